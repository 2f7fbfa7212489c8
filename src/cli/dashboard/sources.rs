//! The stores the dashboard shows: the project's (in a checkout, or `--project-id`), or every
//! repository of the daemon file, read by `cli::fleet_stores` as `status`, `traces` and
//! `trace --config` read them. Looked up again on each request, so a repository the daemon
//! starts serving, or a store created after the dashboard started, shows up.

use std::path::PathBuf;

use uuid::Uuid;

use super::super::fleet_stores::{in_repo, Fleet};
use super::super::{CliError, Context};
use crate::store::{AutopilotStore, StoreError};

/// Where the dashboard reads.
pub enum Sources {
    /// The project of the command line (its repository's name, or the project id).
    Project,
    /// Every repository of this daemon file.
    Fleet(PathBuf),
}

/// One repository's store as a page reads it.
pub struct Source {
    /// `owner/name` (or the project id without a GitHub remote).
    pub repo: String,
    pub store: AutopilotStore,
    /// The web address of its GitHub (`https://github.com`, or a GitHub Enterprise host's),
    /// for links to its threads.
    pub web: String,
}

/// What the stores gave: those that read, and what kept others from it (said on the page).
pub struct Opened {
    pub stores: Vec<Source>,
    pub problems: Vec<String>,
}

impl Sources {
    /// The stores as they are now.
    pub fn open(&self, ctx: &Context) -> Opened {
        let mut opened = Opened {
            stores: Vec::new(),
            problems: Vec::new(),
        };
        match self {
            Sources::Project => {
                let repo = ctx
                    .project()
                    .ok()
                    .and_then(|p| p.repo.map(|r| format!("{}/{}", r.owner, r.name)))
                    .or_else(|| ctx.project_id().ok())
                    .unwrap_or_else(|| "this project".to_owned());
                let web = crate::github::octo::web_url_for(&crate::github::octo::api_url_from_env(
                    &ctx.host,
                ));
                match ctx.existing_store() {
                    Ok(store) => opened.stores.push(Source { repo, store, web }),
                    Err(e) => opened.problems.push(crate::error::error_chain(&e)),
                }
            }
            Sources::Fleet(path) => match Fleet::load(ctx, path) {
                Ok(fleet) => {
                    let default_api = crate::github::octo::api_url_from_env(&ctx.host);
                    for (served, store) in fleet.stores() {
                        match store {
                            Ok(Some(store)) => opened.stores.push(Source {
                                repo: served.name.clone(),
                                store,
                                web: crate::github::octo::web_url_for(
                                    served.entry.api_url.as_deref().unwrap_or(&default_api),
                                ),
                            }),
                            Ok(None) => opened
                                .problems
                                .push(format!("{}: no store yet", served.name)),
                            Err(e) => opened
                                .problems
                                .push(crate::error::error_chain(&in_repo(&served.name, e))),
                        }
                    }
                }
                Err(e) => opened.problems.push(crate::error::error_chain(&e)),
            },
        }
        opened
    }
}

impl Sources {
    /// The data dirs whose `projects/` hold the stores, those there now and those to come.
    pub fn data_dirs(&self, ctx: &Context) -> Vec<PathBuf> {
        match self {
            Sources::Project => crate::project::data_dir(&ctx.host)
                .ok()
                .into_iter()
                .collect(),
            Sources::Fleet(path) => Fleet::load(ctx, path)
                .map(|fleet| vec![fleet.data_dir])
                .unwrap_or_default(),
        }
    }
}

impl Opened {
    /// The store holding trace `id` (a trace, span or action id or a prefix, as `trace` takes
    /// it), and the trace's id.
    pub fn find_trace(&self, id: &str) -> Result<(&Source, Uuid), CliError> {
        let mut found = Vec::new();
        for source in &self.stores {
            match source.store.resolve_trace_id(id) {
                Ok(trace) => found.push((source, trace)),
                Err(StoreError::UnknownId { .. }) => {}
                Err(e) => return Err(in_repo(&source.repo, e.into())),
            }
        }
        match found.len() {
            0 => Err(CliError::NotFound(format!("no trace {id}"))),
            1 => Ok(found.remove(0)),
            _ => Err(CliError::Usage(format!(
                "{id} names a trace in more than one repository: give more of the id"
            ))),
        }
    }
}
