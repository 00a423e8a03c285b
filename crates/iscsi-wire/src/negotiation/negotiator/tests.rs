use super::*;

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn run(
    n: &mut Negotiator,
    list: &[(&str, &str)],
) -> Result<Vec<(String, String)>, NegotiationError> {
    let mut replies = Vec::new();
    n.receive_all(&pairs(list), &mut replies)?;
    Ok(replies)
}

fn reply<'a>(replies: &'a [(String, String)], key: &str) -> Option<&'a str> {
    replies
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// The operational keys libiscsi sends (lib/login.c), with its defaults.
const LIBISCSI: &[(&str, &str)] = &[
    ("HeaderDigest", "None,CRC32C"),
    ("DataDigest", "None"),
    ("InitialR2T", "No"),
    ("ImmediateData", "Yes"),
    ("MaxBurstLength", "262144"),
    ("FirstBurstLength", "262144"),
    ("DefaultTime2Wait", "2"),
    ("DefaultTime2Retain", "0"),
    ("MaxOutstandingR2T", "1"),
    ("ErrorRecoveryLevel", "0"),
    ("IFMarker", "No"),
    ("OFMarker", "No"),
    ("MaxConnections", "1"),
    ("MaxRecvDataSegmentLength", "262144"),
    ("DataPDUInOrder", "Yes"),
    ("DataSequenceInOrder", "Yes"),
];

#[test]
fn libiscsi_offer_is_answered_key_by_key() {
    let mut n = Negotiator::new(TargetLimits::default(), SessionType::Normal);
    let r = run(&mut n, LIBISCSI).unwrap();
    assert_eq!(reply(&r, "HeaderDigest"), Some("None"));
    assert_eq!(reply(&r, "DataDigest"), Some("None"));
    assert_eq!(reply(&r, "InitialR2T"), Some("No"));
    assert_eq!(reply(&r, "ImmediateData"), Some("Yes"));
    assert_eq!(reply(&r, "MaxBurstLength"), Some("262144"));
    assert_eq!(reply(&r, "FirstBurstLength"), Some("262144"));
    assert_eq!(reply(&r, "DefaultTime2Wait"), Some("2"));
    assert_eq!(reply(&r, "DefaultTime2Retain"), Some("0"));
    assert_eq!(reply(&r, "ErrorRecoveryLevel"), Some("0"));
    assert_eq!(reply(&r, "IFMarker"), Some("No"));
    assert_eq!(reply(&r, "OFMarker"), Some("No"));
    assert_eq!(reply(&r, "MaxConnections"), Some("1"));
    // Declarative: no reply.
    assert_eq!(reply(&r, "MaxRecvDataSegmentLength"), None);
    let mut decl = Vec::new();
    n.declare(&mut decl);
    assert_eq!(decl, pairs(&[("MaxRecvDataSegmentLength", "262144")]));
    let (s, c) = n.finish().unwrap();
    assert!(!s.initial_r2t && s.immediate_data);
    assert_eq!(s.max_burst_length, 262144);
    assert_eq!(s.default_time2retain, 0);
    assert_eq!(c.initiator_max_recv_data_segment_length, 262144);
    assert_eq!(c.target_max_recv_data_segment_length, 262144);
}

#[test]
fn digest_picks_first_supported_in_initiator_order() {
    let limits = TargetLimits::default();
    let mut n = Negotiator::new(limits.clone(), SessionType::Normal);
    let r = run(
        &mut n,
        &[
            ("HeaderDigest", "CRC32C,None"),
            ("DataDigest", "None,CRC32C"),
        ],
    )
    .unwrap();
    assert_eq!(reply(&r, "HeaderDigest"), Some("CRC32C"));
    assert_eq!(reply(&r, "DataDigest"), Some("None"));
    let (_, c) = n.finish().unwrap();
    assert_eq!(
        (c.header_digest, c.data_digest),
        (Digest::Crc32c, Digest::None)
    );

    let no_crc = TargetLimits {
        header_digest_crc32c: false,
        data_digest_crc32c: false,
        ..limits
    };
    let mut n = Negotiator::new(no_crc, SessionType::Normal);
    let r = run(
        &mut n,
        &[("HeaderDigest", "CRC32C,None"), ("DataDigest", "CRC32C")],
    )
    .unwrap();
    assert_eq!(reply(&r, "HeaderDigest"), Some("None"));
    assert_eq!(reply(&r, "DataDigest"), Some("Reject"));
    let (_, c) = n.finish().unwrap();
    assert_eq!(c.data_digest, Digest::None);
}

