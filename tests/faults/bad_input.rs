//! Bad input gets NCCL's error code and its text, never a crash, and the communicator still works.

use std::os::raw::c_void;
use std::os::unix::process::ExitStatusExt;
use std::ptr::null_mut;
use std::time::Duration;

use metrale_gpu_sys::cuda;
use metrale_gpu_sys::nccl::*;
use metrale_gpu_watchdog as watchdog;

use crate::common::*;

/// Configs NCCL refuses: what is wrong, blocking, minCTAs, maxCTAs, and NCCL's message for it.
const BAD_CONFIGS: [(&str, i32, i32, i32, &str); 2] = [
    (
        "blocking = 7",
        7,
        NCCL_CONFIG_UNDEF_INT,
        NCCL_CONFIG_UNDEF_INT,
        "Invalid config blocking attribute value 7",
    ),
    (
        "minCTAs 8 > maxCTAs 2",
        NCCL_CONFIG_UNDEF_INT,
        8,
        2,
        "Invalid config min/max channels attribute value 8/2",
    ),
];

fn bad_config(blocking: i32, min_ctas: i32, max_ctas: i32) -> NcclConfig {
    let mut config = NcclConfig::default();
    config.blocking = blocking;
    config.minCTAs = min_ctas;
    config.maxCTAs = max_ctas;
    config
}

/// Checks that `res` is `code`, that NCCL's text for it (`ncclGetErrorString`) contains `text`, and that
/// `ncclGetLastError` names this failure (contains every one of `last`). Returns the error's message.
///
/// `ncclGetLastError` is process-wide, not per thread or per call (`bad_input_without_a_gpu_is_an_error_with_nccls_text` shows it), so every
/// case uses values no other case uses, and the call's name, to be sure the message is this call's.
///
/// # Safety
/// As for `check_nccl_with_last_error`: no other thread calls NCCL between the call that returned `res`
/// and this check's return (the process runs one test, on one thread, with no communicator of its
/// own at work).
pub unsafe fn expect_error(
    what: &str,
    res: NcclResult,
    code: NcclResult,
    text: &str,
    last: &[&str],
) -> Result<String, String> {
    // SAFETY: the caller's promise.
    let err = match unsafe { check_nccl_with_last_error(res, what) } {
        Ok(()) => {
            return Err(format!(
                "{what}: returned ncclSuccess, expected NCCL error {}",
                code.0
            ))
        }
        Err(e) => e,
    };
    let msg = err.to_string();
    let GpuError::Nccl {
        code: got,
        text: got_text,
        last_error,
        ..
    } = &err
    else {
        return Err(format!("{what}: not an NCCL error: {msg}"));
    };
    if *got != code {
        return Err(format!(
            "{what}: NCCL error {}, expected {}: {msg}",
            got.0, code.0
        ));
    }
    if !got_text.contains(text) {
        return Err(format!("{what}: text {got_text:?} lacks {text:?}"));
    }
    let last_error = last_error.clone().unwrap_or_default();
    if let Some(missing) = last.iter().find(|l| !last_error.contains(*l)) {
        return Err(format!(
            "{what}: ncclGetLastError {last_error:?} lacks {missing:?} ({msg})"
        ));
    }
    println!("ok    {what}: {msg}");
    Ok(msg)
}

