//! Decoding of the SBC-4 commands: reads, writes, verifies, WRITE SAME,
//! UNMAP, cache control, COMPARE AND WRITE, capacity and LBA status.
//!
//! Invariants: returns `Ok(None)` exactly for operation codes this module
//! does not own; RDPROTECT/WRPROTECT/VRPROTECT other than zero are invalid
//! because the logical unit is formatted without protection information
//! (SBC-4 §4.22: the device server then terminates the command).

use super::{
    group_length, opcode as op, service_action as sa, BlockIo, ByteCheck, Cdb, CdbSize, Command,
};
use crate::sense::{Sense, INVALID_COMMAND_OPERATION_CODE};

pub(super) fn parse(opcode: u8, cdb: &[u8]) -> Result<Option<Command>, Sense> {
    let command = match opcode {
        op::READ_6 => Command::Read(six(&Cdb::new(cdb, 6)?)),
        op::WRITE_6 => Command::Write(six(&Cdb::new(cdb, 6)?)),
        op::READ_10 | op::READ_12 | op::READ_16 => Command::Read(io(opcode, cdb)?.0),
        op::WRITE_10 | op::WRITE_12 | op::WRITE_16 => Command::Write(io(opcode, cdb)?.0),
        op::WRITE_AND_VERIFY_10 | op::WRITE_AND_VERIFY_12 | op::WRITE_AND_VERIFY_16 => {
            let (io, c) = io(opcode, cdb)?;
            let byte_check = match (c.u8(1) >> 1) & 0x03 {
                0 => ByteCheck::Medium,
                1 => ByteCheck::DataOut,
                // 10b and 11b are reserved for WRITE AND VERIFY.
                _ => return Err(Sense::invalid_field_in_cdb(1, Some(2))),
            };
            Command::WriteAndVerify { io, byte_check }
        }
        op::VERIFY_10 | op::VERIFY_12 | op::VERIFY_16 => {
            let (io, c) = io(opcode, cdb)?;
            let byte_check = match (c.u8(1) >> 1) & 0x03 {
                0 => ByteCheck::Medium,
                1 => ByteCheck::DataOut,
                3 => ByteCheck::OneBlock,
                _ => return Err(Sense::invalid_field_in_cdb(1, Some(2))),
            };
            Command::Verify { io, byte_check }
        }
        op::WRITE_SAME_10 | op::WRITE_SAME_16 => write_same(opcode, cdb)?,
        op::UNMAP => {
            let c = Cdb::new(cdb, 10)?;
            Command::Unmap {
                anchor: c.bit(1, 0),
                group: c.u8(6) & 0x3f,
                param_len: c.be16(7),
            }
        }
        op::SYNCHRONIZE_CACHE_10 | op::SYNCHRONIZE_CACHE_16 => {
            let (size, lba, blocks, group, c) = ranged(opcode, cdb)?;
            Command::SynchronizeCache {
                size,
                lba,
                blocks,
                immed: c.bit(1, 1),
                group,
            }
        }
        op::PRE_FETCH_10 | op::PRE_FETCH_16 => {
            let (size, lba, blocks, group, c) = ranged(opcode, cdb)?;
            Command::PreFetch {
                size,
                lba,
                blocks,
                immed: c.bit(1, 1),
                group,
            }
        }
        op::COMPARE_AND_WRITE => {
            let c = Cdb::new(cdb, 16)?;
            protect(&c)?;
            Command::CompareAndWrite {
                lba: c.be64(2),
                blocks: c.u8(13),
                dpo: c.bit(1, 4),
                fua: c.bit(1, 3),
                group: c.u8(14) & 0x3f,
            }
        }
        op::READ_CAPACITY_10 => {
            Cdb::new(cdb, 10)?;
            Command::ReadCapacity10
        }
        op::SERVICE_ACTION_IN_16 => {
            let c = Cdb::new(cdb, 16)?;
            match c.u8(1) & 0x1f {
                sa::READ_CAPACITY_16 => Command::ReadCapacity16 {
                    alloc_len: c.be32(10),
                },
                sa::GET_LBA_STATUS => Command::GetLbaStatus {
                    lba: c.be64(2),
                    alloc_len: c.be32(10),
                    report_type: c.u8(14) & 0x07,
                },
                _ => return Err(INVALID_COMMAND_OPERATION_CODE),
            }
        }
        _ => return Ok(None),
    };
    Ok(Some(command))
}

