//! NVMe over Fabrics commands (opcode 7Fh): Connect with its 1024-byte
//! connect data, Property Get/Set, Disconnect and the authentication
//! commands, and the result dwords Connect completes with.
//!
//! Invariants: viewing a Fabrics SQE never fails; `to_sqe` of every view
//! produces an SQE that views back to the same value; connect data parsing
//! accepts exactly what [`ConnectData::to_bytes`] can produce (NQNs of at
//! most 223 UTF-8 bytes, NUL-terminated in their 256-byte fields) and
//! reports the offending byte offset otherwise, which is what a target puts
//! in the Connect Invalid Parameters result.

use crate::bytes::{
    bytes_at, check_nqn, le16, nul_terminated, put, put16, put_nul_padded, NQN_MAX_LEN,
};
use crate::properties::PropertySize;
use crate::sqe::Sqe;
use crate::WireError;

/// Opcode of every Fabrics command.
pub const FABRICS_OPCODE: u8 = 0x7f;

/// Fabrics command types (SQE byte 4).
pub mod fctype {
    pub const PROPERTY_SET: u8 = 0x00;
    pub const CONNECT: u8 = 0x01;
    pub const PROPERTY_GET: u8 = 0x04;
    pub const AUTHENTICATION_SEND: u8 = 0x05;
    pub const AUTHENTICATION_RECEIVE: u8 = 0x06;
    pub const DISCONNECT: u8 = 0x08;
}

/// Byte offsets of Connect's fields in the SQE, for
/// [`connect_invalid_parameter_result`].
pub mod connect_sqe_offset {
    pub const RECFMT: u16 = 40;
    pub const QID: u16 = 42;
    pub const SQSIZE: u16 = 44;
    pub const CATTR: u16 = 46;
    pub const KATO: u16 = 48;
}

/// Byte offsets of the connect data fields, for
/// [`connect_invalid_parameter_result`].
pub mod connect_data_offset {
    pub const HOSTID: u16 = 0;
    pub const CNTLID: u16 = 16;
    pub const SUBNQN: u16 = 256;
    pub const HOSTNQN: u16 = 512;
}

/// Length of the Connect command's data.
pub const CONNECT_DATA_LEN: usize = 1024;
/// CNTLID in connect data asking for any controller (dynamic model).
pub const CNTLID_DYNAMIC: u16 = 0xffff;
/// CNTLID in connect data asking for any controller (static model).
pub const CNTLID_STATIC_ANY: u16 = 0xfffe;
/// The well-known NQN of discovery subsystems.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";

/// Result DW0 of a successful Connect: the controller ID (bits 15:0) and
/// the authentication requirements (bits 31:16, 0 when none).
pub fn connect_success_result(cntlid: u16, authreq: u16) -> u32 {
    u32::from(cntlid) | (u32::from(authreq) << 16)
}

/// Result DW0 of a Connect that failed with
/// [`crate::Status::CONNECT_INVALID_PARAMETERS`]: the byte offset of the
/// invalid parameter (bits 15:0) and whether it lies in the connect data
/// (bit 16 set) or in the SQE (clear).
pub fn connect_invalid_parameter_result(in_connect_data: bool, offset: u16) -> u32 {
    u32::from(offset) | (u32::from(in_connect_data) << 16)
}

/// Fabrics commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FabricsCommand {
    Connect(Connect),
    PropertyGet(PropertyGet),
    PropertySet(PropertySet),
    /// Disconnect the I/O queue the command arrived on.
    Disconnect {
        recfmt: u16,
    },
    AuthenticationSend(Authentication),
    AuthenticationReceive(Authentication),
    /// Any other command type, for the target to refuse.
    Other {
        fctype: u8,
    },
}

/// Views a Fabrics SQE.
pub fn parse_fabrics(s: &Sqe) -> FabricsCommand {
    match s.fctype() {
        fctype::CONNECT => FabricsCommand::Connect(Connect {
            recfmt: s.cdw10 as u16,
            qid: (s.cdw10 >> 16) as u16,
            sqsize: s.cdw11 as u16,
            cattr: (s.cdw11 >> 16) as u8,
            kato: s.cdw12,
        }),
        fctype::PROPERTY_GET => FabricsCommand::PropertyGet(PropertyGet {
            attrib: s.cdw10 as u8,
            offset: s.cdw11,
        }),
        fctype::PROPERTY_SET => FabricsCommand::PropertySet(PropertySet {
            attrib: s.cdw10 as u8,
            offset: s.cdw11,
            value: u64::from(s.cdw12) | (u64::from(s.cdw13) << 32),
        }),
        fctype::DISCONNECT => FabricsCommand::Disconnect {
            recfmt: s.cdw10 as u16,
        },
        t @ (fctype::AUTHENTICATION_SEND | fctype::AUTHENTICATION_RECEIVE) => {
            let a = Authentication {
                secp: (s.cdw10 >> 24) as u8,
                spsp0: (s.cdw10 >> 8) as u8,
                spsp1: (s.cdw10 >> 16) as u8,
                length: s.cdw11,
            };
            if t == fctype::AUTHENTICATION_SEND {
                FabricsCommand::AuthenticationSend(a)
            } else {
                FabricsCommand::AuthenticationReceive(a)
            }
        }
        fctype => FabricsCommand::Other { fctype },
    }
}

