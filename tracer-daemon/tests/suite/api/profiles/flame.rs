//! Reading flame graphs: tracer's folded stacks as the statistics name
//! them, folded lines parsed, and an SVG read by Python's XML parser.
use std::{path::Path, process::Command};

use serde_json::Value;

use crate::suite::support::output_ok;

/// tracer's name of a frame in folded stacks (`profile/stacks.rs`): a frame
/// with no line info named by its site (its JSON has `file`, the module) is
/// `FUNCTION+0xOFFSET (MODULE)`, or `MODULE+0xOFFSET` with no function.
pub(super) fn folded_name(frame: &Value) -> String {
    let file = frame["filename"].as_str().expect("filename");
    let line = frame["lineno"].as_u64().expect("lineno");
    if let Some(module) = frame["file"].as_str() {
        let site = file.strip_prefix(module).expect("a site after its module");
        return match site.strip_prefix('!') {
            Some(function) => format!("{function} ({module})"),
            None => file.to_string(),
        };
    }
    match (frame["function"].as_str(), line) {
        (Some(function), 0) => format!("{function} ({file})"),
        (Some(function), line) => format!("{function} ({file}:{line})"),
        (None, 0) => file.to_string(),
        (None, line) => format!("{file}:{line}"),
    }
}

/// The folded stack of a statistic's traceback, root first.
pub(super) fn folded_stack(statistic: &Value) -> String {
    let frames = statistic["traceback"].as_array().expect("traceback");
    let names: Vec<String> = frames.iter().rev().map(folded_name).collect();
    names.join(";")
}

/// Parses folded lines of `n` values each into (stack, values), sorted.
pub(super) fn folded(text: &str, n: usize) -> Vec<(String, Vec<i64>)> {
    let mut lines: Vec<(String, Vec<i64>)> = text
        .lines()
        .map(|line| {
            let tokens: Vec<&str> = line.split(' ').collect();
            let at = tokens.len().checked_sub(n).expect("values");
            let values = tokens[at..]
                .iter()
                .map(|t| t.parse().unwrap_or_else(|_| panic!("{line:?}")))
                .collect();
            (tokens[..at].join(" "), values)
        })
        .collect();
    lines.sort();
    lines
}

/// Python's XML parser reads `svg`; its `<title>` texts and every text.
pub(super) fn well_formed(svg: &[u8], dir: &Path) -> String {
    let file = dir.join("graph.svg");
    std::fs::write(&file, svg).expect("write svg");
    let out = output_ok(Command::new("python3").args([
        "-c",
        "import sys, xml.etree.ElementTree as E\n\
         root = E.parse(sys.argv[1]).getroot()\n\
         print('\\n'.join(''.join(e.itertext()) for e in root.iter() if e.tag.endswith('}title') or e.tag.endswith('}text')))",
        file.to_str().expect("path"),
    ]));
    String::from_utf8(out.stdout).expect("utf-8")
}