/// Without a GPU (CI), NCCL 2.29.7 answers these deterministically: every call that takes a
/// communicator checks it first, so a NULL one is `ncclInvalidArgument` with "<call> : comm argument is
/// NULL" whatever the other arguments (a data type of 99 included); destroying, finalizing or aborting
/// NULL is a successful no-op; `ncclGroupEnd` outside a group is `ncclInvalidUsage`. Initialisation
/// validates its arguments and config only after initialising CUDA, so without a driver an invalid
/// config (blocking = 7, minCTAs > maxCTAs) or rank gets the CUDA error, not the config error: those
/// checks are GPU tests (`bad_input_on_gpus`).
#[test]
fn bad_input_without_a_gpu_is_an_error_with_nccls_text() {
    // NCCL's last-error message is read below: in a process of its own, with no other test's thread.
    if !child::alone("bad_input::bad_input_without_a_gpu_is_an_error_with_nccls_text") {
        return;
    }
    let mut x = [0f32; 16];
    let p: *mut c_void = x.as_mut_ptr().cast();
    let inv = NcclResult::ncclInvalidArgument;
    let ia = "invalid argument";
    let (f32t, sum) = (NcclDataType::ncclFloat32, NcclRedOp::ncclSum);
    let mut n = 0;
    let mut state = NcclResult::ncclSuccess;
    let mut handle = null_mut();
    let mut win = null_mut();
    let mut op = sum;
    let no_driver = matches!(
        cuda::driver("probe"),
        Err(GpuError::DriverUnavailable { .. })
    );
    let mut failures = Vec::new();
    let mut check = |r: Result<String, String>| {
        if let Err(e) = r {
            println!("FAIL  {e}");
            failures.push(e);
        }
    };
    // SAFETY: every call gets a NULL communicator, which NCCL checks before touching anything else;
    // the other pointers are valid host memory that NCCL never dereferences on this path. This test
    // runs alone in its process, on one thread (`child::alone`): NCCL's last error is this thread's.
    unsafe {
        check(expect_error(
            "ncclAllReduce(comm NULL)",
            ncclAllReduce(p, p, 1, f32t, sum, null_mut(), null_mut()),
            inv,
            ia,
            &["AllReduce : comm argument is NULL"],
        ));
        check(expect_error(
            "ncclAllReduce(comm NULL, datatype 99)",
            ncclAllReduce(
                p,
                p,
                1,
                NcclDataType(99),
                NcclRedOp(99),
                null_mut(),
                null_mut(),
            ),
            inv,
            ia,
            &["AllReduce : comm argument is NULL"],
        ));
        check(expect_error(
            "ncclBroadcast(comm NULL)",
            ncclBroadcast(p, p, 1, f32t, 0, null_mut(), null_mut()),
            inv,
            ia,
            &["Broadcast : comm argument is NULL"],
        ));
        check(expect_error(
            "ncclReduce(comm NULL)",
            ncclReduce(p, p, 1, f32t, sum, 0, null_mut(), null_mut()),
            inv,
            ia,
            &["Reduce : comm argument is NULL"],
        ));
        check(expect_error(
            "ncclAllGather(comm NULL)",
            ncclAllGather(p, p, 1, f32t, null_mut(), null_mut()),
            inv,
            ia,
            &["AllGather : comm argument is NULL"],
        ));
        check(expect_error(
            "ncclReduceScatter(comm NULL)",
            ncclReduceScatter(p, p, 1, f32t, sum, null_mut(), null_mut()),
            inv,
            ia,
            &["ReduceScatter : comm argument is NULL"],
        ));
        check(expect_error(
            "ncclSend(comm NULL)",
            ncclSend(p, 1, f32t, 0, null_mut(), null_mut()),
            inv,
            ia,
            &["Send : comm argument is NULL"],
        ));
        check(expect_error(
            "ncclRecv(comm NULL)",
            ncclRecv(p, 1, f32t, 0, null_mut(), null_mut()),
            inv,
            ia,
            &["Recv : comm argument is NULL"],
        ));
        check(expect_error(
            "ncclCommCount(NULL)",
            ncclCommCount(null_mut(), &mut n),
            inv,
            ia,
            &["CommCount : comm argument is NULL"],
        ));
        check(expect_error(
            "ncclCommCuDevice(NULL)",
            ncclCommCuDevice(null_mut(), &mut n),
            inv,
            ia,
            &["CommCuDevice : comm argument is NULL"],
        ));
        check(expect_error(
            "ncclCommUserRank(NULL)",
            ncclCommUserRank(null_mut(), &mut n),
            inv,
            ia,
            &["CommUserRank : comm argument is NULL"],
        ));
        check(expect_error(
            "ncclCommGetAsyncError(NULL)",
            ncclCommGetAsyncError(null_mut(), &mut state),
            inv,
            ia,
            &["ncclGetAsyncError : comm argument is NULL"],
        ));
        check(expect_error(
            "ncclCommRegister(NULL)",
            ncclCommRegister(null_mut(), p, 64, &mut handle),
            inv,
            ia,
            &["ncclCommRegister : comm argument is NULL"],
        ));
        // NCCL 2.28 and older initialise CUDA before they check the communicator here: without a
        // driver they answer with the CUDA error (still an error, never success). With a driver, NCCL
        // 2.28.9 then dereferences the NULL communicator: a segfault (seen on the GPU host), NCCL's bug,
        // which no binding can catch; so it is called only where there is no driver.
        if no_driver {
            let res = ncclCommWindowRegister(null_mut(), p, 64, &mut win, 0);
            if res == NcclResult::ncclUnhandledCudaError {
                check(expect_error(
                    "ncclCommWindowRegister(NULL) (CUDA initialised first)",
                    res,
                    NcclResult::ncclUnhandledCudaError,
                    "unhandled cuda error",
                    &["CUDA driver version is insufficient"],
                ));
            } else {
                check(expect_error(
                    "ncclCommWindowRegister(NULL)",
                    res,
                    inv,
                    ia,
                    &["ncclCommWindowRegister : comm argument is NULL"],
                ));
            }
        } else {
            println!("not called: ncclCommWindowRegister(NULL), which NCCL 2.28.9 segfaults on once CUDA is up");
        }
        let mut scalar = 2f32;
        check(expect_error(
            "ncclRedOpCreatePreMulSum(comm NULL)",
            ncclRedOpCreatePreMulSum(
                &mut op,
                (&mut scalar as *mut f32).cast(),
                f32t,
                ncclScalarResidence_t::ncclScalarHostImmediate,
                null_mut(),
            ),
            inv,
            ia,
            &["ncclRedOpCreatePreMulSum : comm argument is NULL"],
        ));
        check(expect_error(
            "ncclGroupEnd() outside a group",
            ncclGroupEnd(),
            NcclResult::ncclInvalidUsage,
            "invalid usage",
            &["ncclGroupEnd: not in a group call"],
        ));
        check(expect_error(
            "ncclGetUniqueId(NULL)",
            ncclGetUniqueId(null_mut()),
            inv,
            ia,
            &["GetUniqueId : out argument is NULL"],
        ));
        // ncclGetVersion(NULL) is an invalid argument too, but records no message: ncclGetLastError still
        // holds the previous failure's (so a GpuError's last_error may describe an earlier call).
        check(expect_error(
            "ncclGetVersion(NULL)",
            ncclGetVersion(null_mut()),
            inv,
            ia,
            &[],
        ));
        // Destroying, finalizing and aborting NULL are no-ops.
        for (what, res) in [
            ("ncclCommDestroy(NULL)", ncclCommDestroy(null_mut())),
            ("ncclCommFinalize(NULL)", ncclCommFinalize(null_mut())),
            ("ncclCommAbort(NULL)", ncclCommAbort(null_mut())),
        ] {
            if res != NcclResult::ncclSuccess {
                check(Err(format!("{what}: {:?}", check_nccl(res, what))));
            }
        }
    }
    // ncclGetLastError is process-wide: a failure on another thread shows on this one.
    // SAFETY: NULL out argument, checked by NCCL.
    let refused = std::thread::spawn(|| unsafe { ncclCommCount(null_mut(), null_mut()) })
        .join()
        .expect("thread");
    assert_ne!(
        refused,
        NcclResult::ncclSuccess,
        "ncclCommCount(NULL, NULL)"
    );
    // SAFETY: NULL out argument, checked by NCCL (it records no message of its own).
    let res = unsafe { ncclGetVersion(null_mut()) };
    // SAFETY: the other thread was joined before the call: this test's thread is the one calling NCCL.
    check(unsafe {
        expect_error(
            "ncclGetVersion(NULL) after another thread's failure",
            res,
            inv,
            ia,
            &["CommCount : comm argument is NULL"],
        )
    });

    // Without a driver the config is never looked at: CUDA's initialisation fails first.
    if matches!(
        cuda::driver("probe"),
        Err(GpuError::DriverUnavailable { .. })
    ) {
        let id = NcclUniqueId::new().expect("ncclGetUniqueId");
        let mut comm: NcclComm = null_mut();
        for (what, blocking, min, max, _) in BAD_CONFIGS {
            let mut config = bad_config(blocking, min, max);
            // SAFETY: comm and config are valid for the call.
            let res = unsafe { ncclCommInitRankConfig(&mut comm, 1, id, 0, &mut config) };
            // SAFETY: this test runs alone in its process, on one thread (`child::alone`).
            check(unsafe {
                expect_error(
                    &format!("ncclCommInitRankConfig({what}) without a driver"),
                    res,
                    NcclResult::ncclUnhandledCudaError,
                    "unhandled cuda error",
                    &["CUDA driver version is insufficient"],
                )
            });
            assert!(comm.is_null(), "a failed init left a handle");
        }
    } else {
        println!("a CUDA driver is present: the no-driver answers are not checked here (bad_input_on_gpus checks the config on GPUs)");
    }
    expect_no_failures(&failures);
}

