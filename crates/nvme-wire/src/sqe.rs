//! The 64-byte NVMe submission queue entry (SQE) and the SGL descriptor in
//! its data pointer: every byte position, nothing more. What the fields
//! mean for a given opcode is [`crate::command`]'s and
//! [`crate::fabrics`]'s job.
//!
//! Invariants: parsing never fails on 64 bytes (every bit pattern is some
//! SQE) and keeps every bit, so `Sqe::from_bytes(&b).to_bytes() == b`.

use crate::bytes::{bytes_at, le16, le32, le64, put, put16, put32, put64, put8, u8_at};
use crate::WireError;

/// Length of a submission queue entry.
pub const SQE_LEN: usize = 64;
/// Length of an SGL descriptor.
pub const SGL_DESCRIPTOR_LEN: usize = 16;

/// PSDT values (CDW0 bits 15:14): how DPTR (and MPTR) describe the data.
pub mod psdt {
    /// PRPs (not used on fabrics).
    pub const PRP: u8 = 0;
    /// SGLs; MPTR is a contiguous metadata buffer. NVMe over Fabrics
    /// requires this value (Linux hosts always send it).
    pub const SGL_CONTIGUOUS_METADATA: u8 = 1;
    /// SGLs; MPTR is an SGL segment.
    pub const SGL_METADATA_SGL: u8 = 2;
}

/// Fused operation values (CDW0 bits 9:8).
pub mod fuse {
    /// Normal operation.
    pub const NORMAL: u8 = 0;
    /// First command of a fused pair.
    pub const FIRST: u8 = 1;
    /// Second command of a fused pair.
    pub const SECOND: u8 = 2;
}

/// SGL descriptor identifiers (byte 15: type in bits 7:4, subtype in 3:0)
/// that NVMe/TCP uses.
pub mod sgl_id {
    /// Data Block, subtype Address.
    pub const DATA_BLOCK_ADDRESS: u8 = 0x00;
    /// Data Block, subtype Offset: in-capsule data at `address` bytes into
    /// the capsule's data (NVMe/TCP hosts send offset 0).
    pub const DATA_BLOCK_OFFSET: u8 = 0x01;
    /// Transport SGL Data Block, transport-specific subtype A: data moved
    /// by R2T/H2CData (writes) or C2HData (reads).
    pub const TRANSPORT_DATA_BLOCK: u8 = 0x5a;
}

/// A submission queue entry, field by field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sqe {
    /// CDW0 bits 7:0.
    pub opcode: u8,
    /// CDW0 bits 15:8: FUSE in bits 1:0, PSDT in bits 7:6, the rest
    /// reserved (kept so nothing is lost).
    pub flags: u8,
    /// Command identifier (CDW0 bits 31:16).
    pub cid: u16,
    /// Namespace identifier (bytes 4-7). For a Fabrics command byte 4 is
    /// FCTYPE instead.
    pub nsid: u32,
    /// CDW2 (bytes 8-11).
    pub cdw2: u32,
    /// CDW3 (bytes 12-15).
    pub cdw3: u32,
    /// Metadata pointer (bytes 16-23).
    pub mptr: u64,
    /// Data pointer (bytes 24-39), an SGL descriptor on fabrics.
    pub dptr: [u8; SGL_DESCRIPTOR_LEN],
    /// Command dwords 10 to 15 (bytes 40-63).
    pub cdw10: u32,
    pub cdw11: u32,
    pub cdw12: u32,
    pub cdw13: u32,
    pub cdw14: u32,
    pub cdw15: u32,
}

impl Sqe {
    /// An all-zero entry with the given opcode and command identifier and
    /// PSDT set to SGLs, as fabrics requires.
    pub fn new(opcode: u8, cid: u16) -> Sqe {
        Sqe::from_bytes(&[0; SQE_LEN]).with_header(opcode, cid)
    }

    fn with_header(mut self, opcode: u8, cid: u16) -> Sqe {
        self.opcode = opcode;
        self.cid = cid;
        self.flags = psdt::SGL_CONTIGUOUS_METADATA << 6;
        self
    }

