//! iSCSI PDUs (RFC 7143 §11): the 48-byte Basic Header Segment, the
//! Additional Header Segments, every PDU type in both directions as a
//! typed value, and their encoders.
//!
//! A PDU on the wire is: BHS (48 bytes), AHSs (TotalAHSLength 4-byte
//! words), header digest (optional), data segment (DataSegmentLength
//! bytes, zero padded to a multiple of 4), data digest (optional, only
//! after a non-empty data segment). Integers are big-endian, except the
//! digests (see [`crate::digest`]).
//!
//! Invariants:
//! - A PDU value holds its header fields only; the data segment stays in
//!   the caller's buffer (the decoder hands out a range of it), so read
//!   data can be sent from the target's own buffers after
//!   [`TargetPdu::encode_header`].
//! - Encoders append to a caller-supplied `Vec<u8>`, write every reserved
//!   bit and byte as zero, set TotalAHSLength and DataSegmentLength
//!   themselves, and either write the whole header or, on
//!   [`EncodeError`], nothing.
//! - Decoding an encoded PDU yields the value encoded (given the code
//!   values `from_code` produces; see [`codes`]).

mod ahs;
pub(crate) mod bytes;
pub mod codes;
mod initiator;
pub mod serial;
mod target;

pub use ahs::{AHS_TYPE_BIDI_READ_LENGTH, AHS_TYPE_EXTENDED_CDB, MAX_AHS_LEN};
pub use codes::{
    login_status_class, scsi_response, AsyncEvent, LoginStage, LogoutReason, LogoutResponseCode,
    RejectReason, Residual, SnackType, TaskAttribute, TmfFunction, TmfResponse,
};
pub use initiator::{
    DataOut, LoginRequest, LogoutRequest, NopOut, ScsiCommand, SnackRequest, TaskManagementRequest,
    TextRequest,
};
pub use serial::{sn_ge, sn_gt, sn_in_window, sn_le, sn_lt};
pub use target::{
    AsyncMessage, DataIn, DataInStatus, LoginResponse, LogoutResponse, NopIn, ReadyToTransfer,
    Reject, ScsiResponse, TaskManagementResponse, TextResponse,
};

use crate::digest::{digest_bytes, header_digest, DataDigest, Digests};
use bytes::{put24, put8};

/// Length of the Basic Header Segment.
pub const BHS_LEN: usize = 48;
/// Largest DataSegmentLength (a 24-bit field).
pub const MAX_DATA_SEGMENT_LEN: u32 = 0x00ff_ffff;
/// The reserved tag value: "no task" in ITT, "no transfer" in TTT.
pub const RESERVED_TAG: u32 = 0xffff_ffff;
/// Byte 0 bit: the PDU is an immediate command (not queued by CmdSN).
pub const IMMEDIATE_BIT: u8 = 0x40;
/// Byte 1 bit: F (final); fixed to 1 in single-PDU requests and responses.
pub const FINAL_BIT: u8 = 0x80;
/// The only iSCSI version (Version-max, Version-min, Version-active).
pub const ISCSI_VERSION: u8 = 0x00;

/// Bytes of zero padding after a data segment (or AHS) of `len` bytes, to
/// the next multiple of 4 (0 to 3).
pub fn data_padding(len: usize) -> usize {
    (4 - len % 4) % 4
}

/// A header field a parser refused, at a byte offset from the PDU start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FieldError {
    pub offset: usize,
    pub reason: &'static str,
}

/// Why a PDU cannot be encoded. Nothing was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// DataSegmentLength is a 24-bit field.
    #[error("data segment of {len} bytes exceeds the 24-bit DataSegmentLength")]
    DataSegmentTooLong { len: usize },
    /// TotalAHSLength counts at most 255 words (1020 bytes).
    #[error("additional header segments of {len} bytes exceed {MAX_AHS_LEN} bytes")]
    AhsTooLong { len: usize },
}

/// Which way a PDU travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    InitiatorToTarget,
    TargetToInitiator,
}

