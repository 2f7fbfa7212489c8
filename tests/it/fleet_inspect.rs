//! One place to look: outside a checkout, `status`, `traces`, `events`, `dead-letters`, `gc` and
//! `trace` read every repository of the daemon file, each from its own store, with a REPO column
//! (`"repo"` in the JSON), `--repo` to narrow; a repository with no store yet is said, one whose
//! store cannot be read is an error naming the file while the others are still shown; `events`
//! also lists the deliveries the webhook endpoint refused. The stores are written through the
//! store's own write paths (`support::storegen`), the binary run as a user runs it, no Docker.

use std::path::Path;
use std::process::{Command, Output};

use chrono::Duration;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::support::env::{rover_bin, stderr, stdout};
use crate::support::gitrepo::git;
use crate::support::storegen::{meta, Gen, TraceWriter};
use rover::store::{AutopilotStore, IntakeOutcome, IntakeRecord, Meta, Span, SpanStatus, StepKind};

/// A data dir with the stores of `octo-org/api` and `octo-org/web`, and a daemon file naming
/// them and `octo-org/new` (not cloned yet: no store).
struct World {
    dir: tempfile::TempDir,
    api: AutopilotStore,
    web: AutopilotStore,
    /// The traces, by repository: api's two, web's one.
    api_traces: Vec<Uuid>,
    web_trace: Uuid,
    gen: Gen,
}

impl World {
    fn new() -> World {
        let dir = tempfile::tempdir().expect("temp dir");
        let root = dir.path();
        let home = root.join("home");
        std::fs::create_dir_all(home.join(".config/rover")).unwrap();
        let api = store_of(root, "api");
        let web = store_of(root, "web");
        std::fs::write(
            home.join(".config/rover/daemon.json"),
            json!({"repositories": [
                {"repo": "octo-org/api", "checkout": root.join("api")},
                {"repo": "octo-org/web", "checkout": root.join("web")},
                "octo-org/new",
            ]})
            .to_string(),
        )
        .unwrap();
        let mut gen = Gen::new(7);
        // Interleaved in time: api's first, web's, api's second.
        let api_first = traced(&api, &mut gen, 0, "IssuesEvent opened #1 by alice: api one");
        let web_trace = traced(
            &web,
            &mut gen,
            10_000,
            "IssuesEvent opened #2 by bob: web one",
        );
        let api_second = traced(
            &api,
            &mut gen,
            20_000,
            "IssuesEvent opened #3 by carol: api two",
        );
        let t0 = gen.t0;
        for (store, secs, number, trace) in [
            (&api, 1, 1, api_first),
            (&web, 11, 2, web_trace),
            (&api, 21, 3, api_second),
        ] {
            let mut r = IntakeRecord::new(
                "poll",
                IntakeOutcome::Ingested,
                t0 + Duration::seconds(secs),
            );
            r.kind = Some("IssuesEvent".into());
            r.action = Some("opened".into());
            r.number = Some(number);
            r.trace_id = Some(trace);
            store.append_intake(&[r]).unwrap();
        }
        World {
            dir,
            api,
            web,
            api_traces: vec![api_first, api_second],
            web_trace,
            gen,
        }
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    /// `rover autopilot <args>` in a folder that is no checkout, the daemon file at its default
    /// place; no engine to sweep (gc says it cannot list, and touches nothing).
    fn rover(&self, args: &[&str]) -> Output {
        let home = self.root().join("home");
        Command::new(rover_bin())
            .arg("autopilot")
            .args(args)
            .current_dir(&home)
            .env("HOME", &home)
            .env_remove("XDG_CONFIG_HOME")
            .env("ROVER_DATA_DIR", self.root().join("data"))
            .env("NO_COLOR", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env(
                "DOCKER_HOST",
                format!("unix://{}", self.root().join("no-docker.sock").display()),
            )
            .env_remove("GITHUB_TOKEN")
            .env_remove("GH_TOKEN")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .output()
            .expect("run rover")
    }

    fn json(&self, args: &[&str]) -> Value {
        let out = self.rover(args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        serde_json::from_slice(&out.stdout).expect("JSON")
    }

    fn refused(&self, text: &str) {
        let dir = self.root().join("data").join("daemon");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("refused.jsonl"), text).unwrap();
    }
}

/// A checkout of `octo-org/<name>` under `root` (its `origin` on GitHub), and its store.
fn store_of(root: &Path, name: &str) -> AutopilotStore {
    let checkout = root.join(name);
    std::fs::create_dir_all(&checkout).unwrap();
    git(&checkout, &["init", "-q", "-b", "main"]);
    git(
        &checkout,
        &[
            "remote",
            "add",
            "origin",
            &format!("https://github.com/octo-org/{name}.git"),
        ],
    );
    let project = rover::project::Project::discover(&checkout).expect("a checkout");
    AutopilotStore::open(&root.join("data"), &project.id).expect("open store")
}

/// A finished trace started `ms` after the generator's start, labelled `label`.
fn traced(store: &AutopilotStore, gen: &mut Gen, ms: i64, label: &str) -> Uuid {
    let mut t = TraceWriter::start(store, gen, ms, label);
    let root = t.trace_id;
    let a = t.act(root, StepKind::Coordinate, "a new issue", json!({}));
    t.run(
        &a,
        100,
        SpanStatus::Completed,
        "decided noop",
        json!({"decision": "noop"}),
    );
    root
}

/// A finished trace with the id `id` in `store`, started `ms` in.
fn trace_with_id(store: &AutopilotStore, gen: &Gen, id: Uuid, ms: i64) {
    let mut root = Span::root(
        id,
        gen.at(ms),
        meta(json!({"type": "IssuesEvent", "action": "opened", "label": "twin"})),
    );
    root.finish(SpanStatus::Completed, "twin", Meta::new(), gen.at(ms + 5))
        .unwrap();
    store.create_trace(&root, None, &[]).unwrap();
}

fn short(id: Uuid) -> String {
    id.to_string()[..8].to_owned()
}

/// The lines of `text` that are table rows of repository `repo`.
fn rows_of<'a>(text: &'a str, repo: &str) -> Vec<&'a str> {
    text.lines()
        .filter(|l| l.split_whitespace().next() == Some(repo))
        .collect()
}