fn fabrics_sqe(fctype: u8, cid: u16) -> Sqe {
    let mut s = Sqe::new(FABRICS_OPCODE, cid);
    s.nsid = u32::from(fctype);
    s
}

/// Connect: creates the admin queue (and a controller) or an I/O queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Connect {
    /// Record format (bytes 40-41); only 0 is defined.
    pub recfmt: u16,
    /// Queue identifier (bytes 42-43): 0 for the admin queue.
    pub qid: u16,
    /// Submission queue size, 0's based (bytes 44-45).
    pub sqsize: u16,
    /// Connect attributes (byte 46): priority class in bits 1:0, disable
    /// SQ flow control in bit 2.
    pub cattr: u8,
    /// Keep alive timeout in milliseconds (bytes 48-51), admin queue only.
    pub kato: u32,
}

impl Connect {
    /// Number of entries the host wants in the queue.
    pub fn queue_entries(&self) -> u32 {
        u32::from(self.sqsize) + 1
    }

    /// True when the host asks for SQ flow control to be disabled (the
    /// controller then reports SQHD as 0xFFFF).
    pub fn disable_sq_flow_control(&self) -> bool {
        self.cattr & 0x04 != 0
    }

    /// The SQE (host side); the connect data goes in the capsule.
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        let mut s = fabrics_sqe(fctype::CONNECT, cid);
        s.cdw10 = u32::from(self.recfmt) | (u32::from(self.qid) << 16);
        s.cdw11 = u32::from(self.sqsize) | (u32::from(self.cattr) << 16);
        s.cdw12 = self.kato;
        s
    }
}

/// Property Get.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PropertyGet {
    /// Attributes (byte 40): bits 2:0 give the size.
    pub attrib: u8,
    /// Property offset (bytes 44-47).
    pub offset: u32,
}

impl PropertyGet {
    /// The property size asked for.
    pub fn size(&self) -> PropertySize {
        PropertySize::from_attrib(self.attrib)
    }

    /// The SQE (host side).
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        let mut s = fabrics_sqe(fctype::PROPERTY_GET, cid);
        s.cdw10 = u32::from(self.attrib);
        s.cdw11 = self.offset;
        s
    }
}

/// Property Set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PropertySet {
    /// Attributes (byte 40): bits 2:0 give the size.
    pub attrib: u8,
    /// Property offset (bytes 44-47).
    pub offset: u32,
    /// Value (bytes 48-55); only the low 4 bytes count for a 4-byte
    /// property.
    pub value: u64,
}

impl PropertySet {
    /// The property size written.
    pub fn size(&self) -> PropertySize {
        PropertySize::from_attrib(self.attrib)
    }

    /// The SQE (host side).
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        let mut s = fabrics_sqe(fctype::PROPERTY_SET, cid);
        s.cdw10 = u32::from(self.attrib);
        s.cdw11 = self.offset;
        s.cdw12 = self.value as u32;
        s.cdw13 = (self.value >> 32) as u32;
        s
    }
}

/// Authentication Send / Receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Authentication {
    /// Security protocol (byte 43).
    pub secp: u8,
    /// SP specific 0 (byte 41).
    pub spsp0: u8,
    /// SP specific 1 (byte 42).
    pub spsp1: u8,
    /// Transfer length (send) or allocation length (receive), bytes 44-47.
    pub length: u32,
}

/// The Connect command's data.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConnectData {
    /// Host identifier (bytes 0-15).
    pub hostid: [u8; 16],
    /// Controller ID requested (bytes 16-17): [`CNTLID_DYNAMIC`] on the
    /// admin queue of a dynamic controller, the controller's ID on I/O
    /// queues.
    pub cntlid: u16,
    /// NQN of the subsystem (bytes 256-511).
    pub subnqn: String,
    /// NQN of the host (bytes 512-767).
    pub hostnqn: String,
}

