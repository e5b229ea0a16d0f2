//! The members of the etcd cluster `ci/etcd-cluster` runs, stopped and started again by a test.

use std::process::Command;

/// etcd members a test stopped (SIGKILL; each port closed when `stop` returns), started again when
/// dropped, the test passed or not.
#[derive(Default)]
pub struct Stopped(Vec<usize>);

impl Stopped {
    /// Stops member `n`, by its place in `METRALE_ETCD_ENDPOINTS`.
    pub fn stop(&mut self, n: usize) {
        ctl("stop", n);
        self.0.push(n);
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        for n in self.0.drain(..) {
            ctl("start", n);
        }
    }
}

/// ci/etcd-cluster's control: `stop N` (its port closed when it returns) or `start N` (healthy), each
/// bounded there.
fn ctl(what: &str, n: usize) {
    let dir =
        std::env::var("METRALE_ETCD_CLUSTER").expect("METRALE_ETCD_CLUSTER, from ci/etcd-cluster");
    let status = Command::new(format!("{dir}/ctl"))
        .args([what, &n.to_string()])
        .status();
    assert!(
        matches!(status, Ok(s) if s.success()),
        "ci/etcd-cluster ctl {what} {n}: {status:?}"
    );
}
