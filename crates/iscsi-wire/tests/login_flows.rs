//! Logins driven through `LoginMachine` the way libiscsi (lib/login.c)
//! and Linux open-iscsi (usr/login.c) run them without CHAP, and the
//! failures RFC 7143 expects; CHAP logins are in login_chap.rs.

mod login_common;

use login_common::*;

#[test]
fn open_target_login_without_security_stage() {
    let p = Policy::default();
    let mut first = FIRST_CHAP[..4].to_vec();
    first.extend_from_slice(LIBISCSI_OPS);
    let mut m = machine();
    let s = m.receive(
        &req(Stage::Operational, true, Stage::FullFeature, &first),
        &p,
    );
    let k = keys(&s.0);
    assert_eq!(key(&k, "TargetPortalGroupTag"), Some("1"));
    assert_eq!(key(&k, "MaxRecvDataSegmentLength"), Some("262144"));
    assert_eq!(key(&k, "DataPDUInOrder"), Some("Yes"));
    assert_eq!(s.0.stat_sn, 500);
    assert_eq!(s.0.isid, [0x80, 0, 0, 0x12, 0x34, 0]);
    assert_eq!(s.0.itt, 0x1000);
    let o = complete(s);
    assert_eq!(o.authenticated_user, None);
    assert_eq!(o.next_stat_sn, 501);
}

#[test]
fn discovery_logins() {
    let p = Policy::default();
    // libiscsi: operational stage only, every key, Discovery.
    let mut first = vec![("InitiatorName", INITIATOR), ("SessionType", "Discovery")];
    first.extend_from_slice(LIBISCSI_OPS);
    let mut m = machine();
    let s = m.receive(
        &req(Stage::Operational, true, Stage::FullFeature, &first),
        &p,
    );
    let k = keys(&s.0);
    assert_eq!(key(&k, "TargetPortalGroupTag"), None);
    assert_eq!(key(&k, "InitialR2T"), Some("Irrelevant"));
    assert_eq!(key(&k, "MaxBurstLength"), Some("Irrelevant"));
    assert_eq!(key(&k, "HeaderDigest"), Some("None"));
    let o = complete(s);
    assert_eq!(o.session_type, SessionType::Discovery);
    assert_eq!(o.target_name, None);

    // open-iscsi with default digests and segment length: security stage
    // straight to full feature.
    let mut m = machine();
    let s = m.receive(
        &req(
            Stage::Security,
            true,
            Stage::FullFeature,
            &[
                ("InitiatorName", INITIATOR),
                ("SessionType", "Discovery"),
                ("AuthMethod", "None"),
            ],
        ),
        &p,
    );
    assert_eq!(key(&keys(&s.0), "AuthMethod"), Some("None"));
    let o = complete(s);
    assert_eq!(o.connection.target_max_recv_data_segment_length, 8192);

    // open-iscsi without authentication: operational stage.
    let mut m = machine();
    let s = m.receive(
        &req(
            Stage::Operational,
            true,
            Stage::FullFeature,
            &[
                ("InitiatorName", INITIATOR),
                ("SessionType", "Discovery"),
                ("HeaderDigest", "None"),
                ("DataDigest", "None"),
                ("DefaultTime2Wait", "2"),
                ("DefaultTime2Retain", "0"),
                ("IFMarker", "No"),
                ("OFMarker", "No"),
                ("ErrorRecoveryLevel", "0"),
                ("MaxRecvDataSegmentLength", "32768"),
            ],
        ),
        &p,
    );
    let o = complete(s);
    assert_eq!(o.connection.initiator_max_recv_data_segment_length, 32768);
}

#[test]
fn continued_request_text_is_joined() {
    let p = Policy::default();
    let mut first = FIRST_CHAP[..4].to_vec();
    first.extend_from_slice(LIBISCSI_OPS);
    let all = data(&first);
    let mut m = machine();
    let pieces: Vec<&[u8]> = all.chunks(100).collect();
    let last = pieces.len() - 1;
    for (i, piece) in pieces.iter().enumerate() {
        let mut r = req(Stage::Operational, i == last, Stage::FullFeature, &[]);
        r.cont = i != last;
        r.data = piece.to_vec();
        let s = m.receive(&r, &p);
        assert_eq!(s.0.stat_sn, 500 + i as u32);
        if i != last {
            ok(&s);
            assert!(!s.0.transit && !s.0.cont && s.0.data.is_empty());
            assert_eq!(s.1, LoginEvent::Continue);
        } else {
            complete(s);
        }
    }
}

