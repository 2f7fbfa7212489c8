//! The integration tests: one binary, one module per subsystem, shared helpers in `support`.

// Test code favours short names and owned fixtures over pedantic style.
#![allow(clippy::many_single_char_names, clippy::needless_pass_by_value)]

mod support;

mod agents;
mod budget;
/// The Docker Swarm tests: one chain on the shared two-node test swarm, one at a time;
/// `tests/run.sh` runs them (`cluster::`) in a process of their own beside the rest.
mod cluster {
    mod swarm;
    mod swarm_cancel;
    mod swarm_registry;
}
mod collect;
mod contributor_prs;
mod daemon;
mod dashboard;
mod dashboard_browser;
mod dashboard_pages;
mod demo;
mod engine_gc;
mod environments;
mod fleet;
mod fleet_budget;
mod fleet_inspect;
mod fleet_installed;
mod fleet_proxy;
mod follow_through;
mod git;
mod github;
mod github_app;
mod idle;
mod inspect;
mod intake;
mod intervene;
mod layers;
mod lifecycle;
mod memory;
pub mod network;
mod orchestrator;
mod proof;
mod real_cli;
mod replay;
mod sandbox;
mod sandbox_shipped;
mod scenarios;
mod self_review;
mod setup_steps;
mod slots;
mod soak;
mod steps_decide;
mod steps_resolve;
mod steps_workflow;
mod store;
mod store_cold;
mod supervise;
mod telemetry;
mod third_cli;
mod thread;
mod webhook;
