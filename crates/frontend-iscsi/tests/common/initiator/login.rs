//! The test initiator's login: the security stage (AuthMethod, and CHAP
//! when the target asks for it), the operational stage with the keys an
//! initiator offers, and what they settled; a refusal reports its status
//! and whether the target closed the connection.

use super::{Initiator, FIRST_CMD_SN};
use basalt_iscsi_wire::chap::chap_response;
use basalt_iscsi_wire::decoder::DecoderConfig;
use basalt_iscsi_wire::digest::Digests;
use basalt_iscsi_wire::pdu::{InitiatorPdu, LoginRequest, LoginResponse, LoginStage, TargetPdu};
use basalt_iscsi_wire::text::{self, value};
use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;

/// What an initiator offers at login.
#[derive(Debug, Clone)]
pub struct LoginOptions {
    pub initiator: String,
    pub target: String,
    pub isid: [u8; 6],
    /// Offer CRC32C header / data digests (and only them).
    pub digests: Digests,
    /// CHAP user and secret, when the initiator offers CHAP.
    pub chap: Option<(String, Vec<u8>)>,
    /// The initiator's MaxRecvDataSegmentLength.
    pub max_recv_data_segment: u32,
    pub max_burst: u32,
    pub first_burst: u32,
    pub immediate_data: bool,
    pub initial_r2t: bool,
}

impl LoginOptions {
    pub fn new(initiator: &str, target: &str) -> LoginOptions {
        LoginOptions {
            initiator: initiator.to_owned(),
            target: target.to_owned(),
            isid: [0x80, 0x12, 0x34, 0x56, 0x78, 0x01],
            digests: Digests::NONE,
            chap: None,
            max_recv_data_segment: 64 * 1024,
            max_burst: 1024 * 1024,
            first_burst: 256 * 1024,
            immediate_data: true,
            initial_r2t: false,
        }
    }
}

/// What the login settled.
#[derive(Debug, Clone)]
pub struct Negotiated {
    pub digests: Digests,
    /// The target's MaxRecvDataSegmentLength.
    pub target_max_recv_data_segment: u32,
    pub max_burst: u32,
    pub first_burst: u32,
    pub immediate_data: bool,
    pub initial_r2t: bool,
    /// Every key the target sent in the operational stage.
    pub keys: Vec<(String, String)>,
}

/// A refused login: its status (class << 8 | detail) and whether the
/// target then closed the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    pub status: u16,
    pub closed: bool,
}

