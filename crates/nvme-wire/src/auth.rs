//! In-band authentication (NVMe Base Specification 2.0, 8.13): the
//! messages Authentication Send/Receive carry for DH-HMAC-CHAP, and the
//! `DHHC-1` secret representation hosts and targets exchange secrets in
//! (what `nvme gen-dhchap-key` prints and `nvme connect --dhchap-secret`
//! takes).
//!
//! Pure bytes: the hashes, HMACs and Diffie-Hellman live with the target.
//! Parsers never panic and check every length field against the bytes
//! they were given; encoders write reserved bytes as zero.

use crate::WireError;
use base64::Engine as _;

/// Security protocol of every authentication command (SECP).
pub const SECP_NVME: u8 = 0xe9;
/// SPSP0 and SPSP1 of every authentication command.
pub const SPSP: u8 = 0x01;

/// Message types (byte 0).
pub mod auth_type {
    pub const COMMON: u8 = 0x00;
    pub const DHCHAP: u8 = 0x01;
}

/// Message identifiers (byte 1).
pub mod auth_id {
    pub const NEGOTIATE: u8 = 0x00;
    pub const CHALLENGE: u8 = 0x01;
    pub const REPLY: u8 = 0x02;
    pub const SUCCESS1: u8 = 0x03;
    pub const SUCCESS2: u8 = 0x04;
    pub const FAILURE2: u8 = 0xf0;
    pub const FAILURE1: u8 = 0xf1;
}

/// Hash function identifiers.
pub mod hash_id {
    pub const SHA256: u8 = 0x01;
    pub const SHA384: u8 = 0x02;
    pub const SHA512: u8 = 0x03;
}

/// Diffie-Hellman group identifiers (RFC 7919 groups, or none).
pub mod dh_group {
    pub const NULL: u8 = 0x00;
    pub const FFDHE2048: u8 = 0x01;
    pub const FFDHE3072: u8 = 0x02;
    pub const FFDHE4096: u8 = 0x03;
    pub const FFDHE6144: u8 = 0x04;
    pub const FFDHE8192: u8 = 0x05;
}

/// Reason code explanations of AUTH_Failure1/2 (the reason code is always
/// 1, "authentication failure").
pub mod failure {
    pub const FAILED: u8 = 0x01;
    pub const PROTOCOL_UNUSABLE: u8 = 0x02;
    pub const SCC_MISMATCH: u8 = 0x03;
    pub const HASH_UNUSABLE: u8 = 0x04;
    pub const DHGROUP_UNUSABLE: u8 = 0x05;
    pub const INCORRECT_PAYLOAD: u8 = 0x06;
    pub const INCORRECT_PROTOCOL_MESSAGE: u8 = 0x07;
}

/// One authentication protocol a host offers in AUTH_Negotiate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtocolDescriptor {
    /// 0x01: DH-HMAC-CHAP.
    pub auth_id: u8,
    pub hash_ids: Vec<u8>,
    pub dh_groups: Vec<u8>,
}

/// What a host sends (Authentication Send).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostMessage {
    Negotiate {
        tid: u16,
        /// Secure channel concatenation asked for (0: none).
        sc_c: u8,
        protocols: Vec<ProtocolDescriptor>,
    },
    Reply {
        tid: u16,
        /// The host's response to the controller's challenge.
        response: Vec<u8>,
        /// The host's own challenge, when it wants the controller to
        /// authenticate too (bidirectional).
        challenge: Option<Vec<u8>>,
        /// Sequence number of the host's challenge.
        seqnum: u32,
        /// The host's Diffie-Hellman public value (empty: null group).
        dh_value: Vec<u8>,
    },
    Success2 {
        tid: u16,
    },
    Failure2 {
        tid: u16,
        reason: u8,
        explanation: u8,
    },
}

