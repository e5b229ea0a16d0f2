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

/// The fixed places searched after the variables (the folder `ci/setup` fills, then the toolkit and the
/// system), and the target they are for.
#[derive(Debug, Clone)]
pub struct Places {
    /// `ci/setup`'s NCCL for the pinned version (`.deps/nccl-<v>/nvidia/nccl`, or `.deps/<target>/…` for
    /// another target than the build machine's); `None` outside this repository.
    pub setup_nccl: Option<PathBuf>,
    /// `ci/setup`'s CUDA headers (`.deps/cuda-13.0/nvidia/cu13`), the same for every target; `None` outside
    /// this repository.
    pub setup_cuda: Option<PathBuf>,
    /// The NCCL version the crate pins: what the not-found message offers to install.
    pub pinned_nccl: String,
    pub usr_local_cuda: PathBuf,
    pub system_include: PathBuf,
    /// The target's multiarch library folder (`/usr/lib/aarch64-linux-gnu`).
    pub system_lib: PathBuf,
    /// The target triple: its `<VAR>_<target>` forms of the variables are read first.
    pub target: String,
    /// A CUDA toolkit's folder for the target under its root: `targets/<this>/` (`sbsa-linux`).
    pub cuda_target: String,
    /// Whether the target is the build machine's: a toolkit root's own `lib64/` and `lib/` hold its
    /// libraries then, and only then.
    pub native: bool,
}

