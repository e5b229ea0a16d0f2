//! Values nccl.h gives as initializer macros, taken from the C shim so they are exactly the installed
//! header's: every `NCCL_…_INITIALIZER` it defines is its struct's `Default` (`NcclConfig::default()` is
//! `NCCL_CONFIG_INITIALIZER`, 2.31's `ncclCollConfig_t::default()` `NCCL_COLLCONFIG_INITIALIZER`); and the
//! one config field whose lifetime the C type cannot say.

use std::ffi::CStr;

use crate::bindings::{ncclConfig_t, METRALE_NCCL_CONFIG_UNDEF_INT};

/// `NCCL_CONFIG_UNDEF_INT`: the value of a config field left to NCCL's default (`INT_MIN`).
pub const NCCL_CONFIG_UNDEF_INT: i32 = METRALE_NCCL_CONFIG_UNDEF_INT;

/// `impl Default for $ty` returning the installed header's `$macro`, byte for byte, through the shim's
/// `$shim` (shim/shim.c defines one for each initializer macro; the build generates both lists from the
/// macros the preprocessor finds in nccl.h, `$body` being the definition it printed).
macro_rules! initializer {
    ($ty:ident, $shim:ident, $macro:literal, $body:literal) => {
        unsafe extern "C" {
            fn $shim(out: *mut crate::bindings::$ty);
        }

        impl Default for crate::bindings::$ty {
            #[doc = concat!("`", $macro, "` of the installed nccl.h, byte for byte: `", $body, "`.")]
            fn default() -> Self {
                let mut value = std::mem::MaybeUninit::<crate::bindings::$ty>::uninit();
                // SAFETY: the shim copies sizeof(type) bytes of the macro's value, initialising all of it.
                unsafe {
                    $shim(value.as_mut_ptr());
                    value.assume_init()
                }
            }
        }
    };
}

include!(concat!(env!("OUT_DIR"), "/initializers.rs"));

impl ncclConfig_t {
    /// Sets `commName`, the communicator's name in NCCL's logs and profiler, from a string that lives for
    /// the whole program, as NCCL needs: see [`NcclConfig`](crate::nccl::NcclConfig). For a name built
    /// at run time, `CString::leak` gives one (a few bytes per communicator).
    pub fn set_comm_name(&mut self, name: &'static CStr) {
        self.commName = name.as_ptr();
    }
}
