//! Where libnccl is looked for at run time, in order (docs/loading.md): the places, not the loading, so
//! that the order is one list a test can read. The operator's choices come first and the folder baked in
//! at build time last: a binary shipped elsewhere finds there a folder that may not exist, or that
//! someone else created.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::settings::{Settings, LIBRARY_VAR};

/// The system's dynamic loader, as the report names it.
pub(super) const SYSTEM: &str =
    "the system's dynamic loader (LD_LIBRARY_PATH, the executable's RUNPATH, the ld cache)";

/// One place of the search: what it is (for the report) and what to hand the dynamic loader, or why
/// there is nothing to hand it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Place {
    /// The place, as the report names it.
    pub(super) what: String,
    /// What the dynamic loader is given (an absolute path, or the bare file name for its own search), or
    /// why the place offers nothing.
    pub(super) target: Result<OsString, String>,
}

/// The places, in order: [`LIBRARY_VAR`], the system's dynamic loader, the active Python environments,
/// then `build_dir` (the folder the build found the library in). `file` is the library's name
/// (`libnccl.so.2`: the headers' major version is its ABI). Where [`LIBRARY_VAR`] is set it is the only
/// place: whoever set it meant that library, and another one found instead would hide their mistake.
/// In secure-execution mode only the system's dynamic loader is searched.
pub(super) fn places(settings: &Settings, build_dir: &Path, file: &str) -> Vec<Place> {
    if let Some(named) = &settings.library {
        return vec![named_place(named, file)];
    }
    let unread = |what: &str| Place {
        what: what.to_string(),
        target: Err(match settings.secure {
            true => "not read (secure-execution mode)".into(),
            false => "not set".into(),
        }),
    };
    let mut places = vec![unread(LIBRARY_VAR)];
    places.push(Place {
        what: SYSTEM.into(),
        target: Ok(OsString::from(file)),
    });
    for (env, prefix) in &settings.python {
        match prefix {
            None => places.push(unread(env)),
            Some(prefix) => places.extend(python_places(env, Path::new(prefix), file)),
        }
    }
    let what = format!("the folder found at build time ({})", build_dir.display());
    let built = build_dir.join(file);
    places.push(Place {
        what,
        target: match (settings.secure, built.is_file()) {
            (true, _) => Err("not searched in secure-execution mode".into()),
            (false, true) => Ok(built.into_os_string()),
            (false, false) => Err(format!("no {file} there any more")),
        },
    });
    places
}

/// The place [`LIBRARY_VAR`] names: a file, or a folder holding `file`; refused unless absolute (a
/// relative path would be found from whatever folder the program runs in).
fn named_place(named: &OsString, file: &str) -> Place {
    let what = format!("{LIBRARY_VAR}={}", named.to_string_lossy());
    let path = PathBuf::from(named);
    if !path.is_absolute() {
        return Place {
            what,
            target: Err(format!(
                "a relative path, refused: it would be found from the working folder; give an absolute path \
                 ({LIBRARY_VAR}=/path/to/{file}, or its folder)"
            )),
        };
    }
    let path = if path.is_dir() { path.join(file) } else { path };
    Place {
        what,
        target: Ok(path.into_os_string()),
    }
}

/// The library in a Python environment's `lib/python3.*/site-packages/nvidia/nccl/lib/` (pip's
/// nvidia-nccl wheels), one place for each Python that has it, in name order; one place saying so
/// where none has.
fn python_places(env: &str, prefix: &Path, file: &str) -> Vec<Place> {
    let what = format!("{env}={}", prefix.display());
    if !prefix.is_absolute() {
        return vec![Place {
            what,
            target: Err("a relative path, passed over".into()),
        }];
    }
    let found = python_nccl(prefix, file);
    if found.is_empty() {
        return vec![Place {
            what,
            target: Err(format!(
                "no lib/python3*/site-packages/nvidia/nccl/lib/{file} there"
            )),
        }];
    }
    found
        .into_iter()
        .map(|path| Place {
            what: what.clone(),
            target: Ok(path.into_os_string()),
        })
        .collect()
}

