//! The kernel's unwind tables, kept by tracerd: which files have a table in
//! `UNWIND_ROWS`/`UNWIND_PAGES` (one per file, by device and inode, shared
//! by every process that maps it), where their rows are, which processes use
//! them, and each process's executable mappings in `PROC_MAPS`.
//!
//! [`TableStore`] is the bookkeeping; the writes go through a [`TableSink`]
//! (the kernel maps for `Capture`, memory for the fake kernel), so the
//! policy is the same for both and tested without a kernel:
//! - a file is compiled and loaded once; a file that could not be compiled
//!   or did not fit is remembered as refused (`UNWIND_FILE_NONE`: its
//!   frames are stepped with frame pointers) and not tried again;
//! - a file no process uses keeps its table until its rows are needed by
//!   another (least recently used first), so a program started again and
//!   again is compiled once;
//! - rows are allocated as runs in a fixed array (first fit, freed runs
//!   merged), one run per page.
use std::collections::{HashMap, HashSet};

use tracer_common::{
    MAX_PROC_MAPPINGS, ProcMapping, ProcMappings, UNWIND_FILE_NONE, UNWIND_FILE_PENDING,
    UnwindPage, UnwindPageKey, UnwindRow,
};

use crate::elf::unwind::FileTable;
use crate::sys::procfs::FileKey;

mod rows;

pub use rows::RowAllocator;

/// Where a [`TableStore`] writes: the kernel maps, or memory in tests.
pub trait TableSink {
    /// Writes `rows` into `UNWIND_ROWS` from index `first`.
    ///
    /// # Errors
    /// What the kernel said.
    fn write_rows(&mut self, first: u32, rows: &[UnwindRow]) -> Result<(), String>;
    /// Inserts a page of a file into `UNWIND_PAGES`.
    ///
    /// # Errors
    /// What the kernel said (e.g. the map is full).
    fn insert_page(&mut self, key: UnwindPageKey, page: UnwindPage) -> Result<(), String>;
    /// Removes a page from `UNWIND_PAGES` (absent: nothing).
    fn remove_page(&mut self, key: UnwindPageKey);
    /// Sets a process's entry of `PROC_MAPS`.
    ///
    /// # Errors
    /// What the kernel said (e.g. the map is full).
    fn set_mappings(&mut self, tgid: u32, mappings: &ProcMappings) -> Result<(), String>;
    /// Removes a process's entry of `PROC_MAPS` (absent: nothing).
    fn remove_mappings(&mut self, tgid: u32);
    /// Names file `key`'s table `id` in `FILE_TABLES`, for the walk of an
    /// address `PROC_MAPS` lacks (`tracer_common::vma`).
    ///
    /// # Errors
    /// What the kernel said (e.g. the map is full).
    fn set_file_table(&mut self, key: FileKey, id: u32) -> Result<(), String>;
    /// Removes file `key` from `FILE_TABLES` (absent: nothing).
    fn remove_file_table(&mut self, key: FileKey);
}

/// A file the store knows: its table's place, or its refusal.
#[derive(Clone, Debug)]
struct FileEntry {
    /// Its id in `UNWIND_PAGES`, or `UNWIND_FILE_NONE` when refused.
    id: u32,
    /// Each page's (page number, first row, rows).
    runs: Vec<(u32, u32, u32)>,
    /// Processes whose mappings name it.
    users: u32,
    /// When it was last loaded or used (the store's clock).
    used_at: u64,
}

/// The unwind tables in the kernel and who uses them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct UnwindUsage {
    /// Files with a table loaded.
    pub files: u64,
    /// Files refused (no table: frame pointers only): no unwind
    /// information, or over the budget.
    pub files_refused: u64,
    /// Of them, files whose table did not fit in `unwind_table_rows` or
    /// `unwind_table_pages` even after dropping every unused table.
    pub files_over_budget: u64,
    /// Tables dropped to make room for another (their files are compiled
    /// again when a process maps them again).
    pub files_evicted: u64,
    /// Rows in use in `UNWIND_ROWS`.
    pub rows: u64,
    /// Its capacity in rows.
    pub rows_capacity: u64,
    /// Entries in use in `UNWIND_PAGES`.
    pub pages: u64,
    /// Its capacity.
    pub pages_capacity: u64,
    /// Processes with an entry in `PROC_MAPS`.
    pub processes: u64,
    /// Bytes the tables take in the kernel: rows (8 bytes), pages (16 bytes
    /// of key and value) and process entries (8,200 bytes each).
    pub bytes: u64,
}

