//! PDUs against byte vectors written out by hand from the NVMe/TCP
//! transport specification's figures (and cross-checked with what Linux's
//! nvme-tcp host sends), in both directions.

use basalt_nvme_wire::decoder::max_plen_for_data;
use basalt_nvme_wire::fabrics::{Connect, ConnectData, CNTLID_DYNAMIC};
use basalt_nvme_wire::pdu::{flags, IC_PDU_LEN};
use basalt_nvme_wire::*;

fn hex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s.bytes().filter(u8::is_ascii_hexdigit).collect();
    digits
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap())
        .collect()
}

fn controller(negotiated: Negotiated) -> DecoderConfig {
    DecoderConfig::controller(max_plen_for_data(1 << 20)).with_negotiated(negotiated)
}

fn host(negotiated: Negotiated) -> DecoderConfig {
    DecoderConfig::host(max_plen_for_data(1 << 20)).with_negotiated(negotiated)
}

fn decode_all<'a>(bytes: &'a [u8], config: &DecoderConfig) -> Pdu<'a> {
    match decode_pdu(bytes, config) {
        Ok(Decoded::Pdu { pdu, consumed }) => {
            assert_eq!(consumed, bytes.len());
            pdu
        }
        other => panic!("{other:?}"),
    }
}

/// Every strict prefix asks for more bytes, and never for more than the
/// whole PDU has.
fn assert_prefixes_need_more(bytes: &[u8], config: &DecoderConfig) {
    for cut in 0..bytes.len() {
        match decode_pdu(&bytes[..cut], config) {
            Ok(Decoded::NeedMore(n)) => assert!(n > 0 && cut + n <= bytes.len(), "cut {cut}: {n}"),
            other => panic!("prefix of {cut} bytes: {other:?}"),
        }
    }
}

fn digests(header: bool, data: bool) -> Negotiated {
    Negotiated {
        digests: Digests { header, data },
        ..Negotiated::INITIAL
    }
}

fn ic_req_bytes(hpda: u8, dgst: u8) -> Vec<u8> {
    let mut b = hex("00 00 80 00 80000000 0000");
    b.push(hpda);
    b.push(dgst);
    b.extend_from_slice(&hex("00000000"));
    b.resize(IC_PDU_LEN, 0);
    b
}

#[test]
fn ic_req_from_a_linux_host() {
    // Linux: PFV 0, HPDA 0, both digests requested, MAXR2T 0.
    let bytes = ic_req_bytes(0, 0x03);
    let config = controller(Negotiated::INITIAL);
    let pdu = decode_all(&bytes, &config);
    let expected = IcReq {
        pfv: 0,
        hpda: 0,
        digests: Digests::BOTH,
        maxr2t: 0,
    };
    assert_eq!(pdu, Pdu::IcReq(expected));
    let mut out = Vec::new();
    expected.encode(&mut out);
    assert_eq!(out, bytes);
    assert_prefixes_need_more(&bytes, &config);
}

#[test]
fn ic_req_field_errors() {
    let config = controller(Negotiated::INITIAL);
    let mut bad_pfv = ic_req_bytes(0, 0);
    bad_pfv[8] = 1;
    let err = decode_pdu(&bad_pfv, &config).unwrap_err();
    assert_eq!((err.fes(), err.fei()), (Some(Fes::InvalidHeaderField), 8));
    let err = decode_pdu(&ic_req_bytes(32, 0), &config).unwrap_err();
    assert_eq!((err.fes(), err.fei()), (Some(Fes::InvalidHeaderField), 10));
    let mut long = ic_req_bytes(0, 0);
    long[4] = 129;
    long.push(0);
    let err = decode_pdu(&long, &config).unwrap_err();
    assert_eq!(err.fei(), 4);
}

#[test]
fn ic_resp_bytes() {
    let resp = IcResp {
        pfv: 0,
        cpda: 0,
        digests: Digests {
            header: true,
            data: false,
        },
        maxh2cdata: 0x0040_0000,
    };
    let mut out = Vec::new();
    resp.encode(&mut out);
    let mut expected = hex("01 00 80 00 80000000 0000 00 01 00004000");
    expected.resize(128, 0);
    assert_eq!(out, expected);
    assert_eq!(
        decode_all(&out, &host(Negotiated::INITIAL)),
        Pdu::IcResp(resp)
    );
    // MAXH2CDATA below 4096 is refused (Linux hosts do the same).
    let mut small = out.clone();
    small[12..16].copy_from_slice(&2048u32.to_le_bytes());
    assert_eq!(
        decode_pdu(&small, &host(Negotiated::INITIAL))
            .unwrap_err()
            .fei(),
        12
    );
}

