//! Source lines for `Traceback.format()`, as Python's `linecache`
//! makes them of a file's bytes (tracemalloc calls `linecache.getline` for
//! every frame). Pure: the bytes are handed in by whoever read the file
//! (tracerd's `symbolize::linecache`, which also says which files may be
//! read at all).
//!
//! - names like `<unknown>` (starting with `<` and ending with `>`) have no
//!   source ([`has_source`]);
//! - the bytes are decoded as `tokenize.open` does: a UTF-8 BOM, or a
//!   coding cookie (`# -*- coding: latin-1 -*-`) on one of the first two
//!   lines, chooses the encoding (UTF-8 by default; UTF-8, Latin-1 and
//!   ASCII are supported here, another declared encoding gives no lines); a
//!   file that does not decode gives no lines at all;
//! - lines end at `\n`, `\r\n` or `\r` (universal newlines); line N is the
//!   N-th, counted from 1.

/// Whether a frame's file name may name a file with source lines
/// (`linecache.updatecache`: not empty, not `<...>`).
#[must_use]
pub fn has_source(filename: &str) -> bool {
    !(filename.is_empty() || (filename.starts_with('<') && filename.ends_with('>')))
}

/// `linecache.updatecache` of a file's `bytes`: its lines, each ending with
/// `\n`, or none when it does not decode.
#[must_use]
pub fn source_lines(bytes: &[u8]) -> Vec<String> {
    decode_source(bytes).map_or_else(Vec::new, |text| split_lines(&text))
}

/// The line `lineno` (counted from 1) of `lines`, or an empty string
/// (`linecache.getline`).
#[must_use]
pub fn line_of(lines: &[String], lineno: u32) -> String {
    usize::try_from(lineno)
        .ok()
        .and_then(|n| n.checked_sub(1))
        .and_then(|i| lines.get(i))
        .cloned()
        .unwrap_or_default()
}

/// The encodings `decode_source` knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Encoding {
    Utf8,
    Latin1,
    Ascii,
}

/// `tokenize.detect_encoding` then decoding, or None where Python raises
/// (SyntaxError, UnicodeDecodeError) or for an encoding not known here.
fn decode_source(bytes: &[u8]) -> Option<String> {
    let (bom, body) = match bytes.strip_prefix(b"\xef\xbb\xbf") {
        Some(rest) => (true, rest),
        None => (false, bytes),
    };
    let mut lines = body.split_inclusive(|&b| b == b'\n');
    let first = lines.next().unwrap_or(&[]);
    let encoding = match find_cookie(first, bom)? {
        Some(encoding) => encoding,
        None if !is_blank(first) => Encoding::Utf8,
        None => {
            let second = lines.next().unwrap_or(&[]);
            find_cookie(second, bom)?.unwrap_or(Encoding::Utf8)
        }
    };
    match encoding {
        Encoding::Utf8 => std::str::from_utf8(body).ok().map(str::to_string),
        Encoding::Ascii => body
            .is_ascii()
            .then(|| String::from_utf8_lossy(body).into_owned()),
        Encoding::Latin1 => Some(body.iter().map(|&b| char::from(b)).collect()),
    }
}

/// `blank_re`: `^[ \t\f]*(?:[#\r\n]|$)`.
fn is_blank(line: &[u8]) -> bool {
    let rest = trim_indent(line);
    matches!(rest.first(), None | Some(b'#' | b'\r' | b'\n'))
}

fn trim_indent(line: &[u8]) -> &[u8] {
    let start = line
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t' | b'\x0c'))
        .unwrap_or(line.len());
    line.get(start..).unwrap_or(&[])
}

