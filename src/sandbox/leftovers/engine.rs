//! The sweep on the engine: list every container, network and volume, judge rover's (see
//! [`super::judge_all`]), remove those to go (containers first: a network with members and a
//! volume in use cannot go before them).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;

use bollard::models::ContainerSummaryStateEnum as State;
use bollard::query_parameters::{
    ListContainersOptionsBuilder, ListImagesOptionsBuilder, ListServicesOptionsBuilder,
    RemoveContainerOptionsBuilder,
};

use super::stores::Stores;
use super::{host_id, judge_all, Found, ImageSweep, Kind, Sweep};
use crate::host_env::HostEnv;
use crate::sandbox::error::status_of;
use crate::sandbox::runnet::{proxy_image_reference, PROXY_IMAGE_REPO, PROXY_MOUNT};
use crate::sandbox::spec::LABEL_PROJECT;
use crate::sandbox::DockerSandbox;

/// The label the engine puts on a swarm task's container: its service owns it, not rover.
const SWARM_TASK: &str = "com.docker.swarm.service.id";

/// A resource's labels, without the blank ones: rover's layer over an environment blanks the
/// build's labels its setup container passed into the image (`rover.env.build=""`, ...), so a
/// container of that image is not taken for the build.
fn labels(map: Option<HashMap<String, String>>) -> BTreeMap<String, String> {
    map.unwrap_or_default()
        .into_iter()
        .filter(|(_, value)| !value.is_empty())
        .collect()
}

/// Sweeps rover's leftovers on the engine at `DOCKER_HOST` in rover's environment (`env`; else
/// the local socket); on `dry_run`, only says what would go. A missing engine is an empty
/// sweep, not an error.
pub async fn sweep(dry_run: bool, env: &HostEnv) -> Sweep {
    let host = crate::sandbox::docker_host(env.var(crate::sandbox::DOCKER_HOST_ENV));
    let mut sweep = Sweep {
        engine: host.clone(),
        ..Sweep::default()
    };
    let Ok(docker) = DockerSandbox::connect_to(&host, Vec::new()).await else {
        tracing::debug!(engine = %host, "no Docker engine answers: no leftovers to sweep");
        return sweep;
    };
    let (found, live_names) = match list(&docker).await {
        Ok(listed) => listed,
        Err(e) => {
            sweep.errors.push(e);
            return sweep;
        }
    };
    // An older rover's resources name no store: what the engine mounts into its proxy's
    // containers does, when the engine shares this machine's file system.
    let legacy_ok = host.starts_with("unix://");
    let mut stores = Stores::new(!dry_run);
    let judged = judge_all(&found, host_id(), legacy_ok, &live_names, |root| {
        stores.state(root)
    });
    let (mut gone, kept): (Vec<_>, Vec<_>) =
        judged.into_iter().partition(|(_, l)| l.reason.removes());
    sweep.kept = kept.into_iter().map(|(_, l)| l).collect();
    gone.sort_by_key(|(f, _)| f.kind);
    for (found, leftover) in gone {
        if !dry_run {
            if let Err(e) = remove(&docker, &found).await {
                sweep.errors.push(e);
                continue;
            }
            tracing::info!(
                name = %leftover.name,
                role = ?leftover.role,
                store = ?leftover.store,
                reason = %leftover.reason,
                "removed a leftover of rover's"
            );
        }
        sweep.removed.push(leftover);
    }
    drop(stores);
    sweep.proxy_images = proxy_images(&docker, dry_run, &mut sweep.errors).await;
    sweep
}

/// How old a proxy image no container uses must be to go: one imported a moment ago is about
/// to start a proxy server.
const PROXY_IMAGE_MIN_AGE_SECS: i64 = 3600;

/// Whether the proxy image `tag` goes: no container uses it, it is not this rover's own
/// (`own`), and it was made at least [`PROXY_IMAGE_MIN_AGE_SECS`] ago (`age_secs`).
pub(crate) fn proxy_image_goes(tag: &str, used: bool, own: Option<&str>, age_secs: i64) -> bool {
    !used && own != Some(tag) && age_secs >= PROXY_IMAGE_MIN_AGE_SECS
}

/// Removes rover's proxy images no container uses (running or not), but this rover's own and
/// those made in the last hour: one is made per rover build that ran a proxy, so an upgraded
/// rover leaves the old ones. A rover whose image went imports it again at its next start (about
/// a second). One a container took meanwhile is refused by the engine, and kept.
async fn proxy_images(
    docker: &DockerSandbox,
    dry_run: bool,
    errors: &mut Vec<String>,
) -> ImageSweep {
    let mut images = ImageSweep::default();
    let own = match std::env::current_exe() {
        Ok(exe) => proxy_image_reference(&exe).await.ok(),
        Err(_) => None,
    };
    let now = chrono::Utc::now().timestamp();
    let client = docker.client();
    let filters = HashMap::from([(
        "reference".to_owned(),
        vec![format!("{PROXY_IMAGE_REPO}:*")],
    )]);
    let listed = match client
        .list_images(Some(
            ListImagesOptionsBuilder::default()
                .filters(&filters)
                .build(),
        ))
        .await
    {
        Ok(listed) => listed,
        Err(e) => {
            errors.push(format!("cannot list rover's proxy images: {e}"));
            return images;
        }
    };
    let used: BTreeSet<String> = match client
        .list_containers(Some(
            ListContainersOptionsBuilder::default().all(true).build(),
        ))
        .await
    {
        Ok(containers) => containers.into_iter().filter_map(|c| c.image_id).collect(),
        Err(e) => {
            errors.push(format!("cannot list containers: {e}"));
            return images;
        }
    };
    for image in listed {
        let tags: Vec<&String> = image
            .repo_tags
            .iter()
            .filter(|t| t.starts_with(&format!("{PROXY_IMAGE_REPO}:")))
            .collect();
        for tag in tags {
            let age = now - image.created;
            if !proxy_image_goes(tag, used.contains(&image.id), own.as_deref(), age) {
                images.kept.push(tag.clone());
                continue;
            }
            if !dry_run {
                match client
                    .remove_image(
                        tag,
                        None::<bollard::query_parameters::RemoveImageOptions>,
                        None,
                    )
                    .await
                {
                    Ok(_) => {}
                    Err(e) if status_of(&e) == Some(404) => {}
                    Err(e) if status_of(&e) == Some(409) => {
                        images.kept.push(tag.clone());
                        continue;
                    }
                    Err(e) => {
                        errors.push(format!("cannot remove the image {tag}: {e}"));
                        continue;
                    }
                }
                tracing::info!(image = %tag, "removed a proxy image no container uses");
            }
            images.removed.push(tag.clone());
        }
    }
    images
}

