//! The running kernel's structure layouts, from its BTF
//! (`/sys/kernel/btf/vmlinux`, parsed by the `btfparse` crate): the field
//! offsets the unwinder's walk reads when it asks the kernel which mapping
//! holds an address (`tracer_common::VmaOffsets`). A kernel without BTF,
//! or whose structures lack one of the fields, gets none: the walk then
//! never asks (and says so at start).

use btfparse::{Offset, Readable, TypeInformation};
use tracer_common::VmaOffsets;

/// The kernel's BTF.
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Why the offsets could not be found.
#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    /// The BTF file cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The BTF cannot be parsed.
    #[error("cannot parse the kernel's BTF: {0}")]
    Parse(String),
    /// A structure or field is missing, or is a bit-field.
    #[error("the kernel's BTF has no byte offset for {0}")]
    Missing(&'static str),
}

/// A BTF file in memory, as `btfparse` reads one.
struct Bytes(Vec<u8>);

impl Readable for Bytes {
    fn read(&self, offset: u64, buffer: &mut [u8]) -> btfparse::Result<()> {
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        match start
            .checked_add(buffer.len())
            .and_then(|end| self.0.get(start..end))
        {
            Some(bytes) => {
                buffer.copy_from_slice(bytes);
                Ok(())
            }
            None => Err(btfparse::Error::new(
                btfparse::ErrorKind::EOF,
                "read past the end of the BTF",
            )),
        }
    }
}

/// The offsets of the running kernel ([`VMLINUX_BTF`]).
///
/// # Errors
/// [`BtfError`]: the file cannot be read or parsed, or lacks a field.
pub fn vma_offsets() -> Result<VmaOffsets, BtfError> {
    let bytes = std::fs::read(VMLINUX_BTF).map_err(|source| BtfError::Read {
        path: VMLINUX_BTF.to_string(),
        source,
    })?;
    vma_offsets_of(bytes)
}

/// The offsets in BTF `bytes`.
///
/// # Errors
/// As [`vma_offsets`].
pub fn vma_offsets_of(bytes: Vec<u8>) -> Result<VmaOffsets, BtfError> {
    let types =
        TypeInformation::new(&Bytes(bytes)).map_err(|err| BtfError::Parse(format!("{err:?}")))?;
    let field = |name: &'static str, structure: &str, path: &str| -> Result<u32, BtfError> {
        let id = types.id_of(structure).ok_or(BtfError::Missing(name))?;
        match types.offset_of(id, path) {
            Ok((_, Offset::ByteOffset(offset))) => Ok(offset),
            _ => Err(BtfError::Missing(name)),
        }
    };
    Ok(VmaOffsets {
        enabled: 1,
        vm_start: field("vm_area_struct.vm_start", "vm_area_struct", "vm_start")?,
        vm_end: field("vm_area_struct.vm_end", "vm_area_struct", "vm_end")?,
        vm_flags: field("vm_area_struct.vm_flags", "vm_area_struct", "vm_flags")?,
        vm_pgoff: field("vm_area_struct.vm_pgoff", "vm_area_struct", "vm_pgoff")?,
        vm_file: field("vm_area_struct.vm_file", "vm_area_struct", "vm_file")?,
        f_inode: field("file.f_inode", "file", "f_inode")?,
        i_ino: field("inode.i_ino", "inode", "i_ino")?,
        i_sb: field("inode.i_sb", "inode", "i_sb")?,
        s_dev: field("super_block.s_dev", "super_block", "s_dev")?,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests may unwrap (CONTRIBUTING.md).
mod tests {
    use super::*;

    #[test]
    fn bytes_that_are_not_btf_are_refused() {
        assert!(matches!(
            vma_offsets_of(b"not BTF at all".to_vec()),
            Err(BtfError::Parse(_))
        ));
        assert!(matches!(
            vma_offsets_of(Vec::new()),
            Err(BtfError::Parse(_))
        ));
    }

    #[test]
    fn the_running_kernels_offsets_are_found_where_it_has_btf() {
        // Every kernel tracerd runs on has BTF (CO-RE needs it); this
        // machine's does. The offsets are the fields' places, so the first
        // two are the VMA's bounds, one word apart.
        let offsets = vma_offsets().unwrap();
        assert_eq!(offsets.enabled, 1);
        assert_eq!(offsets.vm_end, offsets.vm_start + 8);
        assert!(offsets.vm_file > offsets.vm_start);
    }
}
