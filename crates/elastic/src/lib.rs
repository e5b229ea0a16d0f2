//! Elastic NCCL training without a restart. Ranks train round after round; when some die, the
//! survivors agree on who died, make the communicator of the living (`ncclCommShrink`, or a new one
//! from a new unique id) and train on at the size they have; replacements started later grow it back
//! (`ncclCommGrow`), up to the first world's size. Every wait has a bound ([`Bounds`]); the README
//! beside this crate lists them, and what each failure comes to.
//!
//! A training loop gives `Training` (a round's work on the communicator of the moment; its docs have
//! the whole API in one example) to `run`, with a [`Config`] read from the launcher's variables
//! (torchrun, Slurm, Open MPI, PMI) or flags. The GPU side needs NCCL 2.29+ headers (`ncclCommRevoke`, `ncclCommShrink` of a revoked communicator,
//! `ncclCommGrow`); built against older ones, the crate has the protocol ([`run_with`] on any
//! [`Fabric`]) and no `run`.
//!
//! - [`config`]: where a rank stands and the job's bounds, each value checked.
//! - [`membership`]: who is alive, the agreement and the grows behind one seam, [`Membership`]; the
//!   embedded backend keeps it in rank 0 (a rendezvous on the launch crate's door: job token,
//!   HMAC challenge-response, caps), whose death ends the job.
//! - `etcd` (feature `etcd`): the membership kept in etcd, where the job outlives any rank, the
//!   coordinator included; chosen where `METRALE_ETCD_ENDPOINTS` is set.
//! - [`protocol`]: the rendezvous's messages, one line each.
//! - [`fabric`]: what a rank's life asks of the GPU side, so that the same life runs on NCCL or on the
//!   tests' fake ranks.
//! - [`lines`]: reading the `ELASTIC` lines a rank reports its phases with.

mod backend;
mod client;
mod clock;
pub mod config;
mod coordinator;
#[cfg(feature = "etcd")]
pub mod etcd;
pub mod fabric;
#[cfg(test)]
mod fake;
#[cfg(nccl_2_29)]
mod gpu;
pub mod lines;
pub mod membership;
#[cfg(nccl_2_29)]
mod nccl;
pub mod protocol;
mod recovery;
#[cfg(feature = "etcd")]
mod store;
#[cfg(test)]
mod strays_tests;
#[cfg(test)]
mod tests;

pub use backend::run_with;
pub use config::{Config, First};
pub use fabric::{Fabric, Place};
#[cfg(nccl_2_29)]
pub use gpu::{run, Training};
pub use membership::{Bounds, Membership};
pub use recovery::MAX_ROUNDS;
