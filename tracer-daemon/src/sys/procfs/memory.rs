//! A process's resident and anonymous memory, as the kernel counts it
//! (`/proc/PID/statm`): what the watch reads of every process at each
//! interval, one small read each.

/// Resident and resident anonymous bytes of process `pid`, from
/// `/proc/PID/statm` (`resident` and `resident - shared` pages, `shared`
/// being file-backed and shared memory, times the page size); None when
/// it is gone, or maps no memory (a kernel thread, a zombie).
pub fn read_memory(pid: u32) -> Option<(u64, u64)> {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    let (resident, shared) = parse_statm(&statm)?;
    let page = super::page_size();
    (resident > 0).then(|| (resident * page, resident.saturating_sub(shared) * page))
}

/// (resident, shared) pages of a `statm` line: `size resident shared text
/// lib data dt`.
fn parse_statm(statm: &str) -> Option<(u64, u64)> {
    let mut fields = statm.split_whitespace().skip(1);
    let resident = fields.next()?.parse().ok()?;
    let shared = fields.next()?.parse().ok()?;
    Some((resident, shared))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statm_gives_resident_and_anonymous_pages() {
        assert_eq!(
            parse_statm("2787 1043 789 213 0 236 0\n"),
            Some((1043, 789))
        );
        assert_eq!(parse_statm("0 0 0 0 0 0 0\n"), Some((0, 0)));
        assert_eq!(parse_statm("12"), None);
        let (rss, anon) = read_memory(std::process::id()).expect("own statm");
        assert!(rss >= anon && anon > 0);
    }
}
