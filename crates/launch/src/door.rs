//! Rank 0's door, in front of every rendezvous this crate and metrale-gpu-elastic serve. Whatever
//! reaches rank 0's port is a stranger until its hello is read and checked:
//!
//! - each connection's hello is one line of at most [`HELLO_CAP`] bytes, read within [`HELLO_BOUND`]
//!   (and within the rendezvous's own deadline): a longer line, a silent or slow peer, a peer that closes
//!   first, a hello that does not parse, a rank that is taken or out of range, or no proof of the job
//!   token ([`crate::auth`]) is a stray connection: closed, with one warning line naming the peer, and noted
//!   for the rendezvous's final error ([`Door::refusals`]), never the end of the job;
//! - at most [`pending_cap`] connections wait for their hello at once; over it the newest is refused
//!   (closed unread: a real rank refused so tries again within its own deadline, [`crate::backoff`]);
//! - every later line is read with [`Lines`] too, bounded by the protocol's own cap.
//!
//! What this protects against: port scanners, health checks and load-balancer probes, a leftover rank
//! of an earlier job on the same port (its token differs), a peer that sends garbage, floods a line or
//! holds connections open. See [`crate::token`] for what the token protects and what it does not.

use std::net::{IpAddr, SocketAddr, TcpListener};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use std::time::Duration;

use crate::auth;
use crate::line::Lines;
use crate::token::{self, JobToken};

/// How long a new connection may take to say its hello: a few seconds, far above a real rank's
/// (which writes it as soon as it connects), far below a rendezvous's deadline.
pub const HELLO_BOUND: Duration = Duration::from_secs(5);
pub use crate::auth::HELLO_CAP;
/// How many connections may wait for their hello at once in a world of `world` ranks: every rank at the
/// same moment (they start together) and as many strays besides. Each holds a thread and at most a
/// [`HELLO_CAP`] line, for at most [`HELLO_BOUND`].
pub fn pending_cap(world: usize) -> usize {
    world + 64
}

