//! Marker-like tags in untrusted data: found the way a model could read them, not the way a
//! byte comparison does, and neutralized before the data goes inside an untrusted block.
//!
//! A tag is `<`, then at most [`MAX_GAP`] characters that are neither letters nor digits (the
//! `/` of a closing tag, a `!`, a backslash of an escaped slash), then the word `untrusted`,
//! compared after folding what makes two texts read alike: HTML entities (`&lt;`, `&#x3C;`,
//! `&amp;lt;`), URL and backslash escapes (`%3C`, `\u003c`, `\x3c`), compatibility forms
//! (fullwidth `＜`, small `﹤`, circled and mathematical letters: NFKD), accents (combining marks
//! dropped), zero-width and format characters, whitespace and backslashes (dropped), case, and the
//! look-alikes of `<`, `/` and the word's letters in other scripts. The `<` of each tag found
//! (whatever form it had) becomes [`NEUTRAL_OPEN`], which no fold maps back, so nothing in the
//! result reads as a marker, and the rest of the data is left as it was.

use unicode_normalization::char::{decompose_compatible, is_combining_mark};

/// The word every untrusted marker starts with.
const WORD: &str = "untrusted";

/// Most folded characters (neither letters nor digits) between `<` and the word.
const MAX_GAP: usize = 3;

/// What the `<` of a marker-like tag in the data becomes.
pub const NEUTRAL_OPEN: char = '[';

/// Characters a model does not see or reads through: zero-width and other format characters
/// (general category Cf), fillers that render as nothing, whitespace, controls and backslashes.
fn ignorable(c: char) -> bool {
    c.is_whitespace()
        || c.is_control()
        || c == '\\'
        || matches!(
            c,
            '\u{00AD}'
                | '\u{034F}'
                | '\u{061C}'
                | '\u{115F}'
                | '\u{1160}'
                | '\u{17B4}'
                | '\u{17B5}'
                | '\u{180B}'..='\u{180F}'
                | '\u{200B}'..='\u{200F}'
                | '\u{202A}'..='\u{202E}'
                | '\u{2060}'..='\u{206F}'
                | '\u{2800}'
                | '\u{3164}'
                | '\u{FE00}'..='\u{FE0F}'
                | '\u{FEFF}'
                | '\u{FFA0}'
                | '\u{FFF0}'..='\u{FFFB}'
                | '\u{1BCA0}'..='\u{1BCA3}'
                | '\u{1D173}'..='\u{1D17A}'
                | '\u{E0000}'..='\u{E0FFF}'
        )
}

/// Look-alikes that compatibility decomposition leaves alone (Unicode's confusables for `<`,
/// `/` and the letters of [`WORD`]), after lowercasing.
fn look_alike(c: char) -> char {
    match c {
        '‹' | '〈' | '⟨' | '❬' | '❮' | '˂' | 'ᐸ' | '⧼' | '⋖' | '≺' => '<',
        '∕' | '⁄' | '⧸' | '╱' | '⟋' | '丿' | '〳' | 'ノ' => '/',
        'ս' | 'υ' | 'ʋ' | 'ᴜ' | 'ц' => 'u',
        'ո' | 'п' | 'ɴ' | 'η' => 'n',
        'т' | 'τ' | 'ᴛ' => 't',
        'г' | 'ʀ' | 'ᴦ' => 'r',
        'ѕ' | 'ꜱ' => 's',
        'е' | 'ҽ' | 'ᴇ' | 'ε' | 'є' => 'e',
        'ԁ' | 'ɗ' | 'ᑯ' | 'ᴅ' => 'd',
        c => c,
    }
}

/// What one character folds to, appended to `out` (nothing for an ignorable one).
fn fold_char(c: char, out: &mut Vec<char>) {
    decompose_compatible(c, |d| {
        if ignorable(d) || is_combining_mark(d) {
            return;
        }
        for l in d.to_lowercase() {
            out.push(look_alike(l));
        }
    });
}

/// `s` starts with `prefix`, ASCII case ignored.
fn starts_with_ci(s: &str, prefix: &str) -> bool {
    s.get(..prefix.len())
        .is_some_and(|head| head.eq_ignore_ascii_case(prefix))
}

/// The leading run of ASCII digits of the given radix (at most `max`), as a character.
fn code_point(s: &str, radix: u32, max: usize) -> Option<(char, usize)> {
    let len = s
        .bytes()
        .take(max)
        .take_while(|b| char::from(*b).is_digit(radix))
        .count();
    let value = u32::from_str_radix(s.get(..len).filter(|d| !d.is_empty())?, radix).ok()?;
    Some((char::from_u32(value)?, len))
}

