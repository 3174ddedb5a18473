use std::path::PathBuf;

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
    for bad in [
        "http://h:1",
        "mqtt://",
        "mqtt://h:x",
        "mqtt://h:70000",
        "h:1883",
        "mqtt://@h",
        "mqtt://u:%zz@h",
    ] {
        assert!(matches!(parse_mqtt_url(bad), Err(ConfigError::MqttUrl(_))), "{bad}");
    }
}

#[test]
fn broker_urls_with_tls_and_credentials() {
    let u = parse_broker_url("mqtts://svc:p%40ss:w@broker.example:8884").unwrap();
    assert_eq!((u.host.as_str(), u.port, u.tls), ("broker.example", 8884, true));
    let c = u.credentials.unwrap();
    assert_eq!((c.username.as_str(), c.password.as_str()), ("svc", "p@ss:w"));
    assert!(!format!("{c:?}").contains("p@ss"), "no password in Debug");
    assert_eq!(
        parse_broker_url("mqtts://[::1]").unwrap().port,
        8883,
        "TLS default port"
    );
    assert_eq!(
        parse_broker_url("mqtt://u@h").unwrap().credentials.unwrap().password,
        ""
    );
    let err = parse_broker_url("mqtts://u:secret@h:x").unwrap_err().to_string();
    assert!(!err.contains("secret") && err.contains("u:***@h:x"), "{err}");
}

#[test]
fn plain_listeners_beyond_loopback_are_refused() {
    let refused = |args: &[&str]| {
        let mut all = vec!["stategate"];
        all.extend_from_slice(args);
        Config::from_args(Cli::try_parse_from(all).unwrap().serve)
    };
    for (args, flag) in [
        (&["--http-listen", "0.0.0.0:3500"][..], "--http-listen"),
        (&["--grpc-listen", "192.0.2.1:50001"][..], "--grpc-listen"),
        (&["--mqtt-listen", "[::]:1883"][..], "--mqtt-listen"),
        (&["--metrics-listen", "0.0.0.0:9090"][..], "--metrics-listen"),
    ] {
        match refused(args) {
            Err(ConfigError::InsecureListen { flag: f, .. }) => assert_eq!(f, flag),
            other => panic!("{args:?}: {other:?}"),
        }
    }
    assert!(refused(&["--http-listen", "0.0.0.0:3500", "--allow-insecure-listen"]).is_ok());
    // TLS doors may bind anywhere; the plain MQTT listener still may not.
    let tls = ["--tls-cert", "c.pem", "--tls-key", "k.pem"];
    let mut a = tls.to_vec();
    a.extend(["--http-listen", "0.0.0.0:3500", "--grpc-listen", "0.0.0.0:50001"]);
    assert!(refused(&a).is_ok());
    let mut a = tls.to_vec();
    a.extend(["--mqtt-listen", "0.0.0.0:1883"]);
    assert!(matches!(refused(&a), Err(ConfigError::InsecureListen { .. })));
    // The metrics listener has no TLS of its own: TLS on the doors does not open it.
    let mut a = tls.to_vec();
    a.extend(["--metrics-listen", "0.0.0.0:9090"]);
    assert!(matches!(
        refused(&a),
        Err(ConfigError::InsecureListen {
            flag: "--metrics-listen",
            ..
        })
    ));
    assert!(refused(&["--metrics-listen", "127.0.0.1:9090"]).is_ok());
    assert!(Cli::try_parse_from(["stategate", "--mqtt-tls-client-ca", "ca.pem"]).is_err());
    let mut a = tls.to_vec();
    a.extend(["--mqtt-tls-client-ca", "ca.pem", "--mqtt-tls-listen", "off"]);
    assert!(matches!(refused(&a), Err(ConfigError::ClientCaWithoutListener)));
}

#[test]
fn external_broker_turns_on_observer_idle_expiry() {
    let a = ServeArgs {
        mqtt_url: Some("mqtt://127.0.0.1:1".into()),
        ..ServeArgs::default()
    };
    let c = Config::from_args(a).unwrap();
    assert_eq!(c.limits.observers.idle, Some(Duration::from_secs(86_400)));
}

