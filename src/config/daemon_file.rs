//! The daemon file: the repositories one `rover autopilot start` serves, when it runs outside a
//! checkout (`--config FILE`, default `~/.config/rover/daemon.json`, or under
//! `$XDG_CONFIG_HOME`):
//!
//! ```json
//! {
//!   "repositories": [
//!     "octo-org/api",
//!     {"repo": "octo-org/web", "checkout": "/srv/checkouts/web"},
//!     {"repo": "tools/lint", "apiUrl": "https://ghe.example.com/api/v3"},
//!     {"repo": "octo-org/docs", "cloneUrl": "/srv/mirrors/docs.git"}
//!   ]
//! }
//! ```
//!
//! An entry is `owner/name`, or an object with `repo` and, optionally, `checkout` (the clone
//! rover works in; relative to the file's folder; default `<data dir>/checkouts/<owner>/<name>`)
//! and `apiUrl` (the REST API of a repository on GitHub Enterprise Server; default the file's
//! own `apiUrl`, else rover's `ROVER_GITHUB_API_URL`), and `cloneUrl` (where rover clones a
//! repository that has no checkout yet; default its GitHub URL). Each repository keeps its own
//! `rover.json`, store and budgets; a top-level `"daemon"` sets the agent slots they share.
//!
//! Or, as a GitHub App, every repository the app is installed on:
//!
//! ```json
//! {
//!   "repositories": "installed",
//!   "app": {"id": 123456, "privateKeyFile": "rover-app.pem"},
//!   "exclude": ["octo-org/sandbox"],
//!   "relistIntervalSecs": 600
//! }
//! ```
//!
//! An unknown key, a malformed name, a repository listed twice, an empty list, or keys that do
//! not go together (`app` with a list, `"installed"` without `app`) is an error that names the
//! line and what to do: nothing is served from a file that does not say what it means.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::DaemonConfig;
use crate::budget::DaemonBudgetSettings;
use crate::host_env::HostEnv;
use crate::orchestrator::SlotSettings;
use crate::project::RepoSlug;

/// Where the daemon file's format is explained.
const SEE: &str = "see docs/configuration.md, \"The daemon file\"";

/// The shortest time between two listings of an app's installations.
pub const MIN_RELIST_SECS: u64 = 30;
/// The time between two listings when the file does not say.
pub const DEFAULT_RELIST_SECS: u64 = 600;

/// The daemon file, read and checked.
#[derive(Debug, Clone)]
pub struct DaemonFile {
    pub path: PathBuf,
    /// The repositories listed (none with `"repositories": "installed"`).
    pub repositories: Vec<ServedRepo>,
    /// The agent slots shared by every repository served, and the scheduler's score.
    pub slots: SlotSettings,
    /// The daemon-wide budget (`"daemon": {"budget": ...}`), above each repository's own.
    pub budget: DaemonBudgetSettings,
    /// With `"repositories": "installed"`: the app whose installations are served.
    pub installed: Option<InstalledConfig>,
}

/// `"repositories": "installed"`: every repository a GitHub App is installed on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstalledConfig {
    pub app_id: u64,
    /// The app's private key (`app.privateKeyFile`, resolved against the file's folder);
    /// `None`: the file `ROVER_GITHUB_APP_KEY_FILE` names.
    pub private_key_file: Option<PathBuf>,
    /// The REST API of the app's GitHub (`None`: rover's own).
    pub api_url: Option<String>,
    /// Repositories not served even though the app is installed on them.
    pub exclude: Vec<RepoSlug>,
    /// How often the installations are listed again.
    pub relist_interval: Duration,
}

impl InstalledConfig {
    /// Whether `slug` is excluded (names are not case-sensitive).
    pub fn excludes(&self, slug: &RepoSlug) -> bool {
        self.exclude.iter().any(|e| same_repo(e, slug))
    }
}

