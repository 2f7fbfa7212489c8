//! What a push would send, read before it is sent: every commit reachable from the branch and
//! from none of the remote's refs (as this repository knows them), each commit's message, the
//! paths it changes and the content it adds over its first parent. A secret rover holds is a
//! hit anywhere (a later commit removing it does not help: history is pushed); a key-shaped
//! string is a hit only in what the commit adds, unless the user allowed it as a known fake.
//! The scan is bounded: more commits or bytes than [`ScanLimits`] allow refuse the push too.

use std::collections::HashSet;
use std::fmt::{self, Write as _};
use std::path::Path;

use git2::{Delta, DiffFindOptions, DiffOptions, Oid, Repository, Sort};
use serde::{Deserialize, Serialize};

use super::error::GitError;
use super::workspace::{blocking, Workspace};
use crate::secrets::{describe_held, hint, HeldSecrets, KeyShape};

/// How much a scan reads at most; a push beyond it is refused (never sent unread).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanLimits {
    /// Commits the push would send.
    pub max_commits: usize,
    /// A file larger than this is searched for exact values only (as bytes, like a binary).
    pub max_text_bytes: usize,
    /// Bytes of file content read in all.
    pub max_total_bytes: u64,
    /// Findings recorded one by one; the rest are counted.
    pub max_findings: usize,
}

impl Default for ScanLimits {
    fn default() -> Self {
        ScanLimits {
            max_commits: 1000,
            max_text_bytes: 4 * 1024 * 1024,
            max_total_bytes: 256 * 1024 * 1024,
            max_findings: 20,
        }
    }
}

/// What a push must not send: the exact values rover holds, key shapes, and the key-shaped
/// strings the user allowed (`autopilot.pipeline.allowedKeyShapes`; never a held value).
#[derive(Debug, Clone, Default)]
pub struct SecretScan {
    held: HeldSecrets,
    allowed: Vec<String>,
    limits: ScanLimits,
}

impl SecretScan {
    pub fn new(held: HeldSecrets) -> SecretScan {
        SecretScan {
            held,
            allowed: Vec::new(),
            limits: ScanLimits::default(),
        }
    }

    /// Key-shaped strings that are known fakes (test fixtures): not a hit. An allowed string
    /// that is also a value rover holds is still a hit.
    #[must_use]
    pub fn allowing(mut self, allowed: impl IntoIterator<Item = String>) -> SecretScan {
        self.allowed.extend(allowed);
        self
    }

    #[must_use]
    pub fn with_limits(mut self, limits: ScanLimits) -> SecretScan {
        self.limits = limits;
        self
    }
}

/// Where in what a push sends a secret was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SecretPlace {
    /// The commit's message.
    Message,
    /// A path the commit adds or changes.
    Path,
    /// The content the commit adds to a file.
    Content,
    /// The name of the branch pushed.
    BranchName,
}

/// What was found: a value rover holds (by the variable it came from) or a key shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum SecretWhat {
    /// The exact value of a secret rover holds; `name` is its variable (empty when unknown).
    Held { name: String },
    /// A string shaped like a key.
    Shape { shape: KeyShape },
}

impl SecretWhat {
    pub fn describe(&self) -> String {
        match self {
            SecretWhat::Held { name } => describe_held(name),
            SecretWhat::Shape { shape } => shape.describe().to_owned(),
        }
    }
}

/// One secret in what a push would send, never with its value: at most a hint (`…wxyz`) at a
/// key-shaped string. Paths and branch names are recorded masked (`[redacted secret]` where a
/// secret or a key shape was).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SecretFinding {
    /// The commit (full sha); none for the branch name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    #[serde(rename = "in")]
    pub place: SecretPlace,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The line, 1-based (of the file as the commit leaves it, or of the message).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
    #[serde(flatten)]
    pub what: SecretWhat,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

