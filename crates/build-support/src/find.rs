//! Where NCCL (nccl.h, libnccl) and the CUDA headers (cuda.h) are: the discovery steps in their documented
//! order, each step that did not serve recorded as data ([`Miss`]), and the one message a person gets when
//! no step finds them ([`NotFound`]'s `Display`, the only place the report is worded).
//!
//! The environment and pkg-config come through [`Host`], so the tests drive the search with a fake one;
//! the files are looked for on the file system.

use std::fmt;
use std::path::{Path, PathBuf};

/// What the build script needs to know about its surroundings.
pub trait Host {
    /// An environment variable, already declared to cargo; `None` when unset or empty.
    fn var(&self, name: &str) -> Option<PathBuf>;
    /// `pkg-config <name>`: its include and library directories, or why it failed.
    fn pkg_config(&self, name: &str) -> Result<PkgConfig, String>;
    /// The pkg-config packages named `cuda-<version>`, newest first ([`cuda_version`] orders them).
    fn pkg_config_cuda_names(&self) -> Vec<String>;
}

/// What pkg-config said about a package.
#[derive(Debug, Clone, Default)]
pub struct PkgConfig {
    pub include_paths: Vec<PathBuf>,
    pub link_paths: Vec<PathBuf>,
}

/// The variables that name NCCL's places, in the order they are read.
const NCCL_VARS: [&str; 4] = ["NCCL_INCLUDE_DIR", "NCCL_LIB_DIR", "NCCL_HOME", "NCCL_ROOT"];
/// The variables that name the CUDA headers' places, in the order they are read.
const CUDA_VARS: [&str; 3] = ["CUDA_INCLUDE_DIR", "CUDA_HOME", "CUDA_PATH"];

/// The fixed places searched after the variables (the folder `ci/setup` fills, then the toolkit and the
/// system), and the target they are for.
#[derive(Debug, Clone)]
pub struct Places {
    /// `ci/setup`'s NCCL for the pinned version (`.deps/nccl-<v>/nvidia/nccl`, or `.deps/<target>/…` for
    /// another target than the build machine's); `None` outside this repository.
    pub setup_nccl: Option<PathBuf>,
    /// `ci/setup`'s CUDA headers, a CUDA root (`.deps/cuda-<version>/nvidia`, the newest version there),
    /// the same for every target; `None` outside this repository, or where ci/setup installed none.
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
            setup_cuda: deps.and_then(newest_cuda).map(|dir| dir.join("nvidia")),
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

/// The `cuda-<version>` folder with the newest version directly under `deps` (where ci/setup installs
/// each CUDA version's headers).
fn newest_cuda(deps: &Path) -> Option<PathBuf> {
    std::fs::read_dir(deps)
        .ok()?
        .flatten()
        .filter_map(|entry| {
            let version = cuda_version(entry.file_name().to_str()?)?;
            Some((version, entry.path()))
        })
        .max()
        .map(|(_, dir)| dir)
}

/// The version a `cuda-<version>` name gives (ci/setup's folders, NVIDIA's pkg-config packages), by
/// part, for ordering: `[12, 9]` for `cuda-12.9`.
pub fn cuda_version(name: &str) -> Option<Vec<u32>> {
    let digits = name.strip_prefix("cuda-")?;
    digits.split('.').map(|p| p.parse().ok()).collect()
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
    pub nccl_step: Step,
    pub cuda_step: Step,
    /// Places a variable named outright that were passed over (no header, or a header without its
    /// library): worth a warning, since the person who set the variable meant it.
    pub passed_over: Vec<Miss>,
}

/// A discovery step: where it looked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Variables that say where to look, none of them set (`NCCL_HOME`; `NCCL_INCLUDE_DIR` and
    /// `NCCL_LIB_DIR`).
    Unset(Vec<&'static str>),
    /// `NCCL_INCLUDE_DIR` and `NCCL_LIB_DIR`, both set.
    NcclDirs,
    /// One of `NCCL_INCLUDE_DIR` and `NCCL_LIB_DIR` alone (`var`), read as `form` with the value `dir`:
    /// the other (`missing`) is looked for beside it.
    NcclDirAlone {
        var: &'static str,
        form: String,
        dir: PathBuf,
        missing: &'static str,
    },
    /// A variable that names an installation root or an include directory (`var`), read as `form` with
    /// the value `value`.
    Variable {
        var: &'static str,
        form: String,
        value: PathBuf,
    },
    /// The folder `ci/setup` fills in this repository.
    Setup,
    /// `pkg-config <package>`.
    PkgConfig(String),
    /// The pkg-config packages named `cuda-<version>`, when there is none.
    PkgConfigCuda,
    /// A toolkit's usual root (`/usr/local/cuda`).
    Folder(PathBuf),
    /// The system's include and library directories.
    System,
}

impl Step {
    /// The variable the step follows, where a person set one.
    fn variable(&self) -> Option<&'static str> {
        match self {
            Step::NcclDirs => Some("NCCL_INCLUDE_DIR"),
            Step::NcclDirAlone { var, .. } | Step::Variable { var, .. } => Some(var),
            _ => None,
        }
    }
}

