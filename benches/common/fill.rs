//! Filling a store the way the service writes keys, for the benchmarks that measure a restart
//! (`storage`, `restart`).

use bytes::Bytes;
use stategate::hlc::Hlc;
use stategate::storage::{DeadlineCheck, Record, Store, Swap};

/// Writes keys `0..n` (16 decimal digits) with 100-byte values, one versioned record each, from
/// 64 writers: one log record per key, as the service's SETs leave them.
pub async fn fill(store: &Store, n: u64) {
    let value = Bytes::from(vec![b'v'; 100]);
    let mut tasks = Vec::new();
    for w in 0..64u64 {
        let (store, value) = (store.clone(), value.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = w;
            while i < n {
                let swap = Swap {
                    key: Bytes::from(format!("{i:016}")),
                    expected: None,
                    new: Some(Record {
                        value: value.clone(),
                        version: Hlc::new(1_700_000_000_000 + i, 0, "bench"),
                        fencing: None,
                        expires_at_ms: None,
                        slide_ms: None,
                    }),
                    deadline: DeadlineCheck::Any,
                };
                store.backend().swap_many(&[swap], None).await.expect("swap");
                i += 64;
            }
        }));
    }
    for t in tasks {
        t.await.expect("writer");
    }
}
