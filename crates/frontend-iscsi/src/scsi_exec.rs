//! The commands that are neither a plain read nor a plain write, run as
//! jobs on the offload pool with the volume's blocking calls: WRITE AND
//! VERIFY, VERIFY, WRITE SAME, UNMAP, SYNCHRONIZE CACHE, COMPARE AND WRITE
//! and GET LBA STATUS, each carrying out the logical unit's plan
//! (`basalt_scsi_wire::lu::Plan`) and answering with its response.
//!
//! Invariants:
//! - A response is GOOD only after everything the plan asked for
//!   completed, durably where the plan says FUA (WRITE AND VERIFY always).
//! - COMPARE AND WRITE holds the unit's compare-and-write lock from its
//!   read to its write, so two of them never interleave.
//! - I/O failures become sense data (`lu::io_failure_sense`): no space is
//!   DATA PROTECT / SPACE ALLOCATION FAILED, a device error a MEDIUM
//!   ERROR, anything else a HARDWARE ERROR.

use crate::units::Unit;
use crate::LOGICAL_BLOCK_SIZE;
use basalt_scsi_wire::data::{get_lba_status, LbaStatus};
use basalt_scsi_wire::lu::{self, IoFailure, Plan, Response};
use basalt_scsi_wire::sense;
use basalt_store::{AlignedBuf, IoError};
use basalt_volume::VolumeHandle;
use std::sync::Arc;

/// Bytes WRITE SAME writes per call (its block repeated).
const WRITE_SAME_CHUNK: usize = 1 << 20;
/// Most blocks one GET LBA STATUS reports on (its descriptors then end
/// there; the initiator asks again from where they end).
const LBA_STATUS_SPAN: u64 = 1 << 18;

/// How an I/O error reads to SCSI.
pub(crate) fn io_failure(err: &IoError, write: bool) -> IoFailure {
    match err {
        IoError::NoSpace => IoFailure::OutOfSpace,
        IoError::Io(_) | IoError::Corrupt { .. } if write => IoFailure::Write { lba: None },
        IoError::Io(_) | IoError::Corrupt { .. } => IoFailure::Read { lba: None },
        _ => IoFailure::Other,
    }
}

fn failed(err: &IoError, write: bool) -> Response {
    tracing::warn!("iSCSI command failed: {err}");
    Response::check(lu::io_failure_sense(io_failure(err, write)))
}

