//! The linked libnccl, called on a machine without a GPU: what works on the CPU works, and what needs a GPU
//! fails with an error that says why.

use metrale_gpu_sys::nccl::*;
use metrale_gpu_sys::version::{self, NcclVersion};

#[test]
fn library_version_is_the_headers_version_unless_another_is_named() {
    // The build finds the library beside the headers; ci/setup installs the same version of both. A run
    // that names a newer library (METRALE_NCCL_LIBRARY: a user who upgraded libnccl before the crate)
    // loads that one.
    let library = version::library_version().expect("ncclGetVersion");
    assert_eq!(version::check_library_version(), Ok(library));
    let path = version::library_path().expect("dladdr finds libnccl");
    assert!(path.contains("libnccl.so"), "{path}");
    match std::env::var_os("METRALE_NCCL_LIBRARY") {
        None => assert_eq!(library, NcclVersion::HEADERS),
        Some(named) => {
            assert!(library >= NcclVersion::HEADERS, "{library}");
            let named = std::path::PathBuf::from(named);
            let canonical = |p: &std::path::Path| p.canonicalize().unwrap_or_else(|_| p.into());
            let file = if named.is_dir() {
                named.join("libnccl.so.2")
            } else {
                named
            };
            assert_eq!(
                canonical(path.as_ref()),
                canonical(&file),
                "the named library is the one"
            );
        }
    }
}

#[test]
fn every_result_code_has_nccl_text_and_failures_are_errors() {
    assert_eq!(check_nccl(NcclResult::ncclSuccess, "noop"), Ok(()));
    for code in 1..NcclResult::ncclNumResults.0 {
        let err =
            check_nccl(NcclResult(code), "ncclSomething(rank 3)").expect_err("a failure code");
        let msg = err.to_string();
        assert!(
            msg.starts_with("ncclSomething(rank 3) failed: NCCL error "),
            "{msg}"
        );
        assert!(msg.contains(&format!("error {code} (")), "{msg}");
        let GpuError::Nccl {
            text, code: got, ..
        } = err
        else {
            panic!("not an NCCL error: {msg}")
        };
        assert_eq!(got, NcclResult(code));
        assert!(
            !text.is_empty() && !text.contains("unknown"),
            "code {code}: {text}"
        );
    }
    // Specific texts from NCCL itself.
    let invalid = check_nccl(NcclResult::ncclInvalidArgument, "x")
        .expect_err("failure")
        .to_string();
    assert!(invalid.contains("invalid argument"), "{invalid}");
    let in_progress = check_nccl(NcclResult::ncclInProgress, "x")
        .expect_err("not success")
        .to_string();
    assert!(in_progress.contains("in progress"), "{in_progress}");
}

#[test]
fn unknown_result_codes_are_errors_with_their_code() {
    // 2.30 added ncclTimeout = 8; a newer library can return codes these headers do not list
    // (with the pinned 2.29.7 headers: 8, 9 and 1000).
    let first_unknown = NcclResult::ncclNumResults.0;
    for code in [first_unknown, first_unknown + 1, 1000] {
        let err = check_nccl(NcclResult(code), "ncclCommInitRank").expect_err("never success");
        let msg = err.to_string();
        assert!(msg.contains(&format!("NCCL error {code} ")), "{msg}");
        assert!(
            msg.contains("unknown to the NCCL") && msg.contains("the library is newer"),
            "{msg}"
        );
    }
}

#[test]
fn unique_ids_differ_and_round_trip_through_bytes() {
    let a = NcclUniqueId::new().expect("ncclGetUniqueId works without a GPU");
    let b = NcclUniqueId::new().expect("ncclGetUniqueId");
    assert_ne!(a.to_bytes(), b.to_bytes());
    assert_ne!(a.to_bytes(), [0u8; NcclUniqueId::BYTES]);
    let bytes: [u8; 128] = a.into();
    assert_eq!(NcclUniqueId::from(bytes), a);
    assert_eq!(NcclUniqueId::from_bytes(b.to_bytes()), b);
    // Debug prints the bytes in hex, one word, not 128 integers.
    let hex: String = a.to_bytes().iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(format!("{a:?}"), format!("ncclUniqueId({hex})"));
}

#[test]
fn version_verdict_names_both_versions() {
    let headers = NcclVersion {
        major: 2,
        minor: 29,
        patch: 7,
    };
    let older = NcclVersion::from_code(22809);
    assert_eq!(
        older,
        NcclVersion {
            major: 2,
            minor: 28,
            patch: 9
        }
    );
    let msg = version::compare(headers, older)
        .expect_err("older library")
        .to_string();
    assert!(msg.contains("2.28.9") && msg.contains("2.29.7"), "{msg}");
    assert_eq!(version::compare(headers, headers), Ok(()));
    assert_eq!(
        version::compare(headers, NcclVersion::from_code(23203)),
        Ok(())
    );
    assert_eq!(
        NcclVersion::from_code(2804),
        NcclVersion {
            major: 2,
            minor: 8,
            patch: 4
        }
    );
}

/// The loader's status for a call that could not reach a function names the function and the loaded
/// library, from any thread (the status alone says which); a code past the functions is NCCL's.
#[cfg(not(feature = "link"))]
#[test]
fn the_loaders_missing_function_status_names_the_function_and_the_library() {
    use metrale_gpu_sys::loader::MISSING_BASE;
    let path = version::library_path().expect("the loaded library");
    let err = std::thread::spawn(|| check_nccl(NcclResult(MISSING_BASE), "a call"))
        .join()
        .expect("the thread")
        .expect_err("an error");
    let GpuError::NcclFunctionMissing {
        function,
        library,
        library_path,
        ..
    } = &err
    else {
        panic!("not a missing function: {err}")
    };
    assert!(function.starts_with("nccl"), "{err}");
    assert_eq!(Ok(*library), version::library_version());
    assert_eq!(*library_path, path);
    let msg = err.to_string();
    assert!(
        msg.starts_with(&format!(
            "a call failed: the loaded libnccl {library} ({path}) lacks {function}"
        )),
        "{msg}"
    );
    let far = check_nccl(NcclResult(MISSING_BASE + 1_000_000), "a call").expect_err("an error");
    assert!(matches!(far, GpuError::Nccl { .. }), "{far}");
}
