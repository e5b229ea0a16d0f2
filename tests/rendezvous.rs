//! The unique-id rendezvous of examples/multi_process.rs, on loopback: the id arrives intact at every
//! rank, and bad input (a stranger, a short reply, nobody there) gives a clear error within its bound.

#[allow(dead_code)]
#[path = "../examples/multi_process/rendezvous.rs"]
mod rendezvous;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use rendezvous::{fetch, serve_on, ID_BYTES};

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

#[test]
fn a_stranger_is_refused_by_name() {
    let (l, addr) = listener();
    let server =
        std::thread::spawn(move || serve_on(l, 2, &[1; ID_BYTES], Duration::from_secs(20)));
    let mut s = TcpStream::connect(&addr).expect("connect");
    s.write_all(b"GET / HTTP").expect("write");
    let err = server
        .join()
        .expect("server thread")
        .expect_err("not a rank");
    assert!(err.contains("is not a rank of this job"), "{err}");
}

#[test]
fn a_taken_or_impossible_rank_is_refused() {
    let (l, addr) = listener();
    let server =
        std::thread::spawn(move || serve_on(l, 2, &[1; ID_BYTES], Duration::from_secs(20)));
    let mut s = TcpStream::connect(&addr).expect("connect");
    s.write_all(b"MGS1")
        .and_then(|()| s.write_all(&7u32.to_le_bytes()))
        .expect("write");
    let err = server
        .join()
        .expect("server thread")
        .expect_err("rank 7 of 2");
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
    let server =
        std::thread::spawn(move || rendezvous::serve(&master, 2, &id, Duration::from_secs(20)));
    assert_eq!(
        fetch(&format!("127.0.0.1:{port}"), 1, Duration::from_secs(20)),
        Ok(id)
    );
    assert_eq!(server.join().expect("server thread"), Ok(()));
    let err =
        rendezvous::serve("no-port-here", 2, &id, Duration::from_secs(1)).expect_err("no port");
    assert!(err.contains("has no port"), "{err}");
}
