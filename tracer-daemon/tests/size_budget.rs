//! The size budget, checked on the sources of every crate of the
//! workspace: a file of more than [`MAX_FILE_LINES`] lines, or a function
//! of more than [`MAX_FN_LINES`], fails unless it is listed below with a
//! one-line reason. A file or function that shrank under its budget must
//! leave the list, so the list is always the whole truth. Needs no root
//! and no eBPF.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// Most lines a source file may have.
const MAX_FILE_LINES: usize = 600;

/// Most lines a function may have, from its signature to its closing
/// brace.
const MAX_FN_LINES: usize = 120;

/// Files allowed over [`MAX_FILE_LINES`]: (path from the workspace root,
/// why).
const LARGE_FILES: &[(&str, &str)] = &[];

/// Functions allowed over [`MAX_FN_LINES`]: (path from the workspace root,
/// function, why).
const LONG_FUNCTIONS: &[(&str, &str, &str)] = &[
    (
        "tracer-daemon/tests/suite/api/ui.rs",
        "the_page_shows_the_api_s_numbers_and_a_process_s_lines_in_chromium_with_the_token_and_over_the_unix_socket",
        "one chromium session's steps in order, all on its client and its get_ok/get_text closures; to split next",
    ),
    (
        "tracer-daemon/tests/suite/service/access.rs",
        "each_user_sees_only_the_processes_they_could_ptrace_and_operators_see_all",
        "one loop over each viewer's connection whose three checks share ten locals; to split next",
    ),
];

/// The workspace's crates whose sources the budget covers.
const CRATES: [&str; 7] = [
    "tracer-api",
    "tracer-common",
    "tracer-model",
    "tracer-daemon",
    "tracer-ebpf",
    "tracer-cli",
    "xtask",
];

/// Every `.rs` file under `dir`, but build output and fixtures that are
/// not the project's code (the Rust fixture's own crate is code; C
/// fixtures are not `.rs`).
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)
            .expect("read a source folder")
            .flatten()
        {
            let path = entry.path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n == "target") {
                    continue;
                }
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The functions of a file with more than [`MAX_FN_LINES`] lines: name and
/// lines.
#[derive(Default)]
struct LongFunctions {
    found: Vec<(String, usize)>,
}

impl LongFunctions {
    fn check(&mut self, name: String, span: proc_macro2::Span) {
        let lines = span.end().line - span.start().line + 1;
        if lines > MAX_FN_LINES {
            self.found.push((name, lines));
        }
    }
}

impl<'ast> Visit<'ast> for LongFunctions {
    fn visit_item_fn(&mut self, item: &'ast syn::ItemFn) {
        self.check(
            item.sig.ident.to_string(),
            syn::spanned::Spanned::span(item),
        );
        syn::visit::visit_item_fn(self, item);
    }

    fn visit_impl_item_fn(&mut self, item: &'ast syn::ImplItemFn) {
        self.check(
            item.sig.ident.to_string(),
            syn::spanned::Spanned::span(item),
        );
        syn::visit::visit_impl_item_fn(self, item);
    }

    fn visit_trait_item_fn(&mut self, item: &'ast syn::TraitItemFn) {
        if item.default.is_some() {
            self.check(
                item.sig.ident.to_string(),
                syn::spanned::Spanned::span(item),
            );
        }
        syn::visit::visit_trait_item_fn(self, item);
    }
}

#[test]
fn files_and_functions_stay_within_the_size_budget_or_are_listed_with_a_reason() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root");
    let mut files: BTreeMap<String, usize> = BTreeMap::new();
    let mut functions: BTreeMap<(String, String), usize> = BTreeMap::new();
    for krate in CRATES {
        for path in sources(&root.join(krate)) {
            let text = std::fs::read_to_string(&path).expect("read a source file");
            let name = path
                .strip_prefix(root)
                .expect("under the root")
                .display()
                .to_string();
            let lines = text.lines().count();
            if lines > MAX_FILE_LINES {
                files.insert(name.clone(), lines);
            }
            let file = syn::parse_file(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
            let mut long = LongFunctions::default();
            long.visit_file(&file);
            for (function, lines) in long.found {
                functions.insert((name.clone(), function), lines);
            }
        }
    }
    let mut wrong = Vec::new();
    for (file, lines) in &files {
        if !LARGE_FILES.iter().any(|(listed, _)| listed == file) {
            wrong.push(format!(
                "{file}: {lines} lines (over {MAX_FILE_LINES}): split it, or list it with a reason"
            ));
        }
    }
    for (listed, _) in LARGE_FILES {
        if !files.contains_key(*listed) {
            wrong.push(format!(
                "{listed}: listed, but within {MAX_FILE_LINES} lines now: take it off the list"
            ));
        }
    }
    for ((file, function), lines) in &functions {
        if !LONG_FUNCTIONS
            .iter()
            .any(|(f, name, _)| f == file && name == function)
        {
            wrong.push(format!("{file}: fn {function}: {lines} lines (over {MAX_FN_LINES}): split it, or list it with a reason"));
        }
    }
    for (file, function, _) in LONG_FUNCTIONS {
        if !functions.contains_key(&((*file).to_string(), (*function).to_string())) {
            wrong.push(format!("{file}: fn {function}: listed, but within {MAX_FN_LINES} lines now: take it off the list"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn every_listed_exception_gives_a_reason() {
    for (file, reason) in LARGE_FILES {
        assert!(reason.len() > 10, "{file}: a reason in words");
    }
    for (file, function, reason) in LONG_FUNCTIONS {
        assert!(
            reason.len() > 10,
            "{file}: fn {function}: a reason in words"
        );
    }
}
