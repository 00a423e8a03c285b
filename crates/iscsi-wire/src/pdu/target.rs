//! The PDUs a target sends (RFC 7143 §11.4, 11.6, 11.7.2, 11.8, 11.9,
//! 11.11, 11.13, 11.15, 11.17, 11.19): one struct per opcode with every
//! field named, a parser from the 48-byte BHS and a writer of the
//! opcode-specific BHS bytes.
//!
//! Invariants:
//! - Parsers ignore reserved bits and bytes and the bits the RFC fixes
//!   (F of single-PDU responses, the 0xffffffff tag of Reject and
//!   Asynchronous Message). Fields the RFC declares reserved unless a flag
//!   is set (residual counts, the status of a Data-In) are kept only with
//!   their flag. The one failure is a residual with both its overflow and
//!   underflow flags set, which the RFC calls a protocol error.
//! - Writers set the fixed bits, zero every reserved bit and byte, and
//!   leave bytes 4-7 (TotalAHSLength, DataSegmentLength) to the caller.
//! - `parse(write(x)) == x` for every value.

use super::bytes::{array, be16, be32, be64, put, put16, put32, put64, put8, u8_at};
use super::codes::{
    AsyncEvent, LoginStage, LogoutResponseCode, RejectReason, Residual, TmfResponse,
};
use super::initiator::login_flags;
use super::{FieldError, Opcode, FINAL_BIT, RESERVED_TAG};

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

/// Byte 1 bits of residual flags: overflow and underflow.
const RESIDUAL_OVERFLOW: u8 = 0x04;
const RESIDUAL_UNDERFLOW: u8 = 0x02;
const BIDI_RESIDUAL_OVERFLOW: u8 = 0x10;
const BIDI_RESIDUAL_UNDERFLOW: u8 = 0x08;

fn residual(b: &[u8], overflow: u8, underflow: u8, at: usize) -> Result<Residual, FieldError> {
    Residual::from_flags(flag(b, overflow), flag(b, underflow), be32(b, at)).ok_or(FieldError {
        offset: 1,
        reason: "overflow and underflow flags both set",
    })
}

fn residual_bits(r: Residual, overflow: u8, underflow: u8) -> u8 {
    bit(r.overflow(), overflow) | bit(r.underflow(), underflow)
}

/// NOP-In (opcode 0x20): answers a NOP-Out, or pings the initiator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NopIn {
    pub lun: u64,
    /// The NOP-Out's ITT when answering one, else 0xffffffff.
    pub itt: u32,
    /// 0xffffffff when answering; a tag the initiator must echo when the
    /// target wants a NOP-Out back.
    pub ttt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
}

impl NopIn {
    pub(crate) fn parse(b: &[u8]) -> NopIn {
        NopIn {
            lun: be64(b, 8),
            itt: be32(b, 16),
            ttt: be32(b, 20),
            stat_sn: be32(b, 24),
            exp_cmd_sn: be32(b, 28),
            max_cmd_sn: be32(b, 32),
        }
    }

    pub(crate) fn write(&self, b: &mut [u8]) {
        put8(b, 0, Opcode::NopIn.code());
        put8(b, 1, FINAL_BIT);
        put64(b, 8, self.lun);
        put32(b, 16, self.itt);
        put32(b, 20, self.ttt);
        put32(b, 24, self.stat_sn);
        put32(b, 28, self.exp_cmd_sn);
        put32(b, 32, self.max_cmd_sn);
    }
}

/// SCSI Response (opcode 0x21). The data segment carries SenseLength,
/// sense data and response data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ScsiResponse {
    /// o/u flags and the Bidirectional Read Residual Count.
    pub bidi_read_residual: Residual,
    /// O/U flags and the Residual Count.
    pub residual: Residual,
    /// See [`super::scsi_response`]; the status is valid only with
    /// Command Completed at Target.
    pub response: u8,
    /// The SCSI status (GOOD 0x00, CHECK CONDITION 0x02, ...).
    pub status: u8,
    pub itt: u32,
    pub snack_tag: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    /// Number of Data-In and R2T PDUs sent for the command.
    pub exp_data_sn: u32,
}

impl ScsiResponse {
    pub(crate) fn parse(b: &[u8]) -> Result<ScsiResponse, FieldError> {
        Ok(ScsiResponse {
            bidi_read_residual: residual(b, BIDI_RESIDUAL_OVERFLOW, BIDI_RESIDUAL_UNDERFLOW, 40)?,
            residual: residual(b, RESIDUAL_OVERFLOW, RESIDUAL_UNDERFLOW, 44)?,
            response: u8_at(b, 2),
            status: u8_at(b, 3),
            itt: be32(b, 16),
            snack_tag: be32(b, 20),
            stat_sn: be32(b, 24),
            exp_cmd_sn: be32(b, 28),
            max_cmd_sn: be32(b, 32),
            exp_data_sn: be32(b, 36),
        })
    }

