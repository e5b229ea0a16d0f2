//! The headers' NCCL version against the loaded library's: a library older than the headers is an error
//! (it lacks what the bindings declare); a newer one is fine (NCCL keeps its ABI within 2.x).

use crate::error::GpuError;
use crate::nccl_version::NcclVersion;

/// The version of the libnccl this process uses (`ncclGetVersion`), loading it first where the crate
/// loads it at run time; also the version of an older library the loader refused.
#[cfg(not(feature = "link"))]
pub fn library_version() -> Result<NcclVersion, GpuError> {
    crate::loader::library("library_version").map(|l| l.version)
}

/// The version of the libnccl this process uses (`ncclGetVersion`).
#[cfg(feature = "link")]
pub fn library_version() -> Result<NcclVersion, GpuError> {
    let mut code = 0;
    // SAFETY: ncclGetVersion writes one int through a valid pointer.
    let status = unsafe { crate::bindings::ncclGetVersion(&mut code) };
    crate::check::check_nccl(status, "ncclGetVersion")?;
    Ok(NcclVersion::from_code(code as u32))
}

/// The loaded library's version, or [`GpuError::VersionSkew`] naming both versions when it is older than
/// the headers (also where `METRALE_NCCL_ALLOW_OLDER=1` let the loader accept it). Call it once at
/// start-up: where it fails, the program is running on a library that lacks some of the bindings.
pub fn check_library_version() -> Result<NcclVersion, GpuError> {
    let library = library_version()?;
    compare(NcclVersion::HEADERS, library)?;
    Ok(library)
}

/// The verdict alone: `Err` when `library` is older than `headers`.
pub fn compare(headers: NcclVersion, library: NcclVersion) -> Result<(), GpuError> {
    if library < headers {
        return Err(GpuError::VersionSkew {
            headers,
            library,
            library_path: super::library_path(),
        });
    }
    Ok(())
}
