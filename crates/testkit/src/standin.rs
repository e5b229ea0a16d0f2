//! Stand-in C libraries: a test compiles one from a C file with the target's C compiler, then runs one of
//! its own tests again in a child process that loads it in place of the real library (the CUDA driver and
//! libnccl are loaded once per process, so each stand-in needs a process of its own). The child runs as
//! this binary does ([`child::test_command`]: through the target's runner when cross-testing).

use std::path::PathBuf;
use std::process::Command;

use crate::child;

/// How the child loads the stand-in.
#[derive(Clone, Copy, Debug)]
pub enum Load {
    /// `LD_PRELOAD`: its functions come before the real library's (a few of libnccl's calls).
    Preload,
    /// `LD_LIBRARY_PATH`: a library opened by the stand-in's file name is the stand-in (`libcuda.so.1`).
    ByName,
}

/// `source` compiled with `cc` and `flags` into `dir/name`, loaded as `load` says.
pub struct StandIn<'a> {
    /// The target's C compiler: the crate's build names the one that built its shim in
    /// `METRALE_TARGET_CC` (`env!` in the crate's tests).
    pub cc: &'a str,
    pub source: &'a str,
    pub flags: &'a [String],
    /// A scratch directory of the test's own (under `CARGO_TARGET_TMPDIR`).
    pub dir: PathBuf,
    pub name: &'a str,
    pub load: Load,
}

impl StandIn<'_> {
    /// Builds the stand-in, then runs this binary's test `test` (its full name, `module::function`) in a
    /// child that loads it, with `env` added. Returns the child's output once the child passed its one
    /// test; panics with that output otherwise.
    pub fn run(&self, test: &str, env: &[(&str, String)]) -> String {
        std::fs::create_dir_all(&self.dir).expect("a scratch directory");
        let lib = self.dir.join(self.name);
        let built = Command::new(self.cc)
            .args(["-shared", "-fPIC", "-Wall", "-Werror", "-o"])
            .arg(&lib)
            .arg(self.source)
            .args(self.flags)
            .status()
            .unwrap_or_else(|e| panic!("{} (the target's C compiler) does not run: {e}", self.cc));
        assert!(
            built.success(),
            "{} failed to build the stand-in {}",
            self.cc,
            self.source
        );
        let (var, path) = match self.load {
            Load::Preload => ("LD_PRELOAD", lib),
            Load::ByName => ("LD_LIBRARY_PATH", self.dir.clone()),
        };
        let mut cmd = child::test_command(test, env);
        cmd.env(var, path);
        child::passed(test, cmd)
    }
}
