//! The PDUs an initiator sends (RFC 7143 §11.3, 11.5, 11.7.1, 11.10, 11.12,
//! 11.14, 11.16, 11.18): one struct per opcode with every field named, a
//! parser from the 48-byte BHS (and, for a SCSI Command, its AHS bytes),
//! and a writer of the opcode-specific BHS bytes.
//!
//! Invariants:
//! - Parsers never fail on reserved bits or bytes: receivers ignore them
//!   (RFC 7143 §11.2.1), and so does the parser; bits the RFC fixes to 1
//!   (the F bit of single-PDU requests, the I bit of a Login Request) are
//!   not checked either. Only malformed AHSs fail.
//! - Writers set those fixed bits, and zero every reserved bit and byte;
//!   bytes 4-7 (TotalAHSLength, DataSegmentLength) are left to the caller.
//! - `parse(write(x)) == x` for every value.

use std::borrow::Cow;

use super::ahs::{parse_command_ahs, CommandAhs};
use super::bytes::{array, be16, be32, be64, put, put16, put32, put64, put8, u8_at};
use super::codes::{LoginStage, LogoutReason, SnackType, TaskAttribute, TmfFunction};
use super::{FieldError, Opcode, FINAL_BIT, IMMEDIATE_BIT};

/// Byte 0: the opcode with the immediate bit.
fn opcode_byte(opcode: Opcode, immediate: bool) -> u8 {
    opcode.code() | if immediate { IMMEDIATE_BIT } else { 0 }
}

fn immediate(b: &[u8]) -> bool {
    u8_at(b, 0) & IMMEDIATE_BIT != 0
}

fn flag(b: &[u8], bit: u8) -> bool {
    u8_at(b, 1) & bit != 0
}

fn bit(set: bool, bit: u8) -> u8 {
    if set {
        bit
    } else {
        0
    }
}

/// NOP-Out (opcode 0x00): a ping, or the answer to a target's NOP-In.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NopOut {
    pub immediate: bool,
    pub lun: u64,
    /// 0xffffffff when this answers a NOP-In (no NOP-In is wanted back).
    pub itt: u32,
    /// The NOP-In's TTT when answering one, else 0xffffffff.
    pub ttt: u32,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
}

impl NopOut {
    pub(crate) fn parse(b: &[u8]) -> NopOut {
        NopOut {
            immediate: immediate(b),
            lun: be64(b, 8),
            itt: be32(b, 16),
            ttt: be32(b, 20),
            cmd_sn: be32(b, 24),
            exp_stat_sn: be32(b, 28),
        }
    }

    pub(crate) fn write(&self, b: &mut [u8]) {
        put8(b, 0, opcode_byte(Opcode::NopOut, self.immediate));
        put8(b, 1, FINAL_BIT);
        put64(b, 8, self.lun);
        put32(b, 16, self.itt);
        put32(b, 20, self.ttt);
        put32(b, 24, self.cmd_sn);
        put32(b, 28, self.exp_stat_sn);
    }
}

/// SCSI Command (opcode 0x01).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ScsiCommand {
    pub immediate: bool,
    /// F: no unsolicited Data-Out PDUs follow.
    pub final_pdu: bool,
    /// R: the command reads (Data-In expected).
    pub read: bool,
    /// W: the command writes (Data-Out expected).
    pub write: bool,
    pub attr: TaskAttribute,
    pub lun: u64,
    pub itt: u32,
    pub expected_data_transfer_length: u32,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
    /// The first 16 bytes of the CDB (shorter CDBs are zero padded).
    pub bhs_cdb: [u8; 16],
    /// The CDB bytes beyond 16, carried in an extended CDB AHS; empty for
    /// CDBs of at most 16 bytes.
    pub extended_cdb: Vec<u8>,
    /// The bidirectional read expected data transfer length AHS (present
    /// for commands with both R and W set).
    pub bidi_read_expected_data_transfer_length: Option<u32>,
}

