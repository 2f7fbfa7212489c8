//! `rover autopilot proxy serve|relay`: the two parts of a sandbox's closed network that run
//! rover's own binary, each in a container rover starts (see [`crate::sandbox::runnet`]).
//! Hidden from `--help`: nobody runs them by hand.

use std::path::Path;
use std::process::ExitCode;

use tokio_util::sync::CancellationToken;

use super::{CliError, ProxyCommand};
use crate::proxy::{self, ProxyConfig};
use crate::sandbox::runnet::{socket_dir, SOCKET_NAME};

pub fn run(command: ProxyCommand) -> Result<ExitCode, CliError> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| CliError::Internal(format!("cannot start the proxy's runtime: {e}")))?;
    runtime.block_on(async move {
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                () = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
            }
            stop.cancel();
        });
        match command {
            ProxyCommand::Serve { dir } => serve(&dir, shutdown).await,
            ProxyCommand::Relay {
                key,
                run,
                socket,
                listen,
            } => {
                let listener = tokio::net::TcpListener::bind(listen).await.map_err(|e| {
                    CliError::Unavailable(format!("the relay cannot listen on {listen}: {e}"))
                })?;
                proxy::relay(listener, socket, key, run, shutdown)
                    .await
                    .map_err(|e| CliError::Internal(crate::error::error_chain(&e)))?;
                Ok(ExitCode::SUCCESS)
            }
        }
    })
}

async fn serve(dir: &Path, shutdown: CancellationToken) -> Result<ExitCode, CliError> {
    let config = ProxyConfig::from_env(dir, |name| std::env::var(name).ok())
        .map_err(|e| CliError::Internal(crate::error::error_chain(&e)))?;
    let sock_dir = socket_dir(dir);
    std::fs::create_dir_all(&sock_dir)
        .map_err(|e| CliError::Internal(format!("cannot create {}: {e}", sock_dir.display())))?;
    let socket = sock_dir.join(SOCKET_NAME);
    // A socket file left by a server that died is in the way.
    let _ = std::fs::remove_file(&socket);
    let listener = tokio::net::UnixListener::bind(&socket).map_err(|e| {
        CliError::Unavailable(format!("cannot listen on {}: {e}", socket.display()))
    })?;
    proxy::serve(config, listener, shutdown)
        .await
        .map_err(|e| CliError::Internal(crate::error::error_chain(&e)))?;
    Ok(ExitCode::SUCCESS)
}
