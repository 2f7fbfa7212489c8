//! rover's Docker leftovers: the containers, networks and volumes rover made for a store whose
//! daemon can no longer clean them up. Every one rover makes carries the store's directory
//! ([`LABEL_STORE`]) and the machine it was made on ([`LABEL_HOST`]); `rover autopilot gc` and
//! the daemon's hourly reclaim remove those whose store is gone, and those of a store whose
//! daemon is not running that no live run needs (its proxy server, relays, run networks and
//! environment builds; its agent containers wait for its next start, which collects them).
//!
//! Labels can be set by whoever runs containers, which is the engine's owner: they are trusted
//! to say which store a resource claims, then checked (a plain absolute path; for the proxy's
//! containers, the directory the engine itself mounts into them). Only Docker resources are
//! removed: a label never names a host path to delete, only one to look at.

mod engine;
mod stores;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::runnet::{server_name, LABEL_PROXY_PROJECT, LABEL_PROXY_ROLE, LABEL_PROXY_RUN};
use super::spec::{LABEL_ACTION, LABEL_ENV_BUILD, LABEL_PROJECT, LABEL_TRACE};
pub use engine::sweep;
use stores::StoreState;

/// The directory of the store a resource was made for (the parent of its proxy dir).
pub const LABEL_STORE: &str = "rover.store";
/// The machine a resource was made on (a hash of its machine id): a store path means nothing
/// on another machine sharing the engine.
pub const LABEL_HOST: &str = "rover.host";

/// This machine's identity for [`LABEL_HOST`]: a hash of `/etc/machine-id` (never the id
/// itself), else of the hostname.
pub fn host_id() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| {
        let raw = [
            "/etc/machine-id",
            "/var/lib/dbus/machine-id",
            "/proc/sys/kernel/hostname",
        ]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .map(|s| s.trim().to_owned())
        .find(|s| !s.is_empty())
        .unwrap_or_default();
        let digest = Sha256::digest(format!("rover.host\0{raw}").as_bytes());
        super::runnet::hex(&digest[..8])
    })
}

/// The labels that tie a resource to the store at `store` on this machine (made absolute: a
/// relative data dir means nothing to another process).
pub fn owner_labels(store: &Path) -> [(String, String); 2] {
    let store = std::path::absolute(store).unwrap_or_else(|_| store.to_owned());
    [
        (LABEL_STORE.to_owned(), store.to_string_lossy().into_owned()),
        (LABEL_HOST.to_owned(), host_id().to_owned()),
    ]
}

/// What kind of Docker resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Kind {
    Container,
    Network,
    Volume,
}

/// What the resource is to rover.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Role {
    /// The store's sandbox proxy server (`rover-proxy-*`).
    ProxyServer,
    /// A run's relay (`<run>-relay`).
    Relay,
    /// A run's network (`<run>-net`).
    RunNetwork,
    /// An agent, gate, hook or corrective container.
    Sandbox,
    /// A container the dev container CLI left from an environment build.
    EnvironmentBuild,
    Volume,
}

/// Why a resource goes or stays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Reason {
    /// Removed: its store's directory does not exist any more.
    StoreGone,
    /// Removed: no daemon holds its store's lock and no live run needs it.
    DaemonDead,
    /// Kept: its store's daemon runs.
    DaemonRuns,
    /// Kept: its run's agent still runs (a `--once` run leaves its agents working).
    LiveRun,
    /// Kept: an agent's container whose result the store's next start collects.
    AwaitsNextStart,
    /// Kept: no daemon ever ran on its store (tests, benchmarks): nothing says it is dead.
    NeverStarted,
    /// Kept: made by an older rover without [`LABEL_STORE`], and nothing the engine reports
    /// says which store it belongs to.
    UnknownStore,
    /// Kept: made on another machine sharing this engine.
    OtherHost,
    /// Kept: its labels do not hold up (see the detail).
    InvalidLabel,
    /// Kept: its store's directory or lock cannot be read (see the detail).
    UnreadableStore,
}

impl Reason {
    /// Whether a resource with this reason is removed.
    pub fn removes(self) -> bool {
        matches!(self, Reason::StoreGone | Reason::DaemonDead)
    }

