use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::stores::{inspect, StoreState};
use super::*;
use crate::sandbox::runnet::{server_name, LABEL_PROXY_PROJECT, LABEL_PROXY_ROLE, LABEL_PROXY_RUN};

const HOST: &str = "this-host";

fn owned(store: &str) -> Vec<(&'static str, String)> {
    vec![
        (LABEL_STORE, store.to_owned()),
        (LABEL_HOST, HOST.to_owned()),
    ]
}

fn found(
    kind: Kind,
    name: &str,
    labels: &[(&str, String)],
    mount: Option<&str>,
    live: bool,
) -> Found {
    let labels: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect();
    Found {
        kind,
        role: Found::role_of(kind, &labels).expect("rover's"),
        id: format!("id-{name}"),
        name: name.to_owned(),
        labels,
        proxy_mount: mount.map(PathBuf::from),
        live,
    }
}

fn server(store: &str, labelled: bool) -> Found {
    let dir = format!("{store}/proxy");
    let mut labels = vec![
        (LABEL_PROXY_PROJECT, "p".to_owned()),
        (LABEL_PROXY_ROLE, "server".to_owned()),
    ];
    if labelled {
        labels.extend(owned(store));
    }
    found(
        Kind::Container,
        &server_name(Path::new(&dir)),
        &labels,
        Some(&dir),
        true,
    )
}

fn relay(store: &str, run: &str, labelled: bool) -> Found {
    let mut labels = vec![
        (LABEL_PROXY_PROJECT, "p".to_owned()),
        (LABEL_PROXY_ROLE, "relay".to_owned()),
        (LABEL_PROXY_RUN, run.to_owned()),
    ];
    if labelled {
        labels.extend(owned(store));
    }
    let sock = format!("{store}/proxy/sock");
    found(
        Kind::Container,
        &format!("{run}-relay"),
        &labels,
        Some(&sock),
        true,
    )
}

fn network(store: &str, run: &str, labelled: bool) -> Found {
    let mut labels = vec![
        (LABEL_PROXY_PROJECT, "p".to_owned()),
        (LABEL_PROXY_ROLE, "network".to_owned()),
        (LABEL_PROXY_RUN, run.to_owned()),
    ];
    if labelled {
        labels.extend(owned(store));
    }
    found(Kind::Network, &format!("{run}-net"), &labels, None, false)
}

fn agent(store: &str, run: &str, live: bool, labelled: bool) -> Found {
    let mut labels = vec![(crate::sandbox::LABEL_PROJECT, "p".to_owned())];
    if labelled {
        labels.extend(owned(store));
    }
    found(Kind::Container, run, &labels, None, live)
}

/// The verdicts by name, with every store in `states` (others are gone).
fn verdicts(
    all: &[Found],
    states: &[(&str, StoreState)],
    legacy_ok: bool,
) -> BTreeMap<String, Reason> {
    let live: BTreeSet<String> = all
        .iter()
        .filter(|f| f.kind == Kind::Container && f.live)
        .map(|f| f.name.clone())
        .collect();
    let states: BTreeMap<PathBuf, StoreState> = states
        .iter()
        .map(|(s, st)| (PathBuf::from(s), st.clone()))
        .collect();
    judge_all(all, HOST, legacy_ok, &live, |root| {
        states.get(root).cloned().unwrap_or(StoreState::Gone)
    })
    .into_iter()
    .map(|(f, l)| (f.name, l.reason))
    .collect()
}

#[test]
fn everything_of_a_gone_store_goes_and_nothing_of_a_store_whose_daemon_runs() {
    let all = [
        server("/d/projects/gone", true),
        relay("/d/projects/gone", "rover-a", true),
        network("/d/projects/gone", "rover-a", true),
        agent("/d/projects/gone", "rover-a", true, true),
        server("/d/projects/up", true),
        relay("/d/projects/up", "rover-b", true),
        network("/d/projects/up", "rover-b", true),
        agent("/d/projects/up", "rover-c", false, true),
    ];
    let v = verdicts(&all, &[("/d/projects/up", StoreState::DaemonRuns)], true);
    for name in [&all[0].name, "rover-a-relay", "rover-a-net", "rover-a"] {
        assert_eq!(v[name], Reason::StoreGone, "{name}: {v:?}");
    }
    for name in [&all[4].name, "rover-b-relay", "rover-b-net", "rover-c"] {
        assert_eq!(v[name], Reason::DaemonRuns, "{name}: {v:?}");
    }
}

