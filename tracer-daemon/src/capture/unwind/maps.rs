//! The kernel maps that hold the unwind tables (`UNWIND_ROWS`,
//! `UNWIND_PAGES`, `PROC_MAPS`), as a [`TableSink`], and `Capture`'s
//! methods over them.
use tracer_common::{ProcMapping, ProcMappings, UnwindPage, UnwindPageKey, UnwindRow};

use super::FileTable;
use super::tables::{TableError, TableSink, UnwindUsage};
use crate::capture::Capture;
use crate::sys::procfs::FileKey;

/// The unwind maps of the loaded object; none in an object without the
/// unwinder (every write is refused, so every process is walked with frame
/// pointers).
#[derive(Debug, Default)]
pub struct UnwindMaps {
    _private: (),
}

impl UnwindMaps {
    /// No unwind maps.
    #[must_use]
    pub fn none() -> Self {
        Self::default()
    }
}

impl TableSink for UnwindMaps {
    fn write_rows(&mut self, _first: u32, _rows: &[UnwindRow]) -> Result<(), String> {
        Err("this eBPF object has no unwind maps".into())
    }
    fn insert_page(&mut self, _key: UnwindPageKey, _page: UnwindPage) -> Result<(), String> {
        Err("this eBPF object has no unwind maps".into())
    }
    fn remove_page(&mut self, _key: UnwindPageKey) {}
    fn set_mappings(&mut self, _tgid: u32, _mappings: &ProcMappings) -> Result<(), String> {
        Err("this eBPF object has no unwind maps".into())
    }
    fn remove_mappings(&mut self, _tgid: u32) {}
}

impl Capture {
    /// See [`crate::capture::KernelMaps::unwind_file`].
    pub fn unwind_file(&self, key: FileKey) -> Option<u32> {
        self.unwind.file(key)
    }

    /// See [`crate::capture::KernelMaps::load_unwind_file`].
    pub fn load_unwind_file(&mut self, key: FileKey, table: Result<&FileTable, &str>) -> u32 {
        self.unwind.load(&mut self.unwind_maps, key, table)
    }

    /// See [`crate::capture::KernelMaps::set_process_mappings`].
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
        self.unwind
            .set_process(&mut self.unwind_maps, tgid, generation, mappings, files)
    }

    /// See [`crate::capture::KernelMaps::remove_process_mappings`].
    pub fn remove_process_mappings(&mut self, tgid: u32, generation: u32) {
        self.unwind.remove_process(&mut self.unwind_maps, tgid, generation);
    }

    /// See [`crate::capture::KernelMaps::unwind_processes`].
    pub fn unwind_processes(&self) -> Vec<crate::capture::ImageId> {
        self.unwind
            .processes()
            .into_iter()
            .map(|(tgid, generation)| crate::capture::ImageId::new(tgid, generation))
            .collect()
    }

    /// See [`crate::capture::KernelMaps::unwind_usage`].
    pub fn unwind_usage(&self) -> UnwindUsage {
        self.unwind.usage()
    }
}
