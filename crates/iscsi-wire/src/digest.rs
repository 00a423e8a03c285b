//! iSCSI header and data digests (RFC 7143 §11.1 and §13.1, "CRC32C"):
//! which digests a connection uses, and the CRC32C values they carry.
//!
//! The CRC is CRC-32C (Castagnoli polynomial 0x1EDC6F41, reflected, initial
//! value and final XOR of all ones), the same function as `crc32c::crc32c`.
//!
//! Byte order, a known trap: the digest is NOT sent in network (big-endian)
//! order like every other iSCSI integer. RFC 3720 appendix B.4 lists the
//! four bytes of the CRC of 32 zero bytes as `aa 36 91 8a` in transmission
//! order, while the CRC value is 0x8a9136aa; libiscsi (`lib/pdu.c`) and
//! Linux assemble a received digest least significant byte first. So the
//! 32-bit CRC goes on the wire little-endian ([`digest_bytes`]).
//!
//! Invariants:
//! - The header digest covers the whole header: the 48-byte BHS and every
//!   AHS (AHSs are padded to 4 bytes, so there is never extra padding).
//! - The data digest covers the data segment *including* its zero padding
//!   to a multiple of 4 bytes ([`data_digest`], [`DataDigest::finish`]),
//!   and is sent only when the data segment is not empty.

/// Length of either digest on the wire.
pub const DIGEST_LEN: usize = 4;

/// Which digests a connection uses (the negotiated HeaderDigest and
/// DataDigest keys; both are `None` during the login phase).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Digests {
    /// A CRC32C follows the header (BHS and AHS) of every PDU.
    pub header: bool,
    /// A CRC32C follows the padded data segment of every PDU with data.
    pub data: bool,
}

impl Digests {
    /// No digests: the login phase, and the default.
    pub const NONE: Digests = Digests {
        header: false,
        data: false,
    };
    /// Both digests.
    pub const BOTH: Digests = Digests {
        header: true,
        data: true,
    };

    /// Bytes the header digest occupies (0 or 4).
    pub fn header_len(self) -> usize {
        if self.header {
            DIGEST_LEN
        } else {
            0
        }
    }

    /// Bytes the data digest occupies after a data segment of `data_len`
    /// bytes (0 when digests are off or the segment is empty).
    pub fn data_len(self, data_len: usize) -> usize {
        if self.data && data_len > 0 {
            DIGEST_LEN
        } else {
            0
        }
    }
}

/// CRC32C of `bytes`.
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

/// The header digest of a header (BHS followed by its AHSs).
pub fn header_digest(header: &[u8]) -> u32 {
    crc32c(header)
}

/// The data digest of an unpadded data segment: the CRC32C of the data
/// followed by its zero padding.
pub fn data_digest(data: &[u8]) -> u32 {
    let mut d = DataDigest::new();
    d.update(data);
    d.finish()
}

/// The four bytes of a digest in transmission order (little-endian; see the
/// module documentation).
pub fn digest_bytes(digest: u32) -> [u8; DIGEST_LEN] {
    digest.to_le_bytes()
}

/// The digest value carried by four received bytes.
pub fn digest_from_bytes(bytes: [u8; DIGEST_LEN]) -> u32 {
    u32::from_le_bytes(bytes)
}

/// Incremental data digest over a data segment sent or received in pieces
/// (scatter/gather buffers) without copying it together. It counts the
/// bytes so that [`DataDigest::finish`] can add the padding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DataDigest {
    crc: u32,
    len: u64,
}

impl DataDigest {
    /// A digest over no bytes yet.
    pub fn new() -> DataDigest {
        DataDigest { crc: 0, len: 0 }
    }

    /// Adds the next piece of the data segment (without padding).
    pub fn update(&mut self, bytes: &[u8]) {
        self.crc = crc32c::crc32c_append(self.crc, bytes);
        self.len = self.len.wrapping_add(bytes.len() as u64);
    }

    /// The digest of everything added so far, followed by the zero padding
    /// that brings it to a multiple of 4 bytes.
    pub fn finish(&self) -> u32 {
        let pad = (4 - (self.len % 4) as usize) % 4;
        let zeros = [0u8; 3];
        crc32c::crc32c_append(self.crc, zeros.get(..pad).unwrap_or(&[]))
    }

    /// [`DataDigest::finish`] in transmission order.
    pub fn finish_bytes(&self) -> [u8; DIGEST_LEN] {
        digest_bytes(self.finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 3720 appendix B.4: the CRC bytes as listed there (transmission
    /// order).
    #[test]
    fn rfc3720_appendix_b4_vectors() {
        let incrementing: Vec<u8> = (0..32).collect();
        let decrementing: Vec<u8> = (0..32).rev().collect();
        let cases: [(&[u8], [u8; 4]); 4] = [
            (&[0u8; 32], [0xaa, 0x36, 0x91, 0x8a]),
            (&[0xffu8; 32], [0x43, 0xab, 0xa8, 0x62]),
            (&incrementing, [0x4e, 0x79, 0xdd, 0x46]),
            (&decrementing, [0x5c, 0xdb, 0x3f, 0x11]),
        ];
        for (input, wire) in cases {
            assert_eq!(digest_bytes(header_digest(input)), wire);
            assert_eq!(digest_from_bytes(wire), crc32c(input));
            // 32 bytes need no padding: the data digest is the same.
            assert_eq!(digest_bytes(data_digest(input)), wire);
        }
        assert_eq!(crc32c(&[0u8; 32]), 0x8a91_36aa);
    }

    /// RFC 3720 appendix B.4: the SCSI READ(10) command PDU.
    #[test]
    fn rfc3720_read10_header_digest() {
        let mut bhs = [0u8; 48];
        bhs[0] = 0x01;
        bhs[1] = 0xc0;
        bhs[16] = 0x14;
        bhs[22] = 0x04;
        bhs[27] = 0x14;
        bhs[31] = 0x18;
        bhs[32] = 0x28;
        bhs[40] = 0x02;
        assert_eq!(digest_bytes(header_digest(&bhs)), [0x56, 0x3a, 0x96, 0xd9]);
    }

    #[test]
    fn data_digest_covers_padding() {
        assert_eq!(data_digest(b"abcde"), crc32c(b"abcde\0\0\0"));
        assert_eq!(data_digest(b"abcd"), crc32c(b"abcd"));
        assert_eq!(data_digest(b""), 0);
    }

    #[test]
    fn incremental_matches_one_shot() {
        let data: Vec<u8> = (0..=255u8).cycle().take(10_001).collect();
        let mut d = DataDigest::new();
        for chunk in data.chunks(777) {
            d.update(chunk);
        }
        assert_eq!(d.finish(), data_digest(&data));
        assert_eq!(d.finish_bytes(), data_digest(&data).to_le_bytes());
    }

    #[test]
    fn digest_lengths() {
        assert_eq!(Digests::NONE.header_len() + Digests::NONE.data_len(9), 0);
        assert_eq!(Digests::BOTH.header_len(), 4);
        assert_eq!(Digests::BOTH.data_len(0), 0);
        assert_eq!(Digests::BOTH.data_len(1), 4);
    }
}
