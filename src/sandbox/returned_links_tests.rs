//! Links made over parents, names given twice, hard links that reach for a host file, and
//! the fd walk: each refused with the entry named and nothing written outside the worktree.

#[allow(clippy::wildcard_imports, reason = "the fixture of the parent module")]
use super::*;

impl Fixture {
    /// A directory beside the worktree standing for the host's `/etc`, with a `hostname`
    /// holding [`HOST_SECRET`]; returns the directory, for a link to point at.
    fn host(&self) -> &'static str {
        let host = self.dir.path().join("host");
        std::fs::create_dir_all(&host).expect("mkdir");
        std::fs::write(host.join("hostname"), HOST_SECRET).expect("write");
        Box::leak(host.display().to_string().into_boxed_str())
    }

    /// Asserts no path under the temp dir is named `name`, and no file but the host's own
    /// holds [`HOST_SECRET`].
    fn nowhere(&self, name: &str) {
        for path in self.listing() {
            assert!(
                Path::new(&path).file_name() != Some(OsStr::new(name)),
                "{path}"
            );
            let full = self.dir.path().join(&path);
            let is_file = std::fs::symlink_metadata(&full).is_ok_and(|m| m.is_file());
            if is_file && path != "host/hostname" {
                let data = std::fs::read(&full).expect("read");
                assert!(
                    !data
                        .windows(HOST_SECRET.len())
                        .any(|w| w == HOST_SECRET.as_bytes()),
                    "{path} holds the host's file"
                );
            }
        }
    }
}

/// What the host's file holds: found anywhere else, it leaked.
const HOST_SECRET: &str = "the host's own hostname\n";

/// The escape this module was rewritten for: a file, its parent then replaced by a link to a
/// host directory (the directory removed and the link made), then a hard link to the file's
/// name, accepted by its name and copied through the replaced parent.
#[test]
fn a_hard_link_through_a_parent_replaced_by_a_link_to_etc_never_copies_a_host_file() {
    let fx = Fixture::new();
    let etc_before = std::fs::read("/etc/hostname").ok();
    fx.refused(
        &[
            file("workspace/d/hostname", "inside"),
            link("workspace/d", T::Symlink, "/etc"),
            link("workspace/leak", T::Link, "workspace/d/hostname"),
        ],
        "workspace/d",
        "names a path an earlier entry of the archive made: an archive names each path once",
    );
    fx.nowhere("leak");
    assert!(std::fs::symlink_metadata(fx.worktree.join("leak")).is_err());
    assert!(std::fs::symlink_metadata(fx.worktree.join("d")).is_err());
    assert_eq!(std::fs::read("/etc/hostname").ok(), etc_before);

    // The same against a host directory the test can see: nothing of it is read or written.
    let host = fx.host();
    fx.refused(
        &[
            file("workspace/d/hostname", "inside"),
            link("workspace/d", T::Symlink, host),
            link("workspace/leak", T::Link, "workspace/d/hostname"),
        ],
        "workspace/d",
        "names a path an earlier entry",
    );
    fx.nowhere("leak");
    assert_eq!(
        std::fs::read_to_string(Path::new(host).join("hostname")).expect("host file"),
        HOST_SECRET
    );
    assert_eq!(
        std::fs::read_dir(host).expect("host dir").count(),
        1,
        "nothing written into the host directory"
    );
}

#[test]
fn a_hard_link_to_a_file_named_before_a_later_link_replaced_its_parent_is_refused() {
    let fx = Fixture::new();
    let host = fx.host();
    // The directory named first, a file in it, the directory replaced by a link, the copy.
    fx.refused(
        &[
            raw("workspace/d/", T::Directory),
            file("workspace/d/hostname", "inside"),
            link("workspace/d", T::Symlink, host),
            link("workspace/leak", T::Link, "workspace/d/hostname"),
        ],
        "workspace/d",
        "names a path an earlier entry",
    );
    // Deeper: the link replaces a grandparent.
    fx.refused(
        &[
            file("workspace/a/b/hostname", "inside"),
            link("workspace/a", T::Symlink, host),
            link("workspace/leak", T::Link, "workspace/a/b/hostname"),
        ],
        "workspace/a",
        "names a path an earlier entry",
    );
    fx.nowhere("leak");
}

