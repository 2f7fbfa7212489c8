//! The shipped workspace of a swarm task: nothing of rover's host reaches the node. Before the
//! service is made, the spec's host paths become one tar ([`super::super::ship::write_bundle`])
//! in the run's dir of rover's proxy; the task's command is wrapped in a short script that
//! fetches it over the run's network (`GET /rover/workspace` from `rover-proxy:8080`, through
//! the run's relay), extracts it into the task's own tmpfs directories, runs the command, and
//! sends `/workspace` back (`PUT` to the same path) before it exits with the command's status.
//! What came back is then taken from the proxy's file, at most `workspaceLimitMb`, and checked
//! entry by entry like any returned workspace (`sandbox::returned`).
//!
//! The image needs `bash`, `tar` and coreutils (`head`, `stat`, `cat`, `sleep`): no HTTP
//! client, bash's `/dev/tcp` speaks to the proxy. The script says what is missing and exits
//! 125 when one is. The directories are tmpfs mounts (mode 1777, the task's user makes what it
//! extracts its own), so a shipped workspace lives in the task's memory and counts against
//! `memoryMb`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use bollard::models::{Mount, MountType, MountVolumeOptions, MountVolumeOptionsDriverConfig};
use tokio::io::AsyncWriteExt as _;

use crate::proxy::{
    Grant, WORKSPACE_IN, WORKSPACE_LIMIT, WORKSPACE_OUT, WORKSPACE_PATH, WORKSPACE_REFUSED,
};
use crate::sandbox::error::SandboxError;
use crate::sandbox::runnet::{PROXY_ALIAS, PROXY_PORT};
use crate::sandbox::ship::{self, Owner, Shipped};
use crate::sandbox::spec::SandboxSpec;

/// Label on a service whose workspace is shipped: the run's dir in rover's proxy dir, where
/// what the task sends back is found (also after a restart of rover).
pub const LABEL_SHIP: &str = "rover.swarm.ship";

/// The exit status of the wrapper when it could not fetch the workspace (the command never ran).
pub const SHIP_FAILED: i64 = 125;

/// The wrapper's first part, for `sh`: checks the tools the second needs (`$0` is its name,
/// `$1` the second part, the command follows), then runs the second with `bash`.
const PRELUDE: &str = r#"for t in bash tar head stat cat sleep; do
  command -v "$t" >/dev/null 2>&1 || { echo "rover: this image has no $t; a workspace shipped to a swarm node needs bash, tar and coreutils in the sandbox image (docs/scale.md)" >&2; exit 125; }
done
s=$1
shift
exec bash -c "$s" rover-ship "$@"
"#;

/// The wrapper's second part, for `bash` (no HTTP client in the image is needed: `/dev/tcp`).
/// It fetches the workspace (`GET`, a body of known length, read to its end), runs the
/// command, and sends `/workspace` back (`PUT`, chunked, 1 MiB at a time through a file in
/// `/tmp`). Everything it says itself starts with `rover:` and goes to stderr: stdout is the
/// command's.
const SCRIPT: &str = r#"h="$ROVER_WORKSPACE_HOST"; p="$ROVER_WORKSPACE_PORT"; path="$ROVER_WORKSPACE_PATH"
# A connection rover closes (a refusal) is an error to report, not a signal that ends the script;
# the command runs with SIGPIPE as it would anywhere.
trap '' PIPE
fetch() {
  exec 3<>"/dev/tcp/$h/$p" || return 1
  printf 'GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n' "$path" "$h" >&3 || return 1
  local status line rc
  IFS= read -r status <&3 || return 1
  case "$status" in
    "HTTP/1.1 200 "*) ;;
    *) echo "rover: rover answered '${status%$'\r'}' to the workspace's fetch" >&2; exec 3<&-; return 1 ;;
  esac
  while IFS= read -r line <&3; do [ "$line" = $'\r' ] && break; done
  tar -x -f - -C / --no-same-owner <&3
  rc=$?
  exec 3<&-
  return $rc
}
send() {
  exec 3<>"/dev/tcp/$h/$p" || return 1
  printf 'PUT %s HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n' "$path" "$h" >&3 || return 1
  local chunk=/tmp/.rover-ship-chunk status
  (cd / && tar -c -f - workspace) | while :; do
    head -c 1048576 >"$chunk" || exit 1
    n=$(stat -c %s "$chunk") || exit 1
    [ "$n" -eq 0 ] && break
    { printf '%x\r\n' "$n" && cat "$chunk" && printf '\r\n'; } >&3 || exit 1
  done || {
    rm -f "$chunk"
    IFS= read -r -t 2 status <&3 && echo "rover: rover answered '${status%$'\r'}' to the workspace sent back" >&2
    exec 3<&-
    return 1
  }
  rm -f "$chunk"
  printf '0\r\n\r\n' >&3 || return 1
  IFS= read -r status <&3
  exec 3<&-
  case "$status" in
    "HTTP/1.1 201 "*) return 0 ;;
    *) echo "rover: rover answered '${status%$'\r'}' to the workspace sent back" >&2; return 1 ;;
  esac
}
fetched=
for try in 1 2 3 4 5 6 7 8 9 10; do
  if fetch; then fetched=1; break; fi
  sleep 1
