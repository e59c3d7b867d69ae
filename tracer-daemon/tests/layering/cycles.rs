//! No loop of imports between the files of one stage: within a stage,
//! the files read as the data's path too, each naming only files below it.
//!
//! A file's module path comes from its place under `src/`
//! (`http/handlers/views.rs` is `http::handlers::views`, a `mod.rs` is its
//! folder's). Every path it names through `crate::`, `super::` or `self::`
//! (a brace list's items each) resolves to the longest module path that is
//! a file; a name of the file's own module, an ancestor (whose `mod.rs`
//! declares and re-exports it) or a descendant is no edge. A strongly
//! connected set of more than one file is a loop.
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The module path of a source file under `src` (`["http", "work"]` for
/// both `http/work.rs` and `http/work/mod.rs`).
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let relative = file.strip_prefix(src).expect("under src");
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().expect("a file name");
    let stem = last.strip_suffix(".rs").unwrap_or(&last).to_string();
    if stem != "mod" {
        parts.push(stem);
    }
    parts
}

/// The paths `code` names from `crate`, `super` or `self`, each as its
/// segments (a brace list gives one path per item, with the item's first
/// segment).
pub fn named_paths(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    for root in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(found) = code[from..].find(root) {
            let at = from + found;
            from = at + root.len();
            if at > 0
                && (bytes[at - 1].is_ascii_alphanumeric()
                    || bytes[at - 1] == b'_'
                    || bytes[at - 1] == b':')
            {
                continue;
            }
            let mut prefix = vec![root.trim_end_matches("::").to_string()];
            let mut rest = &code[from..];
            loop {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if name.is_empty() {
                    break;
                }
                rest = &rest[name.len()..];
                prefix.push(name);
                match rest.strip_prefix("::") {
                    Some(after) => rest = after,
                    None => break,
                }
            }
            if let Some(list) = rest.strip_prefix('{') {
                for item in top_level_items(list) {
                    let mut path = prefix.clone();
                    path.extend(item);
                    out.push(path);
                }
            } else {
                out.push(prefix);
            }
        }
    }
    out
}

/// The leading segments of each top-level item of a brace list
/// (`a::b, c::{d, e}}` gives `[a, b]` and `[c]`).
fn top_level_items(list: &str) -> Vec<Vec<String>> {
    let mut items = Vec::new();
    let mut depth = 0;
    let mut item = String::new();
    for c in list.chars() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(std::mem::take(&mut item));
                continue;
            }
            _ => {}
        }
        if depth == 0 {
            item.push(c);
        }
    }
    items.push(item);
    items
        .iter()
        .map(|item| {
            item.trim()
                .split("::")
                .map(str::trim)
                .take_while(|s| !s.is_empty() && s.chars().all(|c| c.is_alphanumeric() || c == '_'))
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .filter(|segments| !segments.is_empty())
        .collect()
}

/// `path` (from `crate`, `super` or `self`) as seen from module `from`,
/// resolved to the longest prefix that is one of `modules`.
fn resolve(
    from: &[String],
    path: &[String],
    modules: &BTreeSet<Vec<String>>,
) -> Option<Vec<String>> {
    let mut base: Vec<String> = match path.first().map(String::as_str) {
        Some("crate") => Vec::new(),
        Some("self") => from.to_vec(),
        Some("super") => from[..from.len().checked_sub(1)?].to_vec(),
        _ => return None,
    };
    let mut rest = &path[1..];
    while rest.first().map(String::as_str) == Some("super") {
        base.pop()?;
        rest = &rest[1..];
    }
    let mut best = None;
    let mut candidate = base;
    if modules.contains(&candidate) {
        best = Some(candidate.clone());
    }
    for segment in rest {
        candidate.push(segment.clone());
        if modules.contains(&candidate) {
            best = Some(candidate.clone());
        }
    }
    best
}

/// The loops of imports between files of one stage under `src`, each as
/// its files' module paths, sorted.
pub fn loops(src: &Path) -> Vec<Vec<String>> {
    let files: Vec<_> = super::sources(src)
        .into_iter()
        .filter(|f| super::stage_of(src, f).is_some())
        .collect();
    let modules: BTreeSet<Vec<String>> = files.iter().map(|f| module_of(src, f)).collect();
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for file in &files {
        let from = module_of(src, file);
        let text = super::code(&std::fs::read_to_string(file).expect("read"));
        for path in named_paths(&text) {
            let Some(to) = resolve(&from, &path, &modules) else {
                continue;
            };
            let related = to.starts_with(&from) || from.starts_with(&to);
            if !related && to.first() == from.first() {
                edges.entry(from.clone()).or_default().insert(to);
            }
        }
    }
    strongly_connected(&modules, &edges)
        .into_iter()
        .filter(|set| set.len() > 1)
        .map(|set| set.iter().map(|m| m.join("::")).collect())
        .collect()
}

/// Tarjan's strongly connected components of the graph.
fn strongly_connected(
    nodes: &BTreeSet<Vec<String>>,
    edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
) -> Vec<BTreeSet<Vec<String>>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        index: BTreeMap<&'a [String], usize>,
        low: BTreeMap<&'a [String], usize>,
        stack: Vec<&'a [String]>,
        on_stack: BTreeSet<&'a [String]>,
        out: Vec<BTreeSet<Vec<String>>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, node: &'a [String]) {
            let n = self.index.len();
            self.index.insert(node, n);
            self.low.insert(node, n);
            self.stack.push(node);
            self.on_stack.insert(node);
            let next: Vec<&'a [String]> = self
                .edges
                .get(node)
                .map(|e| e.iter().map(Vec::as_slice).collect())
                .unwrap_or_default();
            for to in next {
                if !self.index.contains_key(to) {
                    self.visit(to);
                    let low = self.low[to].min(self.low[node]);
                    self.low.insert(node, low);
                } else if self.on_stack.contains(to) {
                    let low = self.index[to].min(self.low[node]);
                    self.low.insert(node, low);
                }
            }
            if self.low[node] == self.index[node] {
                let mut set = BTreeSet::new();
                while let Some(top) = self.stack.pop() {
                    self.on_stack.remove(top);
                    set.insert(top.to_vec());
                    if top == node {
                        break;
                    }
                }
                self.out.push(set);
            }
        }
    }
    let mut walk = Walk {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for node in nodes {
        if !walk.index.contains_key(node.as_slice()) {
            walk.visit(node);
        }
    }
    walk.out
}