/// On GPUs, one blocking communicator per rank's process: every bad argument is NCCL's
/// `ncclInvalidArgument` with its message, and a correct all-reduce over every rank (checked against
/// the host) works after each. Every rank makes the same bad calls on its own communicator; NCCL checks
/// them before it enqueues anything, so no rank waits for another.
#[test]
#[ignore = "needs a GPU: run through ci/gpu-run.sh"]
fn bad_input_on_gpus() {
    ranks::test("bad_input::bad_input_on_gpus").run_raw(bad_input_rank);
}

fn bad_input_rank(me: &Me) {
    const COUNT: usize = 1 << 18;
    let n = me.nranks;
    let mut summed = Summed::new(me.join(), COUNT);
    summed
        .check_all_reduce(100)
        .expect("a correct all-reduce first");
    let (c0, s0) = (summed.world.comms[0], summed.world.streams[0]);
    let (sb, rb) = (summed.send[0].at(0), summed.recv[0].at(0));
    let (f32t, sum) = (NcclDataType::ncclFloat32, NcclRedOp::ncclSum);
    let inv = NcclResult::ncclInvalidArgument;
    let ia = "invalid argument";
    let mut failures = Vec::new();
    let mut seed = 100;
    // A failed all-reduce ends the test: the communicator is aborted, and the handle copied above is
    // never used again.
    let mut case = |what: &str, r: Result<String, String>| {
        seed += 1;
        if let Err(e) = r {
            println!("FAIL  {e}");
            failures.push(e);
        }
        if let Err(e) = summed.check_all_reduce(seed) {
            failures.push(format!("{what}: the communicator no longer works: {e}"));
            expect_no_failures(&failures);
        }
        println!("      ... and a correct all-reduce after it");
    };
    // Out of range for `n` ranks, on either side.
    let (root, peer, rank) = (n as i32 + 3, n as i32 + 4, n as i32 + 3);
    let id = NcclUniqueId::new().expect("ncclGetUniqueId");
    // SAFETY: every call gets live handles and buffers of COUNT floats on this rank's device; NCCL checks
    // the bad argument before it enqueues anything (so nothing waits for another rank). Each rank is a
    // process of its own running this test on one thread, with its communicator idle between the
    // cases: NCCL's last error is this thread's.
    unsafe {
        case(
            "datatype 99",
            expect_error(
                "ncclAllReduce(datatype 99)",
                ncclAllReduce(sb, rb, COUNT, NcclDataType(99), sum, c0, s0),
                inv,
                ia,
                &["AllReduce", "invalid type 99"],
            ),
        );
        case(
            "op 98",
            expect_error(
                "ncclAllReduce(op 98)",
                ncclAllReduce(sb, rb, COUNT, f32t, NcclRedOp(98), c0, s0),
                inv,
                ia,
                &["AllReduce", "reduction operation 98"],
            ),
        );
        case(
            &format!("root {root}"),
            expect_error(
                &format!("ncclBroadcast(root {root} of {n})"),
                ncclBroadcast(sb, rb, COUNT, f32t, root, c0, s0),
                inv,
                ia,
                &["Broadcast", &format!("invalid root {root}")],
            ),
        );
        case(
            "root -3",
            expect_error(
                "ncclReduce(root -3)",
                ncclReduce(sb, rb, COUNT, f32t, sum, -3, c0, s0),
                inv,
                ia,
                &["Reduce", "invalid root -3"],
            ),
        );
        case(
            &format!("peer {peer}"),
            expect_error(
                &format!("ncclSend(peer {peer} of {n})"),
                ncclSend(sb, COUNT, f32t, peer, c0, s0),
                inv,
                ia,
                &["Send", &peer.to_string()],
            ),
        );
        case(
            "peer -2",
            expect_error(
                "ncclRecv(peer -2)",
                ncclRecv(rb, COUNT, f32t, -2, c0, s0),
                inv,
                ia,
                &["Recv", "-2"],
            ),
        );
        case(
            "null comm",
            expect_error(
                "ncclAllReduce(comm NULL)",
                ncclAllReduce(sb, rb, COUNT, f32t, sum, null_mut(), s0),
                inv,
                ia,
                &["AllReduce : comm argument is NULL"],
            ),
        );
        let mut comm: NcclComm = null_mut();
        cuda::use_device(me.device, "bad config").expect("use_device");
        for (what, blocking, min, max, message) in BAD_CONFIGS {
            let mut config = bad_config(blocking, min, max);
            case(
                what,
                expect_error(
                    &format!("ncclCommInitRankConfig({what})"),
                    ncclCommInitRankConfig(&mut comm, 1, id, 0, &mut config),
                    inv,
                    ia,
                    &[message],
                ),
            );
            assert!(comm.is_null(), "a refused config left a handle");
        }
        case(
            &format!("rank {rank} of {n}"),
            expect_error(
                &format!("ncclCommInitRank(rank {rank} of {n})"),
                ncclCommInitRank(&mut comm, n as i32, id, rank),
                inv,
                ia,
                &[&format!("Invalid rank requested : {rank}/{n}")],
            ),
        );
        assert!(comm.is_null(), "a refused init left a handle");
    }

    // A window whose address breaks NCCL_WIN_REQUIRED_ALIGNMENT (collective: every rank registers the
    // same misaligned offset of its own allocation). On one host NCCL refuses it on every rank. Across
    // hosts some NCCL versions register a communicator without symmetric support locally only, before
    // they look at the alignment: what NCCL does there is reported, and a window it made is deregistered.
    // (Registering again after a refusal is not tried: where NCCL refuses that on one rank alone, as
    // 2.28.9 did, the others would wait in the collective registration for ever.)
    let align = WIN_ALIGNMENT;
    let buf = nccl_mem_alloc(me.device, 8 * align).expect("ncclMemAlloc");
    let mut win: ncclWindow_t = null_mut();
    // SAFETY: a live communicator; the range lies inside this rank's allocation; writes one handle.
    let res = unsafe {
        ncclCommWindowRegister(
            c0,
            buf.cast::<u8>().add(1024).cast::<c_void>(),
            4 * align,
            &mut win,
            NCCL_WIN_COLL_SYMMETRIC as i32,
        )
    };
    let what = format!("ncclCommWindowRegister(address 1024 bytes past a {align} boundary)");
    if me.hosts > 1 && res == NcclResult::ncclSuccess {
        println!(
            "FAULT-OUTCOME misaligned window over {} hosts: registered (no symmetric support across hosts)",
            me.hosts
        );
        // SAFETY: the window just registered on this idle communicator, deregistered once.
        let res = unsafe { ncclCommWindowDeregister(c0, win) };
        check_nccl(res, "ncclCommWindowDeregister").expect("deregister");
        case("misaligned window", Ok(what));
    } else {
        case(
            "misaligned window",
            // SAFETY: this rank's process runs this test alone, on one thread; its communicator is idle.
            unsafe { expect_error(&what, res, inv, ia, &["aligned"]) },
        );
        assert!(
            win.is_null(),
            "a refused registration returned a window: {win:?}"
        );
    }
    // The communicator first: destroying it releases any window NCCL registered.
    drop(summed);
    // SAFETY: from nccl_mem_alloc, no longer registered (the communicator is gone) or used.
    unsafe { nccl_mem_free(buf) }.expect("ncclMemFree");
    if me.rank == 0 {
        measured(&format!(
            "{} bad-input cases at {n} ranks, {} failed on rank 0",
            11,
            failures.len()
        ));
    }
    expect_no_failures(&failures);
}

