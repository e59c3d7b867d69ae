//! Frame 0 of the blocks of real programs that allocate through a layer of
//! their own is the caller of that layer (the default `allocator_frames`):
//! OpenJDK 17 (HotSpot's `os::malloc`, `AllocateHeap`, arenas), `ab`
//! (APR's pools, in libapr-1), `gio monitor` (glib) and `ldbadd` (talloc).
//! Each program is held at a point of its work, traced with its unwind
//! tables, and read frozen.

use std::{path::Path, process::Command, time::Duration};

use super::{NFRAME_MANY, assert_frame_0_is_the_wrappers_caller, settle};
use crate::suite::support::{Frozen, Held, Nginx, TempDir, Tracerd};

/// tracerd (nframe 16) and `command` held, traced with its unwind tables.
fn traced(command: &mut Command) -> (Tracerd, Held) {
    let tracerd = Tracerd::start(&["--nframe", NFRAME_MANY]);
    let held = Held::spawn(command);
    tracerd.wait_traced(held.pid());
    settle(&tracerd, held.pid());
    (tracerd, held)
}

/// After "ready" and a line: 200 Deflaters (zlib through libzip), 20
/// threads, 300 lambdas and a hot loop the JIT compiles; "done", and a wait.
const JAVA: &str = "import java.util.*;
import java.util.zip.*;
public class Work {
    static int f(int x) { return x * 31 + 7; }
    public static void main(String[] args) throws Exception {
        java.io.BufferedReader in = new java.io.BufferedReader(new java.io.InputStreamReader(System.in));
        System.out.println(\"ready\");
        in.readLine();
        List<Deflater> ds = new ArrayList<>();
        for (int i = 0; i < 200; i++) ds.add(new Deflater());
        List<Thread> ts = new ArrayList<>();
        for (int i = 0; i < 20; i++) {
            Thread t = new Thread(() -> { try { Thread.sleep(100000); } catch (Exception e) {} });
            t.setDaemon(true); t.start(); ts.add(t);
        }
        List<Runnable> rs = new ArrayList<>();
        for (int i = 0; i < 300; i++) { final int k = i; rs.add(() -> f(k)); }
        long s = 0;
        for (int i = 0; i < 2000000; i++) s += f(i);
        System.out.println(\"done \" + s + \" \" + ds.size() + ts.size() + rs.size());
        in.readLine();
    }
}
";

/// HotSpot's allocation layer: its patterns among tracerd's default
/// `allocator_frames`.
const HOTSPOT: [&str; 23] = [
    "os::malloc*",
    "os::realloc*",
    "os::strdup*",
    "AllocateHeap*",
    "ReallocateHeap*",
    "CHeapObj<*>::operator new*",
    "ResourceObj::operator new*",
    "AnyObj::operator new*",
    "Arena::grow*",
    "Arena::Amalloc*",
    "Arena::Arealloc*",
    "Chunk::operator new*",
    "ChunkPool::allocate*",
    "ResourceArea::allocate_bytes*",
    "MallocArrayAllocator<*>::*allocate*",
    "ArrayAllocator<*>::*allocate*",
    "GrowableArrayCHeapAllocator::allocate*",
    "GrowableArrayResourceAllocator::allocate*",
    "GrowableArrayArenaAllocator::allocate*",
    "GrowableArrayWithAllocator<*>::grow*",
    "GrowableArrayWithAllocator<*>::expand_to*",
    "NMTPreInit::*",
    "NMTPreInitAllocation::*",
];

#[test]
fn frame_0_of_java_blocks_is_the_caller_of_hotspots_allocators() {
    let dir = TempDir::new("java");
    let source = dir.path().join("Work.java");
    std::fs::write(&source, JAVA).expect("write Work.java");
    let (tracerd, mut java) = traced(Command::new("java").arg(&source));
    java.line_starting("ready");
    java.send("go");
    java.line_starting("done");
    let _frozen = Frozen::new(java.pid());
    assert_frame_0_is_the_wrappers_caller(&tracerd, java.pid(), &HOTSPOT, 100);
}

/// APR's allocation layer: its patterns among tracerd's default
/// `allocator_frames`.
const APR: [&str; 10] = [
    "module:*/libapr-1.so*",
    "apr_palloc*",
    "apr_pcalloc*",
    "apr_allocator_alloc",
    "apr_pool_create*",
    "apr_pstr*dup",
    "apr_pmemdup",
    "apr_pstrcat*",
    "apr_p*sprintf",
    "apr_bucket_alloc",
];

#[test]
fn frame_0_of_abs_blocks_is_the_caller_of_apr() {
    let nginx = Nginx::start(1);
    let (tracerd, ab) = traced(
        Command::new("ab")
            .args(["-q", "-n", "10000000", "-c", "4"])
            .arg(nginx.url()),
    );
    std::thread::sleep(Duration::from_secs(2));
    let _frozen = Frozen::new(ab.pid());
    assert_frame_0_is_the_wrappers_caller(&tracerd, ab.pid(), &APR, 2);
}

/// glib's allocation layer: its patterns among tracerd's default
/// `allocator_frames`.
const GLIB: [&str; 12] = [
    "g_malloc*",
    "g_realloc*",
    "g_try_malloc*",
    "g_try_realloc*",
    "g_slice_*",
    "g_strdup*",
    "g_strndup",
    "g_memdup*",
    "g_aligned_alloc*",
    "g_strconcat",
    "g_strjoin*",
    "g_strdupv",
];

#[test]
fn frame_0_of_gio_monitors_blocks_is_the_caller_of_glib_allocators() {
    let dir = TempDir::new("gio");
    let watched = dir.path().join("watched");
    std::fs::create_dir(&watched).expect("mkdir");
    let (tracerd, gio) = traced(Command::new("gio").arg("monitor").arg(&watched));
    // Events after the unwinder has its tables: each allocates in glib.
    for i in 0..50 {
        std::fs::write(watched.join(format!("f{i}")), "x").expect("write");
    }
    std::thread::sleep(Duration::from_secs(1));
    let _frozen = Frozen::new(gio.pid());
    assert_frame_0_is_the_wrappers_caller(&tracerd, gio.pid(), &GLIB, 20);
}

/// talloc's allocation layer: its patterns among tracerd's default
/// `allocator_frames`.
const TALLOC: [&str; 5] = [
    "module:*/libtalloc.so*",
    "talloc_*",
    "_talloc_*",
    "__talloc*",
    "_talloc",
];

#[test]
fn frame_0_of_ldbadds_blocks_is_the_caller_of_talloc() {
    let ldbadd = Path::new("/usr/bin/ldbadd");
    assert!(
        ldbadd.exists(),
        "ldb-tools is not installed: cargo xtask setup installs it"
    );
    let dir = TempDir::new("ldb");
    let url = format!("tdb://{}/db.ldb", dir.path().display());
    // It reads its LDIF from stdin: held there, after opening the database.
    let (tracerd, ldb) = traced(Command::new(ldbadd).args(["-H", &url]));
    std::thread::sleep(Duration::from_secs(1));
    let _frozen = Frozen::new(ldb.pid());
    assert_frame_0_is_the_wrappers_caller(&tracerd, ldb.pid(), &TALLOC, 20);
}