/// Rank 0's listener for the rendezvous at `master` (`HOST:PORT`; port 0 picks one): on that loopback
/// address alone where `master` is one ([`token::is_loopback`]), else on every interface (as torchrun
/// does: `MASTER_ADDR` may resolve to a loopback address on rank 0's own host), where
/// [`JobToken::for_master`] asks for a token.
pub fn bind(master: &str) -> Result<TcpListener, String> {
    let (host, port) = master
        .rsplit_once(':')
        .and_then(|(host, port)| Some((host, port.parse::<u16>().ok()?)))
        .ok_or_else(|| format!("the rendezvous address '{master}' has no port"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let ip = match token::is_loopback(master) {
        true => host.parse().unwrap_or(IpAddr::from([127, 0, 0, 1])),
        false => IpAddr::from([0, 0, 0, 0]),
    };
    TcpListener::bind((ip, port))
        .map_err(|e| format!("rank 0 cannot listen on port {port}: {e} (on {ip})"))
}

/// How many refusals the final error names; the rest are counted.
const NAMED: usize = 8;
/// How many (host, reason) pairs the door remembers, to warn once per pair: a rank of another job
/// retrying, or a scanner hammering the port, is one line, not one a connection.
const REMEMBERED: usize = 64;
/// How much of a refusal's reason (which may quote the peer's bytes) a warning line keeps.
const WHY_MAX: usize = 160;

pub struct Door {
    /// Who speaks in the warnings (`rank 0`).
    who: String,
    token: JobToken,
    cap: usize,
    pending: AtomicUsize,
    refused: Mutex<Refused>,
}

#[derive(Default)]
struct Refused {
    named: Vec<String>,
    count: usize,
    /// The (host, reason) pairs warned about, the first [`REMEMBERED`].
    warned: Vec<(IpAddr, String)>,
}

/// A connection's place among those waiting for their hello; dropping it frees the place.
pub struct Ticket(Arc<Door>);

impl Drop for Ticket {
    fn drop(&mut self) {
        self.0.pending.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Door {
    /// A door that admits hellos carrying `token`, with at most `cap` of them waiting at once.
    pub fn new(who: &str, token: JobToken, cap: usize) -> Arc<Door> {
        Arc::new(Door {
            who: who.to_string(),
            token,
            cap,
            pending: AtomicUsize::new(0),
            refused: Mutex::new(Refused::default()),
        })
    }

    /// A place for the connection from `peer` to say its hello in, or `None` (refused, and said so)
    /// when `cap` connections already wait: the newest is the one turned away.
    pub fn enter(self: &Arc<Door>, peer: SocketAddr) -> Option<Ticket> {
        let cap = self.cap;
        let taken = self.pending.fetch_add(1, Ordering::AcqRel);
        let ticket = Ticket(Arc::clone(self));
        if taken < cap {
            return Some(ticket);
        }
        self.refuse(
            peer,
            &format!("{cap} connections already wait for their hello"),
        );
        None
    }

    /// The hello on `lines`, proved ([`auth::admit`]): each line of at most [`HELLO_CAP`] bytes,
    /// the whole exchange within [`HELLO_BOUND`] (or by `deadline`, if sooner). The error is why the
    /// connection is a stray (for [`Door::refuse`]).
    pub fn hello(&self, lines: &mut Lines, deadline: Instant) -> Result<String, String> {
        let by = deadline.min(Instant::now() + HELLO_BOUND);
        auth::admit(lines, &self.token, by)
    }

    /// Says on stderr that the connection from `peer` is refused and why, one line (the first time
    /// for its host and reason; repeats are counted), and notes it for [`Door::refusals`]. The caller
    /// closes the connection.
    pub fn refuse(&self, peer: SocketAddr, why: &str) {
        let why: String = match why.char_indices().nth(WHY_MAX) {
            Some((cut, _)) => format!("{}…", &why[..cut]),
            None => why.to_string(),
        };
        let mut r = self.refused.lock().unwrap_or_else(PoisonError::into_inner);
        r.count += 1;
        let pair = (peer.ip(), why);
        if r.warned.contains(&pair) {
            return;
        }
        let why = &pair.1;
        eprintln!(
            "{}: rendezvous: refused {peer}: {why} (repeats from this host for this reason are \
             counted, not shown)",
            self.who
        );
        if r.named.len() < NAMED {
            r.named.push(format!("{peer} ({why})"));
        }
        if r.warned.len() < REMEMBERED {
            r.warned.push(pair);
        }
    }

    /// What was refused so far, for a rendezvous's final error (empty when nothing was): a stray is
    /// never an error, but a rank refused for its token or its rank is how a misconfigured job shows.
    pub fn refusals(&self) -> String {
        let r = self.refused.lock().unwrap_or_else(PoisonError::into_inner);
        let more = match r.count - r.named.len() {
            0 => String::new(),
            n => format!(" and {n} more"),
        };
        match r.count {
            0 => String::new(),
            n => format!("; refused {n} connection(s): {}{more}", r.named.join(", ")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    #[test]
    fn over_the_cap_the_newest_is_refused_and_a_freed_place_is_taken_again() {
        let door = Door::new("rank 0", JobToken::none(), 2);
        let first = door.enter(peer(1)).expect("a place");
        let _second = door.enter(peer(2)).expect("a place");
        assert!(door.enter(peer(3)).is_none());
        drop(first);
        assert!(door.enter(peer(4)).is_some());
        assert_eq!(
            door.refusals(),
            "; refused 1 connection(s): 127.0.0.1:3 (2 connections already wait for their hello)"
        );
    }

    /// Closed by default: a loopback rendezvous listens on loopback alone (strangers cannot reach it);
    /// another listens on every interface (and needs a token, `JobToken::for_master`).
    #[test]
    fn a_loopback_rendezvous_listens_on_loopback_alone() {
        for (master, loopback) in [
            ("127.0.0.1:0", true),
            ("localhost:0", true),
            ("rank0.invalid:0", false),
        ] {
            let ip = bind(master)
                .expect("binds")
                .local_addr()
                .expect("addr")
                .ip();
            assert_eq!(ip.is_loopback(), loopback, "{master}: {ip}");
            assert_eq!(ip.is_unspecified(), !loopback, "{master}: {ip}");
        }
        let err = bind("nowhere").expect_err("no port");
        assert!(err.contains("'nowhere' has no port"), "{err}");
    }

    #[test]
    fn the_record_names_a_few_and_counts_the_rest_and_cuts_long_reasons() {
        let door = Door::new("rank 0", JobToken::none(), 0);
        for port in 0..(NAMED as u16 + 3) {
            door.refuse(peer(port), &format!("{port}{}", "x".repeat(1000)));
        }
        let record = door.refusals();
        assert!(
            record.starts_with("; refused 11 connection(s): 127.0.0.1:0 ("),
            "{record}"
        );
        assert!(record.ends_with("…) and 3 more"), "{record}");
        assert!(record.len() < NAMED * (WHY_MAX + 40), "{record}");
    }
}
