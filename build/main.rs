//! Finds NCCL and the CUDA headers, translates them with bindgen, compiles the C shim, and links libnccl.
//! The steps, in order: discovery (`metrale_gpu_sys_build::find`, through `host`), `header` (versions and initializer macros, from the C
//! preprocessor), `bindings` (bindgen, feature `bindgen`) or `snapshot` (`bundled-bindings`),
//! `initializers` and the shim (cc), linking.
//! Any failure ends the build with one message on stderr: what is missing, where it looked, how to fix it.

#[cfg(feature = "bindgen")]
mod bindings;
#[cfg(feature = "bindgen")]
mod declared;
mod device;
#[cfg(feature = "bindgen")]
mod driver_table;
mod env;
mod header;
mod host;
mod initializers;
#[cfg(feature = "bindgen")]
mod layout;
#[cfg(feature = "bindgen")]
mod nccl_table;
mod nvcc;
#[cfg(feature = "bindgen")]
mod print;
mod snapshot;

use std::path::{Path, PathBuf};

use header::HeaderVersion;
use host::BuildHost;
use metrale_gpu_sys_build::find;
use snapshot::Snapshot;

/// Minor versions the `nccl_2_<minor>` cfg flags are declared for (see `emit_version`).
const NCCL_MINORS: std::ops::RangeInclusive<u32> = 0..=99;

