//! Values nccl.h gives as initializer macros, taken from the C shim so they are exactly the installed
//! header's (`NcclConfig::default()` is `NCCL_CONFIG_INITIALIZER`), and the one config field whose lifetime
//! the C type cannot say.

use std::ffi::CStr;

use crate::bindings::{ncclConfig_t, METRALE_NCCL_CONFIG_UNDEF_INT};

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

impl ncclConfig_t {
    /// Sets `commName`, the communicator's name in NCCL's logs and profiler, from a string that lives for
    /// the whole program, as NCCL needs: see [`NcclConfig`](crate::nccl::NcclConfig). For a name built
    /// at run time, `CString::leak` gives one (a few bytes per communicator).
    pub fn set_comm_name(&mut self, name: &'static CStr) {
        self.commName = name.as_ptr();
    }
}
