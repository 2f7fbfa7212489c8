//! Helpers shared by the integration tests: temp dirs, fakes, the binary under test.

pub mod fake_agent;
