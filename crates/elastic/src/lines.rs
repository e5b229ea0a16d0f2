//! Reading a rank's `ELASTIC` lines ([`crate::Training::event`]), for whatever steers or watches a job
//! by them: the CPU tests' fake driver, the GPU test's.

/// The number after `key=` in an `ELASTIC` line.
pub fn number(line: &str, key: &str) -> Option<usize> {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
}

/// Whether `line` says its process made generation `gen`. Every member of a generation says so before
/// the checks that rank 0's `phase=waiting` follows; a replacement whose grow was lost says only that it
/// lost it (`phase=detect`), and is pending still.
pub fn made(line: &str, gen: usize) -> bool {
    line.starts_with("ELASTIC phase=made") && number(line, "gen") == Some(gen)
}