#[test]
fn nothing_is_written_under_a_link_made_first() {
    let fx = Fixture::new();
    let host = fx.host();
    fx.refused(
        &[
            link("workspace/d", T::Symlink, host),
            file("workspace/d/hostname", "overwritten"),
        ],
        "workspace/d/hostname",
        "passes through the link `d` an earlier entry made (links are never followed)",
    );
    fx.refused(
        &[
            link("workspace/d", T::Symlink, host),
            raw("workspace/d/sub/", T::Directory),
        ],
        "workspace/d/sub/",
        "passes through the link `d`",
    );
    fx.refused(
        &[
            link("workspace/d", T::Symlink, host),
            link("workspace/d/evil", T::Symlink, "/"),
        ],
        "workspace/d/evil",
        "passes through the link `d`",
    );
    fx.refused(
        &[
            file("workspace/a", "a"),
            link("workspace/d", T::Symlink, host),
            link("workspace/d/new", T::Link, "workspace/a"),
        ],
        "workspace/d/new",
        "passes through the link `d`",
    );
    // Deeper, through a link inside a directory the archive made.
    fx.refused(
        &[
            link("workspace/x/y", T::Symlink, host),
            file("workspace/x/y/z/hostname", "1"),
        ],
        "workspace/x/y/z/hostname",
        "passes through the link `x/y`",
    );
    fx.refused(
        &[file("workspace/f", "1"), file("workspace/f/x", "1")],
        "workspace/f/x",
        "is inside `f`, which is not a directory",
    );
    assert_eq!(
        std::fs::read_to_string(Path::new(host).join("hostname")).expect("host file"),
        HOST_SECRET
    );
    assert_eq!(std::fs::read_dir(host).expect("host dir").count(), 1);
}

#[test]
fn a_link_replacing_a_file_is_refused() {
    let fx = Fixture::new();
    fx.refused(
        &[
            file("workspace/a", "1"),
            link("workspace/a", T::Symlink, "/etc/passwd"),
        ],
        "workspace/a",
        "names a path an earlier entry",
    );
    // And a file replacing a link.
    fx.refused(
        &[
            link("workspace/a", T::Symlink, "/etc/passwd"),
            file("workspace/a", "1"),
        ],
        "workspace/a",
        "names a path an earlier entry",
    );
}

#[test]
fn a_file_named_twice_is_refused() {
    let fx = Fixture::new();
    fx.refused(
        &[file("workspace/a", "1"), file("workspace/a", "2")],
        "workspace/a",
        "names a path an earlier entry",
    );
    // Spelled differently, the same path.
    fx.refused(
        &[
            file("workspace/src/a", "1"),
            file("workspace/./src//a", "2"),
        ],
        "workspace/./src//a",
        "names a path an earlier entry",
    );
    // A file where an earlier entry made a directory as its parent.
    fx.refused(
        &[file("workspace/d/f", "1"), file("workspace/d", "2")],
        "workspace/d",
        "names a path an earlier entry",
    );
    // A directory named twice.
    fx.refused(
        &[
            raw("workspace/d", T::Directory),
            raw("workspace/d", T::Directory),
        ],
        "workspace/d",
        "names a path an earlier entry",
    );
}

#[test]
fn a_directory_entry_then_a_link_of_the_same_name_is_refused() {
    let fx = Fixture::new();
    fx.refused(
        &[
            raw("workspace/d/", T::Directory),
            link("workspace/d", T::Symlink, "/etc"),
        ],
        "workspace/d",
        "names a path an earlier entry",
    );
    // A directory made as a parent, then a link there.
    fx.refused(
        &[
            file("workspace/d/f", "1"),
            link("workspace/d", T::Symlink, "/etc"),
        ],
        "workspace/d",
        "names a path an earlier entry",
    );
}

#[test]
fn a_hard_link_to_a_path_under_a_link_is_refused() {
    let fx = Fixture::new();
    let host = fx.host();
    fx.refused(
        &[
            link("workspace/l", T::Symlink, host),
            link("workspace/h", T::Link, "workspace/l/hostname"),
        ],
        "workspace/h",
        "is a hard link to `workspace/l/hostname`, which is not a file of the workspace",
    );
    fx.refused(
        &[
            link("workspace/l", T::Symlink, "/etc"),
            link("workspace/h", T::Link, "workspace/l/hostname"),
        ],
        "workspace/h",
        "not a file of the workspace",
    );
    fx.nowhere("h");
}

