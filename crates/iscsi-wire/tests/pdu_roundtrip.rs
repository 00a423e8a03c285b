//! Property tests of the PDU codec: every PDU type in both directions
//! decodes back to what was encoded under every digest setting, with its
//! data segment; every split of the bytes asks for more until the PDU is
//! complete; digests catch corruption; and arbitrary bytes under arbitrary
//! configurations never make a decoder panic or claim bytes it was not
//! given.

use basalt_iscsi_wire::decoder::{
    decode_initiator, decode_target, Decoded, DecoderConfig, PduError,
};
use basalt_iscsi_wire::digest::{DataDigest, Digests};
use basalt_iscsi_wire::pdu::*;
use proptest::collection::vec;
use proptest::prelude::*;

fn digests() -> impl Strategy<Value = Digests> {
    (any::<bool>(), any::<bool>()).prop_map(|(header, data)| Digests { header, data })
}

fn residual() -> impl Strategy<Value = Residual> {
    prop_oneof![
        Just(Residual::None),
        any::<u32>().prop_map(Residual::Overflow),
        any::<u32>().prop_map(Residual::Underflow),
    ]
}

fn stage() -> impl Strategy<Value = LoginStage> {
    any::<u8>().prop_map(LoginStage::from_code)
}

fn scsi_command() -> impl Strategy<Value = ScsiCommand> {
    (
        (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()),
        any::<u8>().prop_map(TaskAttribute::from_code),
        (
            any::<u64>(),
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
        ),
        any::<[u8; 16]>(),
        vec(any::<u8>(), 0..=48),
        any::<Option<u32>>(),
    )
        .prop_map(
            |(
                (immediate, final_pdu, read, write),
                attr,
                (lun, itt, edtl, cmd_sn, exp_stat_sn),
                bhs_cdb,
                extended_cdb,
                bidi,
            )| {
                ScsiCommand {
                    immediate,
                    final_pdu,
                    read,
                    write,
                    attr,
                    lun,
                    itt,
                    expected_data_transfer_length: edtl,
                    cmd_sn,
                    exp_stat_sn,
                    bhs_cdb,
                    extended_cdb,
                    bidi_read_expected_data_transfer_length: bidi,
                }
            },
        )
}

