//! Tests of the /proc parsers, on fixed and random text and on this process.
use super::*;
use rand::{Rng as _, SeedableRng as _};

const MAPS: &str = "\
55d0c8a00000-55d0c8a02000 r--p 00000000 fd:01 1234                       /usr/bin/cat
55d0c8a02000-55d0c8a07000 r-xp 00002000 fd:01 1234                       /usr/bin/cat
55d0c9000000-55d0c9021000 rw-p 00000000 00:00 0                          [heap]
7f0000000000-7f0000001000 r-xp 00001000 08:10 99                         /opt/my app/lib x.so (deleted)
7f0000001000-7f0000002000 rw-p 00000000 00:00 0 
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
7ffd000fe000-7ffd00100000 r-xp 00000000 00:00 0                          [vdso]
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
";

#[test]
fn parse_maps_reads_every_column() {
    let entries = parse_maps(MAPS).unwrap();
    assert_eq!(entries.len(), 8);
    assert_eq!(
        entries[1],
        MapEntry {
            start: 0x55d0c8a02000,
            end: 0x55d0c8a07000,
            offset: 0x2000,
            perms: Perms {
                read: true,
                write: false,
                execute: true,
                shared: false
            },
            dev: (0xfd, 0x01),
            inode: 1234,
            path: Some(Arc::from("/usr/bin/cat")),
            deleted: false,
        }
    );
    assert!(entries[1].is_file_backed());
}

#[test]
fn parse_maps_keeps_spaces_and_strips_deleted() {
    let entries = parse_maps(MAPS).unwrap();
    assert_eq!(entries[3].path.as_deref(), Some("/opt/my app/lib x.so"));
    assert!(entries[3].deleted);
    assert_eq!(entries[3].dev, (8, 0x10));
    assert!(entries[3].is_file_backed());
}

#[test]
fn parse_maps_pseudo_paths_and_anonymous() {
    let entries = parse_maps(MAPS).unwrap();
    assert_eq!(entries[2].path.as_deref(), Some("[heap]"));
    assert!(!entries[2].is_file_backed());
    // Anonymous with the kernel's trailing padding space.
    assert_eq!(entries[4].path, None);
    assert!(!entries[4].is_file_backed());
    assert_eq!(entries[5].path.as_deref(), Some("[stack]"));
    assert_eq!(entries[6].path.as_deref(), Some("[vdso]"));
    assert!(!entries[6].is_file_backed());
    assert_eq!(entries[7].start, 0xffffffffff600000);
    assert_eq!(
        entries[7].perms,
        Perms {
            read: false,
            write: false,
            execute: true,
            shared: false
        }
    );
}

#[test]
fn parse_maps_unescapes_newline_in_path() {
    let text = "1000-2000 r-xp 00000000 fd:01 7 /tmp/a\\012b\n";
    let entries = parse_maps(text).unwrap();
    assert_eq!(entries[0].path.as_deref(), Some("/tmp/a\nb"));
}

#[test]
fn parse_maps_path_named_deleted_only_once_stripped() {
    let text = "1000-2000 r-xp 00000000 fd:01 7 /tmp/x (deleted) (deleted)\n";
    let entries = parse_maps(text).unwrap();
    assert_eq!(entries[0].path.as_deref(), Some("/tmp/x (deleted)"));
    assert!(entries[0].deleted);
}

#[test]
fn parse_maps_empty_text_is_empty() {
    assert_eq!(parse_maps("").unwrap(), Vec::new());
    assert_eq!(parse_maps("\n\n").unwrap(), Vec::new());
}

