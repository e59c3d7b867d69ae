//! `cargo xtask setup`: installs what building the eBPF programs needs (the
//! nightly toolchain, its `rust-src`, `bpf-linker` 0.10.0), the Debian
//! packages the tests, benchmarks and service runs use, and schemathesis
//! (PyPI, pinned, in a venv of its own) for the API's test, each only when
//! missing: idempotent, and silent when everything is present.
use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

use crate::util::{
    cmd::{output, run_checked},
    paths::workspace_root,
};

/// The bpf-linker release whose default feature links the nightly rustc's own
/// LLVM (newer ones need a system LLVM 21+ that Debian 12 lacks).
const BPF_LINKER_VERSION: &str = "0.10.0";
/// The nightly toolchain the eBPF crate is built with.
const NIGHTLY: &str = "nightly";

/// schemathesis, the judge of `GET /openapi.json` (the root test
/// `api::openapi`): this version, in a venv of Debian's python3 at
/// [`SCHEMATHESIS_VENV`] (the test runs its `bin/schemathesis`).
const SCHEMATHESIS_VERSION: &str = "4.32.5";
/// The venv schemathesis is installed into.
const SCHEMATHESIS_VENV: &str = "/opt/tracer-tests/schemathesis";

/// Debian packages: (command that proves it is installed, or an absolute
/// path of a file it installs, package).
const DEBIAN_PACKAGES: &[(&str, &str)] = &[
    // Tests and benchmarks: C workloads, CPython's tracemalloc, the
    // reference tools and real programs of the overhead table.
    ("gcc", "gcc"),
    ("python3", "python3"),
    ("bpftrace", "bpftrace"),
    ("heaptrack", "heaptrack"),
    ("valgrind", "valgrind"),
    ("sqlite3", "sqlite3"),
    // The unwinder's judge (gdb's backtrace) and its C++ fixture.
    ("gdb", "gdb"),
    ("g++", "g++"),
    // The Rust fixture's allocator crates: tikv-jemalloc-sys builds
    // jemalloc with its shipped configure script and make (the mimalloc
    // crate needs the C compiler alone).
    ("make", "make"),
    // Programs linked with the allocator libraries tracerd probes besides
    // glibc (their -l links and the libraries).
    (
        "/usr/lib/x86_64-linux-gnu/libjemalloc.so",
        "libjemalloc-dev",
    ),
    (
        "/usr/lib/x86_64-linux-gnu/libtcmalloc.so",
        "libgoogle-perftools-dev",
    ),
    (
        "/usr/lib/x86_64-linux-gnu/libmimalloc.so",
        "libmimalloc-dev",
    ),
    // Programs of other libcs and allocators found per object: musl
    // (musl-gcc, dynamic and static), and Debian's redis-server (jemalloc).
    ("musl-gcc", "musl-tools"),
    ("redis-server", "redis-server"),
    ("redis-cli", "redis-tools"),
    // A real container: a Debian root made by debootstrap, run by podman
    // with runc (crun, podman's first choice, refuses a host whose cgroup
    // v2 hierarchy has controllers beside v1's, the hybrid layout).
    ("debootstrap", "debootstrap"),
    ("podman", "podman"),
    ("runc", "runc"),
    // The service tests: scraping, map inspection, the unit file, dropping
    // privileges.
    ("prometheus", "prometheus"),
    ("bpftool", "bpftool"),
    ("systemd-analyze", "systemd"),
    ("setpriv", "util-linux"),
    // The judge of the pprof answers (`go tool pprof`: -top, -traces,
    // -diff_base).
    ("go", "golang"),
    // The web page's test: Debian's Chromium, driven headless through
    // chromedriver (WebDriver).
    ("chromium", "chromium"),
    ("chromedriver", "chromium-driver"),
    // Debian's own services traced as users run them
    // (tests/suite/services/): PostgreSQL 15 (initdb, postgres, pgbench),
    // nginx loaded by ab (apache2-utils, also the APR program), Node.js,
    // OpenJDK 17 (`java File.java` needs the JDK's compiler), glib's gio,
    // and ldb-tools' ldbadd (a talloc program).
    ("/usr/lib/postgresql/15/bin/pgbench", "postgresql"),
    ("/usr/sbin/nginx", "nginx"),
    ("ab", "apache2-utils"),
    ("node", "nodejs"),
    (
        "/usr/lib/jvm/java-17-openjdk-amd64/bin/javac",
        "openjdk-17-jdk-headless",
    ),
    ("gio", "libglib2.0-bin"),
    ("ldbadd", "ldb-tools"),
];

/// Installs whatever is missing.
pub fn setup() -> anyhow::Result<()> {
    ensure_nightly()?;
    ensure_rust_src()?;
    ensure_bpf_linker()?;
    ensure_packages(DEBIAN_PACKAGES)?;
    ensure_schemathesis()
}