/// Why a step did not serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Why {
    /// Its variables are not set.
    NotSet,
    /// None of `dirs` holds `header`.
    NoHeader {
        header: &'static str,
        dirs: Vec<PathBuf>,
    },
    /// nccl.h is in `include`, but none of `lib_dirs` holds libnccl.
    NoLibrary {
        include: PathBuf,
        lib_dirs: Vec<PathBuf>,
    },
    /// pkg-config failed, in its words.
    PkgConfig(String),
    /// pkg-config knows no such package.
    NoPackage,
}

/// A step that did not serve, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Miss {
    pub step: Step,
    pub why: Why,
}

/// What a search looks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sought {
    /// nccl.h and libnccl.
    Nccl,
    /// cuda.h.
    CudaHeaders,
}

/// No step found NCCL, the CUDA headers, or either: each search that failed with its misses, in order.
#[derive(Debug, Clone)]
pub struct NotFound {
    pub failed: Vec<(Sought, Vec<Miss>)>,
    /// Whether the build runs in this repository (ci/setup's folder is searched): the fix is ci/setup then.
    pub in_repository: bool,
    /// The NCCL version the crate pins: what the fix offers to install.
    pub pinned_nccl: String,
}

/// Runs every step in order; on failure, what each failed search tried.
pub fn find(host: &dyn Host, places: &Places) -> Result<Found, NotFound> {
    let mut nccl_misses = Vec::new();
    let nccl = find_nccl(host, places, &mut nccl_misses);
    let mut cuda_misses = Vec::new();
    let cuda = find_cuda(host, places, &mut cuda_misses);
    match (nccl, cuda) {
        (Some(nccl), Some((cuda_include, cuda_step))) => Ok(Found {
            nccl_include: nccl.include,
            nccl_lib_dir: nccl.lib_dir,
            nccl_lib_file: nccl.lib_file,
            cuda_include,
            nccl_step: nccl.step,
            cuda_step,
            // Only the variables that name what each search looks for: CUDA_HOME that served the CUDA
            // headers is not "passed over" because the NCCL search also looked for nccl.h there.
            passed_over: passed_over(nccl_misses, &NCCL_VARS)
                .chain(passed_over(cuda_misses, &CUDA_VARS))
                .collect(),
        }),
        (nccl, cuda) => Err(NotFound {
            failed: [
                nccl.is_none().then_some((Sought::Nccl, nccl_misses)),
                cuda.is_none().then_some((Sought::CudaHeaders, cuda_misses)),
            ]
            .into_iter()
            .flatten()
            .collect(),
            in_repository: places.setup_nccl.is_some(),
            pinned_nccl: places.pinned_nccl.clone(),
        }),
    }
}

/// The misses of steps that one of `vars` named (set), which did not serve.
fn passed_over(misses: Vec<Miss>, vars: &'static [&'static str]) -> impl Iterator<Item = Miss> {
    misses.into_iter().filter(move |miss| {
        miss.why != Why::NotSet && miss.step.variable().is_some_and(|var| vars.contains(&var))
    })
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
    step: Step,
}

