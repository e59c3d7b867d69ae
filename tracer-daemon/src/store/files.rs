//! The state directory's files: `<id>.tsnap` in tracer's dump format with
//! the store's metadata in its header, and `next-id`, the reservation of
//! ids. Reading is strict: a file that does not decode is refused whole.
use std::{
    io::Read as _,
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use serde_json::Value;
use tracer_api::{SnapshotHeader, StoreHeader};
use tracer_model::{Completeness, decode};

use super::disk::{FileCheck, OnDisk};
use super::stored::{
    Shape, SnapshotHead, SnapshotInfo, SnapshotKind, check_label, store_frames, wire_completeness,
    wire_frames, wire_kind,
};
use super::{Body, Entry};
use crate::sys::fsync::{open_regular, read_regular};
use crate::sys::unix_ms;

/// File name suffix of a stored snapshot.
pub const SNAPSHOT_SUFFIX: &str = "tsnap";

pub(super) fn file_of(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("{id}.{SNAPSHOT_SUFFIX}"))
}

/// The metadata kept in a snapshot file's header.
pub(super) fn meta_of(entry: &Entry) -> Value {
    let s = &entry.head;
    SnapshotHeader {
        allocator_frames: entry.info.allocator_frames.map(wire_frames),
        comm: entry.info.comm.clone(),
        id: Some(s.id),
        kind: Some(wire_kind(entry.info.kind)),
        label: entry.info.label.clone(),
        pid: Some(s.pid),
        taken_at_ms: Some(unix_ms(s.taken_at)),
        traced_memory: Some([s.traced_memory.0, s.traced_memory.1]),
        store: Some(StoreHeader {
            generation: Some(s.generation),
            owner_uid: entry.info.owner,
            source_format: entry.info.source_format.map(str::to_string),
            start_time: Some(s.start_time),
        }),
        completeness: wire_completeness(&s.completeness),
    }
    .to_meta()
}

/// The entry of the snapshot file `path` (named `<stem>.tsnap`), kept on
/// disk: the file is read and decoded whole once, to check it and count
/// what its summary shows, and its traces are dropped.
///
/// # Errors
/// Why it is refused: it cannot be read, does not decode, or its header
/// is not the store's.
pub(super) fn read_snapshot_file(path: &Path, stem: &str) -> Result<Entry, String> {
    let cannot = |e: std::io::Error| format!("cannot read it: {e}");
    let (mut file, file_meta) = open_regular(path).map_err(cannot)?;
    let mut bytes = Vec::with_capacity(usize::try_from(file_meta.len()).unwrap_or(0));
    file.read_to_end(&mut bytes).map_err(cannot)?;
    let decoded = decode(&bytes).map_err(|e| e.to_string())?;
    let meta = &decoded.meta;
    let header = SnapshotHeader::from_meta(meta);
    let id = header.id.ok_or("its header has no snapshot id")?;
    if stem != id.to_string() {
        return Err(format!(
            "its header says snapshot {id}, its name says {stem}"
        ));
    }
    let kind = header
        .kind
        .map_or(SnapshotKind::Taken, SnapshotKind::from_wire);
    let label = header.label;
    if let Some(label) = &label {
        check_label(label).map_err(|e| e.to_string())?;
    }
    let own = header.store.unwrap_or_default();
    let source_format = match own.source_format.as_deref() {
        Some("tracemalloc") => Some("tracemalloc"),
        Some("tracer") => Some("tracer"),
        _ => None,
    };
    let [current, peak] = header.traced_memory.unwrap_or([0, 0]);
    let head = SnapshotHead {
        id,
        pid: header.pid.unwrap_or(0),
        start_time: own.start_time.unwrap_or(0),
        generation: own.generation.unwrap_or(0),
        taken_at: SystemTime::UNIX_EPOCH + Duration::from_millis(header.taken_at_ms.unwrap_or(0)),
        traced_memory: (current, peak),
        completeness: Completeness::from_meta(meta),
    };
    let info = SnapshotInfo {
        kind,
        label,
        // An earlier run's pid and generation name no live image.
        image: None,
        comm: header.comm,
        source_format,
        allocator_frames: header.allocator_frames.map(store_frames),
        owner: own.owner_uid,
    };
    let check = FileCheck::new(&file_meta, &bytes);
    Ok(Entry {
        head,
        shape: Shape::of(&decoded.snapshot),
        body: Body::OnDisk(OnDisk::new(id, path.to_path_buf(), check)),
        info,
        persisted: true,
        this_run: false,
        bytes: bytes.len() as u64,
    })
}

/// The id reservation in `path` (0 when there is none or it is not a
/// regular file holding a number: the ids of the files present still
/// count, see `SnapshotStore::open`).
pub(super) fn read_next_id(path: &Path) -> u64 {
    read_regular(path)
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0)
}

/// Bytes of the regular files under `dir`, its subdirectories included
/// (symbolic links are not followed; a file or directory that cannot be
/// read counts 0): the size of tracerd's state directory. Sizes are the
/// files' lengths (`st_size`), not the blocks they take.
pub fn dir_bytes(dir: &Path) -> u64 {
    let mut total = 0u64;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let Ok(listing) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in listing.flatten() {
            let Ok(meta) = entry.metadata() else {
                continue;
            };
            if meta.is_dir() {
                pending.push(entry.path());
            } else if meta.is_file() {
                total = total.saturating_add(meta.len());
            }
        }
    }
    total
}
