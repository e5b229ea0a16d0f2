//! Where each rank of a multi-process GPU test runs: R ranks, one process each (as in production), over
//! the G GPUs this host has. Pure: no GPU, no NCCL call; the harness ([`crate::ranks`]) applies it.
//!
//! Rank r runs on GPU `r % G`. Ranks that would share a GPU are put on **simulated hosts**, laid out like
//! a cluster of G-GPU hosts: host `r / G` (G = 2, R = 8: 4 hosts x 2 GPUs; G = 1: R hosts of one GPU).
//! Each simulated host is its own `NCCL_HOSTID`, so NCCL connects the ranks of one host as it would on a
//! real one (P2P, SHM) and the hosts through its network transport, `NET/Socket`, kept on the loopback
//! interface (`NCCL_SOCKET_IFNAME=lo`). Without a distinct host identity two processes on one GPU fail
//! NCCL's init ("Duplicate GPU detected").
//!
//! The second mode, [`Mode::MultiRankGpu`], keeps one host and sets `NCCL_MULTI_RANK_GPU_ENABLE=1`:
//! NCCL 2.30 and later then connect ranks that share a GPU through P2P/CUMEM. It is refused where the
//! loaded libnccl is older than [`MULTI_RANK_GPU_SINCE`] (the variable is ignored there, and the init
//! would fail as a duplicate GPU).
//!
//! Fewer ranks than GPUs (R < G) is no conflict: ranks take GPUs 0..R, one each, on the one real host,
//! and the other GPUs stay idle ([`Plan::gpus_used`]).
//!
//! The variables: [`RANKS`] (`METRALE_TEST_RANKS`, default 2) and [`MODE`] (`METRALE_TEST_PLACEMENT`,
//! `hosts` by default, or `multi-rank-gpu`). The GPU count comes from the driver.

use std::fmt;

use metrale_gpu_sys::version::NcclVersion;

/// The number of ranks of every multi-process GPU test.
pub const RANKS: &str = "METRALE_TEST_RANKS";
/// How ranks that share a GPU are told apart: `hosts` (default) or `multi-rank-gpu`.
pub const MODE: &str = "METRALE_TEST_PLACEMENT";
/// The rank count when [`RANKS`] is unset.
pub const DEFAULT_RANKS: usize = 2;
/// The first NCCL that reads `NCCL_MULTI_RANK_GPU_ENABLE` (an environment variable, so no header
/// macro says it; NCCL's release notes for 2.30 do).
pub const MULTI_RANK_GPU_SINCE: NcclVersion = NcclVersion {
    major: 2,
    minor: 30,
    patch: 0,
};
/// The prefix of every simulated host's `NCCL_HOSTID`, followed by the host's index.
pub const HOSTID_PREFIX: &str = "metrale-simulated-host-";

/// How ranks that share a GPU are told apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Simulated hosts of G GPUs each, their own `NCCL_HOSTID`, connected by sockets over loopback.
    Hosts,
    /// One host, `NCCL_MULTI_RANK_GPU_ENABLE=1` (NCCL 2.30+).
    MultiRankGpu,
}

impl Mode {
    /// The value of [`MODE`] that selects it.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Hosts => "hosts",
            Mode::MultiRankGpu => "multi-rank-gpu",
        }
    }

    pub fn parse(text: &str) -> Result<Mode, PlanError> {
        [Mode::Hosts, Mode::MultiRankGpu]
            .into_iter()
            .find(|m| m.name() == text.trim())
            .ok_or_else(|| PlanError::UnknownMode(text.to_string()))
    }
}

/// A request no placement can meet, in words a person can act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlanError {
    NoRanks,
    NoGpus,
    NotANumber { var: &'static str, value: String },
    UnknownMode(String),
    ModeNeedsNewerNccl { library: NcclVersion },
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanError::NoRanks => write!(f, "0 ranks requested: set {RANKS} to 1 or more"),
            PlanError::NoGpus => write!(
                f,
                "no GPU found: multi-rank tests need at least one (check nvidia-smi and CUDA_VISIBLE_DEVICES)"
            ),
            PlanError::NotANumber { var, value } => {
                write!(f, "{var}={value:?} is not a rank count: set it to a number such as 2 or 8")
            }
            PlanError::UnknownMode(value) => write!(
                f,
                "{MODE}={value:?} is no placement: use '{}' or '{}'",
                Mode::Hosts.name(),
                Mode::MultiRankGpu.name()
            ),
            PlanError::ModeNeedsNewerNccl { library } => write!(
                f,
                "{MODE}={} needs NCCL {MULTI_RANK_GPU_SINCE} or later (NCCL_MULTI_RANK_GPU_ENABLE), but the \
                 loaded libnccl is {library}: use {MODE}={} (simulated hosts) or load a newer libnccl",
                Mode::MultiRankGpu.name(),
                Mode::Hosts.name()
            ),
        }
    }
}