impl fmt::Display for SecretFinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.what.describe())?;
        if let Some(hint) = &self.hint {
            write!(f, " ({hint})")?;
        }
        let commit = self
            .commit
            .as_deref()
            .map(|c| &c[..c.len().min(7)])
            .unwrap_or_default();
        let path = self.path.as_deref().unwrap_or_default();
        match (self.place, self.line) {
            (SecretPlace::Content, Some(line)) => {
                write!(f, " in `{path}` line {line} of commit {commit}")
            }
            (SecretPlace::Content, None) => write!(f, " in `{path}` of commit {commit}"),
            (SecretPlace::Path, _) => write!(f, " in the path `{path}` of commit {commit}"),
            (SecretPlace::Message, Some(line)) => {
                write!(f, " in the message of commit {commit} (line {line})")
            }
            (SecretPlace::Message, None) => write!(f, " in the message of commit {commit}"),
            (SecretPlace::BranchName, _) => write!(f, " in the branch name"),
        }
    }
}

/// `a; b; c` and how many more, for an error message.
pub fn describe_findings(findings: &[SecretFinding], more: usize) -> String {
    let mut text = findings
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ");
    if more > 0 {
        let _ = write!(text, "; and {more} more");
    }
    text
}

/// What a scan read and found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScanReport {
    /// Commits the push would send.
    pub commits: usize,
    pub findings: Vec<SecretFinding>,
    /// Findings beyond [`ScanLimits::max_findings`], counted only.
    pub more: usize,
}

impl Workspace {
    /// Scans what pushing `branch` to the workspace's remote would send (see the module).
    pub async fn scan_outgoing(
        &self,
        branch: &str,
        scan: &SecretScan,
    ) -> Result<ScanReport, GitError> {
        let repo_path = self.repo_path().to_path_buf();
        let remote = self.remote().to_owned();
        let branch = branch.to_owned();
        let scan = scan.clone();
        blocking(move || {
            let repo = Repository::open(&repo_path).map_err(GitError::git2("open", &repo_path))?;
            scan_branch(&repo, &repo_path, &remote, &branch, &scan)
        })
        .await?
    }

    /// [`Workspace::scan_outgoing`], a hit or a push too large to scan being an error:
    /// [`GitError::SecretsInPush`], [`GitError::ScanTooLarge`].
    pub(crate) async fn check_outgoing(
        &self,
        branch: &str,
        scan: &SecretScan,
    ) -> Result<ScanReport, GitError> {
        let report = self.scan_outgoing(branch, scan).await?;
        if report.findings.is_empty() {
            return Ok(report);
        }
        Err(GitError::SecretsInPush {
            branch: scan.held.mask(branch),
            findings: report.findings,
            more: report.more,
        })
    }
}

/// A finding's place and kind: commit, place, path, line, what.
type SeenKey = (
    Option<String>,
    SecretPlace,
    Option<String>,
    Option<u32>,
    String,
);

/// The findings so far, bounded.
struct Found<'s> {
    scan: &'s SecretScan,
    /// Every held value, escaped, in one pattern: a binary's bytes are read once.
    held_bytes: Option<regex::bytes::Regex>,
    findings: Vec<SecretFinding>,
    /// Each (commit, place, path, line, what) once.
    seen: HashSet<SeenKey>,
    more: usize,
}

/// Where a piece of text sits, for the findings in it.
#[derive(Clone, Copy)]
struct At<'a> {
    commit: Option<&'a str>,
    place: SecretPlace,
    path: Option<&'a str>,
    line: Option<u32>,
}

