//! `ncclUniqueId`: the id rank 0 creates and hands to the other ranks, and its bytes for sending.

use crate::bindings::{ncclGetUniqueId, ncclUniqueId};
use crate::check::check_nccl;
use crate::error::GpuError;

impl ncclUniqueId {
    /// Its size, `NCCL_UNIQUE_ID_BYTES`.
    pub const BYTES: usize = crate::bindings::NCCL_UNIQUE_ID_BYTES as usize;

    /// A new id from `ncclGetUniqueId`, for rank 0 to hand to the other ranks.
    ///
    /// Not free: NCCL starts its bootstrap root for the id, a thread listening on a socket, which lasts
    /// until every rank has joined through the id (the communicator's init); an id never used keeps its
    /// thread and socket for the process's life. Create one per communicator, when it is about to be used.
    pub fn new() -> Result<ncclUniqueId, GpuError> {
        let mut id = ncclUniqueId {
            internal: [0; Self::BYTES],
        };
        // SAFETY: writes one ncclUniqueId through a valid pointer.
        check_nccl(unsafe { ncclGetUniqueId(&mut id) }, "ncclGetUniqueId")?;
        Ok(id)
    }

    /// The id's bytes, to send to other processes or hosts.
    pub fn to_bytes(&self) -> [u8; Self::BYTES] {
        self.internal.map(|c| c as u8)
    }

    /// The id whose bytes another process sent.
    pub fn from_bytes(bytes: [u8; Self::BYTES]) -> ncclUniqueId {
        ncclUniqueId {
            internal: bytes.map(|b| b as std::os::raw::c_char),
        }
    }
}

/// `ncclUniqueId(0a1b…)`: the bytes in hex, as one word.
impl std::fmt::Debug for ncclUniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ncclUniqueId(")?;
        for byte in self.to_bytes() {
            write!(f, "{byte:02x}")?;
        }
        f.write_str(")")
    }
}

impl From<[u8; ncclUniqueId::BYTES]> for ncclUniqueId {
    fn from(bytes: [u8; ncclUniqueId::BYTES]) -> Self {
        ncclUniqueId::from_bytes(bytes)
    }
}

impl From<ncclUniqueId> for [u8; ncclUniqueId::BYTES] {
    fn from(id: ncclUniqueId) -> Self {
        id.to_bytes()
    }
}
