//! `allocator_frames`: the glob patterns that say which frames belong to
//! the allocation machinery (allocators, their wrappers and the library
//! code leading to them), their defaults (`defaults`, by family), and their
//! compiled form.
//!
//! A pattern `module:GLOB` matches a frame's module path (the mapped file,
//! as `/proc/PID/maps` names it); any other pattern matches its function
//! name, demangled. A C++ function template's demangled name starts with
//! its return type (`void std::vector<int>::_M_realloc_insert<int>(...)`):
//! a function pattern matches either the whole name or the name after that
//! return type, so `std::*` finds it.
//!
//! Globs are small on purpose: `*` is any run of characters (`::`, `/` and
//! spaces included), `?` any one character, `\*`, `\?` and `\\` those
//! characters; everything else, `[` and `]` included (C++'s `operator
//! new[]`, Rust's `<[T]>`), is itself. Matching is case-sensitive and the
//! whole name must match. A glob is matched by `tracer_model::Pattern`
//! (fnmatch) once translated: fnmatch itself would read `[` as a class, and
//! accepts every string, so no typo could be refused.

use tracer_model::Pattern;

use super::ConfigError;

/// The setting's name, in errors.
const FIELD: &str = "allocator_frames";

/// The prefix of a pattern over module paths.
pub const MODULE_PREFIX: &str = "module:";

/// Longest pattern, in bytes.
const MAX_PATTERN_LEN: usize = 4096;

mod defaults;

pub(super) use defaults::defaults;

/// A compiled glob (see the module's documentation for its syntax),
/// matched as the fnmatch pattern that means the same: `[` becomes `[[]`,
/// `\*` and `\?` become `[*]` and `[?]`, `\\` a backslash (which fnmatch
/// never reads as an escape).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Glob(Pattern);

impl Glob {
    /// Compiles `glob`.
    ///
    /// # Errors
    /// A reason when `glob` is empty or has a backslash that escapes
    /// nothing it may escape.
    pub fn new(glob: &str) -> Result<Self, String> {
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
        Ok(Self(Pattern::new(&fnmatch)))
    }

    /// Whether the whole of `text` matches.
    #[must_use]
    pub fn matches(&self, text: &str) -> bool {
        self.0.matches(text)
    }
}

/// `allocator_frames` compiled: the function globs and the module globs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FramePatterns {
    functions: Vec<Glob>,
    modules: Vec<Glob>,
}

impl FramePatterns {
    /// Compiles the patterns of `allocator_frames`.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the first pattern that does not
    /// compile, and why.
    pub fn compile(patterns: &[String]) -> Result<Self, ConfigError> {
        let mut compiled = Self::default();
        for pattern in patterns {
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
            match pattern.strip_prefix(MODULE_PREFIX) {
                Some(glob) => compiled
                    .modules
                    .push(Glob::new(glob).map_err(|e| invalid(format!("module: {e}")))?),
                None => compiled
                    .functions
                    .push(Glob::new(pattern).map_err(invalid)?),
            }
        }
        Ok(compiled)
    }

    /// True when no pattern is set (nothing is ever dropped).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.functions.is_empty() && self.modules.is_empty()
    }

    /// Whether the demangled function name `name` matches a function
    /// pattern, whole or after a C++ return type.
    #[must_use]
    pub fn matches_function(&self, name: &str) -> bool {
        let bare = without_return_type(name);
        self.functions
            .iter()
            .any(|g| g.matches(name) || bare.is_some_and(|bare| g.matches(bare)))
    }

    /// Whether the module path `path` matches a `module:` pattern.
    #[must_use]
    pub fn matches_module(&self, path: &str) -> bool {
        self.modules.iter().any(|g| g.matches(path))
    }
}

/// A demangled C++ name without the return type a function template's
/// name starts with: `void std::vector<int>::_M_realloc_insert<int>(int&&)`
/// gives `std::vector<int>::_M_realloc_insert<int>(int&&)`. None when the
/// name has none (the last space outside brackets before the parameters
/// ends it; an operator's own symbols and `operator new`'s space are no
/// brackets and no return type).
#[must_use]
pub fn without_return_type(name: &str) -> Option<&str> {
    let bytes = name.as_bytes();
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut depth = 0i32;
    let mut split = None;
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        let rest = bytes.get(i..).unwrap_or_default();
        let starts_word = i == 0 || bytes.get(i - 1).is_none_or(|&p| !ident(p));
        if starts_word && rest.starts_with(b"operator") {
            i += "operator".len();
            let after = bytes.get(i..).unwrap_or_default();
            if after.starts_with(b"()") {
                i += 2;
            } else if after.first() == Some(&b' ') {
                // operator new, operator delete, a conversion operator.
                i += 1;
            } else {
                while bytes
                    .get(i)
                    .is_some_and(|c| b"<>=!+-*/%^&|~,[]".contains(c))
                {
                    i += 1;
                }
                // `operator< <char>`: the space before an operator's
                // template arguments.
                if bytes.get(i..).unwrap_or_default().starts_with(b" <") {
                    i += 1;
                }
            }
            continue;
        }
        match b {
            b'(' if depth == 0 => break,
            b'<' | b'(' | b'[' | b'{' => depth += 1,
            b'>' | b')' | b']' | b'}' => depth -= 1,
            b' ' if depth == 0 => split = Some(i + 1),
            _ => {}
        }
        i += 1;
    }
    split
        .and_then(|s| name.get(s..))
        .filter(|bare| !bare.is_empty())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests may unwrap (CONTRIBUTING.md).
