//! The wire format of Basalt's node-to-node replication transport.
//!
//! Job: turn [`Frame`]s (a connection's `Hello`, or one replication [`Msg`]
//! for a volume) into bytes and back. Pure: no sockets, no clocks; the
//! transport (`basalt-cluster`'s `peer` module) does the I/O. The layout is
//! documented in `docs/peer-protocol.md`.
//!
//! Invariants:
//! - Integers are little-endian. Every frame is a fixed 20-byte header
//!   (magic, version, kind, flags, payload length, payload CRC32C, header
//!   CRC32C) followed by the payload.
//! - [`decode`] never panics and never reads past its input. It checks the
//!   header (magic, version, header CRC, kind, flags, length ≤
//!   [`MAX_PAYLOAD`]) as soon as the header is complete, before waiting for
//!   (or allocating) the payload, so a corrupt length cannot make a reader
//!   buffer 4 GiB. It returns `Ok(None)` only when a longer input could
//!   still be a valid frame.
//! - The encoding is canonical: a frame has exactly one byte form (flags
//!   and booleans are checked, no padding), so `encode(decode(b)) == b` for
//!   every `b` that decodes.
//! - A `Msg` carrying a volume (`Repl`, `ReplAck`, `ReplDigest`,
//!   `ReplNoSpace`, `ReplStarted`, `Fenced`, `HeartbeatAck`, `RepairRead`, `RepairData`)
//!   must name the frame's volume: the volume is written once, in the
//!   frame, and decoded into both places, so a receiver can never see the
//!   two disagree.
//! - Bulk data (the bytes of writes and read replies) is the tail of its
//!   payload, so [`encode_split`] lets a writer send it straight from the
//!   message (`writev`) without copying it.
//! - Zeros never travel as bytes: `ReplOp::WriteZeroes` has its own op, and
//!   a `ClientReq::Write` whose data is all zero (a forwarded TRIM or
//!   WRITE_ZEROES) is written in a form that carries only its length and
//!   decodes to the same zero-filled write. The data form of such a write
//!   is refused, so the encoding stays canonical; a decoded zero write is
//!   no longer than a data write could be ([`MAX_PAYLOAD`]).
//! - `MetaGet`, `MetaCas` and `MetaReply` are not peer messages (they go to
//!   etcd) and do not encode.

#![forbid(unsafe_code)]

use basalt_replication::{
    payload, ClientReply, ClientReq, Epoch, LayerId, Msg, NodeId, Payload, Prior, ReplOp, VolumeId,
};

/// The first four bytes of every frame.
pub const MAGIC: [u8; 4] = *b"BSPW";
/// The format version this crate writes and reads. Version 2 added
/// `Repl` op 3 (`WriteZeroes`) and `ClientReq` req 3 (a write of zeros); a
/// version 1 peer would refuse those mid-stream, so the versions refuse each
/// other at `Hello` instead. Version 3 added `commit` and `floor` to
/// `Repl` and the `ReplStarted` kind (9), the acknowledgement of a `Start`
/// with the secondary's uncertain regions of the epoch before. Version 4
/// added the coordinator's `lease_ms` to `HeartbeatAck`. Version 5 added the
/// mutual authentication of the two ends: a `nonce` and a `proof` in
/// `Hello`, and the `Auth` kind (10) the dialer proves itself with.
/// Version 6 added read repair: the `RepairRead` (11) and `RepairData` (12)
/// kinds and the `Unreadable` client reply (2). Version 7 added the replica
/// compare: `Repl` op 4 (`Digest`), `ClientReq` req 4 (`Compare`) and the
/// `ReplDigest` kind (13), and made `RepairRead` name the stream entry the
/// replica must have applied before it reads (`session`, `after`).
/// Version 8 added snapshot layers: `Repl` ops 5 (`Snapshot`), 6
/// (`DeleteLayer`) and 7 (`Rebase`), the layers a secondary holds in
/// `ReplStarted`, `ClientReq` reqs 5 (`Snapshot`), 6 (`DeleteSnapshot`)
/// and 7 (`Rollback`), and the `NoSuchLayer` client reply (3).
/// Version 9 added the flattening of clones: `Repl` op 8 (`Flatten`) and
/// `ClientReq` req 8 (`Flatten`). Version 10 added a full store: the
/// `ReplNoSpace` kind (14) and the `NoSpace` client reply (4). Version 11
/// added the compaction of replicated volumes (`Repl` op 9 and `ClientReq`
/// req 9, `Compact`) and reads of a snapshot through the primary
/// (`ClientReq` req 10, `ReadLayer`). Version 12 added compare-and-write
/// (`ClientReq` req 11, `CompareWrite`).
pub const VERSION: u8 = 12;
/// Bytes in a frame header.
pub const HEADER_LEN: usize = 20;
/// The largest payload a decoder accepts (and an encoder produces).
pub const MAX_PAYLOAD: usize = 64 << 20;

/// Frame kinds (header byte 5).
pub mod kind {
    pub const HELLO: u8 = 1;
    pub const REPL: u8 = 2;
    pub const REPL_ACK: u8 = 3;
    pub const FENCED: u8 = 4;
    pub const HEARTBEAT: u8 = 5;
    pub const HEARTBEAT_ACK: u8 = 6;
    pub const CLIENT_REQ: u8 = 7;
    pub const CLIENT_REPLY: u8 = 8;
    pub const REPL_STARTED: u8 = 9;
    pub const AUTH: u8 = 10;
    pub const REPAIR_READ: u8 = 11;
    pub const REPAIR_DATA: u8 = 12;
    pub const REPL_DIGEST: u8 = 13;
    pub const REPL_NO_SPACE: u8 = 14;
}

/// Bytes of a Hello's nonce.
pub const NONCE_LEN: usize = 16;
/// Bytes of an authentication proof (an HMAC-SHA256).
pub const PROOF_LEN: usize = 32;

