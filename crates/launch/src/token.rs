//! The job token: the secret every rank of one job shares, derived by every rank the same way from its
//! environment, with which each side of a rendezvous proves it belongs to the job ([`crate::auth`]:
//! the token itself never crosses the wire). The first source present (and not empty) wins:
//!
//! | order | variable(s) | set by |
//! | --- | --- | --- |
//! | 1 | `METRALE_JOB_TOKEN` | you: any string of at most [`TOKEN_MAX`] bytes, the same on every rank |
//! | 2 | `SLURM_JOB_ID`, with `SLURM_STEP_ID` when set | Slurm (`srun`, `sbatch`) |
//! | 3 | `TORCHELASTIC_RUN_ID` (not its default `none`, which every job shares) | torchrun |
//! | 4 | `OMPI_MCA_ess_base_jobid` | Open MPI up to 4 (`mpirun`) |
//! | 5 | `PMIX_NAMESPACE` | Open MPI 5 (`mpirun`, PRRTE), or any PMIx launcher |
//!
//! The Slurm token includes the step, so that two steps of one allocation on one port keep apart; a
//! process started by another step (an elastic replacement's own `srun`) then needs the explicit variable.
//! The token is the source's name and its value (`slurm:4242.0`), so that two sources never give the
//! same token by accident.
//!
//! **Closed by default** ([`JobToken::for_master`]): a rendezvous whose address (`--master`,
//! `MASTER_ADDR`) is a loopback address (`127.0.0.0/8`, `::1`, `localhost`) listens on loopback only,
//! and may run without a token: only this host's processes reach it. Any other address listens on
//! every interface and refuses to start without a token source, naming `METRALE_JOB_TOKEN`, unless
//! [`UNSAFE_NO_TOKEN_VAR`]` = 1` says to admit anyone (unsafe: whoever reaches the port first can take
//! a rank's place, and learn the unique id).
//!
//! What a token protects against: impostors and strays (a rank of another job, a leftover of an
//! earlier one, a port scanner, a squatter on the port, who learn nothing of the token and get no id).
//! What it does not: it is no encryption. The unique id and every later message cross the network in
//! clear, and NCCL's own sockets are not encrypted either (NCCL 2.32's `ncclSetEncryption` does that;
//! this crate does not call it). A token derived from a launcher's job id is only as secret as that id
//! (a Slurm job id is visible to every user of the cluster), and any peer that reaches rank 0's port
//! may test guesses of a weak token offline against the proof rank 0 sends it: where strangers can
//! reach the port, set `METRALE_JOB_TOKEN` to a long random value (`openssl rand -hex 32`).

use std::fmt;
use std::net::IpAddr;

/// The variable that sets the token explicitly.
pub const TOKEN_VAR: &str = "METRALE_JOB_TOKEN";
/// The variable that lets a rendezvous on a non-loopback address run without a token, when `1`:
/// unsafe (see the module's docs).
pub const UNSAFE_NO_TOKEN_VAR: &str = "METRALE_UNSAFE_NO_JOB_TOKEN";
/// The longest token, in bytes.
pub const TOKEN_MAX: usize = 256;

/// A job's token: the key of the rendezvous's proofs (empty for none). Its `Debug` shows where it came
/// from, never its value: logs are no place for it.
#[derive(Clone, PartialEq, Eq)]
pub struct JobToken {
    key: Vec<u8>,
    /// Where it came from, for the logs.
    source: String,
}

impl fmt::Debug for JobToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.source.as_str() {
            "" => write!(f, "JobToken(none)"),
            source => write!(f, "JobToken(from {source})"),
        }
    }
}

