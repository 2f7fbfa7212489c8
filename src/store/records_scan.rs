//! Reading `state.json` by a direct scan of the form rover writes it in, one pass over its
//! queue entries; anything out of that form goes to serde (`records_de`), with the same result
//! and the same errors.

use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{Map, Value};
use uuid::Uuid;

use super::records::{iso, PendingAction, State, StepKind};
use super::records_de::Version;

/// Read `state.json`: a direct scan of the form rover writes, or serde when anything in it is
/// out of that form (an escaped string where a plain one is expected, a duplicate key, a missing
/// field, a bad value): same result, same errors. The scan reads each queue entry's fields in
/// place (the whole file is checked to be UTF-8 once), at a fraction of serde's cost per entry,
/// which every separate process reading the queue pays (`status`, a cron `--once`).
pub(super) fn state_from_slice(bytes: &[u8]) -> serde_json::Result<State> {
    if let Some(state) = std::str::from_utf8(bytes)
        .ok()
        .and_then(|text| Scan { text, at: 0 }.state())
    {
        return Ok(state);
    }
    serde_json::from_slice(bytes)
}

/// The direct scan: `None` as soon as anything is not as expected (the caller falls back).
struct Scan<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Scan<'a> {
    fn ws(&mut self) {
        let b = self.text.as_bytes();
        while self.at < b.len() && matches!(b[self.at], b' ' | b'\n' | b'\t' | b'\r') {
            self.at += 1;
        }
    }

    /// The next byte after whitespace, consumed.
    fn next(&mut self) -> Option<u8> {
        self.ws();
        let c = *self.text.as_bytes().get(self.at)?;
        self.at += 1;
        Some(c)
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        (self.next()? == c).then_some(())
    }

    /// `null` (consumed) or not (nothing consumed).
    fn null(&mut self) -> bool {
        self.ws();
        let null = self.text.as_bytes()[self.at..].starts_with(b"null");
        if null {
            self.at += 4;
        }
        null
    }

    /// A string without escapes; `Err(())` for one with escapes (nothing consumed).
    fn plain(&mut self) -> Option<Result<&'a str, ()>> {
        self.eat(b'"')?;
        let b = self.text.as_bytes();
        let start = self.at;
        let len = b[start..]
            .iter()
            .position(|c| matches!(c, b'"' | b'\\' | 0..=0x1f))?;
        let end = start + len;
        match b[end] {
            b'"' => {
                self.at = end + 1;
                Some(Ok(&self.text[start..end]))
            }
            b'\\' => {
                self.at = start - 1;
                Some(Err(()))
            }
            _ => None,
        }
    }

    /// A string without escapes.
    fn str(&mut self) -> Option<&'a str> {
        self.plain()?.ok()
    }

    /// Any string (escapes decoded by serde).
    fn string(&mut self) -> Option<String> {
        match self.plain()? {
            Ok(s) => Some(s.to_owned()),
            Err(()) => self.serde(),
        }
    }

    /// One value of any kind, read by serde.
    fn serde<T: Deserialize<'a>>(&mut self) -> Option<T> {
        self.ws();
        let mut values = serde_json::Deserializer::from_str(&self.text[self.at..]).into_iter::<T>();
        let value = values.next()?.ok()?;
        self.at += values.byte_offset();
        Some(value)
    }

    /// The `N` bytes of a string of exactly that length (no escapes: the bytes are checked by
    /// the caller's parse), without consuming them.
    fn fixed<const N: usize>(&mut self) -> Option<&'a [u8; N]> {
        self.ws();
        let b = self.text.as_bytes();
        if b.get(self.at) != Some(&b'"') || b.get(self.at + N + 1) != Some(&b'"') {
            return None;
        }
        let start = self.at + 1;
        b[start..start + N].try_into().ok()
    }

    fn uuid(&mut self) -> Option<Uuid> {
        if let Some(id) = self.fixed::<36>().and_then(hyphenated) {
            self.at += 38;
            return Some(id);
        }
        Uuid::parse_str(self.str()?).ok()
    }

    fn time(&mut self) -> Option<DateTime<Utc>> {
        if let Some(t) = self.fixed::<24>().and_then(|b| iso::ours(b)) {
            self.at += 26;
            return Some(t);
        }
        iso::parse(self.str()?).ok()
    }

    /// A JSON number that fits a `u32` (`0` or no leading zero).
    fn u32(&mut self) -> Option<u32> {
        self.ws();
        let b = self.text.as_bytes();
        let start = self.at;
        while self.at < b.len() && b[self.at].is_ascii_digit() {
            self.at += 1;
        }
        let digits = &self.text[start..self.at];
        if digits.is_empty() || (digits.len() > 1 && digits.starts_with('0')) {
            return None;
        }
        digits.parse().ok()
    }

    /// The members of an object, each read by `member` (given its key), until `}`.
    fn object(&mut self, mut member: impl FnMut(&mut Self, &'a str) -> Option<()>) -> Option<()> {
        self.eat(b'{')?;
        self.ws();
        if self.text.as_bytes().get(self.at) == Some(&b'}') {
            self.at += 1;
            return Some(());
        }
        loop {
            let key = self.str()?;
            self.eat(b':')?;
            member(self, key)?;
            match self.next()? {
                b',' => {}
                b'}' => return Some(()),
                _ => return None,
            }
        }
    }

    fn state(mut self) -> Option<State> {
        let (mut version, mut updated_at, mut pending, mut task_mappings, mut closed) =
            (None, None, None, None, None);
        let mut extra = Map::new();
        self.object(|s, key| match key {
            "version" => once(&mut version, s.serde::<Version>()?.0),
            "updatedAt" => once(&mut updated_at, s.time()?),
            "pending" => once(&mut pending, s.pending()?),
            "taskMappings" => once(&mut task_mappings, s.serde()?),
            "closed" => once(&mut closed, s.serde()?),
            other => {
                extra.insert(other.to_owned(), s.serde::<Value>()?);
                Some(())
            }
        })?;
        self.ws();
        if self.at != self.text.len() {
            return None;
        }
        Some(State {
            version: version?,
            updated_at: updated_at?,
            pending: pending?,
            task_mappings: task_mappings?,
            closed: closed.unwrap_or_default(),
            extra,
        })
    }

    fn pending(&mut self) -> Option<Vec<PendingAction>> {
        self.eat(b'[')?;
        let mut entries = Vec::new();
        self.ws();
        if self.text.as_bytes().get(self.at) == Some(&b']') {
            self.at += 1;
            return Some(entries);
        }
        loop {
            let entry = match self.entry_as_written() {
                Some(e) => e,
                None => self.entry()?,
            };
            entries.push(entry);
            match self.next()? {
                b',' => {}
                b']' => return Some(entries),
                _ => return None,
            }
        }
    }

    /// The literal bytes `lit` next (consumed), or not (nothing consumed).
    fn lit(&mut self, lit: &[u8]) -> bool {
        let found = self.text.as_bytes()[self.at..].starts_with(lit);
        if found {
            self.at += lit.len();
        }
        found
    }

    /// An entry laid out exactly as rover writes it at this depth (its known keys in their
    /// order, each value in rover's form), read without looking keys up; `None`, with nothing
    /// consumed, for anything else (the general [`Scan::entry`] reads it).
    fn entry_as_written(&mut self) -> Option<PendingAction> {
        let start = self.at;
        let entry = self.as_written();
        if entry.is_none() {
            self.at = start;
        }
        entry
    }

    fn as_written(&mut self) -> Option<PendingAction> {
        const KEY: &[u8] = b"\n      \"";
        self.ws();
        // The key `name` next (consumed), or not (nothing consumed).
        let key = |s: &mut Self, name: &str, first: bool| {
            let start = s.at;
            let found =
                (first || s.lit(b",")) && s.lit(KEY) && s.lit(name.as_bytes()) && s.lit(b"\": ");
            if !found {
                s.at = start;
            }
            found
        };
        if !(self.lit(b"{") && key(self, "traceId", true)) {
            return None;
        }
        let trace_id = self.uuid_as_written()?;
        key(self, "actionId", false).then_some(())?;
        let action_id = self.uuid_as_written()?;
        key(self, "spanId", false).then_some(())?;
        let span_id = self.uuid_as_written()?;
        key(self, "action", false).then_some(())?;
        let action = self.str().filter(|n| !n.is_empty())?;
        let action = action.parse::<StepKind>().expect("infallible");
        key(self, "summary", false).then_some(())?;
        let summary = self.str()?.to_owned();
        key(self, "createdAt", false).then_some(())?;
        let created_at = self.time_as_written()?;
        let mut attempts = 0;
        if key(self, "attempts", false) {
            attempts = self.u32()?;
        }
        let mut running_span_id = None;
        if key(self, "runningSpanId", false) {
            running_span_id = Some(self.uuid_as_written()?);
        }
        let mut not_before = None;
        if key(self, "notBefore", false) {
            not_before = Some(self.time_as_written()?);
        }
        let mut superseded_by = None;
        if key(self, "supersededBy", false) {
            superseded_by = Some(self.uuid_as_written()?);
        }
        self.lit(b"\n    }").then_some(())?;
        Some(PendingAction {
            trace_id,
            action_id,
            span_id,
            action,
            summary,
            created_at,
            attempts,
            running_span_id,
            not_before,
            superseded_by,
            extra: Map::new(),
        })
    }

    fn uuid_as_written(&mut self) -> Option<Uuid> {
        let id = self.fixed::<36>().and_then(hyphenated)?;
        self.at += 38;
        Some(id)
    }

    fn time_as_written(&mut self) -> Option<DateTime<Utc>> {
        let t = self.fixed::<24>().and_then(|b| iso::ours(b))?;
        self.at += 26;
        Some(t)
    }

    fn entry(&mut self) -> Option<PendingAction> {
        let (mut trace_id, mut action_id, mut span_id) = (None, None, None);
        let (mut action, mut summary, mut created_at) = (None, None, None);
        let (mut attempts, mut running_span_id, mut not_before, mut superseded_by) =
            (None, None, None, None);
        let mut extra = Map::new();
        self.object(|s, key| match key {
            "traceId" => once(&mut trace_id, s.uuid()?),
            "actionId" => once(&mut action_id, s.uuid()?),
            "spanId" => once(&mut span_id, s.uuid()?),
            "action" => {
                let name = s.string().filter(|n| !n.is_empty())?;
                once(&mut action, name.parse::<StepKind>().expect("infallible"))
            }
            "summary" => once(&mut summary, s.string()?),
            "createdAt" => once(&mut created_at, s.time()?),
            "attempts" => once(&mut attempts, s.u32()?),
            "runningSpanId" => {
                let v = if s.null() { None } else { Some(s.uuid()?) };
                once(&mut running_span_id, v)
            }
            "notBefore" => {
                let v = if s.null() { None } else { Some(s.time()?) };
                once(&mut not_before, v)
            }
            "supersededBy" => {
                let v = if s.null() { None } else { Some(s.uuid()?) };
                once(&mut superseded_by, v)
            }
            other => {
                extra.insert(other.to_owned(), s.serde::<Value>()?);
                Some(())
            }
        })?;
        Some(PendingAction {
            trace_id: trace_id?,
            action_id: action_id?,
            span_id: span_id?,
            action: action?,
            summary: summary?,
            created_at: created_at?,
            attempts: attempts.unwrap_or(0),
            running_span_id: running_span_id.flatten(),
            not_before: not_before.flatten(),
            superseded_by: superseded_by.flatten(),
            extra,
        })
    }
}

