//! The incremental iSCSI PDU decoder: given the bytes received so far, says
//! how many more are needed, or returns one PDU with the range of its data
//! segment and the bytes it took, or a [`PduError`] that tells the target
//! what to answer (a Reject and its reason) and whether the connection
//! must close.
//!
//! Invariants:
//! - Never panics, never reads past `buf`; a decoded PDU's `consumed` is at
//!   most `buf.len()`, and its `data` range lies inside `buf`.
//! - Before asking for bytes beyond the header, the decoder has checked the
//!   header digest (when enabled: no field is trusted before it is), that
//!   the opcode is one this side receives, that DataSegmentLength is within
//!   the caller's limit, and every header field; so a peer cannot make the
//!   caller buffer more than [`DecoderConfig::max_pdu_len`] bytes for one
//!   PDU. Before the header digest is checked the decoder waits for at most
//!   48 + 1020 + 4 bytes (BHS, largest AHS, digest).
//! - The data digest covers the data segment and its padding exactly as
//!   received, and is present only after a non-empty data segment.

use std::ops::Range;

use crate::digest::{crc32c, digest_from_bytes, Digests, DIGEST_LEN};
use crate::pdu::bytes::{be24, be32};
use crate::pdu::{
    data_padding, Direction, FieldError, InitiatorPdu, Opcode, Reject, RejectReason, TargetPdu,
    BHS_LEN, MAX_AHS_LEN,
};

/// What the decoder knows about the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DecoderConfig {
    /// Negotiated digests ([`Digests::NONE`] during login).
    pub digests: Digests,
    /// Largest DataSegmentLength accepted: this side's
    /// MaxRecvDataSegmentLength (8192 during login).
    pub max_data_segment: u32,
}

impl DecoderConfig {
    /// The login phase: no digests, MaxRecvDataSegmentLength 8192 (its
    /// default, RFC 7143 §13.12).
    pub const LOGIN: DecoderConfig = DecoderConfig {
        digests: Digests::NONE,
        max_data_segment: 8192,
    };

    /// The most bytes one accepted PDU occupies: header with the largest
    /// AHS and its digest, the largest data segment, padding and digest.
    pub fn max_pdu_len(&self) -> usize {
        let data = usize::try_from(self.max_data_segment).unwrap_or(usize::MAX);
        (BHS_LEN + MAX_AHS_LEN + 3 + 2 * DIGEST_LEN).saturating_add(data)
    }
}

/// Result of one decoding step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded<P> {
    /// At least this many bytes beyond `buf.len()` are needed.
    NeedMore(usize),
    /// One PDU, which occupied the first `consumed` bytes of the buffer
    /// (header, data, padding and digests); its data segment is
    /// `buf[data]`, without padding.
    Pdu {
        pdu: P,
        data: Range<usize>,
        consumed: usize,
    },
}

/// Why received bytes are not an acceptable PDU. Every variant says what
/// the target answers ([`PduError::reject`], whose data segment is
/// [`PduError::rejected_bhs`]) and whether the connection must close
/// ([`PduError::closes_connection`]). Errors own their data, so they
/// outlive the receive buffer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PduError {
    /// The opcode is undefined, vendor specific, or one this side never
    /// receives. RFC 7143 answers with Reject "Command not supported".
    #[error("opcode {opcode:#04x} is not supported")]
    UnknownOpcode {
        /// Byte 0 of the BHS.
        opcode: u8,
        bhs: [u8; BHS_LEN],
        /// The bytes the PDU occupies by its TotalAHSLength and
        /// DataSegmentLength, when these are within limits (the caller may
        /// skip that many and carry on); `None` when they are not.
        pdu_len: Option<usize>,
    },
    /// DataSegmentLength exceeds MaxRecvDataSegmentLength: a protocol
    /// error; the data is not awaited, so the connection cannot go on.
    #[error("data segment of {length} bytes exceeds the limit of {limit}")]
    DataSegmentTooLong {
        length: u32,
        limit: u32,
        bhs: [u8; BHS_LEN],
    },
    /// The header digest does not match: no field of the header can be
    /// trusted, not even the lengths. With ErrorRecoveryLevel 0 the
    /// connection is dropped.
    #[error("header digest {received:#010x}, computed {computed:#010x}")]
    HeaderDigest { received: u32, computed: u32 },
    /// A header field holds a value the RFC forbids (a malformed AHS, a
    /// residual with both overflow and underflow set). The PDU is rejected
    /// with "Invalid PDU field"; it occupies `pdu_len` bytes from its
    /// start, which may be more than were received so far.
    #[error("opcode {opcode:#04x}: field at byte {offset}: {reason}")]
    InvalidField {
        opcode: u8,
        offset: usize,
        reason: &'static str,
        bhs: [u8; BHS_LEN],
        pdu_len: usize,
    },
    /// The data digest does not match. The PDU occupied `consumed` bytes
    /// (all received) and is discarded; the target sends Reject "Data
    /// digest error" and, for lost write data, ends the task (RFC 7143,
    /// "Digest Errors"): `itt` names it.
    #[error("opcode {opcode:#04x} (task {itt:#010x}): data digest {received:#010x}, computed {computed:#010x}")]
    DataDigest {
        opcode: u8,
        itt: u32,
        bhs: [u8; BHS_LEN],
        consumed: usize,
        received: u32,
        computed: u32,
    },
}

