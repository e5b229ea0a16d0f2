//! The discovery steps (`find`), driven with a fake environment over directories made here: each way of
//! finding NCCL and the CUDA headers, their order, the steps passed over, and the message when nothing is
//! found.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use metrale_gpu_sys_build::find::{self, Host, Miss, NotFound, PkgConfig, Places, Step, Why};

/// The NCCL version the places pin: any version; the tests pass it in and look for it.
const PINNED: &str = "2.99.0";

/// The search, as the build runs it.
fn find(host: &Fake, places: &Places) -> Result<find::Found, NotFound> {
    find::find(host, places)
}

/// The report of a search expected to fail.
fn not_found(host: &Fake, places: &Places, why: &str) -> String {
    find(host, places).expect_err(why).to_string()
}

/// The step of a variable `var`, set (as `form`) to `value`.
fn variable(var: &'static str, form: &str, value: &Path) -> Step {
    Step::Variable {
        var,
        form: form.to_string(),
        value: value.to_path_buf(),
    }
}

#[derive(Default)]
struct Fake {
    vars: HashMap<&'static str, PathBuf>,
    pkgs: HashMap<&'static str, PkgConfig>,
}

impl Host for Fake {
    fn var(&self, name: &str) -> Option<PathBuf> {
        self.vars.get(name).cloned()
    }
    fn pkg_config(&self, name: &str) -> Result<PkgConfig, String> {
        self.pkgs
            .get(name)
            .cloned()
            .ok_or_else(|| format!("package '{name}' was not found"))
    }
    fn pkg_config_cuda_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .pkgs
            .keys()
            .filter(|n| n.starts_with("cuda-"))
            .map(|n| n.to_string())
            .collect();
        names.sort();
        names.reverse();
        names
    }
}