/// Why a file's table is not loaded (it is then `UNWIND_FILE_NONE`).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TableError {
    /// The table does not fit in what is free, even after dropping the
    /// tables no process uses.
    #[error("its table needs {needed} rows and {pages} pages; {free} rows are free")]
    Full {
        /// Rows the table needs.
        needed: u64,
        /// Pages the table needs.
        pages: u64,
        /// Rows free after evicting unused tables.
        free: u64,
    },
    /// The kernel refused a write.
    #[error("the kernel refused it: {0}")]
    Kernel(String),
}

/// The bookkeeping of the kernel's unwind tables (see the module doc).
#[derive(Clone, Debug)]
pub struct TableStore {
    rows: RowAllocator,
    pages_capacity: u32,
    pages_used: u32,
    files: HashMap<FileKey, FileEntry>,
    /// Each process's image generation and files (distinct), for the
    /// users counts.
    processes: HashMap<u32, (u32, Vec<FileKey>)>,
    next_id: u32,
    clock: u64,
    evicted: u64,
    over_budget: u64,
}

impl TableStore {
    /// A store for `rows` rows and `pages` page entries.
    #[must_use]
    pub fn new(rows: u32, pages: u32) -> Self {
        Self {
            rows: RowAllocator::new(rows),
            pages_capacity: pages,
            pages_used: 0,
            files: HashMap::new(),
            processes: HashMap::new(),
            next_id: 1,
            clock: 0,
            evicted: 0,
            over_budget: 0,
        }
    }

    /// The id of `key`'s table: `Some(id)` once loaded, `Some(UNWIND_FILE_NONE)`
    /// once refused, None when the file was never offered.
    #[must_use]
    pub fn file(&self, key: FileKey) -> Option<u32> {
        self.files.get(&key).map(|f| f.id)
    }

    /// Loads `key`'s compiled table (or records that it could not be
    /// compiled, `Err` with why) and returns its id, `UNWIND_FILE_NONE` when
    /// refused. A file already offered keeps its id.
    pub fn load(
        &mut self,
        sink: &mut dyn TableSink,
        key: FileKey,
        table: Result<&FileTable, &str>,
    ) -> u32 {
        self.clock += 1;
        if let Some(entry) = self.files.get_mut(&key) {
            entry.used_at = self.clock;
            return entry.id;
        }
        let entry = match table {
            Ok(table) if !table.pages.is_empty() => match self.place(sink, table) {
                Ok(runs) => {
                    let id = self.next_id;
                    // Never NONE nor PENDING: those mean "no table" to the walk.
                    self.next_id = match self.next_id.wrapping_add(1) {
                        UNWIND_FILE_NONE | UNWIND_FILE_PENDING => 1,
                        next => next,
                    };
                    match write_pages(sink, id, &runs) {
                        Ok(()) => {
                            self.pages_used += u32::try_from(runs.len()).unwrap_or(u32::MAX);
                            // Without it only the processes whose mappings
                            // tracerd wrote find the table.
                            if let Err(err) = sink.set_file_table(key, id) {
                                tracing::debug!(dev = ?key.dev, inode = key.inode, %err, "table not named in FILE_TABLES");
                            }
                            FileEntry {
                                id,
                                runs,
                                users: 0,
                                used_at: self.clock,
                            }
                        }
                        Err(err) => {
                            self.free_runs(sink, id, &runs, false);
                            tracing::info!(dev = ?key.dev, inode = key.inode, %err, "no unwind table: frame pointers only");
                            refused(self.clock)
                        }
                    }
                }
                Err(err) => {
                    if matches!(err, TableError::Full { .. }) {
                        self.over_budget += 1;
                    }
                    tracing::info!(dev = ?key.dev, inode = key.inode, %err, "no unwind table: frame pointers only");
                    refused(self.clock)
                }
            },
            Ok(_) => refused(self.clock),
            Err(why) => {
                tracing::debug!(dev = ?key.dev, inode = key.inode, why, "unwind information not compiled");
                refused(self.clock)
            }
        };
        let id = entry.id;
        if id == UNWIND_FILE_NONE {
            // Decided: the walk of a mapping of it that `PROC_MAPS` lacks
            // steps with frame pointers, as one it holds, rather than
            // taking the file for one not compiled yet (cut).
            if let Err(err) = sink.set_file_table(key, UNWIND_FILE_NONE) {
                tracing::debug!(dev = ?key.dev, inode = key.inode, %err, "no table not named in FILE_TABLES");
            }
        }
        self.files.insert(key, entry);
        id
    }

