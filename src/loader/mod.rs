//! libnccl, loaded at run time (the default; feature `link` links it instead): a program starts
//! without the library, and a library that lacks a function fails only that function's calls.
//!
//! The first NCCL call loads the library (the places of the README's search, in order), checks its version against
//! the headers, and keeps it for the process's life (a library whose functions ran is never unloaded).
//! Each function is resolved on its own, at its first call (`build/nccl_table.rs` generates the
//! functions from bindgen's declarations): after that a call costs one atomic load and the indirect call.
//! A function a library of `LD_PRELOAD` defines is taken from it, as the dynamic linker would for a
//! linked build.
//!
//! A call that cannot reach the library returns a status of the crate's own, one per function
//! ([`MISSING_BASE`] + the function's index): the status alone says which function it was, whichever thread reads it, and
//! `check_nccl` turns it into [`GpuError::NcclUnavailable`] (no library: the search),
//! [`GpuError::VersionSkew`] (an older library, refused) or [`GpuError::NcclFunctionMissing`] (the
//! library lacks the function).

mod search;

use std::ffi::{c_char, c_int, OsString};
use std::path::Path;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::OnceLock;

use libloading::os::unix::{Library as Handle, RTLD_LOCAL, RTLD_NOW};

use crate::bindings::loaded_functions::{signatures, NAMES};
use crate::bindings::{ncclResult_t, NCCL_MAJOR};
use crate::error::GpuError;
use crate::last_error::NCCL_LAST_ERROR_BYTES;
use crate::nccl_version::NcclVersion;
use crate::version::build_info;
pub use search::LIBRARY_VAR;

/// The variable that lets the loader accept a library older than the headers (`1`): the functions it
/// has work, and the others fail their calls with [`GpuError::NcclFunctionMissing`].
pub const ALLOW_OLDER_VAR: &str = "METRALE_NCCL_ALLOW_OLDER";

/// The first of the statuses a call returns when it cannot reach the library: function `i` of
/// `NAMES` returns `MISSING_BASE + i`. Far above NCCL's own codes (`ncclNumResults` is 8 in 2.29, and
/// grows by one a release at most), so no NCCL status is mistaken for one.
pub const MISSING_BASE: u32 = 0x4d47_0000;

/// The loaded library.
pub(crate) struct Library {
    /// Kept, never dropped: the library stays loaded for the process's life.
    handle: Handle,
    /// The file (as the dynamic loader recorded it, where it can tell).
    pub(crate) path: String,
    pub(crate) version: NcclVersion,
    /// Older than the headers and not allowed: no function resolves.
    refused: bool,
    /// Each place searched and what it gave, one per line.
    report: String,
}

/// The library, or the search's report of why none loaded; decided once.
static LIBRARY: OnceLock<Result<Library, String>> = OnceLock::new();

/// The loaded library (loading it on the first call), or [`GpuError::NcclUnavailable`] naming `context`
/// and the search.
pub(crate) fn library(context: &str) -> Result<&'static Library, GpuError> {
    match LIBRARY.get_or_init(load) {
        Ok(library) => Ok(library),
        Err(report) => Err(GpuError::NcclUnavailable {
            context: context.to_string(),
            search: report.clone(),
        }),
    }
}

/// Each place searched and what it gave, one per line.
pub(crate) fn search_report() -> String {
    match LIBRARY.get_or_init(load) {
        Ok(library) => library.report.clone(),
        Err(report) => report.clone(),
    }
}

/// Looks `name` up in the library (loading it first) and stores it in `slot` for the next calls; `None`
/// where there is no library, the library was refused, or it lacks the function.
pub(crate) fn resolve(slot: &AtomicPtr<()>, name: &str) -> Option<*mut ()> {
    let library = library(name).ok().filter(|l| !l.refused)?;
    let function = match preloaded(name) {
        Some(function) => function,
        // SAFETY: looking a symbol up runs no code of the library; the pointer is only ever called
        // through the signature nccl.h declares for `name` (the generated caller's).
        None => *unsafe { library.handle.get::<*mut ()>(name.as_bytes()) }.ok()?,
    };
    if function.is_null() {
        return None;
    }
    // Release: a thread that loads the pointer (Acquire) sees the library as loaded.
    slot.store(function, Ordering::Release);
    Some(function)
}

/// `name` as a library of `LD_PRELOAD` defines it, if one does: the dynamic linker lets such a library
/// interpose a linked build's calls, and so does the loader (tracers, profilers, the tests' stand-ins).
/// Only `LD_PRELOAD`'s libraries: another libnccl already in the process's global scope is not mixed in.
fn preloaded(name: &str) -> Option<*mut ()> {
    let preload = std::env::var_os("LD_PRELOAD")?;
    let symbol = std::ffi::CString::new(name).ok()?;
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only looks the name up.
    let function = unsafe { libc::dlsym(libc::RTLD_DEFAULT, symbol.as_ptr()) };
    if function.is_null() {
        return None;
    }
    let file = crate::dladdr::file_of(function)?;
    let file = Path::new(&file);
    let preload = preload.to_string_lossy().into_owned();
    // ld.so's list: paths or names, separated by spaces or colons.
    let listed = preload
        .split([' ', ':'])
        .filter(|entry| !entry.is_empty())
        .map(Path::new)
        .any(|entry| entry == file || entry.file_name() == file.file_name());
    listed.then_some(function.cast())
}

/// What a call of function `index` returns when it cannot reach the library.
pub(crate) fn missing_status(index: usize) -> ncclResult_t {
    ncclResult_t(MISSING_BASE + index as u32)
}

