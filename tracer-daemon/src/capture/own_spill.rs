//! The per-image spill maps (`OWN_LIVE`, `OWN_LEVELS`; protocol in
//! `tracer_common::own_spill`): tracerd creates each image's level maps as
//! the programs ask for them, reads one image's spilled blocks from its own
//! maps rather than from every spilled block of the host, and drops them
//! once the image ended and its blocks were read.
use std::{
    collections::{BTreeMap, HashMap},
    ops::ControlFlow,
    os::fd::{AsFd as _, OwnedFd},
    sync::{Arc, Mutex, MutexGuard, PoisonError},
};

use aya::maps::{Map, MapData};
use tracer_common::{
    AllocInfo, AllocKey, MAP_OWN_LEVELS, MAP_OWN_LIVE, OWN_LEVELS_MAX, OwnKey, own_image_key,
    own_level_blocks,
};

use super::{CaptureError, ImageId};
use crate::sys::bpf as bpf_sys;

/// What the per-image spill maps hold now, for `/maps` and the metrics:
/// each level map (a descriptor of its own, to count its entries) and
/// their capacity in blocks together.
#[derive(Clone, Debug, Default)]
pub struct OwnUsage {
    /// Every level map of every image.
    pub maps: Vec<Arc<OwnedFd>>,
    /// Their capacities together, in blocks.
    pub capacity: u64,
}

/// The per-image spill maps and the level maps tracerd created. Shared
/// (its state behind a lock of its own, held only for bookkeeping and the
/// making or dropping of maps, never for a read of blocks): the event
/// reader makes the levels the programs ask for without the kernel lock
/// ([`OwnLevels`]), while a snapshot reads an image's levels.
pub struct OwnSpill {
    inner: Mutex<Inner>,
}

/// What [`OwnSpill`]'s lock guards.
struct Inner {
    /// `OWN_LIVE`: (tgid, generation, level) → level map.
    outer: MapData,
    /// `OWN_LEVELS`: image → levels.
    levels: MapData,
    /// Each image's level maps, level 0 first, with their capacities; in
    /// (pid, generation) order, so that a pid's images are a range.
    images: BTreeMap<ImageId, Levels>,
    /// Blocks the level maps hold at most, together.
    capacity: u64,
    /// Most blocks the level maps may be made for together
    /// ([`CAPACITY_PER_LIVE_BLOCK`] × `max_live_blocks`): a level that
    /// would pass it is made smaller, or not at all (its blocks go to
    /// `LIVE_ALLOCS`).
    max_capacity: u64,
}

/// The event reader's handle on the spill maps ([`super::KernelMaps::own_levels`]):
/// it makes the levels the programs ask for as soon as their events are
/// read, without the kernel lock, which a read of millions of blocks may
/// hold for a second (meanwhile the blocks that find the newest level full
/// go to `LIVE_ALLOCS`).
#[derive(Clone)]
pub struct OwnLevels {
    own: Arc<OwnSpill>,
    /// The kernel's per-process totals (`PROC_SLOTS`, `PROCS`): whether an
    /// image is live.
    totals: Arc<dyn super::ProcTotalsSource>,
    /// Where `/maps` finds the maps' use.
    stats: Arc<super::usage::KernelStats>,
}

impl OwnLevels {
    /// The handle of `own`, with the kernel's totals and the use published
    /// for `/maps`.
    pub(super) fn new(
        own: Arc<OwnSpill>,
        totals: Arc<dyn super::ProcTotalsSource>,
        stats: Arc<super::usage::KernelStats>,
    ) -> Self {
        Self { own, totals, stats }
    }

    /// Makes the levels `asks` names ((image, level), in the order the
    /// programs asked) of those images that are live (their generation is
    /// the one the kernel's totals have: nothing would drop the maps of one
    /// that ended meanwhile), all in one change of `OWN_LIVE`
    /// ([`OwnSpill::add_levels`]); how many were made.
    pub fn add(&self, asks: &[(ImageId, u32)]) -> usize {
        let live: Vec<(ImageId, u32)> = asks
            .iter()
            .filter(|(image, _)| self.totals.image_totals(*image).is_some())
            .copied()
            .collect();
        let made = self.own.add_levels(&live);
        if made > 0 {
            self.stats.publish_own(self.own.usage());
        }
        made
    }
}

/// The key of `OWN_LIVE` of level `level` of `image`.
fn own_key(image: ImageId, level: u32) -> OwnKey {
    OwnKey {
        tgid: image.pid,
        gen_: image.generation,
        level,
        _pad: 0,
    }
}