/// A fresh, empty directory for one test.
fn scratch(name: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "discovery-{name}-{}",
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

fn touch(path: PathBuf) -> PathBuf {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(&path, "").expect("touch");
    path
}

/// An NCCL installation root: include/nccl.h and <lib>/<file>.
fn nccl_root(dir: &Path, lib: &str, file: &str) -> PathBuf {
    touch(dir.join("include/nccl.h"));
    touch(dir.join(lib).join(file));
    dir.to_path_buf()
}

/// A CUDA headers root as the pip wheels lay it out: include/cuda.h and include/cccl/.
fn cuda_root(dir: &Path) -> PathBuf {
    touch(dir.join("include/cuda.h"));
    std::fs::create_dir_all(dir.join("include/cccl/nv")).expect("cccl");
    dir.to_path_buf()
}

/// Places whose fixed directories are all empty, under `dir`, as in this repository (with ci/setup's).
fn empty_places(dir: &Path) -> Places {
    Places {
        setup_nccl: Some(dir.join("deps/nccl")),
        setup_cuda: Some(dir.join("deps/cuda")),
        pinned_nccl: PINNED.to_string(),
        usr_local_cuda: dir.join("usr-local-cuda"),
        system_include: dir.join("usr-include"),
        system_lib: dir.join("usr-lib"),
        target: "x86_64-unknown-linux-gnu".to_string(),
        cuda_target: "x86_64-linux".to_string(),
        native: true,
    }
}

#[test]
fn nothing_anywhere_gives_one_message_naming_every_place_and_the_fix() {
    let dir = scratch("none");
    let msg = not_found(&Fake::default(), &empty_places(&dir), "nothing to find");
    assert!(msg.starts_with("metrale-gpu-sys could not find NCCL (nccl.h and libnccl.so*) nor the CUDA headers (cuda.h)."), "{msg}");
    for step in [
        "NCCL_INCLUDE_DIR, NCCL_LIB_DIR: not set",
        "NCCL_HOME: not set",
        "NCCL_ROOT: not set",
        "pkg-config nccl: package 'nccl' was not found",
        "CUDA_HOME: not set",
        "CUDA_PATH: not set",
        "CUDA_INCLUDE_DIR: not set",
        "pkg-config cuda-*: no such package",
        "the system directories: no nccl.h in",
        "the system directories: no cuda.h in",
    ] {
        assert!(msg.contains(step), "missing {step:?} in:\n{msg}");
    }
    assert!(
        msg.contains(&format!(
            "ci/setup's folder: no nccl.h in {}",
            dir.join("deps/nccl/include").display()
        )),
        "{msg}"
    );
    assert!(
        msg.contains(&dir.join("usr-local-cuda/include").display().to_string()),
        "{msg}"
    );
    assert!(
        msg.contains("\n        ci/setup\n"),
        "the fix is one command: {msg}"
    );
    assert!(
        !msg.contains("pip install nvidia"),
        "inside the repository: {msg}"
    );
    for var in [
        "NCCL_HOME=",
        "CUDA_HOME=",
        "NCCL_INCLUDE_DIR + NCCL_LIB_DIR",
        "nccl.pc",
    ] {
        assert!(msg.contains(var), "{var}: {msg}");
    }
}

/// ci/setup's folder, which `empty_places` has.
fn setup(folder: &Option<PathBuf>) -> &Path {
    folder.as_deref().expect("ci/setup's folder")
}

/// A published crate (no ci/setup beside it) never looks into a `.deps/` that happens to be there, and its
/// not-found message offers NVIDIA's wheels and the variables, not a script it does not ship.
#[test]
fn outside_the_repository_deps_is_not_searched_and_the_message_names_the_wheels() {
    let dir = scratch("published");
    let places = Places {
        setup_nccl: None,
        setup_cuda: None,
        ..empty_places(&dir)
    };
    nccl_root(&dir.join("deps/nccl"), "lib", "libnccl.so.2");
    cuda_root(&dir.join("deps/cuda"));
    let msg = not_found(&Fake::default(), &places, "nothing searched holds NCCL");
    assert!(!msg.contains("ci/setup"), "{msg}");
    assert!(!msg.contains(".deps"), "{msg}");
    for fix in [
        &format!("pip install nvidia-nccl-cu13=={PINNED} nvidia-cuda-runtime nvidia-cuda-crt nvidia-cuda-cccl"),
        "nvidia-nccl-cu12, nvidia-cuda-runtime-cu12, nvidia-cuda-nvcc-cu12, nvidia-cuda-cccl-cu12",
        "NCCL_HOME=",
        "CUDA_HOME=",
        "NCCL_INCLUDE_DIR + NCCL_LIB_DIR",
        "<NAME>_<target triple> or <TARGET TRIPLE>_<NAME>",
    ] {
        assert!(msg.contains(fix), "{fix:?} missing in:\n{msg}");
    }
    // Places::new: the folder only where the build names one (the checkout has ci/setup).
    let published = Places::new(
        None,
        PINNED,
        "x86_64-unknown-linux-gnu",
        "x86_64-unknown-linux-gnu",
    );
    assert_eq!((published.setup_nccl, published.setup_cuda), (None, None));
}

/// One of NCCL_INCLUDE_DIR and NCCL_LIB_DIR alone: the other is looked for beside it (an installation
/// root's `include/` and `lib/` or `lib64/`), and where it is not there the message says to set it.
#[test]
fn one_of_the_two_directories_alone() {
    let dir = scratch("one-dir");
    let nccl = nccl_root(&dir.join("nccl"), "lib64", "libnccl.so.2");
    let cuda = cuda_root(&dir.join("cuda"));
    let mut host = Fake::default();
    host.vars.insert("CUDA_INCLUDE_DIR", cuda.join("include"));
    host.vars.insert("NCCL_LIB_DIR", nccl.join("lib64"));
    let found = find(&host, &empty_places(&dir)).expect("nccl.h beside the library");
    assert_eq!(found.nccl_include, nccl.join("include"));
    assert_eq!(found.nccl_lib_dir, nccl.join("lib64"));
    assert_eq!(
        found.nccl_step,
        Step::NcclDirAlone {
            var: "NCCL_LIB_DIR",
            form: "NCCL_LIB_DIR".into(),
            dir: nccl.join("lib64"),
            missing: "NCCL_INCLUDE_DIR",
        }
    );

    host.vars.remove("NCCL_LIB_DIR");
    host.vars.insert("NCCL_INCLUDE_DIR", nccl.join("include"));
    let found = find(&host, &empty_places(&dir)).expect("the library beside the headers");
    assert_eq!(found.nccl_lib_dir, nccl.join("lib64"));

    // Apart: what is missing, named.
    let lib = dir.join("elsewhere/lib");
    touch(lib.join("libnccl.so.2"));
    host.vars.remove("NCCL_INCLUDE_DIR");
    host.vars.insert("NCCL_LIB_DIR", lib.clone());
    let msg = not_found(&host, &empty_places(&dir), "no nccl.h beside the library");
    let expected = format!(
        "NCCL_LIB_DIR={} without NCCL_INCLUDE_DIR (set it too, or nccl.h is looked for beside it): no nccl.h in {}",
        lib.display(),
        dir.join("elsewhere/include").display()
    );
    assert!(msg.contains(&expected), "{expected:?} missing in:\n{msg}");
    let inc = dir.join("apart/include");
    touch(inc.join("nccl.h"));
    host.vars.remove("NCCL_LIB_DIR");
    host.vars.insert("NCCL_INCLUDE_DIR", inc.clone());
    let msg = not_found(&host, &empty_places(&dir), "no library beside the headers");
    let expected = format!(
        "NCCL_INCLUDE_DIR={} without NCCL_LIB_DIR (set it too, or the library is looked for beside it): \
         nccl.h in {}, but no libnccl.so or libnccl.so.2 in",
        inc.display(),
        inc.display()
    );
    assert!(msg.contains(&expected), "{expected:?} missing in:\n{msg}");
}

#[test]
fn include_and_lib_dirs_named_outright() {
    let dir = scratch("dirs");
    let nccl = nccl_root(&dir.join("nccl"), "libs", "libnccl.so");
    let cuda = cuda_root(&dir.join("cuda"));
    let mut host = Fake::default();
    host.vars.insert("NCCL_INCLUDE_DIR", nccl.join("include"));
    host.vars.insert("NCCL_LIB_DIR", nccl.join("libs"));
    host.vars.insert("CUDA_INCLUDE_DIR", cuda.join("include"));
    let found = find(&host, &empty_places(&dir)).expect("found");
    assert_eq!(found.nccl_include, nccl.join("include"));
    assert_eq!(found.nccl_lib_dir, nccl.join("libs"));
    assert_eq!(found.nccl_lib_file, "libnccl.so");
    assert_eq!(found.nccl_step, Step::NcclDirs);
    assert_eq!(found.nccl_step.to_string(), "NCCL_INCLUDE_DIR/NCCL_LIB_DIR");
    let include = cuda.join("include");
    assert_eq!(
        found.cuda_step,
        variable("CUDA_INCLUDE_DIR", "CUDA_INCLUDE_DIR", &include)
    );
    assert_eq!(
        found.cuda_step.to_string(),
        format!("CUDA_INCLUDE_DIR={}", include.display())
    );
}

#[test]
fn a_pip_layout_through_nccl_home_and_cuda_home() {
    let dir = scratch("pip");
    let site = dir.join("site-packages/nvidia");
    let nccl = nccl_root(&site.join("nccl"), "lib", "libnccl.so.2");
    let cuda = cuda_root(&site.join("cu13"));
    let mut host = Fake::default();
    host.vars.insert("NCCL_HOME", nccl.clone());
    host.vars.insert("CUDA_HOME", cuda.clone());
    let found = find(&host, &empty_places(&dir)).expect("found");
    assert_eq!(found.nccl_lib_dir, nccl.join("lib"));
    assert_eq!(
        found.nccl_lib_file, "libnccl.so.2",
        "only the SONAME exists in a wheel"
    );
    assert_eq!(
        found.cuda_include,
        vec![cuda.join("include"), cuda.join("include/cccl")]
    );
    assert_eq!(found.nccl_step, variable("NCCL_HOME", "NCCL_HOME", &nccl));
    assert_eq!(
        found.nccl_step.to_string(),
        format!("NCCL_HOME={}", nccl.display())
    );
}

#[test]
fn nccl_root_with_a_toolkit_layout() {
    let dir = scratch("root");
    let nccl = nccl_root(&dir.join("nccl"), "lib64", "libnccl.so");
    let cuda = cuda_root(&dir.join("cuda"));
    let mut host = Fake::default();
    host.vars.insert("NCCL_ROOT", nccl.clone());
    host.vars.insert("CUDA_PATH", cuda.clone());
    let found = find(&host, &empty_places(&dir)).expect("found");
    assert_eq!(found.nccl_lib_dir, nccl.join("lib64"));
    assert_eq!(found.cuda_step, variable("CUDA_PATH", "CUDA_PATH", &cuda));
}

#[test]
fn an_explicit_root_beats_ci_setup_which_beats_pkg_config() {
    let dir = scratch("order");
    let places = empty_places(&dir);
    nccl_root(setup(&places.setup_nccl), "lib", "libnccl.so.2");
    cuda_root(setup(&places.setup_cuda));
    let pc = nccl_root(&dir.join("pc"), "lib", "libnccl.so");
    let mut host = Fake::default();
    host.pkgs.insert(
        "nccl",
        PkgConfig {
            include_paths: vec![pc.join("include")],
            link_paths: vec![pc.join("lib")],
        },
    );
    let found = find(&host, &places).expect("found");
    assert_eq!(
        (found.nccl_step, found.cuda_step),
        (Step::Setup, Step::Setup)
    );

    let home = nccl_root(&dir.join("home"), "lib", "libnccl.so.2");
    host.vars.insert("NCCL_HOME", home.clone());
    assert_eq!(
        find(&host, &places).expect("found").nccl_include,
        home.join("include")
    );
}

#[test]
fn pkg_config_for_nccl_and_cuda() {
    let dir = scratch("pc");
    let nccl = nccl_root(&dir.join("nccl"), "lib", "libnccl.so");
    let cuda = cuda_root(&dir.join("cuda"));
    let mut host = Fake::default();
    host.pkgs.insert(
        "nccl",
        PkgConfig {
            include_paths: vec![nccl.join("include")],
            link_paths: vec![nccl.join("lib")],
        },
    );
    host.pkgs.insert(
        "cuda-13.0",
        PkgConfig {
            include_paths: vec![cuda.join("include")],
            link_paths: vec![],
        },
    );
    let found = find(&host, &empty_places(&dir)).expect("found");
    assert_eq!(
        (found.nccl_step, found.cuda_step),
        (
            Step::PkgConfig("nccl".into()),
            Step::PkgConfig("cuda-13.0".into())
        )
    );
    assert_eq!(found.nccl_lib_dir, nccl.join("lib"));
}

#[test]
fn a_header_without_its_library_is_not_taken() {
    let dir = scratch("nolib");
    let places = empty_places(&dir);
    touch(dir.join("half/include/nccl.h"));
    let system = nccl_root(&dir.join("sys"), "lib", "libnccl.so.2");
    let places = Places {
        system_include: system.join("include"),
        system_lib: system.join("lib"),
        ..places
    };
    let mut host = Fake::default();
    host.vars.insert("NCCL_HOME", dir.join("half"));
    host.vars.insert("CUDA_HOME", cuda_root(&dir.join("cuda")));
    let found = find(&host, &places).expect("the system's complete install");
    assert_eq!(found.nccl_step, Step::System);

    let places = Places {
        system_include: dir.join("none"),
        ..places
    };
    let msg = not_found(&host, &places, "only half an install");
    assert!(
        msg.contains("but no libnccl.so or libnccl.so.2 in"),
        "{msg}"
    );
    assert!(
        !msg.contains("nor the CUDA headers"),
        "CUDA was found: {msg}"
    );
}

#[test]
fn a_variable_that_names_no_installation_is_passed_over_with_a_warning() {
    let dir = scratch("passed");
    let places = empty_places(&dir);
    nccl_root(setup(&places.setup_nccl), "lib", "libnccl.so.2");
    cuda_root(setup(&places.setup_cuda));
    let mut host = Fake::default();
    host.vars.insert("NCCL_HOME", dir.join("typo"));
    let found = find(&host, &places).expect("ci/setup's folder");
    assert_eq!(found.nccl_step, Step::Setup);
    let typo = dir.join("typo");
    assert_eq!(
        found.passed_over,
        vec![Miss {
            step: variable("NCCL_HOME", "NCCL_HOME", &typo),
            why: Why::NoHeader {
                header: "nccl.h",
                dirs: vec![typo.join("include")],
            },
        }]
    );
    assert_eq!(
        found.passed_over[0].to_string(),
        format!(
            "NCCL_HOME={}: no nccl.h in {}",
            typo.display(),
            typo.join("include").display()
        )
    );
    host.vars.clear();
    assert!(find(&host, &places).expect("found").passed_over.is_empty());

    // CUDA_HOME that serves the CUDA headers is not passed over because it holds no nccl.h (a toolkit
    // beside NCCL installed elsewhere, as NVIDIA's apt packages do).
    let dir = scratch("toolkit");
    let places = empty_places(&dir);
    touch(places.system_include.join("nccl.h"));
    touch(places.system_lib.join("libnccl.so.2"));
    let toolkit = cuda_root(&dir.join("cuda-12"));
    host.vars.insert("CUDA_HOME", toolkit.clone());
    let found = find(&host, &places).expect("found");
    assert_eq!(found.nccl_step, Step::System);
    assert_eq!(found.cuda_include[0], toolkit.join("include"));
    assert!(found.passed_over.is_empty(), "{:?}", found.passed_over);
}

/// pip's CUDA 12 wheels under `site-packages/nvidia`: cuda.h, crt/ and nv/target each in its own package.
fn cuda12_pip(nvidia: &Path) -> [PathBuf; 3] {
    touch(nvidia.join("cuda_runtime/include/cuda.h"));
    touch(nvidia.join("cuda_nvcc/include/crt/host_defines.h"));
    touch(nvidia.join("cuda_cccl/include/nv/target"));
    ["cuda_runtime", "cuda_nvcc", "cuda_cccl"].map(|p| nvidia.join(p).join("include"))
}

#[test]
fn cuda_12_pip_wheels_are_found_from_one_variable() {
    let dir = scratch("cu12");
    let places = empty_places(&dir);
    nccl_root(setup(&places.setup_nccl), "lib", "libnccl.so.2");
    let nvidia = dir.join("site-packages/nvidia");
    let expected = cuda12_pip(&nvidia);
    // The wheels' common folder, or the runtime's own: the same three include folders.
    for home in [nvidia.clone(), nvidia.join("cuda_runtime")] {
        let mut host = Fake::default();
        host.vars.insert("CUDA_HOME", home.clone());
        let found = find(&host, &places).expect("found");
        assert_eq!(found.cuda_include, expected, "CUDA_HOME={}", home.display());
        assert_eq!(found.cuda_step, variable("CUDA_HOME", "CUDA_HOME", &home));
    }
    // CUDA 13's single package, from the same common folder.
    let cu13 = cuda_root(&dir.join("site13/nvidia/cu13"));
    let mut host = Fake::default();
    host.vars.insert("CUDA_PATH", dir.join("site13/nvidia"));
    assert_eq!(
        find(&host, &places).expect("found").cuda_include,
        vec![cu13.join("include"), cu13.join("include/cccl")]
    );
}

/// Places as the build script makes them for `target` on an x86_64 build machine, in a checkout whose
/// `.deps/` is `deps`.
fn places_in(deps: &Path, target: &str) -> Places {
    Places::new(Some(deps), PINNED, target, "x86_64-unknown-linux-gnu")
}

/// Places as the build script makes them for `target` on an x86_64 build machine, in a checkout at /repo.
fn places_for(target: &str) -> Places {
    places_in(Path::new("/repo/.deps"), target)
}

/// Places for a cross-build to aarch64 on x86_64, with the fixed folders empty under `dir`.
fn aarch64_places(dir: &Path) -> Places {
    let cross = places_for("aarch64-unknown-linux-gnu");
    Places {
        target: cross.target,
        cuda_target: cross.cuda_target,
        native: cross.native,
        ..empty_places(dir)
    }
}

#[test]
fn a_cross_build_takes_the_targets_folders() {
    let native = places_for("x86_64-unknown-linux-gnu");
    assert_eq!(native.system_lib, Path::new("/usr/lib/x86_64-linux-gnu"));
    assert_eq!(
        native.setup_nccl,
        Some(PathBuf::from(format!(
            "/repo/.deps/nccl-{PINNED}/nvidia/nccl"
        )))
    );
    assert_eq!(native.cuda_target, "x86_64-linux");
    let cross = places_for("aarch64-unknown-linux-gnu");
    assert_eq!(cross.system_lib, Path::new("/usr/lib/aarch64-linux-gnu"));
    assert_eq!(
        cross.setup_nccl,
        Some(PathBuf::from(format!(
            "/repo/.deps/aarch64-unknown-linux-gnu/nccl-{PINNED}/nvidia/nccl"
        )))
    );
    let deps = scratch("cross-deps");
    std::fs::create_dir_all(deps.join("cuda-13.0/nvidia")).expect("mkdir");
    assert_eq!(
        places_in(&deps, "aarch64-unknown-linux-gnu").setup_cuda,
        places_in(&deps, "x86_64-unknown-linux-gnu").setup_cuda,
        "headers are the same for every target"
    );
    assert_eq!(cross.cuda_target, "sbsa-linux");
    assert!(!cross.native);

    // A toolkit root with both architectures: the target's folder, never the build machine's lib64/.
    let dir = scratch("cross");
    let places = aarch64_places(&dir);
    let toolkit = dir.join("cuda");
    touch(toolkit.join("lib64/libnccl.so.2"));
    touch(toolkit.join("include/cuda.h"));
    touch(toolkit.join("include/nccl.h"));
    let mut host = Fake::default();
    host.vars.insert("CUDA_HOME", toolkit.clone());
    let msg = not_found(&host, &places, "only x86_64's libnccl");
    assert!(
        msg.contains("but no libnccl.so or libnccl.so.2 in"),
        "{msg}"
    );
    let sbsa = toolkit.join("targets/sbsa-linux");
    touch(sbsa.join("lib/libnccl.so.2"));
    touch(sbsa.join("include/cuda.h"));
    let found = find(&host, &places).expect("the target's folder");
    assert_eq!(found.nccl_lib_dir, sbsa.join("lib"));
    assert_eq!(found.cuda_include, vec![sbsa.join("include")]);
}

#[test]
fn a_variable_for_the_target_beats_the_plain_one() {
    let dir = scratch("target-vars");
    let places = aarch64_places(&dir);
    let plain = nccl_root(&dir.join("plain"), "lib", "libnccl.so.2");
    let cuda = cuda_root(&dir.join("cuda"));
    // cc's forms, then openssl-sys's.
    for form in [
        "NCCL_HOME_aarch64_unknown_linux_gnu",
        "NCCL_HOME_aarch64-unknown-linux-gnu",
        "AARCH64_UNKNOWN_LINUX_GNU_NCCL_HOME",
    ] {
        let arm = nccl_root(&dir.join(form), "lib", "libnccl.so.2");
        let mut host = Fake::default();
        host.vars.insert("NCCL_HOME", plain.clone());
        host.vars.insert(form, arm.clone());
        host.vars
            .insert("CUDA_HOME_aarch64_unknown_linux_gnu", cuda.clone());
        let found = find(&host, &places).expect("found");
        assert_eq!(found.nccl_include, arm.join("include"));
        assert_eq!(found.nccl_step, variable("NCCL_HOME", form, &arm));
        assert_eq!(
            found.cuda_step,
            variable("CUDA_HOME", "CUDA_HOME_aarch64_unknown_linux_gnu", &cuda)
        );
    }
    // Another target's variable is not this one's.
    let mut host = Fake::default();
    host.vars.insert("NCCL_HOME", plain.clone());
    host.vars
        .insert("NCCL_HOME_x86_64_unknown_linux_gnu", dir.join("x86"));
    host.vars
        .insert("X86_64_UNKNOWN_LINUX_GNU_NCCL_HOME", dir.join("x86"));
    host.vars.insert("CUDA_HOME", cuda);
    assert_eq!(
        find(&host, &places).expect("found").nccl_include,
        plain.join("include")
    );
}

/// ci/setup's CUDA headers are the newest `cuda-<version>` it installed (by version, not by name), and
/// none where it installed none.
#[test]
fn ci_setups_newest_cuda_headers_are_searched() {
    let deps = scratch("setup-cuda");
    assert_eq!(
        places_in(&deps, "x86_64-unknown-linux-gnu").setup_cuda,
        None
    );
    for version in ["12.4", "12.9", "13.10", "13.9"] {
        std::fs::create_dir_all(deps.join(format!("cuda-{version}/nvidia"))).expect("mkdir");
    }
    std::fs::create_dir_all(deps.join("cuda-unknown/nvidia")).expect("mkdir");
    assert_eq!(
        places_in(&deps, "x86_64-unknown-linux-gnu").setup_cuda,
        Some(deps.join("cuda-13.10/nvidia"))
    );
    assert_eq!(find::cuda_version("cuda-12.9"), Some(vec![12, 9]));
    assert_eq!(find::cuda_version("cuda-12.x"), None);
    assert_eq!(find::cuda_version("nccl-2.29.7"), None);

    // The CUDA 12 wheels' layout under that root serves too.
    let places = Places {
        setup_cuda: Some(deps.join("cuda-12.9/nvidia")),
        ..empty_places(&deps)
    };
    nccl_root(setup(&places.setup_nccl), "lib", "libnccl.so.2");
    let expected = cuda12_pip(&deps.join("cuda-12.9/nvidia"));
    let found = find(&Fake::default(), &places).expect("found");
    assert_eq!(found.cuda_step, Step::Setup);
    assert_eq!(found.cuda_include, expected);
}