#[test]
fn a_dead_daemons_proxy_stays_while_a_run_of_it_is_live_and_its_agents_wait_for_its_next_start() {
    let store = "/d/projects/dead";
    let live = [
        server(store, true),
        relay(store, "rover-live", true),
        network(store, "rover-live", true),
        agent(store, "rover-live", true, true),
        relay(store, "rover-over", true),
        network(store, "rover-over", true),
        agent(store, "rover-over", false, true),
        relay(store, "rover-gone", true),
        network(store, "rover-gone", true),
    ];
    let v = verdicts(
        &live,
        &[(
            store,
            StoreState::DaemonDead {
                queued: BTreeSet::new(),
            },
        )],
        true,
    );
    assert_eq!(v[&live[0].name], Reason::LiveRun, "{v:?}");
    for name in ["rover-live-relay", "rover-live-net", "rover-live"] {
        assert_eq!(v[name], Reason::LiveRun, "{name}: {v:?}");
    }
    for name in [
        "rover-over-relay",
        "rover-over-net",
        "rover-gone-relay",
        "rover-gone-net",
    ] {
        assert_eq!(v[name], Reason::DaemonDead, "{name}: {v:?}");
    }
    assert_eq!(v["rover-over"], Reason::AwaitsNextStart, "{v:?}");
    // With no live run, the server goes too.
    let v = verdicts(
        &live[4..],
        &[(
            store,
            StoreState::DaemonDead {
                queued: BTreeSet::new(),
            },
        )],
        true,
    );
    assert!(v.values().all(|r| *r != Reason::LiveRun), "{v:?}");
    let v = verdicts(
        &[server(store, true)],
        &[(
            store,
            StoreState::DaemonDead {
                queued: BTreeSet::new(),
            },
        )],
        true,
    );
    assert_eq!(v.values().next(), Some(&Reason::DaemonDead));
}

/// A swarm run's agent is a service on another engine: with its run still queued in its dead
/// daemon's store and no container of it here, its relay, network and the proxy server stay
/// (a `gc` of another store's must not cut a `--once` run's model access); a queued run whose
/// agent is here and exited, and a run no longer queued, go.
#[test]
fn a_queued_run_whose_agent_is_on_another_engine_keeps_its_relay_and_the_proxy() {
    let store = "/d/projects/cron";
    let found = [
        server(store, true),
        relay(store, "rover-swarm", true),
        network(store, "rover-swarm", true),
        relay(store, "rover-here", true),
        network(store, "rover-here", true),
        agent(store, "rover-here", false, true),
        relay(store, "rover-done", true),
        network(store, "rover-done", true),
    ];
    let queued: BTreeSet<String> = ["rover-swarm", "rover-here"]
        .iter()
        .map(|r| (*r).to_owned())
        .collect();
    let v = verdicts(&found, &[(store, StoreState::DaemonDead { queued })], true);
    assert_eq!(v[&found[0].name], Reason::LiveRun, "{v:?}");
    for name in ["rover-swarm-relay", "rover-swarm-net"] {
        assert_eq!(v[name], Reason::LiveRun, "{name}: {v:?}");
    }
    for name in [
        "rover-here-relay",
        "rover-here-net",
        "rover-done-relay",
        "rover-done-net",
    ] {
        assert_eq!(v[name], Reason::DaemonDead, "{name}: {v:?}");
    }
}

