//! Where a stuck process is: every thread's stack, from a debugger on `PATH` (`gdb`, else `cuda-gdb`:
//! the GPU host has only the latter), attached for one batch command. [`crate::ranks::Job`] takes them
//! from each rank still running when it gives up on it, before killing it, so that a hang names the
//! frames it hung in rather than only the time it took.

use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::child;

/// The debuggers looked for on `PATH`, in this order.
pub const DEBUGGERS: [&str; 2] = ["gdb", "cuda-gdb"];
/// How long the debuggers (attached to every stuck process at once) may take, then they are killed.
pub const LIMIT: Duration = Duration::from_secs(45);
/// The most frames shown of one thread (innermost first) and the most distinct stacks of one process.
const FRAMES: usize = 24;
const STACKS: usize = 40;
/// The most characters of one frame's function name.
const NAME: usize = 120;

/// The first of [`DEBUGGERS`] found in the directories of `path` (a `PATH` value).
pub fn debugger(path: Option<&OsStr>) -> Option<PathBuf> {
    let dirs: Vec<PathBuf> = path.map(|p| std::env::split_paths(p).collect())?;
    DEBUGGERS
        .iter()
        .find_map(|name| dirs.iter().map(|d| d.join(name)).find(|f| f.is_file()))
}

/// The debugger that shows the frames of this process's children here, or why there is none.
pub fn available() -> Result<PathBuf, String> {
    if let Some(runner) = child::runner() {
        return Err(format!(
            "the process runs under {runner:?}, whose own frames a debugger would show"
        ));
    }
    debugger(std::env::var_os("PATH").as_deref()).ok_or_else(|| {
        format!("none of {DEBUGGERS:?} is on PATH (install gdb to see where it is stuck)")
    })
}

/// Every thread's stack of each process in `pids` (one text per pid, in order), the debuggers running
/// side by side within [`LIMIT`]; where none can be had, one line that says why.
pub fn capture(pids: &[u32]) -> Vec<String> {
    let debugger = match available() {
        Ok(d) => d,
        Err(why) => return pids.iter().map(|_| format!("no stacks: {why}\n")).collect(),
    };
    let name = debugger
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let running: Vec<child::Child> = pids
        .iter()
        .map(|pid| {
            let mut cmd = Command::new(&debugger);
            cmd.args(["-p", &pid.to_string(), "-batch", "-nx"])
                .args(["-ex", "set width 0", "-ex", "thread apply all bt"])
                // Never wait on a download of debug symbols.
                .env("DEBUGINFOD_URLS", "");
            child::start(&format!("{name} -p {pid}"), cmd)
        })
        .collect();
    let done = child::wait_all(running, LIMIT);
    pids.iter()
        .zip(done)
        .map(|(pid, d)| {
            let stacks = summary(&d.output);
            let head = format!(
                "----- every thread's stack of pid {pid} ({name}, innermost frame first) -----\n"
            );
            if !stacks.is_empty() {
                return head + &stacks;
            }
            let said: Vec<&str> = d.output.lines().rev().take(5).collect();
            let ended = match d.status {
                Some(s) => format!("exited with {s}"),
                None => format!("was killed after {LIMIT:?}"),
            };
            format!(
                "{head}no stacks: {name} {ended} without one; its last lines:\n{}\n",
                said.into_iter().rev().collect::<Vec<_>>().join("\n")
            )
        })
        .collect()
}

/// gdb's `thread apply all bt` as one line per distinct stack: the threads that have it, then their
/// frames' function names, innermost first. Empty when it holds no frame.
pub fn summary(gdb: &str) -> String {
    // (threads with this stack, its frames), in the order gdb printed them.
    let mut stacks: Vec<(Vec<String>, Vec<String>)> = Vec::new();
    let mut thread: Option<(String, Vec<String>)> = None;
    let flush = |t: Option<(String, Vec<String>)>, stacks: &mut Vec<(Vec<String>, Vec<String>)>| {
        let Some((label, frames)) = t.filter(|(_, f)| !f.is_empty()) else {
            return;
        };
        match stacks.iter_mut().find(|(_, f)| *f == frames) {
            Some((labels, _)) => labels.push(label),
            None => stacks.push((vec![label], frames)),
        }
    };
    for line in gdb.lines() {
        if let Some(rest) = line.strip_prefix("Thread ") {
            flush(thread.take(), &mut stacks);
            thread = Some((thread_label(rest), Vec::new()));
        } else if let (Some((_, frames)), Some(rest)) = (thread.as_mut(), line.strip_prefix('#')) {
            frames.push(frame_name(rest));
        }
    }
    flush(thread, &mut stacks);
    let mut out = String::new();
    for (labels, frames) in stacks.iter().take(STACKS) {
        let shown: Vec<&str> = frames.iter().take(FRAMES).map(String::as_str).collect();
        let more = frames.len().saturating_sub(FRAMES);
        let more = if more > 0 {
            format!(" < ... {more} more")
        } else {
            String::new()
        };
        let threads = if labels.len() == 1 {
            "thread"
        } else {
            "threads"
        };
        out += &format!(
            "{threads} {}: {}{more}\n",
            labels.join(", "),
            shown.join(" < ")
        );
    }
    if stacks.len() > STACKS {
        out += &format!("... {} more distinct stacks\n", stacks.len() - STACKS);
    }
    out
}

/// `2 (Thread 0x7f.. (LWP 1235) "name"):` as `2 "name"`.
fn thread_label(header: &str) -> String {
    let number = header.split_whitespace().next().unwrap_or("?");
    let mut quoted = header.rsplitn(3, '"');
    match (quoted.next(), quoted.next(), quoted.next()) {
        (Some(_), Some(name), Some(_)) => format!("{number} \"{name}\""),
        _ => number.to_string(),
    }
}

