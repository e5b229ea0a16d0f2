//! What this crate takes from metrale-gpu-sys's build (its `links = "nccl"` metadata, `DEP_NCCL_*`): the
//! NCCL version of the headers, as the same `cfg(nccl_2_<minor>)` flags the -sys crate sets for the API
//! this crate uses (`nccl_2_29`: `ncclCommRevoke`; `nccl_2_30`: `ncclTimeout`), and the library's folder,
//! so that the tests find libnccl without `LD_LIBRARY_PATH` as the -sys crate's own do.

/// The minors whose API this crate's code is conditional on.
const MINORS: [u32; 2] = [29, 30];

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_NCCL_VERSION");
    println!("cargo:rerun-if-env-changed=DEP_NCCL_LIB_DIR");
    for minor in MINORS {
        println!("cargo:rustc-check-cfg=cfg(nccl_2_{minor})");
    }
    // metrale-gpu-sys always says it: "2.29.7", from the headers' version macros.
    let version = std::env::var("DEP_NCCL_VERSION").unwrap_or_default();
    let (major, minor) = major_minor(&version).unwrap_or_else(|| {
        panic!(
            "metrale-gpu-watchdog: DEP_NCCL_VERSION is {version:?}, not MAJOR.MINOR.PATCH: it comes from \
             metrale-gpu-sys's build script, which sets it in every build (is a different links = \"nccl\" crate \
             in the graph?)"
        )
    });
    for flag in MINORS {
        if major > 2 || (major == 2 && minor >= flag) {
            println!("cargo:rustc-cfg=nccl_2_{flag}");
        }
    }
    if let Ok(dir) = std::env::var("DEP_NCCL_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,--enable-new-dtags,-rpath,{dir}");
    }
    // The target's C compiler, for the tests that build a stand-in libnccl (tests/waits/comm_work.rs).
    println!(
        "cargo:rustc-env=METRALE_TARGET_CC={}",
        cc::Build::new().get_compiler().path().display()
    );
}

/// `"2.29.7"` as `(2, 29)`.
fn major_minor(version: &str) -> Option<(u32, u32)> {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
    Some((parts.next()??, parts.next()??))
}
