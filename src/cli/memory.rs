//! `rover autopilot memory [list|show ID|forget ID|pin ID]`: the lessons rover learned from this
//! repository's ended traces (`autopilot/memory/lessons.json`, see docs/memory.md), for a person
//! to read and correct. Outside a checkout, every repository of the daemon file (narrowed by
//! `--repo`): `list` shows them all, a REPO column first; `show`, `forget` and `pin` act on the
//! repository whose book holds the id.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use super::fleet_stores::{add_repo_field, daemon_file, in_repo, with_repo_column, Fleet};
use super::{CliError, Context, Output};
use crate::memory::{Lesson, LessonBook, MemoryError};
use crate::store::AutopilotStore;

/// What `memory` does.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum MemoryCommand {
    /// List the lessons, strongest first (the default)
    List,
    /// Show one lesson with its evidence: the traces, spans, command and exit codes
    Show {
        /// A lesson id, or an unambiguous prefix of one
        id: String,
    },
    /// Remove a lesson for good (a trace that teaches it again adds it anew)
    Forget {
        /// A lesson id, or an unambiguous prefix of one
        id: String,
    },
    /// Keep a lesson whatever its weight and age (`--unpin` lets it go again)
    Pin {
        /// A lesson id, or an unambiguous prefix of one
        id: String,
        #[arg(long)]
        unpin: bool,
    },
}

/// Runs `command` (`list` when none).
pub fn memory(
    ctx: &Context,
    out: &mut Output,
    command: Option<MemoryCommand>,
    json: bool,
    config: Option<PathBuf>,
) -> Result<ExitCode, CliError> {
    let command = command.unwrap_or(MemoryCommand::List);
    if let Some(path) = daemon_file(ctx, config) {
        let fleet = Fleet::load(ctx, &path)?;
        if let MemoryCommand::List = command {
            let mut got = fleet.gather(|_, store| Ok(sorted(LessonBook::load(store)?)));
            let (repos, lessons): (Vec<String>, Vec<Lesson>) =
                std::mem::take(&mut got.rows).into_iter().unzip();
            print_list(out, &lessons, json, Some(&repos))?;
            return got.finish(out, json);
        }
        let id = command_id(&command);
        let mut errors = Vec::new();
        for (served, store) in fleet.stores() {
            match store {
                Ok(Some(store)) if LessonBook::load(&store).is_ok_and(|b| b.find(id).is_ok()) => {
                    return act(out, &store, &command, json).map_err(|e| in_repo(&served.name, e));
                }
                Ok(_) => {}
                Err(e) => errors.push(in_repo(&served.name, e)),
            }
        }
        return Err(errors.into_iter().next().unwrap_or_else(|| {
            CliError::NotFound(format!(
                "no lesson {id} in the {} repositories of {}",
                fleet.repos.len(),
                path.display()
            ))
        }));
    }
    let store = ctx.existing_store()?;
    if let MemoryCommand::List = command {
        print_list(out, &sorted(LessonBook::load(&store)?), json, None)?;
        return Ok(ExitCode::SUCCESS);
    }
    act(out, &store, &command, json)
}

fn command_id(command: &MemoryCommand) -> &str {
    match command {
        MemoryCommand::List => "",
        MemoryCommand::Show { id }
        | MemoryCommand::Forget { id }
        | MemoryCommand::Pin { id, .. } => id,
    }
}