#[test]
fn a_store_no_daemon_ever_ran_on_or_that_cannot_be_read_keeps_its_resources() {
    let all = [server("/t/data", true), relay("/u/data", "rover-x", true)];
    let v = verdicts(
        &all,
        &[
            ("/t/data", StoreState::NeverStarted),
            ("/u/data", StoreState::Unreadable("denied".into())),
        ],
        true,
    );
    assert_eq!(v[&all[0].name], Reason::NeverStarted);
    assert_eq!(v["rover-x-relay"], Reason::UnreadableStore);
}

#[test]
fn labels_that_do_not_hold_up_keep_the_resource() {
    let mut other_host = server("/d/projects/a", true);
    other_host
        .labels
        .insert(LABEL_HOST.to_owned(), "another-machine".to_owned());
    let mut relative = relay("/d/projects/b", "rover-rel", true);
    relative
        .labels
        .insert(LABEL_STORE.to_owned(), "d/projects/b".to_owned());
    let mut dotted = relay("/d/projects/c", "rover-dot", true);
    dotted
        .labels
        .insert(LABEL_STORE.to_owned(), "/d/projects/../c".to_owned());
    // A server claiming one store while the engine mounts another's proxy dir.
    let mut lying = server("/d/projects/d", true);
    lying
        .labels
        .insert(LABEL_STORE.to_owned(), "/d/projects/e".to_owned());
    let mut no_host = agent("/d/projects/f", "rover-nohost", false, true);
    no_host.labels.remove(LABEL_HOST);
    let all = [other_host, relative, dotted, lying, no_host];
    let v = verdicts(&all, &[], true);
    assert_eq!(v[&all[0].name], Reason::OtherHost, "{v:?}");
    for f in &all[1..] {
        assert_eq!(v[&f.name], Reason::InvalidLabel, "{}: {v:?}", f.name);
    }
}

#[test]
fn an_older_rovers_proxy_is_judged_by_what_the_engine_mounts_and_its_other_containers_are_kept() {
    let store = "/d/projects/old";
    let all = [
        server(store, false),
        relay(store, "rover-old", false),
        network(store, "rover-old", false),
        network(store, "rover-lone", false),
        agent(store, "rover-old", false, false),
    ];
    let v = verdicts(&all, &[], true);
    for name in [&all[0].name, "rover-old-relay", "rover-old-net"] {
        assert_eq!(v[name], Reason::StoreGone, "{name}: {v:?}");
    }
    assert_eq!(v["rover-lone-net"], Reason::UnknownStore, "{v:?}");
    assert_eq!(v["rover-old"], Reason::UnknownStore, "{v:?}");
    // A server not named after the dir it mounts is not taken at its mount's word.
    let mut renamed = server(store, false);
    renamed.name = "rover-proxy-000000000000".to_owned();
    assert_eq!(
        verdicts(&[renamed], &[], true).into_values().next(),
        Some(Reason::UnknownStore)
    );
    // On an engine that may not share this machine's files, nothing of an older rover goes.
    let v = verdicts(&all, &[], false);
    assert!(v.values().all(|r| *r == Reason::UnknownStore), "{v:?}");
}

#[test]
fn only_rovers_own_resources_are_judged() {
    let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    assert_eq!(
        Found::role_of(Kind::Container, &labels(&[("rover.image", "agents")])),
        None
    );
    assert_eq!(
        Found::role_of(Kind::Container, &labels(&[("rover.test", "x")])),
        None
    );
    assert_eq!(
        Found::role_of(Kind::Network, &labels(&[("rover.project", "p")])),
        None
    );
    assert_eq!(
        Found::role_of(
            Kind::Container,
            &labels(&[("rover.env.build", "h"), ("rover.store", "/s")])
        ),
        Some(Role::EnvironmentBuild)
    );
    // An agent's container in an environment image an older rover built (whose setup
    // container's build label came with the commit) is the agent's, never a build's: a dead
    // daemon's exited agent waits for its next start.
    assert_eq!(
        Found::role_of(
            Kind::Container,
            &labels(&[
                ("rover.env.build", "h"),
                ("rover.store", "/s"),
                ("rover.project", "p"),
                ("rover.trace", "t"),
                ("rover.action", "a"),
            ])
        ),
        Some(Role::Sandbox)
    );
    assert_eq!(
        Found::role_of(
            Kind::Volume,
            &labels(&[("rover.project", "p"), ("rover.swarm", "1")])
        ),
        Some(Role::Volume)
    );
}

