//! Command descriptor block decoding (SPC-5 §4.2, SBC-4 §5): turns the
//! bytes of a CDB into a typed [`Command`], or into the sense data the
//! device server reports for it.
//!
//! Invariants:
//! - [`parse`] never panics and never reads past its input; bytes after the
//!   opcode's CDB length (iSCSI pads CDBs to 16 bytes) are ignored.
//! - Only checks that need nothing but the CDB happen here: unknown
//!   operation codes and service actions, CDBs shorter than their operation
//!   code needs, the NACA bit, protection-information fields (this target
//!   formats no protection information), and fields whose values the
//!   standard reserves. Checks against the logical unit (capacity, limits,
//!   write protection, provisioning) belong to [`crate::lu`].
//! - Reserved and obsolete bits are ignored rather than rejected: initiators
//!   (libiscsi's FUA_NV tests, old Linux kernels) set some of them, and
//!   the usage maps of [`supported_opcodes`] report them as not evaluated.
//! - Counts keep the CDB's meaning except where the standard redefines zero
//!   for the command: READ(6)/WRITE(6) with 0 blocks carry 256.
//! - A failed check yields ILLEGAL REQUEST sense with a field pointer at the
//!   most significant bit of the offending field.

mod block;
mod primary;
mod usage;

pub use usage::supported_opcodes;

use crate::sense::{Sense, INVALID_COMMAND_OPERATION_CODE};

/// Operation codes this crate decodes.
pub mod opcode {
    pub const TEST_UNIT_READY: u8 = 0x00;
    pub const REQUEST_SENSE: u8 = 0x03;
    pub const READ_6: u8 = 0x08;
    pub const WRITE_6: u8 = 0x0a;
    pub const INQUIRY: u8 = 0x12;
    pub const MODE_SELECT_6: u8 = 0x15;
    pub const RESERVE_6: u8 = 0x16;
    pub const RELEASE_6: u8 = 0x17;
    pub const MODE_SENSE_6: u8 = 0x1a;
    pub const START_STOP_UNIT: u8 = 0x1b;
    pub const SEND_DIAGNOSTIC: u8 = 0x1d;
    pub const PREVENT_ALLOW_MEDIUM_REMOVAL: u8 = 0x1e;
    pub const READ_CAPACITY_10: u8 = 0x25;
    pub const READ_10: u8 = 0x28;
    pub const WRITE_10: u8 = 0x2a;
    pub const WRITE_AND_VERIFY_10: u8 = 0x2e;
    pub const VERIFY_10: u8 = 0x2f;
    pub const PRE_FETCH_10: u8 = 0x34;
    pub const SYNCHRONIZE_CACHE_10: u8 = 0x35;
    pub const WRITE_SAME_10: u8 = 0x41;
    pub const UNMAP: u8 = 0x42;
    pub const MODE_SELECT_10: u8 = 0x55;
    pub const RESERVE_10: u8 = 0x56;
    pub const RELEASE_10: u8 = 0x57;
    pub const MODE_SENSE_10: u8 = 0x5a;
    pub const PERSISTENT_RESERVE_IN: u8 = 0x5e;
    pub const PERSISTENT_RESERVE_OUT: u8 = 0x5f;
    pub const READ_16: u8 = 0x88;
    pub const COMPARE_AND_WRITE: u8 = 0x89;
    pub const WRITE_16: u8 = 0x8a;
    pub const WRITE_AND_VERIFY_16: u8 = 0x8e;
    pub const VERIFY_16: u8 = 0x8f;
    pub const PRE_FETCH_16: u8 = 0x90;
    pub const SYNCHRONIZE_CACHE_16: u8 = 0x91;
    pub const WRITE_SAME_16: u8 = 0x93;
    pub const SERVICE_ACTION_IN_16: u8 = 0x9e;
    pub const REPORT_LUNS: u8 = 0xa0;
    pub const MAINTENANCE_IN: u8 = 0xa3;
    pub const READ_12: u8 = 0xa8;
    pub const WRITE_12: u8 = 0xaa;
    pub const WRITE_AND_VERIFY_12: u8 = 0xae;
    pub const VERIFY_12: u8 = 0xaf;
}

