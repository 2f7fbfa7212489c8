//! The lines `trace` prints under a `review` span: each task read, at which head, its verdict
//! and what it found (the reviewer's words, one line each, without control characters).
//!
//! The span's record is the review step's (`steps::meta::ReviewSpanMeta`, a layer above);
//! this reads the keys it shows, and the step's tests render a record through it.

use std::fmt::Write as _;

use serde::Deserialize;

use crate::agents::{ReviewFinding, ReviewVerdict};
use crate::store::{Span, StepKind};

/// What `trace` shows of a review span.
#[derive(Debug, Default, Deserialize)]
struct Shown {
    #[serde(default)]
    reviews: Vec<ShownReview>,
}

#[derive(Debug, Deserialize)]
struct ShownReview {
    title: String,
    head: String,
    verdict: ReviewVerdict,
    summary: String,
    #[serde(default)]
    findings: Vec<ReviewFinding>,
    #[serde(default)]
    carried: bool,
}

use super::tree::one_line;

/// Most findings listed per task; the rest are counted.
const MAX_FINDINGS: usize = 10;

/// The lines for `span`, each starting with `lead`; empty for a span that is no review.
pub fn review_lines(span: &Span, lead: &str) -> String {
    let mut out = String::new();
    if span.step != StepKind::Review {
        return out;
    }
    let Ok(meta) = crate::store::from_meta::<Shown>(&span.meta) else {
        return out;
    };
    for review in &meta.reviews {
        let verdict = match review.verdict {
            ReviewVerdict::Approve => "approve",
            ReviewVerdict::Changes => "changes",
        };
        let _ = writeln!(
            out,
            "{lead}{verdict}: {} at {}{}: {}",
            one_line(&review.title),
            crate::git::short_sha(&review.head),
            if review.carried {
                " (approved earlier at this head)"
            } else {
                ""
            },
            one_line(&review.summary)
        );
        for finding in review.findings.iter().take(MAX_FINDINGS) {
            let place = match finding.line {
                Some(line) => format!("{}:{line}", one_line(&finding.file)),
                None => one_line(&finding.file),
            };
            let _ = writeln!(
                out,
                "{lead}  - {place}: {} ({})",
                one_line(&finding.what),
                one_line(&finding.why)
            );
        }
        if review.findings.len() > MAX_FINDINGS {
            let _ = writeln!(
                out,
                "{lead}  … {} more",
                review.findings.len() - MAX_FINDINGS
            );
        }
    }
    out
}
