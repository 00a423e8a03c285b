//! PDUs against byte vectors written out by hand from the RFC 7143 §11
//! figures (and RFC 3720 appendix B.4 for the READ(10) command and its
//! CRC), in both directions: the bytes decode to the expected value, the
//! value encodes to the same bytes, and every strict prefix asks for more.

use basalt_iscsi_wire::decoder::{
    decode_initiator, decode_target, Decoded, DecoderConfig, PduError,
};
use basalt_iscsi_wire::digest::Digests;
use basalt_iscsi_wire::pdu::*;

fn hex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s.bytes().filter(u8::is_ascii_hexdigit).collect();
    digits
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap())
        .collect()
}

fn cfg(digests: Digests) -> DecoderConfig {
    DecoderConfig {
        digests,
        max_data_segment: 65536,
    }
}

fn decode_i(bytes: &[u8], cfg: &DecoderConfig) -> (InitiatorPdu, Vec<u8>) {
    for cut in 0..bytes.len() {
        match decode_initiator(&bytes[..cut], cfg) {
            Ok(Decoded::NeedMore(n)) => assert!(n > 0 && cut + n <= bytes.len(), "cut {cut}: {n}"),
            other => panic!("prefix of {cut} bytes: {other:?}"),
        }
    }
    match decode_initiator(bytes, cfg) {
        Ok(Decoded::Pdu {
            pdu,
            data,
            consumed,
        }) => {
            assert_eq!(consumed, bytes.len());
            (pdu, bytes[data].to_vec())
        }
        other => panic!("{other:?}"),
    }
}

fn decode_t(bytes: &[u8], cfg: &DecoderConfig) -> (TargetPdu, Vec<u8>) {
    for cut in 0..bytes.len() {
        match decode_target(&bytes[..cut], cfg) {
            Ok(Decoded::NeedMore(n)) => assert!(n > 0 && cut + n <= bytes.len(), "cut {cut}: {n}"),
            other => panic!("prefix of {cut} bytes: {other:?}"),
        }
    }
    match decode_target(bytes, cfg) {
        Ok(Decoded::Pdu {
            pdu,
            data,
            consumed,
        }) => {
            assert_eq!(consumed, bytes.len());
            (pdu, bytes[data].to_vec())
        }
        other => panic!("{other:?}"),
    }
}

fn encode_i(pdu: &InitiatorPdu, data: &[u8], digests: Digests) -> Vec<u8> {
    let mut out = Vec::new();
    pdu.encode(data, digests, &mut out).unwrap();
    out
}

fn encode_t(pdu: &TargetPdu, data: &[u8], digests: Digests) -> Vec<u8> {
    let mut out = Vec::new();
    pdu.encode(data, digests, &mut out).unwrap();
    out
}

const LOGIN_TEXT: &[u8] = b"InitiatorName=iqn.2004-10.com.ubuntu:01:5e2f7c1d9a3b\0\
SessionType=Normal\0TargetName=iqn.2024-01.io.basalt:vol1\0AuthMethod=None\0";