    /// Places every page's rows in the row array (evicting unused tables
    /// while there is no room) and writes them; returns the runs.
    fn place(
        &mut self,
        sink: &mut dyn TableSink,
        table: &FileTable,
    ) -> Result<Vec<(u32, u32, u32)>, TableError> {
        let needed = table.rows() as u64;
        let pages = table.pages.len() as u64;
        // A table that would not fit even with every unused one gone
        // (a compiler's 150 MB library) is refused at once: evicting them
        // all first would only have them compiled again.
        let (evictable_rows, evictable_pages) = self
            .files
            .values()
            .filter(|f| f.users == 0 && f.id != UNWIND_FILE_NONE)
            .flat_map(|f| &f.runs)
            .fold((0u64, 0u64), |(rows, pages), &(_, _, count)| {
                (rows + u64::from(count), pages + 1)
            });
        let pages_free = u64::from(self.pages_capacity.saturating_sub(self.pages_used));
        if needed > self.rows.free_rows() + evictable_rows || pages > pages_free + evictable_pages {
            return Err(TableError::Full {
                needed,
                pages,
                free: self.rows.free_rows(),
            });
        }
        loop {
            let pages_free = u64::from(self.pages_capacity.saturating_sub(self.pages_used));
            if needed <= self.rows.free_rows()
                && pages <= pages_free
                && let Some(runs) = self.try_alloc(table)
            {
                let mut written = Vec::with_capacity(runs.len());
                for ((page, rows), &(_, first, count)) in table.pages.iter().zip(&runs) {
                    if let Err(err) = sink.write_rows(first, rows) {
                        for &(_, f, c) in runs.iter() {
                            self.rows.release(f, c);
                        }
                        return Err(TableError::Kernel(err));
                    }
                    written.push((*page, first, count));
                }
                return Ok(written);
            }
            if !self.evict_one(sink) {
                return Err(TableError::Full {
                    needed,
                    pages,
                    free: self.rows.free_rows(),
                });
            }
        }
    }

    /// One run per page, or None (nothing kept) when they do not all fit.
    fn try_alloc(&mut self, table: &FileTable) -> Option<Vec<(u32, u32, u32)>> {
        let mut runs = Vec::with_capacity(table.pages.len());
        for (page, rows) in &table.pages {
            let count = u32::try_from(rows.len()).ok()?;
            match self.rows.alloc(count) {
                Some(first) => runs.push((*page, first, count)),
                None => {
                    for &(_, first, count) in &runs {
                        self.rows.release(first, count);
                    }
                    return None;
                }
            }
        }
        Some(runs)
    }

    /// Drops the least recently used table that no process uses; false
    /// when there is none.
    fn evict_one(&mut self, sink: &mut dyn TableSink) -> bool {
        let victim = self
            .files
            .iter()
            .filter(|(_, f)| f.users == 0 && f.id != UNWIND_FILE_NONE)
            .min_by_key(|(_, f)| f.used_at)
            .map(|(k, _)| *k);
        let Some(key) = victim else {
            return false;
        };
        if let Some(entry) = self.files.remove(&key) {
            // Unnamed before its pages go: a walk that finds the id finds
            // no page of it (ids are never reused), never another's rows.
            sink.remove_file_table(key);
            self.free_runs(sink, entry.id, &entry.runs, true);
            self.evicted += 1;
        }
        true
    }

    fn free_runs(
        &mut self,
        sink: &mut dyn TableSink,
        id: u32,
        runs: &[(u32, u32, u32)],
        pages: bool,
    ) {
        for &(page, first, count) in runs {
            if pages {
                sink.remove_page(UnwindPageKey { file: id, page });
                self.pages_used = self.pages_used.saturating_sub(1);
            }
            self.rows.release(first, count);
        }
    }