impl std::error::Error for PlanError {}

/// One rank's place: its GPU (device ordinal) and its host (0 for the real one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    pub rank: usize,
    pub device: usize,
    pub host: usize,
}

/// R ranks over G GPUs (see the module's docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    ranks: usize,
    gpus: usize,
    mode: Mode,
}

impl Plan {
    /// `ranks` over `gpus` in `mode`, for the loaded libnccl `library`.
    pub fn new(
        ranks: usize,
        gpus: usize,
        mode: Mode,
        library: NcclVersion,
    ) -> Result<Plan, PlanError> {
        if ranks == 0 {
            return Err(PlanError::NoRanks);
        }
        if gpus == 0 {
            return Err(PlanError::NoGpus);
        }
        if mode == Mode::MultiRankGpu && library < MULTI_RANK_GPU_SINCE {
            return Err(PlanError::ModeNeedsNewerNccl { library });
        }
        Ok(Plan { ranks, gpus, mode })
    }

    /// The plan [`RANKS`] and [`MODE`] ask for, as `var` reads them, over `gpus` GPUs.
    pub fn from_vars(
        var: &dyn Fn(&str) -> Option<String>,
        gpus: usize,
        library: NcclVersion,
    ) -> Result<Plan, PlanError> {
        let ranks = match var(RANKS) {
            None => DEFAULT_RANKS,
            Some(v) => v.trim().parse().map_err(|_| PlanError::NotANumber {
                var: RANKS,
                value: v.clone(),
            })?,
        };
        let mode = var(MODE).map_or(Ok(Mode::Hosts), |v| Mode::parse(&v))?;
        Plan::new(ranks, gpus, mode, library)
    }

    /// [`Plan::from_vars`] from this process's environment.
    pub fn from_env(gpus: usize, library: NcclVersion) -> Result<Plan, PlanError> {
        Plan::from_vars(&|name| std::env::var(name).ok(), gpus, library)
    }

    /// The same placement for `ranks` ranks (a test of a fixed size).
    pub fn with_ranks(&self, ranks: usize) -> Result<Plan, PlanError> {
        if ranks == 0 {
            return Err(PlanError::NoRanks);
        }
        Ok(Plan { ranks, ..*self })
    }

    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// The GPUs this host has.
    pub fn gpus(&self) -> usize {
        self.gpus
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The GPUs ranks run on: GPUs 0..this.
    pub fn gpus_used(&self) -> usize {
        self.ranks.min(self.gpus)
    }

    /// Hosts, simulated ones included (1 in [`Mode::MultiRankGpu`], and whenever R <= G).
    pub fn hosts(&self) -> usize {
        match self.mode {
            Mode::Hosts => self.ranks.div_ceil(self.gpus),
            Mode::MultiRankGpu => 1,
        }
    }

    /// Whether some GPU runs more than one rank.
    pub fn shares_gpus(&self) -> bool {
        self.ranks > self.gpus
    }

    pub fn place(&self, rank: usize) -> Place {
        assert!(
            rank < self.ranks,
            "rank {rank} outside a plan of {}",
            self.ranks
        );
        let host = match self.mode {
            Mode::Hosts => rank / self.gpus,
            Mode::MultiRankGpu => 0,
        };
        Place {
            rank,
            device: rank % self.gpus,
            host,
        }
    }

    /// What NCCL must see in rank `rank`'s process for this placement (the harness adds the rank and
    /// its device). Nothing on one real host: that is what production runs.
    pub fn nccl_env(&self, rank: usize) -> Vec<(&'static str, String)> {
        let place = self.place(rank);
        if self.hosts() > 1 {
            vec![
                ("NCCL_HOSTID", format!("{HOSTID_PREFIX}{}", place.host)),
                ("NCCL_SOCKET_IFNAME", "lo".to_string()),
            ]
        } else if self.mode == Mode::MultiRankGpu {
            vec![("NCCL_MULTI_RANK_GPU_ENABLE", "1".to_string())]
        } else {
            Vec::new()
        }
    }

    /// The transport between ranks that this placement gives, in words.
    pub fn transport(&self) -> &'static str {
        if self.hosts() > 1 {
            "NET/Socket over lo between hosts, NCCL's own choice within one"
        } else if self.mode == Mode::MultiRankGpu && self.shares_gpus() {
            "NCCL_MULTI_RANK_GPU_ENABLE (P2P/CUMEM on a shared GPU)"
        } else {
            "NCCL's own choice on one host"
        }
    }
}

