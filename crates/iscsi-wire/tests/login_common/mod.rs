//! Shared by the login tests: a configurable `LoginPolicy`, request
//! builders, and the key sets libiscsi and open-iscsi send.

#![allow(dead_code, unused_imports)]

pub use basalt_iscsi_wire::chap::chap_response;
pub use basalt_iscsi_wire::login::{
    Authorization, ConnectionIdentity, LoginEvent, LoginMachine, LoginOutcome, LoginPolicy,
    LoginRequest, LoginResponse, LoginStatus, Stage,
};
pub use basalt_iscsi_wire::negotiation::{Digest, SessionType, TargetLimits};
pub use basalt_iscsi_wire::text::{self, value};

pub const TARGET: &str = "iqn.2024-01.io.basalt:vol1";
pub const INITIATOR: &str = "iqn.2007-10.com.github:sahlberg:libiscsi:iscsi-test";
pub const SECRET: &[u8] = b"initiator-secret";
pub const TARGET_SECRET: &[u8] = b"target-secret-xyz";
pub const CHALLENGE: [u8; 16] = *b"0123456789abcdef";
pub const ID: u8 = 0x42;

#[derive(Default)]
pub struct Policy {
    pub chap: bool,
    pub mutual: bool,
    pub deny: bool,
    pub weak_secret: bool,
    pub refuse: Option<LoginStatus>,
}

impl LoginPolicy for Policy {
    fn target_exists(&self, target_name: &str) -> bool {
        target_name == TARGET
    }

    fn authorization(&self, _initiator: &str, _target: Option<&str>) -> Authorization {
        if self.deny {
            return Authorization::Denied;
        }
        if !self.chap {
            return Authorization::Open;
        }
        Authorization::Chap {
            initiator_user: "alice".into(),
            initiator_secret: if self.weak_secret {
                b"short".to_vec()
            } else {
                SECRET.to_vec()
            },
            mutual: self
                .mutual
                .then(|| ("basalt".to_string(), TARGET_SECRET.to_vec())),
        }
    }

    fn admit_connection(&self, _identity: &ConnectionIdentity<'_>) -> Result<(), LoginStatus> {
        self.refuse.map_or(Ok(()), Err)
    }
}

pub fn data(pairs: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    text::encode(pairs, &mut out);
    out
}

pub fn req(csg: Stage, transit: bool, nsg: Stage, pairs: &[(&str, &str)]) -> LoginRequest {
    LoginRequest {
        transit,
        cont: false,
        csg,
        nsg,
        version_max: 0,
        version_min: 0,
        isid: [0x80, 0, 0, 0x12, 0x34, 0],
        tsih: 0,
        itt: 0x1000,
        cid: 0,
        cmd_sn: 77,
        exp_stat_sn: 500,
        data: data(pairs),
    }
}

pub fn keys(resp: &LoginResponse) -> Vec<(String, String)> {
    text::parse_records(&resp.data).unwrap()
}

pub fn key<'a>(pairs: &'a [(String, String)], k: &str) -> Option<&'a str> {
    pairs.iter().find(|(x, _)| x == k).map(|(_, v)| v.as_str())
}

pub fn ok(step: &(LoginResponse, LoginEvent)) {
    assert_eq!(step.0.status_code(), 0, "{:?}", step);
}

pub fn failed(step: (LoginResponse, LoginEvent), status: LoginStatus) {
    assert_eq!(step.0.status_code(), status.code(), "{step:?}");
    assert_eq!(step.1, LoginEvent::Failed(status));
    assert!(!step.0.transit);
    assert!(step.0.data.is_empty());
}

pub fn complete(step: (LoginResponse, LoginEvent)) -> LoginOutcome {
    ok(&step);
    assert!(step.0.transit);
    assert_eq!(step.0.nsg, Stage::FullFeature);
    match step.1 {
        LoginEvent::Complete(outcome) => *outcome,
        other => panic!("expected completion, got {other:?}"),
    }
}

/// libiscsi's operational keys (lib/login.c, defaults).
pub const LIBISCSI_OPS: &[(&str, &str)] = &[
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

/// open-iscsi's operational keys for a normal session (usr/login.c,
/// iscsid.conf defaults).
pub const OPEN_ISCSI_OPS: &[(&str, &str)] = &[
    ("HeaderDigest", "None"),
    ("DataDigest", "None"),
    ("DefaultTime2Wait", "2"),
    ("DefaultTime2Retain", "0"),
    ("IFMarker", "No"),
    ("OFMarker", "No"),
    ("ErrorRecoveryLevel", "0"),
    ("InitialR2T", "No"),
    ("ImmediateData", "Yes"),
    ("MaxBurstLength", "16776192"),
    ("FirstBurstLength", "262144"),
    ("MaxOutstandingR2T", "1"),
    ("MaxConnections", "1"),
    ("DataPDUInOrder", "Yes"),
    ("DataSequenceInOrder", "Yes"),
    ("MaxRecvDataSegmentLength", "262144"),
];

pub fn machine() -> LoginMachine {
    LoginMachine::new(TargetLimits::default(), CHALLENGE, ID)
}

pub const FIRST_CHAP: &[(&str, &str)] = &[
    ("InitiatorName", INITIATOR),
    ("InitiatorAlias", "test host"),
    ("TargetName", TARGET),
    ("SessionType", "Normal"),
    ("AuthMethod", "CHAP,None"),
];

/// Runs the security stage of a libiscsi CHAP login up to the challenge.
pub fn chap_until_challenge(
    m: &mut LoginMachine,
    p: &Policy,
    chap_a: &str,
) -> (LoginResponse, LoginEvent) {
    let s = m.receive(
        &req(Stage::Security, true, Stage::Operational, FIRST_CHAP),
        p,
    );
    ok(&s);
    assert!(!s.0.transit, "no transit before authentication");
    let k = keys(&s.0);
    assert_eq!(key(&k, "AuthMethod"), Some("CHAP"));
    assert_eq!(key(&k, "TargetPortalGroupTag"), Some("1"));
    assert_eq!(s.0.stat_sn, 500);
    m.receive(
        &req(
            Stage::Security,
            false,
            Stage::Operational,
            &[("CHAP_A", chap_a)],
        ),
        p,
    )
}

pub fn good_response() -> String {
    value::hex(&chap_response(ID, SECRET, &CHALLENGE))
}
