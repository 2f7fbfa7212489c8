//! What rover counts as a secret: the exact values it holds (the GitHub token, the webhook
//! secret, model keys, what enters a sandbox), each known by the variable it came from, and the
//! shapes of keys (GitHub tokens, `sk-ant-…`, AWS keys, private keys, ...). The one source for
//! redaction (`github::redact`) and for the scan of what a push would send (`git::scan`).

use std::fmt;
use std::sync::LazyLock;

use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::host_env::HostEnv;

/// What replaces a secret in text rover writes or sends.
pub const SECRET: &str = "[redacted secret]";

/// Values shorter than this are not held (too likely to appear innocently).
pub const MIN_SECRET_CHARS: usize = 8;

/// The model credentials rover may hand to an agent; their values are always held.
pub const MODEL_KEY_ENV: &[&str] = &[
    "ANTHROPIC_API_KEY",
    "CLAUDE_CODE_OAUTH_TOKEN",
    "OPENAI_API_KEY",
    "CODEX_API_KEY",
];

/// Words that make a variable name a secret's (`GITHUB_TOKEN`, `DB_PASSWORD`, `*_API_KEY`).
const SECRET_NAME_WORDS: &[&str] = &[
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "API_KEY",
    "APIKEY",
    "PRIVATE_KEY",
    "ACCESS_KEY",
    "CREDENTIAL",
];

/// Whether a variable's name says it holds a secret.
pub fn name_looks_secret(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    SECRET_NAME_WORDS.iter().any(|w| upper.contains(w)) || upper.ends_with("_KEY")
}

/// Whether a variable looks secret: by its name, or because its whole value is key-shaped.
pub fn looks_secret(name: &str, value: &str) -> bool {
    name_looks_secret(name) || KeyShape::of_whole(value.trim()).is_some()
}

/// Whether a value could be a secret rather than a placeholder or a word (`undefined`,
/// `changeme`, `false`): no whitespace, and at least two of lower case, upper case, digits and
/// other characters.
pub fn could_be_secret(value: &str) -> bool {
    let value = value.trim();
    let classes = [
        value.chars().any(|c| c.is_ascii_lowercase()),
        value.chars().any(|c| c.is_ascii_uppercase()),
        value.chars().any(|c| c.is_ascii_digit()),
        value.chars().any(|c| !c.is_ascii_alphanumeric()),
    ];
    !value.chars().any(char::is_whitespace) && classes.iter().filter(|c| **c).count() >= 2
}

/// One secret value rover holds and the variable it came from (`Debug` never shows the value).
#[derive(Clone, PartialEq, Eq)]
pub struct HeldSecret {
    name: String,
    value: String,
}

impl HeldSecret {
    /// The variable the value came from (`ANTHROPIC_API_KEY`); empty when unknown.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn value(&self) -> &str {
        &self.value
    }

    /// What the secret is, for a message: `the value of ANTHROPIC_API_KEY`.
    pub fn describe(&self) -> String {
        describe_held(&self.name)
    }
}

/// `the value of NAME`, or `a secret rover holds` when the name is unknown.
pub fn describe_held(name: &str) -> String {
    if name.is_empty() {
        "a secret rover holds".to_owned()
    } else {
        format!("the value of {name}")
    }
}

impl fmt::Debug for HeldSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HeldSecret({:?}, {SECRET})", self.name)
    }
}

/// The exact secret values rover holds, longest first (so a secret containing another is
/// replaced whole), each value once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeldSecrets {
    list: Vec<HeldSecret>,
}

impl HeldSecrets {
    pub fn new() -> HeldSecrets {
        HeldSecrets::default()
    }

    /// Holds `value` as the secret of variable `name` (empty: unknown). A value shorter than
    /// [`MIN_SECRET_CHARS`] (trimmed) is ignored; a value already held keeps its first name.
    pub fn add(&mut self, name: &str, value: &str) {
        let value = value.trim();
        if value.chars().count() < MIN_SECRET_CHARS || self.list.iter().any(|s| s.value == value) {
            return;
        }
        let at = self
            .list
            .iter()
            .position(|s| s.value.len() < value.len())
            .unwrap_or(self.list.len());
        self.list.insert(
            at,
            HeldSecret {
                name: name.to_owned(),
                value: value.to_owned(),
            },
        );
    }

