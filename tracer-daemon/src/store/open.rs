//! Opening the store on a state directory (its files read back), and ids:
//! handed out from blocks reserved on disk before use.
use std::{
    fs,
    path::{Path, PathBuf},
};

use crate::sys::fsync::{create_private_dir, write_atomically};

use super::files::{SNAPSHOT_SUFFIX, read_next_id, read_snapshot_file};
use super::{SnapshotStore, StoreError, Unreadable, failed_write, io};

/// How many ids are reserved on disk at a time.
const ID_BLOCK: u64 = 1024;

impl SnapshotStore {
    /// Opens (creating it if needed) `<state_dir>/snapshots` and reads back
    /// every stored snapshot. Leftover temporary files of an interrupted
    /// write are removed; files that do not decode are listed in
    /// [`SnapshotStore::unreadable`] and left in place.
    ///
    /// # Errors
    /// [`StoreError::Io`] if the directory cannot be created or listed, or
    /// the id file cannot be written.
    pub fn open(state_dir: &Path) -> Result<Self, StoreError> {
        let dir = state_dir.join("snapshots");
        create_private_dir(&dir).map_err(io("creating", &dir))?;
        let mut store = Self {
            dir: Some(dir.clone()),
            ..Self::default()
        };
        let mut max_id = 0;
        let listing = fs::read_dir(&dir).map_err(io("listing", &dir))?;
        let mut paths: Vec<PathBuf> = listing.filter_map(|e| e.ok().map(|e| e.path())).collect();
        paths.sort();
        for path in paths {
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default()
                .to_string();
            if name.starts_with('.') && name.ends_with(".tmp") {
                // An interrupted write: the final file (if any) is intact.
                let _ = fs::remove_file(&path);
                continue;
            }
            let Some(stem) = name.strip_suffix(&format!(".{SNAPSHOT_SUFFIX}")) else {
                continue;
            };
            // The id its name claims stays reserved whether or not the file
            // reads back: a refused file is left for inspection, and a new
            // snapshot must never be written over it.
            if let Ok(id) = stem.parse::<u64>() {
                max_id = max_id.max(id);
            }
            // Read whole once, to check it and count its summary; its
            // traces are dropped and read again when it is used.
            match read_snapshot_file(&path, stem) {
                Ok(entry) => {
                    max_id = max_id.max(entry.head.id);
                    if let Some(label) = &entry.info.label
                        && let Some(other) = store.id_of_label(label)
                    {
                        store.unreadable.push(Unreadable {
                            path: path.clone(),
                            error: format!("label {label:?} is also used by snapshot {other}"),
                        });
                        continue;
                    }
                    store.entries.insert(entry.head.id, entry);
                }
                Err(error) => {
                    tracing::warn!(target = %path.display(), err = %error, "stored snapshot refused");
                    store.unreadable.push(Unreadable { path, error });
                }
            }
        }
        let reserved = read_next_id(&dir.join("next-id"));
        store.next_id = reserved.max(max_id);
        store.reserved = store.next_id;
        Ok(store)
    }

    /// The next id, reserving a new block on disk first when needed.
    pub(super) fn allocate_id(&mut self) -> Result<u64, StoreError> {
        let id = self.next_id + 1;
        if let Some(dir) = &self.dir
            && id > self.reserved
        {
            let reserved = self.next_id + ID_BLOCK;
            write_atomically(&dir.join("next-id"), format!("{reserved}\n").as_bytes())
                .map_err(failed_write)?;
            self.reserved = reserved;
        }
        self.next_id = id;
        Ok(id)
    }
}