/// One unit on a peer connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// Opens a connection; both sides send one first.
    Hello {
        /// Cluster id: a node refuses peers of another cluster.
        cluster: [u8; 16],
        node: NodeId,
        /// The sender's boot id (changes at every process start).
        boot: u64,
        /// Fresh random bytes of this connection, which the other end's
        /// proof covers (so no proof can be replayed).
        nonce: [u8; NONCE_LEN],
        /// The acceptor's proof that it holds the cluster secret (over both
        /// Hellos); zeros in the dialer's Hello, which cannot prove yet.
        proof: [u8; PROOF_LEN],
    },
    /// The dialer's proof that it holds the cluster secret (over both
    /// Hellos): its second frame, before any message.
    Auth { proof: [u8; PROOF_LEN] },
    /// A replication message about volume `vol` (in the frame because
    /// `Msg::Heartbeat` carries none).
    Msg { vol: VolumeId, msg: Msg },
}

/// Why a frame cannot be encoded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EncodeError {
    #[error("{0} is not a peer message (it goes to the metadata service)")]
    NotPeerMessage(&'static str),
    #[error("message names volume {msg:#x} but the frame volume {frame:#x}")]
    VolumeMismatch { frame: u128, msg: u128 },
    #[error("payload of {len} bytes exceeds the maximum of {max}")]
    TooLarge { len: usize, max: usize },
    #[error("ReplStarted reports a prior epoch 0")]
    PriorEpochZero,
}

/// Why bytes are not a frame. Every one is fatal for the connection: after
/// it, frame boundaries cannot be trusted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("bad magic {found:02x?}")]
    BadMagic { found: Vec<u8> },
    #[error("unsupported format version {0}")]
    UnsupportedVersion(u8),
    #[error("header CRC mismatch: header says {expected:#010x}, computed {actual:#010x}")]
    HeaderCrc { expected: u32, actual: u32 },
    #[error("payload CRC mismatch: header says {expected:#010x}, computed {actual:#010x}")]
    PayloadCrc { expected: u32, actual: u32 },
    #[error("payload length {len} exceeds the maximum of {max}")]
    TooLarge { len: u32, max: usize },
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    #[error("unknown flags {0:#06x}")]
    UnknownFlags(u16),
    #[error("{kind} payload truncated: {field} needs {need} bytes, {have} left")]
    Truncated {
        kind: &'static str,
        field: &'static str,
        need: usize,
        have: usize,
    },
    #[error("{kind} payload has {extra} trailing bytes")]
    TrailingBytes { kind: &'static str, extra: usize },
    #[error("{kind}: invalid value {value} for {field}")]
    InvalidValue {
        kind: &'static str,
        field: &'static str,
        value: u8,
    },
    /// A value with a shorter form: write data that is all zero (it has
    /// its own form), or a write of zeros of length 0.
    #[error("{kind}: {field} is not in its canonical form")]
    NotCanonical {
        kind: &'static str,
        field: &'static str,
    },
    #[error("{kind}: {field} of {len} bytes exceeds the maximum of {max}")]
    ZeroWriteTooLarge {
        kind: &'static str,
        field: &'static str,
        len: u32,
        max: usize,
    },
}

/// Whether `data` is written in the zeros form (see the module docs).
fn zero_form(data: &[u8]) -> bool {
    !data.is_empty()
        && data
            .chunks(4096)
            .all(|c| c.iter().fold(0u8, |a, b| a | b) == 0)
}

/// Payload bytes of a `ClientReq` write in data form, before its data.
const CLIENT_WRITE_FIELDS: usize = 16 + 8 + 1 + 8 + 1 + 4;

// ---------------------------------------------------------------- encoding

/// Appends `frame` to `out`. On error `out` is left as it was.
pub fn encode(frame: &Frame, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    let data = encode_split(frame, out)?;
    out.extend_from_slice(data);
    Ok(())
}

/// Appends the header and the payload of `frame` up to its bulk data to
/// `out`, and returns the bulk data (possibly empty): the frame on the wire
/// is what was appended followed by the returned bytes. Lets a writer send
/// write data from the message itself. On error `out` is left as it was.
pub fn encode_split<'f>(frame: &'f Frame, out: &mut Vec<u8>) -> Result<&'f [u8], EncodeError> {
    let (kind, data) = check(frame)?;
    let start = out.len();
    out.extend_from_slice(&[0; HEADER_LEN]);
    write_fields(frame, data, out);
    let fields = &out[start + HEADER_LEN..];
    let payload_len = fields.len() + data.len();
    let payload_crc = crc32c::crc32c_append(crc32c::crc32c(fields), data);
    let header = header_bytes(kind, payload_len as u32, payload_crc);
    out[start..start + HEADER_LEN].copy_from_slice(&header);
    Ok(data)
}

/// The number of bytes `encode` would append for `frame`.
pub fn encoded_len(frame: &Frame) -> Result<usize, EncodeError> {
    let (_, data) = check(frame)?;
    Ok(HEADER_LEN + fields_len(frame) + data.len())
}

fn header_bytes(kind: u8, payload_len: u32, payload_crc: u32) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[0..4].copy_from_slice(&MAGIC);
    h[4] = VERSION;
    h[5] = kind;
    // h[6..8]: flags, none defined.
    h[8..12].copy_from_slice(&payload_len.to_le_bytes());
    h[12..16].copy_from_slice(&payload_crc.to_le_bytes());
    let crc = crc32c::crc32c(&h[0..16]);
    h[16..20].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Validates `frame` and returns its kind and bulk data.
