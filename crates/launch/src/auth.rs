//! The challenge-response that opens every connection to a rendezvous: each side proves it knows the
//! job token ([`crate::token`]) with an HMAC-SHA256 over a fresh nonce of the other side's, checked in
//! constant time. The token never crosses the wire, and rank 0 proves itself first, so that a squatter
//! on its port learns nothing but a random nonce and cannot hand out an id of its own.
//!
//! The exchange, one line each way, then the protocol's own:
//!
//! 1. the rank: `MGS3 <nonce R, 32 bytes as hex>`;
//! 2. rank 0: `MGS3 <nonce S> <HMAC(token, "rank 0" ‖ R ‖ S)>`, which the rank checks;
//! 3. the rank: `<its hello> proof=<HMAC(token, "rank" ‖ S ‖ R ‖ hello)>`, which rank 0 checks before
//!    it reads the hello (the proof covers the hello: it cannot be moved to another).
//!
//! A line that is not the next step, a wrong proof, a peer that closes or is silent past the bound: the
//! connection is a stray to rank 0 ([`crate::door`]), and rank 0 an impostor to the rank.

use std::time::Instant;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::hex;
use crate::line::Lines;
use crate::token::JobToken;

/// The longest line of the exchange: a challenge, rank 0's proof, or a hello with its proof (a few
/// hundred bytes at most), and room.
pub const HELLO_CAP: usize = 1024;

/// The first word of the exchange's lines (the protocol's version).
pub const MAGIC: &str = "MGS3";
/// The field of the hello's line that carries the rank's proof.
pub const PROOF: &str = "proof=";
/// Bytes of a nonce.
pub const NONCE: usize = 32;
/// What each side's HMAC covers first: which side made it, so that neither can be passed off as the
/// other.
const RANK0: &[u8] = b"metrale rendezvous: rank 0";
const RANK: &[u8] = b"metrale rendezvous: rank";

type HmacSha256 = Hmac<Sha256>;

/// The HMAC of `parts` under `token`.
fn mac(token: &JobToken, parts: &[&[u8]]) -> Result<HmacSha256, String> {
    // HMAC takes a key of any length (the empty one of no token too): no error comes.
    let mut mac = HmacSha256::new_from_slice(token.key())
        .map_err(|e| format!("an HMAC keyed with the job token: {e}"))?;
    for part in parts {
        // Each part's length first: no two splits of the same bytes give the same MAC.
        mac.update(&(part.len() as u64).to_be_bytes());
        mac.update(part);
    }
    Ok(mac)
}

/// The hex of the HMAC of `parts` under `token`.
fn sign(token: &JobToken, parts: &[&[u8]]) -> Result<String, String> {
    Ok(hex::encode(&mac(token, parts)?.finalize().into_bytes()))
}

/// Whether `theirs` (hex) is the HMAC of `parts` under `token`; compared in constant time (the time a
/// refusal takes says nothing of how much of a guess was right).
fn verify(token: &JobToken, parts: &[&[u8]], theirs: &str) -> bool {
    let mac = mac(token, parts);
    hex::decode(theirs).is_some_and(|theirs| mac.is_ok_and(|mac| mac.verify_slice(&theirs).is_ok()))
}

/// A fresh nonce from the operating system's random source.
fn nonce() -> Result<[u8; NONCE], String> {
    let mut n = [0u8; NONCE];
    getrandom::fill(&mut n)
        .map_err(|e| format!("no random nonce from the operating system: {e}"))?;
    Ok(n)
}

/// A nonce's hex, or `None` for anything else.
fn parse_nonce(text: &str) -> Option<[u8; NONCE]> {
    hex::decode(text).and_then(|bytes| bytes.try_into().ok())
}

/// How the rank's side of the exchange failed.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// Rank 0 closed the connection before its proof: it refused this one (too many waiting), worth
    /// another try.
    Closed,
    /// The peer is no rank 0 of this job (a wrong proof, or no exchange at all), or the exchange broke
    /// (the connection, a bound): why.
    Failed(String),
}

