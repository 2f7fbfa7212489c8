//! The layering check (docs/architecture.md): every `crate::<module>` path in `src/` is an edge
//! between two top-level modules, and an edge may only point to the same layer or a lower one:
//!
//! ```text
//! foundation (error, project, secrets, host_env) → store (store, logging)
//!   → edges (agents, github, git, proxy, sandbox, environment, agent_run) → intake (intake)
//!   → orchestrator (budget, trace, orchestrator) → pipeline (config, steps, telemetry, replay)
//!   → top (daemon, cli)
//! ```
//!
//! and no two top-level modules may import each other, directly or round a loop. Edges against
//! the layering that are known and being removed are listed in `KNOWN`, each with the fix it
//! needs; the check fails on any other, and on a listed one that is gone (so the list only
//! shrinks). Reads the source text only: `cargo test --test it layers` runs it in a second.
//!
//! It sees `crate::` paths (the project's style for reaching another module: `use crate::x::..`,
//! `use crate::{x::.., y::..}` and inline `crate::x::f()`), in code and comments alike except
//! line comments; `super::` never leaves a top-level module in this crate.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The layers, lowest first; a module may use modules of its own layer and of lower ones.
const LAYERS: &[(&str, &[&str])] = &[
    ("foundation", &["error", "project", "secrets", "host_env"]),
    ("store", &["store", "logging"]),
    (
        "edges",
        &[
            "agents",
            "github",
            "git",
            "proxy",
            "sandbox",
            "environment",
            "agent_run",
        ],
    ),
    // What brings work in (poll, webhook, reconcile, submit) and the one path into the store:
    // above the store and GitHub it reads, below the scheduler and the steps it feeds.
    ("intake", &["intake"]),
    (
        "orchestrator",
        &["budget", "trace", "orchestrator", "memory"],
    ),
    ("pipeline", &["config", "steps", "telemetry", "replay"]),
    ("top", &["daemon", "cli"]),
];

/// Edges against the layering that are known, with the change that removes each.
const KNOWN: &[(&str, &str, &str)] = &[];

/// Files of the crate root that are not a module of a layer.
const ROOT_FILES: &[&str] = &["lib.rs", "main.rs"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The `.rs` files under `dir`, sorted.
fn sorted_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    rust_files(dir, &mut files);
    files.sort();
    files
}

