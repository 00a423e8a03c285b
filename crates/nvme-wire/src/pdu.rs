//! NVMe/TCP PDUs (NVMe/TCP Transport Specification 1.0, section 3.6): the
//! PDU types, the 8-byte common header, every PDU-specific header, the
//! fatal error status codes, and an encoder for every PDU.
//!
//! Invariants:
//! - Every integer is little-endian; reserved bytes are written as zero.
//! - Encoders append one complete PDU (or, for [`C2HDataHeader`], the part
//!   before the data) to a caller-supplied `Vec<u8>`; they allocate only
//!   when that vector must grow, so a reused vector means no allocation per
//!   PDU. An encoder that fails leaves the vector untouched.
//! - Padding between the header (and its digest) and the data is zeros and
//!   brings the data to the alignment the receiver asked for: HPDA for
//!   controller-to-host PDUs, CPDA for host-to-controller PDUs.
//! - [`crate::decoder::decode_pdu`] turns every encoded PDU back into the
//!   value it came from.

use crate::bytes::{le16, le32, put, put16, put32, put8, u8_at};
use crate::completion::{Cqe, CQE_LEN};
use crate::digest::{crc32c, Digests};
use crate::sqe::{Sqe, SQE_LEN};
use crate::WireError;

/// Length of the common header every PDU starts with.
pub const COMMON_HEADER_LEN: usize = 8;
/// HLEN and PLEN of ICReq and ICResp.
pub const IC_PDU_LEN: usize = 128;
/// HLEN of H2CTermReq and C2HTermReq.
pub const TERM_REQ_HEADER_LEN: usize = 24;
/// Most bytes of the offending PDU's header a termination request carries.
pub const TERM_REQ_MAX_ERROR_DATA: usize = 128;
/// Largest PLEN of a termination request.
pub const TERM_REQ_MAX_LEN: usize = TERM_REQ_HEADER_LEN + TERM_REQ_MAX_ERROR_DATA;
/// HLEN of CapsuleCmd: common header plus the 64-byte SQE.
pub const CAPSULE_CMD_HEADER_LEN: usize = COMMON_HEADER_LEN + SQE_LEN;
/// HLEN of CapsuleResp: common header plus the 16-byte CQE.
pub const CAPSULE_RESP_HEADER_LEN: usize = COMMON_HEADER_LEN + CQE_LEN;
/// HLEN of H2CData and C2HData.
pub const DATA_HEADER_LEN: usize = 24;
/// HLEN of R2T.
pub const R2T_HEADER_LEN: usize = 24;
/// The only PDU format version defined (PFV 1.0 is encoded as 0).
pub const PFV_1_0: u16 = 0;
/// Largest HPDA/CPDA value (0's based dwords: 128-byte alignment).
pub const MAX_PDA: u8 = 31;
/// Smallest MAXH2CDATA a controller may announce.
pub const MIN_MAXH2CDATA: u32 = 4096;
/// The IANA port of NVMe/TCP I/O controllers.
pub const DEFAULT_PORT: u16 = 4420;
/// The IANA port of NVMe/TCP discovery controllers.
pub const DISCOVERY_PORT: u16 = 8009;

/// Bits of the common header's FLAGS byte.
pub mod flags {
    /// HDGSTF: a header digest follows the header.
    pub const HDGSTF: u8 = 1 << 0;
    /// DDGSTF: a data digest follows the data.
    pub const DDGSTF: u8 = 1 << 1;
    /// LAST_PDU (H2CData, C2HData): the last data PDU of the transfer.
    pub const LAST_PDU: u8 = 1 << 2;
    /// SUCCESS (C2HData only): the command succeeded and no CapsuleResp
    /// follows; only allowed together with LAST_PDU.
    pub const SUCCESS: u8 = 1 << 3;
}

/// PDU types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PduType {
    /// 00h: Initialize Connection Request (host to controller).
    IcReq,
    /// 01h: Initialize Connection Response.
    IcResp,
    /// 02h: Host to Controller Terminate Connection Request.
    H2CTermReq,
    /// 03h: Controller to Host Terminate Connection Request.
    C2HTermReq,
    /// 04h: Command Capsule.
    CapsuleCmd,
    /// 05h: Response Capsule.
    CapsuleResp,
    /// 06h: Host to Controller Data.
    H2CData,
    /// 07h: Controller to Host Data.
    C2HData,
    /// 09h: Ready to Transfer.
    R2T,
}

