//! Differential test of `Traceback.format()` with source lines against
//! CPython 3.11 (`support/format_oracle.py`, real `linecache`): files
//! with CRLF and CR line ends, no final newline, whitespace Python strips
//! (tabs, NBSP, U+2003, U+001C), blank lines, a Latin-1 coding cookie, a
//! BOM, bytes that are not UTF-8 and an unknown encoding; frames before,
//! inside and past each file, `<unknown>` and missing files; every limit.

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tracer_model::{Frame, Traceback, has_source, line_of, source_lines};

use crate::common;
use crate::oracle;

/// `linecache.getline` for the test: the files read whole (they are the
/// test's own), their bytes made lines by the model, as tracerd's
/// `symbolize::linecache` makes them after its checks of who may read them.
#[derive(Default)]
struct LineCache {
    files: std::collections::HashMap<String, Vec<String>>,
}

impl LineCache {
    fn new() -> Self {
        Self::default()
    }

    fn getline(&mut self, filename: &str, lineno: u32) -> String {
        let lines = self.files.entry(filename.to_string()).or_insert_with(|| {
            if !has_source(filename) {
                return Vec::new();
            }
            std::fs::read(filename).map_or_else(|_| Vec::new(), |bytes| source_lines(&bytes))
        });
        line_of(lines, lineno)
    }
}

const FILES: [(&str, &[u8]); 8] = [
    (
        "plain.c",
        b"int main(void) {\n\tchar *p = malloc(10);  \n\n   \n  return 0; /* \xc3\xa9 */\n}\n",
    ),
    ("crlf.c", b"a();\r\n  b();\r\n\r\nc();\rd();\r  e();"),
    (
        "spaces.c",
        b"\xc2\xa0nbsp();\xc2\xa0\n\xe2\x80\x83em();\n\x1cfs();\x1f\n\x0bvt();\x0c\n\x85nel();\n",
    ),
    ("latin.c", b"# -*- coding: latin-1 -*-\ncaf\xe9();\n"),
    (
        "cookie2.c",
        b"\n# vim: set fileencoding=utf-8 :\nsecond();\n",
    ),
    ("bom.c", b"\xef\xbb\xbfbom();\nafter();\n"),
    ("broken.c", b"ok();\n\xff\xfe bad();\n"),
    ("klingon.c", b"# coding: klingon\nqapla();\n"),
];

#[test]
fn traceback_format_with_source_matches_cpython() {
    let dir = common::TempDir::new("format");
    let mut names: Vec<String> = Vec::new();
    for (name, bytes) in FILES {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).expect("write source");
        names.push(path.to_str().expect("utf-8 path").to_string());
    }
    names.push("<unknown>".into());
    names.push(
        dir.path()
            .join("missing.c")
            .to_str()
            .expect("path")
            .to_string(),
    );
    let names: Vec<Arc<str>> = names.iter().map(|n| Arc::from(n.as_str())).collect();
    let mut rng = StdRng::seed_from_u64(3);
    let mut tracebacks = Vec::new();
    // Every line of every file once, then random stacks.
    for name in &names {
        for lineno in 0..9 {
            tracebacks.push(Traceback::new(
                vec![Frame::new(Arc::clone(name), lineno)],
                None,
            ));
        }
    }
    for _ in 0..300 {
        let frames = (0..rng.random_range(1..6))
            .map(|_| {
                Frame::new(
                    Arc::clone(&names[rng.random_range(0..names.len())]),
                    rng.random_range(0..9),
                )
            })
            .collect();
        tracebacks.push(Traceback::new(frames, None));
    }
    let limits: [Option<i64>; 7] = [
        None,
        Some(0),
        Some(1),
        Some(2),
        Some(-1),
        Some(-3),
        Some(100),
    ];
    let request = json!({
        "tracebacks": tracebacks.iter().map(|tb| tb.frames().iter().map(|f| json!([&*f.filename, f.lineno])).collect::<Vec<_>>()).collect::<Vec<_>>(),
        "limits": limits,
    });
    let answer = oracle::run("format_oracle.py", &request);
    let mut cache = LineCache::new();
    let mut with_source = 0;
    for (i, tb) in tracebacks.iter().enumerate() {
        for (j, limit) in limits.iter().enumerate() {
            for (k, recent) in [false, true].into_iter().enumerate() {
                let ours = tb.format_with(*limit, recent, |f, l| cache.getline(f, l));
                let expected = &answer["formats"][i][j][k];
                assert_eq!(
                    expected,
                    &json!(ours),
                    "traceback {i} {:?} limit {limit:?} most_recent_first {recent}",
                    tb.frames()
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                );
                with_source += ours.iter().filter(|l| l.starts_with("    ")).count();
            }
        }
    }
    assert!(
        with_source > 500,
        "only {with_source} source lines compared"
    );
    assert_eq!(
        answer["formats"].as_array().map(Vec::len),
        Some(tracebacks.len())
    );
    let _: &Value = &answer;
}
