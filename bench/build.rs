//! The perf binary finds the libnccl it was built against without `LD_LIBRARY_PATH`, as the crate's own
//! targets do: metrale-gpu-sys passes its library folder to dependents (`links = "nccl"` metadata).

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_NCCL_LIB_DIR");
    if let Ok(dir) = std::env::var("DEP_NCCL_LIB_DIR") {
        println!("cargo:rustc-link-arg-bins=-Wl,--enable-new-dtags,-rpath,{dir}");
    }
}
