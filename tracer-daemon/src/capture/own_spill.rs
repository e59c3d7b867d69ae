//! The per-image spill maps (`OWN_LIVE`, `OWN_LEVELS`; protocol in
//! `tracer_common::own_spill`): tracerd creates each image's level maps as
//! the programs ask for them, reads one image's spilled blocks from its own
//! maps rather than from every spilled block of the host, and drops them
//! once the image ended and its blocks were read. Maps of the first
//! levels' sizes wait in `OWN_LIVE` ahead, in a pool: giving one to an
//! image changes `OWN_LEVELS` alone, where putting a map in `OWN_LIVE`
//! waits for an RCU grace period, in which a process that allocates at
//! full speed spills many blocks (figures in
//! `docs/design/0011-measured-figures.md`).
use std::{
    collections::{BTreeMap, HashMap},
    ops::ControlFlow,
    os::fd::{AsFd as _, BorrowedFd, OwnedFd},
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
};

use aya::maps::{Map, MapData};
use tracer_common::{
    AllocInfo, AllocKey, MAP_OWN_LEVELS, MAP_OWN_LIVE, OWN_LEVELS_MAX, OwnLevelMaps, own_image_key,
    own_level_blocks,
};

use super::{CaptureError, ImageId};
use crate::sys::bpf as bpf_sys;

mod level_map;

use level_map::{LevelMap, create_level, put_in_outer};

pub use super::usage::OwnUsage;

/// The per-image spill maps and the level maps tracerd created. Shared
/// (its state behind a lock of its own, held only for bookkeeping and the
/// making or dropping of maps, never for a read of blocks): the event
/// reader makes the levels the programs ask for without the kernel lock
/// ([`OwnLevels`]), while a snapshot reads an image's levels.
pub struct OwnSpill {
    inner: Mutex<Inner>,
    /// `OWN_LIVE`: map id → level map. Outside the lock: the pool is
    /// refilled without it (each change waits for a grace period).
    outer: MapData,
    /// A refill of the pool is under way ([`OwnSpill::refill`]).
    refilling: AtomicBool,
}

/// What [`OwnSpill`]'s lock guards.
struct Inner {
    /// `OWN_LEVELS`: image → its levels' map ids.
    levels: MapData,
    /// Each image's level maps, level 0 first; in (pid, generation)
    /// order, so that a pid's images are a range.
    images: BTreeMap<ImageId, Levels>,
    /// Blocks the images' level maps hold at most, together.
    capacity: u64,
    /// Maps in `OWN_LIVE` that no image has yet, by level: each of that
    /// level's size ([`POOL`]).
    pool: Vec<Vec<LevelMap>>,
    /// Blocks the pool's maps hold at most, together (with those of maps
    /// being made for it).
    pooled: u64,
    /// Most blocks the level maps may be made for together
    /// ([`CAPACITY_PER_LIVE_BLOCK`] × `max_live_blocks`), the pool's
    /// included: a level that would pass it is made smaller, or not at
    /// all (its blocks go to `LIVE_ALLOCS`).
    max_capacity: u64,
    /// The id the next map made gets.
    next_id: u32,
}

/// Maps kept in the pool for each of the first levels: eight of level 0
/// (a burst of new processes), fewer of the larger. Up to level 7: a
/// level is asked for with a quarter of the levels' room left, 32,000
/// blocks at level 7, more than a process spills in a grace period at
/// full speed (16,000 to 30,000 here). Their buckets cost 16 bytes per
/// block, 5.4 MiB for a full pool.
const POOL: [usize; 8] = [8, 4, 4, 2, 2, 2, 1, 1];

/// The pool holds at most this share of the level maps' capacity
/// (1/POOL_SHARE).
const POOL_SHARE: u64 = 8;

/// The event reader's handle on the spill maps ([`super::BlockMaps::own_levels`]):
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
    /// that ended meanwhile), from the pool where it has one
    /// ([`OwnSpill::add_levels`]); how many were made. A refill of the pool
    /// is started on a thread of its own when it runs low.
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
        if self.own.pool_low() {
            let own = Arc::clone(&self.own);
            // At the expensive work's priority: making maps is the
            // kernel's time (their buckets allocated and set up), which
            // the routes need not wait for.
            let spawned = std::thread::Builder::new()
                .name("tracerd-pool".into())
                .spawn(move || {
                    crate::sys::lower_this_threads_priority(crate::sys::EXPENSIVE_NICE);
                    own.refill();
                });
            if let Err(e) = spawned {
                tracing::debug!(err = %e, "no thread to refill the spill map pool");
            }
        }
        made
    }
}

