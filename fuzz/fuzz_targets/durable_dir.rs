//! Recovery of an arbitrary data directory: the durable store's log segments and snapshots
//! (`crates/storage/src/durable/{format,recovery,snapshot}.rs`), as a disk, an operator or a
//! crash may leave them. The input is a directory: see `stategate_fuzz::DataDir`.
//!
//! Whatever the files hold, recovery refuses (an error naming the file) or repairs (cuts a torn
//! tail), and never panics nor loops (libFuzzer's `-timeout` catches a loop). What it repaired
//! stays repaired: a store that opened once opens again, read-write and read-only, with the
//! same records; and the read-only load (which skips a torn tail instead of cutting it)
//! recovers the same records as the open that repairs.

#![no_main]

use std::sync::Arc;

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use stategate::hlc::ManualClock;
use stategate::storage::durable::{DurableBackend, DurableOptions, FsyncMode, load_read_only};
use stategate::storage::{Backend, Record};
use stategate_fuzz::{DataDir, NOW_MS, run};

/// Every live key of a store (at the fuzzed engines' time) with its record.
async fn contents(store: &dyn Backend) -> Vec<(Bytes, Option<Record>)> {
    let mut out = Vec::new();
    let mut after: Option<Bytes> = None;
    loop {
        let Ok(page) = store.scan(after.as_deref(), 1024, NOW_MS, &|_: &[u8]| true).await else {
            return out;
        };
        for key in page.keys {
            let record = store.get(&key).await.ok().flatten();
            out.push((key, record));
        }
        match page.resume_after {
            Some(k) => after = Some(k),
            None => return out,
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let input = DataDir::parse(data);
    let dir = tempfile::tempdir().expect("a temporary directory");
    input.write(dir.path());
    let key = input.key();

    let read_only = load_read_only(dir.path(), key.as_ref()).ok();
    let read_only = read_only.map(|index| run(contents(&index)));

    let options = DurableOptions {
        fsync: FsyncMode::Never,
        clock: Arc::new(ManualClock::new(NOW_MS)),
        encryption: key.clone(),
        ..DurableOptions::new(dir.path())
    };
    let Ok(store) = DurableBackend::open(options.clone()) else {
        return;
    };
    let opened = run(contents(&store));
    if let Some(read_only) = read_only {
        assert_eq!(
            opened, read_only,
            "a read-only load and an open recover different records"
        );
    }
    drop(store);
    let store = match DurableBackend::open(options) {
        Ok(store) => store,
        Err(e) => panic!("a directory that opened does not open again: {e}"),
    };
    assert_eq!(run(contents(&store)), opened, "a reopen recovers other records");
    drop(store);
    if let Err(e) = load_read_only(dir.path(), key.as_ref()) {
        panic!("a directory that opened does not load read-only: {e}");
    }
});