fn connect_capsule() -> (Sqe, [u8; 1024]) {
    let mut sqe = Connect {
        recfmt: 0,
        qid: 0,
        sqsize: 31,
        cattr: 0,
        kato: 5000,
    }
    .to_sqe(0);
    sqe.set_sgl(&SglDescriptor::in_capsule(0, 1024));
    let data = ConnectData {
        hostid: [7; 16],
        cntlid: CNTLID_DYNAMIC,
        subnqn: "nqn.2014-08.org.nvmexpress.discovery".into(),
        hostnqn: "nqn.2014-08.org.nvmexpress:uuid:0".into(),
    }
    .to_bytes()
    .unwrap();
    (sqe, data)
}

#[test]
fn capsule_cmd_without_digests() {
    let (sqe, data) = connect_capsule();
    let mut bytes = hex("04 00 48 48 48040000"); // hlen 72, pdo 72, plen 1096
    bytes.extend_from_slice(&sqe.to_bytes());
    bytes.extend_from_slice(&data);
    let config = controller(Negotiated::INITIAL);
    let Pdu::CapsuleCmd(cmd) = decode_all(&bytes, &config) else {
        panic!("not a capsule");
    };
    assert_eq!(cmd.sqe, sqe);
    assert_eq!(cmd.data, &data[..]);
    assert_eq!(cmd.sqe.sgl().kind(), SglKind::InCapsule);
    let mut out = Vec::new();
    cmd.encode(&Negotiated::INITIAL, &mut out).unwrap();
    assert_eq!(out, bytes);
    assert_prefixes_need_more(&bytes, &config);
}

#[test]
fn capsule_cmd_with_digests() {
    let (sqe, data) = connect_capsule();
    let negotiated = digests(true, true);
    // flags HDGSTF|DDGSTF, hlen 72, pdo 76, plen 76 + 1024 + 4 = 1104.
    let mut bytes = hex("04 03 48 4c 50040000");
    bytes.extend_from_slice(&sqe.to_bytes());
    let hdgst = digest::crc32c(&bytes);
    bytes.extend_from_slice(&hdgst.to_le_bytes());
    bytes.extend_from_slice(&data);
    bytes.extend_from_slice(&digest::crc32c(&data).to_le_bytes());
    let config = controller(negotiated);
    let pdu = decode_all(&bytes, &config);
    let mut out = Vec::new();
    pdu.encode(&negotiated, &mut out).unwrap();
    assert_eq!(out, bytes);
    assert_prefixes_need_more(&bytes, &config);

    // A corrupted header is a fatal header digest error ...
    let mut bad = bytes.clone();
    bad[20] ^= 1;
    let err = decode_pdu(&bad, &config).unwrap_err();
    assert_eq!(err.fes(), Some(Fes::HeaderDigestError));
    assert!(matches!(err, PduError::HeaderDigest { received, .. } if received == hdgst));
    // ... and it is caught as soon as the header is complete.
    assert!(decode_pdu(&bad[..76], &config).is_err());

    // Corrupted data is not fatal: the PDU's length and CID are reported.
    let mut bad = bytes.clone();
    bad[500] ^= 0x80;
    let err = decode_pdu(&bad, &config).unwrap_err();
    assert_eq!(err.fes(), None);
    assert!(matches!(
        err,
        PduError::DataDigest {
            command_id: 0,
            consumed: 1104,
            ..
        }
    ));
}

#[test]
fn capsule_cmd_without_data_has_no_data_digest() {
    // A Linux host sends a read command with PDO 0 and only HDGSTF.
    let negotiated = digests(true, true);
    let mut sqe = Sqe::new(0x02, 0x1234);
    sqe.nsid = 1;
    sqe.set_sgl(&SglDescriptor::transport(4096));
    let mut bytes = hex("04 01 48 00 4c000000");
    bytes.extend_from_slice(&sqe.to_bytes());
    let hdgst = digest::crc32c(&bytes);
    bytes.extend_from_slice(&hdgst.to_le_bytes());
    let pdu = decode_all(&bytes, &controller(negotiated));
    assert_eq!(pdu, Pdu::CapsuleCmd(CapsuleCmd { sqe, data: &[] }));
    let mut out = Vec::new();
    pdu.encode(&negotiated, &mut out).unwrap();
    assert_eq!(out, bytes);
}

