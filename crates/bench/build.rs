//! The perf binary finds the libnccl it was built against without `LD_LIBRARY_PATH`, as the crate's own
//! targets do: metrale-gpu-sys passes its library folder to dependents (`links = "nccl"` metadata).
//! `call_cost` also links libnccl itself and declares its functions with the crate's bindgen output
//! (`DEP_NCCL_BINDINGS`), to time a linked call beside the crate's.

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_NCCL_LIB_DIR");
    println!("cargo:rerun-if-env-changed=DEP_NCCL_BINDINGS");
    if let Ok(dir) = std::env::var("DEP_NCCL_LIB_DIR") {
        println!("cargo:rustc-link-arg-bins=-Wl,--enable-new-dtags,-rpath,{dir}");
        println!("cargo:rustc-link-arg-bin=call_cost=-L{dir}");
        println!("cargo:rustc-link-arg-bin=call_cost=-l:libnccl.so.2");
    }
    if let Ok(bindings) = std::env::var("DEP_NCCL_BINDINGS") {
        println!("cargo:rustc-env=METRALE_BENCH_BINDINGS={bindings}");
    }
}
