//! How the processes of a multi-process GPU job find each other, before NCCL can.
//!
//! - [`placement`]: where this process stands (its rank, the world's size, its GPU on this host) and
//!   where rank 0 listens, from flags or the variables torchrun, Slurm, Open MPI or a PMI launcher set.
//! - [`token`]: the job token, the secret every rank of one job shares, from `METRALE_JOB_TOKEN` or
//!   the launcher's job id.
//! - [`auth`]: the challenge-response that opens every connection: each side proves it knows the token
//!   with an HMAC-SHA256 over the other's fresh nonce; the token never crosses the wire.
//! - [`door`]: rank 0's door: whatever reaches its port is a stranger until its hello is read within
//!   its bounds and proved; strays are refused with a line, never the end of the job.
//! - [`line`](mod@line): a peer's lines, each bounded in bytes and in time.
//! - [`backoff`]: how a rank tries again when rank 0 closed its connection without a word.
//! - [`rendezvous`]: rank 0 hands its `ncclUniqueId` (any fixed number of bytes) to the other ranks.
//! - [`hex`]: bytes as hex and back.
//!
//! ```no_run
//! use std::time::Duration;
//! use metrale_gpu_launch::{placement, rendezvous};
//!
//! let args: Vec<String> = std::env::args().skip(1).collect();
//! let me = placement::placement(&args, &|name| std::env::var(name).ok())?;
//! let id: [u8; 128] = if me.rank == 0 {
//!     let id = [7u8; 128]; // ncclGetUniqueId's bytes
//!     rendezvous::serve(&me.master, me.world_size, &id, Duration::from_secs(120))?;
//!     id
//! } else {
//!     rendezvous::fetch(&me.master, me.rank, Duration::from_secs(120))?
//! };
//! # let _ = id;
//! # Ok::<(), String>(())
//! ```

pub mod auth;
pub mod backoff;
pub mod door;
pub mod hex;
pub mod line;
pub mod placement;
pub mod rendezvous;
pub mod token;
