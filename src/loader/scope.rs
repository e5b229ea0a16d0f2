//! The process's global scope: what `LD_PRELOAD`, the program and the libraries it links define, as the
//! dynamic linker would bind a linked build's calls. A libnccl there (it defines `ncclGetVersion`) is the
//! one the process uses: the loader opens no second copy beside it. A library there that defines only
//! some calls (a tracer, the tests' stand-ins) interposes them over the one library.

use std::ffi::{c_int, CString};

use crate::dladdr::file_of;
use crate::ffi::loaded_functions::signatures;
use crate::ffi::ncclResult_t;
use crate::nccl_version::NcclVersion;

/// The function that names a library as NCCL itself.
const VERSION_FUNCTION: &str = "ncclGetVersion";

/// `name` as the global scope defines it (the first definition in the dynamic linker's order).
pub(super) fn global_symbol(name: &str) -> Option<*mut ()> {
    let symbol = CString::new(name).ok()?;
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only looks the name up.
    let function = unsafe { libc::dlsym(libc::RTLD_DEFAULT, symbol.as_ptr()) };
    (!function.is_null()).then_some(function.cast())
}

/// The libnccl of the global scope, if there is one: its version and its file (as the dynamic loader
/// recorded it), or why its version could not be read.
pub(super) fn global_nccl() -> Option<Result<(NcclVersion, String), String>> {
    let function = global_symbol(VERSION_FUNCTION)?;
    let file = file_of(function.cast()).unwrap_or_else(|| "(a file dladdr cannot name)".into());
    // SAFETY: the global scope's `ncclGetVersion`, which has nccl.h's signature.
    let get_version =
        unsafe { std::mem::transmute::<*mut (), signatures::ncclGetVersion>(function) };
    Some(version_of(get_version).map(|version| (version, file)))
}

/// `name` as a library of the global scope interposes it over the library the loader opened: any
/// definition there, but one from a libnccl that joined the global scope after the loader chose its
/// library (two copies of NCCL are never mixed).
pub(super) fn interposer(name: &str) -> Option<*mut ()> {
    let function = global_symbol(name)?;
    let whole_nccl = global_symbol(VERSION_FUNCTION)
        .is_some_and(|version| file_of(version.cast()) == file_of(function.cast()));
    (!whole_nccl).then_some(function)
}

/// What `get_version` reports, or why it reports nothing.
pub(super) fn version_of(get_version: signatures::ncclGetVersion) -> Result<NcclVersion, String> {
    let mut code: c_int = 0;
    // SAFETY: ncclGetVersion writes one int through a valid pointer.
    let status = unsafe { get_version(&mut code) };
    if status != ncclResult_t::ncclSuccess {
        return Err(format!("{VERSION_FUNCTION} returned {}", status.0));
    }
    Ok(NcclVersion::from_code(code as u32))
}
