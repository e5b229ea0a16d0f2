//! Where a job's keys live: under `/metrale/jobs/<digest>/`, the digest an HMAC-SHA256 keyed by the job
//! token. Two jobs with different tokens never share a key, and the token itself is never written: the
//! digest does not give it back. As with any digest, a reader of etcd can test a guessed token against
//! it, so the token must be a secret that is hard to guess, as the rendezvous requires too.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// What the digest is of: the token keys an HMAC over this label, so that the digest is of use for
/// nothing but this prefix (the same token's HMAC over other data, in the rendezvous, says nothing of it).
const LABEL: &[u8] = b"metrale-gpu-elastic-etcd: the job's key prefix";

/// The root of every job's keys.
pub const ROOT: &str = "/metrale/jobs/";

/// A job's key prefix, `/metrale/jobs/<64 hex digits>/`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobPrefix(String);

impl JobPrefix {
    /// The prefix of the job whose token is `token` (its bytes: the same bytes on every rank).
    pub fn of_token(token: &[u8]) -> JobPrefix {
        // HMAC takes a key of any length (a long one is hashed first): this cannot fail.
        let mut mac =
            <Hmac<Sha256> as Mac>::new_from_slice(token).unwrap_or_else(|_| unreachable!());
        mac.update(LABEL);
        let digest = mac.finalize().into_bytes();
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        JobPrefix(format!("{ROOT}{hex}/"))
    }

    /// The prefix, ending with `/`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The full key of `rest` (relative to the prefix).
    pub(crate) fn key(&self, rest: &str) -> String {
        format!("{}{rest}", self.0)
    }

    /// `key` relative to the prefix, if it is under it.
    pub(crate) fn relative<'k>(&self, key: &'k [u8]) -> Option<&'k [u8]> {
        key.strip_prefix(self.0.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefix_is_the_tokens_hmac_in_hex_under_the_root() {
        let p = JobPrefix::of_token(b"token-a");
        let hex = p
            .as_str()
            .strip_prefix(ROOT)
            .and_then(|s| s.strip_suffix('/'))
            .unwrap();
        assert_eq!(hex.len(), 64);
        assert!(hex
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        // The same token, the same prefix, on every rank.
        assert_eq!(p, JobPrefix::of_token(b"token-a"));
    }

    #[test]
    fn two_tokens_have_two_prefixes_neither_under_the_other() {
        let (a, b) = (
            JobPrefix::of_token(b"token-a"),
            JobPrefix::of_token(b"token-b"),
        );
        assert_ne!(a, b);
        assert!(!a.as_str().starts_with(b.as_str()) && !b.as_str().starts_with(a.as_str()));
    }

    #[test]
    fn the_token_is_not_in_the_prefix() {
        let token = "0123456789abcdef0123456789abcdef";
        assert!(!JobPrefix::of_token(token.as_bytes())
            .as_str()
            .contains(token));
    }

    #[test]
    fn the_prefix_is_stable_across_builds() {
        // Ranks of different builds must agree: HMAC-SHA256 keyed by b"token-a" over the label, as
        // Python's hmac module computes it.
        assert_eq!(
            JobPrefix::of_token(b"token-a").as_str(),
            "/metrale/jobs/341b8e18f2eafb70334a1081bd9a5004dc26a59a553b5b402dd8d647bd83625b/"
        );
    }

    #[test]
    fn a_key_is_relative_to_its_own_prefix_only() {
        let (a, b) = (JobPrefix::of_token(b"a"), JobPrefix::of_token(b"b"));
        let key = a.key("members/r1");
        assert_eq!(a.relative(key.as_bytes()), Some(&b"members/r1"[..]));
        assert_eq!(b.relative(key.as_bytes()), None);
    }
}
