//! Tests of the secret scan of what a push would send.

use super::*;

const HELD: &str = "held-secret-value-0123";
const TOKEN: &str = "ghp_abcdefghijklmnopqrstuvwxyz0123456789";

/// A repository whose remote (`origin`) has `base`; branches are built commit by commit.
struct Repo {
    dir: tempfile::TempDir,
    repo: Repository,
}

impl Repo {
    fn new() -> Repo {
        let dir = tempfile::tempdir().expect("temp dir");
        let repo = Repository::init(dir.path()).expect("init");
        Repo { dir, repo }
    }

    /// A commit whose tree is `files` (flat), on `parent`.
    fn commit(&self, parent: Option<Oid>, files: &[(&str, &[u8])], message: &str) -> Oid {
        let mut tree = self.repo.treebuilder(None).expect("tree builder");
        for (path, content) in files {
            let blob = self.repo.blob(content).expect("blob");
            tree.insert(path, blob, 0o100_644).expect("insert");
        }
        let tree = self
            .repo
            .find_tree(tree.write().expect("tree"))
            .expect("find tree");
        let sig = git2::Signature::now("t", "t@example.com").expect("signature");
        let parents: Vec<git2::Commit<'_>> = parent
            .map(|p| self.repo.find_commit(p).expect("parent"))
            .into_iter()
            .collect();
        let parents: Vec<&git2::Commit<'_>> = parents.iter().collect();
        self.repo
            .commit(None, &sig, &sig, message, &tree, &parents)
            .expect("commit")
    }

    fn set(&self, reference: &str, oid: Oid) {
        self.repo
            .reference(reference, oid, true, "test")
            .expect("reference");
    }

    fn scan(&self, branch: &str, scan: &SecretScan) -> Result<ScanReport, GitError> {
        scan_branch(&self.repo, self.dir.path(), "origin", branch, scan)
    }
}

fn scan() -> SecretScan {
    SecretScan::new(HeldSecrets::new().with("ANTHROPIC_API_KEY", Some(HELD)))
}

/// A remote `main` with `files`, and `rover/x` one commit `message` later with `then`.
fn pushed(files: &[(&str, &[u8])], then: &[(&str, &[u8])], message: &str) -> (Repo, Oid) {
    let r = Repo::new();
    let base = r.commit(None, files, "base");
    r.set("refs/remotes/origin/main", base);
    let tip = r.commit(Some(base), then, message);
    r.set("refs/heads/rover/x", tip);
    (r, tip)
}

fn held(name: &str) -> SecretWhat {
    SecretWhat::Held {
        name: name.to_owned(),
    }
}

#[test]
fn a_held_value_in_a_file_is_found_with_its_file_and_line() {
    let (r, tip) = pushed(
        &[("README.md", b"# x\n")],
        &[
            ("README.md", b"# x\n"),
            ("settings.env", format!("A=1\nKEY={HELD}\n").as_bytes()),
        ],
        "Add settings",
    );
    let report = r.scan("rover/x", &scan()).expect("scanned");
    assert_eq!(report.commits, 1);
    assert_eq!(
        report.findings,
        [SecretFinding {
            commit: Some(tip.to_string()),
            place: SecretPlace::Content,
            path: Some("settings.env".into()),
            line: Some(2),
            what: held("ANTHROPIC_API_KEY"),
            hint: None,
        }]
    );
    let text = report.findings[0].to_string();
    assert_eq!(
        text,
        format!(
            "the value of ANTHROPIC_API_KEY in `settings.env` line 2 of commit {}",
            &tip.to_string()[..7]
        )
    );
    assert!(!text.contains(HELD));
}

#[test]
fn a_held_value_in_a_path_or_a_message_is_found_and_the_path_is_masked() {
    let name = format!("{HELD}.txt");
    let (r, _) = pushed(
        &[],
        &[(name.as_str(), b"nothing\n")],
        &format!("Add it\n\nthe key is {HELD}"),
    );
    let report = r.scan("rover/x", &scan()).expect("scanned");
    let places: Vec<(SecretPlace, Option<&str>, Option<u32>)> = report
        .findings
        .iter()
        .map(|f| (f.place, f.path.as_deref(), f.line))
        .collect();
    assert_eq!(
        places,
        [
            (SecretPlace::Message, None, Some(3)),
            (SecretPlace::Path, Some("[redacted secret].txt"), None),
        ]
    );
    let json = serde_json::to_string(&report.findings).expect("json");
    assert!(!json.contains(HELD), "{json}");
}

#[test]
fn a_held_value_a_later_commit_removes_is_still_found() {
    let r = Repo::new();
    let base = r.commit(None, &[("a.txt", b"a\n")], "base");
    r.set("refs/remotes/origin/main", base);
    let leak = r.commit(
        Some(base),
        &[("a.txt", format!("a\n{HELD}\n").as_bytes())],
        "Leak",
    );
    let fix = r.commit(Some(leak), &[("a.txt", b"a\n")], "Remove it again");
    r.set("refs/heads/rover/x", fix);
    let report = r.scan("rover/x", &scan()).expect("scanned");
    assert_eq!(report.commits, 2);
    assert_eq!(report.findings.len(), 1, "{:?}", report.findings);
    assert_eq!(report.findings[0].commit, Some(leak.to_string()));
    assert_eq!(report.findings[0].line, Some(2));
}