done
[ -n "$fetched" ] || { echo "rover: could not fetch the workspace from rover at $h:$p" >&2; exit 125; }
cd /workspace || exit 125
trap - PIPE
"$@"
code=$?
trap '' PIPE
send || echo "rover: could not send the workspace back to rover at $h:$p" >&2
exit $code
"#;

/// The command `cmd` wrapped so that it runs in the shipped workspace and sends it back.
pub fn wrap(cmd: &[String]) -> Vec<String> {
    let mut argv = vec![
        "/bin/sh".to_owned(),
        "-c".to_owned(),
        PRELUDE.to_owned(),
        "rover-ship".to_owned(),
        SCRIPT.to_owned(),
    ];
    argv.extend(cmd.iter().cloned());
    argv
}

/// The wrapper's environment entries (`NAME=value`): where rover's proxy answers on the run's
/// network.
pub fn env() -> [String; 3] {
    [
        format!("ROVER_WORKSPACE_HOST={PROXY_ALIAS}"),
        format!("ROVER_WORKSPACE_PORT={PROXY_PORT}"),
        format!("ROVER_WORKSPACE_PATH={WORKSPACE_PATH}"),
    ]
}

/// A directory the task's user owns at each shipped target: an anonymous volume of the local
/// driver on a tmpfs (`uid`/`gid` its owner, mode 0700, at most `workspaceLimitMb`), never
/// filled from the image. Not a plain tmpfs mount: its root would take the owner and mode of
/// the image's directory at that path (root's `/workspace`, which rover's own layer makes),
/// and an engine before 27 takes no option to change that. Its content goes with the task's
/// container (a tmpfs is gone once unmounted), but an engine may keep the empty volume's entry
/// (20.10 does: a swarm task's anonymous volumes outlive it), so it carries the run's labels
/// and `rover.swarm=1` for `docker volume prune --filter label=rover.swarm=1` on the node.
pub fn mounts(spec: &SandboxSpec, owner: Owner) -> Vec<Mount> {
    let labels: HashMap<String, String> = spec
        .all_labels()
        .into_iter()
        .chain([(super::LABEL_SWARM.to_owned(), "1".to_owned())])
        .collect();
    let options = HashMap::from([
        ("type".to_owned(), "tmpfs".to_owned()),
        ("device".to_owned(), "tmpfs".to_owned()),
        (
            "o".to_owned(),
            format!(
                "uid={},gid={},mode=0700,size={}",
                owner.uid, owner.gid, spec.workspace_limit
            ),
        ),
    ]);
    ship::shipments(spec)
        .into_iter()
        .map(|s| Mount {
            target: Some(s.target),
            typ: Some(MountType::VOLUME),
            volume_options: Some(MountVolumeOptions {
                no_copy: Some(true),
                labels: Some(labels.clone()),
                driver_config: Some(MountVolumeOptionsDriverConfig {
                    name: Some("local".to_owned()),
                    options: Some(options.clone()),
                }),
                ..Default::default()
            }),
            ..Default::default()
        })
        .collect()
}