fn main() {
    if let Err(message) = run() {
        eprintln!("\nerror: {message}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let manifest_dir = PathBuf::from(required("CARGO_MANIFEST_DIR")?);
    let out_dir = PathBuf::from(required("OUT_DIR")?);
    for input in ["build", "wrapper.h", "shim", "src/snapshot"] {
        println!("cargo:rerun-if-changed={input}");
    }

    let snapshot = Snapshot {
        dir: manifest_dir.join("src/snapshot"),
    };
    if env::var("DOCS_RS").is_some() {
        // docs.rs has neither CUDA nor NCCL: document the committed snapshot; nothing to compile or link.
        let (nccl, cuda) = snapshot.install(&out_dir)?;
        emit_version(nccl, cuda, None, &out_dir);
        emit_device_api(snapshot.has_device_api());
        return Ok(());
    }

    // Features are additive: where one crate of the graph asks for bindgen and another for the snapshot,
    // bindgen's translation of the headers found serves both (it is what the snapshot stands in for).
    let bundled =
        env::var("CARGO_FEATURE_BUNDLED_BINDINGS").is_some() && !cfg!(feature = "bindgen");
    if !bundled && !cfg!(feature = "bindgen") {
        return Err(no_bindings());
    }
    let target = required("TARGET")?;
    let host = required("HOST")?;
    // This repository (not a published copy, which lacks ci/setup): ci/setup's folder is searched too.
    let deps = manifest_dir
        .join("ci/setup")
        .is_file()
        .then(|| manifest_dir.join(".deps"));
    let places = find::Places::new(
        deps.as_deref(),
        &pinned_nccl(),
        &target.to_string_lossy(),
        &host.to_string_lossy(),
    );
    let found = find::find(&BuildHost, &places).map_err(|not_found| not_found.to_string())?;
    for skipped in &found.passed_over {
        println!(
            "cargo:warning=metrale-gpu-sys passed over {skipped}; using {}",
            found.nccl_step
        );
    }
    let mut include_dirs = vec![found.nccl_include.clone()];
    include_dirs.extend(found.cuda_include.iter().cloned());
    let macros = header::Macros::of(&manifest_dir.join("wrapper.h"), &include_dirs)?;
    let (nccl, cuda) = (macros.nccl_version()?, macros.cuda_version()?);
    let initializers = macros.initializers(&out_dir)?;
    // The structs the shim fills: one per initializer macro of the headers found.
    let filled: Vec<&str> = initializers.iter().map(|i| i.c_type.as_str()).collect();
    // NCCL 2.28+'s device API (C++): its own initializers and shim.
    let device = device::Device::find(
        &manifest_dir,
        nccl,
        &found.nccl_include,
        &include_dirs,
        &initializers,
        &out_dir,
    )?;

    let mut shim = cc::Build::new();
    // With `bundled-bindings`: what a failed compile of the shim means.
    let bundled_note = if bundled {
        use_snapshot(
            &snapshot,
            (nccl, cuda),
            &found,
            (&filled, device.as_ref()),
            &out_dir,
            &mut shim,
        )?
    } else {
        generate_bindings(&Inputs {
            wrapper: &manifest_dir.join("wrapper.h"),
            shim_header: &manifest_dir.join("shim/shim.h"),
            include_dirs: &include_dirs,
            out_dir: &out_dir,
            nccl,
            cuda,
            filled: &filled,
            device: device.as_ref(),
        })?;
        String::new()
    };
    // After the snapshot's copy: the shim is compiled for the headers found, and the Rust side follows it.
    let device_initializers = device.as_ref().map_or(&[][..], |d| &d.initializers[..]);
    initializers::write(&initializers, device_initializers, &out_dir)?;
    if let Some(device) = &device {
        device.compile_shim(&manifest_dir, &include_dirs, &out_dir, bundled)?;
    }

    shim.file(manifest_dir.join("shim/shim.c"))
        .includes(&include_dirs)
        .include(&out_dir)
        .warnings(true)
        .extra_warnings(true)
        .try_compile("metrale_gpu_shim")
        .map_err(|e| {
            format!(
                "cannot compile shim/shim.c against {}: {e}{bundled_note}",
                found.nccl_include.display()
            )
        })?;
    // The target's C compiler, for tests that build C for the target (tests/driver_contract/).
    println!(
        "cargo:rustc-env=METRALE_TARGET_CC={}",
        shim.get_compiler().path().display()
    );

    if cfg!(feature = "link") {
        link_nccl(&found);
    }
    emit_version(nccl, cuda, Some(&found), &out_dir);
    emit_macros(&macros, &out_dir);
    // The bindings have the device API where bindgen translated it, or the snapshot has it (its
    // nccl_loaded.rs then names its types, whatever the headers found).
    emit_device_api(device.is_some() || (bundled && snapshot.has_device_api()));
    if let Some(device) = &device {
        for initializer in &device.initializers {
            if ASKED_MACROS.contains(&initializer.name.as_str()) {
                println!("cargo:rustc-cfg=nccl_macro=\"{}\"", initializer.name);
            }
        }
        // For dependents (systest's C++ checks, kernels built against the same headers).
        println!(
            "cargo:device_bindings={}",
            out_dir.join(device::BINDINGS).display()
        );
        println!("cargo:device_cxx_std={}", device::CXX_STD);
        if let Some(nvcc) = nvcc::find(&found.cuda_include, cuda, deps.as_deref()) {
            println!("cargo:nvcc={}", nvcc.display());
        }
    }
    Ok(())
}

/// `bundled-bindings`: installs the snapshot where the headers found (`nccl`, `cuda`: their versions) are
/// its NCCL version and CUDA major version, and has the shims' compiles check that each struct they fill
/// (`filled` by shim/shim.c, the device API's by shim/device.cc) has the size and field offsets of the
/// snapshot's Rust type (the same version number does not make the same structs: a patched or mislabelled
/// nccl.h). Returns what a failed compile of the shim then means.
fn use_snapshot(
    snapshot: &Snapshot,
    (nccl, cuda): (HeaderVersion, u32),
    found: &find::Found,
    (filled, device): (&[&str], Option<&device::Device>),
    out_dir: &Path,
    shim: &mut cc::Build,
) -> Result<String, String> {
    // bindgen does not run, so it declares no header: these are what the checks below read.
    println!(
        "cargo:rerun-if-changed={}",
        found.nccl_include.join("nccl.h").display()
    );
    println!(
        "cargo:rerun-if-changed={}",
        found.cuda_include[0].join("cuda.h").display()
    );
    let (bundled, bundled_cuda) = snapshot.install(out_dir)?;
    if bundled_cuda / 1000 != cuda / 1000 {
        return Err(format!(
            "the bundled bindings (feature `bundled-bindings`) were made from CUDA {}.{} headers, but the \
             headers found are CUDA {}.{} ({}): the driver table and the driver version check follow the \
             headers' major version. Point the build at CUDA {} headers (CUDA_HOME), or drop the feature so \
             bindgen translates the headers found.",
            bundled_cuda / 1000,
            bundled_cuda % 1000 / 10,
            cuda / 1000,
            cuda % 1000 / 10,
            found.cuda_include[0].display(),
            bundled_cuda / 1000
        ));
    }
    if bundled != nccl {
        return Err(format!(
            "the bundled bindings (feature `bundled-bindings`) are NCCL {bundled}'s, but the headers found are \
             {nccl} ({}): their structs may differ. Point the build at NCCL {bundled}, or drop the feature so \
             bindgen translates the headers found.",
            found.nccl_include.display()
        ));
    }
    shim.define("METRALE_BUNDLED_BINDINGS", None);
    let (checks, mut summary) = snapshot.layout_checks(filled, "_Static_assert");
    let path = out_dir.join(snapshot::LAYOUT_CHECKS);
    std::fs::write(&path, checks).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    if let Some(device) = device {
        let (checks, device_summary) = snapshot.layout_checks(&device.filled(), "static_assert");
        let path = out_dir.join(snapshot::DEVICE_LAYOUT_CHECKS);
        std::fs::write(&path, checks)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        summary.extend(device_summary);
    }
    Ok(format!(
        "\nWith `bundled-bindings` the shim checks that each struct it fills has the size and field offsets \
         of the bundled snapshot's Rust type ({}); the `_Static_assert` above names the struct or field \
         that differs. These headers are not the ones the snapshot was made from, whatever their version \
         says: drop the feature so that bindgen translates them.",
        summary.join("; ")
    ))
}

/// NCCL's version as the crate's version carries it (`0.1.0+nccl-2.29.7`): the one place it is pinned.
fn pinned_nccl() -> String {
    let version = env!("CARGO_PKG_VERSION");
    version
        .split_once("+nccl-")
        .map_or(String::new(), |(_, v)| v.to_string())
}

fn required(name: &str) -> Result<std::ffi::OsString, String> {
    env::var(name).ok_or_else(|| format!("{name} is not set: run this build script through cargo"))
}

/// What bindgen translates, and where its output goes.
#[cfg_attr(not(feature = "bindgen"), allow(dead_code))]
struct Inputs<'a> {
    /// The device API, where the headers have it (NCCL 2.28+).
    device: Option<&'a device::Device>,
    wrapper: &'a Path,
    shim_header: &'a Path,
    include_dirs: &'a [PathBuf],
    out_dir: &'a Path,
    /// The headers' versions and the structs the shim fills, recorded beside the bindings (`facts.rs`).
    nccl: HeaderVersion,
    cuda: u32,
    filled: &'a [&'a str],
}

