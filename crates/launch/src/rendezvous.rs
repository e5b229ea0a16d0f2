//! Hands rank 0's `ncclUniqueId` to the other ranks over TCP: the out-of-band step every multi-process NCCL
//! program needs (torchrun uses its store; MPI programs `MPI_Bcast`). Rank 0 listens on `MASTER_PORT`
//! ([`door::bind`]: loopback alone for a loopback `MASTER_ADDR`, else every interface, with a job token);
//! each other rank connects to `MASTER_ADDR:MASTER_PORT`, proves it belongs to the job and reads the id.
//!
//! Wire format: the exchange of [`crate::auth`], whose hello is `MGS2 <rank>`; rank 0 answers `MGS2`
//! and the id's bytes. Whatever else reaches the port is a stray connection
//! ([`crate::door`]): refused with a warning, never the end of the job; rank 0's deadline still bounds
//! the whole wait, and its timeout error lists what it refused. The id is any fixed number of bytes
//! (`ncclUniqueId`'s 128, `NCCL_UNIQUE_ID_BYTES`): this crate knows nothing of NCCL.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::auth::{self, Refused};
use crate::backoff::{self, Backoff};
use crate::door::{self, Door, HELLO_BOUND};
use crate::line::Lines;
use crate::placement;
use crate::token::JobToken;

const MAGIC: &str = "MGS2";

/// Rank 0: serves `id` to `world_size - 1` ranks at `addr` (`host:port`, [`door::bind`]) within
/// `timeout`, to the ranks that prove this job's token ([`JobToken::of_this_job`]).
pub fn serve(addr: &str, world_size: u32, id: &[u8], timeout: Duration) -> Result<(), String> {
    let token = JobToken::of_this_job(addr, "rank 0")?;
    serve_as(addr, world_size, id, token, timeout)
}

/// [`serve`], admitting the ranks that prove `token`.
pub fn serve_as(
    addr: &str,
    world_size: u32,
    id: &[u8],
    token: JobToken,
    timeout: Duration,
) -> Result<(), String> {
    serve_on(door::bind(addr)?, world_size, id, token, timeout)
}

/// What a connection's hello said: the rank it claims, or why it is a stray.
type Hello = (TcpStream, SocketAddr, Result<u32, String>);

