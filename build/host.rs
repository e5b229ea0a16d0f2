//! The build's surroundings as the discovery steps see them (`find::Host`): the environment, declared to
//! cargo, and pkg-config.

use std::path::PathBuf;

use metrale_gpu_sys_build::find;

use crate::env;

/// Reads the environment and pkg-config for `find`.
pub struct BuildHost;

impl find::Host for BuildHost {
    fn var(&self, name: &str) -> Option<PathBuf> {
        env::var(name).map(PathBuf::from)
    }

    fn pkg_config(&self, name: &str) -> Result<find::PkgConfig, String> {
        pkg_config::Config::new()
            .cargo_metadata(false)
            .env_metadata(true)
            .probe(name)
            .map(|lib| find::PkgConfig {
                include_paths: lib.include_paths,
                link_paths: lib.link_paths,
            })
            .map_err(|e| e.to_string().lines().next().unwrap_or("failed").to_string())
    }

    fn pkg_config_cuda_names(&self) -> Vec<String> {
        // pkg-config's folders: PKG_CONFIG_PATH's, then PKG_CONFIG_LIBDIR's where set, else the tool's own
        // (`pc_path`, asked through the pkg-config crate, which honours PKG_CONFIG, the sysroot and the
        // per-target variables, and does not answer for another target unless told it may). Each name
        // found is then probed through the crate too (`find`'s pkg-config step).
        let mut dirs: Vec<PathBuf> = Vec::new();
        for var in ["PKG_CONFIG_PATH", "PKG_CONFIG_LIBDIR"] {
            if let Some(value) = env::var(var) {
                dirs.extend(std::env::split_paths(&value));
            }
        }
        if env::var("PKG_CONFIG_LIBDIR").is_none() {
            let Ok(own) = pkg_config::get_variable("pkg-config", "pc_path") else {
                return Vec::new();
            };
            dirs.extend(std::env::split_paths(&own));
        }
        let mut names: Vec<(Vec<u32>, String)> = dirs
            .iter()
            .filter_map(|dir| std::fs::read_dir(dir).ok())
            .flatten()
            .flatten()
            .filter_map(|entry| {
                let name = entry.file_name().into_string().ok()?;
                let name = name.strip_suffix(".pc")?.to_string();
                Some((find::cuda_version(&name)?, name))
            })
            .collect();
        // Newest first; a name in two folders once (pkg-config takes the first folder's).
        names.sort_by(|a, b| b.cmp(a));
        names.dedup();
        names.into_iter().map(|(_, name)| name).collect()
    }
}
