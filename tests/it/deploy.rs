//! The deploy files (`deploy/`) name only flags, environment variables, configuration keys and
//! files that exist: checked against the real command line, without a container runtime.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use stategate::config::file;

fn repo() -> PathBuf {
    crate::support::repo_path("")
}

/// Every file under `deploy/`, with its text.
fn deploy_files() -> Vec<(PathBuf, String)> {
    fn walk(dir: &Path, out: &mut Vec<(PathBuf, String)>) {
        for entry in std::fs::read_dir(dir).expect("deploy dir") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if let Ok(text) = std::fs::read_to_string(&path) {
                out.push((path, text));
            }
        }
    }
    let mut out = Vec::new();
    walk(&repo().join("deploy"), &mut out);
    out.sort();
    out
}

/// The long flags a `stategate` command line may use: `serve`'s, and each client command's.
fn known_flags(subcommand: &str) -> Option<BTreeSet<String>> {
    let mut cli = <stategate::config::Cli as clap::CommandFactory>::command();
    cli.build();
    let cmd = match subcommand {
        "" | "serve" => cli.find_subcommand("serve")?.clone(),
        other => cli.find_subcommand(other)?.clone(),
    };
    let mut flags: BTreeSet<String> = cmd
        .get_arguments()
        .filter_map(|a| a.get_long())
        .map(str::to_owned)
        .collect();
    flags.insert("help".into());
    Some(flags)
}

fn known_env() -> BTreeSet<String> {
    let cmd = file::serve_command();
    cmd.get_arguments()
        .filter_map(|a| a.get_env())
        .map(|e| e.to_string_lossy().into_owned())
        .collect()
}

/// `--flag` tokens (the part before any `=`).
fn flags_in(tokens: &[&str]) -> Vec<String> {
    tokens
        .iter()
        .filter_map(|t| t.strip_prefix("--"))
        .filter(|f| f.starts_with(|c: char| c.is_ascii_lowercase()))
        .map(|f| f.split('=').next().unwrap_or(f).to_owned())
        .collect()
}

/// Command lines of stategate in a file: `stategate [sub] --flags...` anywhere in a line, and
/// YAML/JSON argument lists that start with `"serve"`. Returns (subcommand, flags, line).
fn stategate_commands(text: &str) -> Vec<(String, Vec<String>, String)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let cleaned: String = line
            .chars()
            .map(|c| if matches!(c, '"' | '[' | ']' | ',') { ' ' } else { c })
            .collect();
        let tokens: Vec<&str> = cleaned.split_whitespace().collect();
        let is_list = line.contains("args:") || line.contains("command:") || line.contains("CMD");
        if is_list && tokens.contains(&"serve") {
            let at = tokens.iter().position(|t| *t == "serve").unwrap_or(0);
            out.push(("serve".into(), flags_in(&tokens[at..]), line.to_owned()));
            continue;
        }
        for (i, t) in tokens.iter().enumerate() {
            // A command, not the value of another program's flag (`useradd --gid stategate`).
            let a_value = i > 0 && tokens[i - 1].starts_with('-');
            if (*t == "stategate" || t.ends_with("/stategate")) && !a_value {
                let rest = &tokens[i + 1..];
                let sub = match rest.first() {
                    Some(s) if !s.starts_with('-') && known_flags(s).is_some() => (*s).to_owned(),
                    _ => String::new(),
                };
                let flags = flags_in(rest);
                if !flags.is_empty() {
                    out.push((sub, flags, line.to_owned()));
                }
            }
        }
    }
    out
}

