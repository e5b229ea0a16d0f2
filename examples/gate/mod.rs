//! The door of both examples' rendezvous, `multi_process`'s (`examples/multi_process/rendezvous.rs`) and
//! the elastic coordinator's (`examples/elastic/coordinator.rs`); each includes this folder with
//! `#[path]`. Whatever reaches rank 0's port is a stranger until its hello is read and checked:
//!
//! - each connection's hello is one line of at most [`HELLO_CAP`] bytes, read within [`HELLO_BOUND`]
//!   (and within the rendezvous's own deadline): a longer line, a silent or slow peer, a peer that closes
//!   first, a hello that does not parse, a rank that is taken or out of range, or the wrong job token
//!   ([`token`]) is a stray connection: closed, with one warning line naming the peer, and noted for the
//!   rendezvous's final error ([`Door::refusals`]), never the end of the job;
//! - at most [`pending_cap`] connections wait for their hello at once; over it the newest is refused
//!   (closed unread: a real rank refused so tries again within its own deadline, [`backoff`]);
//! - every later line (an admitted elastic member's, and the coordinator's to it) is read with
//!   [`line::Lines`] too, bounded by the protocol's cap (`LINE_CAP` in `examples/elastic/protocol.rs`).
//!
//! What this protects against: port scanners, health checks and load-balancer probes, a leftover rank
//! of an earlier job on the same port (its token differs), a peer that sends garbage, floods a line or
//! holds connections open. What it does not: anyone who can read the job's traffic or environment. The
//! token crosses the network in clear, unencrypted and unsigned, so it keeps strays out, not an attacker
//! on the network, and one derived from a launcher's job id is only as secret as that id (a Slurm job
//! id is visible to every user of the cluster). Nothing here encrypts the unique id or NCCL's own
//! traffic: NCCL 2.32's `ncclSetEncryption` does the latter (see the crate's README).

pub mod backoff;
pub mod door;
pub mod line;
pub mod token;

use std::time::Duration;

/// How long a new connection may take to say its hello: a few seconds, far above a real rank's
/// (which writes it as soon as it connects), far below a rendezvous's deadline.
pub const HELLO_BOUND: Duration = Duration::from_secs(5);
/// The longest hello line: a rank, a job token of at most [`token::TOKEN_MAX`] bytes in hex, and room.
pub const HELLO_CAP: usize = 1024;
/// How many connections may wait for their hello at once in a world of `world` ranks: every rank at the
/// same moment (they start together) and as many strays besides. Each holds a thread and at most a
/// [`HELLO_CAP`] line, for at most [`HELLO_BOUND`].
pub fn pending_cap(world: usize) -> usize {
    world + 64
}

#[cfg(test)]
pub mod peak;
#[cfg(test)]
pub mod strays;