#[test]
fn parse_maps_rejects_malformed_lines_with_line_number() {
    let cases = [
        ("1000 r-xp 0 fd:01 7 /x", "address range without '-'"),
        (
            "2000-1000 r-xp 0 fd:01 7 /x",
            "start address after end address",
        ),
        ("+10-2000 r-xp 0 fd:01 7 /x", "bad start address"),
        ("1000-2000 rwxq 0 fd:01 7 /x", "bad permissions"),
        ("1000-2000 r-x 0 fd:01 7 /x", "bad permissions"),
        ("1000-2000 r-xp zz fd:01 7 /x", "bad offset"),
        ("1000-2000 r-xp 0 fd01 7 /x", "device without ':'"),
        ("1000-2000 r-xp 0 1ffffffff:01 7 /x", "bad device major"),
        ("1000-2000 r-xp 0 fd:01 -7 /x", "bad inode"),
        ("1000-2000 r-xp 0 fd:01", "missing inode"),
        ("1000-2000", "missing permissions"),
        ("10000000000000000-2 r-xp 0 fd:01 7 /x", "bad start address"),
    ];
    for (line, reason) in cases {
        let text = format!("1000-2000 r-xp 0 fd:01 7 /ok\n{line}\n");
        match parse_maps(&text) {
            Err(ProcError::MalformedMaps { line: 2, reason: r }) => {
                assert_eq!(r, reason, "{line}")
            }
            other => panic!("{line}: {other:?}"),
        }
    }
}

/// Property: arbitrary bytes (and mutations of real maps text) never panic.
#[test]
fn parse_maps_never_panics_on_random_input() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x7261_6365);
    let alphabet = b"0123456789abcdefABCDEF-: rwxsp/()[]\n\\deleted\xff";
    for _ in 0..20_000 {
        let len = rng.random_range(0..120);
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                if rng.random_bool(0.7) {
                    alphabet[rng.random_range(0..alphabet.len())]
                } else {
                    rng.random()
                }
            })
            .collect();
        let _ = parse_maps(&String::from_utf8_lossy(&bytes));
    }
    let real = MAPS.as_bytes();
    for _ in 0..20_000 {
        let mut bytes = real.to_vec();
        for _ in 0..rng.random_range(1..6) {
            let at = rng.random_range(0..bytes.len());
            match rng.random_range(0..3) {
                0 => bytes[at] = rng.random(),
                1 => {
                    bytes.remove(at);
                }
                _ => bytes.truncate(at),
            }
            if bytes.is_empty() {
                break;
            }
        }
        let _ = parse_maps(&String::from_utf8_lossy(&bytes));
    }
}

fn stat_line(comm: &str) -> String {
    stat_with_ppid(comm, 1)
}

/// Fields 3..=22 then the rest, as the kernel writes them; ppid (field 4)
/// as given, starttime = 424242.
fn stat_with_ppid(comm: &str, ppid: u64) -> String {
    format!(
        "4321 ({comm}) S {ppid} 4321 4321 0 -1 4194560 100 0 0 0 3 1 0 0 20 0 1 0 424242 \
         8192000 200 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0\n"
    )
}

#[test]
fn stat_start_time_with_plain_comm() {
    assert_eq!(parse_stat_start_time(&stat_line("cat")).unwrap(), 424242);
}

#[test]
fn stat_start_time_with_comm_containing_paren_and_spaces() {
    assert_eq!(parse_stat_start_time(&stat_line("a) b")).unwrap(), 424242);
    assert_eq!(
        parse_stat_start_time(&stat_line(") 1 2 3 (")).unwrap(),
        424242
    );
    assert_eq!(parse_stat_start_time(&stat_line("")).unwrap(), 424242);
}

#[test]
fn stat_start_time_rejects_malformed_text() {
    assert!(matches!(
        parse_stat_start_time("4321 cat S 1"),
        Err(ProcError::MalformedStat { .. })
    ));
    assert!(matches!(
        parse_stat_start_time("4321 (cat) S 1 2 3"),
        Err(ProcError::MalformedStat { .. })
    ));
    let bad = stat_line("cat").replace("424242", "42x242");
    assert!(matches!(
        parse_stat_start_time(&bad),
        Err(ProcError::MalformedStat { .. })
    ));
}

