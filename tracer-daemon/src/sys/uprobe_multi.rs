//! Raw `bpf(2)` calls for uprobe_multi links (Linux 6.6+), which aya 0.14
//! does not offer: loading a uprobe program for them (the kernel takes a
//! uprobe_multi link only for a program loaded with that expected attach
//! type, and aya loads uprobes with none), asking whether the kernel has
//! them, and creating one: many uprobes of one program in one object, all
//! unregistered with one batched wait when the link's last descriptor
//! closes. The same for uprobe session links (Linux 6.13+,
//! `BPF_TRACE_UPROBE_SESSION`): one program run at each call's entry and,
//! unless that run returned 1, at its return.
use std::{
    ffi::CStr,
    io,
    os::fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
};

use aya_obj::generated::{bpf_func_info, bpf_insn, bpf_line_info};

use super::bpf::syscall;

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_BTF_LOAD: libc::c_long = 18;
const BPF_LINK_CREATE: libc::c_long = 28;
/// `BPF_PROG_TYPE_KPROBE`: uprobes' programs are of kprobes' type.
const BPF_PROG_TYPE_KPROBE: u32 = 2;
/// `BPF_TRACE_UPROBE_MULTI` of `enum bpf_attach_type`.
const BPF_TRACE_UPROBE_MULTI: u32 = 48;
/// `BPF_TRACE_UPROBE_SESSION` of `enum bpf_attach_type` (Linux 6.13+).
const BPF_TRACE_UPROBE_SESSION: u32 = 57;
/// `BPF_F_UPROBE_MULTI_RETURN`: the link's uprobes are uretprobes.
const BPF_F_UPROBE_MULTI_RETURN: u32 = 1;
/// Bytes of verifier log kept when a load is refused (its end, where the
/// verifier says why).
const LOG_BYTES: usize = 1 << 20;

/// `union bpf_attr` as `BPF_PROG_LOAD` uses it, up to `line_info_cnt`
/// (the kernel zeroes the rest).
#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
    prog_btf_fd: u32,
    func_info_rec_size: u32,
    func_info: u64,
    func_info_cnt: u32,
    line_info_rec_size: u32,
    line_info: u64,
    line_info_cnt: u32,
    _attach_btf_id: u32,
}
const _: () = assert!(size_of::<ProgLoadAttr>() == 112);

/// `union bpf_attr` as `BPF_BTF_LOAD` uses it.
#[repr(C)]
#[derive(Default)]
struct BtfLoadAttr {
    btf: u64,
    btf_log_buf: u64,
    btf_size: u32,
    btf_log_size: u32,
    btf_log_level: u32,
    _btf_log_true_size: u32,
}
const _: () = assert!(size_of::<BtfLoadAttr>() == 32);

/// `union bpf_attr` as `BPF_LINK_CREATE` uses it for a uprobe_multi link.
#[repr(C)]
#[derive(Default)]
struct UprobeMultiAttr {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    path: u64,
    offsets: u64,
    ref_ctr_offsets: u64,
    cookies: u64,
    cnt: u32,
    multi_flags: u32,
    pid: u32,
    _pad: u32,
}
const _: () = assert!(size_of::<UprobeMultiAttr>() == 64);

/// A program the kernel refused to load.
#[derive(Debug, thiserror::Error)]
#[error("{source}{}", if log.is_empty() { String::new() } else { format!("; verifier: {log}") })]
pub struct LoadError {
    /// The syscall's error.
    pub source: io::Error,
    /// The end of the verifier's log (empty when it said nothing).
    pub log: String,
}

/// Loads BTF (`raw`: a `.BTF` section as the kernel takes it) into the
/// kernel, for the programs whose functions and lines it describes.
///
/// # Errors
/// The syscall's error (EINVAL: BTF the kernel does not take).
pub fn load_btf(raw: &[u8]) -> io::Result<OwnedFd> {
    let mut attr = BtfLoadAttr {
        btf: raw.as_ptr() as u64,
        btf_size: raw.len() as u32,
        ..BtfLoadAttr::default()
    };
    // SAFETY: attr is BPF_BTF_LOAD's bpf_attr; btf points at raw, of
    // btf_size bytes; no log buffer.
    owned(unsafe { syscall(BPF_BTF_LOAD, &mut attr) })
}

/// A program's BTF: the loaded BTF ([`load_btf`]) and the program's
/// function and line records, their instruction offsets those of the
/// instructions given with them.
pub struct ProgramBtf<'a> {
    /// The loaded BTF.
    pub btf: BorrowedFd<'a>,
    /// One record per function (the program and each subprogram).
    pub func_info: &'a [bpf_func_info],
    /// Source lines.
    pub line_info: &'a [bpf_line_info],
}