/// `find_cookie`: Some(None) for no cookie, Some(Some(enc)) for a cookie,
/// None where Python raises SyntaxError (the line is not UTF-8, an unknown
/// encoding, or a BOM with another encoding than UTF-8).
fn find_cookie(line: &[u8], bom: bool) -> Option<Option<Encoding>> {
    let text = std::str::from_utf8(line).ok()?;
    // cookie_re: ^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)  (re.ASCII)
    let rest = trim_indent(text.as_bytes());
    if rest.first() != Some(&b'#') {
        return Some(None);
    }
    let rest = std::str::from_utf8(rest).ok()?;
    let mut name = None;
    let mut search = rest;
    while let Some(at) = search.find("coding") {
        let after = &search[at + 6..];
        if let Some(value) = after.strip_prefix([':', '=']) {
            let value = value.trim_start_matches([' ', '\t']);
            let end = value
                .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
                .unwrap_or(value.len());
            if end > 0 {
                name = Some(&value[..end]);
                break;
            }
        }
        search = &search[at + 1..];
    }
    let Some(name) = name else { return Some(None) };
    let encoding = normal_encoding(name)?;
    if bom && encoding != Encoding::Utf8 {
        return None;
    }
    Some(Some(encoding))
}

/// `_get_normal_name` and `codecs.lookup` for the encodings known here.
fn normal_encoding(name: &str) -> Option<Encoding> {
    let short: String = name
        .chars()
        .take(12)
        .collect::<String>()
        .to_lowercase()
        .replace('_', "-");
    if short == "utf-8" || short.starts_with("utf-8-") {
        return Some(Encoding::Utf8);
    }
    if ["latin-1", "iso-8859-1", "iso-latin-1"].contains(&short.as_str())
        || ["latin-1-", "iso-8859-1-", "iso-latin-1-"]
            .iter()
            .any(|p| short.starts_with(p))
    {
        return Some(Encoding::Latin1);
    }
    // codecs.lookup normalizes case and separators the same way.
    match name.to_lowercase().replace(['-', ' '], "_").as_str() {
        "utf8" | "u8" | "utf" | "utf_8" | "cp65001" => Some(Encoding::Utf8),
        "latin1" | "latin_1" | "iso8859_1" | "iso_8859_1" | "l1" | "8859" | "cp819" | "latin" => {
            Some(Encoding::Latin1)
        }
        "ascii" | "us_ascii" | "646" | "us" => Some(Encoding::Ascii),
        _ => None,
    }
}

/// `readlines()` with universal newlines, and a final `\n` added as
/// `updatecache` does.
fn split_lines(text: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut current = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\r' => {
                if chars.peek() == Some(&'\n') {
                    chars.next();
                }
                current.push('\n');
                lines.push(std::mem::take(&mut current));
            }
            '\n' => {
                current.push('\n');
                lines.push(std::mem::take(&mut current));
            }
            c => current.push(c),
        }
    }
    if !current.is_empty() {
        current.push('\n');
        lines.push(current);
    }
    lines
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests may unwrap (CONTRIBUTING.md).
mod tests {
    use super::*;

    #[test]
    fn universal_newlines_and_a_final_newline() {
        assert_eq!(split_lines("a\r\nb\rc\nd"), ["a\n", "b\n", "c\n", "d\n"]);
        assert_eq!(split_lines(""), Vec::<String>::new());
        assert_eq!(split_lines("\n\n"), ["\n", "\n"]);
    }

    #[test]
    fn cookies_choose_the_encoding_like_tokenize() {
        assert_eq!(
            decode_source(b"# -*- coding: latin-1 -*-\n\xe9\n").unwrap(),
            "# -*- coding: latin-1 -*-\n\u{e9}\n"
        );
        assert_eq!(
            decode_source(b"\n# vim: set fileencoding=iso-8859-1 :\n\xe9")
                .unwrap()
                .chars()
                .last(),
            Some('\u{e9}')
        );
        assert!(
            decode_source(b"int x;\n# coding: latin-1\n\xe9").is_none(),
            "cookie only after a blank first line"
        );
        assert!(decode_source(b"\xe9\n").is_none(), "not UTF-8");
        assert!(
            decode_source(b"# coding: klingon\nx").is_none(),
            "unknown encoding"
        );
        assert!(
            decode_source(b"\xef\xbb\xbf# coding: latin-1\nx").is_none(),
            "BOM with another encoding"
        );
        assert_eq!(decode_source(b"\xef\xbb\xbfx\n").unwrap(), "x\n");
        assert!(decode_source(b"# coding=ascii\n\xc3\xa9").is_none());
    }
}
