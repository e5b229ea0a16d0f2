//! `NcclVersion`: an NCCL version in release order, and its `NCCL_VERSION_CODE` encoding both ways. The
//! crate compares the headers' version with the loaded library's with it.

use std::fmt;

/// An NCCL version, comparable in release order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NcclVersion {
    /// `NCCL_MAJOR`.
    pub major: u32,
    /// `NCCL_MINOR`.
    pub minor: u32,
    /// `NCCL_PATCH`.
    pub patch: u32,
}

impl NcclVersion {
    /// `NCCL_VERSION(major, minor, patch)` as nccl.h computes it: `2807` style up to 2.8, `22907` after.
    pub const fn code(self) -> u32 {
        if self.major <= 2 && self.minor <= 8 {
            self.major * 1000 + self.minor * 100 + self.patch
        } else {
            self.major * 10000 + self.minor * 100 + self.patch
        }
    }

    /// Decodes an `NCCL_VERSION_CODE` as `ncclGetVersion` reports it: the inverse of [`NcclVersion::code`].
    pub const fn from_code(code: u32) -> NcclVersion {
        if code >= 10000 {
            NcclVersion {
                major: code / 10000,
                minor: code % 10000 / 100,
                patch: code % 100,
            }
        } else {
            NcclVersion {
                major: code / 1000,
                minor: code % 1000 / 100,
                patch: code % 100,
            }
        }
    }
}

impl fmt::Display for NcclVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}
