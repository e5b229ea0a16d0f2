//! Compiles kernels/lsa_all_reduce.cu with the nvcc and headers metrale-gpu-sys found, and writes
//! `fatbin.rs`: the image (`Ok(include_bytes!(…))`), or why there is none (`Err("…")`: headers without the
//! device API, no nvcc), so that the workspace builds everywhere and the kernel's test says what is
//! missing. `cfg(device_api)`: the headers have NCCL's device API (2.28+), so the host side compiles.

fn main() {
    println!("cargo:rustc-check-cfg=cfg(device_api)");
    println!("cargo:rerun-if-env-changed=DEP_NCCL_DEVICE_CXX_STD");
    if std::env::var_os("DEP_NCCL_DEVICE_CXX_STD").is_some() {
        println!("cargo:rustc-cfg=device_api");
    }
    let kernel = metrale_gpu_nvcc::Fatbin::new("kernels/lsa_all_reduce.cu").arch(90);
    let image = match kernel.compile() {
        Ok(path) => format!("Ok(include_bytes!({:?}))", path.display().to_string()),
        Err(e) => {
            let first = e.to_string().lines().next().unwrap_or_default().to_string();
            println!("cargo:warning=no device-API kernel: {first}");
            format!("Err({:?})", e.to_string())
        }
    };
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    std::fs::write(out.join("fatbin.rs"), image).expect("write fatbin.rs");
}