impl fmt::Display for Plan {
    /// `8 ranks on 1 GPU, 8 hosts (hosts): NET/Socket ...`: what a runner's table row names.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let plural = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
        write!(
            f,
            "{} on {}, {} ({}): {}",
            plural(self.ranks, "rank"),
            plural(self.gpus_used(), "GPU"),
            plural(self.hosts(), "host"),
            self.mode.name(),
            self.transport()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V2_29: NcclVersion = NcclVersion {
        major: 2,
        minor: 29,
        patch: 7,
    };
    const V2_30: NcclVersion = NcclVersion {
        major: 2,
        minor: 30,
        patch: 7,
    };

    #[test]
    fn every_rank_and_gpu_count_from_1_to_16() {
        for g in 1..=16 {
            for r in 1..=16 {
                let plan = Plan::new(r, g, Mode::Hosts, V2_29).unwrap();
                let hosts = r.div_ceil(g);
                assert_eq!(plan.hosts(), hosts, "R={r} G={g}");
                assert_eq!(plan.gpus_used(), r.min(g), "R={r} G={g}");
                assert_eq!(plan.shares_gpus(), r > g, "R={r} G={g}");
                let mut per_gpu_host = std::collections::HashSet::new();
                for rank in 0..r {
                    let p = plan.place(rank);
                    assert_eq!((p.device, p.host), (rank % g, rank / g), "R={r} G={g}");
                    assert!(p.device < plan.gpus_used() && p.host < hosts);
                    // No two ranks on one GPU of one host: NCCL's duplicate-GPU check passes.
                    assert!(per_gpu_host.insert((p.host, p.device)), "R={r} G={g}");
                    let env = plan.nccl_env(rank);
                    if hosts == 1 {
                        assert!(env.is_empty(), "R={r} G={g}: {env:?}");
                    } else {
                        assert_eq!(
                            env,
                            vec![
                                ("NCCL_HOSTID", format!("{HOSTID_PREFIX}{}", rank / g)),
                                ("NCCL_SOCKET_IFNAME", "lo".to_string())
                            ],
                            "R={r} G={g}"
                        );
                    }
                }
                // Every host but the last is full: G ranks each, as in a cluster of G-GPU hosts.
                for h in 0..hosts - 1 {
                    let members = (0..r).filter(|&k| plan.place(k).host == h).count();
                    assert_eq!(members, g, "R={r} G={g} host {h}");
                }
                // The multi-rank mode: one host, the same GPUs, its variable set.
                let multi = Plan::new(r, g, Mode::MultiRankGpu, V2_30).unwrap();
                assert_eq!(multi.hosts(), 1);
                for rank in 0..r {
                    assert_eq!(multi.place(rank).device, rank % g);
                    assert_eq!(multi.place(rank).host, 0);
                    assert_eq!(
                        multi.nccl_env(rank),
                        vec![("NCCL_MULTI_RANK_GPU_ENABLE", "1".to_string())]
                    );
                }
            }
        }
    }

    #[test]
    fn the_layouts_the_issue_names() {
        // G = 2, R = 8: 4 hosts x 2 GPUs.
        let plan = Plan::new(8, 2, Mode::Hosts, V2_29).unwrap();
        let places: Vec<(usize, usize)> = (0..8)
            .map(|r| (plan.place(r).host, plan.place(r).device))
            .collect();
        assert_eq!(
            places,
            [
                (0, 0),
                (0, 1),
                (1, 0),
                (1, 1),
                (2, 0),
                (2, 1),
                (3, 0),
                (3, 1)
            ]
        );
        assert_eq!(
            plan.to_string(),
            "8 ranks on 2 GPUs, 4 hosts (hosts): NET/Socket over lo between hosts, NCCL's own choice within one"
        );
        // G = 1: R hosts of one GPU.
        let one = Plan::new(4, 1, Mode::Hosts, V2_29).unwrap();
        assert_eq!(one.hosts(), 4);
        let ids: Vec<String> = (0..4).map(|r| one.nccl_env(r)[0].1.clone()).collect();
        assert_eq!(
            ids,
            [0, 1, 2, 3].map(|h| format!("{HOSTID_PREFIX}{h}")),
            "a distinct NCCL_HOSTID per rank"
        );
        // R < G: GPUs 0..R on the real host, nothing set.
        let few = Plan::new(2, 8, Mode::Hosts, V2_29).unwrap();
        assert_eq!((few.hosts(), few.gpus_used()), (1, 2));
        assert_eq!((few.place(1).device, few.place(1).host), (1, 0));
        assert!(few.nccl_env(0).is_empty() && few.nccl_env(1).is_empty());
        assert_eq!(
            few.to_string(),
            "2 ranks on 2 GPUs, 1 host (hosts): NCCL's own choice on one host"
        );
        let single = Plan::new(1, 1, Mode::Hosts, V2_29).unwrap();
        assert_eq!(
            single.to_string(),
            "1 rank on 1 GPU, 1 host (hosts): NCCL's own choice on one host"
        );
    }

    /// Variables as (name, value) pairs.
    type Vars<'a> = &'a [(&'a str, &'a str)];

    fn vars<'a>(pairs: Vars<'a>) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn the_variables() {
        let plan = Plan::from_vars(&vars(&[]), 1, V2_29).unwrap();
        assert_eq!((plan.ranks(), plan.mode()), (DEFAULT_RANKS, Mode::Hosts));
        let plan = Plan::from_vars(&vars(&[(RANKS, " 8 ")]), 1, V2_29).unwrap();
        assert_eq!(plan.ranks(), 8);
        let plan =
            Plan::from_vars(&vars(&[(RANKS, "4"), (MODE, "multi-rank-gpu")]), 1, V2_30).unwrap();
        assert_eq!(
            (plan.ranks(), plan.mode(), plan.hosts()),
            (4, Mode::MultiRankGpu, 1)
        );
        assert_eq!(
            plan.transport(),
            "NCCL_MULTI_RANK_GPU_ENABLE (P2P/CUMEM on a shared GPU)"
        );
        let sixteen = plan.with_ranks(16).unwrap();
        assert_eq!(
            (sixteen.ranks(), sixteen.mode(), sixteen.gpus()),
            (16, Mode::MultiRankGpu, 1)
        );
        assert_eq!(plan.with_ranks(0), Err(PlanError::NoRanks));
        let plan = Plan::from_vars(&vars(&[(MODE, "hosts")]), 2, V2_29).unwrap();
        assert_eq!(plan.mode(), Mode::Hosts);
    }