/// Service actions of the operation codes that have them.
pub mod service_action {
    /// SERVICE ACTION IN(16)
    pub const READ_CAPACITY_16: u8 = 0x10;
    /// SERVICE ACTION IN(16)
    pub const GET_LBA_STATUS: u8 = 0x12;
    /// MAINTENANCE IN
    pub const REPORT_TARGET_PORT_GROUPS: u8 = 0x0a;
    /// MAINTENANCE IN
    pub const REPORT_SUPPORTED_OPERATION_CODES: u8 = 0x0c;
}

/// The length of a CDB as its operation code's group defines it (SPC-5
/// §4.2.5.1), or `None` for the reserved, variable-length and vendor groups.
pub const fn group_length(opcode: u8) -> Option<usize> {
    match opcode >> 5 {
        0 => Some(6),
        1 | 2 => Some(10),
        4 => Some(16),
        5 => Some(12),
        _ => None,
    }
}

/// Which CDB form a command came in, which fixes where its fields sit
/// (the logical unit needs that to point at a field it rejects).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CdbSize {
    Six,
    Ten,
    Twelve,
    Sixteen,
}

impl CdbSize {
    /// Byte offset of the TRANSFER LENGTH (VERIFICATION LENGTH, NUMBER OF
    /// LOGICAL BLOCKS, PREFETCH LENGTH) field of the block commands.
    pub const fn length_byte(self) -> u16 {
        match self {
            CdbSize::Six => 4,
            CdbSize::Ten => 7,
            CdbSize::Twelve => 6,
            CdbSize::Sixteen => 10,
        }
    }

    /// Byte offset of the LOGICAL BLOCK ADDRESS field (READ(6)/WRITE(6):
    /// byte 1, whose low five bits start it).
    pub const fn lba_byte(self) -> u16 {
        match self {
            CdbSize::Six => 1,
            _ => 2,
        }
    }
}

/// A READ or WRITE of any size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockIo {
    pub size: CdbSize,
    pub lba: u64,
    /// Blocks to transfer (READ(6)/WRITE(6): 0 in the CDB is 256 here).
    pub blocks: u32,
    /// Disable page out: a caching hint only.
    pub dpo: bool,
    /// Force unit access.
    pub fua: bool,
    pub group: u8,
}

/// The BYTCHK field of VERIFY and WRITE AND VERIFY (SBC-4 §5.32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ByteCheck {
    /// 00b: verify the medium only, no data-out.
    Medium,
    /// 01b: compare data-out (the full length) with the medium.
    DataOut,
    /// 11b: one block of data-out compared against every block (VERIFY
    /// only).
    OneBlock,
}

