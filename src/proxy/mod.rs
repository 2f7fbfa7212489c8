//! The per-run model and egress proxy.
//!
//! An agent's container sits on an internal network whose only other member is the run's
//! [`relay`], which hands each connection to the long-lived proxy server ([`serve`]) over a unix
//! socket, prefixed by a preamble naming the run. The proxy holds the real model credentials;
//! the agent holds a per-run token that only this proxy accepts, for this run, while its grant
//! lasts. All the proxy knows is in files under its dir, so it outlives the daemon process:
//!
//! - `runs/<run>/grant.json` ([`Grant`]): written by the daemon, read on every request;
//! - `runs/<run>/ledger.json` ([`Ledger`]): written by the proxy (under `ledger.lock`), read by
//!   the daemon;
//! - `runs/<run>/workspace-in.tar`, `workspace-limit` (written by the daemon) and
//!   `workspace-out.tar` (written by the proxy): a workspace shipped over the run's network
//!   ([`workspace`]);
//! - `proxy.sock`: the socket the server listens on.
//!
//! A daemon of one checkout runs one server for its store, whose dir is `<store>/proxy`. A
//! daemon serving a daemon file runs one for all its repositories, whose dir holds a store dir
//! per repository, `<key>/runs/<run>/...` (the key is the project id; the store's `proxy` links
//! there): the relay names the key in the preamble (`ROVER-RUN <key>/<run>`, [`preamble`]), and
//! everything the server does for a connection (the grant, the ledger, the store's live spend
//! for its day and month limits, the reservations of its requests in flight, the rebaselining)
//! is that store's alone. What spans the repositories is [`daemon_wide`]'s shared file.

mod bookkeeping;
mod config;
mod daemon_wide;
mod egress;
pub mod env;
mod error;
mod grant;
mod ledger;
mod limits;
mod metered;
mod model;
mod policy;
mod preamble;
mod relay;
mod reserve;
mod respond;
mod routes;
mod server;
mod spend;
mod usage;
mod workspace;

#[cfg(test)]
mod tests;

pub use bookkeeping::{
    end_run, forget_run, run_trace, runs_in_flight, runs_with_files, shared_runs_in_flight,
    PeriodSpend, RecordedSpend,
};
pub use config::{Credential, ProxyConfig, ProxyPrices, Upstream};
pub use daemon_wide::{
    periods, run_recorded as daemon_run_recorded, DaemonSpend, Held as DaemonHeld, LiveRun, Tally,
    WireStops, HOLD_TTL_SECS, LIVE_TTL_SECS, SPEND_FILE,
};
pub use error::ProxyError;
pub use grant::{
    is_valid_key, is_valid_run, new_token, token_sha256, Egress, Grant, GrantBudget, PeriodBudget,
    Provider, DEFAULT_MAX_REQUESTS, RUNS_DIR,
};
pub use ledger::{
    model_key, ConnectionRow, Ledger, ModelUsage, Refusal, Stopped, TokenUsage,
    MAX_CONNECTION_ROWS, MAX_MODELS, MAX_MODEL_CHARS, MAX_REFUSALS, OTHER_HOST, OTHER_MODEL,
    UNKNOWN_MODEL,
};
pub use limits::{
    BODY_BUDGET_BYTES, BODY_TIMEOUT, HEADER_TIMEOUT, MAX_CONNECTIONS_PER_RUN, ROOM_TIMEOUT,
    RUN_BODY_BYTES,
};
pub use model::{MAX_REQUEST_BYTES, OAUTH_BETA};
pub use preamble::{
    preamble, read_preamble, BadPreamble, RunRef, MAX_PREAMBLE_BYTES, PREAMBLE_PREFIX,
};
pub use relay::relay;
pub use reserve::{worst_case, Worst, DEFAULT_MAX_OUTPUT_TOKENS};
pub use routes::{route, Route, MODEL_ROUTES};
pub use server::serve;
pub use spend::{live_spend, trace_spend, LiveSpend};
pub use usage::{SeenUsage, UsageParser, MAX_EVENT_BYTES, MAX_JSON_BYTES};
pub use workspace::{
    WORKSPACE_IN, WORKSPACE_LIMIT, WORKSPACE_OUT, WORKSPACE_PATH, WORKSPACE_REFUSED,
};

/// The socket the proxy server listens on, in its dir.
pub const SOCKET_FILE: &str = "proxy.sock";