#[test]
fn capsule_resp_bytes() {
    let cqe = Cqe::new(0x1234, 0, 0x0005, Status::SUCCESS).with_result(0x0001);
    let mut out = Vec::new();
    CapsuleResp { cqe }.encode(&digests(true, false), &mut out);
    let mut expected = hex("05 01 18 00 1c000000 01000000 00000000 0500 0000 3412 0000");
    let hdgst = digest::crc32c(&expected);
    expected.extend_from_slice(&hdgst.to_le_bytes());
    assert_eq!(out, expected);
    assert_eq!(
        decode_all(&out, &host(digests(true, false))),
        Pdu::CapsuleResp(CapsuleResp { cqe })
    );
    // Without header digests the header digest flag must be clear.
    let err = decode_pdu(&out, &host(Negotiated::INITIAL)).unwrap_err();
    assert_eq!((err.fes(), err.fei()), (Some(Fes::InvalidHeaderField), 1));
}

#[test]
fn r2t_bytes() {
    let r2t = R2T {
        cccid: 0x0102,
        ttag: 0x0304,
        r2to: 0x1000,
        r2tl: 0x0002_0000,
    };
    let mut out = Vec::new();
    r2t.encode(&Negotiated::INITIAL, &mut out);
    assert_eq!(
        out,
        hex("09 00 18 00 18000000 0201 0403 00100000 00000200 00000000")
    );
    assert_eq!(decode_all(&out, &host(Negotiated::INITIAL)), Pdu::R2T(r2t));
}

#[test]
fn h2c_data_from_a_linux_host() {
    let negotiated = digests(false, true);
    let data = vec![0x5a; 4096];
    // flags DDGSTF|LAST_PDU, hlen 24, pdo 24, plen 24 + 4096 + 4.
    let mut bytes = hex("06 06 18 18 1c100000 0700 0100 00000000 00100000 00000000");
    bytes.extend_from_slice(&data);
    bytes.extend_from_slice(&digest::crc32c(&data).to_le_bytes());
    let config = controller(negotiated);
    let expected = H2CData {
        cccid: 7,
        ttag: 1,
        datao: 0,
        last: true,
        data: &data,
    };
    assert_eq!(decode_all(&bytes, &config), Pdu::H2CData(expected));
    let mut out = Vec::new();
    expected.encode(&negotiated, &mut out).unwrap();
    assert_eq!(out, bytes);

    // DATAL must match what PLEN leaves for data.
    let mut bad = bytes.clone();
    bad[16] = 1;
    assert_eq!(decode_pdu(&bad, &config).unwrap_err().fei(), 4);
    // The data digest flag must be set when data digests are enabled.
    let mut bad = bytes.clone();
    bad[1] &= !flags::DDGSTF;
    assert_eq!(decode_pdu(&bad, &config).unwrap_err().fei(), 1);
}

#[test]
fn c2h_data_with_alignment_and_digests() {
    // HPDA 31: data starts at byte 128; padding after the header digest.
    let negotiated = Negotiated {
        digests: Digests::BOTH,
        hpda: 31,
        cpda: 0,
    };
    let data = [0u8; 32];
    let header = C2HDataHeader {
        cccid: 9,
        datao: 4096,
        datal: 32,
        last: true,
        success: true,
    };
    let mut out = Vec::new();
    header.encode(&negotiated, &mut out).unwrap();
    assert_eq!(out.len(), 128);
    let mut ch = hex("07 0f 18 80 a4000000 0900 0000 00100000 20000000 00000000");
    let hdgst = digest::crc32c(&ch);
    ch.extend_from_slice(&hdgst.to_le_bytes());
    assert_eq!(out[..28], ch[..]);
    assert!(out[28..].iter().all(|&b| b == 0));
    assert_eq!(header.pdu_len(&negotiated), 0xa4);
    out.extend_from_slice(&data);
    let mut dd = DataDigest::new();
    dd.update(&data);
    // The CRC32C of 32 zero bytes (RFC 3720, B.4) is 0x8a9136aa, sent
    // little-endian.
    assert_eq!(dd.to_bytes(), [0xaa, 0x36, 0x91, 0x8a]);
    out.extend_from_slice(&dd.to_bytes());
    let config = host(negotiated);
    assert_eq!(
        decode_all(&out, &config),
        Pdu::C2HData(C2HData {
            cccid: 9,
            datao: 4096,
            last: true,
            success: true,
            data: &data,
        })
    );
    assert_prefixes_need_more(&out, &config);

    // A PDO that ignores the alignment is refused.
    let mut unaligned = Vec::new();
    header.encode(&digests(true, true), &mut unaligned).unwrap();
    unaligned.extend_from_slice(&data);
    unaligned.extend_from_slice(&dd.to_bytes());
    let err = decode_pdu(&unaligned, &config).unwrap_err();
    assert_eq!((err.fes(), err.fei()), (Some(Fes::InvalidHeaderField), 3));
}