/// Installs schemathesis [`SCHEMATHESIS_VERSION`] into a fresh venv at
/// [`SCHEMATHESIS_VENV`] unless that venv already runs it (with Debian's
/// `python3-venv` when the venv module lacks `ensurepip`).
fn ensure_schemathesis() -> anyhow::Result<()> {
    let bin = format!("{SCHEMATHESIS_VENV}/bin/schemathesis");
    if output(&bin, &["--version"]).is_some_and(|v| v.contains(SCHEMATHESIS_VERSION)) {
        return Ok(());
    }
    eprintln!("xtask: installing schemathesis {SCHEMATHESIS_VERSION} into {SCHEMATHESIS_VENV}");
    if output("/usr/bin/python3", &["-c", "import ensurepip"]).is_none() {
        run_checked(Command::new("apt-get").args(["update", "-qq"]))?;
        run_checked(
            Command::new("apt-get")
                .args([
                    "install",
                    "-y",
                    "-qq",
                    "--no-install-recommends",
                    "python3-venv",
                ])
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )?;
    }
    run_checked(Command::new("/usr/bin/python3").args([
        "-m",
        "venv",
        "--clear",
        SCHEMATHESIS_VENV,
    ]))?;
    run_checked(Command::new(format!("{SCHEMATHESIS_VENV}/bin/pip")).args([
        "install",
        "-q",
        "--disable-pip-version-check",
        &format!("schemathesis=={SCHEMATHESIS_VERSION}"),
    ]))
}

/// Installs the packages whose command is missing (apt-get update once,
/// then apt-get install -y); silent when all are present.
fn ensure_packages(packages: &[(&str, &str)]) -> anyhow::Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .filter(|(proof, _)| {
            if proof.starts_with('/') {
                !Path::new(proof).exists()
            } else {
                output("sh", &["-c", &format!("command -v {proof}")]).is_none()
            }
        })
        .map(|(_, package)| *package)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("xtask: installing {}", missing.join(" "));
    run_checked(Command::new("apt-get").args(["update", "-qq"]))?;
    run_checked(
        Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

fn ensure_nightly() -> anyhow::Result<()> {
    if output("rustc", &[&format!("+{NIGHTLY}"), "--version"]).is_some() {
        return Ok(());
    }
    eprintln!("xtask: installing the {NIGHTLY} toolchain");
    run_checked(Command::new("rustup").args([
        "toolchain",
        "install",
        NIGHTLY,
        "--profile",
        "minimal",
    ]))
}

fn ensure_rust_src() -> anyhow::Result<()> {
    let sysroot = output("rustc", &[&format!("+{NIGHTLY}"), "--print", "sysroot"])
        .context("rustc +nightly --print sysroot")?;
    let rustlib = PathBuf::from(sysroot.trim()).join("lib/rustlib");
    if rustlib.join("src/rust/library/core/Cargo.toml").exists() {
        return Ok(());
    }
    eprintln!("xtask: installing rust-src for {NIGHTLY}");
    let added = Command::new("rustup")
        .args(["component", "add", "rust-src", "--toolchain", NIGHTLY])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if added && rustlib.join("src/rust/library/core/Cargo.toml").exists() {
        return Ok(());
    }
    // Offline fallback: the same component, shipped beside the project.
    let tarball = workspace_root().join("../shared/toolchain/rust-src-nightly-2026-05-19.tar.xz");
    if !tarball.exists() {
        bail!(
            "rustup could not add rust-src and {} is missing",
            tarball.display()
        );
    }
    eprintln!("xtask: extracting {}", tarball.display());
    let dir = env::temp_dir().join("tracer-rust-src");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    run_checked(
        Command::new("tar")
            .arg("-xJf")
            .arg(&tarball)
            .arg("-C")
            .arg(&dir),
    )?;
    // The tarball is a rust-installer package: rust-src-*/rust-src/lib/rustlib/src.
    let found = walk_for(&dir, "lib/rustlib/src").context("no lib/rustlib/src in the tarball")?;
    run_checked(Command::new("cp").arg("-a").arg(&found).arg(&rustlib))?;
    if !rustlib.join("src/rust/library/core/Cargo.toml").exists() {
        bail!("rust-src is still missing under {}", rustlib.display());
    }
    Ok(())
}

/// The first path under `dir` that ends with `suffix`, depth first.
fn walk_for(dir: &Path, suffix: &str) -> Option<PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        if path.ends_with(suffix) {
            return Some(path);
        }
        if path.is_dir()
            && let Some(found) = walk_for(&path, suffix)
        {
            return Some(found);
        }
    }
    None
}

fn ensure_bpf_linker() -> anyhow::Result<()> {
    if output("bpf-linker", &["--version"]).is_some_and(|v| v.contains(BPF_LINKER_VERSION)) {
        return Ok(());
    }
    eprintln!("xtask: installing bpf-linker {BPF_LINKER_VERSION} (a few minutes)");
    run_checked(Command::new("cargo").args([
        "install",
        &format!("bpf-linker@{BPF_LINKER_VERSION}"),
        "--locked",
        "--force",
    ]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::paths::TempDir;

    #[test]
    fn walk_for_finds_a_nested_suffix() {
        let dir = TempDir::new("walk-test");
        let deep = dir.path().join("rust-src-x/rust-src/lib/rustlib/src");
        std::fs::create_dir_all(deep.join("rust")).unwrap();
        assert_eq!(walk_for(dir.path(), "lib/rustlib/src"), Some(deep));
        assert_eq!(walk_for(dir.path(), "lib/nowhere"), None);
    }
}