    /// Whether a kept resource with this reason needs a person's look (said by `gc`).
    pub fn worth_saying(self) -> bool {
        matches!(
            self,
            Reason::UnknownStore | Reason::InvalidLabel | Reason::UnreadableStore
        )
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Reason::StoreGone => "its store is gone",
            Reason::DaemonDead => "its store's daemon is not running and no live run needs it",
            Reason::DaemonRuns => "its store's daemon runs",
            Reason::LiveRun => "its run is live",
            Reason::AwaitsNextStart => "its store's next start collects it",
            Reason::NeverStarted => "no daemon ever ran on its store",
            Reason::UnknownStore => "made by an older rover: its store cannot be told",
            Reason::OtherHost => "made on another machine",
            Reason::InvalidLabel => "its labels do not hold up",
            Reason::UnreadableStore => "its store cannot be read",
        })
    }
}

/// One resource `gc` judged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Leftover {
    pub kind: Kind,
    pub role: Role,
    pub name: String,
    /// The store it belongs to, as its label (or, for an older rover's proxy, its mount) says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    pub reason: Reason,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Role::ProxyServer => "proxy server",
            Role::Relay => "relay",
            Role::RunNetwork => "run network",
            Role::Sandbox => "sandbox",
            Role::EnvironmentBuild => "environment build",
            Role::Volume => "volume",
        })
    }
}

/// `proxy server rover-proxy-… of /store: its store is gone`.
impl std::fmt::Display for Leftover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.role, self.name)?;
        match (&self.store, &self.project) {
            (Some(store), _) => write!(f, " of {}", store.display())?,
            (None, Some(project)) => write!(f, " of project {project}")?,
            (None, None) => {}
        }
        write!(f, ": {}", self.reason)?;
        match &self.detail {
            Some(detail) => write!(f, " ({detail})"),
            None => Ok(()),
        }
    }
}

/// What `gc` did with rover's containers, networks and volumes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Sweep {
    /// The engine swept (`DOCKER_HOST`, else the local socket).
    pub engine: String,
    /// Removed (or, on a dry run, that would be).
    pub removed: Vec<Leftover>,
    pub kept: Vec<Leftover>,
    /// What could not be listed or removed (a missing engine is not an error).
    pub errors: Vec<String>,
    /// rover's proxy images (`rover-proxy:<hash of a rover binary>`, one per rover build that
    /// ran a proxy): those no container uses, but this rover's own, are removed.
    pub proxy_images: ImageSweep,
}

/// The images of a sweep: removed (or, on a dry run, that would be) and kept.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageSweep {
    pub removed: Vec<String>,
    pub kept: Vec<String>,
}

/// A resource as the engine lists it, reduced to what judging it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Found {
    pub kind: Kind,
    pub role: Role,
    /// What the engine removes it by (a container's or network's id, a volume's name).
    pub id: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// The host directory the engine mounts at [`super::runnet::PROXY_MOUNT`] (the proxy's
    /// containers).
    pub proxy_mount: Option<PathBuf>,
    /// A container created, running, paused or restarting; a volume some container mounts.
    pub live: bool,
}

impl Found {
    /// The role its labels give it; `None` for what is not rover's to judge (a container of
    /// a test, or one made from a rover image by hand).
    pub fn role_of(kind: Kind, labels: &BTreeMap<String, String>) -> Option<Role> {
        let proxy = labels.get(LABEL_PROXY_ROLE).map(String::as_str);
        match kind {
            Kind::Volume => (labels.contains_key(LABEL_STORE)
                || labels.contains_key(LABEL_PROJECT))
            .then_some(Role::Volume),
            Kind::Network => (proxy == Some("network")).then_some(Role::RunNetwork),
            Kind::Container => match proxy {
                Some("server") => Some(Role::ProxyServer),
                Some("relay") => Some(Role::Relay),
                // An agent's (or a gate's, hook's) container, whatever its image carries.
                None if labels.contains_key(LABEL_ACTION) || labels.contains_key(LABEL_TRACE) => {
                    Some(Role::Sandbox)
                }
                None if labels.contains_key(LABEL_ENV_BUILD) => Some(Role::EnvironmentBuild),
                None if labels.contains_key(LABEL_PROJECT) || labels.contains_key(LABEL_STORE) => {
                    Some(Role::Sandbox)
                }
                // Another proxy role, or nothing of rover's to judge.
                _ => None,
            },
        }
    }