impl Found<'_> {
    fn push(&mut self, at: &At<'_>, what: SecretWhat, hint: Option<String>) {
        let path = at.path.map(|p| self.scan.held.mask(p));
        let key = (
            at.commit.map(str::to_owned),
            at.place,
            path.clone(),
            at.line,
            what.describe(),
        );
        if !self.seen.insert(key) {
            return;
        }
        if self.findings.len() >= self.scan.limits.max_findings {
            self.more += 1;
            return;
        }
        self.findings.push(SecretFinding {
            commit: at.commit.map(str::to_owned),
            place: at.place,
            path,
            line: at.line,
            what,
            hint,
        });
    }

    /// Held values anywhere in `text`; key shapes too when `added` (new text).
    fn text(&mut self, at: &At<'_>, text: &str, added: bool) {
        let mut held_here: Vec<&str> = Vec::new();
        for secret in self.scan.held.iter() {
            if text.contains(secret.value()) {
                held_here.push(secret.value());
                self.push(
                    at,
                    SecretWhat::Held {
                        name: secret.name().to_owned(),
                    },
                    None,
                );
            }
        }
        if !added {
            return;
        }
        for (shape, range) in KeyShape::find_all(text) {
            let found = &text[range];
            // Reported once, as the held value it is (or contains, or is part of).
            let held = held_here
                .iter()
                .any(|v| v.contains(found) || found.contains(v));
            if held || self.scan.allowed.iter().any(|a| a == found) {
                continue;
            }
            self.push(at, SecretWhat::Shape { shape }, hint(found));
        }
    }

    /// Held values in raw bytes (a binary or oversized file).
    fn bytes(&mut self, at: &At<'_>, bytes: &[u8]) {
        let Some(pattern) = &self.held_bytes else {
            return;
        };
        let names: Vec<String> = pattern
            .find_iter(bytes)
            .filter_map(|m| {
                self.scan
                    .held
                    .iter()
                    .find(|s| s.value().as_bytes() == m.as_bytes())
                    .map(|s| s.name().to_owned())
            })
            .collect();
        for name in names {
            self.push(at, SecretWhat::Held { name }, None);
        }
    }
}

/// Git's test for a binary blob: a NUL byte in its first 8000 bytes (attributes are not read:
/// a `.gitattributes` in the pushed tree must not hide a file from the scan).
fn is_binary(bytes: &[u8]) -> bool {
    bytes[..bytes.len().min(8000)].contains(&0)
}

