//! `ncclConfig_t` through `ncclCommInitRankConfig`, one process per rank: the default, non-blocking
//! communicators, the fields NCCL reports; and configs NCCL must refuse (one process, 1-rank
//! communicators).

use metrale_gpu_sys::cuda;
use metrale_gpu_sys::nccl::*;

use metrale_gpu_testkit::ranks::Job;

use crate::common::*;
use crate::data;

fn smoke_cases(world: &World, tally: &mut Tally, seed: u64) {
    let counts = [1usize, 65_539, sized(world, (4 << 20) + 1, 65_539 + 8)];
    for (i, count) in counts.into_iter().enumerate() {
        let s = seed + i as u64;
        let f32 = &data::FLOAT32;
        for case in [
            Case::new(Coll::AllReduce(Op::Sum), f32, count, false, s),
            Case::new(Coll::AllReduce(Op::Sum), f32, count, true, s + 100),
            Case::new(Coll::AllGather, &data::FLOAT16, count, false, s + 200),
        ] {
            tally.case(world, case);
        }
    }
}

#[test]
#[ignore = "needs a GPU: run through ci/gpu-run.sh"]
fn config_default_init_rank_config() {
    ranks::test("config::config_default_init_rank_config").run_raw(|me| {
        let config = NcclConfig::default();
        assert_eq!(
            config.size,
            std::mem::size_of::<NcclConfig>(),
            "config.size"
        );
        assert_eq!(config.magic, 0xcafe_beef, "config.magic");
        assert_eq!(config.blocking, NCCL_CONFIG_UNDEF_INT, "config.blocking");
        let (world, res) = me.join_config(config).expect("init with the default");
        assert_eq!(res, NcclResult::ncclSuccess, "a blocking init's status");
        let mut tally = Tally::new();
        smoke_cases(&world, &mut tally, 5000);
        tally.finish("config_default_init_rank_config");
    });
}

/// `blocking = 0`: init and collectives return `ncclInProgress` and complete by polling
/// `ncclCommGetAsyncError`; finalize too.
#[test]
#[ignore = "needs a GPU: run through ci/gpu-run.sh"]
fn config_nonblocking_in_progress_polling() {
    ranks::test("config::config_nonblocking_in_progress_polling").run_raw(|me| {
        let (mut world, res) = me
            .join_config(NcclConfig {
                blocking: 0,
                ..NcclConfig::default()
            })
            .expect("non-blocking init");
        println!("non-blocking init returned {res:?}");
        assert_eq!(
            res,
            NcclResult::ncclInProgress,
            "a non-blocking init returns ncclInProgress"
        );
        assert!(!world.blocking);
        let mut tally = Tally::new();
        smoke_cases(&world, &mut tally, 5100);
        println!(
            "non-blocking collectives: {} of the groups returned ncclInProgress and were polled to completion",
            world.in_progress_seen.get()
        );
        world.sync_all().expect("sync every stream");
        // Finalize is non-blocking too: in a group, then polled, then destroy.
        let comms = world.comms.clone();
        let fin = group_with("ncclCommFinalize", comms.len(), false, |i| {
            // SAFETY: a live, idle communicator, finalized once.
            unsafe { ncclCommFinalize(comms[i]) }
        })
        .expect("ncclCommFinalize");
        println!("non-blocking finalize: ncclGroupEnd returned {fin:?}");
        wait_comms(&comms, "ncclCommFinalize").expect("finalize completes");
        for &c in &comms {
            // SAFETY: finalized above, destroyed once; the world forgets it below.
            check_nccl(unsafe { ncclCommDestroy(c) }, "ncclCommDestroy").expect("destroy");
        }
        world.forget_comms();
        tally.finish("config_nonblocking_in_progress_polling");
    });
}

/// What NCCL logs when it takes a config field: `Comm config <label> set to <value>` (NCCL_DEBUG
/// subsystem ENV). The child sets these.
const REPORTED: [(&str, &str); 6] = [
    ("Comm name", "metrale-gpu-config"),
    ("Net name", "Socket"),
    ("Min CTAs", "2"),
    ("Max CTAs", "4"),
    ("Split share", "1"),
    ("CTA policy flags", "1"),
];

