//! What the build says when bindgen panics (`bindgen_panic`): a libclang that cannot load is a setup to
//! fix, any other panic a bug to report, never "install libclang".

use metrale_gpu_sys_build::bindgen_panic;

#[test]
fn a_missing_libclang_says_how_to_get_one() {
    // bindgen 0.72's own words (`clang_sys::load().expect("Unable to find libclang")`).
    let why = "Unable to find libclang: \"couldn't find any valid shared libraries matching: ['libclang.so']\"";
    let message = bindgen_panic::message(why, Some("bindgen-0.72.1/lib.rs:616:27"));
    assert!(
        message.starts_with(&format!("bindgen failed: {why}\n")),
        "{message}"
    );
    for fix in [
        "apt-get install libclang-dev",
        "LIBCLANG_PATH",
        "bundled-bindings",
    ] {
        assert!(message.contains(fix), "{fix:?} missing in: {message}");
    }
}

#[test]
fn any_other_panic_is_reported_as_a_bug_with_its_place() {
    let message = bindgen_panic::message(
        "index out of bounds: the len is 0 but the index is 0",
        Some("bindgen-0.72.1/codegen/mod.rs:100:5"),
    );
    assert!(
        message.starts_with(
            "bindgen panicked at bindgen-0.72.1/codegen/mod.rs:100:5: index out of bounds"
        ),
        "{message}"
    );
    assert!(message.contains("a bug in bindgen"), "{message}");
    assert!(!message.contains("libclang"), "{message}");
    assert!(bindgen_panic::message("", None).contains("at an unknown place"));
}
