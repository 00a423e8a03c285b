//! Helpers the caller uses while carrying out a [`super::Plan`]: sizing
//! data-in, comparing data for VERIFY / WRITE AND VERIFY / COMPARE AND
//! WRITE, deciding whether WRITE SAME may deallocate, and turning I/O
//! failures into sense data.
//!
//! Invariants: comparisons never index out of bounds (a length mismatch
//! is a miscompare at the first missing byte); [`finish_data_in`] never
//! returns more than the allocation length or the expected length.

use super::{Residual, Response};
use crate::cdb::ByteCheck;
use crate::data::Provisioning;
use crate::sense::{
    Sense, INTERNAL_TARGET_FAILURE, MISCOMPARE_DURING_VERIFY,
    SPACE_ALLOCATION_FAILED_WRITE_PROTECT, UNRECOVERED_READ_ERROR, WRITE_ERROR,
};

/// Cuts the full data-in to the allocation length (SPDTL is what remains)
/// and to the expected data-in length, with the residual between them.
pub fn finish_data_in(mut data: Vec<u8>, alloc_len: u32, expected_length: u32) -> Response {
    data.truncate(usize::try_from(alloc_len).unwrap_or(usize::MAX));
    let residual = Residual::of(expected_length, data.len() as u64);
    data.truncate(usize::try_from(expected_length).unwrap_or(usize::MAX));
    Response {
        data_in: data,
        ..Response::good().with_residual(residual)
    }
}

/// Answers [`super::Plan::ReportLuns`] with the LUNs the I_T nexus may
/// access. SELECT REPORT 01h asks for well known LUs only, of which this
/// target has none.
pub fn report_luns(
    luns: &[u64],
    select_report: u8,
    alloc_len: u32,
    expected_length: u32,
) -> Response {
    let mut data = Vec::new();
    let luns = if select_report == 0x01 { &[][..] } else { luns };
    crate::data::report_luns(luns, &mut data);
    finish_data_in(data, alloc_len, expected_length)
}

/// MISCOMPARE DURING VERIFY OPERATION with the INFORMATION field set to the
/// offset of the first byte where `expected` and `actual` differ, or `None`
/// when they are equal.
pub fn miscompare(expected: &[u8], actual: &[u8]) -> Option<Sense> {
    let offset = match expected.iter().zip(actual).position(|(a, b)| a != b) {
        Some(i) => i,
        None if expected.len() == actual.len() => return None,
        None => expected.len().min(actual.len()),
    };
    Some(MISCOMPARE_DURING_VERIFY.with_information(offset as u64))
}

/// Compares VERIFY data-out with the blocks read from the medium.
/// [`ByteCheck::OneBlock`] compares the single data-out block with each
/// block; the INFORMATION offset then counts into the data-out as if the
/// block had been repeated (SBC-4: the device server duplicates it).
pub fn verify_data(
    byte_check: ByteCheck,
    data_out: &[u8],
    medium: &[u8],
    block_size: u32,
) -> Result<(), Sense> {
    match byte_check {
        ByteCheck::Medium => Ok(()),
        ByteCheck::DataOut => miscompare(data_out, medium).map_or(Ok(()), Err),
        ByteCheck::OneBlock => {
            let bs = usize::try_from(block_size).unwrap_or(usize::MAX).max(1);
            for (i, block) in medium.chunks(bs).enumerate() {
                if let Some(sense) = miscompare(data_out, block) {
                    let offset = sense.information.unwrap_or(0);
                    let base = (i as u64).saturating_mul(bs as u64);
                    return Err(sense.with_information(base.saturating_add(offset)));
                }
            }
            Ok(())
        }
    }
}

/// Whether WRITE SAME with the UNMAP bit may deallocate instead of
/// writing: the block written must read back as it would after
/// deallocation, which with LBPRZ means all zeroes (`block` is `None` for
/// NDOB, which writes zeroes). Without LBPRZ deallocated blocks read back
/// unspecified, so the blocks are written.
pub fn write_same_may_deallocate(prov: &Provisioning, unmap: bool, block: Option<&[u8]>) -> bool {
    unmap
        && prov.write_same_unmap_supported()
        && prov.lbprz()
        && block.is_none_or(|b| b.iter().all(|&x| x == 0))
}

/// How an I/O the plan asked for failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoFailure {
    /// Thin provisioning could not allocate space for a write.
    OutOfSpace,
    /// The medium could not be read; `lba` is the first block that failed
    /// if known.
    Read { lba: Option<u64> },
    /// The medium could not be written.
    Write { lba: Option<u64> },
    /// Anything else (lost replicas, internal errors).
    Other,
}

/// The sense data a failed I/O is reported with: DATA PROTECT / SPACE
/// ALLOCATION FAILED WRITE PROTECT (SBC-4 §4.7.3.6), MEDIUM ERROR /
/// UNRECOVERED READ ERROR or WRITE ERROR with the failing LBA, or
/// HARDWARE ERROR / INTERNAL TARGET FAILURE.
pub fn io_failure_sense(failure: IoFailure) -> Sense {
    match failure {
        IoFailure::OutOfSpace => SPACE_ALLOCATION_FAILED_WRITE_PROTECT,
        IoFailure::Read { lba } => with_lba(UNRECOVERED_READ_ERROR, lba),
        IoFailure::Write { lba } => with_lba(WRITE_ERROR, lba),
        IoFailure::Other => INTERNAL_TARGET_FAILURE,
    }
}

fn with_lba(sense: Sense, lba: Option<u64>) -> Sense {
    match lba {
        Some(lba) => sense.with_information(lba),
        None => sense,
    }
}
