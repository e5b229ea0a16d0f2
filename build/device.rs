//! NCCL's device API (`nccl_device.h`, NCCL 2.28+): its host functions and the types they take, translated
//! from the installed headers like the rest, and its initializer macros turned into `Default`s.
//!
//! The header is C++ (templates, overloads, `nullptr` in its initializers): a C compiler cannot read it, and
//! NCCL 2.29's `NCCL_HOSTLIB_ONLY` view is gone from later versions. So it is read as C++ by the same tools
//! that read nccl.h as C, each on its own file:
//! - bindgen in C++ mode over `shim/device.h` writes `device.rs`: every non-inline `nccl*` function the
//!   device headers declare (the C-linkage host functions: `ncclDevCommCreate`, `ncclTeamLsa`, …) and the
//!   types they take, recursively. nccl.h's and cuda.h's items are left to `bindings.rs` (the two files
//!   share one module), so nothing is translated twice. `ncclDevComm` is opaque: a kernel takes it by
//!   value and the host never reads it, so it has the C++ compiler's size and alignment and no fields
//!   (its fields name NCCL's internal window struct, which nccl.h leaves opaque).
//! - the C++ preprocessor over the same file finds the initializer macros nccl.h lacks
//!   (`NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER`, `NCCL_COMM_PROPERTIES_INITIALIZER`), and `shim/device.cc`,
//!   compiled as C++, copies their values as `shim/shim.c` does nccl.h's.
//!
//! The functions are loaded at run time per symbol like nccl.h's: `nccl_table.rs` generates their wrappers
//! from `bindings.rs` and `device.rs` together.

use std::path::{Path, PathBuf};

use crate::header::HeaderVersion;
use crate::header::{Initializer, Macros};

/// The C++ wrapper bindgen and the preprocessor read, relative to the crate's root.
pub const WRAPPER: &str = "shim/device.h";
/// The C++ shim that copies the device API's initializer macros.
pub const SHIM: &str = "shim/device.cc";
/// The translation's file in OUT_DIR (included beside `bindings.rs` under `cfg(nccl_device_api)`).
pub const BINDINGS: &str = "device.rs";
/// The C++ standard the headers need (`decltype(auto)`, `if constexpr`).
pub const CXX_STD: &str = "c++17";
/// The first NCCL version with the device API: (major, minor).
const SINCE: (u32, u32) = (2, 28);

/// The device API of the headers found, where they have it.
pub struct Device {
    /// `shim/device.h`: bindgen's input (feature `bindgen`).
    #[cfg_attr(not(feature = "bindgen"), allow(dead_code))]
    pub wrapper: PathBuf,
    /// Its initializer macros that nccl.h lacks.
    pub initializers: Vec<Initializer>,
}

impl Device {
    /// The device API of headers of NCCL 2.28 and newer; `None` for older ones, and (with a warning) for
    /// headers that lack `nccl_device.h` (an install of nccl.h alone); `Err` where its initializers cannot
    /// be read.
    pub fn find(
        manifest_dir: &Path,
        nccl: HeaderVersion,
        nccl_include: &Path,
        include_dirs: &[PathBuf],
        c_initializers: &[Initializer],
        out_dir: &Path,
    ) -> Result<Option<Device>, String> {
        if (nccl.major, nccl.minor) < SINCE {
            return Ok(None);
        }
        let header = nccl_include.join("nccl_device.h");
        if !header.is_file() {
            println!(
                "cargo:warning=metrale-gpu-sys: the NCCL {nccl} headers in {} lack nccl_device.h, which \
                 every NCCL since {}.{} installs beside nccl.h: the bindings leave its device API out. \
                 Install NCCL's whole include folder (pip's nvidia-nccl wheel has it) to have it.",
                nccl_include.display(),
                SINCE.0,
                SINCE.1
            );
            return Ok(None);
        }
        println!("cargo:rerun-if-changed={}", header.display());
        let wrapper = manifest_dir.join(WRAPPER);
        let macros = Macros::of_cplusplus(&wrapper, include_dirs, CXX_STD)?;
        let initializers = macros
            .initializers(out_dir)?
            .into_iter()
            .filter(|i| !c_initializers.iter().any(|c| c.name == i.name))
            .collect();
        Ok(Some(Device {
            wrapper,
            initializers,
        }))
    }

    /// The C++ types the device shim fills, by name.
    pub fn filled(&self) -> Vec<&str> {
        self.initializers
            .iter()
            .map(|i| i.c_type.as_str())
            .collect()
    }

