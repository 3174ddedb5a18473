//! Browsers on behalf of other sites: a cross-site "simple" request (no preflight) and a
//! DNS-rebinding host name are refused before anything runs; clients that send no `Origin`
//! (curl, the SDKs, daprd) and the service's own pages keep working.

use reqwest::StatusCode;
use stategate::http::BrowserPolicy;

use crate::support::{Broker, TestEnv};

async fn loopback_env(allowed_origins: &[&str]) -> TestEnv {
    let origins: Vec<String> = allowed_origins.iter().map(|s| s.to_string()).collect();
    TestEnv::start_with(Broker::Embedded, move |c| {
        c.http.browser = BrowserPolicy {
            allowed_origins: origins,
            loopback_hosts_only: true,
            allowed_hosts: vec![],
        };
    })
    .await
}

#[tokio::test]
async fn a_cross_site_form_post_is_refused_and_stores_nothing() {
    let env = loopback_env(&[]).await;
    let c = reqwest::Client::new();
    let save = |origin: Option<&str>| {
        let mut r = c
            .post(format!("{}/v1.0/state/statestore", env.http()))
            .header("content-type", "text/plain")
            .body(r#"[{"key":"csrf","value":"planted"}]"#);
        if let Some(o) = origin {
            r = r.header("origin", o);
        }
        r.send()
    };
    let r = save(Some("https://evil.example")).await.unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["errorCode"], "ERR_FORBIDDEN_ORIGIN", "{body}");
    let r = save(Some("null")).await.unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let got = c
        .get(format!("{}/v1.0/state/statestore/csrf", env.http()))
        .send()
        .await
        .unwrap();
    assert_eq!(got.status(), StatusCode::NO_CONTENT, "a refused save changes nothing");

    // The service's own pages (the console) and clients without Origin are served.
    let own = env.http();
    assert_eq!(save(Some(&own)).await.unwrap().status(), StatusCode::NO_CONTENT);
    assert_eq!(save(None).await.unwrap().status(), StatusCode::NO_CONTENT);
    env.stop().await;
}

#[tokio::test]
async fn a_rebinding_host_name_reads_nothing() {
    let env = loopback_env(&[]).await;
    let c = reqwest::Client::new();
    c.post(format!("{}/v1.0/state/statestore", env.http()))
        .body(r#"[{"key":"secret","value":"s3cret"}]"#)
        .send()
        .await
        .unwrap();
    for path in ["/v1.0/state/statestore/secret", "/v1.0-alpha1/stategate/export", "/ui/"] {
        let r = c
            .get(format!("{}{path}", env.http()))
            .header("host", "rebind.evil.example:3500")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "{path}");
        let body = r.text().await.unwrap();
        assert!(
            body.contains("ERR_FORBIDDEN_HOST") && !body.contains("s3cret"),
            "{path}: {body}"
        );
    }
    let r = c
        .get(format!("{}/v1.0/state/statestore/secret", env.http()))
        .header("host", "localhost")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    env.stop().await;
}

#[tokio::test]
async fn allowed_origins_are_served() {
    let env = loopback_env(&["https://dashboard.example"]).await;
    let r = reqwest::Client::new()
        .post(format!("{}/v1.0/state/statestore", env.http()))
        .header("origin", "https://dashboard.example")
        .body(r#"[{"key":"k","value":1}]"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    env.stop().await;
}