impl PduError {
    /// The reason of the Reject the target sends, `None` when it sends
    /// none (a header digest error: the header cannot be trusted).
    pub fn reject_reason(&self) -> Option<RejectReason> {
        match self {
            PduError::UnknownOpcode { .. } => Some(RejectReason::CommandNotSupported),
            PduError::DataSegmentTooLong { .. } => Some(RejectReason::ProtocolError),
            PduError::HeaderDigest { .. } => None,
            PduError::InvalidField { .. } => Some(RejectReason::InvalidPduField),
            PduError::DataDigest { .. } => Some(RejectReason::DataDigestError),
        }
    }

    /// The BHS of the offending PDU: the data segment of the Reject.
    pub fn rejected_bhs(&self) -> Option<&[u8; BHS_LEN]> {
        match self {
            PduError::UnknownOpcode { bhs, .. }
            | PduError::DataSegmentTooLong { bhs, .. }
            | PduError::InvalidField { bhs, .. }
            | PduError::DataDigest { bhs, .. } => Some(bhs),
            PduError::HeaderDigest { .. } => None,
        }
    }

    /// The Reject PDU to send (its data segment is
    /// [`PduError::rejected_bhs`]), given the connection's sequence
    /// numbers.
    pub fn reject(&self, stat_sn: u32, exp_cmd_sn: u32, max_cmd_sn: u32) -> Option<Reject> {
        Some(Reject {
            reason: self.reject_reason()?,
            stat_sn,
            exp_cmd_sn,
            max_cmd_sn,
            data_sn: 0,
        })
    }

    /// Whether the connection must close (after the Reject, if any): the
    /// stream cannot be resynchronised because the PDU's length is unknown
    /// or untrusted, or beyond what the receiver accepts.
    pub fn closes_connection(&self) -> bool {
        self.skip_len().is_none()
    }

    /// When the connection can go on: how many bytes, from the start of the
    /// offending PDU, the caller discards before decoding the next one.
    /// This may exceed what was received so far (except for
    /// [`PduError::DataDigest`]).
    pub fn skip_len(&self) -> Option<usize> {
        match self {
            PduError::UnknownOpcode { pdu_len, .. } => *pdu_len,
            PduError::InvalidField { pdu_len, .. } => Some(*pdu_len),
            PduError::DataDigest { consumed, .. } => Some(*consumed),
            PduError::DataSegmentTooLong { .. } | PduError::HeaderDigest { .. } => None,
        }
    }
}

/// Decodes the PDU an initiator sent at the start of `buf` (the target's
/// side).
pub fn decode_initiator(
    buf: &[u8],
    cfg: &DecoderConfig,
) -> Result<Decoded<InitiatorPdu>, PduError> {
    decode(buf, cfg, Direction::InitiatorToTarget, InitiatorPdu::parse)
}

/// Decodes the PDU a target sent at the start of `buf` (an initiator's
/// side, for tests).
pub fn decode_target(buf: &[u8], cfg: &DecoderConfig) -> Result<Decoded<TargetPdu>, PduError> {
    decode(buf, cfg, Direction::TargetToInitiator, |op, bhs, _ahs| {
        TargetPdu::parse(op, bhs)
    })
}

