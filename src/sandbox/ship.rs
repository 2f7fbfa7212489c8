//! Shipping a spec's host paths into a container as tar archives, for a backend that copies
//! the workspace in instead of mounting it ([`super::WorkspaceMode::Shipped`]).
//!
//! Every host path of a spec becomes a [`Shipment`]: the worktree (at `/workspace`, its `.git`
//! left out, rover's git file put there when a mount names one), the input dir and each extra
//! mount. An archive is made as it is sent ([`stream`]): links stay links (never followed),
//! fifos, sockets and devices are left out, and every entry is owned by the user the container
//! runs as (a read-only one by root, without write bits, so that user cannot change it). Its
//! first entry is the root directory named `/`, which the Docker engine applies to the
//! directory it extracts into (it skips one named `.`), so the user owns the volume's root.

use std::io::{self, Read as _, Write};
use std::os::unix::fs::MetadataExt as _;
use std::path::PathBuf;

use super::spec::{SandboxSpec, INPUT_MOUNT, WORKSPACE_MOUNT};

/// One host path copied into a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shipment {
    /// Absolute path in the container (a directory the backend makes writable, e.g. a volume).
    pub target: String,
    /// The host directory (or file) whose content goes there.
    pub source: PathBuf,
    /// A read-only mount: owned by root, no write bits.
    pub read_only: bool,
    /// The worktree: its `.git` is left out (`gitfile` goes there instead, when set).
    pub worktree: bool,
    /// A host file put at `.git` (read-only) in place of the worktree's own.
    pub gitfile: Option<PathBuf>,
}

/// What to ship for `spec`: the worktree first, then the input dir and the extra mounts (a
/// mount over `/workspace/.git` becomes the worktree's `gitfile`).
pub fn shipments(spec: &SandboxSpec) -> Vec<Shipment> {
    let gitfile_target = format!("{WORKSPACE_MOUNT}/.git");
    let gitfile = spec
        .extra_mounts
        .iter()
        .find(|m| m.target == gitfile_target)
        .map(|m| m.host.clone());
    let mut list = vec![Shipment {
        target: WORKSPACE_MOUNT.to_owned(),
        source: spec.worktree.clone(),
        read_only: false,
        worktree: true,
        gitfile,
    }];
    if let Some(input) = &spec.input_dir {
        list.push(Shipment {
            target: INPUT_MOUNT.to_owned(),
            source: input.clone(),
            read_only: true,
            worktree: false,
            gitfile: None,
        });
    }
    for mount in spec
        .extra_mounts
        .iter()
        .filter(|m| m.target != gitfile_target)
    {
        list.push(Shipment {
            target: mount.target.clone(),
            source: mount.host.clone(),
            read_only: mount.read_only,
            worktree: false,
            gitfile: None,
        });
    }
    list
}

/// Who owns the shipped entries in the container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
}

/// Counts of one shipped archive.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Shipped {
    pub entries: u64,
    /// File bytes (not counting headers).
    pub bytes: u64,
}

/// Writes the archive of `shipment` to `out` (blocking: walks the host directory).
pub fn write_archive(shipment: &Shipment, owner: Owner, out: impl Write) -> io::Result<Shipped> {
    let mut builder = tar::Builder::new(out);
    builder.mode(tar::HeaderMode::Deterministic);
    let shipped = append(&mut builder, shipment, owner, None)?;
    builder.into_inner()?.flush()?;
    Ok(shipped)
}

/// Writes every one of `shipments` into one archive, each under its target without the
/// leading `/` (`workspace/...`, `rover-git/...`), for a task that extracts it at `/` itself
/// into directories it can write (the swarm backend's shipped workspace: see
/// [`super::swarm`]). No entry names a target itself, so the task keeps the directories it
/// was given; and every directory keeps its owner's write bit, since the task, not root,
/// extracts it (a read-only shipment's files keep no write bit; nothing of them comes back).
pub fn write_bundle(shipments: &[Shipment], owner: Owner, out: impl Write) -> io::Result<Shipped> {
    let mut builder = tar::Builder::new(out);
    builder.mode(tar::HeaderMode::Deterministic);
    let mut shipped = Shipped::default();
    for shipment in shipments {
        let prefix = PathBuf::from(shipment.target.trim_start_matches('/'));
        let one = append(&mut builder, shipment, owner, Some(&prefix))
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", shipment.source.display())))?;
        shipped.entries += one.entries;
        shipped.bytes += one.bytes;
    }
    builder.into_inner()?.flush()?;
    Ok(shipped)
}