/// An image's level maps, level 0 first.
type Levels = Vec<LevelMap>;

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
        let own = Self {
            inner: Mutex::new(Inner {
                levels,
                images: BTreeMap::new(),
                capacity: 0,
                pool: vec![Vec::new(); POOL.len()],
                pooled: 0,
                max_capacity: max_live_blocks.saturating_mul(CAPACITY_PER_LIVE_BLOCK),
                next_id: 1,
            }),
            outer,
            refilling: AtomicBool::new(false),
        };
        // The pool, before the first process asks.
        own.refill();
        Ok(own)
    }

    /// Whether the pool lacks maps and no refill is under way.
    pub fn pool_low(&self) -> bool {
        !self.refilling.load(Ordering::Relaxed) && !self.inner().pool_lacks().is_empty()
    }

    /// Fills the pool: the maps it lacks are made and put in `OWN_LIVE`
    /// in one batch (one grace period), without the lock; again while
    /// levels were taken meanwhile (at most a few rounds). One refill at
    /// a time; a call during another returns at once.
    pub fn refill(&self) {
        if self.refilling.swap(true, Ordering::AcqRel) {
            return;
        }
        for _ in 0..4 {
            // The maps lacking and their room, reserved under one lock.
            let (wanted, reserved) = {
                let mut inner = self.inner();
                let wanted: Vec<(u32, u32)> = inner
                    .pool_lacks()
                    .into_iter()
                    .map(|level| (level, inner.take_id()))
                    .collect();
                let reserved: u64 = wanted
                    .iter()
                    .map(|(level, _)| own_level_blocks(*level))
                    .sum();
                inner.pooled += reserved;
                (wanted, reserved)
            };
            if wanted.is_empty() {
                break;
            }
            let made: Vec<(u32, LevelMap)> = wanted
                .iter()
                .filter_map(|(level, id)| {
                    let blocks = own_level_blocks(*level);
                    create_level(*id, blocks).map(|map| (*level, map))
                })
                .collect();
            let maps: Vec<&LevelMap> = made.iter().map(|(_, map)| map).collect();
            let put = put_in_outer(self.outer.fd().as_fd(), &maps);
            let mut inner = self.inner();
            // What was reserved and is not in the pool gives its room back.
            let mut kept = 0;
            for ((level, map), put) in made.into_iter().zip(put) {
                if put {
                    kept += map.blocks;
                    inner.pool[level as usize].push(map);
                }
            }
            inner.pooled = inner.pooled.saturating_sub(reserved - kept);
            if kept < reserved {
                break;
            }
        }
        self.refilling.store(false, Ordering::Release);
    }

    /// The state, locked (a poisoned lock is taken as is: the maps in the
    /// kernel are the truth, and every change to the bookkeeping is whole).
    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Gives the levels `asks` names ((image, level)), each one that is
    /// the next its image lacks (after those before it in `asks`), a map:
    /// one of the pool's, or one made (with [`own_level_blocks`] entries,
    /// or what is left of the level maps' capacity when that is less) and
    /// put in `OWN_LIVE`, those made in one batch (every change of
    /// `OWN_LIVE` waits for an RCU grace period, 15 ms here: a batch of
    /// asks from many processes costs one, not one a level); then each
    /// image's levels written whole in `OWN_LEVELS` (in that order, so that
    /// a program that sees the count finds the map). A level past
    /// [`OWN_LEVELS_MAX`] or the capacity of all level maps, or one the
    /// kernel refused (logged), is not made. Returns how many were made.
    pub fn add_levels(&self, asks: &[(ImageId, u32)]) -> usize {
        self.inner().add_levels(self.outer.fd().as_fd(), asks)
    }

    /// Drops the spill maps of `images` (ended, their blocks read and
    /// removed): out of `OWN_LEVELS` first, then out of `OWN_LIVE`.
    pub fn drop_images(&self, images: &[ImageId]) {
        self.inner().drop_images(self.outer.fd().as_fd(), images);
    }

    /// The images that have spill maps.
    pub fn images(&self) -> Vec<ImageId> {
        self.inner().images.keys().copied().collect()
    }

    /// Whether `image` has spill maps.
    pub fn has(&self, image: &ImageId) -> bool {
        self.inner().images.contains_key(image)
    }

    /// The images' level maps and their capacity, for `/maps` (the
    /// pool's are not counted).
    pub fn usage(&self) -> OwnUsage {
        let inner = self.inner();
        OwnUsage {
            maps: inner
                .images
                .values()
                .flatten()
                .map(|level| Arc::clone(&level.map))
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
        for LevelMap { map, blocks, .. } in maps.iter().rev() {
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
                .flat_map(|(_, maps)| maps.iter().rev().map(|level| Arc::clone(&level.map)))
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
    /// [`OwnSpill::add_levels`]: each level from the pool, or made and put
    /// in `OWN_LIVE` (those made, in one batch), then each image's levels
    /// written whole in `OWN_LEVELS`.
    fn add_levels(&mut self, outer: BorrowedFd<'_>, asks: &[(ImageId, u32)]) -> usize {
        // (image, level, map, whether it came from the pool)
        let mut new: Vec<(ImageId, u32, LevelMap, bool)> = Vec::new();
        for &(image, level) in asks {
            let have = self.images.get(&image).map_or(0, Vec::len)
                + new.iter().filter(|(of, ..)| *of == image).count();
            if level as usize != have || level >= OWN_LEVELS_MAX {
                continue;
            }
            if let Some(map) = self.pool.get_mut(level as usize).and_then(Vec::pop) {
                self.pooled = self.pooled.saturating_sub(map.blocks);
                self.capacity += map.blocks;
                new.push((image, level, map, true));
            } else if let Some(map) = self.make(image, level) {
                new.push((image, level, map, false));
            }
        }
        if new.is_empty() {
            return 0;
        }
        let made: Vec<&LevelMap> = new
            .iter()
            .filter(|(.., pooled)| !pooled)
            .map(|(_, _, map, _)| map)
            .collect();
        let mut made_put = put_in_outer(outer, &made).into_iter();
        let in_outer: Vec<bool> = new
            .iter()
            .map(|(.., pooled)| *pooled || made_put.next().unwrap_or(false))
            .collect();
        // An image's level after one that is not in OWN_LIVE is not made
        // either; each image's levels are then written whole.
        let mut failed: Vec<ImageId> = Vec::new();
        let mut counts: BTreeMap<ImageId, u32> = BTreeMap::new();
        for ((image, level, ..), put) in new.iter().zip(&in_outer) {
            if *put && !failed.contains(image) {
                counts.insert(*image, level + 1);
            } else {
                failed.push(*image);
            }
        }
        counts.retain(|image, count| {
            let mut value = OwnLevelMaps {
                count: *count,
                ..OwnLevelMaps::default()
            };
            let old = self.images.get(image).map_or(&[][..], Vec::as_slice);
            let ids = old.iter().map(|level| level.id).chain(
                new.iter()
                    .filter(|(of, ..)| of == image)
                    .map(|(_, _, map, _)| map.id),
            );
            for (slot, id) in value.maps.iter_mut().zip(ids) {
                *slot = id;
            }
            let image_key = own_image_key(image.pid, image.generation);
            bpf_sys::update(self.levels.fd().as_fd(), &image_key, &value, 0)
                .inspect_err(|e| tracing::debug!(pid = image.pid, err = %e, "spill level not published: its blocks go to LIVE_ALLOCS"))
                .is_ok()
        });
        let mut published = 0;
        for ((image, level, map, _), put) in new.into_iter().zip(in_outer) {
            if counts.get(&image).is_some_and(|count| level < *count) {
                self.images.entry(image).or_default().push(map);
                published += 1;
            } else {
                if put {
                    bpf_sys::delete(outer, &map.id);
                }
                self.capacity = self.capacity.saturating_sub(map.blocks);
            }
        }
        published
    }

    /// Makes the map of level `level` of `image` (with [`own_level_blocks`]
    /// entries, or what is left of the level maps' capacity when that is
    /// less), its capacity counted (the caller puts it in `OWN_LIVE`); None
    /// when there is no room or the kernel refused (logged).
    fn make(&mut self, image: ImageId, level: u32) -> Option<LevelMap> {
        // The last level that fits may be smaller than its share: what is
        // left of the level maps' capacity.
        let room = self
            .max_capacity
            .saturating_sub(self.capacity + self.pooled);
        let blocks = own_level_blocks(level).min(room);
        if blocks < u64::from(tracer_common::OWN_FIRST_BLOCKS) {
            tracing::debug!(
                pid = image.pid,
                level,
                "no room for another spill map: its blocks go to LIVE_ALLOCS"
            );
            return None;
        }
        let id = self.take_id();
        let map = create_level(id, blocks)?;
        self.capacity += blocks;
        Some(map)
    }

    /// A map id not in use.
    fn take_id(&mut self) -> u32 {
        let id = self.next_id;
        self.next_id = self.next_id.checked_add(1).unwrap_or(1);
        id
    }

    /// The levels of the maps the pool lacks, one entry a map: up to
    /// [`POOL`] maps of each level it keeps, while the pool stays within its
    /// share of the capacity (and within the room left).
    fn pool_lacks(&self) -> Vec<u32> {
        let bound = self.max_capacity / POOL_SHARE;
        let mut pooled = self.pooled;
        let mut lacks = Vec::new();
        for (level, target) in POOL.iter().enumerate() {
            let blocks = own_level_blocks(level as u32);
            for _ in self.pool[level].len()..*target {
                if pooled + blocks > bound || self.capacity + pooled + blocks > self.max_capacity {
                    break;
                }
                pooled += blocks;
                lacks.push(level as u32);
            }
        }
        lacks
    }

    /// Drops the spill maps of `images` (ended, their blocks read and
    /// removed): out of `OWN_LEVELS` first, then out of `OWN_LIVE`, all of
    /// them in one batch (every change of `OWN_LIVE` waits for an RCU grace
    /// period, 15 ms here: one for the batch, not one per level).
    fn drop_images(&mut self, outer: BorrowedFd<'_>, images: &[ImageId]) {
        let mut ids = Vec::new();
        for image in images {
            let Some(maps) = self.images.remove(image) else {
                continue;
            };
            self.capacity = self
                .capacity
                .saturating_sub(maps.iter().map(|level| level.blocks).sum::<u64>());
            bpf_sys::delete(
                self.levels.fd().as_fd(),
                &own_image_key(image.pid, image.generation),
            );
            ids.extend(maps.iter().map(|level| level.id));
        }
        bpf_sys::delete_batch(outer, &ids, |_| {});
    }
}
