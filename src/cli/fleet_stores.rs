//! Outside a checkout, the inspection commands (`status`, `traces`, `events`, `dead-letters`,
//! `gc`, `trace`) read every repository of the daemon file, each from its own store, narrowed by
//! `--repo`. One repository's store missing or unreadable never hides the others: a missing one is
//! said, an unreadable one is an error line naming it and the command's exit code at the end.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use super::{CliError, Context, Output};
use crate::config::{DaemonFile, ServedRepo};
use crate::daemon::{status_path, FleetStatus, ListingStatus, RepoStatus};
use crate::error::{error_chain, Kinded};
use crate::project::{Project, RepoSlug};
use crate::store::{AutopilotStore, StoreError};

/// The daemon file an inspection command reads: `--config FILE`, else outside a checkout with no
/// `--project-id`, the one at the default place when there is one (`--repo` then narrows it).
pub fn daemon_file(ctx: &Context, given: Option<PathBuf>) -> Option<PathBuf> {
    if given.is_some() {
        return given;
    }
    if ctx.global.project_id.is_some() || Project::discover(&ctx.project_dir()).is_ok() {
        return None;
    }
    DaemonFile::default_path(&ctx.host).filter(|p| p.is_file())
}

/// The repositories of a daemon file a command looks at.
pub struct Fleet {
    pub file: DaemonFile,
    pub data_dir: PathBuf,
    /// With `"repositories": "installed"`: how the daemon's latest listing went.
    pub last_listing: Option<ListingStatus>,
    /// Why the daemon holds every repository's new agent runs (its budget, its breaker).
    pub paused: Option<String>,
    /// Those asked about (every one, or those `--repo` names), in the file's order.
    pub repos: Vec<Served>,
}

/// One repository of the file, and where its store is.
pub struct Served {
    pub entry: ServedRepo,
    /// `owner/name`, as the file spells it.
    pub name: String,
    /// Its store's project id, once known (from the daemon's record, else its checkout).
    pub project_id: Option<String>,
    /// How it stands, as the daemon serving this file recorded it.
    pub standing: Option<RepoStatus>,
}

impl Fleet {
    /// The file at `path`, its repositories narrowed to those `--repo` names (an unknown one is
    /// an error naming those served).
    pub fn load(ctx: &Context, path: &Path) -> Result<Fleet, CliError> {
        let file = DaemonFile::load(path)?;
        let data_dir = crate::project::data_dir(&ctx.host)?;
        let recorded: Option<FleetStatus> = crate::store::fsio::read_json(&status_path(&data_dir))?;
        // The standing is the daemon's of this file only.
        let recorded = recorded.filter(|s| s.file == file.path);
        let entries = served(&file, recorded.as_ref());
        let wanted = narrowing(&ctx.global.repo, &file, &entries)?;
        let repos = entries
            .iter()
            .filter(|r| wanted.is_empty() || wanted.contains(&r.full_name()))
            .map(|entry| {
                let name = entry.full_name();
                let standing = recorded
                    .as_ref()
                    .and_then(|s| s.repositories.iter().find(|r| r.repo == name).cloned());
                let project_id = standing
                    .as_ref()
                    .and_then(|s| s.project_id.clone())
                    .or_else(|| {
                        Project::discover(&entry.checkout_in(&data_dir))
                            .ok()
                            .map(|p| p.id)
                    });
                Served {
                    entry: entry.clone(),
                    name,
                    project_id,
                    standing,
                }
            })
            .collect();
        let paused = recorded.as_ref().and_then(|s| s.paused.clone());
        Ok(Fleet {
            paused,
            last_listing: recorded.and_then(|s| s.last_listing),
            file,
            data_dir,
            repos,
        })
    }

    /// Each repository's store, opened: `None` when it has none yet.
    pub fn stores(
        &self,
    ) -> impl Iterator<Item = (&Served, Result<Option<AutopilotStore>, CliError>)> {
        self.repos.iter().map(|r| (r, r.open(&self.data_dir)))
    }

