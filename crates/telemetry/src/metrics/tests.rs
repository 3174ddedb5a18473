use std::time::Instant;

use super::*;

#[tokio::test]
async fn requests_are_counted_by_door_command_and_outcome() {
    let m = Metrics::new();
    let t = Instant::now();
    m.request(Door::Http, Cmd::Get, Outcome::Ok, t);
    m.request(Door::Http, Cmd::Get, Outcome::Ok, t);
    m.request(Door::Mqtt, Cmd::Set, Outcome::Unavailable, t);
    let text = m.render(&Sources::default()).await.unwrap();
    assert!(
        text.contains(r#"stategate_requests_total{command="get",door="http",outcome="ok"} 2"#),
        "{text}"
    );
    assert!(text.contains(r#"stategate_requests_total{command="set",door="mqtt",outcome="unavailable"} 1"#));
    assert!(text.contains(r#"stategate_request_duration_seconds_count{command="get",door="http"} 2"#));
}

#[tokio::test]
async fn disabled_records_nothing_but_keeps_the_link_state() {
    let m = Metrics::disabled();
    m.request(Door::Http, Cmd::Get, Outcome::Ok, Instant::now());
    assert!(m.render(&Sources::default()).await.is_none());
    assert!(!m.mqtt_subscribed());
    m.mqtt_link(Link::Subscribed);
    assert!(m.mqtt_subscribed());
}

#[tokio::test]
async fn streams_and_reconnects() {
    let m = Metrics::new();
    let g = m.stream_opened(Stream::Sse);
    let text = m.render(&Sources::default()).await.unwrap();
    assert!(text.contains(r#"stategate_streams_active{kind="sse"} 1"#), "{text}");
    drop(g);
    m.mqtt_link(Link::Connected);
    m.mqtt_link(Link::Subscribed);
    m.mqtt_link(Link::Down);
    m.mqtt_link(Link::Connected);
    let text = m.render(&Sources::default()).await.unwrap();
    assert!(text.contains(r#"stategate_streams_active{kind="sse"} 0"#), "{text}");
    assert!(text.contains("stategate_mqtt_reconnects_total 1"), "{text}");
    assert!(text.contains("stategate_mqtt_connected 1"), "{text}");
    assert!(text.contains("stategate_mqtt_subscribed 0"), "{text}");
}

#[test]
fn labels() {
    assert_eq!(Cmd::from_verb(b"keynotify"), Cmd::KeyNotify);
    assert_eq!(Cmd::from_verb(b"HELLO"), Cmd::Other);
    assert_eq!(Cmd::from_grpc_method("ExecuteStateTransaction"), Cmd::Transaction);
    assert_eq!(Outcome::from_status(503), Outcome::Unavailable);
    assert_eq!(Outcome::from_status(409), Outcome::ClientError);
    assert_eq!(Outcome::from_status(204), Outcome::Ok);
    assert_eq!(Outcome::from_grpc(14), Outcome::Unavailable);
    assert_eq!(Outcome::from_grpc(3), Outcome::ClientError);
}
