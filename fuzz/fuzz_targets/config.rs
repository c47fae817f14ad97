//! The agent's configuration as `main` loads it: the command-line flags (`config::Flags`,
//! clap) and the `KubeletConfiguration` file (YAML or JSON), defaulted, with the flags
//! applied on top and everything validated (`config::load`).
//!
//! The input is `<argv, one argument per line> NUL <config file>`; without a NUL byte the
//! whole input is the file and there are no flags. The file is written to a scratch file
//! that `--config` names, whatever the flags say (a fuzzed `--config=/dev/zero` would read
//! forever). Besides never panicking, these must hold:
//! - the error of a refused configuration renders (it is what `main` prints);
//! - what the agent builds from a loaded configuration at start (the server's settings,
//!   tracing, eviction thresholds, log rotation, node allocatable, image and shutdown
//!   settings) accepts it: validation names every bad setting before the agent starts, so
//!   nothing it let through may fail or panic later;
//! - a loaded configuration renders as `/configz`, and that document written back as a
//!   file (with its `apiVersion` and `kind`) loads to the same configuration when no flag
//!   was given: what `/configz` shows is what the file meant. (With flags the property
//!   does not hold, as upstream: `--max-pods=0` is kept as 0, but a file saying
//!   `maxPods: 0` is defaulted to 110.)
//!
//! `SWIFTLET_FUZZ_DEBUG=1` prints what `load` made of each input when running the target
//! on inputs.

#![no_main]

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use clap::Parser as _;
use libfuzzer_sys::fuzz_target;
use swiftlet::config::{self, API_VERSION, Flags, KIND};
use swiftlet::settings;

fuzz_target!(|data: &[u8]| {
    let (args, file) = match data.iter().position(|&b| b == 0) {
        Some(nul) => (&data[..nul], &data[nul + 1..]),
        None => (&[][..], data),
    };
    let args: Vec<OsString> = if args.is_empty() {
        Vec::new()
    } else {
        args.split(|&b| b == b'\n').map(|a| OsString::from_vec(a.to_vec())).collect()
    };
    let Ok(mut flags) = Flags::try_parse_from(std::iter::once(OsString::from("swiftlet")).chain(args.iter().cloned()))
    else {
        return;
    };
    let path = scratch_file();
    std::fs::write(path, file).expect("writing the scratch config file");
    flags.config = Some(path.to_owned());
    // The node name must not depend on the machine the fuzzer runs on.
    flags.hostname_override.get_or_insert_with(|| "fuzz-node".to_owned());
    let result = config::load(flags);
    if std::env::var_os("SWIFTLET_FUZZ_DEBUG").is_some() {
        match &result {
            Ok(loaded) => eprintln!("loaded: {}", loaded.kubelet.to_configz_json()),
            Err(e) => eprintln!("refused: {e}"),
        }
    }
    let loaded = match result {
        Ok(loaded) => loaded,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    what_the_agent_builds(&loaded);
    let mut configz = loaded.kubelet.to_configz_json();
    let mut document = configz["kubeletconfig"].take();
    document["apiVersion"] = API_VERSION.into();
    document["kind"] = KIND.into();
    if !args.is_empty() {
        return;
    }
    let text = serde_json::to_string(&document).expect("the configz document serializes");
    std::fs::write(path, &text).expect("writing the scratch config file");
    let mut again = Flags::default();
    again.config = Some(path.to_owned());
    again.hostname_override = Some("fuzz-node".to_owned());
    match config::load(again) {
        Ok(reloaded) => assert_eq!(reloaded.kubelet, loaded.kubelet, "/configz {text} reloads differently"),
        Err(e) => panic!("/configz {text} does not load again: {e}"),
    }
});

/// What `agent::run` and `main` derive from the configuration before serving.
fn what_the_agent_builds(loaded: &config::Config) {
    let kc = &loaded.kubelet;
    if let Err(e) = settings::server(loaded) {
        panic!("validated, yet the server refuses it: {e}");
    }
    if let Err(e) = settings::tracing(loaded) {
        panic!("validated, yet tracing refuses it: {e}");
    }
    if let Err(e) = swiftlet::eviction::thresholds::EvictionConfig::from_settings(&settings::eviction(kc)) {
        panic!("validated, yet the eviction manager refuses it: {e:?}");
    }
    if let Err(e) = settings::log_rotation(kc) {
        panic!("validated, yet log rotation refuses it: {e}");
    }
    let capacity = swiftlet::cm::allocatable::Capacity {
        cpus: 4,
        memory_bytes: 8 << 30,
        max_pid: Some(4_194_304),
        hugepages: [(2 << 20, 0), (1 << 30, 2 << 30)].into(),
    };
    let _ = swiftlet::cm::allocatable::plan(&settings::allocatable(kc), &capacity);
    let _ = settings::image_puller(kc);
    let _ = settings::image_gc(kc);
    let _ = settings::resource_managers(kc);
    let _ = swiftlet::nodeshutdown::periods(&settings::node_shutdown(kc));
}

/// A file of this process (libFuzzer may run several jobs side by side).
fn scratch_file() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| std::env::temp_dir().join(format!("swiftlet-fuzz-config-{}.yaml", std::process::id())))
}