/// What a call of a function returning text (`ncclGetErrorString`, `ncclGetLastError`) returns when it
/// cannot reach the library: a static C string saying so.
pub(crate) fn missing_text() -> *const c_char {
    MISSING_TEXT.as_ptr().cast()
}

/// What a call of function `index` that returns no status (the device API's `ncclTeamLsa`) does when it
/// cannot reach the library: no value of its type could say so, so it ends the process with the error
/// [`missing_error`] gives for the function, as the dynamic linker ends a linked build that lacks a
/// symbol. Only a library older than the headers, accepted with [`ALLOW_OLDER_VAR`], lacks one.
// Only the device API (NCCL 2.28+) declares functions that return no status.
#[cfg_attr(not(nccl_device_api), allow(dead_code))]
pub(crate) fn missing_abort(index: usize) -> ! {
    let name = NAMES.get(index).copied().unwrap_or("an NCCL function");
    match missing_error(missing_status(index), name) {
        Some(error) => eprintln!("metrale-gpu-sys: {error}"),
        None => eprintln!("metrale-gpu-sys: {name} is unavailable"),
    }
    std::process::abort()
}

/// The text of [`missing_text`], NUL-padded to the size of NCCL's last-error buffer: a reader of what
/// `ncclGetLastError` returns may read that many bytes (`last_error.rs`).
static MISSING_TEXT: [u8; NCCL_LAST_ERROR_BYTES] = padded(
    b"metrale-gpu-sys: this NCCL function is unavailable (no libnccl loaded, or the loaded one lacks it); \
      see metrale_gpu_sys::version::library_search()",
);

/// `text` followed by NULs, cut to leave at least one.
const fn padded<const N: usize>(text: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    let mut i = 0;
    while i < text.len() && i + 1 < N {
        out[i] = text[i];
        i += 1;
    }
    out
}

/// The error for a status from [`missing_status`] (`None` for any other status), naming `context`.
pub(crate) fn missing_error(status: ncclResult_t, context: &str) -> Option<GpuError> {
    let index = status.0.checked_sub(MISSING_BASE)? as usize;
    let function = *NAMES.get(index)?;
    Some(match library(context) {
        Err(unavailable) => unavailable,
        Ok(library) if library.refused => GpuError::VersionSkew {
            headers: NcclVersion::HEADERS,
            library: library.version,
            library_path: Some(library.path.clone()),
        },
        Ok(library) => GpuError::NcclFunctionMissing {
            context: context.to_string(),
            function,
            library: library.version,
            library_path: library.path.clone(),
        },
    })
}

/// Tries the places in order; the first NCCL library that loads is kept.
fn load() -> Result<Library, String> {
    let file = format!("libnccl.so.{NCCL_MAJOR}");
    let var = |name: &str| std::env::var_os(name);
    let places = search::places(&var, Path::new(build_info::NCCL_LIB_DIR), &file);
    let mut report = String::new();
    for (i, place) in places.iter().enumerate() {
        let outcome = match &place.target {
            Err(why) => Err(why.clone()),
            Ok(target) => open(target),
        };
        match outcome {
            Ok((handle, version, path)) => {
                let allowed = var(ALLOW_OLDER_VAR).is_some_and(|v| v == "1");
                let refused = version < NcclVersion::HEADERS && !allowed;
                let verdict = match (version < NcclVersion::HEADERS, refused) {
                    (false, _) => String::new(),
                    (true, true) => format!(
                        ", older than the {} headers: refused ({ALLOW_OLDER_VAR}=1 accepts it)",
                        NcclVersion::HEADERS
                    ),
                    (true, false) => format!(
                        ", older than the {} headers: accepted ({ALLOW_OLDER_VAR}=1)",
                        NcclVersion::HEADERS
                    ),
                };
                report.push_str(&format!(
                    "{}. {}: loaded {path}, NCCL {version}{verdict}\n",
                    i + 1,
                    place.what
                ));
                return Ok(Library {
                    handle,
                    path,
                    version,
                    refused,
                    report,
                });
            }
            Err(why) => report.push_str(&format!("{}. {}: {why}\n", i + 1, place.what)),
        }
    }
    Err(format!(
        "no {file} could be loaded; searched, in order:\n{report}Set {}=<a {file}, or its folder>, or \
         install NCCL where one of these looks (pip's nvidia-nccl wheel in the active environment, say)",
        search::LIBRARY_VAR
    ))
}

/// Opens `target` and asks its version: the handle, the version and the file, or why not.
fn open(target: &OsString) -> Result<(Handle, NcclVersion, String), String> {
    // SAFETY: loading libnccl runs its initialisers, which have no preconditions. RTLD_NOW: a library
    // whose own dependencies are missing fails here, not at a later call.
    let handle =
        unsafe { Handle::open(Some(target), RTLD_NOW | RTLD_LOCAL) }.map_err(|e| e.to_string())?;
    let name = "ncclGetVersion";
    // SAFETY: looking a symbol up runs no code; it is called below with the signature nccl.h declares.
    let get_version = unsafe { handle.get::<signatures::ncclGetVersion>(name.as_bytes()) }
        .map_err(|e| format!("loaded, but it is not NCCL: {e}"))?;
    let mut code: c_int = 0;
    // SAFETY: ncclGetVersion writes one int through a valid pointer.
    let status = unsafe { get_version(&mut code) };
    if status != ncclResult_t::ncclSuccess {
        return Err(format!("loaded, but {name} returned {}", status.0));
    }
    let path = crate::dladdr::file_of(*get_version as *const libc::c_void)
        .unwrap_or_else(|| target.to_string_lossy().into_owned());
    Ok((handle, NcclVersion::from_code(code as u32), path))
}