/// The run's dir in the proxy dir `proxy_dir` for the service `name`.
pub fn run_dir(proxy_dir: &Path, name: &str) -> PathBuf {
    Grant::run_dir(proxy_dir, name)
}

/// Writes the spec's workspace for the task into `run_dir` (atomically), with the limit of what
/// may come back; an older return is removed. Blocking work runs off the runtime.
pub async fn prepare(
    spec: &SandboxSpec,
    owner: Owner,
    run_dir: &Path,
) -> Result<Shipped, SandboxError> {
    let shipments = ship::shipments(spec);
    for s in &shipments {
        std::fs::symlink_metadata(&s.source).map_err(|e| SandboxError::Mount {
            path: s.source.clone(),
            source: e,
        })?;
    }
    let dir = run_dir.to_owned();
    let limit = spec.workspace_limit;
    let worktree = spec.worktree.clone();
    tokio::task::spawn_blocking(move || -> Result<Shipped, SandboxError> {
        let file_err = |path: &Path| {
            let path = path.to_owned();
            move |source| SandboxError::File { path, source }
        };
        std::fs::create_dir_all(&dir).map_err(file_err(&dir))?;
        for old in [WORKSPACE_OUT, WORKSPACE_REFUSED] {
            let old = dir.join(old);
            match std::fs::remove_file(&old) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(file_err(&old)(e)),
            }
        }
        let limit_path = dir.join(WORKSPACE_LIMIT);
        crate::store::fsio::write_atomic(&limit_path, limit.to_string().as_bytes()).map_err(
            |e| SandboxError::File {
                path: limit_path.clone(),
                source: std::io::Error::other(e),
            },
        )?;
        let part = dir.join(format!("{WORKSPACE_IN}.part"));
        let file = std::fs::File::create(&part).map_err(file_err(&part))?;
        let mut writer = std::io::BufWriter::with_capacity(256 * 1024, file);
        // One bundle; the error of a host path that cannot be read names that path.
        let shipped = ship::write_bundle(&shipments, owner, &mut writer).map_err(|e| {
            let _ = std::fs::remove_file(&part);
            SandboxError::Mount {
                path: worktree.clone(),
                source: e,
            }
        })?;
        let file = writer
            .into_inner()
            .map_err(|e| file_err(&part)(e.into_error()))?;
        file.sync_all().map_err(file_err(&part))?;
        let path = dir.join(WORKSPACE_IN);
        std::fs::rename(&part, &path).map_err(file_err(&path))?;
        Ok(shipped)
    })
    .await
    .map_err(|e| SandboxError::File {
        path: run_dir.to_owned(),
        source: std::io::Error::other(e),
    })?
}

