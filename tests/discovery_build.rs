//! Real builds of the crate, copied outside this checkout (so ci/setup's .deps/ is not beside it, as for a
//! user of the published crate), finding the headers each way a user would point at them; then the
//! example runs and says which way it was. Also: nothing to find fails with the one message, and a second
//! identical build does not run the build script (bindgen) again.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use metrale_gpu_sys::version::build_info::PINNED_NCCL;
use metrale_gpu_sys::version::NcclVersion;
use metrale_gpu_sys_build::find::{self, Host, PkgConfig, Places};
use metrale_gpu_testkit::deps::nccl_in;
use metrale_gpu_testkit::skip::skip;

const REPO: &str = env!("CARGO_MANIFEST_DIR");

fn deps() -> PathBuf {
    Path::new(REPO).join(".deps")
}

/// An environment with no variable set and no pkg-config package: where the build finds what ci/setup
/// installed.
struct Bare;

impl Host for Bare {
    fn var(&self, _: &str) -> Option<PathBuf> {
        None
    }
    fn pkg_config(&self, name: &str) -> Result<PkgConfig, String> {
        Err(format!("no {name} here"))
    }
    fn pkg_config_cuda_names(&self) -> Vec<String> {
        Vec::new()
    }
}

/// What ci/setup installed for this build machine, as the build's discovery finds it: the pinned NCCL's
/// root, the CUDA headers' folder (holding include/cuda.h) and their `cuda-<version>` name.
fn setup() -> (PathBuf, PathBuf, String) {
    let host = std::env::consts::ARCH.to_string() + "-unknown-linux-gnu";
    let places = Places::new(Some(&deps()), PINNED_NCCL, &host, &host);
    let found = find::find(&Bare, &places).unwrap_or_else(|e| panic!("run ci/setup first:\n{e}"));
    let headers = found.cuda_include[0].parent().expect("the headers' root");
    let cuda = places.setup_cuda.as_deref().expect("ci/setup's CUDA root");
    let name = cuda
        .parent()
        .and_then(Path::file_name)
        .and_then(|n| n.to_str())
        .expect("cuda-<version>");
    (
        found
            .nccl_lib_dir
            .parent()
            .expect("the NCCL root")
            .to_path_buf(),
        headers.to_path_buf(),
        name.to_string(),
    )
}

/// An NCCL under .deps/ other than the pinned one, older where there is one, and its library folder.
fn other_nccl() -> Option<(NcclVersion, PathBuf)> {
    nccl_in(&deps())
        .into_iter()
        .rev()
        .find(|(v, _)| v.to_string() != PINNED_NCCL)
}

/// Where this test binary's scratch crates and their builds go: inside its own target directory, so that
/// runs from other target directories (and their cached fingerprints) never meet.
fn scratch(name: &str) -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(name)
}

/// The target directory every scratch crate builds in (one, so that the dependencies build once).
fn scratch_target() -> PathBuf {
    scratch("discovery-build-target")
}

/// The package's build inputs, copied to a directory of their own, as a workspace of its own.
fn copy_crate(to: &Path) {
    let _ = std::fs::remove_dir_all(to);
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in [
        "wrapper.h",
        "Cargo.lock",
        "build",
        "src",
        "shim",
        "examples",
        "crates/build-support",
    ] {
        copy(&Path::new(REPO).join(entry), &to.join(entry));
    }
    let manifest = std::fs::read_to_string(Path::new(REPO).join("Cargo.toml")).expect("Cargo.toml");
    // The copy is a workspace of its own (an empty `[workspace]`: no systest, testkit or bench), without the
    // dev-dependencies that live in those members, as the published crate is.
    let mut kept = Vec::new();
    let mut dropped = false;
    for line in manifest.lines() {
        if line.starts_with('[') {
            dropped = ["[workspace]", "[dev-dependencies]"].contains(&line.trim());
            if line.trim() == "[workspace]" {
                kept.push(line);
            }
        }
        if !dropped {
            kept.push(line);
        }
    }
    std::fs::write(to.join("Cargo.toml"), kept.join("\n")).expect("write Cargo.toml");
}

fn copy(from: &Path, to: &Path) {
    if from.is_dir() {
        std::fs::create_dir_all(to).expect("mkdir");
        for entry in std::fs::read_dir(from).expect("read_dir").flatten() {
            copy(&entry.path(), &to.join(entry.file_name()));
        }
    } else {
        std::fs::copy(from, to).unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
    }
}