/// An image's level maps, level 0 first, each with its capacity in blocks.
type Levels = Vec<(Arc<OwnedFd>, u64)>;

/// The level maps of all images together are made for at most this many
/// times `max_live_blocks` blocks. A level is made when its image's blocks
/// fill 3/4 of the levels before, so an image's levels are made for at
/// most 2.7 times the blocks they hold: at the bound they hold at least
/// 1.5 × `max_live_blocks`. A level's buckets cost 16 bytes per block it is
/// made for, from the moment it is made (the kernel's hash allocates its
/// buckets whole, and its entries as blocks come).
pub const CAPACITY_PER_LIVE_BLOCK: u64 = 4;

impl OwnSpill {
    /// Takes `OWN_LIVE` and `OWN_LEVELS` out of the loaded object; the
    /// level maps will be made for at most [`CAPACITY_PER_LIVE_BLOCK`] ×
    /// `max_live_blocks` blocks together.
    ///
    /// # Errors
    /// [`CaptureError::Map`] when one is missing or of another kind.
    pub(super) fn take(ebpf: &mut aya::Ebpf, max_live_blocks: u64) -> Result<Self, CaptureError> {
        let outer = match ebpf.take_map(MAP_OWN_LIVE) {
            Some(Map::HashOfMaps(data)) => data,
            _ => {
                return Err(CaptureError::Map {
                    map: MAP_OWN_LIVE,
                    reason: "missing or not a hash of maps".into(),
                });
            }
        };
        let levels = match ebpf.take_map(MAP_OWN_LEVELS) {
            Some(Map::HashMap(data)) => data,
            _ => {
                return Err(CaptureError::Map {
                    map: MAP_OWN_LEVELS,
                    reason: "missing or not a hash map".into(),
                });
            }
        };
        Ok(Self {
            inner: Mutex::new(Inner {
                outer,
                levels,
                images: BTreeMap::new(),
                capacity: 0,
                max_capacity: max_live_blocks.saturating_mul(CAPACITY_PER_LIVE_BLOCK),
            }),
        })
    }

    /// The state, locked (a poisoned lock is taken as is: the maps in the
    /// kernel are the truth, and every change to the bookkeeping is whole).
    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Creates the levels `asks` names ((image, level)), each one that is
    /// the next its image lacks (after those before it in `asks`): its map
    /// (with [`own_level_blocks`] entries, or what is left of the level
    /// maps' capacity when that is less), all of them put in `OWN_LIVE` in
    /// one batch, then each image's level count raised in `OWN_LEVELS` (in
    /// that order, so that a program that sees the count finds the map).
    /// Every change of `OWN_LIVE` waits for an RCU grace period (15 ms
    /// here): a batch of asks from many processes costs one, not one a
    /// level. A level past [`OWN_LEVELS_MAX`] or the capacity of all level
    /// maps, or one the kernel refused (logged), is not made. Returns how
    /// many were made.
    pub fn add_levels(&self, asks: &[(ImageId, u32)]) -> usize {
        self.inner().add_levels(asks)
    }

    /// Drops the spill maps of `images` (ended, their blocks read and
    /// removed): out of `OWN_LEVELS` first, then out of `OWN_LIVE`.
    pub fn drop_images(&self, images: &[ImageId]) {
        self.inner().drop_images(images);
    }

    /// The images that have spill maps.
    pub fn images(&self) -> Vec<ImageId> {
        self.inner().images.keys().copied().collect()
    }

    /// Whether `image` has spill maps.
    pub fn has(&self, image: &ImageId) -> bool {
        self.inner().images.contains_key(image)
    }

    /// The level maps and their capacity, for `/maps`.
    pub fn usage(&self) -> OwnUsage {
        let inner = self.inner();
        OwnUsage {
            maps: inner
                .images
                .values()
                .flatten()
                .map(|(map, _)| map.clone())
                .collect(),
            capacity: inner.capacity,
        }
    }