#[test]
fn a_hard_link_to_a_link_is_refused() {
    let fx = Fixture::new();
    let host = fx.host();
    let hostname: &'static str = Box::leak(format!("{host}/hostname").into_boxed_str());
    fx.refused(
        &[
            link("workspace/l", T::Symlink, hostname),
            link("workspace/h", T::Link, "workspace/l"),
        ],
        "workspace/h",
        "is a hard link to `workspace/l`, which is not a file of the workspace",
    );
    fx.nowhere("h");
}

#[test]
fn a_hard_link_to_a_directory_or_to_no_file_is_refused() {
    let fx = Fixture::new();
    fx.refused(
        &[
            raw("workspace/dir", T::Directory),
            link("workspace/h", T::Link, "workspace/dir"),
        ],
        "workspace/h",
        "not a file of the workspace",
    );
    // A directory made as a parent.
    fx.refused(
        &[
            file("workspace/dir/f", "1"),
            link("workspace/h", T::Link, "workspace/dir"),
        ],
        "workspace/h",
        "not a file of the workspace",
    );
    // A name the archive makes later, the link's own name, the workspace's root, the host.
    fx.refused(
        &[
            link("workspace/h", T::Link, "workspace/later"),
            file("workspace/later", "1"),
        ],
        "workspace/h",
        "not a file of the workspace",
    );
    fx.refused(
        &[link("workspace/h", T::Link, "workspace/h")],
        "workspace/h",
        "not a file of the workspace",
    );
    fx.refused(
        &[link("workspace/h", T::Link, "workspace")],
        "workspace/h",
        "not a file of the workspace",
    );
    fx.refused(
        &[link("workspace/h", T::Link, "/etc/hostname")],
        "workspace/h",
        "not a file of the workspace",
    );
}

#[test]
fn a_long_chain_of_nested_directories_still_applies() {
    let fx = Fixture::new();
    let rules = Rules {
        max_entries: 1000,
        ..Fixture::rules()
    };
    // 300 directories made as parents (a GNU long name), then 200 named one by one.
    let implicit = format!("workspace/{}/f.txt", ["d"; 300].join("/"));
    let named: Vec<String> = (1..=200)
        .map(|n| format!("workspace/{}/", ["e"; 200][..n].join("/")))
        .collect();
    let bottom = format!("workspace/{}/g.txt", ["e"; 200].join("/"));
    let copy = format!("workspace/{}/h.txt", ["e"; 200].join("/"));
    let mut entries = vec![Raw {
        data: b"deep",
        ..raw(Box::leak(implicit.clone().into_boxed_str()), T::Regular)
    }];
    entries.extend(
        named
            .iter()
            .map(|n| raw(Box::leak(n.clone().into_boxed_str()), T::Directory)),
    );
    entries.push(Raw {
        data: b"bottom",
        ..raw(Box::leak(bottom.clone().into_boxed_str()), T::Regular)
    });
    entries.push(link(
        Box::leak(copy.clone().into_boxed_str()),
        T::Link,
        Box::leak(implicit.clone().into_boxed_str()),
    ));
    let applied = fx
        .apply_with(&entries, &rules)
        .expect("a deep tree applies");
    assert_eq!(applied.entries, 203);
    assert_eq!(applied.bytes, 4 + 6 + 4);
    let at = |name: &str| fx.worktree.join(&name["workspace/".len()..]);
    assert_eq!(
        std::fs::read_to_string(at(&implicit)).expect("deep"),
        "deep"
    );
    assert_eq!(
        std::fs::read_to_string(at(&bottom)).expect("bottom"),
        "bottom"
    );
    assert_eq!(std::fs::read_to_string(at(&copy)).expect("copy"), "deep");
}

