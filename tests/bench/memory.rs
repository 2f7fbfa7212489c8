//! rover's memory (docs/memory.md): the scripted series of similar issues on a repository whose
//! `make test` needs `make gen` first, run with memory off and on (the real daemon, real
//! containers, the fake agent: first-try gate passes, workflow runs and model tokens per
//! issue; needs Docker), and the retrieval of a prompt's lessons from a book of 1,000 (time and bytes added).

use std::time::Instant;

use serde_json::json;
use uuid::Uuid;

use rover::memory::{render, retrieve, retrieve_in, Evidence, LessonBook, LessonKind, NewLesson};

use crate::support::lessons::{fix, generated_tests, widget_issue, workflow_statuses};

/// Issues in the series.
const ISSUES: [&str; 4] = ["a", "b", "c", "d"];
/// Lessons in the book retrieval is timed on.
const LESSONS: usize = 1_000;
/// Retrievals timed.
const ROUNDS: usize = 200;

pub fn run() {
    println!("\n== memory (the scripted series off and on; retrieval at {LESSONS} lessons)");
    retrieval();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    for enabled in [false, true] {
        rt.block_on(series(enabled));
    }
}

/// Each issue of the series, one after the other, on one repository.
async fn series(enabled: bool) {
    let marker = std::env::temp_dir().join(format!("rover-bench-memory-{}", Uuid::new_v4()));
    let mut s = generated_tests(json!({"enabled": enabled}), &fix(&marker)).await;
    let (mut first_try, mut runs, mut tokens) = (0, 0, 0u64);
    for (i, name) in ISSUES.iter().enumerate() {
        let trace = widget_issue(&mut s, 50 + i as u64, name).await;
        let statuses = workflow_statuses(&trace);
        first_try += usize::from(statuses.first().is_some_and(|s| s == "completed"));
        runs += statuses.len();
        tokens += trace
            .spans
            .iter()
            .filter_map(rover::budget::SpanUsage::of)
            .map(|u| u.tokens())
            .sum::<u64>();
    }
    let n = ISSUES.len();
    println!(
        "  memory {:<3}  first-try gate pass {first_try}/{n}  workflow runs per issue {:.2}  model tokens per issue {:.0} (the fake agent's counts)",
        if enabled { "on" } else { "off" },
        runs as f64 / n as f64,
        tokens as f64 / n as f64
    );
}

/// A book of [`LESSONS`] distinct gate lessons on varied tasks.
fn book() -> LessonBook {
    let words = [
        "parser", "widget", "export", "csv", "login", "cache", "queue", "report", "schema", "theme",
    ];
    let mut book = LessonBook::default();
    for i in 0..LESSONS {
        let (a, b) = (
            words[i % words.len()],
            words[(i / words.len()) % words.len()],
        );
        let command = format!("make test-{i}");
        book.learn(
            NewLesson {
                kind: LessonKind::Gate,
                statement: format!("The required gate `{command}` failed; it passed after this fix: run `make gen-{a}` before it"),
                concerns: vec![command.clone()],
                topic: format!("Add the {a} {b} {i}"),
                evidence: Evidence {
                    command: vec!["make".into(), format!("test-{i}")],
                    exit_codes: vec![2, 0],
                    ..Evidence::new(Uuid::new_v4(), vec![Uuid::new_v4()], chrono::Utc::now())
                },
            },
            usize::MAX,
        );
    }
    book
}

/// Median and p95 of `times` (sorted here), in ms.
fn quantiles(times: &mut [f64]) -> (f64, f64) {
    times.sort_by(f64::total_cmp);
    (times[times.len() / 2], times[times.len() * 95 / 100])
}

/// A prompt's retrieval from a book of [`LESSONS`] in a store: as it was (the file read, parsed
/// and every lesson tokenized per prompt) and as it is (the book kept per version of the file).
fn retrieval() {
    let dir = tempfile::tempdir().unwrap();
    let store = rover::store::AutopilotStore::open(dir.path(), "bench").unwrap();
    let built = book();
    LessonBook::update(&store, |b| *b = built.clone()).unwrap();
    let query = "Add the csv parser: read quoted fields, with tests";
    let mut reread = Vec::with_capacity(ROUNDS);
    let mut got = retrieve(&built, query, 2048);
    for _ in 0..ROUNDS {
        let t = Instant::now();
        let book = LessonBook::load(&store).unwrap();
        got = retrieve(&book, query, 2048);
        reread.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let mut cached = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let t = Instant::now();
        let shelved = LessonBook::cached(&store).unwrap();
        let again = retrieve_in(&shelved.book, &shelved.index, query, 2048);
        cached.push(t.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(again, got, "the same lessons either way");
    }
    let bytes = render(&got).map_or(0, |s| s.len());
    let (m0, p0) = quantiles(&mut reread);
    let (m1, p1) = quantiles(&mut cached);
    println!(
        "  retrieval from {LESSONS} lessons: median {m1:.2} ms, p95 {p1:.2} ms with the book kept per version of the file (re-read and re-tokenized per prompt: median {m0:.2} ms, p95 {p0:.2} ms); {} lesson(s) picked, {bytes} bytes added to the prompt (budget 2048 of lesson lines)",
        got.lessons.len()
    );
}
