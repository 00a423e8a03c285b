//! The incremental NVMe/TCP PDU decoder: given the bytes received so far,
//! says how many more are needed, or returns one PDU and how many bytes it
//! took, or a [`PduError`] that tells a controller which C2HTermReq to send.
//!
//! Invariants:
//! - Never panics, never reads past `buf`, and `consumed` (or what
//!   `NeedMore` asks for) never makes the caller skip bytes it has not
//!   seen: a decoded PDU's `consumed` is at most `buf.len()`.
//! - Before asking for more bytes the decoder has checked everything the
//!   bytes at hand allow: type, HLEN, digest flags, and (as soon as the
//!   header is complete) the header digest and PLEN against the caller's
//!   limit, so a hostile peer cannot make the caller buffer more than
//!   `max_plen` bytes for one PDU.
//! - Which digests are present is decided by the negotiated settings; the
//!   HDGSTF/DDGSTF flags must agree with them.

use crate::bytes::{le16, le32, u8_at};
use crate::completion::Cqe;
use crate::digest::{crc32c, DIGEST_LEN};
use crate::pdu::{
    flags, pda_alignment, C2HData, CapsuleCmd, CapsuleResp, CommonHeader, Direction, H2CData,
    IcReq, IcResp, Negotiated, Pdu, PduType, TermReq, COMMON_HEADER_LEN, MAX_PDA, MIN_MAXH2CDATA,
    PFV_1_0, R2T, TERM_REQ_HEADER_LEN, TERM_REQ_MAX_ERROR_DATA, TERM_REQ_MAX_LEN,
};
use crate::sqe::{Sqe, SQE_LEN};
use crate::PduError;

/// What the decoder knows about the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DecoderConfig {
    /// The PDUs this side receives: a controller decodes
    /// [`Direction::HostToController`] PDUs; anything else is refused.
    pub direction: Direction,
    /// Negotiated digests and alignments ([`Negotiated::INITIAL`] until the
    /// ICReq/ICResp exchange).
    pub negotiated: Negotiated,
    /// Largest PLEN accepted; larger PDUs fail with
    /// [`PduError::PduTooLarge`] before their bytes are awaited. A
    /// controller sets it from its in-capsule data size and MAXH2CDATA
    /// plus the largest header, digests and padding
    /// (see [`max_plen_for_data`]).
    pub max_plen: u32,
}

impl DecoderConfig {
    /// A controller's decoder before ICReq.
    pub fn controller(max_plen: u32) -> DecoderConfig {
        DecoderConfig {
            direction: Direction::HostToController,
            negotiated: Negotiated::INITIAL,
            max_plen,
        }
    }

    /// A host's decoder before ICResp.
    pub fn host(max_plen: u32) -> DecoderConfig {
        DecoderConfig {
            direction: Direction::ControllerToHost,
            negotiated: Negotiated::INITIAL,
            max_plen,
        }
    }

    /// The same decoder after negotiation.
    pub fn with_negotiated(self, negotiated: Negotiated) -> DecoderConfig {
        DecoderConfig { negotiated, ..self }
    }
}

/// The PLEN limit that admits every PDU carrying up to `max_data` bytes of
/// data under any digest and alignment setting, and every PDU without data
/// (ICReq/ICResp, full-size termination requests).
pub fn max_plen_for_data(max_data: u32) -> u32 {
    // The largest data offset is 128 (72-byte header, 4-byte digest,
    // padded to the largest alignment), plus the data digest.
    max_data
        .saturating_add(128 + DIGEST_LEN as u32)
        .max(TERM_REQ_MAX_LEN as u32)
}

/// Result of one decoding step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// At least this many bytes beyond `buf.len()` are needed.
    NeedMore(usize),
    /// One PDU, which occupied the first `consumed` bytes of the buffer.
    Pdu { pdu: Pdu<'a>, consumed: usize },
}

/// The bytes of the offending PDU to echo in a termination request: its
/// header as far as received, at most HLEN (at least the 8-byte common
/// header) and at most 128 bytes.
pub fn term_req_error_data(buf: &[u8]) -> &[u8] {
    let hlen = usize::from(u8_at(buf, 2)).max(COMMON_HEADER_LEN);
    let len = buf.len().min(hlen).min(TERM_REQ_MAX_ERROR_DATA);
    buf.get(..len).unwrap_or(buf)
}

