//! rover: a daemon that watches a GitHub repository and reacts to its events with coding agents.
//!
//! The binary in `main.rs` is a thin shell over this library; integration tests and benches use
//! the library directly.

pub mod agent_run;
pub mod agents;
pub mod budget;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod environment;
pub mod error;
pub mod git;
pub mod github;
pub mod host_env;
pub mod intake;
pub mod logging;
pub mod memory;
pub mod orchestrator;
pub mod project;
pub mod proxy;
pub mod replay;
pub mod sandbox;
pub mod secrets;
pub mod steps;
pub mod store;
pub mod telemetry;
pub mod trace;