    /// Calls `keep` with every block of the spill maps of `image` (newest
    /// level first) until it breaks; returns whether it broke.
    pub fn for_each_block(
        &self,
        image: &ImageId,
        keep: &mut dyn FnMut(&AllocKey, &AllocInfo) -> ControlFlow<()>,
    ) -> bool {
        // Read without the lock: a level made meanwhile holds blocks that
        // came after the read began, which it may miss as any walk does.
        let Some(maps) = self.inner().images.get(image).cloned() else {
            return false;
        };
        for (map, blocks) in maps.iter().rev() {
            let mut broke = false;
            let mut each = |addr: &u64, info: &AllocInfo| {
                let key = AllocKey {
                    tgid: image.pid,
                    _pad: 0,
                    addr: *addr,
                };
                let flow = keep(&key, info);
                broke = flow.is_break();
                flow
            };
            // A large level is read by two walks at once (its buckets: its
            // capacity rounded up to a power of two, as the kernel sizes a
            // hash); every block of it is the image's.
            let buckets = u32::try_from(blocks.next_power_of_two()).unwrap_or(1 << 31);
            let read = if super::live::two_walks(buckets) {
                bpf_sys::lookup_batch_halves(map.as_fd(), buckets, Arc::new(|_, _| true), &mut each)
            } else {
                bpf_sys::lookup_batch(map.as_fd(), &mut each)
            };
            if read.is_err() {
                bpf_sys::lookup_each(map.as_fd(), &mut each);
            }
            if broke {
                return true;
            }
        }
        false
    }

    /// Removes those of `keys` that are in a spill map of an image of their
    /// pid (of `only`, when given); calls `on_removed` with each; returns
    /// the others.
    ///
    /// The keys of a pid are deleted in runs: a batch delete from the level
    /// the last key was found in, until a key is not there; that key is
    /// looked for in the pid's other levels, and the next run starts in
    /// the level it was found in. Keys read from the maps come level by
    /// level, so removing them costs a few syscalls a level, not one a key.
    pub fn remove(
        &self,
        keys: Vec<AllocKey>,
        only: Option<ImageId>,
        mut on_removed: impl FnMut(&AllocKey),
    ) -> Vec<AllocKey> {
        if keys.is_empty() || self.inner().images.is_empty() {
            return keys;
        }
        let mut grouped: HashMap<u32, Vec<AllocKey>> = HashMap::new();
        for key in keys {
            grouped.entry(key.tgid).or_default().push(key);
        }
        let mut rest = Vec::new();
        for (pid, keys) in grouped {
            // The pid's level maps, each image's newest first.
            let maps: Vec<Arc<OwnedFd>> = self
                .inner()
                .images
                .range(ImageId::new(pid, 0)..=ImageId::new(pid, u32::MAX))
                .filter(|(image, _)| only.is_none_or(|only| only == **image))
                .flat_map(|(_, maps)| maps.iter().rev().map(|(map, _)| Arc::clone(map)))
                .collect();
            if maps.is_empty() {
                rest.extend(keys);
                continue;
            }
            let addrs: Vec<u64> = keys.iter().map(|key| key.addr).collect();
            let mut at = 0;
            let mut level = 0;
            while at < addrs.len() {
                // Refused (no batch command): the key it stopped at is
                // tried in this level too, one delete at a time.
                let (run, refused) = match bpf_sys::delete_run(maps[level].as_fd(), &addrs[at..]) {
                    Ok(run) => (run, false),
                    Err((run, _)) => (run, true),
                };
                keys[at..at + run].iter().for_each(&mut on_removed);
                at += run;
                let Some(addr) = addrs.get(at) else {
                    break;
                };
                let found = (0..maps.len())
                    .filter(|other| *other != level || refused)
                    .find(|other| bpf_sys::delete(maps[*other].as_fd(), addr));
                match found {
                    Some(other) => {
                        on_removed(&keys[at]);
                        level = other;
                    }
                    None => rest.push(keys[at]),
                }
                at += 1;
            }
        }
        rest
    }
}