#[test]
fn result_functions() {
    let limits = TargetLimits {
        max_burst_length: 65536,
        first_burst_length: 65536,
        initial_r2t: true,
        immediate_data: false,
        default_time2wait: 5,
        max_connections: 4,
        ..TargetLimits::default()
    };
    let mut n = Negotiator::new(limits, SessionType::Normal);
    let r = run(
        &mut n,
        &[
            ("InitialR2T", "No"),
            ("ImmediateData", "Yes"),
            ("MaxBurstLength", "16776192"),
            ("DefaultTime2Wait", "2"),
            ("MaxConnections", "8"),
            ("ErrorRecoveryLevel", "2"),
            ("DataPDUInOrder", "No"),
        ],
    )
    .unwrap();
    assert_eq!(reply(&r, "InitialR2T"), Some("Yes")); // OR
    assert_eq!(reply(&r, "ImmediateData"), Some("No")); // AND
    assert_eq!(reply(&r, "MaxBurstLength"), Some("65536")); // min
    assert_eq!(reply(&r, "DefaultTime2Wait"), Some("5")); // max
    assert_eq!(reply(&r, "MaxConnections"), Some("4"));
    assert_eq!(reply(&r, "ErrorRecoveryLevel"), Some("0"));
    assert_eq!(reply(&r, "DataPDUInOrder"), Some("Yes"));
}

#[test]
fn out_of_range_values_are_rejected_and_keep_defaults() {
    let mut n = Negotiator::new(TargetLimits::default(), SessionType::Normal);
    let r = run(
        &mut n,
        &[
            ("MaxBurstLength", "100"),
            ("MaxConnections", "0"),
            ("DefaultTime2Wait", "3601"),
            ("InitialR2T", "maybe"),
            ("ErrorRecoveryLevel", "3"),
            ("IFMarkInt", "2048~8192"),
        ],
    )
    .unwrap();
    for key in [
        "MaxBurstLength",
        "MaxConnections",
        "DefaultTime2Wait",
        "InitialR2T",
        "ErrorRecoveryLevel",
        "IFMarkInt",
    ] {
        assert_eq!(reply(&r, key), Some("Reject"), "{key}");
    }
    let (s, _) = n.finish().unwrap();
    assert_eq!(s, SessionParams::default());
}

#[test]
fn first_burst_is_clamped_to_max_burst() {
    let mut n = Negotiator::new(TargetLimits::default(), SessionType::Normal);
    // FirstBurstLength comes first in the PDU but is settled after
    // MaxBurstLength.
    let r = run(
        &mut n,
        &[
            ("FirstBurstLength", "1048576"),
            ("MaxBurstLength", "131072"),
        ],
    )
    .unwrap();
    assert_eq!(reply(&r, "MaxBurstLength"), Some("131072"));
    assert_eq!(reply(&r, "FirstBurstLength"), Some("131072"));
    let (s, _) = n.finish().unwrap();
    assert_eq!((s.first_burst_length, s.max_burst_length), (131072, 131072));
}

#[test]
fn first_burst_above_a_later_max_burst_fails_at_the_end() {
    let mut n = Negotiator::new(TargetLimits::default(), SessionType::Normal);
    run(&mut n, &[("FirstBurstLength", "262144")]).unwrap();
    run(&mut n, &[("MaxBurstLength", "65536")]).unwrap();
    assert_eq!(
        n.finish(),
        Err(NegotiationError::FirstBurstAboveMaxBurst {
            first: 262144,
            max: 65536
        })
    );
}

#[test]
fn renegotiation_is_an_error() {
    let mut n = Negotiator::new(TargetLimits::default(), SessionType::Normal);
    run(&mut n, &[("MaxBurstLength", "65536")]).unwrap();
    assert_eq!(
        run(&mut n, &[("MaxBurstLength", "65536")]),
        Err(NegotiationError::Renegotiated("MaxBurstLength".into()))
    );
}

