//! The C compiler's view of the headers (compiled by `build/main.rs` from a generated C file) against the
//! Rust bindings: sizes, alignments, field offsets, enum constants, `#define`s, and the initializer
//! macros' bytes, for every initializer the crate found in nccl.h. The device API (NCCL 2.28+'s
//! `nccl_device.h`, C++) is checked the same way against the C++ compiler's view (the `device_` tests).
//! Each test lists every mismatch it finds, not just the first.

#[cfg(test)]
mod tests {
    // The generated tables cast every constant alike, whatever its Rust type already is.
    #![allow(clippy::unnecessary_cast)]
    use metrale_gpu_sys::bindings::*;

    include!(concat!(env!("OUT_DIR"), "/checks.rs"));

    /// One compiler's tables (the C compiler's of nccl.h, the C++ compiler's of the device API), as the
    /// generated Rust tables list the items.
    struct CTables {
        sizes: &'static [usize],
        aligns: &'static [usize],
        offsets: &'static [usize],
        ints: &'static [i64],
        floats: &'static [f64],
    }

    /// Each row where the Rust side differs from the C side. `required`: the table must have rows (the
    /// device API has no floating-point constants).
    fn mismatches<T: PartialEq + std::fmt::Debug>(
        what: &str,
        rust: &[(&str, T)],
        c: &[T],
        required: bool,
    ) -> Vec<String> {
        assert_eq!(
            rust.len(),
            c.len(),
            "{what}: the generated tables disagree in length"
        );
        assert!(
            !required || !rust.is_empty(),
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
        let c = c_tables();
        let mut bad = mismatches("sizeof", RUST_SIZES, c.sizes, true);
        bad.extend(mismatches("alignof", RUST_ALIGNS, c.aligns, true));
        assert!(bad.is_empty(), "{}", bad.join("\n"));
    }

    #[test]
    fn field_offsets_match_c() {
        let bad = mismatches("offsetof", RUST_OFFSETS, c_tables().offsets, true);
        assert!(bad.is_empty(), "{}", bad.join("\n"));
    }

    #[test]
    fn enum_constants_and_defines_match_c() {
        let c = c_tables();
        let mut bad = mismatches("value", RUST_INTS, c.ints, true);
        bad.extend(mismatches("value", RUST_FLOATS, c.floats, true));
        assert!(bad.is_empty(), "{}", bad.join("\n"));
    }

    /// The C side of an initializer: a static holding the macro's value (padding zero, as for every
    /// static), and its size.
    type CSide = unsafe extern "C" fn(*mut usize) -> *const u8;
    /// The Rust side: the bytes the shim's initializer writes, and whether `T::default()` equals them.
    type RustSide = fn() -> (Vec<u8>, bool);

    /// What the crate's `Default` is built on, read without moving a value: the shim's initializer writes
    /// through a pointer into zeroed memory, whose every byte (padding included: the shim copies a
    /// zero-padded static) is then defined. A value passed around by value keeps no padding, so
    /// `T::default()` itself is compared field by field (`PartialEq`), never as bytes.
    fn shim_value<T: Default + PartialEq>(init: unsafe extern "C" fn(*mut T)) -> (Vec<u8>, bool) {
        let mut slot = std::mem::MaybeUninit::<T>::zeroed();
        // SAFETY: the shim writes one `T` through the pointer, which is valid for it.
        unsafe { init(slot.as_mut_ptr()) };
        // SAFETY: every byte of `slot` is initialised: zeroed, then written by C's memcpy.
        let bytes =
            unsafe { std::slice::from_raw_parts(slot.as_ptr().cast::<u8>(), size_of::<T>()) }
                .to_vec();
        // SAFETY: the shim wrote a valid `T` (plain C data) into the slot.
        let value = unsafe { slot.assume_init() };
        (bytes, T::default() == value)
    }

    /// NCCL versions a struct by its first fields (`size`, `magic`, `version`), which only its initializer
    /// macro fills correctly: each such struct has one, found by the crate's build.
    #[test]
    fn every_versioned_struct_has_an_initializer_default() {
        let covered: Vec<&str> = INITIALIZERS.iter().map(|(name, _, _)| *name).collect();
        let missing: Vec<&&str> = VERSIONED_STRUCTS
            .iter()
            .filter(|s| !covered.contains(s))
            .collect();
        assert!(
            VERSIONED_STRUCTS.contains(&"ncclConfig_t") && missing.is_empty(),
            "versioned structs {VERSIONED_STRUCTS:?}; without an initializer Default: {missing:?}"
        );
    }

    #[test]
    fn every_default_is_its_c_initializer_byte_for_byte() {
        let names: Vec<&str> = INITIALIZERS.iter().map(|(name, _, _)| *name).collect();
        assert!(
            names.contains(&"ncclConfig_t") && names.contains(&"ncclSimInfo_t"),
            "{names:?}"
        );
        same_bytes(INITIALIZERS);
    }

    /// Each initializer's bytes, the shim's against the compiler's, and its `Default` against the shim's.
    fn same_bytes(initializers: &[(&str, RustSide, CSide)]) {
        for (name, rust, c) in initializers {
            let mut len = 0;
            // SAFETY: the C side returns a pointer to a static of `len` bytes.
            let c = unsafe { std::slice::from_raw_parts(c(&mut len), len) };
            let (shim, default_is_shim) = rust();
            assert_eq!(
                shim, c,
                "{name}: the shim's initializer against the C compiler's, byte for byte"
            );
            assert!(
                default_is_shim,
                "{name}::default() differs from the shim's initializer"
            );
        }
    }

    /// The device API (NCCL 2.28+), as the C++ compiler sees it over `shim/device.h`: every type's size,
    /// alignment and field offsets (`ncclDevComm` by size and alignment: opaque to the host), every enum
    /// constant, and every initializer (`NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER`,
    /// `NCCL_COMM_PROPERTIES_INITIALIZER`: 2.29+) byte for byte; and every struct it versions has one.
    #[cfg(systest_device)]
    #[test]
    fn device_api_matches_cxx() {
        let cxx = device_c_tables();
        let names: Vec<&str> = DEVICE_RUST_SIZES.iter().map(|(name, _)| *name).collect();
        assert!(
            names.contains(&"ncclDevComm") && names.contains(&"ncclTeam"),
            "the device API's types checked: {names:?}"
        );
        let mut bad = mismatches("sizeof", DEVICE_RUST_SIZES, cxx.sizes, true);
        bad.extend(mismatches("alignof", DEVICE_RUST_ALIGNS, cxx.aligns, true));
        bad.extend(mismatches(
            "offsetof",
            DEVICE_RUST_OFFSETS,
            cxx.offsets,
            true,
        ));
        // 2.28 has no enum among the device API's types; none has a floating-point constant.
        bad.extend(mismatches("value", DEVICE_RUST_INTS, cxx.ints, false));
        bad.extend(mismatches("value", DEVICE_RUST_FLOATS, cxx.floats, false));
        assert!(bad.is_empty(), "{}", bad.join("\n"));
        let covered: Vec<&str> = DEVICE_INITIALIZERS
            .iter()
            .map(|(name, _, _)| *name)
            .collect();
        let missing: Vec<&&str> = DEVICE_VERSIONED_STRUCTS
            .iter()
            .filter(|s| !covered.contains(s))
            .collect();
        assert!(
            missing.is_empty(),
            "versioned device structs {DEVICE_VERSIONED_STRUCTS:?}; without an initializer Default: {missing:?}"
        );
        same_bytes(DEVICE_INITIALIZERS);
    }

    #[cfg(not(systest_device))]
    #[test]
    fn device_api_matches_cxx() {
        metrale_gpu_testkit::skip::skip(
            "the NCCL headers found have no device API (nccl_device.h, NCCL 2.28+)",
        );
    }
}
