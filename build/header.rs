//! What the headers found define, as the C preprocessor reports it (`cc -E -dM` over `wrapper.h`, the
//! file bindgen translates), read before bindgen runs: the versions, for cfg flags, metadata and
//! messages, and nccl.h's initializer macros, which the shim turns into `Default`s. Nothing here reads a
//! header's text, nor a macro's body: the preprocessor resolves includes, conditionals and comments, and
//! prints each macro defined at the end as one `#define NAME BODY` line; a second pass expands each
//! initializer in a probe that has the preprocessor itself print the struct it is for.

use std::fmt;
use std::path::{Path, PathBuf};

/// The NCCL version nccl.h declares, as its macros say it: `NCCL_MAJOR`, `NCCL_MINOR`, `NCCL_PATCH` and
/// `NCCL_VERSION_CODE`. For the cfg flags, the metadata and the messages; the crate compares versions
/// with its own `NcclVersion`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
    pub code: u32,
}

impl fmt::Display for HeaderVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

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

/// The macros defined after `wrapper.h`, by name, and how the preprocessor was run to find them.
pub struct Macros {
    /// (name, parameter list for a function-like macro, body).
    defined: Vec<(String, Option<String>, String)>,
    wrapper: PathBuf,
    include_dirs: Vec<PathBuf>,
    /// The C++ standard, where the wrapper is C++ (the device API's); `None` for C.
    cplusplus: Option<&'static str>,
}

impl Macros {
    /// Runs the C preprocessor over `wrapper` with the include directories the build found.
    pub fn of(wrapper: &Path, include_dirs: &[PathBuf]) -> Result<Macros, String> {
        Macros::run(wrapper, include_dirs, None)
    }

    /// Runs the C++ preprocessor (standard `std`) over `wrapper`, a C++ header.
    pub fn of_cplusplus(
        wrapper: &Path,
        include_dirs: &[PathBuf],
        std: &'static str,
    ) -> Result<Macros, String> {
        Macros::run(wrapper, include_dirs, Some(std))
    }

    fn run(
        wrapper: &Path,
        include_dirs: &[PathBuf],
        cplusplus: Option<&'static str>,
    ) -> Result<Macros, String> {
        let output = preprocess(wrapper, include_dirs, &["-dM"], cplusplus)?;
        Ok(Macros {
            defined: Macros::parse(&String::from_utf8_lossy(&output)),
            wrapper: wrapper.to_path_buf(),
            include_dirs: include_dirs.to_vec(),
            cplusplus,
        })
    }

    /// `-dM`'s lines: `#define NAME BODY` or `#define NAME(PARAMS) BODY`.
    fn parse(text: &str) -> Vec<(String, Option<String>, String)> {
        let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_';
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
            .collect()
    }

