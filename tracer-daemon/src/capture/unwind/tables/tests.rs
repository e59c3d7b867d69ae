//! Tests of the table store and its row allocator, on a kernel in memory.
use super::*;
use tracer_common::{UNWIND_CFA_RSP, UNWIND_UNKNOWN};

/// The kernel maps in memory.
#[derive(Default)]
struct Memory {
    rows: HashMap<u32, UnwindRow>,
    pages: HashMap<UnwindPageKey, UnwindPage>,
    procs: HashMap<u32, (u32, Vec<ProcMapping>)>,
    files: HashMap<FileKey, u32>,
    page_limit: usize,
}

impl TableSink for Memory {
    fn write_rows(&mut self, first: u32, rows: &[UnwindRow]) -> Result<(), String> {
        for (i, row) in rows.iter().enumerate() {
            self.rows.insert(first + i as u32, *row);
        }
        Ok(())
    }
    fn insert_page(&mut self, key: UnwindPageKey, page: UnwindPage) -> Result<(), String> {
        if self.page_limit > 0 && self.pages.len() >= self.page_limit {
            return Err("E2BIG".into());
        }
        self.pages.insert(key, page);
        Ok(())
    }
    fn remove_page(&mut self, key: UnwindPageKey) {
        self.pages.remove(&key);
    }
    fn set_mappings(&mut self, tgid: u32, value: &ProcMappings) -> Result<(), String> {
        let used = value.mappings[..value.count as usize].to_vec();
        self.procs.insert(tgid, (value.generation, used));
        Ok(())
    }
    fn remove_mappings(&mut self, tgid: u32) {
        self.procs.remove(&tgid);
    }
    fn set_file_table(&mut self, key: FileKey, id: u32) -> Result<(), String> {
        self.files.insert(key, id);
        Ok(())
    }
    fn remove_file_table(&mut self, key: FileKey) {
        self.files.remove(&key);
    }
}

fn key(inode: u64) -> FileKey {
    FileKey { dev: (8, 1), inode }
}

/// A table of `pages` pages of `rows` rows each.
fn table(pages: u32, rows: u16) -> FileTable {
    let mut table = FileTable::default();
    for page in 0..pages {
        let list = (0..rows)
            .map(|i| UnwindRow {
                pc: i * 16,
                kind: if i == 0 {
                    UNWIND_UNKNOWN
                } else {
                    UNWIND_CFA_RSP
                },
                rbp_slot: 0,
                cfa_offset: 8 + i32::from(i),
            })
            .collect();
        table.pages.insert(page, list);
    }
    table
}

#[test]
fn runs_are_first_fit_and_freed_runs_merge() {
    let mut rows = RowAllocator::new(10);
    assert_eq!(rows.alloc(4), Some(0));
    assert_eq!(rows.alloc(4), Some(4));
    assert_eq!(rows.alloc(3), None);
    rows.release(0, 4);
    assert_eq!(rows.alloc(2), Some(0));
    rows.release(4, 4);
    rows.release(0, 2);
    assert_eq!(rows.free_rows(), 10);
    assert_eq!(rows.alloc(10), Some(0), "merged into one run");
    assert_eq!(rows.alloc(0), None);
}

#[test]
fn a_file_is_loaded_once_and_its_rows_and_pages_are_in_the_maps() {
    let mut memory = Memory::default();
    let mut store = TableStore::new(100, 10);
    let t = table(2, 5);
    let id = store.load(&mut memory, key(1), Ok(&t));
    assert_ne!(id, UNWIND_FILE_NONE);
    assert_eq!(store.load(&mut memory, key(1), Ok(&t)), id, "loaded once");
    assert_eq!(memory.pages.len(), 2);
    let page = memory.pages[&UnwindPageKey { file: id, page: 1 }];
    assert_eq!(page.count, 5);
    for (i, want) in t.pages[&1].iter().enumerate() {
        assert_eq!(memory.rows[&(page.first + i as u32)], *want);
    }
    let usage = store.usage();
    assert_eq!((usage.files, usage.rows, usage.pages), (1, 10, 2));
    assert_eq!(usage.bytes, 10 * 8 + 2 * 16);
    // Named for the walk of an address PROC_MAPS lacks.
    assert_eq!(memory.files, HashMap::from([(key(1), id)]));
}

#[test]
fn a_file_that_cannot_be_compiled_or_has_no_cfi_is_refused_once() {
    let mut memory = Memory::default();
    let mut store = TableStore::new(100, 10);
    assert_eq!(
        store.load(&mut memory, key(1), Err("no ELF")),
        UNWIND_FILE_NONE
    );
    assert_eq!(store.file(key(1)), Some(UNWIND_FILE_NONE));
    assert_eq!(
        store.load(&mut memory, key(2), Ok(&FileTable::default())),
        UNWIND_FILE_NONE
    );
    assert_eq!(store.usage().files_refused, 2);
    assert_eq!(store.file(key(3)), None);
    assert_eq!(
        memory.files,
        HashMap::from([(key(1), UNWIND_FILE_NONE), (key(2), UNWIND_FILE_NONE)]),
        "a refused file is named as one with no table: frame pointers, not a cut"
    );
}