    fn run(&self) -> Option<&str> {
        self.labels.get(LABEL_PROXY_RUN).map(String::as_str)
    }

    fn project(&self) -> Option<String> {
        self.labels
            .get(LABEL_PROJECT)
            .or_else(|| self.labels.get(LABEL_PROXY_PROJECT))
            .cloned()
    }
}

/// Which store a resource belongs to, as far as can be told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Claim {
    Store(PathBuf),
    OtherHost,
    Unknown,
    Invalid(String),
}

/// An absolute path of plain components (no `.` or `..`), below the root.
fn plain_absolute(path: &Path) -> bool {
    use std::path::Component;
    path.is_absolute()
        && path.components().count() > 1
        && path
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
}

/// The store a proxy container's mount says it serves: the server mounts `<store>/proxy` (and
/// is named after it), a relay `<store>/proxy/sock`.
fn store_of_mount(role: Role, name: &str, mount: &Path) -> Option<PathBuf> {
    let proxy_dir = match role {
        Role::ProxyServer => (server_name(mount) == name).then_some(mount)?,
        Role::Relay => (mount.file_name()? == "sock").then(|| mount.parent())??,
        _ => return None,
    };
    proxy_dir.parent().map(Path::to_path_buf)
}

/// Which store `found` claims on the machine `host`. `legacy_ok`: resources of an older rover
/// are judged by what the engine mounts (the engine is this machine's); `relays`: the claims of
/// the relays, by run, for an older rover's networks.
pub(crate) fn claim(
    found: &Found,
    host: &str,
    legacy_ok: bool,
    relays: &BTreeMap<String, Claim>,
) -> Claim {
    let proxy_side = matches!(found.role, Role::ProxyServer | Role::Relay);
    if let Some(store) = found.labels.get(LABEL_STORE) {
        let store = PathBuf::from(store);
        match found.labels.get(LABEL_HOST) {
            Some(h) if h == host => {}
            Some(_) => return Claim::OtherHost,
            None => return Claim::Invalid(format!("{LABEL_STORE} without {LABEL_HOST}")),
        }
        if !plain_absolute(&store) {
            return Claim::Invalid(format!("{LABEL_STORE} is not a plain absolute path"));
        }
        if proxy_side {
            let mounted = found
                .proxy_mount
                .as_deref()
                .and_then(|m| store_of_mount(found.role, &found.name, m));
            if mounted.as_deref() != Some(store.as_path()) {
                return Claim::Invalid(format!(
                    "{LABEL_STORE} names {} but it mounts {}",
                    store.display(),
                    found
                        .proxy_mount
                        .as_deref()
                        .map_or_else(|| "no proxy dir".to_owned(), |m| m.display().to_string())
                ));
            }
        }
        return Claim::Store(store);
    }
    if !legacy_ok {
        return Claim::Unknown;
    }
    match found.role {
        Role::ProxyServer | Role::Relay => found
            .proxy_mount
            .as_deref()
            .and_then(|m| store_of_mount(found.role, &found.name, m))
            .filter(|s| plain_absolute(s))
            .map_or(Claim::Unknown, Claim::Store),
        Role::RunNetwork => found
            .run()
            .and_then(|run| relays.get(run))
            .cloned()
            .unwrap_or(Claim::Unknown),
        _ => Claim::Unknown,
    }
}

