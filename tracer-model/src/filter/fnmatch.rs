//! Shell-style file name patterns exactly as CPython 3.11's `fnmatch`
//! matches them on POSIX (where `os.path.normcase` changes nothing, so
//! matching is case-sensitive).
//!
//! CPython translates a pattern to a regular expression (`fnmatch.translate`)
//! and runs it with `re`. The translation is reproduced here token by token,
//! including its corner cases: an unclosed `[` is a literal `[`, `[]...]`
//! and `[!]...]` take `]` as their first member, a `-` right after `[` or
//! `[!` or right before `]` is literal, ranges whose ends are reversed are
//! dropped (`[z-a]` matches nothing, `[!z-a]` matches any character), and a
//! backslash is never an escape. `*` and `?` match any character, newlines
//! included (the regex is compiled with `(?s:...)`).
//!
//! Matching works on Unicode scalar values, as Python's `str` does, with the
//! classic greedy algorithm for `*` that backtracks only to the last star.
//! That is equivalent to CPython's atomic `(?>.*?fixed)` groups because
//! every other token matches exactly one character.

use std::fmt;

/// One element of a translated pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    /// `*`: any run of characters (consecutive stars are one).
    Star,
    /// `?`, and `[!]`: any one character.
    Any,
    /// A character matched exactly.
    Literal(char),
    /// `[...]` / `[!...]`: any one character in (or not in) the ranges,
    /// each an inclusive `(low, high)` pair (single characters are
    /// `(c, c)`).
    Class {
        /// `[!...]`.
        negated: bool,
        /// Inclusive ranges.
        ranges: Vec<(char, char)>,
    },
    /// `[z-a]` and other classes left empty: never matches.
    Never,
}

impl Token {
    /// Whether this single-character token accepts `c` (never called on
    /// [`Token::Star`]).
    fn accepts(&self, c: char) -> bool {
        match self {
            Token::Star | Token::Any => true,
            Token::Literal(l) => *l == c,
            Token::Class { negated, ranges } => {
                ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi) != *negated
            }
            Token::Never => false,
        }
    }
}

/// A compiled `fnmatch` pattern.
///
/// ```
/// use tracer_model::Pattern;
/// let p = Pattern::new("/srv/*/cache.[ch]");
/// assert!(p.matches("/srv/app/src/cache.c"));
/// assert!(!p.matches("/srv/app/src/cache.cc"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pattern {
    source: String,
    tokens: Vec<Token>,
}

impl Pattern {
    /// Compiles `pattern` as `fnmatch.translate` does. Every string is a
    /// valid pattern.
    #[must_use]
    pub fn new(pattern: &str) -> Self {
        Pattern {
            source: pattern.to_owned(),
            tokens: translate(pattern),
        }
    }

