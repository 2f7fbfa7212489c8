//! `rover autopilot submit "<request>"`: a local event, intake's fourth source. It enters the
//! store through the same `intake::ingest` as a GitHub event (visibility private; the answer goes
//! into the trace and `start`'s output), and wakes a running daemon so it is picked up at once.

use std::io::Read;
use std::process::ExitCode;

use super::{CliError, Context, Output};
use crate::intake::Arrival;
use crate::store::AutopilotStore;

pub fn submit(ctx: &Context, out: &mut Output, text: Option<String>) -> Result<ExitCode, CliError> {
    let request = if let Some(t) = text.filter(|t| t != "-") {
        t
    } else {
        let mut buf = String::new();
        std::io::stdin().read_to_string(&mut buf).map_err(|e| {
            CliError::Internal(format!("cannot read the request from standard input: {e}"))
        })?;
        buf
    };
    if request.trim().is_empty() {
        return Err(CliError::Usage("the request is empty: say what rover should do, e.g. rover autopilot submit \"add a --json flag to export\"".into()));
    }
    let project_id = ctx.project_id()?;
    let store = AutopilotStore::open(&crate::project::data_dir(&ctx.host)?, &project_id)?;
    let actor = std::env::var("USER").unwrap_or_else(|_| "local".into());
    let arrival = Arrival::Local {
        request: &request,
        actor: &actor,
    };
    let entry = crate::intake::Entry::new(project_id, crate::steps::kinds::FIRST_STEP);
    let trace = crate::intake::ingest(&store, &entry, arrival)?.trace();
    out.print(&format!("submitted trace {trace}\n"))?;
    match super::wake_daemon(&store) {
        Some(pid) => {
            out.print(&format!("the daemon (pid {pid}) picks it up now; follow it with `rover autopilot trace {}`\n", crate::trace::short(trace)))?;
        }
        None => out.print(
            "no daemon is running: `rover autopilot start --once` (or `start`) processes it\n",
        )?,
    }
    Ok(ExitCode::SUCCESS)
}
