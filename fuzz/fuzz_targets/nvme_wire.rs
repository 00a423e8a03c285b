//! Feeds arbitrary bytes through `basalt-nvme-wire`: the first three bytes
//! choose the connection settings (direction, digests, HPDA, CPDA), the
//! rest is a received byte stream that is decoded PDU after PDU, as a
//! target (or host) would. Every SQE that arrives is viewed as admin, I/O
//! and Fabrics command, and in-capsule data as connect data, DSM ranges
//! and DH-HMAC-CHAP messages and secrets.
//!
//! Beyond "never panics", it checks that the decoder never claims more
//! bytes than it was given, that every decoded PDU re-encodes to bytes
//! that decode to the same PDU, and that every error yields a termination
//! request that decodes.

#![no_main]

use basalt_nvme_wire::command::parse_dsm_ranges;
use basalt_nvme_wire::decoder::max_plen_for_data;
use basalt_nvme_wire::fabrics::parse_fabrics;
use basalt_nvme_wire::log_page::DiscoveryLog;
use basalt_nvme_wire::*;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((settings, stream)) = data.split_first_chunk::<3>() else {
        return;
    };
    let negotiated = Negotiated {
        digests: Digests::from_bits(settings[0] >> 1),
        hpda: settings[1] % 32,
        cpda: settings[2] % 32,
    };
    let direction = if settings[0] & 1 == 0 {
        Direction::HostToController
    } else {
        Direction::ControllerToHost
    };
    let config = DecoderConfig {
        direction,
        negotiated,
        max_plen: max_plen_for_data(16 * 1024),
    };
    decode_stream(stream, &config);
    structures(stream);
});

fn decode_stream(mut rest: &[u8], config: &DecoderConfig) {
    loop {
        match decode_pdu(rest, config) {
            Ok(Decoded::NeedMore(n)) => {
                assert!(n > 0);
                return;
            }
            Ok(Decoded::Pdu { pdu, consumed }) => {
                assert!(consumed >= 8 && consumed <= rest.len());
                check_pdu(&pdu, config);
                rest = &rest[consumed..];
            }
            Err(err) => {
                check_error(&err, rest);
                match err {
                    // Not fatal: skip the PDU and go on.
                    PduError::DataDigest { consumed, .. } => {
                        assert!(consumed <= rest.len());
                        rest = &rest[consumed..];
                    }
                    _ => return,
                }
            }
        }
    }
}

fn check_pdu(pdu: &Pdu<'_>, config: &DecoderConfig) {
    let mut out = Vec::new();
    if pdu.encode(&config.negotiated, &mut out).is_ok() {
        let wide = DecoderConfig {
            max_plen: u32::MAX,
            ..*config
        };
        match decode_pdu(&out, &wide) {
            Ok(Decoded::Pdu { pdu: back, consumed }) => {
                assert_eq!(&back, pdu);
                assert_eq!(consumed, out.len());
            }
            other => panic!("re-encoded PDU does not decode: {other:?}"),
        }
    }
    if let Pdu::CapsuleCmd(cmd) = pdu {
        for queue in [QueueType::Admin, QueueType::Io] {
            let _ = parse_command(&cmd.sqe, queue);
        }
        let _ = parse_fabrics(&cmd.sqe);
        let _ = cmd.sqe.sgl().kind();
        assert_eq!(Sqe::from_bytes(&cmd.sqe.to_bytes()), cmd.sqe);
        if let Ok(d) = ConnectData::parse(cmd.data) {
            let bytes = d.to_bytes().expect("parsed connect data re-encodes");
            assert_eq!(ConnectData::parse(&bytes).as_ref(), Ok(&d));
        }
        // In-capsule data as an Authentication Send message: a parsed one
        // re-encodes to bytes that parse to the same message.
        if let Ok(m) = auth::HostMessage::parse(cmd.data) {
            let mut bytes = Vec::new();
            m.encode(&mut bytes);
            assert_eq!(auth::HostMessage::parse(&bytes).as_ref(), Ok(&m));
        }
        if let Ok(text) = std::str::from_utf8(cmd.data) {
            let _ = auth::DhchapSecret::parse(text);
        }
        let ranges = (cmd.sqe.cdw10 & 0xff) as u16 + 1;
        if let Ok(iter) = parse_dsm_ranges(cmd.data, ranges) {
            assert_eq!(iter.count(), usize::from(ranges));
        }
    }
}

fn check_error(err: &PduError, rest: &[u8]) {
    let _ = err.to_string();
    let Some(fes) = err.fes() else {
        return;
    };
    let error_data = term_req_error_data(rest);
    assert!(error_data.len() <= 128);
    let mut out = Vec::new();
    TermReq::new(fes, err.fei(), error_data).encode(PduType::C2HTermReq, &mut out);
    match decode_pdu(&out, &DecoderConfig::host(u32::MAX)) {
        Ok(Decoded::Pdu {
            pdu: Pdu::C2HTermReq(t),
            consumed,
        }) => {
            assert_eq!(consumed, out.len());
            assert_eq!(t.error_data, error_data);
            assert_eq!(Fes::from_code(t.fes), Some(fes));
        }
        other => panic!("termination request does not decode: {other:?}"),
    }
}

fn structures(bytes: &[u8]) {
    if let Ok(sqe) = Sqe::parse(bytes) {
        assert_eq!(&sqe.to_bytes()[..], &bytes[..64]);
    }
    if let Ok(cqe) = Cqe::parse(bytes) {
        assert_eq!(&cqe.to_bytes()[..], &bytes[..16]);
    }
    if let Ok(log) = DiscoveryLog::parse(bytes) {
        let mut out = Vec::new();
        // Entries with non-ASCII addresses parse lossily and may not
        // re-encode; those that do are stable.
        if log.encode(&mut out).is_ok() {
            assert_eq!(DiscoveryLog::parse(&out).as_ref(), Ok(&log));
        }
    }
}
