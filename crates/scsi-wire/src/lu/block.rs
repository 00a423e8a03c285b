//! Planning of the SBC-4 block commands: range and limit checks, write
//! protection, FUA, and the data-out/data-in sizing against the iSCSI
//! expected length.
//!
//! Invariant: check order is field checks, write protection, transfer
//! limits, LBA range, then the data-out size. libiscsi's tests depend on
//! parts of it: a write-protected unit reports WRITE PROTECTED even for a
//! WRITE SAME sent without data-out, and a transfer past the end of the
//! medium reports LBA OUT OF RANGE even when it is also longer than the
//! WRITE SAME limit.

use super::{finish_data_in, respond, LuConfig, Plan, Residual, Transfer};
use crate::cdb::{BlockIo, ByteCheck, CdbSize, Command};
use crate::data::mode::ModeState;
use crate::data::{parse_unmap, read_capacity_10, read_capacity_16};
use crate::sense::{
    Sense, SenseKey, INVALID_COMMAND_OPERATION_CODE, LBA_OUT_OF_RANGE, WRITE_PROTECTED,
};

/// ILLEGAL REQUEST, INVALID FIELD IN COMMAND INFORMATION UNIT (05h/0Eh/
/// 03h): the iSCSI expected length does not fit the command's data-out and
/// the command is refused before any data is applied (FCP-4's option b for
/// a data-out overflow/underflow, which libiscsi's residual tests accept;
/// [`crate::sense::INVALID_FIELD_IN_COMMAND_INFORMATION_UNIT`] is the
/// ABORTED COMMAND form of option c, which they do not).
pub const DATA_OUT_REFUSED: Sense = Sense::new(SenseKey::IllegalRequest, 0x0e, 0x03);

/// Plans `command` if it is a block command, `None` otherwise.
pub(super) fn plan(
    config: &LuConfig,
    mode: &ModeState,
    command: &Command,
    transfer: Transfer,
) -> Option<Plan> {
    let plan = match *command {
        Command::Read(io) => read(config, io, transfer),
        Command::Write(io) => write(config, mode, io, transfer),
        Command::WriteAndVerify { io, byte_check } => {
            write(config, mode, io, transfer).map(|p| into_write_and_verify(p, byte_check))
        }
        Command::Verify { io, byte_check } => verify(config, io, byte_check, transfer),
        Command::WriteSame {
            size,
            lba,
            blocks,
            unmap,
            anchor,
            ndob,
            ..
        } => write_same(
            config,
            mode,
            size,
            lba,
            blocks,
            (unmap, anchor, ndob),
            transfer,
        ),
        Command::Unmap {
            anchor, param_len, ..
        } => unmap(config, anchor, param_len, transfer),
        Command::SynchronizeCache {
            lba, blocks, immed, ..
        } => to_end(config, lba, blocks).map(|blocks| {
            if blocks == 0 {
                respond(None, no_data(transfer))
            } else {
                Plan::Flush {
                    lba,
                    blocks,
                    immed,
                    residual: no_data(transfer),
                }
            }
        }),
        // No cache to load: after the range check there is nothing to do,
        // and GOOD (not CONDITION MET) is what a device server reports
        // when it cannot promise the blocks stay cached.
        Command::PreFetch { lba, blocks, .. } => {
            to_end(config, lba, blocks).map(|_| respond(None, no_data(transfer)))
        }
        Command::CompareAndWrite {
            lba, blocks, fua, ..
        } => compare_and_write(config, mode, lba, blocks, fua, transfer),
        Command::GetLbaStatus { lba, alloc_len, .. } => {
            // The starting LBA must name a block (SBC-4 §5.8).
            if lba >= config.blocks {
                Err(LBA_OUT_OF_RANGE)
            } else {
                Ok(Plan::LbaStatus {
                    lba,
                    alloc_len,
                    expected_length: transfer.data_in(),
                })
            }
        }
        Command::ReadCapacity10 => {
            let mut data = Vec::with_capacity(8);
            read_capacity_10(config.blocks, config.block_size(), &mut data);
            Ok(Plan::Respond(finish_data_in(data, 8, transfer.data_in())))
        }
        Command::ReadCapacity16 { alloc_len } => {
            let mut data = Vec::with_capacity(32);
            read_capacity_16(
                config.blocks,
                config.block_size(),
                config.limits.physical_block_exponent,
                &config.provisioning,
                &mut data,
            );
            Ok(Plan::Respond(finish_data_in(
                data,
                alloc_len,
                transfer.data_in(),
            )))
        }
        _ => return None,
    };
    Some(plan.unwrap_or_else(|sense| respond(Some(sense), Residual::None)))
}

/// LBA OUT OF RANGE unless `blocks` blocks from `lba` lie on the medium
/// (zero blocks at the capacity itself are in range).
pub(super) fn check_range(config: &LuConfig, lba: u64, blocks: u64) -> Result<(), Sense> {
    match lba.checked_add(blocks) {
        Some(end) if end <= config.blocks => Ok(()),
        _ => Err(LBA_OUT_OF_RANGE),
    }
}

