//! What this process runs: its threads' names and CPU time, for the tests that check that an aborted
//! communicator leaves nothing running.

/// Names of this process's threads.
pub fn threads() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
        .map(|n| n.trim().to_string())
        .collect();
    names.sort();
    names
}

/// The threads a communicator starts (proxy, service, progress, sockets): none may outlive its abort.
/// NCCL's bootstrap root thread of `ncclGetUniqueId` and its process-wide RAS thread are not among them.
pub fn comm_threads(names: &[String]) -> Vec<String> {
    names
        .iter()
        .filter(|n| {
            n.starts_with("NCCL Service")
                || n.starts_with("NCCL Progress")
                || n.starts_with("NCCL Sock")
        })
        .cloned()
        .collect()
}

/// CPU seconds used so far by this process's threads, split into NCCL's bootstrap root thread ("NCCL
/// BootstrapR", started by ncclGetUniqueId; it waits for the ranks of the id and belongs to no
/// communicator, so no API stops it) and all the others (`utime + stime`, /proc/self/task/*/stat).
pub fn cpu_seconds() -> (f64, f64) {
    // SAFETY: sysconf has no preconditions.
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let (mut root, mut others) = (0.0, 0.0);
    for task in std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .flatten()
    {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue; // the thread ended meanwhile
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let name = &stat[open + 1..close];
        let fields: Vec<&str> = stat[close + 2..].split_whitespace().collect();
        // Fields 14 and 15 of proc(5); after the name, numbering starts at field 3.
        let ticks: f64 = [11, 12]
            .iter()
            .filter_map(|&k| fields.get(k).and_then(|v| v.parse::<f64>().ok()))
            .sum();
        if name.starts_with("NCCL BootstrapR") {
            root += ticks / tick;
        } else {
            others += ticks / tick;
        }
    }
    (root, others)
}