#[cfg(feature = "bindgen")]
fn generate_bindings(inputs: &Inputs) -> Result<(), String> {
    bindings::generate(inputs)
}

#[cfg(not(feature = "bindgen"))]
fn generate_bindings(_: &Inputs) -> Result<(), String> {
    Err(no_bindings())
}

/// Why a build with neither `bindgen` nor `bundled-bindings` stops.
fn no_bindings() -> String {
    format!(
        "metrale-gpu-sys has neither of the features that give it bindings: `bindgen` (a default feature: \
         translates the headers found, needs libclang) or `bundled-bindings` (the committed bindings of NCCL \
         {}). Enable one in your Cargo.toml, e.g. `metrale-gpu-sys = {{ version = \"…\", \
         default-features = false, features = [\"bundled-bindings\"] }}`.",
        pinned_nccl()
    )
}

/// Feature `link`: a dynamic link to libnccl (without it, `src/loader/` loads it at run time), by its SONAME where the unversioned link is missing (pip wheels), with a
/// RUNPATH so that this crate's tests and examples run without LD_LIBRARY_PATH (which still overrides it).
fn link_nccl(found: &find::Found) {
    let dir = found.nccl_lib_dir.display();
    println!("cargo:rustc-link-search=native={dir}");
    if found.nccl_lib_file == "libnccl.so" {
        println!("cargo:rustc-link-lib=dylib=nccl");
    } else {
        println!(
            "cargo:rustc-link-lib=dylib:+verbatim={}",
            found.nccl_lib_file
        );
    }
    println!("cargo:rustc-link-arg=-Wl,--enable-new-dtags,-rpath,{dir}");
}

