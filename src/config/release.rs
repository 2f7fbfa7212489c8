//! `autopilot.lifecycle.release`: after a green look at the merge commit on the base branch,
//! rover tags it and makes a GitHub release (`"none"`, the default, makes none). The tag comes
//! from a template with `{major}`, `{minor}` and `{patch}`, each once; the previous version is
//! read back from the releases' tags with the same template.

use std::fmt;

use serde::Deserialize;

/// The longest tag template accepted.
const MAX_TEMPLATE: usize = 100;

/// `autopilot.lifecycle.release`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(try_from = "serde_json::Value")]
pub enum ReleaseConfig {
    /// No release (`"none"`).
    #[default]
    None,
    /// Tag the merge commit with the next version and make a release of it.
    Tag { tag: TagTemplate, bump: Bump },
}

impl ReleaseConfig {
    /// The tag and the bump, when rover releases.
    pub fn tagged(&self) -> Option<(&TagTemplate, Bump)> {
        match self {
            ReleaseConfig::None => None,
            ReleaseConfig::Tag { tag, bump } => Some((tag, *bump)),
        }
    }
}

impl TryFrom<serde_json::Value> for ReleaseConfig {
    type Error = String;

    fn try_from(value: serde_json::Value) -> Result<Self, String> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Raw {
            #[serde(default)]
            tag: Option<String>,
            #[serde(default)]
            bump: Bump,
        }
        match value {
            serde_json::Value::String(s) if s == "none" => Ok(ReleaseConfig::None),
            serde_json::Value::Object(_) => {
                let raw: Raw = serde_json::from_value(value).map_err(|e| e.to_string())?;
                let tag = raw.tag.as_deref().unwrap_or(TagTemplate::DEFAULT);
                Ok(ReleaseConfig::Tag {
                    tag: TagTemplate::parse(tag)?,
                    bump: raw.bump,
                })
            }
            other => Err(format!(
                "expected \"none\" or {{\"tag\": \"{}\", \"bump\": \"patch\"}}, found {other}",
                TagTemplate::DEFAULT
            )),
        }
    }
}

/// Which part of the version a release raises.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Bump {
    Major,
    Minor,
    #[default]
    Patch,
}

impl Bump {
    /// The word as written in `rover.json`.
    pub fn as_str(self) -> &'static str {
        match self {
            Bump::Major => "major",
            Bump::Minor => "minor",
            Bump::Patch => "patch",
        }
    }
}

/// A version `major.minor.patch`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    pub major: u64,
    pub minor: u64,
    pub patch: u64,
}

impl Version {
    /// The next version: the bumped part raised, the parts after it zero.
    #[must_use]
    pub fn bumped(self, bump: Bump) -> Version {
        match bump {
            Bump::Major => Version {
                major: self.major + 1,
                minor: 0,
                patch: 0,
            },
            Bump::Minor => Version {
                minor: self.minor + 1,
                patch: 0,
                ..self
            },
            Bump::Patch => Version {
                patch: self.patch + 1,
                ..self
            },
        }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// A tag template: text around `{major}`, `{minor}` and `{patch}` (each once), only
/// characters a tag name takes without quoting (letters, digits, `.`, `-`, `_`, `/`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TagTemplate {
    /// The literal pieces and placeholders in order.
    parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Major,
    Minor,
    Patch,
}

const PLACEHOLDERS: [(&str, Part); 3] = [
    ("{major}", Part::Major),
    ("{minor}", Part::Minor),
    ("{patch}", Part::Patch),
];

impl TagTemplate {
    pub const DEFAULT: &'static str = "v{major}.{minor}.{patch}";