/// `cargo build --example nccl_info` of the copy with exactly `vars` set among the discovery variables.
fn build(krate: &Path, vars: &[(&str, PathBuf)], verbose: bool) -> Output {
    let args = ["build", "--example", "nccl_info", "-v"];
    cargo(krate, &args[..if verbose { 4 } else { 3 }], vars)
}

/// `cargo <args>` on the copy, offline, with this repository's Cargo.lock: its versions, less what only
/// the workspace's other members use (proptest's dependencies, say), which cargo drops from the copy's
/// lock (so not `--locked`, which refuses that).
fn cargo(krate: &Path, args: &[&str], vars: &[(&str, PathBuf)]) -> Output {
    cargo_command(krate, args, vars)
        .output()
        .expect("run cargo")
}

/// `cargo <args>` on a scratch crate or workspace, offline, with exactly `vars` set among the variables the
/// build reads.
fn cargo_command(krate: &Path, args: &[&str], vars: &[(&str, PathBuf)]) -> Command {
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args(args)
        .args(["--offline", "--manifest-path"])
        .arg(krate.join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", scratch_target());
    for var in [
        "NCCL_INCLUDE_DIR",
        "NCCL_LIB_DIR",
        "NCCL_HOME",
        "NCCL_ROOT",
        "CUDA_HOME",
        "CUDA_PATH",
        "CUDA_INCLUDE_DIR",
        "PKG_CONFIG_PATH",
        "DOCS_RS",
        "LIBCLANG_PATH",
        "RUSTDOCFLAGS",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in vars {
        cmd.env(k, v);
    }
    cmd
}

fn run_example(expect_found_by: &[&str]) {
    let exe = scratch_target().join("debug/examples/nccl_info");
    let out = Command::new(&exe)
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .expect("run nccl_info");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "nccl_info failed:\n{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for found in expect_found_by {
        assert!(
            stdout.contains(&format!("found by {found}")),
            "expected 'found by {found}' in:\n{stdout}"
        );
    }
    assert!(stdout.contains("same as the headers"), "{stdout}");
}

fn ok(out: &Output, what: &str) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{what}: the build failed:\n{stderr}");
    stderr
}

#[test]
fn each_way_of_finding_the_headers_builds_and_runs() {
    let dir = scratch("discovery-build");
    let krate = dir.join("crate");
    copy_crate(&krate);
    let (nccl, cuda, cuda_name) = setup();

    // Nothing to find: one message, no panic, no clang errors. The copy is a published crate's: no ci/setup
    // to run, so the message offers NVIDIA's wheels and the variables.
    let out = build(&krate, &[], false);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "built without headers?");
    assert!(
        stderr.contains("metrale-gpu-sys could not find NCCL"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("pip install nvidia-nccl-cu13=={PINNED_NCCL}"))
            && stderr.contains("NCCL_HOME=")
            && !stderr.contains("ci/setup"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("panicked") && !stderr.contains("fatal error"),
        "{stderr}"
    );

    // A pip layout, through NCCL_HOME and CUDA_HOME.
    let pip = [("NCCL_HOME", nccl.clone()), ("CUDA_HOME", cuda.clone())];
    ok(&build(&krate, &pip, false), "NCCL_HOME + CUDA_HOME");
    run_example(&[
        &format!("NCCL_HOME={}", nccl.display()),
        &format!("CUDA_HOME={}", cuda.display()),
    ]);

    // The same again: nothing changed, so the build script (and bindgen) must not run.
    let stderr = ok(&build(&krate, &pip, true), "no-op rebuild");
    assert!(stderr.contains("Fresh metrale-gpu-sys"), "{stderr}");
    assert!(
        !stderr.contains("build-script-build`"),
        "the build script ran again:\n{stderr}"
    );

    // The directories named outright.
    let dirs = [
        ("NCCL_INCLUDE_DIR", nccl.join("include")),
        ("NCCL_LIB_DIR", nccl.join("lib")),
        ("CUDA_INCLUDE_DIR", cuda.join("include")),
    ];
    ok(
        &build(&krate, &dirs, false),
        "NCCL_INCLUDE_DIR + NCCL_LIB_DIR",
    );
    run_example(&["NCCL_INCLUDE_DIR/NCCL_LIB_DIR", "CUDA_INCLUDE_DIR"]);

    // pkg-config files such as a distribution would ship.
    let pc = dir.join("pkgconfig");
    std::fs::create_dir_all(&pc).expect("mkdir");
    let nccl_pc = format!(
        "includedir={}\nlibdir={}\n\nName: nccl\nDescription: NVIDIA NCCL\nVersion: {PINNED_NCCL}\nCflags: -I${{includedir}}\nLibs: -L${{libdir}} -lnccl\n",
        nccl.join("include").display(),
        nccl.join("lib").display()
    );
    std::fs::write(pc.join("nccl.pc"), nccl_pc).expect("nccl.pc");
    let cuda_pc = format!(
        "cudaroot={}\n\nName: cuda\nDescription: CUDA headers\nVersion: {}\nCflags: -I${{cudaroot}}/include\nLibs:\n",
        cuda.display(),
        cuda_name.trim_start_matches("cuda-")
    );
    std::fs::write(pc.join(format!("{cuda_name}.pc")), cuda_pc).expect("cuda .pc");
    ok(
        &build(&krate, &[("PKG_CONFIG_PATH", pc)], false),
        "pkg-config",
    );
    run_example(&["pkg-config nccl", &format!("pkg-config {cuda_name}")]);
}

