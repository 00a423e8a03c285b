//! Capacity and provisioning data: READ CAPACITY (10) / (16) parameter
//! data (SBC-4 §5.20, §5.21), GET LBA STATUS parameter data (SBC-4 §5.8)
//! and the UNMAP parameter list (SBC-4 §5.31).
//!
//! Invariants: the returned logical block address is always the LAST LBA
//! (capacity - 1), saturated to FFFF_FFFFh in READ CAPACITY (10) when it
//! does not fit; [`parse_unmap`] returns descriptors exactly as sent
//! (range checks against the capacity belong to the logical unit) and
//! never panics.

use super::{bad_param, be16, be32, be64, patch_u32, put_u32, put_u64, BlockLimits, Provisioning};
use crate::sense::{Sense, PARAMETER_LIST_LENGTH_ERROR};

/// Appends READ CAPACITY (10) parameter data (8 bytes).
pub fn read_capacity_10(blocks: u64, block_size: u32, out: &mut Vec<u8>) {
    let last = blocks.saturating_sub(1);
    // FFFF_FFFFh tells the initiator to use READ CAPACITY (16).
    put_u32(out, u32::try_from(last).unwrap_or(u32::MAX));
    put_u32(out, block_size);
}

/// Appends READ CAPACITY (16) parameter data (32 bytes): last LBA, block
/// length, no protection, one logical block per physical block, LBPME /
/// LBPRZ from `prov`, lowest aligned LBA 0.
pub fn read_capacity_16(
    blocks: u64,
    block_size: u32,
    physical_block_exponent: u8,
    prov: &Provisioning,
    out: &mut Vec<u8>,
) {
    put_u64(out, blocks.saturating_sub(1));
    put_u32(out, block_size);
    out.push(0); // RC BASIS, P_TYPE, PROT_EN
                 // P_I_EXPONENT (0), LOGICAL BLOCKS PER PHYSICAL BLOCK EXPONENT
    out.push(physical_block_exponent & 0x0f);
    let mut b14 = 0u8;
    if prov.thin {
        b14 |= 0x80; // LBPME
    }
    if prov.lbprz() {
        b14 |= 0x40; // LBPRZ
    }
    out.push(b14);
    out.push(0); // LOWEST ALIGNED LOGICAL BLOCK ADDRESS
    out.extend_from_slice(&[0u8; 16]);
}

/// Provisioning status of an LBA status descriptor (SBC-4 table
/// "PROVISIONING STATUS field").
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LbaStatus {
    Mapped = 0,
    Deallocated = 1,
    Anchored = 2,
}

/// Appends GET LBA STATUS parameter data: an 8-byte header then one
/// 16-byte LBA status descriptor per `(lba, blocks, status)`.
pub fn get_lba_status(descriptors: &[(u64, u32, LbaStatus)], out: &mut Vec<u8>) {
    let start = out.len();
    put_u32(out, 0); // PARAMETER DATA LENGTH, patched below
    put_u32(out, 0);
    for &(lba, blocks, status) in descriptors {
        put_u64(out, lba);
        put_u32(out, blocks);
        out.push(status as u8);
        out.extend_from_slice(&[0, 0, 0]);
    }
    let len = out.len() - start - 4;
    patch_u32(out, start, u32::try_from(len).unwrap_or(u32::MAX));
}

/// Size of the UNMAP parameter list header and of one block descriptor.
const UNMAP_HEADER: usize = 8;
const UNMAP_DESCRIPTOR: usize = 16;