/// [`serve`] on a listener already bound (tests bind port 0), admitting the ranks that prove `token`.
/// Each connection's hello is read on a thread of its own (so that a silent one delays nobody), within
/// the gate's bounds; this thread hands out the ranks.
pub fn serve_on(
    listener: TcpListener,
    world_size: u32,
    id: &[u8],
    token: JobToken,
    timeout: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let door = Door::new("rank 0", token, door::pending_cap(world_size as usize));
    let (hellos, heard) = mpsc::channel::<Hello>();
    let mut served = Vec::new();
    // Accepting can fail for a while (out of descriptors, a connection aborted in the queue): the next
    // try may do, within the deadline, whose error then names the last such failure.
    let mut accept_failed = String::new();
    while served.len() + 1 < world_size as usize {
        if Instant::now() >= deadline {
            return Err(format!(
                "rank 0 at {local}: timed out after {timeout:?} with {} of {} ranks connected ({served:?}){}{accept_failed}",
                served.len(),
                world_size - 1,
                door.refusals()
            ));
        }
        let accepted = match listener.accept() {
            Ok((peer, from)) => {
                if let Some(ticket) = door.enter(from) {
                    let (door, hellos) = (Arc::clone(&door), hellos.clone());
                    std::thread::spawn(move || {
                        let said = read_hello(&door, &peer, deadline);
                        let _ = hellos.send((peer, from, said));
                        drop(ticket);
                    });
                }
                true
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
            Err(e) => {
                accept_failed = format!("; the last accept failed: {e}");
                false
            }
        };
        // While connections queue, take the next at once; else wait a little for a hello.
        let said = match accepted {
            true => heard.try_recv().ok(),
            false => heard.recv_timeout(Duration::from_millis(5)).ok(),
        };
        let Some((mut peer, from, said)) = said else {
            continue;
        };
        match said {
            Ok(rank) if rank == 0 || rank >= world_size || served.contains(&rank) => door.refuse(
                from,
                &format!("claims rank {rank}, invalid or taken (world size {world_size})"),
            ),
            Ok(rank) => {
                let mut reply = MAGIC.as_bytes().to_vec();
                reply.extend_from_slice(id);
                match peer.write_all(&reply) {
                    Ok(()) => served.push(rank),
                    Err(e) => door.refuse(from, &format!("rank {rank}: sending it the id: {e}")),
                }
            }
            Err(why) => door.refuse(from, &why),
        }
    }
    Ok(())
}

/// The rank the hello on `peer` claims, read within the gate's bounds and `deadline`.
fn read_hello(door: &Door, peer: &TcpStream, deadline: Instant) -> Result<u32, String> {
    // Accepted from a non-blocking listener, which some systems pass on; the id's write is bounded too.
    peer.set_nonblocking(false).map_err(|e| e.to_string())?;
    peer.set_write_timeout(Some(HELLO_BOUND))
        .map_err(|e| e.to_string())?;
    let mut lines = Lines::new(peer.try_clone().map_err(|e| e.to_string())?);
    let payload = door.hello(&mut lines, deadline)?;
    parse_hello(&payload)
}

/// `MGS2 <rank>` (the hello without its token field); the error quotes it (shortened by the door).
fn parse_hello(payload: &str) -> Result<u32, String> {
    payload
        .split_once(' ')
        .filter(|(magic, _)| *magic == MAGIC)
        .and_then(|(_, rank)| rank.parse().ok())
        .ok_or_else(|| format!("not a rank's hello: {payload:?}"))
}

/// Any other rank: fetches the id from rank 0 at `addr`, retrying the connection until `timeout` (rank 0
/// may start later), proving this job's token ([`JobToken::of_this_job`]).
pub fn fetch<const N: usize>(addr: &str, rank: u32, timeout: Duration) -> Result<[u8; N], String> {
    let token = JobToken::of_this_job(addr, &format!("rank {rank}"))?;
    fetch_as(addr, rank, &token, timeout)
}

/// [`fetch`] with `token`. A connection rank 0 closes without a word (it refused it: too many waiting,
/// or the hello was wrong) is tried again until `timeout` ([`crate::backoff`]).
pub fn fetch_as<const N: usize>(
    addr: &str,
    rank: u32,
    token: &JobToken,
    timeout: Duration,
) -> Result<[u8; N], String> {
    let deadline = Instant::now() + timeout;
    let mut backoff = Backoff::until(deadline);
    let mut connect_within = timeout;
    loop {
        let closed = match fetch_once(addr, rank, token, deadline, connect_within) {
            Err(Fetch::Closed(why)) => why,
            Err(Fetch::Failed(why)) => return Err(why),
            Ok(id) => return Ok(id),
        };
        if !backoff.wait() {
            return Err(format!("{closed} ({})", backoff::REFUSED));
        }
        connect_within = backoff.left();
    }
}

enum Fetch {
    /// Rank 0 closed the connection before its first byte: worth another try.
    Closed(String),
    Failed(String),
}

fn fetch_once<const N: usize>(
    addr: &str,
    rank: u32,
    token: &JobToken,
    deadline: Instant,
    connect_within: Duration,
) -> Result<[u8; N], Fetch> {
    let failed = Fetch::Failed;
    let stream = placement::connect(addr, connect_within)
        .map_err(|e| failed(format!("rank {rank}: {e}")))?;
    let mut lines = Lines::new(stream);
    match auth::prove(&mut lines, token, &format!("{MAGIC} {rank}"), deadline) {
        Ok(()) => {}
        Err(Refused::Closed) => {
            let why =
                format!("rank {rank}: rank 0 at {addr} closed the connection before its proof");
            return Err(Fetch::Closed(why));
        }
        Err(Refused::Failed(why)) => return Err(failed(format!("rank {rank}: {addr}: {why}"))),
    }
    lines
        .stream()
        .set_read_timeout(Some(remaining(deadline).map_err(failed)?))
        .map_err(|e| failed(e.to_string()))?;
    let mut reply = vec![0u8; MAGIC.len() + N];
    let what = format!("the unique id from rank 0 at {addr}");
    match read_all(lines.reader(), &mut reply, &what) {
        Err((true, why)) => return Err(Fetch::Closed(why)),
        Err((false, why)) => return Err(failed(why)),
        Ok(()) => {}
    }
    if &reply[..4] != MAGIC.as_bytes() {
        return Err(failed(format!(
            "{addr} is not rank 0 of this job (bad reply {:02x?})",
            &reply[..4]
        )));
    }
    let mut id = [0u8; N];
    id.copy_from_slice(&reply[MAGIC.len()..]);
    Ok(id)
}

/// Reads exactly `buf.len()` bytes, naming what was expected when the peer closes early or is too slow;
/// the error says whether the peer closed (or reset) the connection before the first byte.
fn read_all(stream: &mut impl Read, buf: &mut [u8], what: &str) -> Result<(), (bool, String)> {
    let (mut got, want) = (0, buf.len());
    let closed = |got: usize, how: &str| {
        let why = format!("{what}: the peer {how} the connection after {got} of {want} bytes");
        (got == 0, why)
    };
    while got < buf.len() {
        match stream.read(&mut buf[got..]) {
            Ok(0) => return Err(closed(got, "closed")),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                return Err(closed(got, "reset"))
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                let why = format!("{what}: timed out after {got} of {want} bytes");
                return Err((false, why));
            }
            Err(e) => return Err((false, format!("{what}: {e}"))),
        }
    }
    Ok(())
}

