//! Frame 0 of the blocks of real programs that allocate through a layer of
//! their own is the caller of that layer (the default `allocator_frames`):
//! OpenJDK 17 (HotSpot's `os::malloc`, `AllocateHeap`, arenas), `ab`
//! (APR's pools, in libapr-1), `gio monitor` (glib) and `ldbadd` (talloc).
//! Each program is held at a point of its work, traced alone (tracerd's
//! scope is its executable: neither this test nor the host's other
//! processes fill tracerd's maps or slow its answers) with its unwind
//! tables, and read frozen.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use super::{NFRAME_MANY, assert_frame_0_is_the_wrappers_caller, settle};
use crate::suite::support::{Frozen, Held, Nginx, SharedTracerd, TempDir, Tracerd, output_ok};

/// The executable `command` runs, as the kernel names it: found in PATH
/// when its program is a bare name, symlinks resolved (`/usr/bin/java` is
/// the JDK's `bin/java`).
fn executable(command: &Command) -> PathBuf {
    let program = Path::new(command.get_program());
    let found = if program.components().count() > 1 {
        Some(program.to_path_buf())
    } else {
        std::env::var_os("PATH").and_then(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join(program))
                .find(|p| p.is_file())
        })
    };
    let found = found.unwrap_or_else(|| panic!("{} is not in PATH", program.display()));
    std::fs::canonicalize(&found).unwrap_or_else(|e| panic!("{}: {e}", found.display()))
}

/// tracerd (nframe 16, its scope `command`'s executable) and `command`
/// held, traced with its unwind tables.
fn traced(command: &mut Command) -> (SharedTracerd, Held) {
    let exe = executable(command);
    let tracerd = Tracerd::shared(&[
        "--nframe",
        NFRAME_MANY,
        "--scope-exe",
        exe.to_str().expect("utf-8 path"),
    ]);
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
    // Compiled beforehand: `java Work.java` runs javac inside the traced
    // JVM, ten times its classes and blocks (67,000, most of them javac's
    // symbols) for no wrapper of its own.
    output_ok(Command::new("javac").arg("-d").arg(dir.path()).arg(&source));
    let (tracerd, mut java) = traced(Command::new("java").arg("-cp").arg(dir.path()).arg("Work"));
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
    // ab's live blocks are OpenSSL's (5,800, its start-up); APR holds few:
    // apr_initialize's allocator (malloc) and each pool's 8 KiB node,
    // which Debian's APR maps with mmap (APR_ALLOCATOR_USES_MMAP: libc's
    // mmap, then libapr), the global pool's and one per connection at least.
    assert_frame_0_is_the_wrappers_caller(&tracerd, ab.pid(), &APR, 2 + 4);
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