/// What a controller sends (Authentication Receive).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControllerMessage {
    Challenge {
        tid: u16,
        hash_id: u8,
        dh_group: u8,
        seqnum: u32,
        challenge: Vec<u8>,
        dh_value: Vec<u8>,
    },
    Success1 {
        tid: u16,
        /// Hash length of the transaction (sent even without a response:
        /// the Linux host reads it).
        hash_len: u8,
        /// The controller's response to the host's challenge.
        response: Option<Vec<u8>>,
    },
    Failure1 {
        tid: u16,
        explanation: u8,
    },
}

const WHAT: &str = "authentication message";
const DESCRIPTOR_LEN: usize = 64;
const ID_LIST_LEN: usize = 30;

fn too_short(needed: usize, got: usize) -> WireError {
    WireError::TooShort {
        what: WHAT,
        needed,
        got,
    }
}

fn bad(offset: usize, reason: &'static str) -> WireError {
    WireError::BadField {
        what: WHAT,
        offset,
        reason,
    }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

impl HostMessage {
    /// Parses the data of an Authentication Send.
    pub fn parse(b: &[u8]) -> Result<HostMessage, WireError> {
        if b.len() < 8 {
            return Err(too_short(8, b.len()));
        }
        let tid = u16_at(b, 4);
        match (b[0], b[1]) {
            (auth_type::COMMON, auth_id::NEGOTIATE) => {
                let napd = usize::from(b[7]);
                let needed = 8 + napd * DESCRIPTOR_LEN;
                if b.len() < needed {
                    return Err(too_short(needed, b.len()));
                }
                let protocols = (0..napd)
                    .map(|i| {
                        let d = &b[8 + i * DESCRIPTOR_LEN..8 + (i + 1) * DESCRIPTOR_LEN];
                        let (halen, dhlen) = (usize::from(d[2]), usize::from(d[3]));
                        if halen > ID_LIST_LEN || dhlen > ID_LIST_LEN {
                            return Err(bad(8 + i * DESCRIPTOR_LEN + 2, "list longer than 30"));
                        }
                        Ok(ProtocolDescriptor {
                            auth_id: d[0],
                            hash_ids: d[4..4 + halen].to_vec(),
                            dh_groups: d[34..34 + dhlen].to_vec(),
                        })
                    })
                    .collect::<Result<_, _>>()?;
                Ok(HostMessage::Negotiate {
                    tid,
                    sc_c: b[6],
                    protocols,
                })
            }
            (auth_type::DHCHAP, auth_id::REPLY) => {
                if b.len() < 16 {
                    return Err(too_short(16, b.len()));
                }
                let hl = usize::from(b[6]);
                if hl == 0 {
                    return Err(bad(6, "hash length 0"));
                }
                let cvalid = b[8];
                if cvalid > 1 {
                    return Err(bad(8, "CVALID is neither 0 nor 1"));
                }
                let dhvlen = usize::from(u16_at(b, 10));
                let needed = 16 + 2 * hl + dhvlen;
                if b.len() < needed {
                    return Err(too_short(needed, b.len()));
                }
                Ok(HostMessage::Reply {
                    tid,
                    response: b[16..16 + hl].to_vec(),
                    challenge: (cvalid == 1).then(|| b[16 + hl..16 + 2 * hl].to_vec()),
                    seqnum: u32_at(b, 12),
                    dh_value: b[16 + 2 * hl..needed].to_vec(),
                })
            }
            (auth_type::DHCHAP, auth_id::SUCCESS2) => Ok(HostMessage::Success2 { tid }),
            (auth_type::COMMON, auth_id::FAILURE2) => Ok(HostMessage::Failure2 {
                tid,
                reason: b[6],
                explanation: b[7],
            }),
            _ => Err(bad(1, "not a message a host sends")),
        }
    }

    /// The bytes of the message (host side, for tests).
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            HostMessage::Negotiate {
                tid,
                sc_c,
                protocols,
            } => {
                out.extend_from_slice(&[auth_type::COMMON, auth_id::NEGOTIATE, 0, 0]);
                out.extend_from_slice(&tid.to_le_bytes());
                out.push(*sc_c);
                out.push(protocols.len().min(255) as u8);
                for p in protocols.iter().take(255) {
                    let mut d = [0u8; DESCRIPTOR_LEN];
                    let hashes = &p.hash_ids[..p.hash_ids.len().min(ID_LIST_LEN)];
                    let groups = &p.dh_groups[..p.dh_groups.len().min(ID_LIST_LEN)];
                    d[0] = p.auth_id;
                    d[2] = hashes.len() as u8;
                    d[3] = groups.len() as u8;
                    d[4..4 + hashes.len()].copy_from_slice(hashes);
                    d[34..34 + groups.len()].copy_from_slice(groups);
                    out.extend_from_slice(&d);
                }
            }
            HostMessage::Reply {
                tid,
                response,
                challenge,
                seqnum,
                dh_value,
            } => {
                out.extend_from_slice(&[auth_type::DHCHAP, auth_id::REPLY, 0, 0]);
                out.extend_from_slice(&tid.to_le_bytes());
                out.push(response.len() as u8);
                out.push(0);
                out.push(u8::from(challenge.is_some()));
                out.push(0);
                out.extend_from_slice(&(dh_value.len() as u16).to_le_bytes());
                out.extend_from_slice(&seqnum.to_le_bytes());
                out.extend_from_slice(response);
                match challenge {
                    Some(c) => out.extend_from_slice(c),
                    None => out.resize(out.len() + response.len(), 0),
                }
                out.extend_from_slice(dh_value);
            }
            HostMessage::Success2 { tid } => {
                out.extend_from_slice(&[auth_type::DHCHAP, auth_id::SUCCESS2, 0, 0]);
                out.extend_from_slice(&tid.to_le_bytes());
                out.extend_from_slice(&[0; 10]);
            }
            HostMessage::Failure2 {
                tid,
                reason,
                explanation,
            } => {
                out.extend_from_slice(&[auth_type::COMMON, auth_id::FAILURE2, 0, 0]);
                out.extend_from_slice(&tid.to_le_bytes());
                out.extend_from_slice(&[*reason, *explanation]);
            }
        }
    }
}

