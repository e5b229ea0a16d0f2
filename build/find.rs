//! Where NCCL (nccl.h, libnccl) and the CUDA headers (cuda.h) are: the discovery steps in their documented
//! order, and the one message a person gets when none of them finds anything.
//!
//! Pure apart from reading the file system through `Host`, so the tests drive it with a fake environment.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// What the build script needs to know about its surroundings.
pub trait Host {
    /// An environment variable, already declared to cargo; `None` when unset or empty.
    fn var(&self, name: &str) -> Option<PathBuf>;
    /// `pkg-config <name>`: its include and library directories, or why it failed.
    fn pkg_config(&self, name: &str) -> Result<PkgConfig, String>;
    /// The pkg-config packages named `cuda-<version>`, newest first.
    fn pkg_config_cuda_names(&self) -> Vec<String>;
}

/// What pkg-config said about a package.
#[derive(Debug, Clone, Default)]
pub struct PkgConfig {
    pub include_paths: Vec<PathBuf>,
    pub link_paths: Vec<PathBuf>,
}

/// The fixed places searched after the variables: the folder `ci/setup` fills, then the toolkit and the system.
#[derive(Debug, Clone)]
pub struct Places {
    /// `ci/setup`'s NCCL for the pinned version (`.deps/nccl-<v>/nvidia/nccl`).
    pub setup_nccl: PathBuf,
    /// `ci/setup`'s CUDA headers (`.deps/cuda-13.0/nvidia/cu13`).
    pub setup_cuda: PathBuf,
    pub usr_local_cuda: PathBuf,
    pub system_include: PathBuf,
    pub system_lib: PathBuf,
}

impl Places {
    pub fn new(manifest_dir: &Path, pinned_nccl: &str) -> Places {
        let deps = manifest_dir.join(".deps");
        Places {
            setup_nccl: deps.join(format!("nccl-{pinned_nccl}/nvidia/nccl")),
            setup_cuda: deps.join("cuda-13.0/nvidia/cu13"),
            usr_local_cuda: PathBuf::from("/usr/local/cuda"),
            system_include: PathBuf::from("/usr/include"),
            system_lib: PathBuf::from("/usr/lib/x86_64-linux-gnu"),
        }
    }
}

/// Where the headers and the library were found, and by which step.
#[derive(Debug, Clone)]
pub struct Found {
    pub nccl_include: PathBuf,
    pub nccl_lib_dir: PathBuf,
    /// The file to link: `libnccl.so`, or `libnccl.so.2` where only the versioned name exists (pip wheels).
    pub nccl_lib_file: String,
    /// `cuda.h`'s directory first, then `cccl/` beside it where CUDA 13 keeps `nv/target`.
    pub cuda_include: Vec<PathBuf>,
    pub nccl_step: String,
    pub cuda_step: String,
    /// Places a variable named outright that were passed over (no header, or a header without its
    /// library): worth a warning, since the person who set the variable meant it.
    pub passed_over: Vec<String>,
}

/// Runs every step in order; on failure, the whole message for the person at the keyboard.
pub fn find(host: &dyn Host, places: &Places) -> Result<Found, String> {
    let mut tried = String::new();
    let nccl = find_nccl(host, places, &mut tried);
    let mut cuda_tried = String::new();
    let cuda = find_cuda(host, places, &mut cuda_tried);
    match (nccl, cuda) {
        (
            Ok((nccl_include, nccl_lib_dir, nccl_lib_file, nccl_step)),
            Ok((cuda_include, cuda_step)),
        ) => Ok(Found {
            nccl_include,
            nccl_lib_dir,
            nccl_lib_file,
            cuda_include,
            nccl_step,
            cuda_step,
            passed_over: passed_over(&tried)
                .chain(passed_over(&cuda_tried))
                .collect(),
        }),
        (nccl, cuda) => Err(not_found_message(
            nccl.err().map(|what| (what, tried)),
            cuda.err().map(|what| (what, cuda_tried)),
        )),
    }
}

/// The notes of steps that a set variable named and that did not serve.
fn passed_over(tried: &str) -> impl Iterator<Item = String> + '_ {
    tried
        .lines()
        .map(|l| l.trim_start_matches(['-', ' ']))
        .filter(|l| (l.starts_with("NCCL_") || l.starts_with("CUDA_")) && !l.ends_with(": not set"))
        .map(String::from)
}