    pub(crate) fn write(&self, b: &mut [u8]) {
        put8(b, 0, Opcode::ScsiResponse.code());
        put8(
            b,
            1,
            FINAL_BIT
                | residual_bits(
                    self.bidi_read_residual,
                    BIDI_RESIDUAL_OVERFLOW,
                    BIDI_RESIDUAL_UNDERFLOW,
                )
                | residual_bits(self.residual, RESIDUAL_OVERFLOW, RESIDUAL_UNDERFLOW),
        );
        put8(b, 2, self.response);
        put8(b, 3, self.status);
        put32(b, 16, self.itt);
        put32(b, 20, self.snack_tag);
        put32(b, 24, self.stat_sn);
        put32(b, 28, self.exp_cmd_sn);
        put32(b, 32, self.max_cmd_sn);
        put32(b, 36, self.exp_data_sn);
        put32(b, 40, self.bidi_read_residual.count());
        put32(b, 44, self.residual.count());
    }
}

/// Task Management Function Response (opcode 0x22).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TaskManagementResponse {
    pub response: TmfResponse,
    pub itt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
}

impl TaskManagementResponse {
    pub(crate) fn parse(b: &[u8]) -> TaskManagementResponse {
        TaskManagementResponse {
            response: TmfResponse::from_code(u8_at(b, 2)),
            itt: be32(b, 16),
            stat_sn: be32(b, 24),
            exp_cmd_sn: be32(b, 28),
            max_cmd_sn: be32(b, 32),
        }
    }

    pub(crate) fn write(&self, b: &mut [u8]) {
        put8(b, 0, Opcode::TaskManagementResponse.code());
        put8(b, 1, FINAL_BIT);
        put8(b, 2, self.response.code());
        put32(b, 16, self.itt);
        put32(b, 24, self.stat_sn);
        put32(b, 28, self.exp_cmd_sn);
        put32(b, 32, self.max_cmd_sn);
    }
}

/// Login Response (opcode 0x23).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LoginResponse {
    pub transit: bool,
    pub cont: bool,
    pub csg: LoginStage,
    pub nsg: LoginStage,
    pub version_max: u8,
    pub version_active: u8,
    pub isid: [u8; 6],
    pub tsih: u16,
    pub itt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    /// See [`super::login_status_class`].
    pub status_class: u8,
    pub status_detail: u8,
}

impl LoginResponse {
    pub(crate) fn parse(b: &[u8]) -> LoginResponse {
        let flags = u8_at(b, 1);
        LoginResponse {
            transit: flags & 0x80 != 0,
            cont: flags & 0x40 != 0,
            csg: LoginStage::from_code(flags >> 2),
            nsg: LoginStage::from_code(flags),
            version_max: u8_at(b, 2),
            version_active: u8_at(b, 3),
            isid: array(b, 8),
            tsih: be16(b, 14),
            itt: be32(b, 16),
            stat_sn: be32(b, 24),
            exp_cmd_sn: be32(b, 28),
            max_cmd_sn: be32(b, 32),
            status_class: u8_at(b, 36),
            status_detail: u8_at(b, 37),
        }
    }

    pub(crate) fn write(&self, b: &mut [u8]) {
        put8(b, 0, Opcode::LoginResponse.code());
        put8(
            b,
            1,
            login_flags(self.transit, self.cont, self.csg, self.nsg),
        );
        put8(b, 2, self.version_max);
        put8(b, 3, self.version_active);
        put(b, 8, &self.isid);
        put16(b, 14, self.tsih);
        put32(b, 16, self.itt);
        put32(b, 24, self.stat_sn);
        put32(b, 28, self.exp_cmd_sn);
        put32(b, 32, self.max_cmd_sn);
        put8(b, 36, self.status_class);
        put8(b, 37, self.status_detail);
    }
}

/// Text Response (opcode 0x24).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TextResponse {
    pub final_pdu: bool,
    pub cont: bool,
    pub lun: u64,
    pub itt: u32,
    /// 0xffffffff on the final response, else a tag the initiator echoes
    /// to ask for the rest.
    pub ttt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
}