/// Parses an UNMAP parameter list (the data-out, as long as the CDB's
/// PARAMETER LIST LENGTH) into `(lba, blocks)` ranges in the order sent.
///
/// - An empty list is no work, not an error; a list shorter than its
///   8-byte header is PARAMETER LIST LENGTH ERROR.
/// - Descriptors announced by UNMAP BLOCK DESCRIPTOR DATA LENGTH but cut
///   off by the parameter list length are PARAMETER LIST LENGTH ERROR; a
///   trailing partial descriptor (length not a multiple of 16) is ignored
///   as SBC-4 says. UNMAP DATA LENGTH is not checked: it is redundant and
///   initiators are not consistent about it.
/// - More descriptors than MAXIMUM UNMAP BLOCK DESCRIPTOR COUNT, or more
///   blocks in total than MAXIMUM UNMAP LBA COUNT (`u32::MAX` = unlimited),
///   is INVALID FIELD IN PARAMETER LIST.
/// - Descriptors with zero blocks are kept (the logical unit still checks
///   their LBA against the capacity).
pub fn parse_unmap(params: &[u8], limits: &BlockLimits) -> Result<Vec<(u64, u32)>, Sense> {
    if params.is_empty() {
        return Ok(Vec::new());
    }
    let bd_len = be16(params, 2).ok_or(PARAMETER_LIST_LENGTH_ERROR)?;
    if params.len() < UNMAP_HEADER {
        return Err(PARAMETER_LIST_LENGTH_ERROR);
    }
    let bd_len = usize::from(bd_len);
    if UNMAP_HEADER + bd_len > params.len() {
        return Err(PARAMETER_LIST_LENGTH_ERROR);
    }
    let count = bd_len / UNMAP_DESCRIPTOR;
    if limits.max_unmap_descriptors != u32::MAX
        && u32::try_from(count).map_or(true, |c| c > limits.max_unmap_descriptors)
    {
        return Err(bad_param(2, Some(7)));
    }
    let mut ranges = Vec::with_capacity(count);
    let mut total: u64 = 0;
    for i in 0..count {
        let at = UNMAP_HEADER + i * UNMAP_DESCRIPTOR;
        let (Some(lba), Some(blocks)) = (be64(params, at), be32(params, at + 8)) else {
            return Err(PARAMETER_LIST_LENGTH_ERROR);
        };
        total = total.saturating_add(u64::from(blocks));
        if limits.max_unmap_blocks != u32::MAX && total > u64::from(limits.max_unmap_blocks) {
            return Err(bad_param(at + 8, Some(7)));
        }
        ranges.push((lba, blocks));
    }
    Ok(ranges)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn limits(max_blocks: u32, max_desc: u32) -> BlockLimits {
        BlockLimits {
            block_size: 512,
            max_transfer_blocks: 0,
            optimal_transfer_blocks: 0,
            max_unmap_blocks: max_blocks,
            max_unmap_descriptors: max_desc,
            unmap_granularity_blocks: 0,
            max_write_same_blocks: 0,
            max_compare_and_write_blocks: 1,
            physical_block_exponent: 0,
        }
    }

    #[test]
    fn capacity_10() {
        let mut out = Vec::new();
        read_capacity_10(0x1000, 512, &mut out);
        assert_eq!(out, [0, 0, 0x0f, 0xff, 0, 0, 0x02, 0x00]);
        out.clear();
        read_capacity_10(0x1_0000_0000, 4096, &mut out);
        assert_eq!(out, [0xff, 0xff, 0xff, 0xff, 0, 0, 0x10, 0x00]);
        out.clear();
        // Exactly 2^32 - 1 blocks: last LBA FFFF_FFFEh still fits.
        read_capacity_10(0xffff_ffff, 512, &mut out);
        assert_eq!(&out[..4], &[0xff, 0xff, 0xff, 0xfe]);
    }

    #[test]
    fn capacity_16() {
        let mut out = Vec::new();
        let thin = Provisioning {
            thin: true,
            unmap: true,
            write_same_unmap: true,
            zeroes_after_unmap: true,
        };
        read_capacity_16(0x1_0000_0000, 512, 3, &thin, &mut out);
        let mut want = vec![
            0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0x02, 0x00, 0, 0x03, 0xc0, 0,
        ];
        want.resize(32, 0);
        assert_eq!(out, want);
        out.clear();
        read_capacity_16(8, 4096, 0, &Provisioning::default(), &mut out);
        assert_eq!(
            &out[..16],
            &[0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0x10, 0, 0, 0, 0, 0]
        );
    }

    #[test]
    fn lba_status() {
        let mut out = Vec::new();
        get_lba_status(
            &[
                (0x10, 8, LbaStatus::Mapped),
                (0x18, 0x100, LbaStatus::Deallocated),
            ],
            &mut out,
        );
        assert_eq!(
            out,
            [
                0, 0, 0, 36, 0, 0, 0, 0, // header
                0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 8, 0, 0, 0, 0, // mapped
                0, 0, 0, 0, 0, 0, 0, 0x18, 0, 0, 1, 0, 1, 0, 0, 0, // deallocated
            ]
        );
    }

    fn unmap_list(descs: &[(u64, u32)]) -> Vec<u8> {
        let bd = (descs.len() * 16) as u16;
        let mut b = Vec::new();
        b.extend_from_slice(&(bd + 6).to_be_bytes());
        b.extend_from_slice(&bd.to_be_bytes());
        b.extend_from_slice(&[0; 4]);
        for &(lba, n) in descs {
            b.extend_from_slice(&lba.to_be_bytes());
            b.extend_from_slice(&n.to_be_bytes());
            b.extend_from_slice(&[0; 4]);
        }
        b
    }

    #[test]
    fn unmap_ok() {
        let l = limits(100, 4);
        assert_eq!(parse_unmap(&[], &l), Ok(vec![]));
        assert_eq!(parse_unmap(&unmap_list(&[]), &l), Ok(vec![]));
        assert_eq!(
            parse_unmap(&unmap_list(&[(5, 0), (1 << 40, 100)]), &l),
            Ok(vec![(5, 0), (1 << 40, 100)])
        );
        // A trailing partial descriptor is ignored.
        let mut b = unmap_list(&[(1, 1)]);
        b[3] = 20;
        b.extend_from_slice(&[0; 4]);
        assert_eq!(parse_unmap(&b, &l), Ok(vec![(1, 1)]));
        // Unlimited.
        let big = unmap_list(&[(0, u32::MAX), (0, u32::MAX)]);
        assert_eq!(
            parse_unmap(&big, &limits(u32::MAX, u32::MAX))
                .unwrap()
                .len(),
            2
        );
    }

    #[test]
    fn unmap_errors() {
        let l = limits(100, 2);
        assert_eq!(
            parse_unmap(&[0, 6, 0], &l),
            Err(PARAMETER_LIST_LENGTH_ERROR)
        );
        assert_eq!(
            parse_unmap(&[0, 6, 0, 0, 0, 0, 0], &l),
            Err(PARAMETER_LIST_LENGTH_ERROR)
        );
        // Descriptor data length beyond the parameter list.
        let mut b = unmap_list(&[(1, 1)]);
        b[3] = 32;
        assert_eq!(parse_unmap(&b, &l), Err(PARAMETER_LIST_LENGTH_ERROR));
        // Too many descriptors.
        let b = unmap_list(&[(1, 1), (2, 1), (3, 1)]);
        assert_eq!(
            parse_unmap(&b, &l),
            Err(Sense::invalid_field_in_parameter_list(2, Some(7)))
        );
        // Too many blocks in total: the second descriptor's count is blamed.
        let b = unmap_list(&[(1, 60), (100, 41)]);
        assert_eq!(
            parse_unmap(&b, &l),
            Err(Sense::invalid_field_in_parameter_list(32, Some(7)))
        );
    }

    proptest! {
        #[test]
        fn unmap_never_panics(b in prop::collection::vec(any::<u8>(), 0..128),
                              max_blocks: u32, max_desc: u32) {
            let _ = parse_unmap(&b, &limits(max_blocks, max_desc));
        }

        #[test]
        fn unmap_round_trip(descs in prop::collection::vec((any::<u64>(), 0u32..1000), 0..8)) {
            let b = unmap_list(&descs);
            prop_assert_eq!(parse_unmap(&b, &limits(u32::MAX, u32::MAX)), Ok(descs));
        }
    }
}
