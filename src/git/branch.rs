//! Safe branch names: `rover/<short-id>-<slug>`, ASCII only, bounded length.

/// Every branch rover creates starts with this prefix.
pub const BRANCH_PREFIX: &str = "rover/";

const SLUG_MAX: usize = 40;
const ID_MAX: usize = 12;

/// A lowercase ASCII slug of `title`: letters and digits, runs of anything else become one `-`,
/// at most 40 characters, cut at a word boundary when possible; `task` when nothing is left.
pub fn slugify(title: &str) -> String {
    let mut slug = String::new();
    for c in title.chars() {
        if c.is_ascii_alphanumeric() {
            slug.push(c.to_ascii_lowercase());
        } else if !slug.is_empty() && !slug.ends_with('-') {
            slug.push('-');
        }
    }
    if slug.len() > SLUG_MAX {
        let cut = &slug[..SLUG_MAX];
        slug = match cut.rfind('-') {
            Some(at) if at >= SLUG_MAX / 2 => cut[..at].to_string(),
            _ => cut.to_string(),
        };
    }
    let slug = slug.trim_matches('-').to_string();
    if slug.is_empty() {
        "task".to_string()
    } else {
        slug
    }
}

/// Whether `name` (from GitHub: a person's head branch) is a branch name git takes as it is:
/// a valid `refs/heads/<name>`, not an option, nothing a refspec would read as syntax.
pub fn is_branch_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(['-', '+'])
        && !name.contains(':')
        && git2::Reference::is_valid_name(&format!("refs/heads/{name}"))
}

/// `rover/<short-id>-<slug>` where the short id is the first 12 ASCII alphanumerics of `id`
/// (lowercased; a trace or task id) and the slug comes from `title`. Always a valid ref name.
pub fn branch_name(id: &str, title: &str) -> String {
    let short: String = id
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(ID_MAX)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    let slug = slugify(title);
    if short.is_empty() {
        format!("{BRANCH_PREFIX}{slug}")
    } else {
        format!("{BRANCH_PREFIX}{short}-{slug}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_branch_names_are_taken() {
        for ok in ["feature/csv", "fix-1", "a.b"] {
            assert!(is_branch_name(ok), "{ok}");
        }
        for bad in [
            "",
            "-f",
            "+main",
            "a:b",
            "a..b",
            "a b",
            "a~1",
            "x.lock",
            "a\\b",
            "refs/../x",
        ] {
            assert!(!is_branch_name(bad), "{bad}");
        }
    }

    #[test]
    fn slug_is_ascii_lowercase_and_dashed() {
        assert_eq!(slugify("Fix the  login bug!"), "fix-the-login-bug");
        assert_eq!(slugify("Ünïcode → ascii"), "n-code-ascii");
        assert_eq!(slugify("../../etc/passwd; rm -rf /"), "etc-passwd-rm-rf");
        assert_eq!(slugify("   "), "task");
        assert_eq!(slugify("--a--"), "a");
    }

    #[test]
    fn slug_is_bounded_and_cut_at_a_word() {
        let slug = slugify("add a very long feature title that goes on and on and on forever");
        assert!(slug.len() <= 40, "{slug}");
        assert!(!slug.ends_with('-'));
        assert_eq!(slug, "add-a-very-long-feature-title-that-goes");
        let word = slugify(&"x".repeat(100));
        assert_eq!(word.len(), 40);
    }

    #[test]
    fn branch_names_are_valid_refs() {
        assert_eq!(
            branch_name("3f2A-91bc-ffff-0000", "Add login"),
            "rover/3f2a91bcffff-add-login"
        );
        assert_eq!(branch_name("", "x"), "rover/x");
        for (id, title) in [
            ("a.b", "..lock"),
            ("@{", "a b~c^d:e?f*g[h\\"),
            ("-", "HEAD"),
        ] {
            let name = branch_name(id, title);
            assert!(
                git2::Reference::is_valid_name(&format!("refs/heads/{name}")),
                "{name}"
            );
        }
    }
}