/// Any command this crate decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Command {
    TestUnitReady,
    RequestSense {
        /// DESC: descriptor-format sense data wanted.
        desc: bool,
        alloc_len: u8,
    },
    Inquiry {
        evpd: bool,
        page_code: u8,
        alloc_len: u16,
    },
    ModeSense {
        ten: bool,
        /// DBD: disable block descriptors.
        dbd: bool,
        /// LLBAA: long LBA block descriptors accepted (MODE SENSE(10)).
        llbaa: bool,
        /// PC: 0 current, 1 changeable, 2 default, 3 saved.
        page_control: u8,
        page: u8,
        subpage: u8,
        alloc_len: u16,
    },
    ModeSelect {
        ten: bool,
        /// PF: page format.
        pf: bool,
        /// SP: save pages.
        sp: bool,
        param_len: u16,
    },
    StartStopUnit {
        immed: bool,
        power_condition: u8,
        no_flush: bool,
        loej: bool,
        start: bool,
    },
    PreventAllowMediumRemoval {
        prevent: u8,
    },
    SendDiagnostic {
        self_test_code: u8,
        self_test: bool,
        param_len: u16,
    },
    ReadCapacity10,
    ReadCapacity16 {
        alloc_len: u32,
    },
    GetLbaStatus {
        lba: u64,
        alloc_len: u32,
        report_type: u8,
    },
    Read(BlockIo),
    Write(BlockIo),
    WriteAndVerify {
        io: BlockIo,
        /// Medium or DataOut (11b is reserved for this command).
        byte_check: ByteCheck,
    },
    Verify {
        io: BlockIo,
        byte_check: ByteCheck,
    },
    WriteSame {
        size: CdbSize,
        lba: u64,
        /// 0: from `lba` to the end of the medium.
        blocks: u32,
        unmap: bool,
        anchor: bool,
        /// No data-out buffer: write zeroes (WRITE SAME(16) only).
        ndob: bool,
        group: u8,
    },
    Unmap {
        anchor: bool,
        group: u8,
        param_len: u16,
    },
    SynchronizeCache {
        size: CdbSize,
        lba: u64,
        /// 0: from `lba` to the end of the medium.
        blocks: u32,
        immed: bool,
        group: u8,
    },
    CompareAndWrite {
        lba: u64,
        blocks: u8,
        dpo: bool,
        fua: bool,
        group: u8,
    },
    PreFetch {
        size: CdbSize,
        lba: u64,
        /// 0: from `lba` to the end of the medium.
        blocks: u32,
        immed: bool,
        group: u8,
    },
    ReportLuns {
        select_report: u8,
        alloc_len: u32,
    },
    /// SPC-2 RESERVE(6)/(10) of the whole logical unit (no third party).
    Reserve {
        ten: bool,
    },
    /// SPC-2 RELEASE(6)/(10).
    Release {
        ten: bool,
    },
    PersistentReserveIn {
        service_action: u8,
        alloc_len: u16,
    },
    PersistentReserveOut {
        service_action: u8,
        scope: u8,
        kind: u8,
        param_len: u32,
    },
    ReportTargetPortGroups {
        /// PARAMETER DATA FORMAT 001b: extended header.
        extended: bool,
        alloc_len: u32,
    },
    ReportSupportedOpcodes {
        /// RCTD: return command timeouts descriptors.
        rctd: bool,
        /// REPORTING OPTIONS (0..=3).
        options: u8,
        opcode: u8,
        service_action: u16,
        alloc_len: u32,
    },
}

impl Command {
    /// The operation code this command is sent with.
    pub fn opcode(&self) -> u8 {
        use opcode as op;
        match self {
            Command::TestUnitReady => op::TEST_UNIT_READY,
            Command::RequestSense { .. } => op::REQUEST_SENSE,
            Command::Inquiry { .. } => op::INQUIRY,
            Command::ModeSense { ten, .. } => {
                if *ten {
                    op::MODE_SENSE_10
                } else {
                    op::MODE_SENSE_6
                }
            }
            Command::ModeSelect { ten, .. } => {
                if *ten {
                    op::MODE_SELECT_10
                } else {
                    op::MODE_SELECT_6
                }
            }
            Command::StartStopUnit { .. } => op::START_STOP_UNIT,
            Command::PreventAllowMediumRemoval { .. } => op::PREVENT_ALLOW_MEDIUM_REMOVAL,
            Command::SendDiagnostic { .. } => op::SEND_DIAGNOSTIC,
            Command::ReadCapacity10 => op::READ_CAPACITY_10,
            Command::ReadCapacity16 { .. } | Command::GetLbaStatus { .. } => {
                op::SERVICE_ACTION_IN_16
            }
            Command::Read(io) => {
                sized(io.size, [op::READ_6, op::READ_10, op::READ_12, op::READ_16])
            }
            Command::Write(io) => sized(
                io.size,
                [op::WRITE_6, op::WRITE_10, op::WRITE_12, op::WRITE_16],
            ),
            Command::WriteAndVerify { io, .. } => sized(
                io.size,
                [
                    op::WRITE_AND_VERIFY_10,
                    op::WRITE_AND_VERIFY_10,
                    op::WRITE_AND_VERIFY_12,
                    op::WRITE_AND_VERIFY_16,
                ],
            ),
            Command::Verify { io, .. } => sized(
                io.size,
                [op::VERIFY_10, op::VERIFY_10, op::VERIFY_12, op::VERIFY_16],
            ),
            Command::WriteSame { size, .. } => {
                if *size == CdbSize::Sixteen {
                    op::WRITE_SAME_16
                } else {
                    op::WRITE_SAME_10
                }
            }
            Command::Unmap { .. } => op::UNMAP,
            Command::SynchronizeCache { size, .. } => {
                if *size == CdbSize::Sixteen {
                    op::SYNCHRONIZE_CACHE_16
                } else {
                    op::SYNCHRONIZE_CACHE_10
                }
            }
            Command::CompareAndWrite { .. } => op::COMPARE_AND_WRITE,
            Command::PreFetch { size, .. } => {
                if *size == CdbSize::Sixteen {
                    op::PRE_FETCH_16
                } else {
                    op::PRE_FETCH_10
                }
            }
            Command::ReportLuns { .. } => op::REPORT_LUNS,
            Command::Reserve { ten } => {
                if *ten {
                    op::RESERVE_10
                } else {
                    op::RESERVE_6
                }
            }
            Command::Release { ten } => {
                if *ten {
                    op::RELEASE_10
                } else {
                    op::RELEASE_6
                }
            }
            Command::PersistentReserveIn { .. } => op::PERSISTENT_RESERVE_IN,
            Command::PersistentReserveOut { .. } => op::PERSISTENT_RESERVE_OUT,
            Command::ReportTargetPortGroups { .. } | Command::ReportSupportedOpcodes { .. } => {
                op::MAINTENANCE_IN
            }
        }
    }
}

