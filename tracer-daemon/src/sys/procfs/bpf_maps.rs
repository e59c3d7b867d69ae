//! The BPF maps tracerd itself holds, from `/proc/self/fdinfo`: what its
//! own kernel memory is.

/// One BPF map that tracerd holds, from `/proc/self/fdinfo`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct BpfMapInfo {
    /// The kernel's map id.
    pub id: u64,
    /// `map_type` (`enum bpf_map_type`).
    #[serde(rename = "type")]
    pub map_type: Option<u64>,
    /// Capacity in entries.
    pub max_entries: Option<u64>,
    /// Bytes the kernel charges for it.
    pub memlock: u64,
}

/// The BPF maps this process holds, from `/proc/self/fdinfo` (deduplicated
/// by map id, sorted by it): id, type, max_entries and the memory the
/// kernel charges.
pub fn bpf_maps_of_self() -> Vec<BpfMapInfo> {
    let mut seen = std::collections::HashSet::new();
    let mut maps = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return maps;
    };
    for entry in dir.flatten() {
        let is_map = std::fs::read_link(entry.path())
            .is_ok_and(|t| t.to_string_lossy() == "anon_inode:bpf-map");
        if !is_map {
            continue;
        }
        let info_path = std::path::Path::new("/proc/self/fdinfo").join(entry.file_name());
        let Ok(text) = std::fs::read_to_string(info_path) else {
            continue;
        };
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(':')))
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        let Some(id) = field("map_id") else { continue };
        if !seen.insert(id) {
            continue;
        }
        maps.push(BpfMapInfo {
            id,
            map_type: field("map_type"),
            max_entries: field("max_entries"),
            memlock: field("memlock").unwrap_or(0),
        });
    }
    maps.sort_by_key(|m| m.id);
    maps
}
