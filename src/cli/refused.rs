//! The webhook deliveries the daemon's one endpoint refused (for a repository it does not serve),
//! read from `<data dir>/daemon/refused.jsonl` for `events` outside a checkout. One JSON object a
//! line: `{"at", "deliveryId", "event", "repo", "reason"}`. Every field but `at` comes from the
//! delivery, that is from anyone who can reach the endpoint: printed escaped and bounded.

use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde::Deserialize;

use super::CliError;
use crate::store::{IntakeOutcome, IntakeRecord, StoreError};

/// How many characters of a delivery's repository, event, id and reason are shown.
const REPO_CHARS: usize = 100;
const EVENT_CHARS: usize = 64;
const DELIVERY_CHARS: usize = 80;
const REASON_CHARS: usize = 300;

/// Where the daemon records the deliveries it refused.
pub fn path(data_dir: &Path) -> PathBuf {
    data_dir.join("daemon").join("refused.jsonl")
}

/// One refused delivery, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Refused {
    pub at: DateTime<Utc>,
    pub delivery_id: Option<String>,
    pub event: String,
    pub repo: Option<String>,
    pub reason: String,
}

impl Refused {
    /// The repository the delivery named, and the delivery as an `events` record (path
    /// `webhook`), every field from the delivery escaped and bounded.
    pub fn into_record(self) -> (Option<String>, IntakeRecord) {
        let mut record = IntakeRecord::new("webhook", IntakeOutcome::Skipped, self.at)
            .reason(printable(&self.reason, REASON_CHARS));
        record.kind = Some(printable(&self.event, EVENT_CHARS));
        record.event_id = self.delivery_id.map(|d| printable(&d, DELIVERY_CHARS));
        (self.repo.map(|r| printable(&r, REPO_CHARS)), record)
    }
}

/// The refused deliveries, oldest first; none when the file does not exist. A last line without
/// its newline that does not parse is a write cut off and left out; any other line that does
/// not parse is an error naming the file and the line.
pub fn read(path: &Path) -> Result<Vec<Refused>, CliError> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(parse(path, &String::from_utf8_lossy(&bytes))?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(StoreError::io("read", path)(e).into()),
    }
}

fn parse(path: &Path, text: &str) -> Result<Vec<Refused>, StoreError> {
    let (whole, tail) = match text.rfind('\n') {
        Some(at) => text.split_at(at + 1),
        None => ("", text),
    };
    let mut refused = Vec::new();
    for (n, line) in whole.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        refused.push(
            serde_json::from_str(line).map_err(|e| StoreError::Unreadable {
                path: path.to_owned(),
                reason: format!("line {}: {e}", n + 1),
            })?,
        );
    }
    if let Ok(last) = serde_json::from_str(tail.trim()) {
        refused.push(last);
    }
    Ok(refused)
}

/// `text` with every control or invisible formatting character escaped (`\u{1b}`), at most
/// `max` characters (then `…`): no delivery's bytes steer the terminal.
pub fn printable(text: &str, max: usize) -> String {
    let mut out = String::new();
    let mut count = 0;
    for c in text.chars() {
        let shown = if c.is_control() || invisible(c) {
            c.escape_default().to_string()
        } else {
            c.to_string()
        };
        count += shown.chars().count();
        if count > max {
            out.push('…');
            break;
        }
        out.push_str(&shown);
    }
    out
}

/// Characters that change how a line reads without showing: zero-width ones, direction
/// overrides and isolates, the byte-order mark.
fn invisible(c: char) -> bool {
    matches!(c, '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2060}'..='\u{2069}' | '\u{FEFF}')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Kinded;

    const FILE: &str = "/data/daemon/refused.jsonl";

    #[test]
    fn reads_each_refused_delivery_and_leaves_out_a_torn_last_line() {
        let text = concat!(
            r#"{"at": "2026-11-29T10:00:00Z", "deliveryId": "d-1", "event": "issues", "repo": "stranger/repo", "reason": "not served"}"#,
            "\n",
            r#"{"at": "2026-11-29T10:00:05Z", "deliveryId": null, "event": "ping", "repo": null, "reason": "no repository"}"#,
            "\n",
            r#"{"at": "2026-11-29T10:00:09Z", "deliv"#,
        );
        let refused = parse(Path::new(FILE), text).unwrap();
        assert_eq!(refused.len(), 2);
        assert_eq!(refused[0].delivery_id.as_deref(), Some("d-1"));
        assert_eq!(refused[0].repo.as_deref(), Some("stranger/repo"));
        assert_eq!(refused[1].repo, None);
        assert_eq!(refused[1].delivery_id, None);
        assert_eq!(refused[1].reason, "no repository");
        // A whole last line without its newline is still read.
        let whole = text.rsplit_once('\n').unwrap().0;
        assert_eq!(parse(Path::new(FILE), whole).unwrap().len(), 2);
    }

    #[test]
    fn a_malformed_earlier_line_is_an_error_naming_the_file_and_the_line() {
        let text = concat!(
            r#"{"at": "2026-11-29T10:00:00Z", "deliveryId": "d-1", "event": "issues", "repo": null, "reason": "x"}"#,
            "\n{not json\n",
            r#"{"at": "2026-11-29T10:00:05Z", "deliveryId": null, "event": "ping", "repo": null, "reason": "y"}"#,
            "\n",
        );
        let err = parse(Path::new(FILE), text).unwrap_err();
        assert_eq!(err.kind(), crate::error::ErrorKind::Corrupt);
        let said = err.to_string();
        assert!(
            said.starts_with(&format!("{FILE} does not parse: line 2: ")),
            "{said}"
        );
    }

    #[test]
    fn a_missing_file_is_no_refused_delivery() {
        let dir = tempfile::tempdir().unwrap();
        assert!(read(&path(dir.path())).unwrap().is_empty());
    }

    #[test]
    fn a_delivery_s_words_are_escaped_and_bounded() {
        let refused = Refused {
            at: "2026-11-29T10:00:00Z".parse().unwrap(),
            delivery_id: Some("d\u{1b}[2J".into()),
            event: "issues\r\nFAKE".into(),
            repo: Some(format!("evil/\u{202E}{}", "x".repeat(500))),
            reason: "not served".into(),
        };
        let (repo, record) = refused.into_record();
        let repo = repo.unwrap();
        assert!(repo.starts_with("evil/\\u{202e}x"), "{repo}");
        assert_eq!(repo.chars().count(), REPO_CHARS + 1);
        assert!(repo.ends_with('…'));
        assert_eq!(record.kind.as_deref(), Some("issues\\r\\nFAKE"));
        assert_eq!(record.event_id.as_deref(), Some("d\\u{1b}[2J"));
        assert_eq!(record.via, "webhook");
        assert_eq!(record.reason.as_deref(), Some("not served"));
        assert!(!format!("{repo}{:?}", record.kind)
            .chars()
            .any(char::is_control));
    }
}
