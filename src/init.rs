//! Values nccl.h gives as initializer macros, taken from the C shim so they are exactly the installed
//! header's, and the unique id's conversion to bytes for sending between processes.

use std::ffi::CStr;

use crate::bindings::{ncclConfig_t, ncclGetUniqueId, ncclUniqueId, METRALE_NCCL_CONFIG_UNDEF_INT};
use crate::error::{check_nccl, GpuError};

/// `NCCL_CONFIG_UNDEF_INT`: the value of a config field left to NCCL's default (`INT_MIN`).
pub const NCCL_CONFIG_UNDEF_INT: i32 = METRALE_NCCL_CONFIG_UNDEF_INT;

/// `impl Default for $ty` returning the installed header's `$macro`, byte for byte, through the shim.
macro_rules! initializer {
    ($(#[$cfg:meta])* $ty:ident = $shim:ident, $macro:literal, $doc:literal) => {
        $(#[$cfg])*
        impl Default for crate::bindings::$ty {
            #[doc = concat!("`", $macro, "`, byte for byte: ", $doc)]
            fn default() -> Self {
                let mut value = std::mem::MaybeUninit::<crate::bindings::$ty>::uninit();
                // SAFETY: the shim copies sizeof(type) bytes of the macro's value, initialising all of it.
                unsafe {
                    crate::bindings::$shim(value.as_mut_ptr());
                    value.assume_init()
                }
            }
        }
    };
}

initializer!(ncclConfig_t = metrale_nccl_config_initializer, "NCCL_CONFIG_INITIALIZER",
    "`size`, `magic` and `version` set, every other field left to NCCL (`NCCL_CONFIG_UNDEF_INT`, NULL).");
initializer!(
    ncclSimInfo_t = metrale_nccl_sim_info_initializer,
    "NCCL_SIM_INFO_INITIALIZER",
    "for `ncclGroupSimulateEnd`."
);
initializer!(
    #[cfg(nccl_2_32)]
    ncclCollConfig_t = metrale_nccl_coll_config_initializer,
    "NCCL_COLLCONFIG_INITIALIZER",
    "for the `nccl*Config` collectives (NCCL 2.32+)."
);
initializer!(
    #[cfg(nccl_2_32)]
    ncclEncryptionConfig_t = metrale_nccl_encryption_config_initializer,
    "NCCL_ENCRYPTION_CONFIG_INITIALIZER",
    "(NCCL 2.32+)."
);

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

impl ncclConfig_t {
    /// Sets `commName`, the communicator's name in NCCL's logs and profiler, from a string that lives for
    /// the whole program, as NCCL needs: see [`NcclConfig`](crate::nccl::NcclConfig). For a name built
    /// at run time, `CString::leak` gives one (a few bytes per communicator).
    pub fn set_comm_name(&mut self, name: &'static CStr) {
        self.commName = name.as_ptr();
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