/// The opcodes RFC 7143 defines (byte 0, bits 0-5). The vendor-specific
/// opcodes (0x1c-0x1e, 0x3c-0x3e) are not supported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Opcode {
    NopOut,
    ScsiCommand,
    TaskManagementRequest,
    LoginRequest,
    TextRequest,
    DataOut,
    LogoutRequest,
    SnackRequest,
    NopIn,
    ScsiResponse,
    TaskManagementResponse,
    LoginResponse,
    TextResponse,
    DataIn,
    LogoutResponse,
    ReadyToTransfer,
    AsyncMessage,
    Reject,
}

impl Opcode {
    /// The opcode for byte 0 of a BHS (the immediate bit and the reserved
    /// top bit are ignored), `None` if undefined.
    pub fn from_byte(byte: u8) -> Option<Opcode> {
        Some(match byte & 0x3f {
            0x00 => Opcode::NopOut,
            0x01 => Opcode::ScsiCommand,
            0x02 => Opcode::TaskManagementRequest,
            0x03 => Opcode::LoginRequest,
            0x04 => Opcode::TextRequest,
            0x05 => Opcode::DataOut,
            0x06 => Opcode::LogoutRequest,
            0x10 => Opcode::SnackRequest,
            0x20 => Opcode::NopIn,
            0x21 => Opcode::ScsiResponse,
            0x22 => Opcode::TaskManagementResponse,
            0x23 => Opcode::LoginResponse,
            0x24 => Opcode::TextResponse,
            0x25 => Opcode::DataIn,
            0x26 => Opcode::LogoutResponse,
            0x31 => Opcode::ReadyToTransfer,
            0x32 => Opcode::AsyncMessage,
            0x3f => Opcode::Reject,
            _ => return None,
        })
    }

    /// The 6-bit opcode value.
    pub fn code(self) -> u8 {
        match self {
            Opcode::NopOut => 0x00,
            Opcode::ScsiCommand => 0x01,
            Opcode::TaskManagementRequest => 0x02,
            Opcode::LoginRequest => 0x03,
            Opcode::TextRequest => 0x04,
            Opcode::DataOut => 0x05,
            Opcode::LogoutRequest => 0x06,
            Opcode::SnackRequest => 0x10,
            Opcode::NopIn => 0x20,
            Opcode::ScsiResponse => 0x21,
            Opcode::TaskManagementResponse => 0x22,
            Opcode::LoginResponse => 0x23,
            Opcode::TextResponse => 0x24,
            Opcode::DataIn => 0x25,
            Opcode::LogoutResponse => 0x26,
            Opcode::ReadyToTransfer => 0x31,
            Opcode::AsyncMessage => 0x32,
            Opcode::Reject => 0x3f,
        }
    }

    /// Which way PDUs with this opcode travel (target opcodes have bit 5
    /// set).
    pub fn direction(self) -> Direction {
        if self.code() & 0x20 == 0 {
            Direction::InitiatorToTarget
        } else {
            Direction::TargetToInitiator
        }
    }
}

/// Appends BHS, AHSs and header digest, after checking the lengths.
fn emit_header(
    bhs: &mut [u8; BHS_LEN],
    ahs_len: usize,
    write_ahs: impl FnOnce(&mut Vec<u8>),
    data_segment_len: u32,
    digests: Digests,
    out: &mut Vec<u8>,
) -> Result<(), EncodeError> {
    if data_segment_len > MAX_DATA_SEGMENT_LEN {
        return Err(EncodeError::DataSegmentTooLong {
            len: data_segment_len as usize,
        });
    }
    let words = u8::try_from(ahs_len / 4)
        .ok()
        .filter(|_| ahs_len.is_multiple_of(4))
        .ok_or(EncodeError::AhsTooLong { len: ahs_len })?;
    put8(bhs, 4, words);
    put24(bhs, 5, data_segment_len);
    let start = out.len();
    out.reserve(BHS_LEN + ahs_len + digests.header_len());
    out.extend_from_slice(bhs);
    write_ahs(out);
    if digests.header {
        let digest = header_digest(out.get(start..).unwrap_or(&[]));
        out.extend_from_slice(&digest_bytes(digest));
    }
    Ok(())
}