/// Whether `master` (`HOST:PORT`) names this host's loopback: an address in `127.0.0.0/8`, `::1`
/// (bracketed or not), or `localhost`. A name that merely resolves to loopback on one host (Debian's
/// `127.0.1.1` for the host's own name) is no loopback: the other hosts resolve it elsewhere.
pub fn is_loopback(master: &str) -> bool {
    let host = master.rsplit_once(':').map_or(master, |(host, _)| host);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

impl JobToken {
    /// No token: the proofs are made with an empty key, which any process can make.
    pub fn none() -> JobToken {
        JobToken {
            key: Vec::new(),
            source: String::new(),
        }
    }

    /// `value` from `source`; an error for an empty or over-long one.
    pub fn new(source: &str, value: &str) -> Result<JobToken, String> {
        if value.is_empty() || value.len() > TOKEN_MAX {
            return Err(format!(
                "the job token from {source} has {} bytes; it needs 1 to {TOKEN_MAX}",
                value.len()
            ));
        }
        Ok(JobToken {
            key: value.as_bytes().to_vec(),
            source: source.to_string(),
        })
    }

    /// Whether this is no token at all.
    pub fn is_none(&self) -> bool {
        self.source.is_empty()
    }

    /// The key of the proofs, and of whatever else keeps this job apart from others (the etcd
    /// membership's key prefix). A secret: never print it, never send it.
    pub fn key(&self) -> &[u8] {
        &self.key
    }
    /// The token of this job, from the first source of the table above that `env` has.
    pub fn from_env(env: &dyn Fn(&str) -> Option<String>) -> Result<JobToken, String> {
        let var = |name: &str| env(name).filter(|v| !v.is_empty());
        if let Some(v) = var(TOKEN_VAR) {
            return JobToken::new(TOKEN_VAR, &v);
        }
        if let Some(job) = var("SLURM_JOB_ID") {
            return match var("SLURM_STEP_ID") {
                Some(step) => {
                    JobToken::new("SLURM_JOB_ID.SLURM_STEP_ID", &format!("slurm:{job}.{step}"))
                }
                None => JobToken::new("SLURM_JOB_ID", &format!("slurm:{job}")),
            };
        }
        let sources = [
            ("TORCHELASTIC_RUN_ID", "torchelastic"),
            ("OMPI_MCA_ess_base_jobid", "ompi"),
            ("PMIX_NAMESPACE", "pmix"),
        ];
        for (name, tag) in sources {
            match var(name) {
                Some(v) if !(name == "TORCHELASTIC_RUN_ID" && v == "none") => {
                    return JobToken::new(name, &format!("{tag}:{v}"))
                }
                _ => {}
            }
        }
        Ok(JobToken::none())
    }

    /// The token of a rendezvous at `master`, from `env` ([`JobToken::from_env`]), under the module's
    /// rule: none is fine on loopback; elsewhere it is an error naming [`TOKEN_VAR`], unless
    /// [`UNSAFE_NO_TOKEN_VAR`] is `1`.
    pub fn for_master(
        master: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<JobToken, String> {
        let token = JobToken::from_env(env)?;
        if !token.is_none()
            || is_loopback(master)
            || env(UNSAFE_NO_TOKEN_VAR).as_deref() == Some("1")
        {
            return Ok(token);
        }
        Err(format!(
            "the rendezvous at {master} is not on loopback and this job has no token: set {TOKEN_VAR} to \
             one secret value on every rank (e.g. `openssl rand -hex 32`), or run under a launcher that \
             gives a job id (SLURM_JOB_ID, TORCHELASTIC_RUN_ID, OMPI_MCA_ess_base_jobid, PMIX_NAMESPACE); \
             {UNSAFE_NO_TOKEN_VAR}=1 admits anyone who reaches the port (unsafe)"
        ))
    }

    /// [`JobToken::for_master`] on this process's environment, said on stderr by `who` (where it came
    /// from, or that there is none and what that means).
    pub fn of_this_job(master: &str, who: &str) -> Result<JobToken, String> {
        let token = JobToken::for_master(master, &|name| std::env::var(name).ok())?;
        match token.source.as_str() {
            "" if is_loopback(master) => eprintln!(
                "{who}: no job token ({TOKEN_VAR} and the launchers' job ids are unset): the rendezvous on \
                 loopback admits this host's processes; set {TOKEN_VAR} to one value on every rank to keep \
                 other jobs' ranks out"
            ),
            "" => eprintln!(
                "{who}: WARNING: no job token and {UNSAFE_NO_TOKEN_VAR}=1: the rendezvous at {master} admits \
                 anyone who reaches its port"
            ),
            source => eprintln!("{who}: job token from {source}"),
        }
        Ok(token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(vars: &[(&str, &str)]) -> Result<JobToken, String> {
        JobToken::from_env(&|name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn the_first_source_present_wins_in_the_documented_order() {
        let all = [
            (TOKEN_VAR, "s3cret"),
            ("SLURM_JOB_ID", "4242"),
            ("SLURM_STEP_ID", "0"),
            ("TORCHELASTIC_RUN_ID", "run-7"),
            ("OMPI_MCA_ess_base_jobid", "12345"),
            ("PMIX_NAMESPACE", "prterun-h-1@1"),
        ];
        let expected = [
            (TOKEN_VAR, "s3cret"),
            ("SLURM_JOB_ID.SLURM_STEP_ID", "slurm:4242.0"),
            ("TORCHELASTIC_RUN_ID", "torchelastic:run-7"),
            ("OMPI_MCA_ess_base_jobid", "ompi:12345"),
            ("PMIX_NAMESPACE", "pmix:prterun-h-1@1"),
        ];
        // Dropping the winner each time (the step id goes with the job id) shows the next in line.
        let mut left: Vec<_> = all.to_vec();
        for (source, value) in expected {
            assert_eq!(from(&left), JobToken::new(source, value), "{source}");
            left.retain(|(n, _)| !source.split('.').any(|s| s == *n));
        }
        assert_eq!(from(&left), Ok(JobToken::none()));
        assert_eq!(
            from(&[("SLURM_JOB_ID", "9")]),
            JobToken::new("SLURM_JOB_ID", "slurm:9")
        );
        // torchrun's default run id names no job; an empty variable is no source.
        assert_eq!(
            from(&[("TORCHELASTIC_RUN_ID", "none"), (TOKEN_VAR, "")]),
            Ok(JobToken::none())
        );
        let err = from(&[(TOKEN_VAR, &"x".repeat(TOKEN_MAX + 1))]).expect_err("too long");
        assert!(err.contains("has 257 bytes; it needs 1 to 256"), "{err}");
    }

    #[test]
    fn loopback_is_an_address_not_a_name_that_resolves_there() {
        for master in [
            "127.0.0.1:1",
            "127.3.2.1:0",
            "[::1]:29500",
            "localhost:5",
            "LOCALHOST:5",
        ] {
            assert!(is_loopback(master), "{master}");
        }
        for master in [
            "10.0.0.1:1",
            "0.0.0.0:1",
            "[::]:1",
            "node-1:29500",
            "rank0.invalid:1",
            "",
        ] {
            assert!(!is_loopback(master), "{master}");
        }
    }

    /// Off loopback a rendezvous without a token source does not start; the error names the variable
    /// to set and the unsafe opt-out, which admits anyone.
    #[test]
    fn off_loopback_no_token_is_refused_unless_the_unsafe_opt_out_says_so() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                vars.iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| v.to_string())
            }
        };
        let err = JobToken::for_master("node-1:29500", &env(&[])).expect_err("closed");
        assert!(
            err.contains("is not on loopback and this job has no token: set METRALE_JOB_TOKEN")
                && err.contains("METRALE_UNSAFE_NO_JOB_TOKEN=1 admits anyone"),
            "{err}"
        );
        let err = JobToken::for_master("10.0.0.1:1", &env(&[(UNSAFE_NO_TOKEN_VAR, "yes")]));
        assert!(err.is_err(), "only `1` opts out");
        assert_eq!(
            JobToken::for_master("10.0.0.1:1", &env(&[(UNSAFE_NO_TOKEN_VAR, "1")])),
            Ok(JobToken::none())
        );
        assert_eq!(
            JobToken::for_master("127.0.0.1:1", &env(&[])),
            Ok(JobToken::none())
        );
        assert_eq!(
            JobToken::for_master("node-1:1", &env(&[("SLURM_JOB_ID", "7")])),
            JobToken::new("SLURM_JOB_ID", "slurm:7")
        );
    }

    #[test]
    fn debug_never_shows_the_value() {
        let token = JobToken::new(TOKEN_VAR, "s3cret-value").expect("token");
        assert_eq!(format!("{token:?}"), "JobToken(from METRALE_JOB_TOKEN)");
        assert_eq!(format!("{:?}", JobToken::none()), "JobToken(none)");
    }
}