/// commName, netName ("Socket"), minCTAs/maxCTAs, splitShare and CTAPolicy are accepted, and take
/// effect where NCCL reports them (its INFO log, read from every rank, started with NCCL_DEBUG=INFO).
#[test]
#[ignore = "needs a GPU: run through ci/gpu-run.sh"]
fn config_fields_take_effect() {
    const TEST: &str = "config::config_fields_take_effect";
    if let Some(me) = Me::get(TEST) {
        config_rank(&me);
        me.done();
        return;
    }
    let plan = ranks::plan();
    let env = [
        ("NCCL_DEBUG", "INFO".to_string()),
        ("NCCL_DEBUG_SUBSYS", "INIT,ENV,NET".to_string()),
    ];
    let done = Job::start(TEST, plan, &env).wait(ranks::limit());
    ranks::expect_ranks_ok(TEST, &plan, &done);

    let mut problems = Vec::new();
    for f in &done {
        let log = &f.output;
        // netName = "Socket": the network NCCL chose.
        let networks: Vec<&str> = log
            .lines()
            .filter_map(|l| l.split("Using network ").nth(1))
            .collect();
        println!("{}: networks NCCL used: {networks:?}", f.name);
        if networks.is_empty() || networks.iter().any(|n| n.trim() != "Socket") {
            problems.push(format!(
                "{}: netName Socket: NCCL used {networks:?}",
                f.name
            ));
        }
        // minCTAs/maxCTAs: the channels of every communicator lie in [2, 4].
        let channels: Vec<usize> = log
            .lines()
            .filter_map(|l| {
                l.split(" coll channels")
                    .next()
                    .filter(|_| l.contains(" coll channels"))
            })
            .filter_map(|head| head.split_whitespace().last()?.parse().ok())
            .collect();
        println!("{}: coll channels per communicator: {channels:?}", f.name);
        if channels.is_empty() || channels.iter().any(|&c| !(2..=4).contains(&c)) {
            problems.push(format!(
                "{}: minCTAs 2 / maxCTAs 4: coll channels {channels:?} (none reported, or outside [2, 4])",
                f.name
            ));
        }
        // Each field, where this NCCL reports its config.
        let reports = log.contains("Comm config ");
        for (label, value) in REPORTED {
            let want = format!("Comm config {label} set to {value}");
            let seen = log.contains(&want);
            println!(
                "{}: {label:<17} {}",
                f.name,
                if seen {
                    "reported as set".to_string()
                } else if reports {
                    format!("NOT reported (expected '{want}')")
                } else {
                    "this NCCL does not report config fields".to_string()
                }
            );
            if reports && !seen {
                problems.push(format!("{}: '{want}' missing from NCCL's log", f.name));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "config fields: {}",
        problems.join("; ")
    );
}

/// A rank of `config_fields_take_effect`: its communicator with the config set, then a split of it.
fn config_rank(me: &Me) {
    let (world, _) = me
        .join_config(NcclConfig {
            commName: c"metrale-gpu-config".as_ptr(),
            netName: c"Socket".as_ptr(),
            minCTAs: 2,
            maxCTAs: 4,
            splitShare: 1,
            CTAPolicy: NCCL_CTA_POLICY_EFFICIENCY as i32,
            ..NcclConfig::default()
        })
        .expect("init with the config");
    let mut tally = Tally::new();
    smoke_cases(&world, &mut tally, 5200);
    // A split inherits the config (NULL config) and, with splitShare, shares the parent's resources.
    let mut split = vec![std::ptr::null_mut(); world.n()];
    world
        .group("ncclCommSplit", |i| {
            // SAFETY: a live parent; writes one handle; a NULL config inherits the parent's.
            unsafe {
                ncclCommSplit(
                    world.comms[i],
                    0,
                    world.ranks[i] as i32,
                    &mut split[i],
                    std::ptr::null_mut(),
                )
            }
        })
        .expect("split with splitShare");
    let child = World::from_comms(split, true);
    smoke_cases(&child, &mut tally, 5300);
    drop(child);
    drop(world);
    tally.finish("config rank");
}

/// A config whose magic or size is wrong is refused with ncclInvalidArgument, before any
/// communication (a 1-rank communicator, so that nothing could hang).
#[test]
#[ignore = "needs a GPU: run through ci/gpu-run.sh"]
fn config_bad_magic_or_size_refused() {
    gpus();
    cuda::use_device(0, "config test").expect("use_device");
    let try_init = |what: &str, config: &mut NcclConfig| -> NcclResult {
        let id = NcclUniqueId::new().expect("ncclGetUniqueId");
        let mut comm: NcclComm = std::ptr::null_mut();
        // SAFETY: writes one handle; the config is readable for config.size bytes or more.
        let res = unsafe { ncclCommInitRankConfig(&mut comm, 1, id, 0, config) };
        match check_nccl(res, what) {
            Ok(()) => {
                println!("{what}: accepted");
                // SAFETY: a communicator NCCL just made; destroyed once.
                check_nccl(unsafe { ncclCommDestroy(comm) }, "ncclCommDestroy").expect("destroy");
            }
            Err(e) => println!("{what}: refused: {e}"),
        }
        res
    };
    let mut failures = Vec::new();
    let mut expect = |what: &str, config: &mut NcclConfig, want: NcclResult| {
        let got = try_init(what, config);
        if got != want {
            failures.push(format!("{what}: NCCL returned {got:?}, expected {want:?}"));
        }
    };
    expect(
        "default config",
        &mut NcclConfig::default(),
        NcclResult::ncclSuccess,
    );
    let config = |edit: &dyn Fn(&mut NcclConfig)| {
        let mut c = NcclConfig::default();
        edit(&mut c);
        c
    };
    let mut refused = vec![
        (
            "magic 0xdeadbeef".to_string(),
            config(&|c| c.magic = 0xdead_beef),
        ),
        ("magic 0 (a zeroed config)".into(), config(&|c| c.magic = 0)),
        ("blocking 5".into(), config(&|c| c.blocking = 5)),
    ];
    // Sizes that stop before the magic (offset 8, 4 bytes): NCCL copies `size` bytes only.
    for size in [0, 8, 11] {
        refused.push((format!("size {size}"), config(&|c| c.size = size)));
    }
    for (what, mut c) in refused {
        expect(&what, &mut c, NcclResult::ncclInvalidArgument);
    }
    // A size larger than the struct is clamped by NCCL by design (a newer header's config): reported,
    // not required either way.
    let mut c = config(&|c| c.size = std::mem::size_of::<NcclConfig>() + 64);
    let _either_way = try_init("size larger than ncclConfig_t (NCCL clamps it)", &mut c);
    assert!(failures.is_empty(), "{}", failures.join("; "));
}
