//! A release's notes: the pull requests merged into the base branch since the last release,
//! each as one line (its title and link); the title is the repository's text, said, never
//! followed, and redacted with the whole body as a public comment is.

use std::fmt::Write as _;

use chrono::{DateTime, Utc};

use crate::github::MergedPull;
use crate::steps::meta::ReleaseMeta;

/// The longest title kept, in characters.
const MAX_TITLE: usize = 200;

/// The pull requests merged after `since` (all that GitHub listed: none before), oldest first,
/// rover's own merge among them even when GitHub's list does not show it yet.
pub(super) fn since(
    merged: &[MergedPull],
    since: Option<DateTime<Utc>>,
    meta: &ReleaseMeta,
) -> Vec<MergedPull> {
    let mut listed: Vec<MergedPull> = merged
        .iter()
        .filter(|p| since.is_none_or(|t| p.merged_at > t))
        .cloned()
        .collect();
    if !listed.iter().any(|p| p.number == meta.pr_number) {
        listed.push(MergedPull {
            number: meta.pr_number,
            title: String::new(),
            html_url: meta.pr_url.clone(),
            merged_at: Utc::now(),
        });
    }
    listed.sort_by_key(|p| (p.merged_at, p.number));
    listed
}

/// The notes' text.
pub(super) fn render(listed: &[MergedPull], previous: Option<&str>, meta: &ReleaseMeta) -> String {
    let mut out = format!(
        "Released by rover after pull request #{} was merged and its checks passed on `{}`.\n\n",
        meta.pr_number, meta.branch
    );
    match previous {
        Some(tag) => {
            let _ = write!(out, "## Pull requests merged since {tag}\n\n");
        }
        None => out.push_str("## Pull requests merged\n\n"),
    }
    for pull in listed {
        let title = one_line(&pull.title);
        if title.is_empty() {
            let _ = writeln!(out, "- #{} {}", pull.number, pull.html_url);
        } else {
            let _ = writeln!(out, "- {title} (#{}) {}", pull.number, pull.html_url);
        }
    }
    out
}

/// `title` on one line, without control characters, at most [`MAX_TITLE`] characters.
fn one_line(title: &str) -> String {
    let flat: String = title
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let words: Vec<&str> = flat.split_whitespace().collect();
    let joined = words.join(" ");
    if joined.chars().count() <= MAX_TITLE {
        return joined;
    }
    let cut: String = joined.chars().take(MAX_TITLE).collect();
    format!("{cut}…")
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn pull(n: u64, title: &str, day: u32) -> MergedPull {
        MergedPull {
            number: n,
            title: title.into(),
            html_url: format!("https://github.com/o/r/pull/{n}"),
            merged_at: Utc.with_ymd_and_hms(2026, 11, day, 10, 0, 0).unwrap(),
        }
    }

    fn meta(n: u64) -> ReleaseMeta {
        ReleaseMeta {
            pr_number: n,
            pr_url: format!("https://github.com/o/r/pull/{n}"),
            branch: "main".into(),
            sha: "abc".into(),
            merged: "Merged.".into(),
        }
    }

    #[test]
    fn the_notes_list_what_was_merged_since_the_last_release_oldest_first() {
        let merged = [
            pull(9, "fix: c", 20),
            pull(7, "feat: a", 10),
            pull(8, "docs: b", 15),
        ];
        let after = Utc.with_ymd_and_hms(2026, 11, 12, 0, 0, 0).unwrap();
        let listed = since(&merged, Some(after), &meta(9));
        assert_eq!(listed.iter().map(|p| p.number).collect::<Vec<_>>(), [8, 9]);
        let text = render(&listed, Some("v1.2.3"), &meta(9));
        assert!(
            text.contains("## Pull requests merged since v1.2.3"),
            "{text}"
        );
        assert!(
            text.contains("- docs: b (#8) https://github.com/o/r/pull/8\n- fix: c (#9)"),
            "{text}"
        );
        assert_eq!(since(&merged, None, &meta(9)).len(), 3);
    }

    #[test]
    fn rovers_merge_is_listed_even_before_github_lists_it_and_titles_stay_one_line() {
        let listed = since(&[], None, &meta(12));
        assert_eq!(listed[0].number, 12);
        let text = render(&listed, None, &meta(12));
        assert!(
            text.contains("- #12 https://github.com/o/r/pull/12"),
            "{text}"
        );
        let long = "x".repeat(500);
        let odd = [
            pull(3, "a\nb\r\n## injected heading\u{7}", 1),
            pull(4, &long, 2),
        ];
        let text = render(&odd, None, &meta(3));
        assert!(text.contains("- a b ## injected heading (#3)"), "{text}");
        assert!(!text.contains("\n## injected"), "{text}");
        assert!(
            text.contains(&format!("{}… (#4)", "x".repeat(200))),
            "{text}"
        );
    }
}
