//! A real container: a Debian bookworm root made by
//! `debootstrap --variant=minbase`, run by Debian's podman with runc, with
//! no network. The C fixture built on the host is the container's `/prog`
//! and runs on the container's own glibc (its root's file, another inode
//! than the host's), which tracerd, started with no flag, finds while it
//! holds runc's exec of `/prog` (in the container's root, through the
//! program's `DT_NEEDED` and the root's `ld.so.cache`) and probes before
//! `/prog` runs; every block, from its first, is then at its line with its
//! exact size, and `GET /pid/{pid}` shows the process's pid inside the container,
//! its cgroup and the container's id.
//!
//! The root is made once and kept in this test binary's scratch directory
//! (`CARGO_TARGET_DIR/tmp`, `CARGO_TARGET_TMPDIR`): debootstrap takes far
//! longer than the test itself (times in
//! `docs/design/0011-measured-figures.md`).

use std::{
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    process::Command,
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use serde_json::Value;

use super::allocators::{C_API, by_source, expect};
use crate::suite::support::{Fixture, Program, Tracerd, cgroup_v2, output_ok};

/// The suite, the variant and the mirror of the container's root.
const SUITE: &str = "bookworm";
const VARIANT: &str = "minbase";
const MIRROR: &str = "http://deb.debian.org/debian";

/// The container's glibc, as its processes' `/proc/PID/maps` name it
/// (bookworm's root merges `/lib` into `/usr/lib`).
const CONTAINER_LIBC: &str = "/usr/lib/x86_64-linux-gnu/libc.so.6";

/// The longest debootstrap may take before it is stopped (30 to 55 s here,
/// more from a slow mirror).
const DEBOOTSTRAP_LIMIT: Duration = Duration::from_secs(600);

/// The Debian root in `CARGO_TARGET_TMPDIR`, made by debootstrap on first
/// use. It is made under another name and renamed once complete, so that an
/// interrupted run leaves no half root to be taken for a whole one; what
/// such a run left is removed first (its mounts too: debootstrap mounts
/// `/proc` and `/sys` in the root while it installs).
fn debian_root() -> PathBuf {
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let root = cache.join(format!("debian-{SUITE}-{VARIANT}-root"));
    if root.join("etc/debian_version").exists() {
        return root;
    }
    let partial = cache.join(format!("debian-{SUITE}-{VARIANT}-root.partial"));
    unmount_under(&partial);
    let _ = std::fs::remove_dir_all(&partial);
    std::fs::create_dir_all(cache).expect("create the scratch directory");
    let started = Instant::now();
    // timeout stops debootstrap's whole process group (its wget, dpkg and
    // chroot children) past the limit.
    let out = Command::new("timeout")
        .arg("--kill-after=10")
        .arg(DEBOOTSTRAP_LIMIT.as_secs().to_string())
        .args(["debootstrap", &format!("--variant={VARIANT}"), SUITE])
        .arg(&partial)
        .arg(MIRROR)
        .output()
        .expect("run debootstrap");
    if !out.status.success() {
        unmount_under(&partial);
        let _ = std::fs::remove_dir_all(&partial);
        panic!(
            "debootstrap {SUITE} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    std::fs::rename(&partial, &root).expect("rename the finished root");
    eprintln!(
        "debootstrap --variant={VARIANT} {SUITE}: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    root
}

/// Unmounts (lazily, deepest first) every mount point at or below `dir`
/// (`/proc/self/mountinfo`'s fifth field).
fn unmount_under(dir: &Path) {
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut points: Vec<&str> = mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| Path::new(p).starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for point in points {
        let _ = Command::new("umount").arg("--lazy").arg(point).status();
    }
}

/// A container the test runs, by its name: removed (`podman rm --force`,
/// which kills its processes) on drop, failed test or not, unless podman
/// already removed it (`--rm`).
struct Container {
    name: String,
}

impl Container {
    /// A name no other container has: `tracer-test-{our pid}-{n}`.
    fn new() -> Self {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        Self {
            name: format!("tracer-test-{}-{n}", std::process::id()),
        }
    }

    /// Its 64-hex-digit id and the host pid of its first process
    /// (`podman inspect`).
    fn id_and_pid(&self) -> (String, u32) {
        let out = output_ok(Command::new("podman").args([
            "inspect",
            "--format",
            "{{.Id}} {{.State.Pid}}",
            &self.name,
        ]));
        let text = String::from_utf8_lossy(&out.stdout);
        let (id, pid) = text
            .trim()
            .split_once(' ')
            .unwrap_or_else(|| panic!("podman inspect said {text:?}"));
        (id.to_string(), pid.parse().expect("a pid"))
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("podman")
            .args(["rm", "--force", "--ignore", "--time", "0", &self.name])
            .output();
    }
}

/// The probed object `GET /health` lists as found in process `pid`, if
/// any: (path, family).
fn found_in(tracerd: &Tracerd, pid: u32) -> Option<(String, String)> {
    let health = tracerd.get_ok("/health");
    health["libraries"].as_array()?.iter().find_map(|l| {
        (l["found_in"] == pid).then(|| {
            let field = |f: &str| l[f].as_str().unwrap_or_default().to_string();
            (field("path"), field("family"))
        })
    })
}

/// The inode of the object mapped at `path` in `/proc/{pid}/maps`.
fn mapped_inode(pid: u32, path: &str) -> u64 {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("maps");
    maps.lines()
        .find_map(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            (fields.get(5) == Some(&path)).then(|| fields[4].parse().expect("an inode"))
        })
        .unwrap_or_else(|| panic!("{path} not mapped by {pid}: {maps}"))
}

#[test]
fn a_podman_container_on_its_own_glibc_is_traced_exactly_with_its_pid_cgroup_and_id() {
    // Made before tracerd starts: debootstrap's processes untraced.
    let root = debian_root();
    let prog = Program::build("allocator_libs", &[]);
    let tracerd = Tracerd::start(&[]);
    let container = Container::new();
    let volume = format!("{}:/prog:ro", prog.exe.to_str().expect("utf-8"));
    let mut fx = Fixture::spawn(
        Path::new("podman"),
        &[
            "run",
            "--rm",
            "--interactive",
            "--name",
            &container.name,
            // crun 1.8 refuses this host's hybrid cgroup layout (v1
            // controllers, and a v2 hierarchy with one of its own: "cgroups
            // in hybrid mode not supported", even with --cgroups=disabled);
            // runc puts the container in both, so that its cgroup v2 path
            // names it.
            "--runtime",
            "runc",
            "--network",
            "none",
            // Rootful podman asks the runtime for 1048576 open files, and
            // runs it under a process limit of its own (32768) that the
            // container's may not exceed: raising a hard limit takes
            // CAP_SYS_RESOURCE, which root lacks here (as in a container).
            // Lower limits are always allowed.
            "--ulimit",
            "nofile=1024:1024",
            "--ulimit",
            "nproc=1024:1024",
            // The fixture is the container's /prog (a bind mount: the
            // cached root stays as debootstrap made it).
            "--volume",
            &volume,
            "--rootfs",
            root.to_str().expect("utf-8"),
            "/prog",
        ],
    );
    fx.expect_line("ready");
    // conmon, not podman, is its parent: podman knows its pid.
    let (id, pid) = container.id_and_pid();
    assert_eq!(
        std::fs::read_link(format!("/proc/{pid}/exe")).expect("exe"),
        Path::new("/prog")
    );
    // Its glibc is the root's own file, not the host's.
    let inode = mapped_inode(pid, CONTAINER_LIBC);
    let in_root = std::fs::metadata(root.join(CONTAINER_LIBC.trim_start_matches('/')))
        .expect("the root's glibc");
    let on_host = std::fs::metadata(CONTAINER_LIBC).expect("the host's glibc");
    assert_eq!(inode, in_root.ino());
    assert_ne!(inode, on_host.ino());
    // tracerd finds it in the process and probes it (the host's glibc was
    // probed from the start: it lists that one as found in no process).
    // It was probed while runc's exec of /prog was held, before /prog ran:
    // listed already when /prog says "ready".
    let (path, family) = found_in(&tracerd, pid).expect("the container's glibc probed");
    assert_eq!((path.as_str(), family.as_str()), (CONTAINER_LIBC, "glibc"));
    // So its first allocation, before "ready", is traced.
    tracerd.wait_traced(pid);
    let first = tracerd.get_ok(&format!("/pid/{pid}/statistics?group_by=lineno&limit=0"));
    expect(
        &prog,
        &first["statistics"],
        "in a podman container, at its start",
        &[("LIB_FIRST", 1, 10)],
    );
    fx.step("done");
    tracerd.wait_traced(pid);
    let stats = tracerd.get_ok(&format!("/pid/{pid}/statistics?group_by=lineno&limit=0"));
    let stats = &stats["statistics"];
    expect(&prog, stats, "in a podman container", C_API);
    // And nothing else: the C API's blocks, the first malloc and stdio's
    // two buffers (stdout's at "ready", stdin's at the first line read:
    // 4096 bytes each, the pipes' block size) are all the process holds,
    // all from the container's glibc.
    let process = tracerd.get_ok(&format!("/pid/{pid}"));
    let held = |field: &str| process[field].as_i64().expect("a number");
    // The sites of C_API: 50 + 50 + 40 + 30 + 20 blocks of 50000 + 15000 +
    // 200000 + 19200 + 51200 bytes; and 10 + 4096 + 4096 bytes at start.
    let start = (3, 10 + 2 * 4096);
    assert_eq!(
        (held("blocks"), held("current")),
        (190 + start.0, 335_400 + start.1),
        "{process}"
    );
    // Reached before the frees: the 50 freed blocks of 1000 bytes held too.
    assert_eq!(held("peak"), 385_400 + start.1, "{process}");
    // 100 + 50 + 40 mallocs, 40 reallocs, 30 + 20 aligned, 3 at start; 50
    // frees, and the 40 blocks the reallocs moved.
    assert_eq!(
        (held("allocs"), held("frees")),
        (280 + start.0, 90),
        "{process}"
    );
    assert_eq!(
        by_source(&tracerd, pid),
        [("glibc".to_string(), 335_400 + start.1, 385_400 + start.1)]
    );
    // Its pid in the container is 1, its cgroup the one podman made for
    // it, whose path holds its id.
    assert_eq!(process["nspid"], 1, "{process}");
    assert_eq!(process["cgroup"], cgroup_v2(pid), "{process}");
    assert_eq!(process["container_id"], Value::from(id), "{process}");
    fx.end();
}
