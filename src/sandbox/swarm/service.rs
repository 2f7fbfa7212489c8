//! A sandbox spec as a Swarm service of one task that is never restarted, placed by the spec's
//! limits (as reservations and limits) and the configured constraints. Pure.
//!
//! Not a `replicated-job`: on engines before 24 (Debian bookworm ships 20.10), removing a job
//! service leaves its running tasks running (moby/moby#44312, fixed by moby/swarmkit#3112), and
//! Swarm has no other way to stop a task, so a job on such an engine could not be cancelled. A
//! `replicated` service of one replica with the restart condition `none` runs once as well (a
//! completed task is not replaced, and neither is one lost with its node: measured, see
//! docs/scale.md), and scaling it to 0 stops its task at once.

use std::collections::HashMap;

use bollard::models::{
    Limit, Mount, MountTmpfsOptions, MountType, NetworkAttachmentConfig, ResourceObject,
    ResourcesUlimits, ServiceSpec, ServiceSpecMode, ServiceSpecModeReplicated, TaskSpec,
    TaskSpecContainerSpec, TaskSpecContainerSpecDnsConfig, TaskSpecContainerSpecPrivileges,
    TaskSpecLogDriver, TaskSpecPlacement, TaskSpecResources, TaskSpecRestartPolicy,
    TaskSpecRestartPolicyConditionEnum,
};

use crate::sandbox::spec::{SandboxSpec, WORKSPACE_MOUNT};

/// Label on every service rover makes, so its own can be told from others on a shared swarm.
pub const LABEL_SWARM: &str = "rover.swarm";
/// Label rover adds to a service whose task it stopped (scaled to 0): its task's `shutdown`
/// is then a kill, not the loss of its node.
pub const LABEL_STOPPED: &str = "rover.swarm.stopped";

/// What goes into one service besides the spec.
#[derive(Debug, Clone)]
pub struct ServicePlan {
    /// The image as the nodes must find it: an id (`sha256:…`, never pulled) or a reference
    /// with a digest from the registry rover pushed to.
    pub image: String,
    /// `uid:gid` the task runs as.
    pub user: String,
    /// The container's environment, `NAME=value`.
    pub env: Vec<String>,
    /// Bind mounts (only while the workspace is still mounted, not shipped).
    pub mounts: Vec<Mount>,
    /// Placement constraints (`node.labels.pool==agents`, `node.role==worker`).
    pub constraints: Vec<String>,
    /// The task's command: the spec's, or the spec's wrapped to ship the workspace.
    pub command: Vec<String>,
    /// Labels of the service besides the spec's.
    pub labels: Vec<(String, String)>,
}

/// Whether a network name is one a service can join (a run's overlay), rather than a mode of
/// the local engine (`none`, `bridge`, `host`).
pub(super) fn joins_network(network: &str) -> bool {
    !matches!(network, "none" | "bridge" | "host" | "default" | "")
}

