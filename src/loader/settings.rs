//! What the loader takes from the process's environment, read once, before any NCCL code runs: NCCL's
//! first call sets variables itself (from `NCCL_CONF_FILE`, `~/.nccl.conf` and `/etc/nccl.conf`), and
//! reading the environment while another thread writes it is a race.
//!
//! In secure-execution mode (`getauxval(AT_SECURE)`: a set-user-ID or set-group-ID program, or one with
//! file capabilities) nothing is read: the variables belong to the less privileged user who started
//! the program. [`Settings::read`] is the seam the tests use to show that: it takes the mode and the
//! reader of variables as arguments, and the process's own values come from [`Settings::of_process`]
//! alone, so nothing outside the crate can claim a mode the kernel did not set.

use std::ffi::OsString;

/// The variable naming the library outright: an absolute path to a file, or to a folder holding
/// `libnccl.so.<major>`.
pub const LIBRARY_VAR: &str = "METRALE_NCCL_LIBRARY";
/// The variable that lets the loader accept a library older than the headers (`1`): the functions it
/// has work, and the others fail their calls with
/// [`GpuError::NcclFunctionMissing`](crate::nccl::GpuError::NcclFunctionMissing).
pub const ALLOW_OLDER_VAR: &str = "METRALE_NCCL_ALLOW_OLDER";
/// The active Python environments, where PyTorch's wheels put `nvidia/nccl/lib`.
pub(super) const PYTHON_ENVS: [&str; 2] = ["VIRTUAL_ENV", "CONDA_PREFIX"];

/// The loader's view of the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Settings {
    /// Secure-execution mode: no variable was read, and the build folder is not searched.
    pub(super) secure: bool,
    /// [`LIBRARY_VAR`], where set and not empty.
    pub(super) library: Option<OsString>,
    /// [`ALLOW_OLDER_VAR`] is `1`.
    pub(super) allow_older: bool,
    /// Each of [`PYTHON_ENVS`] and its value, where set and not empty.
    pub(super) python: Vec<(&'static str, Option<OsString>)>,
}

impl Settings {
    /// The process's settings: its secure-execution flag from the kernel, its variables from its
    /// environment.
    pub(super) fn of_process() -> Settings {
        Settings::read(secure_execution(), &|name| std::env::var_os(name))
    }

    /// The settings `var` gives, unless `secure`: then `var` is never called.
    pub(super) fn read(secure: bool, var: &dyn Fn(&str) -> Option<OsString>) -> Settings {
        if secure {
            return Settings {
                secure,
                library: None,
                allow_older: false,
                python: PYTHON_ENVS.iter().map(|&name| (name, None)).collect(),
            };
        }
        let set = |name: &str| var(name).filter(|v| !v.is_empty());
        Settings {
            secure,
            library: set(LIBRARY_VAR),
            allow_older: set(ALLOW_OLDER_VAR).is_some_and(|v| v == "1"),
            python: PYTHON_ENVS.iter().map(|&name| (name, set(name))).collect(),
        }
    }
}

/// True in secure-execution mode, as the kernel told the dynamic loader (`AT_SECURE`), which then also
/// ignores `LD_LIBRARY_PATH` and restricts `LD_PRELOAD`.
fn secure_execution() -> bool {
    // SAFETY: getauxval reads the process's auxiliary vector; any type is allowed (0 where absent).
    unsafe { libc::getauxval(libc::AT_SECURE) != 0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    #[test]
    fn secure_execution_reads_no_variable() {
        let read = RefCell::new(Vec::new());
        let var = |name: &str| {
            read.borrow_mut().push(name.to_string());
            Some(OsString::from("/anything"))
        };
        let settings = Settings::read(true, &var);
        assert!(read.borrow().is_empty(), "read {:?}", read.borrow());
        assert_eq!(settings.library, None);
        assert!(!settings.allow_older);
        assert!(
            settings.python.iter().all(|(_, v)| v.is_none()),
            "{settings:?}"
        );
        // The same reader outside secure mode: every variable is read once, and empty ones are unset.
        let settings = Settings::read(false, &var);
        assert_eq!(
            *read.borrow(),
            [LIBRARY_VAR, ALLOW_OLDER_VAR, "VIRTUAL_ENV", "CONDA_PREFIX"]
        );
        assert_eq!(settings.library, Some(OsString::from("/anything")));
        let empty = Settings::read(false, &|_| Some(OsString::new()));
        assert_eq!(empty.library, None);
    }

    #[test]
    fn this_test_process_is_not_in_secure_execution_mode() {
        assert!(
            !secure_execution(),
            "cargo's test binaries are not set-user-ID"
        );
    }
}
