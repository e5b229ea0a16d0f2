//! Stray connections, for the tests: what port scanners, health checks, floods and other jobs' ranks
//! send to a rendezvous, and what each saw (the launch and elastic crates' tests, the GPU suite's).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::thread::JoinHandle;
use std::time::Duration;

/// The flood's size: a line with no newline, far over any cap.
pub const FLOOD: usize = 8 << 20;

/// What one stray saw.
pub struct Stray {
    what: String,
    /// Whether it began with a challenge (`MGS3 <nonce>`), which the rendezvous answers with its own
    /// proof: one line, which says nothing of the token.
    challenged: bool,
    /// What the rendezvous sent it (its first 4 KiB): nothing, or for a challenge that one line (a
    /// stray must never get the unique id).
    answer: Vec<u8>,
    /// Whether the rendezvous closed it within the wait (`false` for one that closed itself).
    closed: bool,
}

/// Waits for a stray's end: an error, naming it, where the rendezvous sent it a byte or left it open.
pub fn refused(stray: JoinHandle<Stray>) -> Result<(), String> {
    let s = stray
        .join()
        .map_err(|_| "a stray's thread panicked".to_string())?;
    let proof_only = |a: &[u8]| {
        let line = a.strip_suffix(b"\n").unwrap_or(b"");
        a.starts_with(b"MGS3 ") && !line.contains(&b'\n')
    };
    match s.closed && (s.answer.is_empty() || (s.challenged && proof_only(&s.answer))) {
        true => Ok(()),
        false => Err(format!(
            "{}: answered {:?}, closed by the rendezvous: {}",
            s.what,
            String::from_utf8_lossy(&s.answer),
            s.closed
        )),
    }
}

/// What a stray sends: its name, bytes, and how many times it sends them (the flood repeats a small
/// chunk, so that the sender's own memory does not hide the rendezvous's in a test's RSS).
pub type Kind = (String, Vec<u8>, usize);

/// The strays, by name, with `hellos` (well-formed lines, each with its newline, that must still be
/// refused: a wrong token, a forged rank) after them; the flood only where `flood` says.
pub fn kinds(hellos: &[(&str, String)], flood: bool) -> Vec<Kind> {
    const CHUNK: usize = 64 << 10;
    let mut kinds = vec![
        ("16 bytes of 0xff".to_string(), vec![0xff; 16], 1),
        (
            "an HTTP request".to_string(),
            b"GET / HTTP/1.1\r\nHost: rank0\r\n\r\n".to_vec(),
            1,
        ),
        ("HELLO rank=1".to_string(), b"HELLO rank=1\n".to_vec(), 1),
        ("silence".to_string(), Vec::new(), 0),
    ];
    if flood {
        let what = format!("{FLOOD} bytes without a newline");
        kinds.push((what, vec![b'a'; CHUNK], FLOOD / CHUNK));
    }
    kinds.extend(
        hellos
            .iter()
            .map(|(what, line)| (what.to_string(), line.as_bytes().to_vec(), 1)),
    );
    kinds
}

/// Connects one stray of each of `kinds` to `addr`, in order, and a connect-and-close; each then waits
/// (up to `wait`) in a thread of its own for the rendezvous to close it. Returns once all are
/// connected, so that they reach the rendezvous before whatever the caller connects next.
pub fn send(addr: &str, kinds: Vec<Kind>, wait: Duration) -> Vec<JoinHandle<Stray>> {
    if let Ok(conn) = TcpStream::connect(addr) {
        drop(conn); // connect and close
    }
    kinds
        .into_iter()
        .filter_map(|(what, bytes, times)| {
            let conn = TcpStream::connect(addr).ok()?;
            Some(std::thread::spawn(move || {
                stray(conn, what, &bytes, times, wait)
            }))
        })
        .collect()
}

fn stray(mut conn: TcpStream, what: String, bytes: &[u8], times: usize, wait: Duration) -> Stray {
    // A refused flood ends in a reset: the write's error is the rendezvous closing it.
    for _ in 0..times {
        if conn.write_all(bytes).is_err() {
            break;
        }
    }
    let _ = conn.set_read_timeout(Some(wait));
    let mut chunk = [0u8; 256];
    let mut answer = Vec::new();
    let closed = loop {
        match conn.read(&mut chunk) {
            Ok(0) => break true,
            Ok(n) if answer.len() < 4096 => answer.extend_from_slice(&chunk[..n]),
            Ok(_) => {}
            Err(e) => break e.kind() == std::io::ErrorKind::ConnectionReset,
        }
    };
    Stray {
        what,
        challenged: bytes.starts_with(b"MGS3 "),
        answer,
        closed,
    }
}