mod tests {
    use super::*;

    fn glob(g: &str) -> Glob {
        Glob::new(g).unwrap()
    }

    #[test]
    fn globs_match_stars_question_marks_and_literal_brackets() {
        assert!(glob("operator new*").matches("operator new[](unsigned long)"));
        assert!(glob("<[*]>::*").matches("<[u8]>::to_vec"));
        assert!(!glob("<[*]>::*").matches("<u8>::to_vec"));
        assert!(glob("g_malloc?").matches("g_malloc0"));
        assert!(!glob("g_malloc?").matches("g_malloc"));
        assert!(glob("a*b*c").matches("aXbYc"));
        assert!(glob("*").matches(""));
        assert!(!glob("xmalloc").matches("xmallocz"));
        assert!(glob(r"a\*b").matches("a*b"));
        assert!(!glob(r"a\*b").matches("aXb"));
        assert!(glob(r"a\?\\").matches(r"a?\"));
        // Brackets are themselves, never a class.
        assert!(glob("x[!a]").matches("x[!a]"));
        assert!(!glob("x[!a]").matches("xb"));
        assert!(glob("operator new[]*").matches("operator new[](unsigned long)"));
        assert!(!glob("operator new[]*").matches("operator new(unsigned long)"));
        assert!(glob("*/libc.so.6").matches("/usr/lib/x86_64-linux-gnu/libc.so.6"));
        assert!(!glob("*/libc.so.6").matches("/usr/lib/x86_64-linux-gnu/libc.so.60"));
    }

    #[test]
    fn bad_globs_say_why() {
        assert_eq!(Glob::new("").unwrap_err(), "an empty glob matches nothing");
        assert_eq!(
            Glob::new(r"a\b").unwrap_err(),
            r"\b: a backslash escapes only *, ? and \"
        );
        assert_eq!(
            Glob::new(r"a\").unwrap_err(),
            r"it ends in a backslash, which escapes only *, ? and \"
        );
    }

    #[test]
    fn return_types_of_cpp_templates_are_found() {
        let cases = [
            (
                "void std::vector<int, std::allocator<int> >::_M_realloc_insert<int const&>(__gnu_cxx::__normal_iterator<int*, std::vector<int, std::allocator<int> > >, int const&)",
                Some(
                    "std::vector<int, std::allocator<int> >::_M_realloc_insert<int const&>(__gnu_cxx::__normal_iterator<int*, std::vector<int, std::allocator<int> > >, int const&)",
                ),
            ),
            ("unsigned long std::foo<int>()", Some("std::foo<int>()")),
            (
                "std::_MakeUniq<int>::__single_object std::make_unique<int>()",
                Some("std::make_unique<int>()"),
            ),
            ("operator new(unsigned long)", None),
            ("operator new[](unsigned long, std::align_val_t)", None),
            (
                "bool std::operator< <char>(std::string const&, char const*)",
                Some("std::operator< <char>(std::string const&, char const*)"),
            ),
            (
                "std::foo::operator std::vector<int, std::allocator<int> >() const",
                None,
            ),
            ("main::{lambda(int)#1}::operator()(int) const", None),
            ("(anonymous namespace)::grow(int)", None),
            ("myapp::f(int, std::string)", None),
            (
                "<alloc::alloc::Global as core::alloc::Allocator>::allocate",
                None,
            ),
            ("xmalloc", None),
        ];
        for (name, want) in cases {
            assert_eq!(without_return_type(name), want, "{name}");
        }
    }

    #[test]
    fn function_and_module_patterns_are_apart() {
        let p = FramePatterns::compile(&["std::*".into(), "module:*/libc.so.6".into()]).unwrap();
        assert!(
            p.matches_function("std::__new_allocator<int>::allocate(unsigned long, void const*)")
        );
        assert!(p.matches_function("int* std::__uninitialized_copy_a<int const*, int*, int>(int const*, int const*, int*, std::allocator<int>&)"));
        // A user function with std:: in its parameters is the user's.
        assert!(!p.matches_function("myapp::f(int, std::string)"));
        assert!(!p.matches_function("/usr/lib/x86_64-linux-gnu/libc.so.6"));
        assert!(p.matches_module("/usr/lib/x86_64-linux-gnu/libc.so.6"));
        assert!(!p.matches_module("std::x"));
        assert!(!p.is_empty());
        assert!(FramePatterns::compile(&[]).unwrap().is_empty());
    }

    #[test]
    fn an_invalid_pattern_is_refused_by_name() {
        let err = FramePatterns::compile(&["xmalloc".into(), r"my\alloc".into()]).unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"allocator_frames = "my\\alloc" is invalid: \a: a backslash escapes only *, ? and \; a pattern is a glob of a function name (* any run, ? one character, \ escapes * ? \), or module:GLOB of a module path"#
        );
        let err = FramePatterns::compile(&["module:".into()]).unwrap_err();
        assert!(
            err.to_string().starts_with(
                r#"allocator_frames = "module:" is invalid: module: an empty glob matches nothing;"#
            ),
            "{err}"
        );
        let err = FramePatterns::compile(&[String::new()]).unwrap_err();
        assert!(
            err.to_string()
                .starts_with(r#"allocator_frames = "" is invalid: an empty glob"#),
            "{err}"
        );
    }
}
