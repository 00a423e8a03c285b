//! Additional Header Segments (RFC 7143 §11.2.2): the extended CDB AHS
//! (type 1, the bytes of a CDB beyond the 16 the BHS holds) and the
//! bidirectional read expected data transfer length AHS (type 2), the two
//! a SCSI Command may carry.
//!
//! Invariants: parsing never reads past the AHS bytes it is given and
//! rejects an AHS that runs past TotalAHSLength or appears twice; AHS types
//! this crate does not know are skipped (RFC 7143 leaves 3-59 reserved and
//! 60-63 to non-iSCSI extensions). Encoding writes each AHS padded with
//! zeros to a multiple of 4 bytes, so TotalAHSLength is exact.

use super::bytes::{be16, be32, put16, put32, put8, u8_at};
use super::{data_padding, FieldError, BHS_LEN};

/// AHSType of the extended CDB AHS.
pub const AHS_TYPE_EXTENDED_CDB: u8 = 1;
/// AHSType of the bidirectional read expected data transfer length AHS.
pub const AHS_TYPE_BIDI_READ_LENGTH: u8 = 2;
/// Largest total AHS length: TotalAHSLength counts 4-byte words in a byte.
pub const MAX_AHS_LEN: usize = 255 * 4;
/// AHSLength of the bidirectional read length AHS: a reserved byte and a
/// 32-bit length.
const BIDI_AHS_LENGTH: u16 = 5;
/// AHSLength, AHSType and the first AHS-specific byte (reserved in both
/// AHS types defined).
const AHS_HEADER_LEN: usize = 4;

/// What the AHSs of a SCSI Command carry.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct CommandAhs {
    pub extended_cdb: Vec<u8>,
    pub bidi_read_length: Option<u32>,
}

/// Parses the AHS bytes that follow a SCSI Command's BHS.
pub(crate) fn parse_command_ahs(ahs: &[u8]) -> Result<CommandAhs, FieldError> {
    let mut out = CommandAhs::default();
    let mut seen_cdb = false;
    let mut at = 0usize;
    while at < ahs.len() {
        let offset = BHS_LEN + at;
        let bad = |reason| FieldError { offset, reason };
        let length = usize::from(be16(ahs, at));
        // Bits 0-1 of AHSType (the two most significant) are reserved.
        let ahs_type = u8_at(ahs, at + 2) & 0x3f;
        let padded = (3 + length) + data_padding(3 + length);
        let end = at
            .checked_add(padded)
            .filter(|&end| end <= ahs.len())
            .ok_or(bad("AHS runs past TotalAHSLength"))?;
        let specific = ahs.get(at + 3..at + 3 + length).unwrap_or(&[]);
        match ahs_type {
            AHS_TYPE_EXTENDED_CDB => {
                if seen_cdb {
                    return Err(bad("second extended CDB AHS"));
                }
                // AHSLength is CDB length - 15: a reserved byte, then the
                // CDB bytes beyond the 16 in the BHS.
                let Some(rest) = specific.get(1..) else {
                    return Err(bad("extended CDB AHS without its reserved byte"));
                };
                out.extended_cdb = rest.to_vec();
                seen_cdb = true;
            }
            AHS_TYPE_BIDI_READ_LENGTH => {
                if out.bidi_read_length.is_some() {
                    return Err(bad("second bidirectional read length AHS"));
                }
                if length != usize::from(BIDI_AHS_LENGTH) {
                    return Err(bad("bidirectional read length AHS length is not 5"));
                }
                out.bidi_read_length = Some(be32(specific, 1));
            }
            _ => {}
        }
        at = end;
    }
    Ok(out)
}

/// Bytes the AHSs of a SCSI Command occupy.
pub(crate) fn command_ahs_len(extended_cdb: &[u8], bidi_read_length: Option<u32>) -> usize {
    let cdb = if extended_cdb.is_empty() {
        0
    } else {
        let len = AHS_HEADER_LEN.saturating_add(extended_cdb.len());
        len.saturating_add(data_padding(len))
    };
    let bidi = if bidi_read_length.is_some() { 8 } else { 0 };
    cdb.saturating_add(bidi)
}

