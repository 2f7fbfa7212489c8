//! The relay: the one other member of a run's internal network. It accepts the agent's TCP
//! connections and passes each to the proxy's unix socket, first writing the preamble that
//! names the run (and, under a server shared by many repositories, its store's key), then
//! copying bytes both ways untouched.

use std::path::{Path, PathBuf};

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::error::ProxyError;
use super::grant::{check_run, is_valid_key};
use super::preamble::preamble;

/// Relay every connection accepted on `listen` to the proxy socket `socket` as `run`'s (of the
/// store `key` under a shared server), until `shutdown` is cancelled (which also closes the
/// relayed connections).
pub async fn relay(
    listen: TcpListener,
    socket: PathBuf,
    key: Option<String>,
    run: String,
    shutdown: CancellationToken,
) -> Result<(), ProxyError> {
    check_run(&run)?;
    if let Some(key) = key.as_deref().filter(|k| !is_valid_key(k)) {
        return Err(ProxyError::BadRun {
            run: format!("{}/{run}", key.chars().take(140).collect::<String>()),
        });
    }
    let line = preamble(key.as_deref(), &run);
    let tracker = TaskTracker::new();
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listen.accept() => match accepted {
                Ok((client, _)) => {
                    let _ = client.set_nodelay(true);
                    let (socket, line, shutdown) = (socket.clone(), line.clone(), shutdown.clone());
                    tracker.spawn(async move {
                        tokio::select! {
                            () = pass_on(client, &socket, &line) => {}
                            () = shutdown.cancelled() => {}
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the relay cannot accept a connection");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            },
        }
    }
    tracker.close();
    tracker.wait().await;
    Ok(())
}

/// Carry one agent connection to the proxy.
async fn pass_on(mut client: TcpStream, socket: &Path, line: &str) {
    let mut proxy = match UnixStream::connect(socket).await {
        Ok(proxy) => proxy,
        Err(e) => {
            tracing::warn!(socket = %socket.display(), error = %e, "the relay cannot reach the proxy");
            let body =
                "rover's relay cannot reach rover's proxy; is the proxy container running?\n";
            let answer = format!(
                "HTTP/1.1 502 Bad Gateway\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = client.write_all(answer.as_bytes()).await;
            return;
        }
    };
    if proxy.write_all(line.as_bytes()).await.is_err() {
        return;
    }
    if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut proxy).await {
        tracing::debug!(error = %e, "a relayed connection ended with an error");
    }
}
