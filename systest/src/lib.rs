//! The C compiler's view of the headers (compiled by `build.rs` from a generated C file) against the Rust
//! bindings: sizes, alignments, field offsets, enum constants, `#define`s, and the initializer macros'
//! bytes. Each test lists every mismatch it finds, not just the first.

#[cfg(test)]
mod tests {
    // The generated tables cast every constant alike, whatever its Rust type already is.
    #![allow(clippy::unnecessary_cast)]
    use metrale_gpu_sys::bindings::*;

    include!(concat!(env!("OUT_DIR"), "/checks.rs"));

    fn mismatches<T: PartialEq + std::fmt::Debug>(
        what: &str,
        rust: &[(&str, T)],
        c: &[T],
    ) -> Vec<String> {
        assert_eq!(
            rust.len(),
            c.len(),
            "{what}: the generated tables disagree in length"
        );
        assert!(
            !rust.is_empty(),
            "{what}: nothing was checked; the generator found no items"
        );
        rust.iter()
            .zip(c)
            .filter(|((_, r), c)| r != *c)
            .map(|((name, r), c)| format!("{what} of {name}: Rust {r:?}, C {c:?}"))
            .collect()
    }

    #[test]
    fn sizes_and_alignments_match_c() {
        // SAFETY: the C side defines each table with exactly the generated length.
        let (sizes, aligns) = unsafe { (&systest_sizes, &systest_aligns) };
        let mut bad = mismatches("sizeof", RUST_SIZES, sizes);
        bad.extend(mismatches("alignof", RUST_ALIGNS, aligns));
        assert!(bad.is_empty(), "{}", bad.join("\n"));
    }

    #[test]
    fn field_offsets_match_c() {
        // SAFETY: as above.
        let bad = mismatches("offsetof", RUST_OFFSETS, unsafe { &systest_offsets });
        assert!(bad.is_empty(), "{}", bad.join("\n"));
    }

    #[test]
    fn enum_constants_and_defines_match_c() {
        // SAFETY: as above.
        let mut bad = mismatches("value", RUST_INTS, unsafe { &systest_ints });
        bad.extend(mismatches("value", RUST_FLOATS, unsafe { &systest_floats }));
        assert!(bad.is_empty(), "{}", bad.join("\n"));
    }

    #[test]
    fn config_default_is_the_c_initializer_byte_for_byte() {
        let rust = ncclConfig_t::default();
        // SAFETY: reading the plain-data struct (padding included, zeroed by the shim's static) as bytes.
        let rust = unsafe {
            std::slice::from_raw_parts(
                (&rust as *const ncclConfig_t).cast::<u8>(),
                size_of::<ncclConfig_t>(),
            )
        };
        let mut len = 0;
        // SAFETY: the C side returns a static NCCL_CONFIG_INITIALIZER and its size.
        let c = unsafe { std::slice::from_raw_parts(systest_config_bytes(&mut len), len) };
        assert_eq!(rust, c);
    }

    #[test]
    fn sim_info_default_is_the_c_initializer_byte_for_byte() {
        let rust = ncclSimInfo_t::default();
        // SAFETY: as above, for ncclSimInfo_t.
        let rust = unsafe {
            std::slice::from_raw_parts(
                (&rust as *const ncclSimInfo_t).cast::<u8>(),
                size_of::<ncclSimInfo_t>(),
            )
        };
        let mut len = 0;
        // SAFETY: the C side returns a static NCCL_SIM_INFO_INITIALIZER and its size.
        let c = unsafe { std::slice::from_raw_parts(systest_sim_info_bytes(&mut len), len) };
        assert_eq!(rust, c);
    }
}