/// Which way a PDU travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Sent by the host, received by the controller.
    HostToController,
    /// Sent by the controller, received by the host.
    ControllerToHost,
}

impl PduType {
    /// The type for a PDU-Type byte, `None` if undefined.
    pub fn from_code(code: u8) -> Option<PduType> {
        Some(match code {
            0x00 => PduType::IcReq,
            0x01 => PduType::IcResp,
            0x02 => PduType::H2CTermReq,
            0x03 => PduType::C2HTermReq,
            0x04 => PduType::CapsuleCmd,
            0x05 => PduType::CapsuleResp,
            0x06 => PduType::H2CData,
            0x07 => PduType::C2HData,
            0x09 => PduType::R2T,
            _ => return None,
        })
    }

    /// The PDU-Type byte.
    pub fn code(self) -> u8 {
        match self {
            PduType::IcReq => 0x00,
            PduType::IcResp => 0x01,
            PduType::H2CTermReq => 0x02,
            PduType::C2HTermReq => 0x03,
            PduType::CapsuleCmd => 0x04,
            PduType::CapsuleResp => 0x05,
            PduType::H2CData => 0x06,
            PduType::C2HData => 0x07,
            PduType::R2T => 0x09,
        }
    }

    /// The fixed HLEN of the type.
    pub fn header_len(self) -> usize {
        match self {
            PduType::IcReq | PduType::IcResp => IC_PDU_LEN,
            PduType::H2CTermReq | PduType::C2HTermReq => TERM_REQ_HEADER_LEN,
            PduType::CapsuleCmd => CAPSULE_CMD_HEADER_LEN,
            PduType::CapsuleResp => CAPSULE_RESP_HEADER_LEN,
            PduType::H2CData | PduType::C2HData => DATA_HEADER_LEN,
            PduType::R2T => R2T_HEADER_LEN,
        }
    }

    /// True when a negotiated header digest follows this type's header
    /// (every type except ICReq, ICResp and the termination requests).
    pub fn has_header_digest(self) -> bool {
        !matches!(
            self,
            PduType::IcReq | PduType::IcResp | PduType::H2CTermReq | PduType::C2HTermReq
        )
    }

    /// True for the types whose data is placed at PDO and covered by a
    /// negotiated data digest (CapsuleCmd, H2CData, C2HData).
    pub fn carries_data(self) -> bool {
        matches!(
            self,
            PduType::CapsuleCmd | PduType::H2CData | PduType::C2HData
        )
    }

    /// Which way this type travels.
    pub fn direction(self) -> Direction {
        match self {
            PduType::IcReq | PduType::H2CTermReq | PduType::CapsuleCmd | PduType::H2CData => {
                Direction::HostToController
            }
            PduType::IcResp
            | PduType::C2HTermReq
            | PduType::CapsuleResp
            | PduType::C2HData
            | PduType::R2T => Direction::ControllerToHost,
        }
    }
}

/// Fatal Error Status of a termination request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fes {
    /// 01h: Invalid PDU Header Field; FEI is the byte offset of the field.
    InvalidHeaderField,
    /// 02h: PDU Sequence Error.
    PduSequenceError,
    /// 03h: Header Digest Error.
    HeaderDigestError,
    /// 04h: Data Transfer Out of Range.
    DataTransferOutOfRange,
    /// 05h: Data Transfer Limit Exceeded (also named R2T Limit Exceeded).
    DataTransferLimitExceeded,
    /// 06h: Unsupported Parameter; FEI is the byte offset of the field.
    UnsupportedParameter,
}

impl Fes {
    /// The FES value.
    pub fn code(self) -> u16 {
        match self {
            Fes::InvalidHeaderField => 0x01,
            Fes::PduSequenceError => 0x02,
            Fes::HeaderDigestError => 0x03,
            Fes::DataTransferOutOfRange => 0x04,
            Fes::DataTransferLimitExceeded => 0x05,
            Fes::UnsupportedParameter => 0x06,
        }
    }

