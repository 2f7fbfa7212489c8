//! The dashboard's HTML: escaping (every text a page shows went through [`esc`]: issue titles,
//! summaries, error output are what events, agents and containers wrote), the page around a
//! body, and the small formatting helpers the pages share.

use std::fmt::Write as _;

use chrono::{DateTime, SecondsFormat, Utc};

/// `text` safe in HTML text and in a double-quoted attribute.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            // Control characters a model or a container wrote are dropped, as `trace` does.
            c if c.is_control() && c != '\n' && c != '\t' => {}
            c => out.push(c),
        }
    }
    out
}

/// A value for a query string (`repo=o%2Fw`).
pub fn url_part(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// A time as the pages show it and as `data-since` carries it (RFC 3339, seconds).
pub fn iso(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// The pages in the navigation bar: path and title.
const NAV: &[(&str, &str)] = &[
    ("/", "Now"),
    ("/traces", "Traces"),
    ("/outcomes", "Outcomes"),
    ("/memory", "Lessons"),
];

/// A whole page: `title`, the navigation with `current` marked, and `body` (already HTML).
/// Styles and script come from `/assets/` only: the content security policy allows nothing
/// inline.
pub fn document(title: &str, current: &str, body: &str) -> String {
    let mut nav = String::new();
    for (path, name) in NAV {
        let mark = if *path == current {
            " aria-current=\"page\""
        } else {
            ""
        };
        let _ = write!(nav, "<a href=\"{path}\"{mark}>{name}</a>");
    }
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{} · rover</title>\
         <link rel=\"stylesheet\" href=\"/assets/dashboard.css\">\
         <script src=\"/assets/dashboard.js\" defer></script></head>\
         <body><header><span class=\"brand\">rover</span><nav>{nav}</nav></header>\
         <main>{body}</main></body></html>\n",
        esc(title)
    )
}

/// A message page (not found, refused), its text escaped.
pub fn message(title: &str, text: &str) -> String {
    document(
        title,
        "",
        &format!(
            "<h1>{}</h1><p class=\"message\">{}</p>",
            esc(title),
            esc(text)
        ),
    )
}

/// The CSS class of a span status or a trace outcome.
pub fn status_class(status: &str) -> &'static str {
    match status {
        "running" => "st-running",
        "completed" => "st-completed",
        "failed" => "st-failed",
        "error" => "st-error",
        _ => "st-other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_and_quotes_are_escaped_and_control_characters_dropped() {
        assert_eq!(
            esc("<img src=x onerror=alert(1)> & \"'</script>\u{1b}[31m"),
            "&lt;img src=x onerror=alert(1)&gt; &amp; &quot;&#39;&lt;/script&gt;[31m"
        );
        assert_eq!(url_part("o/w b&c"), "o%2Fw%20b%26c");
    }
}
