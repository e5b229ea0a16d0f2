//! Who this process is in the job (its rank, the world size, its GPU on this host) and where rank 0
//! listens, from the command line or from the variables a launcher sets ([`placement`]; [`joiner`] for
//! a process that joins a running job), and the connection to rank 0 ([`connect`]). The examples'
//! rendezvous (`multi_process`, `elastic`) start here. A job whose ranks meet elsewhere than at rank 0
//! (the elastic library's membership in etcd) reads the same without rank 0's address ([`standing`],
//! [`local_rank`]).
//!
//! Sources, in this order (the first that is present gives the values):
//!
//! | source | rank | world size | local rank (GPU) |
//! | --- | --- | --- | --- |
//! | flags | `--rank` | `--world-size` | `--local-rank` |
//! | torchrun | `RANK` | `WORLD_SIZE` | `LOCAL_RANK` |
//! | Slurm (`srun`) | `SLURM_PROCID` | `SLURM_NTASKS` | `SLURM_LOCALID` |
//! | Open MPI (`mpirun`) | `OMPI_COMM_WORLD_RANK` | `OMPI_COMM_WORLD_SIZE` | `OMPI_COMM_WORLD_LOCAL_RANK` |
//! | PMI (MPICH, `srun --mpi=pmi2`) | `PMI_RANK` | `PMI_SIZE` | (none) |
//!
//! Flags are explicit and win outright (a flag not given falls back to the launchers). Between
//! launchers nothing is guessed: when two launchers' variables are present and disagree on the rank, the
//! world size or the local rank, that is an error naming both (`srun torchrun ...` is such a case: pass
//! flags, or unset the outer launcher's variables). A launcher whose rank is set without its size (or the
//! other way round) is an error too. The local rank defaults to 0 where the source has none (one GPU per
//! host). Rank 0's address is `--master HOST:PORT`, else `MASTER_ADDR` and `MASTER_PORT` (default 29500),
//! whatever the launcher: a Slurm batch script sets `MASTER_ADDR` from `scontrol show hostnames`, as it
//! does for torchrun.

use std::collections::HashMap;
use std::fmt;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Where this process stands, and which source said so.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub rank: u32,
    pub world_size: u32,
    pub local_rank: u32,
    /// `HOST:PORT` of rank 0's rendezvous.
    pub master: String,
    /// Where the rank and world size came from (`"flags"`, `"torchrun"`, `"Slurm"`, ...).
    pub source: &'static str,
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}, rank 0 at {}", self.standing(), self.master)
    }
}

impl Placement {
    /// Where this process stands, without rank 0's address.
    pub fn standing(&self) -> Standing {
        Standing {
            rank: self.rank,
            world_size: self.world_size,
            local_rank: self.local_rank,
            source: self.source,
        }
    }
}

/// Where this process stands, and which source said so, without rank 0's address ([`standing`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Standing {
    pub rank: u32,
    pub world_size: u32,
    pub local_rank: u32,
    /// Where the rank and world size came from (`"flags"`, `"torchrun"`, `"Slurm"`, ...).
    pub source: &'static str,
}

impl fmt::Display for Standing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rank {} of {}, local rank {} (from {})",
            self.rank, self.world_size, self.local_rank, self.source
        )
    }
}

/// A launcher's variables: its name, then rank, world size and local rank (if it has one).
struct Launcher {
    name: &'static str,
    rank: &'static str,
    size: &'static str,
    local: Option<&'static str>,
}

/// The launchers, in the order they are consulted.
const LAUNCHERS: [Launcher; 4] = [
    Launcher {
        name: "torchrun",
        rank: "RANK",
        size: "WORLD_SIZE",
        local: Some("LOCAL_RANK"),
    },
    Launcher {
        name: "Slurm",
        rank: "SLURM_PROCID",
        size: "SLURM_NTASKS",
        local: Some("SLURM_LOCALID"),
    },
    Launcher {
        name: "Open MPI",
        rank: "OMPI_COMM_WORLD_RANK",
        size: "OMPI_COMM_WORLD_SIZE",
        local: Some("OMPI_COMM_WORLD_LOCAL_RANK"),
    },
    Launcher {
        name: "PMI",
        rank: "PMI_RANK",
        size: "PMI_SIZE",
        local: None,
    },
];

