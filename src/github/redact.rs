//! Redaction before anything leaves rover: public channels lose paths, environment details,
//! secrets and full key fingerprints; private channels keep diagnostics but never secrets.

use std::sync::LazyLock;

use regex::{Captures, Regex};

use super::events::Visibility;
use crate::secrets::{last4, HeldSecrets, LiveSecrets};

/// What replaces a secret (`crate::secrets::SECRET`).
pub use crate::secrets::SECRET;
/// What replaces a file-system path in public.
pub const PATH: &str = "[path]";
/// What replaces an environment line in public.
pub const ENV: &str = "[environment details omitted]";

fn re(pattern: &str) -> Regex {
    Regex::new(pattern).expect("redaction patterns are valid, checked by the tests")
}

static PEM: LazyLock<Regex> =
    LazyLock::new(|| re(r"-----BEGIN [A-Z0-9 ]+-----[\s\S]*?(?:-----END [A-Z0-9 ]+-----|\z)"));
static BEARER: LazyLock<Regex> =
    LazyLock::new(|| re(r"(?i)\b(bearer|token|basic)(\s+)[A-Za-z0-9._~+/=-]{16,}"));
/// `NAME=value` / `NAME: value` where the name says it is a secret (`password`, `api_key`,
/// `GITHUB_TOKEN`, `SSH_KEY`; not `author` or `monkey`).
static SECRET_ASSIGN: LazyLock<Regex> = LazyLock::new(|| {
    re(concat!(
        r"(?i)\b((?:[a-z0-9]+_)*(?:api_?key|access_?key|secret_?key|private_?key|secret|token|password|passwd|credentials?|auth)s?",
        r#"|(?:[a-z0-9]+_)+key)\b(["']?\s*[=:]\s*["']?)[^\s"']+"#,
    ))
});
/// A line of an environment dump (`NAME=value`, optionally `export`ed).
static ENV_LINE: LazyLock<Regex> =
    LazyLock::new(|| re(r"(?m)^[ \t]*(?:export[ \t]+)?[A-Z][A-Z0-9_]*=[^\n]*$"));
/// Absolute unix paths with two or more segments, home paths and Windows paths.
static PATHS: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r#"(?:(?:^|[\s(\[{"'`=,;])(?:/(?:[\w.@+-]+/)+[\w.@+-]*|/(?:home|root|tmp|var|etc|usr|opt|work|Users|srv|mnt|proc|dev)\b[\w./@+-]*|~/[\w./@+-]*)|\b[A-Za-z]:\\[^\s"'`]*)"#,
    )
});
static FINGERPRINT_CONTEXT: LazyLock<Regex> = LazyLock::new(|| {
    re(r"(?i)\b((?:fingerprint|key(?:\s*id)?)\s*(?:ending in|is|:|=)?\s*`?)(0x)?([0-9A-F]{8,})\b")
});
static FINGERPRINT_SHA: LazyLock<Regex> =
    LazyLock::new(|| re(r"\b(SHA256|SHA1|MD5):([A-Za-z0-9+/]{16,}=*)"));
static FINGERPRINT_HEX: LazyLock<Regex> =
    LazyLock::new(|| re(r"\b(?:[0-9a-fA-F]{2}:){7,}[0-9a-fA-F]{2}\b"));

/// Redacts text for a channel, knowing the exact secret values rover holds.
///
/// Clones share one set: a secret learned later (a GitHub App installation token minted while
/// the daemon runs, see `github::app`) is hidden by every clone from then on.
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    held: LiveSecrets,
}

impl Redactor {
    /// `secrets`: exact values never to disclose, their variables unknown (tests, callers with
    /// bare values). Values shorter than `secrets::MIN_SECRET_CHARS` are ignored (too likely
    /// to appear innocently).
    pub fn new<I, S>(secrets: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut held = HeldSecrets::new();
        for value in secrets {
            held.add("", &value.into());
        }
        Self::from_held(held)
    }

    /// Over the secrets rover holds (the daemon collects them: `secrets::HeldSecrets`); the
    /// push scan reads the same set through [`Redactor::held`].
    pub fn from_held(held: HeldSecrets) -> Self {
        Self {
            held: LiveSecrets::new(held),
        }
    }