#[test]
fn c_and_t_together_is_an_error() {
    let mut r = req(Stage::Operational, true, Stage::FullFeature, &[]);
    r.cont = true;
    failed(
        machine().receive(&r, &Policy::default()),
        LoginStatus::InitiatorError,
    );
}

#[test]
fn long_responses_are_continued_by_the_target() {
    let p = Policy::default();
    let names: Vec<String> = (0..200)
        .map(|i| format!("X-io.basalt.{i:04}.{}", "k".repeat(40)))
        .collect();
    let mut first: Vec<(&str, &str)> = FIRST_CHAP[..4].to_vec();
    for n in &names {
        first.push((n.as_str(), "1"));
    }
    let mut m = machine();
    let s = m.receive(
        &req(Stage::Operational, true, Stage::FullFeature, &first),
        &p,
    );
    ok(&s);
    assert!(s.0.cont && !s.0.transit);
    assert_eq!(s.0.data.len(), 8192);
    let mut all = s.0.data.clone();
    let s = m.receive(&req(Stage::Operational, false, Stage::FullFeature, &[]), &p);
    all.extend_from_slice(&s.0.data);
    assert!(!s.0.cont);
    complete(s);
    let k = text::parse(&all).unwrap();
    assert_eq!(key(&k, &names[199]), Some("NotUnderstood"));
}

#[test]
fn renegotiating_a_key_fails() {
    let p = Policy::default();
    let mut first = FIRST_CHAP[..4].to_vec();
    first.push(("MaxBurstLength", "65536"));
    let mut m = machine();
    ok(&m.receive(
        &req(Stage::Operational, false, Stage::FullFeature, &first),
        &p,
    ));
    failed(
        m.receive(
            &req(
                Stage::Operational,
                true,
                Stage::FullFeature,
                &[("MaxBurstLength", "65536")],
            ),
            &p,
        ),
        LoginStatus::InitiatorError,
    );
    // Session keys cannot come back either.
    let mut m = machine();
    ok(&m.receive(
        &req(Stage::Operational, false, Stage::FullFeature, &first),
        &p,
    ));
    failed(
        m.receive(
            &req(
                Stage::Operational,
                true,
                Stage::FullFeature,
                &[("TargetName", TARGET)],
            ),
            &p,
        ),
        LoginStatus::InitiatorError,
    );
}

#[test]
fn digest_negotiation_through_the_machine() {
    let p = Policy::default();
    let mut first = FIRST_CHAP[..4].to_vec();
    first.extend_from_slice(&[("HeaderDigest", "CRC32C,None"), ("DataDigest", "CRC32C")]);
    let o = complete(machine().receive(
        &req(Stage::Operational, true, Stage::FullFeature, &first),
        &p,
    ));
    assert_eq!(o.connection.header_digest, Digest::Crc32c);
    assert_eq!(o.connection.data_digest, Digest::Crc32c);

    let limits = TargetLimits {
        data_digest_crc32c: false,
        ..TargetLimits::default()
    };
    let mut m = LoginMachine::new(limits, CHALLENGE, ID);
    let s = m.receive(
        &req(Stage::Operational, true, Stage::FullFeature, &first),
        &p,
    );
    assert_eq!(key(&keys(&s.0), "DataDigest"), Some("Reject"));
    let o = complete(s);
    assert_eq!(o.connection.data_digest, Digest::None);
}

#[test]
fn first_burst_above_max_burst_is_clamped() {
    let p = Policy::default();
    let mut first = FIRST_CHAP[..4].to_vec();
    first.extend_from_slice(&[("FirstBurstLength", "524288"), ("MaxBurstLength", "131072")]);
    let s = machine().receive(
        &req(Stage::Operational, true, Stage::FullFeature, &first),
        &p,
    );
    assert_eq!(key(&keys(&s.0), "FirstBurstLength"), Some("131072"));
    let o = complete(s);
    assert_eq!(o.session.first_burst_length, 131072);
}

