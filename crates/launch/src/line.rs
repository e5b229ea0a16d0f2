//! A peer's lines, each bounded in bytes and, where the caller gives a deadline, in time: a peer that
//! floods a line without a newline, or trickles one a byte at a time, costs at most the cap and the
//! deadline, never memory or a thread for good.

use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::net::TcpStream;
use std::time::Instant;

pub struct Lines {
    reader: BufReader<TcpStream>,
}

impl Lines {
    pub fn new(stream: TcpStream) -> Lines {
        Lines {
            reader: BufReader::new(stream),
        }
    }

    /// The connection, for what else the protocol reads or writes on it.
    pub fn stream(&self) -> &TcpStream {
        self.reader.get_ref()
    }

    /// The reader, whose buffer may hold bytes past the last line: a protocol that goes on in bytes
    /// reads them from here.
    pub fn reader(&mut self) -> &mut BufReader<TcpStream> {
        &mut self.reader
    }

    /// Writes `line` and its newline, by `deadline` (a peer that reads nothing costs at most that).
    pub fn send(&mut self, line: &str, deadline: Instant) -> Result<(), String> {
        let left = deadline
            .checked_duration_since(Instant::now())
            .filter(|left| !left.is_zero())
            .ok_or("no time left to write a line")?;
        let stream = self.reader.get_ref();
        stream
            .set_write_timeout(Some(left))
            .map_err(|e| format!("setting the write bound: {e}"))?;
        let mut stream = stream;
        stream
            .write_all(format!("{line}\n").as_bytes())
            .map_err(|e| format!("writing a line: {e}"))
    }

    /// The next line, without its `\n` (or `\r\n`); `None` when the peer closed (or reset) the
    /// connection before a line began. An
    /// error, naming what was read, for a line over `cap` bytes, a line not UTF-8, a peer that closes
    /// inside a line, or `deadline` passing first (each read waits at most until then; `None`: as long
    /// as the peer keeps the connection open).
    pub fn next(
        &mut self,
        cap: usize,
        deadline: Option<Instant>,
    ) -> Result<Option<String>, String> {
        let mut line = Vec::new();
        loop {
            let wait = match deadline {
                None => None,
                Some(d) => Some(
                    d.checked_duration_since(Instant::now())
                        .filter(|left| !left.is_zero())
                        .ok_or_else(|| silent(line.len()))?,
                ),
            };
            self.reader
                .get_ref()
                .set_read_timeout(wait)
                .map_err(|e| format!("setting the read bound: {e}"))?;
            let chunk = match self.reader.fill_buf() {
                Ok(chunk) => chunk,
                // A reset is the peer's end too (a process that dies with bytes unread resets).
                Err(e) if e.kind() == ErrorKind::ConnectionReset => &[],
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return Err(silent(line.len()))
                }
                Err(e) => return Err(format!("reading a line: {e}")),
            };
            if chunk.is_empty() {
                return match line.len() {
                    0 => Ok(None),
                    n => Err(format!(
                        "the connection closed inside a line ({n} bytes, no newline)"
                    )),
                };
            }
            let newline = chunk.iter().position(|&b| b == b'\n');
            let take = newline.unwrap_or(chunk.len());
            if line.len() + take > cap {
                return Err(format!("a line longer than {cap} bytes"));
            }
            line.extend_from_slice(&chunk[..take]);
            self.reader.consume(take + usize::from(newline.is_some()));
            if newline.is_some() {
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                return String::from_utf8(line)
                    .map(Some)
                    .map_err(|e| format!("a line that is not UTF-8 text ({e})"));
            }
        }
    }
}

fn silent(got: usize) -> String {
    format!("no complete line within its time bound ({got} bytes of it)")
}

#[cfg(test)]
mod tests {
    //! On loopback: lines arrive whole and in order, and each bound ends a read with its reason.
    use super::*;
    use std::io::Write;
    use std::net::TcpListener;
    use std::time::Duration;

    /// A connected pair: the peer's end, and ours as `Lines`.
    fn pair() -> (TcpStream, Lines) {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let peer = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        (peer, Lines::new(l.accept().expect("accept").0))
    }

    fn soon() -> Option<Instant> {
        Some(Instant::now() + Duration::from_millis(300))
    }

    #[test]
    fn lines_arrive_whole_then_the_end() {
        let (mut peer, mut lines) = pair();
        peer.write_all(b"one\r\ntwo\n\nthree").expect("write");
        drop(peer);
        assert_eq!(lines.next(8, soon()), Ok(Some("one".into())));
        assert_eq!(lines.next(8, None), Ok(Some("two".into())));
        assert_eq!(lines.next(8, None), Ok(Some(String::new())));
        let err = lines.next(8, None).expect_err("no newline before the end");
        assert!(err.contains("closed inside a line (5 bytes"), "{err}");
        assert_eq!(lines.next(8, None), Ok(None));
    }

    #[test]
    fn each_bound_ends_the_read_with_its_reason() {
        let (mut peer, mut lines) = pair();
        peer.write_all(b"0123456789\n").expect("write");
        let err = lines.next(9, soon()).expect_err("over the cap");
        assert_eq!(err, "a line longer than 9 bytes");

        let (mut peer, mut lines) = pair();
        peer.write_all(b"half a li").expect("write");
        let err = lines.next(64, soon()).expect_err("silent");
        assert!(
            err.contains("no complete line within its time bound (9 bytes"),
            "{err}"
        );

        let (mut peer, mut lines) = pair();
        peer.write_all(&[0xff, 0xfe, b'\n']).expect("write");
        let err = lines.next(64, soon()).expect_err("not text");
        assert!(err.contains("not UTF-8"), "{err}");
    }
}
