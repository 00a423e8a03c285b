//! Presence sectors: which 4 KiB blocks of an extent a layer has written
//! (layers feature). Bit `i` of sector `k` is data block `k * 4064 + i`;
//! each 512 B sector carries its own CRC32C (salted with its index) in its
//! first four bytes and 508 bytes of bits.
//!
//! Why per sector: the region is rewritten in place by checkpoints, and a
//! power cut tears a write at sector boundaries, so a torn page leaves
//! every sector old or new, and both verify.

use super::{get_u32, put_u32};

pub const PRESENCE_SECTOR: usize = 512;
/// Data blocks one presence sector covers.
pub const PRESENCE_BITS_PER_SECTOR: u64 = ((PRESENCE_SECTOR - 4) * 8) as u64;
/// 64-bit words of bits in one sector (the last one is half used).
pub const PRESENCE_WORDS_PER_SECTOR: usize = (PRESENCE_SECTOR - 4).div_ceil(8);

/// Where data block `block`'s bit lives in a presence bitmap laid out
/// like the region (`PRESENCE_WORDS_PER_SECTOR` words per sector): the
/// word index and the bit's mask.
pub fn presence_bit(block: u64) -> (usize, u64) {
    let (sector, i) = (
        block / PRESENCE_BITS_PER_SECTOR,
        block % PRESENCE_BITS_PER_SECTOR,
    );
    (
        sector as usize * PRESENCE_WORDS_PER_SECTOR + (i / 64) as usize,
        1 << (i % 64),
    )
}

fn sector_crc(index: u64, bits: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&index.to_le_bytes()), bits)
}

/// Encodes sector `index` from `words` (bit `i` of the sector is bit
/// `i % 64` of `words[i / 64]`; the last word's upper half is not stored).
pub fn encode_presence_sector(index: u64, words: &[u64], out: &mut [u8]) {
    let out = &mut out[..PRESENCE_SECTOR];
    out.fill(0);
    for (i, w) in words.iter().take(PRESENCE_WORDS_PER_SECTOR).enumerate() {
        let bytes = w.to_le_bytes();
        let at = 4 + i * 8;
        let n = (PRESENCE_SECTOR - at).min(8);
        out[at..at + n].copy_from_slice(&bytes[..n]);
    }
    let crc = sector_crc(index, &out[4..]);
    put_u32(out, 0, crc);
}

/// Decodes sector `index` into its words; `None` if it fails to verify.
pub fn decode_presence_sector(index: u64, b: &[u8]) -> Option<[u64; PRESENCE_WORDS_PER_SECTOR]> {
    let b = b.get(..PRESENCE_SECTOR)?;
    if get_u32(b, 0) != sector_crc(index, &b[4..]) {
        return None;
    }
    let mut words = [0u64; PRESENCE_WORDS_PER_SECTOR];
    for (i, w) in words.iter_mut().enumerate() {
        let at = 4 + i * 8;
        let n = (PRESENCE_SECTOR - at).min(8);
        let mut bytes = [0u8; 8];
        bytes[..n].copy_from_slice(&b[at..at + n]);
        *w = u64::from_le_bytes(bytes);
    }
    Some(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presence_sectors_roundtrip_and_verify_their_place() {
        let mut words = [0u64; PRESENCE_WORDS_PER_SECTOR];
        words[0] = 0b1011;
        words[PRESENCE_WORDS_PER_SECTOR - 1] = 0xFFFF_FFFF; // the stored half
        let mut b = [0u8; PRESENCE_SECTOR];
        encode_presence_sector(9, &words, &mut b);
        assert_eq!(decode_presence_sector(9, &b), Some(words));
        assert_eq!(decode_presence_sector(8, &b), None, "misplaced sector");
        let mut flipped = b;
        flipped[100] ^= 2;
        assert_eq!(decode_presence_sector(9, &flipped), None);
        assert_eq!(decode_presence_sector(0, &[0u8; PRESENCE_SECTOR]), None);
        assert_eq!(PRESENCE_BITS_PER_SECTOR, 4064);
    }
}