#[test]
fn c2h_term_req_bytes() {
    let offending = ic_req_bytes(0, 0);
    let term = TermReq::new(Fes::InvalidHeaderField, 2, term_req_error_data(&offending));
    let mut out = Vec::new();
    term.encode(PduType::C2HTermReq, &mut out);
    let mut expected = hex("03 00 18 00 98000000 0100 02000000 00000000 00000000 0000");
    expected.extend_from_slice(&offending);
    assert_eq!(out, expected);
    assert_eq!(out.len(), 152);
    assert_eq!(
        decode_all(&out, &host(Negotiated::INITIAL)),
        Pdu::C2HTermReq(term)
    );
    // Error data is cut to 128 bytes.
    let long = [1u8; 200];
    let mut out2 = Vec::new();
    TermReq::new(Fes::PduSequenceError, 0, &long).encode(PduType::C2HTermReq, &mut out2);
    assert_eq!(out2.len(), 152);
}

#[test]
fn h2c_term_req_is_decoded_by_a_controller() {
    let mut out = Vec::new();
    TermReq::new(Fes::HeaderDigestError, 0, &[4, 1, 72, 0, 76, 0, 0, 0])
        .encode(PduType::H2CTermReq, &mut out);
    assert_eq!(out[0], 0x02);
    let Pdu::H2CTermReq(t) = decode_all(&out, &controller(digests(true, true))) else {
        panic!("not a termination request");
    };
    assert_eq!(Fes::from_code(t.fes), Some(Fes::HeaderDigestError));
    assert_eq!(t.error_data.len(), 8);
    // More than 152 bytes is invalid.
    let mut long = out.clone();
    long[4..8].copy_from_slice(&153u32.to_le_bytes());
    long.resize(153, 0);
    assert_eq!(
        decode_pdu(&long, &controller(Negotiated::INITIAL))
            .unwrap_err()
            .fei(),
        4
    );
}

#[test]
fn common_header_errors() {
    let config = controller(Negotiated::INITIAL);
    // Undefined type.
    let err = decode_pdu(&hex("08 00 18 00 18000000"), &config).unwrap_err();
    assert_eq!(err, PduError::UnexpectedPduType { pdu_type: 8 });
    assert_eq!((err.fes(), err.fei()), (Some(Fes::InvalidHeaderField), 0));
    // A controller never receives an R2T.
    let err = decode_pdu(&hex("09 00 18 00 18000000"), &config).unwrap_err();
    assert_eq!(err.fei(), 0);
    // Wrong HLEN for a CapsuleCmd, caught from the common header alone.
    let err = decode_pdu(&hex("04 00 40 00 48000000"), &config).unwrap_err();
    assert_eq!((err.fes(), err.fei()), (Some(Fes::InvalidHeaderField), 2));
    // PLEN shorter than HLEN.
    let mut b = hex("04 00 48 00 40000000");
    b.resize(72, 0);
    let err = decode_pdu(&b, &config).unwrap_err();
    assert_eq!(err.fei(), 4);
    // PLEN over the limit: refused before the data is awaited.
    let mut b = hex("04 00 48 48 00001000");
    b.resize(72, 0);
    let err = decode_pdu(&b, &DecoderConfig::controller(8192 + 72)).unwrap_err();
    assert_eq!(err.fes(), Some(Fes::DataTransferLimitExceeded));
    // PDO pointing into the header.
    let mut b = hex("04 00 48 40 50000000");
    b.resize(72, 0);
    let err = decode_pdu(&b, &config).unwrap_err();
    assert_eq!(err.fei(), 3);
    // DDGSTF without negotiated data digests.
    let mut b = hex("04 02 48 48 50000000");
    b.resize(72, 0);
    assert_eq!(decode_pdu(&b, &config).unwrap_err().fei(), 1);
    // SUCCESS without LAST_PDU on C2HData.
    let mut b = hex("07 08 18 18 1c000000 0100 0000 00000000 04000000 00000000");
    b.extend_from_slice(&[0; 4]);
    assert_eq!(
        decode_pdu(&b, &host(Negotiated::INITIAL))
            .unwrap_err()
            .fei(),
        1
    );
}

#[test]
fn error_data_for_term_req() {
    let bytes = hex("04 00 30 00 48000000 00");
    assert_eq!(term_req_error_data(&bytes).len(), 9);
    let long = [0x04, 0, 72, 0, 0, 0, 0, 0].repeat(20);
    assert_eq!(term_req_error_data(&long).len(), 72);
    let ic = [0u8; 200];
    // HLEN 0 still echoes the common header.
    assert_eq!(term_req_error_data(&ic).len(), 8);
    assert_eq!(term_req_error_data(&[1, 2]).len(), 2);
}
