//! Small setups several test files share: a bare store in a test env of its own, and an issue
//! opened on a scenario's fake GitHub (the issue and its feed event).

use rover::store::AutopilotStore;
use serde_json::json;

use super::env::TestEnv;
use super::scenario::Scenario;

/// A new `TestEnv` and its store (keep the env: it owns the temp dir).
pub fn env_and_store() -> (TestEnv, AutopilotStore) {
    let env = TestEnv::new();
    let store = env.store();
    (env, store)
}

/// `author` opens issue `number` (`title`, `body`) on the scenario's fake GitHub: the issue and
/// its `IssuesEvent` in the feed.
pub fn issue_opened(s: &Scenario, number: u64, title: &str, body: &str, author: &str) {
    s.github.add_issue(number, title, body, author, &[]);
    s.github.seed_event(
        "IssuesEvent",
        author,
        json!({"action": "opened", "issue": {"number": number, "title": title, "body": body, "user": {"login": author}}}),
    );
}
