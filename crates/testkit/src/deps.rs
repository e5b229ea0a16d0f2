//! What `ci/setup` installed under a checkout's `.deps/` for this binary's architecture: `.deps/<target>/`
//! where `ci/setup --target` filled one (cross-testing under qemu-user), else `.deps/`, the build
//! machine's own. Tests that load another libnccl than the linked one look here.

use std::path::{Path, PathBuf};

use metrale_gpu_sys::version::NcclVersion;

/// This binary's target triple (the Linux GNU targets the crate builds for).
pub fn target() -> String {
    format!("{}-unknown-linux-gnu", std::env::consts::ARCH)
}

/// The `nccl-<version>/nvidia/nccl/lib` folders holding a `libnccl.so.2` under `root`'s `.deps/` for this
/// architecture, with the version their names give, oldest first.
pub fn installed_nccl(root: &Path) -> Vec<(NcclVersion, PathBuf)> {
    let deps = root.join(".deps");
    let cross = deps.join(target());
    nccl_in(if cross.is_dir() { &cross } else { &deps })
}

/// The `nccl-<version>/nvidia/nccl/lib` folders holding a `libnccl.so.2` directly under `deps`, oldest
/// first: the build machine's own where `deps` is `.deps/` (what a scratch crate built for the host loads,
/// whatever this binary's architecture).
pub fn nccl_in(deps: &Path) -> Vec<(NcclVersion, PathBuf)> {
    let mut found: Vec<(NcclVersion, PathBuf)> = std::fs::read_dir(deps)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let mut parts = name
                .strip_prefix("nccl-")?
                .split('.')
                .map(|p| p.parse::<u32>());
            let v = NcclVersion {
                major: parts.next()?.ok()?,
                minor: parts.next()?.ok()?,
                patch: parts.next()?.ok()?,
            };
            let lib = entry.path().join("nvidia/nccl/lib");
            lib.join("libnccl.so.2").exists().then_some((v, lib))
        })
        .collect();
    found.sort();
    found
}
