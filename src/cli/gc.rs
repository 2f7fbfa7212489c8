//! `rover autopilot gc`: each store's part (what its ended traces hold, reclaimed past the
//! retention; its project's environment images), then the engine's, once: rover's containers,
//! networks and volumes of stores gone or whose daemon is dead, and old proxy images (see
//! [`crate::sandbox::leftovers`]). Outside a checkout, each repository of the daemon file's store
//! in turn, and the engine once.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;
use std::process::ExitCode;

use chrono::Utc;
use serde_json::json;

use super::fleet_stores::{self, Fleet};
use super::intervene::{actor, wake_daemon};
use super::{CliError, Context, Output};
use crate::sandbox::leftovers::{Kind, Reason, Sweep};
use crate::steps::gc::{Plan, Reclaim};
use crate::store::{AutopilotStore, StoreError};

/// `gc`'s flags.
pub struct GcArgs {
    pub dry_run: bool,
    pub json: bool,
    pub retain_days: Option<u64>,
}

/// One store's part of `gc`.
struct StoreGc {
    retain_days: u64,
    plan: Plan,
    /// The cleanup actions queued (none on a dry run).
    queued: Vec<uuid::Uuid>,
    images: crate::environment::gc::Sweep,
    /// The lessons of the store's memory unused for `memory.ttlDays` (removed unless a dry run).
    lessons_expired: Vec<String>,
}

