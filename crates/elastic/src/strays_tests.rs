//! The coordinator against stray connections, on loopback with threads for ranks: what reaches rank 0's
//! port besides its ranks is refused without harm, its end is no death, and however many come, rank
//! 0's threads and connections stay within their caps.

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::client::Client;
use crate::coordinator::Coordinator;
use metrale_gpu_launch::auth;
use metrale_gpu_launch::line::Lines;
use metrale_gpu_launch::token::JobToken;
use metrale_gpu_testkit::{peak, strays};

const T: Duration = Duration::from_secs(20);

fn token(value: &str) -> JobToken {
    JobToken::new("test", value).expect("token")
}

/// A coordinator of `world` ranks on a free port, admitting job `job-a`, and its address.
fn coordinator(world: usize) -> (Coordinator, String) {
    let c =
        Coordinator::listen_for("127.0.0.1:0", world, 1, "f00d", token("job-a")).expect("listens");
    let master = format!("127.0.0.1:{}", c.port());
    (c, master)
}

/// Every stray the launch crate's test sends, in the elastic protocol's words: a garbage hello, an HTTP
/// request, a connect-and-close, a silent connection, an 8 MiB line without a newline, hellos and
/// JOINs with a forged proof, an old hello with its token in clear.
fn elastic_strays(flood: bool) -> Vec<strays::Kind> {
    let hellos = [
        ("a forged hello", auth::forged("HELLO 1")),
        ("a forged JOIN", auth::forged("JOIN")),
        (
            "an old hello with its token in clear",
            "HELLO 1 token=6a6f622d61\n".into(),
        ),
        ("a forged hello of no rank", auth::forged("HELLO 9")),
    ];
    strays::kinds(&hellos, flood)
}

fn all_refused(sent: Vec<std::thread::JoinHandle<strays::Stray>>) {
    for stray in sent {
        strays::refused(stray).expect("refused, unanswered");
    }
}

/// Strays before the ranks and while they run: the fake ranks still get the id and the coordinator's
/// news, no stray's end is a death, and the peak RSS grows by less than 6 MiB (holding the flood would
/// take 8 MiB; the pass measured after a warm-up without the flood).
#[test]
fn strays_before_and_among_the_ranks_are_refused_and_the_job_goes_on() {
    peak::assert_within_flood_bound(strays_among_ranks);
}

fn strays_among_ranks(flood: bool) {
    let (c, master) = coordinator(3);
    let early = strays::send(&master, elastic_strays(flood), T);
    let members: Vec<Client> = (1..3)
        .map(|rank| {
            let (client, id) = Client::hello_as(&master, rank, &token("job-a"), T).expect("hello");
            assert_eq!(id, "f00d");
            client
        })
        .collect();
    c.wait_members(T).expect("every rank connects");
    let late = strays::send(&master, elastic_strays(flood), T);
    all_refused(early);
    all_refused(late);
    assert_eq!(c.lost(0), None, "a stray's end is no death");
    for m in &members {
        assert_eq!(m.lost(0), None);
        m.finish().expect("DONE");
    }
    c.finish(T).expect("every member said DONE");
}

#[test]
fn the_wait_for_the_ranks_lists_what_it_refused() {
    let (c, master) = coordinator(2);
    let other_job = std::thread::spawn(move || {
        Client::hello_as(&master, 1, &token("job-b"), Duration::from_millis(700)).map(|_| ())
    });
    let err = c
        .wait_members(Duration::from_secs(1))
        .expect_err("no rank of this job");
    assert!(
        err.contains("for every rank to connect; refused ")
            && err.contains("(it closed after rank 0's proof: a rank of another job"),
        "{err}"
    );
    let err = other_job.join().expect("no panic").expect_err("refused");
    assert!(
        err.contains("did not prove it knows this job's token"),
        "{err}"
    );
}

#[test]
fn a_member_line_over_the_cap_ends_it_as_a_death() {
    let (c, master) = coordinator(2);
    let mut member = TcpStream::connect(&master).expect("connect");
    let mut lines = Lines::new(member.try_clone().expect("clone"));
    let by = Instant::now() + T;
    auth::prove(&mut lines, &token("job-a"), "HELLO 1", by).expect("admitted");
    c.wait_members(T).expect("rank 1 connects");
    let _ = member.write_all(&vec![b'7'; crate::protocol::LINE_CAP + 1]);
    let deadline = Instant::now() + T;
    while c.lost(0).is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        c.lost(0),
        Some("the rendezvous: rank 1 of generation 0 died".into())
    );
}

/// Rank 0's connections at `port`, from the kernel's table: sockets whose local port it is, open at
/// rank 0's end (established, or closed by the peer and not yet by rank 0). `None` where the table
/// cannot be read.
fn rank0_connections(port: u16) -> Option<usize> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let local = format!(":{port:04X}");
    let open = table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            Some((*fields.get(1)?, *fields.get(3)?))
        })
        .filter(|(addr, state)| addr.ends_with(&local) && matches!(*state, "01" | "08"))
        .count();
    Some(open)
}

/// 1,000 replacements of this job say `JOIN` one after another (300 of them took rank 0 from 3
/// threads to 303 before the cap): the first world's size of them wait, the rest are refused with a
/// line; rank 0's connection threads and its connections stay within the cap all along.
#[test]
fn a_thousand_joins_leave_rank_0_within_its_caps() {
    const WORLD: usize = 4;
    let (c, master) = coordinator(WORLD);
    let port = c.port();
    let cap = crate::coordinator::thread_cap(WORLD);
    let mut held: Vec<TcpStream> = Vec::new();
    let mut most = (0, 0);
    for join in 0..1000 {
        let conn = TcpStream::connect(&master).expect("connect");
        let mut lines = Lines::new(conn.try_clone().expect("clone"));
        let by = Instant::now() + T;
        // Refused before its proof when too many wait for theirs: that connection is closed.
        if auth::prove(&mut lines, &token("job-a"), "JOIN", by).is_ok() {
            held.push(conn);
        }
        if join % 50 == 49 {
            // The connections rank 0 closed are let go here too (this process's descriptors).
            held.retain(|conn| {
                conn.set_nonblocking(true).expect("nonblocking");
                !matches!(conn.peek(&mut [0u8; 1]), Ok(0))
            });
            let connections = rank0_connections(port).unwrap_or(0);
            most = (most.0.max(c.threads()), most.1.max(connections));
            assert!(c.waiting() <= WORLD, "{} replacements wait", c.waiting());
        }
    }
    assert!(
        most.0 <= cap,
        "rank 0 ran {} connection threads, over {cap}",
        most.0
    );
    assert!(
        most.1 <= cap,
        "rank 0 held {} connections, over {cap}",
        most.1
    );
    if rank0_connections(port).is_none() {
        metrale_gpu_testkit::skip::skip_check(
            "connections",
            "/proc/net/tcp cannot be read: only the thread count was checked",
        );
    }
    assert_eq!(c.waiting(), WORLD, "the first world's size of them wait");
    let err = c.wait_members(Duration::ZERO).expect_err("no ranks came");
    assert!(
        err.contains("replacements wait already, the most (4"),
        "{err}"
    );
}