    /// The status for a FES value, `None` if undefined.
    pub fn from_code(code: u16) -> Option<Fes> {
        Some(match code {
            0x01 => Fes::InvalidHeaderField,
            0x02 => Fes::PduSequenceError,
            0x03 => Fes::HeaderDigestError,
            0x04 => Fes::DataTransferOutOfRange,
            0x05 => Fes::DataTransferLimitExceeded,
            0x06 => Fes::UnsupportedParameter,
            _ => return None,
        })
    }
}

/// The settings ICReq/ICResp fix for the rest of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Negotiated {
    /// Enabled digests.
    pub digests: Digests,
    /// Host PDU data alignment (from ICReq): data of controller-to-host
    /// PDUs starts at a multiple of `(hpda + 1) * 4` bytes.
    pub hpda: u8,
    /// Controller PDU data alignment (from ICResp): the same for
    /// host-to-controller PDUs.
    pub cpda: u8,
}

impl Negotiated {
    /// Before ICReq/ICResp: no digests, no alignment beyond dwords.
    pub const INITIAL: Negotiated = Negotiated {
        digests: Digests::NONE,
        hpda: 0,
        cpda: 0,
    };

    /// The settings an ICReq/ICResp exchange fixes: the digests the
    /// controller enabled in its ICResp, the host's HPDA and the
    /// controller's CPDA.
    pub fn from_exchange(ic_req: &IcReq, ic_resp: &IcResp) -> Negotiated {
        Negotiated {
            digests: ic_resp.digests,
            hpda: ic_req.hpda.min(MAX_PDA),
            cpda: ic_resp.cpda.min(MAX_PDA),
        }
    }

    /// The PDA that applies to PDUs of `pdu_type`.
    pub fn pda_for(&self, pdu_type: PduType) -> u8 {
        match pdu_type.direction() {
            Direction::HostToController => self.cpda,
            Direction::ControllerToHost => self.hpda,
        }
    }

    /// Header digest length for `pdu_type` (0 or 4).
    pub fn header_digest_len(&self, pdu_type: PduType) -> usize {
        if pdu_type.has_header_digest() {
            self.digests.header_len()
        } else {
            0
        }
    }

    /// The PDO of a data-carrying PDU of `pdu_type` with non-empty data:
    /// header, header digest, then padding to the alignment.
    pub fn data_offset(&self, pdu_type: PduType) -> usize {
        let end = pdu_type.header_len() + self.header_digest_len(pdu_type);
        end.next_multiple_of(pda_alignment(self.pda_for(pdu_type)))
    }
}

/// Alignment in bytes that a PDA value (0's based dwords) demands; values
/// above [`MAX_PDA`] are treated as [`MAX_PDA`].
pub fn pda_alignment(pda: u8) -> usize {
    (usize::from(pda.min(MAX_PDA)) + 1) * 4
}

/// The common header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CommonHeader {
    /// PDU-Type byte.
    pub pdu_type: u8,
    /// FLAGS (see [`flags`]).
    pub flags: u8,
    /// Header length: common plus PDU-specific header, without digest.
    pub hlen: u8,
    /// PDU data offset (0 when the PDU carries no data).
    pub pdo: u8,
    /// Total PDU length including digests and padding.
    pub plen: u32,
}

impl CommonHeader {
    /// Reads the first 8 bytes, `None` if fewer are given.
    pub fn parse(buf: &[u8]) -> Option<CommonHeader> {
        if buf.len() < COMMON_HEADER_LEN {
            return None;
        }
        Some(CommonHeader {
            pdu_type: u8_at(buf, 0),
            flags: u8_at(buf, 1),
            hlen: u8_at(buf, 2),
            pdo: u8_at(buf, 3),
            plen: le32(buf, 4),
        })
    }

    /// The 8 bytes.
    pub fn to_bytes(&self) -> [u8; COMMON_HEADER_LEN] {
        let mut b = [0u8; COMMON_HEADER_LEN];
        put8(&mut b, 0, self.pdu_type);
        put8(&mut b, 1, self.flags);
        put8(&mut b, 2, self.hlen);
        put8(&mut b, 3, self.pdo);
        put32(&mut b, 4, self.plen);
        b
    }
}

