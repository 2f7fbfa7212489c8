//! `rover autopilot dashboard` and `start --dashboard ADDR`: a web page of what rover does,
//! served by rover itself. Server-rendered HTML (assets embedded in the binary, nothing from
//! the network), read from the stores through the same code as `status`, `traces` and `trace`
//! (`sources.rs`: the project's store, or every repository of the daemon file as
//! `cli::fleet_stores` reads them). Pages: Now (`now.rs`, each running agent's last output line
//! read from its log by `activity.rs`, the proxy's recent refusals by `refusals.rs`, live through server-sent events fed by
//! a watch of the store directories: `live.rs`), Traces (`list.rs`), a trace as a waterfall
//! (`waterfall.rs`), Outcomes and spend (`outcomes.rs`), the lessons (`memory.rs`), with `--allow-actions` cancel and
//! retry (`actions.rs`), forget and pin a lesson. Who may look and
//! act: `auth.rs`. See docs/dashboard.md.

mod actions;
mod activity;
mod auth;
mod html;
mod list;
mod live;
mod memory;
mod now;
mod outcomes;
mod refusals;
mod sources;
mod waterfall;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

use super::{CliError, Context, Output};
use crate::error::{ErrorKind, Kinded};
pub use sources::Sources;

/// The variable holding the token people log in with.
pub const TOKEN_VAR: &str = "ROVER_DASHBOARD_TOKEN";

/// What every page answers with: no script but the dashboard's own file, no inline style, no
/// frame, nothing from elsewhere.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// What the handlers share.
pub struct Dash {
    ctx: Context,
    sources: Sources,
    auth: auth::Auth,
    allow_actions: bool,
    changes: tokio::sync::watch::Receiver<u64>,
}

pub type Shared = Arc<Dash>;

/// A dashboard bound to its address, not serving yet.
pub struct Prepared {
    listener: std::net::TcpListener,
    ctx: Context,
    sources: Sources,
    token: Option<String>,
    allow_actions: bool,
}

/// Checks the address against the token and binds it: a dashboard on an address other than
/// loopback without `ROVER_DASHBOARD_TOKEN` is refused, before anything starts.
pub fn prepare(
    ctx: &Context,
    addr: SocketAddr,
    allow_actions: bool,
    sources: Sources,
) -> Result<Prepared, CliError> {
    let token = ctx.host.non_empty(TOKEN_VAR);
    if !addr.ip().is_loopback() && token.is_none() {
        return Err(CliError::Config(format!(
            "the dashboard refuses to serve {addr} without a token: anyone who reaches it would see every trace{}. Set {TOKEN_VAR} (a long random string, e.g. `openssl rand -hex 32`) or serve on loopback (127.0.0.1)",
            if allow_actions { " and cancel them" } else { "" }
        )));
    }
    let listener = std::net::TcpListener::bind(addr)
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .map_err(|e| {
            CliError::Unavailable(format!("the dashboard cannot listen on {addr}: {e}"))
        })?;
    Ok(Prepared {
        listener,
        ctx: Context {
            global: ctx.global.clone(),
            host: ctx.host.clone(),
        },
        sources,
        token,
        allow_actions,
    })
}

impl Prepared {
    /// `http://ADDR/`, the address it answers on.
    pub fn url(&self) -> String {
        self.listener
            .local_addr()
            .map_or_else(|_| "?".to_owned(), |a| format!("http://{a}/"))
    }

    /// What it says when it starts: its address, and whether it takes actions.
    pub fn banner(&self) -> String {
        format!(
            "dashboard on {} ({}{})\n",
            self.url(),
            if self.allow_actions {
                "cancel and retry allowed"
            } else {
                "read-only"
            },
            if self.token.is_some() {
                format!("; {TOKEN_VAR} required")
            } else {
                String::new()
            }
        )
    }

