//! Integration tests for `git`: real repositories with a bare `origin`, real hooks, real signing.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use rover::git::{
    branch_name, commit_message, BranchBase, CommitOutcome, GitError, PreparedWorktree, Removal,
    SecretScan, SecretWhat, Workspace,
};

use crate::support::gitrepo::{git, TestRepo};

/// `branch`'s worktree at `path`, forked from the default branch.
async fn worktree_at(ws: &Workspace, branch: &str, path: &Path) -> PreparedWorktree {
    ws.prepare_worktree(branch, BranchBase::DefaultBranch, path)
        .await
        .expect("prepare a worktree")
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).expect("write file");
}

fn executable(path: &Path, text: &str) {
    write(path, text);
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

#[tokio::test]
async fn task_branch_forks_from_default_and_commits_through_the_cli() {
    let repo = TestRepo::new();
    let ws = repo.workspace().await;
    assert_eq!(ws.default_branch().await.expect("default branch"), "main");
    let main_sha = git(&repo.checkout, &["rev-parse", "main"]);

    let branch = branch_name("3f2a91bc-0000", "Add a greeting");
    let path = repo.worktree_path("task-a");
    let wt = worktree_at(&ws, &branch, &path).await;
    assert!(wt.created_branch && wt.created_worktree);
    assert_eq!(wt.fork_point, main_sha);
    assert_eq!(git(&path, &["rev-parse", "--abbrev-ref", "HEAD"]), branch);
    // The user's checkout is untouched.
    assert_eq!(
        git(&repo.checkout, &["rev-parse", "--abbrev-ref", "HEAD"]),
        "main"
    );

    write(&path.join("README.md"), "hello\nworld\n");
    std::fs::create_dir_all(path.join("src")).expect("mkdir");
    write(&path.join("src/greet.txt"), "hi\nthere\n");
    let summary = ws.diff_summary(&path, &wt.fork_point).await.expect("diff");
    assert_eq!(summary.files, ["README.md", "src/greet.txt"]);
    assert_eq!(
        (summary.files_changed, summary.insertions, summary.deletions),
        (2, 3, 0)
    );

    let message = commit_message(
        "Add a greeting\n\nCo-Authored-By: Claude <noreply@anthropic.com>",
        true,
    );
    let outcome = ws.commit_all(&path, &message).await.expect("commit");
    let CommitOutcome::Committed { sha } = outcome else {
        panic!("expected a commit, got {outcome:?}");
    };
    assert_eq!(git(&repo.checkout, &["rev-parse", &branch]), sha);
    let body = git(&path, &["log", "-1", "--format=%B"]);
    assert!(
        body.contains("Co-Authored-By: Rover <noreply@endor.dev>"),
        "{body}"
    );
    assert!(!body.contains("Claude"), "{body}");
    let trailers = git(
        &path,
        &[
            "log",
            "-1",
            "--format=%(trailers:key=Co-Authored-By,valueonly)",
        ],
    );
    assert_eq!(trailers, "Rover <noreply@endor.dev>");
    // The diff against the fork point still counts the committed work.
    let after = ws
        .diff_summary(&path, &wt.fork_point)
        .await
        .expect("diff after commit");
    assert_eq!(after.files_changed, 2);

    assert_eq!(
        ws.commit_all(&path, "nothing")
            .await
            .expect("second commit"),
        CommitOutcome::NoChanges
    );

    // Preparing again (a restart) reuses branch and worktree.
    let again = worktree_at(&ws, &branch, &path).await;
    assert!(!again.created_branch && !again.created_worktree);
    assert_eq!(again.fork_point, main_sha);
}

/// A worktree add cut off by a crash (its registration gone or broken, its directory half
/// made) is made again on the next prepare; a directory that is not rover's stays an error.
#[tokio::test]
async fn an_interrupted_worktree_add_is_made_again_and_a_foreign_directory_is_refused() {
    let repo = TestRepo::new();
    let ws = repo.workspace().await;
    let path = repo.worktree_path("cut");
    worktree_at(&ws, "rover/cut-off", &path).await;
    // The kill came after the gitfile and some files, before the registration was complete.
    let registration = repo.checkout.join(".git/worktrees/rover-cut-off");
    std::fs::remove_dir_all(&registration).unwrap();
    assert!(path.join(".git").is_file());
    let again = worktree_at(&ws, "rover/cut-off", &path).await;
    assert!(again.created_worktree);
    assert!(registration.is_dir());
    assert!(path.join("README.md").exists() || std::fs::read_dir(&path).unwrap().count() > 1);

    let foreign = repo.worktree_path("foreign");
    std::fs::create_dir_all(&foreign).unwrap();
    write(&foreign.join("notes.txt"), "mine\n");
    let refused = ws
        .prepare_worktree("rover/foreign", BranchBase::DefaultBranch, &foreign)
        .await
        .expect_err("not rover's directory");
    assert!(
        matches!(refused, GitError::WorktreePathInUse { .. }),
        "{refused}"
    );
    assert_eq!(
        std::fs::read_to_string(foreign.join("notes.txt")).unwrap(),
        "mine\n"
    );
}

/// A kill during a worktree add's checkout leaves a registered worktree with files missing
/// (libgit2 writes its index last): it is made again, never handed out half checked out. A
/// kill before the registration's files were written leaves a directory git does not
/// recognise: the next add still succeeds.
#[tokio::test]
async fn a_worktree_add_cut_off_during_checkout_or_registration_is_made_again() {
    let repo = TestRepo::new();
    let ws = repo.workspace().await;
    let path = repo.worktree_path("half");
    worktree_at(&ws, "rover/half", &path).await;
    let registration = repo.checkout.join(".git/worktrees/rover-half");
    assert!(
        registration.join("index").is_file(),
        "a complete add has its index"
    );
    // Cut off during the checkout: README.md not out yet, no index.
    std::fs::remove_file(registration.join("index")).unwrap();
    std::fs::remove_file(path.join("README.md")).unwrap();
    let again = worktree_at(&ws, "rover/half", &path).await;
    assert!(again.created_worktree);
    assert!(path.join("README.md").is_file(), "the checkout is whole");
    assert_eq!(git(&path, &["status", "--porcelain"]), "");

    // Cut off before the registration's files: only its directory and one file exist.
    let path = repo.worktree_path("early");
    let early = repo.checkout.join(".git/worktrees/rover-early");
    std::fs::create_dir_all(&early).unwrap();
    write(
        &early.join("gitdir"),
        &format!("{}\n", path.join(".git").display()),
    );
    let made = worktree_at(&ws, "rover/early", &path).await;
    assert!(made.created_worktree);
    assert!(path.join("README.md").is_file());
    assert!(early.join("HEAD").is_file());
}

#[tokio::test]
async fn dependent_branch_forks_from_the_dependency_branch() {
    let repo = TestRepo::new();
    let ws = repo.workspace().await;
    let a_path = repo.worktree_path("a");
    worktree_at(&ws, "rover/a-first", &a_path).await;
    write(&a_path.join("a.txt"), "from a\n");
    let CommitOutcome::Committed { sha: a_sha } =
        ws.commit_all(&a_path, "A").await.expect("commit a")
    else {
        panic!("a had changes");
    };

    let b_path = repo.worktree_path("b");
    let b = ws
        .prepare_worktree(
            "rover/b-second",
            BranchBase::Branch("rover/a-first".into()),
            &b_path,
        )
        .await
        .expect("prepare b");
    assert_eq!(b.fork_point, a_sha);
    assert_eq!(
        std::fs::read_to_string(b_path.join("a.txt")).expect("a.txt in b"),
        "from a\n"
    );
    assert!(ws
        .diff_summary(&b_path, &b.fork_point)
        .await
        .expect("diff")
        .is_empty());

    let missing = ws
        .prepare_worktree(
            "rover/c",
            BranchBase::Branch("rover/nope".into()),
            &repo.worktree_path("c"),
        )
        .await
        .expect_err("missing dependency branch");
    assert!(
        matches!(missing, GitError::BranchMissing { ref branch, .. } if branch == "rover/nope"),
        "{missing}"
    );

    let inside = ws
        .prepare_worktree(
            "rover/inside",
            BranchBase::DefaultBranch,
            &repo.checkout.join("wt/x"),
        )
        .await
        .expect_err("not inside the checkout");
    assert!(
        matches!(inside, GitError::WorktreeInsideCheckout { .. }),
        "{inside}"
    );
    assert!(!repo.checkout.join("wt").exists());

    let existing = ws
        .prepare_worktree("rover/gone", BranchBase::Existing, &repo.worktree_path("d"))
        .await
        .expect_err("existing branch required");
    assert!(
        matches!(existing, GitError::BranchMissing { .. }),
        "{existing}"
    );

    // Iterating on a PR branch that exists only on the remote: checked out from origin.
    let other = repo.other_clone("pr-author");
    git(&other, &["checkout", "--quiet", "-b", "rover/pr-branch"]);
    write(&other.join("pr.txt"), "pr\n");
    git(&other, &["add", "-A"]);
    git(&other, &["commit", "--quiet", "-m", "PR work"]);
    git(&other, &["push", "--quiet", "origin", "rover/pr-branch"]);
    let pr_tip = git(&other, &["rev-parse", "HEAD"]);
    git(&repo.checkout, &["fetch", "--quiet", "origin"]);
    let pr_path = repo.worktree_path("pr");
    let pr = ws
        .prepare_worktree("rover/pr-branch", BranchBase::Existing, &pr_path)
        .await
        .expect("existing remote branch");
    assert!(pr.created_branch, "a local branch was made from origin's");
    assert_eq!(git(&pr_path, &["rev-parse", "HEAD"]), pr_tip);
    assert_eq!(pr.fork_point, git(&repo.checkout, &["rev-parse", "main"]));
}

#[tokio::test]
async fn pre_commit_hook_failure_is_captured_until_the_tool_exists() {
    let repo = TestRepo::new();
    // Host hooks only when asked for (`hooks: "host"`).
    let ws = repo
        .workspace()
        .await
        .with_hook_mode(rover::git::HookMode::Host);
    let tool = repo.dir.path().join("lint-tool");
    let hook = repo.checkout.join(".git/hooks/pre-commit");
    executable(
        &hook,
        &format!(
            "#!/bin/sh\nif [ ! -x '{0}' ]; then echo 'pre-commit: lint-tool not found, install it' >&2; exit 3; fi\nexec '{0}'\n",
            tool.display()
        ),
    );
    let path = repo.worktree_path("hooked");
    worktree_at(&ws, "rover/hooked", &path).await;
    write(&path.join("x.txt"), "x\n");

    // By default the hook is the sandbox's to run: the host's git refuses to run it.
    let sandboxed = repo.workspace().await;
    let err = sandboxed
        .commit_all(&path, "Add x")
        .await
        .expect_err("hooks need the sandbox");
    assert!(
        matches!(err, rover::git::GitError::HooksNeedSandbox { .. }),
        "{err}"
    );
    assert!(
        matches!(plan(&sandboxed, &path).await, rover::git::HookPlan::Sandbox { ref hooks, .. } if hooks == &["pre-commit"])
    );

    let err = ws
        .commit_all(&path, "Add x")
        .await
        .expect_err("hook blocks the commit");
    let failure = err.command_failure().expect("command failure");
    assert_eq!(failure.exit_code, Some(1));
    assert!(
        failure.stderr.contains("lint-tool not found"),
        "{}",
        failure.stderr
    );
    assert!(failure.command.iter().any(|a| a == "commit"));
    assert!(!failure
        .command
        .iter()
        .any(|a| a == "--no-verify" || a == "-n"));
    assert!(!err.is_retryable());

    executable(&tool, "#!/bin/sh\necho lint ok\n");
    let outcome = ws
        .commit_all(&path, "Add x")
        .await
        .expect("commit once the tool exists");
    assert!(matches!(outcome, CommitOutcome::Committed { .. }));
}

#[tokio::test]
async fn signing_failure_is_captured() {
    let repo = TestRepo::new();
    let ws = repo.workspace().await;
    git(&repo.checkout, &["config", "commit.gpgsign", "true"]);
    git(
        &repo.checkout,
        &["config", "user.signingkey", "0xDEADBEEFDEADBEEF"],
    );
    let gnupg = repo.dir.path().join("gnupg");
    std::fs::create_dir_all(&gnupg).expect("mkdir gnupg");
    std::fs::set_permissions(&gnupg, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let ws = ws.with_env("GNUPGHOME", &gnupg);
    let path = repo.worktree_path("signed");
    worktree_at(&ws, "rover/signed", &path).await;
    write(&path.join("y.txt"), "y\n");
    let err = ws
        .commit_all(&path, "Add y")
        .await
        .expect_err("no key to sign with");
    let failure = err.command_failure().expect("command failure");
    assert_eq!(failure.exit_code, Some(128));
    assert!(
        failure.stderr.contains("failed to sign"),
        "{}",
        failure.stderr
    );
    assert_eq!(
        git(&path, &["rev-parse", "HEAD"]),
        git(&repo.checkout, &["rev-parse", "main"])
    );
}

#[tokio::test]
async fn push_rebases_and_retries_instead_of_forcing() {
    let repo = TestRepo::new();
    git(
        &repo.origin,
        &["config", "receive.denyNonFastForwards", "true"],
    );
    let ws = repo.workspace().await;
    let path = repo.worktree_path("pushed");
    let branch = "rover/pushed-task";
    worktree_at(&ws, branch, &path).await;
    write(&path.join("ours.txt"), "1\n");
    ws.commit_all(&path, "Ours 1").await.expect("commit 1");
    let first = ws
        .push_branch(
            &path,
            branch,
            branch,
            None,
            &plan(&ws, &path).await,
            &SecretScan::default(),
        )
        .await
        .expect("first push");
    assert!(!first.rebased);
    assert_eq!(
        git(&path, &["rev-parse", "--abbrev-ref", "@{upstream}"]),
        format!("origin/{branch}")
    );

    // Someone else pushes to the same branch; ours diverges.
    let other = repo.other_clone("other");
    git(&other, &["checkout", "--quiet", branch]);
    write(&other.join("theirs.txt"), "theirs\n");
    git(&other, &["add", "-A"]);
    git(&other, &["commit", "--quiet", "-m", "Theirs"]);
    git(&other, &["push", "--quiet", "origin", branch]);
    let theirs = git(&other, &["rev-parse", "HEAD"]);

    write(&path.join("ours.txt"), "2\n");
    ws.commit_all(&path, "Ours 2").await.expect("commit 2");
    let second = ws
        .push_branch(
            &path,
            branch,
            branch,
            Some("ghp_not_a_real_token"),
            &plan(&ws, &path).await,
            &SecretScan::default(),
        )
        .await
        .expect("push after rebase");
    assert!(second.rebased);
    let remote_tip = git(&repo.origin, &["rev-parse", branch]);
    assert_eq!(remote_tip, git(&path, &["rev-parse", "HEAD"]));
    // Their commit survived: the remote history contains it (nothing was forced).
    git(
        &repo.origin,
        &["merge-base", "--is-ancestor", &theirs, &remote_tip],
    );
    assert_eq!(
        git(&repo.origin, &["show", &format!("{remote_tip}:ours.txt")]),
        "2"
    );
}

#[tokio::test]
async fn push_failure_keeps_the_token_out_of_argv_and_output() {
    let repo = TestRepo::new();
    let ws = repo.workspace().await.with_remote("nowhere");
    git(
        &repo.checkout,
        &["remote", "add", "nowhere", "/nonexistent/repo.git"],
    );
    let path = repo.worktree_path("tok");
    worktree_at(&ws, "rover/tok", &path).await;
    let err = ws
        .push_branch(
            &path,
            "rover/tok",
            "rover/tok",
            Some("ghp_secret_value"),
            &plan(&ws, &path).await,
            &SecretScan::default(),
        )
        .await
        .expect_err("remote does not exist");
    let failure = err.command_failure().expect("command failure");
    assert!(!failure.command.join(" ").contains("ghp_secret_value"));
    assert!(
        !failure.stderr.contains("ghp_secret_value")
            && !failure.stdout.contains("ghp_secret_value")
    );
    assert!(failure
        .command
        .iter()
        .all(|a| a != "--force" && a != "-f" && !a.starts_with('+')));
}

/// A held secret committed on a task branch (then removed again) keeps the whole branch from
/// the remote: the push is refused before git runs, and the error names where, not the value.
#[tokio::test]
async fn a_push_carrying_a_held_secret_sends_nothing() {
    let repo = TestRepo::new();
    let ws = repo.workspace().await;
    let path = repo.worktree_path("leaky");
    let branch = "rover/leaky-task";
    worktree_at(&ws, branch, &path).await;
    let secret = "sk-live-held-value-for-the-test";
    write(&path.join("config.env"), &format!("KEY={secret}\n"));
    ws.commit_all(&path, "Add the config")
        .await
        .expect("commit");
    write(&path.join("config.env"), "KEY=\n");
    ws.commit_all(&path, "Remove the key")
        .await
        .expect("commit");
    let held = rover::secrets::HeldSecrets::new().with("OPENAI_API_KEY", Some(secret));
    let err = ws
        .push_branch(
            &path,
            branch,
            branch,
            None,
            &plan(&ws, &path).await,
            &SecretScan::new(held),
        )
        .await
        .expect_err("refused");
    let GitError::SecretsInPush { findings, .. } = &err else {
        panic!("not a refusal: {err}");
    };
    assert_eq!(findings.len(), 1, "{findings:?}");
    assert_eq!(findings[0].path.as_deref(), Some("config.env"));
    assert_eq!(
        findings[0].what,
        SecretWhat::Held {
            name: "OPENAI_API_KEY".into()
        }
    );
    let text = err.to_string();
    assert!(
        text.contains("the value of OPENAI_API_KEY in `config.env` line 1"),
        "{text}"
    );
    assert!(!text.contains(secret), "{text}");
    let remote = git(&repo.origin, &["for-each-ref", "refs/heads/rover/"]);
    assert!(remote.is_empty(), "pushed: {remote}");
}

#[tokio::test]
async fn merge_conflict_is_aborted_and_listed() {
    let repo = TestRepo::new();
    let ws = repo.workspace().await;
    let mut paths = Vec::new();
    for (name, text, extra) in [
        ("one", "one\n", "one.txt"),
        ("two", "two\n", "two.txt"),
        ("three", "three\n", "three.txt"),
    ] {
        let path = repo.worktree_path(name);
        worktree_at(&ws, &format!("rover/{name}"), &path).await;
        write(&path.join(extra), text);
        if name != "two" {
            write(&path.join("README.md"), text);
        }
        ws.commit_all(&path, name).await.expect("commit");
        paths.push(path);
    }
    let target = repo.worktree_path("target");
    worktree_at(&ws, "rover/target", &target).await;
    let ok = ws
        .merge_branches(&target, &["rover/one".to_string(), "rover/two".to_string()])
        .await
        .expect("clean merges");
    assert_eq!(ok.merged, ["rover/one", "rover/two"]);
    assert!(target.join("one.txt").exists() && target.join("two.txt").exists());

    let err = ws
        .merge_branches(&target, &["rover/three".to_string()])
        .await
        .expect_err("conflict on README.md");
    let GitError::MergeConflict {
        source_branch,
        files,
    } = &err
    else {
        panic!("expected a merge conflict, got {err}");
    };
    assert_eq!(source_branch, "rover/three");
    assert_eq!(files, &["README.md"]);
    assert_eq!(git(&target, &["status", "--porcelain"]), "");
    assert_eq!(git(&target, &["rev-parse", "HEAD"]), ok.head);
}

#[tokio::test]
async fn cleanup_tolerates_each_piece_already_gone() {
    let repo = TestRepo::new();
    let ws = repo.workspace().await;
    let path = repo.worktree_path("clean");
    worktree_at(&ws, "rover/clean", &path).await;
    write(&path.join("dirty.txt"), "uncommitted\n");

    let report = ws.cleanup(&path, "rover/clean").await.expect("cleanup");
    assert_eq!(
        (report.worktree, report.branch),
        (Removal::Removed, Removal::Removed)
    );
    assert!(!path.exists());
    assert!(!ws
        .branch_exists("rover/clean")
        .await
        .expect("branch lookup"));
    assert_eq!(
        git(&repo.checkout, &["worktree", "list", "--porcelain"])
            .matches("worktree ")
            .count(),
        1
    );

    let again = ws
        .cleanup(&path, "rover/clean")
        .await
        .expect("cleanup again");
    assert_eq!(
        (again.worktree, again.branch),
        (Removal::Absent, Removal::Absent)
    );

    // Directory deleted by hand: the stale registration is still pruned, then the branch goes.
    let path2 = repo.worktree_path("clean2");
    worktree_at(&ws, "rover/clean2", &path2).await;
    std::fs::remove_dir_all(&path2).expect("rm worktree by hand");
    assert_eq!(
        ws.remove_worktree(&path2).await.expect("remove"),
        Removal::Removed
    );
    assert_eq!(
        ws.delete_branch("rover/clean2").await.expect("delete"),
        Removal::Removed
    );
    assert_eq!(
        ws.delete_branch("rover/clean2")
            .await
            .expect("delete again"),
        Removal::Absent
    );
    // The same branch and path can be prepared again afterwards.
    worktree_at(&ws, "rover/clean2", &path2).await;
}

#[tokio::test]
async fn parallel_tasks_prepare_their_worktrees_at_once() {
    let repo = TestRepo::new();
    let ws = repo.workspace().await;
    let prepare = |i: usize| {
        let ws = ws.clone();
        let path = repo.worktree_path(&format!("par-{i}"));
        async move {
            ws.prepare_worktree(&format!("rover/par-{i}"), BranchBase::DefaultBranch, &path)
                .await
        }
    };
    let (a, b, c) = tokio::join!(prepare(0), prepare(1), prepare(2));
    for (i, wt) in [a, b, c].into_iter().enumerate() {
        let wt = wt.expect("prepared in parallel");
        assert_eq!(
            git(&wt.path, &["rev-parse", "--abbrev-ref", "HEAD"]),
            format!("rover/par-{i}")
        );
    }
    let list = git(&repo.checkout, &["worktree", "list", "--porcelain"]);
    assert_eq!(
        list.matches("branch refs/heads/rover/par-").count(),
        3,
        "{list}"
    );
    let listed = ws.list_worktrees().await.expect("list worktrees");
    let branches: Vec<_> = listed
        .iter()
        .map(|w| w.branch.clone().unwrap_or_default())
        .collect();
    assert_eq!(branches, ["rover/par-0", "rover/par-1", "rover/par-2"]);
    assert!(listed
        .iter()
        .all(|w| w.present && w.path.starts_with(&repo.data)));
    std::fs::remove_dir_all(repo.worktree_path("par-1")).expect("rm by hand");
    let listed = ws.list_worktrees().await.expect("list again");
    assert!(!listed[1].present && listed[1].branch.is_none());
}

/// Where the worktree's hooks run (the default mode).
async fn plan(ws: &Workspace, worktree: &std::path::Path) -> rover::git::HookPlan {
    ws.hook_plan(worktree, rover::git::HookMode::Sandbox)
        .await
        .expect("hook plan")
}

/// A worktree a container still had when rover stopped (handed to the sandbox user) is taken
/// back and reused on the next start, not refused as "in use" (git refuses a repository another
/// user owns).
#[tokio::test]
async fn a_worktree_left_with_the_sandbox_user_is_taken_back_and_reused() {
    let repo = TestRepo::new();
    let ws = repo.workspace().await;
    let path = repo.worktree_path("handed");
    let first = worktree_at(&ws, "rover/handed", &path).await;
    write(&path.join("agent.txt"), "agent\n");
    let (uid, gid) = rover::git::owner::owner(&path).expect("owner");
    let run_as = rover::git::owner::RunAs {
        uid: rover::git::owner::SANDBOX_UID,
        gid: rover::git::owner::SANDBOX_GID,
        hand_over: true,
    };
    rover::git::owner::hand_over(&path, run_as).expect("hand over");
    let again = worktree_at(&ws, "rover/handed", &path).await;
    assert!(!again.created_worktree);
    assert_eq!(again.fork_point, first.fork_point);
    let meta = std::fs::symlink_metadata(path.join("agent.txt")).expect("stat");
    assert_eq!((meta.uid(), meta.gid()), (uid, gid));
    ws.commit_all(&path, "Agent work")
        .await
        .expect("the host commits it");
}

/// Commits `file` with `text` in the checkout on `main` and pushes it; returns the commit.
fn commit_on_main(repo: &TestRepo, file: &str, text: &str, subject: &str) -> String {
    write(&repo.checkout.join(file), text);
    git(&repo.checkout, &["add", "-A"]);
    git(&repo.checkout, &["commit", "-q", "-m", subject]);
    git(&repo.checkout, &["push", "-q", "origin", "main"]);
    git(&repo.checkout, &["rev-parse", "HEAD"])
}

#[tokio::test]
async fn a_merge_commit_is_reverted_against_its_first_parent_and_a_conflicting_revert_changes_nothing(
) {
    let repo = TestRepo::new();
    // A merge commit on main: a side branch's `side.txt`.
    git(&repo.checkout, &["checkout", "-q", "-b", "side"]);
    write(&repo.checkout.join("side.txt"), "from the side\n");
    git(&repo.checkout, &["add", "-A"]);
    git(&repo.checkout, &["commit", "-q", "-m", "side"]);
    git(&repo.checkout, &["checkout", "-q", "main"]);
    git(
        &repo.checkout,
        &["merge", "-q", "--no-ff", "-m", "Merge side", "side"],
    );
    git(&repo.checkout, &["push", "-q", "origin", "main"]);
    let merge = git(&repo.checkout, &["rev-parse", "HEAD"]);
    // Then a change of README's line, twice: reverting the first conflicts with the second.
    let first = commit_on_main(&repo, "README.md", "one\n", "README one");
    commit_on_main(&repo, "README.md", "two\n", "README two");
    let ws = repo.workspace().await;

    let path = repo.worktree_path("revert-merge");
    worktree_at(&ws, "rover/revert-merge", &path).await;
    let changed = ws
        .revert_into(&path, &merge)
        .await
        .expect("revert the merge");
    assert_eq!(changed, ["side.txt"]);
    assert!(!path.join("side.txt").exists());
    assert_eq!(
        std::fs::read_to_string(path.join("README.md")).unwrap(),
        "two\n"
    );
    // A plain staged change, no revert in progress: the commit step commits it as any change.
    assert_eq!(git(&path, &["status", "--porcelain"]), "D  side.txt");
    let git_dir = git(&path, &["rev-parse", "--git-dir"]);
    assert!(!Path::new(&git_dir).join("REVERT_HEAD").exists());

    let path = repo.worktree_path("revert-conflict");
    worktree_at(&ws, "rover/revert-conflict", &path).await;
    let err = ws.revert_into(&path, &first).await.expect_err("a conflict");
    let GitError::RevertConflict { files, .. } = &err else {
        panic!("{err:?}");
    };
    assert_eq!(files, &["README.md"]);
    assert!(
        err.to_string()
            .contains("a person must take it back by hand"),
        "{err}"
    );
    assert_eq!(
        git(&path, &["status", "--porcelain"]),
        "",
        "nothing changed"
    );
    assert_eq!(
        std::fs::read_to_string(path.join("README.md")).unwrap(),
        "two\n"
    );
}