/// ICReq: the host's connection parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IcReq {
    /// PDU format version (byte 8); only [`PFV_1_0`] is defined.
    pub pfv: u16,
    /// Host PDU data alignment (byte 10), at most [`MAX_PDA`].
    pub hpda: u8,
    /// Requested digests (byte 11).
    pub digests: Digests,
    /// Maximum outstanding R2Ts per command, 0's based (bytes 12-15).
    pub maxr2t: u32,
}

/// ICResp: the controller's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IcResp {
    /// PDU format version (byte 8).
    pub pfv: u16,
    /// Controller PDU data alignment (byte 10), at most [`MAX_PDA`].
    pub cpda: u8,
    /// Enabled digests (byte 11); Linux hosts refuse the connection unless
    /// this equals what their ICReq asked for.
    pub digests: Digests,
    /// Most data bytes per H2CData PDU (bytes 12-15): a multiple of 4, at
    /// least [`MIN_MAXH2CDATA`].
    pub maxh2cdata: u32,
}

/// H2CTermReq or C2HTermReq.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TermReq<'a> {
    /// Fatal error status (bytes 8-9), see [`Fes`]; kept raw.
    pub fes: u16,
    /// Fatal error information (bytes 10-13).
    pub fei: u32,
    /// Header of the PDU in error (at most [`TERM_REQ_MAX_ERROR_DATA`]
    /// bytes), following the 24-byte header.
    pub error_data: &'a [u8],
}

/// CapsuleCmd: a command and its in-capsule data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CapsuleCmd<'a> {
    /// The submission queue entry.
    pub sqe: Sqe,
    /// In-capsule data (empty when none).
    pub data: &'a [u8],
}

/// CapsuleResp: a completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CapsuleResp {
    /// The completion queue entry.
    pub cqe: Cqe,
}

/// H2CData: write data the controller asked for with an R2T.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct H2CData<'a> {
    /// Command identifier (bytes 8-9).
    pub cccid: u16,
    /// Transfer tag from the R2T (bytes 10-11).
    pub ttag: u16,
    /// Offset of this data within the command's data (bytes 12-15).
    pub datao: u32,
    /// LAST_PDU flag.
    pub last: bool,
    /// The data; its length is DATAL (bytes 16-19).
    pub data: &'a [u8],
}

/// C2HData: read data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct C2HData<'a> {
    /// Command identifier (bytes 8-9).
    pub cccid: u16,
    /// Offset of this data within the command's data (bytes 12-15).
    pub datao: u32,
    /// LAST_PDU flag.
    pub last: bool,
    /// SUCCESS flag (requires `last`).
    pub success: bool,
    /// The data; its length is DATAL (bytes 16-19).
    pub data: &'a [u8],
}

/// The header of a C2HData PDU whose data the caller sends itself (from
/// its own buffers, followed by the digest from
/// [`crate::digest::DataDigest`] when data digests are enabled).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct C2HDataHeader {
    /// Command identifier.
    pub cccid: u16,
    /// Offset of this data within the command's data.
    pub datao: u32,
    /// Length of the data that follows.
    pub datal: u32,
    /// LAST_PDU flag.
    pub last: bool,
    /// SUCCESS flag (requires `last`).
    pub success: bool,
}

/// R2T: the controller asks for write data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct R2T {
    /// Command identifier (bytes 8-9).
    pub cccid: u16,
    /// Transfer tag the host echoes in its H2CData (bytes 10-11).
    pub ttag: u16,
    /// Offset of the requested data within the command's data (12-15).
    pub r2to: u32,
    /// Length of the requested data (16-19).
    pub r2tl: u32,
}

