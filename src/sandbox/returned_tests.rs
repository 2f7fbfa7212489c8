//! Hostile archives: each refused with the entry named, the worktree unchanged, nothing
//! written outside it.

use std::ffi::OsStr;
use std::os::unix::fs::MetadataExt as _;

use super::*;

/// One raw entry: its name written as given (no checks), its type, data and link.
struct Raw<'a> {
    name: &'a [u8],
    kind: tar::EntryType,
    data: &'a [u8],
    link: &'a [u8],
    size: Option<u64>,
    mode: u32,
}

fn raw(name: &'static str, kind: tar::EntryType) -> Raw<'static> {
    Raw {
        name: name.as_bytes(),
        kind,
        data: b"",
        link: b"",
        size: None,
        mode: if kind.is_dir() { 0o755 } else { 0o644 },
    }
}

fn file(name: &'static str, data: &'static str) -> Raw<'static> {
    Raw {
        data: data.as_bytes(),
        ..raw(name, tar::EntryType::Regular)
    }
}

fn link(name: &'static str, kind: tar::EntryType, to: &'static str) -> Raw<'static> {
    Raw {
        link: to.as_bytes(),
        ..raw(name, kind)
    }
}

/// A GNU long name (`L`) or long link (`K`) entry, which a reader takes for the next header's.
fn long(builder: &mut tar::Builder<Vec<u8>>, kind: tar::EntryType, value: &[u8]) {
    let mut h = tar::Header::new_gnu();
    h.as_gnu_mut().expect("gnu").name[..13].copy_from_slice(b"././@LongLink");
    h.set_entry_type(kind);
    h.set_size(value.len() as u64 + 1);
    h.set_cksum();
    builder
        .append(&h, [value, b"\0"].concat().as_slice())
        .expect("append");
}

fn tar_of(entries: &[Raw<'_>]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_gnu();
        let field = h.as_gnu_mut().expect("gnu").name.len();
        if e.name.len() > field {
            long(&mut builder, T::GNULongName, e.name);
        }
        if e.link.len() > field {
            long(&mut builder, T::GNULongLink, e.link);
        }
        let cut = e.name.len().min(field);
        h.as_gnu_mut().expect("gnu").name[..cut].copy_from_slice(&e.name[..cut]);
        h.set_entry_type(e.kind);
        h.set_mode(e.mode);
        h.set_size(e.size.unwrap_or(e.data.len() as u64));
        if e.kind == tar::EntryType::GNUSparse {
            // A 4 GiB file of holes and one byte at its end.
            let gnu = h.as_gnu_mut().expect("gnu");
            gnu.set_real_size(4 << 30);
            gnu.sparse[0].set_offset((4 << 30) - 1);
            gnu.sparse[0].set_length(1);
        }
        if !e.link.is_empty() {
            let cut = e.link.len().min(field);
            h.as_gnu_mut().expect("gnu").linkname[..cut].copy_from_slice(&e.link[..cut]);
        }
        h.set_cksum();
        builder.append(&h, e.data).expect("append");
    }
    builder.into_inner().expect("finish")
}

struct Fixture {
    dir: tempfile::TempDir,
    worktree: PathBuf,
}

