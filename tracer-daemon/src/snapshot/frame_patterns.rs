//! The allocator-frame patterns compiled and matched: [`FramePatterns`]
//! says whether a frame's function name or module path belongs to the
//! allocation machinery; [`machinery`](super::machinery) drops a
//! traceback's leading run of such frames. The patterns' syntax, and their
//! validation at start, are `config::allocator_frames`'s
//! ([`parse_frame_patterns`]).
//!
//! Matching is case-sensitive and the whole name must match. A C++
//! function template's demangled name starts with its return type (`void
//! std::vector<int>::_M_realloc_insert<int>(...)`): a function pattern
//! matches either the whole name or the name after that return type
//! ([`without_return_type`]), so `std::*` finds it.

use tracer_model::Pattern;

use crate::config::{ConfigError, FrameName, glob_to_fnmatch, parse_frame_patterns};

/// A compiled glob (`config::allocator_frames` gives its syntax), matched
/// as the fnmatch pattern that means the same ([`glob_to_fnmatch`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Glob(Pattern);

impl Glob {
    /// Compiles `glob`.
    ///
    /// # Errors
    /// A reason when `glob` is empty or has a backslash that escapes
    /// nothing it may escape.
    pub fn new(glob: &str) -> Result<Self, String> {
        glob_to_fnmatch(glob).map(|fnmatch| Self(Pattern::new(&fnmatch)))
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
        for pattern in parse_frame_patterns(patterns)? {
            let glob = Glob(Pattern::new(&pattern.fnmatch));
            match pattern.name {
                FrameName::Function => compiled.functions.push(glob),
                FrameName::Module => compiled.modules.push(glob),
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
mod tests;

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests may unwrap (CONTRIBUTING.md).
mod real_names;
