//! The eBPF object before loading: an aligned copy whose `STACKS` value
//! size fits the configured nframe, and the sampling's exponential table.
use object::{Object as _, ObjectSection as _, ObjectSymbol as _};
use tracer_common::EXP_TABLE_LEN;

use super::CaptureError;

/// An 8-byte aligned copy of an ELF object (object parsing needs alignment).
pub struct AlignedObject(Vec<u64>, usize);

impl AlignedObject {
    /// The object's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: the Vec holds at least self.1 initialised bytes (its length
        // in u64s is rounded up), and u8 has no alignment requirement.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr().cast::<u8>(), self.1) }
    }

    fn as_bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in as_bytes, and we hold the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr().cast::<u8>(), self.1) }
    }
}

/// Returns a copy of the eBPF object with the `value_size` of the legacy map
/// definition `map` (a `struct bpf_map_def` in section `maps`) changed from
/// `expected` to `value_size` bytes. STACKS is compiled for 64 frames; a
/// value of `1 + nframe` words keeps each stored stack as small as nframe
/// allows.
///
/// # Errors
/// [`CaptureError::Load`] if the object has no such map definition, or its
/// value size is not `expected`.
pub fn patch_map_value_size(
    object: &[u8],
    map: &str,
    expected: u32,
    value_size: u32,
) -> Result<AlignedObject, CaptureError> {
    let mut copy = AlignedObject(vec![0u64; object.len().div_ceil(8)], object.len());
    copy.as_bytes_mut().copy_from_slice(object);
    let position = {
        let file = object::File::parse(copy.as_bytes())
            .map_err(|e| CaptureError::Load(format!("parsing the eBPF object: {e}")))?;
        let symbol = file
            .symbols()
            .find(|s| s.name() == Ok(map))
            .ok_or_else(|| CaptureError::Load(format!("no symbol {map} in the eBPF object")))?;
        let section = symbol
            .section_index()
            .and_then(|i| file.section_by_index(i).ok())
            .ok_or_else(|| CaptureError::Load(format!("symbol {map} has no section")))?;
        let (start, _) = section
            .file_range()
            .ok_or_else(|| CaptureError::Load(format!("section of {map} has no data")))?;
        // struct bpf_map_def { u32 type, key_size, value_size, ... }
        usize::try_from(start + symbol.address() + 8)
            .map_err(|_| CaptureError::Load(format!("map {map} lies beyond the object")))?
    };
    let field = copy
        .as_bytes_mut()
        .get_mut(position..position + 4)
        .ok_or_else(|| CaptureError::Load(format!("map {map} lies beyond the object")))?;
    let old = u32::from_le_bytes([field[0], field[1], field[2], field[3]]);
    if old != expected {
        return Err(CaptureError::Load(format!(
            "map {map} has value size {old}, expected {expected}"
        )));
    }
    field.copy_from_slice(&value_size.to_le_bytes());
    Ok(copy)
}

/// `-ln((i + 0.5) / n)` for i in 0..n, in 16.16 fixed point: exponential
/// variates of mean 1 for the kernel's sampling countdown.
pub fn exponential_table() -> Vec<u32> {
    let n = f64::from(EXP_TABLE_LEN);
    (0..EXP_TABLE_LEN)
        .map(|i| (-((f64::from(i) + 0.5) / n).ln() * 65536.0).round() as u32)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exponential_table_has_mean_one() {
        let table = exponential_table();
        assert_eq!(table.len(), EXP_TABLE_LEN as usize);
        let mean = table.iter().map(|&v| f64::from(v) / 65536.0).sum::<f64>() / table.len() as f64;
        assert!((mean - 1.0).abs() < 0.002, "mean {mean}");
        assert!(table.windows(2).all(|w| w[0] > w[1]));
    }
}