/// Which links a program is loaded for: its expected attach type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkKind {
    /// uprobe_multi links (`BPF_TRACE_UPROBE_MULTI`): uprobes or
    /// uretprobes.
    Multi,
    /// uprobe session links (`BPF_TRACE_UPROBE_SESSION`, Linux 6.13+).
    Session,
}

impl LinkKind {
    fn attach_type(self) -> u32 {
        match self {
            LinkKind::Multi => BPF_TRACE_UPROBE_MULTI,
            LinkKind::Session => BPF_TRACE_UPROBE_SESSION,
        }
    }
}

/// Loads `insns` (relocated: maps by descriptor, calls resolved) as a
/// uprobe program for uprobe_multi or session links (`kind`;
/// `BPF_PROG_TYPE_KPROBE`), named `name` (its first
/// 15 bytes, as the kernel keeps it), under `license`, with its BTF (the
/// verifier requires it of a program that passes a callback, as
/// `bpf_loop` does).
///
/// # Errors
/// [`LoadError`]: the syscall's error (EINVAL from a kernel before 6.6,
/// EACCES from the verifier, EPERM without CAP_BPF) and the end of the
/// verifier's log, asked for again when the first load fails.
pub fn load_program(
    name: &str,
    kind: LinkKind,
    insns: &[bpf_insn],
    license: &CStr,
    btf: Option<&ProgramBtf<'_>>,
) -> Result<OwnedFd, LoadError> {
    let mut prog_name = [0u8; 16];
    for (to, from) in prog_name.iter_mut().zip(name.bytes().take(15)) {
        *to = from;
    }
    let mut attr = ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_KPROBE,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        prog_name,
        expected_attach_type: kind.attach_type(),
        ..ProgLoadAttr::default()
    };
    if let Some(btf) = btf {
        attr.prog_btf_fd = btf.btf.as_raw_fd() as u32;
        attr.func_info_rec_size = size_of::<bpf_func_info>() as u32;
        attr.func_info = btf.func_info.as_ptr() as u64;
        attr.func_info_cnt = btf.func_info.len() as u32;
        attr.line_info_rec_size = size_of::<bpf_line_info>() as u32;
        attr.line_info = btf.line_info.as_ptr() as u64;
        attr.line_info_cnt = btf.line_info.len() as u32;
    }
    let source = match prog_load(&mut attr) {
        Ok(fd) => return Ok(fd),
        Err(err) => err,
    };
    // Again with the verifier's log: it says why.
    let mut log = vec![0u8; LOG_BYTES];
    attr.log_level = 1;
    attr.log_size = LOG_BYTES as u32;
    attr.log_buf = log.as_mut_ptr() as u64;
    if let Ok(fd) = prog_load(&mut attr) {
        return Ok(fd);
    }
    let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
    let text = String::from_utf8_lossy(&log[..end]);
    let tail: Vec<&str> = text.lines().rev().take(20).collect();
    let log = tail.into_iter().rev().collect::<Vec<_>>().join("\n");
    Err(LoadError { source, log })
}

fn prog_load(attr: &mut ProgLoadAttr) -> io::Result<OwnedFd> {
    // SAFETY: attr is BPF_PROG_LOAD's bpf_attr prefix; its insns,
    // license, func_info, line_info and log_buf point at live buffers of
    // the counts and sizes it gives (load_program).
    owned(unsafe { syscall(BPF_PROG_LOAD, attr) })
}

/// The descriptor a call of BPF_BTF_LOAD, BPF_PROG_LOAD or
/// BPF_LINK_CREATE returned, or its error.
fn owned(result: io::Result<libc::c_long>) -> io::Result<OwnedFd> {
    let fd = i32::try_from(result?).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: what these commands return is a new descriptor that nothing
    // else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// What one uprobe_multi link attaches: program `program` at `offsets`
/// (file offsets in the object at `path`) with one attach cookie per
/// offset (`cookies`, as long as `offsets`: what the program's
/// `bpf_get_attach_cookie` returns there), as uretprobes when `ret`, for
/// the process `pid` only (its thread group) or, with 0, for every process.
/// A session link (`kind`) runs its program at the entry and the return.
pub struct MultiAttach<'a> {
    /// A program loaded by [`load_program`] for links of `kind`.
    pub program: BorrowedFd<'a>,
    /// uprobe_multi or session link.
    pub kind: LinkKind,
    /// The object's path, resolved by the kernel when the link is created.
    pub path: &'a CStr,
    /// File offsets of the probed instructions.
    pub offsets: &'a [u64],
    /// One cookie per offset.
    pub cookies: &'a [u64],
    /// Uretprobes (true) or uprobes; false for a session.
    pub ret: bool,
    /// One process (its tgid) or 0: all.
    pub pid: u32,
}

