//! The membership against a real 3-member etcd cluster, `ci/etcd-cluster -- cargo test -p
//! metrale-gpu-elastic-etcd`: fake ranks (threads, each its own member with its own connection) join,
//! elect a coordinator and make generations while the test kills ranks and stops etcd members. Without a
//! cluster (METRALE_ETCD_ENDPOINTS unset) each test prints `SKIP <test>: <why>` and passes.

mod election;
mod fake;
mod faults;
mod jobs;
mod support;
