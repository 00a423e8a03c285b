//! CHAP logins driven through `LoginMachine` as libiscsi (lib/login.c,
//! test-tool/test_iscsi_chap*.c) and open-iscsi (usr/login.c) run them:
//! one-way and mutual CHAP, and the refusals (status 0x0201).

mod login_common;

use login_common::*;

#[test]
fn libiscsi_one_way_chap_login() {
    let p = Policy {
        chap: true,
        ..Policy::default()
    };
    let mut m = machine();
    let s = chap_until_challenge(&mut m, &p, "5");
    ok(&s);
    let k = keys(&s.0);
    assert_eq!(key(&k, "CHAP_A"), Some("5"));
    assert_eq!(key(&k, "CHAP_I"), Some("66"));
    assert_eq!(
        key(&k, "CHAP_C"),
        Some("0x30313233343536373839616263646566")
    );
    assert_eq!(s.0.stat_sn, 501);

    let r = good_response();
    let s = m.receive(
        &req(
            Stage::Security,
            true,
            Stage::Operational,
            &[("CHAP_N", "alice"), ("CHAP_R", &r)],
        ),
        &p,
    );
    ok(&s);
    assert!(s.0.transit);
    assert_eq!((s.0.csg, s.0.nsg), (Stage::Security, Stage::Operational));
    assert!(s.0.data.is_empty());

    let s = m.receive(
        &req(Stage::Operational, true, Stage::FullFeature, LIBISCSI_OPS),
        &p,
    );
    assert_eq!(s.0.stat_sn, 503);
    let k = keys(&s.0);
    assert_eq!(key(&k, "MaxRecvDataSegmentLength"), Some("262144"));
    assert_eq!(key(&k, "HeaderDigest"), Some("None"));
    assert_eq!(key(&k, "ImmediateData"), Some("Yes"));
    let o = complete(s);
    assert_eq!(o.session_type, SessionType::Normal);
    assert_eq!(o.initiator_name, INITIATOR);
    assert_eq!(o.initiator_alias.as_deref(), Some("test host"));
    assert_eq!(o.target_name.as_deref(), Some(TARGET));
    assert_eq!(o.authenticated_user.as_deref(), Some("alice"));
    assert!(o.new_session);
    assert_eq!(o.exp_cmd_sn, 77);
    assert_eq!(o.next_stat_sn, 504);
    assert_eq!(m.next_stat_sn(), Some(504));
    assert!(!o.session.initial_r2t);
    assert_eq!(o.connection.initiator_max_recv_data_segment_length, 262144);
    // Nothing more after completion.
    failed(
        m.receive(&req(Stage::Operational, true, Stage::FullFeature, &[]), &p),
        LoginStatus::InitiatorError,
    );
}

#[test]
fn mutual_chap_answers_the_initiators_challenge() {
    let p = Policy {
        chap: true,
        mutual: true,
        ..Policy::default()
    };
    let mut m = machine();
    ok(&chap_until_challenge(&mut m, &p, "5"));
    let r = good_response();
    let their = [0xa5u8; 32];
    let their_hex = value::hex(&their);
    let s = m.receive(
        &req(
            Stage::Security,
            true,
            Stage::Operational,
            &[
                ("CHAP_N", "alice"),
                ("CHAP_R", &r),
                ("CHAP_I", "1"),
                ("CHAP_C", &their_hex),
            ],
        ),
        &p,
    );
    ok(&s);
    assert!(s.0.transit);
    let k = keys(&s.0);
    assert_eq!(key(&k, "CHAP_N"), Some("basalt"));
    let expected = value::hex(&chap_response(1, TARGET_SECRET, &their));
    assert_eq!(key(&k, "CHAP_R"), Some(expected.as_str()));
}

#[test]
fn mutual_chap_refusals() {
    let r = good_response();
    let run = |p: &Policy, challenge: &str| {
        let mut m = machine();
        ok(&chap_until_challenge(&mut m, p, "5"));
        m.receive(
            &req(
                Stage::Security,
                true,
                Stage::Operational,
                &[
                    ("CHAP_N", "alice"),
                    ("CHAP_R", &r),
                    ("CHAP_I", "1"),
                    ("CHAP_C", challenge),
                ],
            ),
            p,
        )
    };
    let mutual = Policy {
        chap: true,
        mutual: true,
        ..Policy::default()
    };
    // Reflection of the target's own challenge.
    failed(
        run(&mutual, &value::hex(&CHALLENGE)),
        LoginStatus::AuthenticationFailure,
    );
    // Mutual asked, but no target secret configured.
    let one_way = Policy {
        chap: true,
        ..Policy::default()
    };
    failed(
        run(&one_way, "0x0102030405060708"),
        LoginStatus::AuthenticationFailure,
    );
}