fn remaining(deadline: Instant) -> Result<Duration, String> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
        .ok_or_else(|| "the rendezvous deadline passed".to_string())
}

#[cfg(test)]
mod tests {
    //! On loopback: the id arrives intact at every rank; strays (a stranger, a forged or wrong-token
    //! hello, a flood, silence) are refused without harm and named when the rendezvous times out; a
    //! short reply or nobody there gives a clear error within its bound.
    use super::*;
    use metrale_gpu_testkit::{peak, strays};

    const T: Duration = Duration::from_secs(20);
    /// `ncclUniqueId`'s size.
    const ID_BYTES: usize = 128;

    fn listener() -> (TcpListener, String) {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let addr = l.local_addr().expect("addr").to_string();
        (l, addr)
    }

    fn token(value: &str) -> JobToken {
        JobToken::new("test", value).expect("token")
    }

    #[test]
    fn every_rank_gets_rank_0s_id() {
        let (l, addr) = listener();
        let id: [u8; ID_BYTES] = std::array::from_fn(|i| (i * 7 + 3) as u8);
        let server = std::thread::spawn(move || serve_on(l, 4, &id, token("job"), T));
        let clients: Vec<_> = (1..4)
            .map(|rank| {
                let addr = addr.clone();
                std::thread::spawn(move || fetch_as(&addr, rank, &token("job"), T))
            })
            .collect();
        for c in clients {
            assert_eq!(c.join().expect("client thread"), Ok(id));
        }
        assert_eq!(server.join().expect("server thread"), Ok(()));
    }

    /// Before the real ranks: a garbage hello, an HTTP request, a connect-and-close, a silent
    /// connection, an 8 MiB line without a newline, a wrong-token hello and forged hellos. The ranks
    /// still get the id; every stray is closed with nothing sent to it; and the peak RSS grows by less
    /// than 6 MiB, where holding the flood would take 8 MiB (the pass measured after a warm-up without
    /// the flood).
    #[test]
    fn strays_before_the_ranks_are_refused_and_the_ranks_still_get_the_id() {
        peak::assert_within_flood_bound(strays_then_ranks);
    }