    /// Serves until the process ends, on its own runtime (the daemon's is not disturbed by a
    /// page being rendered).
    pub fn serve(self) -> Result<(), CliError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("rover-dashboard")
            .enable_all()
            .build()
            .map_err(|e| {
                CliError::Internal(format!("cannot start the dashboard's runtime: {e}"))
            })?;
        runtime.block_on(async move {
            let changes = live::watch(&self.sources.data_dirs(&self.ctx));
            let shared = Arc::new(Dash {
                ctx: self.ctx,
                sources: self.sources,
                auth: auth::Auth::new(self.token),
                allow_actions: self.allow_actions,
                changes,
            });
            let listener = tokio::net::TcpListener::from_std(self.listener)
                .map_err(|e| CliError::Internal(format!("the dashboard's listener: {e}")))?;
            axum::serve(listener, router(shared))
                .with_graceful_shutdown(async {
                    let _ = tokio::signal::ctrl_c().await;
                })
                .await
                .map_err(|e| CliError::Unavailable(format!("the dashboard stopped: {e}")))
        })
    }

    /// Serves on a thread of its own: the dashboard inside the daemon (`start --dashboard`),
    /// gone with the process.
    pub fn spawn(self) {
        std::thread::Builder::new()
            .name("rover-dashboard".into())
            .spawn(move || {
                if let Err(e) = self.serve() {
                    eprintln!("dashboard: {}", crate::error::error_chain(&e));
                }
            })
            .expect("a thread for the dashboard");
    }
}

fn router(shared: Shared) -> Router {
    Router::new()
        .route("/", get(now::page))
        .route("/live", get(live::stream))
        .route("/traces", get(list::page))
        .route("/outcomes", get(outcomes::page))
        .route("/trace/{id}", get(waterfall::page))
        .route("/trace/{id}/cancel", post(actions::cancel))
        .route("/trace/{id}/retry", post(actions::retry))
        .route("/memory", get(memory::page))
        .route("/memory/{id}/forget", post(memory::forget))
        .route("/memory/{id}/pin", post(memory::pin))
        .route("/login", get(auth::login_form).post(auth::login))
        .route("/assets/dashboard.css", get(css))
        .route("/assets/dashboard.js", get(js))
        .layer(axum::middleware::from_fn_with_state(
            shared.clone(),
            auth::guard,
        ))
        .layer(axum::middleware::from_fn(headers))
        .with_state(shared)
}

/// The security headers of every answer.
async fn headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    response
}

async fn css() -> Response {
    asset(
        "text/css; charset=utf-8",
        include_str!("assets/dashboard.css"),
    )
}

async fn js() -> Response {
    asset(
        "text/javascript; charset=utf-8",
        include_str!("assets/dashboard.js"),
    )
}

fn asset(kind: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, kind),
            (header::CACHE_CONTROL, "max-age=300"),
        ],
        body,
    )
        .into_response()
}

/// Runs `render` (file reads) off the runtime's threads.
async fn blocking(
    shared: Shared,
    render: impl FnOnce(&Dash) -> Response + Send + 'static,
) -> Response {
    tokio::task::spawn_blocking(move || render(&shared))
        .await
        .unwrap_or_else(|e| failure(&CliError::Internal(format!("the page failed: {e}"))))
}

/// A failure as a page, with the status of its kind.
fn failure(e: &CliError) -> Response {
    let status = match e.kind() {
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::Usage => StatusCode::BAD_REQUEST,
        ErrorKind::Refused => StatusCode::FORBIDDEN,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    let title = status.canonical_reason().unwrap_or("Error");
    (
        status,
        Html(html::message(title, &crate::error::error_chain(e))),
    )
        .into_response()
}

/// `rover autopilot dashboard`: serve until stopped (Ctrl-C).
pub fn dashboard(
    ctx: &Context,
    out: &mut Output,
    addr: SocketAddr,
    allow_actions: bool,
    config: Option<PathBuf>,
) -> Result<ExitCode, CliError> {
    let sources = if let Some(path) = super::fleet_stores::daemon_file(ctx, config) {
        Sources::Fleet(path)
    } else {
        // In a checkout: its store must exist (never created by looking).
        ctx.existing_store()?;
        Sources::Project
    };
    let prepared = prepare(ctx, addr, allow_actions, sources)?;
    out.print(&prepared.banner())?;
    prepared.serve()?;
    Ok(ExitCode::SUCCESS)
}
