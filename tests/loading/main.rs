//! Which libnccl the process uses (run-time loading, the default), as a user changes it: `LD_PRELOAD`,
//! `LD_LIBRARY_PATH`, `METRALE_NCCL_LIBRARY`. Each case runs this binary again in a child with that
//! environment, and reads what the child reports: the library it calls, its version, the search, and
//! every libnccl mapped into it. The libraries are those `ci/setup <version>` installed under .deps/; a
//! case that needs one the checkout lacks says so (SKIP) and what to install.
#![cfg(not(feature = "link"))]

use std::path::{Path, PathBuf};

use metrale_gpu_sys::nccl::*;
use metrale_gpu_sys::version::{self, build_info, NcclVersion};
use metrale_gpu_testkit::child::{passed, test_command};
use metrale_gpu_testkit::deps;
use metrale_gpu_testkit::skip::skip;

/// Set in the child.
const CHILD: &str = "METRALE_LOADING_CHILD";
/// The child's test.
const REPORTER: &str = "child_reports_the_library";

/// Not a test on its own: the child side, which prints what the cases read.
#[test]
#[ignore = "run in a child process by the loading tests"]
fn child_reports_the_library() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let path = version::library_path().unwrap_or_else(|| "none".into());
    println!("LIBRARY {path}");
    match version::library_version() {
        Ok(v) => println!("VERSION {v}"),
        Err(e) => println!("VERSION none: {e}"),
    }
    match version::check_library_version() {
        Ok(v) => println!("CHECK ok {v}"),
        Err(e) => println!("CHECK err {e}"),
    }
    let err = check_nccl(NcclResult::ncclInternalError, "x").expect_err("a failure code");
    if let GpuError::Nccl { text, .. } = err {
        println!("ERRSTR {text}");
    }
    #[cfg(nccl_2_29)]
    {
        let mut grown: NcclComm = std::ptr::null_mut();
        // SAFETY: a NULL parent and NULL unique id, which NCCL checks and refuses before using anything.
        let res = unsafe {
            ncclCommGrow(
                std::ptr::null_mut(),
                2,
                std::ptr::null(),
                0,
                &mut grown,
                std::ptr::null_mut(),
            )
        };
        match check_nccl(res, "ncclCommGrow") {
            Ok(()) => println!("GROW ok"),
            Err(e) => println!("GROW {e}"),
        }
    }
    for line in version::library_search().lines() {
        println!("SEARCH {line}");
    }
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let mut mapped: Vec<&str> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|p| p.contains("libnccl"))
        .collect();
    mapped.dedup();
    for file in mapped {
        println!("MAPPED {file}");
    }
}

/// What the child reported.
struct Report(String);

impl Report {
    /// The value of the first line starting with `key`.
    fn value(&self, key: &str) -> &str {
        let prefix = format!("{key} ");
        self.0
            .lines()
            .find_map(|l| l.find(&prefix).map(|i| &l[i + prefix.len()..]))
            .unwrap_or_else(|| panic!("no {key} line in:\n{}", self.0))
    }
    /// Every value of the lines starting with `key`.
    fn values(&self, key: &str) -> Vec<&str> {
        let prefix = format!("{key} ");
        self.0
            .lines()
            .filter_map(|l| l.find(&prefix).map(|i| &l[i + prefix.len()..]))
            .collect()
    }
    /// The files the child mapped, as real paths.
    fn mapped(&self) -> Vec<PathBuf> {
        self.values("MAPPED").into_iter().map(real).collect()
    }
}

