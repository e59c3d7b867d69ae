//! The kernel maps that hold the unwind tables (`UNWIND_ROWS`,
//! `UNWIND_PAGES`, `PROC_MAPS`, `FILE_TABLES`), as a [`TableSink`], and
//! `Capture`'s methods over them.
use tracer_common::{
    FileTableKey, MAP_FILE_TABLES, ProcMapping, ProcMappings, UnwindPage, UnwindPageKey, UnwindRow,
    kernel_dev,
};

use super::tables::{TableError, TableSink, UnwindUsage};
use crate::capture::load::{take_array, take_map};
use crate::capture::{Capture, CaptureError};
use crate::elf::unwind::FileTable;
use crate::sys::procfs::FileKey;
use aya::maps::MapData;
use tracer_common::unwind::{MAP_PROC_MAPS, MAP_UNWIND_PAGES, MAP_UNWIND_ROWS};

/// The unwind maps of the loaded object: `UNWIND_ROWS` written through a
/// shared mapping (a file's table is a memory copy, not a syscall per
/// row), `UNWIND_PAGES` and `PROC_MAPS` by map updates. None when the
/// unwinder is off: every write is refused, so every process is walked
/// with frame pointers.
#[derive(Default)]
pub struct UnwindMaps {
    maps: Option<Maps>,
}

struct Maps {
    /// `UNWIND_ROWS`, mapped read-write (`BPF_F_MMAPABLE`).
    rows: memmap2::MmapRaw,
    /// Its rows.
    rows_len: u32,
    /// Kept open beside its mapping.
    _rows_map: MapData,
    pages: aya::maps::HashMap<MapData, UnwindPageKey, UnwindPage>,
    procs: aya::maps::HashMap<MapData, u32, ProcMappings>,
    files: aya::maps::HashMap<MapData, FileTableKey, u32>,
}

impl std::fmt::Debug for UnwindMaps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UnwindMaps")
            .field("rows", &self.maps.as_ref().map(|m| m.rows_len))
            .finish()
    }
}

impl UnwindMaps {
    /// No unwind maps.
    #[must_use]
    pub fn none() -> Self {
        Self::default()
    }

    /// Whether the maps are there (the unwinder is on).
    #[must_use]
    pub fn is_some(&self) -> bool {
        self.maps.is_some()
    }

    /// Takes `UNWIND_ROWS` (of `rows` rows, mapped), `UNWIND_PAGES` and
    /// `PROC_MAPS` out of the loaded object.
    ///
    /// # Errors
    /// [`CaptureError::Map`] naming the map that is missing or cannot be
    /// mapped.
    pub(in crate::capture) fn take(ebpf: &mut aya::Ebpf, rows: u32) -> Result<Self, CaptureError> {
        use std::os::fd::{AsFd as _, AsRawFd as _};
        let rows_map = take_array(ebpf, MAP_UNWIND_ROWS)?;
        let mapped = memmap2::MmapOptions::new()
            .len(rows as usize * size_of::<UnwindRow>())
            .map_raw(rows_map.fd().as_fd().as_raw_fd())
            .map_err(|e| CaptureError::Map {
                map: MAP_UNWIND_ROWS,
                reason: format!("cannot map the unwind rows: {e}"),
            })?;
        Ok(Self {
            maps: Some(Maps {
                rows: mapped,
                rows_len: rows,
                _rows_map: rows_map,
                pages: take_map(ebpf, MAP_UNWIND_PAGES)?,
                procs: take_map(ebpf, MAP_PROC_MAPS)?,
                files: take_map(ebpf, MAP_FILE_TABLES)?,
            }),
        })
    }
}

const OFF: &str = "the unwinder is off";

