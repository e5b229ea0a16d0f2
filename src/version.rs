//! The headers' NCCL version against the loaded library's: a library older than the headers is an error
//! (it lacks what the bindings declare); a newer one is fine (NCCL keeps its ABI within 2.x).

use crate::bindings::{ncclGetVersion, NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH, NCCL_VERSION_CODE};
use crate::error::{check_nccl, GpuError};
pub use crate::nccl_version::NcclVersion;

impl NcclVersion {
    /// The version of the nccl.h these bindings were generated from.
    pub const HEADERS: NcclVersion = NcclVersion {
        major: NCCL_MAJOR,
        minor: NCCL_MINOR,
        patch: NCCL_PATCH,
    };
}

// The header's code and its parts must agree, or `code` and `from_code` are wrong.
const _: () = assert!(NcclVersion::HEADERS.code() == NCCL_VERSION_CODE);

/// The version of the libnccl loaded in this process (`ncclGetVersion`).
pub fn library_version() -> Result<NcclVersion, GpuError> {
    let mut code = 0;
    // SAFETY: ncclGetVersion writes one int through a valid pointer.
    check_nccl(unsafe { ncclGetVersion(&mut code) }, "ncclGetVersion")?;
    Ok(NcclVersion::from_code(code as u32))
}

/// The loaded library's version, or [`GpuError::VersionSkew`] naming both versions when it is older than
/// the headers. Call it once at start-up, before any call the older library may lack.
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
            library_path: library_path(),
        });
    }
    Ok(())
}

/// The file the dynamic loader took libnccl from.
pub fn library_path() -> Option<String> {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: dladdr only reads the address and fills `info`; the function pointer is a valid address in libnccl.
    let found = unsafe { libc::dladdr(ncclGetVersion as *const libc::c_void, info.as_mut_ptr()) };
    // SAFETY: on success dladdr filled `info`; dli_fname is NULL or a NUL-terminated path the loader owns.
    (found != 0)
        .then(|| unsafe { crate::error::c_text(info.assume_init().dli_fname) })
        .flatten()
}

/// Where the build script found the headers and the library these bindings come from.
pub mod build_info {
    /// The NCCL version this crate release pins (its version's `+nccl-…`), which `ci/setup` installs and
    /// the bundled snapshot was generated from.
    pub const PINNED_NCCL: &str = env!("METRALE_PINNED_NCCL");
    /// The directory holding the `nccl.h` the bindings were generated from.
    pub const NCCL_INCLUDE: &str = env!("METRALE_NCCL_INCLUDE");
    /// The directory libnccl was linked from (also the binaries' RUNPATH).
    pub const NCCL_LIB_DIR: &str = env!("METRALE_NCCL_LIB_DIR");
    /// The discovery step that found NCCL (e.g. `NCCL_HOME=…`, `ci/setup's folder`).
    pub const NCCL_FOUND_BY: &str = env!("METRALE_NCCL_FOUND_BY");
    /// The directory holding the `cuda.h` the bindings were generated from.
    pub const CUDA_INCLUDE: &str = env!("METRALE_CUDA_INCLUDE");
    /// The discovery step that found the CUDA headers.
    pub const CUDA_FOUND_BY: &str = env!("METRALE_CUDA_FOUND_BY");
}