/// Any decoded PDU. Data fields borrow from the receive buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pdu<'a> {
    IcReq(IcReq),
    IcResp(IcResp),
    H2CTermReq(TermReq<'a>),
    C2HTermReq(TermReq<'a>),
    CapsuleCmd(CapsuleCmd<'a>),
    CapsuleResp(CapsuleResp),
    H2CData(H2CData<'a>),
    C2HData(C2HData<'a>),
    R2T(R2T),
}

impl Pdu<'_> {
    /// The PDU's type.
    pub fn pdu_type(&self) -> PduType {
        match self {
            Pdu::IcReq(_) => PduType::IcReq,
            Pdu::IcResp(_) => PduType::IcResp,
            Pdu::H2CTermReq(_) => PduType::H2CTermReq,
            Pdu::C2HTermReq(_) => PduType::C2HTermReq,
            Pdu::CapsuleCmd(_) => PduType::CapsuleCmd,
            Pdu::CapsuleResp(_) => PduType::CapsuleResp,
            Pdu::H2CData(_) => PduType::H2CData,
            Pdu::C2HData(_) => PduType::C2HData,
            Pdu::R2T(_) => PduType::R2T,
        }
    }

    /// Appends the encoded PDU to `out`, using the connection's negotiated
    /// digests and alignment.
    pub fn encode(&self, negotiated: &Negotiated, out: &mut Vec<u8>) -> Result<(), WireError> {
        match self {
            Pdu::IcReq(p) => p.encode(out),
            Pdu::IcResp(p) => p.encode(out),
            Pdu::H2CTermReq(p) => p.encode(PduType::H2CTermReq, out),
            Pdu::C2HTermReq(p) => p.encode(PduType::C2HTermReq, out),
            Pdu::CapsuleCmd(p) => return p.encode(negotiated, out),
            Pdu::CapsuleResp(p) => p.encode(negotiated, out),
            Pdu::H2CData(p) => return p.encode(negotiated, out),
            Pdu::C2HData(p) => return p.encode(negotiated, out),
            Pdu::R2T(p) => p.encode(negotiated, out),
        }
        Ok(())
    }
}

/// Appends the common header; returns where the PDU starts in `out`.
fn start_pdu(out: &mut Vec<u8>, ch: CommonHeader, total: usize) -> usize {
    out.reserve(total);
    let start = out.len();
    out.extend_from_slice(&ch.to_bytes());
    start
}

/// Appends the header digest over `out[start..]` when `enabled`.
fn finish_header(out: &mut Vec<u8>, start: usize, enabled: bool) {
    if enabled {
        let digest = crc32c(out.get(start..).unwrap_or(&[]));
        out.extend_from_slice(&digest.to_le_bytes());
    }
}

/// Zero padding up to `start + pdo`.
fn pad_to(out: &mut Vec<u8>, start: usize, pdo: usize) {
    out.resize(start + pdo, 0);
}

fn plen_of(total: usize, what: &'static str) -> Result<u32, WireError> {
    u32::try_from(total).map_err(|_| WireError::DoesNotFit {
        what,
        reason: "the PDU would be longer than 4 GiB",
    })
}

impl IcReq {
    /// Appends the 128-byte ICReq.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let ch = CommonHeader {
            pdu_type: PduType::IcReq.code(),
            flags: 0,
            hlen: IC_PDU_LEN as u8,
            pdo: 0,
            plen: IC_PDU_LEN as u32,
        };
        let mut b = [0u8; IC_PDU_LEN];
        put(&mut b, 0, &ch.to_bytes());
        put16(&mut b, 8, self.pfv);
        put8(&mut b, 10, self.hpda);
        put8(&mut b, 11, self.digests.bits());
        put32(&mut b, 12, self.maxr2t);
        out.extend_from_slice(&b);
    }

    pub(crate) fn parse_psh(b: &[u8]) -> IcReq {
        IcReq {
            pfv: le16(b, 8),
            hpda: u8_at(b, 10),
            digests: Digests::from_bits(u8_at(b, 11)),
            maxr2t: le32(b, 12),
        }
    }
}

impl IcResp {
    /// Appends the 128-byte ICResp.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let ch = CommonHeader {
            pdu_type: PduType::IcResp.code(),
            flags: 0,
            hlen: IC_PDU_LEN as u8,
            pdo: 0,
            plen: IC_PDU_LEN as u32,
        };
        let mut b = [0u8; IC_PDU_LEN];
        put(&mut b, 0, &ch.to_bytes());
        put16(&mut b, 8, self.pfv);
        put8(&mut b, 10, self.cpda);
        put8(&mut b, 11, self.digests.bits());
        put32(&mut b, 12, self.maxh2cdata);
        out.extend_from_slice(&b);
    }

    pub(crate) fn parse_psh(b: &[u8]) -> IcResp {
        IcResp {
            pfv: le16(b, 8),
            cpda: u8_at(b, 10),
            digests: Digests::from_bits(u8_at(b, 11)),
            maxh2cdata: le32(b, 12),
        }
    }
}

