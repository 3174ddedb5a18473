//! The official Python Dapr SDK as a peer a test drives one call at a time
//! (`tests/python/dapr_sdk_repl.py`), so its calls interleave with other clients'.

use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

use crate::support::TestEnv;

/// The SDK's first connection waits for the HTTP health probe; later calls are quick.
const START: Duration = Duration::from_secs(60);
const CALL: Duration = Duration::from_secs(20);

pub struct PySdk {
    child: Child,
    stdin: ChildStdin,
    replies: mpsc::UnboundedReceiver<Value>,
    events: mpsc::UnboundedReceiver<Value>,
    stderr: tokio::task::JoinHandle<String>,
}

impl PySdk {
    /// Starts the SDK against the service's gRPC and HTTP doors; returns once it is connected.
    pub async fn start(env: &TestEnv) -> PySdk {
        let python = crate::grpc::dapr_sdk_python().await;
        let script = crate::support::repo_path("tests/python/dapr_sdk_repl.py");
        let mut child = Command::new(python)
            .arg(script)
            .arg(env.grpc())
            .arg(env.http())
            .env("PYTHONUNBUFFERED", "1")
            .env_remove("DAPR_API_TOKEN")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start python");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let mut stderr = child.stderr.take().expect("stderr");
        let stderr = tokio::spawn(async move {
            let mut s = String::new();
            let _ = tokio::io::AsyncReadExt::read_to_string(&mut stderr, &mut s).await;
            s
        });
        let (reply_tx, replies) = mpsc::unbounded_channel();
        let (event_tx, events) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let Ok(v) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                let _ = if v.get("event").is_some() {
                    event_tx.send(v["event"].clone())
                } else {
                    reply_tx.send(v)
                };
            }
        });
        let mut sdk = PySdk {
            child,
            stdin,
            replies,
            events,
            stderr,
        };
        let ready = sdk.next_reply(START, "the Python SDK to connect").await;
        assert_eq!(ready, json!({"ready": true}));
        sdk
    }

    async fn next_reply(&mut self, limit: Duration, what: &str) -> Value {
        match tokio::time::timeout(limit, self.replies.recv()).await {
            Ok(Some(v)) => v,
            Ok(None) | Err(_) => {
                let _ = self.child.start_kill();
                let stderr = (&mut self.stderr).await.unwrap_or_default();
                panic!("no answer from the Python SDK for {what}; its stderr:\n{stderr}");
            }
        }
    }

    /// Runs one command; the SDK's reply, or the error text it raised as `Err`.
    pub async fn try_call(&mut self, cmd: Value) -> Result<Value, String> {
        let mut line = cmd.to_string();
        line.push('\n');
        self.stdin.write_all(line.as_bytes()).await.expect("write to python");
        let what = format!("{cmd}");
        let v = self.next_reply(CALL, &what).await;
        match v.get("error") {
            Some(e) => Err(e.as_str().unwrap_or_default().to_owned()),
            None => Ok(v["reply"].clone()),
        }
    }

    /// Runs one command that must succeed.
    pub async fn call(&mut self, cmd: Value) -> Value {
        let what = cmd.to_string();
        self.try_call(cmd)
            .await
            .unwrap_or_else(|e| panic!("the Python SDK failed {what}: {e}"))
    }

    /// The next event a configuration subscription handler got.
    pub async fn event(&mut self) -> Value {
        match tokio::time::timeout(CALL, self.events.recv()).await {
            Ok(Some(v)) => v,
            _ => panic!("no configuration event reached the Python SDK's handler"),
        }
    }

    pub async fn quit(mut self) {
        let _ = self.try_call(json!({"op": "quit"})).await;
        let _ = tokio::time::timeout(CALL, self.child.wait()).await;
    }
}
