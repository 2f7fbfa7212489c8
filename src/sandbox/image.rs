//! Sandbox images built locally without a registry: a rootfs tar imported with `create_image`.
//!
//! The rootfs holds a static busybox with its applet symlinks, any host binaries asked for plus
//! the shared libraries `ldd` lists for them (so a dynamically linked Rust binary runs inside),
//! and any extra files. The tar is deterministic, so its sha256 names the image: building twice
//! is a no-op.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use bollard::query_parameters::CreateImageOptionsBuilder;
use futures_util::StreamExt;
use sha2::{Digest, Sha256};

use super::docker::DockerSandbox;
use super::error::SandboxError;

/// Debian's `busybox-static` binary.
pub const DEFAULT_BUSYBOX: &str = "/bin/busybox";

#[derive(Debug, Clone)]
enum Entry {
    Dir(u32),
    File { bytes: Vec<u8>, mode: u32 },
    Symlink(String),
}

/// A recipe for a rootfs image.
#[derive(Debug, Clone)]
pub struct RootfsImage {
    repo: String,
    busybox: Option<PathBuf>,
    binaries: Vec<(PathBuf, String)>,
    files: Vec<(String, Vec<u8>, u32)>,
}

impl RootfsImage {
    /// A recipe for image repository `repo` (e.g. `rover-sandbox-test`) with busybox at its default path.
    pub fn new(repo: impl Into<String>) -> Self {
        Self {
            repo: repo.into(),
            busybox: Some(PathBuf::from(DEFAULT_BUSYBOX)),
            binaries: Vec::new(),
            files: Vec::new(),
        }
    }

    /// Uses another static busybox, or none.
    #[must_use]
    pub fn busybox(mut self, path: Option<PathBuf>) -> Self {
        self.busybox = path;
        self
    }

    /// Adds a host executable at `dest` (absolute path inside the image) with its shared libraries.
    #[must_use]
    pub fn binary(mut self, host: impl Into<PathBuf>, dest: impl Into<String>) -> Self {
        self.binaries.push((host.into(), dest.into()));
        self
    }

    /// Adds a file with the given contents and mode at `dest`.
    #[must_use]
    pub fn file(mut self, dest: impl Into<String>, bytes: impl Into<Vec<u8>>, mode: u32) -> Self {
        self.files.push((dest.into(), bytes.into(), mode));
        self
    }

    /// The rootfs as a deterministic tar (runs `busybox --list-full` and `ldd`; blocking).
    pub fn build_tar(&self) -> Result<Vec<u8>, SandboxError> {
        let mut entries: BTreeMap<String, Entry> = BTreeMap::new();
        for dir in [
            "bin",
            "sbin",
            "usr/bin",
            "usr/sbin",
            "etc",
            "workspace",
            "rover",
            "root",
        ] {
            entries.insert(dir.to_string(), Entry::Dir(0o755));
        }
        entries.insert("tmp".to_string(), Entry::Dir(0o1777));
        entries.insert(
            "etc/passwd".to_string(),
            Entry::File {
                bytes: b"root:x:0:0:root:/root:/bin/sh\nrover:x:1000:1000:rover:/tmp:/bin/sh\n"
                    .to_vec(),
                mode: 0o644,
            },
        );
        entries.insert(
            "etc/group".to_string(),
            Entry::File {
                bytes: b"root:x:0:\nrover:x:1000:\n".to_vec(),
                mode: 0o644,
            },
        );
        let mut libs = BTreeSet::new();
        if let Some(busybox) = &self.busybox {
            entries.insert("bin/busybox".to_string(), read_file(busybox, 0o755)?);
            // busybox-static needs nothing; a dynamic busybox brings its libraries along.
            libs.extend(shared_libraries(busybox, &self.repo)?);
            for applet in busybox_applets(busybox, &self.repo)? {
                if applet != "bin/busybox" {
                    entries.insert(applet, Entry::Symlink("/bin/busybox".to_string()));
                }
            }
        }
        for (host, dest) in &self.binaries {
            entries.insert(rel(dest), read_file(host, 0o755)?);
            libs.extend(shared_libraries(host, &self.repo)?);
        }
        for lib in &libs {
            entries.insert(rel(&lib.display().to_string()), read_file(lib, 0o755)?);
        }
        for (dest, bytes, mode) in &self.files {
            entries.insert(
                rel(dest),
                Entry::File {
                    bytes: bytes.clone(),
                    mode: *mode,
                },
            );
        }
        // Every parent directory exists as a directory entry.
        let parents: Vec<String> = entries
            .keys()
            .flat_map(|path| {
                Path::new(path)
                    .ancestors()
                    .skip(1)
                    .filter(|p| !p.as_os_str().is_empty())
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
            })
            .collect();
        for parent in parents {
            entries.entry(parent).or_insert(Entry::Dir(0o755));
        }
        write_tar(&entries).map_err(|e| SandboxError::ImageBuild {
            image: self.repo.clone(),
            reason: format!("writing the rootfs tar: {e}"),
        })
    }