fn check(frame: &Frame) -> Result<(u8, &[u8]), EncodeError> {
    let (vol, msg) = match frame {
        Frame::Hello { .. } => return Ok((kind::HELLO, &[])),
        Frame::Auth { .. } => return Ok((kind::AUTH, &[])),
        Frame::Msg { vol, msg } => (*vol, msg),
    };
    let same = |inner: &VolumeId| {
        if *inner == vol {
            Ok(())
        } else {
            Err(EncodeError::VolumeMismatch {
                frame: vol.0,
                msg: inner.0,
            })
        }
    };
    let (kind, data): (u8, &[u8]) = match msg {
        Msg::Repl { vol: v, op, .. } => {
            same(v)?;
            let data = match op {
                ReplOp::Write { data, .. } => &data[..],
                ReplOp::Start
                | ReplOp::Flush
                | ReplOp::WriteZeroes { .. }
                | ReplOp::Digest { .. }
                | ReplOp::Snapshot { .. }
                | ReplOp::DeleteLayer { .. }
                | ReplOp::Rebase { .. }
                | ReplOp::Flatten { .. }
                | ReplOp::Compact { .. } => &[],
            };
            (kind::REPL, data)
        }
        Msg::ReplAck { vol: v, .. } => {
            same(v)?;
            (kind::REPL_ACK, &[])
        }
        Msg::ReplDigest { vol: v, .. } => {
            same(v)?;
            (kind::REPL_DIGEST, &[])
        }
        Msg::ReplNoSpace { vol: v, .. } => {
            same(v)?;
            (kind::REPL_NO_SPACE, &[])
        }
        Msg::ReplStarted { vol: v, prior, .. } => {
            same(v)?;
            // Epoch 0 is the wire's "no prior": it must not be sent as one.
            if prior.as_ref().is_some_and(|p| p.epoch.0 == 0) {
                return Err(EncodeError::PriorEpochZero);
            }
            (kind::REPL_STARTED, &[])
        }
        Msg::Fenced { vol: v, .. } => {
            same(v)?;
            (kind::FENCED, &[])
        }
        Msg::RepairRead { vol: v, .. } => {
            same(v)?;
            (kind::REPAIR_READ, &[])
        }
        Msg::RepairData { vol: v, data, .. } => {
            same(v)?;
            (kind::REPAIR_DATA, data.as_deref().unwrap_or(&[]))
        }
        Msg::Heartbeat { .. } => (kind::HEARTBEAT, &[]),
        Msg::HeartbeatAck { vol: v, .. } => {
            same(v)?;
            (kind::HEARTBEAT_ACK, &[])
        }
        Msg::ClientReq { req, .. } => match req {
            ClientReq::Write { data, .. } => {
                // Bounded as the data form would be, zeros or not: whether a
                // write encodes does not depend on its contents.
                if CLIENT_WRITE_FIELDS + data.len() > MAX_PAYLOAD {
                    return Err(EncodeError::TooLarge {
                        len: CLIENT_WRITE_FIELDS + data.len(),
                        max: MAX_PAYLOAD,
                    });
                }
                if zero_form(data) {
                    (kind::CLIENT_REQ, &[])
                } else {
                    (kind::CLIENT_REQ, &data[..])
                }
            }
            ClientReq::Flush
            | ClientReq::Read { .. }
            | ClientReq::Compare { .. }
            | ClientReq::Snapshot { .. }
            | ClientReq::DeleteSnapshot { .. }
            | ClientReq::Rollback { .. }
            | ClientReq::Flatten { .. }
            | ClientReq::Compact { .. }
            | ClientReq::ReadLayer { .. } => (kind::CLIENT_REQ, &[]),
            ClientReq::CompareWrite { both, .. } => (kind::CLIENT_REQ, &both[..]),
        },
        Msg::ClientReply { reply, .. } => match reply {
            ClientReply::Ok {
                data: Some(data), ..
            } => (kind::CLIENT_REPLY, data.as_slice()),
            _ => (kind::CLIENT_REPLY, &[]),
        },
        Msg::MetaGet { .. } => return Err(EncodeError::NotPeerMessage("MetaGet")),
        Msg::MetaCas { .. } => return Err(EncodeError::NotPeerMessage("MetaCas")),
        Msg::MetaReply { .. } => return Err(EncodeError::NotPeerMessage("MetaReply")),
    };
    let len = fields_len(frame) + data.len();
    if len > MAX_PAYLOAD {
        return Err(EncodeError::TooLarge {
            len,
            max: MAX_PAYLOAD,
        });
    }
    Ok((kind, data))
}

/// Payload bytes before the bulk data (for a frame `check` accepted).
fn fields_len(frame: &Frame) -> usize {
    const VOL: usize = 16;
    const LAYER: usize = 16;
    let msg = match frame {
        Frame::Hello { .. } => return 16 + 4 + 8 + NONCE_LEN + PROOF_LEN,
        Frame::Auth { .. } => return PROOF_LEN,
        Frame::Msg { msg, .. } => msg,
    };
    VOL + match msg {
        Msg::Repl { op, .. } => {
            48 + 1
                + match op {
                    ReplOp::Write { .. } => 8 + 1 + 4,
                    ReplOp::WriteZeroes { .. } => 8 + 1 + 8,
                    ReplOp::Digest { .. } => 16,
                    ReplOp::Snapshot { .. } | ReplOp::DeleteLayer { .. } => LAYER,
                    ReplOp::Rebase { onto } => 1 + if onto.is_some() { LAYER } else { 0 },
                    ReplOp::Flatten { .. } | ReplOp::Compact { .. } => 24,
                    ReplOp::Start | ReplOp::Flush => 0,
                }
        }
        Msg::ReplAck { .. } | Msg::ReplNoSpace { .. } => 24,
        Msg::ReplDigest { digest, .. } => 24 + 1 + if digest.is_some() { 4 } else { 0 },
        Msg::ReplStarted { prior, layers, .. } => {
            16 + 8
                + 8
                + 4
                + 4 * prior.as_ref().map_or(0, |p| p.regions.len())
                + 4
                + LAYER * layers.len()
        }
        Msg::Fenced { .. } => 8,
        Msg::RepairRead { .. } => 48,
        Msg::RepairData { data, .. } => 8 + 8 + 1 + if data.is_some() { 4 } else { 0 },
        Msg::Heartbeat { .. } => 16,
        Msg::HeartbeatAck { .. } => 28,
        Msg::ClientReq { req, .. } => {
            8 + 1
                + match req {
                    // Data form or zeros form: the same fields.
                    ClientReq::Write { .. } => 8 + 1 + 4,
                    ClientReq::Flush => 0,
                    ClientReq::Read { .. } | ClientReq::Compare { .. } => 16,
                    ClientReq::Snapshot { .. }
                    | ClientReq::DeleteSnapshot { .. }
                    | ClientReq::Rollback { .. } => LAYER,
                    ClientReq::Flatten { .. } | ClientReq::Compact { .. } => 24,
                    ClientReq::ReadLayer { .. } => LAYER + 16,
                    ClientReq::CompareWrite { .. } => 8 + 1 + 1 + 4,
                }
        }
        Msg::ClientReply { reply, .. } => {
            8 + 1
                + match reply {
                    ClientReply::Ok { data: Some(_), .. } => 4 + 8 + 1 + 4,
                    ClientReply::Ok { data: None, .. } => 4 + 8 + 1,
                    ClientReply::NotPrimary => 0,
                    ClientReply::Unreadable { .. }
                    | ClientReply::NoSuchLayer { .. }
                    | ClientReply::NoSpace { .. } => 4 + 8,
                }
        }
        Msg::MetaGet { .. } | Msg::MetaCas { .. } | Msg::MetaReply { .. } => 0,
    }
}

