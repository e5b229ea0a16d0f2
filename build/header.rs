//! Versions read from the headers that were found, before bindgen runs, so the build can name them in
//! cfg flags and metadata (and in its messages) whatever bindgen later makes of them.

use std::path::Path;

use crate::nccl_version::NcclVersion;

/// The version from its three parts, `NCCL_MAJOR`, `NCCL_MINOR` and `NCCL_PATCH`, as `field` reads them.
pub fn read_version(field: impl Fn(&str) -> Result<u32, String>) -> Result<NcclVersion, String> {
    Ok(NcclVersion {
        major: field("NCCL_MAJOR")?,
        minor: field("NCCL_MINOR")?,
        patch: field("NCCL_PATCH")?,
    })
}

/// `NCCL_MAJOR`, `NCCL_MINOR` and `NCCL_PATCH` from `nccl.h`.
pub fn nccl_version(nccl_h: &Path) -> Result<NcclVersion, String> {
    let text = read(nccl_h)?;
    let field = |name: &str| {
        define(&text, name).ok_or_else(|| {
            format!(
                "{} defines no numeric {name}: is it NCCL's nccl.h?",
                nccl_h.display()
            )
        })
    };
    read_version(field)
}

/// `CUDA_VERSION` from `cuda.h` (e.g. 13000 for 13.0).
pub fn cuda_version(cuda_h: &Path) -> Result<u32, String> {
    let text = read(cuda_h)?;
    define(&text, "CUDA_VERSION")
        .ok_or_else(|| format!("{} defines no numeric CUDA_VERSION", cuda_h.display()))
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

/// The value of `#define NAME <number>`.
fn define(text: &str, name: &str) -> Option<u32> {
    text.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        (words.next() == Some("#define") && words.next() == Some(name))
            .then(|| words.next()?.parse().ok())?
    })
}
