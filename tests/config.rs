//! `NcclConfig::default()` and the other initializer `Default`s against what nccl.h says its
//! initializer macros hold. (Their bytes against the C compiler's own initializers, and every offset, are
//! checked in crates/systest/.)

use metrale_gpu_sys::nccl::*;

#[test]
fn default_config_is_the_headers_initializer() {
    let c = NcclConfig::default();
    assert_eq!(c.size, std::mem::size_of::<NcclConfig>());
    assert_eq!(c.magic, 0xcafe_beef);
    assert_eq!(c.version, NCCL_VERSION_CODE);
    if (NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH) == (2, 29, 7) {
        assert_eq!(c.version, 22907);
        assert_eq!(c.size, 88);
    }
    assert!(c.netName.is_null() && c.commName.is_null());
    #[allow(unused_mut)]
    let mut ints = vec![
        c.blocking,
        c.cgaClusterSize,
        c.minCTAs,
        c.maxCTAs,
        c.splitShare,
        c.trafficClass,
        c.collnetEnable,
        c.CTAPolicy,
        c.shrinkShare,
        c.nvlsCTAs,
    ];
    // Fields that newer headers added (the build sets nccl_2_<minor> for every minor up to the headers').
    #[cfg(nccl_2_28)]
    ints.extend([c.nChannelsPerNetPeer, c.nvlinkCentricSched]);
    #[cfg(nccl_2_29)]
    ints.extend([c.graphUsageMode, c.numRmaCtx]);
    assert!(ints.iter().all(|&v| v == i32::MIN), "{ints:?}");
    assert_eq!(NCCL_CONFIG_UNDEF_INT, i32::MIN);
}

#[test]
fn sim_info_default_is_the_headers_initializer() {
    let s = ncclSimInfo_t::default();
    assert_eq!(s.size, std::mem::size_of::<ncclSimInfo_t>());
    assert_eq!(s.magic, 0x7468_5283);
    assert_eq!(s.version, NCCL_VERSION_CODE);
    assert_eq!(s.estimatedTime, -1.0);
}

/// 2.31+'s per-collective config, where the header has its initializer (the build found it there).
#[cfg(nccl_macro = "NCCL_COLLCONFIG_INITIALIZER")]
#[test]
fn coll_config_default_is_the_headers_initializer() {
    let c = ncclCollConfig_t::default();
    assert_eq!(c.size, std::mem::size_of::<ncclCollConfig_t>());
    assert_eq!((c.magic, c.version), (NCCL_API_MAGIC, NCCL_VERSION_CODE));
    assert!(c.ext.is_null() && c.algSelection.is_null());
    let ints = [
        c.minCTAs,
        c.maxCTAs,
        c.nvlsCTAs,
        c.cgaClusterSize,
        c.CTAPolicy,
    ];
    assert_eq!(ints, [i32::MIN; 5]);
    assert_eq!((c.forceAlgSelection, c.userProfilerTag), (1, 0));
}

#[cfg(not(nccl_macro = "NCCL_COLLCONFIG_INITIALIZER"))]
#[test]
fn coll_config_default_is_the_headers_initializer() {
    metrale_gpu_testkit::skip::skip("nccl.h defines no NCCL_COLLCONFIG_INITIALIZER (NCCL 2.31+)");
}

#[test]
fn a_helper_stream_is_the_stream_nccl_takes() {
    // CUstream and cudaStream_t are one type: this assignment compiles only if they are.
    let stream: CUstream = std::ptr::null_mut();
    let _: cudaStream_t = stream;
}

#[test]
fn selectors_accept_values_the_header_does_not_list() {
    // ncclRedOpCreatePreMulSum writes op values past ncclNumOps; a newer library returns new codes.
    let custom = NcclRedOp(NcclRedOp::ncclNumOps.0 + 3);
    assert_ne!(custom, NcclRedOp::ncclSum);
    let future = NcclResult(8);
    assert_ne!(future, NcclResult::ncclSuccess);
    assert_eq!(
        std::mem::size_of::<NcclResult>(),
        std::mem::size_of::<std::os::raw::c_uint>()
    );
}

#[test]
fn comm_name_is_set_from_a_static_string() {
    static NAME: &std::ffi::CStr = c"trainer-dp0";
    let mut config = NcclConfig::default();
    config.set_comm_name(NAME);
    assert_eq!(config.commName, NAME.as_ptr());
    // SAFETY: commName points to NAME, which lives for the whole program.
    assert_eq!(unsafe { std::ffi::CStr::from_ptr(config.commName) }, NAME);
    assert!(config.netName.is_null(), "only commName is set");
}

#[test]
fn cuda_codes_print_their_header_names() {
    let oom = CUresult::CUDA_ERROR_OUT_OF_MEMORY;
    assert_eq!(
        format!("{oom:?}"),
        format!("CUresult(CUDA_ERROR_OUT_OF_MEMORY = {})", oom.0)
    );
    assert_eq!(oom.to_string(), "CUDA_ERROR_OUT_OF_MEMORY");
    assert_eq!(oom.name(), Some("CUDA_ERROR_OUT_OF_MEMORY"));
    assert_eq!(CUresult::CUDA_SUCCESS.name(), Some("CUDA_SUCCESS"));
    assert_eq!(
        CUresult::CUDA_ERROR_NOT_READY.name(),
        Some("CUDA_ERROR_NOT_READY")
    );
    // A code cuda.h does not list is still a value, printed as its number.
    let unknown = CUresult(123_456);
    assert_eq!(unknown.name(), None);
    assert_eq!(format!("{unknown:?}"), "CUresult(123456)");
}