/// The top-level module a file belongs to (`None` for the crate root and the extra binaries).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).expect("under src");
    let mut parts = rel.iter().map(|p| p.to_string_lossy().into_owned());
    let first = parts.next()?;
    if rel.components().count() == 1 {
        if ROOT_FILES.contains(&first.as_str()) {
            return None;
        }
        return Some(first.trim_end_matches(".rs").to_owned());
    }
    (first != "bin").then_some(first)
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// `text` without its line comments.
fn code_of(text: &str) -> String {
    text.lines()
        .map(|l| l.find("//").map_or(l, |at| &l[..at]))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The modules named by `crate::` paths in `text`, with the line of each mention.
fn mentions(text: &str) -> Vec<(String, usize)> {
    // `$crate::` and `rover_crate::` are other things.
    names_after(&code_of(text), "crate::", |c| is_ident(c) || c == '$')
}

/// Edges between top-level modules, each with the places (`file:line`) that make it.
fn edges(src: &Path) -> BTreeMap<(String, String), Vec<String>> {
    let files = sorted_files(src);
    let mut edges: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for file in files {
        let Some(from) = module_of(src, &file) else {
            continue;
        };
        let text = std::fs::read_to_string(&file).expect("read a source file");
        for (to, line) in mentions(&text) {
            if to == from || to == "self" || to == "super" {
                continue;
            }
            let rel = file.strip_prefix(src).expect("under src").display();
            edges
                .entry((from.clone(), to))
                .or_default()
                .push(format!("src/{rel}:{line}"));
        }
    }
    edges
}

/// Strongly connected sets of more than one module (import cycles between modules).
fn cycles(edges: &BTreeSet<(String, String)>) -> Vec<BTreeSet<String>> {
    let nodes: BTreeSet<&String> = edges.iter().flat_map(|(a, b)| [a, b]).collect();
    let reach = |from: &String| {
        let mut seen: BTreeSet<&String> = BTreeSet::new();
        let mut todo = vec![from];
        while let Some(n) = todo.pop() {
            for (a, b) in edges {
                if a == n && seen.insert(b) {
                    todo.push(b);
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<&String>> =
        nodes.iter().map(|n| (*n, reach(n))).collect();
    let mut out: Vec<BTreeSet<String>> = Vec::new();
    for n in &nodes {
        let set: BTreeSet<String> = nodes
            .iter()
            .filter(|m| reaches[*n].contains(*m) && reaches[*m].contains(*n))
            .map(|m| (*m).clone())
            .collect();
        if set.len() > 1 && !out.contains(&set) {
            out.push(set);
        }
    }
    out
}

/// The shortest loop through the modules of `set` (first module repeated at the end).
fn shortest_loop(edges: &BTreeSet<(String, String)>, set: &BTreeSet<String>) -> Vec<String> {
    let mut best: Option<Vec<String>> = None;
    for start in set {
        let mut came: BTreeMap<&String, &String> = BTreeMap::new();
        let mut todo = std::collections::VecDeque::from([start]);
        'search: while let Some(n) = todo.pop_front() {
            for (a, b) in edges {
                if a != n || !set.contains(b) {
                    continue;
                }
                if b == start {
                    let mut path = vec![start.clone()];
                    let mut at = n;
                    while at != start {
                        path.push(at.clone());
                        at = came[at];
                    }
                    path[1..].reverse();
                    path.push(start.clone());
                    if best.as_ref().is_none_or(|p| path.len() < p.len()) {
                        best = Some(path);
                    }
                    break 'search;
                }
                if !came.contains_key(b) {
                    came.insert(b, n);
                    todo.push_back(b);
                }
            }
        }
    }
    best.expect("a strongly connected set has a loop")
}

#[test]
fn no_module_imports_a_higher_layer_and_no_modules_import_each_other() {
    let src = src_dir();
    let layer_of: BTreeMap<&str, usize> = LAYERS
        .iter()
        .enumerate()
        .flat_map(|(i, (_, mods))| mods.iter().map(move |m| (*m, i)))
        .collect();
    let edges = edges(&src);
    let mut problems = String::new();

    let mut modules: BTreeSet<String> = BTreeSet::new();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    modules.extend(files.iter().filter_map(|f| module_of(&src, f)));
    for m in &modules {
        if !layer_of.contains_key(m.as_str()) {
            let _ = writeln!(
                problems,
                "module `{m}` has no layer: add it to LAYERS (and to docs/architecture.md)"
            );
        }
    }

    let known = |from: &str, to: &str| KNOWN.iter().any(|(a, b, _)| *a == from && *b == to);
    for ((from, to), places) in &edges {
        let (Some(f), Some(t)) = (layer_of.get(from.as_str()), layer_of.get(to.as_str())) else {
            continue;
        };
        if t > f && !known(from, to) {
            let _ = writeln!(
                problems,
                "`{from}` ({} layer) uses `{to}` ({} layer), a higher layer: {}",
                LAYERS[*f].0,
                LAYERS[*t].0,
                places.join(", ")
            );
        }
    }
    for (from, to, fix) in KNOWN {
        if !edges.contains_key(&((*from).to_owned(), (*to).to_owned())) {
            let _ = writeln!(
                problems,
                "`{from}` no longer uses `{to}`: take the edge off KNOWN (it was: {fix})"
            );
        }
    }

    let allowed: BTreeSet<(String, String)> = edges
        .keys()
        .filter(|(a, b)| !known(a, b))
        .cloned()
        .collect();
    for cycle in cycles(&allowed) {
        let path = shortest_loop(&allowed, &cycle);
        let steps: Vec<String> = path
            .windows(2)
            .map(|w| {
                let places = &edges[&(w[0].clone(), w[1].clone())];
                let more = places.len().saturating_sub(3);
                let shown = places
                    .iter()
                    .take(3)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ");
                let more = if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                };
                format!("{} → {} ({shown}{more})", w[0], w[1])
            })
            .collect();
        let _ = writeln!(
            problems,
            "an import cycle between {cycle:?}, e.g. {}: {}",
            path.join(" → "),
            steps.join("; ")
        );
    }
    assert!(problems.is_empty(), "layering:\n{problems}");
}

#[test]
fn the_check_sees_grouped_inline_and_nested_crate_paths_and_skips_comments() {
    let text = "use crate::store::Span;\n\
                use crate::{\n    git::Workspace,\n    orchestrator::{blocking, Step},\n    steps,\n};\n\
                fn f() { crate::trace::short(x); $crate::no; my_crate::no; }\n\
                // crate::cli in a comment\n";
    let names: Vec<(String, usize)> = mentions(text);
    let got: Vec<(&str, usize)> = names.iter().map(|(n, l)| (n.as_str(), *l)).collect();
    assert_eq!(
        got,
        [
            ("store", 1),
            ("git", 3),
            ("orchestrator", 4),
            ("steps", 5),
            ("trace", 7)
        ]
    );
    let edges: BTreeSet<(String, String)> = [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")]
        .iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect();
    let found = cycles(&edges);
    assert_eq!(found.len(), 1);
    assert_eq!(
        found[0],
        ["a", "b", "c"].iter().map(|s| (*s).to_owned()).collect()
    );
    assert_eq!(shortest_loop(&edges, &found[0]), ["a", "b", "c", "a"]);
}

/// The steps of the pipeline (each one `Step`): none names another. What two steps share lives
/// in a shared module of `steps` (`meta`, `tasks`, `history`, `agent_call`, ...), which names
/// no step either; only the assembly (`steps/mod.rs`, `steps/pipeline.rs`) names them all.
const STEPS: &[&str] = &[
    "coordinate",
    "plan",
    "workflow",
    "commit",
    "resolve",
    "push",
    "merge",
    "release",
    "notify",
    "noop",
    "cleanup",
];
const ASSEMBLY: &[&str] = &["mod.rs", "pipeline.rs"];

/// The names that follow each `prefix` in `code` (a `{...}` group's first names at depth one),
/// with their lines; a `prefix` right after a character `not_after` accepts is another path.
fn names_after(code: &str, prefix: &str, not_after: impl Fn(char) -> bool) -> Vec<(String, usize)> {
    let line_at = |at: usize| code[..at].matches('\n').count() + 1;
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(hit) = code[from..].find(prefix) {
        let start = from + hit;
        from = start + prefix.len();
        if code[..start].chars().next_back().is_some_and(&not_after) {
            continue;
        }
        let rest = &code[from..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let mut entry_start = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    ',' if depth == 1 => entry_start = true,
                    c if depth == 1 && entry_start && is_ident(c) => {
                        let name: String =
                            group[i..].chars().take_while(|c| is_ident(*c)).collect();
                        found.push((name, line_at(from + 1 + i)));
                        entry_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            let name: String = rest.chars().take_while(|c| is_ident(*c)).collect();
            if !name.is_empty() {
                found.push((name, line_at(start)));
            }
        }
    }
    found
}

/// The modules of `steps` a file of it names (`crate::steps::x`, and `super::x` or
/// `super::super::x` where that is `steps`), its test module left out.
fn steps_named(rel: &Path, text: &str) -> Vec<(String, usize)> {
    let code = code_of(text);
    let code = code.split("#[cfg(test)]").next().unwrap_or_default();
    let depth = rel.components().count();
    let in_mod_rs = rel.file_name().is_some_and(|f| f == "mod.rs");
    // From `steps/x.rs` and `steps/x/mod.rs`, `super` is `steps`; from `steps/x/y.rs`,
    // `super::super` is.
    let up = match (depth, in_mod_rs) {
        (1, _) | (2, true) => "super::",
        (2, false) | (3, true) => "super::super::",
        _ => "super::super::super::",
    };
    let path_char = |c: char| is_ident(c) || c == ':';
    let mut names = names_after(code, "crate::steps::", path_char);
    names.extend(names_after(code, up, path_char));
    names
}

#[test]
fn no_step_names_another_step() {
    let src = src_dir();
    let steps_dir = src.join("steps");
    let files = sorted_files(&steps_dir);
    let mut wrong = Vec::new();
    for file in files {
        let rel = file.strip_prefix(&steps_dir).expect("under steps");
        if rel.components().count() == 1 && ASSEMBLY.iter().any(|a| rel == Path::new(a)) {
            continue;
        }
        let owner = rel
            .iter()
            .next()
            .map(|c| c.to_string_lossy().trim_end_matches(".rs").to_owned())
            .unwrap_or_default();
        let text = std::fs::read_to_string(&file).expect("read a source file");
        for (name, line) in steps_named(rel, &text) {
            if STEPS.contains(&name.as_str()) && name != owner {
                wrong.push(format!(
                    "src/steps/{}:{line} names the step `{name}`",
                    rel.display()
                ));
            }
        }
    }
    none_of(
        &wrong,
        "a step names another step (share it through a module of steps instead)",
    );
}

#[test]
fn the_step_check_sees_each_way_of_naming_a_step() {
    let text = "use super::meta::X;\nuse super::{tasks, resolve::y};\nlet a = crate::steps::push::z();\n// super::plan in a comment\n#[cfg(test)]\nmod tests { use super::super::notify; }\n";
    let names: Vec<String> = steps_named(Path::new("commit.rs"), text)
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, ["push", "meta", "tasks", "resolve"]);
    let nested: Vec<String> = steps_named(
        Path::new("coordinate/ci.rs"),
        "use super::gather::G;\nuse super::super::plan::p;\n",
    )
    .into_iter()
    .map(|(n, _)| n)
    .collect();
    assert_eq!(nested, ["plan"]);
}

/// Files of `steps` (outside `steps/history`) that walk a trace's spans, with why: each lists
/// every span for a person or a prompt and asks no question of them. Any other walk is a
/// question about the trace's past, which is a named query of `steps/history` (with its tests).
const SPAN_LISTINGS: &[(&str, &str)] = &[
    (
        "agent_call.rs",
        "render_trace: the trace as the prompts list it",
    ),
    (
        "resolve/render.rs",
        "render_trace: the trace as the resolver's prompt lists it",
    ),
    (
        "noop.rs",
        "chain_summary: each span's summary, joined, for a fallback message",
    ),
];

/// The lines of `code` that walk a trace's spans (`.spans` as a field).
fn span_walks(code: &str) -> Vec<usize> {
    let mut found = Vec::new();
    for (i, line) in code.lines().enumerate() {
        let mut from = 0;
        while let Some(hit) = line[from..].find(".spans") {
            let end = from + hit + ".spans".len();
            if !line[end..].chars().next().is_some_and(is_ident) {
                found.push(i + 1);
                break;
            }
            from = end;
        }
    }
    found
}

#[test]
fn only_the_history_walks_a_traces_spans() {
    let src = src_dir();
    let steps_dir = src.join("steps");
    let files = sorted_files(&steps_dir);
    let mut wrong = Vec::new();
    let mut listed_used = BTreeSet::new();
    for file in files {
        let rel = file.strip_prefix(&steps_dir).expect("under steps");
        let name = rel.to_string_lossy().replace('\\', "/");
        if name.starts_with("history/") || name.ends_with("tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("read a source file");
        let code = code_of(&text);
        let code = code.split("#[cfg(test)]").next().unwrap_or_default();
        let walks = span_walks(code);
        if walks.is_empty() {
            continue;
        }
        if SPAN_LISTINGS.iter().any(|(f, _)| *f == name) {
            listed_used.insert(name);
            continue;
        }
        for line in walks {
            wrong.push(format!("src/steps/{name}:{line}"));
        }
    }
    none_of(&wrong, "a step walks its trace's spans itself: ask `steps::history` (add a named query there, with its test)");
    for (file, why) in SPAN_LISTINGS {
        assert!(
            listed_used.contains(*file),
            "src/steps/{file} no longer lists a trace's spans: take it off SPAN_LISTINGS (it was: {why})"
        );
    }
}

#[test]
fn the_span_walk_check_sees_a_field_and_not_a_longer_name() {
    let code = "let a = view.spans.iter();\nlet b = view\n    .spans\n    .len();\nlet c = x.spans_of(y);\n";
    assert_eq!(span_walks(code), [1, 3]);
}

/// The store keeps generic records (spans, actions, the queue, cursors, what every layer reads
/// of any span): none of its types is named after a step or an intervention. What one step
/// writes is its own record, in `steps::meta` or beside its producer.
const STEP_WORDS: &[&str] = &[
    "Coordinate",
    "Plan",
    "Workflow",
    "Commit",
    "Resolve",
    "Push",
    "Merge",
    "Release",
    "Notify",
    "Noop",
    "Cleanup",
    "Intervention",
];

/// The names of the types (`struct`, `enum`, `type`) `code` declares, with their lines.
fn declared_types(code: &str) -> Vec<(String, usize)> {
    let mut found = Vec::new();
    for (i, line) in code.lines().enumerate() {
        let words: Vec<&str> = line.split_whitespace().collect();
        for pair in words.windows(2) {
            if matches!(pair[0], "struct" | "enum" | "type") {
                let name: String = pair[1].chars().take_while(|c| is_ident(*c)).collect();
                if !name.is_empty() {
                    found.push((name, i + 1));
                }
            }
        }
    }
    found
}

#[test]
fn the_store_declares_no_step_shaped_type() {
    let src = src_dir();
    let files = sorted_files(&src.join("store"));
    let mut wrong = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read a source file");
        let code = code_of(&text);
        let code = code.split("#[cfg(test)]").next().unwrap_or_default();
        for (name, line) in declared_types(code) {
            if let Some(word) = STEP_WORDS.iter().find(|w| name.contains(**w)) {
                let rel = file.strip_prefix(&src).expect("under src").display();
                wrong.push(format!("src/{rel}:{line} declares `{name}` ({word})"));
            }
        }
    }
    none_of(&wrong, "the store declares a step's record: move it to `steps::meta` (or beside its producer) and keep the JSON as it is");
}

#[test]
fn the_store_check_sees_each_kind_of_type() {
    let code = "pub struct PushPullRequest {\nenum Mode { A }\npub(crate) type Ids = Vec<u8>;\n// struct Hidden\nlet structure = 1;\n";
    let names: Vec<String> = declared_types(&code_of(code))
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, ["PushPullRequest", "Mode", "Ids"]);
}

/// Outside `steps`, no module names a step (`crate::steps::<step>`): the daemon runs intake's
/// sources and the orchestrator, and what reaches a step goes through the store or the
/// orchestrator (a CI outcome is intake's `Signal`, answered by `Step::woken_by`). Only replay
/// builds the deciding steps, through the assembly's re-exports (`crate::steps::CoordinateStep`).
#[test]
fn no_module_outside_steps_names_a_step() {
    let src = src_dir();
    let files = sorted_files(&src);
    let mut wrong = Vec::new();
    for file in files {
        let rel = file.strip_prefix(&src).expect("under src");
        if rel.starts_with("steps") {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("read a source file");
        let code = code_of(&text);
        let path_char = |c: char| is_ident(c) || c == ':';
        for (name, line) in names_after(&code, "crate::steps::", path_char) {
            if STEPS.contains(&name.as_str()) {
                wrong.push(format!(
                    "src/{}:{line} names the step `{name}`",
                    rel.display()
                ));
            }
        }
    }
    none_of(
        &wrong,
        "a module outside steps names a step (hand it work through the store or the orchestrator)",
    );
}

/// The most lines a file of `src` may have (inline tests included): past it, split the file by
/// what its parts do.
const MAX_LINES: usize = 800;

#[test]
fn no_file_in_src_is_over_800_lines() {
    let src = src_dir();
    let files = sorted_files(&src);
    let long: Vec<String> = files
        .iter()
        .filter_map(|file| {
            let lines = std::fs::read_to_string(file)
                .expect("read a source file")
                .lines()
                .count();
            (lines > MAX_LINES).then(|| {
                let rel = file.strip_prefix(&src).expect("under src").display();
                format!("src/{rel}: {lines} lines")
            })
        })
        .collect();
    none_of(
        &long,
        &format!("files over {MAX_LINES} lines (split them by what their parts do)"),
    );
}

/// `text` without its line comments and without its inline tests (from the first
/// `#[cfg(test)]` on: the crate keeps them at the end of a file).
fn code_without_tests(text: &str) -> String {
    let code = code_of(text);
    match code.find("#[cfg(test)]") {
        Some(at) => code[..at].to_owned(),
        None => code,
    }
}

/// The places (`src/<file>:<line>`) in the files of `src` outside the `allowed` folders and
/// files where `code_without_tests` has a match of `find`.
fn places_outside(src: &Path, allowed: &[&str], find: impl Fn(&str) -> Vec<usize>) -> Vec<String> {
    let files = sorted_files(src);
    let mut wrong = Vec::new();
    for file in files {
        let rel = file.strip_prefix(src).expect("under src");
        if allowed.iter().any(|a| rel.starts_with(a)) || is_test_file(rel) {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("read a source file");
        for line in find(&code_without_tests(&text)) {
            wrong.push(format!("src/{}:{line}", rel.display()));
        }
    }
    wrong
}

/// A file of unit tests (`tests.rs`, `*_tests.rs`, or under a `tests/` folder): declared
/// `#[cfg(test)]` by its parent.
fn is_test_file(rel: &Path) -> bool {
    let name = rel
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    name == "tests.rs"
        || name.ends_with("_tests.rs")
        || rel.components().any(|c| c.as_os_str() == "tests")
}

/// The crate's `src/`.
fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Fails with `what` and the places, one a line, when there are any.
#[track_caller]
fn none_of(places: &[String], what: &str) {
    assert!(places.is_empty(), "{what}:\n{}", places.join("\n"));
}

/// The lines of `code` that hold one of `needles`.
fn lines_with(code: &str, needles: &[&str]) -> Vec<usize> {
    code.lines()
        .enumerate()
        .filter(|(_, l)| needles.iter().any(|n| l.contains(n)))
        .map(|(i, _)| i + 1)
        .collect()
}

/// An agent run is one service (`src/agent_run`): the steps hand it a plan and get a run; the
/// grant, the run's token and the proxy are its business, never a step's.
#[test]
fn no_step_reaches_the_proxy_but_through_the_agent_run_service() {
    let src = src_dir();
    let in_steps = places_outside(
        &src,
        &[
            "agents",
            "agent_run",
            "budget",
            "cli",
            "config.rs",
            "daemon",
            "environment",
            "error.rs",
            "git",
            "github",
            "intake",
            "lib.rs",
            "logging.rs",
            "main.rs",
            "orchestrator",
            "project.rs",
            "proxy",
            "replay",
            "sandbox",
            "secrets.rs",
            "store",
            "telemetry",
            "trace",
            "bin",
        ],
        |code| {
            mentions(code)
                .into_iter()
                .filter(|(m, _)| m == "proxy")
                .map(|(_, l)| l)
                .collect()
        },
    );
    none_of(
        &in_steps,
        "a step names the proxy (ask `crate::agent_run` for what the run needs)",
    );
    let tokens = places_outside(&src, &["proxy", "agent_run"], |code| {
        let made = |l: &str| {
            l.contains("new_token(")
                || l.contains("token_sha256(")
                || (l.contains("Grant {") && !l.contains("::Grant {"))
        };
        code.lines()
            .enumerate()
            .filter(|(_, l)| made(l))
            .map(|(i, _)| i + 1)
            .collect()
    });
    none_of(
        &tokens,
        "a run's grant or token made outside the proxy and the agent run service",
    );
}

/// What differs between agent CLIs is an `AgentCli` in `src/agents`: no other module names
/// one CLI (a third CLI is one file there, not a new arm in every `match`).
#[test]
fn no_module_outside_agents_names_an_agent_cli() {
    let src = src_dir();
    let named = places_outside(&src, &["agents", "bin"], |code| {
        lines_with(
            code,
            &[
                "AgentKind::Claude",
                "AgentKind::Codex",
                "agents::claude::",
                "agents::codex::",
            ],
        )
    });
    none_of(
        &named,
        "a module outside src/agents names one agent CLI (ask its `AgentCli`)",
    );
}

/// `autopilot.sandbox.egress` is read where a run is defined (the agent run service, the
/// sandbox's own spec and settings) and at start (the daemon's warning), nowhere else.
#[test]
fn the_egress_is_read_where_the_run_is_defined() {
    let src = src_dir();
    let reads = places_outside(&src, &["agent_run", "sandbox", "daemon"], |code| {
        lines_with(code, &[".egress()"])
    });
    none_of(&reads, "the egress setting read outside the agent run service (ask `AgentRuns::egress` or the run's record)");
}

/// A run's container is watched by the agent run service alone: following its log, waiting on
/// it, killing it at a limit or for a stop (the steps ask `AgentRuns::look`, `take_log`,
/// `stop`, `release`). Removing leftovers (cleanup, the orphan sweep) stays where it is.
#[test]
fn only_the_agent_run_service_follows_waits_on_or_kills_a_run() {
    let src = src_dir();
    let watched = places_outside(&src, &["agent_run", "sandbox"], |code| {
        lines_with(
            code,
            &["logs_to_file(", "wait_or_kill(", ".kill(", ".wait(&"],
        )
    });
    none_of(&watched, "a run's container followed, waited on or killed outside the agent run service (ask `crate::agent_run::AgentRuns`)");
}

#[test]
fn the_service_checks_see_a_planted_violation_and_skip_tests() {
    let planted = "use crate::proxy::Grant;\nfn f() { let k = AgentKind::Codex; }\n#[cfg(test)]\nmod tests { fn g() { AgentKind::Claude; } }\n";
    let code = code_without_tests(planted);
    assert_eq!(
        mentions(&code)
            .into_iter()
            .filter(|(m, _)| m == "proxy")
            .count(),
        1
    );
    assert_eq!(lines_with(&code, &["AgentKind::Codex"]), [2]);
    assert!(lines_with(&code, &["AgentKind::Claude"]).is_empty());
    assert_eq!(
        lines_with("// AgentKind::Codex", &["AgentKind::Codex"]),
        [1]
    );
    assert!(lines_with(&code_of("// AgentKind::Codex"), &["AgentKind::Codex"]).is_empty());
}

/// The most lines a function of `src` may have, from its `fn` line to its closing brace: past
/// it, name its parts.
const MAX_FN_LINES: usize = 150;

/// The functions of `code` longer than `max` lines: their name, first line and length. A brace
/// counter over the text without strings, chars and line comments: good enough for the
/// crate's style (one `fn` item a line, bodies in braces).
fn long_functions(code: &str, max: usize) -> Vec<(String, usize, usize)> {
    let lines: Vec<String> = code.lines().map(without_literals).collect();
    let mut long = Vec::new();
    for (at, line) in lines.iter().enumerate() {
        let Some(name) = fn_name(line) else {
            continue;
        };
        let mut depth = 0_i64;
        let mut opened = false;
        let mut end = None;
        for (i, l) in lines.iter().enumerate().skip(at) {
            for c in l.chars() {
                match c {
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            if opened && depth <= 0 {
                end = Some(i);
                break;
            }
            if !opened && l.trim_end().ends_with(';') {
                break;
            }
        }
        if let Some(end) = end {
            let length = end - at + 1;
            if length > max {
                long.push((name, at + 1, length));
            }
        }
    }
    long
}

/// The name of the function a line declares (`fn name`, after any `pub`, `async`, `const`,
/// `unsafe`).
fn fn_name(line: &str) -> Option<String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words.iter().position(|w| *w == "fn")?;
    let before_ok = words[..at].iter().all(|w| {
        w.starts_with("pub") || ["async", "const", "unsafe", "extern", "\"C\""].contains(w)
    });
    let name: String = words
        .get(at + 1)?
        .chars()
        .take_while(|c| is_ident(*c))
        .collect();
    (before_ok && !name.is_empty()).then_some(name)
}

/// A line with its string and char literals emptied and its line comment cut.
fn without_literals(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars().peekable();
    let mut in_str = false;
    while let Some(c) = chars.next() {
        if in_str {
            match c {
                '\\' => {
                    chars.next();
                }
                '"' => {
                    in_str = false;
                    out.push('"');
                }
                _ => {}
            }
            continue;
        }
        match c {
            '"' => {
                in_str = true;
                out.push('"');
            }
            '\'' => {
                // A char literal ('x', '\n', '{'); a lifetime has no closing quote.
                let rest: String = chars.clone().take(3).collect();
                if let Some(escaped) = rest.strip_prefix('\\') {
                    if let Some(close) = escaped.find('\'') {
                        for _ in 0..=close + 1 {
                            chars.next();
                        }
                    }
                } else if rest.chars().nth(1) == Some('\'') {
                    chars.next();
                    chars.next();
                }
                out.push('\'');
            }
            '/' if chars.peek() == Some(&'/') => break,
            _ => out.push(c),
        }
    }
    out
}

#[test]
fn no_function_in_src_is_over_150_lines() {
    let src = src_dir();
    let files = sorted_files(&src);
    let mut long = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read a source file");
        let rel = file
            .strip_prefix(&src)
            .expect("under src")
            .display()
            .to_string();
        for (name, line, length) in long_functions(&text, MAX_FN_LINES) {
            long.push(format!("src/{rel}:{line} `{name}`: {length} lines"));
        }
    }
    none_of(
        &long,
        &format!("functions over {MAX_FN_LINES} lines (name their parts)"),
    );
}

#[test]
fn the_function_check_counts_braces_outside_literals() {
    let body = "    let x = 1;\n".repeat(4);
    let code = format!(
        "pub async fn short() {{\n{body}}}\nfn tricky() {{\n    let s = \"}}}}\"; let c = '{{';\n{body}    // }}\n}}\nfn decl();\n"
    );
    let long = long_functions(&code, 6);
    assert_eq!(long, [("tricky".to_owned(), 7, 8)], "{code}");
    assert!(long_functions(&code, 8).is_empty());
    assert_eq!(
        fn_name("    pub(crate) fn a_b<T>(x: T) {"),
        Some("a_b".into())
    );
    assert_eq!(fn_name("    let f = |x| x; // fn not"), None);
}

/// The lines of `code` where a meta is read by key (`meta.get(..)`, `meta[..]`, also across a
/// line break: `span.meta\n    .get(..)`).
fn meta_reads(code: &str) -> Vec<usize> {
    let mut compact = String::new();
    let mut line_of = Vec::new();
    for (i, line) in code.lines().enumerate() {
        for c in line.chars().filter(|c| !c.is_whitespace()) {
            compact.push(c);
            line_of.push(i + 1);
        }
    }
    let mut lines: Vec<usize> = ["meta.get(", "meta["]
        .iter()
        .flat_map(|needle| compact.match_indices(needle).map(|(at, _)| at))
        .filter(|at| {
            // `meta` itself, not the end of a longer name (`metadata[`, `run_meta.get(` are fine:
            // they are typed records or other maps).
            !compact[..*at].ends_with(|c: char| is_ident(c) && c != '.')
        })
        .map(|at| line_of[at])
        .collect();
    lines.sort_unstable();
    lines.dedup();
    lines
}

/// Where a span's or action's meta may be read by key: the typed records themselves.
const META_RECORDS: &[&str] = &[
    // The store's records and the keys it adds to any span (RunSpanMeta, ErrorMeta, ...).
    "store",
    // Every step's action and span records, and the parts steps share.
    "steps/meta",
    // What a workflow span says of its environment (EnvironmentSpanMeta).
    "environment/record.rs",
    // What a run's span says of its network (RunNetworkMeta).
    "agent_run/record.rs",
    // The replay's label of an action lists the values of a fixed list of key fields, whatever
    // their type: a printer, reading nothing it decides on.
    "replay/compare.rs",
];

/// `trace`, telemetry and every reader of a span take what it recorded through the typed
/// records the writers use, never by a key of their own.
#[test]
fn meta_is_read_by_key_only_in_its_records() {
    let src = src_dir();
    let reads = places_outside(&src, META_RECORDS, meta_reads);
    none_of(
        &reads,
        "a meta read by key outside its typed record (read it with the record's `of`)",
    );
}

#[test]
fn the_meta_check_sees_reads_across_lines_and_not_longer_names() {
    let code = "let a = span.meta.get(\"x\");\nlet b = span\n    .meta\n    .get(KEY);\nlet c = meta[\"y\"];\nlet d = metadata[\"z\"];\nlet e = run_meta.get(\"w\");\n";
    assert_eq!(meta_reads(code), [1, 3, 5]);
}

/// The steps of the pipeline, as `StepKind` names them: only the steps, the orchestrator and
/// the store's definition of the name may name one (the root `event` is intake's and the
/// store's; `Other` is a name kept as data).
const STEP_VARIANTS: &[&str] = &[
    "Coordinate",
    "Plan",
    "Workflow",
    "Commit",
    "Resolve",
    "Push",
    "Notify",
    "Noop",
    "Cleanup",
];

/// Modules that still name a step by its `StepKind` variant, each with the change that removes
/// it; the check fails on any other, and on a listed one that no longer does (the list only
/// shrinks).
const KNOWN_STEP_NAMES: &[(&str, &str)] = &[];

/// The lines of `code` naming a pipeline step's `StepKind` variant.
fn step_variants(code: &str) -> Vec<usize> {
    let path_char = |c: char| is_ident(c);
    names_after(code, "StepKind::", path_char)
        .into_iter()
        .filter(|(name, _)| STEP_VARIANTS.contains(&name.as_str()))
        .map(|(_, line)| line)
        .collect()
}

/// The store keeps a step's name as data: what a step is (terminal, recorded for replay, its
/// telemetry role, ...) is declared by the steps (`steps::kinds`), and no other module names one.
#[test]
fn only_the_steps_and_the_orchestrator_name_a_step_by_its_kind() {
    let src = src_dir();
    let mut allowed: Vec<&str> = vec!["steps", "orchestrator", "store/records/span.rs"];
    allowed.extend(KNOWN_STEP_NAMES.iter().map(|(file, _)| *file));
    let named = places_outside(&src, &allowed, step_variants);
    none_of(&named, "a module outside the steps and the orchestrator names a step (ask `steps::kinds`, or a typed record)");
    let gone: Vec<&str> = KNOWN_STEP_NAMES
        .iter()
        .filter(|(file, _)| {
            let text = std::fs::read_to_string(src.join(file)).unwrap_or_default();
            step_variants(&code_without_tests(&text)).is_empty()
        })
        .map(|(file, _)| *file)
        .collect();
    assert!(
        gone.is_empty(),
        "no longer names a step; take it off KNOWN_STEP_NAMES: {gone:?}"
    );
}

/// The store's one place that names the steps, `store/records/span.rs`, names each exactly
/// twice: in `StepKind::ALL` and in the name it is written as. Anything more is a step's
/// behaviour (whether it ends a trace, ...), which the steps declare (`steps::kinds`).
#[test]
fn the_store_names_each_step_only_to_write_its_name() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/store/records/span.rs");
    let text = std::fs::read_to_string(&path).expect("read span.rs");
    let code = code_without_tests(&text);
    let mut wrong = Vec::new();
    for variant in STEP_VARIANTS {
        let named = code.matches(&format!("StepKind::{variant}")).count();
        let exact = code
            .match_indices(&format!("StepKind::{variant}"))
            .filter(|(at, whole)| {
                !code[at + whole.len()..]
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_alphanumeric() || c == '_')
            })
            .count();
        if exact != 2 || named != exact {
            wrong.push(format!("StepKind::{variant} named {exact} times"));
        }
    }
    none_of(&wrong, "src/store/records/span.rs names a step beyond its list and its name (declare it in `steps::kinds`)");
}

#[test]
fn the_step_kind_check_sees_variants_and_not_the_root_or_other_names() {
    let code =
        "if s.step == StepKind::Push {}\nStepKind::Event\nStepKind::Other(x)\nStepKind::Pushy\n";
    assert_eq!(step_variants(code), [1]);
}

/// The backticked names in the rows of the "Where new code goes" table of
/// `docs/architecture.md`.
fn where_table_names(doc: &str) -> Vec<String> {
    let start = doc
        .find("## Where new code goes")
        .expect("the section is there");
    let section = &doc[start..];
    let end = section.find("And in general").unwrap_or(section.len());
    section[..end]
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| to add"))
        .flat_map(|l| l.split('`').skip(1).step_by(2).map(str::to_owned))
        .collect()
}

/// Whether the item `module::name` is declared (a trait, function, type or constant) in a
/// file of `src/<module>` (or `src/<module>.rs`).
fn declared_in(src: &Path, module: &str, name: &str) -> bool {
    let mut files = Vec::new();
    let dir = src.join(module);
    if dir.is_dir() {
        rust_files(&dir, &mut files);
    }
    files.push(src.join(format!("{module}.rs")));
    files.iter().any(|f| {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        ["trait", "fn", "struct", "enum", "const", "type"]
            .iter()
            .any(|kw| {
                text.contains(&format!("{kw} {name}("))
                    || text.contains(&format!("{kw} {name}<"))
                    || text.contains(&format!("{kw} {name}:"))
                    || text.contains(&format!("{kw} {name} "))
                    || text.contains(&format!("{kw} {name};"))
            })
    })
}

#[test]
fn the_where_new_code_goes_table_names_what_is_there() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("src");
    let doc = std::fs::read_to_string(root.join("docs/architecture.md")).expect("read the doc");
    let names = where_table_names(&doc);
    assert!(names.len() > 15, "{names:?}");
    let mut missing = Vec::new();
    for name in &names {
        if let Some(path) = name.strip_prefix("src/") {
            if !src.join(path.trim_end_matches('/')).exists() {
                missing.push(name.clone());
            }
            continue;
        }
        if let Some(path) = name.strip_prefix("tests/") {
            if !root.join("tests").join(path).exists() {
                missing.push(name.clone());
            }
            continue;
        }
        let parts: Vec<&str> = name.split("::").collect();
        let is_module = |m: &str| src.join(m).is_dir() || src.join(format!("{m}.rs")).is_file();
        let found = match parts.as_slice() {
            [module, item] if is_module(module) => declared_in(&src, module, item),
            // `Step::woken_by`: a method of a trait the table names elsewhere.
            [_, method] => {
                declared_in(&src, "orchestrator", method) || declared_in(&src, "steps", method)
            }
            // Plain names (`StepKind`, `CLIS`, `build_steps`, ...): declared somewhere in src.
            [item] if item.chars().all(is_ident) => {
                std::fs::read_dir(&src).expect("src").flatten().any(|e| {
                    let module = e
                        .file_name()
                        .to_string_lossy()
                        .trim_end_matches(".rs")
                        .to_owned();
                    declared_in(&src, &module, item)
                })
            }
            // Settings (`autopilot.sandbox.backend`) and the like: not code names.
            _ => true,
        };
        if !found {
            missing.push(name.clone());
        }
    }
    assert!(
        missing.is_empty(),
        "docs/architecture.md's \"Where new code goes\" names what is not in the tree: {missing:?}"
    );
}

/// A failing command exits with the code of its error's kind (`crate::error::ErrorKind`, via
/// `cli::main`): no module picks an exit code of its own but the two whose codes are outcomes,
/// not errors (`start --once`'s "a step failed" and "GitHub unavailable", `replay`'s verdict, a
/// second signal's 130).
#[test]
fn exit_codes_come_from_error_kinds() {
    let src = src_dir();
    let picked = places_outside(
        &src,
        &[
            "bin",
            "cli/mod.rs",
            "cli/replay.rs",
            "daemon/shutdown.rs",
            "daemon/signals.rs",
            "main.rs",
        ],
        |code| {
            lines_with(
                code,
                &[
                    "ExitCode::FAILURE",
                    "ExitCode::from(",
                    "std::process::exit(",
                ],
            )
        },
    );
    none_of(
        &picked,
        "an exit code picked outside the error kinds (return a kinded error instead)",
    );
    // And no error of the command line is a bare "refused" string: each says its kind.
    let cli = std::fs::read_to_string(src.join("cli/mod.rs")).unwrap();
    let variants = cli
        .split("pub enum CliError {")
        .nth(1)
        .and_then(|rest| rest.split("\n}\n").next())
        .expect("CliError");
    assert!(!variants.contains("Refused(String)"), "{variants}");
}

/// What reads the process environment itself.
const ENV_READS: &[&str] = &[
    "std::env::var",
    "env::var(",
    "env::var_os(",
    "env::vars(",
    "env::vars_os(",
];

/// Where rover may read its environment: the command line (which takes the one snapshot,
/// `HostEnv::from_process`, and hands it to the daemon), the snapshot itself, the extra binaries,
/// and the daemon's fault hook of debug builds (`ROVER_TEST_PANIC`, for the supervision tests).
const ENV_READERS: &[&str] = &[
    "cli",
    "main.rs",
    "host_env.rs",
    "bin",
    "daemon/supervise.rs",
];

/// The environment is read where rover starts and handed down as a `HostEnv` (or settings made
/// of it): nothing below reads it, inline tests included, so a test builds any configuration
/// without setting a variable of its process.
#[test]
fn the_environment_is_read_only_where_rover_starts() {
    let src = src_dir();
    let files = sorted_files(&src);
    let mut reads = Vec::new();
    for file in files {
        let rel = file.strip_prefix(&src).expect("under src");
        if ENV_READERS.iter().any(|a| rel.starts_with(a)) {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("read a source file");
        for line in lines_with(&code_of(&text), ENV_READS) {
            reads.push(format!("src/{}:{line}", rel.display()));
        }
    }
    none_of(&reads, "the process environment read below the command line and the daemon (take a `HostEnv` from the caller)");
}

#[test]
fn the_environment_check_sees_a_planted_read_and_skips_comments() {
    let planted = "fn f() {\n    // std::env::var(\"HOME\") is not read here\n    let home = std::env::var_os(\"HOME\");\n    let all = env::vars();\n    let host = host.var_os(\"HOME\");\n}\n#[cfg(test)]\nmod tests { fn g() { let _ = std::env::var(\"X\"); } }\n";
    assert_eq!(lines_with(&code_of(planted), ENV_READS), [3, 4, 8]);
    assert!(lines_with(&code_of("/// `std::env::vars_os()`"), ENV_READS).is_empty());
}