#[test]
fn a_held_value_in_a_binary_file_is_found_in_its_bytes() {
    let mut bytes = vec![0u8, 1, 2, 255];
    bytes.extend_from_slice(HELD.as_bytes());
    bytes.push(0);
    let (r, _) = pushed(&[], &[("blob.bin", &bytes)], "Add a binary");
    let report = r.scan("rover/x", &scan()).expect("scanned");
    assert_eq!(report.findings.len(), 1);
    let f = &report.findings[0];
    assert_eq!(
        (f.place, f.path.as_deref(), f.line),
        (SecretPlace::Content, Some("blob.bin"), None)
    );
    // A `.gitattributes` saying the file is binary does not hide a text file's lines.
    let (r, _) = pushed(
        &[],
        &[
            (".gitattributes", b"* binary\n"),
            ("t.txt", TOKEN.as_bytes()),
        ],
        "Hide it",
    );
    let report = r.scan("rover/x", &scan()).expect("scanned");
    assert_eq!(report.findings.len(), 1, "{:?}", report.findings);
    assert_eq!(report.findings[0].path.as_deref(), Some("t.txt"));
}

#[test]
fn key_shapes_count_only_where_added_and_allowed_fakes_not_at_all() {
    let fixture = format!("fixture = \"{TOKEN}\"\n");
    let (r, tip) = pushed(
        &[("fixture.py", fixture.as_bytes())],
        &[
            // The remote's fixture, one line added above it.
            ("fixture.py", format!("# tests\n{fixture}").as_bytes()),
            (
                "new.txt",
                b"aws = AKIAIOSFODNN7EXAMPLE\nkey: sk-ant-api03-AbCdEfGhIjKlMnOp\n",
            ),
        ],
        "Add keys",
    );
    let report = r.scan("rover/x", &scan()).expect("scanned");
    let shape = |line: u32, shape: KeyShape, hint: &str| SecretFinding {
        commit: Some(tip.to_string()),
        place: SecretPlace::Content,
        path: Some("new.txt".into()),
        line: Some(line),
        what: SecretWhat::Shape { shape },
        hint: Some(hint.into()),
    };
    assert_eq!(
        report.findings,
        [
            shape(1, KeyShape::AwsAccessKey, "…MPLE"),
            shape(2, KeyShape::AnthropicKey, "…MnOp"),
        ]
    );
    assert_eq!(report.findings[0].commit, Some(tip.to_string()));
    // Allowed as known fakes: nothing.
    let allowed = scan().allowing([
        "AKIAIOSFODNN7EXAMPLE".to_owned(),
        "sk-ant-api03-AbCdEfGhIjKlMnOp".to_owned(),
    ]);
    let report = r.scan("rover/x", &allowed).expect("scanned");
    assert!(report.findings.is_empty(), "{:?}", report.findings);
}

#[test]
fn a_held_value_shaped_like_a_key_is_one_finding_and_never_allowed() {
    let token = SecretScan::new(HeldSecrets::new().with("GITHUB_TOKEN", Some(TOKEN)))
        .allowing([TOKEN.to_owned()]);
    let (r, _) = pushed(&[], &[("t.txt", format!("{TOKEN}\n").as_bytes())], "x");
    let report = r.scan("rover/x", &token).expect("scanned");
    assert_eq!(report.findings.len(), 1, "{:?}", report.findings);
    assert_eq!(report.findings[0].what, held("GITHUB_TOKEN"));
}

#[test]
fn a_push_beyond_the_limits_is_refused_and_findings_beyond_them_counted() {
    let (r, _) = pushed(
        &[],
        &[(
            "a.txt",
            format!("{TOKEN}\n{TOKEN} \n sk-proj-AbCdEfGhIjKlMnOpQrSt\n").as_bytes(),
        )],
        "x",
    );
    let few = scan().with_limits(ScanLimits {
        max_findings: 1,
        ..ScanLimits::default()
    });
    let report = r.scan("rover/x", &few).expect("scanned");
    assert_eq!((report.findings.len(), report.more), (1, 2));
    let tiny = scan().with_limits(ScanLimits {
        max_commits: 0,
        ..ScanLimits::default()
    });
    let err = r.scan("rover/x", &tiny).expect_err("too many commits");
    assert!(matches!(err, GitError::ScanTooLarge { .. }), "{err}");
    let small = scan().with_limits(ScanLimits {
        max_total_bytes: 4,
        ..ScanLimits::default()
    });
    let err = r.scan("rover/x", &small).expect_err("too many bytes");
    assert!(err.to_string().contains("nothing was pushed"), "{err}");
}

#[test]
fn nothing_outgoing_is_nothing_found() {
    let (r, tip) = pushed(&[], &[("a.txt", HELD.as_bytes())], "x");
    r.set("refs/remotes/origin/rover/x", tip);
    let report = r.scan("rover/x", &scan()).expect("scanned");
    assert_eq!(report, ScanReport::default());
}
