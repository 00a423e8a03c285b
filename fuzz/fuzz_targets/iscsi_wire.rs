//! Feeds arbitrary bytes through `basalt-iscsi-wire`'s PDU decoder: the
//! first byte chooses the connection settings (direction, digests, and
//! MaxRecvDataSegmentLength from a small set), the rest is a received byte
//! stream decoded PDU after PDU, as a target (or a test initiator) would.
//!
//! Beyond "never panics", it checks that the decoder never claims more
//! bytes than it was given, that every decoded PDU re-encodes to bytes
//! that decode to the same PDU and data, and that every error that asks
//! for a Reject yields a Reject PDU that decodes with the rejected BHS as
//! its data.

#![no_main]

use basalt_iscsi_wire::decoder::{
    decode_initiator, decode_target, Decoded, DecoderConfig, PduError,
};
use basalt_iscsi_wire::digest::Digests;
use basalt_iscsi_wire::pdu::{TargetPdu, BHS_LEN};
use libfuzzer_sys::fuzz_target;

const LIMITS: [u32; 4] = [0, 512, 8192, 1 << 24];

fuzz_target!(|data: &[u8]| {
    let Some((&settings, stream)) = data.split_first() else {
        return;
    };
    let config = DecoderConfig {
        digests: Digests {
            header: settings & 0x02 != 0,
            data: settings & 0x04 != 0,
        },
        max_data_segment: LIMITS[usize::from(settings >> 3) % LIMITS.len()],
    };
    if settings & 1 == 0 {
        decode_stream(stream, &config, Side::Target);
    } else {
        decode_stream(stream, &config, Side::Initiator);
    }
});

#[derive(Clone, Copy)]
enum Side {
    /// Decodes initiator PDUs.
    Target,
    /// Decodes target PDUs.
    Initiator,
}

fn decode_stream(mut rest: &[u8], config: &DecoderConfig, side: Side) {
    loop {
        let step = match side {
            Side::Target => decode_initiator(rest, config).map(|d| match d {
                Decoded::NeedMore(n) => Step::NeedMore(n),
                Decoded::Pdu {
                    pdu,
                    data,
                    consumed,
                } => {
                    let bytes = rest.get(data).expect("data range inside the buffer");
                    let mut out = Vec::new();
                    pdu.encode(bytes, config.digests, &mut out)
                        .expect("decoded PDU re-encodes");
                    match decode_initiator(&out, &wide(config)) {
                        Ok(Decoded::Pdu {
                            pdu: back,
                            data: d2,
                            consumed: c2,
                        }) => {
                            assert_eq!(back, pdu);
                            assert_eq!(&out[d2], bytes);
                            assert_eq!(c2, out.len());
                        }
                        other => panic!("re-encoded PDU does not decode: {other:?}"),
                    }
                    Step::Consumed(consumed)
                }
            }),
            Side::Initiator => decode_target(rest, config).map(|d| match d {
                Decoded::NeedMore(n) => Step::NeedMore(n),
                Decoded::Pdu {
                    pdu,
                    data,
                    consumed,
                } => {
                    let bytes = rest.get(data).expect("data range inside the buffer");
                    let mut out = Vec::new();
                    pdu.encode(bytes, config.digests, &mut out)
                        .expect("decoded PDU re-encodes");
                    match decode_target(&out, &wide(config)) {
                        Ok(Decoded::Pdu {
                            pdu: back,
                            data: d2,
                            consumed: c2,
                        }) => {
                            assert_eq!(back, pdu);
                            assert_eq!(&out[d2], bytes);
                            assert_eq!(c2, out.len());
                        }
                        other => panic!("re-encoded PDU does not decode: {other:?}"),
                    }
                    Step::Consumed(consumed)
                }
            }),
        };
        match step {
            Ok(Step::NeedMore(n)) => {
                assert!(n > 0);
                return;
            }
            Ok(Step::Consumed(consumed)) => {
                assert!(consumed >= BHS_LEN && consumed <= rest.len());
                rest = &rest[consumed..];
            }
            Err(err) => {
                check_error(&err, rest);
                match err.skip_len() {
                    Some(skip) if skip <= rest.len() => rest = &rest[skip..],
                    _ => return,
                }
            }
        }
    }
}

enum Step {
    NeedMore(usize),
    Consumed(usize),
}

fn wide(config: &DecoderConfig) -> DecoderConfig {
    DecoderConfig {
        max_data_segment: u32::MAX,
        ..*config
    }
}

fn check_error(err: &PduError, rest: &[u8]) {
    let _ = err.to_string();
    if let PduError::DataDigest { consumed, .. } = err {
        assert!(*consumed <= rest.len());
    }
    let Some(reject) = err.reject(1, 2, 3) else {
        return;
    };
    let bhs = err
        .rejected_bhs()
        .expect("a Reject carries the rejected BHS");
    assert_eq!(&bhs[..], &rest[..BHS_LEN]);
    let mut out = Vec::new();
    TargetPdu::Reject(reject)
        .encode(bhs, Digests::NONE, &mut out)
        .expect("Reject encodes");
    match decode_target(&out, &DecoderConfig::LOGIN) {
        Ok(Decoded::Pdu {
            pdu: TargetPdu::Reject(r),
            data,
            consumed,
        }) => {
            assert_eq!(r, reject);
            assert_eq!(&out[data], &bhs[..]);
            assert_eq!(consumed, out.len());
        }
        other => panic!("Reject does not decode: {other:?}"),
    }
}