    /// Compiles `shim/device.cc` against the headers found: the device API's initializers, and with
    /// `bundled-bindings` the snapshot's layout checks of their structs. It uses no C++ library (no
    /// exceptions, no RTTI, no allocation), so nothing links libstdc++.
    pub fn compile_shim(
        &self,
        manifest_dir: &Path,
        include_dirs: &[PathBuf],
        out_dir: &Path,
        bundled: bool,
    ) -> Result<(), String> {
        let mut shim = cc::Build::new();
        shim.cpp(true)
            .cpp_link_stdlib(None)
            .std(CXX_STD)
            .flag_if_supported("-fno-exceptions")
            .flag_if_supported("-fno-rtti")
            .file(manifest_dir.join(SHIM))
            .includes(include_dirs)
            .include(out_dir)
            .warnings(true)
            .extra_warnings(true)
            // NCCL_COMM_PROPERTIES_INITIALIZER fills the first three members and leaves the rest zero.
            .flag_if_supported("-Wno-missing-field-initializers")
            // utility.h defines a static helper for kernels that a host compile never calls.
            .flag_if_supported("-Wno-unused-function");
        if bundled {
            shim.define("METRALE_BUNDLED_BINDINGS", None);
        }
        shim.try_compile("metrale_gpu_device_shim").map_err(|e| {
            format!(
                "cannot compile {SHIM} (C++, -std={CXX_STD}) against the device API of {}: {e}\n\
                 The device API's initializers need a C++ compiler for the target (CXX_<target>, or g++); \
                 NCCL's nccl_device.h is C++.",
                include_dirs[0].display()
            )
        })
    }
}

/// bindgen's run over `shim/device.h`, writing `device.rs` (feature `bindgen`).
#[cfg(feature = "bindgen")]
pub mod translate {
    use super::{Device, BINDINGS, CXX_STD};
    use crate::layout::{Fields, Layout, Probe};
    use crate::Inputs;

    /// The options of a C++ run over the device wrapper: the crate's bindgen options, in C++ mode.
    fn builder(inputs: &Inputs, device: &Device) -> bindgen::Builder {
        crate::bindings::options(inputs)
            .header(device.wrapper.to_string_lossy())
            .clang_args(["-x", "c++", &format!("-std={CXX_STD}")])
    }

    /// Writes `device.rs`, leaving out what `bindings` (bindings.rs, as syn reads it) declares; returns it as
    /// syn reads it (for the loaded functions' table) and the layouts of the structs the device shim fills
    /// (for `facts.rs`).
    pub fn generate(
        inputs: &Inputs,
        device: &Device,
        bindings: &syn::File,
    ) -> Result<(syn::File, Vec<Layout>), String> {
        let fields = Fields::default();
        let mut translated = builder(inputs, device)
            .parse_callbacks(Box::new(fields.clone()))
            .allowlist_function("nccl.*")
            // bindings.rs's items (nccl.h's, cuda.h's), in the same module: referred to, not translated
            // again. nccl.h's opaque `ncclWindow_vidmem` stays opaque.
            .blocklist_item(super::declared_names(bindings).join("|"));
        if !device.initializers.is_empty() {
            // The initializers' structs, which no function need take.
            translated = translated.allowlist_type(device.filled().join("|"));
        }
        let text = translated
            .opaque_type("ncclDevComm")
            .generate()
            .map_err(crate::bindings::bindgen_failed)?
            .to_string();
        let path = inputs.out_dir.join(BINDINGS);
        std::fs::write(&path, &text)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        let file = crate::bindings::parse(&text)?;
        let probe = Probe::new("nccl_device.h", &device.filled(), &fields)?;
        let probed = builder(inputs, device)
            .header_contents(Probe::NAME, &probe.header)
            .allowlist_var(Probe::VARS)
            .generate()
            .map_err(crate::bindings::bindgen_failed)?;
        let layouts = probe.read(&crate::bindings::parse(&probed.to_string())?)?;
        Ok((file, layouts))
    }
}

/// The names `file` gives its items (types, constants, functions, statics), as bindgen's regexes match them.
#[cfg(feature = "bindgen")]
fn declared_names(file: &syn::File) -> Vec<String> {
    let mut names = Vec::new();
    for item in &file.items {
        match item {
            syn::Item::Struct(s) => names.push(s.ident.to_string()),
            syn::Item::Union(u) => names.push(u.ident.to_string()),
            syn::Item::Enum(e) => names.push(e.ident.to_string()),
            syn::Item::Type(t) => names.push(t.ident.to_string()),
            syn::Item::Const(c) => names.push(c.ident.to_string()),
            syn::Item::Static(s) => names.push(s.ident.to_string()),
            syn::Item::Fn(f) => names.push(f.sig.ident.to_string()),
            syn::Item::ForeignMod(block) => {
                names.extend(block.items.iter().filter_map(|item| match item {
                    syn::ForeignItem::Fn(f) => Some(f.sig.ident.to_string()),
                    syn::ForeignItem::Static(s) => Some(s.ident.to_string()),
                    _ => None,
                }));
            }
            _ => {}
        }
    }
    names
}