impl ControllerMessage {
    /// The bytes of the message, for an Authentication Receive.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            ControllerMessage::Challenge {
                tid,
                hash_id,
                dh_group,
                seqnum,
                challenge,
                dh_value,
            } => {
                out.extend_from_slice(&[auth_type::DHCHAP, auth_id::CHALLENGE, 0, 0]);
                out.extend_from_slice(&tid.to_le_bytes());
                out.push(challenge.len() as u8);
                out.push(0);
                out.push(*hash_id);
                out.push(*dh_group);
                out.extend_from_slice(&(dh_value.len() as u16).to_le_bytes());
                out.extend_from_slice(&seqnum.to_le_bytes());
                out.extend_from_slice(challenge);
                out.extend_from_slice(dh_value);
            }
            ControllerMessage::Success1 {
                tid,
                hash_len,
                response,
            } => {
                out.extend_from_slice(&[auth_type::DHCHAP, auth_id::SUCCESS1, 0, 0]);
                out.extend_from_slice(&tid.to_le_bytes());
                out.push(*hash_len);
                out.push(0);
                out.push(u8::from(response.is_some()));
                out.extend_from_slice(&[0; 7]);
                if let Some(r) = response {
                    out.extend_from_slice(r);
                }
            }
            ControllerMessage::Failure1 { tid, explanation } => {
                out.extend_from_slice(&[auth_type::COMMON, auth_id::FAILURE1, 0, 0]);
                out.extend_from_slice(&tid.to_le_bytes());
                out.extend_from_slice(&[failure::FAILED, *explanation]);
            }
        }
    }

    /// Parses a controller message (host side, for tests).
    pub fn parse(b: &[u8]) -> Result<ControllerMessage, WireError> {
        if b.len() < 8 {
            return Err(too_short(8, b.len()));
        }
        let tid = u16_at(b, 4);
        match (b[0], b[1]) {
            (auth_type::DHCHAP, auth_id::CHALLENGE) => {
                if b.len() < 16 {
                    return Err(too_short(16, b.len()));
                }
                let hl = usize::from(b[6]);
                let dhvlen = usize::from(u16_at(b, 10));
                let needed = 16 + hl + dhvlen;
                if b.len() < needed {
                    return Err(too_short(needed, b.len()));
                }
                Ok(ControllerMessage::Challenge {
                    tid,
                    hash_id: b[8],
                    dh_group: b[9],
                    seqnum: u32_at(b, 12),
                    challenge: b[16..16 + hl].to_vec(),
                    dh_value: b[16 + hl..needed].to_vec(),
                })
            }
            (auth_type::DHCHAP, auth_id::SUCCESS1) => {
                if b.len() < 16 {
                    return Err(too_short(16, b.len()));
                }
                let hl = usize::from(b[6]);
                let response = match b[8] {
                    0 => None,
                    _ if b.len() < 16 + hl => return Err(too_short(16 + hl, b.len())),
                    _ => Some(b[16..16 + hl].to_vec()),
                };
                Ok(ControllerMessage::Success1 {
                    tid,
                    hash_len: b[6],
                    response,
                })
            }
            (auth_type::COMMON, auth_id::FAILURE1) => Ok(ControllerMessage::Failure1 {
                tid,
                explanation: b[7],
            }),
            _ => Err(bad(1, "not a message a controller sends")),
        }
    }
}

