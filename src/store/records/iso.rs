//! ISO-8601 timestamps with millisecond precision, UTC: how every record's times are written and
//! read.

use std::fmt;

use chrono::{DateTime, NaiveDate, SecondsFormat, Utc};
use serde::de::{self, Visitor};
use serde::{Deserializer, Serializer};

pub fn serialize<S: Serializer>(t: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
    let mut buf = [0u8; 24];
    match format_ours(t, &mut buf) {
        Some(text) => s.serialize_str(text),
        None => s.serialize_str(&t.to_rfc3339_opts(SecondsFormat::Millis, true)),
    }
}

/// `t` as `YYYY-MM-DDTHH:MM:SS.mmmZ`, the text chrono's `to_rfc3339_opts(Millis, true)` gives,
/// written directly (a rewrite of `state.json` formats two per queue entry); `None` for what
/// chrono writes otherwise (a year outside 0..=9999, a leap second).
pub(crate) fn format_ours<'b>(t: &DateTime<Utc>, buf: &'b mut [u8; 24]) -> Option<&'b str> {
    use chrono::{Datelike, Timelike};
    let year = u32::try_from(t.year()).ok().filter(|y| *y <= 9999)?;
    let nanos = t.nanosecond();
    if nanos >= 1_000_000_000 {
        return None;
    }
    let mut put = |at: usize, n: u32, width: usize| {
        let mut n = n;
        for i in (at..at + width).rev() {
            buf[i] = b'0' + u8::try_from(n % 10).expect("a digit");
            n /= 10;
        }
    };
    put(0, year, 4);
    put(5, t.month(), 2);
    put(8, t.day(), 2);
    put(11, t.hour(), 2);
    put(14, t.minute(), 2);
    put(17, t.second(), 2);
    put(20, nanos / 1_000_000, 3);
    for (at, c) in [
        (4, b'-'),
        (7, b'-'),
        (10, b'T'),
        (13, b':'),
        (16, b':'),
        (19, b'.'),
        (23, b'Z'),
    ] {
        buf[at] = c;
    }
    std::str::from_utf8(buf).ok()
}

pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
    d.deserialize_str(Time)
}

/// Parse an RFC 3339 time: the form rover writes (`2026-11-25T10:00:00.000Z`) directly, any
/// other through chrono (offsets, other precisions), with the same result.
pub fn parse(s: &str) -> Result<DateTime<Utc>, String> {
    if let Some(t) = ours(s.as_bytes()) {
        return Ok(t);
    }
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| format!("bad ISO-8601 time {s:?}: {e}"))
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` exactly, with valid ranges (a leap second goes to chrono).
pub(crate) fn ours(b: &[u8]) -> Option<DateTime<Utc>> {
    if b.len() != 24 || b[23] != b'Z' {
        return None;
    }
    let num = |from: usize, len: usize| -> Option<u32> {
        b[from..from + len].iter().try_fold(0u32, |n, c| {
            c.is_ascii_digit().then(|| n * 10 + u32::from(c - b'0'))
        })
    };
    let seps = [
        (4, b'-'),
        (7, b'-'),
        (10, b'T'),
        (13, b':'),
        (16, b':'),
        (19, b'.'),
    ];
    if seps.iter().any(|(at, c)| b[*at] != *c) {
        return None;
    }
    let date = NaiveDate::from_ymd_opt(i32::try_from(num(0, 4)?).ok()?, num(5, 2)?, num(8, 2)?)?;
    let time = date.and_hms_milli_opt(num(11, 2)?, num(14, 2)?, num(17, 2)?, num(20, 3)?)?;
    Some(time.and_utc())
}

struct Time;

impl Visitor<'_> for Time {
    type Value = DateTime<Utc>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an ISO-8601 time")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        parse(v).map_err(E::custom)
    }
}

/// The same for an optional time (`null` while unset).
pub mod option {
    use std::fmt;

    use chrono::{DateTime, Utc};
    use serde::de::{self, Visitor};
    use serde::{Deserializer, Serializer};

    #[allow(clippy::ref_option)] // serde's `with` passes `&Option<T>`
    pub fn serialize<S: Serializer>(t: &Option<DateTime<Utc>>, s: S) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => super::serialize(t, s),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<DateTime<Utc>>, D::Error> {
        d.deserialize_option(MaybeTime)
    }

    struct MaybeTime;

    impl<'de> Visitor<'de> for MaybeTime {
        type Value = Option<DateTime<Utc>>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("an ISO-8601 time or null")
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            super::deserialize(d).map(Some)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_form_reads_as_chrono_reads_it_and_anything_else_goes_to_chrono() {
        for s in [
            "2026-11-25T10:00:00.000Z",
            "1999-12-31T23:59:59.999Z",
            "2024-02-29T00:00:00.001Z",
            "2026-11-25T10:00:00Z",
            "2026-11-25T10:00:00.123456Z",
            "2026-11-25T12:00:00.000+02:00",
            "2016-12-31T23:59:60.000Z",
        ] {
            let chrono = DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc);
            assert_eq!(parse(s).unwrap(), chrono, "{s}");
        }
        for bad in [
            "2023-02-29T00:00:00.000Z",
            "2026-13-01T00:00:00.000Z",
            "2026-11-25T24:00:00.000Z",
            "2026-11-2510:00:00.0000Z",
            "yesterday",
            "",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
            assert!(DateTime::parse_from_rfc3339(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn times_are_written_as_chrono_writes_them() {
        let chrono = |t: &DateTime<Utc>| t.to_rfc3339_opts(SecondsFormat::Millis, true);
        let mut times: Vec<DateTime<Utc>> = [
            "2026-11-25T10:00:00.000Z",
            "1999-12-31T23:59:59.999Z",
            "2024-02-29T00:00:00.001Z",
            "0001-01-01T00:00:00.000Z",
            "9999-12-31T23:59:59.999Z",
            "2026-11-25T10:00:00.123456789Z",
            "2016-12-31T23:59:60.500Z",
        ]
        .iter()
        .map(|s| DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc))
        .collect();
        times.push(Utc::now());
        times.push(DateTime::<Utc>::MIN_UTC);
        times.push(DateTime::<Utc>::MAX_UTC);
        for t in (0..2000).map(|i| DateTime::from_timestamp_millis(i * 987_654_321_987).unwrap()) {
            times.push(t);
        }
        for t in &times {
            let json = serde_json::to_value(Wrap(*t)).unwrap();
            assert_eq!(json, serde_json::Value::String(chrono(t)), "{t:?}");
        }
    }

    struct Wrap(DateTime<Utc>);

    impl serde::Serialize for Wrap {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            serialize(&self.0, s)
        }
    }
}
