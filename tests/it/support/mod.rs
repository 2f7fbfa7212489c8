//! Helpers shared by the integration tests: temp dirs, fakes, the binary under test, and the test
//! worlds. Which world to use:
//! - `pipeline::Pipeline` (+ `pipeline::Case` to build one case): a step or a few steps on the
//!   in-process orchestrator, with a hand-picked step list;
//! - `pipeline::Sandboxed`: the same with real containers under a project label of their own;
//! - `pipeline::StepsWorld`: every real step plus the `rover` CLI on the same store (budgets,
//!   steering a running pipeline);
//! - `scenario::Scenario`: the real binary end to end (`start --once`) against the fake GitHub;
//! - `local::LocalWorld`: the real binary in local mode as a long-running daemon (proof suites).

pub mod chain;
pub mod child;
pub mod common;
pub mod docker;
pub mod env;
pub mod fake_agent;
pub mod fake_anthropic;
pub mod fake_app_front;
pub mod fake_github;
pub mod fake_openai;
pub mod fake_server;
pub mod flood;
pub mod git_http;
pub mod gitrepo;
pub mod lessons;
pub mod local;
pub mod orch;
pub mod otlp;
pub mod pipeline;
pub mod replay;
pub mod scenario;
pub mod script;
pub mod storegen;
pub mod swarm;