#[test]
fn owner_labels_name_the_store_absolute_and_this_machine_by_a_hash() {
    let [store, host] = owner_labels(Path::new("/d/projects/p"));
    assert_eq!(store, (LABEL_STORE.to_owned(), "/d/projects/p".to_owned()));
    assert_eq!(host.0, LABEL_HOST);
    assert_eq!(host.1.len(), 16);
    let machine = std::fs::read_to_string("/etc/machine-id").unwrap_or_default();
    assert!(machine.trim().is_empty() || !host.1.contains(machine.trim()));
    let [relative, _] = owner_labels(Path::new("data/projects/p"));
    assert!(Path::new(&relative.1).is_absolute(), "{relative:?}");
}

#[test]
fn a_stores_directory_and_daemon_lock_say_whether_its_daemon_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("projects").join("p");
    assert_eq!(inspect(&root).0, StoreState::Gone);
    let store = crate::store::AutopilotStore::open(tmp.path(), "p").unwrap();
    assert_eq!(inspect(&root).0, StoreState::NeverStarted);
    let lock = crate::store::DaemonLock::try_acquire(&store.daemon_lock_path()).unwrap();
    assert_eq!(inspect(&root).0, StoreState::DaemonRuns);
    drop(lock);
    let (state, held) = inspect(&root);
    assert_eq!(
        state,
        StoreState::DaemonDead {
            queued: BTreeSet::new()
        }
    );
    // A daemon starting while a sweep holds the lock waits for it, not refused.
    let release = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(300));
        drop(held);
    });
    let lock = crate::store::DaemonLock::try_acquire(&store.daemon_lock_path())
        .expect("taken once the sweep lets go");
    release.join().unwrap();
    drop(lock);
    // A lock that is a link is not followed.
    std::fs::remove_file(store.daemon_lock_path()).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", store.daemon_lock_path()).unwrap();
    assert!(matches!(inspect(&root).0, StoreState::Unreadable(_)));
}

#[test]
fn a_dead_stores_volume_goes_once_no_container_mounts_it() {
    let store = "/d/projects/dead";
    let volume = |name: &str, mounted: bool| {
        let mut labels = owned(store);
        labels.push((crate::sandbox::LABEL_PROJECT, "p".to_owned()));
        found(Kind::Volume, name, &labels, None, mounted)
    };
    let all = [volume("mounted", true), volume("left", false)];
    let v = verdicts(
        &all,
        &[(
            store,
            StoreState::DaemonDead {
                queued: BTreeSet::new(),
            },
        )],
        true,
    );
    assert_eq!(v["mounted"], Reason::AwaitsNextStart, "{v:?}");
    assert_eq!(v["left"], Reason::DaemonDead, "{v:?}");
    let v = verdicts(&all, &[(store, StoreState::DaemonRuns)], true);
    assert!(v.values().all(|r| *r == Reason::DaemonRuns), "{v:?}");
}

#[test]
fn a_proxy_image_goes_when_unused_not_this_rovers_and_an_hour_old() {
    use super::engine::proxy_image_goes;
    let own = Some("rover-proxy:aaaa");
    assert!(proxy_image_goes("rover-proxy:bbbb", false, own, 7200));
    assert!(
        !proxy_image_goes("rover-proxy:bbbb", true, own, 7200),
        "a container uses it"
    );
    assert!(
        !proxy_image_goes("rover-proxy:aaaa", false, own, 7200),
        "this rover's own"
    );
    assert!(
        !proxy_image_goes("rover-proxy:bbbb", false, own, 60),
        "imported a minute ago"
    );
    assert!(proxy_image_goes("rover-proxy:bbbb", false, None, 3600));
}

