//! Who may look and act. On loopback with no token set, anyone who can reach the port (the
//! machine's users). With `ROVER_DASHBOARD_TOKEN` (required for any other address): the token
//! as a bearer, or the session cookie the login form sets, each compared in constant time;
//! without either every page answers 401. An action (cancel, retry) also needs the form's CSRF
//! token and, when the browser says where the form came from, the dashboard's own origin.

use std::fmt::Write as _;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::html::{document, esc};
use super::Shared;

/// The cookie the login form sets.
pub const COOKIE: &str = "rover_dashboard";

/// The dashboard's secrets: the token people log in with, and the key of this process's CSRF
/// tokens (random at each start, so a token never outlives the server that issued it).
pub struct Auth {
    token: Option<String>,
    csrf_key: [u8; 32],
}

fn hmac_hex(key: &[u8], what: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(what);
    let mut out = String::with_capacity(64);
    for b in mac.finalize().into_bytes() {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// Whether `a` and `b` are equal, in a time that depends on their lengths only.
pub fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Auth {
    pub fn new(token: Option<String>) -> Auth {
        let mut csrf_key = [0u8; 32];
        csrf_key[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
        csrf_key[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
        Auth { token, csrf_key }
    }

    /// The cookie's value for a logged-in browser: derived from the token, never the token.
    fn session(&self) -> Option<String> {
        self.token
            .as_deref()
            .map(|t| hmac_hex(t.as_bytes(), b"rover dashboard session"))
    }

    /// The token the action forms carry.
    pub fn csrf(&self) -> String {
        hmac_hex(&self.csrf_key, b"rover dashboard actions")
    }

    /// Whether a request may see the pages.
    fn admits(&self, headers: &HeaderMap) -> bool {
        let Some(token) = &self.token else {
            return true;
        };
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if bearer.is_some_and(|b| same(b.trim().as_bytes(), token.as_bytes())) {
            return true;
        }
        let session = self.session().unwrap_or_default();
        cookie(headers, COOKIE).is_some_and(|c| same(c.as_bytes(), session.as_bytes()))
    }

    /// Whether `given` is the login token.
    fn accepts(&self, given: &str) -> bool {
        self.token
            .as_deref()
            .is_some_and(|t| same(given.trim().as_bytes(), t.as_bytes()))
    }

    /// Why a POST is refused: a CSRF token that is not this server's, or a form sent from
    /// another origin.
    pub fn refuses_post(&self, headers: &HeaderMap, csrf: &str) -> Option<&'static str> {
        let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
        if let Some(origin) = headers.get(header::ORIGIN) {
            // `https://` too: behind a proxy that terminates TLS and passes the Host on.
            let own = |scheme: &str| host.map(|h| format!("{scheme}://{h}"));
            let origin = origin.to_str().ok();
            if origin.is_none()
                || (own("http").as_deref() != origin && own("https").as_deref() != origin)
            {
                return Some("the form was sent from another origin");
            }
        }
        if let Some(site) = headers.get("sec-fetch-site") {
            if site != "same-origin" {
                return Some("the form was sent from another site");
            }
        }
        if !same(csrf.as_bytes(), self.csrf().as_bytes()) {
            return Some("the form's CSRF token is missing or not this dashboard's");
        }
        None
    }
}

/// The value of cookie `name` in the request.
fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// Whether `host` (a `Host` header) names this machine's loopback: `localhost` (or a name under
/// it), an address of 127.0.0.0/8 or `[::1]`, with any port.
pub fn names_loopback(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or_default()
    } else {
        host.rsplit_once(':').map_or(host, |(name, _)| name)
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name == "localhost"
        || name.ends_with(".localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Every page but the login form and the assets: 401 with the login form without the token.
/// Without a token (loopback only), a request must name loopback as its host: a page of
/// another site that rebinds its name to 127.0.0.1 (DNS rebinding) is refused, so it can
/// neither read the traces nor take the form's CSRF token.
pub async fn guard(State(shared): State<Shared>, request: Request, next: Next) -> Response {
    if shared.auth.token.is_none() {
        let host = request
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or_default();
        if !names_loopback(host) {
            return (
                StatusCode::FORBIDDEN,
                "this dashboard answers only to a loopback host name (localhost, 127.0.0.1, [::1]); set ROVER_DASHBOARD_TOKEN to reach it by another name\n",
            )
                .into_response();
        }
    }
    let path = request.uri().path();
    if path == "/login" || path.starts_with("/assets/") || shared.auth.admits(request.headers()) {
        return next.run(request).await;
    }
    (StatusCode::UNAUTHORIZED, login_page(None)).into_response()
}

fn login_page(said: Option<&str>) -> axum::response::Html<String> {
    let said = said
        .map(|s| format!("<p class=\"message\">{}</p>", esc(s)))
        .unwrap_or_default();
    axum::response::Html(document(
        "Log in",
        "",
        &format!(
            "<h1>Log in</h1>{said}<form method=\"post\" action=\"/login\" class=\"login\">\
             <label>Token (ROVER_DASHBOARD_TOKEN) <input type=\"password\" name=\"token\" \
             autocomplete=\"current-password\" required></label> <button>Log in</button></form>"
        ),
    ))
}

#[derive(serde::Deserialize)]
pub struct Login {
    #[serde(default)]
    token: String,
}

pub async fn login_form(State(shared): State<Shared>) -> Response {
    let said = shared
        .auth
        .token
        .is_none()
        .then_some("this dashboard needs no token");
    login_page(said).into_response()
}

/// The login form's POST: the session cookie, then the Now page.
pub async fn login(State(shared): State<Shared>, axum::Form(form): axum::Form<Login>) -> Response {
    if !shared.auth.accepts(&form.token) {
        return (StatusCode::UNAUTHORIZED, login_page(Some("wrong token"))).into_response();
    }
    let session = shared.auth.session().unwrap_or_default();
    (
        StatusCode::SEE_OTHER,
        [
            (
                header::SET_COOKIE,
                format!("{COOKIE}={session}; HttpOnly; SameSite=Strict; Path=/"),
            ),
            (header::LOCATION, "/".to_owned()),
        ],
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_loopback_host_name_is_loopback() {
        for host in [
            "127.0.0.1:8790",
            "127.0.0.1",
            "127.1.2.3:80",
            "localhost:8790",
            "LOCALHOST",
            "app.localhost:1",
            "[::1]:8790",
            "[::1]",
            "localhost.:8790",
        ] {
            assert!(names_loopback(host), "{host}");
        }
        for host in [
            "",
            "evil.example:8790",
            "localhost.evil.example",
            "127.0.0.1.evil.example:8790",
            "10.0.0.1:8790",
            "[::2]:8790",
            "0.0.0.0:8790",
        ] {
            assert!(!names_loopback(host), "{host}");
        }
    }

    #[test]
    fn the_token_admits_as_bearer_or_as_the_session_cookie_and_nothing_else_does() {
        let auth = Auth::new(Some("s3cret".into()));
        let mut h = HeaderMap::new();
        assert!(!auth.admits(&h));
        h.insert(header::AUTHORIZATION, "Bearer s3cret".parse().unwrap());
        assert!(auth.admits(&h));
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, "Bearer s3cre".parse().unwrap());
        assert!(!auth.admits(&h));
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            format!("a=b; {COOKIE}=s3cret").parse().unwrap(),
        );
        assert!(
            !auth.admits(&h),
            "the cookie holds the session, not the token"
        );
        let mut h = HeaderMap::new();
        let session = auth.session().unwrap();
        h.insert(
            header::COOKIE,
            format!("a=b; {COOKIE}={session}").parse().unwrap(),
        );
        assert!(auth.admits(&h));
        assert!(Auth::new(None).admits(&HeaderMap::new()));
    }

    #[test]
    fn a_post_needs_this_server_s_csrf_token_and_its_own_origin() {
        let auth = Auth::new(None);
        let mut h = HeaderMap::new();
        h.insert(header::HOST, "127.0.0.1:8790".parse().unwrap());
        assert!(auth.refuses_post(&h, &auth.csrf()).is_none());
        assert!(auth.refuses_post(&h, "").is_some());
        assert!(auth.refuses_post(&h, &Auth::new(None).csrf()).is_some());
        h.insert(header::ORIGIN, "http://evil.example".parse().unwrap());
        assert!(auth.refuses_post(&h, &auth.csrf()).is_some());
        h.insert(header::ORIGIN, "http://127.0.0.1:8790".parse().unwrap());
        assert!(auth.refuses_post(&h, &auth.csrf()).is_none());
        assert!(same(b"abc", b"abc") && !same(b"abc", b"abd") && !same(b"abc", b"ab"));
    }
}
