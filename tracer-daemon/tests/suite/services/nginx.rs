//! nginx 1.22 (Debian's: stripped, its functions named by `.dynsym`, no
//! frame pointers): a master and two workers forked from it, under `ab`.

use super::{
    Block, NFRAME, assert_frame_0_is_the_wrappers_caller, assert_no_cut_walk, blocks, cut_walks,
    function, reaches, settle,
};
use crate::suite::support::{Frozen, Nginx, SharedTracerd, Tracerd};

/// The function that calls a worker's cycle (`ngx_worker_process_cycle`,
/// static: Debian's stripped nginx names it nowhere), in the child right
/// after the fork: every allocation of a worker runs under it, one frame
/// deeper (the cycle) at least, and under `main`.
const WORKER_CYCLE_CALLER: &str = "ngx_spawn_process";

/// Where the master parses its configuration (into the cycle's pool).
const INIT_CYCLE: &str = "ngx_init_cycle";

/// nginx's pool size for a cycle (`NGX_CYCLE_POOL_SIZE`, 16 KiB): the
/// least the configuration's pool holds.
const CYCLE_POOL: u64 = 16384;

/// nginx's allocation layer: its patterns among tracerd's default
/// `allocator_frames`.
const ALLOCATOR_FRAMES: [&str; 14] = [
    "ngx_alloc",
    "ngx_calloc",
    "ngx_memalign",
    "ngx_palloc*",
    "ngx_pnalloc",
    "ngx_pcalloc",
    "ngx_pmemalign",
    "ngx_create_pool",
    "ngx_pool_cleanup_add",
    "ngx_pstrdup",
    "ngx_array_create",
    "ngx_array_push*",
    "ngx_list_create",
    "ngx_list_push",
];

/// tracerd (nframe 64), then nginx with two workers, both traced with their
/// unwind tables, after 20,000 requests of `ab`.
fn loaded() -> (SharedTracerd, Nginx) {
    let tracerd = Tracerd::shared(&["--nframe", NFRAME]);
    let nginx = Nginx::start(2);
    tracerd.wait_traced(nginx.master());
    for worker in nginx.workers() {
        tracerd.wait_traced(worker);
        settle(&tracerd, worker);
    }
    nginx.load(20_000, 8);
    (tracerd, nginx)
}

/// A traceback as its first functions, for messages.
fn names(block: &Block) -> String {
    let functions: Vec<&str> = block.frames.iter().take(6).map(function).collect();
    format!(
        "{} B {functions:?} ({} frames)",
        block.size,
        block.frames.len()
    )
}

#[test]
fn every_block_of_an_nginx_worker_is_traced_from_its_cycle_to_main() {
    let (tracerd, nginx) = loaded();
    let mut failures = Vec::new();
    for worker in nginx.workers() {
        let _frozen = Frozen::new(worker);
        let blocks = blocks(&tracerd, worker, "");
        assert!(!blocks.is_empty(), "worker {worker} has no blocks");
        let one_frame = blocks.iter().filter(|b| b.frames.len() == 1).count();
        let under_cycle = |b: &&Block| {
            b.frames
                .iter()
                .position(|f| function(f) == WORKER_CYCLE_CALLER)
                .is_some_and(|at| at >= 1)
                && reaches(&b.frames, "main")
        };
        let outside: Vec<&Block> = blocks.iter().filter(|b| !under_cycle(b)).collect();
        eprintln!(
            "worker {worker}: {} blocks, {one_frame} of one frame, {} not under the cycle \
             {WORKER_CYCLE_CALLER} called",
            blocks.len(),
            outside.len()
        );
        if one_frame > 0 || !outside.is_empty() {
            failures.push(format!(
                "worker {worker}: {} blocks ({} B): {one_frame} of one frame, {} are not under \
                 the cycle {WORKER_CYCLE_CALLER} called (and main), e.g.\n  {}",
                blocks.len(),
                blocks.iter().map(|b| b.size).sum::<u64>(),
                outside.len(),
                outside
                    .iter()
                    .take(5)
                    .map(|b| names(b))
                    .collect::<Vec<_>>()
                    .join("\n  ")
            ));
        }
        failures.extend(cut_walks(&tracerd, worker));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_nginx_master_holds_its_configuration_and_its_workers_do_not() {
    let (tracerd, nginx) = loaded();
    let master = nginx.master();
    let record = tracerd.get_ok(&format!("/pid/{master}"));
    assert_eq!(record["state"], "alive", "{record}");
    assert_eq!(record["exe"], "/usr/sbin/nginx", "{record}");
    assert_eq!(record["complete"], true, "{record}");
    let config = |pid: u32| -> (usize, u64, usize) {
        let _frozen = Frozen::new(pid);
        let blocks = blocks(&tracerd, pid, "");
        let held: Vec<&Block> = blocks
            .iter()
            .filter(|b| reaches(&b.frames, INIT_CYCLE))
            .collect();
        (held.len(), held.iter().map(|b| b.size).sum(), blocks.len())
    };
    let (count, size, all) = config(master);
    eprintln!(
        "master {master}: {record}; {count} of its {all} blocks ({size} B) under {INIT_CYCLE}"
    );
    // A fork child starts with an empty live set: what the master parsed
    // before forking is the master's alone.
    for worker in nginx.workers() {
        assert_eq!(
            config(worker).0,
            0,
            "worker {worker} holds blocks of its parent's {INIT_CYCLE}"
        );
    }
    assert!(
        size >= CYCLE_POOL,
        "the master {master} holds {count} blocks, {size} B, under {INIT_CYCLE} of its {all} \
         blocks (at least its cycle pool's {CYCLE_POOL} B must be)"
    );
    assert_no_cut_walk(&tracerd, master);
}

#[test]
fn frame_0_of_nginx_blocks_is_the_caller_of_its_pools() {
    let (tracerd, nginx) = loaded();
    for pid in std::iter::once(nginx.master()).chain(nginx.workers()) {
        let _frozen = Frozen::new(pid);
        assert_frame_0_is_the_wrappers_caller(&tracerd, pid, &ALLOCATOR_FRAMES, 5);
    }
}