/// One repository the daemon serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedRepo {
    pub slug: RepoSlug,
    /// The clone rover works in (`None`: `<data dir>/checkouts/<owner>/<name>`).
    pub checkout: Option<PathBuf>,
    /// The REST API it is served by (`None`: rover's own).
    pub api_url: Option<String>,
    /// Where it is cloned from when it has no checkout (`cloneUrl`, or an app's listing; `None`:
    /// its GitHub URL).
    pub clone_url: Option<String>,
    /// Served as this installation of a GitHub App (`"repositories": "installed"`).
    pub app: Option<ServedAsApp>,
}

/// The app installation a repository is served as: its tokens are minted for that
/// installation and scoped to the repository.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedAsApp {
    pub app_id: u64,
    pub installation_id: u64,
    pub private_key_file: PathBuf,
}

impl ServedRepo {
    /// `owner/name`.
    pub fn full_name(&self) -> String {
        format!("{}/{}", self.slug.owner, self.slug.name)
    }

    /// The clone rover works in: the entry's `checkout`, else under `data_dir`.
    pub fn checkout_in(&self, data_dir: &Path) -> PathBuf {
        self.checkout.clone().unwrap_or_else(|| {
            data_dir
                .join("checkouts")
                .join(&self.slug.owner)
                .join(&self.slug.name)
        })
    }