#[test]
fn bad_values_are_refused() {
    let a = ServeArgs {
        node_id: "a:b".into(),
        ..ServeArgs::default()
    };
    assert!(matches!(Config::from_args(a), Err(ConfigError::BadNodeId(_))));
    // What would break a version, an SSE event id (a newline) or a log line is refused.
    for bad in ["", "a\nb", "a b", "é", "a/b", &"n".repeat(65)] {
        let a = ServeArgs {
            node_id: bad.into(),
            ..ServeArgs::default()
        };
        assert!(
            matches!(Config::from_args(a), Err(ConfigError::BadNodeId(_))),
            "{bad:?}"
        );
    }
    for good in ["n1", "edge-gw_01.site", &"n".repeat(64)] {
        let a = ServeArgs {
            node_id: good.into(),
            ..ServeArgs::default()
        };
        assert!(Config::from_args(a).is_ok(), "{good:?}");
    }
    let a = ServeArgs {
        mqtt_max_packet_bytes: 1024,
        ..ServeArgs::default()
    };
    assert!(matches!(Config::from_args(a), Err(ConfigError::PacketTooSmall { .. })));
}

/// `--mqtt-bind-client-id` binds client ids to identities; without a password file or client
/// certificates an identity is whatever the client typed, so the flag alone is refused.
#[test]
#[cfg(feature = "embedded-broker")]
fn binding_client_ids_needs_verified_identities() {
    let a = ServeArgs {
        mqtt_bind_client_id: true,
        ..ServeArgs::default()
    };
    let e = Config::from_args(a).unwrap_err();
    assert!(matches!(e, ConfigError::BindNeedsVerifiedIdentities), "{e}");
    assert_eq!(e.setting(), Some("mqtt-bind-client-id"));
    let users = tempfile::NamedTempFile::new().unwrap();
    let a = ServeArgs {
        mqtt_bind_client_id: true,
        mqtt_auth_file: Some(users.path().to_owned()),
        ..ServeArgs::default()
    };
    assert!(Config::from_args(a).is_ok(), "with a password file");
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

#[test]
fn store_and_history_flags() {
    let c = Config::default();
    assert_eq!(c.dapr.lock_stores.names().collect::<Vec<_>>(), ["lockstore"]);
    assert_eq!(c.dapr.configuration_stores.names().collect::<Vec<_>>(), ["configstore"]);
    assert_eq!(c.limits.feed, FeedLimits::default());
    let cli = Cli::try_parse_from([
        "stategate",
        "--lock-store",
        "locks=name,leases",
        "--watch-history-events",
        "10",
        "--watch-history-secs",
        "5",
    ])
    .unwrap();
    let c = Config::from_args(cli.serve).unwrap();
    assert_eq!(c.dapr.lock_stores.names().collect::<Vec<_>>(), ["locks", "leases"]);
    assert_eq!(c.limits.feed.max_events, 10);
    assert_eq!(c.limits.feed.max_age, Duration::from_secs(5));
    let cli = Cli::try_parse_from(["stategate", "--configuration-store", "a=x||y"]).unwrap();
    let err = Config::from_args(cli.serve).unwrap_err().to_string();
    assert!(err.starts_with("--configuration-store: "), "{err}");
}

mod file_layering {
    use std::ffi::OsString;
    use std::io::Write;

    use super::super::file::{self, FileError, LayerError};
    use super::*;

    fn write(text: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(text.as_bytes()).unwrap();
        f
    }

    fn layer_with(file: &tempfile::NamedTempFile, extra: &[&str]) -> Result<file::Layered, LayerError> {
        let mut argv: Vec<OsString> = vec!["stategate".into(), "--config".into(), file.path().into()];
        argv.extend(extra.iter().map(OsString::from));
        file::layer(&argv)
    }

    fn file_error(text: &str) -> FileError {
        match layer_with(&write(text), &[]) {
            Err(LayerError::File(e)) => e,
            other => panic!("{text:?}: expected a file error, got {other:?}"),
        }
    }

    /// Sample values for settings that have no default (the test cannot invent one). A new
    /// flag without a default fails `every_flag_is_a_setting_and_in_config_default` until it
    /// has a sample here.
    fn sample(key: &str) -> Option<&'static str> {
        Some(match key {
            "mqtt-url" => "\"mqtt://127.0.0.1:1883\"",
            "mqtt-share-group" => "\"g\"",
            "max-keys" => "10",
            "api-token" => "\"t\"",
            "state-store" => "[\"a\", \"b=none\"]",
            "dapr-component-socket" => "\"/tmp/x.sock\"",
            "log-level" => "\"debug\"",
            "mqtt-auth-file" => "\"/etc/stategate/passwd\"",
            "acl-file" => "\"/etc/stategate/acl.toml\"",
            "api-token-file" => "\"/etc/stategate/tokens\"",
            "mqtt-session-expiry-secs" => "3600",
            "encryption-key-file" => "\"/etc/stategate/key\"",
            "lock-store" => "[\"locks=name\"]",
            "configuration-store" => "[\"config=none\"]",
            "http-allowed-origins" => "[\"https://dashboard.example\"]",
            "http-allowed-hosts" => "[\"gateway.lan\"]",
            "tls-cert" => "\"/etc/stategate/tls/cert.pem\"",
            "tls-key" => "\"/etc/stategate/tls/key.pem\"",
            "mqtt-tls-client-ca" => "\"/etc/stategate/tls/clients-ca.pem\"",
            "mqtt-ca-file" => "\"/etc/stategate/tls/broker-ca.pem\"",
            "state-topics" => "\"state/\"",
            _ => return None,
        })
    }

    #[test]
    fn every_flag_is_a_setting_and_in_config_default() {
        let default_file = file::default_file();
        let cmd = file::serve_command();
        let mut n = 0;
        for arg in file::settings(&cmd) {
            let key = arg.get_long().unwrap();
            n += 1;
            assert!(
                default_file.contains(&format!("\n{key} = ")) || default_file.contains(&format!("\n# {key} = ")),
                "`{key}` is missing from `config default`"
            );
            // The value `config default` prints (or a sample), set from a file, must be taken.
            let line = default_file
                .lines()
                .find(|l| l.starts_with(&format!("{key} = ")))
                .map(|l| l[key.len() + 3..].to_owned());
            let value = line
                .or_else(|| sample(key).map(str::to_owned))
                .unwrap_or_else(|| panic!("`{key}` has no default: give it a sample value in this test"));
            // Settings that need others (clap `requires`) come with them.
            let companions = match key {
                "tls-cert" | "tls-key" | "mqtt-tls-client-ca" => {
                    "tls-cert = \"/etc/stategate/tls/cert.pem\"\ntls-key = \"/etc/stategate/tls/key.pem\"\n"
                }
                _ => "",
            };
            let text = format!("{key} = {value}\n{}", companions.replace(&format!("{key} = "), "# "));
            let layered =
                layer_with(&write(&text), &[]).unwrap_or_else(|e| panic!("`{key} = {value}` is refused: {e:?}"));
            let switch_off = value == "false";
            assert!(
                switch_off || layered.from_file.contains(key),
                "`{key}` from the file was not applied"
            );
        }
        assert!(n > 30, "only {n} settings found");
    }

    #[test]
    fn the_default_file_loads_and_changes_nothing() {
        let layered = layer_with(&write(&file::default_file()), &[]).unwrap();
        let from_file = Config::from_args(layered.args).unwrap();
        let defaults = Config::default();
        assert_eq!(format!("{from_file:?}"), format!("{defaults:?}"));
    }

    #[test]
    fn file_under_flags_over_defaults() {
        let f = write("node-id = \"from-file\"\nmax-keys = 7\nno-ui = true\nstate-store = [\"a\", \"b=none\"]\n");
        let l = layer_with(&f, &[]).unwrap();
        assert_eq!(l.args.node_id, "from-file");
        assert_eq!(l.args.max_keys, Some(7));
        assert!(l.args.no_ui);
        assert_eq!(l.args.state_stores, vec!["a", "b=none"]);
        assert_eq!(
            l.args.http_listen, "127.0.0.1:3500",
            "untouched settings keep their default"
        );
        let l = layer_with(&f, &["--node-id", "from-flag"]).unwrap();
        assert_eq!(l.args.node_id, "from-flag");
        assert!(!l.from_file.contains("node-id"));
        assert_eq!(l.args.max_keys, Some(7));
        // The `serve` subcommand form too.
        let argv: Vec<OsString> = vec![
            "stategate".into(),
            "serve".into(),
            "--config".into(),
            f.path().into(),
            "--max-keys".into(),
            "9".into(),
        ];
        let l = file::layer(&argv).unwrap();
        assert_eq!((l.args.node_id.as_str(), l.args.max_keys), ("from-file", Some(9)));
    }

    #[test]
    fn changed_settings_are_named() {
        let a = layer_with(&write("max-keys = 7\n"), &[]).unwrap();
        let b = layer_with(&write("max-keys = 8\nlog-level = \"debug\"\n"), &[]).unwrap();
        assert_eq!(a.changed(&b), vec!["log-level".to_owned(), "max-keys".to_owned()]);
        assert!(a.changed(&a).is_empty());
    }

    #[test]
    fn every_error_names_the_file_and_the_setting() {
        let cases = [
            ("bogus = 1\n", "unknown setting `bogus`"),
            ("config = \"/x.toml\"\n", "unknown setting `config`"),
            ("max-keys = \"many\"\n", "setting `max-keys`: invalid value 'many'"),
            ("max-keys = [1, 2]\n", "setting `max-keys`: expected a single value"),
            (
                "max-keys = { a = 1 }\n",
                "setting `max-keys`: expected a string, a number or a boolean",
            ),
            ("no-ui = \"yes\"\n", "setting `no-ui`: expected true or false"),
            ("storage = \"disk\"\n", "setting `storage`: invalid value 'disk'"),
            ("fsync = \"sometimes\"\n", "setting `fsync`"),
            ("shutdown-grace = \"soon\"\n", "setting `shutdown-grace`"),
            ("log-format = \"xml\"\n", "setting `log-format`"),
            ("max-keys = 1\nmax-keys = 2\n", "not a valid TOML"),
            ("[section\n", "not a valid TOML"),
        ];
        for (text, want) in cases {
            let f = write(text);
            let e = match layer_with(&f, &[]) {
                Err(LayerError::File(e)) => e,
                other => panic!("{text:?}: expected a file error, got {other:?}"),
            };
            let msg = e.to_string();
            assert!(msg.starts_with(&f.path().display().to_string()), "{text:?}: {msg}");
            assert!(msg.contains(want), "{text:?}: {msg}");
        }
        // A file the command line overrides is still checked whole.
        let f = write("max-keys = \"many\"\n");
        assert!(matches!(layer_with(&f, &["--max-keys", "3"]), Err(LayerError::File(_))));
        let missing = vec![
            OsString::from("stategate"),
            "--config".into(),
            "/nonexistent/stategate.toml".into(),
        ];
        match file::layer(&missing) {
            Err(LayerError::File(e @ FileError::Read { .. })) => {
                assert!(e.to_string().contains("/nonexistent/stategate.toml"), "{e}")
            }
            other => panic!("expected a read error, got {other:?}"),
        }
        let _ = file_error("x = 1\n");
    }

    #[test]
    fn semantic_errors_name_their_setting() {
        let a = ServeArgs {
            node_id: "a:b".into(),
            ..ServeArgs::default()
        };
        assert_eq!(Config::from_args(a).unwrap_err().setting(), Some("node-id"));
        let a = ServeArgs {
            metrics_listen: "nowhere".into(),
            ..ServeArgs::default()
        };
        assert_eq!(Config::from_args(a).unwrap_err().setting(), Some("metrics-listen"));
        let a = ServeArgs {
            log_level: Some("stategate=loud".into()),
            ..ServeArgs::default()
        };
        assert_eq!(Config::from_args(a).unwrap_err().setting(), Some("log-level"));
    }

    #[test]
    fn log_filters() {
        assert_eq!(OpsSettings::log_filter(None, None), "stategate=info");
        assert_eq!(OpsSettings::log_filter(Some("debug"), Some("warn")), "stategate=debug");
        assert_eq!(OpsSettings::log_filter(None, Some("rmqtt=info")), "rmqtt=info");
        assert_eq!(OpsSettings::log_filter(Some(" "), None), "stategate=info");
    }
}

#[test]
fn the_http_door_checks_browser_hosts_only_on_loopback() {
    let config = |args: &[&str]| {
        let mut all = vec!["stategate"];
        all.extend_from_slice(args);
        Config::from_args(Cli::try_parse_from(all).unwrap().serve).unwrap()
    };
    let c = config(&[]);
    assert!(c.http.browser.loopback_hosts_only);
    assert!(c.http.browser.allowed_origins.is_empty() && c.http.browser.allowed_hosts.is_empty());
    let c = config(&[
        "--http-allowed-origins",
        "https://a.example,https://b.example",
        "--http-allowed-hosts",
        "gateway.lan",
    ]);
    assert_eq!(
        c.http.browser.allowed_origins,
        ["https://a.example", "https://b.example"]
    );
    assert_eq!(c.http.browser.allowed_hosts, ["gateway.lan"]);
    let c = config(&["--http-listen", "0.0.0.0:3500", "--allow-insecure-listen"]);
    assert!(!c.http.browser.loopback_hosts_only);
}