/// `gc [--dry-run] [--json] [--retain-days N]`: what ended traces hold and when it is freed;
/// without `--dry-run`, queue the cleanup of what is due (the daemon runs it). Then rover's
/// containers, networks and volumes of stores gone or whose daemon is dead: swept even without
/// a store for this project.
pub fn gc(
    ctx: &Context,
    out: &mut Output,
    args: &GcArgs,
    config: Option<std::path::PathBuf>,
) -> Result<ExitCode, CliError> {
    if let Some(path) = fleet_stores::daemon_file(ctx, config) {
        return fleet_gc(ctx, out, args, &path);
    }
    let dry_run = args.dry_run;
    let store = match ctx.existing_store() {
        Ok(store) => store,
        Err(CliError::Store(StoreError::MissingStore { path })) => {
            let leftovers = sweep(dry_run, &ctx.host)?;
            if args.json {
                out.json(&json!({"dryRun": dry_run, "store": null, "leftovers": leftovers}))?;
            } else {
                out.print(&format!(
                    "no rover store at {}: no traces to reclaim\n",
                    path.display()
                ))?;
                print(out, &leftovers, dry_run)?;
            }
            return Ok(ExitCode::SUCCESS);
        }
        Err(e) => return Err(e),
    };
    let retain_days = args
        .retain_days
        .unwrap_or_else(|| retention_of(ctx.project().ok().map(|p| p.root).as_deref()));
    let checkout = ctx.project().ok().map(|p| p.root);
    let ttl = memory_of(checkout.as_deref()).ttl_days;
    let one = store_gc(&store, &ctx.project_id()?, (retain_days, ttl), dry_run)?;
    let leftovers = sweep(dry_run, &ctx.host)?;
    if args.json {
        out.json(&json!({
            "retainDays": one.retain_days, "dryRun": dry_run, "plan": one.plan,
            "environmentImages": one.images,
            "queued": one.queued.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "lessonsExpired": one.lessons_expired,
            "leftovers": leftovers,
        }))?;
        return Ok(ExitCode::SUCCESS);
    }
    out.print(&plan_text(&[(None, &one)], dry_run))?;
    print(out, &leftovers, dry_run)?;
    if !dry_run && !one.queued.is_empty() {
        wake_daemon(
            &store,
            out,
            "removes their worktrees, branches, containers and task mappings",
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `gc` outside a checkout: each repository's store as in its checkout, the engine once.
fn fleet_gc(
    ctx: &Context,
    out: &mut Output,
    args: &GcArgs,
    path: &Path,
) -> Result<ExitCode, CliError> {
    let fleet = Fleet::load(ctx, path)?;
    let mut stores = Vec::new();
    let mut got = fleet.gather(|served, store| {
        let retain_days = args
            .retain_days
            .unwrap_or_else(|| retention_of(Some(&served.entry.checkout_in(&fleet.data_dir))));
        let id = served.project_id.as_deref().unwrap_or_default();
        let ttl = memory_of(Some(&served.entry.checkout_in(&fleet.data_dir))).ttl_days;
        let one = store_gc(store, id, (retain_days, ttl), args.dry_run)?;
        stores.push(store.clone());
        Ok(vec![one])
    });
    let rows = std::mem::take(&mut got.rows);
    let leftovers = sweep(args.dry_run, &ctx.host)?;
    if args.json {
        let repositories: Vec<serde_json::Value> = rows
            .iter()
            .map(|(repo, one)| {
                json!({
                    "repo": repo, "retainDays": one.retain_days, "plan": one.plan,
                    "environmentImages": one.images,
                    "queued": one.queued.iter().map(ToString::to_string).collect::<Vec<_>>(),
                    "lessonsExpired": one.lessons_expired,
                })
            })
            .collect();
        out.json(
            &json!({"dryRun": args.dry_run, "repositories": repositories, "leftovers": leftovers}),
        )?;
        return got.finish(out, true);
    }
    let shown: Vec<(Option<&str>, &StoreGc)> = rows
        .iter()
        .map(|(repo, one)| (Some(repo.as_str()), one))
        .collect();
    out.print(&plan_text(&shown, args.dry_run))?;
    print(out, &leftovers, args.dry_run)?;
    // One word per daemon: a daemon file's daemon holds every repository's store.
    let mut woken = BTreeSet::new();
    for (store, (_, one)) in stores.iter().zip(&rows) {
        if !args.dry_run && !one.queued.is_empty() && woken.insert(store.daemon_pid()) {
            wake_daemon(
                store,
                out,
                "removes their worktrees, branches, containers and task mappings",
            )?;
        }
    }
    got.finish(out, false)
}

/// `pipeline.retainDays` of the `rover.json` in `checkout`, else 7.
fn retention_of(checkout: Option<&Path>) -> u64 {
    checkout
        .and_then(|root| crate::config::RoverConfig::load(root).ok())
        .map_or(7, |c| c.autopilot.pipeline.retain_days)
}

/// `autopilot.memory` of the `rover.json` in `checkout`, else the defaults.
fn memory_of(checkout: Option<&Path>) -> crate::memory::MemorySettings {
    checkout
        .and_then(|root| crate::config::RoverConfig::load(root).ok())
        .map(|c| c.autopilot.memory)
        .unwrap_or_default()
}

/// The lessons of `store`'s memory unused for `ttl_days`: removed, or on a dry run only named.
fn expire_lessons(
    store: &AutopilotStore,
    ttl_days: u32,
    dry_run: bool,
) -> Result<Vec<String>, CliError> {
    let now = Utc::now();
    if dry_run {
        let mut book = crate::memory::LessonBook::load(store)?;
        return Ok(book.expire(ttl_days, now));
    }
    Ok(crate::memory::LessonBook::update(store, |b| {
        b.expire(ttl_days, now)
    })?)
}

/// One store's part: its plan (queued on a real run: the `gc` spans and cleanup actions, under
/// the store lock, for its daemon to run) and its project's environment images.
fn store_gc(
    store: &AutopilotStore,
    project_id: &str,
    (retain_days, ttl_days): (u64, u32),
    dry_run: bool,
) -> Result<StoreGc, CliError> {
    let (plan, queued) = if dry_run {
        (
            crate::steps::gc::plan(store, crate::steps::gc::retention(retain_days), Utc::now())?,
            Vec::new(),
        )
    } else {
        crate::steps::gc::run(store, retain_days, &actor(None))?
    };
    // Environment images: all of the project's but the newest and those of traces that keep
    // their tasks.
    let live: Vec<uuid::Uuid> = plan
        .live
        .iter()
        .copied()
        .chain(plan.later.iter().chain(&plan.open_prs).map(|r| r.trace_id))
        .collect();
    let images = crate::environment::gc::sweep(
        store,
        project_id,
        &live,
        crate::steps::history::image_of,
        dry_run,
    );
    let lessons_expired = expire_lessons(store, ttl_days, dry_run)?;
    Ok(StoreGc {
        retain_days,
        plan,
        queued,
        images,
        lessons_expired,
    })
}

/// What the stores' plans free and keep; with a repository, each line about one starts with it.
fn plan_text(rows: &[(Option<&str>, &StoreGc)], dry_run: bool) -> String {
    let width = rows
        .iter()
        .filter_map(|(repo, _)| repo.map(str::len))
        .max()
        .unwrap_or(0);
    let lead = |repo: Option<&str>| repo.map_or(String::new(), |r| format!("{r:width$}  "));
    let line = |r: &Reclaim| {
        format!(
            "{}  {} task(s) [{}]  ended {}  {}",
            crate::trace::short(r.trace_id),
            r.tasks.len(),
            r.branches.join(", "),
            r.ended_at.format("%Y-%m-%d %H:%M"),
            r.label
        )
    };
    let mut text = String::new();
    let verb = if dry_run { "due now" } else { "reclaiming" };
    let days: BTreeSet<u64> = rows.iter().map(|(_, one)| one.retain_days).collect();
    match days.iter().next() {
        None => {
            let _ = writeln!(text, "{verb}:");
        }
        Some(d) if days.len() == 1 => {
            let _ = writeln!(text, "{verb} (ended more than {d} day(s) ago):");
        }
        Some(_) => {
            let each: Vec<String> = rows
                .iter()
                .map(|(repo, one)| format!("{} {} day(s)", repo.unwrap_or("-"), one.retain_days))
                .collect();
            let _ = writeln!(
                text,
                "{verb} (ended longer ago than each repository keeps them: {}):",
                each.join(", ")
            );
        }
    }
    if rows.iter().all(|(_, one)| one.plan.due.is_empty()) {
        text.push_str("  nothing\n");
    }
    for (repo, one) in rows {
        for r in &one.plan.due {
            let _ = writeln!(text, "{}  {}", lead(*repo), line(r));
        }
    }
    for (repo, one) in rows {
        for r in &one.plan.later {
            let at = r.due_at.format("%Y-%m-%d %H:%M");
            let _ = writeln!(text, "{}kept until {at}: {}", lead(*repo), line(r));
        }
    }
    for (repo, one) in rows {
        for r in &one.plan.open_prs {
            let _ = writeln!(
                text,
                "{}kept while its pull request is open: {}",
                lead(*repo),
                line(r)
            );
        }
    }
    for (repo, one) in rows {
        if !one.lessons_expired.is_empty() {
            let what = if dry_run { "would expire" } else { "expired" };
            let _ = writeln!(
                text,
                "{}memory: {what} {} unused lesson(s): {}",
                lead(*repo),
                one.lessons_expired.len(),
                one.lessons_expired.join(", ")
            );
        }
    }
    for (repo, one) in rows {
        if !one.plan.live.is_empty() {
            let _ = writeln!(
                text,
                "{}{} trace(s) with work queued or running keep theirs",
                lead(*repo),
                one.plan.live.len()
            );
        }
    }
    for (repo, one) in rows {
        let state = if dry_run { "unused" } else { "removed" };
        for image in &one.images.removed {
            let _ = writeln!(text, "{}environment image {state}: {image}", lead(*repo));
        }
        for error in &one.images.errors {
            let _ = writeln!(text, "{}environment images: {error}", lead(*repo));
        }
    }
    text
}

/// Sweeps rover's leftovers on the engine (on `dry_run`, only says what would go).
pub fn sweep(dry_run: bool, host: &crate::host_env::HostEnv) -> Result<Sweep, CliError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::Internal(format!("cannot start a runtime to ask Docker: {e}")))?;
    Ok(runtime.block_on(crate::sandbox::leftovers::sweep(dry_run, host)))
}

/// Says what the sweep removed (or would), what it kept that needs a look, and why.
pub fn print(out: &mut Output, sweep: &Sweep, dry_run: bool) -> Result<(), CliError> {
    let verb = if dry_run { "would remove" } else { "removed" };
    for l in &sweep.removed {
        out.print(&format!("{verb} {l}\n"))?;
    }
    for l in sweep.kept.iter().filter(|l| l.reason.worth_saying()) {
        out.print(&format!("kept {l}\n"))?;
        if l.reason == Reason::UnknownStore {
            out.print(&format!(
                "  remove it by hand once no rover of that project runs: `docker {} {}`\n",
                match l.kind {
                    Kind::Container => "container rm -f",
                    Kind::Network => "network rm",
                    Kind::Volume => "volume rm",
                },
                l.name
            ))?;
        }
    }
    let others = sweep
        .kept
        .iter()
        .filter(|l| !l.reason.worth_saying())
        .count();
    if others > 0 {
        out.print(&format!(
            "{others} other container(s), network(s) or volume(s) of rover's kept: their store's daemon runs (or never ran), their run is live, their store's next start collects them, or they were made on another machine (`--json` lists them with why)\n"
        ))?;
    }
    for image in &sweep.proxy_images.removed {
        out.print(&format!(
            "{verb} the proxy image {image}: no container uses it and it is not this rover's\n"
        ))?;
    }
    for e in &sweep.errors {
        out.print(&format!("leftovers: {e}\n"))?;
    }
    Ok(())
}