/// The proxy server the repositories of a daemon file share is the daemon dir's: it mounts
/// `<data dir>/daemon/proxy`, each relay its `sock/`. It stays while the daemon runs or a run
/// of any of its repositories is live (through its relay), and goes with the daemon dead and no
/// run live; the agents stay their own stores'.
#[test]
fn a_daemon_files_shared_proxy_is_its_daemons_and_stays_while_any_repositorys_run_is_live() {
    let daemon = "/d/daemon";
    let all = [
        server(daemon, true),
        relay(daemon, "rover-a1", true),
        network(daemon, "rover-a1", true),
        agent("/d/projects/a", "rover-a1", true, true),
        relay(daemon, "rover-b1", true),
        network(daemon, "rover-b1", true),
        agent("/d/projects/b", "rover-b1", false, true),
    ];
    let judged = judge_all(
        &all,
        HOST,
        true,
        &BTreeSet::from(["rover-a1".to_owned()]),
        |_| StoreState::DaemonRuns,
    );
    for (f, l) in &judged {
        match f.role {
            Role::ProxyServer | Role::Relay | Role::RunNetwork => {
                assert_eq!(l.store.as_deref(), Some(Path::new(daemon)), "{l}");
            }
            _ => assert!(l.store.as_deref() != Some(Path::new(daemon)), "{l}"),
        }
        assert_eq!(l.reason, Reason::DaemonRuns, "{l}");
    }
    let dead = || StoreState::DaemonDead {
        queued: BTreeSet::new(),
    };
    let states = [
        (daemon, dead()),
        ("/d/projects/a", dead()),
        ("/d/projects/b", dead()),
    ];
    let v = verdicts(&all, &states, true);
    assert_eq!(v[&all[0].name], Reason::LiveRun, "{v:?}");
    for name in ["rover-a1-relay", "rover-a1-net", "rover-a1"] {
        assert_eq!(v[name], Reason::LiveRun, "{name}: {v:?}");
    }
    for name in ["rover-b1-relay", "rover-b1-net"] {
        assert_eq!(v[name], Reason::DaemonDead, "{name}: {v:?}");
    }
    // No run live in any repository: the server goes.
    let v = verdicts(&all[4..], &states, true);
    assert!(v.values().all(|r| *r != Reason::LiveRun), "{v:?}");
    let v = verdicts(&[server(daemon, true)], &states, true);
    assert_eq!(v.values().next(), Some(&Reason::DaemonDead));
    // A label naming a repository's store on the shared server does not hold up: it mounts the
    // daemon's dir.
    let mut lying = server(daemon, true);
    lying
        .labels
        .insert(LABEL_STORE.to_owned(), "/d/projects/a".to_owned());
    assert!(matches!(
        claim(&lying, HOST, true, &BTreeMap::new()),
        Claim::Invalid(_)
    ));
}

#[test]
fn a_daemon_dirs_lock_says_whether_the_daemon_of_a_daemon_file_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("daemon");
    std::fs::create_dir_all(dir.join("proxy")).unwrap();
    assert_eq!(inspect(&dir).0, StoreState::NeverStarted);
    let lock = crate::store::DaemonLock::try_acquire(&dir.join("daemon.lock")).unwrap();
    assert_eq!(inspect(&dir).0, StoreState::DaemonRuns);
    drop(lock);
    // Dead: the runs queued by the repositories it served through its proxy count.
    let store = crate::store::AutopilotStore::open(tmp.path(), "acme-web-1a2b3c4d").unwrap();
    std::fs::create_dir_all(dir.join("proxy").join("acme-web-1a2b3c4d")).unwrap();
    std::fs::create_dir_all(dir.join("proxy").join("sock")).unwrap();
    assert!(store.read_state().unwrap().pending.is_empty());
    let (state, held) = inspect(&dir);
    assert_eq!(
        state,
        StoreState::DaemonDead {
            queued: BTreeSet::new()
        }
    );
    drop(held);
}
