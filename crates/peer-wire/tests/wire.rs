//! The peer wire format against literal bytes (so the layout cannot drift
//! silently), round trips of every message kind, and corruption: every
//! single-bit flip and every truncation is refused or awaited, never
//! accepted and never a panic.

use basalt_peer_wire::*;
use basalt_replication::{
    ClientReply, ClientReq, Epoch, LayerId, Msg, NodeId, Prior, ReplOp, VolumeId,
};
use proptest::prelude::*;

/// Hex digits with any separators; CRCs computed independently (a bitwise
/// CRC32C in Python), not by this crate.
fn hex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s.bytes().filter(u8::is_ascii_hexdigit).collect();
    digits
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap())
        .collect()
}

const VOL: VolumeId = VolumeId(0x0011_2233_4455_6677_8899_aabb_ccdd_eeff);
const LAYER: LayerId = LayerId(0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10);

fn assert_literal(frame: &Frame, bytes: &[u8]) {
    let mut out = Vec::new();
    encode(frame, &mut out).unwrap();
    assert_eq!(out, bytes);
    assert_eq!(encoded_len(frame), Ok(bytes.len()));
    assert_eq!(decode(bytes), Ok(Some((frame.clone(), bytes.len()))));
}

#[test]
fn hello_literal() {
    let frame = Frame::Hello {
        cluster: [0x11; 16],
        node: NodeId(7),
        boot: 0x0102_0304_0506_0708,
        nonce: [0x22; 16],
        proof: [0x33; 32],
    };
    let bytes = hex("
        42 53 50 57  0c  01  00 00  4c 00 00 00  13 8a 7c 76  ff 2a bf cb
        11 11 11 11 11 11 11 11 11 11 11 11 11 11 11 11  07 00 00 00  08 07 06 05 04 03 02 01
        22 22 22 22 22 22 22 22 22 22 22 22 22 22 22 22
        33 33 33 33 33 33 33 33 33 33 33 33 33 33 33 33 33 33 33 33 33 33 33 33 33 33 33 33 33 33 33 33");
    assert_literal(&frame, &bytes);
}

#[test]
fn repl_write_literal() {
    let frame = Frame::Msg {
        vol: VOL,
        msg: Msg::Repl {
            vol: VOL,
            epoch: Epoch(2),
            session: 3,
            lseq: 4,
            vseq: 5,
            commit: 7,
            floor: 6,
            op: ReplOp::Write {
                lba: 6,
                fua: true,
                data: b"ABCDEFGH".to_vec().into(),
            },
        },
    };
    let bytes = hex("
        42 53 50 57  0c  02  00 00  56 00 00 00  95 00 1d 92  df f1 9c fe
        ff ee dd cc bb aa 99 88 77 66 55 44 33 22 11 00
        02 00 00 00 00 00 00 00  03 00 00 00 00 00 00 00
        04 00 00 00 00 00 00 00  05 00 00 00 00 00 00 00
        07 00 00 00 00 00 00 00  06 00 00 00 00 00 00 00
        01  06 00 00 00 00 00 00 00  01  08 00 00 00  41 42 43 44 45 46 47 48");
    assert_literal(&frame, &bytes);
    // The split form is the same bytes, with the data left in the message.
    let mut head = Vec::new();
    let data = encode_split(&frame, &mut head).unwrap();
    assert_eq!(data, b"ABCDEFGH");
    assert_eq!([head.as_slice(), data].concat(), bytes);
}

#[test]
fn repl_write_zeroes_literal() {
    // A resync copy of a never-written 4 MiB region: 66 bytes of payload,
    // no data.
    let frame = Frame::Msg {
        vol: VOL,
        msg: Msg::Repl {
            vol: VOL,
            epoch: Epoch(2),
            session: 3,
            lseq: 4,
            vseq: 5,
            commit: 7,
            floor: 6,
            op: ReplOp::WriteZeroes {
                lba: 0x400,
                blocks: 0x400,
                fua: false,
            },
        },
    };
    let bytes = hex("
        42 53 50 57  0c  02  00 00  52 00 00 00  b3 3f c9 60  5b 1a 68 76
        ff ee dd cc bb aa 99 88 77 66 55 44 33 22 11 00
        02 00 00 00 00 00 00 00  03 00 00 00 00 00 00 00
        04 00 00 00 00 00 00 00  05 00 00 00 00 00 00 00
        07 00 00 00 00 00 00 00  06 00 00 00 00 00 00 00
        03  00 04 00 00 00 00 00 00  00  00 04 00 00 00 00 00 00");
    assert_literal(&frame, &bytes);
    let mut head = Vec::new();
    assert_eq!(encode_split(&frame, &mut head), Ok(&[][..]));
}

#[test]
fn repl_started_literal() {
    // The acknowledgement of a Start with the secondary's uncertain
    // regions 1 and 9 of epoch 1 (synced at vseq 0x20), and its snapshot
    // layers 7 and LAYER, oldest first.
    let frame = Frame::Msg {
        vol: VOL,
        msg: Msg::ReplStarted {
            vol: VOL,
            epoch: Epoch(2),
            session: 3,
            prior: Some(Prior {
                epoch: Epoch(1),
                synced: 0x20,
                regions: vec![1, 9],
            }),
            layers: vec![LayerId(7), LAYER],
        },
    };
    let bytes = hex("
        42 53 50 57  0c  09  00 00  60 00 00 00  e5 31 90 b2  2a 4e cd 6e
        ff ee dd cc bb aa 99 88 77 66 55 44 33 22 11 00
        02 00 00 00 00 00 00 00  03 00 00 00 00 00 00 00
        01 00 00 00 00 00 00 00  20 00 00 00 00 00 00 00
        02 00 00 00  01 00 00 00  09 00 00 00
        02 00 00 00
        07 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
        10 0f 0e 0d 0c 0b 0a 09 08 07 06 05 04 03 02 01");
    assert_literal(&frame, &bytes);
    // No prior: epoch, synced and count all zero; anything else there is
    // not canonical. No layers: a layer count of zero.
    let none = Frame::Msg {
        vol: VOL,
        msg: Msg::ReplStarted {
            vol: VOL,
            epoch: Epoch(2),
            session: 3,
            prior: None,
            layers: vec![],
        },
    };
    let mut out = Vec::new();
    encode(&none, &mut out).unwrap();
    assert_eq!(out.len(), 20 + 16 + 40);
    assert_eq!(&out[20 + 32..], &[0; 24]);
    let zero = Frame::Msg {
        vol: VOL,
        msg: Msg::ReplStarted {
            vol: VOL,
            epoch: Epoch(2),
            session: 3,
            prior: Some(Prior {
                epoch: Epoch(0),
                synced: 1,
                regions: vec![],
            }),
            layers: vec![],
        },
    };
    assert_eq!(encoded_len(&zero), Err(EncodeError::PriorEpochZero));
}

/// A `Repl` entry of epoch 2, session 3, lseq 4 (vseq 0, commit 7, floor
/// 6) carrying `op`.
fn repl(op: ReplOp) -> Frame {
    Frame::Msg {
        vol: VOL,
        msg: Msg::Repl {
            vol: VOL,
            epoch: Epoch(2),
            session: 3,
            lseq: 4,
            vseq: 0,
            commit: 7,
            floor: 6,
            op,
        },
    }
}

/// The `Repl` payload fields before the op of [`repl`]'s entries.
const REPL_FIELDS: &str = "
    ff ee dd cc bb aa 99 88 77 66 55 44 33 22 11 00
    02 00 00 00 00 00 00 00  03 00 00 00 00 00 00 00
    04 00 00 00 00 00 00 00  00 00 00 00 00 00 00 00
    07 00 00 00 00 00 00 00  06 00 00 00 00 00 00 00";

#[test]
fn repl_layer_ops_literal() {
    let cases = [
        (
            ReplOp::Snapshot { layer: LAYER },
            "42 53 50 57  0c  02  00 00  51 00 00 00  4f 25 c7 bc  fa 51 da 8a",
            "05  10 0f 0e 0d 0c 0b 0a 09 08 07 06 05 04 03 02 01",
        ),
        (
            ReplOp::DeleteLayer { layer: LAYER },
            "42 53 50 57  0c  02  00 00  51 00 00 00  ae 41 ea 5c  cd d7 c4 9d",
            "06  10 0f 0e 0d 0c 0b 0a 09 08 07 06 05 04 03 02 01",
        ),
        (
            ReplOp::Rebase { onto: Some(LAYER) },
            "42 53 50 57  0c  02  00 00  52 00 00 00  47 8b e8 0a  2e 8d 1f 28",
            "07  01  10 0f 0e 0d 0c 0b 0a 09 08 07 06 05 04 03 02 01",
        ),
        (
            ReplOp::Rebase { onto: None },
            "42 53 50 57  0c  02  00 00  42 00 00 00  68 1a 6a 14  d5 61 6c aa",
            "07  00",
        ),
        (
            ReplOp::Flatten {
                lba: 0x10,
                blocks: 0x4000,
                rate: 0x0200_0000,
            },
            "42 53 50 57  0c  02  00 00  59 00 00 00  2d 31 77 18  9e 2e 25 3b",
            "08  10 00 00 00 00 00 00 00  00 40 00 00 00 00 00 00  00 00 00 02 00 00 00 00",
        ),
    ];
    for (op, header, tail) in cases {
        let frame = repl(op);
        let bytes = hex(&format!("{header} {REPL_FIELDS} {tail}"));
        assert_literal(&frame, &bytes);
        let mut head = Vec::new();
        assert_eq!(encode_split(&frame, &mut head), Ok(&[][..]));
    }
}

#[test]
fn client_layer_requests_and_no_such_layer_literal() {
    let req = |req| Frame::Msg {
        vol: VOL,
        msg: Msg::ClientReq { id: 11, req },
    };
    let cases = [
        (
            req(ClientReq::Snapshot { layer: LAYER }),
            "42 53 50 57  0c  07  00 00  29 00 00 00  6a ca 97 83  ea ac 3e a4",
            "05  10 0f 0e 0d 0c 0b 0a 09 08 07 06 05 04 03 02 01",
        ),
        (
            req(ClientReq::DeleteSnapshot { layer: LAYER }),
            "42 53 50 57  0c  07  00 00  29 00 00 00  8b ae ba 63  dd 2a 20 b3",
            "06  10 0f 0e 0d 0c 0b 0a 09 08 07 06 05 04 03 02 01",
        ),
        (
            req(ClientReq::Rollback { layer: LAYER }),
            "42 53 50 57  0c  07  00 00  29 00 00 00  d4 72 5e 3c  30 57 2a be",
            "07  10 0f 0e 0d 0c 0b 0a 09 08 07 06 05 04 03 02 01",
        ),
        (
            req(ClientReq::Flatten {
                lba: 0x10,
                blocks: 0x4000,
                rate: 0,
            }),
            "42 53 50 57  0c  07  00 00  31 00 00 00  cb 09 ad db  a8 82 3c bd",
            "08  10 00 00 00 00 00 00 00  00 40 00 00 00 00 00 00  00 00 00 00 00 00 00 00",
        ),
        (
            Frame::Msg {
                vol: VOL,
                msg: Msg::ClientReply {
                    id: 11,
                    reply: ClientReply::NoSuchLayer {
                        by: NodeId(7),
                        epoch: Epoch(2),
                    },
                },
            },
            "42 53 50 57  0c  08  00 00  25 00 00 00  95 66 a7 27  35 dd 37 40",
            "03  07 00 00 00  02 00 00 00 00 00 00 00",
        ),
    ];
    for (frame, header, tail) in cases {
        let bytes = hex(&format!(
            "{header} ff ee dd cc bb aa 99 88 77 66 55 44 33 22 11 00
             0b 00 00 00 00 00 00 00 {tail}"
        ));
        assert_literal(&frame, &bytes);
    }
}

#[test]
fn malformed_layer_fields_are_refused() {
    let rebuild = |kind: u8, payload: &[u8]| {
        let mut h = Vec::from(MAGIC);
        h.extend_from_slice(&[VERSION, kind, 0, 0]);
        h.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        h.extend_from_slice(&crc32c::crc32c(payload).to_le_bytes());
        let crc = crc32c::crc32c(&h);
        h.extend_from_slice(&crc.to_le_bytes());
        h.extend_from_slice(payload);
        h
    };
    // A Rebase's presence flag is 0 or 1, and the layer follows only a 1.
    let mut rebase = hex(REPL_FIELDS);
    rebase.extend_from_slice(&[7, 2]);
    rebase.extend_from_slice(&LAYER.0.to_le_bytes());
    assert_eq!(
        decode(&rebuild(kind::REPL, &rebase)),
        Err(DecodeError::InvalidValue {
            kind: "Repl",
            field: "has_onto",
            value: 2
        })
    );
    let mut rebase = hex(REPL_FIELDS);
    rebase.extend_from_slice(&[7, 0]);
    rebase.extend_from_slice(&LAYER.0.to_le_bytes());
    assert_eq!(
        decode(&rebuild(kind::REPL, &rebase)),
        Err(DecodeError::TrailingBytes {
            kind: "Repl",
            extra: 16
        })
    );
    let mut rebase = hex(REPL_FIELDS);
    rebase.extend_from_slice(&[7, 1, 0x10]);
    assert!(matches!(
        decode(&rebuild(kind::REPL, &rebase)),
        Err(DecodeError::Truncated {
            kind: "Repl",
            field: "onto",
            ..
        })
    ));
    // A layer count the payload cannot hold is refused before allocating.
    let started = |count: u32, layers: usize| {
        let mut p = VOL.0.to_le_bytes().to_vec();
        p.extend_from_slice(&[0; 8 + 8 + 8 + 8 + 4]); // epoch … region count
        p.extend_from_slice(&count.to_le_bytes());
        for _ in 0..layers {
            p.extend_from_slice(&LAYER.0.to_le_bytes());
        }
        rebuild(kind::REPL_STARTED, &p)
    };
    assert!(matches!(decode(&started(1, 1)), Ok(Some(_))));
    for (count, layers) in [(2, 1), (u32::MAX, 1), (1, 0)] {
        assert!(
            matches!(
                decode(&started(count, layers)),
                Err(DecodeError::Truncated {
                    kind: "ReplStarted",
                    field: "layers",
                    ..
                })
            ),
            "count {count}, {layers} layers"
        );
    }
    let mut long = started(1, 1)[20..].to_vec();
    long.push(0);
    assert_eq!(
        decode(&rebuild(kind::REPL_STARTED, &long)),
        Err(DecodeError::TrailingBytes {
            kind: "ReplStarted",
            extra: 1
        })
    );
    // A Repl op, client req or client reply past the last one defined.
    let mut op = hex(REPL_FIELDS);
    op.push(10);
    assert_eq!(
        decode(&rebuild(kind::REPL, &op)),
        Err(DecodeError::InvalidValue {
            kind: "Repl",
            field: "op",
            value: 10
        })
    );
    let mut p = VOL.0.to_le_bytes().to_vec();
    p.extend_from_slice(&11u64.to_le_bytes());
    p.push(12);
    p.extend_from_slice(&LAYER.0.to_le_bytes());
    assert_eq!(
        decode(&rebuild(kind::CLIENT_REQ, &p)),
        Err(DecodeError::InvalidValue {
            kind: "ClientReq",
            field: "req",
            value: 12
        })
    );
    let mut p = VOL.0.to_le_bytes().to_vec();
    p.extend_from_slice(&11u64.to_le_bytes());
    p.push(5);
    p.extend_from_slice(&[0; 12]);
    assert_eq!(
        decode(&rebuild(kind::CLIENT_REPLY, &p)),
        Err(DecodeError::InvalidValue {
            kind: "ClientReply",
            field: "reply",
            value: 5
        })
    );
}

#[test]
fn client_write_of_zeros_literal() {
    // 12 KiB of zeros forwarded to the primary: the zeros form, 38 bytes of
    // payload; it decodes to the same zero-filled write.
    let frame = Frame::Msg {
        vol: VOL,
        msg: Msg::ClientReq {
            id: 11,
            req: ClientReq::Write {
                lba: 6,
                data: vec![0; 0x3000].into(),
                fua: true,
            },
        },
    };
    let bytes = hex("
        42 53 50 57  0c  07  00 00  26 00 00 00  0a 17 b7 81  1c f7 41 c1
        ff ee dd cc bb aa 99 88 77 66 55 44 33 22 11 00
        0b 00 00 00 00 00 00 00  03  06 00 00 00 00 00 00 00  01  00 30 00 00");
    assert_literal(&frame, &bytes);
    let mut head = Vec::new();
    assert_eq!(encode_split(&frame, &mut head), Ok(&[][..]));
}

#[test]
fn client_compare_write_literal() {
    // One 4-byte block expected ("EEEE") and its new content ("NNNN"), as
    // one bulk of both after the fields; written only if all match.
    let frame = Frame::Msg {
        vol: VOL,
        msg: Msg::ClientReq {
            id: 9,
            req: ClientReq::compare_write(6, b"EEEE", b"NNNN", true, false),
        },
    };
    let bytes = hex("
        42 53 50 57  0c  07  00 00  2f 00 00 00  a3 a8 ef 92  dc f1 6a 6c
        ff ee dd cc bb aa 99 88 77 66 55 44 33 22 11 00
        09 00 00 00 00 00 00 00  0b  06 00 00 00 00 00 00 00  00  01  08 00 00 00
        45 45 45 45 4e 4e 4e 4e");
    assert_literal(&frame, &bytes);
    let mut head = Vec::new();
    assert_eq!(encode_split(&frame, &mut head), Ok(&b"EEEENNNN"[..]));
}

#[test]
fn non_canonical_and_oversized_zero_writes_are_refused() {
    let rebuild = |kind: u8, payload: &[u8]| {
        let mut h = Vec::from(MAGIC);
        h.extend_from_slice(&[VERSION, kind, 0, 0]);
        h.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        h.extend_from_slice(&crc32c::crc32c(payload).to_le_bytes());
        let crc = crc32c::crc32c(&h);
        h.extend_from_slice(&crc.to_le_bytes());
        h.extend_from_slice(payload);
        h
    };
    let req = |form: u8, len: u32, data: &[u8]| {
        let mut p = VOL.0.to_le_bytes().to_vec();
        p.extend_from_slice(&11u64.to_le_bytes());
        p.push(form);
        p.extend_from_slice(&6u64.to_le_bytes());
        p.push(0);
        p.extend_from_slice(&len.to_le_bytes());
        p.extend_from_slice(data);
        rebuild(kind::CLIENT_REQ, &p)
    };
    let not_canonical = |field| {
        Err(DecodeError::NotCanonical {
            kind: "ClientReq",
            field,
        })
    };
    // Zeros in the data form: they have a shorter one.
    assert_eq!(decode(&req(0, 4, &[0; 4])), not_canonical("data"));
    // A write of no bytes is the data form; the zeros form never is empty.
    assert!(matches!(decode(&req(0, 0, &[])), Ok(Some(_))));
    assert_eq!(decode(&req(3, 0, &[])), not_canonical("zeros"));
    // A zeros length a data write could not have: refused before allocating.
    let max = (MAX_PAYLOAD - 38) as u32;
    assert!(matches!(decode(&req(3, max, &[])), Ok(Some(_))));
    assert!(matches!(
        decode(&req(3, max + 1, &[])),
        Err(DecodeError::ZeroWriteTooLarge { len, .. }) if len == max + 1
    ));
    assert!(matches!(
        decode(&req(3, u32::MAX, &[])),
        Err(DecodeError::ZeroWriteTooLarge { .. })
    ));
    // And the encoder bounds a write the same way, zeros or not.
    for fill in [0u8, 1] {
        let frame = Frame::Msg {
            vol: VOL,
            msg: Msg::ClientReq {
                id: 1,
                req: ClientReq::Write {
                    lba: 0,
                    data: vec![fill; max as usize + 1].into(),
                    fua: false,
                },
            },
        };
        assert!(matches!(
            encoded_len(&frame),
            Err(EncodeError::TooLarge { .. })
        ));
    }
}

#[test]
fn heartbeat_literal() {
    let frame = Frame::Msg {
        vol: VOL,
        msg: Msg::Heartbeat {
            boot: 9,
            sent_at: 10,
        },
    };
    let bytes = hex("
        42 53 50 57  0c  05  00 00  20 00 00 00  23 35 8e d5  00 66 63 53
        ff ee dd cc bb aa 99 88 77 66 55 44 33 22 11 00
        09 00 00 00 00 00 00 00  0a 00 00 00 00 00 00 00");
    assert_literal(&frame, &bytes);
}

#[test]
fn typed_errors_name_the_problem() {
    let frame = Frame::Msg {
        vol: VOL,
        msg: Msg::Heartbeat {
            boot: 9,
            sent_at: 10,
        },
    };
    let mut good = Vec::new();
    encode(&frame, &mut good).unwrap();

    assert!(matches!(decode(b"BSX"), Err(DecodeError::BadMagic { .. })));
    assert_eq!(decode(b"BSP"), Ok(None));
    // A version 1 peer (no zero forms), 2 (no failover watermarks), 3 (no
    // lease in heartbeat answers), 4 (no authentication), 5 (no read
    // repair), 6 (no replica compare, unordered repair reads) or 7 (no
    // snapshot layers), 8 (no flattening), 9 (no full-store answers), 10
    // (no compaction) or 11 (no compare-and-write) is refused, as is a
    // future one.
    for v in [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13] {
        let mut b = good.clone();
        b[4] = v;
        assert_eq!(decode(&b), Err(DecodeError::UnsupportedVersion(v)));
    }
    let mut b = good.clone();
    b[8] ^= 1;
    assert!(matches!(decode(&b), Err(DecodeError::HeaderCrc { .. })));
    let mut b = good.clone();
    b[30] ^= 1;
    assert!(matches!(decode(&b), Err(DecodeError::PayloadCrc { .. })));

    // A structurally wrong payload with valid CRCs: rebuilt by hand.
    let rebuild = |kind: u8, payload: &[u8]| {
        let mut h = Vec::from(MAGIC);
        h.extend_from_slice(&[VERSION, kind, 0, 0]);
        h.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        h.extend_from_slice(&crc32c::crc32c(payload).to_le_bytes());
        let crc = crc32c::crc32c(&h);
        h.extend_from_slice(&crc.to_le_bytes());
        h.extend_from_slice(payload);
        h
    };
    assert_eq!(decode(&rebuild(15, &[])), Err(DecodeError::UnknownKind(15)));
    assert!(matches!(
        decode(&rebuild(kind::HEARTBEAT, &good[20..good.len() - 1])),
        Err(DecodeError::Truncated {
            kind: "Heartbeat",
            field: "sent_at",
            ..
        })
    ));
    let mut long = good[20..].to_vec();
    long.push(0);
    assert_eq!(
        decode(&rebuild(kind::HEARTBEAT, &long)),
        Err(DecodeError::TrailingBytes {
            kind: "Heartbeat",
            extra: 1
        })
    );
    let mut fenced = VOL.0.to_le_bytes().to_vec();
    fenced.extend_from_slice(&[0; 8]);
    fenced.extend_from_slice(&[0; 8]); // session
    fenced.extend_from_slice(&[0; 32]); // lseq, vseq, commit, floor
    fenced.push(10); // no such op
    assert_eq!(
        decode(&rebuild(kind::REPL, &fenced)),
        Err(DecodeError::InvalidValue {
            kind: "Repl",
            field: "op",
            value: 10
        })
    );
}

#[test]
fn frames_follow_each_other_in_one_buffer() {
    let a = Frame::Hello {
        cluster: [1; 16],
        node: NodeId(1),
        boot: 1,
        nonce: [2; 16],
        proof: [0; 32],
    };
    let b = Frame::Msg {
        vol: VOL,
        msg: Msg::Fenced {
            vol: VOL,
            epoch: Epoch(4),
        },
    };
    let mut buf = Vec::new();
    encode(&a, &mut buf).unwrap();
    let first = buf.len();
    encode(&b, &mut buf).unwrap();
    assert_eq!(decode(&buf), Ok(Some((a, first))));
    assert_eq!(decode(&buf[first..]), Ok(Some((b, buf.len() - first))));
}

// ------------------------------------------------------------ properties

fn data() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..300)
}

/// Write data: random, or zeros (the zeros form), or zeros but one byte.
fn write_data() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        data(),
        (1..300usize).prop_map(|n| vec![0; n]),
        (1..300usize, any::<prop::sample::Index>(), 1..=255u8).prop_map(|(n, at, b)| {
            let mut d = vec![0; n];
            d[at.index(n)] = b;
            d
        }),
    ]
}

fn layer() -> impl Strategy<Value = LayerId> {
    any::<u128>().prop_map(LayerId)
}

fn repl_op() -> impl Strategy<Value = ReplOp> {
    prop_oneof![
        Just(ReplOp::Start),
        Just(ReplOp::Flush),
        (any::<u64>(), any::<bool>(), data()).prop_map(|(lba, fua, data)| ReplOp::Write {
            lba,
            fua,
            data: data.into()
        }),
        (any::<u64>(), any::<bool>(), any::<u64>())
            .prop_map(|(lba, fua, blocks)| { ReplOp::WriteZeroes { lba, fua, blocks } }),
        (any::<u64>(), any::<u64>()).prop_map(|(lba, blocks)| ReplOp::Digest { lba, blocks }),
        layer().prop_map(|layer| ReplOp::Snapshot { layer }),
        layer().prop_map(|layer| ReplOp::DeleteLayer { layer }),
        prop::option::of(layer()).prop_map(|onto| ReplOp::Rebase { onto }),
        (any::<u64>(), any::<u64>(), any::<u64>())
            .prop_map(|(lba, blocks, rate)| ReplOp::Flatten { lba, blocks, rate }),
    ]
}

fn client_req() -> impl Strategy<Value = ClientReq> {
    prop_oneof![
        Just(ClientReq::Flush),
        (any::<u64>(), any::<bool>(), write_data()).prop_map(|(lba, fua, data)| ClientReq::Write {
            lba,
            fua,
            data: data.into()
        }),
        (any::<u64>(), any::<u64>()).prop_map(|(lba, blocks)| ClientReq::Read { lba, blocks }),
        (any::<u64>(), any::<u64>()).prop_map(|(lba, blocks)| ClientReq::Compare { lba, blocks }),
        layer().prop_map(|layer| ClientReq::Snapshot { layer }),
        layer().prop_map(|layer| ClientReq::DeleteSnapshot { layer }),
        layer().prop_map(|layer| ClientReq::Rollback { layer }),
        (any::<u64>(), any::<u64>(), any::<u64>())
            .prop_map(|(lba, blocks, rate)| ClientReq::Flatten { lba, blocks, rate }),
        (any::<u64>(), data(), any::<bool>(), any::<bool>()).prop_map(|(lba, both, whole, fua)| {
            ClientReq::CompareWrite {
                lba,
                both: both.into(),
                whole,
                fua,
            }
        }),
    ]
}

fn client_reply() -> impl Strategy<Value = ClientReply> {
    prop_oneof![
        Just(ClientReply::NotPrimary),
        (any::<u32>(), any::<u64>()).prop_map(|(by, epoch)| ClientReply::Unreadable {
            by: NodeId(by),
            epoch: Epoch(epoch),
        }),
        (any::<u32>(), any::<u64>()).prop_map(|(by, epoch)| ClientReply::NoSuchLayer {
            by: NodeId(by),
            epoch: Epoch(epoch),
        }),
        (any::<u32>(), any::<u64>()).prop_map(|(by, epoch)| ClientReply::NoSpace {
            by: NodeId(by),
            epoch: Epoch(epoch),
        }),
        (any::<u32>(), any::<u64>(), prop::option::of(data())).prop_map(|(by, epoch, data)| {
            ClientReply::Ok {
                by: NodeId(by),
                epoch: Epoch(epoch),
                data,
            }
        }),
    ]
}

/// Every peer message kind, naming volume `vol` where it carries one.
fn msg(vol: VolumeId) -> impl Strategy<Value = Msg> {
    let n = any::<u64>;
    prop_oneof![
        (n(), n(), n(), n(), (n(), n()), repl_op()).prop_map(
            move |(e, session, lseq, vseq, (commit, floor), op)| Msg::Repl {
                vol,
                epoch: Epoch(e),
                session,
                lseq,
                vseq,
                commit,
                floor,
                op,
            }
        ),
        (
            n(),
            n(),
            proptest::option::of((
                1..=u64::MAX,
                n(),
                proptest::collection::vec(any::<u32>(), 0..20)
            )),
            proptest::collection::vec(layer(), 0..6)
        )
            .prop_map(move |(e, session, prior, layers)| Msg::ReplStarted {
                vol,
                epoch: Epoch(e),
                session,
                prior: prior.map(|(pe, synced, regions)| Prior {
                    epoch: Epoch(pe),
                    synced,
                    regions
                }),
                layers,
            }),
        (n(), n(), n()).prop_map(move |(e, session, lseq)| Msg::ReplAck {
            vol,
            epoch: Epoch(e),
            session,
            lseq
        }),
        (n(), n(), n()).prop_map(move |(e, session, lseq)| Msg::ReplNoSpace {
            vol,
            epoch: Epoch(e),
            session,
            lseq
        }),
        n().prop_map(move |e| Msg::Fenced {
            vol,
            epoch: Epoch(e)
        }),
        (n(), n(), n(), n(), (n(), n())).prop_map(move |(e, id, lba, blocks, (session, after))| {
            Msg::RepairRead {
                vol,
                epoch: Epoch(e),
                id,
                lba,
                blocks,
                session,
                after,
            }
        }),
        (n(), n(), n(), prop::option::of(any::<u32>())).prop_map(
            move |(e, session, lseq, digest)| Msg::ReplDigest {
                vol,
                epoch: Epoch(e),
                session,
                lseq,
                digest,
            }
        ),
        (n(), n(), prop::option::of(data())).prop_map(move |(e, id, data)| Msg::RepairData {
            vol,
            epoch: Epoch(e),
            id,
            data,
        }),
        (n(), n()).prop_map(|(boot, sent_at)| Msg::Heartbeat { boot, sent_at }),
        (n(), n(), any::<u32>(), n()).prop_map(move |(sent_at, e, p, lease_ms)| {
            Msg::HeartbeatAck {
                sent_at,
                vol,
                epoch: Epoch(e),
                primary: NodeId(p),
                lease_ms,
            }
        }),
        (n(), client_req()).prop_map(|(id, req)| Msg::ClientReq { id, req }),
        (n(), client_reply()).prop_map(|(id, reply)| Msg::ClientReply { id, reply }),
    ]
}

fn frame() -> impl Strategy<Value = Frame> {
    prop_oneof![
        (
            any::<[u8; 16]>(),
            any::<u32>(),
            any::<u64>(),
            any::<[u8; 16]>(),
            any::<[u8; 32]>()
        )
            .prop_map(|(cluster, node, boot, nonce, proof)| Frame::Hello {
                cluster,
                node: NodeId(node),
                boot,
                nonce,
                proof,
            }),
        any::<[u8; 32]>().prop_map(|proof| Frame::Auth { proof }),
        any::<u128>().prop_flat_map(|v| msg(VolumeId(v)).prop_map(move |msg| Frame::Msg {
            vol: VolumeId(v),
            msg
        })),
    ]
}

proptest! {
    #[test]
    fn round_trip(frame in frame(), prefix in data()) {
        // Appends after whatever the buffer already holds.
        let mut out = prefix.clone();
        encode(&frame, &mut out).unwrap();
        prop_assert_eq!(&out[..prefix.len()], &prefix[..]);
        let bytes = &out[prefix.len()..];
        prop_assert_eq!(encoded_len(&frame), Ok(bytes.len()));
        prop_assert_eq!(decode(bytes), Ok(Some((frame.clone(), bytes.len()))));
        let mut with_next = bytes.to_vec();
        with_next.extend_from_slice(&MAGIC);
        prop_assert_eq!(decode(&with_next), Ok(Some((frame, bytes.len()))));
    }

    #[test]
    fn every_bit_flip_is_refused(frame in frame()) {
        let mut good = Vec::new();
        encode(&frame, &mut good).unwrap();
        for bit in 0..good.len() * 8 {
            let mut bad = good.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            // A flip in the magic's prefix may only be noticed as bad magic;
            // nowhere may it decode or wait for more.
            prop_assert!(decode(&bad).is_err(), "bit {} accepted", bit);
        }
    }

    #[test]
    fn truncations_wait_or_fail(frame in frame()) {
        let mut good = Vec::new();
        encode(&frame, &mut good).unwrap();
        for cut in 0..good.len() {
            prop_assert_eq!(decode(&good[..cut]), Ok(None));
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        let _ = decode(&bytes);
        // With a valid header in front, the payload parsers see the bytes.
        for k in kind::HELLO..=kind::REPL_NO_SPACE {
            let mut h = Vec::from(MAGIC);
            h.extend_from_slice(&[VERSION, k, 0, 0]);
            h.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
            h.extend_from_slice(&crc32c::crc32c(&bytes).to_le_bytes());
            let crc = crc32c::crc32c(&h);
            h.extend_from_slice(&crc.to_le_bytes());
            h.extend_from_slice(&bytes);
            if let Ok(Some((f, used))) = decode(&h) {
                let mut again = Vec::new();
                encode(&f, &mut again).unwrap();
                prop_assert_eq!(&again[..], &h[..used]);
            }
        }
    }
}

/// A decoded write's data lands in a 4 KiB-aligned payload wherever it sat
/// in the received bytes, so the receiving store writes it with O_DIRECT
/// without bouncing it through another copy.
#[test]
fn decoded_write_payloads_are_aligned() {
    let data: Vec<u8> = (0..3 * 4096u32).map(|i| (i % 251) as u8 + 1).collect();
    let client = Frame::Msg {
        vol: VOL,
        msg: Msg::ClientReq {
            id: 9,
            req: ClientReq::Write {
                lba: 5,
                data: data.clone().into(),
                fua: false,
            },
        },
    };
    let write = repl(ReplOp::Write {
        lba: 5,
        data: data.clone().into(),
        fua: true,
    });
    for frame in [client, write] {
        let mut bytes = Vec::new();
        encode(&frame, &mut bytes).unwrap();
        // Shift the frame in the receive buffer by every odd offset.
        for shift in [0usize, 1, 7, 4095] {
            let mut buf = vec![0xAA; shift];
            buf.extend_from_slice(&bytes);
            let (got, _) = decode(&buf[shift..]).unwrap().unwrap();
            assert_eq!(got, frame);
            let payload = match got {
                Frame::Msg {
                    msg:
                        Msg::Repl {
                            op: ReplOp::Write { data, .. },
                            ..
                        },
                    ..
                }
                | Frame::Msg {
                    msg:
                        Msg::ClientReq {
                            req: ClientReq::Write { data, .. },
                            ..
                        },
                    ..
                } => data,
                other => panic!("not a write: {other:?}"),
            };
            assert_eq!(payload.as_ptr() as usize % 4096, 0, "shift {shift}");
        }
    }
}

/// `decode_shared` decodes what `decode` does, and a write's data is then
/// the frame buffer's own bytes, not a copy.
#[test]
fn decode_shared_shares_write_data() {
    let frame = repl(ReplOp::Write {
        lba: 1,
        data: vec![9; 8192].into(),
        fua: false,
    });
    let mut bytes = Vec::new();
    encode(&frame, &mut bytes).unwrap();
    let buf = basalt_replication::Payload::from(bytes.clone());
    let (got, used) = decode_shared(&buf).unwrap().unwrap();
    assert_eq!(used, bytes.len());
    assert_eq!(Some((got.clone(), used)), decode(&bytes).unwrap());
    let Frame::Msg {
        msg: Msg::Repl {
            op: ReplOp::Write { data, .. },
            ..
        },
        ..
    } = got
    else {
        panic!("not a write");
    };
    let range = buf.as_ptr() as usize..buf.as_ptr() as usize + buf.len();
    assert!(range.contains(&(data.as_ptr() as usize)));
}
