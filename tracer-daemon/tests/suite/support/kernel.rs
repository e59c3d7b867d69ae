//! What a process holds in the kernel: the ids of its BPF programs, maps
//! and links (from `/proc/PID/fdinfo`), `bpftool`'s view of them, and the
//! uprobe events it registered.

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

/// Ids of the BPF programs, maps and links `pid` holds, as (kind, id), from
/// the `prog_id:`/`map_id:`/`link_id:` lines of its `/proc/PID/fdinfo`;
/// sorted, without repeats; empty when the process is gone.
pub fn bpf_ids(pid: u32) -> Vec<(&'static str, u32)> {
    let mut ids = Vec::new();
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return ids;
    };
    for entry in entries.flatten() {
        let Ok(text) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        for line in text.lines() {
            for (prefix, kind) in [
                ("prog_id:", "prog"),
                ("map_id:", "map"),
                ("link_id:", "link"),
            ] {
                if let Some(id) = line
                    .strip_prefix(prefix)
                    .and_then(|v| v.trim().parse().ok())
                {
                    ids.push((kind, id));
                }
            }
        }
    }
    ids.sort_unstable();
    ids.dedup();
    ids
}

fn bpftool(kind: &str, id: u32, json: bool) -> std::process::Output {
    let mut command = Command::new("bpftool");
    if json {
        command.arg("-j");
    }
    command
        .args([kind, "show", "id", &id.to_string()])
        .stdin(Stdio::null())
        .output()
        .expect("run bpftool (cargo xtask setup installs it)")
}

/// Whether `bpftool {kind} show id {id}` finds the object.
pub fn bpftool_shows(kind: &str, id: u32) -> bool {
    bpftool(kind, id, false).status.success()
}

/// `bpftool -j {kind} show id {id}`, when it answers JSON.
pub fn bpftool_json(kind: &str, id: u32) -> Option<Value> {
    serde_json::from_slice(&bpftool(kind, id, true).stdout).ok()
}

/// The uprobe events tracerd `pid` registered (aya names them
/// `aya_{pid}_...`), from tracefs' `uprobe_events`.
pub fn uprobe_events_of(pid: u32) -> Vec<String> {
    let events = std::fs::read_to_string("/sys/kernel/tracing/uprobe_events")
        .or_else(|_| std::fs::read_to_string("/sys/kernel/debug/tracing/uprobe_events"))
        .unwrap_or_default();
    events
        .lines()
        .filter(|l| l.contains(&format!("aya_{pid}_")))
        .map(str::to_string)
        .collect()
}

/// Of `held` (from [`bpf_ids`] while its process ran), what `bpftool`
/// still shows once `within` has passed, or sooner when nothing is left:
/// the kernel frees programs, maps and links once their last reference
/// goes, after an RCU grace period.
pub fn left_after(held: &[(&'static str, u32)], within: Duration) -> Vec<(&'static str, u32)> {
    let deadline = Instant::now() + within;
    let mut left = held.to_vec();
    while !left.is_empty() && Instant::now() < deadline {
        left.retain(|(kind, id)| bpftool_shows(kind, *id));
        std::thread::sleep(Duration::from_millis(100));
    }
    left
}

/// The machine code the kernel's JIT made of BPF program `id` (x86-64
/// bytes), read with `BPF_PROG_GET_FD_BY_ID` and `BPF_OBJ_GET_INFO_BY_FD`
/// (`bpf_prog_info.jited_prog_insns`): Debian's bpftool is built without
/// the disassembler that `bpftool prog dump jited` needs.
///
/// # Errors
/// The `bpf(2)` error (the program is gone: ENOENT).
pub fn jited_image(id: u32) -> std::io::Result<Vec<u8>> {
    use std::os::fd::{FromRawFd as _, OwnedFd};
    /// `bpf_attr` as the two commands read it, padded past what they read.
    #[repr(C)]
    #[derive(Default)]
    struct Attr {
        /// GET_FD_BY_ID: the program id; GET_INFO_BY_FD: the fd.
        first: u32,
        /// GET_INFO_BY_FD: the size of the info buffer.
        info_len: u32,
        /// GET_INFO_BY_FD: the info buffer's address.
        info: u64,
        pad: [u64; 14],
    }
    /// `bpf_prog_info` up to `jited_prog_insns`, padded to its full size.
    #[repr(C)]
    #[derive(Default)]
    struct Info {
        prog_type: u32,
        id: u32,
        tag: [u8; 8],
        jited_prog_len: u32,
        xlated_prog_len: u32,
        jited_prog_insns: u64,
        pad: [u64; 29],
    }
    fn bpf(cmd: libc::c_long, attr: &mut Attr) -> std::io::Result<libc::c_long> {
        // SAFETY: `attr` is a valid, writable bpf_attr of the size passed.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                cmd,
                std::ptr::from_mut(attr),
                std::mem::size_of::<Attr>(),
            )
        };
        if ret < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(ret)
    }
    const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
    const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
    let mut attr = Attr {
        first: id,
        ..Attr::default()
    };
    let raw = bpf(BPF_PROG_GET_FD_BY_ID, &mut attr)?;
    // SAFETY: the kernel just gave us this descriptor.
    let fd = unsafe { OwnedFd::from_raw_fd(raw as i32) };
    let raw_fd = std::os::fd::AsRawFd::as_raw_fd(&fd) as u32;
    let mut info = Info::default();
    let ask = |info: &mut Info| {
        let mut attr = Attr {
            first: raw_fd,
            info_len: std::mem::size_of::<Info>() as u32,
            info: std::ptr::from_mut(info) as u64,
            ..Attr::default()
        };
        bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr).map(drop)
    };
    ask(&mut info)?;
    let mut image = vec![0u8; info.jited_prog_len as usize];
    let mut info = Info {
        jited_prog_len: image.len() as u32,
        jited_prog_insns: image.as_mut_ptr() as u64,
        ..Info::default()
    };
    ask(&mut info)?;
    image.truncate(info.jited_prog_len as usize);
    Ok(image)
}

/// How many functions of the JIT image `image` set up a per-CPU private
/// stack: the x86-64 JIT points its frame register at one with
/// `add %gs:OFFSET,%r9` (the CPU's share of the program's private stack).
/// Disassembled by binutils' objdump.
pub fn private_stack_frames(image: &[u8]) -> usize {
    let path = std::env::temp_dir().join(format!("tracer-jit-{}.bin", std::process::id()));
    std::fs::write(&path, image).expect("write the JIT image");
    let out = Command::new("objdump")
        .args(["-D", "-b", "binary", "-m", "i386:x86-64"])
        .arg(&path)
        .stdin(Stdio::null())
        .output()
        .expect("run objdump (binutils)");
    let _ = std::fs::remove_file(&path);
    assert!(out.status.success(), "objdump: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("add ") && l.contains("%gs:") && l.trim_end().ends_with(",%r9"))
        .count()
}