/// A DH-HMAC-CHAP secret: `DHHC-1:<hh>:<base64 of key and its CRC-32>:`,
/// where `hh` names the hash the key is transformed with before use (00:
/// used as it is; 01/02/03: HMAC-SHA-256/384/512 over the NQN).
#[derive(Clone, PartialEq, Eq)]
pub struct DhchapSecret {
    pub transform: u8,
    pub key: Vec<u8>,
}

impl std::fmt::Debug for DhchapSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material.
        f.debug_struct("DhchapSecret")
            .field("transform", &self.transform)
            .field("key_len", &self.key.len())
            .finish()
    }
}

/// Why a `DHHC-1` secret was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("a DH-HMAC-CHAP secret reads DHHC-1:<hash>:<base64>:")]
    Format,
    #[error("unknown key transformation {0:02x} (00 to 03)")]
    Transform(u8),
    #[error("the key is not base64")]
    Base64,
    #[error("the key is {0} bytes; 32, 48 or 64 are allowed")]
    Length(usize),
    #[error("the key's CRC-32 does not match (mistyped?)")]
    Checksum,
}

impl DhchapSecret {
    /// Parses a secret as `nvme gen-dhchap-key` writes it.
    pub fn parse(text: &str) -> Result<DhchapSecret, SecretError> {
        let rest = text
            .trim()
            .strip_prefix("DHHC-1:")
            .ok_or(SecretError::Format)?;
        let (hh, rest) = rest.split_once(':').ok_or(SecretError::Format)?;
        let b64 = rest.strip_suffix(':').ok_or(SecretError::Format)?;
        if hh.len() != 2 {
            return Err(SecretError::Format);
        }
        let transform = u8::from_str_radix(hh, 16).map_err(|_| SecretError::Format)?;
        if transform > hash_id::SHA512 {
            return Err(SecretError::Transform(transform));
        }
        let raw = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|_| SecretError::Base64)?;
        let key_len = raw.len().saturating_sub(4);
        if !matches!(key_len, 32 | 48 | 64) || raw.len() != key_len + 4 {
            return Err(SecretError::Length(key_len));
        }
        let (key, crc) = raw.split_at(key_len);
        if crc32fast::hash(key).to_le_bytes() != crc {
            return Err(SecretError::Checksum);
        }
        Ok(DhchapSecret {
            transform,
            key: key.to_vec(),
        })
    }

    /// The secret's text form.
    pub fn encode(&self) -> String {
        let mut raw = self.key.clone();
        raw.extend_from_slice(&crc32fast::hash(&self.key).to_le_bytes());
        format!(
            "DHHC-1:{:02x}:{}:",
            self.transform,
            base64::engine::general_purpose::STANDARD.encode(raw)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_messages_round_trip() {
        for m in [
            HostMessage::Negotiate {
                tid: 7,
                sc_c: 0,
                protocols: vec![ProtocolDescriptor {
                    auth_id: 1,
                    hash_ids: vec![1, 2, 3],
                    dh_groups: vec![0, 1, 2, 3, 4, 5],
                }],
            },
            HostMessage::Reply {
                tid: 7,
                response: vec![9; 32],
                challenge: Some(vec![8; 32]),
                seqnum: 0x0102_0304,
                dh_value: vec![5; 256],
            },
            HostMessage::Reply {
                tid: 1,
                response: vec![9; 48],
                challenge: None,
                seqnum: 0,
                dh_value: vec![],
            },
            HostMessage::Success2 { tid: 3 },
            HostMessage::Failure2 {
                tid: 3,
                reason: 1,
                explanation: failure::FAILED,
            },
        ] {
            let mut b = Vec::new();
            m.encode(&mut b);
            assert_eq!(HostMessage::parse(&b), Ok(m));
        }
    }

    #[test]
    fn controller_messages_round_trip() {
        for m in [
            ControllerMessage::Challenge {
                tid: 2,
                hash_id: hash_id::SHA256,
                dh_group: dh_group::FFDHE2048,
                seqnum: 77,
                challenge: vec![1; 32],
                dh_value: vec![2; 256],
            },
            ControllerMessage::Success1 {
                tid: 2,
                hash_len: 32,
                response: Some(vec![3; 32]),
            },
            ControllerMessage::Success1 {
                tid: 2,
                hash_len: 32,
                response: None,
            },
            ControllerMessage::Failure1 {
                tid: 2,
                explanation: failure::HASH_UNUSABLE,
            },
        ] {
            let mut b = Vec::new();
            m.encode(&mut b);
            assert_eq!(ControllerMessage::parse(&b), Ok(m));
        }
    }

    #[test]
    fn truncated_and_lying_lengths_are_refused() {
        let mut b = Vec::new();
        HostMessage::Reply {
            tid: 1,
            response: vec![1; 32],
            challenge: None,
            seqnum: 1,
            dh_value: vec![7; 256],
        }
        .encode(&mut b);
        for cut in 0..b.len() {
            assert!(HostMessage::parse(&b[..cut]).is_err(), "cut at {cut}");
        }
        // A Negotiate announcing more descriptors than it carries.
        let lying = [0, 0, 0, 0, 1, 0, 0, 3, 1, 0, 1, 1];
        assert!(HostMessage::parse(&lying).is_err());
    }

    #[test]
    fn secrets_parse_as_nvme_cli_writes_them() {
        let s = DhchapSecret {
            transform: 1,
            key: (0..32).collect(),
        };
        let text = s.encode();
        assert!(
            text.starts_with("DHHC-1:01:") && text.ends_with(':'),
            "{text}"
        );
        assert_eq!(DhchapSecret::parse(&text), Ok(s.clone()));
        // One changed character breaks the checksum (or the base64).
        let mut bad = text.clone().into_bytes();
        bad[12] = if bad[12] == b'A' { b'B' } else { b'A' };
        assert!(DhchapSecret::parse(std::str::from_utf8(&bad).unwrap()).is_err());
        for wrong in [
            "",
            "DHHC-1:01:",
            "DHHC-2:00:AAAA:",
            "DHHC-1:09:AAAA:",
            "DHHC-1:00:!!!!:",
        ] {
            assert!(DhchapSecret::parse(wrong).is_err(), "{wrong}");
        }
        assert!(!format!("{s:?}").contains("[0, 1"), "Debug shows no key");
    }
}