/// Creates the uprobe_multi link `attach` describes; closing its last
/// descriptor detaches every uprobe of it, with one wait for the kernel's
/// grace periods.
///
/// # Errors
/// The syscall's error: ESRCH (the process is gone), ENOENT or EBADF (no
/// such regular file), EINVAL (an offset or the program refused), E2BIG
/// (over the kernel's limit of offsets per link).
pub fn attach(attach: &MultiAttach<'_>) -> io::Result<OwnedFd> {
    if attach.cookies.len() != attach.offsets.len() {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut attr = UprobeMultiAttr {
        prog_fd: attach.program.as_raw_fd() as u32,
        attach_type: attach.kind.attach_type(),
        path: attach.path.as_ptr() as u64,
        offsets: attach.offsets.as_ptr() as u64,
        cookies: attach.cookies.as_ptr() as u64,
        cnt: attach.offsets.len() as u32,
        multi_flags: if attach.ret && attach.kind == LinkKind::Multi {
            BPF_F_UPROBE_MULTI_RETURN
        } else {
            0
        },
        pid: attach.pid,
        ..UprobeMultiAttr::default()
    };
    link_create(&mut attr)
}

fn link_create(attr: &mut UprobeMultiAttr) -> io::Result<OwnedFd> {
    // SAFETY: attr is BPF_LINK_CREATE's bpf_attr prefix for a
    // uprobe_multi link; path is a NUL-terminated string and offsets and
    // cookies hold cnt u64 each (its callers).
    owned(unsafe { syscall(BPF_LINK_CREATE, attr) })
}

/// Whether the kernel takes links of `kind` for `program` (loaded by
/// [`load_program`] for them) and filters them by process, not thread
/// (fixed in Linux 6.10 and its stable kernels): libbpf's probe. A link
/// on `/` is refused with EBADF (not a regular file) where links exist,
/// and one with pid -1 with EINVAL where the pid filter is the process's.
/// Nothing is attached.
pub fn supported(program: BorrowedFd<'_>, kind: LinkKind) -> bool {
    let offset = 0u64;
    let cookie = 0u64;
    let mut attr = UprobeMultiAttr {
        prog_fd: program.as_raw_fd() as u32,
        attach_type: kind.attach_type(),
        path: c"/".as_ptr() as u64,
        offsets: std::ptr::from_ref(&offset) as u64,
        cookies: std::ptr::from_ref(&cookie) as u64,
        cnt: 1,
        ..UprobeMultiAttr::default()
    };
    let errno = |result: io::Result<OwnedFd>| result.err().and_then(|e| e.raw_os_error());
    if errno(link_create(&mut attr)) != Some(libc::EBADF) {
        return false;
    }
    attr.pid = u32::MAX;
    errno(link_create(&mut attr)) == Some(libc::EINVAL)
}

/// The run statistics the kernel keeps for program `fd` while
/// `BPF_ENABLE_STATS` is on: (total run time in ns, runs), from
/// `/proc/self/fdinfo`; zeros when it cannot be read.
pub fn run_stats(fd: BorrowedFd<'_>) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd()))
        .unwrap_or_default();
    parse_run_stats(&text)
}

/// `run_time_ns` and `run_cnt` of a BPF program's fdinfo text (0 where absent).
fn parse_run_stats(text: &str) -> (u64, u64) {
    let field = |name: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or(0)
    };
    (field("run_time_ns:"), field("run_cnt:"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_stats_are_read_from_a_programs_fdinfo() {
        let text = "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t2071\nlink_type:\tx\nprog_type:\t2\nprog_jited:\t1\nprog_tag:\tabc\nmemlock:\t4096\nprog_id:\t42\nrun_time_ns:\t123456\nrun_cnt:\t789\nrecursion_misses:\t0\n";
        assert_eq!(parse_run_stats(text), (123_456, 789));
        assert_eq!(parse_run_stats("prog_id:\t1\n"), (0, 0));
        assert_eq!(parse_run_stats("run_cnt:\tlots\n"), (0, 0));
    }
}
