//! Source lines for `Traceback.format()`, as Python's `linecache.getline`
//! finds them (tracemalloc calls it for every frame):
//!
//! - names like `<unknown>` (starting with `<` and ending with `>`) have no
//!   source;
//! - the file is read as `tokenize.open` does: a UTF-8 BOM, or a coding
//!   cookie (`# -*- coding: latin-1 -*-`) on one of the first two lines,
//!   chooses the encoding (UTF-8 by default; UTF-8, Latin-1 and ASCII are
//!   supported here, another declared encoding gives no lines); a file
//!   that does not decode gives no lines at all;
//! - lines end at `\n`, `\r\n` or `\r` (universal newlines); line N is the
//!   N-th, counted from 1;
//! - a relative name is looked up from tracerd's working directory only
//!   (Python would also search `sys.path`).
//!
//! tracerd runs as root and anyone who can reach its API can choose file
//! names (a traced program's debug info, or an uploaded snapshot), so a
//! file is read only if any local user could read it anyway: a regular
//! file, world-readable, in world-searchable directories (checked on its
//! canonical path, so symlinks cannot lead elsewhere), of at most
//! [`MAX_SOURCE_BYTES`], and not on one of the kernel's own file systems
//! ([`KERNEL_FS`]: `/proc`, `/sys` and the like), whose files say more to
//! root than their permission bits let others see (`/proc/PID/maps` of
//! another user's process, `/proc/kallsyms` with real addresses). Anything
//! else has no source lines.
use std::{
    collections::HashMap,
    fs::File,
    io::Read as _,
    os::unix::fs::{MetadataExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
};

/// Largest source file read, in bytes.
pub const MAX_SOURCE_BYTES: u64 = 16 * 1024 * 1024;

/// The lines of the files read so far (one cache per request: files change).
#[derive(Debug, Default)]
pub struct LineCache {
    files: HashMap<String, Vec<String>>,
}

impl LineCache {
    /// An empty cache.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// `linecache.getline(filename, lineno)`: the line with its end of line
    /// (`\n`), or an empty string.
    pub fn getline(&mut self, filename: &str, lineno: u32) -> String {
        let lines = self
            .files
            .entry(filename.to_string())
            .or_insert_with(|| read_lines(filename));
        usize::try_from(lineno)
            .ok()
            .and_then(|n| n.checked_sub(1))
            .and_then(|i| lines.get(i))
            .cloned()
            .unwrap_or_default()
    }
}

/// `linecache.updatecache`: the file's lines, each ending with `\n`, or none.
fn read_lines(filename: &str) -> Vec<String> {
    if filename.is_empty() || (filename.starts_with('<') && filename.ends_with('>')) {
        return Vec::new();
    }
    let Some(bytes) = read_public_file(Path::new(filename)) else {
        return Vec::new();
    };
    let Some(text) = decode_source(&bytes) else {
        return Vec::new();
    };
    split_lines(&text)
}

/// The kernel's own file systems, by `statfs` magic (linux/magic.h):
/// procfs, sysfs, debugfs, tracefs, securityfs, cgroup v1 and v2, bpffs,
/// devpts, configfs, efivarfs, pstore. Their files are never source.
const KERNEL_FS: [i64; 12] = [
    0x9fa0,
    0x6265_6572,
    0x6462_6720,
    0x7472_6163,
    0x7363_6673,
    0x0027_e0eb,
    0x6367_7270,
    0xcafe_4a11,
    0x1cd1,
    0x6265_6570,
    0xde5e_81e4,
    0x6165_676c,
];

/// Whether `file` lives on one of the [`KERNEL_FS`] (or its file system
/// cannot be told: then it is not read either).
fn on_kernel_fs(file: &File) -> bool {
    use std::os::fd::AsRawFd as _;
    let mut stat = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: a valid descriptor and a buffer of the size fstatfs writes.
    if unsafe { libc::fstatfs(file.as_raw_fd(), stat.as_mut_ptr()) } != 0 {
        return true;
    }
    // SAFETY: fstatfs succeeded, so it filled the buffer.
    #[allow(
        clippy::useless_conversion,
        reason = "f_type is i64 on x86-64, narrower elsewhere"
    )]
    let kind = i64::from(unsafe { stat.assume_init() }.f_type);
    KERNEL_FS.contains(&kind)
}

/// Reads `path` if any local user could: see the module docs.
fn read_public_file(path: &Path) -> Option<Vec<u8>> {
    let canonical = std::fs::canonicalize(path).ok()?;
    let mut dir: PathBuf = canonical.parent()?.to_path_buf();
    loop {
        let mode = std::fs::metadata(&dir).ok()?.mode();
        if mode & 0o001 == 0 {
            return None;
        }
        if !dir.pop() {
            break;
        }
    }
    // O_NONBLOCK: a FIFO swapped in after the checks cannot block us.
    let mut file = File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&canonical)
        .ok()?;
    let meta = file.metadata().ok()?;
    if !meta.is_file()
        || meta.mode() & 0o004 == 0
        || meta.len() > MAX_SOURCE_BYTES
        || on_kernel_fs(&file)
    {
        return None;
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.by_ref()
        .take(MAX_SOURCE_BYTES + 1)
        .read_to_end(&mut bytes)
        .ok()?;
    if bytes.len() as u64 > MAX_SOURCE_BYTES {
        return None;
    }
    Some(bytes)
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
    fn files_of_the_kernel_s_own_file_systems_have_no_source_lines() {
        // World-readable files that say more to root than to their reader:
        // a process's mappings, the CPUs, the kernel's symbols.
        let mut cache = LineCache::new();
        for (path, line) in [
            ("/proc/self/maps", 1),
            ("/proc/self/status", 1),
            ("/proc/kallsyms", 1),
            ("/sys/devices/system/cpu/online", 1),
        ] {
            assert_eq!(cache.getline(path, line), "", "{path}");
        }
        // A world-readable file elsewhere still has its lines.
        assert!(!cache.getline("/etc/passwd", 1).is_empty());
    }

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

    #[test]
    fn private_files_and_pseudo_names_have_no_lines() {
        let mut cache = LineCache::new();
        assert_eq!(cache.getline("<unknown>", 1), "");
        assert_eq!(cache.getline("/etc/shadow", 1), "", "not world-readable");
        assert_eq!(cache.getline("/dev/zero", 1), "", "not a regular file");
        assert_eq!(cache.getline("/nonexistent/x.c", 1), "");
        let dir = std::env::temp_dir().join(format!("tracer-source-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("a.c");
        std::fs::write(&file, "int a;\n  int b;  \r\nlast").unwrap();
        std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .unwrap();
        let name = file.to_str().unwrap();
        assert_eq!(cache.getline(name, 2), "  int b;  \n");
        assert_eq!(cache.getline(name, 3), "last\n");
        assert_eq!(cache.getline(name, 0), "");
        assert_eq!(cache.getline(name, 4), "");
        let private = dir.join("p.c");
        std::fs::write(&private, "secret\n").unwrap();
        std::fs::set_permissions(
            &private,
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .unwrap();
        assert_eq!(LineCache::new().getline(private.to_str().unwrap(), 1), "");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
