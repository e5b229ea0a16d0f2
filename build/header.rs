//! What the headers found define, as the C preprocessor reports it (`cc -E -dM` over `wrapper.h`, the
//! file bindgen translates), read before bindgen runs: the versions, for cfg flags, metadata and
//! messages, and nccl.h's initializer macros, which the shim turns into `Default`s. Nothing here reads a
//! header's text: the preprocessor resolves includes, conditionals and comments, and prints each macro
//! defined at the end as one `#define NAME BODY` line.

use std::path::{Path, PathBuf};

use crate::nccl_version::NcclVersion;

/// An initializer macro of nccl.h (`NCCL_<NAME>_INITIALIZER`) and the struct it initialises.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Initializer {
    /// The macro's name.
    pub name: String,
    /// The C type it initialises: the one whose size its first member is (`sizeof(ncclConfig_t)`).
    pub c_type: String,
    /// Its definition, as the preprocessor prints it (one line, comments removed).
    pub body: String,
}

/// The macros defined after `wrapper.h`, by name: (name, parameter list for a function-like macro, body).
pub struct Macros(Vec<(String, Option<String>, String)>);

impl Macros {
    /// Runs the preprocessor over `wrapper` with the include directories the build found.
    pub fn of(wrapper: &Path, include_dirs: &[PathBuf]) -> Result<Macros, String> {
        let output = cc::Build::new()
            .file(wrapper)
            .includes(include_dirs)
            .flag("-dM")
            .cargo_metadata(false)
            .try_expand()
            .map_err(|e| {
                format!(
                    "the C preprocessor failed on {} (with -I {}): {e}",
                    wrapper.display(),
                    display_dirs(include_dirs)
                )
            })?;
        Ok(Macros::parse(&String::from_utf8_lossy(&output)))
    }

    /// `-dM`'s lines: `#define NAME BODY` or `#define NAME(PARAMS) BODY`.
    fn parse(text: &str) -> Macros {
        let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_';
        Macros(
            text.lines()
                .filter_map(|line| {
                    let rest = line.strip_prefix("#define ")?;
                    let end = rest.find(|c| !is_name(c)).unwrap_or(rest.len());
                    let (name, rest) = rest.split_at(end);
                    let (params, body) = match rest.strip_prefix('(') {
                        Some(rest) => {
                            let (params, body) = rest.split_once(')')?;
                            (Some(params.to_string()), body)
                        }
                        None => (None, rest),
                    };
                    Some((name.to_string(), params, body.trim().to_string()))
                })
                .collect(),
        )
    }

    fn body(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, params, _)| n == name && params.is_none())
            .map(|(_, _, body)| body.as_str())
    }

    /// The value of an object-like macro defined as a plain number.
    fn number(&self, name: &str, header: &str) -> Result<u32, String> {
        let body = self
            .body(name)
            .ok_or_else(|| format!("the headers found define no {name}: is it {header}?"))?;
        body.parse().map_err(|_| {
            format!("{header} defines {name} as `{body}`, not a number: is it {header}?")
        })
    }

    /// `NCCL_MAJOR`, `NCCL_MINOR` and `NCCL_PATCH`.
    pub fn nccl_version(&self) -> Result<NcclVersion, String> {
        let field = |name| self.number(name, "NCCL's nccl.h");
        Ok(NcclVersion {
            major: field("NCCL_MAJOR")?,
            minor: field("NCCL_MINOR")?,
            patch: field("NCCL_PATCH")?,
        })
    }

    /// `CUDA_VERSION` (e.g. 13000 for 13.0).
    pub fn cuda_version(&self) -> Result<u32, String> {
        self.number("CUDA_VERSION", "CUDA's cuda.h")
    }

    /// Whether the headers define `name` as a macro, object-like or function-like: a name nccl.h defines
    /// as a macro is no function to call (2.30+ turns `ncclResetDebugInit` into an empty macro outside
    /// NCCL's own build).
    pub fn defines(&self, name: &str) -> bool {
        self.0.iter().any(|(n, _, _)| n == name)
    }

    /// Every `NCCL_…_INITIALIZER`, in name order, with the struct it initialises; `Err` names one the shim
    /// cannot turn into a `Default` (function-like, or not `{ sizeof(TYPE), … }`, NCCL's versioned-struct
    /// convention that says which type it is for).
    pub fn initializers(&self) -> Result<Vec<Initializer>, String> {
        let mut found = Vec::new();
        for (name, params, body) in &self.0 {
            if !(name.starts_with("NCCL_") && name.ends_with("_INITIALIZER")) {
                continue;
            }
            let c_type = params
                .is_none()
                .then(|| sized_type(body))
                .flatten()
                .ok_or_else(|| {
                    let params = params.as_ref().map(|p| format!("({p})")).unwrap_or_default();
                    format!(
                        "nccl.h defines the initializer macro {name}{params} as `{body}`, which the shim cannot \
                         turn into a Default: it handles object-like initializers whose first member is \
                         `sizeof(TYPE)` (the struct they initialise). Teach build/header.rs and shim/shim.c \
                         this form, or build against another nccl.h."
                    )
                })?;
            found.push(Initializer {
                name: name.clone(),
                c_type,
                body: body.clone(),
            });
        }
        found.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(found)
    }
}

/// `TYPE` of a body `{ sizeof(TYPE), … }`.
fn sized_type(body: &str) -> Option<String> {
    let rest = body
        .strip_prefix('{')?
        .trim_start()
        .strip_prefix("sizeof")?;
    let (ty, _) = rest.trim_start().strip_prefix('(')?.split_once(')')?;
    let ty = ty.trim();
    let ident = !ty.is_empty()
        && !ty.starts_with(|c: char| c.is_ascii_digit())
        && ty.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    ident.then(|| ty.to_string())
}

fn display_dirs(dirs: &[PathBuf]) -> String {
    let dirs: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    dirs.join(" -I ")
}