/// Appends `shipment` to `builder`: with no `prefix`, as the engine's archive API takes it
/// (a root entry named `/`, then paths relative to the target); with one, under it and without
/// a root entry.
fn append<W: Write>(
    builder: &mut tar::Builder<W>,
    shipment: &Shipment,
    owner: Owner,
    prefix: Option<&std::path::Path>,
) -> io::Result<Shipped> {
    let mut shipped = Shipped::default();
    let meta = std::fs::symlink_metadata(&shipment.source)?;
    let (uid, gid) = if shipment.read_only {
        (0, 0)
    } else {
        (owner.uid, owner.gid)
    };
    let mode = |m: u32| {
        let m = m & 0o777;
        if shipment.read_only {
            m & !0o222
        } else {
            m
        }
    };
    // Directories: readable and searchable by their owner; writable too when the task extracts
    // them itself.
    let dir_bits = if prefix.is_some() { 0o700 } else { 0o500 };
    let header = |kind: tar::EntryType, size: u64, perm: u32| {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(size);
        h.set_mode(perm);
        h.set_uid(u64::from(uid));
        h.set_gid(u64::from(gid));
        h.set_mtime(0);
        h
    };
    let named = |rel: &std::path::Path| prefix.map_or_else(|| rel.to_path_buf(), |p| p.join(rel));
    if prefix.is_none() {
        // The root: named `/` so the engine applies its owner and mode (see the module doc).
        let root_mode = if meta.is_dir() {
            mode(meta.mode()) | 0o500
        } else {
            0o755
        };
        let mut h = header(tar::EntryType::Directory, 0, root_mode);
        h.as_old_mut().name[0] = b'/';
        h.set_cksum();
        builder.append(&h, io::empty())?;
        shipped.entries += 1;
    }
    if !meta.is_dir() {
        // A single file: shipped under its own name.
        let name = shipment
            .source
            .file_name()
            .map_or_else(|| PathBuf::from("file"), PathBuf::from);
        let file = std::fs::File::open(&shipment.source)?;
        let mut h = header(tar::EntryType::Regular, meta.len(), mode(meta.mode()));
        builder.append_data(&mut h, named(&name), file)?;
        shipped.entries += 1;
        shipped.bytes += meta.len();
        return Ok(shipped);
    }
    if let Some(gitfile) = shipment.gitfile.as_ref().filter(|_| shipment.worktree) {
        let data = std::fs::read(gitfile)?;
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_size(data.len() as u64);
        h.set_mode(0o444);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        builder.append_data(&mut h, named(std::path::Path::new(".git")), data.as_slice())?;
        shipped.entries += 1;
    }
    let mut stack: Vec<PathBuf> = vec![PathBuf::new()];
    while let Some(relative) = stack.pop() {
        let dir = shipment.source.join(&relative);
        let mut names: Vec<_> = std::fs::read_dir(&dir)?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<io::Result<_>>()?;
        names.sort();
        for name in names {
            if shipment.worktree && relative.as_os_str().is_empty() && name == ".git" {
                continue;
            }
            let rel = relative.join(&name);
            let path = shipment.source.join(&rel);
            let meta = std::fs::symlink_metadata(&path)?;
            let kind = meta.file_type();
            if kind.is_dir() {
                let mut h = header(tar::EntryType::Directory, 0, mode(meta.mode()) | dir_bits);
                builder.append_data(&mut h, named(&rel), io::empty())?;
                stack.push(rel);
            } else if kind.is_symlink() {
                let target = std::fs::read_link(&path)?;
                let mut h = header(tar::EntryType::Symlink, 0, 0o777);
                builder.append_link(&mut h, named(&rel), &target)?;
            } else if kind.is_file() {
                let file = std::fs::File::open(&path)?;
                let mut h = header(tar::EntryType::Regular, meta.len(), mode(meta.mode()));
                builder.append_data(&mut h, named(&rel), file.take(meta.len()))?;
                shipped.bytes += meta.len();
            } else {
                // A fifo, socket or device: nothing a task needs, and nothing to copy.
                continue;
            }
            shipped.entries += 1;
        }
    }
    Ok(shipped)
}

/// A writer that hands what it gets to an async receiver in chunks of about 256 KiB.
struct ChannelWriter {
    tx: tokio::sync::mpsc::Sender<bytes::Bytes>,
    buf: Vec<u8>,
}

const CHUNK: usize = 256 * 1024;

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK {
            self.flush()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = bytes::Bytes::from(std::mem::take(&mut self.buf));
        self.tx
            .blocking_send(chunk)
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the engine stopped reading"))
    }
}