/// Appends the payload fields (everything but the bulk data `data`).
fn write_fields(frame: &Frame, data: &[u8], out: &mut Vec<u8>) {
    let u64le = |out: &mut Vec<u8>, v: u64| out.extend_from_slice(&v.to_le_bytes());
    let u32le = |out: &mut Vec<u8>, v: u32| out.extend_from_slice(&v.to_le_bytes());
    let layer = |out: &mut Vec<u8>, l: &LayerId| out.extend_from_slice(&l.0.to_le_bytes());
    // A flatten's or a compaction's op byte and its range.
    let range_op = |out: &mut Vec<u8>, op: u8, lba: u64, blocks: u64, rate: u64| {
        out.push(op);
        for v in [lba, blocks, rate] {
            out.extend_from_slice(&v.to_le_bytes());
        }
    };
    // `check` bounded the payload by MAX_PAYLOAD, so the data length fits.
    let data_len = data.len() as u32;
    let (vol, msg) = match frame {
        Frame::Hello {
            cluster,
            node,
            boot,
            nonce,
            proof,
        } => {
            out.extend_from_slice(cluster);
            u32le(out, node.0);
            u64le(out, *boot);
            out.extend_from_slice(nonce);
            out.extend_from_slice(proof);
            return;
        }
        Frame::Auth { proof } => {
            out.extend_from_slice(proof);
            return;
        }
        Frame::Msg { vol, msg } => (vol, msg),
    };
    out.extend_from_slice(&vol.0.to_le_bytes());
    match msg {
        Msg::Repl {
            epoch,
            session,
            lseq,
            vseq,
            commit,
            floor,
            op,
            ..
        } => {
            u64le(out, epoch.0);
            u64le(out, *session);
            u64le(out, *lseq);
            u64le(out, *vseq);
            u64le(out, *commit);
            u64le(out, *floor);
            match op {
                ReplOp::Start => out.push(0),
                ReplOp::Write { lba, fua, .. } => {
                    out.push(1);
                    u64le(out, *lba);
                    out.push(u8::from(*fua));
                    u32le(out, data_len);
                }
                ReplOp::Flush => out.push(2),
                ReplOp::WriteZeroes { lba, blocks, fua } => {
                    out.push(3);
                    u64le(out, *lba);
                    out.push(u8::from(*fua));
                    u64le(out, *blocks);
                }
                ReplOp::Digest { lba, blocks } => {
                    out.push(4);
                    u64le(out, *lba);
                    u64le(out, *blocks);
                }
                ReplOp::Snapshot { layer: l } => {
                    out.push(5);
                    layer(out, l);
                }
                ReplOp::DeleteLayer { layer: l } => {
                    out.push(6);
                    layer(out, l);
                }
                ReplOp::Rebase { onto } => {
                    out.push(7);
                    match onto {
                        Some(l) => {
                            out.push(1);
                            layer(out, l);
                        }
                        None => out.push(0),
                    }
                }
                ReplOp::Flatten { lba, blocks, rate } => range_op(out, 8, *lba, *blocks, *rate),
                ReplOp::Compact { lba, blocks, rate } => range_op(out, 9, *lba, *blocks, *rate),
            }
        }
        Msg::ReplDigest {
            epoch,
            session,
            lseq,
            digest,
            ..
        } => {
            u64le(out, epoch.0);
            u64le(out, *session);
            u64le(out, *lseq);
            match digest {
                Some(d) => {
                    out.push(1);
                    u32le(out, *d);
                }
                None => out.push(0),
            }
        }
        Msg::ReplAck {
            epoch,
            session,
            lseq,
            ..
        }
        | Msg::ReplNoSpace {
            epoch,
            session,
            lseq,
            ..
        } => {
            u64le(out, epoch.0);
            u64le(out, *session);
            u64le(out, *lseq);
        }
        Msg::ReplStarted {
            epoch,
            session,
            prior,
            layers,
            ..
        } => {
            u64le(out, epoch.0);
            u64le(out, *session);
            match prior {
                Some(p) => {
                    u64le(out, p.epoch.0);
                    u64le(out, p.synced);
                    u32le(out, p.regions.len() as u32);
                    for r in &p.regions {
                        u32le(out, *r);
                    }
                }
                None => {
                    u64le(out, 0);
                    u64le(out, 0);
                    u32le(out, 0);
                }
            }
            // `check` bounded the payload by MAX_PAYLOAD, so the count fits.
            u32le(out, layers.len() as u32);
            for l in layers {
                layer(out, l);
            }
        }
        Msg::Fenced { epoch, .. } => u64le(out, epoch.0),
        Msg::RepairRead {
            epoch,
            id,
            lba,
            blocks,
            session,
            after,
            ..
        } => {
            u64le(out, epoch.0);
            u64le(out, *id);
            u64le(out, *lba);
            u64le(out, *blocks);
            u64le(out, *session);
            u64le(out, *after);
        }
        Msg::RepairData {
            epoch, id, data, ..
        } => {
            u64le(out, epoch.0);
            u64le(out, *id);
            match data {
                Some(_) => {
                    out.push(1);
                    u32le(out, data_len);
                }
                None => out.push(0),
            }
        }
        Msg::Heartbeat { boot, sent_at } => {
            u64le(out, *boot);
            u64le(out, *sent_at);
        }
        Msg::HeartbeatAck {
            sent_at,
            epoch,
            primary,
            lease_ms,
            ..
        } => {
            u64le(out, *sent_at);
            u64le(out, epoch.0);
            u32le(out, primary.0);
            u64le(out, *lease_ms);
        }
        Msg::ClientReq { id, req } => {
            u64le(out, *id);
            match req {
                ClientReq::Write { lba, fua, data } => {
                    // `check` bounded the data by MAX_PAYLOAD.
                    let zeros = zero_form(data);
                    out.push(if zeros { 3 } else { 0 });
                    u64le(out, *lba);
                    out.push(u8::from(*fua));
                    u32le(out, data.len() as u32);
                }
                ClientReq::Flush => out.push(1),
                ClientReq::Read { lba, blocks } => {
                    out.push(2);
                    u64le(out, *lba);
                    u64le(out, *blocks);
                }
                ClientReq::Compare { lba, blocks } => {
                    out.push(4);
                    u64le(out, *lba);
                    u64le(out, *blocks);
                }
                ClientReq::Snapshot { layer: l } => {
                    out.push(5);
                    layer(out, l);
                }
                ClientReq::DeleteSnapshot { layer: l } => {
                    out.push(6);
                    layer(out, l);
                }
                ClientReq::Rollback { layer: l } => {
                    out.push(7);
                    layer(out, l);
                }
                ClientReq::Flatten { lba, blocks, rate } => range_op(out, 8, *lba, *blocks, *rate),
                ClientReq::Compact { lba, blocks, rate } => range_op(out, 9, *lba, *blocks, *rate),
                ClientReq::ReadLayer {
                    layer: l,
                    lba,
                    blocks,
                } => {
                    out.push(10);
                    layer(out, l);
                    u64le(out, *lba);
                    u64le(out, *blocks);
                }
                ClientReq::CompareWrite {
                    lba,
                    both,
                    whole,
                    fua,
                } => {
                    out.push(11);
                    u64le(out, *lba);
                    out.push(u8::from(*fua));
                    out.push(u8::from(*whole));
                    u32le(out, both.len() as u32);
                }
            }
        }
        Msg::ClientReply { id, reply } => {
            u64le(out, *id);
            match reply {
                ClientReply::Ok { by, epoch, data } => {
                    out.push(0);
                    u32le(out, by.0);
                    u64le(out, epoch.0);
                    match data {
                        Some(_) => {
                            out.push(1);
                            u32le(out, data_len);
                        }
                        None => out.push(0),
                    }
                }
                ClientReply::NotPrimary => out.push(1),
                ClientReply::Unreadable { by, epoch } => {
                    out.push(2);
                    u32le(out, by.0);
                    u64le(out, epoch.0);
                }
                ClientReply::NoSuchLayer { by, epoch } => {
                    out.push(3);
                    u32le(out, by.0);
                    u64le(out, epoch.0);
                }
                ClientReply::NoSpace { by, epoch } => {
                    out.push(4);
                    u32le(out, by.0);
                    u64le(out, epoch.0);
                }
            }
        }
        // Refused by `check`.
        Msg::MetaGet { .. } | Msg::MetaCas { .. } | Msg::MetaReply { .. } => {}
    }
}