    /// Where rover clones it from when it has no checkout: its `cloneUrl`, else its URL on the
    /// GitHub whose REST API is `api_url` (`https://github.com/<owner>/<name>.git`, or
    /// `https://HOST/<owner>/<name>.git` for GitHub Enterprise's `https://HOST/api/v3`).
    pub fn clone_source(&self, api_url: &str) -> String {
        self.clone_url.clone().unwrap_or_else(|| {
            format!(
                "{}/{}/{}.git",
                crate::github::octo::web_url_for(api_url),
                self.slug.owner,
                self.slug.name
            )
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DaemonFileError {
    #[error("cannot read the daemon file {path}: {source} (outside a checkout, rover serves the repositories it lists: write it, or pass --config FILE; {SEE})")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {reason} ({SEE})")]
    Setting { path: PathBuf, reason: String },
    #[error("{path}:{line}:{column}: {reason} ({SEE})")]
    Invalid {
        path: PathBuf,
        line: usize,
        column: usize,
        reason: String,
    },
}

impl crate::error::Kinded for DaemonFileError {
    fn kind(&self) -> crate::error::ErrorKind {
        match self {
            DaemonFileError::Read { source, .. }
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                crate::error::ErrorKind::NotFound
            }
            _ => crate::error::ErrorKind::Config,
        }
    }
}

impl DaemonFile {
    /// The default place: `$XDG_CONFIG_HOME/rover/daemon.json`, else
    /// `$HOME/.config/rover/daemon.json`; `None` without either.
    pub fn default_path(host: &HostEnv) -> Option<PathBuf> {
        let config = host
            .var("XDG_CONFIG_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| host.var("HOME").map(|h| PathBuf::from(h).join(".config")))?;
        Some(config.join("rover").join("daemon.json"))
    }

    /// Reads and checks the file at `path`.
    pub fn load(path: &Path) -> Result<DaemonFile, DaemonFileError> {
        let text = std::fs::read_to_string(path).map_err(|source| DaemonFileError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        // One name for one file, however it was given (`status` finds the daemon serving it).
        let path = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
        DaemonFile::parse(&path, &text)
    }

    /// Checks `text`, the file at `path` (relative checkouts are resolved against its folder).
    pub fn parse(path: &Path, text: &str) -> Result<DaemonFile, DaemonFileError> {
        let raw: Raw = serde_json::from_str(text).map_err(|e| {
            let full = e.to_string();
            let reason = full
                .rfind(" at line ")
                .map_or(full.as_str(), |at| &full[..at])
                .to_owned();
            DaemonFileError::Invalid {
                path: path.to_path_buf(),
                line: e.line(),
                column: e.column(),
                reason,
            }
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        let invalid_at = |key: &str, reason: String| {
            let (line, column) = position_of(text, key);
            DaemonFileError::Invalid {
                path: path.to_path_buf(),
                line,
                column,
                reason,
            }
        };
        let slots = raw
            .daemon
            .slots("daemon")
            .map_err(|reason| DaemonFileError::Setting {
                path: path.to_path_buf(),
                reason,
            })?;
        raw.daemon
            .budget
            .check("daemon")
            .map_err(|reason| DaemonFileError::Setting {
                path: path.to_path_buf(),
                reason,
            })?;
        let budget = raw.daemon.budget.clone();
        if let Some(url) = &raw.api_url {
            check_api_url(url).map_err(|reason| invalid_at("apiUrl", reason))?;
        }
        let api_url = raw.api_url.map(|u| u.trim_end_matches('/').to_owned());
        let Repositories::Listed(listed) = raw.repositories else {
            let Some(app) = raw.app else {
                return Err(invalid_at("repositories", "\"repositories\": \"installed\" serves a GitHub App's installations: name the app, \"app\": {\"id\": APP_ID, \"privateKeyFile\": \"/path/to/key.pem\"}".into()));
            };
            let relist = raw.relist_interval_secs.unwrap_or(DEFAULT_RELIST_SECS);
            if relist < MIN_RELIST_SECS {
                return Err(invalid_at("relistIntervalSecs", format!("\"relistIntervalSecs\" is {relist}: list at most every {MIN_RELIST_SECS} s (a SIGUSR1 or an installation webhook lists at once)")));
            }
            return Ok(DaemonFile {
                path: path.to_path_buf(),
                repositories: Vec::new(),
                slots,
                budget,
                installed: Some(InstalledConfig {
                    app_id: app.id,
                    private_key_file: app.private_key_file.map(|k| base.join(k)),
                    api_url,
                    exclude: raw
                        .exclude
                        .unwrap_or_default()
                        .into_iter()
                        .map(RepoSlug::from)
                        .collect(),
                    relist_interval: Duration::from_secs(relist),
                }),
            });
        };
        for (key, given) in [
            ("app", raw.app.is_some()),
            ("exclude", raw.exclude.is_some()),
            ("relistIntervalSecs", raw.relist_interval_secs.is_some()),
        ] {
            if given {
                return Err(invalid_at(key, format!("\"{key}\" goes with \"repositories\": \"installed\" only: remove it, or serve every repository the app is installed on with \"repositories\": \"installed\"")));
            }
        }
        let repositories = listed
            .into_iter()
            .map(|mut repo| {
                repo.checkout = repo.checkout.map(|c| base.join(c));
                repo.api_url = repo.api_url.or_else(|| api_url.clone());
                repo
            })
            .collect();
        Ok(DaemonFile {
            path: path.to_path_buf(),
            repositories,
            slots,
            budget,
            installed: None,
        })
    }
}

/// Line and column (1-based) of the first `"key":` in `text`, else of its start: a check of
/// keys that go together points at the key to change.
fn position_of(text: &str, key: &str) -> (usize, usize) {
    let quoted = format!("\"{key}\"");
    let mut from = 0;
    while let Some(found) = text[from..].find(&quoted) {
        let at = from + found;
        let after = text[at + quoted.len()..].trim_start();
        if after.starts_with(':') {
            let before = &text[..at];
            let line = before.matches('\n').count() + 1;
            let column = before.len() - before.rfind('\n').map_or(0, |n| n + 1) + 1;
            return (line, column);
        }
        from = at + quoted.len();
    }
    (1, 1)
}

fn check_api_url(url: &str) -> Result<(), String> {
    if url.starts_with("https://") || url.starts_with("http://") {
        Ok(())
    } else {
        Err(format!("\"apiUrl\" {url:?} is not an http(s) URL: write the REST API's base, such as https://ghe.example.com/api/v3"))
    }
}

/// The file as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Raw {
    repositories: Repositories,
    #[serde(default)]
    daemon: DaemonConfig,
    #[serde(default)]
    app: Option<RawApp>,
    #[serde(default)]
    api_url: Option<String>,
    #[serde(default)]
    exclude: Option<Vec<Excluded>>,
    #[serde(default)]
    relist_interval_secs: Option<u64>,
}

/// `"app"`: the GitHub App whose installations are served.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawApp {
    id: u64,
    #[serde(default)]
    private_key_file: Option<PathBuf>,
}

/// One name of `"exclude"`, checked as it is read.
struct Excluded(RepoSlug);

impl<'de> Deserialize<'de> for Excluded {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        slug(&name).map(Excluded)
    }
}

impl From<Excluded> for RepoSlug {
    fn from(e: Excluded) -> RepoSlug {
        e.0
    }
}

/// The list, each entry checked as it is read so an error has its line; or `"installed"`.
enum Repositories {
    Listed(Vec<ServedRepo>),
    Installed,
}

impl<'de> Deserialize<'de> for Repositories {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(RepositoriesVisitor)
    }
}

struct RepositoriesVisitor;

impl<'de> Visitor<'de> for RepositoriesVisitor {
    type Value = Repositories;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of repositories (\"owner/name\" or {\"repo\": \"owner/name\", ...})")
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<Repositories, E> {
        if value == "installed" {
            return Ok(Repositories::Installed);
        }
        Err(E::custom(format!(
            "\"repositories\" is {value:?}: it takes a list of repositories, or \"installed\" (every repository a GitHub App is installed on)"
        )))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Repositories, A::Error> {
        let mut repos: Vec<ServedRepo> = Vec::new();
        // Each entry is checked against those before it while it is read, so a repository
        // listed twice is refused on its own line.
        while let Some(Entry(repo)) = seq.next_element_seed(EntryVisitor { before: &repos })? {
            repos.push(repo);
        }
        if repos.is_empty() {
            return Err(de::Error::custom(
                "\"repositories\" lists no repository: name at least one (\"owner/name\")",
            ));
        }
        Ok(Repositories::Listed(repos))
    }
}

/// GitHub's names are not case-sensitive.
fn same_repo(a: &RepoSlug, b: &RepoSlug) -> bool {
    a.owner.eq_ignore_ascii_case(&b.owner) && a.name.eq_ignore_ascii_case(&b.name)
}

/// One entry: `"owner/name"` or an object.
struct Entry(ServedRepo);

/// The object form of an entry.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct EntryFields {
    repo: String,
    #[serde(default)]
    checkout: Option<PathBuf>,
    #[serde(default)]
    api_url: Option<String>,
    #[serde(default)]
    clone_url: Option<String>,
}

/// Reads one entry, refusing one listed `before`.
struct EntryVisitor<'a> {
    before: &'a [ServedRepo],
}

impl<'de> de::DeserializeSeed<'de> for EntryVisitor<'_> {
    type Value = Entry;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Entry, D::Error> {
        d.deserialize_any(self)
    }
}

impl EntryVisitor<'_> {
    fn entry<E: de::Error>(&self, repo: ServedRepo) -> Result<Entry, E> {
        if self.before.iter().any(|r| same_repo(&r.slug, &repo.slug)) {
            return Err(E::custom(format!(
                "{} is listed twice: list each repository once",
                repo.full_name()
            )));
        }
        Ok(Entry(repo))
    }
}