/// The archive of `shipment` as a stream of chunks made as they are read (on a blocking
/// thread), and the handle that says how making it went.
pub fn stream(
    shipment: Shipment,
    owner: Owner,
) -> (
    impl futures_util::Stream<Item = bytes::Bytes> + Send + 'static,
    tokio::task::JoinHandle<io::Result<Shipped>>,
) {
    let (tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(8);
    let handle = tokio::task::spawn_blocking(move || {
        let mut writer = ChannelWriter {
            tx,
            buf: Vec::with_capacity(CHUNK),
        };
        let shipped = write_archive(&shipment, owner, &mut writer)?;
        writer.flush()?;
        Ok(shipped)
    });
    let chunks = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|chunk| (chunk, rx))
    });
    (chunks, handle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_archive_keeps_links_as_links_and_leaves_out_git_and_fifos() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("wt");
        std::fs::create_dir_all(root.join("src")).expect("mkdir");
        std::fs::write(root.join("src/a.rs"), "fn a() {}\n").expect("write");
        std::fs::write(root.join(".git"), "gitdir: /host/secret\n").expect("write");
        std::os::unix::fs::symlink("/etc/passwd", root.join("out")).expect("link");
        nix::unistd::mkfifo(&root.join("fifo"), nix::sys::stat::Mode::S_IRWXU).expect("fifo");
        let gitfile = dir.path().join("gitfile");
        std::fs::write(&gitfile, "gitdir: /rover-git\n").expect("write");
        let shipment = Shipment {
            target: "/workspace".into(),
            source: root,
            read_only: false,
            worktree: true,
            gitfile: Some(gitfile),
        };
        let mut out = Vec::new();
        let shipped =
            write_archive(&shipment, Owner { uid: 77, gid: 78 }, &mut out).expect("archive");
        let mut archive = tar::Archive::new(out.as_slice());
        let mut seen = Vec::new();
        for entry in archive.entries().expect("entries") {
            let mut entry = entry.expect("entry");
            let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
            let header = entry.header().clone();
            let mut text = String::new();
            if header.entry_type().is_file() {
                entry.read_to_string(&mut text).expect("read");
            }
            let link = entry
                .link_name()
                .expect("link")
                .map(|l| l.display().to_string());
            seen.push((name, header.uid().expect("uid"), text, link));
        }
        let names: Vec<&str> = seen.iter().map(|s| s.0.as_str()).collect();
        assert_eq!(names, ["/", ".git", "out", "src", "src/a.rs"]);
        assert_eq!(seen[0].1, 77);
        assert_eq!(seen[1].1, 0, "rover's git file is root's");
        assert_eq!(seen[1].2, "gitdir: /rover-git\n");
        assert_eq!(seen[2].3.as_deref(), Some("/etc/passwd"));
        assert_eq!(seen[4].2, "fn a() {}\n");
        assert_eq!(shipped.entries, 5);
    }

    #[test]
    fn a_bundle_puts_each_shipment_under_its_target_without_naming_the_target_itself() {
        let dir = tempfile::tempdir().expect("tempdir");
        let wt = dir.path().join("wt");
        std::fs::create_dir_all(wt.join("src")).expect("mkdir");
        std::fs::write(wt.join("src/a.rs"), "a").expect("write");
        let objects = dir.path().join("objects");
        std::fs::create_dir_all(objects.join("ab")).expect("mkdir");
        std::fs::write(objects.join("ab/cd"), "blob").expect("write");
        let gitfile = dir.path().join("gitfile");
        std::fs::write(&gitfile, "gitdir: /rover-git\n").expect("write");
        let shipments = [
            Shipment {
                target: "/workspace".into(),
                source: wt,
                read_only: false,
                worktree: true,
                gitfile: Some(gitfile),
            },
            Shipment {
                target: "/rover-git-objects".into(),
                source: objects,
                read_only: true,
                worktree: false,
                gitfile: None,
            },
        ];
        let mut out = Vec::new();
        let shipped = write_bundle(&shipments, Owner { uid: 7, gid: 8 }, &mut out).expect("bundle");
        let mut archive = tar::Archive::new(out.as_slice());
        let seen: Vec<(String, u32)> = archive
            .entries()
            .expect("entries")
            .map(|e| {
                let e = e.expect("entry");
                (
                    String::from_utf8_lossy(&e.path_bytes()).into_owned(),
                    e.header().mode().expect("mode"),
                )
            })
            .collect();
        let names: Vec<&str> = seen.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "workspace/.git",
                "workspace/src",
                "workspace/src/a.rs",
                "rover-git-objects/ab",
                "rover-git-objects/ab/cd"
            ]
        );
        // The task extracts it itself: its directories keep their owner's write bit, a
        // read-only shipment's files none.
        assert_eq!(seen[3].1 & 0o700, 0o700, "{seen:?}");
        assert_eq!(seen[4].1 & 0o222, 0, "{seen:?}");
        assert_eq!(shipped.entries, 5);
        assert_eq!(shipped.bytes, 5);
    }
}