// ---------------------------------------------------------------- decoding

/// A checked frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub kind: u8,
    pub payload_len: u32,
    pub payload_crc: u32,
}

impl Header {
    /// Bytes of the whole frame (header and payload).
    pub fn frame_len(&self) -> usize {
        HEADER_LEN + self.payload_len as usize
    }
}

/// Checks the header at the start of `buf`: `Ok(None)` if fewer than
/// [`HEADER_LEN`] bytes are there (and what is there could start a frame).
/// Lets a reader size its buffer for the whole frame.
pub fn decode_header(buf: &[u8]) -> Result<Option<Header>, DecodeError> {
    let prefix = buf.len().min(MAGIC.len());
    if buf[..prefix] != MAGIC[..prefix] {
        return Err(DecodeError::BadMagic {
            found: buf[..prefix].to_vec(),
        });
    }
    let Some(h) = buf.get(..HEADER_LEN) else {
        return Ok(None);
    };
    // Version first: a future version may lay the header out differently.
    if h[4] != VERSION {
        return Err(DecodeError::UnsupportedVersion(h[4]));
    }
    let expected = le_u32(&h[16..20]);
    let actual = crc32c::crc32c(&h[0..16]);
    if expected != actual {
        return Err(DecodeError::HeaderCrc { expected, actual });
    }
    let kind = h[5];
    if !(kind::HELLO..=kind::REPL_NO_SPACE).contains(&kind) {
        return Err(DecodeError::UnknownKind(kind));
    }
    let flags = u16::from_le_bytes([h[6], h[7]]);
    if flags != 0 {
        return Err(DecodeError::UnknownFlags(flags));
    }
    let payload_len = le_u32(&h[8..12]);
    if payload_len as usize > MAX_PAYLOAD {
        return Err(DecodeError::TooLarge {
            len: payload_len,
            max: MAX_PAYLOAD,
        });
    }
    Ok(Some(Header {
        kind,
        payload_len,
        payload_crc: le_u32(&h[12..16]),
    }))
}

/// Decodes the frame at the start of `buf`: `Ok(None)` if more bytes are
/// needed, else the frame and the bytes it used (never more than `buf`).
pub fn decode(buf: &[u8]) -> Result<Option<(Frame, usize)>, DecodeError> {
    decode_from(buf, None)
}

/// [`decode`] of a frame received into a buffer of its own: the data of a
/// write is a slice of `buf`, shared, not a copy. (A transport that
/// receives a large frame into a buffer whose end is 4 KiB-aligned gets the
/// write's data aligned, as it is whole blocks at the frame's tail.)
pub fn decode_shared(buf: &Payload) -> Result<Option<(Frame, usize)>, DecodeError> {
    decode_from(buf, Some(buf))
}