#[test]
fn every_flag_named_in_deploy_files_exists() {
    let mut checked = 0;
    for (path, text) in deploy_files() {
        for (sub, flags, line) in stategate_commands(&text) {
            let known = known_flags(&sub).unwrap_or_else(|| panic!("{}: unknown command {sub:?}", path.display()));
            for f in flags {
                assert!(
                    known.contains(&f),
                    "{}: `--{f}` is not a flag of `stategate {sub}`: {line}",
                    path.display()
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 10, "only {checked} flags found: is the scan broken?");
}

#[test]
fn every_environment_variable_named_in_deploy_files_exists() {
    let known = known_env();
    let mut checked = 0;
    for (path, text) in deploy_files() {
        for (i, _) in text.match_indices("STATEGATE_") {
            let name: String = text[i..]
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            // `STATEGATE_*`, `STATEGATE_*_LISTEN`: a pattern in prose, not a name.
            if text[i + name.len()..].starts_with('*') {
                continue;
            }
            assert!(
                known.contains(&name),
                "{}: {name} is not an environment variable of `stategate serve`",
                path.display()
            );
            checked += 1;
        }
    }
    assert!(checked >= 10, "only {checked} variables found");
}

/// The TOML block of the Kubernetes ConfigMap (`stategate.toml: |` and what is indented below).
fn configmap_toml() -> String {
    let text = std::fs::read_to_string(repo().join("deploy/k8s/configmap.yaml")).expect("configmap");
    let lines = text.lines().skip_while(|l| l.trim() != "stategate.toml: |").skip(1);
    let first = lines.clone().next().expect("a TOML block");
    let indent = first.len() - first.trim_start().len();
    lines
        .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() >= indent)
        .map(|l| l.get(indent..).unwrap_or("").to_owned() + "\n")
        .collect()
}

fn load_config_file(path: &Path) -> stategate::config::Config {
    let argv: Vec<OsString> = vec!["stategate".into(), "--config".into(), path.into()];
    let layered = file::layer(&argv).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    stategate::config::Config::from_args(layered.args).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn configuration_files_in_deploy_load() {
    let example = load_config_file(&repo().join("deploy/stategate.toml"));
    assert_eq!(example.storage.data_dir, PathBuf::from("/var/lib/stategate"));
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("stategate.toml");
    std::fs::write(&path, configmap_toml()).expect("write");
    let k8s = load_config_file(&path);
    assert_eq!(k8s.storage.data_dir, PathBuf::from("/var/lib/stategate"));
    assert!(k8s.ops.metrics_listen.is_some(), "the pods' metrics port is served");
}

#[test]
fn paths_named_in_deploy_files_exist_and_agree() {
    let deploy = repo().join("deploy");
    // Files the Dockerfile copies from the repository.
    let dockerfile = std::fs::read_to_string(deploy.join("Dockerfile")).expect("Dockerfile");
    for line in dockerfile
        .lines()
        .filter(|l| l.starts_with("COPY ") && !l.contains("--from"))
    {
        let parts: Vec<&str> = line.split_whitespace().collect();
        for src in &parts[1..parts.len() - 1] {
            assert!(
                repo().join(src).exists(),
                "Dockerfile copies {src}, which does not exist"
            );
        }
    }
    // Files compose mounts from beside it.
    let compose = std::fs::read_to_string(deploy.join("docker-compose.yml")).expect("compose");
    for (i, _) in compose.match_indices("- ./") {
        let src: String = compose[i + 2..].chars().take_while(|c| *c != ':').collect();
        assert!(
            deploy.join(&src).exists(),
            "docker-compose.yml mounts {src}, which does not exist"
        );
    }
    // Kubernetes: STATEGATE_CONFIG is the ConfigMap's key under the config volume's mount, and
    // the data directory is the volume claim's mount.
    let sts = std::fs::read_to_string(deploy.join("k8s/statefulset.yaml")).expect("statefulset");
    let cm = std::fs::read_to_string(deploy.join("k8s/configmap.yaml")).expect("configmap");
    for manifest in [
        &sts,
        &std::fs::read_to_string(deploy.join("k8s/replicas.yaml")).expect("replicas"),
    ] {
        assert!(manifest.contains("value: /etc/stategate/stategate.toml"));
        assert!(manifest.contains("mountPath: /etc/stategate\n"));
        assert!(manifest.contains("name: stategate-config"));
        assert!(manifest.contains("path: /healthz") && manifest.contains("path: /readyz"));
    }
    assert!(cm.contains("name: stategate-config") && cm.contains("  stategate.toml: |"));
    assert!(sts.contains("mountPath: /var/lib/stategate"));
    let secret = std::fs::read_to_string(deploy.join("k8s/secret.yaml")).expect("secret");
    for key in ["api-token", "redis-url"] {
        assert!(secret.contains(&format!("  {key}: ")), "the Secret has no {key}");
    }
    // systemd runs the binary where the image installs it, with the example file's path.
    let unit = std::fs::read_to_string(deploy.join("systemd/stategate.service")).expect("unit");
    assert!(unit.contains("ExecStart=/usr/local/bin/stategate serve --config /etc/stategate/stategate.toml"));
    assert!(dockerfile.contains("/usr/local/bin/stategate"));
}

/// The Kubernetes manifests decode strictly into the Kubernetes API types (and the app pods'
/// Dapr Component into dapr's), and what they name in each other exists: the Go test module
/// `tests/go/k8s`, built by `scripts/go-peers` into `k8s.test`.
#[test]
fn kubernetes_manifests_decode_strictly_and_agree() {
    let out = std::process::Command::new(crate::aio_go::go_test_binary("k8s"))
        .args(["-test.v", "-test.count=1"])
        .env("STATEGATE_REPO", repo())
        .output()
        .expect("run k8s.test");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "k8s.test failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.matches("--- PASS").count() >= 4,
        "k8s.test ran fewer checks than it has:\n{stdout}"
    );
}