#[test]
fn docs_rs_mode_documents_every_item_without_any_header() {
    let krate = scratch("docs-rs/crate");
    copy_crate(&krate);
    // No variable points anywhere and the copy has no .deps/: only the snapshot is there.
    let vars = [
        ("DOCS_RS", PathBuf::from("1")),
        ("RUSTDOCFLAGS", PathBuf::from("-D warnings")),
    ];
    ok(
        &cargo(&krate, &["doc", "--no-deps", "--lib"], &vars),
        "DOCS_RS=1 cargo doc",
    );
    let doc = scratch_target().join("doc/metrale_gpu_sys");
    for (page, text) in [
        ("bindings/fn.ncclAllReduce.html", "All-Reduce"),
        ("bindings/fn.ncclCommInitRankConfig.html", "configuration"),
        (
            "bindings/struct.ncclConfig_v22800.html",
            "Communicator configuration",
        ),
        ("bindings/struct.ncclResult_t.html", "ncclInProgress"),
        ("nccl/fn.check_nccl.html", "ncclGetErrorString"),
        ("nccl/fn.stream_ready.html", "CUDA_ERROR_NOT_READY"),
        ("cuda/struct.DriverApi.html", "cuStreamQuery"),
    ] {
        let html =
            std::fs::read_to_string(doc.join(page)).unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(html.contains(text), "{page} lacks {text:?}");
    }
}

#[test]
fn bundled_bindings_need_no_libclang_but_the_same_nccl() {
    let krate = scratch("bundled/crate");
    copy_crate(&krate);
    let (nccl, cuda, _) = setup();
    // A libclang that cannot load: bindgen must not run at all.
    let vars = [
        ("NCCL_HOME", nccl),
        ("CUDA_HOME", cuda.clone()),
        ("LIBCLANG_PATH", PathBuf::from("/nonexistent")),
    ];
    let args = [
        "build",
        "--example",
        "nccl_info",
        "--no-default-features",
        "--features",
        "bundled-bindings",
    ];
    ok(&cargo(&krate, &args, &vars), "bundled-bindings");

    let Some((other, other_lib)) = other_nccl() else {
        return skip(format_args!(
            "no NCCL but the pinned {PINNED_NCCL} under .deps/ (`ci/setup 2.28.9`): no other headers to refuse"
        ));
    };
    let other_root = other_lib.parent().expect("the library folder's root");
    let vars = [("NCCL_HOME", other_root.to_path_buf()), ("CUDA_HOME", cuda)];
    let out = cargo(&krate, &args, &vars);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "the {PINNED_NCCL} snapshot must not build against {other} headers"
    );
    let refusal = format!(
        "the bundled bindings (feature `bundled-bindings`) are NCCL {PINNED_NCCL}'s, but the headers found \
         are {other}"
    );
    assert!(stderr.contains(&refusal), "{stderr}");
}

