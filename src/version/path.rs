//! Which libnccl file the process uses, and how it was found.

/// The file libnccl was loaded from: the loader's choice (loading it first), or with feature `link` the
/// file the dynamic loader took at start-up. `None` where no library could be loaded.
#[cfg(not(feature = "link"))]
pub fn library_path() -> Option<String> {
    crate::loader::library("library_path")
        .ok()
        .map(|l| l.path.clone())
}

/// The file libnccl was loaded from: the loader's choice (loading it first), or with feature `link` the
/// file the dynamic loader took at start-up. `None` where no library could be loaded.
#[cfg(feature = "link")]
pub fn library_path() -> Option<String> {
    crate::dladdr::file_of(crate::bindings::ncclGetVersion as *const std::ffi::c_void)
}

/// How libnccl was found: each place searched in order and what it gave, one per line (loading the
/// library first), as docs/loading.md describes them.
#[cfg(not(feature = "link"))]
pub fn library_search() -> String {
    crate::loader::search_report()
}

/// How libnccl was found: with feature `link`, by the dynamic loader at start-up.
#[cfg(feature = "link")]
pub fn library_search() -> String {
    format!(
        "linked (feature `link`): the dynamic loader found libnccl at start-up through LD_LIBRARY_PATH, the \
         RUNPATH ({}) or its cache",
        super::build_info::NCCL_LIB_DIR
    )
}
