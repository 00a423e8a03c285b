//! NVMe/TCP header and data digests: CRC32C (Castagnoli, the standard
//! reflected form with initial value and final XOR of all ones), sent as a
//! little-endian dword after the header (HDGST) and after the data (DDGST).
//!
//! Invariants: the header digest covers exactly the HLEN bytes of the PDU
//! header (common header plus PDU-specific header), never the padding; the
//! data digest covers exactly the PDU data, never padding before it.

/// Length of either digest on the wire.
pub const DIGEST_LEN: usize = 4;

/// Which digests a connection uses, as negotiated by ICReq/ICResp (the DGST
/// byte: bit 0 header digest, bit 1 data digest).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Digests {
    /// HDGST follows the header of every PDU type that may carry one
    /// (CapsuleCmd, CapsuleResp, H2CData, C2HData, R2T).
    pub header: bool,
    /// DDGST follows the data of every PDU that carries data.
    pub data: bool,
}

impl Digests {
    /// No digests: the state before ICReq/ICResp and the default.
    pub const NONE: Digests = Digests {
        header: false,
        data: false,
    };
    /// Both digests.
    pub const BOTH: Digests = Digests {
        header: true,
        data: true,
    };

    /// Decodes the DGST byte of ICReq/ICResp; reserved bits are ignored.
    pub fn from_bits(bits: u8) -> Digests {
        Digests {
            header: bits & 0x01 != 0,
            data: bits & 0x02 != 0,
        }
    }

    /// The DGST byte.
    pub fn bits(self) -> u8 {
        u8::from(self.header) | (u8::from(self.data) << 1)
    }

    /// Bytes the header digest occupies (0 or 4).
    pub fn header_len(self) -> usize {
        if self.header {
            DIGEST_LEN
        } else {
            0
        }
    }

    /// Bytes the data digest occupies after non-empty data (0 or 4).
    pub fn data_len(self) -> usize {
        if self.data {
            DIGEST_LEN
        } else {
            0
        }
    }
}

/// CRC32C of `bytes`, the value a digest field carries.
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

/// Incremental data digest, for data that is sent or received in pieces
/// (scatter/gather buffers) without first copying it together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DataDigest {
    crc: u32,
}

impl DataDigest {
    /// A digest over no bytes yet.
    pub fn new() -> DataDigest {
        DataDigest { crc: 0 }
    }

    /// Adds the next piece of data.
    pub fn update(&mut self, bytes: &[u8]) {
        self.crc = crc32c::crc32c_append(self.crc, bytes);
    }

    /// The CRC32C of everything added so far.
    pub fn value(&self) -> u32 {
        self.crc
    }

    /// The four bytes that go on the wire.
    pub fn to_bytes(&self) -> [u8; DIGEST_LEN] {
        self.crc.to_le_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_check_value() {
        // The CRC-32C check value of the ASCII digits 1..9.
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c(b""), 0);
    }

    #[test]
    fn incremental_matches_one_shot() {
        let data: Vec<u8> = (0..=255u8).cycle().take(10_000).collect();
        let mut d = DataDigest::new();
        for chunk in data.chunks(777) {
            d.update(chunk);
        }
        assert_eq!(d.value(), crc32c(&data));
        assert_eq!(d.to_bytes(), crc32c(&data).to_le_bytes());
    }

    #[test]
    fn dgst_bits() {
        for bits in 0..=255u8 {
            let d = Digests::from_bits(bits);
            assert_eq!(d.bits(), bits & 3);
        }
        assert_eq!(Digests::BOTH.header_len() + Digests::BOTH.data_len(), 8);
    }
}
