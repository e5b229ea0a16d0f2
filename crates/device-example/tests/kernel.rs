//! The kernel compiles without a GPU: this crate's build ran nvcc over kernels/lsa_all_reduce.cu and
//! embedded a fatbin. It skips, saying why, where the build made none (headers without NCCL's device API,
//! or no nvcc: `ci/setup --nvcc`).

use metrale_gpu_testkit::skip::skip;

#[test]
fn the_kernel_is_compiled_into_a_fatbin() {
    let image = match metrale_gpu_device_example::FATBIN {
        Ok(image) => image,
        Err(why) => return skip(why.lines().next().unwrap_or_default()),
    };
    assert!(
        image.starts_with(&metrale_gpu_nvcc::FATBIN_MAGIC),
        "the embedded kernel is no fatbin: {:02x?}",
        &image[..image.len().min(16)]
    );
    // Both kernels' names are in the image (the symbols the host looks up).
    for name in ["lsa_all_reduce_sum_f32", "dev_comm_info"] {
        assert!(
            image.windows(name.len()).any(|w| w == name.as_bytes()),
            "{name} is not in the fatbin"
        );
    }
}
