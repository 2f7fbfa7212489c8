//! rover's benchmarks: `cargo bench --bench rover` prints every figure the README quotes.
//!
//! Figures, not pass/fail: each line says what was measured, on this machine's disk, and the bar
//! it is compared against. `cargo bench --bench rover -- store` runs only the store section.

// Figures are arithmetic on counts and durations: float casts are the point.
#![allow(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

mod agents;
mod cold;
mod dashboard;
mod e2e;
mod fleet;
mod memory;
mod merge;
mod orchestrator;
mod prompts;
mod registry;
mod sandbox;
mod store;
mod swarm;
mod telemetry;
mod workspace;

/// The integration tests' helpers (the stateful fake GitHub, the scenario driver), for the
/// figures only a whole scenario shows.
#[path = "../it/support/mod.rs"]
#[allow(
    dead_code,
    unused_imports,
    clippy::many_single_char_names,
    clippy::needless_pass_by_value
)]
mod support;

fn main() {
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let wants = |name: &str| filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str()));
    println!(
        "rover benchmarks ({} cores, {})",
        std::thread::available_parallelism().map_or(1, std::num::NonZero::get),
        chrono::Utc::now().format("%Y-%m-%d")
    );
    let mut floor = None;
    if wants("store") {
        floor = Some(store::run());
    }
    if wants("dashboard") {
        dashboard::run();
    }
    if wants("cold") {
        cold::run();
    }
    if wants("orchestrator") {
        let floor = floor.unwrap_or_else(store::floor_only);
        orchestrator::run(floor);
    }
    if wants("agents") {
        agents::run();
    }
    if wants("e2e") {
        e2e::run();
    }
    if wants("memory") {
        memory::run();
    }
    if wants("merge") {
        merge::run();
    }
    if wants("fleet") {
        fleet::run();
    }
    if wants("prompts") {
        prompts::run();
    }
    if wants("sandbox") {
        sandbox::run();
    }
    if wants("telemetry") {
        telemetry::run();
    }
    if wants("workspace") {
        workspace::run();
    }
    if wants("swarm") {
        swarm::run();
    }
    if wants("swarm-registry") {
        registry::run();
    }
}

/// Median and 99th percentile of a sample, in microseconds.
pub fn percentiles(mut samples: Vec<f64>) -> (f64, f64) {
    samples.sort_by(f64::total_cmp);
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99))
}
