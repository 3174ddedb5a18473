//! The command-line client: the real `stategate` binary against a service started in the test,
//! over each door (MQTT on the embedded broker, HTTP, gRPC).
//!
//! Synchronisation: every wait is on the child's exit or on a line it prints, bounded by
//! `support::WAIT`. `watch -v` says "watching" on stderr once changes are being delivered;
//! `lock -v` says "waiting:" once it found the lease held.

use std::process::Stdio;

use base64::Engine as _;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command};

use crate::support::{Broker, TestEnv, WAIT};

mod lock;
mod sliding;
mod watch;

const BIN: &str = env!("CARGO_BIN_EXE_stategate");

/// The door flags for each door of `env`, named.
fn doors(env: &TestEnv) -> [(&'static str, Vec<String>); 3] {
    [
        (
            "mqtt",
            vec!["--mqtt-url".into(), format!("mqtt://127.0.0.1:{}", env.broker_port)],
        ),
        ("http", vec!["--http".into(), env.http()]),
        ("grpc", vec!["--grpc".into(), env.grpc()]),
    ]
}

/// The client's command, with no `STATEGATE_*` variable inherited from the test's environment.
fn command(args: &[&str], door: &[String]) -> Command {
    let mut c = Command::new(BIN);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("STATEGATE_") {
            c.env_remove(k);
        }
    }
    // Door flags go before a `--` (what follows it is the command `lock` runs).
    let split = args.iter().position(|a| *a == "--").unwrap_or(args.len());
    c.args(&args[..split]).args(door);
    if !args.contains(&"--timeout") {
        c.args(["--timeout", "5s"]);
    }
    c.args(&args[split..]);
    c.kill_on_drop(true);
    c
}

/// What a finished command did.
#[derive(Debug)]
struct Ran {
    code: i32,
    stdout: Vec<u8>,
    stderr: String,
}

impl Ran {
    fn text(&self) -> &str {
        std::str::from_utf8(&self.stdout).expect("stdout is UTF-8")
    }
    fn json(&self) -> Vec<Value> {
        self.text()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?} is not JSON: {e}")))
            .collect()
    }
}

