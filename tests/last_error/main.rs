//! NCCL's last-error message is read only by the `unsafe` `check_nccl_with_last_error`, never by the
//! safe `check_nccl`: counted with a stand-in `ncclGetLastError` (`counting_last_error.c`, preloaded in a
//! child process). Without a GPU, NCCL's own message for a failed init: the unsafe check carries it.

use std::path::PathBuf;

use metrale_gpu_sys::nccl::*;
use metrale_gpu_testkit::child;
use metrale_gpu_testkit::skip::skip;
use metrale_gpu_testkit::standin::{Load, StandIn};

/// Set in the child that preloads the stand-in.
const CHILD: &str = "METRALE_COUNTING_LAST_ERROR";

/// The stand-in's call counter, if the stand-in is what this process calls.
fn calls() -> Option<extern "C" fn() -> i32> {
    let name = c"metrale_counting_last_error_calls";
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only looks a symbol up.
    let symbol = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    // SAFETY: the stand-in defines this name as `int name(void)`.
    (!symbol.is_null()).then(|| unsafe {
        std::mem::transmute::<*mut libc::c_void, extern "C" fn() -> i32>(symbol)
    })
}

#[test]
fn only_the_unsafe_check_reads_nccls_last_error() {
    let test = "only_the_unsafe_check_reads_nccls_last_error";
    if std::env::var(CHILD).is_err() {
        let standin = StandIn {
            cc: env!("METRALE_TARGET_CC"),
            source: concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/last_error/counting_last_error.c"
            ),
            flags: &[],
            dir: PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("counting-last-error"),
            name: "libcounting_last_error.so",
            load: Load::Preload,
        };
        let text = standin.run(test, &[(CHILD, "1".into())]);
        if text.contains("SKIP") {
            skip(format_args!(
                "the child could not preload the stand-in (a cross-built binary?):\n{text}"
            ));
        }
        return;
    }
    let Some(calls) = calls() else {
        return skip("the counting stand-in is not loaded");
    };
    for code in [NcclResult::ncclInternalError, NcclResult::ncclRemoteError] {
        let err = check_nccl(code, "ncclAllReduce").expect_err("a failure code");
        let GpuError::Nccl { last_error, .. } = &err else {
            panic!("{err:?}")
        };
        assert_eq!(*last_error, None, "{err}");
        assert!(!err.to_string().contains("last error"), "{err}");
    }
    assert_eq!(calls(), 0, "the safe check read NCCL's last-error buffer");
    assert_eq!(
        // SAFETY: this child runs this one test on one thread: no other thread calls NCCL.
        unsafe { check_nccl_with_last_error(NcclResult::ncclSuccess, "ncclAllReduce") },
        Ok(())
    );
    assert_eq!(calls(), 0, "a success needs no message");
    // SAFETY: as above.
    let err = unsafe { check_nccl_with_last_error(NcclResult::ncclInternalError, "ncclAllReduce") }
        .expect_err("a failure code");
    assert_eq!(calls(), 1, "the unsafe check reads it once");
    assert!(
        err.to_string()
            .ends_with("; NCCL's last error: the stand-in's last error"),
        "{err}"
    );
}

#[test]
fn init_without_a_gpu_is_an_error_carrying_ncclgetlasterror() {
    if !child::alone("init_without_a_gpu_is_an_error_carrying_ncclgetlasterror") {
        return;
    }
    let id = NcclUniqueId::new().expect("ncclGetUniqueId");
    let mut comm: NcclComm = std::ptr::null_mut();
    // SAFETY: comm is valid for writes; NCCL reports the missing GPU as an error code.
    let result = unsafe { ncclCommInitRank(&mut comm, 1, id, 0) };
    // SAFETY: this child runs this one test on one thread (`child::alone`): no other thread calls NCCL,
    // and the failed init left no communicator whose threads could.
    let err = unsafe { check_nccl_with_last_error(result, "ncclCommInitRank(rank 0 of 1)") }
        .expect_err("no GPU here");
    let GpuError::Nccl { last_error, .. } = &err else {
        panic!("not an NCCL error: {err}")
    };
    let last = last_error
        .as_deref()
        .expect("NCCL says why in ncclGetLastError");
    assert!(
        err.to_string()
            .contains(&format!("NCCL's last error: {last}")),
        "{err}"
    );
    assert!(comm.is_null());
    // Bounded by NCCL's buffer (`char ncclLastError[1024]`, NUL included).
    assert!(
        !last.is_empty() && last.len() < 1024,
        "{} bytes",
        last.len()
    );
    // The safe check carries the code and its text only.
    let safe = check_nccl(result, "ncclCommInitRank").expect_err("no GPU here");
    assert!(
        matches!(
            safe,
            GpuError::Nccl {
                last_error: None,
                ..
            }
        ),
        "{safe:?}"
    );
}