/// What one source says: (rank, world size, local rank), each with the variable or flag it came from.
struct Said {
    source: &'static str,
    rank: (u32, String),
    size: (u32, String),
    local: Option<(u32, String)>,
}

/// The flags and variables [`placement`] reads, for a program's usage line.
pub const USAGE: &str = "[--rank R --world-size N --local-rank G --master HOST:PORT]\n\
    (or the variables torchrun, srun or mpirun set: RANK/WORLD_SIZE/LOCAL_RANK, SLURM_PROCID/SLURM_NTASKS/\
    SLURM_LOCALID, OMPI_COMM_WORLD_RANK/_SIZE/_LOCAL_RANK, PMI_RANK/PMI_SIZE; with MASTER_ADDR and MASTER_PORT)";

fn number(text: &str, name: &str) -> Result<u32, String> {
    text.trim()
        .parse()
        .map_err(|_| format!("{name} is not a number: '{text}'"))
}

/// What the flags and the launchers' variables say, the launchers checked against each other.
struct Sources<'a> {
    flags: HashMap<&'a str, String>,
    said: Vec<Said>,
    env: &'a dyn Fn(&str) -> Option<String>,
}

fn sources<'a>(
    args: &'a [String],
    env: &'a dyn Fn(&str) -> Option<String>,
) -> Result<Sources<'a>, String> {
    let mut flags = HashMap::new();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        if !matches!(
            flag.as_str(),
            "--rank" | "--world-size" | "--local-rank" | "--master"
        ) {
            return Err(format!("unknown argument '{flag}'"));
        }
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        flags.insert(flag.as_str(), value.clone());
    }

    let mut said = Vec::new();
    for l in &LAUNCHERS {
        let var = |name: &'static str| -> Result<Option<(u32, String)>, String> {
            env(name)
                .map(|v| Ok((number(&v, name)?, format!("{name}={v}"))))
                .transpose()
        };
        let (rank, size) = (var(l.rank)?, var(l.size)?);
        let local = l.local.map(var).transpose()?.flatten();
        match (rank, size) {
            (Some(rank), Some(size)) => said.push(Said {
                source: l.name,
                rank,
                size,
                local,
            }),
            (None, None) => {}
            (Some(_), None) => {
                return Err(format!(
                    "{}'s {} is set but {} is not",
                    l.name, l.rank, l.size
                ))
            }
            (None, Some(_)) => {
                return Err(format!(
                    "{}'s {} is set but {} is not",
                    l.name, l.size, l.rank
                ))
            }
        }
    }
    // Two launchers that disagree: an error naming both, never a guess.
    for (i, a) in said.iter().enumerate() {
        for b in &said[i + 1..] {
            let disagree = |x: &(u32, String), y: &(u32, String), what: &str| {
                (x.0 != y.0).then(|| {
                    format!(
                        "two launchers disagree on the {what}: {} ({}) but {} ({}); pass --rank/--world-size/--local-rank, \
                         or unset one launcher's variables",
                        x.1, a.source, y.1, b.source
                    )
                })
            };
            let local = match (&a.local, &b.local) {
                (Some(x), Some(y)) => disagree(x, y, "local rank"),
                _ => None,
            };
            if let Some(e) = disagree(&a.rank, &b.rank, "rank")
                .or_else(|| disagree(&a.size, &b.size, "world size"))
                .or(local)
            {
                return Err(e);
            }
        }
    }
    Ok(Sources { flags, said, env })
}

