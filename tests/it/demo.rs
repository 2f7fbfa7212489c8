//! The newcomer's demo (`docs/demo/run.sh`) runs end to end, as the README promises.

use std::path::Path;
use std::process::Command;

/// The steps the demo's trace goes through, as `trace` and the dashboard show them.
const DEMO_STEPS: [&str; 7] = [
    "coordinate",
    "plan",
    "workflow",
    "commit",
    "resolve",
    "push",
    "notify",
];

#[test]
fn the_demo_script_runs_the_whole_pipeline_and_shows_the_trace() {
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_rover")).parent().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new("bash")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/demo/run.sh"))
        .env("ROVER_DEMO_BIN_DIR", bin_dir)
        .env("TMPDIR", tmp.path())
        .env_remove("GITHUB_TOKEN")
        .env_remove("GH_TOKEN")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if let Some(trace) = text
        .lines()
        .find_map(|l| l.strip_prefix("submitted trace "))
    {
        crate::support::docker::remove_containers(&format!("rover.trace={}", trace.trim()));
    }
    assert!(out.status.success(), "the demo failed:\n{text}");
    assert!(text.contains("outcome  notify (completed)"), "{text}");
    for step in DEMO_STEPS {
        assert!(
            text.contains(&format!("─ {step} ")),
            "the trace shows {step}:\n{text}"
        );
    }
    assert!(
        text.contains("answer for "),
        "start printed the local answer:\n{text}"
    );
    assert!(
        text.contains(r#"echo '["sprocket","gear","flange"]'"#),
        "the pushed branch has the change:\n{text}"
    );
    dashboard_shows_the_demos_trace(&text);
}

/// The dashboard command the demo prints, run as printed (on a free port): the trace's page
/// shows the demo's trace as a timeline, every step of it.
fn dashboard_shows_the_demos_trace(text: &str) {
    let trace = text
        .lines()
        .find_map(|l| l.strip_prefix("submitted trace "))
        .expect("the demo's trace id")
        .trim();
    let printed = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("cd "))
        .filter(|l| l.ends_with(" autopilot dashboard"))
        .unwrap_or_else(|| panic!("the demo prints the dashboard's command:\n{text}"));
    let (dir, rest) = printed
        .split_once(" && ROVER_DATA_DIR=")
        .expect("cd DIR && ROVER_DATA_DIR=");
    let (data, rover) = rest.split_once(' ').expect("the data dir, then rover");
    let rover = rover
        .strip_suffix(" autopilot dashboard")
        .expect("rover's path");
    let mut cmd = Command::new(rover);
    cmd.args(["autopilot", "dashboard", "--addr", "127.0.0.1:0"])
        .current_dir(dir)
        .env("ROVER_DATA_DIR", data);
    let dash = crate::dashboard::Dashboard::spawn(cmd);
    let page = dash.get(&format!("/trace/{trace}"), &[]);
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains("<svg"), "a timeline: {}", page.body);
    for step in DEMO_STEPS {
        assert!(
            page.body.contains(&format!("<title>{step} ")),
            "the timeline shows {step}: {}",
            page.body
        );
    }
}