    /// Parses the first [`SQE_LEN`] bytes of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Sqe, WireError> {
        let bytes: &[u8; SQE_LEN] =
            buf.get(..SQE_LEN)
                .and_then(|b| b.try_into().ok())
                .ok_or(WireError::TooShort {
                    what: "submission queue entry",
                    needed: SQE_LEN,
                    got: buf.len(),
                })?;
        Ok(Sqe::from_bytes(bytes))
    }

    /// Decodes 64 bytes.
    pub fn from_bytes(b: &[u8; SQE_LEN]) -> Sqe {
        Sqe {
            opcode: u8_at(b, 0),
            flags: u8_at(b, 1),
            cid: le16(b, 2),
            nsid: le32(b, 4),
            cdw2: le32(b, 8),
            cdw3: le32(b, 12),
            mptr: le64(b, 16),
            dptr: bytes_at(b, 24),
            cdw10: le32(b, 40),
            cdw11: le32(b, 44),
            cdw12: le32(b, 48),
            cdw13: le32(b, 52),
            cdw14: le32(b, 56),
            cdw15: le32(b, 60),
        }
    }

    /// Encodes the 64 bytes.
    pub fn to_bytes(&self) -> [u8; SQE_LEN] {
        let mut b = [0u8; SQE_LEN];
        put8(&mut b, 0, self.opcode);
        put8(&mut b, 1, self.flags);
        put16(&mut b, 2, self.cid);
        put32(&mut b, 4, self.nsid);
        put32(&mut b, 8, self.cdw2);
        put32(&mut b, 12, self.cdw3);
        put64(&mut b, 16, self.mptr);
        put(&mut b, 24, &self.dptr);
        put32(&mut b, 40, self.cdw10);
        put32(&mut b, 44, self.cdw11);
        put32(&mut b, 48, self.cdw12);
        put32(&mut b, 52, self.cdw13);
        put32(&mut b, 56, self.cdw14);
        put32(&mut b, 60, self.cdw15);
        b
    }

    /// Fused operation (see [`fuse`]).
    pub fn fuse(&self) -> u8 {
        self.flags & 0x03
    }

    /// PRP or SGL data transfer (see [`psdt`]).
    pub fn psdt(&self) -> u8 {
        self.flags >> 6
    }

    /// The data pointer read as an SGL descriptor.
    pub fn sgl(&self) -> SglDescriptor {
        SglDescriptor::from_bytes(&self.dptr)
    }

    /// Stores an SGL descriptor in the data pointer.
    pub fn set_sgl(&mut self, sgl: &SglDescriptor) {
        self.dptr = sgl.to_bytes();
    }

    /// The Fabrics command type (byte 4); meaningful only when the opcode
    /// is [`crate::fabrics::FABRICS_OPCODE`].
    pub fn fctype(&self) -> u8 {
        self.nsid.to_le_bytes()[0]
    }

    /// CDW10 and CDW11 as one 64-bit value (a starting LBA).
    pub fn cdw10_11(&self) -> u64 {
        u64::from(self.cdw10) | (u64::from(self.cdw11) << 32)
    }

    /// CDW12 and CDW13 as one 64-bit value (a log page offset).
    pub fn cdw12_13(&self) -> u64 {
        u64::from(self.cdw12) | (u64::from(self.cdw13) << 32)
    }
}

/// What an SGL descriptor describes, for the identifiers NVMe/TCP uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SglKind {
    /// In-capsule data (Data Block, subtype Offset): `address` is the
    /// offset into the capsule's data.
    InCapsule,
    /// Data transferred by the transport (Transport SGL Data Block,
    /// subtype A).
    Transport,
    /// Any other descriptor; a target answers it with "SGL Descriptor Type
    /// Invalid".
    Other { sgl_type: u8, subtype: u8 },
}

/// A 16-byte SGL descriptor in the generic layout: address (bytes 0-7),
/// length (8-11), bytes 12-14, identifier (15).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SglDescriptor {
    /// Address, or offset for the Offset subtype.
    pub address: u64,
    /// Length of the data in bytes.
    pub length: u32,
    /// Bytes 12-14: reserved for unkeyed descriptors.
    pub reserved: [u8; 3],
    /// SGL identifier: type in bits 7:4, subtype in bits 3:0.
    pub id: u8,
}