/// The verdict on `found` of store state `state`; `store_live`: a run of its store is live;
/// `run_live`: the run a relay or network serves is.
pub(crate) fn judge(found: &Found, state: &StoreState, store_live: bool, run_live: bool) -> Reason {
    match state {
        StoreState::Gone => Reason::StoreGone,
        StoreState::DaemonRuns => Reason::DaemonRuns,
        StoreState::NeverStarted => Reason::NeverStarted,
        StoreState::Unreadable(_) => Reason::UnreadableStore,
        StoreState::DaemonDead { .. } => match found.role {
            Role::ProxyServer if store_live => Reason::LiveRun,
            Role::Relay | Role::RunNetwork if run_live => Reason::LiveRun,
            Role::ProxyServer | Role::Relay | Role::RunNetwork | Role::EnvironmentBuild => {
                Reason::DaemonDead
            }
            Role::Sandbox if found.live => Reason::LiveRun,
            Role::Sandbox => Reason::AwaitsNextStart,
            // A volume still mounted goes with its container; one no container mounts is of no
            // use (a removal left it behind).
            Role::Volume if found.live => Reason::AwaitsNextStart,
            Role::Volume => Reason::DaemonDead,
        },
    }
}

/// Judges every resource in `found`: `live_names` are the containers (and swarm services)
/// live now, by name; `state` says what a store's directory says of its daemon.
pub(crate) fn judge_all(
    found: &[Found],
    host: &str,
    legacy_ok: bool,
    live_names: &BTreeSet<String>,
    mut state: impl FnMut(&Path) -> StoreState,
) -> Vec<(Found, Leftover)> {
    let relays: BTreeMap<String, Claim> = found
        .iter()
        .filter(|f| f.role == Role::Relay)
        .filter_map(|f| {
            Some((
                f.run()?.to_owned(),
                claim(f, host, legacy_ok, &BTreeMap::new()),
            ))
        })
        .collect();
    let claims: Vec<Claim> = found
        .iter()
        .map(|f| claim(f, host, legacy_ok, &relays))
        .collect();
    let run_live = |f: &Found| f.run().is_some_and(|r| live_names.contains(r));
    // Whether a run's agent has a container on this engine, in any state.
    let on_engine = |run: &str| {
        found
            .iter()
            .any(|g| g.kind == Kind::Container && g.role == Role::Sandbox && g.name == run)
    };
    // A store's runs are live when an agent of it is, or a relay of it serves a live agent.
    let live_stores: BTreeSet<&PathBuf> = found
        .iter()
        .zip(&claims)
        .filter(|(f, _)| {
            (f.role == Role::Sandbox && f.live) || (f.role == Role::Relay && run_live(f))
        })
        .filter_map(|(_, c)| match c {
            Claim::Store(s) => Some(s),
            _ => None,
        })
        .collect();
    let mut states: BTreeMap<PathBuf, StoreState> = BTreeMap::new();
    let mut judged = Vec::new();
    for (f, c) in found.iter().zip(&claims) {
        let (store, reason, detail) = match c {
            Claim::OtherHost => (None, Reason::OtherHost, None),
            Claim::Unknown => (None, Reason::UnknownStore, None),
            Claim::Invalid(why) => (None, Reason::InvalidLabel, Some(why.clone())),
            Claim::Store(s) => {
                let st = states.entry(s.clone()).or_insert_with(|| state(s));
                let detail = match st {
                    StoreState::Unreadable(why) => Some(why.clone()),
                    _ => None,
                };
                // A run its dead daemon's queue still holds, with a relay here and no container
                // here: its agent may run on another engine (a swarm node), through that relay.
                let elsewhere: BTreeSet<&str> = match st {
                    StoreState::DaemonDead { queued } => found
                        .iter()
                        .zip(&claims)
                        .filter(|(g, c)| g.role == Role::Relay && *c == &Claim::Store(s.clone()))
                        .filter_map(|(g, _)| g.run())
                        .filter(|run| queued.contains(*run) && !on_engine(run))
                        .collect(),
                    _ => BTreeSet::new(),
                };
                let store_live = live_stores.contains(s) || !elsewhere.is_empty();
                let this_run_live = run_live(f) || f.run().is_some_and(|r| elsewhere.contains(r));
                let reason = judge(f, st, store_live, this_run_live);
                (Some(s.clone()), reason, detail)
            }
        };
        judged.push((
            f.clone(),
            Leftover {
                kind: f.kind,
                role: f.role,
                name: f.name.clone(),
                store,
                project: f.project(),
                reason,
                detail,
            },
        ));
    }
    judged
}