/// Runs one plan on the offload pool; `data` is its Data-Out.
pub(crate) fn run(
    volume: &VolumeHandle,
    unit: &Arc<Unit>,
    plan: Plan,
    data: Option<AlignedBuf>,
) -> Response {
    let block = LOGICAL_BLOCK_SIZE;
    let data = data.as_deref().unwrap_or(&[]);
    match plan {
        Plan::WriteAndVerify {
            lba,
            blocks,
            compare,
            residual,
        } => {
            let offset = lba * block;
            if let Err(err) = volume.write(offset, data, true) {
                return failed(&err, true);
            }
            if compare {
                let mut medium = vec![0u8; data.len()];
                if let Err(err) = volume.read(offset, &mut medium) {
                    return failed(&err, false);
                }
                if let Some(sense) = lu::miscompare(data, &medium) {
                    return Response::check(sense);
                }
            }
            let _ = blocks;
            Response::good().with_residual(residual)
        }
        Plan::Verify {
            lba,
            blocks,
            byte_check,
            residual,
        } => {
            let mut medium = vec![0u8; blocks as usize * block as usize];
            if let Err(err) = volume.read(lba * block, &mut medium) {
                return failed(&err, false);
            }
            match lu::verify_data(byte_check, data, &medium, block as u32) {
                Ok(()) => Response::good().with_residual(residual),
                Err(sense) => Response::check(sense),
            }
        }
        Plan::WriteSame {
            lba,
            blocks,
            unmap,
            ndob,
            fua,
            residual,
        } => {
            let pattern = (!ndob).then_some(data);
            let provisioning = unit.config().provisioning;
            let (offset, len) = (lba * block, blocks * block);
            let zeroes = pattern.is_none_or(|b| b.iter().all(|&x| x == 0));
            let done = if lu::write_same_may_deallocate(&provisioning, unmap, pattern) {
                volume.write_zeroes(offset, len, true, fua)
            } else if zeroes {
                volume.write_zeroes(offset, len, false, fua)
            } else {
                write_repeated(volume, offset, len, data, fua)
            };
            match done {
                Ok(()) => Response::good().with_residual(residual),
                Err(err) => failed(&err, true),
            }
        }
        Plan::Unmap { ranges, residual } => {
            for (lba, blocks) in ranges {
                if let Err(err) = volume.trim(lba * block, u64::from(blocks) * block, false) {
                    return failed(&err, true);
                }
            }
            Response::good().with_residual(residual)
        }
        Plan::Flush { residual, .. } => match volume.flush() {
            Ok(()) => Response::good().with_residual(residual),
            Err(err) => failed(&err, true),
        },
        Plan::CompareAndWrite { lba, blocks, fua } => {
            // Atomic with every write on a replicated volume (from any
            // node); on a single-node one, among compare-and-writes.
            let _one_at_a_time = unit.compare_and_write.lock();
            let offset = lba * block;
            let len = blocks as usize * block as usize;
            let (Some(verify), Some(write)) = (data.get(..len), data.get(len..2 * len)) else {
                return Response::check(sense::INTERNAL_TARGET_FAILURE);
            };
            match volume.compare_and_write(offset, verify, write, fua) {
                Ok(None) => Response::good(),
                // `medium` differs from `verify`: the sense names where.
                Ok(Some(medium)) => Response::check(
                    lu::miscompare(verify, &medium)
                        .unwrap_or(sense::MISCOMPARE_DURING_VERIFY.with_information(0)),
                ),
                Err(err) => failed(&err, true),
            }
        }
        Plan::LbaStatus {
            lba,
            alloc_len,
            expected_length,
        } => {
            let blocks = volume.size() / block;
            let span = blocks.saturating_sub(lba).min(LBA_STATUS_SPAN);
            let runs = match volume.mapping(lba * block, span * block) {
                Ok(runs) => runs,
                Err(err) => return failed(&err, false),
            };
            let mut descriptors = Vec::with_capacity(runs.len());
            let mut at = lba;
            for run in runs {
                let n = run.len / block;
                let status = match run.allocated {
                    true => LbaStatus::Mapped,
                    false => LbaStatus::Deallocated,
                };
                // Descriptors count at most u32::MAX blocks each.
                let mut left = n;
                while left > 0 {
                    let part = left.min(u64::from(u32::MAX));
                    descriptors.push((at, part as u32, status));
                    at += part;
                    left -= part;
                }
            }
            let mut out = Vec::new();
            get_lba_status(&descriptors, &mut out);
            lu::finish_data_in(out, alloc_len, expected_length)
        }
        // Reads, writes and answers never come here.
        _ => Response::check(sense::INTERNAL_TARGET_FAILURE),
    }
}

/// Writes `len` bytes from `offset` as `block` repeated.
fn write_repeated(
    volume: &VolumeHandle,
    offset: u64,
    len: u64,
    block: &[u8],
    fua: bool,
) -> Result<(), IoError> {
    if block.is_empty() {
        return Ok(());
    }
    let chunk: Vec<u8> = block
        .iter()
        .copied()
        .cycle()
        .take(WRITE_SAME_CHUNK.min(len as usize))
        .collect();
    let mut done = 0;
    while done < len {
        let n = (len - done).min(chunk.len() as u64) as usize;
        volume.write(offset + done, &chunk[..n], fua)?;
        done += n as u64;
    }
    Ok(())
}