impl ScsiCommand {
    /// The whole CDB: the 16 BHS bytes followed by the extended CDB bytes.
    /// Borrowed unless there is an extended CDB.
    pub fn cdb(&self) -> Cow<'_, [u8]> {
        if self.extended_cdb.is_empty() {
            Cow::Borrowed(&self.bhs_cdb[..])
        } else {
            let mut full = Vec::with_capacity(16 + self.extended_cdb.len());
            full.extend_from_slice(&self.bhs_cdb);
            full.extend_from_slice(&self.extended_cdb);
            Cow::Owned(full)
        }
    }

    pub(crate) fn parse(b: &[u8], ahs: &[u8]) -> Result<ScsiCommand, FieldError> {
        let CommandAhs {
            extended_cdb,
            bidi_read_length,
        } = parse_command_ahs(ahs)?;
        Ok(ScsiCommand {
            immediate: immediate(b),
            final_pdu: flag(b, FINAL_BIT),
            read: flag(b, 0x40),
            write: flag(b, 0x20),
            attr: TaskAttribute::from_code(u8_at(b, 1)),
            lun: be64(b, 8),
            itt: be32(b, 16),
            expected_data_transfer_length: be32(b, 20),
            cmd_sn: be32(b, 24),
            exp_stat_sn: be32(b, 28),
            bhs_cdb: array(b, 32),
            extended_cdb,
            bidi_read_expected_data_transfer_length: bidi_read_length,
        })
    }

    pub(crate) fn write(&self, b: &mut [u8]) {
        put8(b, 0, opcode_byte(Opcode::ScsiCommand, self.immediate));
        put8(
            b,
            1,
            bit(self.final_pdu, FINAL_BIT)
                | bit(self.read, 0x40)
                | bit(self.write, 0x20)
                | self.attr.code(),
        );
        put64(b, 8, self.lun);
        put32(b, 16, self.itt);
        put32(b, 20, self.expected_data_transfer_length);
        put32(b, 24, self.cmd_sn);
        put32(b, 28, self.exp_stat_sn);
        put(b, 32, &self.bhs_cdb);
    }
}

/// SCSI Task Management Function Request (opcode 0x02).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TaskManagementRequest {
    pub immediate: bool,
    pub function: TmfFunction,
    pub lun: u64,
    pub itt: u32,
    /// The ITT of the task to abort (ABORT TASK), else 0xffffffff.
    pub referenced_task_tag: u32,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
    pub ref_cmd_sn: u32,
    pub exp_data_sn: u32,
}

impl TaskManagementRequest {
    pub(crate) fn parse(b: &[u8]) -> TaskManagementRequest {
        TaskManagementRequest {
            immediate: immediate(b),
            function: TmfFunction::from_code(u8_at(b, 1)),
            lun: be64(b, 8),
            itt: be32(b, 16),
            referenced_task_tag: be32(b, 20),
            cmd_sn: be32(b, 24),
            exp_stat_sn: be32(b, 28),
            ref_cmd_sn: be32(b, 32),
            exp_data_sn: be32(b, 36),
        }
    }

    pub(crate) fn write(&self, b: &mut [u8]) {
        put8(
            b,
            0,
            opcode_byte(Opcode::TaskManagementRequest, self.immediate),
        );
        put8(b, 1, FINAL_BIT | self.function.code());
        put64(b, 8, self.lun);
        put32(b, 16, self.itt);
        put32(b, 20, self.referenced_task_tag);
        put32(b, 24, self.cmd_sn);
        put32(b, 28, self.exp_stat_sn);
        put32(b, 32, self.ref_cmd_sn);
        put32(b, 36, self.exp_data_sn);
    }
}

/// Login Request (opcode 0x03; always immediate, so there is no I flag).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LoginRequest {
    /// T: the initiator is ready to move to `nsg`.
    pub transit: bool,
    /// C: the text in the data segment continues in the next PDU.
    pub cont: bool,
    pub csg: LoginStage,
    pub nsg: LoginStage,
    pub version_max: u8,
    pub version_min: u8,
    pub isid: [u8; 6],
    pub tsih: u16,
    pub itt: u32,
    pub cid: u16,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
}

impl LoginRequest {
    pub(crate) fn parse(b: &[u8]) -> LoginRequest {
        let flags = u8_at(b, 1);
        LoginRequest {
            transit: flags & 0x80 != 0,
            cont: flags & 0x40 != 0,
            csg: LoginStage::from_code(flags >> 2),
            nsg: LoginStage::from_code(flags),
            version_max: u8_at(b, 2),
            version_min: u8_at(b, 3),
            isid: array(b, 8),
            tsih: be16(b, 14),
            itt: be32(b, 16),
            cid: be16(b, 20),
            cmd_sn: be32(b, 24),
            exp_stat_sn: be32(b, 28),
        }
    }

    pub(crate) fn write(&self, b: &mut [u8]) {
        put8(b, 0, opcode_byte(Opcode::LoginRequest, true));
        put8(
            b,
            1,
            login_flags(self.transit, self.cont, self.csg, self.nsg),
        );
        put8(b, 2, self.version_max);
        put8(b, 3, self.version_min);
        put(b, 8, &self.isid);
        put16(b, 14, self.tsih);
        put32(b, 16, self.itt);
        put16(b, 20, self.cid);
        put32(b, 24, self.cmd_sn);
        put32(b, 28, self.exp_stat_sn);
    }
}

/// Byte 1 of Login Request and Response: T, C, CSG, NSG.
pub(crate) fn login_flags(transit: bool, cont: bool, csg: LoginStage, nsg: LoginStage) -> u8 {
    bit(transit, 0x80) | bit(cont, 0x40) | (csg.code() << 2) | nsg.code()
}