    /// The pattern's text.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// `fnmatch.fnmatchcase(name, pattern)`: the whole of `name` must match.
    #[must_use]
    pub fn matches(&self, name: &str) -> bool {
        let tokens = &self.tokens;
        let mut chars = name.chars();
        let mut p = 0usize;
        // Where to resume after the last star: the token after it, and the
        // name from the character after the one the star last stopped at.
        let mut resume: Option<(usize, std::str::Chars<'_>)> = None;
        loop {
            let before = chars.clone();
            let Some(c) = chars.next() else { break };
            match tokens.get(p) {
                Some(Token::Star) => {
                    // The star takes nothing for now.
                    chars = before.clone();
                    p += 1;
                    resume = Some((p, before));
                }
                Some(token) if token.accepts(c) => p += 1,
                _ => match &mut resume {
                    Some((after_star, from)) => {
                        // The star takes one more character.
                        if from.next().is_none() {
                            return false;
                        }
                        p = *after_star;
                        chars = from.clone();
                    }
                    None => return false,
                },
            }
        }
        tokens
            .get(p..)
            .is_some_and(|rest| rest.iter().all(|t| *t == Token::Star))
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

/// `fnmatch.translate`, to tokens instead of a regex string.
fn translate(pattern: &str) -> Vec<Token> {
    let pat: Vec<char> = pattern.chars().collect();
    let n = pat.len();
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(&c) = pat.get(i) {
        i += 1;
        match c {
            '*' => {
                if out.last() != Some(&Token::Star) {
                    out.push(Token::Star);
                }
            }
            '?' => out.push(Token::Any),
            '[' => {
                let mut j = i;
                if pat.get(j) == Some(&'!') {
                    j += 1;
                }
                if pat.get(j) == Some(&']') {
                    j += 1;
                }
                while j < n && pat.get(j) != Some(&']') {
                    j += 1;
                }
                if j >= n {
                    out.push(Token::Literal('['));
                } else {
                    out.push(class(&pat, i, j));
                    i = j + 1;
                }
            }
            c => out.push(Token::Literal(c)),
        }
    }
    out
}

/// One character of the regex class text `translate` writes: raw (`-`
/// joining a range, `]` closing the class, `!`/`^` at the start) or
/// backslash-escaped (always a literal).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Atom {
    Raw(char),
    Escaped(char),
}

impl Atom {
    fn char(self) -> char {
        match self {
            Atom::Raw(c) | Atom::Escaped(c) => c,
        }
    }
}

/// The class `pat[start..end]` (between `[` and `]`): the regex class text
/// `translate` builds (chunks split at the hyphens that form ranges,
/// reversed ranges removed, backslashes, hyphens and `&~|` escaped), then
/// read back as `re`'s parser reads a class.
fn class(pat: &[char], start: usize, end: usize) -> Token {
    let stuff = pat.get(start..end).unwrap_or(&[]);
    let mut text: Vec<Atom> = Vec::with_capacity(stuff.len() + 2);
    let escape = |c: char| match c {
        '\\' | '-' | '&' | '~' | '|' => Atom::Escaped(c),
        c => Atom::Raw(c),
    };
    if stuff.contains(&'-') {
        let mut chunks: Vec<Vec<char>> = Vec::new();
        let mut i = start;
        let mut k = if pat.get(start) == Some(&'!') {
            start + 2
        } else {
            start + 1
        };
        loop {
            // pat.find('-', k, end)
            let found = (k..end).find(|&x| pat.get(x) == Some(&'-'));
            let Some(hyphen) = found else { break };
            chunks.push(pat.get(i..hyphen).unwrap_or(&[]).to_vec());
            i = hyphen + 1;
            k = hyphen + 3;
        }
        let chunk = pat.get(i..end).unwrap_or(&[]).to_vec();
        if chunk.is_empty() {
            if let Some(last) = chunks.last_mut() {
                last.push('-');
            }
        } else {
            chunks.push(chunk);
        }
        // Remove empty ranges -- invalid in RE.
        let mut k = chunks.len().saturating_sub(1);
        while k > 0 {
            let prev_last = chunks.get(k - 1).and_then(|c| c.last().copied());
            let next_first = chunks.get(k).and_then(|c| c.first().copied());
            if let (Some(a), Some(b)) = (prev_last, next_first)
                && a > b
            {
                let next = chunks.remove(k);
                if let Some(prev) = chunks.get_mut(k - 1) {
                    prev.pop();
                    prev.extend(next.iter().skip(1));
                }
            }
            k -= 1;
        }
        for (index, chunk) in chunks.iter().enumerate() {
            if index > 0 {
                text.push(Atom::Raw('-'));
            }
            text.extend(chunk.iter().map(|&c| escape(c)));
        }
    } else {
        text.extend(stuff.iter().map(|&c| escape(c)));
    }
    if text.is_empty() {
        // Empty range: never match.
        return Token::Never;
    }
    if text == [Atom::Raw('!')] {
        // Negated empty range: match any character.
        return Token::Any;
    }
    let negated = text.first() == Some(&Atom::Raw('!'));
    if negated {
        text.remove(0);
    } else if let Some(first) = text.first_mut()
        && matches!(*first, Atom::Raw('^') | Atom::Raw('['))
    {
        *first = Atom::Escaped(first.char());
    }
    text.push(Atom::Raw(']'));
    // re's parser, on `[` (`^`) text: a `]` closes the class unless it is
    // the first member; `a-b` is a range; `a-]` is `a` and `-`.
    let mut ranges: Vec<(char, char)> = Vec::new();
    let mut atoms = text.into_iter().peekable();
    while let Some(this) = atoms.next() {
        if this == Atom::Raw(']') && !ranges.is_empty() {
            break;
        }
        let low = this.char();
        if atoms.peek() == Some(&Atom::Raw('-')) {
            atoms.next();
            match atoms.next() {
                Some(Atom::Raw(']')) | None => {
                    ranges.push((low, low));
                    ranges.push(('-', '-'));
                    break;
                }
                Some(that) => {
                    let high = that.char();
                    if high < low {
                        // re.error("bad character range"): translate's
                        // removal of reversed ranges makes this unreachable;
                        // match nothing rather than fail.
                        return Token::Never;
                    }
                    ranges.push((low, high));
                }
            }
        } else {
            ranges.push((low, low));
        }
    }
    Token::Class { negated, ranges }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests may unwrap (CONTRIBUTING.md).
mod tests {
    use super::*;

    fn m(name: &str, pattern: &str) -> bool {
        Pattern::new(pattern).matches(name)
    }

    #[test]
    fn stars_and_question_marks() {
        assert!(m("a.c", "*.c"));
        assert!(m(".c", "*.c"));
        assert!(!m("a.h", "*.c"));
        assert!(m("abc", "a?c"));
        assert!(!m("ac", "a?c"));
        assert!(m("a\nb", "a*b"), "stars match newlines");
        assert!(m("a\nb", "a?b"));
        assert!(m("", "*"));
        assert!(m("", ""));
        assert!(!m("a", ""));
        assert!(m("aXbYc", "a*b*c"));
        assert!(m("abcbc", "a*bc"));
        assert!(!m("abcbd", "a*bc"));
        assert!(m("/a/b/c.c", "/a/*"), "stars cross slashes");
        assert!(m("éé", "?é"));
    }

    #[test]
    fn classes_follow_translate() {
        assert!(m("b", "[abc]"));
        assert!(!m("d", "[abc]"));
        assert!(m("d", "[!abc]"));
        assert!(m("]", "[]]"));
        assert!(!m("]", "[!]]"));
        assert!(m("a", "[!]]"));
        assert!(m("[", "["), "unclosed [ is literal");
        assert!(m("[ab", "[ab"));
        assert!(m("-", "[-a]"));
        assert!(m("-", "[a-]"));
        assert!(m("b", "[a-c]"));
        assert!(!m("b", "[z-a]"), "reversed range is removed");
        assert!(m("b", "[!z-a]"), "negated empty class matches anything");
        assert!(m("\\", "[\\]"), "backslash is literal");
        assert!(m("-", "[a-c-e]"));
        assert!(m("e", "[a-c-e]"));
        assert!(!m("d", "[a-c-e]"));
        assert!(m("!", "[]!]"));
        assert!(m("^", "[^]"));
    }
}