/// A discovery step for NCCL, with the include directories and the library directories it offers.
struct NcclStep {
    step: Step,
    includes: Vec<PathBuf>,
    libs: Vec<PathBuf>,
}

fn find_nccl(host: &dyn Host, places: &Places, misses: &mut Vec<Miss>) -> Option<NcclHit> {
    let mut steps: Vec<NcclStep> = Vec::new();

    // 1. The directories named outright; one alone stands for the installation root above it.
    let include_dir = var(host, places, "NCCL_INCLUDE_DIR");
    let lib_dir = var(host, places, "NCCL_LIB_DIR");
    match (include_dir, lib_dir) {
        (None, None) => misses.push(Miss {
            step: Step::Unset(vec!["NCCL_INCLUDE_DIR", "NCCL_LIB_DIR"]),
            why: Why::NotSet,
        }),
        (Some((_, include)), Some((_, lib))) => steps.push(NcclStep {
            step: Step::NcclDirs,
            includes: vec![include],
            libs: vec![lib],
        }),
        (Some((form, include)), None) => steps.push(NcclStep {
            libs: include.parent().map(lib_dirs).unwrap_or_default(),
            step: Step::NcclDirAlone {
                var: "NCCL_INCLUDE_DIR",
                form,
                dir: include.clone(),
                missing: "NCCL_LIB_DIR",
            },
            includes: vec![include],
        }),
        (None, Some((form, lib))) => steps.push(NcclStep {
            includes: lib
                .parent()
                .map(|root| vec![root.join("include")])
                .unwrap_or_default(),
            step: Step::NcclDirAlone {
                var: "NCCL_LIB_DIR",
                form,
                dir: lib.clone(),
                missing: "NCCL_INCLUDE_DIR",
            },
            libs: vec![lib],
        }),
    }
    // 2. An installation root.
    for (step, root) in roots(host, places, &["NCCL_HOME", "NCCL_ROOT"], misses) {
        steps.push(NcclStep {
            step,
            includes: vec![root.join("include")],
            libs: lib_dirs(&root),
        });
    }
    // 3. What ci/setup installed into this checkout.
    if let Some(setup) = &places.setup_nccl {
        steps.push(NcclStep {
            step: Step::Setup,
            includes: vec![setup.join("include")],
            libs: vec![setup.join("lib")],
        });
    }
    if let Some(hit) = first_nccl(steps, misses) {
        return Some(hit);
    }

    let mut steps: Vec<NcclStep> = Vec::new();
    // 4. pkg-config.
    let package = Step::PkgConfig("nccl".into());
    match host.pkg_config("nccl") {
        Ok(pc) => {
            let mut libs = pc.link_paths;
            libs.push(places.system_lib.clone());
            let mut includes = pc.include_paths;
            includes.push(places.system_include.clone());
            steps.push(NcclStep {
                step: package,
                includes,
                libs,
            });
        }
        Err(why) => misses.push(Miss {
            step: package,
            why: Why::PkgConfig(why),
        }),
    }
    // 5. The CUDA toolkit's root, then the system.
    let mut cuda_roots = roots(host, places, &["CUDA_HOME", "CUDA_PATH"], misses);
    cuda_roots.push((
        Step::Folder(places.usr_local_cuda.clone()),
        places.usr_local_cuda.clone(),
    ));
    for (step, root) in cuda_roots {
        let target = root.join("targets").join(&places.cuda_target);
        let mut libs = vec![target.join("lib")];
        if places.native {
            libs.extend(lib_dirs(&root));
        }
        steps.push(NcclStep {
            step,
            includes: vec![target.join("include"), root.join("include")],
            libs,
        });
    }
    steps.push(NcclStep {
        step: Step::System,
        includes: vec![places.system_include.clone()],
        libs: vec![places.system_lib.clone()],
    });
    first_nccl(steps, misses)
}