const NAME_CRASH: &str = "bad_input::bad_input_that_may_crash_in_a_child_process";

/// The inputs that may crash the process if NCCL does not catch them run in the ranks' own processes: a
/// count whose byte size overflows size_t, and a host pointer where a device pointer is needed (without
/// and with NCCL_CHECK_POINTERS=1), each case a job of every rank making the same call. What NCCL does is
/// recorded; no rank may crash or hang before it has reported an error (from the call, or the
/// watchdog's). A rank that dies by a signal in its exit after its communicator was aborted (NCCL 2.29.7
/// did, once in 8 ranks, after the count overflow) is NCCL's exit handlers in a faulted process: it is
/// listed in the measured line, not counted as a failure.
#[test]
#[ignore = "needs a GPU: run through ci/gpu-run.sh"]
fn bad_input_that_may_crash_in_a_child_process() {
    if Me::get(NAME_CRASH).is_some() {
        return ranks::test(NAME_CRASH).run_raw(bad_input_case);
    }
    let plan = ranks::test(NAME_CRASH).plan();
    let mut failures = Vec::new();
    let mut outcomes = Vec::new();
    let mut died_at_exit = Vec::new();
    for (case, extra) in [
        ("count-overflow", None),
        ("host-pointer", None),
        (
            "host-pointer",
            Some(("NCCL_CHECK_POINTERS", "1".to_string())),
        ),
    ] {
        let mut env = vec![(CASE_VAR, case.to_string())];
        env.extend(extra.clone());
        let name = format!(
            "{case}{}",
            if extra.is_some() {
                " with NCCL_CHECK_POINTERS=1"
            } else {
                ""
            }
        );
        let done = ranks::Job::start(NAME_CRASH, plan, &env).wait(ranks::limit());
        for f in &done {
            println!(
                "===== {name}: {} exited with {:?} =====\n{}===== end of {} =====",
                f.name, f.status, f.output, f.name
            );
            let outcome = f
                .output
                .lines()
                .find_map(|l| l.split_once("FAULT-OUTCOME ").map(|(_, o)| o.to_string()));
            match (f.ok(), outcome) {
                (true, Some(o)) => outcomes.push(format!("{name}: {o}")),
                // The fault was reported and the communicator aborted; what NCCL's and CUDA's exit
                // handlers then do in a faulted process is NCCL's behaviour, recorded for the report.
                (false, Some(o))
                    if o.contains("was aborted")
                        && f.status.is_some_and(|s| s.signal().is_some()) =>
                {
                    died_at_exit.push(format!("{name}, {}: {:?}", f.name, f.status));
                    outcomes.push(format!("{name}: {o}"));
                }
                (_, o) => failures.push(format!(
                    "{name}, {}: exit {:?} (a crash or hang), outcome {o:?}",
                    f.name, f.status
                )),
            }
        }
    }
    for o in &outcomes {
        println!("recorded: {o}");
    }
    // One entry per case (every rank's is the same but for its number): "<case>:<what happened>".
    let mut summary: Vec<String> = outcomes
        .iter()
        .map(|o| {
            let (case, rest) = o.split_once(": ").unwrap_or((o, ""));
            let what = rest.split_once(": ").map_or(rest, |(_, w)| w);
            format!("{case}:{}", what.split(';').next().unwrap_or(""))
        })
        .collect();
    summary.dedup();
    let after = if died_at_exit.is_empty() {
        String::new()
    } else {
        format!(
            "; died in the exit after reporting: {}",
            died_at_exit.join(", ")
        )
    };
    measured(&format!(
        "no crash at {}: {}{after}",
        plan,
        summary.join("; ")
    ));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `NCCL_WIN_REQUIRED_ALIGNMENT` (nccl.h defines it from 2.28 on; 2.27 required the same 4096 bytes).
#[cfg(nccl_2_28)]
const WIN_ALIGNMENT: usize = NCCL_WIN_REQUIRED_ALIGNMENT as usize;
#[cfg(not(nccl_2_28))]
const WIN_ALIGNMENT: usize = 4096;

pub const CASE_VAR: &str = "METRALE_FAULT_CASE";

/// The watchdog's deadline on an accepted bad call.
const CASE_WATCHDOG: Duration = Duration::from_secs(20);

/// A rank of `bad_input_that_may_crash_in_a_child_process`: one case on a non-blocking communicator (so
/// that every wait is bounded, even where NCCL refuses on some ranks and accepts on others), then
/// "FAULT-OUTCOME <what happened>" and a clean exit.
fn bad_input_case(me: &Me) {
    let case = std::env::var(CASE_VAR).expect("case");
    let checking = std::env::var("NCCL_CHECK_POINTERS").as_deref() == Ok("1");
    const COUNT: usize = 1 << 16;
    let mut config = NcclConfig::default();
    config.blocking = 0;
    let (world, _) = me.join_config(config).expect("non-blocking init");
    let mut summed = Summed::new(world, COUNT);
    summed
        .check_all_reduce(200)
        .expect("a correct all-reduce first");
    // No rank makes the bad call (and may exit) while a peer's proxy still moves the good one's data: a
    // closed socket would be that peer's error, not its outcome.
    me.barrier("good-all-reduce-done");
    let rank = me.rank;
    let mut host = inputs(201, rank, COUNT);
    let mut host_out = vec![f32::NAN; COUNT];
    let (count, send, recv): (usize, *mut c_void, *mut c_void) = match case.as_str() {
        // (usize::MAX / 4 + 2) floats: 4 * count wraps around to 4 bytes.
        "count-overflow" => (
            usize::MAX / 4 + 2,
            summed.send[0].at(0),
            summed.recv[0].at(0),
        ),
        "host-pointer" => (
            COUNT,
            host.as_mut_ptr().cast(),
            host_out.as_mut_ptr().cast(),
        ),
        other => panic!("unknown case {other}"),
    };
    let (comm, stream) = (summed.world.comms[0], summed.world.streams[0]);
    // SAFETY: a live communicator and stream; the pointers are the bad input under test (host memory
    // that outlives the wait, or device buffers smaller than the count): what NCCL does with them is
    // what this process observes, in its own process.
    let res = unsafe {
        ncclAllReduce(
            send,
            recv,
            count,
            NcclDataType::ncclFloat32,
            NcclRedOp::ncclSum,
            comm,
            stream,
        )
    };
    let works = |summed: &mut Summed, seed| match summed.check_all_reduce(seed) {
        Ok(()) => "the communicator still works".to_string(),
        Err(e) => format!("the communicator no longer works: {e}"),
    };
    let outcome = if res != NcclResult::ncclSuccess && res != NcclResult::ncclInProgress {
        // NCCL_CHECK_POINTERS' refusal is named only in NCCL's message ("not a valid pointer").
        // SAFETY: this process drives NCCL from this thread alone, its one communicator healthy until
        // this call (which failed before enqueuing anything): nothing writes NCCL's message meanwhile.
        let err =
            unsafe { check_nccl_with_last_error(res, "ncclAllReduce") }.expect_err("an error");
        format!("refused by the call: {err}; {}", works(&mut summed, 202))
    } else {
        // NCCL accepted it: the watchdog says how the collective ends (a CUDA fault, a hang, or done).
        // SAFETY: live handles; on an error the communicator is aborted and not used again.
        match unsafe { watchdog::wait_stream(comm, stream, CASE_WATCHDOG) } {
            Ok(()) => {
                let mut text = format!("ACCEPTED by NCCL; rank {rank} completed");
                if case == "host-pointer" {
                    let want = expected_sum(201, me.nranks, COUNT);
                    text.push_str(match compare("host-pointer output", &host_out, &want) {
                        Ok(()) => "; output correct (the GPU reached pageable host memory)",
                        Err(_) => "; output WRONG",
                    });
                }
                format!("{text}; {}", works(&mut summed, 203))
            }
            Err(e) => {
                // The communicator is aborted (and the context may hold a sticky CUDA error): leave it
                // and its buffers to the process's exit, as NCCL's own tests do after a fault.
                summed.world.forget_comms();
                std::mem::forget(summed);
                format!("ACCEPTED by NCCL; rank {rank}: {e}")
            }
        }
    };
    println!(
        "\nFAULT-OUTCOME {case}{}: {outcome}",
        if checking {
            " (NCCL_CHECK_POINTERS=1)"
        } else {
            ""
        }
    );
    if checking && case == "host-pointer" {
        assert!(
            outcome.starts_with("refused by the call") && outcome.contains("not a valid pointer"),
            "NCCL_CHECK_POINTERS=1 must refuse a host pointer: {outcome}"
        );
    }
    // Nobody exits before every outcome is recorded (an exit closes sockets a peer still waits on).
    me.barrier("outcomes-recorded");
    // The host buffers outlive every wait above (the collective has completed or was aborted).
    drop(host);
    drop(host_out);
}