    fn strays_then_ranks(flood: bool) {
        let (l, addr) = listener();
        let id: [u8; ID_BYTES] = std::array::from_fn(|i| i as u8);
        let server = std::thread::spawn(move || serve_on(l, 3, &id, token("job-a"), T));
        let hellos = [
            ("a forged proof", auth::forged("MGS2 1")),
            (
                "an old hello with its token in clear",
                "MGS2 1 token=6a6f622d61\n".to_string(),
            ),
            ("a forged proof of rank 0", auth::forged("MGS2 0")),
        ];
        let sent = strays::send(&addr, strays::kinds(&hellos, flood), T);
        for rank in 1..3 {
            assert_eq!(fetch_as(&addr, rank, &token("job-a"), T), Ok(id));
        }
        assert_eq!(server.join().expect("server thread"), Ok(()));
        for stray in sent {
            strays::refused(stray).expect("refused, unanswered");
        }
    }

    #[test]
    fn a_stream_of_strays_holds_rank_0_no_longer_than_its_deadline() {
        let (l, addr) = listener();
        let (done, ended) = mpsc::channel();
        let timeout = Duration::from_millis(500);
        std::thread::spawn(move || {
            let _ = done.send(serve_on(l, 2, &[0; ID_BYTES], JobToken::none(), timeout));
        });
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stream = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Acquire) {
                    if let Ok(mut stray) = TcpStream::connect(&addr) {
                        let _ = stray.write_all(b"GET / HTTP/1.1\r\n");
                    }
                }
            })
        };
        let result = ended.recv_timeout(T);
        stop.store(true, std::sync::atomic::Ordering::Release);
        stream.join().expect("the stream's thread");
        let err = result
            .expect("rank 0 ended at its deadline")
            .expect_err("no rank came");
        assert!(
            err.contains("timed out after 500ms with 0 of 1 ranks connected ([]); refused "),
            "{err}"
        );
    }

    /// What rank 0 of a world of 2 (job `job`) says at its deadline after `client` ran against it.
    fn refused(client: impl FnOnce(String) + Send + 'static) -> String {
        let (l, addr) = listener();
        let timeout = Duration::from_millis(1500);
        let server =
            std::thread::spawn(move || serve_on(l, 2, &[1; ID_BYTES], token("job"), timeout));
        client(addr);
        server
            .join()
            .expect("server thread")
            .expect_err("no rank came")
    }

    #[test]
    fn a_stranger_is_refused_by_name_and_listed_at_the_deadline() {
        let err = refused(|addr| {
            let mut stray = TcpStream::connect(&addr).expect("connect");
            stray.write_all(b"GET / HTTP/1.1\r\n").expect("write");
        });
        assert!(err.contains("with 0 of 1 ranks connected"), "{err}");
        assert!(
            err.contains("; refused 1 connection(s): 127.0.0.1:")
                && err.contains("(not a rendezvous challenge: \"GET / HTTP/1.1\")"),
            "{err}"
        );
    }

    /// A client claiming `rank` with `job`'s token, against rank 0 of job `job` in a world of 2: what
    /// the client ends with (it tries until its deadline), and what rank 0 says at its own.
    fn refused_rank(rank: u32, job: &'static str) -> (String, String) {
        let (tx, rx) = std::sync::mpsc::channel();
        let rank0 = refused(move |addr| {
            let mine = fetch_as::<ID_BYTES>(&addr, rank, &token(job), Duration::from_millis(1000));
            let _ = tx.send(mine.expect_err("no id"));
        });
        (rx.recv().expect("the client's end"), rank0)
    }

    /// A rank of this job that claims a rank out of range is refused after its proof; another job's
    /// rank (a token of its own) finds rank 0 an impostor. Neither gets the id; both sides say why.
    #[test]
    fn an_impossible_rank_or_another_jobs_rank_gets_nothing_and_is_named() {
        let cases = [
            (
                7,
                "job",
                "rank 0 refused this process",
                "(claims rank 7, invalid or taken (world size 2))",
            ),
            (
                1,
                "job-b",
                "did not prove it knows this job's token",
                "a rank of another job (its token differs)",
            ),
        ];
        for (rank, job, mine, theirs) in cases {
            let (client, rank0) = refused_rank(rank, job);
            assert!(client.contains(mine), "{client}");
            assert!(rank0.contains(theirs), "{rank0}");
        }
    }

    /// A fake rank 0 without a token: the `n`th connection is closed at once (`None`) or admitted and
    /// answered with `reply`.
    fn fake_rank0(
        l: TcpListener,
        answers: Vec<Option<&'static [u8]>>,
    ) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            for answer in answers {
                let (peer, _) = l.accept().expect("accept");
                let Some(reply) = answer else { continue };
                let mut lines = Lines::new(peer.try_clone().expect("clone"));
                let deadline = Instant::now() + T;
                auth::admit(&mut lines, &JobToken::none(), deadline).expect("the hello");
                (&peer).write_all(reply).expect("write");
            }
        })
    }

    #[test]
    fn a_reply_cut_short_names_the_missing_bytes() {
        let (l, addr) = listener();
        let fake = fake_rank0(l, vec![Some(b"MGS2 only forty bytes of the id here....")]);
        let err = fetch_as::<ID_BYTES>(&addr, 1, &JobToken::none(), T).expect_err("short reply");
        fake.join().expect("fake rank 0");
        assert!(
            err.contains("the peer closed the connection after 40 of 132 bytes"),
            "{err}"
        );
    }

    #[test]
    fn a_rank_closed_without_a_word_tries_again_within_its_deadline() {
        let (l, addr) = listener();
        let reply: &'static [u8] = Box::leak([b"MGS2".as_slice(), &[9; ID_BYTES]].concat().into());
        let fake = fake_rank0(l, vec![None, None, Some(reply)]);
        assert_eq!(fetch_as(&addr, 1, &JobToken::none(), T), Ok([9; ID_BYTES]));
        fake.join().expect("fake rank 0");

        let (l, addr) = listener();
        let fake = fake_rank0(l, vec![None; 2]);
        let err = fetch_as::<ID_BYTES>(&addr, 1, &JobToken::none(), Duration::from_millis(250))
            .expect_err("refused each time");
        drop(fake);
        assert!(
            err.contains(
                "closed the connection before its proof (each time until the deadline: rank 0 refused"
            ),
            "{err}"
        );
    }

    #[test]
    fn nobody_there_times_out_within_the_bound() {
        let (l, addr) = listener();
        drop(l); // nothing listens on that port now
        let start = std::time::Instant::now();
        let err = fetch::<ID_BYTES>(&addr, 1, Duration::from_millis(500)).expect_err("no rank 0");
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "took {:?}",
            start.elapsed()
        );
        assert!(
            err.contains("rank 0 did not answer at") && err.contains("within 500ms"),
            "{err}"
        );

        let (l, _) = listener();
        let err = serve_on(
            l,
            3,
            &[0; ID_BYTES],
            JobToken::none(),
            Duration::from_millis(300),
        )
        .expect_err("no ranks");
        assert!(
            err.ends_with("timed out after 300ms with 0 of 2 ranks connected ([])"),
            "{err}"
        );
    }

    #[test]
    fn rank_0_listens_on_every_interface_whatever_master_addr_resolves_to() {
        // A free port; rank 0 is given a MASTER_ADDR it need not be able to bind (here: not even resolvable).
        let port = listener().0.local_addr().expect("addr").port();
        let id: [u8; ID_BYTES] = std::array::from_fn(|i| i as u8);
        let master = format!("rank0.invalid:{port}");
        let server = std::thread::spawn(move || serve_as(&master, 2, &id, token("job"), T));
        let got = fetch_as(&format!("127.0.0.1:{port}"), 1, &token("job"), T);
        assert_eq!(got, Ok(id));
        assert_eq!(server.join().expect("server thread"), Ok(()));
        let err = serve_as("no-port-here", 2, &id, token("job"), T).expect_err("no port");
        assert!(err.contains("has no port"), "{err}");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

        /// Every rank's hello reads back as written; any other payload is an error, never a panic.
        #[test]
        fn hellos_round_trip_and_garbage_is_an_error(rank: u32, payload in ".{0,64}") {
            proptest::prop_assert_eq!(parse_hello(&format!("{MAGIC} {rank}")), Ok(rank));
            if let Ok(r) = parse_hello(&payload) {
                proptest::prop_assert!(payload.starts_with(MAGIC) && payload.ends_with(&r.to_string()));
            }
        }
    }
}