/// The rank's side on `lines`, by `deadline`: its challenge, rank 0's proof checked, then `hello` with
/// its own proof. Afterwards the connection is the protocol's.
pub fn prove(
    lines: &mut Lines,
    token: &JobToken,
    hello: &str,
    deadline: Instant,
) -> Result<(), Refused> {
    let failed = Refused::Failed;
    let mine = nonce().map_err(failed)?;
    // A write that fails is rank 0 closing the connection first (it refused it), as a close is.
    if lines
        .send(&format!("{MAGIC} {}", hex::encode(&mine)), deadline)
        .is_err()
    {
        return Err(Refused::Closed);
    }
    let answer = match lines.next(HELLO_CAP, Some(deadline)) {
        Ok(Some(answer)) => answer,
        Ok(None) => return Err(Refused::Closed),
        Err(e) => return Err(failed(format!("rank 0's proof: {e}"))),
    };
    let impostor = || {
        failed(
            "the peer did not prove it knows this job's token: another job's rendezvous (its token \
             differs: is METRALE_JOB_TOKEN the same on every rank?), or a stranger on rank 0's port"
                .to_string(),
        )
    };
    let fields: Vec<&str> = answer.split(' ').collect();
    let [MAGIC, theirs, proof] = fields[..] else {
        return Err(impostor());
    };
    let theirs = parse_nonce(theirs).ok_or_else(impostor)?;
    if !verify(token, &[RANK0, &mine, &theirs], proof) {
        return Err(impostor());
    }
    let proof = sign(token, &[RANK, &theirs, &mine, hello.as_bytes()]).map_err(failed)?;
    lines
        .send(&format!("{hello} {PROOF}{proof}"), deadline)
        .map_err(failed)
}

/// Rank 0's side on `lines`, by `deadline`: the rank's challenge answered with rank 0's proof, then
/// the rank's hello read and its proof checked. The hello (without its proof), or why the connection
/// is a stray.
pub fn admit(lines: &mut Lines, token: &JobToken, deadline: Instant) -> Result<String, String> {
    let challenge = lines
        .next(HELLO_CAP, Some(deadline))?
        .ok_or("it closed without a hello")?;
    let theirs = challenge
        .strip_prefix(MAGIC)
        .and_then(|rest| rest.strip_prefix(' '))
        .and_then(parse_nonce)
        .ok_or_else(|| format!("not a rendezvous challenge: {challenge:?}"))?;
    let mine = nonce()?;
    let proof = sign(token, &[RANK0, &theirs, &mine])?;
    lines.send(&format!("{MAGIC} {} {proof}", hex::encode(&mine)), deadline)?;
    let line = lines.next(HELLO_CAP, Some(deadline))?.ok_or(
        "it closed after rank 0's proof: a rank of another job (its token differs), or a prober",
    )?;
    let (hello, proof) = line
        .rsplit_once(' ')
        .and_then(|(hello, field)| Some((hello, field.strip_prefix(PROOF)?)))
        .ok_or("a hello without a proof of the job token")?;
    match verify(token, &[RANK, &mine, &theirs, hello.as_bytes()], proof) {
        true => Ok(hello.to_string()),
        false => Err("a wrong proof of the job token (another job's rank, or a forgery)".into()),
    }
}

/// What a stray that knows the exchange but not the token sends: a challenge, then `hello` with a
/// forged proof. For the tests that show it gets nothing but rank 0's proof.
pub fn forged(hello: &str) -> String {
    let zeros = "0".repeat(2 * NONCE);
    format!("{MAGIC} {}\n{hello} {PROOF}{zeros}\n", "ab".repeat(NONCE))
}

#[cfg(test)]
mod tests {
    //! Both sides on loopback, and a squatter that records what a rank sends it.
    use super::*;
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::time::Duration;

    fn token(value: &str) -> JobToken {
        JobToken::new("test", value).expect("token")
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(10)
    }

    /// A connected pair: the rank's end and rank 0's, as `Lines`.
    fn pair() -> (Lines, Lines) {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let rank = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        (Lines::new(rank), Lines::new(l.accept().expect("accept").0))
    }

    /// The rank (`ours`) and rank 0 (`theirs`) run the exchange with `hello`: each side's result.
    fn exchange(
        ours: &JobToken,
        theirs: &JobToken,
        hello: &str,
    ) -> (Result<(), Refused>, Result<String, String>) {
        let (mut rank, mut rank0) = pair();
        let theirs = theirs.clone();
        let server = std::thread::spawn(move || admit(&mut rank0, &theirs, soon()));
        let proved = prove(&mut rank, ours, hello, soon());
        drop(rank);
        (proved, server.join().expect("rank 0's thread"))
    }

    #[test]
    fn the_same_token_admits_the_hello_and_each_side_proves_itself() {
        let (proved, admitted) = exchange(&token("job-a"), &token("job-a"), "HELLO 3");
        assert_eq!((proved, admitted), (Ok(()), Ok("HELLO 3".into())));
        let none = JobToken::none();
        let (proved, admitted) = exchange(&none, &none, "JOIN");
        assert_eq!((proved, admitted), (Ok(()), Ok("JOIN".into())));
    }