/// The first Login Request of an initiator that skips authentication:
/// T=1, CSG=0 (security), NSG=1 (operational), a random-format ISID
/// (type 0x80), TSIH 0 (new session), 126 bytes of text padded by 2.
#[test]
fn login_request() {
    assert_eq!(LOGIN_TEXT.len(), 126);
    let mut bytes = hex("43 81 00 00  00 00 00 7e
         80 12 34 56 00 01 00 00
         00 00 00 00  00 00 00 00  00 00 00 01  00 00 00 00
         00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00");
    bytes.extend_from_slice(LOGIN_TEXT);
    bytes.extend_from_slice(&[0, 0]);
    let expected = LoginRequest {
        transit: true,
        cont: false,
        csg: LoginStage::SecurityNegotiation,
        nsg: LoginStage::OperationalNegotiation,
        version_max: 0,
        version_min: 0,
        isid: [0x80, 0x12, 0x34, 0x56, 0x00, 0x01],
        tsih: 0,
        itt: 0,
        cid: 0,
        cmd_sn: 1,
        exp_stat_sn: 0,
    };
    let (pdu, data) = decode_i(&bytes, &DecoderConfig::LOGIN);
    assert_eq!(pdu, InitiatorPdu::LoginRequest(expected));
    assert_eq!(data, LOGIN_TEXT);
    assert_eq!(encode_i(&pdu, LOGIN_TEXT, Digests::NONE), bytes);
    assert!(pdu.immediate());
}

/// The Login Response that moves to full feature phase: T=1, CSG=1,
/// NSG=3, TSIH assigned, status success.
#[test]
fn login_response() {
    let bytes = hex("23 87 00 00  00 00 00 00
         80 12 34 56 00 01 00 05
         00 00 00 00  00 00 00 00  00 00 00 01  00 00 00 02
         00 00 00 11  00 00 00 00 00 00 00 00 00 00 00 00");
    let expected = LoginResponse {
        transit: true,
        cont: false,
        csg: LoginStage::OperationalNegotiation,
        nsg: LoginStage::FullFeaturePhase,
        version_max: 0,
        version_active: 0,
        isid: [0x80, 0x12, 0x34, 0x56, 0x00, 0x01],
        tsih: 5,
        itt: 0,
        stat_sn: 1,
        exp_cmd_sn: 2,
        max_cmd_sn: 0x11,
        status_class: login_status_class::SUCCESS,
        status_detail: 0,
    };
    let (pdu, data) = decode_t(&bytes, &DecoderConfig::LOGIN);
    assert_eq!(pdu, TargetPdu::LoginResponse(expected));
    assert!(data.is_empty());
    assert_eq!(encode_t(&pdu, &[], Digests::NONE), bytes);
}

/// RFC 3720 appendix B.4: "An iSCSI - SCSI Read (10) Command PDU", with
/// the header digest the RFC lists for it (CRC 56 3a 96 d9).
#[test]
fn scsi_command_read10() {
    let bhs = hex("01 c0 00 00  00 00 00 00  00 00 00 00  00 00 00 00
         14 00 00 00  00 00 04 00  00 00 00 14  00 00 00 18
         28 00 00 00  00 00 00 00  02 00 00 00  00 00 00 00");
    let mut cdb = [0u8; 16];
    cdb[0] = 0x28;
    cdb[8] = 0x02;
    let expected = ScsiCommand {
        immediate: false,
        final_pdu: true,
        read: true,
        write: false,
        attr: TaskAttribute::Untagged,
        lun: 0,
        itt: 0x1400_0000,
        expected_data_transfer_length: 1024,
        cmd_sn: 0x14,
        exp_stat_sn: 0x18,
        bhs_cdb: cdb,
        extended_cdb: Vec::new(),
        bidi_read_expected_data_transfer_length: None,
    };
    let (pdu, _) = decode_i(&bhs, &cfg(Digests::NONE));
    assert_eq!(pdu, InitiatorPdu::ScsiCommand(expected.clone()));
    assert_eq!(encode_i(&pdu, &[], Digests::NONE), bhs);
    assert_eq!(&*expected.cdb(), &cdb[..]);

    let mut with_digest = bhs.clone();
    with_digest.extend_from_slice(&[0x56, 0x3a, 0x96, 0xd9]);
    let (pdu2, _) = decode_i(&with_digest, &cfg(Digests::BOTH));
    assert_eq!(pdu2, pdu);
    assert_eq!(encode_i(&pdu, &[], Digests::BOTH), with_digest);
    let mut corrupt = with_digest.clone();
    corrupt[51] ^= 0x80;
    assert!(matches!(
        decode_initiator(&corrupt, &cfg(Digests::BOTH)),
        Err(PduError::HeaderDigest {
            computed: 0xd996_3a56,
            ..
        })
    ));
}

/// A WRITE(32)-sized CDB (32 bytes) and a bidirectional command: the
/// extended CDB AHS (AHSLength 32 - 15 = 17, type 1) and the bidirectional
/// read length AHS (AHSLength 5, type 2), TotalAHSLength 7 words.
#[test]
fn scsi_command_extended_cdb() {
    let bytes = hex("41 e1 00 00  07 00 00 00  00 00 00 00  00 00 00 00
         00 00 00 07  00 00 10 00  00 00 00 09  00 00 00 03
         7f 00 00 00  00 00 00 00  00 00 00 00  00 00 00 18
         00 11 01 00  10 11 12 13  14 15 16 17  18 19 1a 1b
         1c 1d 1e 1f  00 05 02 00  00 00 20 00");
    let mut bhs_cdb = [0u8; 16];
    bhs_cdb[0] = 0x7f;
    bhs_cdb[15] = 0x18;
    let expected = ScsiCommand {
        immediate: true,
        final_pdu: true,
        read: true,
        write: true,
        attr: TaskAttribute::Simple,
        lun: 0,
        itt: 7,
        expected_data_transfer_length: 0x1000,
        cmd_sn: 9,
        exp_stat_sn: 3,
        bhs_cdb,
        extended_cdb: (0x10..0x20).collect(),
        bidi_read_expected_data_transfer_length: Some(0x2000),
    };
    let (pdu, _) = decode_i(&bytes, &cfg(Digests::NONE));
    assert_eq!(pdu, InitiatorPdu::ScsiCommand(expected.clone()));
    assert_eq!(encode_i(&pdu, &[], Digests::NONE), bytes);
    assert_eq!(expected.cdb().len(), 32);
    assert_eq!(expected.cdb()[16..], (0x10..0x20).collect::<Vec<u8>>()[..]);
    // The header digest covers the AHSs too.
    let digested = encode_i(&pdu, &[], Digests::BOTH);
    assert_eq!(digested.len(), bytes.len() + 4);
    assert_eq!(
        digested[bytes.len()..],
        basalt_iscsi_wire::digest::crc32c(&bytes).to_le_bytes()
    );
}

/// The last Data-In of a READ with phase collapse: F and S set, status
/// GOOD, no residual; and a short read with U set and a residual.
#[test]
fn data_in_with_status() {
    let payload: Vec<u8> = (0..=255u8).cycle().take(512).collect();
    let mut bytes = hex("25 81 00 00  00 00 02 00  00 00 00 00  00 00 00 00
         14 00 00 00  ff ff ff ff  00 00 00 18  00 00 00 15
         00 00 00 34  00 00 00 01  00 00 02 00  00 00 00 00");
    bytes.extend_from_slice(&payload);
    let expected = DataIn {
        final_pdu: true,
        ack: false,
        status: Some(DataInStatus {
            status: 0x00,
            stat_sn: 0x18,
            residual: Residual::None,
        }),
        lun: 0,
        itt: 0x1400_0000,
        ttt: RESERVED_TAG,
        exp_cmd_sn: 0x15,
        max_cmd_sn: 0x34,
        data_sn: 1,
        buffer_offset: 0x200,
    };
    let (pdu, data) = decode_t(&bytes, &cfg(Digests::NONE));
    assert_eq!(pdu, TargetPdu::DataIn(expected));
    assert_eq!(data, payload);
    assert_eq!(encode_t(&pdu, &payload, Digests::NONE), bytes);

    // Header only, as the target sends it before its own read buffer.
    let mut header = Vec::new();
    pdu.encode_header(512, Digests::NONE, &mut header).unwrap();
    assert_eq!(header, bytes[..48]);

    let short = hex("25 83 00 00  00 00 00 00  00 00 00 00  00 00 00 00
         00 00 00 2a  ff ff ff ff  00 00 00 19  00 00 00 16
         00 00 00 35  00 00 00 00  00 00 00 00  00 00 02 00");
    let (pdu, _) = decode_t(&short, &cfg(Digests::NONE));
    match &pdu {
        TargetPdu::DataIn(d) => {
            assert_eq!(
                d.status,
                Some(DataInStatus {
                    status: 0,
                    stat_sn: 0x19,
                    residual: Residual::Underflow(0x200),
                })
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(encode_t(&pdu, &[], Digests::NONE), short);

    // Without S, status, StatSN and residual are reserved: ignored.
    let mut no_status = short.clone();
    no_status[1] = 0x00;
    let (pdu, _) = decode_t(&no_status, &cfg(Digests::NONE));
    match pdu {
        TargetPdu::DataIn(d) => assert_eq!((d.status, d.final_pdu), (None, false)),
        other => panic!("{other:?}"),
    }

    // O and U together: a protocol error.
    let mut both = short.clone();
    both[1] = 0x87;
    assert!(matches!(
        decode_target(&both, &cfg(Digests::NONE)),
        Err(PduError::InvalidField { offset: 1, .. })
    ));
}

/// R2T for LUN 1: R2TSN 0, 256 KiB wanted at offset 64 KiB.
#[test]
fn ready_to_transfer() {
    let bytes = hex("31 80 00 00  00 00 00 00  00 01 00 00  00 00 00 00
         00 00 00 2a  00 00 10 01  00 00 00 19  00 00 00 16
         00 00 00 35  00 00 00 00  00 01 00 00  00 04 00 00");
    let expected = ReadyToTransfer {
        lun: 0x0001_0000_0000_0000,
        itt: 0x2a,
        ttt: 0x1001,
        stat_sn: 0x19,
        exp_cmd_sn: 0x16,
        max_cmd_sn: 0x35,
        r2t_sn: 0,
        buffer_offset: 0x1_0000,
        desired_data_transfer_length: 0x4_0000,
    };
    let (pdu, _) = decode_t(&bytes, &cfg(Digests::NONE));
    assert_eq!(pdu, TargetPdu::ReadyToTransfer(expected));
    assert_eq!(encode_t(&pdu, &[], Digests::NONE), bytes);
}

/// The Data-Out answering that R2T, with both digests.
#[test]
fn data_out_with_digests() {
    let payload = b"0123456789";
    let pdu = InitiatorPdu::DataOut(DataOut {
        final_pdu: true,
        lun: 0x0001_0000_0000_0000,
        itt: 0x2a,
        ttt: 0x1001,
        exp_stat_sn: 0x1a,
        data_sn: 0,
        buffer_offset: 0x1_0000,
    });
    let bhs = hex("05 80 00 00  00 00 00 0a  00 01 00 00  00 00 00 00
         00 00 00 2a  00 00 10 01  00 00 00 00  00 00 00 1a
         00 00 00 00  00 00 00 00  00 01 00 00  00 00 00 00");
    let mut bytes = bhs.clone();
    bytes.extend_from_slice(&basalt_iscsi_wire::digest::crc32c(&bhs).to_le_bytes());
    bytes.extend_from_slice(payload);
    bytes.extend_from_slice(&[0, 0]);
    bytes.extend_from_slice(&basalt_iscsi_wire::digest::crc32c(b"0123456789\0\0").to_le_bytes());
    let (decoded, data) = decode_i(&bytes, &cfg(Digests::BOTH));
    assert_eq!(decoded, pdu);
    assert_eq!(data, payload);
    assert_eq!(encode_i(&pdu, payload, Digests::BOTH), bytes);
}

/// Reject "Command not supported" of a vendor-specific opcode (0x1c): the
/// decoder's error gives the reason and the BHS that make this PDU.
#[test]
fn reject_of_an_unknown_opcode() {
    let rejected = hex("1c 80 00 00  00 00 00 00  00 00 00 00  00 00 00 00
         00 00 00 33  ff ff ff ff  00 00 00 17  00 00 00 1a
         00 00 00 00  00 00 00 00  00 00 00 00  00 00 00 00");
    let err = decode_initiator(&rejected, &cfg(Digests::NONE)).unwrap_err();
    assert_eq!(err.skip_len(), Some(48));
    assert!(!err.closes_connection());
    let reject = err.reject(0x19, 0x17, 0x36).unwrap();

    let mut bytes = hex("3f 80 05 00  00 00 00 30  00 00 00 00  00 00 00 00
         ff ff ff ff  00 00 00 00  00 00 00 19  00 00 00 17
         00 00 00 36  00 00 00 00  00 00 00 00  00 00 00 00");
    bytes.extend_from_slice(&rejected);
    let pdu = TargetPdu::Reject(reject);
    assert_eq!(
        encode_t(&pdu, err.rejected_bhs().unwrap(), Digests::NONE),
        bytes
    );
    let (decoded, data) = decode_t(&bytes, &cfg(Digests::NONE));
    assert_eq!(decoded, pdu);
    assert_eq!(data, rejected);
    match decoded {
        TargetPdu::Reject(r) => assert_eq!(r.reason, RejectReason::CommandNotSupported),
        other => panic!("{other:?}"),
    }
}

/// SCSI Response CHECK CONDITION with fixed-format sense data (ILLEGAL
/// REQUEST, INVALID FIELD IN CDB) behind its 2-byte SenseLength.
#[test]
fn scsi_response_check_condition() {
    let mut bytes = hex("21 80 00 02  00 00 00 14  00 00 00 00  00 00 00 00
         00 00 00 2a  00 00 00 00  00 00 00 1a  00 00 00 17
         00 00 00 36  00 00 00 00  00 00 00 00  00 00 00 00");
    let sense = hex("00 12  70 00 05 00 00 00 00 0a 00 00 00 00 24 00 00 00 00 00");
    bytes.extend_from_slice(&sense);
    let expected = ScsiResponse {
        bidi_read_residual: Residual::None,
        residual: Residual::None,
        response: scsi_response::COMMAND_COMPLETED,
        status: 0x02,
        itt: 0x2a,
        snack_tag: 0,
        stat_sn: 0x1a,
        exp_cmd_sn: 0x17,
        max_cmd_sn: 0x36,
        exp_data_sn: 0,
    };
    let (pdu, data) = decode_t(&bytes, &cfg(Digests::NONE));
    assert_eq!(pdu, TargetPdu::ScsiResponse(expected));
    assert_eq!(data, sense);
    assert_eq!(encode_t(&pdu, &sense, Digests::NONE), bytes);

    // Residual underflow (U, 0x02) of 0x400 bytes, reserved bit 0 set by a
    // sloppy sender: ignored.
    let mut under = bytes[..48].to_vec();
    under[1] = 0x83;
    under[7] = 0;
    under[44..48].copy_from_slice(&[0, 0, 4, 0]);
    let (pdu, _) = decode_t(&under, &cfg(Digests::NONE));
    match &pdu {
        TargetPdu::ScsiResponse(r) => assert_eq!(r.residual, Residual::Underflow(0x400)),
        other => panic!("{other:?}"),
    }
    under[1] = 0x82;
    assert_eq!(encode_t(&pdu, &[], Digests::NONE), under);
}

/// NOP-Out ping with data and the NOP-In echoing it.
#[test]
fn nop_ping() {
    let mut out_bytes = hex("40 80 00 00  00 00 00 08  00 00 00 00  00 00 00 00
         00 00 00 05  ff ff ff ff  00 00 00 02  00 00 00 01
         00 00 00 00  00 00 00 00  00 00 00 00  00 00 00 00");
    out_bytes.extend_from_slice(b"nopping\0");
    let (pdu, data) = decode_i(&out_bytes, &cfg(Digests::NONE));
    assert_eq!(
        pdu,
        InitiatorPdu::NopOut(NopOut {
            immediate: true,
            lun: 0,
            itt: 5,
            ttt: RESERVED_TAG,
            cmd_sn: 2,
            exp_stat_sn: 1,
        })
    );
    assert_eq!(data, b"nopping\0");
    assert_eq!(encode_i(&pdu, &data, Digests::NONE), out_bytes);

    let mut in_bytes = hex("20 80 00 00  00 00 00 08  00 00 00 00  00 00 00 00
         00 00 00 05  ff ff ff ff  00 00 00 01  00 00 00 02
         00 00 00 21  00 00 00 00  00 00 00 00  00 00 00 00");
    in_bytes.extend_from_slice(b"nopping\0");
    let (pdu, data) = decode_t(&in_bytes, &cfg(Digests::NONE));
    assert_eq!(
        pdu,
        TargetPdu::NopIn(NopIn {
            lun: 0,
            itt: 5,
            ttt: RESERVED_TAG,
            stat_sn: 1,
            exp_cmd_sn: 2,
            max_cmd_sn: 0x21,
        })
    );
    assert_eq!(encode_t(&pdu, &data, Digests::NONE), in_bytes);
}

/// Task management (LUN RESET) and logout (close session) with their
/// responses.
#[test]
fn task_management_and_logout() {
    let tmf = hex("42 85 00 00  00 00 00 00  00 01 00 00  00 00 00 00
         00 00 00 40  ff ff ff ff  00 00 00 30  00 00 00 20
         00 00 00 00  00 00 00 00  00 00 00 00  00 00 00 00");
    let (pdu, _) = decode_i(&tmf, &cfg(Digests::NONE));
    assert_eq!(
        pdu,
        InitiatorPdu::TaskManagementRequest(TaskManagementRequest {
            immediate: true,
            function: TmfFunction::LogicalUnitReset,
            lun: 0x0001_0000_0000_0000,
            itt: 0x40,
            referenced_task_tag: RESERVED_TAG,
            cmd_sn: 0x30,
            exp_stat_sn: 0x20,
            ref_cmd_sn: 0,
            exp_data_sn: 0,
        })
    );
    assert_eq!(encode_i(&pdu, &[], Digests::NONE), tmf);

    let tmf_rsp = hex("22 80 00 00  00 00 00 00  00 00 00 00  00 00 00 00
         00 00 00 40  00 00 00 00  00 00 00 20  00 00 00 31
         00 00 00 50  00 00 00 00  00 00 00 00  00 00 00 00");
    let (pdu, _) = decode_t(&tmf_rsp, &cfg(Digests::NONE));
    assert_eq!(
        pdu,
        TargetPdu::TaskManagementResponse(TaskManagementResponse {
            response: TmfResponse::FunctionComplete,
            itt: 0x40,
            stat_sn: 0x20,
            exp_cmd_sn: 0x31,
            max_cmd_sn: 0x50,
        })
    );
    assert_eq!(encode_t(&pdu, &[], Digests::NONE), tmf_rsp);

    let logout = hex("46 80 00 00  00 00 00 00  00 00 00 00  00 00 00 00
         00 00 00 41  00 00 00 00  00 00 00 31  00 00 00 21
         00 00 00 00  00 00 00 00  00 00 00 00  00 00 00 00");
    let (pdu, _) = decode_i(&logout, &cfg(Digests::NONE));
    assert_eq!(
        pdu,
        InitiatorPdu::LogoutRequest(LogoutRequest {
            immediate: true,
            reason: LogoutReason::CloseSession,
            itt: 0x41,
            cid: 0,
            cmd_sn: 0x31,
            exp_stat_sn: 0x21,
        })
    );
    assert_eq!(encode_i(&pdu, &[], Digests::NONE), logout);

    let logout_rsp = hex("26 80 00 00  00 00 00 00  00 00 00 00  00 00 00 00
         00 00 00 41  00 00 00 00  00 00 00 21  00 00 00 32
         00 00 00 51  00 00 00 00  00 02 00 14  00 00 00 00");
    let (pdu, _) = decode_t(&logout_rsp, &cfg(Digests::NONE));
    assert_eq!(
        pdu,
        TargetPdu::LogoutResponse(LogoutResponse {
            response: LogoutResponseCode::ClosedSuccessfully,
            itt: 0x41,
            stat_sn: 0x21,
            exp_cmd_sn: 0x32,
            max_cmd_sn: 0x51,
            time2wait: 2,
            time2retain: 20,
        })
    );
    assert_eq!(encode_t(&pdu, &[], Digests::NONE), logout_rsp);
}

/// Text Request SendTargets=All and an Asynchronous Message asking for a
/// logout; and a SNACK.
#[test]
fn text_async_snack() {
    let text = b"SendTargets=All\0";
    let mut bytes = hex("44 80 00 00  00 00 00 10  00 00 00 00  00 00 00 00
         00 00 00 01  ff ff ff ff  00 00 00 02  00 00 00 02
         00 00 00 00  00 00 00 00  00 00 00 00  00 00 00 00");
    bytes.extend_from_slice(text);
    let (pdu, data) = decode_i(&bytes, &cfg(Digests::NONE));
    assert_eq!(
        pdu,
        InitiatorPdu::TextRequest(TextRequest {
            immediate: true,
            final_pdu: true,
            cont: false,
            lun: 0,
            itt: 1,
            ttt: RESERVED_TAG,
            cmd_sn: 2,
            exp_stat_sn: 2,
        })
    );
    assert_eq!(data, text);
    assert_eq!(encode_i(&pdu, text, Digests::NONE), bytes);

    let async_msg = hex("32 80 00 00  00 00 00 00  00 00 00 00  00 00 00 00
         ff ff ff ff  00 00 00 00  00 00 00 07  00 00 00 08
         00 00 00 18  01 00 00 00  00 00 00 0a  00 00 00 00");
    let (pdu, _) = decode_t(&async_msg, &cfg(Digests::NONE));
    assert_eq!(
        pdu,
        TargetPdu::AsyncMessage(AsyncMessage {
            lun: 0,
            stat_sn: 7,
            exp_cmd_sn: 8,
            max_cmd_sn: 0x18,
            async_event: AsyncEvent::LogoutRequest,
            async_vcode: 0,
            parameter1: 0,
            parameter2: 0,
            parameter3: 10,
        })
    );
    assert_eq!(encode_t(&pdu, &[], Digests::NONE), async_msg);

    let snack = hex("10 81 00 00  00 00 00 00  00 00 00 00  00 00 00 00
         ff ff ff ff  ff ff ff ff  00 00 00 00  00 00 00 09
         00 00 00 00  00 00 00 00  00 00 00 07  00 00 00 02");
    let (pdu, _) = decode_i(&snack, &cfg(Digests::NONE));
    assert_eq!(
        pdu,
        InitiatorPdu::SnackRequest(SnackRequest {
            snack_type: SnackType::Status,
            lun: 0,
            itt: RESERVED_TAG,
            ttt: RESERVED_TAG,
            exp_stat_sn: 9,
            beg_run: 7,
            run_length: 2,
        })
    );
    assert_eq!(encode_i(&pdu, &[], Digests::NONE), snack);
}

/// Reserved bits and bytes set by the sender are ignored, and encoding
/// writes them as zero.
#[test]
fn reserved_fields_are_ignored() {
    let clean = hex("05 00 00 00  00 00 00 00  00 00 00 00  00 00 00 00
         00 00 00 2a  00 00 10 01  00 00 00 00  00 00 00 1a
         00 00 00 00  00 00 00 01  00 00 02 00  00 00 00 00");
    let mut dirty = clean.clone();
    dirty[0] |= 0xc0; // reserved bit and the (reserved) I bit of Data-Out
    dirty[1] |= 0x7f;
    dirty[2] = 0xaa;
    dirty[3] = 0x55;
    dirty[24..28].copy_from_slice(&[1, 2, 3, 4]);
    dirty[32..36].copy_from_slice(&[5, 6, 7, 8]);
    dirty[44..48].copy_from_slice(&[9, 9, 9, 9]);
    let (a, _) = decode_i(&clean, &cfg(Digests::NONE));
    let (b, _) = decode_i(&dirty, &cfg(Digests::NONE));
    assert_eq!(a, b);
    assert_eq!(encode_i(&b, &[], Digests::NONE), clean);
}
