//! The running agent's last output line on the Now page: the tail of the log its run's
//! follower writes into the span's artifacts (`agent.log`), read in a bounded piece (never the
//! whole file), given to the agents' own stream parsers (`agents::last_activity`), and made one
//! printable line. What an agent wrote is untrusted: the page escapes it.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use uuid::Uuid;

use crate::store::AutopilotStore;

/// How much of the log's end is read: a few lines of stream-json.
const TAIL_BYTES: u64 = 16 * 1024;
/// The longest line shown, in characters (then `…`).
pub const MAX_CHARS: usize = 200;

/// What the agent of running span `span` did last, as one line, when its log says.
pub fn last_line(store: &AutopilotStore, span: Uuid) -> Option<String> {
    let tail = read_tail(&store.agent_log(span), TAIL_BYTES).ok()?;
    let said = crate::agents::last_activity(&tail)?;
    let line = printable_line(&said, MAX_CHARS);
    (!line.is_empty()).then_some(line)
}

/// The last `max` bytes of `path`, from the first whole line in them.
fn read_tail(path: &Path, max: u64) -> std::io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    let len = file.metadata()?.len();
    let start = len.saturating_sub(max);
    file.seek(SeekFrom::Start(start))?;
    let mut bytes = Vec::with_capacity(usize::try_from(len - start).unwrap_or(0));
    file.take(max).read_to_end(&mut bytes)?;
    if start > 0 {
        // The first line was cut by the seek.
        let first = bytes
            .iter()
            .position(|b| *b == b'\n')
            .map_or(bytes.len(), |i| i + 1);
        bytes.drain(..first);
    }
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// `text` as one line: terminal escape sequences removed whole (not only their ESC), other
/// control characters and runs of white space made one space, at most `max` characters.
pub fn printable_line(text: &str, max: usize) -> String {
    let mut out = String::new();
    let mut count = 0;
    let mut chars = text.chars().peekable();
    let mut space = false;
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            match chars.next() {
                // CSI: parameters up to a final byte in `@`..=`~`.
                Some('[') => {
                    for c in chars.by_ref() {
                        if ('@'..='~').contains(&c) {
                            break;
                        }
                    }
                }
                // OSC: up to BEL or ESC `\`.
                Some(']') => {
                    while let Some(c) = chars.next() {
                        if c == '\u{7}' || c == '\u{1b}' && chars.next_if_eq(&'\\').is_some() {
                            break;
                        }
                    }
                }
                _ => {}
            }
            continue;
        }
        if c.is_control() || c.is_whitespace() {
            space = !out.is_empty();
            continue;
        }
        if space {
            out.push(' ');
            count += 1;
            space = false;
        }
        if count >= max {
            out.push('…');
            break;
        }
        out.push(c);
        count += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_sequences_and_control_characters_leave_one_line() {
        assert_eq!(
            printable_line(
                "\u{1b}[31mred\u{1b}[0m\n\tthen\u{7} \u{1b}]0;title\u{7}end",
                50
            ),
            "red then end"
        );
        assert_eq!(printable_line("abcdef", 3), "abc…");
    }

    #[test]
    fn the_tail_starts_at_a_whole_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        std::fs::write(&path, "first line\nsecond\nthird\n").unwrap();
        assert_eq!(read_tail(&path, 10).unwrap(), "third\n");
        assert_eq!(
            read_tail(&path, 100).unwrap(),
            "first line\nsecond\nthird\n"
        );
    }
}
