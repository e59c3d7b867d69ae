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
    aya_build::build_ebpf([ebpf_package], Toolchain::default())
}