    /// What `read` gives from each repository's store, each row with its repository; the
    /// repositories without a store and those whose store cannot be read, apart.
    pub fn gather<T>(
        &self,
        mut read: impl FnMut(&Served, &AutopilotStore) -> Result<Vec<T>, CliError>,
    ) -> Gathered<T> {
        let mut gathered = Gathered {
            rows: Vec::new(),
            missing: Vec::new(),
            errors: Vec::new(),
        };
        for (served, store) in self.stores() {
            match store.and_then(|s| s.map(|s| read(served, &s)).transpose()) {
                Ok(Some(rows)) => gathered
                    .rows
                    .extend(rows.into_iter().map(|row| (served.name.clone(), row))),
                Ok(None) => gathered.missing.push(served.name.clone()),
                Err(e) => gathered.errors.push(in_repo(&served.name, e)),
            }
        }
        gathered
    }
}

impl Served {
    /// Its store, `None` when it has none yet (never created by looking).
    pub fn open(&self, data_dir: &Path) -> Result<Option<AutopilotStore>, CliError> {
        let Some(id) = &self.project_id else {
            return Ok(None);
        };
        match AutopilotStore::open_existing(data_dir, id) {
            Ok(store) => Ok(Some(store)),
            Err(StoreError::MissingStore { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}

/// The rows of every repository, and what kept some from giving theirs.
pub struct Gathered<T> {
    /// `(owner/name, row)`, by repository in the file's order (each command sorts them).
    pub rows: Vec<(String, T)>,
    /// Repositories with no store yet (not served yet, or nothing recorded).
    pub missing: Vec<String>,
    /// Repositories whose store cannot be read, each error naming it.
    pub errors: Vec<CliError>,
}

impl<T> Gathered<T> {
    /// Says which repositories have no store yet (in the text only) and which cannot be read
    /// (`error: owner/name: ...` on stderr); the exit code of the first error's kind, or 0.
    pub fn finish(&self, out: &mut Output, json: bool) -> Result<ExitCode, CliError> {
        if !json {
            let mut text = String::new();
            for repo in &self.missing {
                let _ = writeln!(
                    text,
                    "{repo}: no store yet (not served yet, or nothing recorded)"
                );
            }
            out.print(&text)?;
        }
        Ok(report(&self.errors))
    }
}

/// Prints each error on stderr; the exit code of the first one's kind, or 0 with none.
pub fn report(errors: &[CliError]) -> ExitCode {
    for e in errors {
        eprintln!("error: {}", error_chain(e));
    }
    errors
        .first()
        .map_or(ExitCode::SUCCESS, |e| super::exit_code_of(e.kind()))
}

/// `e`, said to be about repository `repo`.
pub fn in_repo(repo: &str, e: CliError) -> CliError {
    CliError::InRepo {
        repo: repo.to_owned(),
        source: Box::new(e),
    }
}

/// The `owner/name`s `--repo` names, as the daemon file spells them (empty: every repository).
/// The repositories of `file`: those it lists, or with `"repositories": "installed"` those
/// the daemon serving it recorded (at their default checkouts).
fn served(file: &DaemonFile, recorded: Option<&FleetStatus>) -> Vec<ServedRepo> {
    if file.installed.is_none() {
        return file.repositories.clone();
    }
    recorded
        .map(|s| {
            s.repositories
                .iter()
                .filter_map(|r| RepoSlug::parse(&r.repo).ok())
                .map(|slug| ServedRepo {
                    slug,
                    checkout: None,
                    api_url: None,
                    clone_url: None,
                    app: None,
                })
                .collect()
        })
        .unwrap_or_default()
}

fn narrowing(
    given: &[String],
    file: &DaemonFile,
    entries: &[ServedRepo],
) -> Result<Vec<String>, CliError> {
    let served: Vec<String> = entries.iter().map(ServedRepo::full_name).collect();
    given
        .iter()
        .map(|value| {
            let slug = RepoSlug::parse(value)?;
            let asked = format!("{}/{}", slug.owner, slug.name);
            served
                .iter()
                .find(|s| s.eq_ignore_ascii_case(&asked))
                .cloned()
                .ok_or_else(|| {
                    CliError::NotFound(format!(
                        "{} does not list {asked}: it serves {}",
                        file.path.display(),
                        served.join(", ")
                    ))
                })
        })
        .collect()
}

/// `text`, one row a line after `header` header lines, with a REPO column first: `repos[i]` is
/// row `i`'s repository. The table of a command in a checkout, the same with its repository.
pub fn with_repo_column(text: &str, header: bool, repos: &[String]) -> String {
    let width = repos.iter().map(String::len).max().unwrap_or(0).max(4);
    let mut out = String::with_capacity(text.len() + repos.len() * (width + 2));
    let mut rows = repos.iter();
    for (n, line) in text.lines().enumerate() {
        let repo = if header && n == 0 {
            "REPO"
        } else {
            rows.next().map_or("", String::as_str)
        };
        let _ = writeln!(out, "{repo:width$}  {line}");
    }
    out
}

/// Adds `"repo"` to each object of the array `items`, in order: the JSON rows of a command
/// outside a checkout.
pub fn add_repo_field(
    items: &mut serde_json::Value,
    repos: impl Iterator<Item = serde_json::Value>,
) {
    if let Some(items) = items.as_array_mut() {
        for (item, repo) in items.iter_mut().zip(repos) {
            if let Some(o) = item.as_object_mut() {
                o.insert("repo".into(), repo);
            }
        }
    }
}

/// The store of the repository holding trace `id` (a trace, span or action id, or a prefix),
/// and the trace's id: `trace <ID>` outside a checkout. An id matching traces in two
/// repositories is an error naming both.
pub fn store_with_trace(
    ctx: &Context,
    path: &Path,
    id: &str,
) -> Result<(AutopilotStore, uuid::Uuid), CliError> {
    let fleet = Fleet::load(ctx, path)?;
    let mut found = Vec::new();
    let mut errors = Vec::new();
    for (served, store) in fleet.stores() {
        let store = match store {
            Ok(Some(store)) => store,
            Ok(None) => continue,
            Err(e) => {
                errors.push(in_repo(&served.name, e));
                continue;
            }
        };
        match store.resolve_trace_id(id) {
            Ok(trace) => found.push((served.name.clone(), store, trace)),
            Err(StoreError::UnknownId { .. }) => {}
            // Too short: the same in every repository.
            Err(e @ StoreError::ShortId { .. }) => return Err(e.into()),
            // Two traces of this one repository.
            Err(e @ StoreError::AmbiguousId { .. }) => return Err(in_repo(&served.name, e.into())),
            Err(e) => errors.push(in_repo(&served.name, e.into())),
        }
    }
    match found.len() {
        0 => Err(errors.into_iter().next().unwrap_or_else(|| {
            CliError::NotFound(format!(
                "no trace {id} in the {} repositories of {}",
                fleet.repos.len(),
                fleet.file.path.display()
            ))
        })),
        1 => {
            let (_, store, trace) = found.remove(0);
            Ok((store, trace))
        }
        _ => Err(CliError::Usage(format!(
            "{id} names a trace in {}: give more of the id, or --repo OWNER/NAME",
            found
                .iter()
                .map(|(repo, _, trace)| format!("{repo} ({trace})"))
                .collect::<Vec<_>>()
                .join(" and ")
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_repo_column_goes_first_with_a_header_when_the_table_has_one() {
        let text = "TRACE  AGE\n1a2b  1m\n3c4d  2m\n";
        let repos = vec!["octo-org/api".to_owned(), "o/w".to_owned()];
        assert_eq!(
            with_repo_column(text, true, &repos),
            "REPO          TRACE  AGE\nocto-org/api  1a2b  1m\no/w           3c4d  2m\n"
        );
        assert_eq!(
            with_repo_column("a\nb\n", false, &repos),
            "octo-org/api  a\no/w           b\n"
        );
    }

    #[test]
    fn repo_narrows_to_the_file_s_spelling_and_an_unknown_one_names_those_served() {
        let file = DaemonFile::parse(
            Path::new("/etc/rover/daemon.json"),
            r#"{"repositories": ["Octo-Org/api", "octo-org/web"]}"#,
        )
        .unwrap();
        assert_eq!(
            narrowing(&["octo-org/API".to_owned()], &file, &file.repositories).unwrap(),
            vec!["Octo-Org/api".to_owned()]
        );
        let err = narrowing(&["octo-org/gone".to_owned()], &file, &file.repositories).unwrap_err();
        assert_eq!(err.kind(), crate::error::ErrorKind::NotFound);
        assert_eq!(
            err.to_string(),
            "/etc/rover/daemon.json does not list octo-org/gone: it serves Octo-Org/api, octo-org/web"
        );
        let err = narrowing(&["not a repo".to_owned()], &file, &file.repositories).unwrap_err();
        assert_eq!(err.kind(), crate::error::ErrorKind::Usage);
    }
}