/// The installation roots named by `vars`, each with its step.
fn roots(
    host: &dyn Host,
    places: &Places,
    vars: &[&'static str],
    misses: &mut Vec<Miss>,
) -> Vec<(Step, PathBuf)> {
    let mut found = Vec::new();
    for &name in vars {
        match var(host, places, name) {
            Some((form, root)) => found.push((
                Step::Variable {
                    var: name,
                    form,
                    value: root.clone(),
                },
                root,
            )),
            None => misses.push(Miss {
                step: Step::Unset(vec![name]),
                why: Why::NotSet,
            }),
        }
    }
    found
}

/// The first step whose include directories hold `nccl.h`; a header without a library is a miss, not taken.
fn first_nccl(steps: Vec<NcclStep>, misses: &mut Vec<Miss>) -> Option<NcclHit> {
    for NcclStep {
        step,
        includes,
        libs,
    } in steps
    {
        let Some(include) = includes.iter().find(|d| d.join("nccl.h").is_file()) else {
            misses.push(Miss {
                step,
                why: Why::NoHeader {
                    header: "nccl.h",
                    dirs: includes,
                },
            });
            continue;
        };
        match libs
            .iter()
            .find_map(|d| nccl_lib_file(d).map(|f| (d.clone(), f)))
        {
            Some((lib_dir, lib_file)) => {
                return Some(NcclHit {
                    include: include.clone(),
                    lib_dir,
                    lib_file,
                    step,
                })
            }
            None => misses.push(Miss {
                step,
                why: Why::NoLibrary {
                    include: include.clone(),
                    lib_dirs: libs,
                },
            }),
        }
    }
    None
}

fn find_cuda(
    host: &dyn Host,
    places: &Places,
    misses: &mut Vec<Miss>,
) -> Option<(Vec<PathBuf>, Step)> {
    let mut steps: Vec<(Step, Vec<PathBuf>)> = Vec::new();
    match var(host, places, "CUDA_INCLUDE_DIR") {
        Some((form, dir)) => steps.push((
            Step::Variable {
                var: "CUDA_INCLUDE_DIR",
                form,
                value: dir.clone(),
            },
            vec![dir],
        )),
        None => misses.push(Miss {
            step: Step::Unset(vec!["CUDA_INCLUDE_DIR"]),
            why: Why::NotSet,
        }),
    }
    for (step, root) in roots(host, places, &["CUDA_HOME", "CUDA_PATH"], misses) {
        steps.push((step, cuda_include_dirs(&root, places)));
    }
    if let Some(setup) = &places.setup_cuda {
        steps.push((Step::Setup, cuda_include_dirs(setup, places)));
    }
    if let Some(hit) = first_cuda(steps, misses) {
        return Some(hit);
    }

    let mut steps = Vec::new();
    let names = host.pkg_config_cuda_names();
    if names.is_empty() {
        misses.push(Miss {
            step: Step::PkgConfigCuda,
            why: Why::NoPackage,
        });
    }
    for name in names {
        match host.pkg_config(&name) {
            Ok(pc) => steps.push((Step::PkgConfig(name), pc.include_paths)),
            Err(why) => misses.push(Miss {
                step: Step::PkgConfig(name),
                why: Why::PkgConfig(why),
            }),
        }
    }
    steps.push((
        Step::Folder(places.usr_local_cuda.clone()),
        cuda_include_dirs(&places.usr_local_cuda, places),
    ));
    steps.push((Step::System, vec![places.system_include.clone()]));
    first_cuda(steps, misses)
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
    steps: Vec<(Step, Vec<PathBuf>)>,
    misses: &mut Vec<Miss>,
) -> Option<(Vec<PathBuf>, Step)> {
    for (step, dirs) in steps {
        let Some(dir) = dirs.iter().find(|d| d.join("cuda.h").is_file()) else {
            misses.push(Miss {
                step,
                why: Why::NoHeader {
                    header: "cuda.h",
                    dirs,
                },
            });
            continue;
        };
        let mut found = vec![dir.clone()];
        found.extend(
            cuda_companions(dir)
                .into_iter()
                .filter(|companion| companion.is_dir()),
        );
        return Some((found, step));
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

/// Directories as a comma-separated list.
struct List<'a>(&'a [PathBuf]);

impl fmt::Display for List<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, dir) in self.0.iter().enumerate() {
            let comma = if i == 0 { "" } else { ", " };
            write!(f, "{comma}{}", dir.display())?;
        }
        Ok(())
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Unset(vars) => f.write_str(&vars.join(", ")),
            Step::NcclDirs => f.write_str("NCCL_INCLUDE_DIR/NCCL_LIB_DIR"),
            Step::NcclDirAlone {
                form, dir, missing, ..
            } => {
                let beside = if *missing == "NCCL_LIB_DIR" {
                    "the library"
                } else {
                    "nccl.h"
                };
                write!(
                    f,
                    "{form}={} without {missing} (set it too, or {beside} is looked for beside it)",
                    dir.display()
                )
            }
            Step::Variable { form, value, .. } => write!(f, "{form}={}", value.display()),
            Step::Setup => f.write_str("ci/setup's folder"),
            Step::PkgConfig(package) => write!(f, "pkg-config {package}"),
            Step::PkgConfigCuda => f.write_str("pkg-config cuda-*"),
            Step::Folder(dir) => write!(f, "{}", dir.display()),
            Step::System => f.write_str("the system directories"),
        }
    }
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Why::NotSet => f.write_str("not set"),
            Why::NoHeader { header, dirs } => write!(f, "no {header} in {}", List(dirs)),
            Why::NoLibrary { include, lib_dirs } => write!(
                f,
                "nccl.h in {}, but no libnccl.so or libnccl.so.2 in {}",
                include.display(),
                List(lib_dirs)
            ),
            Why::PkgConfig(why) => f.write_str(why),
            Why::NoPackage => f.write_str("no such package"),
        }
    }
}