    fn body(&self, name: &str) -> Option<&str> {
        self.defined
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

    /// `NCCL_MAJOR`, `NCCL_MINOR`, `NCCL_PATCH` and `NCCL_VERSION_CODE`.
    pub fn nccl_version(&self) -> Result<HeaderVersion, String> {
        let field = |name| self.number(name, "NCCL's nccl.h");
        Ok(HeaderVersion {
            major: field("NCCL_MAJOR")?,
            minor: field("NCCL_MINOR")?,
            patch: field("NCCL_PATCH")?,
            code: field("NCCL_VERSION_CODE")?,
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
        self.defined.iter().any(|(n, _, _)| n == name)
    }

    /// Every `NCCL_…_INITIALIZER`, in name order, with the struct it initialises; `Err` names one the shim
    /// cannot turn into a `Default` (function-like, or not `{ sizeof(TYPE), … }`, NCCL's versioned-struct
    /// convention that says which type it is for). `out_dir` takes the preprocessor's probe.
    pub fn initializers(&self, out_dir: &Path) -> Result<Vec<Initializer>, String> {
        let mut macros: Vec<&(String, Option<String>, String)> = self
            .defined
            .iter()
            .filter(|(name, _, _)| name.starts_with("NCCL_") && name.ends_with("_INITIALIZER"))
            .collect();
        macros.sort_by(|a, b| a.0.cmp(&b.0));
        let object_like: Vec<&str> = macros
            .iter()
            .filter(|(_, params, _)| params.is_none())
            .map(|(name, _, _)| name.as_str())
            .collect();
        let types = self.sized_types(&object_like, out_dir)?;
        macros
            .into_iter()
            .map(|(name, params, body)| {
                let c_type = types.iter().find(|(n, _)| n == name).and_then(|(_, t)| t.clone());
                let c_type = c_type.ok_or_else(|| {
                    let params = params.as_ref().map(|p| format!("({p})")).unwrap_or_default();
                    format!(
                        "nccl.h defines the initializer macro {name}{params} as `{body}`, which the shim cannot \
                         turn into a Default: it handles object-like initializers whose first member is \
                         `sizeof(TYPE)` (the struct they initialise). Teach build/header.rs and shim/shim.c \
                         this form, or build against another nccl.h."
                    )
                })?;
                Ok(Initializer {
                    name: name.clone(),
                    c_type,
                    body: body.clone(),
                })
            })
            .collect()
    }

    /// For each of the object-like `initializers`, `TYPE` where its expansion is `{ sizeof(TYPE), … }`,
    /// as the preprocessor finds it: a probe after `wrapper.h` defines `sizeof(TYPE)` as
    /// `, METRALE_SIZEOF TYPE ,`, which makes the operand an argument of its own, and prints the first two
    /// arguments of each expansion on a line of its own. The form is `{` then `METRALE_SIZEOF TYPE`;
    /// anything else is `None`. The preprocessor expands the nested macros, comments and line splices.
    fn sized_types(
        &self,
        initializers: &[&str],
        out_dir: &Path,
    ) -> Result<Vec<(String, Option<String>)>, String> {
        let mut probe = format!(
            "#include \"{}\"\n\
             #define sizeof(type) , METRALE_SIZEOF type ,\n\
             #define METRALE_FIRST_TWO(first, second, ...) first second\n\
             #define METRALE_FIRST_TWO_OF(...) METRALE_FIRST_TWO(__VA_ARGS__, , )\n",
            self.wrapper.display()
        );
        for (i, name) in initializers.iter().enumerate() {
            probe.push_str(&format!(
                "METRALE_INITIALIZER_{i} METRALE_FIRST_TWO_OF({name})\n"
            ));
        }
        let probe_file = match self.cplusplus {
            None => "metrale_initializer_probe.c",
            Some(_) => "metrale_initializer_probe.cc",
        };
        let path = out_dir.join(probe_file);
        std::fs::write(&path, probe)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        let output = preprocess(&path, &self.include_dirs, &["-P"], self.cplusplus)?;
        let output = String::from_utf8_lossy(&output);
        let is_name = |t: &str| {
            !t.is_empty()
                && !t.starts_with(|c: char| c.is_ascii_digit())
                && t.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        };
        Ok(initializers
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let marker = format!("METRALE_INITIALIZER_{i}");
                let c_type = output.lines().find_map(|line| {
                    match line.split_whitespace().collect::<Vec<_>>()[..] {
                        [m, "{", "METRALE_SIZEOF", ty] if m == marker && is_name(ty) => {
                            Some(ty.to_string())
                        }
                        _ => None,
                    }
                });
                (name.to_string(), c_type)
            })
            .collect())
    }
}

/// The preprocessor's output for `file` (`cc -E` with `flags`, or the C++ compiler's with the standard
/// `cplusplus`), with the include directories found.
fn preprocess(
    file: &Path,
    include_dirs: &[PathBuf],
    flags: &[&str],
    cplusplus: Option<&str>,
) -> Result<Vec<u8>, String> {
    let mut build = cc::Build::new();
    build
        .file(file)
        .includes(include_dirs)
        .cargo_metadata(false);
    if let Some(std) = cplusplus {
        build.cpp(true).std(std);
    }
    for flag in flags {
        build.flag(flag);
    }
    build.try_expand().map_err(|e| {
        format!(
            "the C preprocessor failed on {} (with -I {}): {e}",
            file.display(),
            display_dirs(include_dirs)
        )
    })
}

fn display_dirs(dirs: &[PathBuf]) -> String {
    let dirs: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    dirs.join(" -I ")
}