    /// Over a shared set that grows while rover runs (see [`LiveSecrets`]).
    pub fn from_live(held: LiveSecrets) -> Self {
        Self { held }
    }

    /// The exact secret values this redactor hides, as of now.
    pub fn held(&self) -> HeldSecrets {
        self.held.snapshot()
    }

    /// The shared set itself, to hold secrets learned later (every clone sees them).
    pub fn live(&self) -> &LiveSecrets {
        &self.held
    }

    /// `text` with the exact values rover holds replaced, and nothing else changed: for text
    /// that must stay as it is but for secrets (an agent's prompt, a diff it reads).
    pub fn redact_held(&self, text: &str) -> String {
        self.held.mask_values(text)
    }

    /// Redact `text` for a channel of `visibility`.
    pub fn redact(&self, text: &str, visibility: Visibility) -> String {
        let mut out = self.held.mask_values(text);
        out = PEM.replace_all(&out, SECRET).into_owned();
        out = crate::secrets::key_shape_pattern()
            .replace_all(&out, SECRET)
            .into_owned();
        out = BEARER
            .replace_all(&out, |c: &Captures| format!("{}{}{SECRET}", &c[1], &c[2]))
            .into_owned();
        if visibility == Visibility::Public {
            out = ENV_LINE.replace_all(&out, ENV).into_owned();
        }
        out = SECRET_ASSIGN
            .replace_all(&out, |c: &Captures| format!("{}{}{SECRET}", &c[1], &c[2]))
            .into_owned();
        if visibility == Visibility::Public {
            out = PATHS
                .replace_all(&out, |c: &Captures| {
                    let m = &c[0];
                    let lead: String = m
                        .chars()
                        .take_while(|ch| !matches!(ch, '/' | '~') && !ch.is_ascii_alphabetic())
                        .collect();
                    if lead.is_empty() && m.chars().nth(1) == Some(':') {
                        PATH.to_owned()
                    } else {
                        format!("{lead}{PATH}")
                    }
                })
                .into_owned();
            out = FINGERPRINT_SHA
                .replace_all(&out, |c: &Captures| format!("{}:{}", &c[1], last4(&c[2])))
                .into_owned();
            out = FINGERPRINT_HEX
                .replace_all(&out, |c: &Captures| last4(&c[0]))
                .into_owned();
            out = FINGERPRINT_CONTEXT
                .replace_all(&out, |c: &Captures| format!("{}{}", &c[1], last4(&c[3])))
                .into_owned();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_compile() {
        for r in [
            &PEM,
            &BEARER,
            &SECRET_ASSIGN,
            &ENV_LINE,
            &PATHS,
            &FINGERPRINT_CONTEXT,
            &FINGERPRINT_SHA,
            &FINGERPRINT_HEX,
        ] {
            assert!(!r.as_str().is_empty());
        }
    }

    const TOKEN: &str = "s3cr3t-configured-value";

    /// (input, must appear in public, must not appear in public, must appear in private, must not appear in private)
    #[allow(clippy::type_complexity, reason = "a plain table reads best")]
    const TABLE: &[(&str, &[&str], &[&str], &[&str], &[&str])] = &[
        (
            "push failed with s3cr3t-configured-value in the url",
            &["push failed with", SECRET],
            &[TOKEN],
            &[SECRET],
            &[TOKEN],
        ),
        (
            "token ghp_abcdefghijklmnopqrstuvwxyz0123456789 and github_pat_11ABCDEFG0123456789_abcdefghijklmnop",
            &[SECRET],
            &["ghp_abc", "github_pat_11"],
            &[SECRET],
            &["ghp_abc", "github_pat_11"],
        ),
        (
            "keys sk-ant-api03-AbCdEfGhIjKlMnOp and sk-proj-AbCdEfGhIjKlMnOpQrSt and AKIAIOSFODNN7EXAMPLE",
            &[SECRET],
            &["sk-ant-api03", "sk-proj-", "AKIAIOSFODNN7EXAMPLE"],
            &[SECRET],
            &["sk-ant-api03", "sk-proj-", "AKIAIOSFODNN7EXAMPLE"],
        ),
        (
            "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\nafter",
            &[SECRET, "after"],
            &["b3BlbnNzaC1rZXktdjEAAAAA", "BEGIN OPENSSH"],
            &[SECRET, "after"],
            &["b3BlbnNzaC1rZXktdjEAAAAA"],
        ),
        (
            "HOME=/root\nPATH=/usr/bin:/bin\nANTHROPIC_API_KEY=abc123def456\nexit 1",
            &[ENV, "exit 1"],
            &["/root", "/usr/bin", "abc123def456", "ANTHROPIC_API_KEY"],
            &["HOME=/root", "PATH=/usr/bin:/bin", "ANTHROPIC_API_KEY=[redacted secret]", "exit 1"],
            &["abc123def456"],
        ),
        (
            "error: cannot open /work/wt-1/src/main.rs (see ~/.config/rover) or C:\\Users\\me\\x.txt",
            &["error: cannot open", PATH],
            &["/work/wt-1", "~/.config", "C:\\Users"],
            &["/work/wt-1/src/main.rs", "~/.config/rover"],
            &[SECRET],
        ),
        (
            "Commit signing failed. GPG key ABC123DEF456 not found; ssh SHA256:nThbg6kXUpJWGl7E1IGOCspRomTxdCARLviKw6E5SY8",
            &["GPG key …F456", "SHA256:…5SY8"],
            &["ABC123DEF456", "nThbg6kXUpJWGl7E1IGOCspRomTxdCARLviKw6E5SY8"],
            &["ABC123DEF456", "SHA256:nThbg6kXUpJWGl7E1IGOCspRomTxdCARLviKw6E5SY8"],
            &[SECRET],
        ),
        (
            "Opened https://github.com/o/r/pull/12 from rover/abc-fix; tests in src/parse.rs pass",
            &["https://github.com/o/r/pull/12", "rover/abc-fix", "src/parse.rs"],
            &[PATH, SECRET],
            &["https://github.com/o/r/pull/12", "src/parse.rs"],
            &[PATH, SECRET],
        ),
        (
            "curl -H 'Authorization: Bearer abcdefghijklmnop1234' failed; password: hunter22",
            &["Bearer [redacted secret]", "password: [redacted secret]"],
            &["abcdefghijklmnop1234", "hunter22"],
            &["failed; password: [redacted secret]"],
            &["abcdefghijklmnop1234", "hunter22"],
        ),
        (
            "author: @alice; it takes ~5 minutes; monkey: banana; see owner/repo#3",
            &["author: @alice", "~5 minutes", "monkey: banana", "owner/repo#3"],
            &[SECRET, PATH],
            &["author: @alice", "~5 minutes", "monkey: banana"],
            &[SECRET, PATH],
        ),
        (
            "config: GITHUB_TOKEN=abcdef123456 api_key: 'zzzzzzzz' SSH_KEY=/k",
            &[SECRET],
            &["abcdef123456", "zzzzzzzz"],
            &["GITHUB_TOKEN=[redacted secret]", "api_key: '[redacted secret]"],
            &["abcdef123456", "zzzzzzzz", "SSH_KEY=/k"],
        ),
    ];

    /// A prompt keeps everything (paths, fixtures an agent must see) but the values rover holds.
    #[test]
    fn redact_held_replaces_only_the_held_values() {
        let r = Redactor::new(["held-value-123456"]);
        let text = "+KEY=held-value-123456\n+path /home/dev/x and AKIAIOSFODNN7EXAMPLE";
        assert_eq!(
            r.redact_held(text),
            "+KEY=[redacted secret]\n+path /home/dev/x and AKIAIOSFODNN7EXAMPLE"
        );
        assert_eq!(r.held().len(), 1);
    }

    #[test]
    fn redaction_table_for_both_visibilities() {
        let r = Redactor::new([TOKEN, "abc"]);
        for (input, pub_has, pub_not, priv_has, priv_not) in TABLE {
            for (vis, has, not) in [
                (Visibility::Public, pub_has, pub_not),
                (Visibility::Private, priv_has, priv_not),
            ] {
                let out = r.redact(input, vis);
                for h in *has {
                    assert!(
                        out.contains(h),
                        "{vis:?}: expected {h:?} in {out:?} (from {input:?})"
                    );
                }
                for n in *not {
                    assert!(
                        !out.contains(n),
                        "{vis:?}: did not expect {n:?} in {out:?} (from {input:?})"
                    );
                }
            }
        }
    }
}