fn initiator_pdu() -> impl Strategy<Value = InitiatorPdu> {
    prop_oneof![
        (
            any::<bool>(),
            any::<u64>(),
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
            any::<u32>()
        )
            .prop_map(|(immediate, lun, itt, ttt, cmd_sn, exp_stat_sn)| {
                NopOut {
                    immediate,
                    lun,
                    itt,
                    ttt,
                    cmd_sn,
                    exp_stat_sn,
                }
                .into()
            }),
        scsi_command().prop_map(InitiatorPdu::from),
        (
            any::<bool>(),
            any::<u8>().prop_map(TmfFunction::from_code),
            any::<u64>(),
            any::<[u32; 6]>()
        )
            .prop_map(
                |(
                    immediate,
                    function,
                    lun,
                    [itt, rtt, cmd_sn, exp_stat_sn, ref_cmd_sn, exp_data_sn],
                )| {
                    TaskManagementRequest {
                        immediate,
                        function,
                        lun,
                        itt,
                        referenced_task_tag: rtt,
                        cmd_sn,
                        exp_stat_sn,
                        ref_cmd_sn,
                        exp_data_sn,
                    }
                    .into()
                }
            ),
        (
            (any::<bool>(), any::<bool>(), stage(), stage()),
            (any::<u8>(), any::<u8>(), any::<[u8; 6]>(), any::<u16>()),
            (any::<u32>(), any::<u16>(), any::<u32>(), any::<u32>())
        )
            .prop_map(
                |(
                    (transit, cont, csg, nsg),
                    (version_max, version_min, isid, tsih),
                    (itt, cid, cmd_sn, exp_stat_sn),
                )| {
                    LoginRequest {
                        transit,
                        cont,
                        csg,
                        nsg,
                        version_max,
                        version_min,
                        isid,
                        tsih,
                        itt,
                        cid,
                        cmd_sn,
                        exp_stat_sn,
                    }
                    .into()
                }
            ),
        (any::<[bool; 3]>(), any::<u64>(), any::<[u32; 4]>()).prop_map(
            |([immediate, final_pdu, cont], lun, [itt, ttt, cmd_sn, exp_stat_sn])| {
                TextRequest {
                    immediate,
                    final_pdu,
                    cont,
                    lun,
                    itt,
                    ttt,
                    cmd_sn,
                    exp_stat_sn,
                }
                .into()
            }
        ),
        (any::<bool>(), any::<u64>(), any::<[u32; 5]>()).prop_map(
            |(final_pdu, lun, [itt, ttt, exp_stat_sn, data_sn, buffer_offset])| {
                DataOut {
                    final_pdu,
                    lun,
                    itt,
                    ttt,
                    exp_stat_sn,
                    data_sn,
                    buffer_offset,
                }
                .into()
            }
        ),
        (
            any::<bool>(),
            any::<u8>().prop_map(LogoutReason::from_code),
            any::<u16>(),
            any::<[u32; 3]>()
        )
            .prop_map(|(immediate, reason, cid, [itt, cmd_sn, exp_stat_sn])| {
                LogoutRequest {
                    immediate,
                    reason,
                    itt,
                    cid,
                    cmd_sn,
                    exp_stat_sn,
                }
                .into()
            }),
        (
            any::<u8>().prop_map(SnackType::from_code),
            any::<u64>(),
            any::<[u32; 5]>()
        )
            .prop_map(
                |(snack_type, lun, [itt, ttt, exp_stat_sn, beg_run, run_length])| {
                    SnackRequest {
                        snack_type,
                        lun,
                        itt,
                        ttt,
                        exp_stat_sn,
                        beg_run,
                        run_length,
                    }
                    .into()
                }
            ),
    ]
}

