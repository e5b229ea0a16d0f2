//! C strings a library owns (NCCL's error texts, the driver's names, the dynamic loader's paths), copied
//! into Rust strings.

use std::ffi::{c_char, CStr};

/// Copies a NUL-terminated C string; `None` for NULL.
///
/// # Safety
/// `ptr` is NULL or points to a NUL-terminated string that lives for the duration of the call.
pub(crate) unsafe fn c_text(ptr: *const c_char) -> Option<String> {
    if ptr.is_null() {
        return None;
    }
    // SAFETY: not NULL, so a NUL-terminated string that lives for the call, as the caller promises.
    let text = unsafe { CStr::from_ptr(ptr) };
    Some(text.to_string_lossy().into_owned())
}

/// Copies a C string held in a buffer of `size` bytes: up to its first NUL, and never past the buffer
/// (a text that fills it without a NUL is cut there). Reads byte by byte, so no byte after the NUL is
/// read. `None` for NULL or an empty text.
///
/// # Safety
/// `ptr` is NULL, or each byte from `ptr` up to the first NUL (or `size` bytes, whichever comes first)
/// is readable and not written during the call.
pub(crate) unsafe fn c_text_within(ptr: *const c_char, size: usize) -> Option<String> {
    if ptr.is_null() {
        return None;
    }
    let mut bytes = Vec::new();
    for i in 0..size {
        // SAFETY: byte i comes before the first NUL and within `size`: readable, as the caller promises.
        let byte = unsafe { ptr.add(i).cast::<u8>().read() };
        if byte == 0 {
            break;
        }
        bytes.push(byte);
    }
    (!bytes.is_empty()).then(|| String::from_utf8_lossy(&bytes).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bounded_copy_stops_at_the_first_nul_or_the_end_of_the_buffer() {
        // Only four bytes are given for a bound of 1024: a read past the NUL would leave them (Miri's
        // complaint, and garbage in the text otherwise).
        let short = b"abc\0";
        let full = b"abcdef";
        // SAFETY: each pointer is readable up to its NUL or, for `full`, its length (the bound given);
        // NULL is allowed.
        unsafe {
            let text = c_text_within(short.as_ptr().cast(), 1024);
            assert_eq!(text, Some("abc".into()));
            let text = c_text_within(full.as_ptr().cast(), full.len());
            assert_eq!(text, Some("abcdef".into()));
            assert_eq!(c_text_within(c"".as_ptr(), 1024), None);
            assert_eq!(c_text_within(std::ptr::null(), 1024), None);
        }
    }
}
