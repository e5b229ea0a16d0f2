//! What this crate takes from metrale-gpu-sys's build (`DEP_NCCL_*`, its `links = "nccl"` metadata):
//! `cfg(nccl_2_29)` where the headers have revoke, shrink of a revoked communicator and grow (the GPU
//! side, `src/gpu.rs`; the protocol builds on any headers), and the library's folder, so that tests
//! linked with feature `link` find libnccl as the -sys crate's own do.

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_NCCL_VERSION");
    println!("cargo:rerun-if-env-changed=DEP_NCCL_LIB_DIR");
    println!("cargo:rustc-check-cfg=cfg(nccl_2_29)");
    // metrale-gpu-sys always says it: "2.29.7", from the headers' version macros.
    let version = std::env::var("DEP_NCCL_VERSION").unwrap_or_default();
    let mut parts = version.split('.').map(str::parse::<u32>);
    match (parts.next(), parts.next()) {
        (Some(Ok(major)), Some(Ok(minor))) if (major, minor) >= (2, 29) => {
            println!("cargo:rustc-cfg=nccl_2_29")
        }
        (Some(Ok(_)), Some(Ok(_))) => {}
        _ => panic!("metrale-gpu-elastic: DEP_NCCL_VERSION is {version:?}, not MAJOR.MINOR.PATCH"),
    }
    if let Ok(dir) = std::env::var("DEP_NCCL_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,--enable-new-dtags,-rpath,{dir}");
    }
}
