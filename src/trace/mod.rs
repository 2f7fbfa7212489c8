//! Rendering traces for people and for scripts: the tree of `rover autopilot trace`, the table of
//! `rover autopilot traces`, and their stable JSON forms (documented in `docs/cli.md`).

mod environment;
mod json;
mod lessons;
mod network;
mod review;
pub use review::review_lines;
mod tree;

pub use environment::{note_building, BUILDING_KEY};
pub use json::{trace_json, traces_json};

/// Which steps end a trace: the trace layer renders a pipeline it does not define, so whoever
/// shows a trace says (`steps::kinds::ends_trace`).
pub type EndsTrace = fn(&crate::store::StepKind) -> bool;
pub use tree::{
    error_detail, one_line, render_list, render_tree, span_detail_lines, ErrorDetail, Style,
};

use chrono::{DateTime, Utc};

/// A duration for people: `120ms`, `3.2s`, `2m 03s`, `1h 02m`.
pub fn human_duration(from: DateTime<Utc>, to: DateTime<Utc>) -> String {
    let ms = (to - from).num_milliseconds().max(0);
    match ms {
        0..=999 => format!("{ms}ms"),
        1_000..=59_999 => format!("{}.{}s", ms / 1000, (ms % 1000) / 100),
        60_000..=3_599_999 => format!("{}m {:02}s", ms / 60_000, (ms / 1000) % 60),
        _ => format!("{}h {:02}m", ms / 3_600_000, (ms / 60_000) % 60),
    }
}

/// How long ago, coarsely: `42s ago`, `5m ago`, `3h ago`, `2d ago`.
pub fn human_age(then: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let s = (now - then).num_seconds().max(0);
    match s {
        0..=59 => format!("{s}s ago"),
        60..=3599 => format!("{}m ago", s / 60),
        3600..=86_399 => format!("{}h ago", s / 3600),
        _ => format!("{}d ago", s / 86_400),
    }
}

/// How far ahead `then` is: `in 42s`, `in 5m`, `in 2h`, `in 1d` (`now` when it is due).
pub fn human_until(then: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let s = (then - now).num_seconds();
    match s {
        i64::MIN..=0 => "now".to_owned(),
        1..=59 => format!("in {s}s"),
        60..=3599 => format!("in {}m", s / 60),
        3600..=86_399 => format!("in {}h", s / 3600),
        _ => format!("in {}d", s / 86_400),
    }
}

/// The first 8 characters of an id, as shown in tables and trees.
pub fn short(id: uuid::Uuid) -> String {
    id.simple().to_string()[..8].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Duration;

    #[test]
    fn times_ahead_read_naturally() {
        let t = Utc::now();
        assert_eq!(human_until(t, t), "now");
        assert_eq!(human_until(t - Duration::seconds(5), t), "now");
        assert_eq!(human_until(t + Duration::seconds(42), t), "in 42s");
        assert_eq!(human_until(t + Duration::minutes(30), t), "in 30m");
        assert_eq!(human_until(t + Duration::hours(3), t), "in 3h");
    }

    #[test]
    fn durations_read_naturally() {
        let t = Utc::now();
        assert_eq!(human_duration(t, t + Duration::milliseconds(120)), "120ms");
        assert_eq!(human_duration(t, t + Duration::milliseconds(3_240)), "3.2s");
        assert_eq!(human_duration(t, t + Duration::seconds(123)), "2m 03s");
        assert_eq!(human_duration(t, t + Duration::minutes(62)), "1h 02m");
        assert_eq!(human_duration(t, t - Duration::seconds(5)), "0ms");
    }
}
