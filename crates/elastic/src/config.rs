//! A rank's configuration: where it stands (a rank of the first world, or a replacement) and the job's
//! bounds, from flags or the launcher's variables ([`Config::from_args`]), each value checked so that no
//! bound derived from it can overflow.

use std::time::Duration;

use metrale_gpu_launch::placement;

/// The longest `--deadline`: every bound of a recovery is a few times it (the plan's wait is 4D + 2 s),
/// and a collective that may hang an hour is no deadline anyone means.
pub const MAX_DEADLINE: Duration = Duration::from_secs(3600);
/// The longest `--step-ms` and grow-id delay, in milliseconds.
const MAX_MS: u64 = 3_600_000;

/// A rank of the first world: its rank and the world's size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct First {
    pub rank: usize,
    pub world_size: usize,
}

/// What a rank needs to join or start a job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// A rank of the first world; `None` for a replacement (`--join`), which learns its rank and the
    /// world's size from its grow (a grow restores the first world's size).
    pub first: Option<First>,
    /// Where a rank of the first world stands and which launcher said so (`rank 1 of 4, local rank 1
    /// (from Slurm), rank 0 at h:29500`), for a program's first line; `None` for a replacement.
    pub placed: Option<String>,
    /// The GPU on this host.
    pub local_rank: i32,
    /// `HOST:PORT` of rank 0's rendezvous (port 0 on rank 0: it picks one and says which): what the
    /// embedded membership needs. `None` with the membership in etcd, which needs none (a `--master`
    /// given is accepted, and unused).
    pub master: Option<String>,
    /// D: how long a collective may hang before the survivors give up on it; every recovery bound is
    /// derived from it ([`crate::Bounds`]). 1 s to [`MAX_DEADLINE`].
    pub deadline: Duration,
    /// Rounds the job trains, across recoveries and grows (a replacement is started with the job's).
    pub iters: usize,
    /// The fewest ranks the job trains with (rank 0's counts): below it every rank ends with an error.
    pub min_size: usize,
    /// For tests only: how long rank 0 waits between its last look at the rendezvous and
    /// `ncclCommGetUniqueId` (see [`GROW_ID_DELAY`]).
    pub grow_id_delay: Duration,
    /// Where the membership lives when it is kept in etcd ([`crate::etcd`]): set where the operator set
    /// `METRALE_ETCD_ENDPOINTS`; `None` keeps it in rank 0.
    #[cfg(feature = "etcd")]
    pub etcd: Option<crate::store::Store>,
}

/// The variable behind [`Config::grow_id_delay`]: a rank killed on rank 0's `phase=growid` line then
/// dies after rank 0's last look at the rendezvous, the race the grow id's bounded call guards against.
pub const GROW_ID_DELAY: &str = "METRALE_ELASTIC_GROW_ID_DELAY_MS";

/// The flags [`Config::from_args`] reads besides the launcher's, for a program's usage line.
pub const USAGE: &str = "[--deadline SECS] [--iters N] [--min-size M] [--rank R --world-size N] \
    [--local-rank G] [--master HOST:PORT]\n       or --join [--deadline SECS] [--iters N] \
    [--local-rank G] [--master HOST:PORT]\n(--master, or MASTER_ADDR, unless METRALE_ETCD_ENDPOINTS \
    keeps the membership in etcd)";

/// A count flag's value: a number from `min` to `max`, or an error naming the flag and its range.
fn count(flag: &str, value: &str, min: u64, max: u64) -> Result<u64, String> {
    match value.parse::<u64>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        Ok(n) => Err(format!("{flag} {n} is outside {min} to {max}")),
        Err(_) => Err(format!("{flag} is not a number: '{value}'")),
    }
}