    /// Another job's rank finds rank 0 an impostor and says nothing more; rank 0 names it a rank of
    /// another job. No token against a token is the same.
    #[test]
    fn another_token_fails_on_both_sides() {
        for (ours, theirs) in [
            (token("job-a"), token("job-b")),
            (JobToken::none(), token("job-b")),
            (token("job-a"), JobToken::none()),
        ] {
            let (proved, admitted) = exchange(&ours, &theirs, "HELLO 1");
            let Err(Refused::Failed(why)) = proved else {
                panic!("{proved:?}")
            };
            assert!(
                why.contains("did not prove it knows this job's token"),
                "{why}"
            );
            assert_eq!(
                admitted,
                Err("it closed after rank 0's proof: a rank of another job (its token differs), or a prober".into())
            );
        }
    }

    /// A squatter on rank 0's port (it listens first) sees one line from a rank: a challenge of a
    /// random nonce; nothing of the token, and whatever it answers (an id of its own, a forged proof)
    /// the rank refuses.
    #[test]
    fn a_squatter_learns_nothing_and_cannot_hand_out_an_id() {
        let secret = "squatter-must-not-see-this";
        for answer in [
            "ID 0000\n".to_string(),
            format!("{MAGIC} {} {}\n", "cd".repeat(NONCE), "00".repeat(32)),
        ] {
            let squat = TcpListener::bind("127.0.0.1:0").expect("bind");
            let addr = squat.local_addr().expect("addr");
            let squatter = std::thread::spawn(move || {
                let (conn, _) = squat.accept().expect("accept");
                let mut reader = BufReader::new(conn.try_clone().expect("clone"));
                let mut first = String::new();
                reader.read_line(&mut first).expect("the challenge");
                (&conn).write_all(answer.as_bytes()).expect("answer");
                let mut rest = Vec::new();
                let _ = reader.read_to_end(&mut rest);
                (first, rest)
            });
            let mut rank = Lines::new(TcpStream::connect(addr).expect("connect"));
            let proved = prove(&mut rank, &token(secret), "HELLO 1", soon());
            drop(rank);
            assert!(matches!(&proved, Err(Refused::Failed(why)) if why.contains("did not prove")));
            let (first, rest) = squatter.join().expect("squatter");
            let nonce = first.trim_end().strip_prefix("MGS3 ").expect("a challenge");
            assert!(parse_nonce(nonce).is_some(), "{first:?}");
            assert!(rest.is_empty(), "the rank sent more: {rest:?}");
            let seen = format!("{first}{}", String::from_utf8_lossy(&rest));
            assert!(!seen.contains(secret) && !seen.contains(&hex::encode(secret.as_bytes())));
        }
    }

    /// A proof is bound to its hello and to both nonces: one made for another hello, or replayed on a
    /// new connection (rank 0's nonce is fresh), is refused; so is a forged one.
    #[test]
    fn a_proof_cannot_be_moved_or_replayed_or_forged() {
        let t = token("job-a");
        let (r, s) = ([1u8; NONCE], [2u8; NONCE]);
        let proof = sign(&t, &[RANK, &s, &r, b"HELLO 1"]).expect("a proof");
        assert!(verify(&t, &[RANK, &s, &r, b"HELLO 1"], &proof));
        assert!(!verify(&t, &[RANK, &s, &r, b"HELLO 2"], &proof), "moved");
        assert!(
            !verify(&t, &[RANK, &[3; NONCE], &r, b"HELLO 1"], &proof),
            "replayed"
        );
        assert!(
            !verify(&t, &[RANK0, &s, &r, b"HELLO 1"], &proof),
            "the other side's"
        );
        assert!(!verify(
            &token("job-b"),
            &[RANK, &s, &r, b"HELLO 1"],
            &proof
        ));
        assert!(!verify(&t, &[RANK, &s, &r, b"HELLO 1"], "zz"), "not hex");

        let (mut rank, mut rank0) = pair();
        let server = std::thread::spawn(move || admit(&mut rank0, &t, soon()));
        rank.stream()
            .write_all(forged("HELLO 1").as_bytes())
            .expect("write");
        let answer = rank.next(HELLO_CAP, Some(soon())).expect("rank 0's proof");
        assert!(answer.is_some_and(|a| a.starts_with("MGS3 ")));
        let refused = server.join().expect("rank 0's thread");
        assert_eq!(
            refused,
            Err("a wrong proof of the job token (another job's rank, or a forgery)".into())
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        /// Whatever a peer sends instead of a proof is refused, never a panic.
        #[test]
        fn any_proof_text_is_an_answer(proof in ".{0,80}", hello in "[^\n]{0,40}") {
            let t = JobToken::none();
            proptest::prop_assert!(!verify(&t, &[RANK, &[0; NONCE], &[0; NONCE], hello.as_bytes()], &proof)
                || Ok(proof) == sign(&t, &[RANK, &[0; NONCE], &[0; NONCE], hello.as_bytes()]));
        }
    }
}
