//! The build script's only door to the environment: every variable it reads is declared to cargo,
//! so changing any of them reruns the build, and nothing else does.

use std::ffi::OsString;

/// Reads `name`, declaring it to cargo; an empty value counts as unset.
pub fn var(name: &str) -> Option<OsString> {
    println!("cargo:rerun-if-env-changed={name}");
    std::env::var_os(name).filter(|v| !v.is_empty())
}