fn slug<E: de::Error>(value: &str) -> Result<RepoSlug, E> {
    RepoSlug::parse(value).map_err(|_| {
        E::custom(format!(
            "{value:?} is not a repository: write it as \"owner/name\""
        ))
    })
}

impl<'de> Visitor<'de> for EntryVisitor<'_> {
    type Value = Entry;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(
            "a repository: \"owner/name\" or {\"repo\": \"owner/name\", \"checkout\": \"/path\"}",
        )
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<Entry, E> {
        self.entry(ServedRepo {
            slug: slug(value)?,
            checkout: None,
            api_url: None,
            clone_url: None,
            app: None,
        })
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Entry, A::Error> {
        let fields = EntryFields::deserialize(de::value::MapAccessDeserializer::new(map))?;
        if let Some(url) = &fields.api_url {
            check_api_url(url).map_err(de::Error::custom)?;
        }
        if fields
            .clone_url
            .as_ref()
            .is_some_and(|u| u.trim().is_empty())
        {
            return Err(de::Error::custom(
                "\"cloneUrl\" is empty: write where to clone the repository from (a URL or a path), or leave the key out to clone it from GitHub",
            ));
        }
        self.entry(ServedRepo {
            slug: slug(&fields.repo)?,
            checkout: fields.checkout,
            api_url: fields.api_url.map(|u| u.trim_end_matches('/').to_owned()),
            clone_url: fields.clone_url.map(|u| u.trim().to_owned()),
            app: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<DaemonFile, DaemonFileError> {
        DaemonFile::parse(Path::new("/etc/rover/daemon.json"), text)
    }

    fn invalid(text: &str) -> (usize, String) {
        match parse(text).expect_err("refused") {
            DaemonFileError::Invalid { line, reason, .. } => (line, reason),
            other @ (DaemonFileError::Read { .. } | DaemonFileError::Setting { .. }) => {
                panic!("not an invalid file: {other}")
            }
        }
    }

    #[test]
    fn names_and_objects_are_served_with_their_settings() {
        let file = parse(
            r#"{"repositories": [
                "octo-org/api",
                {"repo": "octo-org/web", "checkout": "web"},
                {"repo": "tools/lint", "apiUrl": "https://ghe.example.com/api/v3/"}
            ]}"#,
        )
        .expect("valid");
        let names: Vec<String> = file
            .repositories
            .iter()
            .map(ServedRepo::full_name)
            .collect();
        assert_eq!(names, ["octo-org/api", "octo-org/web", "tools/lint"]);
        assert_eq!(
            file.repositories[1].checkout.as_deref(),
            Some(Path::new("/etc/rover/web"))
        );
        assert_eq!(
            file.repositories[0].checkout_in(Path::new("/data")),
            Path::new("/data/checkouts/octo-org/api")
        );
        assert_eq!(
            file.repositories[2].api_url.as_deref(),
            Some("https://ghe.example.com/api/v3")
        );
    }

    #[test]
    fn each_mistake_names_its_line_and_what_to_do() {
        let (line, reason) = invalid("{\"repositories\": [\n  \"a/b\",\n  \"a/b\"\n]}");
        assert_eq!(line, 3);
        assert!(reason.contains("a/b is listed twice"), "{reason}");
        let (line, reason) = invalid("{\"repositories\": [\n  \"a/b\",\n  \"A/B\"\n]}");
        assert_eq!(line, 3, "names are not case-sensitive: {reason}");
        let (line, reason) = invalid("{\"repositories\": [\n  \"a/b\",\n  \"not a name\"\n]}");
        assert_eq!(line, 3);
        assert!(reason.contains("\"owner/name\""), "{reason}");
        let (line, reason) = invalid(
            "{\"repositories\": [\n  \"a/b\",\n  {\"repo\": \"c/d\", \"chekout\": \"x\"}\n]}",
        );
        assert_eq!(line, 3);
        assert!(reason.contains("unknown field `chekout`"), "{reason}");
        let (line, reason) = invalid("{\n  \"repositories\": [\"a/b\"],\n  \"maxRunz\": 2\n}");
        assert_eq!(line, 3);
        assert!(reason.contains("unknown field `maxRunz`"), "{reason}");
        let (_, reason) = invalid("{\"repositories\": []}");
        assert!(reason.contains("lists no repository"), "{reason}");
        let (_, reason) = invalid("{\"repositories\": \"every\"}");
        assert!(reason.contains("or \"installed\""), "{reason}");
        let (_, reason) = invalid("{}");
        assert!(reason.contains("missing field `repositories`"), "{reason}");
        let (_, reason) = invalid(r#"{"repositories": [{"repo": "a/b", "apiUrl": "ghe"}]}"#);
        assert!(reason.contains("not an http(s) URL"), "{reason}");
        let (line, reason) =
            invalid("{\"repositories\": [\n  {\"repo\": \"a/b\", \"cloneUrl\": \" \"}\n]}");
        assert_eq!(line, 2);
        assert!(reason.contains("\"cloneUrl\" is empty"), "{reason}");
        let (_, reason) = invalid(r#"{"repositories": [{"repo": "a/b", "cloneUrl": 7}]}"#);
        assert!(reason.contains("expected a string"), "{reason}");
        let (_, reason) = invalid(r#"{"repositories": [{"repo": "a/b", "cloneURL": "x"}]}"#);
        assert!(reason.contains("unknown field `cloneURL`"), "{reason}");
        let shown = parse("{\"repositories\": [\"a/b\", \"a/b\"]}")
            .expect_err("refused")
            .to_string();
        assert!(
            shown.starts_with("/etc/rover/daemon.json:1:"),
            "the path and line lead: {shown}"
        );
    }

    #[test]
    fn a_repository_is_cloned_from_its_clone_url_else_from_its_github() {
        let file = parse(
            r#"{"repositories": [
                "octo-org/api",
                {"repo": "tools/lint", "apiUrl": "https://ghe.example.com/api/v3"},
                {"repo": "octo-org/docs", "cloneUrl": " file:///srv/mirrors/docs.git "}
            ]}"#,
        )
        .expect("valid");
        let [api, lint, docs] = &file.repositories[..] else {
            panic!("three repositories");
        };
        assert_eq!(
            api.clone_source("https://api.github.com"),
            "https://github.com/octo-org/api.git"
        );
        let ghe = lint.api_url.as_deref().expect("its API");
        assert_eq!(
            lint.clone_source(ghe),
            "https://ghe.example.com/tools/lint.git"
        );
        assert_eq!(
            docs.clone_source("https://api.github.com"),
            "file:///srv/mirrors/docs.git"
        );
    }

    #[test]
    fn installed_serves_an_apps_installations_with_its_key_beside_the_file() {
        let file = parse(
            r#"{"repositories": "installed",
                "app": {"id": 42, "privateKeyFile": "keys/app.pem"},
                "apiUrl": "https://ghe.example.com/api/v3/",
                "exclude": ["octo-org/sandbox"],
                "relistIntervalSecs": 120}"#,
        )
        .expect("valid");
        assert!(file.repositories.is_empty());
        let installed = file.installed.expect("installed");
        assert_eq!(installed.app_id, 42);
        assert_eq!(
            installed.private_key_file.as_deref(),
            Some(Path::new("/etc/rover/keys/app.pem"))
        );
        assert_eq!(
            installed.api_url.as_deref(),
            Some("https://ghe.example.com/api/v3")
        );
        assert!(installed.excludes(&RepoSlug::parse("Octo-Org/Sandbox").unwrap()));
        assert!(!installed.excludes(&RepoSlug::parse("octo-org/api").unwrap()));
        assert_eq!(installed.relist_interval, Duration::from_secs(120));
        let file = parse(r#"{"repositories": "installed", "app": {"id": 7}}"#).expect("valid");
        let installed = file.installed.expect("installed");
        assert_eq!(installed.private_key_file, None, "the env var's, at start");
        assert_eq!(
            installed.relist_interval,
            Duration::from_secs(DEFAULT_RELIST_SECS)
        );
        // The file's apiUrl is the default of a listed repository too.
        let file = parse(
            r#"{"apiUrl": "https://ghe.example.com/api/v3", "repositories": ["a/b", {"repo": "c/d", "apiUrl": "http://other/api"}]}"#,
        )
        .expect("valid");
        assert_eq!(
            file.repositories[0].api_url.as_deref(),
            Some("https://ghe.example.com/api/v3")
        );
        assert_eq!(
            file.repositories[1].api_url.as_deref(),
            Some("http://other/api")
        );
    }

    #[test]
    fn installed_keys_that_do_not_go_together_are_refused_at_their_line() {
        let (line, reason) = invalid("{\n  \"repositories\": \"installed\"\n}");
        assert_eq!(line, 2);
        assert!(reason.contains("name the app"), "{reason}");
        let (line, reason) =
            invalid("{\n  \"repositories\": [\"a/b\"],\n  \"app\": {\"id\": 1}\n}");
        assert_eq!(line, 3);
        assert!(
            reason.contains("\"app\" goes with \"repositories\": \"installed\" only"),
            "{reason}"
        );
        let (line, reason) = invalid("{\"repositories\": [\"a/b\"],\n\"exclude\": [\"a/b\"]}");
        assert_eq!(line, 2);
        assert!(reason.contains("\"exclude\" goes with"), "{reason}");
        let (line, reason) = invalid(
            "{\"repositories\": \"installed\",\n \"app\": {\"id\": 1},\n \"relistIntervalSecs\": 5}",
        );
        assert_eq!(line, 3);
        assert!(reason.contains("at most every 30 s"), "{reason}");
        let (line, reason) = invalid(
            "{\"repositories\": \"installed\",\n \"app\": {\"id\": 1, \"keyFile\": \"k.pem\"}}",
        );
        assert_eq!(line, 2);
        assert!(reason.contains("unknown field `keyFile`"), "{reason}");
        let (line, reason) = invalid(
            "{\"repositories\": \"installed\", \"app\": {\"id\": 1},\n \"exclude\": [\"nope\"]}",
        );
        assert_eq!(line, 2);
        assert!(reason.contains("\"owner/name\""), "{reason}");
        let (_, reason) =
            invalid(r#"{"repositories": "installed", "app": {"id": 1}, "apiUrl": "ghe"}"#);
        assert!(reason.contains("not an http(s) URL"), "{reason}");
        // A list and "installed" at once: the key appears twice.
        let (line, reason) =
            invalid("{\"repositories\": \"installed\",\n \"repositories\": [\"a/b\"]}");
        assert_eq!(line, 2);
        assert!(
            reason.contains("duplicate field `repositories`"),
            "{reason}"
        );
    }

    #[test]
    fn the_default_place_follows_xdg_then_home() {
        let host = HostEnv::from_pairs([("HOME", "/home/ops")]);
        assert_eq!(
            DaemonFile::default_path(&host),
            Some(PathBuf::from("/home/ops/.config/rover/daemon.json"))
        );
        let host = HostEnv::from_pairs([("HOME", "/home/ops"), ("XDG_CONFIG_HOME", "/cfg")]);
        assert_eq!(
            DaemonFile::default_path(&host),
            Some(PathBuf::from("/cfg/rover/daemon.json"))
        );
        assert_eq!(
            DaemonFile::default_path(&HostEnv::from_pairs::<&str, &str>([])),
            None
        );
    }

    #[test]
    fn the_daemon_section_sets_the_slots_shared_by_every_repository() {
        let file = parse(
            r#"{"repositories": ["a/b"], "daemon": {"maxRuns": 3, "maxRunsPerRepository": 1,
                "score": {"labels": {"urgent": 400}}}}"#,
        )
        .expect("valid");
        assert_eq!(file.slots.max_runs, 3);
        assert_eq!(file.slots.max_runs_per_repository, 1);
        assert_eq!(file.slots.weights.labels["urgent"], 400);
        let shown = parse(r#"{"repositories": ["a/b"], "daemon": {"maxRuns": 0}}"#)
            .expect_err("refused")
            .to_string();
        assert!(shown.contains("daemon.maxRuns is 0"), "{shown}");
        let (line, reason) =
            invalid("{\"repositories\": [\"a/b\"],\n \"daemon\": {\"maxRun\": 2}}");
        assert_eq!(line, 2);
        assert!(reason.contains("unknown field `maxRun`"), "{reason}");
    }
}
