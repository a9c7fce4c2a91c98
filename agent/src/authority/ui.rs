//! The web UI: static pages served under `/ui/` on the API listener (so with its TLS), for
//! people who would rather look at the registry in a browser than in a terminal.
//!
//! The assets (HTML, CSS, JavaScript ES modules, an icon; sources in `agent/ui/`) are
//! compiled into the binary and carry no data: the page asks the JSON API (`/v1/...`) for
//! everything it shows, with the bearer token the person signs in with, which it keeps in
//! `sessionStorage` and sends only in the `Authorization` header. So `/ui/` answers without
//! credentials, like `/livez`, and every read and write the page makes is authenticated,
//! authorised and audited as the API's own.
//!
//! Every answer here carries a strict Content-Security-Policy (scripts, styles and fetches
//! from this origin only, no inline script or style, no form submission, no framing),
//! `X-Frame-Options: DENY`, `X-Content-Type-Options: nosniff` and
//! `Referrer-Policy: no-referrer`. The routes are not part of the API's OpenAPI table.

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

/// The policy every `/ui` answer carries. `form-action 'none'`: a form the script failed to
/// take over can never send what was typed into it (a token) anywhere, in a URL or not.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

/// One compiled-in file: its path under `/ui/`, its media type and its bytes.
struct Asset {
    path: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

macro_rules! asset {
    ($path:literal, $type:expr) => {
        Asset {
            path: $path,
            content_type: $type,
            body: include_bytes!(concat!("../../ui/", $path)),
        }
    };
}

const JS: &str = "text/javascript; charset=utf-8";

/// Every file the UI is made of; anything else under `/ui/` is `404`.
const ASSETS: &[Asset] = &[
    asset!("index.html", "text/html; charset=utf-8"),
    asset!("style.css", "text/css; charset=utf-8"),
    asset!("favicon.svg", "image/svg+xml"),
    asset!("js/app.js", JS),
    asset!("js/api.js", JS),
    asset!("js/dom.js", JS),
    asset!("js/chart.js", JS),
    asset!("js/pages/signin.js", JS),
    asset!("js/pages/services.js", JS),
    asset!("js/pages/service.js", JS),
    asset!("js/pages/instance.js", JS),
    asset!("js/pages/zones.js", JS),
    asset!("js/pages/alarms.js", JS),
    asset!("js/pages/audit.js", JS),
    asset!("js/pages/federation.js", JS),
    asset!("js/pages/proxies.js", JS),
    asset!("js/pages/proxy.js", JS),
];

/// The `/ui` routes, for the API's router to merge beside its probes (outside
/// authentication: the assets carry no data).
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/ui", get(|| async { to_index() }))
        .route("/ui/", get(|| async { asset("index.html") }))
        .route(
            "/ui/{*path}",
            get(|Path(path): Path<String>| async move { asset(&path) }),
        )
}

/// `/ui` → `/ui/`, so the page's relative paths resolve under it.
fn to_index() -> Response {
    let mut response = (StatusCode::PERMANENT_REDIRECT, "").into_response();
    response
        .headers_mut()
        .insert(header::LOCATION, HeaderValue::from_static("/ui/"));
    secured(response)
}

fn asset(path: &str) -> Response {
    let response = match ASSETS.iter().find(|a| a.path == path) {
        Some(a) => (
            [
                (header::CONTENT_TYPE, a.content_type),
                // The files change with the binary, and an old script against a new API
                // would be wrong: always revalidated (they are small).
                (header::CACHE_CONTROL, "no-cache"),
            ],
            a.body,
        )
            .into_response(),
        None => (
            StatusCode::NOT_FOUND,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            "no such page\n",
        )
            .into_response(),
    };
    secured(response)
}

/// The security headers every `/ui` answer carries.
fn secured(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(
        header::HeaderName::from_static("cross-origin-opener-policy"),
        HeaderValue::from_static("same-origin"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_module_the_pages_import_is_served() {
        // Goal: a page that imports a file left out of ASSETS fails here, not in a browser.
        for a in ASSETS.iter().filter(|a| a.path.ends_with(".js")) {
            let text = std::str::from_utf8(a.body).expect("UTF-8 source");
            let dir = a.path.rsplit_once('/').map_or("", |(d, _)| d);
            for line in text.lines().filter(|l| l.starts_with("import ")) {
                let Some(spec) = line.split(['\'', '"']).nth(1) else {
                    continue;
                };
                let resolved = resolve(dir, spec);
                assert!(
                    ASSETS.iter().any(|x| x.path == resolved),
                    "{} imports {spec} ({resolved}), which is not served",
                    a.path
                );
            }
        }
    }

    #[test]
    fn the_pages_hold_no_inline_script_or_style() {
        // Goal: the policy forbids inline script and style; a page that needs them would
        // break in the browser, so none may contain them.
        let index = std::str::from_utf8(ASSETS[0].body).expect("UTF-8");
        assert!(!index.contains("<script>"), "inline script in index.html");
        assert!(!index.contains("<style"), "inline style in index.html");
        assert!(
            !index.contains(" style="),
            "a style attribute in index.html"
        );
        let handler = index.split(" on").skip(1).find(|rest| {
            let name: String = rest.chars().take_while(char::is_ascii_lowercase).collect();
            !name.is_empty() && rest[name.len()..].starts_with('=')
        });
        assert!(
            handler.is_none(),
            "an inline handler in index.html: on{handler:?}"
        );
        for a in ASSETS.iter().filter(|a| a.path.ends_with(".js")) {
            let text = std::str::from_utf8(a.body).expect("UTF-8");
            assert!(
                !text.contains("innerHTML"),
                "{} writes HTML as text",
                a.path
            );
            assert!(!text.contains("eval("), "{} evaluates text", a.path);
        }
    }

    #[tokio::test]
    async fn assets_come_with_the_security_headers_and_unknown_paths_are_404() {
        let r = asset("js/app.js");
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()[header::CONTENT_TYPE], JS);
        let r = asset("../openapi.json");
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
        for r in [asset("index.html"), asset("nothing"), to_index()] {
            let h = r.headers();
            assert_eq!(h[header::CONTENT_SECURITY_POLICY], CONTENT_SECURITY_POLICY);
            assert_eq!(h[header::X_FRAME_OPTIONS], "DENY");
            assert_eq!(h[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
            assert_eq!(h[header::REFERRER_POLICY], "no-referrer");
        }
    }

    /// `spec` imported from a module in `dir`, as a path under `/ui/`.
    fn resolve(dir: &str, spec: &str) -> String {
        let mut parts: Vec<&str> = dir.split('/').filter(|p| !p.is_empty()).collect();
        for part in spec.split('/') {
            match part {
                "." => {}
                ".." => {
                    parts.pop();
                }
                p => parts.push(p),
            }
        }
        parts.join("/")
    }
}
