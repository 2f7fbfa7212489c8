//! rover: a daemon that watches a GitHub repository and reacts to its events with coding agents.
//!
//! The binary in `main.rs` is a thin shell over this library; integration tests and benches use
//! the library directly.

pub mod agents;
pub mod cli;
pub mod git;
pub mod github;
pub mod project;
pub mod sandbox;
pub mod store;
pub mod trace;
pub mod orchestrator;
pub mod steps;
pub mod config;
pub mod logging;
