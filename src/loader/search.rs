//! Where libnccl is looked for at run time, in order (the README's "How the library is found at run
//! time"): the places, not the loading, so that the order is one list a test can read.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The variable naming the library outright: a file, or a folder holding `libnccl.so.<major>`.
pub const LIBRARY_VAR: &str = "METRALE_NCCL_LIBRARY";
/// The active Python environments searched last, where PyTorch's wheels put `nvidia/nccl/lib`.
const PYTHON_ENVS: [&str; 2] = ["VIRTUAL_ENV", "CONDA_PREFIX"];

/// One place of the search: what it is (for the report) and what to hand the dynamic loader, or why
/// there is nothing to hand it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    /// The place, as the report names it.
    pub what: String,
    /// What the dynamic loader is given (a path, or the bare file name for its own search), or why
    /// the place offers nothing.
    pub target: Result<OsString, String>,
}

/// The places, in order. `var` reads the environment; `build_dir` is the folder the build found the
/// library in; `file` is the library's name (`libnccl.so.2`: the headers' major version is its ABI).
/// Where [`LIBRARY_VAR`] is set it is the only place: whoever set it meant that library, and another
/// one found instead would hide their mistake.
pub fn places(var: &dyn Fn(&str) -> Option<OsString>, build_dir: &Path, file: &str) -> Vec<Place> {
    if let Some(named) = var(LIBRARY_VAR).filter(|v| !v.is_empty()) {
        let path = PathBuf::from(&named);
        let path = if path.is_dir() { path.join(file) } else { path };
        return vec![Place {
            what: format!("{LIBRARY_VAR}={}", named.to_string_lossy()),
            target: Ok(path.into_os_string()),
        }];
    }
    let mut places = vec![Place {
        what: LIBRARY_VAR.to_string(),
        target: Err("not set".into()),
    }];
    let built = build_dir.join(file);
    places.push(Place {
        what: format!("the folder found at build time ({})", build_dir.display()),
        target: if built.is_file() {
            Ok(built.into_os_string())
        } else {
            Err(format!("no {file} there any more"))
        },
    });
    places.push(Place {
        what:
            "the system's dynamic loader (LD_LIBRARY_PATH, the executable's RUNPATH, the ld cache)"
                .into(),
        target: Ok(OsString::from(file)),
    });
    for env in PYTHON_ENVS {
        let Some(prefix) = var(env).filter(|v| !v.is_empty()) else {
            places.push(Place {
                what: env.to_string(),
                target: Err("not set".into()),
            });
            continue;
        };
        let what = format!("{env}={}", prefix.to_string_lossy());
        let found = python_nccl(Path::new(&prefix), file);
        if found.is_empty() {
            places.push(Place {
                what: what.clone(),
                target: Err(format!(
                    "no lib/python3*/site-packages/nvidia/nccl/lib/{file} there"
                )),
            });
        }
        for path in found {
            places.push(Place {
                what: what.clone(),
                target: Ok(path.into_os_string()),
            });
        }
    }
    places
}

/// `<prefix>/lib/python3.*/site-packages/nvidia/nccl/lib/<file>` (pip's nvidia-nccl wheels), for each
/// Python of the environment, in name order.
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

    fn env<'a>(vars: &'a [(&'a str, &'a Path)]) -> impl Fn(&str) -> Option<OsString> + 'a {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.as_os_str().to_owned())
        }
    }

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("metrale-search-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("mkdir");
        dir
    }

    #[test]
    fn the_explicit_variable_is_the_only_place_and_a_folder_means_the_file_in_it() {
        let dir = scratch("explicit");
        let places = places(
            &env(&[(LIBRARY_VAR, &dir)]),
            Path::new("/nowhere"),
            "libnccl.so.2",
        );
        assert_eq!(places.len(), 1, "{places:?}");
        assert_eq!(
            places[0].target,
            Ok(dir.join("libnccl.so.2").into_os_string())
        );
        let file = Path::new("/opt/x/libnccl.so.2.29.7");
        let places = super::places(
            &env(&[(LIBRARY_VAR, file)]),
            Path::new("/nowhere"),
            "libnccl.so.2",
        );
        assert_eq!(places[0].target, Ok(file.as_os_str().to_owned()));
    }

    #[test]
    fn the_order_is_variable_build_folder_system_then_python_environments() {
        let build = scratch("build");
        std::fs::write(build.join("libnccl.so.2"), "").expect("write");
        let venv = scratch("venv");
        let lib = venv.join("lib/python3.12/site-packages/nvidia/nccl/lib");
        std::fs::create_dir_all(&lib).expect("mkdir");
        std::fs::write(lib.join("libnccl.so.2"), "").expect("write");
        let places = places(&env(&[("VIRTUAL_ENV", &venv)]), &build, "libnccl.so.2");
        let whats: Vec<&str> = places.iter().map(|p| p.what.as_str()).collect();
        assert!(
            whats[0] == LIBRARY_VAR && places[0].target.is_err(),
            "{places:?}"
        );
        assert!(
            whats[1].starts_with("the folder found at build time"),
            "{whats:?}"
        );
        assert_eq!(
            places[1].target,
            Ok(build.join("libnccl.so.2").into_os_string())
        );
        assert_eq!(places[2].target, Ok(OsString::from("libnccl.so.2")));
        assert_eq!(
            places[3].target,
            Ok(lib.join("libnccl.so.2").into_os_string())
        );
        assert_eq!(places[4].what, "CONDA_PREFIX");
        assert_eq!(places.len(), 5, "{places:?}");
    }

    #[test]
    fn a_build_folder_without_the_library_is_passed_over_saying_so() {
        let build = scratch("empty-build");
        let places = places(&env(&[]), &build, "libnccl.so.2");
        assert_eq!(
            places[1].target,
            Err("no libnccl.so.2 there any more".into())
        );
    }
}