impl TermReq<'_> {
    /// A termination request for a fatal error, echoing (up to 128 bytes
    /// of) the offending PDU's header; see
    /// [`crate::decoder::term_req_error_data`].
    pub fn new(fes: Fes, fei: u32, error_data: &[u8]) -> TermReq<'_> {
        TermReq {
            fes: fes.code(),
            fei,
            error_data,
        }
    }

    /// Appends the PDU as `pdu_type` ([`PduType::C2HTermReq`] from a
    /// controller, [`PduType::H2CTermReq`] from a host; any other type is
    /// treated as C2HTermReq). Error data beyond
    /// [`TERM_REQ_MAX_ERROR_DATA`] bytes is cut off. Termination requests
    /// never carry digests and their data directly follows the header (PDO
    /// is 0).
    pub fn encode(&self, pdu_type: PduType, out: &mut Vec<u8>) {
        let pdu_type = if pdu_type == PduType::H2CTermReq {
            PduType::H2CTermReq
        } else {
            PduType::C2HTermReq
        };
        let data = self
            .error_data
            .get(..TERM_REQ_MAX_ERROR_DATA)
            .unwrap_or(self.error_data);
        let total = TERM_REQ_HEADER_LEN + data.len();
        let ch = CommonHeader {
            pdu_type: pdu_type.code(),
            flags: 0,
            hlen: TERM_REQ_HEADER_LEN as u8,
            pdo: 0,
            plen: total as u32,
        };
        let mut b = [0u8; TERM_REQ_HEADER_LEN];
        put(&mut b, 0, &ch.to_bytes());
        put16(&mut b, 8, self.fes);
        put32(&mut b, 10, self.fei);
        out.reserve(total);
        out.extend_from_slice(&b);
        out.extend_from_slice(data);
    }
}

impl CapsuleCmd<'_> {
    /// Appends the CapsuleCmd with its in-capsule data.
    pub fn encode(&self, negotiated: &Negotiated, out: &mut Vec<u8>) -> Result<(), WireError> {
        let ty = PduType::CapsuleCmd;
        let hdgst = negotiated.header_digest_len(ty);
        let (pdo, ddgst) = if self.data.is_empty() {
            (0, 0)
        } else {
            (negotiated.data_offset(ty), negotiated.digests.data_len())
        };
        let total = if self.data.is_empty() {
            ty.header_len() + hdgst
        } else {
            pdo + self.data.len() + ddgst
        };
        let plen = plen_of(total, "CapsuleCmd")?;
        let mut flags = 0;
        if hdgst > 0 {
            flags |= flags::HDGSTF;
        }
        if ddgst > 0 {
            flags |= flags::DDGSTF;
        }
        let ch = CommonHeader {
            pdu_type: ty.code(),
            flags,
            hlen: ty.header_len() as u8,
            pdo: pdo as u8,
            plen,
        };
        let start = start_pdu(out, ch, total);
        out.extend_from_slice(&self.sqe.to_bytes());
        finish_header(out, start, hdgst > 0);
        if !self.data.is_empty() {
            pad_to(out, start, pdo);
            out.extend_from_slice(self.data);
            if ddgst > 0 {
                out.extend_from_slice(&crc32c(self.data).to_le_bytes());
            }
        }
        Ok(())
    }
}

impl CapsuleResp {
    /// Appends the CapsuleResp (24 bytes, plus the header digest).
    pub fn encode(&self, negotiated: &Negotiated, out: &mut Vec<u8>) {
        let ty = PduType::CapsuleResp;
        let hdgst = negotiated.header_digest_len(ty);
        let total = ty.header_len() + hdgst;
        let ch = CommonHeader {
            pdu_type: ty.code(),
            flags: if hdgst > 0 { flags::HDGSTF } else { 0 },
            hlen: ty.header_len() as u8,
            pdo: 0,
            plen: total as u32,
        };
        let start = start_pdu(out, ch, total);
        out.extend_from_slice(&self.cqe.to_bytes());
        finish_header(out, start, hdgst > 0);
    }
}