fn scan_branch(
    repo: &Repository,
    repo_path: &Path,
    remote: &str,
    branch: &str,
    scan: &SecretScan,
) -> Result<ScanReport, GitError> {
    let walk_err = || GitError::git2("list the commits a push would send", repo_path);
    let tip = repo
        .find_reference(&format!("refs/heads/{branch}"))
        .and_then(|r| r.peel_to_commit())
        .map_err(GitError::git2("read the branch to push", repo_path))?;
    let mut walk = repo.revwalk().map_err(walk_err())?;
    walk.set_sorting(Sort::TOPOLOGICAL | Sort::REVERSE)
        .map_err(walk_err())?;
    walk.push(tip.id()).map_err(walk_err())?;
    let tracking = repo
        .references_glob(&format!("refs/remotes/{remote}/*"))
        .map_err(walk_err())?;
    for reference in tracking.flatten() {
        if let Ok(commit) = reference.peel_to_commit() {
            walk.hide(commit.id()).map_err(walk_err())?;
        }
    }
    let commits: Vec<Oid> = walk.collect::<Result<_, _>>().map_err(walk_err())?;
    if commits.len() > scan.limits.max_commits {
        return Err(GitError::ScanTooLarge {
            branch: scan.held.mask(branch),
            what: format!("{} commits", commits.len()),
            limit: format!("{} commits", scan.limits.max_commits),
        });
    }
    let alternatives: Vec<String> = scan.held.iter().map(|s| regex::escape(s.value())).collect();
    let held_bytes = (!alternatives.is_empty())
        .then(|| regex::bytes::Regex::new(&alternatives.join("|")))
        .transpose()
        .map_err(|e| GitError::Io {
            path: repo_path.to_path_buf(),
            source: std::io::Error::other(format!("cannot search for the secrets: {e}")),
        })?;
    let mut found = Found {
        scan,
        held_bytes,
        findings: Vec::new(),
        seen: HashSet::new(),
        more: 0,
    };
    found.text(
        &At {
            commit: None,
            place: SecretPlace::BranchName,
            path: None,
            line: None,
        },
        branch,
        true,
    );
    let mut read: u64 = 0;
    let mut binaries_seen: HashSet<Oid> = HashSet::new();
    for oid in &commits {
        let commit = repo
            .find_commit(*oid)
            .map_err(GitError::git2("read a commit to push", repo_path))?;
        let sha = oid.to_string();
        let message = String::from_utf8_lossy(commit.message_bytes()).into_owned();
        for (n, line) in message.lines().enumerate() {
            let at = At {
                commit: Some(&sha),
                place: SecretPlace::Message,
                path: None,
                line: u32::try_from(n + 1).ok(),
            };
            found.text(&at, line, true);
        }
        let tree = commit
            .tree()
            .map_err(GitError::git2("read a commit to push", repo_path))?;
        let parent = match commit.parent(0) {
            Ok(p) => Some(
                p.tree()
                    .map_err(GitError::git2("read a commit's parent", repo_path))?,
            ),
            Err(_) => None,
        };
        let mut opts = DiffOptions::new();
        opts.ignore_submodules(true);
        let mut diff = repo
            .diff_tree_to_tree(parent.as_ref(), Some(&tree), Some(&mut opts))
            .map_err(GitError::git2("diff a commit to push", repo_path))?;
        // A renamed file adds only what changed in it.
        diff.find_similar(Some(DiffFindOptions::new().renames(true)))
            .map_err(GitError::git2("diff a commit to push", repo_path))?;
        for delta in diff.deltas() {
            if delta.status() == Delta::Deleted {
                continue;
            }
            let new = delta.new_file();
            let Some(path) = new.path().map(|p| p.to_string_lossy().into_owned()) else {
                continue;
            };
            let new_path = matches!(
                delta.status(),
                Delta::Added | Delta::Renamed | Delta::Copied | Delta::Untracked
            );
            found.text(
                &At {
                    commit: Some(&sha),
                    place: SecretPlace::Path,
                    path: Some(&path),
                    line: None,
                },
                &path,
                new_path,
            );
            // A gitlink (submodule) names a commit, not a blob.
            let Ok(blob) = repo.find_blob(new.id()) else {
                continue;
            };
            let content = blob.content();
            read = read.saturating_add(content.len() as u64);
            if read > scan.limits.max_total_bytes {
                return Err(GitError::ScanTooLarge {
                    branch: scan.held.mask(branch),
                    what: "the content of its commits".to_owned(),
                    limit: format!("{} MiB", scan.limits.max_total_bytes / (1024 * 1024)),
                });
            }
            let at = At {
                commit: Some(&sha),
                place: SecretPlace::Content,
                path: Some(&path),
                line: None,
            };
            if content.len() > scan.limits.max_text_bytes || is_binary(content) {
                if binaries_seen.insert(blob.id()) {
                    found.bytes(&at, content);
                }
                continue;
            }
            // The old version, when it reads as text; else everything is new.
            let old = Some(delta.old_file().id())
                .filter(|id| !id.is_zero())
                .and_then(|id| repo.find_blob(id).ok())
                .filter(|b| {
                    b.content().len() <= scan.limits.max_text_bytes && !is_binary(b.content())
                });
            let old_content: &[u8] = old.as_ref().map_or(&[], |b| b.content());
            read = read.saturating_add(old_content.len() as u64);
            added_lines(old_content, content, &at, &mut found)
                .map_err(GitError::git2("diff a file to push", repo_path))?;
        }
    }
    Ok(ScanReport {
        commits: commits.len(),
        findings: found.findings,
        more: found.more,
    })
}

/// The lines `new` adds over `old`, scanned as added text.
fn added_lines(
    old: &[u8],
    new: &[u8],
    at: &At<'_>,
    found: &mut Found<'_>,
) -> Result<(), git2::Error> {
    let mut opts = DiffOptions::new();
    opts.force_text(true).context_lines(0);
    let patch = git2::Patch::from_buffers(old, None, new, None, Some(&mut opts))?;
    for hunk in 0..patch.num_hunks() {
        for n in 0..patch.num_lines_in_hunk(hunk)? {
            let line = patch.line_in_hunk(hunk, n)?;
            if line.origin() != '+' {
                continue;
            }
            let text = String::from_utf8_lossy(line.content());
            let here = At {
                line: line.new_lineno(),
                ..*at
            };
            found.text(&here, &text, true);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
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
}