/// rover's containers, networks and volumes, and the names of the containers (and rover's
/// swarm services) live now.
async fn list(docker: &DockerSandbox) -> Result<(Vec<Found>, BTreeSet<String>), String> {
    let client = docker.client();
    let mut found = Vec::new();
    let mut live = BTreeSet::new();
    let mut used_volumes = BTreeSet::new();
    let containers = client
        .list_containers(Some(
            ListContainersOptionsBuilder::default().all(true).build(),
        ))
        .await
        .map_err(|e| format!("cannot list containers: {e}"))?;
    for c in containers {
        let is_live = matches!(
            c.state,
            Some(State::CREATED | State::RUNNING | State::PAUSED | State::RESTARTING)
        );
        let name = c
            .names
            .iter()
            .flatten()
            .next()
            .map(|n| n.trim_start_matches('/').to_owned())
            .unwrap_or_default();
        if is_live {
            live.insert(name.clone());
        }
        used_volumes.extend(c.mounts.iter().flatten().filter_map(|m| m.name.clone()));
        let labels = labels(c.labels);
        let Some(role) = Found::role_of(Kind::Container, &labels) else {
            continue;
        };
        if labels.contains_key(SWARM_TASK) {
            continue;
        }
        let proxy_mount = c.mounts.iter().flatten().find_map(|m| {
            (m.destination.as_deref() == Some(PROXY_MOUNT))
                .then(|| m.source.as_ref().map(PathBuf::from))
                .flatten()
        });
        found.push(Found {
            kind: Kind::Container,
            role,
            id: c.id.unwrap_or_else(|| name.clone()),
            name,
            labels,
            proxy_mount,
            live: is_live,
        });
    }
    // Runs of the swarm backend are services: live while they exist (none on a plain engine).
    let filters = HashMap::from([("label".to_owned(), vec![LABEL_PROJECT.to_owned()])]);
    if let Ok(services) = client
        .list_services(Some(
            ListServicesOptionsBuilder::default()
                .filters(&filters)
                .build(),
        ))
        .await
    {
        live.extend(services.into_iter().filter_map(|s| s.spec?.name));
    }
    let networks = client
        .list_networks(None::<bollard::query_parameters::ListNetworksOptions>)
        .await
        .map_err(|e| format!("cannot list networks: {e}"))?;
    for n in networks {
        let labels = labels(n.labels);
        let Some(role) = Found::role_of(Kind::Network, &labels) else {
            continue;
        };
        let name = n.name.unwrap_or_default();
        found.push(Found {
            kind: Kind::Network,
            role,
            id: n.id.unwrap_or_else(|| name.clone()),
            name,
            labels,
            proxy_mount: None,
            live: false,
        });
    }
    let volumes = client
        .list_volumes(None::<bollard::query_parameters::ListVolumesOptions>)
        .await
        .map_err(|e| format!("cannot list volumes: {e}"))?;
    for v in volumes.volumes.unwrap_or_default() {
        let labels = labels(Some(v.labels));
        let Some(role) = Found::role_of(Kind::Volume, &labels) else {
            continue;
        };
        found.push(Found {
            kind: Kind::Volume,
            role,
            id: v.name.clone(),
            live: used_volumes.contains(&v.name),
            name: v.name,
            labels,
            proxy_mount: None,
        });
    }
    Ok((found, live))
}

/// Removes `found` (gone already is fine).
async fn remove(docker: &DockerSandbox, found: &Found) -> Result<(), String> {
    let client = docker.client();
    let done = match found.kind {
        Kind::Container => {
            let options = RemoveContainerOptionsBuilder::default()
                .force(true)
                .v(true)
                .build();
            client.remove_container(&found.id, Some(options)).await
        }
        Kind::Network => client.remove_network(&found.id).await,
        Kind::Volume => {
            client
                .remove_volume(
                    &found.id,
                    None::<bollard::query_parameters::RemoveVolumeOptions>,
                )
                .await
        }
    };
    match done {
        Ok(()) => Ok(()),
        Err(e) if status_of(&e) == Some(404) => Ok(()),
        Err(e) => Err(format!(
            "cannot remove the {} {}: {e}",
            match found.kind {
                Kind::Container => "container",
                Kind::Network => "network",
                Kind::Volume => "volume",
            },
            found.name
        )),
    }
}
