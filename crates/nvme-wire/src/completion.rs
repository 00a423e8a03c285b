//! The 16-byte NVMe completion queue entry (CQE) and its status field,
//! plus the status codes a target needs.
//!
//! Invariants: every 16-byte pattern parses and re-encodes to itself (the
//! phase tag, reserved on fabrics, is kept); the status field is laid out
//! as P (bit 0), SC (8:1), SCT (11:9), CRD (13:12), M (14), DNR (15).

use crate::bytes::{le16, le32, put16, put32};
use crate::WireError;

/// Length of a completion queue entry.
pub const CQE_LEN: usize = 16;

/// Status code types.
pub mod sct {
    /// Generic command status.
    pub const GENERIC: u8 = 0;
    /// Command specific status.
    pub const COMMAND_SPECIFIC: u8 = 1;
    /// Media and data integrity errors.
    pub const MEDIA: u8 = 2;
    /// Path related status.
    pub const PATH: u8 = 3;
    /// Vendor specific.
    pub const VENDOR: u8 = 7;
}

/// A command's completion status (without the phase tag).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Status {
    /// Status code type (3 bits, see [`sct`]).
    pub sct: u8,
    /// Status code.
    pub sc: u8,
    /// Command retry delay index (2 bits).
    pub crd: u8,
    /// More information in the error log page.
    pub more: bool,
    /// Do not retry: the same command would fail again.
    pub dnr: bool,
}