/// The value of each hex digit (either case); 0xFF for any other byte.
const HEX: [u8; 256] = {
    let mut t = [0xFF; 256];
    let mut i: u8 = 0;
    while i < 10 {
        t[(b'0' + i) as usize] = i;
        i += 1;
    }
    let mut i: u8 = 0;
    while i < 6 {
        t[(b'a' + i) as usize] = 10 + i;
        t[(b'A' + i) as usize] = 10 + i;
        i += 1;
    }
    t
};

/// Where each byte's two hex digits start in `8-4-4-4-12`.
const PAIRS: [usize; 16] = [0, 2, 4, 6, 9, 11, 14, 16, 19, 21, 24, 26, 28, 30, 32, 34];

/// A hyphenated UUID (`8-4-4-4-12` hex digits, either case), as `Uuid::parse_str` reads it.
fn hyphenated(b: &[u8; 36]) -> Option<Uuid> {
    if b[8] != b'-' || b[13] != b'-' || b[18] != b'-' || b[23] != b'-' {
        return None;
    }
    let mut bytes = [0u8; 16];
    let mut bad = 0u8;
    for (byte, at) in bytes.iter_mut().zip(PAIRS) {
        let (hi, lo) = (HEX[usize::from(b[at])], HEX[usize::from(b[at + 1])]);
        bad |= hi | lo;
        *byte = (hi << 4) | lo;
    }
    (bad & 0xF0 == 0).then_some(Uuid::from_bytes(bytes))
}