#[test]
fn a_table_too_big_for_the_room_unused_ones_would_leave_evicts_none() {
    let mut memory = Memory::default();
    let mut store = TableStore::new(30, 10);
    let a = store.load(&mut memory, key(1), Ok(&table(1, 10)));
    let b = store.load(&mut memory, key(2), Ok(&table(1, 10)));
    // 40 rows against 30: refused, and both unused tables stay.
    assert_eq!(
        store.load(&mut memory, key(3), Ok(&table(4, 10))),
        UNWIND_FILE_NONE
    );
    assert_eq!((store.file(key(1)), store.file(key(2))), (Some(a), Some(b)));
    let usage = store.usage();
    assert_eq!((usage.files_evicted, usage.files_over_budget), (0, 1));
    // 30 rows fit once both go.
    assert_ne!(
        store.load(&mut memory, key(4), Ok(&table(3, 10))),
        UNWIND_FILE_NONE
    );
    assert_eq!(store.usage().files_evicted, 2);
}

#[test]
fn unused_tables_make_room_for_new_ones_and_used_ones_never_do() {
    let mut memory = Memory::default();
    let mut store = TableStore::new(20, 10);
    let a = store.load(&mut memory, key(1), Ok(&table(1, 10)));
    let b = store.load(&mut memory, key(2), Ok(&table(1, 10)));
    let mapping = |file| ProcMapping {
        start: 0x1000,
        end: 0x2000,
        file_offset: 0,
        file,
        _pad: 0,
    };
    store
        .set_process(&mut memory, 7, 3, &[mapping(a)], &[key(1)])
        .unwrap();
    // b is unused: it goes to make room; a is used and stays.
    let c = store.load(&mut memory, key(3), Ok(&table(1, 10)));
    assert_ne!(c, UNWIND_FILE_NONE);
    assert_eq!(
        store.file(key(2)),
        None,
        "evicted, compiled again when needed"
    );
    assert_eq!(store.file(key(1)), Some(a));
    assert_eq!(store.usage().files_evicted, 1);
    assert!(!memory.pages.keys().any(|k| k.file == b));
    // No longer named: a walk that meets the file finds no table.
    assert_eq!(memory.files, HashMap::from([(key(1), a), (key(3), c)]));
    // Nothing unused is left: a fourth table does not fit.
    store
        .set_process(&mut memory, 8, 1, &[mapping(c)], &[key(3)])
        .unwrap();
    assert_eq!(
        store.load(&mut memory, key(4), Ok(&table(1, 10))),
        UNWIND_FILE_NONE
    );
    // Once the process ends, its file may go.
    store.remove_process(&mut memory, 7, 9);
    assert!(memory.procs.contains_key(&7), "another image: kept");
    store.remove_process(&mut memory, 7, 3);
    assert!(!memory.procs.contains_key(&7));
    assert_ne!(
        store.load(&mut memory, key(5), Ok(&table(1, 10))),
        UNWIND_FILE_NONE
    );
}

#[test]
fn process_mappings_are_sorted_capped_and_tagged_with_the_generation() {
    let mut memory = Memory::default();
    let mut store = TableStore::new(10, 10);
    let mappings: Vec<ProcMapping> = (0..300u64)
        .rev()
        .map(|i| ProcMapping {
            start: i * 0x1000,
            end: i * 0x1000 + 0x800,
            file_offset: 0,
            file: UNWIND_FILE_NONE,
            _pad: 0,
        })
        .collect();
    store
        .set_process(&mut memory, 9, 4, &mappings, &[])
        .unwrap();
    let (generation, kept) = &memory.procs[&9];
    assert_eq!(*generation, 4);
    assert_eq!(kept.len(), MAX_PROC_MAPPINGS);
    assert!(kept.windows(2).all(|w| w[0].start < w[1].start));
    assert_eq!(kept[0].start, 0, "the lowest addresses are kept");
}

#[test]
fn a_full_page_map_refuses_the_file_and_frees_its_rows() {
    let mut memory = Memory {
        page_limit: 1,
        ..Memory::default()
    };
    let mut store = TableStore::new(100, 10);
    assert_eq!(
        store.load(&mut memory, key(1), Ok(&table(2, 5))),
        UNWIND_FILE_NONE
    );
    assert!(memory.pages.is_empty());
    assert_eq!(store.usage().rows, 0);
}