impl ConnectData {
    /// Parses the first [`CONNECT_DATA_LEN`] bytes of `data`.
    pub fn parse(data: &[u8]) -> Result<ConnectData, WireError> {
        if data.len() < CONNECT_DATA_LEN {
            return Err(WireError::TooShort {
                what: "connect data",
                needed: CONNECT_DATA_LEN,
                got: data.len(),
            });
        }
        Ok(ConnectData {
            hostid: bytes_at(data, 0),
            cntlid: le16(data, 16),
            subnqn: nul_terminated(data, 256, 256, NQN_MAX_LEN, "connect data SUBNQN")?,
            hostnqn: nul_terminated(data, 512, 256, NQN_MAX_LEN, "connect data HOSTNQN")?,
        })
    }

    /// The 1024 bytes.
    pub fn to_bytes(&self) -> Result<[u8; CONNECT_DATA_LEN], WireError> {
        check_nqn(&self.subnqn, "SUBNQN")?;
        check_nqn(&self.hostnqn, "HOSTNQN")?;
        let mut b = [0u8; CONNECT_DATA_LEN];
        put(&mut b, 0, &self.hostid);
        put16(&mut b, 16, self.cntlid);
        put_nul_padded(&mut b, 256, 256, &self.subnqn);
        put_nul_padded(&mut b, 512, 256, &self.hostnqn);
        Ok(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{parse_command, Command, QueueType};

    #[test]
    fn connect_sqe_layout() {
        let c = Connect {
            recfmt: 0,
            qid: 3,
            sqsize: 127,
            cattr: 0x04,
            kato: 0,
        };
        let s = c.to_sqe(9);
        let b = s.to_bytes();
        assert_eq!(b[0], 0x7f);
        assert_eq!(b[1], 0x40);
        assert_eq!(b[4], 0x01);
        assert_eq!(&b[42..44], &[3, 0]);
        assert_eq!(&b[44..46], &[127, 0]);
        assert_eq!(b[46], 0x04);
        let Command::Fabrics(FabricsCommand::Connect(back)) = parse_command(&s, QueueType::Io)
        else {
            panic!("not connect");
        };
        assert_eq!(back, c);
        assert_eq!(back.queue_entries(), 128);
        assert!(back.disable_sq_flow_control());
    }

    #[test]
    fn property_layout() {
        let set = PropertySet {
            attrib: 0,
            offset: 0x14,
            value: 0x0046_0001,
        };
        let b = set.to_sqe(1).to_bytes();
        assert_eq!(b[4], 0x00);
        assert_eq!(b[40], 0);
        assert_eq!(&b[44..48], &[0x14, 0, 0, 0]);
        assert_eq!(&b[48..56], &[1, 0, 0x46, 0, 0, 0, 0, 0]);
        assert_eq!(
            parse_fabrics(&set.to_sqe(1)),
            FabricsCommand::PropertySet(set)
        );
        let get = PropertyGet {
            attrib: 1,
            offset: 0,
        };
        assert_eq!(get.size(), PropertySize::Eight);
        assert_eq!(
            parse_fabrics(&get.to_sqe(2)),
            FabricsCommand::PropertyGet(get)
        );
    }

    #[test]
    fn connect_data_layout() {
        let d = ConnectData {
            hostid: [0xab; 16],
            cntlid: CNTLID_DYNAMIC,
            subnqn: "nqn.2024-01.io.basalt:vol1".into(),
            hostnqn: "nqn.2014-08.org.nvmexpress:uuid:1".into(),
        };
        let b = d.to_bytes().unwrap();
        assert_eq!(&b[16..18], &[0xff, 0xff]);
        assert_eq!(&b[256..260], b"nqn.");
        assert_eq!(b[256 + d.subnqn.len()], 0);
        assert_eq!(&b[512..516], b"nqn.");
        assert_eq!(ConnectData::parse(&b).unwrap(), d);

        let mut bad = b;
        bad[256..512].fill(b'a');
        assert_eq!(
            ConnectData::parse(&bad),
            Err(WireError::BadField {
                what: "connect data SUBNQN",
                offset: 256,
                reason: "string is not NUL-terminated"
            })
        );
        assert!(ConnectData::parse(&b[..1023]).is_err());
        let long = ConnectData {
            subnqn: "n".repeat(224),
            ..d
        };
        assert!(long.to_bytes().is_err());
    }

    #[test]
    fn connect_results() {
        assert_eq!(connect_success_result(7, 0), 7);
        // Linux: IPO_IATTR_CONNECT_DATA(subsysnqn) = (1 << 16) | 256.
        assert_eq!(
            connect_invalid_parameter_result(true, connect_data_offset::SUBNQN),
            0x0001_0100
        );
        assert_eq!(
            connect_invalid_parameter_result(false, connect_sqe_offset::QID),
            42
        );
    }
}