/// Appends the data segment, its padding and its digest.
fn emit_data(data: &[u8], digests: Digests, out: &mut Vec<u8>) {
    let pad = data_padding(data.len());
    out.reserve(data.len() + pad + digests.data_len(data.len()));
    out.extend_from_slice(data);
    out.extend_from_slice([0u8; 3].get(..pad).unwrap_or(&[]));
    if digests.data && !data.is_empty() {
        let mut d = DataDigest::new();
        d.update(data);
        out.extend_from_slice(&d.finish_bytes());
    }
}

fn data_len_u32(data: &[u8]) -> Result<u32, EncodeError> {
    u32::try_from(data.len())
        .ok()
        .filter(|&len| len <= MAX_DATA_SEGMENT_LEN)
        .ok_or(EncodeError::DataSegmentTooLong { len: data.len() })
}

/// A PDU an initiator sends.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum InitiatorPdu {
    NopOut(NopOut),
    ScsiCommand(ScsiCommand),
    TaskManagementRequest(TaskManagementRequest),
    LoginRequest(LoginRequest),
    TextRequest(TextRequest),
    DataOut(DataOut),
    LogoutRequest(LogoutRequest),
    SnackRequest(SnackRequest),
}

impl InitiatorPdu {
    /// The PDU's opcode.
    pub fn opcode(&self) -> Opcode {
        match self {
            InitiatorPdu::NopOut(_) => Opcode::NopOut,
            InitiatorPdu::ScsiCommand(_) => Opcode::ScsiCommand,
            InitiatorPdu::TaskManagementRequest(_) => Opcode::TaskManagementRequest,
            InitiatorPdu::LoginRequest(_) => Opcode::LoginRequest,
            InitiatorPdu::TextRequest(_) => Opcode::TextRequest,
            InitiatorPdu::DataOut(_) => Opcode::DataOut,
            InitiatorPdu::LogoutRequest(_) => Opcode::LogoutRequest,
            InitiatorPdu::SnackRequest(_) => Opcode::SnackRequest,
        }
    }

    /// The Initiator Task Tag.
    pub fn itt(&self) -> u32 {
        match self {
            InitiatorPdu::NopOut(p) => p.itt,
            InitiatorPdu::ScsiCommand(p) => p.itt,
            InitiatorPdu::TaskManagementRequest(p) => p.itt,
            InitiatorPdu::LoginRequest(p) => p.itt,
            InitiatorPdu::TextRequest(p) => p.itt,
            InitiatorPdu::DataOut(p) => p.itt,
            InitiatorPdu::LogoutRequest(p) => p.itt,
            InitiatorPdu::SnackRequest(p) => p.itt,
        }
    }

    /// Whether the immediate bit is set (Login Requests always are; Data-Out
    /// and SNACK never).
    pub fn immediate(&self) -> bool {
        match self {
            InitiatorPdu::NopOut(p) => p.immediate,
            InitiatorPdu::ScsiCommand(p) => p.immediate,
            InitiatorPdu::TaskManagementRequest(p) => p.immediate,
            InitiatorPdu::LoginRequest(_) => true,
            InitiatorPdu::TextRequest(p) => p.immediate,
            InitiatorPdu::LogoutRequest(p) => p.immediate,
            InitiatorPdu::DataOut(_) | InitiatorPdu::SnackRequest(_) => false,
        }
    }