/// For SYNCHRONIZE CACHE and PRE-FETCH, where zero blocks means "to the
/// end of the medium": the checked block count.
fn to_end(config: &LuConfig, lba: u64, blocks: u32) -> Result<u64, Sense> {
    if blocks == 0 {
        check_range(config, lba, 0)?;
        Ok(config.blocks.saturating_sub(lba))
    } else {
        check_range(config, lba, u64::from(blocks))?;
        Ok(u64::from(blocks))
    }
}

/// Residual of a command with no data phase.
fn no_data(transfer: Transfer) -> Residual {
    Residual::of(transfer.expected_length, 0)
}

/// INVALID FIELD IN CDB at the transfer length field if `blocks` exceeds
/// MAXIMUM TRANSFER LENGTH (0: no limit).
fn check_transfer_limit(config: &LuConfig, size: CdbSize, blocks: u32) -> Result<(), Sense> {
    let max = config.limits.max_transfer_blocks;
    if max != 0 && blocks > max {
        return Err(Sense::invalid_field_in_cdb(size.length_byte(), None));
    }
    Ok(())
}

fn check_writable(config: &LuConfig) -> Result<(), Sense> {
    if config.read_only {
        Err(WRITE_PROTECTED)
    } else {
        Ok(())
    }
}

fn spdtl(config: &LuConfig, blocks: u64) -> u64 {
    blocks.saturating_mul(u64::from(config.block_size()))
}

fn read(config: &LuConfig, io: BlockIo, transfer: Transfer) -> Result<Plan, Sense> {
    check_transfer_limit(config, io.size, io.blocks)?;
    check_range(config, io.lba, u64::from(io.blocks))?;
    let presented = spdtl(config, u64::from(io.blocks));
    let expected = transfer.data_in();
    let residual = Residual::of(expected, presented);
    // What is actually sent: never more than expected (overflow), never
    // more than the command reads (underflow).
    let send = presented.min(u64::from(expected));
    if send == 0 {
        return Ok(respond(None, residual));
    }
    let bs = u64::from(config.block_size().max(1));
    Ok(Plan::Read {
        lba: io.lba,
        blocks: super::clamp_u32(send.div_ceil(bs)),
        fua: io.fua,
        data_in_len: super::clamp_u32(send),
        residual,
    })
}

/// The whole blocks of data-out a write-type command applies, after
/// matching SPDTL with the expected length; a partial block is refused.
fn data_out_blocks(
    config: &LuConfig,
    blocks: u64,
    transfer: Transfer,
) -> Result<(u64, Residual), (Sense, Residual)> {
    let presented = spdtl(config, blocks);
    let expected = transfer.data_out();
    let residual = Residual::of(expected, presented);
    let usable = presented.min(u64::from(expected));
    let bs = u64::from(config.block_size().max(1));
    if usable % bs != 0 {
        return Err((DATA_OUT_REFUSED, residual));
    }
    Ok((usable / bs, residual))
}

fn write(
    config: &LuConfig,
    mode: &ModeState,
    io: BlockIo,
    transfer: Transfer,
) -> Result<Plan, Sense> {
    check_writable(config)?;
    check_transfer_limit(config, io.size, io.blocks)?;
    check_range(config, io.lba, u64::from(io.blocks))?;
    let (blocks, residual) = match data_out_blocks(config, u64::from(io.blocks), transfer) {
        Ok(v) => v,
        Err((sense, residual)) => return Ok(respond(Some(sense), residual)),
    };
    if blocks == 0 {
        return Ok(respond(None, residual));
    }
    Ok(Plan::Write {
        lba: io.lba,
        blocks: super::clamp_u32(blocks),
        fua: io.fua || !mode.write_cache,
        residual,
    })
}

fn into_write_and_verify(plan: Plan, byte_check: ByteCheck) -> Plan {
    match plan {
        Plan::Write {
            lba,
            blocks,
            residual,
            ..
        } => Plan::WriteAndVerify {
            lba,
            blocks,
            compare: byte_check == ByteCheck::DataOut,
            residual,
        },
        other => other,
    }
}

fn verify(
    config: &LuConfig,
    io: BlockIo,
    byte_check: ByteCheck,
    transfer: Transfer,
) -> Result<Plan, Sense> {
    // The transfer limit bounds data moved, so it applies only when the
    // whole range comes as data-out.
    if byte_check == ByteCheck::DataOut {
        check_transfer_limit(config, io.size, io.blocks)?;
    }
    check_range(config, io.lba, u64::from(io.blocks))?;
    let (blocks, residual) = match byte_check {
        ByteCheck::Medium => (u64::from(io.blocks), no_data(transfer)),
        ByteCheck::DataOut => match data_out_blocks(config, u64::from(io.blocks), transfer) {
            Ok(v) => v,
            Err((sense, residual)) => return Ok(respond(Some(sense), residual)),
        },
        ByteCheck::OneBlock => {
            let one = u64::from(io.blocks.min(1));
            match data_out_blocks(config, one, transfer) {
                Ok((n, residual)) if n == one => (u64::from(io.blocks), residual),
                Ok((_, residual)) | Err((_, residual)) => {
                    return Ok(respond(Some(DATA_OUT_REFUSED), residual))
                }
            }
        }
    };
    if blocks == 0 {
        return Ok(respond(None, residual));
    }
    Ok(Plan::Verify {
        lba: io.lba,
        blocks: super::clamp_u32(blocks),
        byte_check,
        residual,
    })
}

