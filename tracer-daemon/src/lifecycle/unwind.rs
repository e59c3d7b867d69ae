//! The unwinder's part of an image's life: when tracerd learns of a live
//! image (and when its mappings change), the files it maps get their unwind
//! tables (compiled once per file, shared by every process that maps it)
//! and the kernel gets its executable mappings (`PROC_MAPS`); when the
//! image ends, its mappings leave the kernel, and a table no process uses
//! any more may be dropped to make room for another.
//!
//! Three steps, so that compiling (milliseconds per MiB of text) holds no
//! lock: [`plan`] (reads which files have a table), [`compile_missing`]
//! (no kernel access), [`install`] (writes the tables and the mappings).
use std::sync::Arc;

use tracer_common::{ProcMapping, UNWIND_FILE_NONE};

use crate::capture::{ImageId, KernelMaps};
use crate::elf::unwind::{FileTable, compile_file};
use crate::sys::modules::{Module, ModuleMaps};
use crate::sys::procfs::FileKey;

/// What one image needs from the unwinder: its mappings, and the files
/// among them that were never offered to the kernel.
pub struct Plan {
    /// The image.
    pub image: ImageId,
    /// Its mappings.
    pub maps: Arc<ModuleMaps>,
    /// Files mapped executable that have no table yet, each once.
    pub missing: Vec<Arc<Module>>,
}

/// A file's table as compiled, or why there is none.
pub type Compiled = (FileKey, Result<FileTable, String>);

/// The plan for `image` with mappings `maps`: which of its files need a
/// table compiled (those the kernel was never offered).
#[must_use]
pub fn plan(kernel: &dyn KernelMaps, image: ImageId, maps: Arc<ModuleMaps>) -> Plan {
    let mut missing: Vec<Arc<Module>> = Vec::new();
    for mapping in maps.mappings() {
        let key = mapping.module.key();
        if kernel.unwind_file(key).is_none() && !missing.iter().any(|m| m.key() == key) {
            missing.push(mapping.module.clone());
        }
    }
    Plan {
        image,
        maps,
        missing,
    }
}

/// Compiles the tables of `modules` from their files (read through the
/// descriptor tracerd holds, so a file in another mount namespace or
/// deleted since is still read). A file that cannot be read or compiled
/// gets why.
#[must_use]
pub fn compile_missing(modules: &[Arc<Module>]) -> Vec<Compiled> {
    modules
        .iter()
        .map(|module| {
            let table = match module.fd_path() {
                None => Err(format!("{}: not open", module.path())),
                Some(path) => match std::fs::File::open(&path) {
                    Err(e) => Err(format!("{}: {e}", module.path())),
                    Ok(file) => compile_file(file).map_err(|e| format!("{}: {e}", module.path())),
                },
            };
            if let Err(why) = &table {
                tracing::debug!(%why, "no unwind table: frame pointers only");
            }
            (module.key(), table)
        })
        .collect()
}

/// Loads the `compiled` tables, then writes the image's executable
/// mappings with their files' table ids to `PROC_MAPS`: file-backed ones
/// with their file offsets, anonymous ones (JIT code, the vDSO) with no
/// table, so that the walk steps them with frame pointers. Returns whether
/// the kernel took the mappings.
pub fn install(kernel: &mut dyn KernelMaps, plan: &Plan, compiled: &[Compiled]) -> bool {
    for (key, table) in compiled {
        if kernel.unwind_file(*key).is_none() {
            kernel.load_unwind_file(*key, table.as_ref().map_err(String::as_str));
        }
    }
    let mut mappings = Vec::new();
    let mut files = Vec::new();
    for mapping in plan.maps.mappings() {
        let key = mapping.module.key();
        files.push(key);
        mappings.push(ProcMapping {
            start: mapping.start,
            end: mapping.end,
            file_offset: mapping.offset,
            file: kernel.unwind_file(key).unwrap_or(UNWIND_FILE_NONE),
            _pad: 0,
        });
    }
    for &(start, end) in plan.maps.anonymous() {
        mappings.push(ProcMapping {
            start,
            end,
            file_offset: 0,
            file: UNWIND_FILE_NONE,
            _pad: 0,
        });
    }
    match kernel.set_process_mappings(plan.image.pid, plan.image.generation, &mappings, &files) {
        Ok(()) => true,
        Err(err) => {
            tracing::debug!(pid = plan.image.pid, %err, "mappings not set: frame pointers only");
            false
        }
    }
}

/// Removes from the kernel the mappings of images that `is_live` says are
/// no longer live (ended, or gone without an end event). Returns how many.
pub fn prune(kernel: &mut dyn KernelMaps, is_live: impl Fn(ImageId) -> bool) -> usize {
    let doomed: Vec<ImageId> = kernel
        .unwind_processes()
        .into_iter()
        .filter(|image| !is_live(*image))
        .collect();
    for image in &doomed {
        kernel.remove_process_mappings(image.pid, image.generation);
    }
    doomed.len()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests may unwrap (CONTRIBUTING.md).
mod tests {
    use super::*;
    use crate::capture::UnwindMaps;
    use crate::capture::fake::FakeKernel;
    use crate::sys::modules::ModuleCache;

    /// This test process's own mappings, read as tracerd reads a traced
    /// process's.
    fn own_maps() -> Arc<ModuleMaps> {
        Arc::new(ModuleCache::new(64).capture(std::process::id()).unwrap())
    }

    #[test]
    fn each_file_is_compiled_once_and_every_executable_mapping_is_set() {
        let mut kernel = FakeKernel::new(16);
        let image = ImageId::new(std::process::id(), 7);
        let maps = own_maps();
        let plan1 = plan(&kernel, image, maps.clone());
        let files: std::collections::HashSet<FileKey> =
            maps.mappings().iter().map(|m| m.module.key()).collect();
        assert_eq!(plan1.missing.len(), files.len());
        let compiled = compile_missing(&plan1.missing);
        assert!(install(&mut kernel, &plan1, &compiled));
        // libc has .eh_frame and fits the fake's rows: it has a table (this
        // test binary is too large for them, and is refused).
        let libc = maps
            .mappings()
            .iter()
            .find(|m| m.module.path().contains("libc.so"))
            .unwrap();
        let id = kernel.unwind_file(libc.module.key()).unwrap();
        assert_ne!(id, UNWIND_FILE_NONE);
        let (generation, set) = kernel.process_mappings(image.pid).unwrap();
        assert_eq!(generation, 7);
        assert_eq!(set.len(), maps.mappings().len() + maps.anonymous().len());
        let starts: Vec<u64> = set.iter().map(|m| m.start).collect();
        assert!(
            starts.windows(2).all(|w| w[0] < w[1]),
            "sorted: {starts:x?}"
        );
        // A second image of the same files compiles nothing.
        let plan2 = plan(&kernel, ImageId::new(image.pid + 1, 1), maps);
        assert!(plan2.missing.is_empty());
    }

    #[test]
    fn images_no_longer_live_lose_their_mappings() {
        let mut kernel = FakeKernel::new(16);
        let maps = own_maps();
        for pid in [10, 11] {
            let p = plan(&kernel, ImageId::new(pid, 1), maps.clone());
            let compiled = compile_missing(&p.missing);
            install(&mut kernel, &p, &compiled);
        }
        assert_eq!(prune(&mut kernel, |image| image.pid == 11), 1);
        assert!(kernel.process_mappings(10).is_none());
        assert!(kernel.process_mappings(11).is_some());
        assert_eq!(kernel.unwind_processes(), [ImageId::new(11, 1)]);
    }
}
