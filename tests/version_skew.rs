//! The run-time version check against libraries other than the build's: this test binary re-runs itself
//! with another libnccl that `ci/setup <version>` installed under .deps/ (.deps/<target>/ for another
//! architecture), named by the loader's variable `METRALE_NCCL_LIBRARY` (and on LD_LIBRARY_PATH, which
//! overrides the RUNPATH of the linked build, feature `link`), and reads the verdict the child prints.

use std::path::{Path, PathBuf};

use metrale_gpu_sys::version::{self, NcclVersion};
use metrale_gpu_testkit::child::this_binary;
use metrale_gpu_testkit::deps;
use metrale_gpu_testkit::skip::skip;

/// What ci/setup installed in this checkout for this binary's architecture.
fn installed() -> Vec<(NcclVersion, PathBuf)> {
    deps::installed_nccl(Path::new(env!("CARGO_MANIFEST_DIR")))
}

const CHILD: &str = "METRALE_VERSION_SKEW_CHILD";

/// Not a test on its own: the child side, run by the tests below.
#[test]
#[ignore = "run in a child process by the version-skew tests"]
fn child_prints_the_verdict() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let loaded = version::library_version()
        .map(|v| v.to_string())
        .unwrap_or_else(|e| e.to_string());
    match version::check_library_version() {
        Ok(v) => println!("VERDICT ok {v}"),
        Err(e) => println!("VERDICT err {loaded}: {e}"),
    }
}

fn verdict_with(lib: &PathBuf) -> String {
    let out = this_binary()
        .args([
            "--ignored",
            "--exact",
            "child_prints_the_verdict",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .env("LD_LIBRARY_PATH", lib)
        .env("METRALE_NCCL_LIBRARY", lib)
        .output()
        .expect("run the child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    // The harness prints its own "test … " prefix on the same line.
    let line = stdout
        .lines()
        .find_map(|l| l.find("VERDICT ").map(|i| &l[i..]))
        .unwrap_or_else(|| {
            panic!(
                "the child printed no verdict:\n{stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    line.to_string()
}

#[test]
fn an_older_library_is_refused_naming_both_versions() {
    let headers = NcclVersion::HEADERS;
    let Some((older, lib)) = installed().into_iter().rev().find(|(v, _)| *v < headers) else {
        // NCCL publishes nothing older than 2.27.7 for CUDA 13: the oldest headers have nothing to refuse.
        return skip(format_args!(
            "no libnccl older than the {headers} headers under .deps/ to refuse: install one with \
             `ci/setup 2.28.9` (or 2.27.7)"
        ));
    };
    let verdict = verdict_with(&lib);
    assert!(
        verdict.starts_with(&format!("VERDICT err {older}: NCCL version skew")),
        "{verdict}"
    );
    assert!(
        verdict.contains(&format!("the loaded libnccl is {older}")),
        "{verdict}"
    );
    assert!(
        verdict.contains(&format!("older than the nccl.h {headers}")),
        "{verdict}"
    );
    assert!(
        verdict.contains(&lib.display().to_string()),
        "the message names the loaded file: {verdict}"
    );
}

#[test]
fn the_same_or_a_newer_library_is_accepted() {
    let headers = NcclVersion::HEADERS;
    let candidates: Vec<_> = installed()
        .into_iter()
        .filter(|(v, _)| *v >= headers)
        .collect();
    assert!(
        !candidates.is_empty(),
        "ci/setup's libnccl {headers} is missing under .deps/: run ci/setup"
    );
    for (v, lib) in candidates {
        assert_eq!(verdict_with(&lib), format!("VERDICT ok {v}"));
    }
}