/// The service for `spec`.
pub fn service_spec(spec: &SandboxSpec, plan: ServicePlan) -> ServiceSpec {
    let labels: HashMap<String, String> = spec
        .all_labels()
        .into_iter()
        .chain([(LABEL_SWARM.to_owned(), "1".to_owned())])
        .chain(plan.labels)
        .collect();
    let mut mounts = plan.mounts;
    if spec.readonly_rootfs {
        mounts.push(Mount {
            target: Some("/tmp".to_owned()),
            typ: Some(MountType::TMPFS),
            tmpfs_options: Some(MountTmpfsOptions {
                size_bytes: Some(512 * 1024 * 1024),
                mode: Some(0o1777),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    #[allow(
        clippy::cast_possible_truncation,
        reason = "cpus is small and positive"
    )]
    let nano_cpus = (spec.limits.cpus * 1e9) as i64;
    let container = TaskSpecContainerSpec {
        image: Some(plan.image),
        command: Some(plan.command),
        env: Some(plan.env),
        dir: Some(WORKSPACE_MOUNT.to_owned()),
        user: Some(plan.user),
        // The task's container carries no `rover.*` label: where rover's own engine is also a
        // node, the container would otherwise be listed twice (as itself and as its service).
        labels: None,
        read_only: Some(spec.readonly_rootfs),
        mounts: Some(mounts),
        tty: Some(false),
        open_stdin: Some(false),
        init: Some(true),
        capability_drop: Some(vec!["ALL".to_owned()]),
        // Honoured from API 1.46 (engine 27) on; older engines drop the field.
        privileges: Some(TaskSpecContainerSpecPrivileges {
            no_new_privileges: Some(true),
            ..Default::default()
        }),
        ulimits: Some(vec![ResourcesUlimits {
            name: Some("fsize".to_owned()),
            soft: Some(spec.limits.file_bytes),
            hard: Some(spec.limits.file_bytes),
        }]),
        // Scaling the service to 0 is how a task is stopped (Swarm has no kill): at once.
        stop_signal: Some("SIGKILL".to_owned()),
        stop_grace_period: Some(0),
        dns_config: (!spec.dns.is_empty()).then(|| TaskSpecContainerSpecDnsConfig {
            nameservers: Some(spec.dns.clone()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let networks = joins_network(&spec.network).then(|| {
        vec![NetworkAttachmentConfig {
            target: Some(spec.network.clone()),
            ..Default::default()
        }]
    });
    ServiceSpec {
        name: Some(spec.container_name()),
        labels: Some(labels),
        task_template: Some(TaskSpec {
            container_spec: Some(container),
            resources: Some(TaskSpecResources {
                // Reservations make Swarm place by them; limits hold the task to them.
                limits: Some(Limit {
                    nano_cpus: Some(nano_cpus),
                    memory_bytes: Some(spec.limits.memory_bytes),
                    pids: Some(spec.limits.pids),
                }),
                reservations: Some(ResourceObject {
                    nano_cpus: Some(nano_cpus),
                    memory_bytes: Some(spec.limits.memory_bytes),
                    generic_resources: None,
                }),
                ..Default::default()
            }),
            // A failed run is the resolver's to retry, never the engine's.
            restart_policy: Some(TaskSpecRestartPolicy {
                condition: Some(TaskSpecRestartPolicyConditionEnum::NONE),
                max_attempts: Some(0),
                ..Default::default()
            }),
            placement: (!plan.constraints.is_empty()).then(|| TaskSpecPlacement {
                constraints: Some(plan.constraints),
                ..Default::default()
            }),
            networks,
            log_driver: Some(TaskSpecLogDriver {
                name: Some("json-file".to_owned()),
                options: Some(HashMap::from([
                    ("max-size".to_owned(), spec.limits.log_bytes.to_string()),
                    ("max-file".to_owned(), "2".to_owned()),
                ])),
            }),
            ..Default::default()
        }),
        mode: Some(ServiceSpecMode {
            replicated: Some(ServiceSpecModeReplicated { replicas: Some(1) }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::{SandboxLabels, SandboxSettings};

    fn spec(network: &str) -> SandboxSpec {
        let settings = SandboxSettings {
            image: "img:1".into(),
            memory_mb: 512,
            cpus: 1.5,
            ..SandboxSettings::default()
        };
        let mut spec = SandboxSpec::from_settings(
            &settings,
            vec!["claude".into(), "-p".into()],
            "/w",
            SandboxLabels {
                project: "p".into(),
                trace: "t".into(),
                action: "a".into(),
            },
        );
        network.clone_into(&mut spec.network);
        spec
    }

    fn plan() -> ServicePlan {
        ServicePlan {
            image: "sha256:abc".into(),
            user: "10001:10001".into(),
            env: vec!["HOME=/tmp".into()],
            mounts: Vec::new(),
            constraints: vec!["node.labels.rover.node==wkr".into()],
            command: vec!["claude".into(), "-p".into()],
            labels: Vec::new(),
        }
    }

    #[test]
    fn a_closed_runs_task_asks_its_names_of_the_sink_only() {
        let mut closed = spec("rover-a-net");
        closed.dns = vec![crate::sandbox::DNS_SINK.to_owned()];
        let c = service_spec(&closed, plan())
            .task_template
            .expect("template")
            .container_spec
            .expect("container");
        assert_eq!(
            c.dns_config.expect("dns").nameservers,
            Some(vec!["192.0.2.1".to_owned()])
        );
        let open = service_spec(&spec("rover-a-net"), plan());
        assert!(open
            .task_template
            .and_then(|t| t.container_spec)
            .is_some_and(|c| c.dns_config.is_none()));
    }

    #[test]
    fn one_task_never_restarted_with_limits_as_reservations() {
        let s = service_spec(&spec("rover-a-net"), plan());
        assert_eq!(s.name.as_deref(), Some("rover-a"));
        let mode = s.mode.expect("mode").replicated.expect("replicated");
        assert_eq!(mode.replicas, Some(1));
        let task = s.task_template.expect("template");
        let restart = task.restart_policy.expect("restart");
        assert_eq!(
            restart.condition,
            Some(TaskSpecRestartPolicyConditionEnum::NONE)
        );
        let res = task.resources.expect("resources");
        let limits = res.limits.expect("limits");
        let reserved = res.reservations.expect("reservations");
        assert_eq!(limits.nano_cpus, Some(1_500_000_000));
        assert_eq!(reserved.nano_cpus, Some(1_500_000_000));
        assert_eq!(limits.memory_bytes, Some(512 * 1024 * 1024));
        assert_eq!(reserved.memory_bytes, limits.memory_bytes);
        assert_eq!(
            task.placement.expect("placement").constraints,
            Some(vec!["node.labels.rover.node==wkr".to_owned()])
        );
        let nets = task.networks.expect("networks");
        assert_eq!(nets[0].target.as_deref(), Some("rover-a-net"));
        let c = task.container_spec.expect("container");
        assert_eq!(c.image.as_deref(), Some("sha256:abc"));
        assert_eq!(c.capability_drop, Some(vec!["ALL".to_owned()]));
        assert!(
            c.labels.is_none(),
            "the task's container carries no rover label"
        );
        let labels = s.labels.expect("labels");
        assert_eq!(labels["rover.action"], "a");
        assert_eq!(labels[LABEL_SWARM], "1");
        let tmp = c.mounts.expect("mounts");
        assert_eq!(tmp.len(), 1, "only the tmpfs /tmp: {tmp:?}");
        assert_eq!(tmp[0].typ, Some(MountType::TMPFS));
    }

    #[test]
    fn a_local_network_mode_is_not_joined() {
        for mode in ["none", "bridge"] {
            let s = service_spec(&spec(mode), plan());
            assert!(s.task_template.expect("template").networks.is_none());
        }
        let mut p = plan();
        p.constraints.clear();
        let s = service_spec(&spec("none"), p);
        assert!(s.task_template.expect("template").placement.is_none());
    }
}