    /// Builds the image unless an image with the same content hash is already present; returns
    /// its reference `<repo>:<hash>`.
    pub async fn ensure(&self, sandbox: &DockerSandbox) -> Result<String, SandboxError> {
        self.import(sandbox, None).await
    }

    /// Like [`RootfsImage::ensure`], with the tag given (a hash of the inputs the caller
    /// computed more cheaply than the tar's).
    pub async fn ensure_tagged(
        &self,
        sandbox: &DockerSandbox,
        tag: &str,
    ) -> Result<String, SandboxError> {
        self.import(sandbox, Some(tag)).await
    }

    async fn import(
        &self,
        sandbox: &DockerSandbox,
        tag: Option<&str>,
    ) -> Result<String, SandboxError> {
        let recipe = self.clone();
        let tar = tokio::task::spawn_blocking(move || recipe.build_tar())
            .await
            .map_err(|e| SandboxError::ImageBuild {
                image: self.repo.clone(),
                reason: format!("the tar builder did not finish: {e}"),
            })??;
        let tag = tag.map_or_else(
            || {
                let digest = Sha256::digest(&tar);
                digest.iter().take(8).fold(String::new(), |mut tag, b| {
                    let _ = write!(tag, "{b:02x}");
                    tag
                })
            },
            str::to_owned,
        );
        let reference = format!("{}:{tag}", self.repo);
        if sandbox.image_exists(&reference).await? {
            return Ok(reference);
        }
        let options = CreateImageOptionsBuilder::default()
            .from_src("-")
            .repo(&self.repo)
            .tag(&tag)
            .changes(vec![
                "WORKDIR /workspace".to_string(),
                "ENV PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin".to_string(),
                "LABEL rover.image=rootfs".to_string(),
                "CMD [\"/bin/sh\"]".to_string(),
            ])
            .build();
        let mut stream = sandbox.client().create_image(
            Some(options),
            Some(bollard::body_full(tar.into())),
            None,
        );
        while let Some(progress) = stream.next().await {
            progress.map_err(|e| sandbox.err("import image", &reference, e))?;
        }
        if !sandbox.image_exists(&reference).await? {
            return Err(SandboxError::ImageBuild {
                image: reference,
                reason: "the engine accepted the import but the image is not there".to_string(),
            });
        }
        Ok(reference)
    }
}

fn rel(dest: &str) -> String {
    dest.trim_start_matches('/').to_string()
}