/// Decodes the PDU at the start of `buf`.
pub fn decode_pdu<'a>(buf: &'a [u8], config: &DecoderConfig) -> Result<Decoded<'a>, PduError> {
    let Some(ch) = CommonHeader::parse(buf) else {
        return Ok(Decoded::NeedMore(COMMON_HEADER_LEN - buf.len()));
    };
    let code = ch.pdu_type;
    let ty = PduType::from_code(code)
        .filter(|t| t.direction() == config.direction)
        .ok_or(PduError::UnexpectedPduType { pdu_type: code })?;
    let hlen = ty.header_len();
    if usize::from(ch.hlen) != hlen {
        return Err(PduError::BadHeaderLength {
            pdu_type: code,
            hlen: ch.hlen,
            expected: hlen as u8,
        });
    }
    let negotiated = &config.negotiated;
    if ty.has_header_digest() {
        let flagged = ch.flags & flags::HDGSTF != 0;
        if flagged != negotiated.digests.header {
            return Err(PduError::BadFlags {
                pdu_type: code,
                flags: ch.flags,
                reason: if flagged {
                    "HDGSTF set but header digests are not enabled"
                } else {
                    "header digests are enabled but HDGSTF is clear"
                },
            });
        }
    }
    let hdgst = negotiated.header_digest_len(ty);
    let header_end = hlen + hdgst;
    if buf.len() < header_end {
        return Ok(Decoded::NeedMore(header_end - buf.len()));
    }
    if hdgst > 0 {
        let computed = crc32c(buf.get(..hlen).unwrap_or(&[]));
        let received = le32(buf, hlen);
        if computed != received {
            return Err(PduError::HeaderDigest {
                pdu_type: code,
                received,
                computed,
            });
        }
    }
    let plen = ch.plen;
    let bad_plen = |reason| PduError::BadPduLength {
        pdu_type: code,
        plen,
        reason,
    };
    let total = usize::try_from(plen).map_err(|_| bad_plen("does not fit in memory"))?;
    if total < header_end {
        return Err(bad_plen("shorter than the header"));
    }
    if plen > config.max_plen {
        return Err(PduError::PduTooLarge {
            pdu_type: code,
            plen,
            limit: config.max_plen,
        });
    }
    match ty {
        PduType::IcReq | PduType::IcResp if total != hlen => {
            return Err(bad_plen("ICReq and ICResp are exactly 128 bytes"));
        }
        PduType::CapsuleResp | PduType::R2T if total != header_end => {
            return Err(bad_plen("this PDU type carries no data"));
        }
        PduType::H2CTermReq | PduType::C2HTermReq if total > TERM_REQ_MAX_LEN => {
            return Err(bad_plen("termination requests are at most 152 bytes"));
        }
        _ => {}
    }
    let data_range = if ty.carries_data() {
        data_range(&ch, ty, header_end, total, negotiated)?
    } else {
        0..0
    };
    if buf.len() < total {
        return Ok(Decoded::NeedMore(total - buf.len()));
    }
    let data = buf.get(data_range.clone()).unwrap_or(&[]);
    let pdu = match ty {
        PduType::IcReq => {
            let p = IcReq::parse_psh(buf);
            check_ic(code, p.pfv, p.hpda)?;
            Pdu::IcReq(p)
        }
        PduType::IcResp => {
            let p = IcResp::parse_psh(buf);
            check_ic(code, p.pfv, p.cpda)?;
            if p.maxh2cdata < MIN_MAXH2CDATA || !p.maxh2cdata.is_multiple_of(4) {
                return Err(PduError::BadField {
                    pdu_type: code,
                    offset: 12,
                    reason: "MAXH2CDATA must be a multiple of 4 and at least 4096",
                });
            }
            Pdu::IcResp(p)
        }
        PduType::H2CTermReq | PduType::C2HTermReq => {
            let term = TermReq {
                fes: le16(buf, 8),
                fei: le32(buf, 10),
                error_data: buf.get(TERM_REQ_HEADER_LEN..total).unwrap_or(&[]),
            };
            if ty == PduType::H2CTermReq {
                Pdu::H2CTermReq(term)
            } else {
                Pdu::C2HTermReq(term)
            }
        }
        PduType::CapsuleCmd => {
            let sqe = Sqe::parse(
                buf.get(COMMON_HEADER_LEN..COMMON_HEADER_LEN + SQE_LEN)
                    .unwrap_or(&[]),
            )
            .map_err(|_| bad_plen("shorter than the header"))?;
            Pdu::CapsuleCmd(CapsuleCmd { sqe, data })
        }
        PduType::CapsuleResp => {
            let cqe = Cqe::parse(buf.get(COMMON_HEADER_LEN..).unwrap_or(&[]))
                .map_err(|_| bad_plen("shorter than the header"))?;
            Pdu::CapsuleResp(CapsuleResp { cqe })
        }
        PduType::H2CData | PduType::C2HData => {
            let datal = le32(buf, 16);
            if usize::try_from(datal).ok() != Some(data.len()) {
                return Err(bad_plen("does not match DATAL"));
            }
            let last = ch.flags & flags::LAST_PDU != 0;
            if ty == PduType::H2CData {
                Pdu::H2CData(H2CData {
                    cccid: le16(buf, 8),
                    ttag: le16(buf, 10),
                    datao: le32(buf, 12),
                    last,
                    data,
                })
            } else {
                Pdu::C2HData(C2HData {
                    cccid: le16(buf, 8),
                    datao: le32(buf, 12),
                    last,
                    success: ch.flags & flags::SUCCESS != 0,
                    data,
                })
            }
        }
        PduType::R2T => Pdu::R2T(R2T {
            cccid: le16(buf, 8),
            ttag: le16(buf, 10),
            r2to: le32(buf, 12),
            r2tl: le32(buf, 16),
        }),
    };
    if ty.carries_data() && !data.is_empty() && negotiated.digests.data {
        let received = le32(buf, data_range.end);
        let computed = crc32c(data);
        if received != computed {
            return Err(PduError::DataDigest {
                pdu_type: code,
                // CapsuleCmd: the SQE's CID (bytes 10-11); data PDUs:
                // CCCID (bytes 8-9).
                command_id: if ty == PduType::CapsuleCmd {
                    le16(buf, COMMON_HEADER_LEN + 2)
                } else {
                    le16(buf, 8)
                },
                consumed: total,
                received,
                computed,
            });
        }
    }
    Ok(Decoded::Pdu {
        pdu,
        consumed: total,
    })
}