/// The child with `env` added (and `METRALE_NCCL_LIBRARY`, `LD_LIBRARY_PATH`, `LD_PRELOAD` and
/// `METRALE_NCCL_ALLOW_OLDER` cleared first, unless `env` sets them).
fn child(env: &[(&str, String)]) -> Report {
    let mut cmd = test_command(REPORTER, &[(CHILD, "1".into())]);
    for var in [
        "METRALE_NCCL_LIBRARY",
        "LD_LIBRARY_PATH",
        "LD_PRELOAD",
        "METRALE_NCCL_ALLOW_OLDER",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let report = Report(passed(REPORTER, cmd));
    println!("{env:?}:\n{}", report.0);
    report
}

/// `path` with its links resolved (as given where it cannot be).
fn real(path: impl AsRef<Path>) -> PathBuf {
    let path = path.as_ref();
    path.canonicalize().unwrap_or_else(|_| path.to_path_buf())
}

/// What ci/setup installed for this binary's architecture: the version and the folder of each libnccl.
fn installed() -> Vec<(NcclVersion, PathBuf)> {
    deps::installed_nccl(Path::new(env!("CARGO_MANIFEST_DIR")))
}

/// The newest installed libnccl older than the headers, or a visible skip.
fn older() -> Option<(NcclVersion, PathBuf)> {
    let headers = NcclVersion::HEADERS;
    let found = installed().into_iter().rev().find(|(v, _)| *v < headers);
    if found.is_none() {
        skip(format_args!(
            "no libnccl older than the {headers} headers under .deps/: install one with `ci/setup 2.28.9`"
        ));
    }
    found
}

/// The build folder's library, the one the search takes last.
fn built() -> PathBuf {
    Path::new(build_info::NCCL_LIB_DIR).join("libnccl.so.2")
}

/// An acceptable libnccl in a folder other than the build's: the newest installed one newer than the
/// headers, else the build's own library linked from a scratch folder (the same version under another
/// path).
fn elsewhere(scratch: &str) -> (NcclVersion, PathBuf) {
    let newer = installed()
        .into_iter()
        .rev()
        .find(|(v, dir)| *v > NcclVersion::HEADERS && real(dir) != real(build_info::NCCL_LIB_DIR));
    if let Some(found) = newer {
        return found;
    }
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(scratch);
    std::fs::create_dir_all(&dir).expect("a scratch folder");
    let link = dir.join("libnccl.so.2");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(built(), &link).expect("a link to the build's library");
    (NcclVersion::HEADERS, dir)
}

#[test]
fn a_preloaded_older_nccl_is_the_one_refused_as_skew_and_nothing_else_is_loaded() {
    let Some((older, dir)) = older() else { return };
    let lib = dir.join("libnccl.so.2");
    let preload = ("LD_PRELOAD", lib.display().to_string());
    let report = child(std::slice::from_ref(&preload));
    let check = report.value("CHECK");
    assert!(
        check.starts_with(&format!(
            "err NCCL version skew: the loaded libnccl is {older}"
        )),
        "{check}"
    );
    assert_eq!(real(report.value("LIBRARY")), real(&lib));
    let search = report.value("SEARCH");
    assert!(
        search.starts_with("1. the process's global scope (LD_PRELOAD")
            && search.contains("nothing else is searched"),
        "{search}"
    );
    assert_eq!(report.mapped(), [real(&lib)], "one libnccl in the process");

    // Allowed, it runs on the preloaded library alone: a call it lacks is missing, not taken elsewhere.
    let report = child(&[preload, ("METRALE_NCCL_ALLOW_OLDER", "1".into())]);
    assert_eq!(report.value("VERSION"), older.to_string());
    assert_eq!(report.mapped(), [real(&lib)], "one libnccl in the process");
    if cfg!(nccl_2_29)
        && older
            < (NcclVersion {
                major: 2,
                minor: 29,
                patch: 0,
            })
    {
        let grow = report.value("GROW");
        assert!(
            grow.contains(&format!("the loaded libnccl {older}"))
                && grow.contains("lacks ncclCommGrow"),
            "{grow}"
        );
    }
}

#[test]
fn a_preloaded_nccl_is_the_one_and_a_different_named_library_is_refused_naming_both() {
    let (version, dir) = elsewhere("preloaded");
    let lib = dir.join("libnccl.so.2");
    let preload = ("LD_PRELOAD", lib.display().to_string());
    let report = child(std::slice::from_ref(&preload));
    assert_eq!(report.value("CHECK"), format!("ok {version}"));
    assert_eq!(real(report.value("LIBRARY")), real(&lib));
    assert_eq!(report.mapped(), [real(&lib)], "one libnccl in the process");

    // Another file: any installed library that is not the preloaded one.
    let Some(named) = installed()
        .into_iter()
        .map(|(_, dir)| dir.join("libnccl.so.2"))
        .find(|other| real(other) != real(&lib))
    else {
        return skip("no second libnccl under .deps/ to name: run ci/setup");
    };
    let report = child(&[
        preload,
        ("METRALE_NCCL_LIBRARY", named.display().to_string()),
    ]);
    let version = report.value("VERSION");
    assert!(
        version.starts_with(&format!(
            "none: library_version needs libnccl, which is unavailable: METRALE_NCCL_LIBRARY names {}, but \
             the process already holds the libnccl {}",
            named.display(),
            lib.display()
        )),
        "{version}"
    );
    let search = report.values("SEARCH").join("\n");
    assert!(
        search.contains("two copies of NCCL in one process do not mix"),
        "{search}"
    );
    assert_eq!(report.mapped(), [real(&lib)], "nothing loaded beside it");
}

#[test]
fn a_stand_in_defining_one_call_interposes_it_over_the_checked_library() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("one-call");
    std::fs::create_dir_all(&dir).expect("a scratch folder");
    let stand_in = dir.join("libone_call.so");
    let built_ok = std::process::Command::new(env!("METRALE_TARGET_CC"))
        .args(["-shared", "-fPIC", "-Wall", "-Werror", "-o"])
        .arg(&stand_in)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/loading/one_call.c"
        ))
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        built_ok,
        "the target's C compiler could not build the stand-in"
    );
    let report = child(&[("LD_PRELOAD", stand_in.display().to_string())]);
    assert_eq!(report.value("ERRSTR"), "the stand-in's error string");
    // The rest from the library the search found and checked.
    assert_eq!(
        report.value("CHECK"),
        format!("ok {}", report.value("VERSION"))
    );
    let library = real(report.value("LIBRARY"));
    assert_ne!(library, real(&stand_in));
    assert_eq!(report.mapped(), [library], "one libnccl in the process");
}

