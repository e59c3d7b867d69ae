//! Tests of the loader's search, against `ldd` and on roots made here.
use super::*;
use std::os::unix::fs::symlink;
use std::process::Command;

/// (dev, ino) of a path.
fn id(path: &Path) -> (u64, u64) {
    let m = std::fs::metadata(path).unwrap();
    (m.dev(), m.ino())
}

/// What `ldd /bin/ls` resolves: `name => path` pairs.
fn ldd_ls() -> Vec<(String, PathBuf)> {
    let out = Command::new("ldd")
        .arg("/bin/ls")
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|line| {
            let (name, rest) = line.trim().split_once(" => ")?;
            let path = rest.split(" (").next()?;
            Some((name.to_string(), PathBuf::from(path)))
        })
        .collect()
}

fn ldd_libc() -> PathBuf {
    ldd_ls()
        .into_iter()
        .find(|(n, _)| n == "libc.so.6")
        .unwrap()
        .1
}

fn temp_root(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tracer-ldso-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn loaders_are_shared_objects_and_programs_are_not() {
    assert!(is_shared_object(
        &File::open("/lib64/ld-linux-x86-64.so.2").unwrap()
    ));
    assert!(!is_shared_object(&File::open("/bin/ls").unwrap()));
    assert!(!is_shared_object(&File::open("/etc/passwd").unwrap()));
}

#[test]
fn host_ls_needs_what_ldd_resolves() {
    let root = Root::of_dir(Path::new("/")).unwrap();
    let exe = File::open("/bin/ls").unwrap();
    let found = needed_objects(&root, &exe, Some(Path::new("/bin/ls")), 64);
    let ids: Vec<_> = found.iter().map(|n| file_id(&n.file).unwrap()).collect();
    assert!(ids.contains(&id(&ldd_libc())));
    // The same objects in the same (breadth-first) order as the real loader.
    let ldd: Vec<_> = ldd_ls().iter().map(|(_, p)| id(p)).collect();
    assert_eq!(ids, ldd);
    assert_eq!(needed_objects(&root, &exe, None, 1).len(), 1);
    assert!(needed_objects(&root, &File::open("/etc/passwd").unwrap(), None, 64).is_empty());
}

#[test]
fn search_stays_in_the_root_and_finds_its_libc() {
    let tmp = temp_root("root");
    let lib_dir = tmp.join("usr/lib/x86_64-linux-gnu");
    std::fs::create_dir_all(&lib_dir).unwrap();
    std::fs::create_dir_all(tmp.join("lib64")).unwrap();
    std::fs::create_dir_all(tmp.join("bin")).unwrap();
    std::fs::copy(ldd_libc(), lib_dir.join("libc.so.6")).unwrap();
    std::fs::copy("/bin/ls", tmp.join("bin/ls")).unwrap();
    symlink("usr/lib", tmp.join("lib")).unwrap();
    symlink("/etc", tmp.join("lib64/evil")).unwrap();
    let root = Root::of_dir(&tmp).unwrap();
    assert!(root.open(Path::new("/lib64/evil/passwd")).is_err());
    assert!(root.open(Path::new("/../../../../etc/passwd")).is_err());
    assert!(root.open(Path::new("/proc/self/root/etc/passwd")).is_err());
    let exe = root.open(Path::new("/bin/ls")).unwrap();
    let found = needed_objects(&root, &exe, Some(Path::new("/bin/ls")), 64);
    // Only libc is in this root; its DT_NEEDED is the (absent) interpreter.
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].path, Path::new("/lib/x86_64-linux-gnu/libc.so.6"));
    assert_eq!(
        file_id(&found[0].file),
        Some(id(&lib_dir.join("libc.so.6")))
    );
    assert_ne!(file_id(&found[0].file), Some(id(&ldd_libc())));
    std::fs::remove_dir_all(&tmp).unwrap();
}

#[test]
fn a_library_of_another_machine_is_passed_over() {
    let tmp = temp_root("machine");
    std::fs::create_dir_all(tmp.join("lib/x86_64-linux-gnu")).unwrap();
    std::fs::create_dir_all(tmp.join("usr/lib64")).unwrap();
    let mut bytes = std::fs::read(ldd_libc()).unwrap();
    bytes[18..20].copy_from_slice(&elf::EM_AARCH64.to_le_bytes()); // e_machine
    std::fs::write(tmp.join("lib/x86_64-linux-gnu/libc.so.6"), bytes).unwrap();
    std::fs::copy(ldd_libc(), tmp.join("usr/lib64/libc.so.6")).unwrap();
    let root = Root::of_dir(&tmp).unwrap();
    let found = needed_objects(&root, &File::open("/bin/ls").unwrap(), None, 64);
    let paths: Vec<_> = found.iter().map(|n| n.path.clone()).collect();
    assert_eq!(paths, [PathBuf::from("/usr/lib64/libc.so.6")]);
    std::fs::remove_dir_all(&tmp).unwrap();
}

#[test]
fn origin_is_replaced_and_other_tokens_refused() {
    let o = Some(Path::new("/opt/app/bin"));
    assert_eq!(
        expand_origin(b"$ORIGIN/../lib", o).unwrap(),
        b"/opt/app/bin/../lib"
    );
    assert_eq!(
        expand_origin(b"${ORIGIN}/x:", o).unwrap(),
        b"/opt/app/bin/x:"
    );
    assert_eq!(expand_origin(b"$ORIGINX", o), None);
    assert_eq!(expand_origin(b"/usr/$LIB", o), None);
    assert_eq!(expand_origin(b"$ORIGIN", None), None);
    let mut dirs = Vec::new();
    expand_list(b"$ORIGIN/lib::rel:/abs:$PLATFORM", o, &mut dirs);
    assert_eq!(
        dirs,
        [PathBuf::from("/opt/app/bin/lib"), PathBuf::from("/abs")]
    );
}

#[test]
fn host_cache_names_ldds_libc_and_never_panics() {
    let data = std::fs::read("/etc/ld.so.cache").unwrap();
    let entries = parse_ld_so_cache(&data);
    let libc = entries
        .iter()
        .find(|(key, _, flags)| key == "libc.so.6" && *flags == 0x0303)
        .unwrap();
    assert_eq!(id(Path::new(&libc.1)), id(&ldd_libc()));
    // Behind an old-format block of two entries (16 + 24 bytes, aligned: 40).
    let mut old = b"ld.so-1.7.0\0".to_vec();
    old.extend_from_slice(&2u32.to_le_bytes());
    old.resize(40, 0);
    old.extend_from_slice(&data);
    assert_eq!(parse_ld_so_cache(&old), entries);
    for len in (0..data.len()).step_by(3).chain(0..200) {
        let part = parse_ld_so_cache(&data[..len]);
        assert!(part.len() <= entries.len());
    }
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    for _ in 0..2000 {
        let mut bad = data.clone();
        for _ in 0..4 {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            // Half the flips in the header and first entries.
            let span = if state & 1 == 0 { 512 } else { bad.len() };
            let at = usize::try_from(state >> 33).unwrap() % span;
            bad[at] ^= 1 << ((state >> 29) & 7);
        }
        let _ = parse_ld_so_cache(&bad);
    }
    assert!(parse_ld_so_cache(b"ld.so-1.7.0\0\xff\xff\xff\xff").is_empty());
}
