//! The watch: every process's resident and anonymous memory over time,
//! from what the kernel already counts (`/proc/PID/statm`, read at each
//! interval by `service::exact`), and whether a process grows steadily.
//!
//! It costs the host nothing per allocation: one read of a small file per
//! process and interval. A process that grows steadily is the one worth
//! tracing exactly (`service::exact` does it, `exact = "demand"`).
use std::collections::{HashMap, VecDeque};

/// One process's memory at one read, in bytes (`/proc/PID/statm`:
/// `resident` and `resident - shared` pages, times the page size).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reading {
    /// Process id.
    pub pid: u32,
    /// Resident bytes (`VmRSS`).
    pub rss: u64,
    /// Resident anonymous bytes (`RssAnon`: resident less file-backed and
    /// shared memory).
    pub anon: u64,
}

/// What the watch shows of one process: its memory at the last read and
/// how its anonymous memory changed over the window (bytes, Unix ms).
pub use tracer_api::WatchFigures;

/// The reads kept of one process: those of the window, oldest first.
#[derive(Debug)]
struct Watched {
    /// (Unix ms, anonymous bytes) of each read in the window.
    reads: VecDeque<(u64, u64)>,
    rss: u64,
    since_ms: u64,
}

/// Every watched process's reads within the window (`auto_exact_window`),
/// and the growth that makes a process worth tracing exactly.
#[derive(Debug)]
pub struct Watch {
    processes: HashMap<u32, Watched>,
    /// The window, in ms.
    window_ms: u64,
    /// Anonymous bytes gained over the window that make growth steady
    /// (with most steps rising).
    growth: u64,
}

impl Watch {
    /// An empty watch over a window of `window_ms` ms, where gaining
    /// `growth` anonymous bytes over it, rising at most steps, is steady
    /// growth.
    #[must_use]
    pub fn new(window_ms: u64, growth: u64) -> Self {
        Self {
            processes: HashMap::new(),
            window_ms,
            growth,
        }
    }

    /// Records the reads of one pass over every process at `now_ms`; a
    /// process not read (gone) is forgotten, and so is a read older than
    /// the window (one read at or before the window's start is kept, so
    /// that the window is covered).
    pub fn observe(&mut self, now_ms: u64, readings: &[Reading]) {
        let present: std::collections::HashSet<u32> = readings.iter().map(|r| r.pid).collect();
        self.processes.retain(|pid, _| present.contains(pid));
        let start = now_ms.saturating_sub(self.window_ms);
        for reading in readings {
            let watched = self.processes.entry(reading.pid).or_insert(Watched {
                reads: VecDeque::new(),
                rss: 0,
                since_ms: now_ms,
            });
            watched.rss = reading.rss;
            watched.reads.push_back((now_ms, reading.anon));
            while watched.reads.len() > 2 && watched.reads[1].0 <= start {
                watched.reads.pop_front();
            }
        }
    }

    /// The figures of `pid`, if it is watched.
    #[must_use]
    pub fn figures(&self, pid: u32) -> Option<WatchFigures> {
        let watched = self.processes.get(&pid)?;
        let (first, last) = (watched.reads.front()?, watched.reads.back()?);
        Some(WatchFigures {
            rss: watched.rss,
            anon: last.1,
            anon_growth: i64::try_from(last.1)
                .unwrap_or(i64::MAX)
                .saturating_sub(i64::try_from(first.1).unwrap_or(i64::MAX)),
            growth_over_ms: last.0 - first.0,
            read_at_ms: last.0,
            watched_since_ms: watched.since_ms,
        })
    }

    /// The watched pids.
    pub fn pids(&self) -> impl Iterator<Item = u32> + '_ {
        self.processes.keys().copied()
    }

    /// Whether `pid` grows steadily: its reads cover the whole window, its
    /// anonymous memory gained at least the growth over it, and at least
    /// three steps in four did not fall (a sawtooth freed in bulk, or a
    /// process that rose once and stays flat, does not qualify).
    #[must_use]
    pub fn grows_steadily(&self, pid: u32) -> bool {
        let Some(watched) = self.processes.get(&pid) else {
            return false;
        };
        let (Some(first), Some(last)) = (watched.reads.front(), watched.reads.back()) else {
            return false;
        };
        if last.0 - first.0 < self.window_ms || last.1 < first.1.saturating_add(self.growth) {
            return false;
        }
        let steps = watched.reads.len() - 1;
        let not_falling = watched
            .reads
            .iter()
            .zip(watched.reads.iter().skip(1))
            .filter(|(a, b)| b.1 >= a.1)
            .count();
        steps >= 3 && 4 * not_falling >= 3 * steps
    }

    /// The pids that grow steadily ([`Watch::grows_steadily`]), the
    /// fastest first.
    #[must_use]
    pub fn growing(&self) -> Vec<u32> {
        let mut growing: Vec<(i64, u32)> = self
            .processes
            .keys()
            .filter(|pid| self.grows_steadily(**pid))
            .filter_map(|pid| Some((self.figures(*pid)?.anon_growth, *pid)))
            .collect();
        growing.sort_unstable_by(|a, b| b.cmp(a));
        growing.into_iter().map(|(_, pid)| pid).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn feed(watch: &mut Watch, pid: u32, anon_mib: &[u64]) {
        for (i, anon) in anon_mib.iter().enumerate() {
            let reading = Reading {
                pid,
                rss: anon * MIB + MIB,
                anon: anon * MIB,
            };
            watch.observe(1_000 * i as u64, &[reading]);
        }
    }

    #[test]
    fn steady_growth_over_the_whole_window_is_picked() {
        let mut watch = Watch::new(4_000, 8 * MIB);
        feed(&mut watch, 7, &[10, 12, 14, 16, 18, 20]);
        assert!(watch.grows_steadily(7));
        assert_eq!(watch.growing(), vec![7]);
        let figures = watch.figures(7).expect("watched");
        // The window keeps the reads from 1 s to 5 s (the one at its start included).
        assert_eq!(figures.anon_growth, (8 * MIB) as i64);
        assert_eq!(figures.growth_over_ms, 4_000);
        assert_eq!(figures.anon, 20 * MIB);
        assert_eq!(figures.rss, 21 * MIB);
        assert_eq!(figures.watched_since_ms, 0);
    }

    #[test]
    fn a_cache_warming_a_sawtooth_and_a_short_history_are_not_growth() {
        let mut watch = Watch::new(4_000, 8 * MIB);
        // Rose once, then flat: the window's growth is below the bound.
        feed(&mut watch, 1, &[10, 40, 40, 40, 40, 40, 40]);
        assert!(!watch.grows_steadily(1));
        // A sawtooth: up a lot, but half its steps fall.
        let mut saw = Watch::new(4_000, 8 * MIB);
        feed(&mut saw, 2, &[10, 30, 12, 32, 14, 34]);
        assert!(!saw.grows_steadily(2));
        // Fast growth, but not for a whole window yet.
        let mut young = Watch::new(4_000, 8 * MIB);
        feed(&mut young, 3, &[10, 30, 50]);
        assert!(!young.grows_steadily(3));
    }

    #[test]
    fn a_process_not_read_again_is_forgotten() {
        let mut watch = Watch::new(4_000, MIB);
        watch.observe(
            0,
            &[Reading {
                pid: 1,
                rss: MIB,
                anon: MIB,
            }],
        );
        watch.observe(
            1_000,
            &[Reading {
                pid: 2,
                rss: MIB,
                anon: MIB,
            }],
        );
        assert_eq!(watch.figures(1), None);
        assert_eq!(watch.pids().collect::<Vec<_>>(), vec![2]);
    }
}