fn read_file(path: &Path, mode: u32) -> Result<Entry, SandboxError> {
    let bytes = std::fs::read(path).map_err(|source| SandboxError::File {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(Entry::File { bytes, mode })
}

fn busybox_applets(busybox: &Path, image: &str) -> Result<Vec<String>, SandboxError> {
    let out = Command::new(busybox)
        .arg("--list-full")
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|source| SandboxError::File {
            path: busybox.to_path_buf(),
            source,
        })?;
    if !out.status.success() {
        return Err(SandboxError::ImageBuild {
            image: image.to_string(),
            reason: format!(
                "`{} --list-full` failed; install busybox-static",
                busybox.display()
            ),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.contains(".."))
        .map(ToString::to_string)
        .collect())
}

/// The shared libraries `ldd` lists for `binary` (none for a static one).
fn shared_libraries(binary: &Path, image: &str) -> Result<Vec<PathBuf>, SandboxError> {
    let out = Command::new("ldd")
        .arg(binary)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|source| SandboxError::File {
            path: binary.to_path_buf(),
            source,
        })?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        let all = format!("{text}{}", String::from_utf8_lossy(&out.stderr));
        if all.contains("not a dynamic executable") || all.contains("statically linked") {
            return Ok(Vec::new());
        }
        return Err(SandboxError::ImageBuild {
            image: image.to_string(),
            reason: format!("`ldd {}` failed: {}", binary.display(), all.trim()),
        });
    }
    parse_ldd(&text).map_err(|missing| SandboxError::ImageBuild {
        image: image.to_string(),
        reason: format!(
            "{} needs {missing}, which is not installed",
            binary.display()
        ),
    })
}

/// Library paths from `ldd` output; `Err(name)` for a library reported `not found`.
fn parse_ldd(text: &str) -> Result<Vec<PathBuf>, String> {
    let mut libs = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if let Some((name, rest)) = line.split_once("=>") {
            let target = rest.trim();
            if target.starts_with("not found") {
                return Err(name.trim().to_string());
            }
            if let Some(path) = target
                .split_whitespace()
                .next()
                .filter(|p| p.starts_with('/'))
            {
                libs.push(PathBuf::from(path));
            }
        } else if let Some(path) = line
            .split_whitespace()
            .next()
            .filter(|p| p.starts_with('/'))
        {
            libs.push(PathBuf::from(path));
        }
    }
    Ok(libs)
}

fn write_tar(entries: &BTreeMap<String, Entry>) -> std::io::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, entry) in entries {
        let mut header = tar::Header::new_gnu();
        header.set_mtime(0);
        header.set_uid(0);
        header.set_gid(0);
        match entry {
            Entry::Dir(mode) => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_mode(*mode);
                header.set_size(0);
                builder.append_data(&mut header, format!("{path}/"), std::io::empty())?;
            }
            Entry::File { bytes, mode } => {
                header.set_entry_type(tar::EntryType::Regular);
                header.set_mode(*mode);
                header.set_size(bytes.len() as u64);
                builder.append_data(&mut header, path, bytes.as_slice())?;
            }
            Entry::Symlink(target) => {
                header.set_entry_type(tar::EntryType::Symlink);
                header.set_mode(0o777);
                header.set_size(0);
                builder.append_link(&mut header, path, target)?;
            }
        }
    }
    builder.into_inner()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ldd_output() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x1)\n\t/lib64/ld-linux-x86-64.so.2 (0x2)\n";
        assert_eq!(
            parse_ldd(text).expect("parses"),
            [
                PathBuf::from("/lib/x86_64-linux-gnu/libz.so.1"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2")
            ]
        );
        assert_eq!(
            parse_ldd("\tlibfoo.so => not found\n"),
            Err("libfoo.so".to_string())
        );
    }

    #[test]
    fn tar_is_deterministic_and_has_parents() {
        let recipe = RootfsImage::new("t").busybox(None).file(
            "/opt/x/run.sh",
            b"#!/bin/sh\n".to_vec(),
            0o755,
        );
        let a = recipe.build_tar().expect("tar");
        let b = recipe.build_tar().expect("tar again");
        assert_eq!(a, b);
        let mut archive = tar::Archive::new(a.as_slice());
        let names: Vec<String> = archive
            .entries()
            .expect("entries")
            .map(|e| {
                e.expect("entry")
                    .path()
                    .expect("path")
                    .display()
                    .to_string()
            })
            .collect();
        assert!(names.contains(&"opt/".to_string()), "{names:?}");
        assert!(names.contains(&"opt/x/run.sh".to_string()));
        assert!(names.contains(&"tmp/".to_string()));
    }
}