/// Checks PDO, the data digest flag and the SUCCESS flag of a data-carrying
/// PDU and returns where its data lies.
fn data_range(
    ch: &CommonHeader,
    ty: PduType,
    header_end: usize,
    total: usize,
    negotiated: &Negotiated,
) -> Result<std::ops::Range<usize>, PduError> {
    let code = ch.pdu_type;
    let ddgst_flag = ch.flags & flags::DDGSTF != 0;
    if ddgst_flag && !negotiated.digests.data {
        return Err(PduError::BadFlags {
            pdu_type: code,
            flags: ch.flags,
            reason: "DDGSTF set but data digests are not enabled",
        });
    }
    if ty == PduType::C2HData && ch.flags & flags::SUCCESS != 0 && ch.flags & flags::LAST_PDU == 0 {
        return Err(PduError::BadFlags {
            pdu_type: code,
            flags: ch.flags,
            reason: "SUCCESS without LAST_PDU",
        });
    }
    if total == header_end {
        // No data: PDO is reserved.
        return Ok(total..total);
    }
    if negotiated.digests.data && !ddgst_flag {
        return Err(PduError::BadFlags {
            pdu_type: code,
            flags: ch.flags,
            reason: "data digests are enabled but DDGSTF is clear",
        });
    }
    let bad_pdo = |reason| PduError::BadDataOffset {
        pdu_type: code,
        pdo: ch.pdo,
        reason,
    };
    let pdo = usize::from(ch.pdo);
    if pdo < header_end {
        return Err(bad_pdo("points into the header"));
    }
    if !pdo.is_multiple_of(pda_alignment(negotiated.pda_for(ty))) {
        return Err(bad_pdo("not aligned as the PDU data alignment requires"));
    }
    let end = total - negotiated.digests.data_len();
    if pdo >= end {
        return Err(bad_pdo("leaves no room for data"));
    }
    Ok(pdo..end)
}

fn check_ic(code: u8, pfv: u16, pda: u8) -> Result<(), PduError> {
    if pfv != PFV_1_0 {
        return Err(PduError::BadField {
            pdu_type: code,
            offset: 8,
            reason: "unsupported PDU format version",
        });
    }
    if pda > MAX_PDA {
        return Err(PduError::BadField {
            pdu_type: code,
            offset: 10,
            reason: "PDU data alignment above 31",
        });
    }
    Ok(())
}