#[test]
fn target_offers_keys_whose_defaults_it_cannot_accept() {
    let p = Policy::default();
    let limits = TargetLimits {
        immediate_data: false,
        ..TargetLimits::default()
    };
    let mut m = LoginMachine::new(limits, CHALLENGE, ID);
    let s = m.receive(
        &req(
            Stage::Operational,
            true,
            Stage::FullFeature,
            &FIRST_CHAP[..4],
        ),
        &p,
    );
    ok(&s);
    assert!(!s.0.transit);
    assert_eq!(key(&keys(&s.0), "ImmediateData"), Some("No"));
    let o = complete(m.receive(
        &req(
            Stage::Operational,
            true,
            Stage::FullFeature,
            &[("ImmediateData", "Yes")],
        ),
        &p,
    ));
    assert!(!o.session.immediate_data);

    // Skipping the operational stage is turned into going through it.
    let limits = TargetLimits {
        immediate_data: false,
        ..TargetLimits::default()
    };
    let mut m = LoginMachine::new(limits, CHALLENGE, ID);
    let mut first = FIRST_CHAP[..4].to_vec();
    first.push(("AuthMethod", "None"));
    let s = m.receive(&req(Stage::Security, true, Stage::FullFeature, &first), &p);
    ok(&s);
    assert!(s.0.transit);
    assert_eq!(s.0.nsg, Stage::Operational);
    assert_eq!(s.1, LoginEvent::Continue);
}

#[test]
fn first_request_errors() {
    let p = Policy::default();
    let mut v = req(Stage::Security, true, Stage::Operational, FIRST_CHAP);
    v.version_min = 1;
    v.version_max = 2;
    failed(machine().receive(&v, &p), LoginStatus::UnsupportedVersion);

    failed(
        machine().receive(
            &req(
                Stage::Security,
                true,
                Stage::Operational,
                &[("TargetName", TARGET)],
            ),
            &p,
        ),
        LoginStatus::MissingParameter,
    );
    failed(
        machine().receive(
            &req(
                Stage::Security,
                true,
                Stage::Operational,
                &[("InitiatorName", INITIATOR)],
            ),
            &p,
        ),
        LoginStatus::MissingParameter,
    );
    failed(
        machine().receive(
            &req(
                Stage::Security,
                true,
                Stage::Operational,
                &[
                    ("InitiatorName", INITIATOR),
                    ("TargetName", "iqn.2024-01.io.basalt:none"),
                ],
            ),
            &p,
        ),
        LoginStatus::NotFound,
    );
    failed(
        machine().receive(
            &req(
                Stage::Security,
                true,
                Stage::Operational,
                &[("InitiatorName", INITIATOR), ("SessionType", "Other")],
            ),
            &p,
        ),
        LoginStatus::SessionTypeNotSupported,
    );
    let denied = Policy {
        deny: true,
        ..Policy::default()
    };
    failed(
        machine().receive(
            &req(Stage::Security, true, Stage::Operational, FIRST_CHAP),
            &denied,
        ),
        LoginStatus::AuthorizationFailure,
    );
    let refuse = Policy {
        refuse: Some(LoginStatus::TooManyConnections),
        ..Policy::default()
    };
    failed(
        machine().receive(
            &req(Stage::Security, true, Stage::Operational, FIRST_CHAP),
            &refuse,
        ),
        LoginStatus::TooManyConnections,
    );
    let weak = Policy {
        chap: true,
        weak_secret: true,
        ..Policy::default()
    };
    failed(
        machine().receive(
            &req(Stage::Security, true, Stage::Operational, FIRST_CHAP),
            &weak,
        ),
        LoginStatus::TargetError,
    );
    failed(
        machine().receive(
            &req(Stage::FullFeature, false, Stage::Security, FIRST_CHAP),
            &p,
        ),
        LoginStatus::InitiatorError,
    );
    failed(
        machine().receive(&req(Stage::Security, true, Stage::Reserved, FIRST_CHAP), &p),
        LoginStatus::InitiatorError,
    );
    let mut junk = req(Stage::Security, true, Stage::Operational, &[]);
    junk.data = b"junk\0".to_vec();
    failed(machine().receive(&junk, &p), LoginStatus::InitiatorError);
}

#[test]
fn header_fields_must_not_change() {
    let p = Policy::default();
    type Tweak = fn(&mut LoginRequest);
    let tweaks: [Tweak; 4] = [
        |r| r.isid[5] = 9,
        |r| r.tsih = 3,
        |r| r.itt = 1,
        |r| r.cid = 7,
    ];
    for tweak in tweaks {
        let mut m = machine();
        let mut first = FIRST_CHAP.to_vec();
        first.pop();
        ok(&m.receive(&req(Stage::Security, false, Stage::Security, &first), &p));
        let mut next = req(Stage::Security, true, Stage::Operational, &[]);
        tweak(&mut next);
        failed(m.receive(&next, &p), LoginStatus::InitiatorError);
    }
    // The current stage must be the one the target is in.
    let mut m = machine();
    ok(&m.receive(
        &req(Stage::Security, false, Stage::Security, &FIRST_CHAP[..4]),
        &p,
    ));
    failed(
        m.receive(&req(Stage::Operational, true, Stage::FullFeature, &[]), &p),
        LoginStatus::InitiatorError,
    );
}