#[test]
fn unknown_keys_are_not_understood_and_answers_without_offers_fail() {
    let mut n = Negotiator::new(TargetLimits::default(), SessionType::Normal);
    let r = run(
        &mut n,
        &[
            ("X-com.cisco.PingTimeout", "5"),
            ("TaskReporting", "FastAbort"),
        ],
    )
    .unwrap();
    assert_eq!(reply(&r, "X-com.cisco.PingTimeout"), Some("NotUnderstood"));
    assert_eq!(reply(&r, "TaskReporting"), Some("NotUnderstood"));
    assert!(matches!(
        run(&mut n, &[("InitialR2T", "Irrelevant")]),
        Err(NegotiationError::UnexpectedAnswer { .. })
    ));
}

#[test]
fn discovery_sessions_answer_normal_only_keys_irrelevant() {
    let mut n = Negotiator::new(TargetLimits::default(), SessionType::Discovery);
    let r = run(&mut n, LIBISCSI).unwrap();
    for key in NORMAL_ONLY_KEYS {
        assert_eq!(reply(&r, key), Some("Irrelevant"), "{key}");
    }
    assert_eq!(reply(&r, "HeaderDigest"), Some("None"));
    assert_eq!(reply(&r, "DefaultTime2Wait"), Some("2"));
    assert!(!n.make_offers(&mut Vec::new()));
}

#[test]
fn bad_declarations_fail() {
    let mut n = Negotiator::new(TargetLimits::default(), SessionType::Normal);
    assert!(matches!(
        run(&mut n, &[("MaxRecvDataSegmentLength", "511")]),
        Err(NegotiationError::InvalidDeclaration { .. })
    ));
    let mut n = Negotiator::new(TargetLimits::default(), SessionType::Normal);
    run(&mut n, &[("MaxRecvDataSegmentLength", "4294967295")]).unwrap();
    assert_eq!(
        n.finish().unwrap().1.initiator_max_recv_data_segment_length,
        MAX_DATA_LENGTH
    );
}

#[test]
fn target_offers_what_the_defaults_do_not_allow() {
    let limits = TargetLimits {
        immediate_data: false,
        max_burst_length: 131072,
        first_burst_length: 16384,
        ..TargetLimits::default()
    };
    let mut n = Negotiator::new(limits, SessionType::Normal);
    // The initiator negotiated MaxBurstLength itself.
    run(&mut n, &[("MaxBurstLength", "262144")]).unwrap();
    let mut offers = Vec::new();
    assert!(n.make_offers(&mut offers));
    assert_eq!(
        offers,
        pairs(&[("ImmediateData", "No"), ("FirstBurstLength", "16384")])
    );
    assert!(n.awaiting_answers());
    assert_eq!(
        n.finish(),
        Err(NegotiationError::MissingAnswer("ImmediateData".into()))
    );
    // Answering above the offer violates the minimum function.
    let mut m = n.clone();
    assert!(matches!(
        run(
            &mut m,
            &[("ImmediateData", "No"), ("FirstBurstLength", "65536")]
        ),
        Err(NegotiationError::InvalidAnswer { .. })
    ));
    let r = run(
        &mut n,
        &[("ImmediateData", "Yes"), ("FirstBurstLength", "8192")],
    )
    .unwrap();
    assert!(r.is_empty());
    let (s, _) = n.finish().unwrap();
    assert!(!s.immediate_data);
    assert_eq!((s.max_burst_length, s.first_burst_length), (131072, 8192));
    assert!(!n.make_offers(&mut Vec::new()));
}

mod props {
    use super::super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn never_panics_and_keeps_invariants(
            input in proptest::collection::vec(
                (proptest::sample::select(OPERATIONAL_KEYS.to_vec()), "[ -~]{0,12}"),
                0..24,
            ),
            discovery in any::<bool>(),
        ) {
            let kind = if discovery { SessionType::Discovery } else { SessionType::Normal };
            let limits = TargetLimits::default();
            let mut n = Negotiator::new(limits.clone(), kind);
            let pairs: Vec<(String, String)> =
                input.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
            let mut replies = Vec::new();
            if n.receive_all(&pairs, &mut replies).is_ok() {
                if let Ok((s, c)) = n.finish() {
                    prop_assert!(s.max_burst_length <= limits.max_burst_length.max(262144));
                    prop_assert!(s.first_burst_length <= s.max_burst_length);
                    prop_assert!(s.max_connections <= limits.max_connections);
                    prop_assert_eq!(s.error_recovery_level, 0);
                    prop_assert!(c.initiator_max_recv_data_segment_length >= MIN_DATA_LENGTH);
                }
            }
        }
    }
}