fn decode_from(
    buf: &[u8],
    shared: Option<&Payload>,
) -> Result<Option<(Frame, usize)>, DecodeError> {
    let Some(header) = decode_header(buf)? else {
        return Ok(None);
    };
    let Some(payload) = buf.get(HEADER_LEN..header.frame_len()) else {
        return Ok(None);
    };
    let actual = crc32c::crc32c(payload);
    if actual != header.payload_crc {
        return Err(DecodeError::PayloadCrc {
            expected: header.payload_crc,
            actual,
        });
    }
    let frame = decode_payload(header.kind, payload, shared)?;
    Ok(Some((frame, header.frame_len())))
}

fn le_u32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    u32::from_le_bytes(a)
}

/// A cursor over one payload whose errors name the frame kind and field.
struct Reader<'a> {
    kind: &'static str,
    rest: &'a [u8],
    /// The buffer `rest` lies in, when write data may be shared with it.
    shared: Option<&'a Payload>,
}

impl<'a> Reader<'a> {
    fn take(&mut self, field: &'static str, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.rest.len() < n {
            return Err(DecodeError::Truncated {
                kind: self.kind,
                field,
                need: n,
                have: self.rest.len(),
            });
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], DecodeError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(field, N)?);
        Ok(a)
    }

    fn u8(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(field)?[0])
    }

    fn u32(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }

    fn u64(&mut self, field: &'static str) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }

    fn layer(&mut self, field: &'static str) -> Result<LayerId, DecodeError> {
        Ok(LayerId(u128::from_le_bytes(self.array(field)?)))
    }

    /// A `u32` count of `size`-byte items, checked against the bytes left
    /// before anything is allocated for them.
    fn count(&mut self, field: &'static str, size: usize) -> Result<usize, DecodeError> {
        let count = self.u32(field)? as usize;
        let need = count.saturating_mul(size);
        if self.rest.len() < need {
            return Err(DecodeError::Truncated {
                kind: self.kind,
                field,
                need,
                have: self.rest.len(),
            });
        }
        Ok(count)
    }

    fn bool(&mut self, field: &'static str) -> Result<bool, DecodeError> {
        match self.u8(field)? {
            0 => Ok(false),
            1 => Ok(true),
            value => Err(self.invalid(field, value)),
        }
    }

    /// A `u32` length, then that many bytes.
    fn data(&mut self, field: &'static str) -> Result<Vec<u8>, DecodeError> {
        let len = self.u32(field)? as usize;
        Ok(self.take(field, len)?.to_vec())
    }

    /// A write's data: a slice of the frame's own buffer if it has one,
    /// else copied once into a 4 KiB-aligned payload (which the store
    /// writes with O_DIRECT as it is, and the primary shares with every
    /// replica link).
    fn payload(&mut self, field: &'static str) -> Result<Payload, DecodeError> {
        let len = self.u32(field)? as usize;
        let data = self.take(field, len)?;
        Ok(match self.shared {
            Some(buf) => buf.slice_ref(data),
            None => payload::aligned(data),
        })
    }

    fn invalid(&self, field: &'static str, value: u8) -> DecodeError {
        DecodeError::InvalidValue {
            kind: self.kind,
            field,
            value,
        }
    }

    fn not_canonical(&self, field: &'static str) -> DecodeError {
        DecodeError::NotCanonical {
            kind: self.kind,
            field,
        }
    }

    fn finish(self) -> Result<(), DecodeError> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::TrailingBytes {
                kind: self.kind,
                extra: self.rest.len(),
            })
        }
    }
}

fn kind_name(kind: u8) -> &'static str {
    match kind {
        kind::HELLO => "Hello",
        kind::REPL => "Repl",
        kind::REPL_ACK => "ReplAck",
        kind::FENCED => "Fenced",
        kind::HEARTBEAT => "Heartbeat",
        kind::HEARTBEAT_ACK => "HeartbeatAck",
        kind::CLIENT_REQ => "ClientReq",
        kind::CLIENT_REPLY => "ClientReply",
        kind::REPL_STARTED => "ReplStarted",
        kind::AUTH => "Auth",
        kind::REPAIR_READ => "RepairRead",
        kind::REPAIR_DATA => "RepairData",
        kind::REPL_DIGEST => "ReplDigest",
        kind::REPL_NO_SPACE => "ReplNoSpace",
        _ => "unknown",
    }
}