impl Config {
    /// `--join`, `--deadline SECS` (default 5), `--iters N` (default 100000) and `--min-size M`
    /// (default 1) are the library's; the rest is read as [`placement::placement`] reads it (flags, or
    /// the variables of torchrun, srun, mpirun or a PMI launcher). Rank 0's address is needed by the
    /// embedded membership alone: with the membership in etcd (feature `etcd`, and
    /// `METRALE_ETCD_ENDPOINTS` in `env`) it may be left out. A value that would overflow a bound is
    /// refused by name.
    pub fn from_args(
        args: &[String],
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, String> {
        let (mut join, mut deadline, mut iters, mut min_size) = (false, 5, 100_000, 1);
        let mut rest = Vec::new();
        let mut argv = args.iter();
        while let Some(arg) = argv.next() {
            let mut value = |flag: &str, min: u64, max: u64| -> Result<u64, String> {
                let v = argv.next().ok_or(format!("{flag} needs a value"))?;
                count(flag, v, min, max)
            };
            match arg.as_str() {
                "--join" => join = true,
                "--deadline" => deadline = value("--deadline", 1, MAX_DEADLINE.as_secs())?,
                "--iters" => iters = value("--iters", 1, u32::MAX as u64)?,
                "--min-size" => min_size = value("--min-size", 1, u32::MAX as u64)?,
                _ => rest.push(arg.clone()),
            }
        }
        let grow_id_delay = match env(GROW_ID_DELAY) {
            None => Duration::ZERO,
            Some(ms) => Duration::from_millis(count(GROW_ID_DELAY, &ms, 0, MAX_MS)?),
        };
        #[cfg(feature = "etcd")]
        let etcd = crate::store::Store::from_vars(env)?;
        #[cfg(feature = "etcd")]
        let needs_master = etcd.is_none();
        #[cfg(not(feature = "etcd"))]
        let needs_master = true;
        let (first, placed, local_rank, master) = match (join, needs_master) {
            (true, true) => {
                let (local_rank, master) = placement::joiner(&rest, env)?;
                (None, None, local_rank, Some(master))
            }
            (true, false) => (None, None, placement::local_rank(&rest, env)?, None),
            (false, true) => {
                let me = placement::placement(&rest, env)?;
                (
                    Some(me.standing()),
                    Some(me.to_string()),
                    me.local_rank,
                    Some(me.master),
                )
            }
            (false, false) => {
                let me = placement::standing(&rest, env)?;
                (Some(me), Some(me.to_string()), me.local_rank, None)
            }
        };
        let first = first.map(|me| First {
            rank: me.rank as usize,
            world_size: me.world_size as usize,
        });
        if let Some(first) = first.filter(|f| min_size as usize > f.world_size) {
            return Err(format!(
                "--min-size {min_size} is not a size from 1 to the world's {}",
                first.world_size
            ));
        }
        let local_rank = i32::try_from(local_rank)
            .map_err(|_| format!("local rank {local_rank} is not a GPU ordinal"))?;
        Ok(Config {
            first,
            placed,
            local_rank,
            master,
            deadline: Duration::from_secs(deadline),
            iters: iters as usize,
            min_size: min_size as usize,
            grow_id_delay,
            #[cfg(feature = "etcd")]
            etcd,
        })
    }
}

/// A millisecond flag of a program (`--step-ms`): a number up to an hour, or an error naming it.
pub fn millis(flag: &str, value: &str) -> Result<Duration, String> {
    count(flag, value, 0, MAX_MS).map(Duration::from_millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Config, String> {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        Config::from_args(&args, &|_| None)
    }

    const FIRST: [&str; 6] = ["--rank", "1", "--world-size", "4", "--master", "h:1"];

    #[test]
    fn a_rank_and_a_replacement_read_their_flags() {
        let mut args = FIRST.to_vec();
        args.extend(["--deadline", "7", "--iters", "50", "--min-size", "2"]);
        let c = parse(&args).expect("a rank");
        assert_eq!(
            c.first,
            Some(First {
                rank: 1,
                world_size: 4
            })
        );
        assert_eq!(
            (c.deadline, c.iters, c.min_size, c.master.as_deref()),
            (Duration::from_secs(7), 50, 2, Some("h:1"))
        );
        let c = parse(&["--join", "--local-rank", "3", "--master", "h:2"]).expect("a replacement");
        assert_eq!((c.first, c.local_rank), (None, 3));
    }

    /// The embedded membership needs rank 0's address, a rank of the first world's and a
    /// replacement's alike; the membership in etcd needs none (and leaves one given unused).
    #[test]
    fn rank_0s_address_is_needed_by_the_embedded_membership_alone() {
        for args in [&FIRST[..4], &["--join", "--local-rank", "3"][..]] {
            let err = parse(args).expect_err("no --master");
            assert!(
                err.contains("missing --master HOST:PORT"),
                "{args:?}: {err}"
            );
        }
        #[cfg(feature = "etcd")]
        {
            let env = |name: &str| match name {
                crate::store::ENDPOINTS_VAR => Some("http://127.0.0.1:2379".to_string()),
                "METRALE_JOB_TOKEN" => Some("t0k3n".to_string()),
                _ => None,
            };
            let parse = |args: &[&str]| {
                let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
                Config::from_args(&args, &env)
            };
            let c = parse(&FIRST[..4]).expect("a rank without --master");
            let first = First {
                rank: 1,
                world_size: 4,
            };
            assert_eq!(
                (c.first, c.master, c.etcd.is_some()),
                (Some(first), None, true)
            );
            assert_eq!(
                c.placed.as_deref(),
                Some("rank 1 of 4, local rank 0 (from flags)")
            );
            let c =
                parse(&["--join", "--local-rank", "3"]).expect("a replacement without --master");
            assert_eq!((c.first, c.local_rank, c.master), (None, 3, None));
            let c = parse(&FIRST).expect("a --master given");
            assert_eq!(c.master, None, "unused");
        }
    }

    /// `--deadline 18446744073709551615` overflowed `2 * deadline` and panicked: every value that would
    /// overflow a bound, or means nothing, is refused with the flag and its range.
    #[test]
    fn values_that_would_overflow_a_bound_are_refused_by_name() {
        let cases = [
            (
                vec!["--deadline", "18446744073709551615"],
                "--deadline 18446744073709551615 is outside 1 to 3600",
            ),
            (vec!["--deadline", "0"], "--deadline 0 is outside 1 to 3600"),
            (
                vec!["--deadline", "99999999999999999999"],
                "--deadline is not a number",
            ),
            (
                vec!["--iters", "18446744073709551615"],
                "--iters 18446744073709551615 is outside 1 to 4294967295",
            ),
            (vec!["--min-size", "0"], "--min-size 0 is outside 1"),
            (
                vec!["--min-size", "5"],
                "--min-size 5 is not a size from 1 to the world's 4",
            ),
            (vec!["--iters"], "--iters needs a value"),
        ];
        for (extra, want) in cases {
            let mut args = FIRST.to_vec();
            args.extend(extra);
            let err = parse(&args).expect_err(want);
            assert!(err.contains(want), "{args:?}: {err}");
        }
        assert!(millis("--step-ms", "3600001").is_err());
        assert_eq!(millis("--step-ms", "5"), Ok(Duration::from_millis(5)));
        // The longest deadline's bounds are finite and ordered.
        let b = crate::Bounds::new(MAX_DEADLINE);
        assert!(b.plan > b.report && b.report > MAX_DEADLINE);
    }
}