impl Initiator {
    /// Logs in to a normal session; panics on anything but a clean login
    /// or a refusal.
    pub fn login(addr: SocketAddr, opts: &LoginOptions) -> Result<Initiator, Refused> {
        let mut ini = Initiator {
            stream: Initiator::connect_raw(addr),
            buf: Vec::new(),
            decoder: DecoderConfig::LOGIN,
            negotiated: Negotiated {
                digests: Digests::NONE,
                target_max_recv_data_segment: 8192,
                max_burst: 262_144,
                first_burst: 65_536,
                immediate_data: true,
                initial_r2t: true,
                keys: Vec::new(),
            },
            tsih: 0,
            isid: opts.isid,
            cmd_sn: FIRST_CMD_SN,
            exp_stat_sn: 0,
            max_cmd_sn: FIRST_CMD_SN,
            synced: false,
            next_itt: 0x10,
            tasks: HashMap::new(),
            done: VecDeque::new(),
            aborted: HashSet::new(),
            other: VecDeque::new(),
            held: None,
        };
        let auth = if opts.chap.is_some() {
            "CHAP,None"
        } else {
            "None"
        };
        let first = [
            ("InitiatorName", opts.initiator.as_str()),
            ("TargetName", opts.target.as_str()),
            ("SessionType", "Normal"),
            ("AuthMethod", auth),
        ];
        let security = LoginStage::SecurityNegotiation;
        let operational = LoginStage::OperationalNegotiation;
        let (mut resp, keys) = ini.login_step(security, true, operational, &first)?;
        if key(&keys, "AuthMethod") == Some("CHAP") {
            let (user, secret) = opts.chap.clone().expect("the target asked for CHAP");
            let (_, k) = ini.login_step(security, false, operational, &[("CHAP_A", "5")])?;
            assert_eq!(key(&k, "CHAP_A"), Some("5"));
            let id: u8 = key(&k, "CHAP_I").expect("CHAP_I").parse().unwrap();
            let challenge = value::decode_binary(key(&k, "CHAP_C").expect("CHAP_C")).unwrap();
            let answer = value::hex(&chap_response(id, &secret, &challenge));
            let pairs = [("CHAP_N", user.as_str()), ("CHAP_R", answer.as_str())];
            resp = ini.login_step(security, true, operational, &pairs)?.0;
        } else {
            assert_eq!(key(&keys, "AuthMethod"), Some("None"), "{keys:?}");
        }
        assert!(resp.transit && resp.nsg == operational, "{resp:?}");
        let digest = |on: bool| if on { "CRC32C" } else { "None" };
        let (mrdsl, mbl, fbl) = (
            opts.max_recv_data_segment.to_string(),
            opts.max_burst.to_string(),
            opts.first_burst.to_string(),
        );
        let yes_no = |b: bool| if b { "Yes" } else { "No" };
        let ops = [
            ("HeaderDigest", digest(opts.digests.header)),
            ("DataDigest", digest(opts.digests.data)),
            ("InitialR2T", yes_no(opts.initial_r2t)),
            ("ImmediateData", yes_no(opts.immediate_data)),
            ("MaxBurstLength", mbl.as_str()),
            ("FirstBurstLength", fbl.as_str()),
            ("MaxRecvDataSegmentLength", mrdsl.as_str()),
            ("MaxOutstandingR2T", "1"),
            ("ErrorRecoveryLevel", "0"),
            ("MaxConnections", "1"),
            ("DataPDUInOrder", "Yes"),
            ("DataSequenceInOrder", "Yes"),
            ("DefaultTime2Wait", "2"),
            ("DefaultTime2Retain", "0"),
        ];
        let full = LoginStage::FullFeaturePhase;
        let (mut resp, mut all) = ini.login_step(operational, true, full, &ops)?;
        while !(resp.transit && resp.nsg == full) {
            let (r, k) = ini.login_step(operational, true, full, &[])?;
            resp = r;
            all.extend(k);
        }
        let number = |k: &str| -> u32 {
            key(&all, k)
                .unwrap_or_else(|| panic!("{k} not answered: {all:?}"))
                .parse()
                .unwrap()
        };
        let flag = |k: &str| key(&all, k).unwrap_or_else(|| panic!("{k}: {all:?}")) == "Yes";
        ini.negotiated = Negotiated {
            digests: Digests {
                header: key(&all, "HeaderDigest") == Some("CRC32C"),
                data: key(&all, "DataDigest") == Some("CRC32C"),
            },
            target_max_recv_data_segment: key(&all, "MaxRecvDataSegmentLength")
                .map_or(8192, |v| v.parse().unwrap()),
            max_burst: number("MaxBurstLength"),
            first_burst: number("FirstBurstLength"),
            immediate_data: flag("ImmediateData"),
            initial_r2t: flag("InitialR2T"),
            keys: all,
        };
        ini.tsih = resp.tsih;
        assert_ne!(ini.tsih, 0, "a new session gets a TSIH");
        ini.max_cmd_sn = resp.max_cmd_sn;
        assert_eq!(resp.exp_cmd_sn, FIRST_CMD_SN, "ExpCmdSN after login");
        ini.decoder = DecoderConfig {
            digests: ini.negotiated.digests,
            max_data_segment: opts.max_recv_data_segment,
        };
        Ok(ini)
    }

    /// One Login Request and its response (refusals end the login).
    fn login_step(
        &mut self,
        csg: LoginStage,
        transit: bool,
        nsg: LoginStage,
        pairs: &[(&str, &str)],
    ) -> Result<(LoginResponse, Vec<(String, String)>), Refused> {
        let mut data = Vec::new();
        text::encode(pairs, &mut data);
        let pdu = InitiatorPdu::LoginRequest(LoginRequest {
            transit,
            cont: false,
            csg,
            nsg: if transit {
                nsg
            } else {
                LoginStage::SecurityNegotiation
            },
            version_max: 0,
            version_min: 0,
            isid: self.isid,
            tsih: 0,
            itt: 0x4c,
            cid: 0,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
        });
        self.send_pdu(&pdu, &data);
        let rx = self.recv().expect("connection closed during login");
        let TargetPdu::LoginResponse(resp) = rx.pdu else {
            panic!("expected a Login Response, got {:?}", rx.pdu);
        };
        assert_eq!(resp.itt, 0x4c);
        assert_eq!(resp.isid, self.isid);
        if self.synced {
            assert_eq!(resp.stat_sn, self.exp_stat_sn, "login StatSN in order");
        }
        self.synced = true;
        self.exp_stat_sn = resp.stat_sn.wrapping_add(1);
        if resp.status_class != 0 {
            let status = u16::from(resp.status_class) << 8 | u16::from(resp.status_detail);
            assert!(rx.data.is_empty(), "a refusal carries no keys");
            let closed = self.wait_closed().is_empty();
            return Err(Refused { status, closed });
        }
        let keys = text::parse(&rx.data).expect("login keys");
        Ok((resp, keys))
    }
}

/// A key's value.
pub fn key<'a>(pairs: &'a [(String, String)], k: &str) -> Option<&'a str> {
    pairs.iter().find(|(x, _)| x == k).map(|(_, v)| v.as_str())
}