fn decode_payload(
    kind: u8,
    payload: &[u8],
    shared: Option<&Payload>,
) -> Result<Frame, DecodeError> {
    let mut r = Reader {
        kind: kind_name(kind),
        rest: payload,
        shared,
    };
    if kind == kind::HELLO {
        let frame = Frame::Hello {
            cluster: r.array("cluster")?,
            node: NodeId(r.u32("node")?),
            boot: r.u64("boot")?,
            nonce: r.array("nonce")?,
            proof: r.array("proof")?,
        };
        r.finish()?;
        return Ok(frame);
    }
    if kind == kind::AUTH {
        let frame = Frame::Auth {
            proof: r.array("proof")?,
        };
        r.finish()?;
        return Ok(frame);
    }
    let vol = VolumeId(u128::from_le_bytes(r.array("vol")?));
    let msg = match kind {
        kind::REPL => {
            let epoch = Epoch(r.u64("epoch")?);
            let session = r.u64("session")?;
            let lseq = r.u64("lseq")?;
            let vseq = r.u64("vseq")?;
            let commit = r.u64("commit")?;
            let floor = r.u64("floor")?;
            let op = match r.u8("op")? {
                0 => ReplOp::Start,
                1 => ReplOp::Write {
                    lba: r.u64("lba")?,
                    fua: r.bool("fua")?,
                    data: r.payload("data")?,
                },
                2 => ReplOp::Flush,
                3 => ReplOp::WriteZeroes {
                    lba: r.u64("lba")?,
                    fua: r.bool("fua")?,
                    blocks: r.u64("blocks")?,
                },
                4 => ReplOp::Digest {
                    lba: r.u64("lba")?,
                    blocks: r.u64("blocks")?,
                },
                5 => ReplOp::Snapshot {
                    layer: r.layer("layer")?,
                },
                6 => ReplOp::DeleteLayer {
                    layer: r.layer("layer")?,
                },
                7 => ReplOp::Rebase {
                    onto: if r.bool("has_onto")? {
                        Some(r.layer("onto")?)
                    } else {
                        None
                    },
                },
                8 => ReplOp::Flatten {
                    lba: r.u64("lba")?,
                    blocks: r.u64("blocks")?,
                    rate: r.u64("rate")?,
                },
                9 => ReplOp::Compact {
                    lba: r.u64("lba")?,
                    blocks: r.u64("blocks")?,
                    rate: r.u64("rate")?,
                },
                other => return Err(r.invalid("op", other)),
            };
            Msg::Repl {
                vol,
                epoch,
                session,
                lseq,
                vseq,
                commit,
                floor,
                op,
            }
        }
        kind::REPL_ACK => Msg::ReplAck {
            vol,
            epoch: Epoch(r.u64("epoch")?),
            session: r.u64("session")?,
            lseq: r.u64("lseq")?,
        },
        kind::REPL_NO_SPACE => Msg::ReplNoSpace {
            vol,
            epoch: Epoch(r.u64("epoch")?),
            session: r.u64("session")?,
            lseq: r.u64("lseq")?,
        },
        kind::REPL_DIGEST => {
            let epoch = Epoch(r.u64("epoch")?);
            let session = r.u64("session")?;
            let lseq = r.u64("lseq")?;
            let digest = if r.bool("has_digest")? {
                Some(r.u32("digest")?)
            } else {
                None
            };
            Msg::ReplDigest {
                vol,
                epoch,
                session,
                lseq,
                digest,
            }
        }
        kind::REPL_STARTED => {
            let epoch = Epoch(r.u64("epoch")?);
            let session = r.u64("session")?;
            let prior_epoch = r.u64("prior_epoch")?;
            let synced = r.u64("synced")?;
            // Counts are bounded by the payload before anything is allocated.
            let count = r.count("regions", 4)?;
            let mut regions = Vec::with_capacity(count);
            for _ in 0..count {
                regions.push(r.u32("region")?);
            }
            let prior = if prior_epoch == 0 {
                if synced != 0 || count != 0 {
                    return Err(r.not_canonical("prior_epoch"));
                }
                None
            } else {
                Some(Prior {
                    epoch: Epoch(prior_epoch),
                    synced,
                    regions,
                })
            };
            let layer_count = r.count("layers", 16)?;
            let mut layers = Vec::with_capacity(layer_count);
            for _ in 0..layer_count {
                layers.push(r.layer("layer")?);
            }
            Msg::ReplStarted {
                vol,
                epoch,
                session,
                prior,
                layers,
            }
        }
        kind::FENCED => Msg::Fenced {
            vol,
            epoch: Epoch(r.u64("epoch")?),
        },
        kind::REPAIR_READ => Msg::RepairRead {
            vol,
            epoch: Epoch(r.u64("epoch")?),
            id: r.u64("id")?,
            lba: r.u64("lba")?,
            blocks: r.u64("blocks")?,
            session: r.u64("session")?,
            after: r.u64("after")?,
        },
        kind::REPAIR_DATA => {
            let epoch = Epoch(r.u64("epoch")?);
            let id = r.u64("id")?;
            let data = if r.bool("has_data")? {
                Some(r.data("data")?)
            } else {
                None
            };
            Msg::RepairData {
                vol,
                epoch,
                id,
                data,
            }
        }
        kind::HEARTBEAT => Msg::Heartbeat {
            boot: r.u64("boot")?,
            sent_at: r.u64("sent_at")?,
        },
        kind::HEARTBEAT_ACK => Msg::HeartbeatAck {
            sent_at: r.u64("sent_at")?,
            epoch: Epoch(r.u64("epoch")?),
            primary: NodeId(r.u32("primary")?),
            lease_ms: r.u64("lease_ms")?,
            vol,
        },
        kind::CLIENT_REQ => {
            let id = r.u64("id")?;
            let req = match r.u8("req")? {
                0 => {
                    let lba = r.u64("lba")?;
                    let fua = r.bool("fua")?;
                    let data = r.payload("data")?;
                    if zero_form(&data) {
                        return Err(r.not_canonical("data"));
                    }
                    ClientReq::Write { lba, data, fua }
                }
                1 => ClientReq::Flush,
                2 => ClientReq::Read {
                    lba: r.u64("lba")?,
                    blocks: r.u64("blocks")?,
                },
                4 => ClientReq::Compare {
                    lba: r.u64("lba")?,
                    blocks: r.u64("blocks")?,
                },
                5 => ClientReq::Snapshot {
                    layer: r.layer("layer")?,
                },
                6 => ClientReq::DeleteSnapshot {
                    layer: r.layer("layer")?,
                },
                7 => ClientReq::Rollback {
                    layer: r.layer("layer")?,
                },
                8 => ClientReq::Flatten {
                    lba: r.u64("lba")?,
                    blocks: r.u64("blocks")?,
                    rate: r.u64("rate")?,
                },
                9 => ClientReq::Compact {
                    lba: r.u64("lba")?,
                    blocks: r.u64("blocks")?,
                    rate: r.u64("rate")?,
                },
                10 => ClientReq::ReadLayer {
                    layer: r.layer("layer")?,
                    lba: r.u64("lba")?,
                    blocks: r.u64("blocks")?,
                },
                11 => {
                    let lba = r.u64("lba")?;
                    let fua = r.bool("fua")?;
                    let whole = r.bool("whole")?;
                    let both = r.payload("both")?;
                    ClientReq::CompareWrite {
                        lba,
                        both,
                        whole,
                        fua,
                    }
                }
                3 => {
                    let lba = r.u64("lba")?;
                    let fua = r.bool("fua")?;
                    let len = r.u32("zeros")?;
                    if len == 0 {
                        return Err(r.not_canonical("zeros"));
                    }
                    // No larger than a data write could be: the length is
                    // allocated here, so it is bounded like a payload.
                    if CLIENT_WRITE_FIELDS + len as usize > MAX_PAYLOAD {
                        return Err(DecodeError::ZeroWriteTooLarge {
                            kind: r.kind,
                            field: "zeros",
                            len,
                            max: MAX_PAYLOAD - CLIENT_WRITE_FIELDS,
                        });
                    }
                    ClientReq::Write {
                        lba,
                        data: vec![0; len as usize].into(),
                        fua,
                    }
                }
                other => return Err(r.invalid("req", other)),
            };
            Msg::ClientReq { id, req }
        }
        kind::CLIENT_REPLY => {
            let id = r.u64("id")?;
            let reply = match r.u8("reply")? {
                0 => {
                    let by = NodeId(r.u32("by")?);
                    let epoch = Epoch(r.u64("epoch")?);
                    let data = if r.bool("has_data")? {
                        Some(r.data("data")?)
                    } else {
                        None
                    };
                    ClientReply::Ok { by, epoch, data }
                }
                1 => ClientReply::NotPrimary,
                2 => ClientReply::Unreadable {
                    by: NodeId(r.u32("by")?),
                    epoch: Epoch(r.u64("epoch")?),
                },
                3 => ClientReply::NoSuchLayer {
                    by: NodeId(r.u32("by")?),
                    epoch: Epoch(r.u64("epoch")?),
                },
                4 => ClientReply::NoSpace {
                    by: NodeId(r.u32("by")?),
                    epoch: Epoch(r.u64("epoch")?),
                },
                other => return Err(r.invalid("reply", other)),
            };
            Msg::ClientReply { id, reply }
        }
        // decode_header admits only known kinds.
        other => return Err(DecodeError::UnknownKind(other)),
    };
    r.finish()?;
    Ok(Frame::Msg { vol, msg })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meta_messages_do_not_encode() {
        let frame = Frame::Msg {
            vol: VolumeId(1),
            msg: Msg::MetaGet { vol: VolumeId(1) },
        };
        let mut out = vec![7];
        assert_eq!(
            encode(&frame, &mut out),
            Err(EncodeError::NotPeerMessage("MetaGet"))
        );
        assert_eq!(out, [7]);
    }

    #[test]
    fn volume_mismatch_is_refused() {
        let frame = Frame::Msg {
            vol: VolumeId(1),
            msg: Msg::Fenced {
                vol: VolumeId(2),
                epoch: Epoch(3),
            },
        };
        assert_eq!(
            encoded_len(&frame),
            Err(EncodeError::VolumeMismatch { frame: 1, msg: 2 })
        );
    }

    #[test]
    fn layer_fields_have_the_length_computed_for_them() {
        let l = LayerId(0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10);
        let repl = |op| Msg::Repl {
            vol: VolumeId(1),
            epoch: Epoch(2),
            session: 3,
            lseq: 4,
            vseq: 5,
            commit: 6,
            floor: 7,
            op,
        };
        let client = |req| Msg::ClientReq { id: 9, req };
        let msgs = [
            (repl(ReplOp::Snapshot { layer: l }), 65 + 16),
            (repl(ReplOp::DeleteLayer { layer: l }), 65 + 16),
            (repl(ReplOp::Rebase { onto: Some(l) }), 65 + 1 + 16),
            (repl(ReplOp::Rebase { onto: None }), 65 + 1),
            (client(ClientReq::Snapshot { layer: l }), 25 + 16),
            (client(ClientReq::DeleteSnapshot { layer: l }), 25 + 16),
            (client(ClientReq::Rollback { layer: l }), 25 + 16),
            (
                repl(ReplOp::Flatten {
                    lba: 1,
                    blocks: 2,
                    rate: 3,
                }),
                65 + 24,
            ),
            (
                client(ClientReq::Flatten {
                    lba: 1,
                    blocks: 2,
                    rate: 3,
                }),
                25 + 24,
            ),
            (
                repl(ReplOp::Compact {
                    lba: 1,
                    blocks: 2,
                    rate: 3,
                }),
                65 + 24,
            ),
            (
                client(ClientReq::Compact {
                    lba: 1,
                    blocks: 2,
                    rate: 3,
                }),
                25 + 24,
            ),
            (
                client(ClientReq::ReadLayer {
                    layer: l,
                    lba: 1,
                    blocks: 2,
                }),
                25 + 32,
            ),
            (
                client(ClientReq::CompareWrite {
                    lba: 1,
                    both: Vec::new().into(),
                    whole: true,
                    fua: false,
                }),
                25 + 8 + 1 + 1 + 4,
            ),
            (
                Msg::ClientReply {
                    id: 9,
                    reply: ClientReply::NoSuchLayer {
                        by: NodeId(1),
                        epoch: Epoch(2),
                    },
                },
                25 + 4 + 8,
            ),
            (
                Msg::ClientReply {
                    id: 9,
                    reply: ClientReply::NoSpace {
                        by: NodeId(1),
                        epoch: Epoch(2),
                    },
                },
                25 + 4 + 8,
            ),
            (
                Msg::ReplNoSpace {
                    vol: VolumeId(1),
                    epoch: Epoch(2),
                    session: 3,
                    lseq: 4,
                },
                16 + 24,
            ),
            (
                Msg::ReplStarted {
                    vol: VolumeId(1),
                    epoch: Epoch(2),
                    session: 3,
                    prior: Some(Prior {
                        epoch: Epoch(1),
                        synced: 4,
                        regions: vec![5],
                    }),
                    layers: vec![l, LayerId(0)],
                },
                52 + 4 + 4 + 2 * 16,
            ),
        ];
        for (msg, len) in msgs {
            let frame = Frame::Msg {
                vol: VolumeId(1),
                msg,
            };
            let mut out = Vec::new();
            write_fields(&frame, &[], &mut out);
            assert_eq!((out.len(), fields_len(&frame)), (len, len), "{frame:?}");
            assert_eq!(encoded_len(&frame), Ok(HEADER_LEN + len));
        }
    }

    #[test]
    fn oversized_length_is_refused_from_the_header_alone() {
        let mut h = header_bytes(kind::REPL, (MAX_PAYLOAD + 1) as u32, 0);
        assert!(matches!(
            decode(&h),
            Err(DecodeError::TooLarge { len, .. }) if len as usize == MAX_PAYLOAD + 1
        ));
        h[6] = 1;
        let crc = crc32c::crc32c(&h[0..16]);
        h[16..20].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(decode(&h), Err(DecodeError::UnknownFlags(1)));
    }
}