/// Runs the client to completion (bounded), feeding `stdin` when given.
async fn run(args: &[&str], door: &[String], stdin: Option<&[u8]>) -> Ran {
    let mut c = command(args, door);
    c.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().expect("spawn the stategate binary");
    if let Some(input) = stdin {
        let mut s = child.stdin.take().unwrap();
        s.write_all(input).await.unwrap();
        drop(s);
    }
    let out = tokio::time::timeout(WAIT, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("stategate {args:?} did not finish in time"))
        .unwrap();
    Ran {
        code: out.status.code().unwrap_or(-1),
        stdout: out.stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs and checks the exit code; returns what it printed.
#[track_caller]
fn expect(ran: Ran, code: i32, what: &str) -> Ran {
    assert_eq!(ran.code, code, "{what}: {ran:?}");
    ran
}

/// A client that keeps running (watch, lock): its output read line by line.
struct Live {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: Lines<BufReader<ChildStdout>>,
    stderr: Lines<BufReader<ChildStderr>>,
}

impl Live {
    fn spawn(args: &[&str], door: &[String]) -> Live {
        let mut child = command(args, door)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the stategate binary");
        Live {
            stdin: child.stdin.take(),
            stdout: BufReader::new(child.stdout.take().unwrap()).lines(),
            stderr: BufReader::new(child.stderr.take().unwrap()).lines(),
            child,
        }
    }

    async fn line(&mut self) -> String {
        tokio::time::timeout(WAIT, self.stdout.next_line())
            .await
            .expect("a line in time")
            .unwrap()
            .expect("stdout still open")
    }

    async fn json(&mut self) -> Value {
        let l = self.line().await;
        serde_json::from_str(&l).unwrap_or_else(|e| panic!("{l:?} is not JSON: {e}"))
    }

    /// Reads stderr until a line contains `needle`.
    async fn stderr_until(&mut self, needle: &str) -> String {
        loop {
            let l = tokio::time::timeout(WAIT, self.stderr.next_line())
                .await
                .unwrap_or_else(|_| panic!("no stderr line with {needle:?} in time"))
                .unwrap()
                .unwrap_or_else(|| panic!("stderr closed before {needle:?}"));
            if l.contains(needle) {
                return l;
            }
        }
    }

    fn signal(&self, sig: &str) {
        let pid = self.child.id().expect("still running").to_string();
        let ok = std::process::Command::new("kill")
            .args([&format!("-{sig}"), &pid])
            .status()
            .expect("run kill");
        assert!(ok.success(), "kill -{sig} {pid}");
    }

    async fn exit_code(&mut self) -> i32 {
        let st = tokio::time::timeout(WAIT, self.child.wait())
            .await
            .expect("the client exits in time")
            .unwrap();
        st.code().unwrap_or(-1)
    }
}

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

/// A JSON line without its version (versions differ between runs, not between doors).
fn unversioned(mut v: Value) -> Value {
    if let Some(o) = v.as_object_mut() {
        o.remove("version");
    }
    v
}

/// Every command on every door, with the same output (versions aside) whichever door it used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_prints_the_same_on_every_door() {
    let env = TestEnv::start_with(Broker::Embedded, |c| c.limits.scan_page = 3).await;
    let mut transcripts = Vec::new();
    for (name, door) in doors(&env) {
        let p = |k: &str| format!("{name}-{k}");
        let mut t: Vec<(i32, Value)> = Vec::new();
        let mut log = |ran: Ran| {
            for line in ran.text().lines() {
                let v = serde_json::from_str(line).map_or_else(|_| Value::from(line), unversioned);
                t.push((ran.code, v));
            }
            if ran.stdout.is_empty() {
                t.push((ran.code, Value::Null));
            }
        };
        let (k, bin) = (p("k"), p("bin"));
        let set = expect(run(&["set", &k, "hello", "--json"], &door, None).await, 0, "set");
        let version = set.json()[0]["version"]
            .as_str()
            .expect("set reports the version")
            .to_owned();
        log(set);
        let got = expect(run(&["get", &k, "--json"], &door, None).await, 0, "get");
        assert_eq!(
            got.json()[0]["version"],
            version.as_str(),
            "{name}: get reports the set's version"
        );
        log(got);
        let human = expect(run(&["get", &k, "-v"], &door, None).await, 0, "get -v");
        assert_eq!(human.text(), "hello\n");
        assert!(human.stderr.contains(&version), "{name}: {}", human.stderr);
        log(expect(
            run(&["set", &k, "other", "--nx", "--json"], &door, None).await,
            1,
            "nx",
        ));
        log(expect(
            run(&["set", &p("new"), "v", "--nx", "--json"], &door, None).await,
            0,
            "nx",
        ));
        log(expect(
            run(&["set", &k, "hello", "--nex", "--json"], &door, None).await,
            0,
            "nex",
        ));
        log(expect(
            run(&["set", &k, "other", "--nex", "--json"], &door, None).await,
            1,
            "nex",
        ));
        // Binary values from stdin and from a file, back exactly with --raw and --json.
        let all: Vec<u8> = (0..=255).collect();
        log(expect(
            run(&["set", &bin, "-", "--json"], &door, Some(&all)).await,
            0,
            "set -",
        ));
        assert_eq!(run(&["get", &bin, "--raw"], &door, None).await.stdout, all);
        let j = run(&["get", &bin, "--json"], &door, None).await.json();
        assert_eq!(
            (j[0]["value"].as_str(), j[0]["value_base64"].as_bool()),
            (Some(b64(&all).as_str()), Some(true))
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("v.bin");
        std::fs::write(&file, &all[..128]).unwrap();
        log(expect(
            run(&["set", &bin, "--file", file.to_str().unwrap()], &door, None).await,
            0,
            "--file",
        ));
        assert_eq!(run(&["get", &bin, "--raw"], &door, None).await.stdout, &all[..128]);
        log(expect(
            run(&["vdel", &bin, "nope", "--json"], &door, None).await,
            1,
            "vdel mismatch",
        ));
        log(expect(
            run(&["vdel", &bin, "-", "--json"], &door, Some(&all[..128])).await,
            0,
            "vdel",
        ));
        log(expect(
            run(&["vdel", &bin, "x", "--json"], &door, None).await,
            1,
            "vdel absent",
        ));
        log(expect(run(&["del", &k, "--json"], &door, None).await, 0, "del"));
        log(expect(run(&["del", &k, "--json"], &door, None).await, 1, "del absent"));
        log(expect(run(&["get", &k, "--json"], &door, None).await, 1, "get absent"));
        let miss = expect(run(&["get", &k], &door, None).await, 1, "get absent");
        assert!(miss.stdout.is_empty() && miss.stderr.contains("not found"), "{miss:?}");
        // A TTL: the key exists with a deadline (checked in the engine, not by waiting).
        expect(
            run(&["set", &p("ttl"), "v", "--ttl", "1h"], &door, None).await,
            0,
            "ttl",
        );
        expect(
            run(&["set", &p("px"), "v", "--px", "60000"], &door, None).await,
            0,
            "px",
        );
        for key in [p("ttl"), p("px")] {
            let e = env
                .engine()
                .read(&bytes::Bytes::from(key.clone()))
                .await
                .unwrap()
                .expect("set");
            assert!(e.expires_at_ms.is_some(), "{name}: {key} has a deadline");
        }
        // Scan: many pages (scan_page = 3), every key once.
        for i in 0..10 {
            expect(
                run(&["set", &format!("{name}/s/{i}"), "v"], &door, None).await,
                0,
                "set",
            );
        }
        let pattern = format!("{name}/s/*");
        let scanned = expect(run(&["scan", &pattern, "--json"], &door, None).await, 0, "scan");
        let mut keys: Vec<String> = scanned
            .json()
            .iter()
            .map(|v| v["key"].as_str().unwrap().to_owned())
            .collect();
        keys.sort();
        let want: Vec<String> = (0..10).map(|i| format!("{name}/s/{i}")).collect();
        assert_eq!(keys, want, "{name}");
        let human = run(&["scan", &pattern], &door, None).await;
        assert_eq!(human.text().lines().count(), 10);
        // A lease without a command: the token, then unlock.
        let l = expect(
            run(
                &["lock", &p("lease"), "--ttl", "1h", "--holder", "me", "--json"],
                &door,
                None,
            )
            .await,
            0,
            "lock",
        );
        let token = l.json()[0]["fencing_token"].as_str().unwrap().to_owned();
        assert!(token.parse::<stategate::hlc::Hlc>().is_ok(), "{token}");
        log(expect(
            run(
                &["lock", &p("lease"), "--ttl", "1h", "--holder", "you", "--wait", "0s"],
                &door,
                None,
            )
            .await,
            1,
            "held",
        ));
        log(expect(
            run(&["unlock", &p("lease"), "--holder", "you", "--json"], &door, None).await,
            1,
            "not yours",
        ));
        log(expect(
            run(&["unlock", &p("lease"), "--holder", "me", "--json"], &door, None).await,
            0,
            "unlock",
        ));
        log(expect(
            run(&["unlock", &p("lease"), "--holder", "me", "--json"], &door, None).await,
            1,
            "unlocked",
        ));
        // Keys in the transcript are door-prefixed: compare them without the prefix.
        let t: Vec<String> = t
            .iter()
            .map(|(c, v)| format!("{c} {v}").replace(&format!("{name}-"), ""))
            .collect();
        transcripts.push((name, t));
    }
    let (first, reference) = &transcripts[0];
    for (name, t) in &transcripts[1..] {
        assert_eq!(t, reference, "{name} prints what {first} prints");
    }
    env.stop().await;
}

/// Bytes 0..=255 written through each door read back exactly through every door.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_values_round_trip_across_doors() {
    let env = TestEnv::start(Broker::Embedded).await;
    let all: Vec<u8> = (0..=255).collect();
    for (writer, wdoor) in doors(&env) {
        let key = format!("from-{writer}");
        expect(run(&["set", &key, "-"], &wdoor, Some(&all)).await, 0, "set");
        for (reader, rdoor) in doors(&env) {
            let got = expect(run(&["get", &key, "--raw"], &rdoor, None).await, 0, "get");
            assert_eq!(got.stdout, all, "written over {writer}, read over {reader}");
            let human = run(&["get", &key], &rdoor, None).await;
            assert!(human.text().starts_with("\\x00\\x01"), "{reader}: {}", human.text());
        }
    }
    env.stop().await;
}

/// Exit codes 2 (usage), 3 (conflict), 4 (not authorized) and 5 (unreachable, timed out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_scripts_can_rely_on() {
    let env = TestEnv::start_with(Broker::Embedded, |c| c.http.api_token = Some("s3cret".into())).await;
    let [mqtt, http, grpc] = doors(&env).map(|(_, d)| d);
    let with_token = |d: &[String]| [d, &["--api-token".to_owned(), "s3cret".to_owned()]].concat();
    let (http_t, grpc_t) = (with_token(&http), with_token(&grpc));
    for (args, door, why) in [
        (&["set", "k", "v", "--nx", "--nex"][..], &mqtt, "conflicting flags"),
        (&["get"], &mqtt, "no key"),
        (&["get", ""], &mqtt, "empty key"),
        (
            &["set", "k", "v", "--if-version", "1:0:n"],
            &mqtt,
            "no version condition over MQTT",
        ),
        (
            &["del", "k", "--if-version", "1:0:n"],
            &mqtt,
            "no version condition over MQTT",
        ),
        (&["watch", "--pattern", "a*"], &mqtt, "no pattern watch over MQTT"),
        (&["set", "a||b", "v"], &http_t, "a key the Dapr API refuses"),
        (
            &["--storage", "memory", "get", "k"],
            &mqtt,
            "serve flags with a client command",
        ),
        (
            &["get", "k", "--client-id", "a/b"],
            &mqtt,
            "a client id that is not a topic level",
        ),
    ] {
        expect(run(args, door, None).await, 2, why);
    }
    // A key that is not UTF-8 cannot be named over HTTP.
    let key = <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(b"\xff");
    let out = command(&["get"], &http_t).arg(key).output().await.unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");

    // 3: version mismatch and fencing refusals, on every door that has them.
    for door in [&mqtt, &http_t, &grpc_t] {
        let v1 = run(&["set", "fenced", "1", "--json"], door, None).await.json()[0]["version"].clone();
        let v1 = v1.as_str().unwrap().to_owned();
        let lower = "000000000000001:00000:old";
        expect(
            run(&["set", "fenced", "2", "--fencing-token", &v1], door, None).await,
            0,
            "fence",
        );
        expect(
            run(&["set", "fenced", "3"], door, None).await,
            3,
            "fencing token required",
        );
        expect(
            run(&["set", "fenced", "3", "--fencing-token", lower], door, None).await,
            3,
            "lower token",
        );
        expect(run(&["del", "fenced"], door, None).await, 3, "fencing token required");
        expect(
            run(&["vdel", "fenced", "2"], door, None).await,
            3,
            "fencing token required",
        );
        expect(
            run(&["del", "fenced", "--fencing-token", &v1], door, None).await,
            0,
            "del with token",
        );
    }
    for door in [&http_t, &grpc_t] {
        let v1 = run(&["set", "ver", "1", "--json"], door, None).await.json()[0]["version"].clone();
        let v1 = v1.as_str().unwrap().to_owned();
        expect(
            run(&["set", "ver", "2", "--if-version", &v1], door, None).await,
            0,
            "at the version",
        );
        expect(
            run(&["set", "ver", "3", "--if-version", &v1], door, None).await,
            3,
            "stale version",
        );
        expect(
            run(&["del", "ver", "--if-version", &v1], door, None).await,
            3,
            "stale version",
        );
        expect(run(&["get", "ver", "--raw"], door, None).await, 0, "unchanged");
    }
    // 4: a wrong or missing API token.
    for door in [&http, &grpc] {
        expect(run(&["get", "k"], door, None).await, 4, "no token");
        let wrong = [&door[..], &["--api-token".to_owned(), "nope".to_owned()]].concat();
        expect(run(&["get", "k"], &wrong, None).await, 4, "wrong token");
    }
    // 5: nothing listening, and a listener that never answers (bounded by --timeout).
    let closed = crate::support::free_port();
    for door in [
        vec!["--mqtt-url".to_owned(), format!("mqtt://127.0.0.1:{closed}")],
        vec!["--http".to_owned(), format!("http://127.0.0.1:{closed}")],
        vec!["--grpc".to_owned(), format!("http://127.0.0.1:{closed}")],
    ] {
        let ran = expect(run(&["get", "k"], &door, None).await, 5, "unreachable");
        assert!(ran.stderr.contains("127.0.0.1"), "{}", ran.stderr);
    }
    // A broker without the state store behind it: the request times out.
    let broker = crate::support::Mosquitto::start().await;
    let door = vec!["--mqtt-url".to_owned(), format!("mqtt://127.0.0.1:{}", broker.port)];
    let ran = run(&["get", "k", "--timeout", "300ms"], &door, None).await;
    assert_eq!(ran.code, 5, "{ran:?}");
    assert!(ran.stderr.contains("timed out"), "{}", ran.stderr);
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    for door in [
        vec!["--mqtt-url".to_owned(), format!("mqtt://127.0.0.1:{port}")],
        vec!["--http".to_owned(), format!("http://127.0.0.1:{port}")],
    ] {
        let started = std::time::Instant::now();
        let ran = run(&["get", "k", "--timeout", "300ms"], &door, None).await;
        assert_eq!(ran.code, 5, "{ran:?}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "bounded by --timeout"
        );
    }
    env.stop().await;
}

/// `stategate --help` lists the client commands and the exit codes; serve flags still parse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn help_lists_the_client_commands() {
    let help = run(&["--help"], &[], None).await;
    assert_eq!(help.code, 0);
    for word in [
        "serve",
        "get",
        "set",
        "del",
        "vdel",
        "scan",
        "watch",
        "lock",
        "unlock",
        "Exit codes",
        "--mqtt-listen",
    ] {
        assert!(help.text().contains(word), "{word} missing from --help");
    }
    let help = run(&["set", "--help"], &[], None).await;
    for word in [
        "--nx",
        "--nex",
        "--px",
        "--ttl",
        "--if-version",
        "--fencing-token",
        "STATEGATE_",
        "--json",
        "rounded up",
    ] {
        assert!(help.text().contains(word), "{word} missing from set --help");
    }
    let help = run(&["lock", "--help"], &[], None).await;
    assert!(help.text().contains("STATEGATE_FENCING_TOKEN"), "{}", help.text());
}