/// `show`, `forget` or `pin` on `store`'s book.
fn act(
    out: &mut Output,
    store: &AutopilotStore,
    command: &MemoryCommand,
    json: bool,
) -> Result<ExitCode, CliError> {
    match command {
        MemoryCommand::List => unreachable!("list is printed by the caller"),
        MemoryCommand::Show { id } => {
            let book = LessonBook::load(store)?;
            let lesson = book.find(id)?;
            if json {
                out.json(&serde_json::json!(lesson))?;
            } else {
                out.print(&details(lesson))?;
            }
        }
        MemoryCommand::Forget { id } => {
            let lesson = forget(store, id)?;
            if json {
                out.json(&serde_json::json!({ "forgotten": lesson }))?;
            } else {
                out.print(&format!(
                    "forgot {}: {}\n",
                    lesson.id,
                    printable(&lesson.statement)
                ))?;
            }
        }
        MemoryCommand::Pin { id, unpin } => {
            let id = pin(store, id, !unpin)?;
            if json {
                out.json(&serde_json::json!({ "id": id, "pinned": !unpin }))?;
            } else {
                let what = if *unpin { "unpinned" } else { "pinned" };
                out.print(&format!("{what} {id}\n"))?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `forget ID`: removes the lesson `id` (or a prefix) names from `store`'s book, under its
/// lock; also the dashboard's **forget**.
pub(crate) fn forget(store: &AutopilotStore, id: &str) -> Result<Lesson, CliError> {
    Ok(LessonBook::update(store, |b| b.forget(id))??)
}

/// `pin ID` (`pinned`) or `pin --unpin ID`: the lesson's id; also the dashboard's **pin**.
pub(crate) fn pin(store: &AutopilotStore, id: &str, pinned: bool) -> Result<String, CliError> {
    Ok(LessonBook::update(store, |b| b.pin(id, pinned))??)
}

/// The book's lessons, strongest first (pinned ones first among equals).
pub(crate) fn sorted(book: LessonBook) -> Vec<Lesson> {
    let mut lessons = book.lessons;
    lessons.sort_by(|a, b| {
        (b.pinned, b.weight(), b.last_touched()).cmp(&(a.pinned, a.weight(), a.last_touched()))
    });
    lessons
}

/// One line per lesson (or the JSON array); with `repos`, each one's repository first.
fn print_list(
    out: &mut Output,
    lessons: &[Lesson],
    json: bool,
    repos: Option<&[String]>,
) -> Result<(), CliError> {
    if json {
        let mut list = serde_json::json!(lessons);
        if let Some(repos) = repos {
            add_repo_field(&mut list, repos.iter().map(|r| serde_json::json!(r)));
        }
        return out.json(&list);
    }
    if lessons.is_empty() && repos.is_none() {
        return out.print("no lessons yet (rover learns from ended traces; see docs/memory.md)\n");
    }
    let mut text = String::from(
        "ID            KIND           WEIGHT  TRACES  PINNED  LAST USED         STATEMENT\n",
    );
    for l in lessons {
        let used = l.last_used.map_or_else(
            || "never".to_owned(),
            |t| t.format("%Y-%m-%d %H:%M").to_string(),
        );
        let statement: String = printable(&l.statement).chars().take(100).collect();
        let _ = writeln!(
            text,
            "{:<13} {:<14} {:>6}  {:>6}  {:<6}  {:<16}  {}",
            l.id,
            l.kind.as_str(),
            l.weight(),
            l.evidence.len(),
            if l.pinned { "yes" } else { "" },
            used,
            statement
        );
    }
    match repos {
        Some(repos) => out.print(&with_repo_column(&text, true, repos)),
        None => out.print(&text),
    }
}

/// `text` with every control character a space: a lesson's words come from a resolver's answer
/// or a trace's commands, and no escape sequence of theirs reaches the terminal.
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// `show`'s text: the lesson and each piece of evidence.
fn details(l: &Lesson) -> String {
    let mut text = String::new();
    let _ = writeln!(text, "lesson     {}", l.id);
    let _ = writeln!(text, "kind       {}", l.kind.as_str());
    let _ = writeln!(text, "statement  {}", printable(&l.statement));
    let _ = writeln!(text, "concerns   {}", printable(&l.concerns.join(", ")));
    let _ = writeln!(text, "learned on {}", printable(&l.topics.join("; ")));
    let _ = writeln!(
        text,
        "weight     {} ({} trace(s), {} contradiction(s)){}",
        l.weight(),
        l.evidence.len(),
        l.contradictions.len(),
        if l.pinned { ", pinned" } else { "" }
    );
    for e in &l.evidence {
        let spans: Vec<String> = e.span_ids.iter().map(ToString::to_string).collect();
        let _ = writeln!(
            text,
            "evidence   trace {} at {}",
            e.trace_id,
            e.at.format("%Y-%m-%d %H:%M:%S UTC")
        );
        let _ = writeln!(text, "           spans {}", spans.join(" "));
        if !e.command.is_empty() {
            let codes: Vec<String> = e.exit_codes.iter().map(i64::to_string).collect();
            let _ = writeln!(
                text,
                "           command {} (exit codes {})",
                printable(&e.command.join(" ")),
                codes.join(" then ")
            );
        }
        if let Some(check) = &e.check {
            let _ = writeln!(
                text,
                "           check {} ({})",
                printable(check),
                printable(&e.conclusions.join(" then "))
            );
        } else if !e.conclusions.is_empty() {
            let _ = writeln!(
                text,
                "           outcome {}",
                printable(&e.conclusions.join(" then "))
            );
        }
    }
    for c in &l.contradictions {
        let _ = writeln!(
            text,
            "against    trace {} span {} at {}",
            c.trace_id,
            c.span_id,
            c.at.format("%Y-%m-%d %H:%M:%S UTC")
        );
    }
    text
}

impl From<MemoryError> for CliError {
    fn from(e: MemoryError) -> CliError {
        match e {
            MemoryError::Store(e) => CliError::Store(e),
            MemoryError::UnknownLesson { .. } => CliError::NotFound(e.to_string()),
            MemoryError::AmbiguousLesson { .. } => CliError::Usage(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn what_is_printed_of_a_lesson_holds_no_control_character() {
        let shown = super::printable("add \u{1b}[31mred\u{1b}[0m\u{7}\nnext");
        assert!(!shown.chars().any(char::is_control), "{shown:?}");
        assert_eq!(shown, "add  [31mred [0m  next");
    }
}