impl Sources<'_> {
    fn flag(&self, name: &str) -> Result<Option<(u32, String)>, String> {
        self.flags
            .get(name)
            .map(|v| Ok((number(v, name)?, name.to_string())))
            .transpose()
    }

    /// The GPU on this host: `--local-rank`, else the first launcher that has one, else 0.
    fn local_rank(&self) -> Result<u32, String> {
        let from_env = self.said.iter().find_map(|s| s.local.as_ref());
        Ok(pick(self.flag("--local-rank")?, from_env).unwrap_or(0))
    }

    /// The rank, the world size and the local rank, and which source gave them.
    fn standing(&self) -> Result<Standing, String> {
        let first = self.said.first();
        let (rank_flag, size_flag) = (self.flag("--rank")?, self.flag("--world-size")?);
        let source = match (&rank_flag, &size_flag, first) {
            (Some(_), Some(_), _) | (_, _, None) => "flags",
            (_, _, Some(s)) => s.source,
        };
        let rank = pick(rank_flag, first.map(|s| &s.rank))
            .ok_or("no rank: pass --rank, or run under torchrun, srun or mpirun")?;
        let world_size = pick(size_flag, first.map(|s| &s.size))
            .ok_or("no world size: pass --world-size, or run under torchrun, srun or mpirun")?;
        let local_rank = self.local_rank()?;
        if world_size == 0 || rank >= world_size {
            return Err(format!("rank {rank} is outside a world of {world_size}"));
        }
        Ok(Standing {
            rank,
            world_size,
            local_rank,
            source,
        })
    }

    /// `--master`, else `MASTER_ADDR:MASTER_PORT` (port 29500 by default).
    fn master(&self) -> Result<String, String> {
        if let Some(m) = self.flags.get("--master") {
            return Ok(m.clone());
        }
        let addr = (self.env)("MASTER_ADDR").ok_or(
            "missing --master HOST:PORT (or MASTER_ADDR): where rank 0 listens, the same for every rank",
        )?;
        let port = (self.env)("MASTER_PORT").unwrap_or_else(|| "29500".into());
        number(&port, "MASTER_PORT")?;
        Ok(format!("{addr}:{port}"))
    }
}

/// A flag's value, else the environment's.
fn pick(from_flag: Option<(u32, String)>, from_env: Option<&(u32, String)>) -> Option<u32> {
    from_flag.map(|(v, _)| v).or(from_env.map(|(v, _)| *v))
}