impl SglDescriptor {
    /// In-capsule data of `length` bytes at `offset` into the capsule data.
    pub fn in_capsule(offset: u64, length: u32) -> SglDescriptor {
        SglDescriptor {
            address: offset,
            length,
            reserved: [0; 3],
            id: sgl_id::DATA_BLOCK_OFFSET,
        }
    }

    /// `length` bytes moved by the transport (R2T/H2CData or C2HData).
    pub fn transport(length: u32) -> SglDescriptor {
        SglDescriptor {
            address: 0,
            length,
            reserved: [0; 3],
            id: sgl_id::TRANSPORT_DATA_BLOCK,
        }
    }

    /// Decodes 16 bytes.
    pub fn from_bytes(b: &[u8; SGL_DESCRIPTOR_LEN]) -> SglDescriptor {
        SglDescriptor {
            address: le64(b, 0),
            length: le32(b, 8),
            reserved: bytes_at(b, 12),
            id: u8_at(b, 15),
        }
    }

    /// Encodes the 16 bytes.
    pub fn to_bytes(&self) -> [u8; SGL_DESCRIPTOR_LEN] {
        let mut b = [0u8; SGL_DESCRIPTOR_LEN];
        put64(&mut b, 0, self.address);
        put32(&mut b, 8, self.length);
        put(&mut b, 12, &self.reserved);
        put8(&mut b, 15, self.id);
        b
    }

    /// The descriptor type (bits 7:4 of the identifier).
    pub fn sgl_type(&self) -> u8 {
        self.id >> 4
    }

    /// The descriptor subtype (bits 3:0 of the identifier).
    pub fn subtype(&self) -> u8 {
        self.id & 0x0f
    }

    /// Classifies the descriptor.
    pub fn kind(&self) -> SglKind {
        match self.id {
            sgl_id::DATA_BLOCK_OFFSET => SglKind::InCapsule,
            sgl_id::TRANSPORT_DATA_BLOCK => SglKind::Transport,
            _ => SglKind::Other {
                sgl_type: self.sgl_type(),
                subtype: self.subtype(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_offsets() {
        let mut b = [0u8; SQE_LEN];
        for (i, x) in b.iter_mut().enumerate() {
            *x = i as u8;
        }
        let s = Sqe::from_bytes(&b);
        assert_eq!(s.opcode, 0);
        assert_eq!(s.flags, 1);
        assert_eq!(s.cid, 0x0302);
        assert_eq!(s.nsid, 0x0706_0504);
        assert_eq!(s.mptr, 0x1716_1514_1312_1110);
        assert_eq!(s.dptr[0], 24);
        assert_eq!(s.cdw10, 0x2b2a_2928);
        assert_eq!(s.cdw15, 0x3f3e_3d3c);
        assert_eq!(s.to_bytes(), b);
        let sgl = s.sgl();
        assert_eq!(sgl.address, 0x1f1e_1d1c_1b1a_1918);
        assert_eq!(sgl.length, 0x2322_2120);
        assert_eq!(sgl.id, 0x27);
    }

    #[test]
    fn flags_fields() {
        let mut s = Sqe::new(0x02, 7);
        assert_eq!(s.psdt(), psdt::SGL_CONTIGUOUS_METADATA);
        assert_eq!(s.to_bytes()[1], 0x40);
        s.flags |= fuse::SECOND;
        assert_eq!(s.fuse(), fuse::SECOND);
        assert!(Sqe::parse(&[0; 63]).is_err());
    }

    #[test]
    fn sgl_kinds() {
        assert_eq!(SglDescriptor::in_capsule(0, 512).kind(), SglKind::InCapsule);
        assert_eq!(SglDescriptor::transport(4096).kind(), SglKind::Transport);
        assert_eq!(SglDescriptor::transport(4096).to_bytes()[15], 0x5a);
        let keyed = SglDescriptor {
            id: 0x40,
            ..SglDescriptor::transport(1)
        };
        assert_eq!(
            keyed.kind(),
            SglKind::Other {
                sgl_type: 4,
                subtype: 0
            }
        );
    }
}