/// Versions for this crate (cfg flags) and for dependents (`DEP_NCCL_*` in their build scripts); where the
/// headers and library are, unless the bindings come from the snapshot alone (docs.rs).
fn emit_version(nccl: HeaderVersion, cuda: u32, found: Option<&find::Found>, out_dir: &Path) {
    let asked: Vec<String> = ASKED_MACROS.iter().map(|m| format!("{m:?}")).collect();
    println!(
        "cargo:rustc-check-cfg=cfg(nccl_macro, values({}))",
        asked.join(", ")
    );
    for minor in NCCL_MINORS {
        println!("cargo:rustc-check-cfg=cfg(nccl_2_{minor})");
        if nccl.major > 2 || (nccl.major == 2 && minor <= nccl.minor) {
            println!("cargo:rustc-cfg=nccl_2_{minor}");
        }
    }
    println!("cargo:version_number={}", nccl.code);
    println!("cargo:version={nccl}");
    println!("cargo:cuda_version={cuda}");
    println!("cargo:bindings={}", out_dir.join("bindings.rs").display());
    println!("cargo:rustc-env=METRALE_PINNED_NCCL={}", pinned_nccl());
    let Some(found) = found else {
        let none = "(none: documentation build from the bundled snapshot)";
        for var in [
            "NCCL_INCLUDE",
            "NCCL_LIB_DIR",
            "NCCL_FOUND_BY",
            "CUDA_INCLUDE",
            "CUDA_FOUND_BY",
        ] {
            println!("cargo:rustc-env=METRALE_{var}={none}");
        }
        return;
    };
    println!("cargo:include={}", found.nccl_include.display());
    println!("cargo:lib_dir={}", found.nccl_lib_dir.display());
    let cuda_include: Vec<String> = found
        .cuda_include
        .iter()
        .map(|d| d.display().to_string())
        .collect();
    println!("cargo:cuda_include={}", cuda_include.join(":"));
    // For the crate's own diagnostics (`version::build_info`).
    println!(
        "cargo:rustc-env=METRALE_NCCL_INCLUDE={}",
        found.nccl_include.display()
    );
    println!(
        "cargo:rustc-env=METRALE_NCCL_LIB_DIR={}",
        found.nccl_lib_dir.display()
    );
    println!("cargo:rustc-env=METRALE_NCCL_FOUND_BY={}", found.nccl_step);
    println!(
        "cargo:rustc-env=METRALE_CUDA_INCLUDE={}",
        found.cuda_include[0].display()
    );
    println!("cargo:rustc-env=METRALE_CUDA_FOUND_BY={}", found.cuda_step);
}

/// The macros the crate's own code asks about with `cfg(nccl_macro = "NAME")`: a name nccl.h may define
/// as a macro instead of a function (2.30+'s `ncclResetDebugInit`), or an initializer only some versions
/// have. Only these are set, and check-cfg accepts no other name, so a misspelt one warns instead of being
/// silently false.
const ASKED_MACROS: &[&str] = &[
    "ncclResetDebugInit",
    "NCCL_COLLCONFIG_INITIALIZER",
    // The device API's (nccl_device.h, 2.29+), found by its C++ preprocessor run (`device.rs`).
    "NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER",
    "NCCL_COMM_PROPERTIES_INITIALIZER",
];

/// `cfg(nccl_macro = "NAME")` for each of [`ASKED_MACROS`] the preprocessor saw. And for dependents
/// (systest): the initializers the shim turned into `Default`s.
fn emit_macros(macros: &header::Macros, out_dir: &Path) {
    for name in ASKED_MACROS.iter().filter(|name| macros.defines(name)) {
        println!("cargo:rustc-cfg=nccl_macro=\"{name}\"");
    }
    println!(
        "cargo:initializers={}",
        out_dir.join(initializers::RUST_FILE).display()
    );
}

/// `cfg(nccl_device_api)`: the bindings include `device.rs`, NCCL 2.28+'s device API.
fn emit_device_api(present: bool) {
    println!("cargo:rustc-check-cfg=cfg(nccl_device_api)");
    if present {
        println!("cargo:rustc-cfg=nccl_device_api");
    }
}