macro_rules! status_consts {
    ($($(#[$doc:meta])* $name:ident = ($sct:expr, $sc:expr);)*) => {
        $($(#[$doc])* pub const $name: Status = Status::new($sct, $sc);)*
    };
}

impl Status {
    /// A status with DNR, M and CRD clear.
    pub const fn new(sct: u8, sc: u8) -> Status {
        Status {
            sct: sct & 0x7,
            sc,
            crd: 0,
            more: false,
            dnr: false,
        }
    }

    /// The same status with Do Not Retry set.
    pub const fn with_dnr(self) -> Status {
        Status { dnr: true, ..self }
    }

    /// The same status with More set.
    pub const fn with_more(self) -> Status {
        Status { more: true, ..self }
    }

    /// True for generic success.
    pub fn is_success(&self) -> bool {
        self.sct == sct::GENERIC && self.sc == 0
    }

    /// Decodes a 16-bit status field; returns the status and the phase tag.
    pub fn from_field(field: u16) -> (Status, bool) {
        (
            Status {
                sc: ((field >> 1) & 0xff) as u8,
                sct: ((field >> 9) & 0x7) as u8,
                crd: ((field >> 12) & 0x3) as u8,
                more: field & (1 << 14) != 0,
                dnr: field & (1 << 15) != 0,
            },
            field & 1 != 0,
        )
    }

    /// Encodes the 16-bit status field with the given phase tag.
    pub fn to_field(&self, phase: bool) -> u16 {
        u16::from(phase)
            | (u16::from(self.sc) << 1)
            | (u16::from(self.sct & 0x7) << 9)
            | (u16::from(self.crd & 0x3) << 12)
            | (u16::from(self.more) << 14)
            | (u16::from(self.dnr) << 15)
    }

    status_consts! {
        /// Successful completion.
        SUCCESS = (sct::GENERIC, 0x00);
        /// Invalid Command Opcode.
        INVALID_OPCODE = (sct::GENERIC, 0x01);
        /// Invalid Field in Command.
        INVALID_FIELD = (sct::GENERIC, 0x02);
        /// Command ID Conflict.
        COMMAND_ID_CONFLICT = (sct::GENERIC, 0x03);
        /// Data Transfer Error.
        DATA_TRANSFER_ERROR = (sct::GENERIC, 0x04);
        /// Commands Aborted due to Power Loss Notification.
        ABORTED_POWER_LOSS = (sct::GENERIC, 0x05);
        /// Internal Error.
        INTERNAL_ERROR = (sct::GENERIC, 0x06);
        /// Command Abort Requested.
        ABORT_REQUESTED = (sct::GENERIC, 0x07);
        /// Command Aborted due to SQ Deletion.
        ABORTED_SQ_DELETION = (sct::GENERIC, 0x08);
        /// Invalid Namespace or Format.
        INVALID_NAMESPACE = (sct::GENERIC, 0x0b);
        /// Command Sequence Error.
        COMMAND_SEQUENCE_ERROR = (sct::GENERIC, 0x0c);
        /// Invalid SGL Segment Descriptor.
        INVALID_SGL_SEGMENT_DESCRIPTOR = (sct::GENERIC, 0x0d);
        /// Invalid Number of SGL Descriptors.
        INVALID_SGL_DESCRIPTOR_COUNT = (sct::GENERIC, 0x0e);
        /// Data SGL Length Invalid.
        DATA_SGL_LENGTH_INVALID = (sct::GENERIC, 0x0f);
        /// SGL Descriptor Type Invalid.
        SGL_DESCRIPTOR_TYPE_INVALID = (sct::GENERIC, 0x11);
        /// SGL Offset Invalid.
        SGL_OFFSET_INVALID = (sct::GENERIC, 0x16);
        /// Host Identifier Inconsistent Format.
        HOST_ID_INCONSISTENT_FORMAT = (sct::GENERIC, 0x18);
        /// Keep Alive Timer Expired.
        KEEP_ALIVE_EXPIRED = (sct::GENERIC, 0x19);
        /// Keep Alive Timeout Invalid.
        KEEP_ALIVE_INVALID = (sct::GENERIC, 0x1a);
        /// Namespace is Write Protected.
        NAMESPACE_WRITE_PROTECTED = (sct::GENERIC, 0x20);
        /// Command Interrupted (retry later).
        COMMAND_INTERRUPTED = (sct::GENERIC, 0x21);
        /// Transient Transport Error (for example a data digest mismatch).
        TRANSIENT_TRANSPORT_ERROR = (sct::GENERIC, 0x22);
        /// LBA Out of Range (NVM command set).
        LBA_OUT_OF_RANGE = (sct::GENERIC, 0x80);
        /// Capacity Exceeded (NVM command set).
        CAPACITY_EXCEEDED = (sct::GENERIC, 0x81);
        /// Namespace Not Ready (NVM command set).
        NAMESPACE_NOT_READY = (sct::GENERIC, 0x82);
        /// Reservation Conflict (NVM command set).
        RESERVATION_CONFLICT = (sct::GENERIC, 0x83);
        /// Invalid Queue Identifier.
        INVALID_QUEUE_IDENTIFIER = (sct::COMMAND_SPECIFIC, 0x01);
        /// Invalid Queue Size.
        INVALID_QUEUE_SIZE = (sct::COMMAND_SPECIFIC, 0x02);
        /// Abort Command Limit Exceeded.
        ABORT_LIMIT_EXCEEDED = (sct::COMMAND_SPECIFIC, 0x03);
        /// Asynchronous Event Request Limit Exceeded.
        ASYNC_EVENT_LIMIT_EXCEEDED = (sct::COMMAND_SPECIFIC, 0x05);
        /// Invalid Log Page.
        INVALID_LOG_PAGE = (sct::COMMAND_SPECIFIC, 0x09);
        /// Invalid Format.
        INVALID_FORMAT = (sct::COMMAND_SPECIFIC, 0x0a);
        /// Feature Identifier Not Saveable.
        FEATURE_NOT_SAVEABLE = (sct::COMMAND_SPECIFIC, 0x0d);
        /// Feature Not Changeable.
        FEATURE_NOT_CHANGEABLE = (sct::COMMAND_SPECIFIC, 0x0e);
        /// Feature Not Namespace Specific.
        FEATURE_NOT_NAMESPACE_SPECIFIC = (sct::COMMAND_SPECIFIC, 0x0f);
        /// Attempted Write to Read Only Range (NVM I/O commands).
        WRITE_TO_READ_ONLY_RANGE = (sct::COMMAND_SPECIFIC, 0x82);
        /// Connect: Incompatible Format (Fabrics).
        CONNECT_INCOMPATIBLE_FORMAT = (sct::COMMAND_SPECIFIC, 0x80);
        /// Connect: Controller Busy (Fabrics).
        CONNECT_CONTROLLER_BUSY = (sct::COMMAND_SPECIFIC, 0x81);
        /// Connect: Invalid Parameters; result DW0 names the parameter
        /// (see [`crate::fabrics::connect_invalid_parameter_result`]).
        CONNECT_INVALID_PARAMETERS = (sct::COMMAND_SPECIFIC, 0x82);
        /// Connect: Restart Discovery (Fabrics).
        CONNECT_RESTART_DISCOVERY = (sct::COMMAND_SPECIFIC, 0x83);
        /// Connect: Invalid Host (Fabrics).
        CONNECT_INVALID_HOST = (sct::COMMAND_SPECIFIC, 0x84);
        /// Discovery Restart (Fabrics).
        DISCOVERY_RESTART = (sct::COMMAND_SPECIFIC, 0x90);
        /// Authentication Required (Fabrics).
        AUTHENTICATION_REQUIRED = (sct::COMMAND_SPECIFIC, 0x91);
        /// Write Fault.
        WRITE_FAULT = (sct::MEDIA, 0x80);
        /// Unrecovered Read Error.
        UNRECOVERED_READ_ERROR = (sct::MEDIA, 0x81);
        /// Access Denied.
        ACCESS_DENIED = (sct::MEDIA, 0x86);
        /// Internal Path Error.
        INTERNAL_PATH_ERROR = (sct::PATH, 0x00);
        /// Asymmetric Access Persistent Loss.
        ANA_PERSISTENT_LOSS = (sct::PATH, 0x01);
        /// Asymmetric Access Inaccessible: the host retries on another
        /// path, so this is sent without DNR.
        ANA_INACCESSIBLE = (sct::PATH, 0x02);
        /// Asymmetric Access Transition.
        ANA_TRANSITION = (sct::PATH, 0x03);
        /// Controller Pathing Error.
        CONTROLLER_PATH_ERROR = (sct::PATH, 0x60);
        /// Host Pathing Error.
        HOST_PATH_ERROR = (sct::PATH, 0x70);
        /// Command Aborted By Host.
        ABORTED_BY_HOST = (sct::PATH, 0x71);
    }
}

/// A completion queue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Cqe {
    /// Command specific result, dword 0.
    pub dw0: u32,
    /// Command specific result, dword 1.
    pub dw1: u32,
    /// Submission queue head pointer (0xFFFF when SQ flow control is
    /// disabled on a fabrics queue).
    pub sqhd: u16,
    /// Submission queue identifier.
    pub sqid: u16,
    /// Identifier of the command that completed.
    pub cid: u16,
    /// Status.
    pub status: Status,
    /// Phase tag (reserved on fabrics, kept for round trips).
    pub phase: bool,
}

impl Cqe {
    /// A completion with a zero result.
    pub fn new(cid: u16, sqid: u16, sqhd: u16, status: Status) -> Cqe {
        Cqe {
            cid,
            sqid,
            sqhd,
            status,
            ..Cqe::default()
        }
    }

    /// The same completion with a 64-bit result (DW0 low, DW1 high).
    pub fn with_result(self, result: u64) -> Cqe {
        Cqe {
            dw0: result as u32,
            dw1: (result >> 32) as u32,
            ..self
        }
    }

    /// DW0 and DW1 as one 64-bit value.
    pub fn result(&self) -> u64 {
        u64::from(self.dw0) | (u64::from(self.dw1) << 32)
    }

    /// Parses the first [`CQE_LEN`] bytes of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Cqe, WireError> {
        let bytes: &[u8; CQE_LEN] =
            buf.get(..CQE_LEN)
                .and_then(|b| b.try_into().ok())
                .ok_or(WireError::TooShort {
                    what: "completion queue entry",
                    needed: CQE_LEN,
                    got: buf.len(),
                })?;
        Ok(Cqe::from_bytes(bytes))
    }

    /// Decodes 16 bytes.
    pub fn from_bytes(b: &[u8; CQE_LEN]) -> Cqe {
        let (status, phase) = Status::from_field(le16(b, 14));
        Cqe {
            dw0: le32(b, 0),
            dw1: le32(b, 4),
            sqhd: le16(b, 8),
            sqid: le16(b, 10),
            cid: le16(b, 12),
            status,
            phase,
        }
    }

    /// Encodes the 16 bytes.
    pub fn to_bytes(&self) -> [u8; CQE_LEN] {
        let mut b = [0u8; CQE_LEN];
        put32(&mut b, 0, self.dw0);
        put32(&mut b, 4, self.dw1);
        put16(&mut b, 8, self.sqhd);
        put16(&mut b, 10, self.sqid);
        put16(&mut b, 12, self.cid);
        put16(&mut b, 14, self.status.to_field(self.phase));
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_field_layout() {
        // LBA out of range with DNR: SC 0x80 in bits 8:1, DNR bit 15.
        assert_eq!(Status::LBA_OUT_OF_RANGE.with_dnr().to_field(false), 0x8100);
        // Connect invalid parameters: SCT 1, SC 0x82 (Linux's 0x182 << 1).
        assert_eq!(Status::CONNECT_INVALID_PARAMETERS.to_field(false), 0x0304);
        // ANA inaccessible: SCT 3, SC 2 (Linux's 0x302 << 1).
        assert_eq!(Status::ANA_INACCESSIBLE.to_field(false), 0x0604);
        assert_eq!(Status::SUCCESS.to_field(true), 1);
        for field in [0u16, 1, 0x8100, 0xffff, 0x7ffe, 0x1234] {
            let (s, p) = Status::from_field(field);
            assert_eq!(s.to_field(p), field);
        }
    }

    #[test]
    fn cqe_layout() {
        let cqe = Cqe::new(0xbeef, 1, 0x0010, Status::INVALID_FIELD.with_dnr())
            .with_result(0x1122_3344_5566_7788);
        let b = cqe.to_bytes();
        assert_eq!(
            b,
            [
                0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, // DW0, DW1
                0x10, 0x00, 0x01, 0x00, 0xef, 0xbe, // SQHD, SQID, CID
                0x04, 0x80, // status: SC 2 << 1, DNR
            ]
        );
        assert_eq!(Cqe::from_bytes(&b), cqe);
        assert_eq!(cqe.result(), 0x1122_3344_5566_7788);
    }
}
