//! The committed output of bindgen for the pinned NCCL (`src/snapshot/`, which `ci/regen` writes and
//! `tests/snapshot.rs` guards): installed in place of bindgen's output for docs.rs and `bundled-bindings`,
//! with what the build must check before trusting it against the headers found.

use std::path::{Path, PathBuf};

use crate::header;
use crate::nccl_version::NcclVersion;

pub struct Snapshot {
    pub dir: PathBuf,
}

impl Snapshot {
    const FILES: [&'static str; 3] = ["bindings.rs", "cuda_driver.rs", "initializers.rs"];

    /// Puts the snapshot where bindgen's output would go; returns the NCCL and CUDA versions it was made from.
    pub fn install(&self, out_dir: &Path) -> Result<(NcclVersion, u32), String> {
        for file in Self::FILES {
            let from = self.dir.join(file);
            std::fs::copy(&from, out_dir.join(file)).map_err(|e| {
                format!("cannot copy the bindings snapshot {}: {e}", from.display())
            })?;
        }
        let text = self.bindings()?;
        let field = |name: &str| {
            let prefix = format!("pub const {name}: u32 = ");
            text.lines()
                .find_map(|l| l.strip_prefix(&prefix)?.strip_suffix(';')?.parse().ok())
                .ok_or_else(|| self.stale(&format!("`{prefix}…;`")))
        };
        Ok((header::read_version(field)?, field("CUDA_VERSION")?))
    }

    /// The size of each struct the shim fills (`filled`, by C typedef name) as the snapshot's Rust type has
    /// it (from bindgen's layout tests), 0 for a type the snapshot does not declare: what the shim checks
    /// the C compiler's sizeof against.
    pub fn filled_struct_sizes<'a>(
        &self,
        filled: &[&'a str],
    ) -> Result<Vec<(&'a str, usize)>, String> {
        let text = self.bindings()?;
        filled
            .iter()
            .map(|&c_name| {
                // `pub type ncclConfig_t = ncclConfig_v22800;`: bindgen's layout test names the struct.
                let alias = format!("pub type {c_name} = ");
                let Some(rust) = text
                    .lines()
                    .find_map(|l| l.strip_prefix(&alias)?.strip_suffix(';'))
                else {
                    return Ok((c_name, 0));
                };
                let test = format!("[\"Size of {rust}\"]");
                let size = text
                    .find(&test)
                    .and_then(|at| {
                        let rest = &text[at..];
                        let end = rest.find("usize]")?;
                        rest[..end].rsplit(' ').next()?.parse().ok()
                    })
                    .ok_or_else(|| self.stale(&format!("layout test {test}")))?;
                Ok((c_name, size))
            })
            .collect()
    }

    fn bindings(&self) -> Result<String, String> {
        let path = self.dir.join("bindings.rs");
        std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read the bindings snapshot {}: {e}", path.display()))
    }

    fn stale(&self, what: &str) -> String {
        format!(
            "{} has no {what}: regenerate it with ci/regen",
            self.dir.join("bindings.rs").display()
        )
    }
}