type NcclHit = (PathBuf, PathBuf, String, String);
/// A discovery step for NCCL: its name, the include directories and the library directories it offers.
type NcclStep = (String, Vec<PathBuf>, Vec<PathBuf>);

fn find_nccl(host: &dyn Host, places: &Places, tried: &mut String) -> Result<NcclHit, String> {
    let mut steps: Vec<NcclStep> = Vec::new();

    // 1. Both directories named outright.
    match (host.var("NCCL_INCLUDE_DIR"), host.var("NCCL_LIB_DIR")) {
        (None, None) => note(tried, "NCCL_INCLUDE_DIR, NCCL_LIB_DIR", "not set"),
        (inc, lib) => {
            let inc = inc.unwrap_or_default();
            let libs = match lib {
                Some(lib) => vec![lib],
                None => lib_dirs_beside(&inc),
            };
            steps.push(("NCCL_INCLUDE_DIR/NCCL_LIB_DIR".into(), vec![inc], libs));
        }
    }
    // 2. An installation root.
    push_roots(host, &["NCCL_HOME", "NCCL_ROOT"], &mut steps, tried);
    // 3. What ci/setup installed into this checkout.
    steps.push((
        "ci/setup's folder".into(),
        vec![places.setup_nccl.join("include")],
        vec![places.setup_nccl.join("lib")],
    ));
    if let Some(hit) = first_nccl(&steps, tried) {
        return Ok(hit);
    }
    steps.clear();

    // 4. pkg-config.
    match host.pkg_config("nccl") {
        Ok(pc) => {
            let mut libs = pc.link_paths.clone();
            libs.push(places.system_lib.clone());
            let mut incs = pc.include_paths.clone();
            incs.push(places.system_include.clone());
            steps.push(("pkg-config nccl".into(), incs, libs));
        }
        Err(why) => note(tried, "pkg-config nccl", &why),
    }
    // 5. The CUDA toolkit's root, then the system.
    push_roots(host, &["CUDA_HOME", "CUDA_PATH"], &mut steps, tried);
    let cuda = &places.usr_local_cuda;
    steps.push((
        cuda.display().to_string(),
        vec![cuda.join("include")],
        lib_dirs(cuda),
    ));
    steps.push((
        "the system directories".into(),
        vec![places.system_include.clone()],
        vec![places.system_lib.clone()],
    ));
    first_nccl(&steps, tried).ok_or_else(|| "NCCL (nccl.h and libnccl.so*)".to_string())
}

/// A step for each installation root named by one of `vars`: its `include/`, and `lib64/` or `lib/`.
fn push_roots(host: &dyn Host, vars: &[&str], steps: &mut Vec<NcclStep>, tried: &mut String) {
    for name in vars {
        match host.var(name) {
            Some(root) => steps.push((
                format!("{name}={}", root.display()),
                vec![root.join("include")],
                lib_dirs(&root),
            )),
            None => note(tried, name, "not set"),
        }
    }
}

/// The first step whose include directories hold `nccl.h`; a header without a library is noted, not taken.
fn first_nccl(steps: &[NcclStep], tried: &mut String) -> Option<NcclHit> {
    for (step, incs, libs) in steps {
        let Some(inc) = incs.iter().find(|d| d.join("nccl.h").is_file()) else {
            note(tried, step, &format!("no nccl.h in {}", list(incs)));
            continue;
        };
        match libs
            .iter()
            .find_map(|d| nccl_lib_file(d).map(|f| (d.clone(), f)))
        {
            Some((lib_dir, file)) => return Some((inc.clone(), lib_dir, file, step.clone())),
            None => note(
                tried,
                step,
                &format!(
                    "nccl.h in {}, but no libnccl.so or libnccl.so.2 in {}",
                    inc.display(),
                    list(libs)
                ),
            ),
        }
    }
    None
}