impl Places {
    /// `deps`: `ci/setup`'s `.deps/` folder, where the build runs in this repository (a published crate has
    /// no `ci/setup`, and never looks into a `.deps/` that happens to lie beside it).
    pub fn new(deps: Option<&Path>, pinned_nccl: &str, target: &str, host: &str) -> Places {
        let native = target == host;
        let nccl_deps = |deps: &Path| {
            if native {
                deps.to_path_buf()
            } else {
                deps.join(target)
            }
        };
        let arch = target.split('-').next().unwrap_or(target);
        Places {
            setup_nccl: deps
                .map(|deps| nccl_deps(deps).join(format!("nccl-{pinned_nccl}/nvidia/nccl"))),
            setup_cuda: deps.map(|deps| deps.join("cuda-13.0/nvidia/cu13")),
            pinned_nccl: pinned_nccl.to_string(),
            usr_local_cuda: PathBuf::from("/usr/local/cuda"),
            system_include: PathBuf::from("/usr/include"),
            system_lib: PathBuf::from(format!("/usr/lib/{arch}-linux-gnu")),
            target: target.to_string(),
            // NVIDIA's name for server aarch64 (Grace); the others are `<arch>-linux`.
            cuda_target: match arch {
                "aarch64" => "sbsa-linux".to_string(),
                _ => format!("{arch}-linux"),
            },
            native,
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
    /// `cuda.h`'s directory first, then where the rest of the headers are: `cccl/` beside it (CUDA 13 keeps
    /// `nv/target` there), or pip's CUDA 12 folders beside its own (`cuda_nvcc`'s `crt/`, `cuda_cccl`).
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
        (Ok(nccl), Ok((cuda_include, cuda_step))) => Ok(Found {
            nccl_include: nccl.include,
            nccl_lib_dir: nccl.lib_dir,
            nccl_lib_file: nccl.lib_file,
            cuda_include,
            nccl_step: nccl.step,
            cuda_step,
            // Only the variables that name what each search looks for: CUDA_HOME that served the CUDA
            // headers is not "passed over" because the NCCL search also looked for nccl.h there.
            passed_over: passed_over(&tried, "NCCL_")
                .chain(passed_over(&cuda_tried, "CUDA_"))
                .collect(),
        }),
        (nccl, cuda) => Err(not_found_message(
            nccl.err().map(|what| (what, tried)),
            cuda.err().map(|what| (what, cuda_tried)),
            places,
        )),
    }
}

/// The notes of steps that a set variable named and that did not serve.
fn passed_over<'a>(tried: &'a str, prefix: &'a str) -> impl Iterator<Item = String> + 'a {
    tried
        .lines()
        .map(|l| l.trim_start_matches(['-', ' ']))
        .filter(move |l| l.starts_with(prefix) && !l.ends_with(": not set"))
        .map(String::from)
}

/// `name` as the build reads it for the target, before `<name>` itself: `<name>_<target>`, with the
/// triple's `-` as `_` and then as is (as cc reads its variables: `CC_aarch64_unknown_linux_gnu`), then
/// `<TARGET>_<name>`, the triple in capitals with `_` (as openssl-sys reads its:
/// `AARCH64_UNKNOWN_LINUX_GNU_OPENSSL_DIR`). Every form is read, so that each is declared to cargo; the
/// first one set wins, and comes back with its value.
pub fn var(host: &dyn Host, places: &Places, name: &str) -> Option<(String, PathBuf)> {
    let underscored = places.target.replace('-', "_");
    let forms = [
        format!("{name}_{underscored}"),
        format!("{name}_{}", places.target),
        format!("{}_{name}", underscored.to_uppercase()),
        name.to_string(),
    ];
    let values: Vec<(String, Option<PathBuf>)> = forms
        .into_iter()
        .map(|form| {
            let value = host.var(&form);
            (form, value)
        })
        .collect();
    values
        .into_iter()
        .find_map(|(form, value)| Some((form, value?)))
}

/// Where a discovery step found NCCL: `nccl.h`'s directory, the library's directory and file to link, and
/// the step.
struct NcclHit {
    include: PathBuf,
    lib_dir: PathBuf,
    lib_file: String,
    step: String,
}
/// A discovery step for NCCL: its name, the include directories and the library directories it offers.
type NcclStep = (String, Vec<PathBuf>, Vec<PathBuf>);

fn find_nccl(host: &dyn Host, places: &Places, tried: &mut String) -> Result<NcclHit, String> {
    let mut steps: Vec<NcclStep> = Vec::new();

    // 1. The directories named outright; one alone stands for the installation root above it.
    match (
        var(host, places, "NCCL_INCLUDE_DIR"),
        var(host, places, "NCCL_LIB_DIR"),
    ) {
        (None, None) => note(tried, "NCCL_INCLUDE_DIR, NCCL_LIB_DIR", "not set"),
        (Some((_, inc)), Some((_, lib))) => {
            steps.push(("NCCL_INCLUDE_DIR/NCCL_LIB_DIR".into(), vec![inc], vec![lib]));
        }
        (Some((form, inc)), None) => {
            let libs = inc.parent().map(lib_dirs).unwrap_or_default();
            let step = format!(
                "{form}={} without NCCL_LIB_DIR (set it too, or the library is looked for beside it)",
                inc.display()
            );
            steps.push((step, vec![inc], libs));
        }
        (None, Some((form, lib))) => {
            let incs = lib.parent().map(|root| vec![root.join("include")]);
            let step = format!(
                "{form}={} without NCCL_INCLUDE_DIR (set it too, or nccl.h is looked for beside it)",
                lib.display()
            );
            steps.push((step, incs.unwrap_or_default(), vec![lib]));
        }
    }
    // 2. An installation root.
    for (step, root) in roots(host, places, &["NCCL_HOME", "NCCL_ROOT"], tried) {
        steps.push((step, vec![root.join("include")], lib_dirs(&root)));
    }
    // 3. What ci/setup installed into this checkout.
    if let Some(setup) = &places.setup_nccl {
        steps.push((
            "ci/setup's folder".into(),
            vec![setup.join("include")],
            vec![setup.join("lib")],
        ));
    }
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
    let mut cuda_roots = roots(host, places, &["CUDA_HOME", "CUDA_PATH"], tried);
    cuda_roots.push((
        places.usr_local_cuda.display().to_string(),
        places.usr_local_cuda.clone(),
    ));
    for (step, root) in cuda_roots {
        let target = root.join("targets").join(&places.cuda_target);
        let mut libs = vec![target.join("lib")];
        if places.native {
            libs.extend(lib_dirs(&root));
        }
        steps.push((
            step,
            vec![target.join("include"), root.join("include")],
            libs,
        ));
    }
    steps.push((
        "the system directories".into(),
        vec![places.system_include.clone()],
        vec![places.system_lib.clone()],
    ));
    first_nccl(&steps, tried).ok_or_else(|| "NCCL (nccl.h and libnccl.so*)".to_string())
}

/// The installation roots named by `vars`, each with its step's name (`NCCL_HOME=<root>`).
fn roots(
    host: &dyn Host,
    places: &Places,
    vars: &[&str],
    tried: &mut String,
) -> Vec<(String, PathBuf)> {
    let mut found = Vec::new();
    for name in vars {
        match var(host, places, name) {
            Some((form, root)) => found.push((format!("{form}={}", root.display()), root)),
            None => note(tried, name, "not set"),
        }
    }
    found
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
            Some((lib_dir, lib_file)) => {
                return Some(NcclHit {
                    include: inc.clone(),
                    lib_dir,
                    lib_file,
                    step: step.clone(),
                })
            }
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
    let mut steps: Vec<(String, Vec<PathBuf>)> = Vec::new();
    match var(host, places, "CUDA_INCLUDE_DIR") {
        Some((form, dir)) => steps.push((form, vec![dir])),
        None => note(tried, "CUDA_INCLUDE_DIR", "not set"),
    }
    for (step, root) in roots(host, places, &["CUDA_HOME", "CUDA_PATH"], tried) {
        steps.push((step, cuda_include_dirs(&root, places)));
    }
    if let Some(setup) = &places.setup_cuda {
        steps.push(("ci/setup's folder".into(), vec![setup.join("include")]));
    }
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
            Ok(pc) => steps.push((format!("pkg-config {name}"), pc.include_paths)),
            Err(why) => note(tried, &format!("pkg-config {name}"), &why),
        }
    }
    steps.push((
        places.usr_local_cuda.display().to_string(),
        cuda_include_dirs(&places.usr_local_cuda, places),
    ));
    steps.push((
        "the system directories".into(),
        vec![places.system_include.clone()],
    ));
    first_cuda(&steps, tried).ok_or_else(|| "the CUDA headers (cuda.h)".to_string())
}

