//! `allocator_frames`: the glob patterns that say which frames belong to
//! the allocation machinery (allocators, their wrappers and the library
//! code leading to them), their defaults (`defaults`, by family), and
//! their syntax: each pattern is parsed here, at start, into the name it
//! matches and the fnmatch pattern that means the same
//! ([`parse_frame_patterns`]); `snapshot::frame_patterns` compiles and
//! matches them.
//!
//! A pattern `module:GLOB` matches a frame's module path (the mapped file,
//! as `/proc/PID/maps` names it); any other pattern matches its function
//! name, demangled.
//!
//! Globs are small on purpose: `*` is any run of characters (`::`, `/` and
//! spaces included), `?` any one character, `\*`, `\?` and `\\` those
//! characters; everything else, `[` and `]` included (C++'s `operator
//! new[]`, Rust's `<[T]>`), is itself. A glob is matched by
//! `tracer_model::Pattern` (fnmatch) once translated
//! ([`glob_to_fnmatch`]): fnmatch itself would read `[` as a class, and
//! accepts every string, so no typo could be refused.

use super::ConfigError;

/// The setting's name, in errors.
const FIELD: &str = "allocator_frames";

/// The prefix of a pattern over module paths.
pub const MODULE_PREFIX: &str = "module:";

/// Longest pattern, in bytes.
const MAX_PATTERN_LEN: usize = 4096;

mod defaults;

pub(super) use defaults::defaults;

/// The name of a frame a pattern of `allocator_frames` is matched
/// against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameName {
    /// The function name, demangled (a pattern without a prefix).
    Function,
    /// The module path (a `module:` pattern).
    Module,
}

/// One pattern of `allocator_frames`, parsed: the name it matches and its
/// glob as the fnmatch pattern that means the same.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FramePattern {
    /// The frame's name the pattern is matched against.
    pub name: FrameName,
    /// The glob, translated for `tracer_model::Pattern`.
    pub fnmatch: String,
}

/// Translates `glob` (see the module's documentation for its syntax) into
/// the fnmatch pattern that means the same: `[` becomes `[[]`, `\*` and
/// `\?` become `[*]` and `[?]`, `\\` a backslash (which fnmatch never reads
/// as an escape).
///
/// # Errors
/// A reason when `glob` is empty or has a backslash that escapes nothing
/// it may escape.
pub fn glob_to_fnmatch(glob: &str) -> Result<String, String> {
    if glob.is_empty() {
        return Err("an empty glob matches nothing".into());
    }
    let mut fnmatch = String::with_capacity(glob.len() + 8);
    let mut chars = glob.chars();
    while let Some(c) = chars.next() {
        match c {
            '[' => fnmatch.push_str("[[]"),
            '\\' => match chars.next() {
                Some('*') => fnmatch.push_str("[*]"),
                Some('?') => fnmatch.push_str("[?]"),
                Some('\\') => fnmatch.push('\\'),
                Some(other) => {
                    return Err(format!("\\{other}: a backslash escapes only *, ? and \\"));
                }
                None => {
                    return Err("it ends in a backslash, which escapes only *, ? and \\".into());
                }
            },
            c => fnmatch.push(c),
        }
    }
    Ok(fnmatch)
}

/// Parses the patterns of `allocator_frames`, in their order.
///
/// # Errors
/// [`ConfigError::Invalid`] naming the first pattern that does not parse,
/// and why.
pub fn parse_frame_patterns(patterns: &[String]) -> Result<Vec<FramePattern>, ConfigError> {
    patterns
        .iter()
        .map(|pattern| {
            let invalid = |reason: String| ConfigError::Invalid {
                field: FIELD,
                value: pattern.clone(),
                reason: format!(
                    "{reason}; a pattern is a glob of a function name (* any run, ? one \
                     character, \\ escapes * ? \\), or module:GLOB of a module path"
                ),
            };
            if pattern.len() > MAX_PATTERN_LEN {
                return Err(invalid(format!(
                    "it is longer than {MAX_PATTERN_LEN} bytes"
                )));
            }
            Ok(match pattern.strip_prefix(MODULE_PREFIX) {
                Some(glob) => FramePattern {
                    name: FrameName::Module,
                    fnmatch: glob_to_fnmatch(glob).map_err(|e| invalid(format!("module: {e}")))?,
                },
                None => FramePattern {
                    name: FrameName::Function,
                    fnmatch: glob_to_fnmatch(pattern).map_err(invalid)?,
                },
            })
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests may unwrap (CONTRIBUTING.md).
mod tests {
    use super::*;

    #[test]
    fn globs_become_the_fnmatch_patterns_that_mean_the_same() {
        assert_eq!(glob_to_fnmatch("g_malloc?").unwrap(), "g_malloc?");
        assert_eq!(glob_to_fnmatch("<[*]>::*").unwrap(), "<[[]*]>::*");
        assert_eq!(glob_to_fnmatch("x[!a]").unwrap(), "x[[]!a]");
        assert_eq!(glob_to_fnmatch(r"a\*b\?").unwrap(), "a[*]b[?]");
        assert_eq!(glob_to_fnmatch(r"a\\").unwrap(), r"a\");
    }

    #[test]
    fn bad_globs_say_why() {
        assert_eq!(
            glob_to_fnmatch("").unwrap_err(),
            "an empty glob matches nothing"
        );
        assert_eq!(
            glob_to_fnmatch(r"a\b").unwrap_err(),
            r"\b: a backslash escapes only *, ? and \"
        );
        assert_eq!(
            glob_to_fnmatch(r"a\").unwrap_err(),
            r"it ends in a backslash, which escapes only *, ? and \"
        );
    }

    #[test]
    fn function_and_module_patterns_are_told_apart() {
        let parsed = parse_frame_patterns(&["std::*".into(), "module:*/libc.so.6".into()]).unwrap();
        assert_eq!(
            parsed,
            [
                FramePattern {
                    name: FrameName::Function,
                    fnmatch: "std::*".into()
                },
                FramePattern {
                    name: FrameName::Module,
                    fnmatch: "*/libc.so.6".into()
                },
            ]
        );
        assert!(parse_frame_patterns(&[]).unwrap().is_empty());
    }

    #[test]
    fn an_invalid_pattern_is_refused_by_name() {
        let err = parse_frame_patterns(&["xmalloc".into(), r"my\alloc".into()]).unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"allocator_frames = "my\\alloc" is invalid: \a: a backslash escapes only *, ? and \; a pattern is a glob of a function name (* any run, ? one character, \ escapes * ? \), or module:GLOB of a module path"#
        );
        let err = parse_frame_patterns(&["module:".into()]).unwrap_err();
        assert!(
            err.to_string().starts_with(
                r#"allocator_frames = "module:" is invalid: module: an empty glob matches nothing;"#
            ),
            "{err}"
        );
        let err = parse_frame_patterns(&[String::new()]).unwrap_err();
        assert!(
            err.to_string()
                .starts_with(r#"allocator_frames = "" is invalid: an empty glob"#),
            "{err}"
        );
        let long = "x".repeat(MAX_PATTERN_LEN + 1);
        let err = parse_frame_patterns(&[long]).unwrap_err();
        assert!(
            err.to_string()
                .contains("is invalid: it is longer than 4096 bytes;"),
            "{err}"
        );
    }
}