#[test]
fn wrong_chap_response_is_refused_with_0201() {
    let p = Policy {
        chap: true,
        ..Policy::default()
    };
    let mut bad = chap_response(ID, SECRET, &CHALLENGE);
    bad[0] ^= 0xff;
    for (name, response) in [
        ("alice", value::hex(&bad)),
        ("mallory", good_response()),
        ("alice", "0x00".to_string()),
    ] {
        let mut m = machine();
        ok(&chap_until_challenge(&mut m, &p, "5"));
        failed(
            m.receive(
                &req(
                    Stage::Security,
                    true,
                    Stage::Operational,
                    &[("CHAP_N", name), ("CHAP_R", &response)],
                ),
                &p,
            ),
            LoginStatus::AuthenticationFailure,
        );
        // The machine stays failed.
        failed(
            m.receive(&req(Stage::Security, true, Stage::Operational, &[]), &p),
            LoginStatus::InitiatorError,
        );
    }
}

/// libiscsi test_iscsi_chap_simple / _invalid / _base64.
#[test]
fn libiscsi_chap_algorithm_and_encoding_tests() {
    let p = Policy {
        chap: true,
        ..Policy::default()
    };
    let mut m = machine();
    let s = chap_until_challenge(&mut m, &p, "5,6,7,8");
    ok(&s);
    assert_eq!(key(&keys(&s.0), "CHAP_A"), Some("5"));
    let mut b64 = String::new();
    value::encode_base64(&chap_response(ID, SECRET, &CHALLENGE), &mut b64);
    let s = m.receive(
        &req(
            Stage::Security,
            true,
            Stage::Operational,
            &[("CHAP_N", "alice"), ("CHAP_R", &b64)],
        ),
        &p,
    );
    ok(&s);
    assert!(s.0.transit);

    for chap_a in ["56", ""] {
        let mut m = machine();
        failed(
            chap_until_challenge(&mut m, &p, chap_a),
            LoginStatus::AuthenticationFailure,
        );
    }

    // Oversized base64 response.
    let mut m = machine();
    ok(&chap_until_challenge(&mut m, &p, "5"));
    let oversize = format!("0bb3ZlcnNpemUK{}", &b64[2..]);
    failed(
        m.receive(
            &req(
                Stage::Security,
                true,
                Stage::Operational,
                &[("CHAP_N", "alice"), ("CHAP_R", &oversize)],
            ),
            &p,
        ),
        LoginStatus::AuthenticationFailure,
    );
}

#[test]
fn chap_target_refuses_skipping_authentication() {
    let p = Policy {
        chap: true,
        ..Policy::default()
    };
    // libiscsi without a user starts in the operational stage.
    let mut first = FIRST_CHAP[..4].to_vec();
    first.extend_from_slice(LIBISCSI_OPS);
    failed(
        machine().receive(
            &req(Stage::Operational, true, Stage::FullFeature, &first),
            &p,
        ),
        LoginStatus::AuthenticationFailure,
    );
    // Security stage, but asking to move on without AuthMethod.
    failed(
        machine().receive(
            &req(Stage::Security, true, Stage::Operational, &FIRST_CHAP[..4]),
            &p,
        ),
        LoginStatus::AuthenticationFailure,
    );
    // Offering only None.
    let mut none = FIRST_CHAP[..4].to_vec();
    none.push(("AuthMethod", "None"));
    failed(
        machine().receive(&req(Stage::Security, true, Stage::Operational, &none), &p),
        LoginStatus::AuthenticationFailure,
    );
    // Answering the challenge with something else.
    let mut m = machine();
    ok(&chap_until_challenge(&mut m, &p, "5"));
    failed(
        m.receive(&req(Stage::Security, true, Stage::Operational, &[]), &p),
        LoginStatus::AuthenticationFailure,
    );
}

#[test]
fn open_iscsi_chap_login() {
    let p = Policy {
        chap: true,
        ..Policy::default()
    };
    let mut m = machine();
    let first = [
        ("InitiatorName", "iqn.2004-10.com.ubuntu:01:abcdef"),
        ("TargetName", TARGET),
        ("SessionType", "Normal"),
        ("AuthMethod", "CHAP"),
    ];
    let s = m.receive(&req(Stage::Security, true, Stage::Operational, &first), &p);
    ok(&s);
    assert!(!s.0.transit);
    let s = m.receive(
        &req(
            Stage::Security,
            true,
            Stage::Operational,
            &[("CHAP_A", "7,6,5")],
        ),
        &p,
    );
    ok(&s);
    assert!(!s.0.transit);
    let r = good_response();
    let s = m.receive(
        &req(
            Stage::Security,
            true,
            Stage::Operational,
            &[("CHAP_N", "alice"), ("CHAP_R", &r)],
        ),
        &p,
    );
    ok(&s);
    assert!(s.0.transit);
    let s = m.receive(
        &req(Stage::Operational, true, Stage::FullFeature, OPEN_ISCSI_OPS),
        &p,
    );
    let k = keys(&s.0);
    assert_eq!(key(&k, "MaxBurstLength"), Some("1048576"));
    assert_eq!(key(&k, "FirstBurstLength"), Some("262144"));
    assert_eq!(key(&k, "IFMarker"), Some("No"));
    let o = complete(s);
    assert_eq!(o.session.max_burst_length, 1048576);
    assert_eq!(o.session.default_time2retain, 0);
}