/// A copy of the crate in scratch `name`, and the variables that build it against the pinned nccl.h as
/// `patch` rewrites it (with the pinned library and CUDA 13 headers).
fn crate_with_patched_header(
    name: &str,
    patch: impl Fn(&str) -> String,
) -> (PathBuf, [(&'static str, PathBuf); 3]) {
    let dir = scratch(name);
    let krate = dir.join("crate");
    copy_crate(&krate);
    let (nccl, cuda, _) = setup();
    let include = dir.join("include");
    std::fs::create_dir_all(&include).expect("mkdir");
    let header = std::fs::read_to_string(nccl.join("include/nccl.h")).expect("nccl.h");
    let patched = patch(&header);
    assert_ne!(patched, header, "the patch changed nothing in nccl.h");
    std::fs::write(include.join("nccl.h"), patched).expect("write nccl.h");
    let vars = [
        ("NCCL_INCLUDE_DIR", include),
        ("NCCL_LIB_DIR", nccl.join("lib")),
        ("CUDA_HOME", cuda),
    ];
    (krate, vars)
}

/// The stderr of a `bundled-bindings` build against the pinned nccl.h as `patch` rewrites it, which must fail.
fn refused_bundled_build(name: &str, patch: impl Fn(&str) -> String) -> String {
    let (krate, vars) = crate_with_patched_header(name, patch);
    // The snapshot alone: beside the default `bindgen`, bindgen's output would be used instead.
    let args = [
        "build",
        "--lib",
        "--no-default-features",
        "--features",
        "bundled-bindings",
    ];
    let out = cargo(&krate, &args, &vars);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "built the snapshot against a patched ncclConfig_t ({name}):\n{stderr}"
    );
    stderr
}

/// What the refusal says whichever struct or field differs: the layout it expected, and the way out.
fn expected_refusal() -> [String; 4] {
    // The snapshot's own types: whatever headers this test binary was built against.
    use snapshot::{ncclConfig_t, ncclSimInfo_t};
    [
        "the size and field offsets of the bundled snapshot's Rust type (ncclConfig_t: "
            .to_string(),
        format!("ncclConfig_t: {} bytes, ", size_of::<ncclConfig_t>()),
        format!("ncclSimInfo_t: {} bytes, ", size_of::<ncclSimInfo_t>()),
        "drop the feature".to_string(),
    ]
}

#[test]
fn bundled_bindings_refuse_headers_whose_structs_differ_from_the_snapshot() {
    // The pinned nccl.h with one more field in ncclConfig_t: the same version number, another struct.
    let stderr = refused_bundled_build("bundled-mismatch", |header| {
        header.replacen(
            "} ncclConfig_t;",
            "  int metraleExtraField;\n} ncclConfig_t;",
            1,
        )
    });
    let size = format!(
        "bundled-bindings: sizeof(ncclConfig_t) in the headers found differs from the bundled snapshot's \
         Rust type ({} bytes)",
        size_of::<snapshot::ncclConfig_t>()
    );
    for text in [size].iter().chain(&expected_refusal()) {
        assert!(
            stderr.contains(text.as_str()),
            "expected {text:?} in:\n{stderr}"
        );
    }
}

#[test]
fn bundled_bindings_refuse_a_struct_whose_fields_moved_within_the_same_size() {
    // The pinned nccl.h with two int fields of ncclConfig_t swapped: the same size, other offsets.
    let stderr = refused_bundled_build("bundled-reordered", |header| {
        header.replacen(
            "  int minCTAs;\n  int maxCTAs;\n",
            "  int maxCTAs;\n  int minCTAs;\n",
            1,
        )
    });
    use snapshot::ncclConfig_t;
    let moved = [
        ("minCTAs", std::mem::offset_of!(ncclConfig_t, minCTAs)),
        ("maxCTAs", std::mem::offset_of!(ncclConfig_t, maxCTAs)),
    ]
    .map(|(field, offset)| {
        format!(
            "bundled-bindings: offsetof(ncclConfig_t, {field}) in the headers found differs from the bundled \
             snapshot's Rust type ({offset})"
        )
    });
    for text in moved.iter().chain(&expected_refusal()) {
        assert!(
            stderr.contains(text.as_str()),
            "expected {text:?} in:\n{stderr}"
        );
    }
    for unmoved in [
        "sizeof(ncclConfig_t) in the headers found",
        "offsetof(ncclConfig_t, blocking)",
    ] {
        assert!(
            !stderr.contains(unmoved),
            "{unmoved:?} was refused too:\n{stderr}"
        );
    }
}

/// nccl.h's initializer macros become `Default`s through the shim, which handles `{ sizeof(TYPE), … }`:
/// another form stops the build, naming the macro.
#[test]
fn an_initializer_macro_the_shim_cannot_handle_stops_the_build() {
    // Function-like, and object-like with `sizeof(TYPE)` not first: neither says which struct it is for.
    for (scratch, define, shown) in [
        (
            "initializer-unhandled",
            "#define NCCL_METRALE_TEST_INITIALIZER(v) { v }",
            "NCCL_METRALE_TEST_INITIALIZER(v) as `{ v }`",
        ),
        (
            "initializer-sizeof-second",
            "#define NCCL_METRALE_TEST_INITIALIZER { 0, sizeof(ncclConfig_t) }",
            "NCCL_METRALE_TEST_INITIALIZER as `{ 0, sizeof(ncclConfig_t) }`",
        ),
    ] {
        let (krate, vars) =
            crate_with_patched_header(scratch, |header| format!("{header}\n{define}\n"));
        let out = cargo(&krate, &["build", "--lib"], &vars);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "built with {define:?}");
        for text in [
            &format!("nccl.h defines the initializer macro {shown}"),
            "which the shim cannot turn into a Default",
        ] {
            assert!(stderr.contains(text), "expected {text:?} in:\n{stderr}");
        }
    }
}

