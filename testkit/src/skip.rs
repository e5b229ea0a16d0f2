//! Visible skips. A test that cannot hold where it runs (headers of another version, a driver present
//! where the test needs none, a library it cannot find) returns after one line, `SKIP <test>: <why>`,
//! which `cargo test` shows even for a passing test: it goes to the process's stderr directly, past the
//! harness's capture of `println!`/`eprintln!`. ci/test counts these lines in each row against what the
//! row expects, so that a test never passes silently without running.

use std::io::Write as _;

/// The marker that starts a skip line.
pub const SKIP: &str = "SKIP ";

/// Prints `SKIP <test>: <why>` (the test's name is its thread's, as libtest names it); the caller then
/// returns, passing.
pub fn skip(why: impl std::fmt::Display) {
    say(String::new(), why);
}

/// Prints `SKIP <test> (<check>): <why>`: the test skipped that one check and runs the rest, passing.
pub fn skip_check(check: &str, why: impl std::fmt::Display) {
    say(format!(" ({check})"), why);
}

fn say(check: String, why: impl std::fmt::Display) {
    let thread = std::thread::current();
    // On a line of its own: the harness may have written `test … ... ` to stdout, the same terminal.
    let line = format!(
        "\n{SKIP}{}{check}: {why}\n",
        thread.name().unwrap_or("unnamed-test")
    );
    // One write of the whole line, so that lines of tests running in parallel do not interleave.
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}