    /// [`HeldSecrets::add`] for a value that may be missing.
    #[must_use]
    pub fn with(mut self, name: &str, value: Option<&str>) -> HeldSecrets {
        if let Some(value) = value {
            self.add(name, value);
        }
        self
    }

    /// Holds the values of the variables `names` that are set in rover's environment (`host`).
    #[must_use]
    pub fn with_env(mut self, names: &[&str], host: &HostEnv) -> HeldSecrets {
        for name in names {
            if let Some(value) = host.var(name) {
                self.add(name, &value);
            }
        }
        self
    }

    /// Holds the values of the variables `names` that are set and look secret ([`looks_secret`]):
    /// what `autopilot.sandbox.envAllow` lets into a sandbox.
    #[must_use]
    pub fn with_env_if_secret(mut self, names: &[String], host: &HostEnv) -> HeldSecrets {
        for name in names {
            if let Some(value) = host.var(name) {
                if looks_secret(name, &value) {
                    self.add(name, &value);
                }
            }
        }
        self
    }

    /// Holds the value of every variable of rover's environment (`host`) whose name says it is
    /// a secret ([`name_looks_secret`]) and whose value could be one ([`could_be_secret`]: these
    /// names are guessed, and a held value refuses every push that adds it).
    #[must_use]
    pub fn with_secret_env(mut self, host: &HostEnv) -> HeldSecrets {
        for (name, value) in host.vars() {
            if name_looks_secret(name) && could_be_secret(value) {
                self.add(name, value);
            }
        }
        self
    }

    pub fn iter(&self) -> impl Iterator<Item = &HeldSecret> {
        self.list.iter()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// `text` with every held value replaced by [`SECRET`].
    pub fn mask_values(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for s in &self.list {
            if out.contains(s.value.as_str()) {
                out = out.replace(s.value.as_str(), SECRET);
            }
        }
        out
    }

    /// `text` with every held value and every key-shaped string replaced by [`SECRET`]: what
    /// rover may write about a place that held a secret (a path, a branch name).
    pub fn mask(&self, text: &str) -> String {
        KEY_SHAPES
            .replace_all(&self.mask_values(text), SECRET)
            .into_owned()
    }
}

/// A [`HeldSecrets`] shared by its clones and grown while rover runs: the installation tokens
/// of a GitHub App are minted hourly, and each is held from the moment it exists. `Debug` never
/// shows a value.
#[derive(Debug, Clone, Default)]
pub struct LiveSecrets {
    // std RwLock: held only to read or push a value, never across an await.
    inner: std::sync::Arc<std::sync::RwLock<HeldSecrets>>,
}

impl LiveSecrets {
    pub fn new(held: HeldSecrets) -> LiveSecrets {
        LiveSecrets {
            inner: std::sync::Arc::new(std::sync::RwLock::new(held)),
        }
    }

    /// Holds `value` as the secret of `name` from now on, for every clone.
    pub fn add(&self, name: &str, value: &str) {
        self.inner
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .add(name, value);
    }

    /// Stops holding `value` (an installation token long expired).
    pub fn remove(&self, value: &str) {
        self.inner
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .list
            .retain(|s| s.value != value.trim());
    }

    /// The values held now.
    pub fn snapshot(&self) -> HeldSecrets {
        self.inner
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// [`HeldSecrets::mask_values`] over the values held now.
    pub fn mask_values(&self, text: &str) -> String {
        self.inner
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .mask_values(text)
    }
}

/// A kind of key recognised by its shape (`meta` spells it in camelCase: `githubToken`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum KeyShape {
    /// The first line of a PEM private key (`-----BEGIN ... PRIVATE KEY-----`).
    PrivateKey,
    /// `ghp_`, `gho_`, `ghu_`, `ghs_`, `ghr_`, `github_pat_`.
    GithubToken,
    /// `sk-ant-…` (API keys and OAuth tokens).
    AnthropicKey,
    /// `sk-…`, `sk-proj-…`.
    OpenaiKey,
    /// `AKIA…` / `ASIA…` access key ids.
    AwsAccessKey,
    /// `xoxb-`, `xoxp-`, ...
    SlackToken,
    /// `AIza…`.
    GoogleApiKey,
    /// Three base64url parts, the first a JSON header (`eyJ…`).
    Jwt,
}

impl KeyShape {
    /// Every shape, in the order the pattern tries them.
    pub const ALL: [KeyShape; 8] = [
        KeyShape::PrivateKey,
        KeyShape::GithubToken,
        KeyShape::AnthropicKey,
        KeyShape::OpenaiKey,
        KeyShape::AwsAccessKey,
        KeyShape::SlackToken,
        KeyShape::GoogleApiKey,
        KeyShape::Jwt,
    ];