fn write_same(
    config: &LuConfig,
    mode: &ModeState,
    size: CdbSize,
    lba: u64,
    blocks: u32,
    (unmap, anchor, ndob): (bool, bool, bool),
    transfer: Transfer,
) -> Result<Plan, Sense> {
    check_writable(config)?;
    // ANCHOR is only valid with UNMAP (checked in cdb); anchored blocks are
    // not supported (ANC_SUP = 0).
    if anchor {
        return Err(Sense::invalid_field_in_cdb(1, Some(4)));
    }
    // WSNZ = 1 in the block limits page: zero blocks is not "to the end".
    if blocks == 0 {
        return Err(Sense::invalid_field_in_cdb(size.length_byte(), None));
    }
    check_range(config, lba, u64::from(blocks))?;
    let max = config.limits.max_write_same_blocks;
    if max != 0 && u64::from(blocks) > max {
        return Err(Sense::invalid_field_in_cdb(size.length_byte(), None));
    }
    // One block of data-out, or none with NDOB; anything else is refused
    // rather than guessed at.
    let presented = if ndob {
        0
    } else {
        u64::from(config.block_size())
    };
    let expected = transfer.data_out();
    let residual = Residual::of(expected, presented);
    if u64::from(expected) != presented {
        return Ok(respond(Some(DATA_OUT_REFUSED), residual));
    }
    Ok(Plan::WriteSame {
        lba,
        blocks: u64::from(blocks),
        // Without LBPWS the UNMAP bit is only a hint the unit ignores: the
        // blocks are written.
        unmap: unmap && config.provisioning.write_same_unmap_supported(),
        ndob,
        fua: !mode.write_cache,
        residual,
    })
}

fn unmap(
    config: &LuConfig,
    anchor: bool,
    param_len: u16,
    transfer: Transfer,
) -> Result<Plan, Sense> {
    check_writable(config)?;
    if !config.provisioning.unmap_supported() {
        return Err(INVALID_COMMAND_OPERATION_CODE);
    }
    if anchor {
        return Err(Sense::invalid_field_in_cdb(1, Some(0)));
    }
    let expected = transfer.data_out();
    let residual = Residual::of(expected, u64::from(param_len));
    let len = u32::from(param_len).min(expected);
    if len == 0 {
        // No parameter list: nothing to unmap, not an error (SBC-4 §5.30).
        return Ok(respond(None, residual));
    }
    Ok(Plan::ParameterList {
        len,
        then: super::Pending {
            kind: super::PendingKind::Unmap,
            residual,
        },
    })
}

/// UNMAP's second phase: validate the block descriptors.
pub(super) fn unmap_parameters(config: &LuConfig, params: &[u8], residual: Residual) -> Plan {
    let ranges = match parse_unmap(params, &config.limits) {
        Ok(r) => r,
        Err(sense) => return respond(Some(sense), residual),
    };
    for &(lba, blocks) in &ranges {
        if let Err(sense) = check_range(config, lba, u64::from(blocks)) {
            return respond(Some(sense), residual);
        }
    }
    let ranges: Vec<(u64, u32)> = ranges.into_iter().filter(|r| r.1 != 0).collect();
    if ranges.is_empty() {
        return respond(None, residual);
    }
    Plan::Unmap { ranges, residual }
}

fn compare_and_write(
    config: &LuConfig,
    mode: &ModeState,
    lba: u64,
    blocks: u8,
    fua: bool,
    transfer: Transfer,
) -> Result<Plan, Sense> {
    check_writable(config)?;
    if blocks > config.limits.max_compare_and_write_blocks {
        return Err(Sense::invalid_field_in_cdb(13, None));
    }
    check_range(config, lba, u64::from(blocks))?;
    // Verify data then write data: exactly 2 * blocks blocks.
    let presented = spdtl(config, 2 * u64::from(blocks));
    let expected = transfer.data_out();
    if blocks == 0 && expected != 0 {
        // Data for a compare of nothing: the NUMBER OF LOGICAL BLOCKS
        // field is what is wrong (libiscsi's 256-block case wraps to 0).
        return Err(Sense::invalid_field_in_cdb(13, None));
    }
    let residual = Residual::of(expected, presented);
    if u64::from(expected) != presented {
        return Ok(respond(Some(DATA_OUT_REFUSED), residual));
    }
    if blocks == 0 {
        return Ok(respond(None, residual));
    }
    Ok(Plan::CompareAndWrite {
        lba,
        blocks: u32::from(blocks),
        fua: fua || !mode.write_cache,
    })
}