/// Copies what the task sent back (kept by the proxy in `run_dir`) to `into`, at most `limit`
/// bytes; returns the bytes written.
pub async fn fetch(run_dir: &Path, into: &Path, limit: u64) -> Result<u64, SandboxError> {
    let from = run_dir.join(WORKSPACE_OUT);
    let mut source = match tokio::fs::File::open(&from).await {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // One line of the proxy's, read bounded all the same.
            let (why, _) =
                crate::sandbox::logcap::read_bounded(&[run_dir.join(WORKSPACE_REFUSED)], 1024)
                    .await;
            let refused = Some(why.trim().to_owned()).filter(|w| !w.is_empty());
            return Err(SandboxError::Returned {
                entry: "workspace/".to_owned(),
                reason: match refused {
                    Some(why) => format!("never came back: rover's proxy refused it ({why})"),
                    None => "never came back: the task sent no workspace to rover (its stderr says why: the image may lack bash or tar, or the task was stopped)".to_owned(),
                },
            });
        }
        Err(source) => return Err(SandboxError::File { path: from, source }),
    };
    let len = source
        .metadata()
        .await
        .map_err(|source| SandboxError::File {
            path: from.clone(),
            source,
        })?
        .len();
    if len > limit {
        return Err(SandboxError::Returned {
            entry: "workspace/".to_owned(),
            reason: format!(
                "holds more than {} MiB (autopilot.sandbox.workspaceLimitMb), which looks like a tar bomb or a huge or sparse file",
                limit / (1024 * 1024)
            ),
        });
    }
    let file_err = |source| SandboxError::File {
        path: into.to_path_buf(),
        source,
    };
    let mut out = tokio::fs::File::create(into).await.map_err(file_err)?;
    let copied = tokio::io::copy(
        &mut tokio::io::AsyncReadExt::take(&mut source, limit),
        &mut out,
    )
    .await
    .map_err(file_err)?;
    out.flush().await.map_err(file_err)?;
    out.sync_all().await.map_err(file_err)?;
    Ok(copied)
}

