//! A register under concurrent SET/NX/VDEL/GET from several clients through different
//! replicas (the cluster of `scaleout.rs`) is linearizable: the history is recorded and checked
//! with a small Wing-Gong checker.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::scaleout::{Client, cluster};

/// One operation of the register's history: what was asked, what came back, and when.
#[derive(Debug, Clone)]
struct Op {
    call: Instant,
    ret: Instant,
    kind: Kind,
}

#[derive(Debug, Clone, PartialEq)]
enum Kind {
    Set(u32),
    /// SET NX: applied or not.
    SetNx(u32, bool),
    /// VDEL v: deleted or not.
    VDel(u32, bool),
    Get(Option<u32>),
}

/// Applies `op` to the register `state`; `None` when the outcome is impossible there.
fn step(state: Option<u32>, op: &Kind) -> Option<Option<u32>> {
    match *op {
        Kind::Set(v) => Some(Some(v)),
        Kind::SetNx(v, applied) => match (state, applied) {
            (None, true) => Some(Some(v)),
            (Some(_), false) => Some(state),
            _ => None,
        },
        Kind::VDel(v, deleted) => match (state == Some(v), deleted) {
            (true, true) => Some(None),
            (false, false) => Some(state),
            _ => None,
        },
        Kind::Get(seen) => (seen == state).then_some(state),
    }
}

/// Wing and Gong's search: is there an order of the operations, each placed between its call
/// and its return, in which every outcome is the register's? Depth-first over the operations
/// that may come next (those called before every unplaced operation returned), with the states
/// already explored at each set of placed operations remembered.
fn linearizable(history: &[Op]) -> bool {
    fn search(
        history: &[Op],
        placed: &mut Vec<bool>,
        state: Option<u32>,
        seen: &mut std::collections::HashSet<(Vec<bool>, Option<u32>)>,
    ) -> bool {
        if placed.iter().all(|p| *p) {
            return true;
        }
        if !seen.insert((placed.clone(), state)) {
            return false;
        }
        let earliest_return = history
            .iter()
            .zip(placed.iter())
            .filter(|(_, p)| !**p)
            .map(|(o, _)| o.ret)
            .min()
            .expect("an unplaced operation");
        for i in 0..history.len() {
            if placed[i] || history[i].call > earliest_return {
                continue;
            }
            if let Some(next) = step(state, &history[i].kind) {
                placed[i] = true;
                if search(history, placed, next, seen) {
                    return true;
                }
                placed[i] = false;
            }
        }
        false
    }
    search(history, &mut vec![false; history.len()], None, &mut Default::default())
}

#[test]
fn the_checker_refuses_a_stale_read() {
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let op = |call, ret, kind| Op {
        call: at(call),
        ret: at(ret),
        kind,
    };
    // SET 1 returned before GET started: the GET must see 1.
    assert!(!linearizable(&[op(0, 1, Kind::Set(1)), op(2, 3, Kind::Get(None))]));
    assert!(linearizable(&[op(0, 3, Kind::Set(1)), op(1, 2, Kind::Get(None))]));
    assert!(!linearizable(&[
        op(0, 1, Kind::SetNx(1, true)),
        op(2, 3, Kind::SetNx(2, true))
    ]));
    assert!(linearizable(&[
        op(0, 1, Kind::SetNx(1, true)),
        op(2, 5, Kind::VDel(1, true)),
        op(3, 4, Kind::SetNx(2, false))
    ]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_register_is_linearizable_across_replicas() {
    let c = cluster(2).await;
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(Arc::new(Client::connect(c.mosquitto.port).await));
    }
    let history = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (n, client) in clients.iter().enumerate() {
        let (client, history) = (client.clone(), history.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..12u32 {
                let v = n as u32 * 100 + i;
                let vs = v.to_string();
                let call = Instant::now();
                let (payload, _) = match i % 4 {
                    0 => client.ok(&[b"SET", b"reg", vs.as_bytes()]).await,
                    1 => client.ok(&[b"SET", b"reg", vs.as_bytes(), b"NX"]).await,
                    2 => client.ok(&[b"GET", b"reg"]).await,
                    _ => {
                        let prev = (v - 3).to_string();
                        client.ok(&[b"VDEL", b"reg", prev.as_bytes()]).await
                    }
                };
                let kind = match i % 4 {
                    0 => Kind::Set(v),
                    1 => Kind::SetNx(v, &payload[..] == b"+OK\r\n"),
                    2 => Kind::Get(match &payload[..] {
                        b"$-1\r\n" | b"_\r\n" => None,
                        p => {
                            let text = String::from_utf8_lossy(p);
                            Some(text.rsplit("\r\n").nth(1).unwrap().parse().unwrap())
                        }
                    }),
                    _ => Kind::VDel(v - 3, &payload[..] == b":1\r\n"),
                };
                history.lock().unwrap().push(Op {
                    call,
                    ret: Instant::now(),
                    kind,
                });
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let history = history.lock().unwrap().clone();
    assert!(linearizable(&history), "not linearizable: {history:#?}");
}
