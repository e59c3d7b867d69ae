//! The daemon's layering, checked on its sources: each top-level module of
//! `src/` is a stage, and a stage may import only itself and earlier
//! stages, in the order data flows (see `src/lib.rs` and
//! `docs/architecture.md`). Also: only `http` imports axum, and the model
//! crate depends on no aya, tokio, axum or libc. Needs no root and no eBPF.
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The stages, earliest first. `main.rs` (the binary) may use any.
const STAGES: [&str; 15] = [
    "sys",
    "elf",
    "config",
    "capture",
    "lifecycle",
    "symbolize",
    "snapshot",
    "store",
    "profile",
    "work",
    "service",
    "metrics",
    "http",
    "tasks",
    "app",
];

fn rank(stage: &str) -> Option<usize> {
    STAGES.iter().position(|s| *s == stage)
}

/// Every `.rs` file under `dir`.
pub(crate) fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src").flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The code of a file without its comments (line comments and doc
/// comments; the sources have no block comments).
pub(crate) fn code(text: &str) -> String {
    text.lines()
        .map(|line| match line.find("//") {
            // A `//` inside a string literal would cut a line short; the
            // check only needs paths, which never follow one.
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The stages a piece of code names through `crate::`: `crate::x::...`
/// and every top-level item of `crate::{x, y::{...}}` (the paths the loop
/// check reads too, [`cycles::named_paths`]).
fn stages_used(code: &str) -> BTreeSet<String> {
    cycles::named_paths(code)
        .into_iter()
        .filter(|path| path.first().is_some_and(|root| root == "crate"))
        .filter_map(|mut path| (path.len() > 1).then(|| path.swap_remove(1)))
        .collect()
}

/// The stage a source file belongs to (`src/capture/live.rs` → `capture`,
/// `src/app.rs` → `app`); None for `lib.rs` and `main.rs`.
pub(crate) fn stage_of(src: &Path, file: &Path) -> Option<String> {
    let relative = file.strip_prefix(src).ok()?;
    let first = relative.components().next()?.as_os_str().to_str()?;
    let stage = first.strip_suffix(".rs").unwrap_or(first);
    (stage != "lib" && stage != "main" && stage != "bin").then(|| stage.to_string())
}

/// Every import of a later stage, as `file: stage imports later`.
fn violations(src: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for file in sources(src) {
        let Some(stage) = stage_of(src, &file) else {
            continue;
        };
        let Some(own) = rank(&stage) else {
            out.push(format!("{}: {stage} is not a known stage", file.display()));
            continue;
        };
        let text = code(&std::fs::read_to_string(&file).expect("read"));
        for used in stages_used(&text) {
            match rank(&used) {
                Some(r) if r > own => out.push(format!(
                    "{}: {stage} imports {used}, a later stage",
                    file.display()
                )),
                None => out.push(format!("{}: crate::{used} is not a stage", file.display())),
                _ => {}
            }
        }
        if stage != "http" && text.contains("axum::") {
            out.push(format!("{}: only http may import axum", file.display()));
        }
    }
    out
}

#[test]
fn every_module_imports_only_its_own_and_earlier_stages() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let found = violations(&src);
    assert!(found.is_empty(), "layering broken:\n{}", found.join("\n"));
    // Every stage exists, so the list stays the tree's.
    for stage in STAGES {
        let dir = src.join(stage);
        let file = src.join(format!("{stage}.rs"));
        assert!(
            dir.is_dir() || file.is_file(),
            "stage {stage} has no module"
        );
    }
}

#[test]
fn the_checker_sees_plain_grouped_and_nested_imports() {
    let used = stages_used(
        "use crate::capture::X;\nuse crate::{sys::procfs, lifecycle::{a, b}, store};\nlet x = crate::http::y();",
    );
    let want: BTreeSet<String> = ["capture", "sys", "lifecycle", "store", "http"]
        .into_iter()
        .map(String::from)
        .collect();
    assert_eq!(used, want);
    assert!(stages_used(&code("// see crate::http\nfn f() {}")).is_empty());
    assert!(stages_used("let name = \"mycrate::main\";").is_empty());
}

#[test]
fn the_model_crate_depends_on_no_kernel_runtime_or_web_crate() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tracer-model/Cargo.toml");
    let text = std::fs::read_to_string(manifest).expect("tracer-model/Cargo.toml");
    let dependencies = text
        .split("[dependencies]")
        .nth(1)
        .and_then(|rest| rest.split("\n[").next())
        .expect("a [dependencies] table");
    for forbidden in [
        "aya",
        "tokio",
        "axum",
        "tracer-daemon",
        "tracer-common",
        "libc",
    ] {
        assert!(
            !dependencies
                .lines()
                .any(|l| l.trim_start().starts_with(forbidden)),
            "tracer-model depends on {forbidden}"
        );
    }
}

#[path = "layering/cycles.rs"]
mod cycles;

/// No files of a stage import each other through a chain: within a stage
/// the files read as the data's path too, each naming only files below it
/// (see `layering/cycles.rs`).
#[test]
fn no_files_of_a_stage_import_each_other_in_a_loop() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let found = cycles::loops(&src);
    assert!(
        found.is_empty(),
        "loops of imports inside a stage (move what the lower files need below the higher ones): {found:#?}"
    );
}

#[test]
fn the_loop_checker_resolves_super_crate_and_brace_lists() {
    let src = std::env::temp_dir().join(format!("layering-loops-{}", std::process::id()));
    let write = |path: &str, text: &str| {
        let file = src.join(path);
        std::fs::create_dir_all(file.parent().expect("a folder")).expect("mkdir");
        std::fs::write(file, text).expect("write");
    };
    write("http/mod.rs", "mod a; mod b; mod c; pub use a::X;\n");
    write("http/a.rs", "use super::{b::Y, c};\n");
    write("http/b.rs", "use crate::http::c::Z;\n");
    write("http/c.rs", "fn f() { super::a::g(); } // super::b\n");
    write("sys/mod.rs", "use crate::http::a;\n");
    let found = cycles::loops(&src);
    std::fs::remove_dir_all(&src).expect("rm");
    assert_eq!(found, [vec!["http::a", "http::b", "http::c"]]);
}
