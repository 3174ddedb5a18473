//! The web console at `/ui`: static files embedded in the binary (no CDN, works offline).
//!
//! The page holds no data: every data call it makes needs the api token like any other client,
//! so these paths alone are served without one ([`is_public`]). Each response carries a strict
//! Content-Security-Policy (scripts, styles and connections from this origin only; no inline
//! script or style), `Cache-Control: no-cache` and an `ETag`, so a browser revalidates cheaply
//! and picks up a new binary's files at once.

use std::sync::LazyLock;

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use super::error::ApiError;

/// Where the console is served.
pub const BASE: &str = "/ui";

/// The policy every console response carries.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

const INDEX: &str = "index.html";

static ASSETS: &[Asset] = &[
    Asset {
        name: INDEX,
        content_type: "text/html; charset=utf-8",
        body: include_bytes!("../ui/index.html"),
    },
    Asset {
        name: "style.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("../ui/style.css"),
    },
    Asset {
        name: "app.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("../ui/app.js"),
    },
    Asset {
        name: "api.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("../ui/api.js"),
    },
    Asset {
        name: "live.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("../ui/live.js"),
    },
    Asset {
        name: "value.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("../ui/value.js"),
    },
    Asset {
        name: "editor.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("../ui/editor.js"),
    },
    Asset {
        name: "changes.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("../ui/changes.js"),
    },
    Asset {
        name: "status.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("../ui/status.js"),
    },
    Asset {
        name: "favicon.svg",
        content_type: "image/svg+xml",
        body: include_bytes!("../ui/favicon.svg"),
    },
];

/// A strong validator per asset: a hash of its bytes (they change only with the binary).
static ETAGS: LazyLock<Vec<String>> = LazyLock::new(|| {
    ASSETS
        .iter()
        .map(|a| format!("\"{:08x}\"", crc32fast::hash(a.body)))
        .collect()
});

/// Total bytes of every console file, uncompressed (the page weight).
pub fn page_bytes() -> usize {
    ASSETS.iter().map(|a| a.body.len()).sum()
}

/// Whether `path` is one of the console's own files (served without the api token).
pub fn is_public(path: &str) -> bool {
    match path.strip_prefix(BASE) {
        Some("") | Some("/") => true,
        Some(rest) => rest
            .strip_prefix('/')
            .is_some_and(|name| ASSETS.iter().any(|a| a.name == name)),
        None => false,
    }
}

/// The console's routes.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route(BASE, get(index))
        .route("/ui/", get(index))
        .route("/ui/{file}", get(file))
}

async fn index(headers: HeaderMap) -> Response {
    serve(INDEX, &headers)
}

async fn file(Path(name): Path<String>, headers: HeaderMap) -> Response {
    serve(&name, &headers)
}

fn serve(name: &str, request: &HeaderMap) -> Response {
    let Some(i) = ASSETS.iter().position(|a| a.name == name) else {
        return ApiError::new(
            StatusCode::NOT_FOUND,
            "ERR_NOT_FOUND",
            format!("no console file {name:?}"),
        )
        .into_response();
    };
    let asset = &ASSETS[i];
    let etag = &ETAGS[i];
    let mut headers = HeaderMap::new();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    if let Ok(v) = HeaderValue::from_str(etag) {
        headers.insert(header::ETAG, v);
    }
    let fresh = request
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag || t.trim() == "*"));
    if fresh {
        return (StatusCode::NOT_MODIFIED, headers).into_response();
    }
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(asset.content_type));
    (StatusCode::OK, headers, asset.body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_console_files_are_public() {
        for p in [
            "/ui",
            "/ui/",
            "/ui/app.js",
            "/ui/style.css",
            "/ui/index.html",
            "/ui/favicon.svg",
        ] {
            assert!(is_public(p), "{p}");
        }
        for p in [
            "/",
            "/uix",
            "/ui/nope.js",
            "/ui/app.js/x",
            "/ui//app.js",
            "/v1.0/metadata",
            "/v1.0/state/ui",
            "/openapi.json",
        ] {
            assert!(!is_public(p), "{p}");
        }
    }

    #[test]
    fn the_console_stays_small() {
        // docs/console.md quotes this number: update both together.
        assert!(page_bytes() < 100 * 1024, "the console weighs {} bytes", page_bytes());
    }

    #[test]
    fn html_loads_no_inline_script_or_style() {
        let html = std::str::from_utf8(ASSETS[0].body).unwrap();
        assert!(
            !html.contains("<script>") && !html.contains("style="),
            "inline code in index.html"
        );
        assert!(
            !html.contains("http://") && !html.contains("https://"),
            "a remote URL in index.html"
        );
        for a in ASSETS {
            let text = String::from_utf8_lossy(a.body);
            assert!(
                !text.contains("https://cdn") && !text.contains("//unpkg"),
                "{} loads from a CDN",
                a.name
            );
        }
    }
}
