//! A run's shipped workspace, carried over its own network: for a sandbox on a node that does
//! not share rover's file system (the swarm backend), the daemon leaves the workspace's tar in
//! the run's dir ([`WORKSPACE_IN`]), the task fetches it with `GET /rover/workspace` when it
//! starts and sends `/workspace` back with `PUT /rover/workspace` when its command ends; the
//! proxy keeps what came as [`WORKSPACE_OUT`], at most the bytes [`WORKSPACE_LIMIT`] says.
//!
//! Only the run's own connections (those its relay hands over, named by its preamble) reach a
//! run's files, and the proxy reads nothing of what comes back: it counts the bytes and writes
//! them to a file. What came is untrusted; the daemon checks every entry before it applies any
//! (see `sandbox::returned`). The last complete upload counts; one that passes the limit or
//! breaks off leaves nothing.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt as _, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::grant::Grant;
use super::respond::{text, BoxError, ProxyBody};
use super::server::{off_runtime, Shared};
use super::ProxyError;

/// The path a task fetches its workspace from and sends it back to.
pub const WORKSPACE_PATH: &str = "/rover/workspace";
/// The workspace's tar for the task, in the run's dir (written by the daemon).
pub const WORKSPACE_IN: &str = "workspace-in.tar";
/// What the task sent back, in the run's dir (written by the proxy).
pub const WORKSPACE_OUT: &str = "workspace-out.tar";
/// The most bytes kept of what comes back, as a decimal number (written by the daemon).
pub const WORKSPACE_LIMIT: &str = "workspace-limit";
/// Why the last upload was not kept, one line (written by the proxy; removed by one kept).
pub const WORKSPACE_REFUSED: &str = "workspace-refused";

const CHUNK: usize = 256 * 1024;

/// `GET` or `PUT` of `/rover/workspace` for `run`.
pub(super) async fn handle(
    shared: Arc<Shared>,
    run: &str,
    req: Request<Incoming>,
) -> Response<ProxyBody> {
    let run_dir = Grant::run_dir(shared.dir(), run);
    match *req.method() {
        Method::GET => send(&run_dir).await,
        Method::PUT => receive(&run_dir, req.into_body()).await,
        _ => text(
            StatusCode::METHOD_NOT_ALLOWED,
            "rover's proxy serves GET (the workspace shipped to this run) and PUT (the workspace it sends back) on /rover/workspace",
        ),
    }
}

async fn send(run_dir: &Path) -> Response<ProxyBody> {
    let path = run_dir.join(WORKSPACE_IN);
    let file = match tokio::fs::File::open(&path).await {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return text(
                StatusCode::NOT_FOUND,
                "rover shipped no workspace for this run over its network",
            );
        }
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot open a shipped workspace");
            return text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "rover's proxy cannot read the workspace shipped for this run",
            );
        }
    };
    let len = file.metadata().await.map(|m| m.len()).ok();
    let chunks = futures_util::stream::unfold(Some(file), |file| async move {
        let mut file = file?;
        let mut buf = vec![0u8; CHUNK];
        match file.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(Frame::data(Bytes::from(buf))), Some(file)))
            }
            Err(e) => Some((Err(BoxError::from(e)), None)),
        }
    });
    let mut response = Response::new(StreamBody::new(chunks).boxed_unsync());
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/x-tar"),
    );
    if let Some(len) = len {
        headers.insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(len));
    }
    response
}

/// The limit the daemon set for `run_dir`'s upload.
fn limit_of(run_dir: &Path) -> Result<u64, ProxyError> {
    let path = run_dir.join(WORKSPACE_LIMIT);
    let text = std::fs::read_to_string(&path).map_err(ProxyError::io("read", &path))?;
    text.trim().parse().map_err(|_| ProxyError::Unreadable {
        path,
        reason: "not a number of bytes".to_owned(),
    })
}

/// Why an upload is not kept: the answer's status and its line.
type Refused = (StatusCode, String);

async fn receive(run_dir: &Path, body: Incoming) -> Response<ProxyBody> {
    let limit = {
        let dir = run_dir.to_owned();
        match off_runtime(move || limit_of(&dir)).await {
            Ok(limit) => limit,
            Err(e) => {
                tracing::warn!(error = %e, "a run sent a workspace back but none was shipped to it");
                return text(
                    StatusCode::NOT_FOUND,
                    "rover shipped no workspace for this run, so it takes none back",
                );
            }
        }
    };
    let part: PathBuf = run_dir.join(format!("{WORKSPACE_OUT}.part"));
    let kept = keep(&part, &run_dir.join(WORKSPACE_OUT), body, limit).await;
    let refused = run_dir.join(WORKSPACE_REFUSED);
    match kept {
        Ok(bytes) => {
            let _ = tokio::fs::remove_file(&refused).await;
            text(
                StatusCode::CREATED,
                &format!("rover keeps the {bytes} bytes of the workspace sent back"),
            )
        }
        Err((status, why)) => {
            let _ = tokio::fs::remove_file(&part).await;
            tracing::warn!(%why, "a workspace sent back was not kept");
            // Said in a file too: the task may never read this answer (a refusal mid-upload
            // closes the connection under it).
            if let Err(e) = tokio::fs::write(&refused, format!("{why}\n")).await {
                tracing::warn!(path = %refused.display(), error = %e, "cannot record why a workspace was refused");
            }
            text(status, &why)
        }
    }
}

/// Writes `body` to `part`, at most `limit` bytes, then renames it to `out`.
async fn keep(part: &Path, out: &Path, mut body: Incoming, limit: u64) -> Result<u64, Refused> {
    let failed = |e: std::io::Error| {
        tracing::warn!(path = %part.display(), error = %e, "cannot keep a workspace sent back");
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            "rover's proxy cannot keep the workspace sent back".to_owned(),
        )
    };
    let file = tokio::fs::File::create(part).await.map_err(failed)?;
    let mut file = tokio::io::BufWriter::with_capacity(CHUNK, file);
    let mut received: u64 = 0;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            (
                StatusCode::BAD_REQUEST,
                format!("the upload broke off: {e}"),
            )
        })?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        received += data.len() as u64;
        if received > limit {
            return Err((
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "the workspace sent back holds more than {limit} bytes (autopilot.sandbox.workspaceLimitMb); nothing of it is kept"
                ),
            ));
        }
        file.write_all(&data).await.map_err(failed)?;
    }
    file.flush().await.map_err(failed)?;
    file.get_ref().sync_all().await.map_err(failed)?;
    drop(file);
    tokio::fs::rename(part, out).await.map_err(failed)?;
    Ok(received)
}
