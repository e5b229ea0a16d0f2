//! What the cluster tests share: the cluster (or a visible skip), a token of each test's own, the etcd
//! members' control, and a lock that keeps the tests that stop etcd members from running beside others.

use metrale_gpu_elastic_etcd::Config;
use metrale_gpu_testkit::skip::skip;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{SystemTime, UNIX_EPOCH};

/// Readers: the tests that leave etcd alone. Writers: those that stop its members.
static CLUSTER: RwLock<()> = RwLock::new(());

/// The cluster's config (the defaults: a 5 s lease, 1.5 s calls), or `None` after a skip line.
fn config() -> Option<Config> {
    if std::env::var_os("METRALE_ETCD_ENDPOINTS").is_none() {
        skip("no etcd cluster: METRALE_ETCD_ENDPOINTS is unset (run under ci/etcd-cluster)");
        return None;
    }
    Some(Config::from_env().expect("ci/etcd-cluster's METRALE_ETCD_ENDPOINTS is a valid config"))
}

/// For a test that leaves etcd's members alone: the config, and a share of the cluster.
pub fn shared() -> Option<(Config, RwLockReadGuard<'static, ()>)> {
    let config = config()?;
    Some((config, CLUSTER.read().unwrap_or_else(|e| e.into_inner())))
}

/// For a test that stops etcd members: the config, and the cluster to itself.
pub fn exclusive() -> Option<(Config, RwLockWriteGuard<'static, ()>)> {
    let config = config()?;
    Some((config, CLUSTER.write().unwrap_or_else(|e| e.into_inner())))
}

/// A job token of this test's own: no two tests (nor two runs) share a job.
pub fn token(test: &str) -> Vec<u8> {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{test}-{}-{nanos}", std::process::id()).into_bytes()
}

pub use metrale_gpu_testkit::etcd_cluster::Stopped;

/// Which of the cluster's members (by its place in METRALE_ETCD_ENDPOINTS) is raft's leader now.
pub fn leader(config: &Config) -> usize {
    let rt = runtime();
    let ids: Vec<(u64, u64)> = config
        .endpoints
        .iter()
        .map(|e| {
            bounded(&rt, async {
                let mut c = etcd_client::Client::connect([e], None)
                    .await
                    .expect("connect");
                let s = c.status().await.expect("an etcd member's status");
                (s.header().map_or(0, |h| h.member_id()), s.leader())
            })
        })
        .collect();
    let leader = ids[0].1;
    ids.iter()
        .position(|(id, _)| *id == leader)
        .expect("the leader is one of the endpoints")
}

/// Revokes lease `id` from outside its member (an operator's `etcdctl lease revoke`).
pub fn revoke(config: &Config, id: i64) {
    bounded(&runtime(), async {
        let mut c = etcd_client::Client::connect(&config.endpoints, None)
            .await
            .expect("connect");
        c.lease_revoke(id).await.expect("the lease's revocation");
    });
}

/// Every key under the root of the jobs, with its value.
pub fn all_job_keys(config: &Config) -> Vec<(Vec<u8>, Vec<u8>)> {
    bounded(&runtime(), async {
        let mut c = etcd_client::Client::connect(&config.endpoints, None)
            .await
            .expect("connect");
        let options = etcd_client::GetOptions::new().with_prefix();
        let got = c
            .get(metrale_gpu_elastic_etcd::ROOT, Some(options))
            .await
            .expect("a listing");
        got.kvs()
            .iter()
            .map(|kv| (kv.key().to_vec(), kv.value().to_vec()))
            .collect()
    })
}

/// `fut`'s output, within 10 s (the tests' own calls to etcd, on a healthy cluster).
fn bounded<T>(rt: &tokio::runtime::Runtime, fut: impl std::future::Future<Output = T>) -> T {
    let limit = std::time::Duration::from_secs(10);
    rt.block_on(async { tokio::time::timeout(limit, fut).await })
        .expect("etcd answers within 10 s")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}
