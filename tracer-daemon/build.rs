//! Builds the eBPF programs of `tracer-ebpf` with aya-build (nightly +
//! bpf-linker) and puts the object at `$OUT_DIR/tracer`.
//!
//! `AYA_BUILD_SKIP=1` skips it for jobs that need no eBPF (the model's unit
//! tests, docs): an empty object is written and loading it fails at run time
//! with a clear error.
use anyhow::{Context as _, anyhow};
use aya_build::Toolchain;

fn main() -> anyhow::Result<()> {
    println!("cargo:rerun-if-env-changed=AYA_BUILD_SKIP");
    if std::env::var_os("AYA_BUILD_SKIP").is_some_and(|v| v != "0") {
        let out = std::env::var_os("OUT_DIR").context("OUT_DIR")?;
        std::fs::write(std::path::Path::new(&out).join("tracer"), b"")?;
        return Ok(());
    }
    let cargo_metadata::Metadata { packages, .. } = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("MetadataCommand::exec")?;
    let ebpf_package = packages
        .into_iter()
        .find(|cargo_metadata::Package { name, .. }| name.as_str() == "tracer-ebpf")
        .ok_or_else(|| anyhow!("tracer-ebpf package not found"))?;
    let cargo_metadata::Package {
        name,
        manifest_path,
        ..
    } = ebpf_package;
    let ebpf_package = aya_build::Package {
        name: name.as_str(),
        root_dir: manifest_path
            .parent()
            .ok_or_else(|| anyhow!("no parent for {manifest_path}"))?
            .as_str(),
        ..Default::default()
    };
    build_shared(ebpf_package)
}

/// Builds the eBPF object once for every profile of the host build: aya-build
/// builds it in release, for the BPF target, in a target directory under
/// `OUT_DIR`, and each profile (dev for the no-root tests, release for
/// tracerd) has an `OUT_DIR` of its own, so a fresh `cargo xtask test`
/// built the same object twice (about a minute each). Here aya-build's
/// `OUT_DIR` is `TARGET/ebpf`, shared, under a lock (two profiles may build
/// at once), and the object is copied to this profile's `OUT_DIR`.
fn build_shared(package: aya_build::Package<'_>) -> anyhow::Result<()> {
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").context("OUT_DIR")?);
    // OUT_DIR is TARGET/PROFILE/build/tracer-daemon-HASH/out.
    let shared = out
        .ancestors()
        .nth(4)
        .ok_or_else(|| anyhow!("no target directory above {}", out.display()))?
        .join("ebpf");
    std::fs::create_dir_all(&shared)?;
    let lock = std::fs::File::create(shared.join(".lock"))?;
    lock.lock()?;
    // SAFETY: the build script is one thread; aya-build reads OUT_DIR only.
    unsafe { std::env::set_var("OUT_DIR", &shared) };
    let built = aya_build::build_ebpf([package], Toolchain::default());
    // SAFETY: as above.
    unsafe { std::env::set_var("OUT_DIR", &out) };
    built?;
    std::fs::copy(shared.join("tracer"), out.join("tracer"))
        .with_context(|| format!("copying the eBPF object from {}", shared.display()))?;
    Ok(())
}