    /// The capture group of the shape in [`KEY_SHAPES`].
    fn group(self) -> &'static str {
        match self {
            KeyShape::PrivateKey => "pem",
            KeyShape::GithubToken => "github",
            KeyShape::AnthropicKey => "anthropic",
            KeyShape::OpenaiKey => "openai",
            KeyShape::AwsAccessKey => "aws",
            KeyShape::SlackToken => "slack",
            KeyShape::GoogleApiKey => "google",
            KeyShape::Jwt => "jwt",
        }
    }

    /// What it is, for a message: `a GitHub token shape`.
    pub fn describe(self) -> &'static str {
        match self {
            KeyShape::PrivateKey => "a private key (PEM) shape",
            KeyShape::GithubToken => "a GitHub token shape",
            KeyShape::AnthropicKey => "an Anthropic key shape",
            KeyShape::OpenaiKey => "an OpenAI key shape",
            KeyShape::AwsAccessKey => "an AWS access key shape",
            KeyShape::SlackToken => "a Slack token shape",
            KeyShape::GoogleApiKey => "a Google API key shape",
            KeyShape::Jwt => "a JWT shape",
        }
    }

    /// Every key-shaped string of `text`: its shape and byte range, left to right.
    pub fn find_all(text: &str) -> Vec<(KeyShape, std::ops::Range<usize>)> {
        KEY_SHAPES
            .captures_iter(text)
            .filter_map(|c| {
                let whole = c.get(0)?;
                let shape = KeyShape::ALL
                    .into_iter()
                    .find(|s| c.name(s.group()).is_some())?;
                Some((shape, whole.range()))
            })
            .collect()
    }

    /// The shape of `value` when the whole of it is one key.
    pub fn of_whole(value: &str) -> Option<KeyShape> {
        match KeyShape::find_all(value).as_slice() {
            [(shape, range)] if range.start == 0 && range.end == value.len() => Some(*shape),
            _ => None,
        }
    }
}

fn re(pattern: &str) -> Regex {
    Regex::new(pattern).expect("secret patterns are valid, checked by the tests")
}

/// Every key shape in one pattern, one named group each; at a position the first that matches
/// wins (`sk-ant-` before `sk-`).
pub(crate) static KEY_SHAPES: LazyLock<Regex> = LazyLock::new(|| {
    re(concat!(
        r"(?P<pem>-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----)",
        r"|\b(?P<github>gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})",
        r"|\b(?P<anthropic>sk-ant-[A-Za-z0-9_-]{10,})",
        r"|\b(?P<openai>sk-(?:proj-)?[A-Za-z0-9_-]{16,})",
        r"|\b(?P<aws>(?:AKIA|ASIA)[0-9A-Z]{16})\b",
        r"|\b(?P<slack>xox[abprs]-[A-Za-z0-9-]{10,})",
        r"|\b(?P<google>AIza[0-9A-Za-z_-]{35})",
        r"|\b(?P<jwt>eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,})",
    ))
});

/// The key-shape pattern (every shape), for a caller that replaces matches.
pub fn key_shape_pattern() -> &'static Regex {
    &KEY_SHAPES
}

/// A short hint at a key-shaped string that is not itself secret: `…` and its last 4
/// characters, for a string of 16 characters or more (none for shorter ones).
pub fn hint(value: &str) -> Option<String> {
    let chars: Vec<char> = value.chars().collect();
    (chars.len() >= 16).then(|| last4(value))
}