#[test]
fn stat_ppid_is_field_four_whatever_the_comm_holds() {
    assert_eq!(parse_stat_ppid(&stat_line("cat")).unwrap(), 1);
    assert_eq!(parse_stat_ppid(&stat_with_ppid("sh", 4242)).unwrap(), 4242);
    // Comms that look like the fields after them.
    assert_eq!(
        parse_stat_ppid(&stat_with_ppid("a) S 7 (b", 99)).unwrap(),
        99
    );
    assert_eq!(parse_stat_ppid(&stat_with_ppid(") 1 2 3 (", 0)).unwrap(), 0);
    assert!(matches!(
        parse_stat_ppid("4321 (cat) S"),
        Err(ProcError::MalformedStat { .. })
    ));
    assert!(matches!(
        parse_stat_ppid(&stat_line("cat").replacen(") S 1 ", ") S -1 ", 1)),
        Err(ProcError::MalformedStat { .. })
    ));
    // Beyond u32: no pid.
    assert!(matches!(
        parse_stat_ppid(&stat_with_ppid("cat", 1 << 32)),
        Err(ProcError::MalformedStat { .. })
    ));
}

#[test]
fn own_start_time_and_ppid_are_read_together() {
    let (start_time, ppid) = read_start_time_and_ppid(std::process::id()).unwrap();
    assert_eq!(start_time, read_start_time(std::process::id()).unwrap());
    // SAFETY: getppid has no preconditions.
    let parent = u32::try_from(unsafe { libc::getppid() }).unwrap();
    assert_eq!(ppid, Some(parent));
    assert!(read_start_time_and_ppid(u32::MAX).is_err());
}

#[test]
fn stat_fields_survive_any_comm() {
    // The kernel writes comm (up to 15 bytes, chosen by the program) as it
    // is: whatever it holds, fields 4 and 22 come from after the last ')'.
    let mut rng = rand::rngs::StdRng::seed_from_u64(4);
    for _ in 0..5_000 {
        let len = rng.random_range(0..16);
        let alphabet = b"() S 0123456789ab\n";
        let comm: String = (0..len)
            .map(|_| char::from(alphabet[rng.random_range(0..alphabet.len())]))
            .collect();
        let ppid: u32 = rng.random();
        let text = stat_with_ppid(&comm, u64::from(ppid));
        assert_eq!(parse_stat_ppid(&text).unwrap(), ppid, "{text:?}");
        assert_eq!(parse_stat_start_time(&text).unwrap(), 424242, "{text:?}");
    }
}

#[test]
fn stat_parse_never_panics_on_random_input() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(22);
    for _ in 0..20_000 {
        let len = rng.random_range(0..200);
        let bytes: Vec<u8> = (0..len)
            .map(|_| b"0123456789 ()ab\n\xff"[rng.random_range(0..17)])
            .collect();
        let text = String::from_utf8_lossy(&bytes);
        let _ = parse_stat_start_time(&text);
        let _ = parse_stat_ppid(&text);
    }
}

#[test]
fn own_process_identity_comm_and_exe() {
    let pid = std::process::id();
    let start_time = read_start_time(pid).unwrap();
    assert!(start_time > 0);
    // Start time never changes for a live process.
    assert_eq!(read_start_time(pid).unwrap(), start_time);
    let exe = read_exe(pid).unwrap();
    let current_exe = std::env::current_exe().unwrap();
    assert_eq!(exe, current_exe.to_str().unwrap());
    let comm = read_comm(pid).unwrap();
    assert!(!comm.ends_with('\n'));
    let expected: String = current_exe
        .file_name()
        .unwrap()
        .to_string_lossy()
        .chars()
        .take(15)
        .collect();
    // The test harness names threads, not the process, so comm is the exe's name.
    assert_eq!(comm, expected);
}

#[test]
fn missing_process_is_reported_gone() {
    // pid_max is at most 2^22, so this pid never exists.
    let err = read_maps(u32::MAX).unwrap_err();
    assert!(err.to_string().contains("/proc/4294967295/maps"), "{err}");
}

