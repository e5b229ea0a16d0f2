//! What a panic inside bindgen means to the person building: bindgen panics when it cannot load libclang
//! (a setup to fix), and otherwise only on a bug (its own, or in how the build calls it). Pure, so that
//! `tests/bindgen_panic.rs` checks both messages.

/// The build's message for a bindgen panic with payload `why`, raised at `location` (`file:line:col`).
pub fn message(why: &str, location: Option<&str>) -> String {
    if why.contains("libclang") {
        return format!(
            "bindgen failed: {why}\nbindgen needs libclang: `apt-get install libclang-dev`, or set \
             LIBCLANG_PATH to the directory holding libclang.so; or build with the committed bindings \
             (`default-features = false, features = [\"bundled-bindings\"]`), which need no libclang."
        );
    }
    format!(
        "bindgen panicked at {}: {why}\nThat is a bug in bindgen or in how build/bindings.rs calls it, \
         not a problem with the headers found: please report it, with the NCCL and CUDA versions this \
         build found.",
        location.unwrap_or("an unknown place")
    )
}