impl fmt::Display for Miss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.step, self.why)
    }
}

impl fmt::Display for Sought {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Sought::Nccl => "NCCL (nccl.h and libnccl.so*)",
            Sought::CudaHeaders => "the CUDA headers (cuda.h)",
        })
    }
}

impl fmt::Display for NotFound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let missing: Vec<String> = self.failed.iter().map(|(s, _)| s.to_string()).collect();
        writeln!(
            f,
            "metrale-gpu-sys could not find {}.",
            missing.join(" nor ")
        )?;
        for (sought, misses) in &self.failed {
            writeln!(f, "\n  Looked for {sought}, in this order:")?;
            for miss in misses {
                writeln!(f, "    - {miss}")?;
            }
        }
        if self.in_repository {
            f.write_str(
                "\n  To fix it on a Debian/Ubuntu build machine without a CUDA toolkit, run in this repository:\n\
                 \n        ci/setup\n\
                 \n  It installs the pinned NCCL and the CUDA headers from PyPI into .deps/, where the build finds them.\n",
            )?;
        } else {
            write!(
                f,
                "\n  To fix it without a CUDA toolkit, install NVIDIA's wheels of NCCL and the CUDA headers:\n\
                 \n        pip install nvidia-nccl-cu13=={} nvidia-cuda-runtime nvidia-cuda-crt nvidia-cuda-cccl\n\
                 \n  (CUDA 12: nvidia-nccl-cu12, nvidia-cuda-runtime-cu12, nvidia-cuda-nvcc-cu12, nvidia-cuda-cccl-cu12),\n\
                 \x20 and point the build at them as below.\n",
                self.pinned_nccl
            )?;
        }
        f.write_str(
            "\n  Point the build at an installation:\n\
             \x20     NCCL_HOME=<root with include/nccl.h and lib/libnccl.so*>   (a pip install: .../site-packages/nvidia/nccl)\n\
             \x20     CUDA_HOME=<root with include/cuda.h>                       (a pip install: .../site-packages/nvidia)\n\
             \x20     or NCCL_INCLUDE_DIR + NCCL_LIB_DIR, CUDA_INCLUDE_DIR, or a pkg-config file nccl.pc;\n\
             \x20     each also as <NAME>_<target triple> or <TARGET TRIPLE>_<NAME>, read first (for cross-builds).\n",
        )
    }
}
