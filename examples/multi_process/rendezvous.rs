//! Hands rank 0's `ncclUniqueId` to the other ranks over TCP: the out-of-band step every multi-process NCCL
//! program needs (torchrun uses its store; MPI programs `MPI_Bcast`). Rank 0 listens on `MASTER_PORT` on
//! every interface (as torchrun does: `MASTER_ADDR` may resolve to a loopback address on rank 0's own
//! host); each other rank connects to `MASTER_ADDR:MASTER_PORT`, says who it is, and reads the id.
//!
//! Wire format: the client sends `MGS1` and its rank (u32 LE); rank 0 answers `MGS1` and the id's bytes.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use metrale_gpu_testkit::launcher;

const MAGIC: &[u8; 4] = b"MGS1";
/// The id's size, `NCCL_UNIQUE_ID_BYTES`.
pub const ID_BYTES: usize = metrale_gpu_sys::nccl::ncclUniqueId::BYTES;

/// Rank 0: serves `id` to `world_size - 1` ranks on the port of `addr` (`host:port`), on every interface,
/// within `timeout`.
pub fn serve(
    addr: &str,
    world_size: u32,
    id: &[u8; ID_BYTES],
    timeout: Duration,
) -> Result<(), String> {
    let port = addr
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse::<u16>().ok())
        .ok_or_else(|| format!("MASTER_ADDR:MASTER_PORT '{addr}' has no port"))?;
    let listener = TcpListener::bind(("0.0.0.0", port))
        .map_err(|e| format!("rank 0 cannot listen on port {port}: {e}"))?;
    serve_on(listener, world_size, id, timeout)
}

