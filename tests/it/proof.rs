//! The proof suites (issue 8, item 7): chaos (SIGKILL at random moments with workflows in real
//! containers), concurrency (readers against a writing daemon; one daemon at a time), bad input
//! (agents, GitHub, `rover.json`) and security (trust, secrets, no force-push). Each suite prints
//! its figures on stderr (`cargo test --test it proof:: -- --nocapture` shows them).

mod bad_input;
mod chaos;
mod concurrency;
pub mod escape;
mod security;