impl TableSink for UnwindMaps {
    fn write_rows(&mut self, first: u32, rows: &[UnwindRow]) -> Result<(), String> {
        let maps = self.maps.as_mut().ok_or(OFF)?;
        let end = u64::from(first) + rows.len() as u64;
        if end > u64::from(maps.rows_len) {
            return Err(format!(
                "rows {first}..{end} are beyond UNWIND_ROWS ({} rows)",
                maps.rows_len
            ));
        }
        // SAFETY: in bounds (checked above) of the mapping of rows_len
        // UnwindRows; the programs only read rows, and read these only once
        // a page names them (inserted after this copy).
        unsafe {
            std::ptr::copy_nonoverlapping(
                rows.as_ptr(),
                maps.rows
                    .as_mut_ptr()
                    .cast::<UnwindRow>()
                    .add(first as usize),
                rows.len(),
            );
        }
        Ok(())
    }
    fn insert_page(&mut self, key: UnwindPageKey, page: UnwindPage) -> Result<(), String> {
        let maps = self.maps.as_mut().ok_or(OFF)?;
        maps.pages.insert(key, page, 0).map_err(|e| e.to_string())
    }
    fn remove_page(&mut self, key: UnwindPageKey) {
        if let Some(maps) = self.maps.as_mut() {
            let _ = maps.pages.remove(&key);
        }
    }
    fn set_mappings(&mut self, tgid: u32, mappings: &ProcMappings) -> Result<(), String> {
        let maps = self.maps.as_mut().ok_or(OFF)?;
        maps.procs
            .insert(tgid, mappings, 0)
            .map_err(|e| e.to_string())
    }
    fn remove_mappings(&mut self, tgid: u32) {
        if let Some(maps) = self.maps.as_mut() {
            let _ = maps.procs.remove(&tgid);
        }
    }
    fn set_file_table(&mut self, key: FileKey, id: u32) -> Result<(), String> {
        let maps = self.maps.as_mut().ok_or(OFF)?;
        maps.files
            .insert(file_table_key(key), id, 0)
            .map_err(|e| e.to_string())
    }
    fn remove_file_table(&mut self, key: FileKey) {
        if let Some(maps) = self.maps.as_mut() {
            let _ = maps.files.remove(&file_table_key(key));
        }
    }
}

/// `key` (device as `/proc/PID/maps` prints it) as the kernel names the
/// file: its `super_block.s_dev` and `inode.i_ino`.
fn file_table_key(key: FileKey) -> FileTableKey {
    FileTableKey {
        dev: kernel_dev(key.dev.0, key.dev.1),
        _pad: 0,
        ino: key.inode,
    }
}

impl Capture {
    /// See [`crate::capture::UnwindMaps::unwind_file`].
    pub fn unwind_file(&self, key: FileKey) -> Option<u32> {
        self.unwind.file(key)
    }

    /// See [`crate::capture::UnwindMaps::load_unwind_file`].
    pub fn load_unwind_file(&mut self, key: FileKey, table: Result<&FileTable, &str>) -> u32 {
        let id = self.unwind.load(&mut self.unwind_maps, key, table);
        self.publish_unwind_usage();
        id
    }

    /// See [`crate::capture::UnwindMaps::set_process_mappings`].
    ///
    /// # Errors
    /// [`TableError::Kernel`] when `PROC_MAPS` refuses the entry.
    pub fn set_process_mappings(
        &mut self,
        tgid: u32,
        generation: u32,
        mappings: &[ProcMapping],
        files: &[FileKey],
    ) -> Result<(), TableError> {
        let set = self
            .unwind
            .set_process(&mut self.unwind_maps, tgid, generation, mappings, files);
        self.publish_unwind_usage();
        set
    }

    /// See [`crate::capture::UnwindMaps::remove_process_mappings`].
    pub fn remove_process_mappings(&mut self, tgid: u32, generation: u32) {
        self.unwind
            .remove_process(&mut self.unwind_maps, tgid, generation);
        self.publish_unwind_usage();
    }

    /// Publishes the unwind tables' use to the readers of
    /// [`UsageMaps::stats`](crate::capture::UsageMaps::stats), after a
    /// change of them (and once at load).
    pub(crate) fn publish_unwind_usage(&self) {
        self.stats.publish_unwind(self.unwind.usage());
    }

    /// See [`crate::capture::UnwindMaps::unwind_processes`].
    pub fn unwind_processes(&self) -> Vec<crate::capture::ImageId> {
        self.unwind
            .processes()
            .into_iter()
            .map(|(tgid, generation)| crate::capture::ImageId::new(tgid, generation))
            .collect()
    }

    /// See [`crate::capture::UnwindMaps::unwind_usage`].
    pub fn unwind_usage(&self) -> UnwindUsage {
        self.unwind.usage()
    }
}
