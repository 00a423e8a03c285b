//! Checksum pages: the CRC32C of every 4 KiB data block, 1023 to a 4 KiB
//! page, the page's own CRC32C (salted with its index) in its last four
//! bytes. Block `b` of the data region is entry `b % 1023` of page
//! `b / 1023`.
//!
//! A page is rewritten in place (by cooling, docs/format.md), so a power
//! cut can tear it; a torn or corrupted page fails its checksum and the
//! engine recomputes the blocks it covers from their data. That is safe
//! because a page is only ever written with values that are durable facts
//! about durable data, or values of extents the journal marks hot (which
//! are recomputed after a crash anyway).

use super::{get_u32, put_u32, PAGE};

/// Data-block checksums held by one page.
pub const CHECKSUMS_PER_PAGE: usize = (PAGE as usize - 4) / 4;

/// "Not known": the block's checksum is taken from its data on its next
/// read (left by overlapping writes, whose outcome is undefined, and by
/// failed writes). A block whose real CRC32C equals this value is simply
/// never verified.
pub const CHECKSUM_UNKNOWN: u32 = u32::MAX;

const PAGE_CRC_AT: usize = PAGE as usize - 4;

fn page_crc(index: u64, b: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&index.to_le_bytes()), &b[..PAGE_CRC_AT])
}

/// Encodes checksum page `index` holding `values` (at most 1023; the rest
/// of the page is `CHECKSUM_UNKNOWN`).
pub fn encode_checksum_page(index: u64, values: &[u32], out: &mut [u8]) {
    let out = &mut out[..PAGE as usize];
    for i in 0..CHECKSUMS_PER_PAGE {
        put_u32(
            out,
            i * 4,
            values.get(i).copied().unwrap_or(CHECKSUM_UNKNOWN),
        );
    }
    let crc = page_crc(index, out);
    put_u32(out, PAGE_CRC_AT, crc);
}

/// The 1023 values of checksum page `index`, or `None` if it fails to
/// verify (torn, corrupted, or written for another index). Never panics.
pub fn decode_checksum_page(index: u64, b: &[u8]) -> Option<Vec<u32>> {
    let b = b.get(..PAGE as usize)?;
    if get_u32(b, PAGE_CRC_AT) != page_crc(index, b) {
        return None;
    }
    Some((0..CHECKSUMS_PER_PAGE).map(|i| get_u32(b, i * 4)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_roundtrip_and_verify_their_place() {
        let values: Vec<u32> = (0..CHECKSUMS_PER_PAGE as u32).map(|i| i * 7).collect();
        let mut page = vec![0u8; PAGE as usize];
        encode_checksum_page(5, &values, &mut page);
        assert_eq!(decode_checksum_page(5, &page), Some(values));
        assert_eq!(decode_checksum_page(6, &page), None);
        let mut torn = page.clone();
        torn[700] ^= 0x10;
        assert_eq!(decode_checksum_page(5, &torn), None);
        assert_eq!(decode_checksum_page(0, &[0u8; 4096]), None);
        assert_eq!(decode_checksum_page(0, &[0u8; 10]), None);
        encode_checksum_page(1, &[3], &mut page);
        let short = decode_checksum_page(1, &page).unwrap();
        assert_eq!((short[0], short[1]), (3, CHECKSUM_UNKNOWN));
    }
}
