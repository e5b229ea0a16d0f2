//! Which libnccl the process uses, against the headers the bindings come from: the version check
//! ([`check_library_version`]), the loaded file ([`library_path`]) and how it was found
//! ([`library_search`]), and where the build found the headers ([`build_info`]).

pub mod build_info {
    //! Where the build script found the headers and the library these bindings come from.
    pub use crate::build_info::*;
}
mod path;
mod skew;

pub use crate::nccl_version::NcclVersion;
pub use path::{library_path, library_search};
pub use skew::{check_library_version, compare, library_version};