/// [`serve`] on a listener already bound (tests bind port 0).
pub fn serve_on(
    listener: TcpListener,
    world_size: u32,
    id: &[u8; ID_BYTES],
    timeout: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let mut served = Vec::new();
    while served.len() + 1 < world_size as usize {
        match listener.accept() {
            Ok((mut peer, from)) => {
                peer.set_nonblocking(false).map_err(|e| e.to_string())?;
                peer.set_read_timeout(Some(remaining(deadline)?))
                    .map_err(|e| e.to_string())?;
                let mut hello = [0u8; 8];
                read_all(&mut peer, &mut hello, &format!("the hello from {from}"))?;
                if &hello[..4] != MAGIC {
                    return Err(format!(
                        "{from} is not a rank of this job (bad hello {:02x?})",
                        &hello[..4]
                    ));
                }
                let rank = u32::from_le_bytes([hello[4], hello[5], hello[6], hello[7]]);
                if rank == 0 || rank >= world_size || served.contains(&rank) {
                    return Err(format!(
                        "{from} claims rank {rank}, invalid or taken (world size {world_size})"
                    ));
                }
                let mut reply = MAGIC.to_vec();
                reply.extend_from_slice(id);
                peer.write_all(&reply)
                    .map_err(|e| format!("sending the id to rank {rank} ({from}): {e}"))?;
                served.push(rank);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(format!(
                        "rank 0 at {local}: timed out after {timeout:?} with {} of {} ranks connected ({served:?})",
                        served.len(),
                        world_size - 1
                    ));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(format!("rank 0 at {local}: accept failed: {e}")),
        }
    }
    Ok(())
}

/// Any other rank: fetches the id from rank 0 at `addr`, retrying the connection until `timeout` (rank 0
/// may start later).
pub fn fetch(addr: &str, rank: u32, timeout: Duration) -> Result<[u8; ID_BYTES], String> {
    let deadline = Instant::now() + timeout;
    let mut stream = launcher::connect(addr, timeout).map_err(|e| format!("rank {rank}: {e}"))?;
    stream
        .set_read_timeout(Some(remaining(deadline)?))
        .map_err(|e| e.to_string())?;
    let mut hello = MAGIC.to_vec();
    hello.extend_from_slice(&rank.to_le_bytes());
    stream
        .write_all(&hello)
        .map_err(|e| format!("rank {rank}: sending to {addr}: {e}"))?;
    let mut reply = [0u8; 4 + ID_BYTES];
    read_all(
        &mut stream,
        &mut reply,
        &format!("the unique id from rank 0 at {addr}"),
    )?;
    if &reply[..4] != MAGIC {
        return Err(format!(
            "{addr} is not rank 0 of this job (bad reply {:02x?})",
            &reply[..4]
        ));
    }
    let mut id = [0u8; ID_BYTES];
    id.copy_from_slice(&reply[4..]);
    Ok(id)
}

/// Reads exactly `buf.len()` bytes, naming what was expected when the peer closes early or is too slow.
fn read_all(stream: &mut TcpStream, buf: &mut [u8], what: &str) -> Result<(), String> {
    let mut got = 0;
    while got < buf.len() {
        match stream.read(&mut buf[got..]) {
            Ok(0) => {
                return Err(format!(
                    "{what}: the peer closed the connection after {got} of {} bytes",
                    buf.len()
                ))
            }
            Ok(n) => got += n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(format!(
                    "{what}: timed out after {got} of {} bytes",
                    buf.len()
                ))
            }
            Err(e) => return Err(format!("{what}: {e}")),
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
    //! On loopback: the id arrives intact at every rank, and bad input (a stranger, a short reply,
    //! nobody there) gives a clear error within its bound.
    use super::*;

    fn listener() -> (TcpListener, String) {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let addr = l.local_addr().expect("addr").to_string();
        (l, addr)
    }

    #[test]
    fn every_rank_gets_rank_0s_id() {
        let (l, addr) = listener();
        let id: [u8; ID_BYTES] = std::array::from_fn(|i| (i * 7 + 3) as u8);
        let server = std::thread::spawn(move || serve_on(l, 4, &id, Duration::from_secs(20)));
        let clients: Vec<_> = (1..4)
            .map(|rank| {
                let addr = addr.clone();
                std::thread::spawn(move || fetch(&addr, rank, Duration::from_secs(20)))
            })
            .collect();
        for c in clients {
            assert_eq!(c.join().expect("client thread"), Ok(id));
        }
        assert_eq!(server.join().expect("server thread"), Ok(()));
    }

    /// What rank 0 of a world of 2 answers a client that sends `hello`.
    fn refused(hello: &[u8]) -> String {
        let (l, addr) = listener();
        let server =
            std::thread::spawn(move || serve_on(l, 2, &[1; ID_BYTES], Duration::from_secs(20)));
        TcpStream::connect(&addr)
            .and_then(|mut s| s.write_all(hello))
            .expect("connect and write");
        server
            .join()
            .expect("server thread")
            .expect_err("not a rank of this job")
    }

    #[test]
    fn a_stranger_is_refused_by_name() {
        let err = refused(b"GET / HTTP");
        assert!(err.contains("is not a rank of this job"), "{err}");
    }

    #[test]
    fn a_taken_or_impossible_rank_is_refused() {
        let err = refused(&[b"MGS1".as_slice(), &7u32.to_le_bytes()].concat());
        assert!(
            err.contains("claims rank 7, invalid or taken (world size 2)"),
            "{err}"
        );
    }

    #[test]
    fn a_reply_cut_short_names_the_missing_bytes() {
        let (l, addr) = listener();
        let fake_rank0 = std::thread::spawn(move || {
            let (mut peer, _) = l.accept().expect("accept");
            let mut hello = [0u8; 8];
            peer.read_exact(&mut hello).expect("hello");
            peer.write_all(b"MGS1 only forty bytes of the id here....")
                .expect("write");
        });
        let err = fetch(&addr, 1, Duration::from_secs(20)).expect_err("short reply");
        fake_rank0.join().expect("fake rank 0");
        assert!(
            err.contains("the peer closed the connection after 40 of 132 bytes"),
            "{err}"
        );
    }

    #[test]
    fn nobody_there_times_out_within_the_bound() {
        let (l, addr) = listener();
        drop(l); // nothing listens on that port now
        let start = std::time::Instant::now();
        let err = fetch(&addr, 1, Duration::from_millis(500)).expect_err("no rank 0");
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
        let err = serve_on(l, 3, &[0; ID_BYTES], Duration::from_millis(300)).expect_err("no ranks");
        assert!(
            err.contains("timed out after 300ms with 0 of 2 ranks connected"),
            "{err}"
        );
    }

    #[test]
    fn rank_0_listens_on_every_interface_whatever_master_addr_resolves_to() {
        // A free port; rank 0 is given a MASTER_ADDR it need not be able to bind (here: not even resolvable).
        let port = listener().0.local_addr().expect("addr").port();
        let id: [u8; ID_BYTES] = std::array::from_fn(|i| i as u8);
        let master = format!("rank0.invalid:{port}");
        let server = std::thread::spawn(move || serve(&master, 2, &id, Duration::from_secs(20)));
        assert_eq!(
            fetch(&format!("127.0.0.1:{port}"), 1, Duration::from_secs(20)),
            Ok(id)
        );
        assert_eq!(server.join().expect("server thread"), Ok(()));
        let err = serve("no-port-here", 2, &id, Duration::from_secs(1)).expect_err("no port");
        assert!(err.contains("has no port"), "{err}");
    }
}
