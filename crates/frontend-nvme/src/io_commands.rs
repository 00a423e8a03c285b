//! The NVM I/O commands of a connected I/O queue, whoever runs them (a
//! queue thread, or an event loop and its offload pool): the checks a
//! Read or Write must pass before it reaches the volume, the commands that
//! are not data transfers (Flush, Write Zeroes, Dataset Management), and
//! the completion status of a failed store operation.

use crate::{BLOCK_SIZE, NSID};
use basalt_nvme_wire::command::{io_opcode, parse_dsm_ranges, IoCommand, ReadWrite};
use basalt_nvme_wire::{parse_command, Command, QueueType, SglKind, Sqe, Status};
use basalt_store::IoError;
use basalt_volume::VolumeHandle;
use std::net::SocketAddr;

/// Rejections of a write that do not need its data: checked before its
/// R2T, so a host is not asked for data that would be refused.
pub(crate) fn precheck_write(sqe: &Sqe, qid: u16, volume_blocks: Option<u64>) -> Option<Status> {
    if qid == 0 || sqe.opcode != io_opcode::WRITE {
        return None;
    }
    let blocks = volume_blocks?;
    if let Command::Io(IoCommand::Write(rw)) = parse_command(sqe, QueueType::Io) {
        if rw.nsid != NSID {
            return Some(Status::INVALID_NAMESPACE.with_dnr());
        }
        if rw.end_lba().is_none_or(|e| e > blocks) {
            return Some(Status::LBA_OUT_OF_RANGE.with_dnr());
        }
    }
    None
}

/// A Read or Write that may go to the volume: its byte offset and length,
/// or the status that refuses it. `data_len`: the write data received.
pub(crate) fn check_transfer(
    rw: &ReadWrite,
    sqe: &Sqe,
    write: bool,
    data_len: usize,
    volume_size: u64,
    max_transfer: u32,
) -> Result<(u64, usize), Status> {
    if rw.nsid != NSID {
        return Err(Status::INVALID_NAMESPACE.with_dnr());
    }
    if rw.end_lba().is_none_or(|e| e > volume_size / BLOCK_SIZE) {
        return Err(Status::LBA_OUT_OF_RANGE.with_dnr());
    }
    let bytes = u64::from(rw.blocks) * BLOCK_SIZE;
    if bytes > u64::from(max_transfer) {
        return Err(Status::INVALID_FIELD.with_dnr());
    }
    let sgl = sqe.sgl();
    if u64::from(sgl.length) != bytes {
        return Err(Status::DATA_SGL_LENGTH_INVALID.with_dnr());
    }
    if !write && sgl.kind() != SglKind::Transport {
        return Err(Status::SGL_DESCRIPTOR_TYPE_INVALID.with_dnr());
    }
    if write && data_len as u64 != bytes {
        return Err(Status::DATA_SGL_LENGTH_INVALID.with_dnr());
    }
    Ok((rw.slba * BLOCK_SIZE, bytes as usize))
}

/// Runs an I/O command that is not a data transfer (Flush, Write Zeroes,
/// Dataset Management): blocking, it may commit or wait for the volume's
/// map. `data`: the command's data (DSM ranges).
pub(crate) fn run_io_command(
    volume: &VolumeHandle,
    io: IoCommand,
    data: &[u8],
    cid: u16,
    peer: SocketAddr,
) -> Status {
    let blocks = volume.size() / BLOCK_SIZE;
    let result = match io {
        IoCommand::Flush { nsid } => {
            if nsid != NSID && nsid != 0xffff_ffff {
                return Status::INVALID_NAMESPACE.with_dnr();
            }
            volume.flush()
        }
        IoCommand::WriteZeroes(wz) => {
            if wz.nsid != NSID {
                return Status::INVALID_NAMESPACE.with_dnr();
            }
            if wz.end_lba().is_none_or(|e| e > blocks) {
                return Status::LBA_OUT_OF_RANGE.with_dnr();
            }
            volume.write_zeroes(
                wz.slba * BLOCK_SIZE,
                u64::from(wz.blocks) * BLOCK_SIZE,
                wz.deallocate,
                wz.fua,
            )
        }
        IoCommand::DatasetManagement(dsm) => {
            if dsm.nsid != NSID {
                return Status::INVALID_NAMESPACE.with_dnr();
            }
            if data.len() < dsm.data_len() {
                return Status::DATA_SGL_LENGTH_INVALID.with_dnr();
            }
            if !dsm.deallocate {
                return Status::SUCCESS;
            }
            let Ok(ranges) = parse_dsm_ranges(data, dsm.ranges) else {
                return Status::DATA_SGL_LENGTH_INVALID.with_dnr();
            };
            let ranges: Vec<_> = ranges.collect();
            if ranges.iter().any(|rg| {
                rg.slba
                    .checked_add(u64::from(rg.blocks))
                    .is_none_or(|e| e > blocks)
            }) {
                return Status::LBA_OUT_OF_RANGE.with_dnr();
            }
            ranges.iter().filter(|rg| rg.blocks > 0).try_for_each(|rg| {
                volume.trim(
                    rg.slba * BLOCK_SIZE,
                    u64::from(rg.blocks) * BLOCK_SIZE,
                    false,
                )
            })
        }
        // Data transfers never come here: their queue runs them itself.
        IoCommand::Read(_) | IoCommand::Write(_) => return Status::INTERNAL_ERROR.with_dnr(),
        IoCommand::Other { .. } => return Status::INVALID_OPCODE.with_dnr(),
    };
    match result {
        Ok(()) => Status::SUCCESS,
        Err(err) => {
            tracing::warn!(%peer, cid, "NVMe I/O failed: {err}");
            io_status(&err)
        }
    }
}

/// The completion status for a failed store operation.
pub(crate) fn io_status(err: &IoError) -> Status {
    match err {
        IoError::OutOfRange { .. } => Status::LBA_OUT_OF_RANGE.with_dnr(),
        IoError::NoSpace => Status::CAPACITY_EXCEEDED.with_dnr(),
        IoError::Io(_) => Status::WRITE_FAULT,
        IoError::Corrupt { .. } => Status::UNRECOVERED_READ_ERROR,
        IoError::Gone => Status::INVALID_NAMESPACE.with_dnr(),
        IoError::Failed => Status::INTERNAL_ERROR.with_dnr(),
        IoError::ReadOnly => Status::NAMESPACE_WRITE_PROTECTED.with_dnr(),
    }
}