fn sized(size: CdbSize, ops: [u8; 4]) -> u8 {
    let [six, ten, twelve, sixteen] = ops;
    match size {
        CdbSize::Six => six,
        CdbSize::Ten => ten,
        CdbSize::Twelve => twelve,
        CdbSize::Sixteen => sixteen,
    }
}

/// Decodes one CDB. `cdb` may be longer than the command's CDB (iSCSI
/// carries at least 16 bytes); the extra bytes are ignored.
pub fn parse(cdb: &[u8]) -> Result<Command, Sense> {
    let Some(&op) = cdb.first() else {
        return Err(INVALID_COMMAND_OPERATION_CODE);
    };
    if let Some(command) = primary::parse(op, cdb)? {
        return Ok(command);
    }
    if let Some(command) = block::parse(op, cdb)? {
        return Ok(command);
    }
    Err(INVALID_COMMAND_OPERATION_CODE)
}

/// The bytes of one CDB, cut to its operation code's length, with the
/// checks every CDB gets (length, CONTROL byte).
pub(crate) struct Cdb<'a> {
    bytes: &'a [u8],
}

impl<'a> Cdb<'a> {
    /// Cuts `cdb` to `len` bytes; a shorter CDB is an invalid field at the
    /// first missing byte, and a set NACA bit in the CONTROL byte (the last
    /// byte) is invalid because this device server does not do ACA.
    pub(crate) fn new(cdb: &'a [u8], len: usize) -> Result<Cdb<'a>, Sense> {
        let Some(bytes) = cdb.get(..len) else {
            return Err(Sense::invalid_field_in_cdb(field_index(cdb.len()), None));
        };
        let control = len.saturating_sub(1);
        if bytes.get(control).is_some_and(|c| c & 0x04 != 0) {
            return Err(Sense::invalid_field_in_cdb(field_index(control), Some(2)));
        }
        Ok(Cdb { bytes })
    }

    pub(crate) fn u8(&self, i: usize) -> u8 {
        self.bytes.get(i).copied().unwrap_or(0)
    }

    pub(crate) fn bit(&self, i: usize, bit: u8) -> bool {
        self.u8(i) & (1 << bit) != 0
    }

    pub(crate) fn be16(&self, i: usize) -> u16 {
        u16::from_be_bytes([self.u8(i), self.u8(i + 1)])
    }

    pub(crate) fn be32(&self, i: usize) -> u32 {
        u32::from_be_bytes([self.u8(i), self.u8(i + 1), self.u8(i + 2), self.u8(i + 3)])
    }

    pub(crate) fn be64(&self, i: usize) -> u64 {
        (u64::from(self.be32(i)) << 32) | u64::from(self.be32(i + 4))
    }
}

fn field_index(i: usize) -> u16 {
    u16::try_from(i).unwrap_or(u16::MAX)
}

#[cfg(test)]
mod tests;
