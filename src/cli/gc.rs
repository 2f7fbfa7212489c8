//! `gc`'s sweep of rover's containers, networks and volumes on the engine (see
//! [`crate::sandbox::leftovers`]): run, and said.

use crate::sandbox::leftovers::{Kind, Reason, Sweep};

use super::{CliError, Output};

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