/// `<prefix>/lib/python3.*/site-packages/nvidia/nccl/lib/<file>`, for each Python of the environment, in
/// name order.
fn python_nccl(prefix: &Path, file: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(prefix.join("lib")) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
        .map(|e| e.path().join("site-packages/nvidia/nccl/lib").join(file))
        .filter(|p| p.is_file())
        .collect();
    found.sort();
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(vars: &[(&str, &Path)]) -> Settings {
        Settings::read(false, &|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.as_os_str().to_owned())
        })
    }

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("metrale-search-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("mkdir");
        dir
    }

    const FILE: &str = "libnccl.so.2";

    #[test]
    fn the_explicit_variable_is_the_only_place_and_a_folder_means_the_file_in_it() {
        let dir = scratch("explicit");
        let places = places(
            &settings(&[(LIBRARY_VAR, &dir)]),
            Path::new("/nowhere"),
            FILE,
        );
        assert_eq!(places.len(), 1, "{places:?}");
        assert_eq!(places[0].target, Ok(dir.join(FILE).into_os_string()));
        let file = Path::new("/opt/x/libnccl.so.2.29.7");
        let places = super::places(
            &settings(&[(LIBRARY_VAR, file)]),
            Path::new("/nowhere"),
            FILE,
        );
        assert_eq!(places[0].target, Ok(file.as_os_str().to_owned()));
    }

    #[test]
    fn a_relative_explicit_path_is_refused_and_nothing_else_is_searched() {
        for relative in ["lib", "./libnccl.so.2", "../x/libnccl.so.2"] {
            let places = places(
                &settings(&[(LIBRARY_VAR, Path::new(relative))]),
                Path::new("/nowhere"),
                FILE,
            );
            assert_eq!(places.len(), 1, "{places:?}");
            let why = places[0].target.as_ref().expect_err("refused");
            assert!(why.starts_with("a relative path, refused"), "{why}");
            assert!(why.contains("give an absolute path"), "{why}");
        }
    }

    #[test]
    fn the_order_is_variable_system_python_environments_then_the_build_folder() {
        let build = scratch("build");
        std::fs::write(build.join(FILE), "").expect("write");
        let venv = scratch("venv");
        let lib = venv.join("lib/python3.12/site-packages/nvidia/nccl/lib");
        std::fs::create_dir_all(&lib).expect("mkdir");
        std::fs::write(lib.join(FILE), "").expect("write");
        let places = places(&settings(&[("VIRTUAL_ENV", &venv)]), &build, FILE);
        let whats: Vec<&str> = places.iter().map(|p| p.what.as_str()).collect();
        assert_eq!(places.len(), 5, "{places:?}");
        assert!(
            whats[0] == LIBRARY_VAR && places[0].target.is_err(),
            "{places:?}"
        );
        assert_eq!(
            (whats[1], &places[1].target),
            (SYSTEM, &Ok(OsString::from(FILE)))
        );
        assert_eq!(places[2].target, Ok(lib.join(FILE).into_os_string()));
        assert_eq!(places[3].what, "CONDA_PREFIX");
        assert!(
            whats[4].starts_with("the folder found at build time"),
            "{whats:?}"
        );
        assert_eq!(places[4].target, Ok(build.join(FILE).into_os_string()));
    }

    #[test]
    fn in_secure_execution_mode_only_the_system_loader_is_searched() {
        let build = scratch("secure-build");
        std::fs::write(build.join(FILE), "").expect("write");
        let secure = Settings::read(true, &|name| panic!("{name} was read"));
        let places = places(&secure, &build, FILE);
        let offered: Vec<&Place> = places.iter().filter(|p| p.target.is_ok()).collect();
        assert_eq!(offered.len(), 1, "{places:?}");
        assert_eq!(offered[0].what, SYSTEM);
        let last = places.last().expect("the build folder is named");
        assert_eq!(
            last.target,
            Err("not searched in secure-execution mode".into())
        );
        assert_eq!(
            places[0].target,
            Err("not read (secure-execution mode)".into())
        );
    }

    #[test]
    fn a_build_folder_without_the_library_and_a_relative_environment_are_passed_over_saying_so() {
        let build = scratch("empty-build");
        let places = places(
            &settings(&[("CONDA_PREFIX", Path::new("env"))]),
            &build,
            FILE,
        );
        assert_eq!(
            places.last().map(|p| p.target.clone()),
            Some(Err(format!("no {FILE} there any more")))
        );
        assert_eq!(places[3].target, Err("a relative path, passed over".into()));
    }
}
