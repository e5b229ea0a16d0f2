//! Tests that run whole lives of fake ranks (`fake.rs`) or the agreement between modules: above
//! every module they use, so that no module depends on test support.

#[cfg(feature = "etcd")]
pub(crate) mod etcd;
mod membership;
mod recovery;