    /// Parses a PDU of an initiator opcode from its BHS and AHS bytes.
    pub(crate) fn parse(
        opcode: Opcode,
        bhs: &[u8],
        ahs: &[u8],
    ) -> Option<Result<InitiatorPdu, FieldError>> {
        Some(Ok(match opcode {
            Opcode::NopOut => InitiatorPdu::NopOut(NopOut::parse(bhs)),
            Opcode::ScsiCommand => {
                return Some(ScsiCommand::parse(bhs, ahs).map(InitiatorPdu::ScsiCommand))
            }
            Opcode::TaskManagementRequest => {
                InitiatorPdu::TaskManagementRequest(TaskManagementRequest::parse(bhs))
            }
            Opcode::LoginRequest => InitiatorPdu::LoginRequest(LoginRequest::parse(bhs)),
            Opcode::TextRequest => InitiatorPdu::TextRequest(TextRequest::parse(bhs)),
            Opcode::DataOut => InitiatorPdu::DataOut(DataOut::parse(bhs)),
            Opcode::LogoutRequest => InitiatorPdu::LogoutRequest(LogoutRequest::parse(bhs)),
            Opcode::SnackRequest => InitiatorPdu::SnackRequest(SnackRequest::parse(bhs)),
            _ => return None,
        }))
    }

    /// Bytes [`InitiatorPdu::encode_header`] appends: BHS, AHSs, header
    /// digest.
    pub fn header_len(&self, digests: Digests) -> usize {
        let ahs = match self {
            InitiatorPdu::ScsiCommand(c) => {
                ahs::command_ahs_len(&c.extended_cdb, c.bidi_read_expected_data_transfer_length)
            }
            _ => 0,
        };
        BHS_LEN + ahs + digests.header_len()
    }

    /// Appends the header (BHS, AHSs and, if enabled, the header digest)
    /// for a data segment of `data_segment_len` bytes that the caller sends
    /// after it (padded, with its data digest: see [`crate::digest`]).
    pub fn encode_header(
        &self,
        data_segment_len: u32,
        digests: Digests,
        out: &mut Vec<u8>,
    ) -> Result<(), EncodeError> {
        let mut bhs = [0u8; BHS_LEN];
        match self {
            InitiatorPdu::NopOut(p) => p.write(&mut bhs),
            InitiatorPdu::ScsiCommand(p) => {
                p.write(&mut bhs);
                let ext = &p.extended_cdb;
                let bidi = p.bidi_read_expected_data_transfer_length;
                let ahs_len = ahs::command_ahs_len(ext, bidi);
                if ahs_len > MAX_AHS_LEN {
                    return Err(EncodeError::AhsTooLong { len: ahs_len });
                }
                let write = |out: &mut Vec<u8>| ahs::write_command_ahs(ext, bidi, out);
                return emit_header(&mut bhs, ahs_len, write, data_segment_len, digests, out);
            }
            InitiatorPdu::TaskManagementRequest(p) => p.write(&mut bhs),
            InitiatorPdu::LoginRequest(p) => p.write(&mut bhs),
            InitiatorPdu::TextRequest(p) => p.write(&mut bhs),
            InitiatorPdu::DataOut(p) => p.write(&mut bhs),
            InitiatorPdu::LogoutRequest(p) => p.write(&mut bhs),
            InitiatorPdu::SnackRequest(p) => p.write(&mut bhs),
        }
        emit_header(&mut bhs, 0, |_| {}, data_segment_len, digests, out)
    }

    /// Appends the whole PDU: header, `data`, zero padding, data digest.
    pub fn encode(
        &self,
        data: &[u8],
        digests: Digests,
        out: &mut Vec<u8>,
    ) -> Result<(), EncodeError> {
        self.encode_header(data_len_u32(data)?, digests, out)?;
        emit_data(data, digests, out);
        Ok(())
    }
}

/// A PDU a target sends.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TargetPdu {
    NopIn(NopIn),
    ScsiResponse(ScsiResponse),
    TaskManagementResponse(TaskManagementResponse),
    LoginResponse(LoginResponse),
    TextResponse(TextResponse),
    DataIn(DataIn),
    LogoutResponse(LogoutResponse),
    ReadyToTransfer(ReadyToTransfer),
    AsyncMessage(AsyncMessage),
    Reject(Reject),
}