#[test]
fn an_exited_process_not_yet_reaped_has_no_mappings_rather_than_none() {
    // A child that exited and is not waited for is a zombie: /proc/PID is
    // there, its start time still its own, its maps empty.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .unwrap()
        .contains(") Z ")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "pid {pid} never exited"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(read_start_time(pid).is_ok());
    let err = read_maps(pid).unwrap_err();
    assert!(
        matches!(err, ProcError::NoMappings { pid: p } if p == pid),
        "{err}"
    );
    assert!(read_maps(std::process::id()).unwrap().len() > 1);
    child.wait().unwrap();
}

#[test]
fn namespaced_pid_and_container_id() {
    assert_eq!(nspid_of("Name:\tx\nNSpid:\t4242\t7\t1\n"), Some(1));
    assert_eq!(nspid_of("Name:\tx\nNSpid:\t4242\n"), Some(4242));
    assert_eq!(nspid_of("Name:\tx\n"), None);
    let id = "0123456789abcdef".repeat(4);
    for path in [
        format!("/system.slice/docker-{id}.scope"),
        format!("/machine.slice/libpod-{id}.scope/container"),
        format!("/docker/{id}"),
        format!("/kubepods.slice/kubepods-pod1.slice/cri-containerd-{id}.scope"),
    ] {
        assert_eq!(container_id(&path).as_deref(), Some(id.as_str()), "{path}");
    }
    assert_eq!(
        container_id("/user.slice/user-0.slice/session-1.scope"),
        None
    );
    assert_eq!(container_id("/"), None);
}

#[test]
fn a_process_belongs_to_a_user_only_when_all_its_uids_are_theirs_and_it_is_dumpable() {
    let status = |uids: &str| format!("Name:\tx\nUid:\t{uids}\nGid:\t1000\t1000\t1000\t1000\n");
    assert_eq!(
        owner_of(&status("1000\t1000\t1000\t1000"), 1000),
        Some(1000)
    );
    // A setuid-root program run by user 1000: effective and saved uid 0,
    // and /proc/PID/status owned by root.
    assert_eq!(owner_of(&status("1000\t0\t0\t0"), 0), None);
    // A program that dropped privileges but is not dumpable: the files of
    // /proc/PID stay root's.
    assert_eq!(owner_of(&status("1000\t1000\t1000\t1000"), 0), None);
    // A saved uid of another user.
    assert_eq!(owner_of(&status("1000\t1000\t0\t1000"), 1000), None);
    assert_eq!(owner_of(&status("0\t0\t0\t0"), 0), Some(0));
    assert_eq!(owner_of("Name:\tx\n", 1000), None);
    assert_eq!(owner_of(&status("1000\tx\t1000\t1000"), 1000), None);
    // This process, read back: its uid owns it.
    let me = own_uid();
    assert_eq!(read_owner(std::process::id()), Some(me));
}

/// This process's uid, from `/proc/self/status`.
fn own_uid() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").expect("must succeed");
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("must succeed")
}

#[test]
fn kernel_threads_are_told_from_processes_by_their_stat_flags() {
    // kthreadd is pid 2 in the host's pid namespace.
    assert!(is_kernel_thread(2));
    assert!(!is_kernel_thread(std::process::id()));
    assert!(!is_kernel_thread(u32::MAX), "no such pid");
    let users = user_pids();
    assert!(users.contains(&std::process::id()));
    assert!(!users.contains(&2));
}

#[test]
fn a_zombie_is_told_by_its_state_whatever_the_comm_holds() {
    assert!(!stat_is_zombie(&stat_line("cat")));
    assert!(stat_is_zombie(
        &stat_line("cat").replacen(") S ", ") Z ", 1)
    ));
    // A comm that holds ") Z " is not the state.
    assert!(!stat_is_zombie(&stat_line("a) Z (b")));
    assert!(!stat_is_zombie("4321 (cat"));
    assert!(!stat_is_zombie(""));
}
