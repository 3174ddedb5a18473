//! Request body bytes in flight on the HTTP and gRPC doors (`--http-max-inflight-bytes`,
//! `--grpc-max-inflight-bytes`): a body that does not fit is refused at once and changes
//! nothing, the budget comes back when answers are sent, and a flood of large uploads against
//! the real binary with default settings stays far below what its bodies would cost.

use std::time::{Duration, Instant};

use stategate::grpc::pb::statestore::v1 as npb;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::Code;

use crate::support::{Broker, TestEnv, WAIT, rss, within};

/// Sends the headers and `sent` bytes of a save whose Content-Length says `len`, and keeps the
/// connection open without sending the rest (a refused upload's connection is closed by the
/// service as it is written: the write error is the refusal, not a failure).
async fn partial_save(addr: std::net::SocketAddr, len: usize, sent: usize) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(
        format!(
            "POST /v1.0/state/statestore HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {len}\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let _ = s.write_all(&vec![b' '; sent]).await;
    s
}

/// The status of the answer on `s` (which must come without more of the body).
async fn status_of(s: &mut TcpStream) -> u16 {
    let mut buf = [0u8; 512];
    let n = within("an answer", s.read(&mut buf)).await.unwrap();
    std::str::from_utf8(&buf[..n])
        .ok()
        .and_then(|a| a.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_bodies_past_the_byte_budget_are_refused_at_once() {
    const BUDGET: usize = 64 * 1024;
    let env = TestEnv::start_with(Broker::Embedded, |c| {
        c.net.http_max_inflight_bytes = BUDGET;
    })
    .await;
    let addr = env.service.as_ref().unwrap().http_addr().unwrap();
    // A body larger than the budget: refused before a byte of it is read.
    let mut big = partial_save(addr, BUDGET + 1, 0).await;
    assert_eq!(status_of(&mut big).await, 503);
    // Two bodies that fit alone but not together: the second is refused while the first waits.
    let budget = env
        .service
        .as_ref()
        .unwrap()
        .door_limits()
        .http_inflight
        .bodies()
        .clone();
    let mut first = partial_save(addr, 40 * 1024, 1024).await;
    let give_up = Instant::now() + WAIT;
    while budget.available_bytes() == BUDGET {
        assert!(Instant::now() < give_up, "the first body was never admitted");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut second = partial_save(addr, 40 * 1024, 0).await;
    assert_eq!(status_of(&mut second).await, 503);
    // The first completes (JSON after its leading blanks); its bytes come back.
    let mut rest = br#"[{"key":"k","value":1}]"#.to_vec();
    rest.resize(40 * 1024 - 1024, b' ');
    first.write_all(&rest).await.unwrap();
    assert_eq!(status_of(&mut first).await, 204);
    let give_up = Instant::now() + WAIT;
    while budget.available_bytes() != BUDGET {
        assert!(Instant::now() < give_up, "the first body's bytes never came back");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let c = reqwest::Client::new();
    let r = c
        .post(format!("{}/v1.0/state/statestore", env.http()))
        .body(format!("[{{\"key\":\"k\",\"value\":\"{}\"}}]", "v".repeat(40 * 1024)))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204, "a body that fits is served");
    // A chunked body (no length) that grows past the budget: 503, nothing stored. Sent over a
    // raw connection just past the budget and no further, then the answer is read: a client
    // that keeps writing after the refusal (reqwest streaming a body) may see its write fail
    // on the closed connection before it reads the answer.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(
        b"POST /v1.0/state/statestore HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
    )
    .await
    .unwrap();
    for _ in 0..=BUDGET / 1024 {
        let mut chunk = b"400\r\n".to_vec();
        chunk.extend_from_slice(&[b' '; 1024]);
        chunk.extend_from_slice(b"\r\n");
        if s.write_all(&chunk).await.is_err() {
            break;
        }
    }
    let mut answer = vec![0u8; 1024];
    let n = within("an answer", s.read(&mut answer)).await.unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]).to_lowercase();
    assert!(answer.starts_with("http/1.1 503"), "{answer}");
    assert!(answer.contains("retry-after: 1\r\n"), "{answer}");
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_messages_past_the_byte_budget_fail_resource_exhausted() {
    let env = TestEnv::start_with(Broker::Embedded, |c| {
        c.net.grpc_max_inflight_bytes = 64 * 1024;
    })
    .await;
    let mut client = npb::state_store_client::StateStoreClient::connect(env.grpc())
        .await
        .unwrap();
    let set = |value: Vec<u8>| npb::SetRequest {
        key: b"k".to_vec(),
        value,
        ..Default::default()
    };
    let err = client.set(set(vec![b'x'; 100 * 1024])).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    let got = client.get(npb::GetRequest { key: b"k".to_vec() }).await.unwrap();
    assert!(got.into_inner().value.is_empty(), "a refused set stores nothing");
    client
        .set(set(vec![b'x'; 16 * 1024]))
        .await
        .expect("a message that fits");
    env.stop().await;
}

/// The review's flood, against the real binary with default limits: hundreds of uploads of
/// nearly 4 MiB (the default body limit) that never finish. Before the budget each buffered
/// its body (over 2 GiB resident); now the first fill the 64 MiB budget and the rest are
/// refused before their bodies are read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_large_unfinished_uploads_stays_within_the_budget() {
    const UPLOADS: usize = 300;
    const LEN: usize = 4 * 1024 * 1024 - 1024;
    const SENT: usize = 3 * 1024 * 1024;
    stategate::tls::install_provider();
    let http_port = crate::support::free_port();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_stategate"))
        .args([
            "--storage",
            "memory",
            "--mqtt-listen",
            "127.0.0.1:0",
            "--grpc-listen",
            "off",
        ])
        .args(["--http-listen", &format!("127.0.0.1:{http_port}")])
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    let http = format!("http://127.0.0.1:{http_port}");
    let give_up = Instant::now() + WAIT;
    while reqwest::get(format!("{http}/healthz")).await.is_err() {
        assert!(Instant::now() < give_up, "the service did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let addr: std::net::SocketAddr = format!("127.0.0.1:{http_port}").parse().unwrap();
    let mut held = Vec::new();
    let mut peak = 0;
    for i in 0..UPLOADS {
        held.push(partial_save(addr, LEN, SENT).await);
        if i % 20 == 0 {
            peak = peak.max(rss(pid));
        }
    }
    peak = peak.max(rss(pid));
    // Another client is served meanwhile.
    let r = reqwest::Client::new()
        .post(format!("{http}/v1.0/state/statestore"))
        .body(r#"[{"key":"other","value":1}]"#)
        .send()
        .await
        .unwrap();
    // Past the budget the answer may be a 503 while the uploads hold it: either is bounded.
    assert!(r.status() == 204 || r.status() == 503, "{}", r.status());
    assert!(
        peak < 512 * 1024 * 1024,
        "resident {} MiB with {UPLOADS} unfinished uploads",
        peak / (1024 * 1024)
    );
    println!(
        "{UPLOADS} unfinished uploads of {SENT} bytes: peak resident {} MiB",
        peak / (1024 * 1024)
    );
    drop(held);
    let _ = child.kill().await;
}
