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
    say(&this_test(), "", why);
}

/// Prints `SKIP <test> (<check>): <why>`: the test skipped that one check and runs the rest, passing.
pub fn skip_check(check: &str, why: impl std::fmt::Display) {
    say(&this_test(), &format!(" ({check})"), why);
}

/// Prints `SKIP <test>: <why>` for a test that names itself (the GPU tests' `module::test`).
pub fn skip_named(test: &str, why: impl std::fmt::Display) {
    say(test, "", why);
}

/// The running test's name: its thread's, as libtest names it.
fn this_test() -> String {
    let thread = std::thread::current();
    thread.name().unwrap_or("unnamed-test").to_string()
}

fn say(test: &str, check: &str, why: impl std::fmt::Display) {
    // On a line of its own: the harness may have written `test … ... ` to stdout, the same terminal.
    let line = format!("\n{SKIP}{test}{check}: {why}\n");
    // One write of the whole line, so that lines of tests running in parallel do not interleave.
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}
