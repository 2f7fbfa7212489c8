//! Removing environment images nothing needs any more: every `rover-env` image of the project
//! but the newest and those the traces still holding their tasks ran in.

use std::collections::BTreeSet;
use std::process::{Command, Stdio};

use super::LABEL_ENV_PROJECT;

/// One environment image of a project, as the engine lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvImage {
    /// `rover-env:<hash>`.
    pub image: String,
    /// The engine's creation time, as it prints it (sortable: `2026-11-25 17:43:05 +0000 UTC`).
    pub created: String,
}

/// The project's environment images, newest first (`docker images`; blocking).
pub fn list(project: &str) -> Result<Vec<EnvImage>, String> {
    let out = Command::new("docker")
        .args([
            "images",
            "--filter",
            &format!("label={LABEL_ENV_PROJECT}={project}"),
            "--format",
            "{{.Repository}}:{{.Tag}}\t{{.CreatedAt}}",
        ])
        .stdin(Stdio::null())
        .output();
    let out = match out {
        // No Docker on this machine: no images to collect.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        other => other.map_err(|e| format!("cannot run `docker images`: {e}"))?,
    };
    if !out.status.success() {
        return Err(format!(
            "`docker images` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let mut images: Vec<EnvImage> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| line.split_once('\t'))
        .map(|(image, created)| EnvImage {
            image: image.to_owned(),
            created: created.to_owned(),
        })
        .collect();
    images.sort_by(|a, b| b.created.cmp(&a.created));
    Ok(images)
}

/// Which of `images` (newest first) go: all but the newest and those in `keep`.
pub fn unused(images: &[EnvImage], keep: &BTreeSet<String>) -> Vec<String> {
    images
        .iter()
        .skip(1)
        .filter(|i| !keep.contains(&i.image))
        .map(|i| i.image.clone())
        .collect()
}

/// Removes `image` (`docker image rm`; blocking).
pub fn remove(image: &str) -> Result<(), String> {
    let out = Command::new("docker")
        .args(["image", "rm", image])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run `docker image rm`: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`docker image rm {image}` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// What `gc` did with the project's environment images.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Sweep {
    /// Removed (or, on a dry run, that would be).
    pub removed: Vec<String>,
    pub kept: Vec<String>,
    /// Why an image could not be listed or removed (a missing engine is not an error).
    pub errors: Vec<String>,
}

/// Removes the project's environment images but the newest and those the traces in `live`
/// (traces still holding their tasks) ran in, as `image_of` reads a span's image; on `dry_run`,
/// only says which (blocking).
pub fn sweep(
    store: &crate::store::AutopilotStore,
    project: &str,
    live: &[uuid::Uuid],
    image_of: impl Fn(&crate::store::Span) -> Option<String>,
    dry_run: bool,
) -> Sweep {
    let mut sweep = Sweep::default();
    let images = match list(project) {
        Ok(images) => images,
        Err(e) => {
            sweep.errors.push(e);
            return sweep;
        }
    };
    let keep: BTreeSet<String> = live
        .iter()
        .filter_map(|t| store.load_trace(*t).ok())
        .flat_map(|view| view.spans.iter().filter_map(&image_of).collect::<Vec<_>>())
        .collect();
    let gone = unused(&images, &keep);
    sweep.kept = images
        .iter()
        .map(|i| i.image.clone())
        .filter(|i| !gone.contains(i))
        .collect();
    for image in gone {
        if dry_run {
            sweep.removed.push(image);
            continue;
        }
        match remove(&image) {
            Ok(()) => sweep.removed.push(image),
            Err(e) => sweep.errors.push(e),
        }
    }
    sweep
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_newest_and_those_in_use() {
        let image = |name: &str, created: &str| EnvImage {
            image: name.into(),
            created: created.into(),
        };
        let images = [
            image("rover-env:c", "2026-11-25 12:00:00"),
            image("rover-env:b", "2026-11-24 12:00:00"),
            image("rover-env:a", "2026-11-23 12:00:00"),
        ];
        let keep = BTreeSet::from(["rover-env:b".to_owned()]);
        assert_eq!(unused(&images, &keep), ["rover-env:a"]);
        assert!(unused(&images[..1], &BTreeSet::new()).is_empty());
    }
}
