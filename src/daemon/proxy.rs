//! rover's sandbox proxy as the daemon sees it: a warning at start when the key it adds is
//! missing, which server a repository's runs go through (its own, or the one a daemon file's
//! repositories share), and its release at stop when no run needs it any more.

use std::path::{Path, PathBuf};

use crate::config::RoverConfig;
use crate::host_env::HostEnv;
use crate::sandbox::runnet::SharedServer;
use crate::steps::Services;
use crate::store::AutopilotStore;

/// A sandboxed agent reaches its model API only through rover's proxy, which adds the key
/// from rover's environment: without one, every workflow would fail at its first request.
pub(super) fn warn_without_proxy_key(config: &RoverConfig, host: &HostEnv) {
    if config.autopilot.sandbox.egress().is_none() {
        return;
    }
    let keys = config.autopilot.agent.agent.provider().key_names();
    let missing = (!keys.iter().any(|name| host.is_set(name))).then(|| match keys {
        [first, rest @ ..] if !rest.is_empty() => format!("{first} (or {})", rest.join(", ")),
        _ => keys.join(", "),
    });
    if let Some(names) = missing {
        let text = format!("{names} is not set: sandboxed agents reach the model API only through rover's proxy, which adds that key (a login of the CLI on this machine does not reach the sandbox), so workflows will fail until it is set in rover's environment");
        println!("warning: {text}");
        tracing::warn!("{text}");
    }
}

/// rover's sandbox proxy outlives the process only while an agent run still needs it (a
/// `--once` run leaves its workflows running): with none left, it is stopped.
pub(super) async fn release_proxy(services: &Services, store: &AutopilotStore) {
    let Some(sandbox) = &services.sandbox else {
        return;
    };
    if SharedServer::of_link(&store.proxy_dir()).is_some() {
        // The daemon's one server: released by the daemon when all its repositories stop.
        return;
    }
    match sandbox.run_networks(&services.project_id).await {
        Ok(runs) if runs.is_empty() => {
            let dir = store.proxy_dir();
            if let Err(e) = sandbox.stop_proxy(&dir).await {
                tracing::warn!(error = %e, "cannot stop rover's sandbox proxy");
            }
        }
        Ok(runs) => {
            tracing::info!(
                runs = runs.len(),
                "rover's sandbox proxy stays up for the runs still going"
            );
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot tell whether runs still need rover's sandbox proxy");
        }
    }
}

/// The dir of the proxy server the repositories of a daemon file share:
/// `<data dir>/daemon/proxy`, each repository's runs under `<project id>/runs/`.
pub fn shared_proxy_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("daemon").join("proxy")
}

/// Where the store's runs go through rover's proxy, settled at the repository's start (before
/// any run is started or taken over): `shared` (a daemon file's repository) makes
/// `<store>/proxy` a symbolic link to `<shared>/<project id>`, so the one server of the daemon
/// serves its runs and every reader of the store still finds their files through it; none (a
/// daemon of one checkout) makes it a dir of its own again. A store with runs in flight on the
/// other side keeps it until its next start, since those runs' grants, relays and ledgers are
/// there; the log says so.
pub(super) async fn settle_proxy_dir(
    services: &Services,
    store: &AutopilotStore,
    shared: Option<&Path>,
) {
    let link = store.proxy_dir();
    let current = SharedServer::of_link(&link);
    let wanted = shared.map(|dir| SharedServer {
        dir: dir.to_owned(),
        key: services.project_id.clone(),
    });
    if current == wanted && (current.is_some() || !is_link(&link)) {
        return;
    }
    if let Some(server) = &wanted {
        if !crate::proxy::is_valid_key(&server.key) {
            tracing::warn!(project = %server.key, "this project id cannot name a store under the daemon's proxy; its runs keep a proxy server of their own");
            return;
        }
    }
    // The runs on the side being left.
    let left_dir = current
        .as_ref()
        .map_or_else(|| link.clone(), SharedServer::store_dir);
    let mut in_flight = crate::proxy::runs_in_flight(&left_dir);
    if current.is_none() {
        if let Some(sandbox) = &services.sandbox {
            match sandbox.run_networks(&services.project_id).await {
                Ok(runs) => in_flight.extend(runs),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot tell whether runs need this repository's own proxy server; it keeps it until its next start");
                    return;
                }
            }
        }
    }
    if !in_flight.is_empty() {
        let text = match &wanted {
            Some(_) => "this repository's runs keep its own proxy server until its next start: runs started on it are in flight",
            None => "this repository's runs keep the proxy server of the daemon file that served it until its next start: runs started on it are in flight",
        };
        println!("rover: {text}");
        tracing::info!(runs = in_flight.len(), "{text}");
        return;
    }
    if current.is_none() && link.is_dir() {
        // The store's own server has nothing left to serve.
        if let Some(sandbox) = &services.sandbox {
            if let Err(e) = sandbox.stop_proxy(&link).await {
                tracing::warn!(error = %e, "cannot stop this repository's own proxy server; gc removes it later");
            }
        }
    }
    let moved = {
        let (link, wanted) = (link.clone(), wanted.clone());
        tokio::task::spawn_blocking(move || relink(&link, wanted.as_ref())).await
    };
    match moved {
        Ok(Ok(())) => tracing::info!(
            shared = wanted.is_some(),
            "this repository's runs go through {}",
            if wanted.is_some() {
                "the proxy server its daemon file's repositories share"
            } else {
                "a proxy server of its own"
            }
        ),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, dir = %link.display(), "cannot move this repository's proxy dir; its runs keep the server they had");
        }
        Err(e) => tracing::warn!(error = %e, "moving the proxy dir did not finish"),
    }
}