/// Text Request (opcode 0x04).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TextRequest {
    pub immediate: bool,
    /// F: the last PDU of the text request.
    pub final_pdu: bool,
    /// C: the text continues in the next PDU.
    pub cont: bool,
    pub lun: u64,
    pub itt: u32,
    /// The TTT of the Text Response this continues, else 0xffffffff.
    pub ttt: u32,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
}

impl TextRequest {
    pub(crate) fn parse(b: &[u8]) -> TextRequest {
        TextRequest {
            immediate: immediate(b),
            final_pdu: flag(b, FINAL_BIT),
            cont: flag(b, 0x40),
            lun: be64(b, 8),
            itt: be32(b, 16),
            ttt: be32(b, 20),
            cmd_sn: be32(b, 24),
            exp_stat_sn: be32(b, 28),
        }
    }

    pub(crate) fn write(&self, b: &mut [u8]) {
        put8(b, 0, opcode_byte(Opcode::TextRequest, self.immediate));
        put8(b, 1, bit(self.final_pdu, FINAL_BIT) | bit(self.cont, 0x40));
        put64(b, 8, self.lun);
        put32(b, 16, self.itt);
        put32(b, 20, self.ttt);
        put32(b, 24, self.cmd_sn);
        put32(b, 28, self.exp_stat_sn);
    }
}

/// SCSI Data-Out (opcode 0x05).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DataOut {
    /// F: the last PDU of the unsolicited burst or of the R2T's sequence.
    pub final_pdu: bool,
    pub lun: u64,
    pub itt: u32,
    /// The R2T's TTT, or 0xffffffff for unsolicited data.
    pub ttt: u32,
    pub exp_stat_sn: u32,
    pub data_sn: u32,
    pub buffer_offset: u32,
}

impl DataOut {
    pub(crate) fn parse(b: &[u8]) -> DataOut {
        DataOut {
            final_pdu: flag(b, FINAL_BIT),
            lun: be64(b, 8),
            itt: be32(b, 16),
            ttt: be32(b, 20),
            exp_stat_sn: be32(b, 28),
            data_sn: be32(b, 36),
            buffer_offset: be32(b, 40),
        }
    }

    pub(crate) fn write(&self, b: &mut [u8]) {
        put8(b, 0, Opcode::DataOut.code());
        put8(b, 1, bit(self.final_pdu, FINAL_BIT));
        put64(b, 8, self.lun);
        put32(b, 16, self.itt);
        put32(b, 20, self.ttt);
        put32(b, 28, self.exp_stat_sn);
        put32(b, 36, self.data_sn);
        put32(b, 40, self.buffer_offset);
    }
}

/// Logout Request (opcode 0x06).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LogoutRequest {
    pub immediate: bool,
    pub reason: LogoutReason,
    pub itt: u32,
    /// The connection to close or remove (reserved when closing the session).
    pub cid: u16,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
}

impl LogoutRequest {
    pub(crate) fn parse(b: &[u8]) -> LogoutRequest {
        LogoutRequest {
            immediate: immediate(b),
            reason: LogoutReason::from_code(u8_at(b, 1)),
            itt: be32(b, 16),
            cid: be16(b, 20),
            cmd_sn: be32(b, 24),
            exp_stat_sn: be32(b, 28),
        }
    }

    pub(crate) fn write(&self, b: &mut [u8]) {
        put8(b, 0, opcode_byte(Opcode::LogoutRequest, self.immediate));
        put8(b, 1, FINAL_BIT | self.reason.code());
        put32(b, 16, self.itt);
        put16(b, 20, self.cid);
        put32(b, 24, self.cmd_sn);
        put32(b, 28, self.exp_stat_sn);
    }
}

/// SNACK Request (opcode 0x10).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SnackRequest {
    pub snack_type: SnackType,
    pub lun: u64,
    /// The task's ITT, or 0xffffffff (Status SNACK).
    pub itt: u32,
    /// The TTT (DataACK), the SNACK Tag (R-Data), else 0xffffffff.
    pub ttt: u32,
    pub exp_stat_sn: u32,
    pub beg_run: u32,
    pub run_length: u32,
}

impl SnackRequest {
    pub(crate) fn parse(b: &[u8]) -> SnackRequest {
        SnackRequest {
            snack_type: SnackType::from_code(u8_at(b, 1)),
            lun: be64(b, 8),
            itt: be32(b, 16),
            ttt: be32(b, 20),
            exp_stat_sn: be32(b, 28),
            beg_run: be32(b, 40),
            run_length: be32(b, 44),
        }
    }

    pub(crate) fn write(&self, b: &mut [u8]) {
        put8(b, 0, Opcode::SnackRequest.code());
        put8(b, 1, FINAL_BIT | self.snack_type.code());
        put64(b, 8, self.lun);
        put32(b, 16, self.itt);
        put32(b, 20, self.ttt);
        put32(b, 28, self.exp_stat_sn);
        put32(b, 40, self.beg_run);
        put32(b, 44, self.run_length);
    }
}