impl TextResponse {
    pub(crate) fn parse(b: &[u8]) -> TextResponse {
        TextResponse {
            final_pdu: flag(b, FINAL_BIT),
            cont: flag(b, 0x40),
            lun: be64(b, 8),
            itt: be32(b, 16),
            ttt: be32(b, 20),
            stat_sn: be32(b, 24),
            exp_cmd_sn: be32(b, 28),
            max_cmd_sn: be32(b, 32),
        }
    }

    pub(crate) fn write(&self, b: &mut [u8]) {
        put8(b, 0, Opcode::TextResponse.code());
        put8(b, 1, bit(self.final_pdu, FINAL_BIT) | bit(self.cont, 0x40));
        put64(b, 8, self.lun);
        put32(b, 16, self.itt);
        put32(b, 20, self.ttt);
        put32(b, 24, self.stat_sn);
        put32(b, 28, self.exp_cmd_sn);
        put32(b, 32, self.max_cmd_sn);
    }
}

/// The status a Data-In carries when its S bit is set (phase collapse:
/// no SCSI Response follows).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DataInStatus {
    /// The SCSI status.
    pub status: u8,
    pub stat_sn: u32,
    /// O/U flags and the Residual Count.
    pub residual: Residual,
}

/// Data-In flag bits.
const DATA_IN_ACK: u8 = 0x40;
const DATA_IN_STATUS: u8 = 0x01;

/// SCSI Data-In (opcode 0x25).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DataIn {
    /// F: the last Data-In of the command (or of the sequence). RFC 7143
    /// wants it set whenever `status` is present; the codec keeps the two
    /// independent so that what was received is what is seen.
    pub final_pdu: bool,
    /// A: the target asks for a DataACK SNACK (ErrorRecoveryLevel >= 1).
    pub ack: bool,
    /// S: status, StatSN and the residual, when present.
    pub status: Option<DataInStatus>,
    /// The command's LUN when `ack` is set, otherwise reserved.
    pub lun: u64,
    pub itt: u32,
    /// 0xffffffff unless `ack` is set.
    pub ttt: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub data_sn: u32,
    pub buffer_offset: u32,
}

impl DataIn {
    pub(crate) fn parse(b: &[u8]) -> Result<DataIn, FieldError> {
        let status = if flag(b, DATA_IN_STATUS) {
            Some(DataInStatus {
                status: u8_at(b, 3),
                stat_sn: be32(b, 24),
                residual: residual(b, RESIDUAL_OVERFLOW, RESIDUAL_UNDERFLOW, 44)?,
            })
        } else {
            None
        };
        Ok(DataIn {
            final_pdu: flag(b, FINAL_BIT),
            ack: flag(b, DATA_IN_ACK),
            status,
            lun: be64(b, 8),
            itt: be32(b, 16),
            ttt: be32(b, 20),
            exp_cmd_sn: be32(b, 28),
            max_cmd_sn: be32(b, 32),
            data_sn: be32(b, 36),
            buffer_offset: be32(b, 40),
        })
    }

    pub(crate) fn write(&self, b: &mut [u8]) {
        put8(b, 0, Opcode::DataIn.code());
        let mut flags = bit(self.final_pdu, FINAL_BIT) | bit(self.ack, DATA_IN_ACK);
        if let Some(s) = &self.status {
            flags |=
                DATA_IN_STATUS | residual_bits(s.residual, RESIDUAL_OVERFLOW, RESIDUAL_UNDERFLOW);
            put8(b, 3, s.status);
            put32(b, 24, s.stat_sn);
            put32(b, 44, s.residual.count());
        }
        put8(b, 1, flags);
        put64(b, 8, self.lun);
        put32(b, 16, self.itt);
        put32(b, 20, self.ttt);
        put32(b, 28, self.exp_cmd_sn);
        put32(b, 32, self.max_cmd_sn);
        put32(b, 36, self.data_sn);
        put32(b, 40, self.buffer_offset);
    }
}

/// Logout Response (opcode 0x26).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LogoutResponse {
    pub response: LogoutResponseCode,
    pub itt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub time2wait: u16,
    pub time2retain: u16,
}

impl LogoutResponse {
    pub(crate) fn parse(b: &[u8]) -> LogoutResponse {
        LogoutResponse {
            response: LogoutResponseCode::from_code(u8_at(b, 2)),
            itt: be32(b, 16),
            stat_sn: be32(b, 24),
            exp_cmd_sn: be32(b, 28),
            max_cmd_sn: be32(b, 32),
            time2wait: be16(b, 40),
            time2retain: be16(b, 42),
        }
    }