#[test]
fn traces_lists_every_repository_newest_first_with_its_repo_and_narrows_with_repo() {
    let w = World::new();
    let out = w.rover(&["traces"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("REPO "), "{text}");
    assert!(lines[0].contains("TRACE"), "{text}");
    let expected = [
        ("octo-org/api", w.api_traces[1]),
        ("octo-org/web", w.web_trace),
        ("octo-org/api", w.api_traces[0]),
    ];
    for (line, (repo, trace)) in lines[1..4].iter().zip(expected) {
        let cells: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(cells[..2], [repo, short(trace).as_str()], "{text}");
    }
    assert_eq!(
        lines[4], "octo-org/new: no store yet (not served yet, or nothing recorded)",
        "{text}"
    );

    // The limit applies to the merged list.
    let text = stdout(&w.rover(&["traces", "--limit", "2"]));
    assert_eq!(rows_of(&text, "octo-org/api").len(), 1, "{text}");
    assert_eq!(rows_of(&text, "octo-org/web").len(), 1, "{text}");

    let list = w.json(&["traces", "--json"]);
    let got: Vec<(String, String)> = list["traces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["repo"].as_str().unwrap().to_owned(),
                t["traceId"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let want: Vec<(String, String)> = expected
        .iter()
        .map(|(repo, trace)| ((*repo).to_owned(), trace.to_string()))
        .collect();
    assert_eq!(got, want);

    // --repo narrows (repeatable, in any case), and an unknown one names those served.
    let text = stdout(&w.rover(&["traces", "--repo", "Octo-Org/Web"]));
    assert_eq!(rows_of(&text, "octo-org/web").len(), 1, "{text}");
    assert!(rows_of(&text, "octo-org/api").is_empty(), "{text}");
    assert!(!text.contains("octo-org/new"), "{text}");
    let list = w.json(&[
        "traces",
        "--json",
        "--repo",
        "octo-org/web",
        "--repo",
        "octo-org/api",
    ]);
    assert_eq!(list["traces"].as_array().unwrap().len(), 3);
    let out = w.rover(&["traces", "--repo", "octo-org/gone"]);
    assert_eq!(out.status.code(), Some(66), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(
        said.contains(
            "does not list octo-org/gone: it serves octo-org/api, octo-org/web, octo-org/new"
        ),
        "{said}"
    );
    let out = w.rover(&["traces", "--repo", "not a name"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));

    // status narrows the same way.
    let text = stdout(&w.rover(&["status", "--repo", "octo-org/web"]));
    assert_eq!(rows_of(&text, "octo-org/web").len(), 1, "{text}");
    assert!(!text.contains("octo-org/api"), "{text}");
}

#[test]
fn events_merges_every_repository_by_time_with_the_deliveries_the_endpoint_refused() {
    let w = World::new();
    w.refused(concat!(
        r#"{"at": "2026-11-20T09:15:05Z", "deliveryId": "d-1", "event": "issues", "repo": "stranger/repo", "reason": "not served\u001b[2J here"}"#,
        "\n",
        r#"{"at": "2026-11-20T09:15:15Z", "deliveryId": null, "event": "ping", "repo": null, "reason": "no repository named"}"#,
        "\n",
        r#"{"at": "2026-11-20T09:15:30Z", "deliveryId": "d-3", "ev"#,
    ));
    let out = w.rover(&["events"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        !text.contains('\x1b'),
        "a delivery's bytes reach no terminal: {text}"
    );
    let repos: Vec<&str> = text
        .lines()
        .filter(|l| !l.contains("no store yet"))
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(
        repos,
        [
            "octo-org/api",
            "stranger/repo",
            "octo-org/web",
            "-",
            "octo-org/api"
        ],
        "{text}"
    );
    let refused = rows_of(&text, "stranger/repo")[0];
    assert!(refused.contains(" webhook "), "{refused}");
    assert!(refused.contains(" refused "), "{refused}");
    assert!(refused.contains("issues (event d-1)"), "{refused}");
    assert!(
        refused.ends_with(": not served\\u{1b}[2J here"),
        "{refused}"
    );
    let web = rows_of(&text, "octo-org/web")[0];
    assert!(
        web.contains(&format!("-> trace {}", short(w.web_trace))),
        "{web}"
    );
    assert!(text.contains("octo-org/new: no store yet"), "{text}");

    let list = w.json(&["events", "--json"]);
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 5);
    assert_eq!(list[0]["repo"], "octo-org/api");
    assert_eq!(list[0]["outcome"], "ingested");
    assert_eq!(list[1]["repo"], "stranger/repo");
    assert_eq!(list[1]["outcome"], "refused");
    assert_eq!(list[1]["eventId"], "d-1");
    assert_eq!(list[3]["repo"], Value::Null);
    assert_eq!(list[3]["reason"], "no repository named");
    assert_eq!(list[2]["traceId"], w.web_trace.to_string());

    // The limit keeps the most recent of the merged list; --repo leaves the refused out.
    let list = w.json(&["events", "--json", "--limit", "2"]);
    let repos: Vec<&Value> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|e| &e["repo"])
        .collect();
    assert_eq!(repos, [&Value::Null, &json!("octo-org/api")]);
    let list = w.json(&["events", "--json", "--repo", "octo-org/api"]);
    assert_eq!(list.as_array().unwrap().len(), 2);
    assert!(list
        .as_array()
        .unwrap()
        .iter()
        .all(|e| e["repo"] == "octo-org/api"));

    // A malformed earlier line is an error naming the file and the line; the rest is shown.
    w.refused("{\"at\": \"2026-11-20T09:15:05Z\"\n{}\n");
    let out = w.rover(&["events"]);
    assert_eq!(out.status.code(), Some(65), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(
        said.contains("refused.jsonl does not parse: line 1"),
        "{said}"
    );
    assert_eq!(rows_of(&stdout(&out), "octo-org/api").len(), 2);
}

#[test]
fn dead_letters_and_gc_read_each_repository_s_store_and_the_engine_once() {
    let mut w = World::new();
    let web = w.web.clone();
    let mut t = TraceWriter::start(
        &web,
        &mut w.gen,
        30_000,
        "IssuesEvent opened #4 by dan: web two",
    );
    let root = t.trace_id;
    let letter = t.act(
        root,
        StepKind::Other("translate".into()),
        "from a newer rover",
        json!({}),
    );
    let text = stdout(&w.rover(&["dead-letters"]));
    let rows = rows_of(&text, "octo-org/web");
    assert_eq!(rows.len(), 1, "{text}");
    assert!(rows[0].contains(&short(letter.id)), "{text}");
    assert!(rows[0].contains("\"translate\""), "{text}");
    assert!(rows_of(&text, "octo-org/api").is_empty(), "{text}");
    let list = w.json(&["dead-letters", "--json"]);
    let letters = list["deadLetters"].as_array().unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0]["repo"], "octo-org/web");
    assert_eq!(letters[0]["actionId"], letter.id.to_string());
    let list = w.json(&["dead-letters", "--json", "--repo", "octo-org/api"]);
    assert_eq!(list["deadLetters"], json!([]));

    // gc: each store's plan with its repository, the engine's sweep once.
    let plan = w.json(&["gc", "--dry-run", "--json"]);
    let repos: Vec<&Value> = plan["repositories"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["repo"])
        .collect();
    assert_eq!(repos, [&json!("octo-org/api"), &json!("octo-org/web")]);
    for r in plan["repositories"].as_array().unwrap() {
        assert_eq!(r["retainDays"], 7);
        assert!(r["plan"].is_object(), "{r}");
        assert!(r.get("leftovers").is_none(), "{r}");
    }
    assert!(plan["leftovers"].is_object(), "{plan}");
    let out = w.rover(&["gc", "--dry-run", "--retain-days", "3"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert_eq!(
        text.matches("due now (ended more than 3 day(s) ago):")
            .count(),
        1,
        "{text}"
    );
    assert!(text.contains("octo-org/new: no store yet"), "{text}");
}

#[test]
fn a_store_that_cannot_be_read_is_an_error_naming_it_and_the_others_are_shown() {
    let w = World::new();
    let intake = w.web.intake_path();
    let mut text = std::fs::read_to_string(&intake).unwrap();
    text.push_str("{not json\n");
    std::fs::write(&intake, text).unwrap();
    let out = w.rover(&["events"]);
    assert_eq!(out.status.code(), Some(65), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(
        said.contains(&format!(
            "error: octo-org/web: {} does not parse: line 2",
            intake.display()
        )),
        "{said}"
    );
    assert_eq!(rows_of(&stdout(&out), "octo-org/api").len(), 2);
    // With --json the rows of the others are printed, the error on stderr.
    let out = w.rover(&["events", "--json"]);
    assert_eq!(out.status.code(), Some(65));
    let list: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 2);

    // status says it on the line, and exits with its kind.
    let state = w.web.root().join("autopilot").join("state.json");
    std::fs::write(&state, "{not json").unwrap();
    let out = w.rover(&["status"]);
    assert_eq!(out.status.code(), Some(65), "{}", stdout(&out));
    let line = rows_of(&stdout(&out), "octo-org/web").join("\n");
    assert!(line.contains("its store cannot be read"), "{line}");
    assert!(line.contains("state.json"), "{line}");
    assert!(
        stderr(&out).contains("error: octo-org/web: "),
        "{}",
        stderr(&out)
    );
    assert_eq!(rows_of(&stdout(&out), "octo-org/api").len(), 1);
}

#[test]
fn trace_finds_a_trace_in_any_repository_and_a_prefix_in_two_is_an_error_naming_both() {
    let w = World::new();
    let out = w.rover(&["trace", &short(w.web_trace)]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("web one"), "{}", stdout(&out));

    let a = Uuid::parse_str("abcdef01-1111-4111-8111-111111111111").unwrap();
    let b = Uuid::parse_str("abcdef01-2222-4222-8222-222222222222").unwrap();
    trace_with_id(&w.api, &w.gen, a, 40_000);
    trace_with_id(&w.web, &w.gen, b, 41_000);
    let out = w.rover(&["trace", "abcdef01"]);
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    let said = stderr(&out);
    assert!(said.contains(&format!("octo-org/api ({a})")), "{said}");
    assert!(said.contains(&format!("octo-org/web ({b})")), "{said}");
    let out = w.rover(&["trace", "abcd"]);
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    assert!(stderr(&out).contains("too short"), "{}", stderr(&out));
    assert!(!stderr(&out).contains("octo-org"), "{}", stderr(&out));
    let out = w.rover(&["trace", "abcdef01", "--repo", "octo-org/web", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let view: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(view["traceId"], b.to_string());
}