/// Where the parts of a PDU lie, by its header's length fields.
struct Layout {
    /// End of BHS and AHSs: where the header digest starts.
    ahs_end: usize,
    /// End of the header digest: where the data segment starts.
    header_end: usize,
    /// End of the data segment, before padding.
    data_end: usize,
    /// End of the padding: where the data digest starts.
    padded_end: usize,
    /// End of the PDU.
    total: usize,
}

impl Layout {
    fn of(bhs: &[u8], digests: Digests) -> Layout {
        let ahs_len = usize::from(bhs.get(4).copied().unwrap_or(0)) * 4;
        let data_len = usize::try_from(be24(bhs, 5)).unwrap_or(usize::MAX);
        // At most 48 + 1020 + 4 + (2^24 - 1) + 3 + 4: no overflow, but stay
        // saturating on principle.
        let ahs_end = BHS_LEN + ahs_len;
        let header_end = ahs_end + digests.header_len();
        let data_end = header_end.saturating_add(data_len);
        let padded_end = data_end.saturating_add(data_padding(data_len));
        let total = padded_end.saturating_add(digests.data_len(data_len));
        Layout {
            ahs_end,
            header_end,
            data_end,
            padded_end,
            total,
        }
    }
}

fn digest_at(buf: &[u8], at: usize) -> u32 {
    let mut bytes = [0u8; DIGEST_LEN];
    if let Some(src) = at.checked_add(DIGEST_LEN).and_then(|end| buf.get(at..end)) {
        bytes.copy_from_slice(src);
    }
    digest_from_bytes(bytes)
}

