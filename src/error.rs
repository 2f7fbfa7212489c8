//! Helpers for errors shared by every layer.

/// An error and its causes on one line: `a: b: c`.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let next = s.to_string();
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = s.source();
    }
    text
}

/// What kind of failure a command ended in: its exit code, its stable name in `--json` output
/// and the one line of what to do when the error itself has nothing more precise to say.
///
/// The codes follow sysexits where one fits, so a cron wrapper or a script can tell "try again
/// later" from "fix your setup" from "a bug" without reading the message (`docs/cli.md`, Exit
/// codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The command line is wrong: an argument, a value, an empty request (2, as clap's).
    Usage,
    /// What the command names does not exist: a store, a trace, an id, a dead letter (66,
    /// `EX_NOINPUT`).
    NotFound,
    /// The command is understood and refused by policy or by the state of things: a trace
    /// already ended, nothing to retry, a step still queued (77, `EX_NOPERM`).
    Refused,
    /// A setting is missing or invalid: credentials, `rover.json`, a key file, an agent CLI that
    /// is not installed (78, `EX_CONFIG`).
    Config,
    /// Something rover needs does not answer now: Docker, GitHub, another daemon holding the
    /// project. Nothing was lost; try again later (75, `EX_TEMPFAIL`).
    Unavailable,
    /// A file of the store does not parse: it names the file, kept aside (65, `EX_DATAERR`).
    Corrupt,
    /// Anything else: an I/O error, a runtime that cannot start, a bug (70, `EX_SOFTWARE`).
    Internal,
}

impl ErrorKind {
    /// Every kind, in the order `docs/cli.md` lists them.
    pub const ALL: [ErrorKind; 7] = [
        ErrorKind::Usage,
        ErrorKind::NotFound,
        ErrorKind::Refused,
        ErrorKind::Config,
        ErrorKind::Unavailable,
        ErrorKind::Corrupt,
        ErrorKind::Internal,
    ];

    /// The process exit code of a command that ended in this kind of failure.
    pub fn exit_code(self) -> u8 {
        match self {
            ErrorKind::Usage => 2,
            ErrorKind::NotFound => 66,
            ErrorKind::Refused => 77,
            ErrorKind::Config => 78,
            ErrorKind::Unavailable => 75,
            ErrorKind::Corrupt => 65,
            ErrorKind::Internal => 70,
        }
    }

    /// The stable name (`--json`'s `kind`).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Usage => "usage",
            ErrorKind::NotFound => "not_found",
            ErrorKind::Refused => "refused",
            ErrorKind::Config => "config",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Corrupt => "corrupt",
            ErrorKind::Internal => "internal",
        }
    }

    /// What to do, when the error has nothing more precise to say.
    pub fn default_hint(self) -> &'static str {
        match self {
            ErrorKind::Usage => "see `rover autopilot <command> --help` for the arguments",
            ErrorKind::NotFound => {
                "list what exists with `rover autopilot traces` (and check --project-id)"
            }
            ErrorKind::Refused => {
                "nothing was changed; `rover autopilot trace <id>` shows the state it is in"
            }
            ErrorKind::Config => "fix the setting the message names, then run the command again",
            ErrorKind::Unavailable => "nothing was lost; try again later",
            ErrorKind::Corrupt => {
                "repair or remove the file the message names (nothing was overwritten), then retry"
            }
            ErrorKind::Internal => {
                "this is rover's fault or the machine's (disk, permissions): the message says which; report it with `rover autopilot status` if it persists"
            }
        }
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error that knows what kind of failure it is (see [`ErrorKind`]).
pub trait Kinded: std::error::Error {
    fn kind(&self) -> ErrorKind;
}

#[cfg(test)]
mod tests {
    use super::ErrorKind;

    #[test]
    fn each_kind_has_its_own_exit_code_and_docs_list_them_all() {
        let mut codes: Vec<u8> = ErrorKind::ALL.iter().map(|k| k.exit_code()).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), ErrorKind::ALL.len(), "one code per kind");
        assert!(!codes.contains(&0) && !codes.contains(&1) && !codes.contains(&3));
        let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/cli.md"))
            .expect("docs/cli.md");
        for kind in ErrorKind::ALL {
            let row = format!("| `{}` | `{}` |", kind.exit_code(), kind.as_str());
            assert!(docs.contains(&row), "docs/cli.md lists {row}");
            let json = serde_json::to_string(&kind).unwrap();
            assert_eq!(
                json,
                format!("\"{kind}\""),
                "the JSON name is the stable name"
            );
        }
    }
}
