//! The choice of the process's one libnccl: a libnccl already in the global scope if there is one,
//! else the first acceptable library of the search (a library older than the headers is passed over
//! unless older ones are allowed), each step written to the search report.

use std::fmt::Write as _;
use std::path::Path;

use super::open::{open, Opened};
use super::scope::global_nccl;
use super::search::places;
use super::settings::{Settings, ALLOW_OLDER_VAR, LIBRARY_VAR};
use super::{Library, Source};
use crate::build_info::NCCL_LIB_DIR;
use crate::ffi::NCCL_MAJOR;
use crate::nccl_version::NcclVersion;

/// The global scope, as the report names it.
const GLOBAL: &str =
    "the process's global scope (LD_PRELOAD, or a library linked into the program)";

/// The library for `settings`, or the report of why none could be used.
pub(super) fn load(settings: &Settings) -> Result<Library, String> {
    let file = format!("libnccl.so.{NCCL_MAJOR}");
    let mut report = String::new();
    match global_nccl() {
        None => step(&mut report, GLOBAL, "no libnccl"),
        Some(Err(why)) => {
            step(&mut report, GLOBAL, &format!("a libnccl, but {why}"));
            return Err(unavailable(&file, report));
        }
        Some(Ok((version, path))) => return global(settings, version, path, &file, report),
    }
    let mut older: Option<(NcclVersion, String)> = None;
    for place in places(settings, Path::new(NCCL_LIB_DIR), &file) {
        let opened = match place.target.and_then(|target| open(&target)) {
            Ok(opened) => opened,
            Err(why) => {
                step(&mut report, &place.what, &why);
                continue;
            }
        };
        let Opened {
            handle,
            version,
            path,
        } = opened;
        let (verdict, accepted) = verdict(settings, version, "passed over");
        step(
            &mut report,
            &place.what,
            &format!("loaded {path}, NCCL {version}{verdict}"),
        );
        if accepted {
            return Ok(Library {
                source: Source::Opened(handle),
                path,
                version,
                report,
            });
        }
        // Closed (dropped): nothing of it was called but its version.
        older.get_or_insert((version, path));
    }
    match older {
        // Only older ones: the first, refused, so that every call names the version skew.
        Some((version, path)) => Ok(Library {
            source: Source::Refused,
            path,
            version,
            report,
        }),
        None => Err(unavailable(&file, report)),
    }
}

/// The global scope's libnccl (`version`, at `path`): the one library, checked like any other, unless
/// [`LIBRARY_VAR`] names another file (then none: two copies of NCCL in one process do not mix).
fn global(
    settings: &Settings,
    version: NcclVersion,
    path: String,
    file: &str,
    mut report: String,
) -> Result<Library, String> {
    let (verdict, accepted) = verdict(settings, version, "refused");
    let outcome = format!(
        "{path}, NCCL {version}{verdict}; the process's one libnccl: nothing else is searched"
    );
    step(&mut report, GLOBAL, &outcome);
    if let Some(named) = &settings.library {
        if !same_file(Path::new(named), Path::new(&path), file) {
            let what = format!("{LIBRARY_VAR}={}", named.to_string_lossy());
            let outcome = format!(
                "not loaded: the process already holds {path}, and two copies of NCCL in one process do not mix"
            );
            step(&mut report, &what, &outcome);
            return Err(format!(
                "{LIBRARY_VAR} names {}, but the process already holds the libnccl {path} (NCCL {version}) in \
                 its global scope; searched, in order:\n{report}Remove one of the two: unset {LIBRARY_VAR}, or \
                 take {path} out of LD_PRELOAD (or out of the program's links)",
                named.to_string_lossy()
            ));
        }
    }
    Ok(Library {
        source: match accepted {
            true => Source::Global,
            false => Source::Refused,
        },
        path,
        version,
        report,
    })
}

/// The report's words for a library of `version`, and whether it is accepted: a library older than the
/// headers is accepted only where [`ALLOW_OLDER_VAR`] allows it; otherwise it is `otherwise`.
fn verdict(settings: &Settings, version: NcclVersion, otherwise: &str) -> (String, bool) {
    let headers = NcclVersion::HEADERS;
    match (version < headers, settings.allow_older) {
        (false, _) => (String::new(), true),
        (true, true) => (
            format!(", older than the {headers} headers: accepted ({ALLOW_OLDER_VAR}=1)"),
            true,
        ),
        (true, false) => (
            format!(
                ", older than the {headers} headers: {otherwise} ({ALLOW_OLDER_VAR}=1 accepts it)"
            ),
            false,
        ),
    }
}

/// True where `named` (a file, or a folder holding `file`) is the file at `path`.
fn same_file(named: &Path, path: &Path, file: &str) -> bool {
    let named = match named.is_dir() {
        true => named.join(file),
        false => named.to_path_buf(),
    };
    match (named.canonicalize(), path.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// Adds the next numbered line to the report: a place, and what it gave.
fn step(report: &mut String, what: &str, outcome: &str) {
    let n = report.lines().count() + 1;
    let _ = writeln!(report, "{n}. {what}: {outcome}");
}

/// The error text when no library could be used.
fn unavailable(file: &str, report: String) -> String {
    format!(
        "no {file} could be loaded; searched, in order:\n{report}Set {LIBRARY_VAR}=<the absolute path of a \
         {file}, or of its folder>, or install NCCL where one of these looks (LD_LIBRARY_PATH, or pip's \
         nvidia-nccl wheel in the active environment)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_secure_execution_mode_the_choice_reads_no_variable_and_skips_the_build_folder() {
        let secure = Settings::read(true, &|name| panic!("{name} was read"));
        let report = match load(&secure) {
            Ok(library) => library.report,
            Err(report) => report,
        };
        let build_folder = format!(
            "the folder found at build time ({NCCL_LIB_DIR}): not searched in secure-execution mode"
        );
        assert!(report.contains(&build_folder), "{report}");
        assert!(
            report.contains(&format!("{LIBRARY_VAR}: not read (secure-execution mode)")),
            "{report}"
        );
        assert!(
            !report.contains(&format!("loaded {NCCL_LIB_DIR}")),
            "{report}"
        );
    }
}
