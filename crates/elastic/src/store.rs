//! Where the job's membership lives in etcd (feature `etcd`): read with the rest of the
//! [`Config`](crate::Config), used by [`crate::etcd`].

use metrale_gpu_elastic_etcd::Config as EtcdConfig;
use metrale_gpu_launch::token::JobToken;

/// The variable whose presence selects the etcd membership: etcd's client URLs.
pub const ENDPOINTS_VAR: &str = "METRALE_ETCD_ENDPOINTS";

/// Where the job's membership lives in etcd: the cluster and the job's token (its keys' prefix).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Store {
    pub etcd: EtcdConfig,
    pub token: JobToken,
}

impl Store {
    /// The store `env` names: `None` where [`ENDPOINTS_VAR`] is unset (the embedded membership); an
    /// error for a wrong setting, or for a job without a token (its keys would be any job's).
    pub fn from_vars(env: &dyn Fn(&str) -> Option<String>) -> Result<Option<Store>, String> {
        if env(ENDPOINTS_VAR).is_none_or(|e| e.trim().is_empty()) {
            return Ok(None);
        }
        let etcd = EtcdConfig::from_vars(env).map_err(|e| e.to_string())?;
        let token = JobToken::from_env(env)?;
        if token.is_none() {
            return Err(format!(
                "the etcd membership ({ENDPOINTS_VAR} is set) needs a job token: its keys live under a prefix \
                 derived from it. Set METRALE_JOB_TOKEN to one secret value on every rank, or run under a \
                 launcher that gives a job id (SLURM_JOB_ID, TORCHELASTIC_RUN_ID, ...)"
            ));
        }
        Ok(Some(Store { etcd, token }))
    }
}