/// Where a CUDA root may keep `cuda.h`: a toolkit's `targets/<target>/include` and `include/`, and under
/// pip's `site-packages/nvidia`, CUDA 13's `cu13/include` or CUDA 12's `cuda_runtime/include`.
fn cuda_include_dirs(root: &Path, places: &Places) -> Vec<PathBuf> {
    vec![
        root.join("targets")
            .join(&places.cuda_target)
            .join("include"),
        root.join("include"),
        root.join("cu13/include"),
        root.join("cuda_runtime/include"),
    ]
}

/// The first step with a directory that holds `cuda.h`, with the header folders that go with it.
fn first_cuda(
    steps: &[(String, Vec<PathBuf>)],
    tried: &mut String,
) -> Option<(Vec<PathBuf>, String)> {
    for (step, dirs) in steps {
        let Some(dir) = dirs.iter().find(|d| d.join("cuda.h").is_file()) else {
            note(tried, step, &format!("no cuda.h in {}", list(dirs)));
            continue;
        };
        let mut found = vec![dir.clone()];
        found.extend(
            cuda_companions(dir)
                .into_iter()
                .filter(|companion| companion.is_dir()),
        );
        return Some((found, step.clone()));
    }
    None
}

/// The header folders that complete the one holding `cuda.h`: CUDA 13 keeps `nv/target` in `cccl/` beside
/// it; pip's CUDA 12 wheels put `crt/` and `nv/target` in sibling packages of `nvidia/cuda_runtime/`.
fn cuda_companions(dir: &Path) -> Vec<PathBuf> {
    let mut companions = vec![dir.join("cccl")];
    let runtime = dir.parent().filter(|p| p.ends_with("cuda_runtime"));
    if let Some(nvidia) = runtime.and_then(Path::parent) {
        companions.push(nvidia.join("cuda_nvcc/include"));
        companions.push(nvidia.join("cuda_cccl/include"));
    }
    companions
}

/// `lib64/` and `lib/` under an installation root (toolkits use the first, pip wheels the second).
fn lib_dirs(root: &Path) -> Vec<PathBuf> {
    vec![root.join("lib64"), root.join("lib")]
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

fn not_found_message(
    nccl: Option<(String, String)>,
    cuda: Option<(String, String)>,
    places: &Places,
) -> String {
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
    if places.setup_nccl.is_some() {
        msg.push_str(
            "\n  To fix it on a Debian/Ubuntu build machine without a CUDA toolkit, run in this repository:\n\
             \n        ci/setup\n\
             \n  It installs the pinned NCCL and the CUDA 13 headers from PyPI into .deps/, where the build finds them.\n",
        );
    } else {
        let _ = write!(
            msg,
            "\n  To fix it without a CUDA toolkit, install NVIDIA's wheels of NCCL and the CUDA headers:\n\
             \n        pip install nvidia-nccl-cu13=={} nvidia-cuda-runtime nvidia-cuda-crt nvidia-cuda-cccl\n\
             \n  (CUDA 12: nvidia-nccl-cu12, nvidia-cuda-runtime-cu12, nvidia-cuda-nvcc-cu12, nvidia-cuda-cccl-cu12),\n\
             \x20 and point the build at them as below.\n",
            places.pinned_nccl
        );
    }
    msg.push_str(
        "\n  Point the build at an installation:\n\
         \x20     NCCL_HOME=<root with include/nccl.h and lib/libnccl.so*>   (a pip install: .../site-packages/nvidia/nccl)\n\
         \x20     CUDA_HOME=<root with include/cuda.h>                       (a pip install: .../site-packages/nvidia)\n\
         \x20     or NCCL_INCLUDE_DIR + NCCL_LIB_DIR, CUDA_INCLUDE_DIR, or a pkg-config file nccl.pc;\n\
         \x20     each also as <NAME>_<target triple> or <TARGET TRIPLE>_<NAME>, read first (for cross-builds).\n",
    );
    msg
}
