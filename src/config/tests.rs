use super::*;

#[test]
fn defaults_are_valid_and_embedded_on_loopback() {
    let c = Config::default();
    assert_eq!(c.node_id, "stategate");
    if cfg!(feature = "embedded-broker") {
        assert_eq!(
            c.broker,
            BrokerChoice::Embedded {
                listen: "127.0.0.1:1883".parse().unwrap(),
                client_path: false,
            }
        );
    }
    assert!(c.limits.observers.idle.is_none());
}

#[test]
fn mqtt_urls() {
    let ext = |h: &str, p| BrokerChoice::External {
        host: h.into(),
        port: p,
    };
    assert_eq!(parse_mqtt_url("mqtt://localhost:1884").unwrap(), ext("localhost", 1884));
    assert_eq!(parse_mqtt_url("mqtt://10.0.0.1").unwrap(), ext("10.0.0.1", 1883));
    assert_eq!(parse_mqtt_url("tcp://[::1]:1883/").unwrap(), ext("::1", 1883));
    assert!(matches!(
        parse_mqtt_url("mqtts://h:8883"),
        Err(ConfigError::TlsUnsupported(_))
    ));
    for bad in ["http://h:1", "mqtt://", "mqtt://h:x", "mqtt://h:70000", "h:1883"] {
        assert!(matches!(parse_mqtt_url(bad), Err(ConfigError::BadMqttUrl(_))), "{bad}");
    }
}

#[test]
fn external_broker_turns_on_observer_idle_expiry() {
    let mut a = ServeArgs::default();
    a.mqtt_url = Some("mqtt://127.0.0.1:1".into());
    let c = Config::from_args(a).unwrap();
    assert_eq!(c.limits.observers.idle, Some(Duration::from_secs(86_400)));
}

#[test]
fn bad_values_are_refused() {
    let mut a = ServeArgs::default();
    a.node_id = "a:b".into();
    assert!(matches!(Config::from_args(a), Err(ConfigError::BadNodeId(_))));
    let mut a = ServeArgs::default();
    a.mqtt_max_packet_bytes = 1024;
    assert!(matches!(Config::from_args(a), Err(ConfigError::PacketTooSmall { .. })));
}

#[test]
fn storage_flags() {
    let c = Config::default();
    assert_eq!(c.storage.kind, StorageKind::Durable);
    assert_eq!(c.storage.data_dir, PathBuf::from("./stategate-data"));
    assert_eq!(c.storage.fsync, FsyncMode::Always);
    let cli = Cli::try_parse_from([
        "stategate",
        "--storage",
        "memory",
        "--fsync",
        "batch",
        "--data-dir",
        "/d",
    ])
    .unwrap();
    let c = Config::from_args(cli.serve).unwrap();
    assert_eq!(c.storage.kind, StorageKind::Memory);
    assert_eq!(c.storage.fsync, FsyncMode::Batch);
    assert_eq!(c.storage.data_dir, PathBuf::from("/d"));
    let err = Cli::try_parse_from(["stategate", "--storage", "disk"])
        .unwrap_err()
        .to_string();
    assert!(err.contains("expected durable, memory or redis://host:port"), "{err}");
    let err = Cli::try_parse_from(["stategate", "--fsync", "sometimes"])
        .unwrap_err()
        .to_string();
    assert!(err.contains("expected always, batch or never"), "{err}");
}

#[test]
fn redis_storage_flags() {
    let c = Config::default();
    assert_eq!(c.storage.redis, RedisOptions::default());
    assert_eq!(c.storage.redis.prefix, "stategate:");
    assert_eq!(c.storage.redis.timeout, Duration::from_millis(1000));
    let cli = Cli::try_parse_from([
        "stategate",
        "--storage",
        "redis://app:s3cret@10.0.0.5:6380/2",
        "--redis-prefix",
        "{sg}:",
        "--redis-timeout-ms",
        "250",
        "--redis-wait-replicas",
        "1",
        "--redis-startup-wait-secs",
        "5",
    ]);
    if cfg!(feature = "redis") {
        let c = Config::from_args(cli.unwrap().serve).unwrap();
        let StorageKind::Redis(url) = &c.storage.kind else {
            panic!("not redis: {:?}", c.storage.kind);
        };
        assert_eq!(url.expose(), "redis://app:s3cret@10.0.0.5:6380/2");
        assert_eq!(
            url.to_string(),
            "redis://app:***@10.0.0.5:6380/2",
            "no password in logs"
        );
        assert!(!format!("{c:?}").contains("s3cret"), "no password in Debug either");
        assert_eq!(c.storage.redis.prefix, "{sg}:");
        assert_eq!(c.storage.redis.timeout, Duration::from_millis(250));
        assert_eq!(c.storage.redis.wait_replicas, 1);
        assert_eq!(c.storage.redis.startup_wait, Duration::from_secs(5));
    } else {
        let err = cli.unwrap_err().to_string();
        assert!(err.contains("without the cargo feature `redis`"), "{err}");
        assert!(!err.contains("s3cret"), "{err}");
    }
}

#[test]
fn flags_parse_with_and_without_the_subcommand() {
    let cli = Cli::try_parse_from(["stategate", "--max-keys", "5"]).unwrap();
    assert_eq!(cli.serve.max_keys, Some(5));
    assert!(Config::default().http.ui, "the web console is on by default");
    let cli = Cli::try_parse_from(["stategate", "--no-ui"]).unwrap();
    assert!(!Config::from_args(cli.serve).unwrap().http.ui);
    let cli = Cli::try_parse_from(["stategate", "serve", "--node-id", "n2"]).unwrap();
    match cli.command {
        Some(CliCommand::Serve(a)) => assert_eq!(a.node_id, "n2"),
        other => panic!("expected serve, got {other:?}"),
    }
}