/// `3  0x55.. in std::thread::sleep (dur=...) at library/std/src/thread/mod.rs:2021` (a frame line
/// without its `#`) as `std::thread::sleep`; an unknown function as `?? (libfoo.so)`.
fn frame_name(frame: &str) -> String {
    let rest = frame
        .trim_start_matches(|c: char| c.is_ascii_digit())
        .trim_start();
    let rest = match rest.split_once(" in ") {
        Some((addr, f)) if addr.starts_with("0x") => f,
        _ => rest,
    };
    let rest = without_generics(rest);
    let name = rest.split_once(" (").map_or(rest.as_str(), |(n, _)| n);
    let name: String = name.chars().take(NAME).collect();
    match rest.rsplit_once(" from ") {
        Some((_, lib)) if name == "??" => {
            let lib = lib.rsplit('/').next().unwrap_or(lib);
            format!("?? ({lib})")
        }
        _ => name,
    }
}

/// `core::ops::function::FnOnce::call_once<fn() -> T, ()>` as `core::ops::function::FnOnce::call_once`:
/// Rust's and C++'s generic arguments go (they are long, and hold ` (` that would end the name), a
/// leading `<T as Trait>` stays.
fn without_generics(frame: &str) -> String {
    let (mut out, mut depth, mut prev) = (String::new(), 0usize, ' ');
    for c in frame.chars() {
        let after_name = prev.is_alphanumeric() || prev == '_' || prev == '}';
        match c {
            '<' if depth > 0 || after_name => depth += 1,
            // `->` in a `fn() -> T` argument closes nothing.
            '>' if depth > 0 && prev != '-' => depth -= 1,
            _ if depth > 0 => {}
            _ => out.push(c),
        }
        prev = c;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const GDB: &str = r#"[New LWP 1236]
[Thread debugging using libthread_db enabled]
0x00007f5c in clock_nanosleep () from /lib/x86_64-linux-gnu/libc.so.6

Thread 3 (Thread 0x7f5a (LWP 1237) "cuda-EvtHandlr"):
#0  0x00007f5c in poll () from /lib/x86_64-linux-gnu/libc.so.6
#1  0x00007f4b in ?? () from /lib/x86_64-linux-gnu/libcuda.so.1

Thread 2 (Thread 0x7f5b (LWP 1236) "cuda00001c00008"):
#0  0x00007f5c in poll () from /lib/x86_64-linux-gnu/libc.so.6
#1  0x00007f4b in ?? () from /lib/x86_64-linux-gnu/libcuda.so.1

Thread 1 (Thread 0x7f5d (LWP 1235) "gpu-1a2b"):
#0  0x00007f5c in clock_nanosleep () from /lib/x86_64-linux-gnu/libc.so.6
#1  0x00007f5c in nanosleep () from /lib/x86_64-linux-gnu/libc.so.6
#2  std::sys::pal::unix::thread::Thread::sleep (dur=...) at library/std/src/sys/pal/unix/thread.rs:297
#3  0x000055 in std::thread::sleep (dur=...) at library/std/src/thread/mod.rs:2021
#4  0x000055 in core::ops::function::FnOnce::call_once<fn() -> core::result::Result<(), alloc::string::String>, ()> () at function.rs:250
#5  <alloc::boxed::Box<F> as core::ops::function::FnOnce<A>>::call_once (self=...) at boxed.rs:1
#6  0x000055 in ncclProxyService(void*) () from /opt/nccl/lib/libnccl.so.2
[Inferior 1 (process 1235) detached]
"#;

    #[test]
    fn a_summary_is_one_line_per_distinct_stack_of_function_names() {
        let got = summary(GDB);
        assert_eq!(
            got,
            "threads 3 \"cuda-EvtHandlr\", 2 \"cuda00001c00008\": poll < ?? (libcuda.so.1)\n\
             thread 1 \"gpu-1a2b\": clock_nanosleep < nanosleep < std::sys::pal::unix::thread::Thread::sleep \
             < std::thread::sleep < core::ops::function::FnOnce::call_once \
             < <alloc::boxed::Box as core::ops::function::FnOnce>::call_once < ncclProxyService(void*)\n"
        );
    }

    #[test]
    fn a_summary_of_no_frames_is_empty_and_a_deep_stack_is_cut() {
        assert_eq!(summary("ptrace: Operation not permitted.\n"), "");
        let deep: String = std::iter::once("Thread 1 (Thread 0x1 (LWP 2) \"x\"):\n".to_string())
            .chain((0..100).map(|i| format!("#{i}  0x1 in f{i} ()\n")))
            .collect();
        let got = summary(&deep);
        assert!(got.starts_with("thread 1 \"x\": f0 < f1 < "), "{got}");
        assert!(
            got.ends_with(&format!("f{} < ... {} more\n", FRAMES - 1, 100 - FRAMES)),
            "{got}"
        );
    }

    #[test]
    fn the_debugger_is_the_first_found_on_path() {
        assert_eq!(debugger(None), None);
        assert_eq!(debugger(Some(OsStr::new(""))), None);
        let dir = std::env::temp_dir().join(format!("metrale-stacks-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        std::fs::write(dir.join("cuda-gdb"), "").expect("a file");
        let found = debugger(Some(dir.as_os_str()));
        std::fs::write(dir.join("gdb"), "").expect("a file");
        let preferred = debugger(Some(dir.as_os_str()));
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(found, Some(dir.join("cuda-gdb")));
        assert_eq!(preferred, Some(dir.join("gdb")));
    }
}