fn target_pdu() -> impl Strategy<Value = TargetPdu> {
    prop_oneof![
        (any::<u64>(), any::<[u32; 5]>()).prop_map(
            |(lun, [itt, ttt, stat_sn, exp_cmd_sn, max_cmd_sn])| {
                NopIn {
                    lun,
                    itt,
                    ttt,
                    stat_sn,
                    exp_cmd_sn,
                    max_cmd_sn,
                }
                .into()
            }
        ),
        (residual(), residual(), any::<[u8; 2]>(), any::<[u32; 6]>()).prop_map(
            |(
                bidi_read_residual,
                residual,
                [response, status],
                [itt, snack_tag, stat_sn, exp_cmd_sn, max_cmd_sn, exp_data_sn],
            )| {
                ScsiResponse {
                    bidi_read_residual,
                    residual,
                    response,
                    status,
                    itt,
                    snack_tag,
                    stat_sn,
                    exp_cmd_sn,
                    max_cmd_sn,
                    exp_data_sn,
                }
                .into()
            }
        ),
        (
            any::<u8>().prop_map(TmfResponse::from_code),
            any::<[u32; 4]>()
        )
            .prop_map(|(response, [itt, stat_sn, exp_cmd_sn, max_cmd_sn])| {
                TaskManagementResponse {
                    response,
                    itt,
                    stat_sn,
                    exp_cmd_sn,
                    max_cmd_sn,
                }
                .into()
            }),
        (
            (any::<bool>(), any::<bool>(), stage(), stage()),
            (any::<u8>(), any::<u8>(), any::<[u8; 6]>(), any::<u16>()),
            any::<[u32; 4]>(),
            any::<[u8; 2]>()
        )
            .prop_map(
                |(
                    (transit, cont, csg, nsg),
                    (version_max, version_active, isid, tsih),
                    [itt, stat_sn, exp_cmd_sn, max_cmd_sn],
                    [status_class, status_detail],
                )| {
                    LoginResponse {
                        transit,
                        cont,
                        csg,
                        nsg,
                        version_max,
                        version_active,
                        isid,
                        tsih,
                        itt,
                        stat_sn,
                        exp_cmd_sn,
                        max_cmd_sn,
                        status_class,
                        status_detail,
                    }
                    .into()
                }
            ),
        (any::<[bool; 2]>(), any::<u64>(), any::<[u32; 5]>()).prop_map(
            |([final_pdu, cont], lun, [itt, ttt, stat_sn, exp_cmd_sn, max_cmd_sn])| {
                TextResponse {
                    final_pdu,
                    cont,
                    lun,
                    itt,
                    ttt,
                    stat_sn,
                    exp_cmd_sn,
                    max_cmd_sn,
                }
                .into()
            }
        ),
        (
            any::<[bool; 2]>(),
            proptest::option::of((any::<u8>(), any::<u32>(), residual())),
            any::<u64>(),
            any::<[u32; 6]>()
        )
            .prop_map(
                |(
                    [final_pdu, ack],
                    status,
                    lun,
                    [itt, ttt, exp_cmd_sn, max_cmd_sn, data_sn, buffer_offset],
                )| {
                    DataIn {
                        final_pdu,
                        ack,
                        status: status.map(|(status, stat_sn, residual)| DataInStatus {
                            status,
                            stat_sn,
                            residual,
                        }),
                        lun,
                        itt,
                        ttt,
                        exp_cmd_sn,
                        max_cmd_sn,
                        data_sn,
                        buffer_offset,
                    }
                    .into()
                }
            ),
        (
            any::<u8>().prop_map(LogoutResponseCode::from_code),
            any::<[u32; 4]>(),
            any::<[u16; 2]>()
        )
            .prop_map(
                |(response, [itt, stat_sn, exp_cmd_sn, max_cmd_sn], [time2wait, time2retain])| {
                    LogoutResponse {
                        response,
                        itt,
                        stat_sn,
                        exp_cmd_sn,
                        max_cmd_sn,
                        time2wait,
                        time2retain,
                    }
                    .into()
                }
            ),
        (any::<u64>(), any::<[u32; 8]>()).prop_map(
            |(lun, [itt, ttt, stat_sn, exp_cmd_sn, max_cmd_sn, r2t_sn, buffer_offset, ddtl])| {
                ReadyToTransfer {
                    lun,
                    itt,
                    ttt,
                    stat_sn,
                    exp_cmd_sn,
                    max_cmd_sn,
                    r2t_sn,
                    buffer_offset,
                    desired_data_transfer_length: ddtl,
                }
                .into()
            }
        ),
        (
            any::<u64>(),
            any::<[u32; 3]>(),
            any::<u8>().prop_map(AsyncEvent::from_code),
            any::<u8>(),
            any::<[u16; 3]>()
        )
            .prop_map(
                |(
                    lun,
                    [stat_sn, exp_cmd_sn, max_cmd_sn],
                    async_event,
                    async_vcode,
                    [p1, p2, p3],
                )| {
                    AsyncMessage {
                        lun,
                        stat_sn,
                        exp_cmd_sn,
                        max_cmd_sn,
                        async_event,
                        async_vcode,
                        parameter1: p1,
                        parameter2: p2,
                        parameter3: p3,
                    }
                    .into()
                }
            ),
        (
            any::<u8>().prop_map(RejectReason::from_code),
            any::<[u32; 4]>()
        )
            .prop_map(|(reason, [stat_sn, exp_cmd_sn, max_cmd_sn, data_sn])| {
                Reject {
                    reason,
                    stat_sn,
                    exp_cmd_sn,
                    max_cmd_sn,
                    data_sn,
                }
                .into()
            }),
    ]
}

fn config(digests: Digests) -> DecoderConfig {
    DecoderConfig {
        digests,
        max_data_segment: 4096,
    }
}

