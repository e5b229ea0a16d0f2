//! The process's peak resident memory, for the tests that show a flood costs no memory: Linux's
//! `VmHWM`, reset through `/proc/self/clear_refs` (writing 5 resets it to the current RSS).

/// The stated bound of the flood tests: how much the peak RSS may grow while strays come and go, one of
/// them an 8 MiB line without a newline (holding it would take 8 MiB and more).
const FLOOD_BOUND_KIB: u64 = 6 << 10;

/// Asserts that the peak RSS grows by less than `FLOOD_BOUND_KIB` (6 MiB) while `pass(true)` runs with the
/// flood. `pass(false)`, the same without it, runs first: it warms up what a first run costs once
/// (threads' stacks and allocator arenas, and under an emulator such as qemu-user its translated
/// code), so that the figure is what the flood costs; an allocator keeping the warm-up's memory cannot
/// hide it, as the warm-up never held the flood.
///
/// Under a cargo runner (qemu-user when cross-testing) the figure is the emulator's own memory, which
/// grows with the code it translates and the threads it starts (12.5 MiB for the elastic flood in the
/// aarch64 row): the flood still runs, and the bound is a visible partial skip,
/// `SKIP <test> (peak RSS): why`.
pub fn assert_within_flood_bound(pass: impl Fn(bool)) {
    if let Some(runner) = crate::child::runner() {
        pass(true);
        crate::skip::skip_check(
            "peak RSS",
            format!(
                "this binary runs under `{runner}`, whose own memory the peak RSS would measure"
            ),
        );
        return;
    }
    pass(false);
    let grew = reset().and_then(|()| {
        let before = kib()?;
        pass(true);
        Ok(kib()?.saturating_sub(before))
    });
    let grew = grew.expect("the peak RSS");
    assert!(
        grew < FLOOD_BOUND_KIB,
        "the peak RSS grew by {grew} KiB, over {FLOOD_BOUND_KIB} KiB"
    );
}

/// Resets the peak to the current resident size.
fn reset() -> Result<(), String> {
    std::fs::write("/proc/self/clear_refs", "5")
        .map_err(|e| format!("resetting the peak RSS (/proc/self/clear_refs): {e}"))
}

/// The peak resident size since the last [`reset`], in KiB.
fn kib() -> Result<u64, String> {
    let status = std::fs::read_to_string("/proc/self/status")
        .map_err(|e| format!("reading /proc/self/status: {e}"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or("/proc/self/status has no VmHWM line".to_string())
}
