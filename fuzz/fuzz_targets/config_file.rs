//! The configuration file (`--config FILE`): TOML whose keys are the `serve` flags
//! (`src/config/file.rs`), layered under the command line and then validated into a `Config`
//! as a start does.
//!
//! Whatever the file holds: no panic, only a `FileError`/`ConfigError` naming what is wrong.

#![no_main]

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use stategate::config::Config;
use stategate::config::file::layer;

/// One file per process, rewritten for every input.
fn file() -> &'static PathBuf {
    static FILE: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &FILE
        .get_or_init(|| {
            let dir = tempfile::tempdir().expect("a temporary directory");
            let path = dir.path().join("stategate.toml");
            (dir, path)
        })
        .1
}

fuzz_target!(|data: &[u8]| {
    std::fs::write(file(), data).expect("writing the configuration file");
    let argv: Vec<OsString> = ["stategate", "serve", "--config"]
        .into_iter()
        .map(OsString::from)
        .chain([file().as_os_str().to_owned()])
        .collect();
    if let Ok(layered) = layer(&argv) {
        let _ = Config::from_args(layered.args);
    }
});