    #[test]
    fn impossible_requests_say_what_to_do() {
        let cases: [(Vars, usize, NcclVersion, &str); 6] = [
            (&[(RANKS, "0")], 1, V2_29, "0 ranks requested: set METRALE_TEST_RANKS to 1 or more"),
            (&[], 0, V2_29, "no GPU found"),
            (&[(RANKS, "eight")], 1, V2_29, "METRALE_TEST_RANKS=\"eight\" is not a rank count"),
            (&[(RANKS, "-2")], 1, V2_29, "is not a rank count"),
            (&[(MODE, "mps")], 1, V2_29, "METRALE_TEST_PLACEMENT=\"mps\" is no placement: use 'hosts' or 'multi-rank-gpu'"),
            (
                &[(MODE, "multi-rank-gpu")],
                1,
                V2_29,
                "METRALE_TEST_PLACEMENT=multi-rank-gpu needs NCCL 2.30.0 or later (NCCL_MULTI_RANK_GPU_ENABLE), \
                 but the loaded libnccl is 2.29.7",
            ),
        ];
        for (pairs, gpus, library, want) in cases {
            let err = Plan::from_vars(&vars(pairs), gpus, library).unwrap_err();
            assert!(err.to_string().contains(want), "{pairs:?}: {err}");
        }
        // 2.30.0 itself is accepted.
        let v2_30_0 = MULTI_RANK_GPU_SINCE;
        assert!(Plan::new(2, 1, Mode::MultiRankGpu, v2_30_0).is_ok());
    }
}