/// Decodes `bytes` whole and at every cut, with `decode`; returns the PDU
/// and its data.
fn check_stream<P: std::fmt::Debug + PartialEq>(
    bytes: &[u8],
    decode: impl Fn(&[u8]) -> Result<Decoded<P>, PduError>,
) -> (P, Vec<u8>) {
    for cut in 0..bytes.len() {
        match decode(&bytes[..cut]) {
            Ok(Decoded::NeedMore(n)) => assert!(n > 0 && cut + n <= bytes.len(), "cut {cut}: {n}"),
            other => panic!("prefix of {cut} bytes: {other:?}"),
        }
    }
    // Bytes of the next PDU after this one are not touched.
    let mut longer = bytes.to_vec();
    longer.extend_from_slice(&[0xee; 7]);
    let whole = decode(bytes).unwrap();
    assert_eq!(decode(&longer).unwrap(), whole);
    match whole {
        Decoded::Pdu {
            pdu,
            data,
            consumed,
        } => {
            assert_eq!(consumed, bytes.len());
            (pdu, bytes[data].to_vec())
        }
        other => panic!("{other:?}"),
    }
}

/// Checks what any decoder result may claim about `buf`.
fn check_bounds<P>(buf: &[u8], result: &Result<Decoded<P>, PduError>) {
    match result {
        Ok(Decoded::NeedMore(n)) => assert!(*n > 0),
        Ok(Decoded::Pdu { data, consumed, .. }) => {
            assert!(*consumed >= BHS_LEN && *consumed <= buf.len());
            assert!(data.start <= data.end && data.end <= *consumed);
        }
        Err(err) => {
            let _ = err.to_string();
            if let PduError::DataDigest { consumed, .. } = err {
                assert!(*consumed <= buf.len());
            }
            assert_eq!(err.closes_connection(), err.skip_len().is_none());
            if let Some(skip) = err.skip_len() {
                assert!(skip >= BHS_LEN);
            }
            if err.reject_reason().is_some() {
                assert_eq!(err.rejected_bhs().map(|b| &b[..]), buf.get(..BHS_LEN));
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn initiator_round_trip(pdu in initiator_pdu(), data in vec(any::<u8>(), 0..64), digests in digests()) {
        let mut bytes = Vec::new();
        pdu.encode(&data, digests, &mut bytes).unwrap();
        let cfg = config(digests);
        let (back, back_data) = check_stream(&bytes, |b| decode_initiator(b, &cfg));
        prop_assert_eq!(&back, &pdu);
        prop_assert_eq!(back_data, data.clone());

        // Header-only encoding plus data, padding and digest sent apart.
        let mut split = Vec::new();
        pdu.encode_header(data.len() as u32, digests, &mut split).unwrap();
        prop_assert_eq!(split.len(), pdu.header_len(digests));
        split.extend_from_slice(&data);
        split.resize(split.len() + data_padding(data.len()), 0);
        if digests.data && !data.is_empty() {
            let mut d = DataDigest::new();
            d.update(&data);
            split.extend_from_slice(&d.finish_bytes());
        }
        prop_assert_eq!(split, bytes);
    }

    #[test]
    fn target_round_trip(pdu in target_pdu(), data in vec(any::<u8>(), 0..64), digests in digests()) {
        let mut bytes = Vec::new();
        pdu.encode(&data, digests, &mut bytes).unwrap();
        let cfg = config(digests);
        let (back, back_data) = check_stream(&bytes, |b| decode_target(b, &cfg));
        prop_assert_eq!(&back, &pdu);
        prop_assert_eq!(back_data, data.clone());
        prop_assert_eq!(&bytes[..BHS_LEN], &pdu.bhs(data.len() as u32).unwrap()[..]);
        prop_assert_eq!(bytes.len(), pdu.header_len(digests) + data.len()
            + data_padding(data.len()) + digests.data_len(data.len()));
    }

    /// With both digests, flipping any bit of a PDU is never accepted.
    #[test]
    fn digests_catch_any_bit_flip(pdu in initiator_pdu(), data in vec(any::<u8>(), 1..32), bit in any::<prop::sample::Index>()) {
        let mut bytes = Vec::new();
        pdu.encode(&data, Digests::BOTH, &mut bytes).unwrap();
        let at = bit.index(bytes.len() * 8);
        bytes[at / 8] ^= 1 << (at % 8);
        let result = decode_initiator(&bytes, &config(Digests::BOTH));
        check_bounds(&bytes, &result);
        prop_assert!(!matches!(result, Ok(Decoded::Pdu { .. })), "{:?}", result);
    }

    /// A data digest error leaves the stream in step: the next PDU decodes.
    #[test]
    fn data_digest_error_skips_the_pdu(pdu in target_pdu(), data in vec(any::<u8>(), 1..32), at in any::<prop::sample::Index>()) {
        let mut bytes = Vec::new();
        pdu.encode(&data, Digests::BOTH, &mut bytes).unwrap();
        let header = pdu.header_len(Digests::BOTH);
        let first_len = bytes.len();
        bytes[header + at.index(data.len())] ^= 0x01;
        pdu.encode(&data, Digests::BOTH, &mut bytes).unwrap();
        let cfg = config(Digests::BOTH);
        let err = decode_target(&bytes, &cfg).unwrap_err();
        prop_assert!(matches!(err, PduError::DataDigest { .. }), "{:?}", err);
        prop_assert_eq!(err.skip_len(), Some(first_len));
        prop_assert_eq!(err.reject_reason(), Some(RejectReason::DataDigestError));
        match decode_target(&bytes[first_len..], &cfg).unwrap() {
            Decoded::Pdu { pdu: next, .. } => prop_assert_eq!(next, pdu),
            other => prop_assert!(false, "{:?}", other),
        }
    }

    #[test]
    fn decoders_never_panic(
        bytes in vec(any::<u8>(), 0..400),
        header in any::<bool>(),
        data in any::<bool>(),
        max in prop_oneof![any::<u32>(), 0u32..512],
    ) {
        let cfg = DecoderConfig { digests: Digests { header, data }, max_data_segment: max };
        check_bounds(&bytes, &decode_initiator(&bytes, &cfg));
        check_bounds(&bytes, &decode_target(&bytes, &cfg));
    }

    /// Arbitrary headers of a known opcode with small lengths: whatever
    /// decodes re-encodes to bytes that decode to the same PDU.
    #[test]
    fn decoded_headers_re_encode(
        mut bhs in any::<[u8; 48]>(),
        opcode in prop::sample::select(vec![0x00u8, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x10,
            0x20, 0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x31, 0x32, 0x3f]),
        ahs in vec(any::<u8>(), 0..24),
    ) {
        bhs[0] = (bhs[0] & 0xc0) | opcode;
        let ahs_words = ahs.len() / 4;
        bhs[4] = ahs_words as u8;
        bhs[5..8].copy_from_slice(&[0, 0, 0]);
        let mut bytes = bhs.to_vec();
        bytes.extend_from_slice(&ahs[..ahs_words * 4]);
        let cfg = DecoderConfig { digests: Digests::NONE, max_data_segment: 0 };
        if let Ok(Decoded::Pdu { pdu, .. }) = decode_initiator(&bytes, &cfg) {
            let mut out = Vec::new();
            pdu.encode(&[], Digests::NONE, &mut out).unwrap();
            match decode_initiator(&out, &cfg) {
                Ok(Decoded::Pdu { pdu: back, consumed, .. }) => {
                    prop_assert_eq!(back, pdu);
                    prop_assert_eq!(consumed, out.len());
                }
                other => prop_assert!(false, "{:?}", other),
            }
        }
        if let Ok(Decoded::Pdu { pdu, .. }) = decode_target(&bytes, &cfg) {
            let mut out = Vec::new();
            pdu.encode(&[], Digests::NONE, &mut out).unwrap();
            match decode_target(&out, &cfg) {
                Ok(Decoded::Pdu { pdu: back, consumed, .. }) => {
                    prop_assert_eq!(back, pdu);
                    prop_assert_eq!(consumed, out.len());
                }
                other => prop_assert!(false, "{:?}", other),
            }
        }
    }
}