    pub(crate) fn write(&self, b: &mut [u8]) {
        put8(b, 0, Opcode::LogoutResponse.code());
        put8(b, 1, FINAL_BIT);
        put8(b, 2, self.response.code());
        put32(b, 16, self.itt);
        put32(b, 24, self.stat_sn);
        put32(b, 28, self.exp_cmd_sn);
        put32(b, 32, self.max_cmd_sn);
        put16(b, 40, self.time2wait);
        put16(b, 42, self.time2retain);
    }
}

/// Ready To Transfer (opcode 0x31).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReadyToTransfer {
    pub lun: u64,
    pub itt: u32,
    /// The tag the initiator puts in the Data-Out PDUs that answer.
    pub ttt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub r2t_sn: u32,
    pub buffer_offset: u32,
    pub desired_data_transfer_length: u32,
}

impl ReadyToTransfer {
    pub(crate) fn parse(b: &[u8]) -> ReadyToTransfer {
        ReadyToTransfer {
            lun: be64(b, 8),
            itt: be32(b, 16),
            ttt: be32(b, 20),
            stat_sn: be32(b, 24),
            exp_cmd_sn: be32(b, 28),
            max_cmd_sn: be32(b, 32),
            r2t_sn: be32(b, 36),
            buffer_offset: be32(b, 40),
            desired_data_transfer_length: be32(b, 44),
        }
    }

    pub(crate) fn write(&self, b: &mut [u8]) {
        put8(b, 0, Opcode::ReadyToTransfer.code());
        put8(b, 1, FINAL_BIT);
        put64(b, 8, self.lun);
        put32(b, 16, self.itt);
        put32(b, 20, self.ttt);
        put32(b, 24, self.stat_sn);
        put32(b, 28, self.exp_cmd_sn);
        put32(b, 32, self.max_cmd_sn);
        put32(b, 36, self.r2t_sn);
        put32(b, 40, self.buffer_offset);
        put32(b, 44, self.desired_data_transfer_length);
    }
}

/// Asynchronous Message (opcode 0x32). For a SCSI asynchronous event the
/// data segment carries SenseLength and sense data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AsyncMessage {
    /// The LU of a SCSI asynchronous event, otherwise reserved.
    pub lun: u64,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub async_event: AsyncEvent,
    pub async_vcode: u8,
    pub parameter1: u16,
    pub parameter2: u16,
    pub parameter3: u16,
}

impl AsyncMessage {
    pub(crate) fn parse(b: &[u8]) -> AsyncMessage {
        AsyncMessage {
            lun: be64(b, 8),
            stat_sn: be32(b, 24),
            exp_cmd_sn: be32(b, 28),
            max_cmd_sn: be32(b, 32),
            async_event: AsyncEvent::from_code(u8_at(b, 36)),
            async_vcode: u8_at(b, 37),
            parameter1: be16(b, 38),
            parameter2: be16(b, 40),
            parameter3: be16(b, 42),
        }
    }

    pub(crate) fn write(&self, b: &mut [u8]) {
        put8(b, 0, Opcode::AsyncMessage.code());
        put8(b, 1, FINAL_BIT);
        put64(b, 8, self.lun);
        put32(b, 16, RESERVED_TAG);
        put32(b, 24, self.stat_sn);
        put32(b, 28, self.exp_cmd_sn);
        put32(b, 32, self.max_cmd_sn);
        put8(b, 36, self.async_event.code());
        put8(b, 37, self.async_vcode);
        put16(b, 38, self.parameter1);
        put16(b, 40, self.parameter2);
        put16(b, 42, self.parameter3);
    }
}

/// Reject (opcode 0x3f). The data segment is the BHS of the rejected PDU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Reject {
    pub reason: RejectReason,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    /// The DataSN or R2TSN of a rejected Data/R2T SNACK, otherwise
    /// reserved (0).
    pub data_sn: u32,
}

impl Reject {
    pub(crate) fn parse(b: &[u8]) -> Reject {
        Reject {
            reason: RejectReason::from_code(u8_at(b, 2)),
            stat_sn: be32(b, 24),
            exp_cmd_sn: be32(b, 28),
            max_cmd_sn: be32(b, 32),
            data_sn: be32(b, 36),
        }
    }

    pub(crate) fn write(&self, b: &mut [u8]) {
        put8(b, 0, Opcode::Reject.code());
        put8(b, 1, FINAL_BIT);
        put8(b, 2, self.reason.code());
        put32(b, 16, RESERVED_TAG);
        put32(b, 24, self.stat_sn);
        put32(b, 28, self.exp_cmd_sn);
        put32(b, 32, self.max_cmd_sn);
        put32(b, 36, self.data_sn);
    }
}