impl TargetPdu {
    /// The PDU's opcode.
    pub fn opcode(&self) -> Opcode {
        match self {
            TargetPdu::NopIn(_) => Opcode::NopIn,
            TargetPdu::ScsiResponse(_) => Opcode::ScsiResponse,
            TargetPdu::TaskManagementResponse(_) => Opcode::TaskManagementResponse,
            TargetPdu::LoginResponse(_) => Opcode::LoginResponse,
            TargetPdu::TextResponse(_) => Opcode::TextResponse,
            TargetPdu::DataIn(_) => Opcode::DataIn,
            TargetPdu::LogoutResponse(_) => Opcode::LogoutResponse,
            TargetPdu::ReadyToTransfer(_) => Opcode::ReadyToTransfer,
            TargetPdu::AsyncMessage(_) => Opcode::AsyncMessage,
            TargetPdu::Reject(_) => Opcode::Reject,
        }
    }

    /// The Initiator Task Tag (0xffffffff for Asynchronous Message and
    /// Reject).
    pub fn itt(&self) -> u32 {
        match self {
            TargetPdu::NopIn(p) => p.itt,
            TargetPdu::ScsiResponse(p) => p.itt,
            TargetPdu::TaskManagementResponse(p) => p.itt,
            TargetPdu::LoginResponse(p) => p.itt,
            TargetPdu::TextResponse(p) => p.itt,
            TargetPdu::DataIn(p) => p.itt,
            TargetPdu::LogoutResponse(p) => p.itt,
            TargetPdu::ReadyToTransfer(p) => p.itt,
            TargetPdu::AsyncMessage(_) | TargetPdu::Reject(_) => RESERVED_TAG,
        }
    }

    /// Parses a PDU of a target opcode from its BHS (AHSs are skipped: no
    /// target PDU defines one).
    pub(crate) fn parse(opcode: Opcode, bhs: &[u8]) -> Option<Result<TargetPdu, FieldError>> {
        Some(Ok(match opcode {
            Opcode::NopIn => TargetPdu::NopIn(NopIn::parse(bhs)),
            Opcode::ScsiResponse => {
                return Some(ScsiResponse::parse(bhs).map(TargetPdu::ScsiResponse))
            }
            Opcode::TaskManagementResponse => {
                TargetPdu::TaskManagementResponse(TaskManagementResponse::parse(bhs))
            }
            Opcode::LoginResponse => TargetPdu::LoginResponse(LoginResponse::parse(bhs)),
            Opcode::TextResponse => TargetPdu::TextResponse(TextResponse::parse(bhs)),
            Opcode::DataIn => return Some(DataIn::parse(bhs).map(TargetPdu::DataIn)),
            Opcode::LogoutResponse => TargetPdu::LogoutResponse(LogoutResponse::parse(bhs)),
            Opcode::ReadyToTransfer => TargetPdu::ReadyToTransfer(ReadyToTransfer::parse(bhs)),
            Opcode::AsyncMessage => TargetPdu::AsyncMessage(AsyncMessage::parse(bhs)),
            Opcode::Reject => TargetPdu::Reject(Reject::parse(bhs)),
            _ => return None,
        }))
    }

    /// Bytes [`TargetPdu::encode_header`] appends: BHS and header digest.
    pub fn header_len(&self, digests: Digests) -> usize {
        BHS_LEN + digests.header_len()
    }

    /// The 48-byte BHS for a data segment of `data_segment_len` bytes
    /// (`None` if that does not fit DataSegmentLength).
    pub fn bhs(&self, data_segment_len: u32) -> Option<[u8; BHS_LEN]> {
        if data_segment_len > MAX_DATA_SEGMENT_LEN {
            return None;
        }
        let mut bhs = [0u8; BHS_LEN];
        match self {
            TargetPdu::NopIn(p) => p.write(&mut bhs),
            TargetPdu::ScsiResponse(p) => p.write(&mut bhs),
            TargetPdu::TaskManagementResponse(p) => p.write(&mut bhs),
            TargetPdu::LoginResponse(p) => p.write(&mut bhs),
            TargetPdu::TextResponse(p) => p.write(&mut bhs),
            TargetPdu::DataIn(p) => p.write(&mut bhs),
            TargetPdu::LogoutResponse(p) => p.write(&mut bhs),
            TargetPdu::ReadyToTransfer(p) => p.write(&mut bhs),
            TargetPdu::AsyncMessage(p) => p.write(&mut bhs),
            TargetPdu::Reject(p) => p.write(&mut bhs),
        }
        put24(&mut bhs, 5, data_segment_len);
        Some(bhs)
    }

