//! Git workspaces: branches and worktrees (git2), commit and push (the `git` CLI).