/// `…` and the last 4 characters of `s`.
pub fn last4(s: &str) -> String {
    let chars: Vec<char> = s.chars().collect();
    let tail: String = chars[chars.len().saturating_sub(4)..].iter().collect();
    format!("…{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_shape_is_recognised_and_named() {
        let cases = [
            ("-----BEGIN OPENSSH PRIVATE KEY-----", KeyShape::PrivateKey),
            (
                "-----BEGIN PGP PRIVATE KEY BLOCK-----",
                KeyShape::PrivateKey,
            ),
            ("-----BEGIN PRIVATE KEY-----", KeyShape::PrivateKey),
            (
                "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
                KeyShape::GithubToken,
            ),
            (
                "github_pat_11ABCDEFG0123456789_abcdefghijklmnop",
                KeyShape::GithubToken,
            ),
            ("sk-ant-api03-AbCdEfGhIjKlMnOp", KeyShape::AnthropicKey),
            ("sk-ant-oat01-AbCdEfGhIjKlMnOp", KeyShape::AnthropicKey),
            ("sk-proj-AbCdEfGhIjKlMnOpQrSt", KeyShape::OpenaiKey),
            ("AKIAIOSFODNN7EXAMPLE", KeyShape::AwsAccessKey),
            ("xoxb-1234567890-abcdef", KeyShape::SlackToken),
            (
                "AIzaSyA1234567890abcdefghijklmnopqrstuv",
                KeyShape::GoogleApiKey,
            ),
            (
                "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NSJ9.abcdefghijklmnop",
                KeyShape::Jwt,
            ),
        ];
        for (text, shape) in cases {
            assert_eq!(KeyShape::of_whole(text), Some(shape), "{text}");
            let found = KeyShape::find_all(&format!("x = \"{text}\";"));
            assert_eq!(found.len(), 1, "{text}: {found:?}");
            assert_eq!(found[0].0, shape);
        }
        for text in [
            "-----BEGIN CERTIFICATE-----",
            "ghp_short",
            "task-ant-abcdefghijklmnop",
            "monkey",
            "AKIAIOSFODNN7EXAMPLEX",
        ] {
            assert!(KeyShape::find_all(text).is_empty(), "{text}");
        }
    }

    #[test]
    fn held_values_are_longest_first_once_and_never_short() {
        let held = HeldSecrets::new()
            .with("A", Some("short"))
            .with("B", Some("a-longer-secret"))
            .with("C", Some("a-longer-secret-still"))
            .with("D", Some("a-longer-secret"))
            .with("E", None);
        let names: Vec<&str> = held.iter().map(HeldSecret::name).collect();
        assert_eq!(names, ["C", "B"]);
        assert_eq!(
            held.mask_values("x a-longer-secret-still y a-longer-secret"),
            format!("x {SECRET} y {SECRET}")
        );
        let debug = format!("{held:?}");
        assert!(!debug.contains("a-longer-secret"), "{debug}");
        assert_eq!(held.iter().next().unwrap().describe(), "the value of C");
    }

    #[test]
    fn a_variable_looks_secret_by_its_name_or_its_whole_value() {
        assert!(name_looks_secret("ANTHROPIC_API_KEY"));
        assert!(name_looks_secret("CLAUDE_CODE_OAUTH_TOKEN"));
        assert!(name_looks_secret("db_password"));
        assert!(name_looks_secret("MY_SERVICE_KEY"));
        assert!(!name_looks_secret("HOME"));
        assert!(!name_looks_secret("ANTHROPIC_BASE_URL"));
        assert!(!name_looks_secret("MONKEY"));
        assert!(looks_secret(
            "DEPLOY",
            "ghp_abcdefghijklmnopqrstuvwxyz0123456789"
        ));
        assert!(!looks_secret(
            "SCRIPT",
            "{\"token\": \"ghp_abcdefghijklmnopqrstuvwxyz0123456789\"}"
        ));
    }

    #[test]
    fn guessed_secret_variables_hold_only_values_that_could_be_secrets() {
        let host = HostEnv::from_pairs([
            ("ROVER_TEST_TOKEN", "s3cret-Value-for-test"),
            ("ROVER_TEST_SECRET", "undefined"),
        ]);
        let held = HeldSecrets::new().with_secret_env(&host);
        let names: Vec<&str> = held.iter().map(HeldSecret::name).collect();
        assert_eq!(names, ["ROVER_TEST_TOKEN"]);
        assert!(could_be_secret("hunter22"));
        assert!(!could_be_secret("changeme"));
        assert!(!could_be_secret("two words 123"));
    }

    #[test]
    fn mask_hides_values_and_shapes_and_hints_keep_four_characters() {
        let held = HeldSecrets::new().with("K", Some("plain-secret-value"));
        assert_eq!(
            held.mask("notes/plain-secret-value/ghp_abcdefghijklmnopqrstuvwxyz0123456789.txt"),
            format!("notes/{SECRET}/{SECRET}.txt")
        );
        assert_eq!(
            hint("ghp_abcdefghijklmnopqrstuvwxyz0123456789").as_deref(),
            Some("…6789")
        );
        assert_eq!(hint("short-one"), None);
    }
}