#[test]
fn existing_session_and_caller_rejection() {
    let p = Policy::default();
    let mut first = FIRST_CHAP[..4].to_vec();
    first.extend_from_slice(LIBISCSI_OPS);
    let mut r = req(Stage::Operational, true, Stage::FullFeature, &first);
    r.tsih = 9;
    let mut m = machine();
    let o = complete(m.receive(&r, &p));
    assert!(!o.new_session);
    assert_eq!(o.tsih, 9);
    // The caller cannot honour it: its own failure response instead.
    let resp = m.reject(LoginStatus::SessionDoesNotExist);
    assert_eq!(resp.status_code(), 0x020a);
    assert_eq!(resp.tsih, 9);
    assert_eq!(resp.itt, 0x1000);
    assert_eq!(resp.stat_sn, 501);
    assert!(m.is_finished());
}

mod props {
    use super::*;
    use proptest::prelude::*;

    fn stage() -> impl Strategy<Value = Stage> {
        (0u8..4).prop_map(Stage::from_bits)
    }

    fn keyed_data() -> impl Strategy<Value = Vec<u8>> {
        let keys = proptest::sample::select(vec![
            "InitiatorName",
            "TargetName",
            "SessionType",
            "AuthMethod",
            "CHAP_A",
            "CHAP_N",
            "CHAP_R",
            "CHAP_I",
            "CHAP_C",
            "MaxBurstLength",
            "FirstBurstLength",
            "HeaderDigest",
            "MaxRecvDataSegmentLength",
            "ImmediateData",
            "X-foo",
            "SendTargets",
        ]);
        let values = proptest::sample::select(vec![
            INITIATOR,
            TARGET,
            "Normal",
            "Discovery",
            "CHAP,None",
            "None",
            "5",
            "alice",
            "0x00112233445566778899aabbccddeeff",
            "65536",
            "CRC32C,None",
            "Yes",
            "",
            "0b",
            "Reject",
        ]);
        prop_oneof![
            proptest::collection::vec((keys, values), 0..8).prop_map(|pairs| {
                let mut out = Vec::new();
                text::encode(&pairs, &mut out);
                out
            }),
            proptest::collection::vec(any::<u8>(), 0..64),
        ]
    }

    fn request() -> impl Strategy<Value = LoginRequest> {
        (
            any::<(bool, bool)>(),
            stage(),
            stage(),
            0u8..2,
            any::<u8>(),
            any::<u16>(),
            keyed_data(),
        )
            .prop_map(|((transit, cont), csg, nsg, vmin, isid0, tsih, data)| {
                LoginRequest {
                    transit,
                    cont,
                    csg,
                    nsg,
                    version_max: 0,
                    version_min: vmin,
                    isid: [isid0 & 1, 0, 0, 0, 0, 0],
                    tsih: tsih & 1,
                    itt: 1,
                    cid: 0,
                    cmd_sn: 1,
                    exp_stat_sn: u32::MAX,
                    data,
                }
            })
    }

    proptest! {
        #[test]
        fn machine_never_panics(requests in proptest::collection::vec(request(), 1..12), chap in any::<bool>(), mutual in any::<bool>()) {
            let p = Policy { chap, mutual, ..Policy::default() };
            let mut m = machine();
            let mut last_sn = None;
            for r in &requests {
                let (resp, event) = m.receive(r, &p);
                // StatSN increases by one per response.
                if let Some(prev) = last_sn {
                    prop_assert_eq!(resp.stat_sn, u32::wrapping_add(prev, 1));
                }
                last_sn = Some(resp.stat_sn);
                prop_assert!(!(resp.transit && resp.cont));
                if resp.transit {
                    prop_assert!(r.transit);
                    prop_assert!(resp.nsg.bits() <= r.nsg.bits());
                }
                if let LoginEvent::Complete(o) = &event {
                    if chap {
                        prop_assert!(o.authenticated_user.is_some());
                    }
                }
                if matches!(event, LoginEvent::Failed(_)) {
                    prop_assert!(resp.status_class != 0);
                }
            }
        }
    }
}
