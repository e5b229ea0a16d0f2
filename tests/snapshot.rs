//! The committed bindings snapshot (src/snapshot/, used by docs.rs and the `bundled-bindings` feature) is
//! exactly what the build generates from the pinned headers (bindgen's files, the facts the bundled
//! build checks, and the initializer list): it can never drift. `ci/regen` rewrites it.

use metrale_gpu_sys::version::build_info::PINNED_NCCL as PINNED;
use metrale_gpu_sys::version::NcclVersion;
use metrale_gpu_sys::CUDA_VERSION;
use metrale_gpu_testkit::skip::skip;

#[test]
fn the_snapshot_is_what_bindgen_generates_from_the_pinned_headers() {
    // The snapshot was generated from the pinned NCCL with ci/setup's CUDA headers (and libclang 14);
    // other headers generate other bindings by design.
    let snapshot_cuda = format!("pub const CUDA_VERSION: u32 = {CUDA_VERSION};");
    if !include_str!("../src/snapshot/bindings.rs").contains(&snapshot_cuda) {
        return skip(format_args!(
            "built against CUDA {CUDA_VERSION} headers, not the snapshot's: nothing to compare"
        ));
    }
    if NcclVersion::HEADERS.to_string() != PINNED {
        return skip(format_args!(
            "built against NCCL {} headers, not the pinned {PINNED}: the snapshot is the pinned one's",
            NcclVersion::HEADERS
        ));
    }
    #[cfg_attr(not(nccl_device_api), allow(unused_mut))]
    let mut files = vec![
        (
            "bindings.rs",
            include_str!(concat!(env!("OUT_DIR"), "/bindings.rs")),
            include_str!("../src/snapshot/bindings.rs"),
        ),
        (
            "nccl_functions.rs",
            include_str!(concat!(env!("OUT_DIR"), "/nccl_functions.rs")),
            include_str!("../src/snapshot/nccl_functions.rs"),
        ),
        (
            "nccl_loaded.rs",
            include_str!(concat!(env!("OUT_DIR"), "/nccl_loaded.rs")),
            include_str!("../src/snapshot/nccl_loaded.rs"),
        ),
        (
            "cuda_driver.rs",
            include_str!(concat!(env!("OUT_DIR"), "/cuda_driver.rs")),
            include_str!("../src/snapshot/cuda_driver.rs"),
        ),
        (
            "facts.rs",
            include_str!(concat!(env!("OUT_DIR"), "/facts.rs")),
            include_str!("../src/snapshot/facts.rs"),
        ),
        (
            "initializers.rs",
            include_str!(concat!(env!("OUT_DIR"), "/initializers.rs")),
            include_str!("../src/snapshot/initializers.rs"),
        ),
    ];
    // The device API's bindings, where the headers have it (the pinned ones do).
    #[cfg(nccl_device_api)]
    files.push((
        "device.rs",
        include_str!(concat!(env!("OUT_DIR"), "/device.rs")),
        include_str!("../src/snapshot/device.rs"),
    ));
    for (file, generated, committed) in files {
        let first_difference = generated
            .lines()
            .zip(committed.lines())
            .position(|(g, c)| g != c);
        assert!(
            generated == committed,
            "src/snapshot/{file} differs from bindgen's output (first differing line: {first_difference:?}, \
             {} vs {} lines): run ci/regen and commit the result",
            generated.lines().count(),
            committed.lines().count()
        );
    }
}
