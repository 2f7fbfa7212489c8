//! The integration tests: one binary, one module per subsystem, shared helpers in `support`.

mod support;

mod agents;
mod git;
mod github;
mod sandbox;
