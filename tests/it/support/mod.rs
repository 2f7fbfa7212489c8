//! Helpers shared by the integration tests: temp dirs, fakes, the binary under test.

pub mod child;
pub mod docker;
pub mod env;
pub mod fake_agent;
pub mod fake_anthropic;
pub mod fake_github;
pub mod fake_openai;
pub mod fake_server;
pub mod gitrepo;
pub mod local;
pub mod pipeline;
pub mod scenario;
pub mod storegen;
