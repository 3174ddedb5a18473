//! Recovery of an arbitrary data directory: the durable store's log segments and snapshots
//! (`crates/storage/src/durable/{format,recovery,snapshot}.rs`), as a disk, an operator or a
//! crash may leave them. The input is a directory: see `stategate_fuzz::DataDir`.
//!
//! Whatever the files hold, recovery refuses (an error naming the file) or repairs (cuts a torn
//! tail), and never panics nor loops (libFuzzer's `-timeout` catches a loop). What it repaired
//! stays repaired: a store that opened once opens again, read-write and read-only.

#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use stategate::hlc::ManualClock;
use stategate::storage::durable::{DurableBackend, DurableOptions, FsyncMode, load_read_only};
use stategate_fuzz::{DataDir, NOW_MS};

fuzz_target!(|data: &[u8]| {
    let input = DataDir::parse(data);
    let dir = tempfile::tempdir().expect("a temporary directory");
    input.write(dir.path());
    let key = input.key();

    let _ = load_read_only(dir.path(), key.as_ref());

    let options = DurableOptions {
        fsync: FsyncMode::Never,
        clock: Arc::new(ManualClock::new(NOW_MS)),
        encryption: key.clone(),
        ..DurableOptions::new(dir.path())
    };
    if let Ok(store) = DurableBackend::open(options.clone()) {
        drop(store);
        if let Err(e) = DurableBackend::open(options) {
            panic!("a directory that opened does not open again: {e}");
        }
        if let Err(e) = load_read_only(dir.path(), key.as_ref()) {
            panic!("a directory that opened does not load read-only: {e}");
        }
    }
});
