//! NCCL's device API against a library that lacks it: `ncclDevCommCreate` (NCCL 2.28+) called through the
//! helpers with an older libnccl (2.27.7, which `ci/setup 2.27.7` installs under .deps/) fails its call
//! with the missing-function error naming it, the library's version and file; the process goes on.
//! With feature `link` the program cannot start at all with that library (the dynamic loader refuses it).
//! The layouts and initializers are crates/systest's; the GPU run is the device-example crate's.

#[cfg(nccl_device_api)]
mod missing {
    use std::path::PathBuf;

    use metrale_gpu_sys::device::{requirements, DevComm};
    use metrale_gpu_sys::version::NcclVersion;
    use metrale_gpu_testkit::child::this_binary;
    use metrale_gpu_testkit::deps;
    use metrale_gpu_testkit::skip::skip;

    const CHILD: &str = "METRALE_DEVICE_API_CHILD";
    /// The first NCCL with `ncclDevCommCreate` (nccl_device.h: a version no header macro names).
    const SINCE: NcclVersion = NcclVersion {
        major: 2,
        minor: 28,
        patch: 0,
    };

    /// Not a test on its own: the child side, run by the test below with an older library.
    #[test]
    #[ignore = "run in a child process by the test below"]
    fn child_creates_a_device_communicator() {
        if std::env::var_os(CHILD).is_none() {
            return;
        }
        let wanted = requirements();
        // SAFETY: a NULL communicator, which a library that has the function refuses before using it.
        match unsafe { DevComm::create(std::ptr::null_mut(), &wanted) } {
            Ok(_) => println!("CHILD ncclDevCommCreate: Ok"),
            Err(e) => println!("CHILD ncclDevCommCreate: {e}"),
        }
        // SAFETY: as above.
        match unsafe { metrale_gpu_sys::device::require_device_api(std::ptr::null_mut(), 1) } {
            Ok(()) => println!("CHILD require_device_api: Ok"),
            Err(e) => println!("CHILD require_device_api: {e}"),
        }
    }

    /// An installed libnccl older than the device API; where there is none, the test's SKIP line.
    fn older_library() -> Option<(NcclVersion, PathBuf)> {
        let older = deps::installed_nccl(std::path::Path::new(env!("CARGO_MANIFEST_DIR")))
            .into_iter()
            .find(|(version, _)| *version < SINCE);
        if older.is_none() {
            skip(format_args!(
                "no libnccl older than {SINCE} (the device API) under .deps/: install one with `ci/setup 2.27.7`"
            ));
        }
        older
    }

    /// This binary's child with `lib` as its libnccl, older ones accepted: its exit code and output.
    fn run_child(lib: &PathBuf) -> (Option<i32>, String) {
        let out = this_binary()
            .args([
                "--ignored",
                "--exact",
                "missing::child_creates_a_device_communicator",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, "1")
            .env("METRALE_NCCL_LIBRARY", lib)
            .env("LD_LIBRARY_PATH", lib)
            .env("METRALE_NCCL_ALLOW_OLDER", "1")
            .output()
            .expect("run the child");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), text)
    }

    #[cfg(not(feature = "link"))]
    #[test]
    fn a_library_without_the_device_api_fails_dev_comm_create_naming_it() {
        let Some((older, lib)) = older_library() else {
            return;
        };
        let (code, output) = run_child(&lib);
        println!("with {}: exit status {code:?}\n{output}", lib.display());
        assert_eq!(code, Some(0), "the child ends normally:\n{output}");
        let library = lib.join("libnccl.so.2").display().to_string();
        for text in [
            format!(
                "CHILD ncclDevCommCreate: ncclDevCommCreate failed: the loaded libnccl {older} "
            ),
            library,
            "lacks ncclDevCommCreate".to_string(),
        ] {
            assert!(output.contains(&text), "expected {text:?} in:\n{output}");
        }
        // Headers with ncclCommQueryProperties ask it first, and name it as missing too.
        #[cfg(nccl_macro = "NCCL_COMM_PROPERTIES_INITIALIZER")]
        assert!(
            output.contains(
                "CHILD require_device_api: ncclCommQueryProperties failed: the loaded libnccl"
            ) && output.contains("lacks ncclCommQueryProperties"),
            "{output}"
        );
    }

    #[cfg(feature = "link")]
    #[test]
    fn a_library_without_the_device_api_fails_dev_comm_create_naming_it() {
        let Some((_, lib)) = older_library() else {
            return;
        };
        // Linked (BIND_NOW), the program never starts: the dynamic loader names a missing nccl* symbol.
        let (code, output) = run_child(&lib);
        assert_eq!(code, Some(127), "the loader's exit status:\n{output}");
        assert!(
            output.contains("symbol lookup error") && output.contains("undefined symbol: nccl"),
            "{output}"
        );
        assert!(!output.contains("CHILD"), "the child ran:\n{output}");
    }
}

#[cfg(not(nccl_device_api))]
mod missing {
    #[test]
    fn a_library_without_the_device_api_fails_dev_comm_create_naming_it() {
        metrale_gpu_testkit::skip::skip(
            "the NCCL headers found have no device API (nccl_device.h, NCCL 2.28+)",
        );
    }
}
