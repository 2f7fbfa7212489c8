//! A real git remote over HTTP, as GitHub serves one: `git http-backend` (git's own smart-HTTP
//! server, run as CGI) behind a loopback server that asks for Basic credentials and accepts a
//! password only when the fake GitHub accepts it as a token at that moment (an installation
//! token that has not expired). Every attempt is recorded: the token's acceptance and the
//! service asked for (`git-upload-pack`, `git-receive-pack`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, Response, StatusCode, Uri};
use axum::Router;
use base64::Engine as _;

use super::fake_server::{serve, Served};

/// Decides whether a token is accepted now.
pub type Accepts = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// One request as the git server saw it.
#[derive(Debug, Clone)]
pub struct GitRequest {
    pub path: String,
    pub query: String,
    /// The username and whether the password was accepted (`None`: no credentials sent).
    pub user: Option<String>,
    pub accepted: Option<bool>,
    pub password: Option<String>,
}

struct GitState {
    root: PathBuf,
    accepts: Accepts,
    log: Mutex<Vec<GitRequest>>,
}

/// The running server; `url` + `/origin.git` is the remote.
pub struct GitHttp {
    pub url: String,
    state: Arc<GitState>,
    _served: Served,
}

impl GitHttp {
    /// Serve the repositories under `root` (a bare `origin.git` among them).
    pub async fn start(root: PathBuf, accepts: Accepts) -> GitHttp {
        let state = Arc::new(GitState {
            root,
            accepts,
            log: Mutex::new(Vec::new()),
        });
        let app = Router::new().fallback(handle).with_state(state.clone());
        let served = serve(app, "the git http server").await;
        GitHttp {
            url: format!("http://{}", served.addr),
            state,
            _served: served,
        }
    }

    pub fn requests(&self) -> Vec<GitRequest> {
        self.state.log.lock().expect("git log").clone()
    }

    /// Pushes that got through (`git-receive-pack` POSTs with accepted credentials): the
    /// password of each.
    pub fn accepted_pushes(&self) -> Vec<String> {
        self.requests()
            .into_iter()
            .filter(|r| r.path.ends_with("/git-receive-pack") && r.accepted == Some(true))
            .filter_map(|r| r.password)
            .collect()
    }
}

fn status(code: u16, text: &str) -> Response<Body> {
    let mut r = Response::builder().status(StatusCode::from_u16(code).expect("status"));
    if code == 401 {
        r = r.header("www-authenticate", "Basic realm=\"GitHub\"");
    }
    r.body(Body::from(text.to_owned())).expect("response")
}

async fn handle(
    State(state): State<Arc<GitState>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response<Body> {
    let path = uri.path().to_owned();
    let query = uri.query().unwrap_or("").to_owned();
    let basic = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|s| s.split_once(':').map(|(u, p)| (u.to_owned(), p.to_owned())));
    let accepted = basic.as_ref().map(|(_, p)| (state.accepts)(p));
    state.log.lock().expect("git log").push(GitRequest {
        path: path.clone(),
        query: query.clone(),
        user: basic.as_ref().map(|(u, _)| u.clone()),
        accepted,
        password: basic.as_ref().map(|(_, p)| p.clone()),
    });
    // Every request needs credentials, as a private repository on GitHub does.
    if accepted != Some(true) {
        return status(401, "Authentication failed");
    }
    let mut env: HashMap<&str, String> = HashMap::new();
    env.insert("GIT_PROJECT_ROOT", state.root.display().to_string());
    env.insert("GIT_HTTP_EXPORT_ALL", "1".into());
    env.insert("REQUEST_METHOD", method.as_str().to_owned());
    env.insert("PATH_INFO", path);
    env.insert("QUERY_STRING", query);
    env.insert("REMOTE_USER", basic.map(|(u, _)| u).unwrap_or_default());
    env.insert("REMOTE_ADDR", "127.0.0.1".into());
    env.insert("CONTENT_LENGTH", body.len().to_string());
    if let Some(ct) = headers.get("content-type").and_then(|v| v.to_str().ok()) {
        env.insert("CONTENT_TYPE", ct.to_owned());
    }
    if let Some(ce) = headers
        .get("content-encoding")
        .and_then(|v| v.to_str().ok())
    {
        env.insert("HTTP_CONTENT_ENCODING", ce.to_owned());
    }
    if let Some(gp) = headers.get("git-protocol").and_then(|v| v.to_str().ok()) {
        env.insert("GIT_PROTOCOL", gp.to_owned());
    }
    let mut child = tokio::process::Command::new("git")
        .arg("http-backend")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .envs(env)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("git http-backend");
    let mut stdin = child.stdin.take().expect("stdin");
    let writer = tokio::spawn(async move {
        use tokio::io::AsyncWriteExt as _;
        let _ = stdin.write_all(&body).await;
        drop(stdin);
    });
    let out = child.wait_with_output().await.expect("http-backend output");
    let _ = writer.await;
    let raw = out.stdout;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, 4))
        .or_else(|| raw.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2)));
    let Some((at, sep)) = split else {
        return status(
            500,
            &format!(
                "http-backend said nothing usable: {}",
                String::from_utf8_lossy(&out.stderr)
            ),
        );
    };
    let head = String::from_utf8_lossy(&raw[..at]).into_owned();
    let mut builder = Response::builder();
    let mut code = 200;
    for line in head.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let (k, v) = (k.trim(), v.trim());
        if k.eq_ignore_ascii_case("status") {
            code = v
                .split_whitespace()
                .next()
                .and_then(|c| c.parse().ok())
                .unwrap_or(500);
        } else {
            builder = builder.header(k, v);
        }
    }
    builder
        .status(StatusCode::from_u16(code).expect("status"))
        .body(Body::from(raw[at + sep..].to_vec()))
        .expect("response")
}
