//! The file a loaded address belongs to (`dladdr`), for the diagnostics.

use crate::c_text::c_text;

/// The path of the shared object holding `addr`, as the dynamic loader recorded it; `None` where it
/// cannot tell.
pub(crate) fn file_of(addr: *const libc::c_void) -> Option<String> {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: dladdr only reads the address (any value is allowed) and fills `info`.
    let found = unsafe { libc::dladdr(addr, info.as_mut_ptr()) };
    // SAFETY: on success dladdr filled `info`; dli_fname is NULL or a NUL-terminated path the loader owns.
    (found != 0)
        .then(|| unsafe { c_text(info.assume_init().dli_fname) })
        .flatten()
}
