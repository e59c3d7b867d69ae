//! `docs/architecture.md` names every folder of `tracer-daemon/src/`: its
//! table of folders (the rows of "Crates and modules" whose first cell is a
//! path ending in `/`) lists exactly the folders of the tree, so a folder
//! added, moved or removed fails here until the table says what lives
//! there. Needs no root and no eBPF.
use std::collections::BTreeSet;
use std::path::Path;

/// Every folder under `dir`, as a path relative to `root` with `/` after.
fn folders(root: &Path, dir: &Path, out: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).expect("read src").flatten() {
        let path = entry.path();
        if path.is_dir() {
            let relative = path.strip_prefix(root).expect("under src");
            out.insert(format!("{}/", relative.display()));
            folders(root, &path, out);
        }
    }
}

/// The folders the section "Crates and modules" of `text` names in the
/// first cell of a table row (`` | `capture/unwind/` | ... ``).
fn named_folders(text: &str) -> BTreeSet<String> {
    let section = text
        .split("\n## ")
        .find(|s| s.starts_with("Crates and modules"))
        .expect("docs/architecture.md has a section \"Crates and modules\"");
    section
        .lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|rest| rest.split_once('`').map(|(cell, _)| cell))
        .filter(|cell| cell.ends_with('/'))
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_folder_of_the_daemon_is_named_in_the_architecture() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = crate_dir.join("src");
    let mut tree = BTreeSet::new();
    folders(&src, &src, &mut tree);
    let doc = crate_dir.join("../docs/architecture.md");
    let text = std::fs::read_to_string(&doc).expect("read docs/architecture.md");
    let named = named_folders(&text);
    let missing: Vec<_> = tree.difference(&named).collect();
    let gone: Vec<_> = named.difference(&tree).collect();
    assert!(
        missing.is_empty() && gone.is_empty(),
        "docs/architecture.md's table of the folders of tracer-daemon/src/ is out of date: \
         add a row `| `FOLDER/` | what lives there |` for {missing:?}, remove the rows of {gone:?}"
    );
}

#[test]
fn the_folder_table_is_read_from_its_section_only() {
    let text = "# t\n\n## Crates and modules\n\n| `a/` | x |\n| `a/b/` | y |\n| `c` | file |\n\
                \n## Threads\n\n| `d/` | not here |\n";
    let named = named_folders(text);
    assert_eq!(
        named.into_iter().collect::<Vec<_>>(),
        ["a/".to_owned(), "a/b/".to_owned()]
    );
}