    /// Sets process `tgid`'s mappings (those of image `generation`), which
    /// name the files `files` (each a loaded or refused one): the files it
    /// used before and no longer does lose a user.
    ///
    /// # Errors
    /// [`TableError::Kernel`] when `PROC_MAPS` refused the entry (full):
    /// the process is then walked with frame pointers only.
    pub fn set_process(
        &mut self,
        sink: &mut dyn TableSink,
        tgid: u32,
        generation: u32,
        mappings: &[ProcMapping],
        files: &[FileKey],
    ) -> Result<(), TableError> {
        let mut value = Box::new(ProcMappings {
            count: 0,
            generation,
            mappings: [ProcMapping::default(); MAX_PROC_MAPPINGS],
        });
        let mut sorted: Vec<ProcMapping> = mappings.to_vec();
        sorted.sort_by_key(|m| m.start);
        for (slot, mapping) in value.mappings.iter_mut().zip(&sorted) {
            *slot = *mapping;
        }
        value.count = u32::try_from(sorted.len().min(MAX_PROC_MAPPINGS)).unwrap_or(0);
        let distinct: Vec<FileKey> = files
            .iter()
            .copied()
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        self.clock += 1;
        for key in &distinct {
            if let Some(entry) = self.files.get_mut(key) {
                entry.users += 1;
                entry.used_at = self.clock;
            }
        }
        self.forget_users(tgid);
        self.processes.insert(tgid, (generation, distinct));
        sink.set_mappings(tgid, &value).map_err(TableError::Kernel)
    }

    /// Removes the mappings of process `tgid`'s image `generation` (those of
    /// another image of the pid stay); its files lose a user.
    pub fn remove_process(&mut self, sink: &mut dyn TableSink, tgid: u32, generation: u32) {
        if self
            .processes
            .get(&tgid)
            .is_some_and(|(g, _)| *g == generation)
        {
            self.forget_users(tgid);
            sink.remove_mappings(tgid);
        }
    }

    /// The images whose mappings are in `PROC_MAPS`: (tgid, generation).
    #[must_use]
    pub fn processes(&self) -> Vec<(u32, u32)> {
        self.processes.iter().map(|(t, (g, _))| (*t, *g)).collect()
    }

    fn forget_users(&mut self, tgid: u32) {
        let (_, files) = self.processes.remove(&tgid).unwrap_or_default();
        for key in files {
            if let Some(entry) = self.files.get_mut(&key) {
                entry.users = entry.users.saturating_sub(1);
            }
        }
    }

    /// What the tables hold and cost.
    #[must_use]
    pub fn usage(&self) -> UnwindUsage {
        let rows = u64::from(self.rows.capacity()) - self.rows.free_rows();
        let processes = self.processes.len() as u64;
        let pages = u64::from(self.pages_used);
        UnwindUsage {
            files: self
                .files
                .values()
                .filter(|f| f.id != UNWIND_FILE_NONE)
                .count() as u64,
            files_refused: self
                .files
                .values()
                .filter(|f| f.id == UNWIND_FILE_NONE)
                .count() as u64,
            files_over_budget: self.over_budget,
            files_evicted: self.evicted,
            rows,
            rows_capacity: u64::from(self.rows.capacity()),
            pages,
            pages_capacity: u64::from(self.pages_capacity),
            processes,
            bytes: rows * 8 + pages * 16 + processes * size_of::<ProcMappings>() as u64,
        }
    }
}

/// Inserts a loaded file's page entries.
fn write_pages(sink: &mut dyn TableSink, id: u32, runs: &[(u32, u32, u32)]) -> Result<(), String> {
    for (done, &(page, first, count)) in runs.iter().enumerate() {
        if let Err(err) = sink.insert_page(
            UnwindPageKey { file: id, page },
            UnwindPage { first, count },
        ) {
            for &(page, _, _) in runs.iter().take(done) {
                sink.remove_page(UnwindPageKey { file: id, page });
            }
            return Err(err);
        }
    }
    Ok(())
}

fn refused(clock: u64) -> FileEntry {
    FileEntry {
        id: UNWIND_FILE_NONE,
        runs: Vec::new(),
        users: 0,
        used_at: clock,
    }
}

#[cfg(test)]
mod tests;
