//! MQTT broker URLs: `mqtt[s]://[user[:password]@]host[:port]` (the service's `--mqtt-url`
//! and the command-line client's).

use stategate_telemetry::secret::{mask_url_password, percent_decode};

/// A URL that is not a broker URL; the password is masked in what it says.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadUrl {
    #[error("--mqtt-url must look like mqtt[s]://[user[:password]@]host[:port] (got {0})")]
    Malformed(String),
    #[error("--mqtt-url {0}: TLS (mqtts://) needs the cargo feature `mqtt-client-tls`")]
    TlsUnsupported(String),
}

/// An MQTT broker URL, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerUrl {
    pub host: String,
    pub port: u16,
    /// `mqtts://`: TLS, verified.
    pub tls: bool,
    pub credentials: Option<MqttCredentials>,
}

/// A username and password for an MQTT CONNECT (the password never shows in `Debug`).
#[derive(Clone, PartialEq, Eq)]
pub struct MqttCredentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for MqttCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MqttCredentials")
            .field("username", &self.username)
            .field("password", &"***")
            .finish()
    }
}

/// `mqtt[s]://[user[:password]@]host[:port]`; the port defaults to 1883 (8883 with TLS).
/// User and password are percent-decoded.
pub fn parse_broker_url(url: &str) -> Result<BrokerUrl, BadUrl> {
    let bad = || BadUrl::Malformed(mask_url_password(url));
    let (rest, tls) = if let Some(r) = url.strip_prefix("mqtt://").or_else(|| url.strip_prefix("tcp://")) {
        (r, false)
    } else if let Some(r) = url.strip_prefix("mqtts://").or_else(|| url.strip_prefix("ssl://")) {
        if !cfg!(feature = "mqtt-client-tls") {
            return Err(BadUrl::TlsUnsupported(mask_url_password(url)));
        }
        (r, true)
    } else {
        return Err(bad());
    };
    let rest = rest.trim_end_matches('/');
    let (credentials, rest) = match rest.rsplit_once('@') {
        Some((userinfo, hostport)) => {
            let (user, pass) = userinfo.split_once(':').unwrap_or((userinfo, ""));
            let user = percent_decode(user).ok_or_else(bad)?;
            if user.is_empty() {
                return Err(bad());
            }
            let password = percent_decode(pass).ok_or_else(bad)?;
            (
                Some(MqttCredentials {
                    username: user,
                    password,
                }),
                hostport,
            )
        }
        None => (None, rest),
    };
    let default_port = if tls { 8883 } else { 1883 };
    let (host, port) = match rest.rsplit_once(':') {
        // An IPv6 address without a port: `[::1]`.
        Some((h, p)) if !h.starts_with('[') || h.ends_with(']') => (h, p.parse::<u16>().map_err(|_| bad())?),
        _ => (rest, default_port),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() || host.contains('/') || host.contains('@') {
        return Err(bad());
    }
    Ok(BrokerUrl {
        host: host.to_owned(),
        port,
        tls,
        credentials,
    })
}