#[test]
fn ld_library_path_comes_before_the_build_folder() {
    let (version, dir) = elsewhere("on-ld-library-path");
    let report = child(&[("LD_LIBRARY_PATH", dir.display().to_string())]);
    assert_eq!(report.value("CHECK"), format!("ok {version}"));
    let library = report.value("LIBRARY");
    assert!(library.starts_with(&dir.display().to_string()), "{library}");
    let search = report.values("SEARCH");
    assert!(
        search[2].starts_with("3. the system's dynamic loader") && search[2].contains("loaded "),
        "{search:?}"
    );
}

#[test]
fn an_older_library_on_ld_library_path_is_passed_over_and_named() {
    let Some((older, dir)) = older() else { return };
    let report = child(&[("LD_LIBRARY_PATH", dir.display().to_string())]);
    let check = report.value("CHECK");
    assert!(check.starts_with("ok "), "{check}");
    let search = report.values("SEARCH");
    let passed_over = format!(
        "loaded {}, NCCL {older}, older than the {} headers: passed over",
        dir.join("libnccl.so.2").display(),
        NcclVersion::HEADERS
    );
    assert!(
        search[2].starts_with("3. the system's dynamic loader")
            && search[2].ends_with(&format!(
                "{passed_over} (METRALE_NCCL_ALLOW_OLDER=1 accepts it)"
            )),
        "{search:?}"
    );
    assert_ne!(
        real(report.value("LIBRARY")),
        real(dir.join("libnccl.so.2"))
    );
}

#[test]
fn a_relative_library_variable_is_refused() {
    let report = child(&[("METRALE_NCCL_LIBRARY", "nvidia/nccl/lib".into())]);
    let version = report.value("VERSION");
    assert!(
        version.starts_with("none: library_version needs libnccl, which is unavailable"),
        "{version}"
    );
    let search = report.values("SEARCH");
    assert!(
        search[2].starts_with("2. METRALE_NCCL_LIBRARY=nvidia/nccl/lib: a relative path, refused")
            && search[2].contains("give an absolute path"),
        "{search:?}"
    );
    assert_eq!(search.len(), 4, "nothing else searched: {search:?}");
    assert!(report.mapped().is_empty(), "nothing was loaded");
}