/// The fields of an H2CData or C2HData header.
struct DataFields {
    pdu_type: PduType,
    cccid: u16,
    ttag: u16,
    datao: u32,
    datal: u32,
    /// LAST_PDU and SUCCESS.
    flags: u8,
}

/// Appends a data PDU's header, header digest and padding; returns the
/// length of the data digest that must follow the data (0 or 4).
fn encode_data_header(
    f: &DataFields,
    negotiated: &Negotiated,
    out: &mut Vec<u8>,
) -> Result<usize, WireError> {
    let ty = f.pdu_type;
    let hdgst = negotiated.header_digest_len(ty);
    let data_len = usize::try_from(f.datal).map_err(|_| WireError::DoesNotFit {
        what: "data PDU",
        reason: "data length does not fit in memory",
    })?;
    let (pdo, ddgst) = if f.datal == 0 {
        (0, 0)
    } else {
        (negotiated.data_offset(ty), negotiated.digests.data_len())
    };
    let total = if f.datal == 0 {
        ty.header_len() + hdgst
    } else {
        pdo.saturating_add(data_len).saturating_add(ddgst)
    };
    let plen = plen_of(total, "data PDU")?;
    let mut flags = f.flags;
    if hdgst > 0 {
        flags |= flags::HDGSTF;
    }
    if ddgst > 0 {
        flags |= flags::DDGSTF;
    }
    let ch = CommonHeader {
        pdu_type: ty.code(),
        flags,
        hlen: ty.header_len() as u8,
        pdo: pdo as u8,
        plen,
    };
    let header_total = if f.datal == 0 { total } else { pdo };
    let start = start_pdu(out, ch, header_total);
    let mut psh = [0u8; DATA_HEADER_LEN - COMMON_HEADER_LEN];
    put16(&mut psh, 0, f.cccid);
    put16(&mut psh, 2, f.ttag);
    put32(&mut psh, 4, f.datao);
    put32(&mut psh, 8, f.datal);
    out.extend_from_slice(&psh);
    finish_header(out, start, hdgst > 0);
    if f.datal > 0 {
        pad_to(out, start, pdo);
    }
    Ok(ddgst)
}

impl H2CData<'_> {
    /// Appends the H2CData PDU with its data.
    pub fn encode(&self, negotiated: &Negotiated, out: &mut Vec<u8>) -> Result<(), WireError> {
        let datal = u32::try_from(self.data.len()).map_err(|_| WireError::DoesNotFit {
            what: "H2CData",
            reason: "more than 4 GiB of data",
        })?;
        let fields = DataFields {
            pdu_type: PduType::H2CData,
            cccid: self.cccid,
            ttag: self.ttag,
            datao: self.datao,
            datal,
            flags: if self.last { flags::LAST_PDU } else { 0 },
        };
        let ddgst = encode_data_header(&fields, negotiated, out)?;
        out.extend_from_slice(self.data);
        if ddgst > 0 {
            out.extend_from_slice(&crc32c(self.data).to_le_bytes());
        }
        Ok(())
    }
}

impl C2HDataHeader {
    /// Appends everything of the C2HData PDU that precedes the data:
    /// common header, PDU-specific header, header digest and padding. The
    /// caller then sends `datal` bytes of data and, when data digests are
    /// enabled and `datal > 0`, their digest.
    pub fn encode(&self, negotiated: &Negotiated, out: &mut Vec<u8>) -> Result<(), WireError> {
        if self.success && !self.last {
            return Err(WireError::DoesNotFit {
                what: "C2HData",
                reason: "SUCCESS requires LAST_PDU",
            });
        }
        let mut extra = 0;
        if self.last {
            extra |= flags::LAST_PDU;
        }
        if self.success {
            extra |= flags::SUCCESS;
        }
        let fields = DataFields {
            pdu_type: PduType::C2HData,
            cccid: self.cccid,
            ttag: 0,
            datao: self.datao,
            datal: self.datal,
            flags: extra,
        };
        encode_data_header(&fields, negotiated, out).map(|_| ())
    }

    /// Total PDU length (PLEN) for these settings: what the caller will
    /// have sent once the data and digest follow the header.
    pub fn pdu_len(&self, negotiated: &Negotiated) -> u64 {
        let ty = PduType::C2HData;
        if self.datal == 0 {
            (ty.header_len() + negotiated.header_digest_len(ty)) as u64
        } else {
            (negotiated.data_offset(ty) + negotiated.digests.data_len()) as u64
                + u64::from(self.datal)
        }
    }
}