    pub fn parse(text: &str) -> Result<TagTemplate, String> {
        let refuse = |why: &str| Err(format!("the release tag template {text:?} {why}"));
        if text.is_empty() || text.len() > MAX_TEMPLATE {
            return refuse(&format!("must have 1 to {MAX_TEMPLATE} characters"));
        }
        let mut parts = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            if let Some((p, part)) = PLACEHOLDERS.iter().find(|(p, _)| rest.starts_with(p)) {
                if parts.contains(part) {
                    return refuse(&format!("has {p} twice"));
                }
                parts.push(part.clone());
                rest = &rest[p.len()..];
                continue;
            }
            let end = rest.find('{').unwrap_or(rest.len());
            if end == 0 {
                return refuse("has a `{` that is not {major}, {minor} or {patch}");
            }
            let literal = &rest[..end];
            if let Some(bad) = literal
                .chars()
                .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '/')))
            {
                return refuse(&format!(
                    "has {bad:?}: a tag takes letters, digits, `.`, `-`, `_` and `/`"
                ));
            }
            parts.push(Part::Text(literal.to_owned()));
            rest = &rest[end..];
        }
        if let Some((p, _)) = PLACEHOLDERS.iter().find(|(_, part)| !parts.contains(part)) {
            return refuse(&format!("has no {p}"));
        }
        // Two placeholders side by side would read back ambiguously (`{minor}{patch}`).
        let is_text = |p: &Part| matches!(p, Part::Text(_));
        if parts.windows(2).any(|w| !is_text(&w[0]) && !is_text(&w[1])) {
            return refuse("has two placeholders with nothing between them");
        }
        if text.starts_with(['-', '/', '.']) || text.ends_with(['/', '.']) || text.contains("..") {
            return refuse(
                "is not a valid tag name (a leading `-`, `/` or `.`, a trailing `/` or `.`, or `..`)",
            );
        }
        Ok(TagTemplate { parts })
    }

    /// The tag of `version`.
    pub fn tag(&self, version: Version) -> String {
        self.parts
            .iter()
            .map(|p| match p {
                Part::Text(t) => t.clone(),
                Part::Major => version.major.to_string(),
                Part::Minor => version.minor.to_string(),
                Part::Patch => version.patch.to_string(),
            })
            .collect()
    }

    /// The version a tag made with this template names (`None`: another tag).
    pub fn version_of(&self, tag: &str) -> Option<Version> {
        let mut rest = tag;
        let mut version = Version::default();
        for (i, part) in self.parts.iter().enumerate() {
            let slot = match part {
                Part::Text(t) => {
                    rest = rest.strip_prefix(t.as_str())?;
                    continue;
                }
                Part::Major => &mut version.major,
                Part::Minor => &mut version.minor,
                Part::Patch => &mut version.patch,
            };
            // A number runs to the next literal (or to the end).
            let end = match self.parts.get(i + 1) {
                Some(Part::Text(next)) => rest.find(next.as_str())?,
                _ => rest.len(),
            };
            let digits = &rest[..end];
            if digits.is_empty()
                || !digits.bytes().all(|b| b.is_ascii_digit())
                || (digits.len() > 1 && digits.starts_with('0'))
            {
                return None;
            }
            *slot = digits.parse().ok()?;
            rest = &rest[end..];
        }
        rest.is_empty().then_some(version)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn release(json: &str) -> Result<ReleaseConfig, String> {
        ReleaseConfig::try_from(serde_json::from_str::<serde_json::Value>(json).unwrap())
    }

    #[test]
    fn the_setting_is_none_or_a_tag_and_a_bump() {
        assert_eq!(release(r#""none""#).unwrap(), ReleaseConfig::None);
        let ReleaseConfig::Tag { tag, bump } = release(r#"{"bump": "minor"}"#).unwrap() else {
            panic!("a tag")
        };
        assert_eq!(bump, Bump::Minor);
        assert_eq!(tag, TagTemplate::parse(TagTemplate::DEFAULT).unwrap());
        for bad in [
            r#""yes""#,
            "true",
            r#"{"bump": "micro"}"#,
            r#"{"tags": "v{major}"}"#,
        ] {
            assert!(release(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_template_makes_tags_and_reads_them_back() {
        let t = TagTemplate::parse("release-{major}.{minor}.{patch}").unwrap();
        let v = Version {
            major: 1,
            minor: 20,
            patch: 3,
        };
        assert_eq!(t.tag(v), "release-1.20.3");
        assert_eq!(t.version_of("release-1.20.3"), Some(v));
        for other in [
            "v1.20.3",
            "release-1.20",
            "release-1.20.3-rc1",
            "release-01.2.3",
            "release-a.2.3",
            "release-1..3",
        ] {
            assert_eq!(t.version_of(other), None, "{other}");
        }
        let odd = TagTemplate::parse("{patch}-{major}_{minor}").unwrap();
        assert_eq!(
            odd.version_of("3-1_2"),
            Some(Version {
                major: 1,
                minor: 2,
                patch: 3
            })
        );
    }

    #[test]
    fn a_template_that_cannot_make_a_tag_is_refused() {
        for (bad, why) in [
            ("v{major}.{minor}", "no {patch}"),
            ("v{major}.{minor}.{patch}.{patch}", "twice"),
            ("v{major}{minor}.{patch}", "nothing between"),
            ("v{major}.{minor}.{patch} beta", "' '"),
            ("v{major}.{minor}.{patch}$(id)", "'$'"),
            ("-{major}.{minor}.{patch}", "valid tag"),
            ("v{major}..{minor}.{patch}", "valid tag"),
            ("v{Major}.{minor}.{patch}", "`{`"),
        ] {
            let err = TagTemplate::parse(bad).unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn a_bump_raises_its_part_and_zeroes_the_rest() {
        let v = Version {
            major: 1,
            minor: 2,
            patch: 3,
        };
        assert_eq!(v.bumped(Bump::Patch).to_string(), "1.2.4");
        assert_eq!(v.bumped(Bump::Minor).to_string(), "1.3.0");
        assert_eq!(v.bumped(Bump::Major).to_string(), "2.0.0");
        assert_eq!(Version::default().bumped(Bump::Patch).to_string(), "0.0.1");
    }
}
