//! Values nccl.h gives as initializer macros, taken from the C shim so they are exactly the installed
//! header's, and the unique id's conversion to bytes for sending between processes.

use crate::bindings::{
    metrale_nccl_config_initializer, metrale_nccl_sim_info_initializer, ncclConfig_t,
    ncclGetUniqueId, ncclSimInfo_t, ncclUniqueId, METRALE_NCCL_CONFIG_UNDEF_INT,
};
use crate::error::{check_nccl, GpuError};

/// `NCCL_CONFIG_UNDEF_INT`: the value of a config field left to NCCL's default (`INT_MIN`).
pub const NCCL_CONFIG_UNDEF_INT: i32 = METRALE_NCCL_CONFIG_UNDEF_INT;

impl Default for ncclConfig_t {
    /// `NCCL_CONFIG_INITIALIZER`, byte for byte: `size`, `magic` and `version` set, every other field
    /// undefined (`NCCL_CONFIG_UNDEF_INT`, NULL), so NCCL applies its defaults.
    fn default() -> Self {
        let mut config = std::mem::MaybeUninit::<ncclConfig_t>::uninit();
        // SAFETY: the shim copies sizeof(ncclConfig_t) bytes, which initialises the whole value.
        unsafe {
            metrale_nccl_config_initializer(config.as_mut_ptr());
            config.assume_init()
        }
    }
}

impl Default for ncclSimInfo_t {
    /// `NCCL_SIM_INFO_INITIALIZER`, byte for byte, for `ncclGroupSimulateEnd`.
    fn default() -> Self {
        let mut info = std::mem::MaybeUninit::<ncclSimInfo_t>::uninit();
        // SAFETY: the shim copies sizeof(ncclSimInfo_t) bytes, which initialises the whole value.
        unsafe {
            metrale_nccl_sim_info_initializer(info.as_mut_ptr());
            info.assume_init()
        }
    }
}

impl ncclUniqueId {
    /// Its size, `NCCL_UNIQUE_ID_BYTES`.
    pub const BYTES: usize = crate::bindings::NCCL_UNIQUE_ID_BYTES as usize;

    /// A new id from `ncclGetUniqueId`, for rank 0 to hand to the other ranks.
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