#[test]
fn explicit_directory_entries_after_their_implicit_creation_still_apply() {
    let fx = Fixture::new();
    let applied = fx
        .apply(&[
            file("workspace/src/a.rs", "a"),
            file("workspace/src/sub/b.rs", "b"),
            // The directory entries after the files that made them (tar lists them either way).
            Raw {
                mode: 0o750,
                ..raw("workspace/src/", T::Directory)
            },
            Raw {
                mode: 0o500,
                ..raw("workspace/src/sub", T::Directory)
            },
            link("workspace/src/c.rs", T::Link, "workspace/src/a.rs"),
            link("workspace/src/sub/d.rs", T::Link, "workspace/src/sub/b.rs"),
            Raw {
                data: b"#!/bin/sh\n",
                mode: 0o755,
                ..raw("workspace/src/run.sh", T::Regular)
            },
            link("workspace/src/alias", T::Symlink, "sub/b.rs"),
        ])
        .expect("a clean archive applies");
    assert_eq!(applied.entries, 8);
    let wt = &fx.worktree;
    for (path, data) in [
        ("src/a.rs", "a"),
        ("src/sub/b.rs", "b"),
        ("src/c.rs", "a"),
        ("src/sub/d.rs", "b"),
        ("src/alias", "b"),
    ] {
        assert_eq!(std::fs::read_to_string(wt.join(path)).expect(path), data);
    }
    let mode = |path: &str| std::fs::symlink_metadata(wt.join(path)).expect(path).mode() & 0o7777;
    assert_eq!(
        mode("src"),
        0o750,
        "a named directory's mode, owner rwx kept"
    );
    assert_eq!(mode("src/sub"), 0o700);
    assert_eq!(mode("src/run.sh"), 0o755);
    assert_eq!(mode("src/a.rs"), 0o644);
    assert_eq!(
        std::fs::read_link(wt.join("src/alias")).expect("a link"),
        Path::new("sub/b.rs")
    );
    // The hard links are copies: the worktree holds no second name of one inode.
    assert_ne!(
        std::fs::metadata(wt.join("src/a.rs")).expect("a").ino(),
        std::fs::metadata(wt.join("src/c.rs")).expect("c").ino()
    );
}

/// The second wall: what the disk holds that the archive did not make (a link where a
/// directory or a new name should be) stops the walk, whatever the map says.
#[test]
fn the_fd_walk_never_follows_a_link_on_the_disk() {
    let dir = tempfile::tempdir().expect("tempdir");
    let outside = dir.path().join("outside");
    std::fs::create_dir(&outside).expect("mkdir");
    std::fs::write(outside.join("secret"), HOST_SECRET).expect("write");
    let staging = dir.path().join("staging");
    std::fs::create_dir_all(staging.join("sub")).expect("mkdir");
    std::os::unix::fs::symlink(&outside, staging.join("d")).expect("link");
    std::os::unix::fs::symlink(outside.join("secret"), staging.join("sub/x")).expect("link");
    let meta = std::fs::metadata(&staging).expect("meta");
    let mut tree = Tree::open(&staging, (meta.uid(), meta.gid())).expect("open");
    let part = |p: &str| {
        p.split('/')
            .map(|c| c.as_bytes().to_vec())
            .collect::<Vec<_>>()
    };
    let stopped = |e: SandboxError| {
        let text = e.to_string();
        assert!(
            matches!(&e, SandboxError::Returned { entry, .. } if entry == "workspace/e"),
            "{text}"
        );
        assert!(text.contains("nothing is followed or replaced"), "{text}");
    };

    // `d` as a directory the archive made: opened with O_NOFOLLOW, a link is not one.
    stopped(
        tree.dir(&part("d/new"), 1, "workspace/e")
            .map(|_| ())
            .expect_err("ELOOP"),
    );
    stopped(
        tree.create(&part("d/f"), 1, "workspace/e")
            .map(|_| ())
            .expect_err("ELOOP"),
    );
    // `d` as a name the archive makes now: already there, never replaced nor followed.
    stopped(
        tree.dir(&part("d"), 0, "workspace/e")
            .map(|_| ())
            .expect_err("EEXIST"),
    );
    stopped(
        tree.create(&part("d"), 0, "workspace/e")
            .map(|_| ())
            .expect_err("EEXIST"),
    );
    stopped(
        tree.symlink(&part("d"), 0, b"/", "workspace/e")
            .expect_err("EEXIST"),
    );
    // A hard link's source that is a link on the disk, at its name or on its way.
    stopped(
        tree.source(&part("sub/x"), "workspace/e")
            .map(|_| ())
            .expect_err("ELOOP"),
    );
    stopped(
        tree.source(&part("d/secret"), "workspace/e")
            .map(|_| ())
            .expect_err("ELOOP"),
    );
    // The cursor, once in `sub`, does not lead anywhere else either.
    tree.dir(&part("sub"), 1, "workspace/e")
        .expect("a real directory");
    stopped(
        tree.create(&part("sub/x"), 1, "workspace/e")
            .map(|_| ())
            .expect_err("EEXIST"),
    );

    let names: Vec<_> = std::fs::read_dir(&outside)
        .expect("outside")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(names, ["secret"], "nothing written outside");
    assert_eq!(
        std::fs::read_to_string(outside.join("secret")).expect("secret"),
        HOST_SECRET
    );
}