/// Appends the AHSs of a SCSI Command; the caller has checked that
/// [`command_ahs_len`] is at most [`MAX_AHS_LEN`].
pub(crate) fn write_command_ahs(
    extended_cdb: &[u8],
    bidi_read_length: Option<u32>,
    out: &mut Vec<u8>,
) {
    if !extended_cdb.is_empty() {
        let mut head = [0u8; AHS_HEADER_LEN];
        // Fits: the caller bounded the total by MAX_AHS_LEN.
        let length = u16::try_from(extended_cdb.len() + 1).unwrap_or(u16::MAX);
        put16(&mut head, 0, length);
        put8(&mut head, 2, AHS_TYPE_EXTENDED_CDB);
        out.extend_from_slice(&head);
        out.extend_from_slice(extended_cdb);
        let pad = data_padding(AHS_HEADER_LEN + extended_cdb.len());
        out.extend_from_slice([0u8; 3].get(..pad).unwrap_or(&[]));
    }
    if let Some(len) = bidi_read_length {
        let mut ahs = [0u8; 8];
        put16(&mut ahs, 0, BIDI_AHS_LENGTH);
        put8(&mut ahs, 2, AHS_TYPE_BIDI_READ_LENGTH);
        put32(&mut ahs, 4, len);
        out.extend_from_slice(&ahs);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extended_cdb_of_32_bytes() {
        // A 32-byte CDB: AHSLength 17 (32 - 15), type 1, reserved, then the
        // 16 CDB bytes beyond the BHS; 4 + 16 bytes need no padding.
        let tail: Vec<u8> = (16..32).collect();
        let mut out = Vec::new();
        write_command_ahs(&tail, None, &mut out);
        let mut expected = vec![0x00, 0x11, 0x01, 0x00];
        expected.extend_from_slice(&tail);
        assert_eq!(out, expected);
        assert_eq!(command_ahs_len(&tail, None), 20);
        let parsed = parse_command_ahs(&out).unwrap();
        assert_eq!(parsed.extended_cdb, tail);
        assert_eq!(parsed.bidi_read_length, None);
    }

    #[test]
    fn bidi_read_length() {
        let mut out = Vec::new();
        write_command_ahs(&[0xaa], Some(0x1234_5678), &mut out);
        assert_eq!(
            out,
            [
                0x00, 0x02, 0x01, 0x00, 0xaa, 0x00, 0x00, 0x00, // ext CDB + pad
                0x00, 0x05, 0x02, 0x00, 0x12, 0x34, 0x56, 0x78, // bidi
            ]
        );
        let parsed = parse_command_ahs(&out).unwrap();
        assert_eq!(parsed.extended_cdb, [0xaa]);
        assert_eq!(parsed.bidi_read_length, Some(0x1234_5678));
    }

    #[test]
    fn malformed() {
        // Runs past the end.
        assert!(parse_command_ahs(&[0x00, 0x09, 0x01, 0x00, 0, 0, 0, 0]).is_err());
        // Twice.
        let twice = [0, 5, 2, 0, 0, 0, 0, 1, 0, 5, 2, 0, 0, 0, 0, 2];
        assert!(parse_command_ahs(&twice).is_err());
        // Wrong length for type 2.
        assert!(parse_command_ahs(&[0, 1, 2, 0]).is_err());
        // Extended CDB without the reserved byte.
        assert!(parse_command_ahs(&[0, 0, 1, 0]).is_err());
        // Unknown types are skipped; reserved type bits ignored.
        let parsed = parse_command_ahs(&[0, 1, 0x3c, 0, 0, 5, 0xc2, 0, 0, 0, 0, 9]).unwrap();
        assert_eq!(parsed.bidi_read_length, Some(9));
    }
}
