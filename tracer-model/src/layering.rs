//! The crate's layers, and a test that keeps its imports pointing down
//! them.
//!
//! Lowest first: a module may import its own layer and the layers below,
//! never one above. `snapshot` is the top of the engine (it calls into
//! `engine` and `filter`); `codec` reads and writes snapshots. Test code
//! (`#[cfg(test)]` items and `tests.rs` files) may use anything.

use std::path::{Path, PathBuf};

/// Top-level modules by layer, lowest first.
const LAYERS: [&[&str]; 8] = [
    &["text", "hash", "interrupt"],
    &["error", "completeness"],
    &["trace"],
    &["statistic"],
    &["engine"],
    &["filter"],
    &["snapshot"],
    &["codec"],
];

fn layer(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

/// The code of a source file without its tests: a one-line `#[cfg(test)]`
/// item (`mod tests;`) is dropped, and one that opens a block ends the
/// code (test modules come last).
fn code(text: &str) -> String {
    let mut code = String::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if line.trim() == "#[cfg(test)]" {
            match lines.next() {
                Some(item) if item.trim_end().ends_with(';') => continue,
                _ => break,
            }
        }
        code.push_str(line);
        code.push('\n');
    }
    code
}

/// The top-level modules that `code` names as `crate::<module>`, outside
/// comments.
fn imports(code: &str) -> Vec<&str> {
    code.lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .flat_map(|line| line.split("crate::").skip(1))
        .map(|rest| {
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .collect()
}

fn sources(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
}

#[test]
fn test_code_and_comments_are_not_imports() {
    let text = "//! See crate::codec.\nuse crate::trace::Frame;\n#[cfg(test)]\nmod tests;\n\
                use crate::text::format::{self};\n#[cfg(test)]\nmod tests {\n    use crate::codec;\n}\n";
    assert_eq!(imports(&code(text)), ["trace", "text"]);
}

#[test]
fn imports_point_down_the_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut checked = 0;
    let mut wrong = Vec::new();
    for path in &files {
        let relative = path.strip_prefix(&src).unwrap();
        let top = relative.iter().next().unwrap().to_str().unwrap();
        let top = top.strip_suffix(".rs").unwrap_or(top);
        if ["lib", "layering"].contains(&top) || path.ends_with("tests.rs") {
            continue;
        }
        let own = layer(top).unwrap_or_else(|| panic!("{} is in no layer", relative.display()));
        let text = std::fs::read_to_string(path).unwrap();
        for module in imports(&code(&text)) {
            match layer(module) {
                Some(theirs) if theirs <= own => {}
                Some(_) => wrong.push(format!("{}: crate::{module} is above", relative.display())),
                None => wrong.push(format!(
                    "{}: crate::{module} is no layer",
                    relative.display()
                )),
            }
        }
        checked += 1;
    }
    assert!(checked >= 30, "only {checked} files checked");
    assert!(
        wrong.is_empty(),
        "imports that do not point down:\n{}",
        wrong.join("\n")
    );
}
