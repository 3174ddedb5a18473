//! Requests a web browser makes on behalf of another site. A page on any site can make the
//! user's browser send a "simple" cross-site request (a `POST` with a `text/plain` body, no
//! preflight) to `127.0.0.1:3500`, and a DNS-rebinding name (`evil.example` resolving to
//! 127.0.0.1) makes the browser treat the service as that site and read what it answers. Two
//! checks close both, as development servers do:
//!
//! - **Origin**: a request that carries `Origin` (browsers send it on cross-site requests and on
//!   every `POST`) must come from the service's own origin (the authority in `Host`) or one the
//!   operator allows (`--http-allowed-origins`). curl, the SDKs and daprd send none.
//! - **Host**: when the door listens on loopback only, the `Host` must be a loopback name
//!   (`localhost`, `*.localhost`, `127.0.0.1`, `[::1]`, any port) or one the operator allows
//!   (`--http-allowed-hosts`); a rebinding name is refused before any handler runs.
//!
//! Refusals are 403 in Dapr's error shape and change nothing.

use axum::http::{HeaderMap, header};

/// What the door accepts from browsers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BrowserPolicy {
    /// Origins allowed besides the service's own (`scheme://host[:port]`, compared without
    /// case); `*` allows every origin.
    pub allowed_origins: Vec<String>,
    /// Check `Host` against loopback names (set when the door listens on loopback only).
    pub loopback_hosts_only: bool,
    /// Host names (without port) allowed besides the loopback ones; `*` turns the check off.
    pub allowed_hosts: Vec<String>,
}

pub const FORBIDDEN_ORIGIN: &str = "ERR_FORBIDDEN_ORIGIN";
pub const FORBIDDEN_HOST: &str = "ERR_FORBIDDEN_HOST";

/// The host part of an authority (`host[:port]`, `[v6][:port]`), lower-cased.
fn host_of(authority: &str) -> String {
    let a = authority.trim();
    let host = match a.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or_default(),
        None => a.rsplit_once(':').map_or(
            a,
            |(h, port)| {
                if port.chars().all(|c| c.is_ascii_digit()) { h } else { a }
            },
        ),
    };
    host.to_ascii_lowercase()
}

fn is_loopback_name(host: &str) -> bool {
    host == "localhost"
        || host.ends_with(".localhost")
        || host == "::1"
        || host.parse::<std::net::Ipv4Addr>().is_ok_and(|ip| ip.is_loopback())
}

impl BrowserPolicy {
    /// `Err` with the refusal's code and message, or `Ok` to go on.
    pub fn check(&self, headers: &HeaderMap) -> Result<(), (&'static str, String)> {
        let host_header = headers.get(header::HOST).and_then(|h| h.to_str().ok());
        if self.loopback_hosts_only && !self.allowed_hosts.iter().any(|h| h == "*") {
            let host = host_header.map(host_of).unwrap_or_default();
            if !is_loopback_name(&host) && !self.allowed_hosts.iter().any(|h| h.eq_ignore_ascii_case(&host)) {
                return Err((
                    FORBIDDEN_HOST,
                    format!(
                        "host {host:?} is not allowed: this service listens on loopback; allow more names \
                         with --http-allowed-hosts"
                    ),
                ));
            }
        }
        let Some(origin) = headers.get(header::ORIGIN) else {
            return Ok(());
        };
        let origin = origin.to_str().unwrap_or("null").trim();
        if self
            .allowed_origins
            .iter()
            .any(|o| o == "*" || o.eq_ignore_ascii_case(origin))
        {
            return Ok(());
        }
        // Same origin: the authority after the scheme is the one the request was sent to.
        let own = origin
            .split_once("://")
            .is_some_and(|(_, authority)| host_header.is_some_and(|h| authority.eq_ignore_ascii_case(h.trim())));
        if own {
            return Ok(());
        }
        Err((
            FORBIDDEN_ORIGIN,
            format!("origin {origin:?} is not allowed; allow it with --http-allowed-origins"),
        ))
    }
}

/// Probes answer any `Host`: they tell nothing a page could use, and a prober may name the
/// service however it reaches it.
pub(crate) fn is_probe(path: &str) -> bool {
    matches!(
        path,
        "/healthz" | "/readyz" | "/v1.0/healthz" | "/v1.0/healthz/outbound"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(host: Option<&str>, origin: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(v) = host {
            h.insert(header::HOST, v.parse().unwrap());
        }
        if let Some(v) = origin {
            h.insert(header::ORIGIN, v.parse().unwrap());
        }
        h
    }

    fn loopback() -> BrowserPolicy {
        BrowserPolicy {
            loopback_hosts_only: true,
            ..Default::default()
        }
    }

    #[test]
    fn loopback_names_pass_and_others_are_refused() {
        let p = loopback();
        for ok in [
            "127.0.0.1:3500",
            "localhost:3500",
            "LOCALHOST",
            "app.localhost:1",
            "[::1]:3500",
            "127.9.9.9",
        ] {
            assert_eq!(p.check(&headers(Some(ok), None)), Ok(()), "{ok}");
        }
        for bad in [
            "evil.example:3500",
            "192.168.1.4:3500",
            "localhost.evil.example",
            "[::2]:3500",
        ] {
            assert_eq!(
                p.check(&headers(Some(bad), None)).unwrap_err().0,
                FORBIDDEN_HOST,
                "{bad}"
            );
        }
        assert_eq!(p.check(&headers(None, None)).unwrap_err().0, FORBIDDEN_HOST);
        let extra = BrowserPolicy {
            allowed_hosts: vec!["gateway.lan".into()],
            ..loopback()
        };
        assert_eq!(extra.check(&headers(Some("gateway.lan:3500"), None)), Ok(()));
        let off = BrowserPolicy::default();
        assert_eq!(off.check(&headers(Some("evil.example"), None)), Ok(()));
    }

    #[test]
    fn only_the_own_origin_and_allowed_ones_pass() {
        let p = loopback();
        assert_eq!(
            p.check(&headers(Some("127.0.0.1:3500"), Some("http://127.0.0.1:3500"))),
            Ok(())
        );
        for bad in [
            "https://evil.example",
            "null",
            "http://127.0.0.1:8080",
            "http://localhost:3500",
        ] {
            assert_eq!(
                p.check(&headers(Some("127.0.0.1:3500"), Some(bad))).unwrap_err().0,
                FORBIDDEN_ORIGIN,
                "{bad}"
            );
        }
        let allowed = BrowserPolicy {
            allowed_origins: vec!["https://dashboard.example".into()],
            ..loopback()
        };
        assert_eq!(
            allowed.check(&headers(Some("127.0.0.1:3500"), Some("https://Dashboard.example"))),
            Ok(())
        );
        let any = BrowserPolicy {
            allowed_origins: vec!["*".into()],
            ..loopback()
        };
        assert_eq!(
            any.check(&headers(Some("127.0.0.1:3500"), Some("https://x.example"))),
            Ok(())
        );
    }
}
