//! What an agent's change may not slip past a person: files that steer rover, its sandbox, its
//! agents or the repository's CI and hooks. A pushed change that touches one gets a warning in
//! its pull request body and in the push span (`steering`), naming the files, so a reviewer
//! reads them first; rover never merges such a change without a trusted person's approval.

/// Paths (exact, or a folder's whole content) that steer rover or what runs for it.
const STEERING: &[&str] = &[
    // rover itself: its settings, instructions, setup script.
    "rover.json",
    ".rover/",
    // The sandbox's environment.
    ".devcontainer/",
    ".devcontainer.json",
    // CI, which runs with the repository's secrets.
    ".github/workflows/",
    ".github/actions/",
    // Hook managers: commands run on commit and push.
    ".husky/",
    ".githooks/",
    ".pre-commit-config.yaml",
    ".pre-commit-config.yml",
    "lefthook.yml",
    "lefthook.yaml",
    "lefthook.json",
    ".lefthook.yml",
    ".lefthook.yaml",
    ".lefthook/",
    "lefthook-local.yml",
    ".overcommit.yml",
    ".simple-git-hooks.json",
    ".simple-git-hooks.js",
    ".simple-git-hooks.cjs",
    // The agent CLIs' own settings and hooks, and the instructions they load.
    ".claude/",
    "CLAUDE.md",
    "AGENTS.md",
    ".codex/",
];

/// Whether `path` (relative to the repository root) steers rover or what runs for it. Compared
/// without case: a case-insensitive checkout reads `Rover.json` as `rover.json`.
pub fn steers(path: &str) -> bool {
    let path = path.trim_start_matches("./").to_ascii_lowercase();
    STEERING.iter().any(|pattern| {
        let pattern = pattern.to_ascii_lowercase();
        match pattern.strip_suffix('/') {
            Some(folder) => path.starts_with(&pattern) || path == folder,
            None => path == pattern,
        }
    })
}

/// The paths of `changed` that steer, in their order.
pub fn steering(changed: &[String]) -> Vec<String> {
    changed.iter().filter(|p| steers(p)).cloned().collect()
}

/// The warning a pull request body carries for `files` (none: no warning).
pub fn warning(files: &[String]) -> Option<String> {
    if files.is_empty() {
        return None;
    }
    let listed: Vec<String> = files.iter().take(20).map(|f| format!("`{f}`")).collect();
    Some(format!(
        "> [!WARNING]\n> This change touches what steers rover, its sandbox, its agents or CI: {}{}. Review these files first; rover never merges a change to them without the approval of a person with write access.\n",
        listed.join(", "),
        if files.len() > 20 {
            format!(" and {} more", files.len() - 20)
        } else {
            String::new()
        }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rover_sandbox_ci_hook_and_agent_files_steer() {
        for path in [
            "rover.json",
            "Rover.json",
            ".rover/AUTOPILOT.md",
            ".rover/setup.sh",
            ".devcontainer/devcontainer.json",
            ".devcontainer/Dockerfile",
            ".devcontainer.json",
            ".github/workflows/ci.yml",
            ".github/actions/setup/action.yml",
            ".husky/pre-commit",
            ".pre-commit-config.yaml",
            "lefthook.yml",
            ".claude/settings.json",
            "CLAUDE.md",
            "AGENTS.md",
            ".codex/config.toml",
        ] {
            assert!(steers(path), "{path}");
        }
        for path in [
            "src/rover.json",
            "docs/rover.json.md",
            ".github/CODEOWNERS",
            ".roverx/a",
            "README.md",
            "src/CLAUDE.md",
            "devcontainer.json",
        ] {
            assert!(!steers(path), "{path}");
        }
    }

    #[test]
    fn the_warning_names_the_files() {
        assert_eq!(warning(&[]), None);
        let text =
            warning(&["rover.json".into(), ".github/workflows/ci.yml".into()]).expect("a warning");
        assert!(
            text.contains("`rover.json`, `.github/workflows/ci.yml`"),
            "{text}"
        );
        assert!(text.contains("never merges"), "{text}");
    }
}