/// The committed snapshot the bundled builds use, as Rust sees it (its types only: nothing here is called).
#[allow(
    dead_code,
    unused_imports,
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals
)]
#[allow(
    clippy::useless_transmute,
    clippy::ptr_offset_with_cast,
    clippy::doc_lazy_continuation
)]
mod snapshot {
    include!("../src/snapshot/bindings.rs");
}

/// A dependent that asks for the committed bindings alone compiles no bindgen, nor what bindgen brings
/// (clang-sys, regex, syn, prettyplease); with the default features it does, so the check can fail.
#[test]
fn a_dependent_with_bundled_bindings_alone_compiles_no_bindgen() {
    let dir = scratch("bundled-dependent");
    let _ = std::fs::remove_dir_all(&dir);
    copy_crate(&dir.join("gpu-sys"));
    let tree = |features: &str| {
        let app = dir.join(format!("app{}", features.len()));
        write(
            &app.join("Cargo.toml"),
            &format!(
                "[package]\nname = \"app\"\nversion = \"0.0.0\"\nedition = \"2021\"\npublish = false\n\n\
                 [dependencies]\nmetrale-gpu-sys = {{ path = \"../gpu-sys\"{features} }}\n\n[workspace]\n"
            ),
        );
        write(&app.join("src/lib.rs"), "");
        std::fs::copy(Path::new(REPO).join("Cargo.lock"), app.join("Cargo.lock"))
            .expect("Cargo.lock");
        let args = [
            "tree",
            "-e",
            "normal,build",
            "--prefix",
            "none",
            "--format",
            "{p}",
        ];
        let out = cargo_command(&app, &args, &[])
            .output()
            .expect("run cargo tree");
        ok(&out, "cargo tree");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let crates = |tree: &str| -> Vec<String> {
        let mut names: Vec<String> = tree
            .lines()
            .filter_map(|l| l.split(' ').next())
            .map(String::from)
            .collect();
        names.sort();
        names.dedup();
        names
    };
    let bindgen_and_its = [
        "bindgen",
        "clang-sys",
        "regex",
        "syn",
        "prettyplease",
        "quote",
        "proc-macro2",
    ];
    let bundled = crates(&tree(
        ", default-features = false, features = [\"bundled-bindings\"]",
    ));
    assert!(
        bundled.iter().any(|c| c == "metrale-gpu-sys"),
        "{bundled:?}"
    );
    for name in bindgen_and_its {
        assert!(
            !bundled.iter().any(|c| c == name),
            "bundled-bindings alone compiles {name}: {bundled:?}"
        );
    }
    let default = crates(&tree(""));
    for name in bindgen_and_its {
        assert!(
            default.iter().any(|c| c == name),
            "the default features compile no {name}? {default:?}"
        );
    }
}

/// A file of a scratch package, its folders made.
fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// A scratch workspace of dependents of a copy of the crate (beside it, not in it: a workspace of its own, as a
/// registry crate is): `middle`, a library of NCCL calls on the default features; `plain`, a binary on
/// `middle`; `linked` and `recipe`, the same binary on feature `link`, `recipe` with the README's build.rs
/// recipe: each calls `ncclCommGrow` (2.29+) first, then prints the library's version, or why there is
/// none with exit status 3. And `both`, on `bindgen` and `bundled-bindings` at once, which prints the
/// headers' and the library's versions.
fn dependents(name: &str) -> PathBuf {
    let root = scratch(name);
    let _ = std::fs::remove_dir_all(&root);
    copy_crate(&root.join("gpu-sys"));
    let dir = root.join("app");
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::copy(Path::new(REPO).join("Cargo.lock"), dir.join("Cargo.lock")).expect("Cargo.lock");
    write(
        &dir.join("Cargo.toml"),
        "[workspace]\nmembers = [\"middle\", \"plain\", \"linked\", \"recipe\", \"both\"]\nresolver = \"2\"\n",
    );
    let package = |name: &str, deps: &str| {
        format!("[package]\nname = \"{name}\"\nversion = \"0.0.0\"\nedition = \"2021\"\npublish = false\n\n[dependencies]\n{deps}")
    };
    let gpu_sys =
        |features: &str| format!("metrale-gpu-sys = {{ path = \"../../gpu-sys\"{features} }}\n");
    write(
        &dir.join("middle/Cargo.toml"),
        &package("middle", &gpu_sys("")),
    );
    write(
        &dir.join("middle/src/lib.rs"),
        "use metrale_gpu_sys::nccl::*;\n\n\
         pub fn nccl() -> Result<String, GpuError> {\n    \
         metrale_gpu_sys::version::library_version().map(|v| v.to_string())\n}\n\n\
         pub fn grow() -> String {\n    let mut comm: NcclComm = std::ptr::null_mut();\n    \
         // SAFETY: a NULL parent, which NCCL refuses before using anything.\n    \
         let r = unsafe { ncclCommGrow(std::ptr::null_mut(), 2, std::ptr::null(), 0, &mut comm, std::ptr::null_mut()) };\n    \
         match check_nccl(r, \"ncclCommGrow\") {\n        Ok(()) => \"ncclCommGrow: Ok\".into(),\n        \
         Err(e) => format!(\"ncclCommGrow: {e}\"),\n    }\n}\n",
    );
    let main = "fn main() -> std::process::ExitCode {\n    println!(\"{}\", middle::grow());\n    \
                match middle::nccl() {\n        Ok(v) => println!(\"libnccl {v}\"),\n        \
                Err(e) => {\n            println!(\"no libnccl: {e}\");\n            \
                return std::process::ExitCode::from(3);\n        }\n    }\n    \
                std::process::ExitCode::SUCCESS\n}\n";
    let middle = "middle = { path = \"../middle\" }\n";
    let members = [
        ("plain", String::new()),
        ("linked", gpu_sys(", features = [\"link\"]")),
        ("recipe", gpu_sys(", features = [\"link\"]")),
    ];
    for (member, deps) in members {
        write(
            &dir.join(member).join("Cargo.toml"),
            &package(member, &format!("{middle}{deps}")),
        );
        write(&dir.join(member).join("src/main.rs"), main);
    }
    // Without `middle`, whose ncclCommGrow older headers lack.
    write(
        &dir.join("both/Cargo.toml"),
        &package("both", &gpu_sys(", features = [\"bundled-bindings\"]")),
    );
    write(
        &dir.join("both/src/main.rs"),
        "fn main() {\n    let v = metrale_gpu_sys::version::library_version().expect(\"libnccl\");\n    \
         println!(\"headers {}, libnccl {v}\", metrale_gpu_sys::version::NcclVersion::HEADERS);\n}\n",
    );
    dir
}

/// `cargo build -p <package>` of the dependents against the NCCL at `nccl` (a root) and the CUDA headers.
fn build_dependent(dir: &Path, package: &str, nccl: &Path) {
    let vars = [("NCCL_HOME", nccl.to_path_buf()), ("CUDA_HOME", setup().1)];
    let out = cargo_command(dir, &["build", "-p", package], &vars)
        .output()
        .expect("run cargo");
    ok(&out, package);
}

/// A dependent's binary, run with exactly `vars` among the variables that say where libnccl is.
fn run_dependent(bin: &str, vars: &[(&str, &Path)]) -> Output {
    let mut cmd = Command::new(scratch_target().join("debug").join(bin));
    for var in [
        "LD_LIBRARY_PATH",
        "METRALE_NCCL_LIBRARY",
        "METRALE_NCCL_ALLOW_OLDER",
        "VIRTUAL_ENV",
        "CONDA_PREFIX",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in vars {
        cmd.env(k, v);
    }
    cmd.output().expect("run the dependent's binary")
}

fn text(out: &Output) -> String {
    format!(
        "exit {:?}\n{}{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The pinned NCCL's root under .deps/, and its library folder.
fn pinned_nccl() -> (PathBuf, PathBuf) {
    let (root, _, _) = setup();
    let lib = root.join("lib");
    (root, lib)
}

/// The default features: the binary does not name libnccl (no DT_NEEDED); with no libnccl anywhere it
/// starts, and its first NCCL call fails with the search; the variable points it at the pinned library,
/// where it runs, or at an older one, where the 2.29 call fails naming the function.
#[test]
fn a_default_dependent_starts_anywhere_and_finds_the_library_at_run_time() {
    let (pinned, pinned_lib) = pinned_nccl();
    if let Some(system) = system_libnccl() {
        return skip(format_args!(
            "this machine's dynamic loader finds a libnccl ({system}), so no run can start with no libnccl \
             anywhere"
        ));
    }
    let dir = dependents("dependent-loaded");
    // The build finds NCCL in a folder of links to the pinned one, removed after the build.
    let nccl = dir.join("nccl");
    std::fs::create_dir_all(nccl.join("lib")).expect("mkdir");
    std::os::unix::fs::symlink(pinned.join("include"), nccl.join("include")).expect("symlink");
    let built_lib = nccl.join("lib/libnccl.so.2");
    std::os::unix::fs::symlink(pinned_lib.join("libnccl.so.2"), &built_lib).expect("symlink");
    build_dependent(&dir, "plain", &nccl);

    let exe = scratch_target().join("debug/plain");
    let dynamic = Command::new("readelf")
        .arg("-d")
        .arg(&exe)
        .output()
        .expect("run readelf (binutils)");
    let dynamic = String::from_utf8_lossy(&dynamic.stdout);
    assert!(
        dynamic.contains("(NEEDED)"),
        "readelf printed no dynamic section:\n{dynamic}"
    );
    assert!(
        !dynamic.contains("libnccl"),
        "a default build names libnccl:\n{dynamic}"
    );

    // The build's folder still holds the library: found there.
    let out = run_dependent("plain", &[]);
    assert!(out.status.success(), "{}", text(&out));

    std::fs::remove_file(&built_lib).expect("remove the build's library");
    let out = run_dependent("plain", &[]);
    let all = text(&out);
    assert_eq!(
        out.status.code(),
        Some(3),
        "the program's own status: {all}"
    );
    for expected in [
        "ncclCommGrow: ncclCommGrow needs libnccl, which is unavailable: no libnccl.so.2 could be loaded",
        "1. the process's global scope (LD_PRELOAD, or a library linked into the program): no libnccl",
        "2. METRALE_NCCL_LIBRARY: not set",
        "3. the system's dynamic loader (LD_LIBRARY_PATH, the executable's RUNPATH, the ld cache): ",
        "4. VIRTUAL_ENV: not set",
        "5. CONDA_PREFIX: not set",
        &format!("6. the folder found at build time ({}): no libnccl.so.2 there any more", nccl.join("lib").display()),
        "no libnccl: library_version needs libnccl",
    ] {
        assert!(all.contains(expected), "expected {expected:?} in:\n{all}");
    }
    assert!(!all.contains("panicked"), "{all}");

    let out = run_dependent("plain", &[("METRALE_NCCL_LIBRARY", &pinned_lib)]);
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    assert!(all.contains(&format!("libnccl {}", PINNED_NCCL)), "{all}");
    assert!(!all.contains("lacks"), "{all}");

    let older = nccl_in(&deps())
        .into_iter()
        .rev()
        .find(|(v, _)| v.to_string() != PINNED_NCCL && (v.major, v.minor) < (2, 29));
    let Some((older, older_lib)) = older else {
        return skip(format_args!(
            "no libnccl before 2.29 under .deps/ (`ci/setup 2.28.9`): the missing-function case is not shown"
        ));
    };
    let allow = Path::new("1");
    let out = run_dependent(
        "plain",
        &[
            ("METRALE_NCCL_LIBRARY", &older_lib),
            ("METRALE_NCCL_ALLOW_OLDER", allow),
        ],
    );
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    for expected in [
        &format!("ncclCommGrow: ncclCommGrow failed: the loaded libnccl {older} ("),
        &format!(
            ") lacks ncclCommGrow, which the nccl.h {} this crate was built with declares",
            PINNED_NCCL
        ),
        &format!("libnccl {older}"),
    ] {
        assert!(
            all.contains(expected.as_str()),
            "expected {expected:?} in:\n{all}"
        );
    }
}

/// The libnccl the system's dynamic loader finds on its own (its cache), if any.
fn system_libnccl() -> Option<String> {
    let out = Command::new("ldconfig")
        .arg("-p")
        .output()
        .or_else(|_| Command::new("/sbin/ldconfig").arg("-p").output())
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.contains("libnccl.so.2"))
        .map(|l| l.trim().to_string())
}

/// Feature `link`, by the README's recipe for a binary of a crate that depends on metrale-comm (here
/// `middle`): without the recipe the binary cannot find libnccl at start; with it, it runs.
#[test]
fn a_linked_dependents_binary_runs_without_ld_library_path_by_the_readmes_recipe() {
    let readme = std::fs::read_to_string(Path::new(REPO).join("README.md")).expect("README.md");
    let start = "```rust\n// build.rs of the package that builds the binary";
    let recipe = readme
        .split_once(start)
        .and_then(|(_, rest)| rest.split_once("```"))
        .map(|(body, _)| format!("// build.rs{body}"))
        .unwrap_or_else(|| panic!("README.md has no block starting {start:?}"));
    let dir = dependents("dependent-linked");
    write(&dir.join("recipe/build.rs"), &recipe);
    let (pinned, _) = pinned_nccl();
    build_dependent(&dir, "linked", &pinned);
    build_dependent(&dir, "recipe", &pinned);

    let dynamic = Command::new("readelf")
        .arg("-d")
        .arg(scratch_target().join("debug/linked"))
        .output()
        .expect("run readelf (binutils)");
    assert!(
        String::from_utf8_lossy(&dynamic.stdout).contains("Shared library: [libnccl.so.2]"),
        "{dynamic:?}"
    );
    let linked = run_dependent("linked", &[]);
    assert!(
        !linked.status.success()
            && String::from_utf8_lossy(&linked.stderr)
                .contains("libnccl.so.2: cannot open shared object file"),
        "without the recipe the binary was expected not to find libnccl: {}",
        text(&linked)
    );
    let recipe = run_dependent("recipe", &[]);
    assert!(recipe.status.success(), "{}", text(&recipe));
    assert!(
        String::from_utf8_lossy(&recipe.stdout).ends_with(&format!("libnccl {}\n", PINNED_NCCL)),
        "{}",
        text(&recipe)
    );
}

/// Features are additive: `bundled-bindings` beside the default `bindgen` builds with bindgen's output,
/// shown with headers the snapshot cannot stand for (another NCCL's than the pinned one: with the
/// snapshot, the build would stop on the version).
#[test]
fn bundled_bindings_beside_bindgen_builds_with_bindgens_output() {
    let Some((other, other_lib)) = other_nccl() else {
        return skip(format_args!(
            "no NCCL but the pinned {} under .deps/ (`ci/setup 2.28.9`): both features would build the same",
            PINNED_NCCL
        ));
    };
    let dir = dependents("dependent-both");
    let root = other_lib
        .parent()
        .expect("the library folder's root")
        .to_path_buf();
    build_dependent(&dir, "both", &root);
    let out = run_dependent("both", &[]);
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    assert!(
        all.contains(&format!("headers {other}, libnccl {other}")),
        "{all}"
    );
}
