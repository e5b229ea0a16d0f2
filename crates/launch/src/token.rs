//! The job token: what a rank's hello carries to prove it belongs to this job, derived by every rank the
//! same way from its environment. The first source present (and not empty) wins:
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
//! A rank that finds none runs without a token (and says so): its rendezvous then admits any well-formed
//! hello. The token is the source's name and its value (`slurm:4242.0`), so that two sources never give
//! the same token by accident; it crosses the wire as hex, so any string fits on the hello's line.

use crate::hex;

/// The variable that sets the token explicitly.
pub const TOKEN_VAR: &str = "METRALE_JOB_TOKEN";
/// The longest token, in bytes (before its hex doubles it).
pub const TOKEN_MAX: usize = 256;
/// The hello's last field.
const FIELD: &str = "token=";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobToken {
    /// The token's bytes in hex, empty for none.
    hex: String,
    /// Where it came from, for the logs (never the value: the logs are no place for it).
    source: String,
}

impl JobToken {
    /// No token: every well-formed hello with an empty token field is admitted.
    pub fn none() -> JobToken {
        JobToken {
            hex: String::new(),
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
            hex: hex::encode(value.as_bytes()),
            source: source.to_string(),
        })
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

    /// [`JobToken::from_env`] on this process's environment, said on stderr by `who` (where it came
    /// from, or that there is none and what that means).
    pub fn of_this_job(who: &str) -> Result<JobToken, String> {
        let token = JobToken::from_env(&|name| std::env::var(name).ok())?;
        match token.source.as_str() {
            "" => eprintln!(
                "{who}: no job token ({TOKEN_VAR}, SLURM_JOB_ID, TORCHELASTIC_RUN_ID, OMPI_MCA_ess_base_jobid \
                 and PMIX_NAMESPACE are unset): the rendezvous admits any well-formed hello; set {TOKEN_VAR} \
                 to one value on every rank to keep other jobs' ranks out"
            ),
            source => eprintln!("{who}: job token from {source}"),
        }
        Ok(token)
    }

    /// `payload` with the token as its last field: the hello's line, without its newline.
    pub fn hello(&self, payload: &str) -> String {
        format!("{payload} {FIELD}{}", self.hex)
    }

    /// The payload of `line` (a hello) when its token field is this job's; compared in constant time, so
    /// that the time a refusal takes says nothing about how much of a guess was right.
    pub fn check(&self, line: &str) -> Result<String, String> {
        let (payload, field) = line.rsplit_once(' ').unwrap_or(("", line));
        let theirs = field
            .strip_prefix(FIELD)
            .ok_or("a hello without a job token field")?;
        match same(theirs.as_bytes(), self.hex.as_bytes()) {
            true => Ok(payload.to_string()),
            false if self.hex.is_empty() => Err("a job token where this job has none".into()),
            false => Err("the wrong job token".into()),
        }
    }
}

/// Whether `a` and `b` are equal, in a time that depends on their lengths only.
fn same(a: &[u8], b: &[u8]) -> bool {
    let differ = a
        .iter()
        .zip(b)
        .fold(0u8, |acc, (x, y)| acc | std::hint::black_box(x ^ y));
    a.len() == b.len() && differ == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
    fn a_hello_is_admitted_with_this_jobs_token_only() {
        let ours = JobToken::new("test", "job-a").expect("token");
        let theirs = JobToken::new("test", "job-b").expect("token");
        let none = JobToken::none();
        assert_eq!(ours.check(&ours.hello("HELLO 1")), Ok("HELLO 1".into()));
        assert_eq!(none.check(&none.hello("JOIN")), Ok("JOIN".into()));
        let refused = [
            (ours.check(&theirs.hello("HELLO 1")), "the wrong job token"),
            (ours.check(&none.hello("HELLO 1")), "the wrong job token"),
            (ours.check("HELLO 1"), "a hello without a job token field"),
            (
                none.check(&ours.hello("HELLO 1")),
                "a job token where this job has none",
            ),
        ];
        for (result, why) in refused {
            assert_eq!(result, Err(why.to_string()));
        }
        assert!(same(b"abc", b"abc") && !same(b"abc", b"abd") && !same(b"abc", b"ab"));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Any payload and token round-trip through the hello; another token, or any line at all, is
        /// an answer (never a panic) whose payload is part of the line.
        #[test]
        fn hellos_round_trip_and_any_line_is_an_answer(
            payload in "[^\n]{0,64}",
            a in "[^\n]{1,64}",
            b in "[^\n]{1,64}",
            line in any::<String>(),
        ) {
            let (ta, tb) = (JobToken::new("a", &a).expect("token"), JobToken::new("b", &b).expect("token"));
            prop_assert_eq!(ta.check(&ta.hello(&payload)), Ok(payload.clone()));
            prop_assert_eq!(ta.check(&tb.hello(&payload)).is_ok(), a == b);
            if let Ok(p) = ta.check(&line) {
                prop_assert!(line.starts_with(&p) && p.len() < line.len());
            }
        }
    }
}