/// Removes what a run's workspace left in `run_dir` (the rest of the dir is the proxy's).
pub async fn forget(run_dir: &Path) {
    for name in [
        WORKSPACE_IN,
        WORKSPACE_OUT,
        WORKSPACE_LIMIT,
        WORKSPACE_REFUSED,
    ] {
        let _ = tokio::fs::remove_file(run_dir.join(name)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wrapper_runs_the_command_as_its_arguments() {
        let argv = wrap(&["claude".to_owned(), "-p".to_owned(), "a b".to_owned()]);
        assert_eq!(argv[0], "/bin/sh");
        assert_eq!(argv[1], "-c");
        assert_eq!(argv[3], "rover-ship");
        assert_eq!(&argv[5..], ["claude", "-p", "a b"]);
        assert!(argv[4].contains("\"$@\""));
        assert_eq!(
            env(),
            [
                "ROVER_WORKSPACE_HOST=rover-proxy",
                "ROVER_WORKSPACE_PORT=8080",
                "ROVER_WORKSPACE_PATH=/rover/workspace"
            ]
        );
    }

    /// A tar of `(name, type, data, link)` entries written as given (no checks).
    fn tar_of(entries: &[(&str, tar::EntryType, &str, &str)]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for (name, kind, data, link) in entries {
            let mut h = tar::Header::new_gnu();
            let gnu = h.as_gnu_mut().expect("gnu");
            gnu.name[..name.len()].copy_from_slice(name.as_bytes());
            gnu.linkname[..link.len()].copy_from_slice(link.as_bytes());
            h.set_entry_type(*kind);
            h.set_mode(0o644);
            h.set_size(data.len() as u64);
            h.set_cksum();
            builder.append(&h, data.as_bytes()).expect("append");
        }
        builder.into_inner().expect("finish")
    }

    /// A swarm manager at the wire, as far as taking a workspace back asks it: the engine's
    /// version, its swarm, and the service `rover-shipped`, whose workspace was shipped from
    /// `run_dir` (`LABEL_SHIP`). Returns the engine's address.
    async fn fake_manager(run_dir: &Path) -> String {
        use axum::response::IntoResponse as _;

        let service = serde_json::json!({
            "ID": "svc1",
            "Spec": {"Name": "rover-shipped", "Labels": {LABEL_SHIP: run_dir}},
        })
        .to_string();
        let app = axum::Router::new().fallback(move |uri: axum::http::Uri| {
            let service = service.clone();
            async move {
                // Past the API version (`/v1.44/swarm`).
                let path = uri.path();
                let path = path
                    .strip_prefix("/v")
                    .and_then(|rest| rest.find('/').map(|i| &rest[i..]))
                    .unwrap_or(path);
                let json = |body: String| {
                    (
                        [(axum::http::header::CONTENT_TYPE, "application/json")],
                        body,
                    )
                        .into_response()
                };
                match path {
                    "/_ping" => "OK".into_response(),
                    "/version" => json(
                        r#"{"ApiVersion":"1.44","MinAPIVersion":"1.24","Version":"27.0.0"}"#
                            .to_owned(),
                    ),
                    "/swarm" => json(r#"{"ID":"fake-swarm"}"#.to_owned()),
                    "/services/rover-shipped" => json(service),
                    _ => (
                        axum::http::StatusCode::NOT_FOUND,
                        [(axum::http::header::CONTENT_TYPE, "application/json")],
                        r#"{"message":"not found"}"#,
                    )
                        .into_response(),
                }
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("tcp://{addr}")
    }

    /// The swarm's way back: a task uploads any bytes with `PUT /rover/workspace`, rover's
    /// proxy keeps them as `workspace-out.tar`, and the collection takes them back through the
    /// real `SwarmSandbox::fetch_workspace` (the service's `LABEL_SHIP`, then [`fetch`]) and
    /// the same `returned::take_back` as the local engine's archive. The escape of a hard link
    /// copied through a parent replaced by a link to `/etc` is refused there, naming the entry.
    #[tokio::test]
    async fn an_uploaded_workspace_whose_link_replaces_a_parent_is_refused_naming_the_entry() {
        use crate::sandbox::{
            DockerSandbox, SandboxLabels, SandboxSettings, SwarmSandbox, WorkspaceMode,
        };

        let dir = tempfile::tempdir().expect("tempdir");
        let run_dir = dir.path().join("proxy").join("rover-shipped");
        std::fs::create_dir_all(&run_dir).expect("mkdir");
        std::fs::write(
            run_dir.join(WORKSPACE_OUT),
            tar_of(&[
                (
                    "workspace/d/hostname",
                    tar::EntryType::Regular,
                    "inside",
                    "",
                ),
                ("workspace/d", tar::EntryType::Symlink, "", "/etc"),
                (
                    "workspace/leak",
                    tar::EntryType::Link,
                    "",
                    "workspace/d/hostname",
                ),
            ]),
        )
        .expect("the upload");
        let worktree = dir.path().join("tasks").join("wt");
        std::fs::create_dir_all(&worktree).expect("mkdir");
        std::fs::write(worktree.join("keep.rs"), "old\n").expect("write");
        let engine = fake_manager(&run_dir).await;
        let local = DockerSandbox::connect_to(&engine, Vec::new())
            .await
            .expect("the fake engine answers");
        let swarm = SwarmSandbox::connect(local, &engine, Vec::new())
            .await
            .expect("a swarm manager");
        let mut spec = SandboxSpec::from_settings(
            &SandboxSettings::default(),
            Vec::new(),
            &worktree,
            SandboxLabels {
                project: "p".to_owned(),
                trace: "t".to_owned(),
                action: "a".to_owned(),
            },
        );
        spec.workspace = WorkspaceMode::Shipped;

        let err = crate::sandbox::returned::take_back(&swarm, "rover-shipped", &spec)
            .await
            .expect_err("refused");
        let text = err.to_string();
        assert!(
            matches!(&err, SandboxError::Returned { entry, .. } if entry == "workspace/d"),
            "{text}"
        );
        assert!(
            text.contains("names a path an earlier entry of the archive made"),
            "{text}"
        );
        assert!(text.contains("nothing of it was applied"), "{text}");
        // The worktree as it was, nothing beside it (no archive, no staging), no `leak`.
        let names = |dir: &Path| {
            let mut names: Vec<String> = std::fs::read_dir(dir)
                .expect("read dir")
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            names
        };
        assert_eq!(names(&worktree), ["keep.rs"]);
        assert_eq!(names(worktree.parent().expect("tasks")), ["wt"]);
        assert_eq!(
            std::fs::read_to_string(worktree.join("keep.rs")).expect("kept"),
            "old\n"
        );
    }
}
