//! testkit's own unit tests find the libnccl metrale-gpu-sys was built against without `LD_LIBRARY_PATH`,
//! as the crate's own targets do (its `links = "nccl"` metadata names the folder). A linker that keeps
//! every library it is given (the aarch64 cross linker) makes them need libnccl even if they call none of it.

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_NCCL_LIB_DIR");
    if let Ok(dir) = std::env::var("DEP_NCCL_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,--enable-new-dtags,-rpath,{dir}");
    }
}