/// Set a field once: a second value is out of form (serde says which key is repeated).
fn once<T>(slot: &mut Option<T>, value: T) -> Option<()> {
    if slot.is_some() {
        return None;
    }
    *slot = Some(value);
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entry() -> Value {
        json!({
            "traceId": "11111111-1111-1111-1111-111111111111",
            "actionId": "22222222-2222-2222-2222-222222222222",
            "spanId": "33333333-3333-3333-3333-333333333333",
            "action": "coordinate",
            "summary": "new event",
            "createdAt": "2026-11-25T10:00:00.000Z",
        })
    }

    #[test]
    fn unknown_keys_are_kept_and_written_back_unchanged() {
        let mut v = entry();
        v["otherImpl"] = json!({"nested": [1, 2]});
        v["attempts"] = json!(2);
        v["notBefore"] = json!(null);
        let p: PendingAction = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(p.attempts, 2);
        assert_eq!(p.extra.get("otherImpl"), Some(&json!({"nested": [1, 2]})));
        let back = serde_json::to_value(&p).unwrap();
        assert_eq!(back["otherImpl"], v["otherImpl"]);
        let state = json!({
            "version": "1.3", "updatedAt": "2026-11-25T10:00:00.000Z",
            "pending": [v], "taskMappings": {}, "journalSeq": 7, "futureKey": "x",
        });
        let s: State = serde_json::from_value(state).unwrap();
        assert_eq!(s.extra.get("journalSeq"), Some(&json!(7)));
        assert_eq!(s.extra.get("futureKey"), Some(&json!("x")));
        assert_eq!(s.pending.len(), 1);
        assert!(s.closed.is_empty());
    }

    #[test]
    fn missing_duplicate_and_bad_fields_are_refused_by_name() {
        let mut v = entry();
        v.as_object_mut().unwrap().remove("summary");
        let e = serde_json::from_value::<PendingAction>(v).unwrap_err();
        assert!(e.to_string().contains("missing field `summary`"), "{e}");
        let e = serde_json::from_str::<PendingAction>(
            r#"{"traceId":"11111111-1111-1111-1111-111111111111","traceId":"11111111-1111-1111-1111-111111111111"}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("duplicate field `traceId`"), "{e}");
        let mut v = entry();
        v["createdAt"] = json!("yesterday");
        let e = serde_json::from_value::<PendingAction>(v).unwrap_err();
        assert!(e.to_string().contains("bad ISO-8601 time"), "{e}");
        let e = serde_json::from_value::<State>(json!({
            "version": "2.0", "updatedAt": "2026-11-25T10:00:00.000Z", "pending": [], "taskMappings": {},
        }))
        .unwrap_err();
        assert!(e.to_string().contains("unsupported record version"), "{e}");
        let e =
            serde_json::from_value::<State>(json!({"version": "1.0", "pending": []})).unwrap_err();
        assert!(e.to_string().contains("missing field `updatedAt`"), "{e}");
    }

    fn scan(text: &str) -> Option<State> {
        Scan { text, at: 0 }.state()
    }

    /// A state with every kind of field a queue entry can hold, as rover writes it.
    fn full_state() -> Value {
        let mut plain = entry();
        plain["notBefore"] = json!("2026-12-25T10:00:00.000Z");
        let mut busy = entry();
        busy["actionId"] = json!("44444444-4444-4444-4444-444444444444");
        busy["action"] = json!("frobnicate");
        busy["summary"] = json!("a \"quoted\" line\nand ünïcode \\ tab\t");
        busy["attempts"] = json!(3);
        busy["runningSpanId"] = json!("55555555-5555-5555-5555-555555555555");
        busy["supersededBy"] = json!("66666666-6666-6666-6666-666666666666");
        busy["otherImpl"] = json!({"nested": [1, 2.5, null, true], "s": "x\u{1}"});
        // Forms the scan reads the general way: upper case, braced and simple ids, other times.
        busy["traceId"] = json!("ABCDEF01-1111-1111-1111-11111111111F");
        busy["spanId"] = json!("{33333333-3333-3333-3333-333333333333}");
        busy["createdAt"] = json!("2026-11-25T12:00:00+02:00");
        busy["notBefore"] = json!("2026-11-25T10:00:00.5Z");
        let mut other = entry();
        other["actionId"] = json!("77777777777777777777777777777777");
        other["attempts"] = json!(0);
        other["notBefore"] = json!(null);
        json!({
            "version": "1.0", "updatedAt": "2026-11-25T10:00:00.000Z",
            "pending": [plain, busy, other],
            "taskMappings": {"22222222-2222-2222-2222-222222222222": {
                "taskId": "t1", "branchName": "rover/t1",
                "traceId": "11111111-1111-1111-1111-111111111111",
                "workflowSpanId": "33333333-3333-3333-3333-333333333333",
                "worktree": "/old/key", "extra": {"k": 1},
            }},
            "closed": {"11111111-1111-1111-1111-111111111111": {
                "command": "cancel", "by": "alice", "reason": "", "at": "2026-11-25T10:00:00.000Z",
            }},
            "journalSeq": 7, "zFuture": [1, {"a": "b"}],
        })
    }

    #[test]
    fn the_direct_scan_reads_what_serde_reads() {
        let v = full_state();
        let by_serde: State = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(by_serde.pending.len(), 3);
        // As rover writes it (pretty, then written back), compact, and with odd spacing.
        let pretty = String::from_utf8(serde_json::to_vec_pretty(&v).unwrap()).unwrap() + "\n";
        let rewritten = serde_json::to_string_pretty(&by_serde).unwrap();
        let compact = serde_json::to_string(&v).unwrap();
        let spaced = compact.replace(",\"", " ,\r\n\t\"").replace("\":", "\" : ");
        for text in [&pretty, &rewritten, &compact, &spaced] {
            assert_eq!(scan(text).as_ref(), Some(&by_serde), "{text}");
            assert_eq!(state_from_slice(text.as_bytes()).unwrap(), by_serde);
        }
        let empty = json!({"version": "1.2", "updatedAt": "2026-11-25T10:00:00.000Z",
            "pending": [], "taskMappings": {}});
        let want: State = serde_json::from_value(empty.clone()).unwrap();
        assert_eq!(scan(&empty.to_string()), Some(want));
    }

    #[test]
    fn hyphenated_ids_read_as_uuid_reads_them() {
        for _ in 0..200 {
            let id = Uuid::new_v4();
            for text in [id.to_string(), id.to_string().to_uppercase()] {
                let b: &[u8; 36] = text.as_bytes().try_into().unwrap();
                assert_eq!(hyphenated(b), Some(id));
            }
        }
        for bad in [
            "11111111-1111-1111-1111-11111111111g",
            "11111111-1111-1111-1111+111111111111",
            "111111111-111-1111-1111-111111111111",
            "11111111-1111-1111-1111-11111111111\"",
        ] {
            let b: &[u8; 36] = bad.as_bytes().try_into().unwrap();
            assert_eq!(hyphenated(b), None, "{bad}");
            assert!(Uuid::parse_str(bad).is_err());
        }
    }

    #[test]
    fn anything_out_of_form_goes_to_serde_with_its_error() {
        let pretty = serde_json::to_string_pretty(&full_state()).unwrap();
        let uuid = "\"11111111-1111-1111-1111-111111111111\"";
        let cases = [
            // Repeated keys, in an entry and at the top.
            pretty.replacen("\"summary\"", "\"summary\": \"x\", \"summary\"", 1),
            pretty.replacen("\"pending\"", "\"version\": \"1.0\", \"pending\"", 1),
            // Missing fields.
            pretty.replacen("\"spanId\"", "\"spanIdX\"", 1),
            pretty.replacen("\"taskMappings\"", "\"taskMappingsX\"", 1),
            // Bad values.
            pretty.replacen("2026-11-25T10:00:00.000Z", "yesterday", 1),
            pretty.replacen("\"attempts\": 3", "\"attempts\": 03", 1),
            pretty.replacen("\"attempts\": 3", "\"attempts\": -1", 1),
            pretty.replacen("\"attempts\": 3", "\"attempts\": 3.0", 1),
            pretty.replacen("\"action\": \"frobnicate\"", "\"action\": \"\"", 1),
            pretty.replacen("\"version\": \"1.0\"", "\"version\": \"2.0\"", 1),
            pretty.replacen("\"pending\": [", "\"pending\": [1, ", 1),
            pretty.replacen("\"runningSpanId\": \"", "\"runningSpanId\": nul\"", 1),
            pretty.replacen(uuid, "\"1111\"", 1),
            // Trailing bytes, a cut-off file, a raw control character in a string.
            pretty.clone() + "x",
            pretty[..pretty.len() / 2].to_owned(),
            pretty.replacen("a \\\"quoted", "a \u{1}quoted", 1),
        ];
        for text in &cases {
            assert_ne!(text, &pretty, "each case changes the file");
            assert_eq!(scan(text), None, "{text}");
            let want = serde_json::from_str::<State>(text).unwrap_err().to_string();
            let got = state_from_slice(text.as_bytes()).unwrap_err().to_string();
            assert_eq!(got, want);
        }
        // An escaped id is valid JSON the scan leaves to serde, which reads it.
        let escaped = pretty.replacen("\"traceId\": \"1", "\"traceId\": \"\\u0031", 1);
        assert_eq!(scan(&escaped), None);
        let want: State = serde_json::from_str(&escaped).unwrap();
        assert_eq!(state_from_slice(escaped.as_bytes()).unwrap(), want);
        // Invalid UTF-8 is serde's error too.
        let mut bytes = pretty.into_bytes();
        let at = bytes.iter().position(|b| *b == b'q').unwrap();
        bytes[at] = 0xff;
        let want = serde_json::from_slice::<State>(&bytes)
            .unwrap_err()
            .to_string();
        assert_eq!(state_from_slice(&bytes).unwrap_err().to_string(), want);
    }

    #[test]
    fn entries_as_rover_writes_them_are_read_in_one_pass_and_alike() {
        let t = "2026-11-25T10:00:00.123Z";
        for mask in 0..32u32 {
            let mut v = entry();
            v["createdAt"] = json!(t);
            if mask & 1 != 0 {
                v["attempts"] = json!(mask);
            }
            if mask & 2 != 0 {
                v["runningSpanId"] = json!("55555555-5555-5555-5555-55555555555a");
            }
            if mask & 4 != 0 {
                v["notBefore"] = json!("2027-01-01T00:00:00.000Z");
            }
            if mask & 8 != 0 {
                v["supersededBy"] = json!("66666666-6666-6666-6666-666666666666");
            }
            // An escaped summary is read the general way.
            let escaped = mask & 16 != 0;
            if escaped {
                v["summary"] = json!("say \"hi\"");
            }
            let p: PendingAction = serde_json::from_value(v).unwrap();
            let mut state = State::new(Utc::now());
            state.pending.push(p.clone());
            state.pending.push(p.clone());
            let text = serde_json::to_string_pretty(&state).unwrap();
            let at = text.find("\"pending\": [").unwrap() + "\"pending\": [".len();
            let mut scan = Scan { text: &text, at };
            assert_eq!(
                scan.entry_as_written(),
                (!escaped).then(|| p.clone()),
                "{text}"
            );
            let by_serde: State = serde_json::from_str(&text).unwrap();
            assert_eq!(self::scan(&text), Some(by_serde), "{text}");
        }
    }
}