/// Where this process stands, from `args` (after the program name) and the environment `env`.
pub fn placement(
    args: &[String],
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Placement, String> {
    let s = sources(args, env)?;
    let Standing {
        rank,
        world_size,
        local_rank,
        source,
    } = s.standing()?;
    Ok(Placement {
        rank,
        world_size,
        local_rank,
        master: s.master()?,
        source,
    })
}

/// Where this process stands, read as [`placement`] reads it, for a job whose ranks need not meet at
/// rank 0: rank 0's address is not needed (a `--master` given is accepted, and unused).
pub fn standing(args: &[String], env: &dyn Fn(&str) -> Option<String>) -> Result<Standing, String> {
    sources(args, env)?.standing()
}

/// A joining process's local rank (its GPU), read as [`joiner`] reads it, for a job whose ranks need
/// not meet at rank 0: rank 0's address is not needed (a `--master` given is accepted, and unused).
pub fn local_rank(args: &[String], env: &dyn Fn(&str) -> Option<String>) -> Result<u32, String> {
    sources(args, env)?.local_rank()
}

/// A process that joins a running job later (a replacement): it has no rank yet, only its local rank
/// (its GPU) and rank 0's address, read as [`placement`] reads them.
pub fn joiner(
    args: &[String],
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(u32, String), String> {
    let s = sources(args, env)?;
    Ok((s.local_rank()?, s.master()?))
}

/// Connects to rank 0 at `master` (`HOST:PORT`), retrying until `timeout`: rank 0 may start later.
pub fn connect(master: &str, timeout: Duration) -> Result<TcpStream, String> {
    let deadline = Instant::now() + timeout;
    let target: Vec<SocketAddr> = master
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve rank 0's address '{master}': {e}"))?
        .collect();
    loop {
        let attempt = target
            .iter()
            .find_map(|a| TcpStream::connect_timeout(a, Duration::from_millis(500)).ok());
        match attempt {
            Some(s) => return Ok(s),
            None if Instant::now() >= deadline => {
                return Err(format!(
                    "rank 0 did not answer at {master} within {timeout:?}"
                ))
            }
            None => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str], vars: &[(&str, &str)]) -> Result<Placement, String> {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let env = |name: &str| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        };
        placement(&args, &env)
    }

    const MASTER: (&str, &str) = ("MASTER_ADDR", "10.0.0.1");

    /// A launcher's environment, as (variable, value) pairs.
    type Vars<'a> = &'a [(&'a str, &'a str)];

    #[test]
    fn each_launcher_alone() {
        let cases: [(Vars, &str, u32); 4] = [
            (
                &[("RANK", "3"), ("WORLD_SIZE", "8"), ("LOCAL_RANK", "1")],
                "torchrun",
                1,
            ),
            (
                &[
                    ("SLURM_PROCID", "3"),
                    ("SLURM_NTASKS", "8"),
                    ("SLURM_LOCALID", "1"),
                ],
                "Slurm",
                1,
            ),
            (
                &[
                    ("OMPI_COMM_WORLD_RANK", "3"),
                    ("OMPI_COMM_WORLD_SIZE", "8"),
                    ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
                ],
                "Open MPI",
                1,
            ),
            (&[("PMI_RANK", "3"), ("PMI_SIZE", "8")], "PMI", 0),
        ];
        for (vars, source, local_rank) in cases {
            let mut vars = vars.to_vec();
            vars.push(MASTER);
            let p = run(&[], &vars).unwrap_or_else(|e| panic!("{source}: {e}"));
            assert_eq!(
                p,
                Placement {
                    rank: 3,
                    world_size: 8,
                    local_rank,
                    master: "10.0.0.1:29500".into(),
                    source,
                }
            );
        }
    }

    #[test]
    fn flags_win_and_master_port_is_read() {
        let vars = [
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            MASTER,
            ("MASTER_PORT", "1234"),
        ];
        let p = run(
            &["--rank", "0", "--world-size", "4", "--local-rank", "2"],
            &vars,
        )
        .unwrap();
        assert_eq!(
            (p.rank, p.world_size, p.local_rank, p.source),
            (0, 4, 2, "flags")
        );
        assert_eq!(p.master, "10.0.0.1:1234");
        let p = run(&["--master", "h:9"], &vars).unwrap();
        assert_eq!(
            (p.rank, p.world_size, p.source, p.master.as_str()),
            (1, 2, "torchrun", "h:9")
        );
    }

    #[test]
    fn launchers_that_agree_are_fine_and_fill_each_others_gaps() {
        // srun --mpi=pmi2 sets Slurm's and PMI's variables; mpirun under Slurm sets Open MPI's too.
        let vars = [
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "6"),
            ("PMI_RANK", "5"),
            ("PMI_SIZE", "6"),
            ("OMPI_COMM_WORLD_RANK", "5"),
            ("OMPI_COMM_WORLD_SIZE", "6"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            MASTER,
        ];
        let p = run(&[], &vars).unwrap();
        assert_eq!(
            (p.rank, p.world_size, p.local_rank, p.source),
            (5, 6, 1, "Slurm")
        );
    }

    #[test]
    fn launchers_that_disagree_are_an_error_naming_both() {
        let cases: [(Vars, &str); 3] = [
            (
                &[
                    ("RANK", "1"),
                    ("WORLD_SIZE", "8"),
                    ("SLURM_PROCID", "0"),
                    ("SLURM_NTASKS", "8"),
                ],
                "disagree on the rank: RANK=1 (torchrun) but SLURM_PROCID=0 (Slurm)",
            ),
            (
                &[
                    ("OMPI_COMM_WORLD_RANK", "1"),
                    ("OMPI_COMM_WORLD_SIZE", "2"),
                    ("PMI_RANK", "1"),
                    ("PMI_SIZE", "4"),
                ],
                "world size: OMPI_COMM_WORLD_SIZE=2 (Open MPI) but PMI_SIZE=4 (PMI)",
            ),
            (
                &[
                    ("RANK", "1"),
                    ("WORLD_SIZE", "2"),
                    ("LOCAL_RANK", "1"),
                    ("SLURM_PROCID", "1"),
                    ("SLURM_NTASKS", "2"),
                    ("SLURM_LOCALID", "0"),
                ],
                "local rank: LOCAL_RANK=1 (torchrun) but SLURM_LOCALID=0 (Slurm)",
            ),
        ];
        for (vars, want) in cases {
            let mut vars = vars.to_vec();
            vars.push(MASTER);
            let err = run(&[], &vars).unwrap_err();
            assert!(err.contains(want), "{err}");
        }
    }

    #[test]
    fn incomplete_or_wrong_input_says_what() {
        let cases: [(&[&str], Vars, &str); 8] = [
            (
                &[],
                &[("RANK", "1"), MASTER],
                "torchrun's RANK is set but WORLD_SIZE is not",
            ),
            (
                &[],
                &[("PMI_SIZE", "2"), MASTER],
                "PMI's PMI_SIZE is set but PMI_RANK is not",
            ),
            (
                &[],
                &[("SLURM_PROCID", "x"), ("SLURM_NTASKS", "2")],
                "SLURM_PROCID is not a number: 'x'",
            ),
            (
                &[],
                &[MASTER],
                "no rank: pass --rank, or run under torchrun, srun or mpirun",
            ),
            (
                &["--rank", "2", "--world-size", "2"],
                &[MASTER],
                "rank 2 is outside a world of 2",
            ),
            (
                &["--rank", "0", "--world-size", "2"],
                &[],
                "missing --master HOST:PORT",
            ),
            (&["--rank"], &[], "--rank needs a value"),
            (&["-n", "2"], &[], "unknown argument '-n'"),
        ];
        for (args, vars, want) in cases {
            let err = run(args, vars).unwrap_err();
            assert!(err.contains(want), "{args:?} {vars:?}: {err}");
        }
    }

    /// A job whose ranks meet elsewhere reads everything but rank 0's address, which it may leave out;
    /// `placement` and `joiner` still need it.
    #[test]
    fn standing_and_local_rank_need_no_master() {
        let env = |name: &str| {
            let vars = [
                ("SLURM_PROCID", "3"),
                ("SLURM_NTASKS", "8"),
                ("SLURM_LOCALID", "1"),
            ];
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        };
        let me = standing(&[], &env).expect("no master needed");
        assert_eq!(
            me,
            Standing {
                rank: 3,
                world_size: 8,
                local_rank: 1,
                source: "Slurm"
            }
        );
        assert_eq!(me.to_string(), "rank 3 of 8, local rank 1 (from Slurm)");
        let with_master: Vec<String> = ["--master", "h:1"].map(String::from).into();
        assert_eq!(standing(&with_master, &env), Ok(me));
        let flags: Vec<String> = ["--local-rank", "2"].map(String::from).into();
        assert_eq!(local_rank(&flags, &env), Ok(2));
        assert_eq!(local_rank(&[], &env), Ok(1));
        for err in [
            placement(&[], &env).map(|_| ()),
            joiner(&[], &env).map(|_| ()),
        ] {
            let err = err.expect_err("rank 0's address needed");
            assert!(err.contains("missing --master HOST:PORT"), "{err}");
        }
        let p = placement(&with_master, &env).expect("a placement");
        assert_eq!(p.standing(), me);
        assert_eq!(
            p.to_string(),
            "rank 3 of 8, local rank 1 (from Slurm), rank 0 at h:1"
        );
    }
}