fn decode<P>(
    buf: &[u8],
    cfg: &DecoderConfig,
    direction: Direction,
    parse: impl FnOnce(Opcode, &[u8], &[u8]) -> Option<Result<P, FieldError>>,
) -> Result<Decoded<P>, PduError> {
    let Some(bhs_bytes) = buf.get(..BHS_LEN) else {
        return Ok(Decoded::NeedMore(BHS_LEN - buf.len()));
    };
    let mut bhs = [0u8; BHS_LEN];
    bhs.copy_from_slice(bhs_bytes);
    let layout = Layout::of(&bhs, cfg.digests);
    let opcode_byte = bhs[0];
    let need_more = |end: usize| (buf.len() < end).then(|| Decoded::NeedMore(end - buf.len()));

    if cfg.digests.header {
        if let Some(more) = need_more(layout.header_end) {
            return Ok(more);
        }
        let computed = crc32c(buf.get(..layout.ahs_end).unwrap_or(&[]));
        let received = digest_at(buf, layout.ahs_end);
        if computed != received {
            return Err(PduError::HeaderDigest { received, computed });
        }
    }

    let data_len = be24(&bhs, 5);
    let within_limit = data_len <= cfg.max_data_segment;
    let Some(opcode) = Opcode::from_byte(opcode_byte).filter(|op| op.direction() == direction)
    else {
        return Err(PduError::UnknownOpcode {
            opcode: opcode_byte,
            bhs,
            pdu_len: within_limit.then_some(layout.total),
        });
    };
    if !within_limit {
        return Err(PduError::DataSegmentTooLong {
            length: data_len,
            limit: cfg.max_data_segment,
            bhs,
        });
    }
    if let Some(more) = need_more(layout.header_end) {
        return Ok(more);
    }
    let ahs = buf.get(BHS_LEN..layout.ahs_end).unwrap_or(&[]);
    let pdu = match parse(opcode, &bhs, ahs) {
        Some(Ok(pdu)) => pdu,
        Some(Err(FieldError { offset, reason })) => {
            return Err(PduError::InvalidField {
                opcode: opcode_byte,
                offset,
                reason,
                bhs,
                pdu_len: layout.total,
            })
        }
        // Unreachable: the direction filter admits only opcodes `parse`
        // knows; answer as for an unknown opcode all the same.
        None => {
            return Err(PduError::UnknownOpcode {
                opcode: opcode_byte,
                bhs,
                pdu_len: Some(layout.total),
            })
        }
    };
    if let Some(more) = need_more(layout.total) {
        return Ok(more);
    }
    if cfg.digests.data && data_len > 0 {
        let covered = buf.get(layout.header_end..layout.padded_end).unwrap_or(&[]);
        let computed = crc32c(covered);
        let received = digest_at(buf, layout.padded_end);
        if computed != received {
            return Err(PduError::DataDigest {
                opcode: opcode_byte,
                itt: be32(&bhs, 16),
                bhs,
                consumed: layout.total,
                received,
                computed,
            });
        }
    }
    Ok(Decoded::Pdu {
        pdu,
        data: layout.header_end..layout.data_end,
        consumed: layout.total,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pdu::{DataOut, NopIn, RESERVED_TAG};

    fn data_out() -> InitiatorPdu {
        InitiatorPdu::DataOut(DataOut {
            final_pdu: true,
            lun: 0,
            itt: 0x1234,
            ttt: 7,
            exp_stat_sn: 1,
            data_sn: 0,
            buffer_offset: 512,
        })
    }

    fn cfg(digests: Digests) -> DecoderConfig {
        DecoderConfig {
            digests,
            max_data_segment: 1024,
        }
    }

    #[test]
    fn data_range_and_consumed() {
        for digests in [Digests::NONE, Digests::BOTH] {
            let mut out = Vec::new();
            data_out().encode(b"hello", digests, &mut out).unwrap();
            out.extend_from_slice(b"next");
            match decode_initiator(&out, &cfg(digests)).unwrap() {
                Decoded::Pdu {
                    pdu,
                    data,
                    consumed,
                } => {
                    assert_eq!(pdu, data_out());
                    assert_eq!(&out[data], b"hello");
                    assert_eq!(&out[consumed..], b"next");
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn wrong_direction_is_unknown() {
        let nop = TargetPdu::NopIn(NopIn {
            lun: 0,
            itt: 1,
            ttt: RESERVED_TAG,
            stat_sn: 2,
            exp_cmd_sn: 3,
            max_cmd_sn: 4,
        });
        let mut out = Vec::new();
        nop.encode(&[1, 2, 3], Digests::NONE, &mut out).unwrap();
        let err = decode_initiator(&out, &cfg(Digests::NONE)).unwrap_err();
        assert_eq!(err.reject_reason(), Some(RejectReason::CommandNotSupported));
        assert_eq!(err.skip_len(), Some(out.len()));
        assert!(!err.closes_connection());
        assert_eq!(err.rejected_bhs().map(|b| &b[..]), out.get(..48));
    }

    #[test]
    fn too_long_closes() {
        let mut out = Vec::new();
        data_out()
            .encode(&[0; 1025], Digests::NONE, &mut out)
            .unwrap();
        let err = decode_initiator(&out[..48], &cfg(Digests::NONE)).unwrap_err();
        assert!(matches!(
            err,
            PduError::DataSegmentTooLong {
                length: 1025,
                limit: 1024,
                ..
            }
        ));
        assert!(err.closes_connection());
        let reject = err.reject(5, 6, 7).unwrap();
        assert_eq!(reject.reason, RejectReason::ProtocolError);
    }

    #[test]
    fn digest_errors() {
        let mut out = Vec::new();
        data_out()
            .encode(b"payload", Digests::BOTH, &mut out)
            .unwrap();
        // Corrupt the data: the data digest catches it, the PDU is skipped.
        let mut bad = out.clone();
        bad[52] ^= 1;
        let err = decode_initiator(&bad, &cfg(Digests::BOTH)).unwrap_err();
        assert!(matches!(err, PduError::DataDigest { itt: 0x1234, .. }));
        assert_eq!(err.skip_len(), Some(out.len()));
        assert_eq!(err.reject_reason(), Some(RejectReason::DataDigestError));
        // Corrupt the padding: covered too.
        let mut bad = out.clone();
        bad[59] ^= 1;
        assert!(matches!(
            decode_initiator(&bad, &cfg(Digests::BOTH)),
            Err(PduError::DataDigest { .. })
        ));
        // Corrupt the header: nothing is trusted, the connection closes.
        let mut bad = out.clone();
        bad[20] ^= 1;
        let err = decode_initiator(&bad, &cfg(Digests::BOTH)).unwrap_err();
        assert!(matches!(err, PduError::HeaderDigest { .. }));
        assert!(err.closes_connection() && err.reject_reason().is_none());
    }
}