const GITFILE: &str = "gitdir: /rover-git\n";

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let worktree = dir.path().join("tasks").join("wt");
        std::fs::create_dir_all(worktree.join("src")).expect("mkdir");
        std::fs::write(worktree.join("src/keep.rs"), "old\n").expect("write");
        std::fs::write(worktree.join(".git"), "gitdir: /host/.git/worktrees/wt\n").expect("write");
        Self { dir, worktree }
    }

    fn rules() -> Rules {
        Rules {
            file_bytes: 1024,
            max_entries: 50,
            gitfile: Some(GITFILE.as_bytes().to_vec()),
        }
    }

    fn apply(&self, entries: &[Raw<'_>]) -> Result<Applied, SandboxError> {
        self.apply_with(entries, &Self::rules())
    }

    fn apply_with(&self, entries: &[Raw<'_>], rules: &Rules) -> Result<Applied, SandboxError> {
        let archive = self.dir.path().join("returned.tar");
        std::fs::write(&archive, tar_of(entries)).expect("write tar");
        apply(&archive, &self.worktree, rules)
    }

    /// Every path under the temp dir but the archive, sorted.
    fn listing(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut stack = vec![self.dir.path().to_path_buf()];
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(&dir).expect("read dir").flatten() {
                let p = e.path();
                let rel = p
                    .strip_prefix(self.dir.path())
                    .expect("inside")
                    .display()
                    .to_string();
                if rel != "returned.tar" {
                    out.push(rel);
                }
                if e.file_type().expect("type").is_dir() {
                    stack.push(p);
                }
            }
        }
        out.sort();
        out
    }

    /// Asserts the archive is refused naming `entry`, and nothing changed anywhere.
    fn refused(&self, entries: &[Raw<'_>], entry: &str, why: &str) {
        let before = self.listing();
        let err = self
            .apply(entries)
            .expect_err("a hostile archive is refused");
        let text = err.to_string();
        assert!(
            matches!(&err, SandboxError::Returned { entry: e, .. } if e == entry),
            "{text}"
        );
        assert!(text.contains(why), "{text}");
        assert!(text.contains("nothing of it was applied"), "{text}");
        assert_eq!(self.listing(), before, "nothing written or removed");
        assert_eq!(
            std::fs::read_to_string(self.worktree.join("src/keep.rs")).expect("kept"),
            "old\n"
        );
    }
}

use tar::EntryType as T;

#[test]
fn a_clean_archive_replaces_the_worktree_and_keeps_rovers_git_file() {
    let fx = Fixture::new();
    let applied = fx
        .apply(&[
            raw("workspace/", T::Directory),
            file("workspace/.git", GITFILE),
            raw("workspace/src/", T::Directory),
            file("workspace/src/new.rs", "fn new() {}\n"),
            link("workspace/src/alias.rs", T::Symlink, "new.rs"),
            link("workspace/up", T::Symlink, "src/../src/new.rs"),
            link("workspace/copy.rs", T::Link, "workspace/src/new.rs"),
        ])
        .expect("applied");
    assert_eq!(applied.entries, 5);
    let wt = &fx.worktree;
    assert!(
        !wt.join("src/keep.rs").exists(),
        "a file the agent removed is gone"
    );
    assert_eq!(
        std::fs::read_to_string(wt.join("src/new.rs")).expect("new"),
        "fn new() {}\n"
    );
    assert_eq!(
        std::fs::read_link(wt.join("src/alias.rs")).expect("a link stays a link"),
        Path::new("new.rs")
    );
    assert_eq!(
        std::fs::read_to_string(wt.join("copy.rs")).expect("copy"),
        "fn new() {}\n"
    );
    assert_eq!(
        std::fs::read_to_string(wt.join(".git")).expect("rover's git file"),
        "gitdir: /host/.git/worktrees/wt\n"
    );
    assert_eq!(
        fx.listing(),
        [
            "tasks",
            "tasks/wt",
            "tasks/wt/.git",
            "tasks/wt/copy.rs",
            "tasks/wt/src",
            "tasks/wt/src/alias.rs",
            "tasks/wt/src/new.rs",
            "tasks/wt/up"
        ],
        "no staging or old copy left behind"
    );
}

#[test]
fn path_traversal_is_refused() {
    let fx = Fixture::new();
    fx.refused(
        &[file("workspace/../escape", "x")],
        "workspace/../escape",
        "climbs out",
    );
    fx.refused(&[file("/etc/evil", "x")], "/etc/evil", "absolute");
    fx.refused(
        &[file("elsewhere/f", "x")],
        "elsewhere/f",
        "not under workspace/",
    );
}

#[test]
fn links_stay_links_and_nothing_is_written_through_one() {
    let fx = Fixture::new();
    fx.refused(
        &[
            link("workspace/inner", T::Symlink, "src"),
            file("workspace/inner/f", "x"),
        ],
        "workspace/inner/f",
        "passes through the link `inner`",
    );
    fx.refused(
        &[
            link("workspace/etc", T::Symlink, "/etc"),
            file("workspace/etc/cron.d/evil", "x"),
        ],
        "workspace/etc/cron.d/evil",
        "passes through the link `etc`",
    );
    fx.refused(
        &[link("workspace/pw", T::Link, "/etc/passwd")],
        "workspace/pw",
        "hard link to `/etc/passwd`",
    );
    fx.refused(
        &[link("workspace/pw", T::Link, "workspace/../../etc/passwd")],
        "workspace/pw",
        "not a file of the workspace",
    );
    // A link pointing out is a link, as on a mount: created, never followed.
    fx.apply(&[link("workspace/passwd", T::Symlink, "/etc/passwd")])
        .expect("a link is data");
    assert_eq!(
        std::fs::read_link(fx.worktree.join("passwd")).expect("a link"),
        Path::new("/etc/passwd")
    );
}

#[test]
fn devices_fifos_and_sparse_files_are_refused() {
    let fx = Fixture::new();
    fx.refused(
        &[raw("workspace/null", T::Char)],
        "workspace/null",
        "device file",
    );
    fx.refused(
        &[raw("workspace/sda", T::Block)],
        "workspace/sda",
        "device file",
    );
    fx.refused(&[raw("workspace/pipe", T::Fifo)], "workspace/pipe", "fifo");
    fx.refused(
        &[Raw {
            data: b"x",
            ..raw("workspace/holes", T::GNUSparse)
        }],
        "workspace/holes",
        "sparse file",
    );
}

#[test]
fn huge_files_and_tar_bombs_are_refused() {
    let fx = Fixture::new();
    let big = "x".repeat(2048);
    let big: &'static str = Box::leak(big.into_boxed_str());
    fx.refused(
        &[file("workspace/big.bin", big)],
        "workspace/big.bin",
        "is 2048 bytes, more than the largest file",
    );
    let names: Vec<String> = (0..60).map(|i| format!("workspace/f{i}")).collect();
    let entries: Vec<Raw<'_>> = names
        .iter()
        .map(|n| Raw {
            name: n.as_bytes(),
            kind: T::Regular,
            data: b"",
            link: b"",
            size: None,
            mode: 0o644,
        })
        .collect();
    fx.refused(&entries, "workspace/f50", "tar bomb");
}

#[test]
fn git_metadata_is_never_taken() {
    let fx = Fixture::new();
    fx.refused(
        &[file("workspace/.git", "gitdir: /elsewhere\n")],
        "workspace/.git",
        "git metadata",
    );
    fx.refused(
        &[raw("workspace/.git/", T::Directory)],
        "workspace/.git/",
        "git metadata",
    );
    fx.refused(
        &[file("workspace/.git/hooks/post-checkout", "#!/bin/sh\n")],
        "workspace/.git/hooks/post-checkout",
        "git metadata",
    );
    fx.refused(
        &[link("workspace/.git", T::Symlink, "src")],
        "workspace/.git",
        "git metadata",
    );
    fx.refused(
        &[file("workspace/.GIT", "gitdir: /x\n")],
        "workspace/.GIT",
        "git metadata",
    );
    // A repository nested deeper comes back as files (the commit step leaves it out).
    fx.apply(&[file("workspace/vendor/.git/config", "[core]\n")])
        .expect("a nested repository is files");
    // Without a git file shipped, no `.git` may come back at all.
    let rules = Rules {
        gitfile: None,
        ..Fixture::rules()
    };
    let err = fx
        .apply_with(&[file("workspace/.git", GITFILE)], &rules)
        .expect_err("refused");
    assert!(err.to_string().contains("workspace/.git"), "{err}");
}

#[test]
fn a_crash_between_the_renames_is_recovered() {
    let fx = Fixture::new();
    let old = sibling(&fx.worktree, "rover-old");
    std::fs::rename(&fx.worktree, &old).expect("simulate the crash");
    fx.apply(&[file("workspace/a", "a\n")]).expect("applied");
    assert_eq!(
        std::fs::read_to_string(fx.worktree.join(".git")).expect("git file back"),
        "gitdir: /host/.git/worktrees/wt\n"
    );
    assert!(!old.exists());
}

/// Links made over parents, names given twice, hard links that reach for a host file, and
/// the fd walk (see the module doc of `returned`).
#[path = "returned_links_tests.rs"]
mod links;
