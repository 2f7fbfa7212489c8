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
    let commits = commits_to_push(repo, repo_path, remote, branch, scan)?;
    let mut found = Found {
        scan,
        held_bytes: held_pattern(scan, repo_path)?,
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
    let mut read = Read {
        bytes: 0,
        binaries_seen: HashSet::new(),
    };
    for oid in &commits {
        scan_commit(repo, repo_path, *oid, branch, &mut found, &mut read)?;
    }
    Ok(ScanReport {
        commits: commits.len(),
        findings: found.findings,
        more: found.more,
    })
}

/// What a scan has read so far: the bytes (bounded) and the binaries already searched.
struct Read {
    bytes: u64,
    binaries_seen: HashSet<Oid>,
}

/// The commits a push of `branch` would send, oldest first, within the limit.
fn commits_to_push(
    repo: &Repository,
    repo_path: &Path,
    remote: &str,
    branch: &str,
    scan: &SecretScan,
) -> Result<Vec<Oid>, GitError> {
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
    Ok(commits)
}

/// Every held value, escaped, in one pattern (none when rover holds no secret).
fn held_pattern(
    scan: &SecretScan,
    repo_path: &Path,
) -> Result<Option<regex::bytes::Regex>, GitError> {
    let alternatives: Vec<String> = scan.held.iter().map(|s| regex::escape(s.value())).collect();
    (!alternatives.is_empty())
        .then(|| regex::bytes::Regex::new(&alternatives.join("|")))
        .transpose()
        .map_err(|e| GitError::Io {
            path: repo_path.to_path_buf(),
            source: std::io::Error::other(format!("cannot search for the secrets: {e}")),
        })
}

/// One commit's message, and what its diff over its first parent changes.
fn scan_commit(
    repo: &Repository,
    repo_path: &Path,
    oid: Oid,
    branch: &str,
    found: &mut Found<'_>,
    read: &mut Read,
) -> Result<(), GitError> {
    let commit = repo
        .find_commit(oid)
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
        scan_delta(repo, repo_path, &delta, &sha, branch, found, read)?;
    }
    Ok(())
}

/// One changed file of a commit: its path, and the content it adds (or its bytes, when binary
/// or large).
fn scan_delta(
    repo: &Repository,
    repo_path: &Path,
    delta: &git2::DiffDelta<'_>,
    sha: &str,
    branch: &str,
    found: &mut Found<'_>,
    read: &mut Read,
) -> Result<(), GitError> {
    let scan = found.scan;
    if delta.status() == Delta::Deleted {
        return Ok(());
    }
    let new = delta.new_file();
    let Some(path) = new.path().map(|p| p.to_string_lossy().into_owned()) else {
        return Ok(());
    };
    let new_path = matches!(
        delta.status(),
        Delta::Added | Delta::Renamed | Delta::Copied | Delta::Untracked
    );
    found.text(
        &At {
            commit: Some(sha),
            place: SecretPlace::Path,
            path: Some(&path),
            line: None,
        },
        &path,
        new_path,
    );
    // A gitlink (submodule) names a commit, not a blob.
    let Ok(blob) = repo.find_blob(new.id()) else {
        return Ok(());
    };
    let content = blob.content();
    read.bytes = read.bytes.saturating_add(content.len() as u64);
    if read.bytes > scan.limits.max_total_bytes {
        return Err(GitError::ScanTooLarge {
            branch: scan.held.mask(branch),
            what: "the content of its commits".to_owned(),
            limit: format!("{} MiB", scan.limits.max_total_bytes / (1024 * 1024)),
        });
    }
    let at = At {
        commit: Some(sha),
        place: SecretPlace::Content,
        path: Some(&path),
        line: None,
    };
    if content.len() > scan.limits.max_text_bytes || is_binary(content) {
        if read.binaries_seen.insert(blob.id()) {
            found.bytes(&at, content);
        }
        return Ok(());
    }
    // The old version, when it reads as text; else everything is new.
    let old = Some(delta.old_file().id())
        .filter(|id| !id.is_zero())
        .and_then(|id| repo.find_blob(id).ok())
        .filter(|b| b.content().len() <= scan.limits.max_text_bytes && !is_binary(b.content()));
    let old_content: &[u8] = old.as_ref().map_or(&[], |b| b.content());
    read.bytes = read.bytes.saturating_add(old_content.len() as u64);
    added_lines(old_content, content, &at, found)
        .map_err(GitError::git2("diff a file to push", repo_path))
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
#[path = "scan_tests.rs"]
mod tests;