    /// Appends the header (BHS and, if enabled, the header digest) for a
    /// data segment of `data_segment_len` bytes that the caller sends after
    /// it (padded, with its data digest: see [`crate::digest`]).
    pub fn encode_header(
        &self,
        data_segment_len: u32,
        digests: Digests,
        out: &mut Vec<u8>,
    ) -> Result<(), EncodeError> {
        let mut bhs = self
            .bhs(data_segment_len)
            .ok_or(EncodeError::DataSegmentTooLong {
                len: data_segment_len as usize,
            })?;
        emit_header(&mut bhs, 0, |_| {}, data_segment_len, digests, out)
    }

    /// Appends the whole PDU: header, `data`, zero padding, data digest.
    pub fn encode(
        &self,
        data: &[u8],
        digests: Digests,
        out: &mut Vec<u8>,
    ) -> Result<(), EncodeError> {
        self.encode_header(data_len_u32(data)?, digests, out)?;
        emit_data(data, digests, out);
        Ok(())
    }
}

macro_rules! from_pdu {
    ($enum:ident: $($ty:ident),*) => {
        $(impl From<$ty> for $enum {
            fn from(pdu: $ty) -> $enum {
                $enum::$ty(pdu)
            }
        })*
    };
}

from_pdu!(InitiatorPdu: NopOut, ScsiCommand, TaskManagementRequest, LoginRequest, TextRequest,
    DataOut, LogoutRequest, SnackRequest);
from_pdu!(TargetPdu: NopIn, ScsiResponse, TaskManagementResponse, LoginResponse, TextResponse,
    DataIn, LogoutResponse, ReadyToTransfer, AsyncMessage, Reject);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding() {
        assert_eq!([0, 1, 2, 3, 4, 5].map(data_padding), [0, 3, 2, 1, 0, 3]);
    }

    #[test]
    fn opcodes() {
        for byte in 0..=255u8 {
            if let Some(op) = Opcode::from_byte(byte) {
                assert_eq!(op.code(), byte & 0x3f);
            }
        }
        assert_eq!(Opcode::from_byte(0x43), Some(Opcode::LoginRequest));
        assert_eq!(Opcode::from_byte(0x1c), None);
        assert_eq!(Opcode::Reject.direction(), Direction::TargetToInitiator);
        assert_eq!(
            Opcode::SnackRequest.direction(),
            Direction::InitiatorToTarget
        );
    }

    #[test]
    fn too_long() {
        let nop = TargetPdu::NopIn(NopIn {
            lun: 0,
            itt: 1,
            ttt: RESERVED_TAG,
            stat_sn: 0,
            exp_cmd_sn: 0,
            max_cmd_sn: 0,
        });
        let mut out = vec![7];
        assert_eq!(
            nop.encode_header(1 << 24, Digests::NONE, &mut out),
            Err(EncodeError::DataSegmentTooLong { len: 1 << 24 })
        );
        assert_eq!(out, [7]);
        let cmd = InitiatorPdu::ScsiCommand(ScsiCommand {
            immediate: false,
            final_pdu: true,
            read: false,
            write: false,
            attr: TaskAttribute::Simple,
            lun: 0,
            itt: 0,
            expected_data_transfer_length: 0,
            cmd_sn: 0,
            exp_stat_sn: 0,
            bhs_cdb: [0; 16],
            extended_cdb: vec![0; MAX_AHS_LEN - 3],
            bidi_read_expected_data_transfer_length: None,
        });
        assert!(matches!(
            cmd.encode_header(0, Digests::BOTH, &mut out),
            Err(EncodeError::AhsTooLong { .. })
        ));
        assert_eq!(out, [7]);
    }
}
