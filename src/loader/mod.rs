//! libnccl, loaded at run time (the default; feature `link` links it instead): a program starts
//! without the library, and a library that lacks a function fails only that function's calls.
//!
//! The first NCCL call chooses the process's one libnccl (docs/loading.md): a libnccl already in the
//! process's global scope (`LD_PRELOAD`, or linked into the program) is the one; otherwise the first
//! acceptable library of the search ([`LIBRARY_VAR`], the system's dynamic loader, an active Python
//! environment, the folder found at build time). Its version is checked against the headers, and it is
//! kept for the process's life (a library whose functions ran is never unloaded). Each function is
//! resolved on its own, at its first call (`build/nccl_table.rs` generates the functions from bindgen's
//! declarations): after that a call costs one atomic load and the indirect call. A function that a
//! library of the global scope defines (a tracer, a profiler, the tests' stand-ins) is taken from it,
//! as the dynamic linker would for a linked build.
//!
//! A call that cannot reach the library returns a status of the crate's own, one per function
//! ([`MISSING_BASE`] + the function's index): the status alone says which function it was, whichever
//! thread reads it, and `check_nccl` turns it into [`GpuError::NcclUnavailable`] (no library: the
//! search), [`GpuError::VersionSkew`] (an older library, refused) or [`GpuError::NcclFunctionMissing`]
//! (the library lacks the function).

mod choose;
mod open;
mod scope;
mod search;
mod settings;

use std::ffi::{c_char, CStr};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::OnceLock;

use libloading::os::unix::Library as Handle;

use crate::error::GpuError;
use crate::ffi::loaded_functions::NAMES;
use crate::ffi::ncclResult_t;
use crate::nccl_version::NcclVersion;
use settings::Settings;
pub use settings::{ALLOW_OLDER_VAR, LIBRARY_VAR};

/// The first of the statuses a call returns when it cannot reach the library: function `i` of
/// `NAMES` returns `MISSING_BASE + i`. Far above NCCL's own codes (`ncclNumResults` is 8 in 2.29, and
/// grows by one a release at most), so no NCCL status is mistaken for one.
pub const MISSING_BASE: u32 = 0x4d47_0000;

/// Where the chosen library's functions come from.
enum Source {
    /// The global scope: a libnccl there is the one.
    Global,
    /// A library the search opened, kept (never dropped: it stays loaded for the process's life).
    Opened(Handle),
    /// Older than the headers and not allowed: no function resolves (and nothing the search opened stays
    /// loaded).
    Refused,
}

/// The chosen library.
pub(crate) struct Library {
    source: Source,
    /// The file (as the dynamic loader recorded it, where it can tell).
    pub(crate) path: String,
    pub(crate) version: NcclVersion,
    /// Each place searched and what it gave, one per line.
    report: String,
}

/// The library, or the search's report of why none loaded; decided once.
static LIBRARY: OnceLock<Result<Library, String>> = OnceLock::new();

/// Chooses the library with the process's settings, read once, before any NCCL code runs.
fn load() -> Result<Library, String> {
    choose::load(&Settings::of_process())
}

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

/// Looks `name` up (loading the library first) and stores it in `slot` for the next calls; `None` where
/// there is no library, the library was refused, or it lacks the function.
pub(crate) fn resolve(slot: &AtomicPtr<()>, name: &str) -> Option<*mut ()> {
    let function = match &library(name).ok()?.source {
        Source::Global => scope::global_symbol(name)?,
        Source::Opened(handle) => match scope::interposer(name) {
            Some(function) => function,
            // SAFETY: looking a symbol up runs no code of the library; the pointer is only ever called
            // through the signature nccl.h declares for `name` (the generated caller's).
            None => *unsafe { handle.get::<*mut ()>(name.as_bytes()) }.ok()?,
        },
        Source::Refused => return None,
    };
    if function.is_null() {
        return None;
    }
    // Release: a thread that loads the pointer (Acquire) sees the library as loaded.
    slot.store(function, Ordering::Release);
    Some(function)
}

/// What a call of function `index` returns when it cannot reach the library.
pub(crate) fn missing_status(index: usize) -> ncclResult_t {
    ncclResult_t(MISSING_BASE + index as u32)
}

/// What a call of a function returning text (`ncclGetErrorString`, `ncclGetLastError`) returns when it
/// cannot reach the library: a static C string saying so.
pub(crate) fn missing_text() -> *const c_char {
    MISSING_TEXT.as_ptr()
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

/// The text of [`missing_text`].
const MISSING_TEXT: &CStr =
    c"metrale-gpu-sys: this NCCL function is unavailable (no libnccl loaded, or the loaded \
    one lacks it); see metrale_gpu_sys::version::library_search()";

/// The error for a status from [`missing_status`] (`None` for any other status), naming `context`.
pub(crate) fn missing_error(status: ncclResult_t, context: &str) -> Option<GpuError> {
    let index = status.0.checked_sub(MISSING_BASE)? as usize;
    let function = *NAMES.get(index)?;
    Some(match library(context) {
        Err(unavailable) => unavailable,
        Ok(Library {
            source: Source::Refused,
            path,
            version,
            ..
        }) => GpuError::VersionSkew {
            headers: NcclVersion::HEADERS,
            library: *version,
            library_path: Some(path.clone()),
        },
        Ok(library) => GpuError::NcclFunctionMissing {
            context: context.to_string(),
            function,
            library: library.version,
            library_path: library.path.clone(),
        },
    })
}