impl C2HData<'_> {
    /// Appends the C2HData PDU with its data.
    pub fn encode(&self, negotiated: &Negotiated, out: &mut Vec<u8>) -> Result<(), WireError> {
        let datal = u32::try_from(self.data.len()).map_err(|_| WireError::DoesNotFit {
            what: "C2HData",
            reason: "more than 4 GiB of data",
        })?;
        let header = C2HDataHeader {
            cccid: self.cccid,
            datao: self.datao,
            datal,
            last: self.last,
            success: self.success,
        };
        header.encode(negotiated, out)?;
        out.extend_from_slice(self.data);
        if !self.data.is_empty() && negotiated.digests.data {
            out.extend_from_slice(&crc32c(self.data).to_le_bytes());
        }
        Ok(())
    }
}

impl R2T {
    /// Appends the R2T (24 bytes, plus the header digest).
    pub fn encode(&self, negotiated: &Negotiated, out: &mut Vec<u8>) {
        let ty = PduType::R2T;
        let hdgst = negotiated.header_digest_len(ty);
        let total = ty.header_len() + hdgst;
        let ch = CommonHeader {
            pdu_type: ty.code(),
            flags: if hdgst > 0 { flags::HDGSTF } else { 0 },
            hlen: ty.header_len() as u8,
            pdo: 0,
            plen: total as u32,
        };
        let start = start_pdu(out, ch, total);
        let mut psh = [0u8; R2T_HEADER_LEN - COMMON_HEADER_LEN];
        put16(&mut psh, 0, self.cccid);
        put16(&mut psh, 2, self.ttag);
        put32(&mut psh, 4, self.r2to);
        put32(&mut psh, 8, self.r2tl);
        out.extend_from_slice(&psh);
        finish_header(out, start, hdgst > 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_codes_round_trip() {
        for code in 0..=255u8 {
            if let Some(t) = PduType::from_code(code) {
                assert_eq!(t.code(), code);
            }
        }
        assert_eq!(PduType::from_code(0x08), None);
        for code in 0..=0xffu16 {
            if let Some(f) = Fes::from_code(code) {
                assert_eq!(f.code(), code);
            }
        }
    }

    #[test]
    fn data_offsets() {
        let mut n = Negotiated::INITIAL;
        assert_eq!(n.data_offset(PduType::CapsuleCmd), 72);
        assert_eq!(n.data_offset(PduType::C2HData), 24);
        n.digests = Digests::BOTH;
        assert_eq!(n.data_offset(PduType::CapsuleCmd), 76);
        assert_eq!(n.data_offset(PduType::H2CData), 28);
        n.hpda = 31;
        assert_eq!(n.data_offset(PduType::C2HData), 128);
        assert_eq!(n.data_offset(PduType::H2CData), 28);
        n.cpda = 3;
        assert_eq!(n.data_offset(PduType::CapsuleCmd), 80);
        assert_eq!(pda_alignment(200), 128);
    }

    #[test]
    fn negotiation() {
        let req = IcReq {
            pfv: 0,
            hpda: 3,
            digests: Digests::BOTH,
            maxr2t: 0,
        };
        let resp = IcResp {
            pfv: 0,
            cpda: 0,
            digests: Digests {
                header: true,
                data: false,
            },
            maxh2cdata: 1 << 20,
        };
        let n = Negotiated::from_exchange(&req, &resp);
        assert_eq!((n.hpda, n.cpda), (3, 0));
        assert!(n.digests.header && !n.digests.data);
        assert_eq!(n.pda_for(PduType::C2HData), 3);
        assert_eq!(n.pda_for(PduType::H2CData), 0);
    }

    #[test]
    fn c2h_success_needs_last() {
        let h = C2HDataHeader {
            cccid: 1,
            datao: 0,
            datal: 4,
            last: false,
            success: true,
        };
        let mut out = vec![9];
        assert!(h.encode(&Negotiated::INITIAL, &mut out).is_err());
        assert_eq!(out, vec![9]);
    }
}