impl Inner {
    /// [`OwnSpill::add_levels`]: the levels' maps made, put in `OWN_LIVE`
    /// in one batch, then their images' counts raised.
    fn add_levels(&mut self, asks: &[(ImageId, u32)]) -> usize {
        let mut made: Vec<(ImageId, u32, Arc<OwnedFd>, u64)> = Vec::new();
        for &(image, level) in asks {
            let have = self.images.get(&image).map_or(0, Vec::len)
                + made.iter().filter(|(of, ..)| *of == image).count();
            if level as usize != have || level >= OWN_LEVELS_MAX {
                continue;
            }
            if let Some((map, blocks)) = self.make(image, level) {
                made.push((image, level, map, blocks));
            }
        }
        if made.is_empty() {
            return 0;
        }
        let keys: Vec<OwnKey> = made
            .iter()
            .map(|(image, level, ..)| own_key(*image, *level))
            .collect();
        let fds: Vec<u32> = made
            .iter()
            .map(|(_, _, map, _)| std::os::fd::AsRawFd::as_raw_fd(&**map) as u32)
            .collect();
        let outer = self.outer.fd().as_fd();
        let put = bpf_sys::update_batch(outer, &keys, &fds, 0).unwrap_or_else(|(put, e)| {
            tracing::debug!(err = %e, put, of = keys.len(), "spill maps not put in one batch: one at a time");
            put
        });
        // Those the batch did not put, one at a time (a kernel without the
        // batch command; the map full). An image's level after one that
        // is not in OWN_LIVE is not made either.
        let mut failed: Vec<ImageId> = Vec::new();
        let mut in_outer = vec![false; made.len()];
        for (index, (image, level, _, _)) in made.iter().enumerate() {
            in_outer[index] = !failed.contains(image)
                && (index < put
                    || match bpf_sys::update(outer, &keys[index], &fds[index], 0) {
                        Ok(()) => true,
                        Err(e) => {
                            tracing::debug!(pid = image.pid, level, err = %e, "spill map not put in OWN_LIVE: its blocks go to LIVE_ALLOCS");
                            false
                        }
                    });
            if !in_outer[index] {
                failed.push(*image);
            }
        }
        // Each image's new count, once all its new levels are in OWN_LIVE.
        let mut counts: BTreeMap<ImageId, u64> = BTreeMap::new();
        for ((image, level, _, _), put) in made.iter().zip(&in_outer) {
            if *put {
                counts.insert(*image, u64::from(*level) + 1);
            }
        }
        counts.retain(|image, count| {
            let image_key = own_image_key(image.pid, image.generation);
            bpf_sys::update(self.levels.fd().as_fd(), &image_key, &*count, 0)
                .inspect_err(|e| tracing::debug!(pid = image.pid, err = %e, "spill level not published: its blocks go to LIVE_ALLOCS"))
                .is_ok()
        });
        let mut published = 0;
        for ((image, level, map, blocks), put) in made.into_iter().zip(in_outer) {
            if counts
                .get(&image)
                .is_some_and(|count| u64::from(level) < *count)
            {
                self.images.entry(image).or_default().push((map, blocks));
                published += 1;
            } else {
                if put {
                    bpf_sys::delete(outer, &own_key(image, level));
                }
                self.capacity = self.capacity.saturating_sub(blocks);
            }
        }
        published
    }

    /// Makes the map of level `level` of `image` (with [`own_level_blocks`]
    /// entries, or what is left of the level maps' capacity when that is
    /// less), its capacity counted (the caller puts it in `OWN_LIVE`); None
    /// when there is no room or the kernel refused (logged).
    fn make(&mut self, image: ImageId, level: u32) -> Option<(Arc<OwnedFd>, u64)> {
        // The last level that fits may be smaller than its share: what is
        // left of the level maps' capacity.
        let room = self.max_capacity.saturating_sub(self.capacity);
        let blocks = own_level_blocks(level).min(room);
        if blocks < u64::from(tracer_common::OWN_FIRST_BLOCKS) {
            tracing::debug!(
                pid = image.pid,
                level,
                "no room for another spill map: its blocks go to LIVE_ALLOCS"
            );
            return None;
        }
        let created = bpf_sys::create_hash::<u64, AllocInfo>(
            "own_spill",
            blocks as u32,
            bpf_sys::BPF_F_NO_PREALLOC,
        );
        match created {
            Ok(map) => {
                self.capacity += blocks;
                Some((Arc::new(map), blocks))
            }
            Err(e) => {
                tracing::debug!(pid = image.pid, level, err = %e, "spill map not created: its blocks go to LIVE_ALLOCS");
                None
            }
        }
    }

    /// Drops the spill maps of `images` (ended, their blocks read and
    /// removed): out of `OWN_LEVELS` first, then out of `OWN_LIVE`, all of
    /// them in one batch (every change of `OWN_LIVE` waits for an RCU grace
    /// period, 15 ms here: one for the batch, not one per level).
    fn drop_images(&mut self, images: &[ImageId]) {
        let mut keys = Vec::new();
        for image in images {
            let Some(maps) = self.images.remove(image) else {
                continue;
            };
            self.capacity = self
                .capacity
                .saturating_sub(maps.iter().map(|(_, blocks)| *blocks).sum::<u64>());
            bpf_sys::delete(
                self.levels.fd().as_fd(),
                &own_image_key(image.pid, image.generation),
            );
            keys.extend((0..maps.len() as u32).map(|level| own_key(*image, level)));
        }
        bpf_sys::delete_batch(self.outer.fd().as_fd(), &keys, |_| {});
    }
}
