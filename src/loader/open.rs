//! Opening one candidate of the search: the handle, the version it reports, and its file.

use std::ffi::OsString;

use libloading::os::unix::{Library as Handle, RTLD_LOCAL, RTLD_NOW};

use super::scope::version_of;
use crate::dladdr::file_of;
use crate::ffi::loaded_functions::signatures;
use crate::nccl_version::NcclVersion;

/// A candidate, opened: kept if chosen, closed (dropped) if passed over.
pub(super) struct Opened {
    pub(super) handle: Handle,
    pub(super) version: NcclVersion,
    /// The file, as the dynamic loader recorded it.
    pub(super) path: String,
}

/// Opens `target` (`RTLD_LOCAL`: nothing of it joins the global scope) and asks its version.
pub(super) fn open(target: &OsString) -> Result<Opened, String> {
    // SAFETY: loading libnccl runs its initialisers, which have no preconditions. RTLD_NOW: a library
    // whose own dependencies are missing fails here, not at a later call.
    let handle =
        unsafe { Handle::open(Some(target), RTLD_NOW | RTLD_LOCAL) }.map_err(|e| e.to_string())?;
    // SAFETY: looking a symbol up runs no code; it is called with the signature nccl.h declares.
    let get_version = unsafe { handle.get::<signatures::ncclGetVersion>(b"ncclGetVersion") }
        .map_err(|e| format!("loaded, but it is not NCCL: {e}"))?;
    let version = version_of(*get_version).map_err(|why| format!("loaded, but {why}"))?;
    let path = file_of(*get_version as *const libc::c_void)
        .unwrap_or_else(|| target.to_string_lossy().into_owned());
    Ok(Opened {
        handle,
        version,
        path,
    })
}
