//! Big-endian field access on header bytes, shared by every PDU parser and
//! encoder. Reads outside the slice yield zero and writes outside it are
//! dropped, so no offset can panic; callers size their buffers first (a
//! BHS is always exactly [`super::BHS_LEN`] bytes).

pub(crate) fn u8_at(b: &[u8], at: usize) -> u8 {
    b.get(at).copied().unwrap_or(0)
}

pub(crate) fn array<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    if let Some(src) = at.checked_add(N).and_then(|end| b.get(at..end)) {
        out.copy_from_slice(src);
    }
    out
}

pub(crate) fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes(array(b, at))
}

/// The 24-bit DataSegmentLength field.
pub(crate) fn be24(b: &[u8], at: usize) -> u32 {
    let [x, y, z] = array::<3>(b, at);
    u32::from_be_bytes([0, x, y, z])
}

pub(crate) fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(array(b, at))
}

pub(crate) fn be64(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(array(b, at))
}

pub(crate) fn put(b: &mut [u8], at: usize, src: &[u8]) {
    if let Some(dst) = at.checked_add(src.len()).and_then(|end| b.get_mut(at..end)) {
        dst.copy_from_slice(src);
    }
}

pub(crate) fn put8(b: &mut [u8], at: usize, v: u8) {
    if let Some(dst) = b.get_mut(at) {
        *dst = v;
    }
}

pub(crate) fn put16(b: &mut [u8], at: usize, v: u16) {
    put(b, at, &v.to_be_bytes());
}

/// Writes the low 24 bits of `v` (callers check that it fits).
pub(crate) fn put24(b: &mut [u8], at: usize, v: u32) {
    let [_, x, y, z] = v.to_be_bytes();
    put(b, at, &[x, y, z]);
}

pub(crate) fn put32(b: &mut [u8], at: usize, v: u32) {
    put(b, at, &v.to_be_bytes());
}

pub(crate) fn put64(b: &mut [u8], at: usize, v: u64) {
    put(b, at, &v.to_be_bytes());
}