fn find_cuda(
    host: &dyn Host,
    places: &Places,
    tried: &mut String,
) -> Result<(Vec<PathBuf>, String), String> {
    let mut steps: Vec<(String, PathBuf)> = Vec::new();
    match host.var("CUDA_INCLUDE_DIR") {
        Some(dir) => steps.push(("CUDA_INCLUDE_DIR".into(), dir)),
        None => note(tried, "CUDA_INCLUDE_DIR", "not set"),
    }
    for name in ["CUDA_HOME", "CUDA_PATH"] {
        match host.var(name) {
            Some(root) => steps.push((format!("{name}={}", root.display()), root.join("include"))),
            None => note(tried, name, "not set"),
        }
    }
    steps.push((
        "ci/setup's folder".into(),
        places.setup_cuda.join("include"),
    ));
    if let Some(hit) = first_cuda(&steps, tried) {
        return Ok(hit);
    }
    steps.clear();
    let names = host.pkg_config_cuda_names();
    if names.is_empty() {
        note(tried, "pkg-config cuda-*", "no such package");
    }
    for name in names {
        match host.pkg_config(&name) {
            Ok(pc) => steps.extend(
                pc.include_paths
                    .into_iter()
                    .map(|d| (format!("pkg-config {name}"), d)),
            ),
            Err(why) => note(tried, &format!("pkg-config {name}"), &why),
        }
    }
    steps.push((
        places.usr_local_cuda.display().to_string(),
        places.usr_local_cuda.join("include"),
    ));
    steps.push((
        "the system directories".into(),
        places.system_include.clone(),
    ));
    first_cuda(&steps, tried).ok_or_else(|| "the CUDA headers (cuda.h)".to_string())
}

/// The first step whose directory holds `cuda.h`.
fn first_cuda(steps: &[(String, PathBuf)], tried: &mut String) -> Option<(Vec<PathBuf>, String)> {
    for (step, dir) in steps {
        if !dir.join("cuda.h").is_file() {
            note(tried, step, &format!("no cuda.h in {}", dir.display()));
            continue;
        }
        let mut dirs = vec![dir.clone()];
        let cccl = dir.join("cccl");
        if cccl.is_dir() {
            dirs.push(cccl);
        }
        return Some((dirs, step.clone()));
    }
    None
}

/// `lib64/` and `lib/` under an installation root (toolkits use the first, pip wheels the second).
fn lib_dirs(root: &Path) -> Vec<PathBuf> {
    vec![root.join("lib64"), root.join("lib")]
}

/// Library directories for an include directory given alone: its parent's.
fn lib_dirs_beside(include: &Path) -> Vec<PathBuf> {
    include.parent().map(lib_dirs).unwrap_or_default()
}

/// The name to link libnccl by in `dir`: the unversioned link where one exists, else the SONAME.
pub fn nccl_lib_file(dir: &Path) -> Option<String> {
    ["libnccl.so", "libnccl.so.2"]
        .into_iter()
        .find(|f| dir.join(f).exists())
        .map(String::from)
}

fn note(tried: &mut String, step: &str, result: &str) {
    let _ = writeln!(tried, "    - {step}: {result}");
}

fn list(dirs: &[PathBuf]) -> String {
    let names: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    names.join(", ")
}

fn not_found_message(nccl: Option<(String, String)>, cuda: Option<(String, String)>) -> String {
    let mut msg = String::from("metrale-gpu-sys could not find ");
    let missing: Vec<&str> = [&nccl, &cuda]
        .iter()
        .filter_map(|m| m.as_ref().map(|(what, _)| what.as_str()))
        .collect();
    msg.push_str(&missing.join(" nor "));
    msg.push_str(".\n");
    for (what, tried) in [nccl, cuda].into_iter().flatten() {
        let _ = write!(msg, "\n  Looked for {what}, in this order:\n{tried}");
    }
    msg.push_str(
        "\n  To fix it on a Debian/Ubuntu build machine without a CUDA toolkit, run in this repository:\n\
         \n        ci/setup\n\
         \n  It installs the pinned NCCL and the CUDA 13 headers from PyPI into .deps/, where the build finds them.\n\
         \n  Or point the build at an installation:\n\
         \x20     NCCL_HOME=<root with include/nccl.h and lib/libnccl.so*>   (a pip install: .../site-packages/nvidia/nccl)\n\
         \x20     CUDA_HOME=<root with include/cuda.h>                       (a pip install: .../site-packages/nvidia/cu13)\n\
         \x20     or NCCL_INCLUDE_DIR + NCCL_LIB_DIR, CUDA_INCLUDE_DIR, or a pkg-config file nccl.pc.\n",
    );
    msg
}