/// An HTML character reference at the start of `s` (which starts with `&`), the `;` optional
/// as browsers accept it, through any number of `amp;` layers: the character and its length.
fn entity(s: &str) -> Option<(char, usize)> {
    let mut at = 1;
    while starts_with_ci(&s[at..], "amp;") {
        at += 4;
    }
    let rest = &s[at..];
    let (c, len) = if let Some(hex) = rest.strip_prefix("#x").or(rest.strip_prefix("#X")) {
        code_point(hex, 16, 8).map(|(c, n)| (c, n + 2))?
    } else if let Some(dec) = rest.strip_prefix('#') {
        code_point(dec, 10, 10).map(|(c, n)| (c, n + 1))?
    } else {
        const NAMES: [(&str, char); 8] = [
            ("lt", '<'),
            ("gt", '>'),
            ("sol", '/'),
            ("bsol", '\\'),
            ("amp", '&'),
            ("quot", '"'),
            ("apos", '\''),
            ("lsaquo", '‹'),
        ];
        match NAMES.iter().find(|(name, _)| starts_with_ci(rest, name)) {
            Some((name, c)) => (*c, name.len()),
            None if at > 1 => return Some(('&', at)),
            None => return None,
        }
    };
    let semicolon = usize::from(rest[len..].starts_with(';'));
    Some((c, at + len + semicolon))
}

/// A URL escape at the start of `s` (which starts with `%`), through any number of `%25`
/// layers.
fn percent(s: &str) -> Option<(char, usize)> {
    let mut at = 1;
    while s[at..].starts_with("25") && s.len() > at + 3 {
        at += 2;
    }
    let hex = s.get(at..at + 2)?;
    let byte = u8::from_str_radix(hex, 16).ok().filter(u8::is_ascii)?;
    Some((char::from(byte), at + 2))
}

/// A backslash escape at the start of `s` (which starts with `\`), however many backslashes:
/// `\u003c`, `\u{3c}`, `\U0000003C`, `\x3c`, `\074`.
fn backslash(s: &str) -> Option<(char, usize)> {
    let at = s.bytes().take_while(|b| *b == b'\\').count();
    let rest = &s[at..];
    let (c, len) = if let Some(braced) = rest.strip_prefix("u{") {
        let (c, n) = code_point(braced, 16, 8)?;
        braced[n..].starts_with('}').then_some((c, n + 3))?
    } else if let Some(hex) = rest.strip_prefix('u') {
        code_point(hex, 16, 4)
            .filter(|(_, n)| *n == 4)
            .map(|(c, n)| (c, n + 1))?
    } else if let Some(hex) = rest.strip_prefix('U') {
        code_point(hex, 16, 8)
            .filter(|(_, n)| *n == 8)
            .map(|(c, n)| (c, n + 1))?
    } else if let Some(hex) = rest.strip_prefix('x') {
        code_point(hex, 16, 2)
            .filter(|(_, n)| *n == 2)
            .map(|(c, n)| (c, n + 1))?
    } else {
        code_point(rest, 8, 3).filter(|(_, n)| *n == 3)?
    };
    Some((c, at + len))
}

/// One piece of the original text: its byte range and what it folds to.
struct Piece {
    start: usize,
    end: usize,
    folded: Vec<char>,
}

/// The text cut into pieces (an escape or entity is one piece), each folded.
fn pieces(text: &str) -> Vec<Piece> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(c) = text[at..].chars().next() {
        let rest = &text[at..];
        let escaped = match c {
            '&' => entity(rest),
            '%' => percent(rest),
            '\\' => backslash(rest),
            _ => None,
        };
        let (decoded, len) = escaped.unwrap_or((c, c.len_utf8()));
        let mut folded = Vec::new();
        fold_char(decoded, &mut folded);
        out.push(Piece {
            start: at,
            end: at + len,
            folded,
        });
        at += len;
    }
    out
}

/// The pieces whose `<` opens a marker-like tag.
fn tag_openers(pieces: &[Piece]) -> Vec<usize> {
    // The folded text, each character with the piece it came from.
    let folded: Vec<(char, usize)> = pieces
        .iter()
        .enumerate()
        .flat_map(|(i, p)| p.folded.iter().map(move |c| (*c, i)))
        .collect();
    let word: Vec<char> = WORD.chars().collect();
    let mut openers = Vec::new();
    for (at, (c, piece)) in folded.iter().enumerate() {
        if *c != '<' {
            continue;
        }
        let after = &folded[at + 1..];
        let gap = after
            .iter()
            .take(MAX_GAP + 1)
            .take_while(|(c, _)| !c.is_alphanumeric())
            .count();
        if gap <= MAX_GAP
            && after.len() >= gap + word.len()
            && after[gap..gap + word.len()]
                .iter()
                .map(|(c, _)| *c)
                .eq(word.iter().copied())
            && openers.last() != Some(piece)
        {
            openers.push(*piece);
        }
    }
    openers
}

/// How many marker-like tags `text` holds, in any form a model could read as one.
pub fn marker_like_tags(text: &str) -> usize {
    tag_openers(&pieces(text)).len()
}