fn is_link(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink())
}

/// Makes `link` (a store's proxy dir, with no run in flight) a symbolic link to `wanted`'s
/// store dir, or a dir of its own when none. What was there goes: a dir's leftovers are those
/// of runs whose spans hold what they said.
fn relink(link: &Path, wanted: Option<&SharedServer>) -> std::io::Result<()> {
    let aside = link.with_file_name("proxy.replaced");
    if std::fs::symlink_metadata(&aside).is_ok() {
        remove_any(&aside)?;
    }
    match std::fs::symlink_metadata(link) {
        Ok(_) => std::fs::rename(link, &aside)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    match wanted {
        Some(server) => {
            std::fs::create_dir_all(server.store_dir())?;
            std::os::unix::fs::symlink(server.store_dir(), link)?;
        }
        None => std::fs::create_dir_all(link)?,
    }
    if std::fs::symlink_metadata(&aside).is_ok() {
        remove_any(&aside)?;
    }
    Ok(())
}

/// Removes a symbolic link itself, or a dir and what it holds.
fn remove_any(path: &Path) -> std::io::Result<()> {
    if is_link(path) {
        std::fs::remove_file(path)
    } else {
        std::fs::remove_dir_all(path)
    }
}

/// At the stop of a daemon serving a daemon file: the proxy server its repositories share is
/// stopped when no run of any of them is in flight (a `--once` pass leaves its runs working:
/// the server stays for them, and `gc` removes it once they are done).
pub(super) async fn release_shared_proxy(data_dir: &Path, host: &HostEnv) {
    let dir = shared_proxy_dir(data_dir);
    if std::fs::symlink_metadata(&dir).is_err() {
        return;
    }
    let in_flight = {
        let dir = dir.clone();
        tokio::task::spawn_blocking(move || crate::proxy::shared_runs_in_flight(&dir))
            .await
            .unwrap_or_else(|_| vec!["?".to_owned()])
    };
    if !in_flight.is_empty() {
        tracing::info!(
            runs = in_flight.len(),
            "the daemon's sandbox proxy stays up for the runs still going"
        );
        return;
    }
    match crate::sandbox::DockerSandbox::connect(Vec::new(), host).await {
        Ok(docker) => {
            if let Err(e) = docker.stop_proxy(&dir).await {
                tracing::warn!(error = %e, "cannot stop the daemon's sandbox proxy; gc removes it later");
            }
        }
        Err(e) => tracing::debug!(error = %e, "no engine to stop the daemon's sandbox proxy on"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stores_proxy_dir_becomes_a_link_to_the_shared_servers_store_dir_and_back() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let link = tmp.path().join("projects").join("p-1a2b3c4d").join("proxy");
        std::fs::create_dir_all(link.join("runs").join("rover-old")).expect("an old dir");
        let server = SharedServer {
            dir: tmp.path().join("daemon").join("proxy"),
            key: "p-1a2b3c4d".to_owned(),
        };
        relink(&link, Some(&server)).expect("linked");
        assert_eq!(SharedServer::of_link(&link), Some(server.clone()));
        assert!(server.store_dir().is_dir());
        // What was in the old dir went; a file written through the link lands in the shared dir.
        assert!(crate::proxy::runs_with_files(&link).is_empty());
        std::fs::create_dir_all(link.join("runs").join("rover-new")).expect("through the link");
        assert!(server.store_dir().join("runs").join("rover-new").is_dir());
        assert!(!link.with_file_name("proxy.replaced").exists());
        // Linked again (the same target): nothing changes.
        relink(&link, Some(&server)).expect("linked again");
        assert_eq!(SharedServer::of_link(&link), Some(server.clone()));
        // Back to a dir of its own; the shared dir keeps its files.
        relink(&link, None).expect("a dir again");
        assert!(link.is_dir() && !is_link(&link));
        assert!(SharedServer::of_link(&link).is_none());
        assert!(server.store_dir().join("runs").join("rover-new").is_dir());
    }

    #[test]
    fn a_link_that_is_not_rovers_names_no_shared_server() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let link = tmp.path().join("proxy");
        for target in ["relative/key", "/d/daemon/proxy/..", "/d/daemon/proxy/sock"] {
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(target, &link).expect("a link");
            assert!(SharedServer::of_link(&link).is_none(), "{target}");
        }
    }
}