/// READ(6)/WRITE(6): 21-bit LBA, 8-bit length where 0 means 256.
fn six(c: &Cdb<'_>) -> BlockIo {
    let lba = (u64::from(c.u8(1) & 0x1f) << 16) | u64::from(c.be16(2));
    let blocks = match c.u8(4) {
        0 => 256,
        n => u32::from(n),
    };
    BlockIo {
        size: CdbSize::Six,
        lba,
        blocks,
        dpo: false,
        fua: false,
        group: 0,
    }
}

fn size_of(opcode: u8) -> CdbSize {
    match group_length(opcode) {
        Some(12) => CdbSize::Twelve,
        Some(16) => CdbSize::Sixteen,
        _ => CdbSize::Ten,
    }
}

/// The 10/12/16-byte READ, WRITE, VERIFY and WRITE AND VERIFY layout:
/// protection field, DPO, FUA in byte 1, then LBA, length and group.
fn io<'a>(opcode: u8, cdb: &'a [u8]) -> Result<(BlockIo, Cdb<'a>), Sense> {
    let size = size_of(opcode);
    let c = match size {
        CdbSize::Sixteen => Cdb::new(cdb, 16)?,
        CdbSize::Twelve => Cdb::new(cdb, 12)?,
        _ => Cdb::new(cdb, 10)?,
    };
    protect(&c)?;
    let (lba, blocks, group) = match size {
        CdbSize::Sixteen => (c.be64(2), c.be32(10), c.u8(14)),
        CdbSize::Twelve => (u64::from(c.be32(2)), c.be32(6), c.u8(10)),
        _ => (u64::from(c.be32(2)), u32::from(c.be16(7)), c.u8(6)),
    };
    let io = BlockIo {
        size,
        lba,
        blocks,
        dpo: c.bit(1, 4),
        // VERIFY and WRITE AND VERIFY have no FUA bit (bit 3 is reserved).
        fua: c.bit(1, 3) && !matches!(opcode & 0x0f, 0x0e | 0x0f),
        group: group & 0x3f,
    };
    Ok((io, c))
}

/// The 10/16-byte LBA + count layout of SYNCHRONIZE CACHE and PRE-FETCH.
fn ranged<'a>(opcode: u8, cdb: &'a [u8]) -> Result<(CdbSize, u64, u32, u8, Cdb<'a>), Sense> {
    if group_length(opcode) == Some(16) {
        let c = Cdb::new(cdb, 16)?;
        Ok((CdbSize::Sixteen, c.be64(2), c.be32(10), c.u8(14) & 0x3f, c))
    } else {
        let c = Cdb::new(cdb, 10)?;
        let lba = u64::from(c.be32(2));
        Ok((CdbSize::Ten, lba, u32::from(c.be16(7)), c.u8(6) & 0x3f, c))
    }
}

fn write_same(opcode: u8, cdb: &[u8]) -> Result<Command, Sense> {
    let sixteen = opcode == op::WRITE_SAME_16;
    let c = Cdb::new(cdb, if sixteen { 16 } else { 10 })?;
    protect(&c)?;
    // PBDATA/LBDATA (obsolete) asked for address-stamped blocks, which
    // this device server does not produce.
    if c.u8(1) & 0x06 != 0 {
        return Err(Sense::invalid_field_in_cdb(1, Some(2)));
    }
    let anchor = c.bit(1, 4);
    let unmap = c.bit(1, 3);
    // SBC-4 §5.48: ANCHOR without UNMAP is invalid.
    if anchor && !unmap {
        return Err(Sense::invalid_field_in_cdb(1, Some(4)));
    }
    let (size, lba, blocks, group, ndob) = if sixteen {
        let ndob = c.bit(1, 0);
        (CdbSize::Sixteen, c.be64(2), c.be32(10), c.u8(14), ndob)
    } else {
        let lba = u64::from(c.be32(2));
        (CdbSize::Ten, lba, u32::from(c.be16(7)), c.u8(6), false)
    };
    Ok(Command::WriteSame {
        size,
        lba,
        blocks,
        unmap,
        anchor,
        ndob,
        group: group & 0x3f,
    })
}

/// RDPROTECT/WRPROTECT/VRPROTECT (byte 1, bits 7-5) must be zero.
fn protect(c: &Cdb<'_>) -> Result<(), Sense> {
    if c.u8(1) & 0xe0 != 0 {
        return Err(Sense::invalid_field_in_cdb(1, Some(7)));
    }
    Ok(())
}