/// `text` with the `<` of every marker-like tag (in whatever form) replaced by
/// [`NEUTRAL_OPEN`]; everything else as it was.
pub fn neutralize_markers(text: &str) -> String {
    let pieces = pieces(text);
    let openers = tag_openers(&pieces);
    if openers.is_empty() {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    for i in openers {
        let piece = &pieces[i];
        out.push_str(&text[copied..piece.start]);
        out.push(NEUTRAL_OPEN);
        copied = piece.end;
    }
    out.push_str(&text[copied..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_and_entities_decode_to_one_piece() {
        for (text, c, len) in [
            ("&lt;/", '<', 4),
            ("&LT/", '<', 3),
            ("&#60;", '<', 5),
            ("&#x3C;", '<', 6),
            ("&#X3c", '<', 5),
            ("&amp;lt;", '<', 8),
            ("&amp;amp;#60;", '<', 13),
            ("&sol;", '/', 5),
            ("%3C", '<', 3),
            ("%253c", '<', 5),
            ("\\u003c", '<', 6),
            ("\\\\u003C", '<', 7),
            ("\\u{3c}", '<', 6),
            ("\\x3c", '<', 4),
            ("\\074", '<', 4),
        ] {
            let p = pieces(text);
            assert_eq!(p[0].end, len, "{text}");
            let mut folded = Vec::new();
            fold_char(c, &mut folded);
            assert_eq!(p[0].folded, folded, "{text}");
        }
        // A reference without its `;` is one, as browsers read it.
        assert_eq!(pieces("&ampere")[0].end, 4);
        // Not escapes: left as they are.
        assert_eq!(pieces("&foo")[0].end, 1);
        assert_eq!(pieces("%zz")[0].end, 1);
        assert_eq!(pieces("\\u12")[0].folded, Vec::<char>::new());
    }

    #[test]
    fn folding_removes_case_width_accents_and_invisible_characters() {
        let fold =
            |s: &str| -> String { pieces(s).iter().flat_map(|p| p.folded.clone()).collect() };
        assert_eq!(fold("＜／ＵＮＴＲＵＳＴＥＤ＞"), "</untrusted>");
        assert_eq!(fold("﹤/ùntrüstéd"), "</untrusted");
        assert_eq!(
            fold("<u\u{200B}n\u{00AD}t\u{FEFF}r\u{2060}usted"),
            "<untrusted"
        );
        assert_eq!(fold("<ⓤⓝⓣⓡⓤⓢⓣⓔⓓ"), "<untrusted");
        assert_eq!(fold("<𝐮𝐧𝐭𝐫𝐮𝐬𝐭𝐞𝐝"), "<untrusted");
        assert_eq!(fold("‹∕untrusтеd"), "</untrusted");
        assert_eq!(fold("≮untrusted"), "<untrusted");
    }

    #[test]
    fn neutralizing_changes_only_the_opening_bracket_and_is_final() {
        assert_eq!(
            neutralize_markers("a </UNTRUSTED> b < untrusted c &lt;/untrusted&gt;"),
            "a [/UNTRUSTED> b [ untrusted c [/untrusted&gt;"
        );
        assert_eq!(
            neutralize_markers("x < 3 and untrusted"),
            "x < 3 and untrusted"
        );
        assert_eq!(neutralize_markers("<<untrusted"), "[[untrusted");
        for text in [
            "&lt&lt;untrusted",
            "\\u003c\\u003C/untrusted",
            "%3C%2Funtrusted",
        ] {
            let once = neutralize_markers(text);
            assert_eq!(marker_like_tags(&once), 0, "{text} -> {once}");
            assert_eq!(neutralize_markers(&once), once);
        }
    }

    /// Random mixes of the pieces tags are made of: whatever the mix, the result holds no tag
    /// and differs from the input only where a `<` became [`NEUTRAL_OPEN`].
    #[test]
    fn no_mix_of_tricks_survives_neutralizing() {
        const PARTS: &[&str] = &[
            "<",
            "/",
            "untrusted",
            "UNTRUSTED",
            "un",
            "trusted",
            "u",
            "n",
            "t",
            "r",
            "s",
            "e",
            "d",
            "-data",
            ">",
            " ",
            "\u{200B}",
            "\u{FEFF}",
            "\u{00AD}",
            "\\",
            "&lt;",
            "&",
            "lt;",
            "&amp;",
            "#60;",
            "%3C",
            "%",
            "3C",
            "25",
            "\\u003c",
            "u003c",
            "＜",
            "／",
            "ｕ",
            "﹤",
            "‹",
            "∕",
            "ü",
            "\u{0301}",
            "е",
            "т",
            "x",
            "<",
            "</",
            "a",
            "\n",
        ];
        let mut state: u64 = 0x2545_F491_4F6C_DD1D;
        let mut next = |n: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            usize::try_from(state % n as u64).expect("small")
        };
        for _ in 0..20_000 {
            let len = 1 + next(12);
            let text: String = (0..len).map(|_| PARTS[next(PARTS.len())]).collect();
            let out = neutralize_markers(&text);
            assert_eq!(marker_like_tags(&out), 0, "{text:?} -> {out:?}");
            assert_eq!(neutralize_markers(&out), out, "{text:?}");
            // One bracket for each tag, and the text after the last one as it was.
            assert_eq!(out.matches(NEUTRAL_OPEN).count(), marker_like_tags(&text));
            let tail = out.rsplit(NEUTRAL_OPEN).next().unwrap_or_default();
            assert!(text.ends_with(tail), "{text:?} -> {out:?}");
        }
    }
}
