//! Compiling one ELF file's call frame information into a [`FileTable`].
//! (Being written: see issue 11.)
use super::FileTable;

/// Why a file's unwind information could not be compiled.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// The bytes are not an ELF file this tracerd reads.
    #[error("not a readable ELF file: {0}")]
    Elf(String),
}

/// Compiles the call frame information of the ELF file `elf` (its whole
/// bytes) into rows keyed by file offset.
///
/// # Errors
/// [`CompileError`] when the file cannot be read.
pub fn compile(elf: &[u8]) -> Result<FileTable, CompileError> {
    if elf.get(..4) != Some(b"\x7fELF") {
        return Err(CompileError::Elf("no ELF magic".into()));
    }
    Ok(FileTable::default())
}
