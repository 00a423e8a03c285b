//! [`LoginMachine`]: one connection's login phase, request by request.
//!
//! Invariants (beyond the parent module's):
//! - ISID, TSIH, ITT and CID are those of the first request for the whole
//!   login; a change is an initiator error (0x0200).
//! - The data segments of requests with C=1 are joined (up to
//!   [`MAX_LOGIN_TEXT`] bytes) and answered with empty responses until the
//!   request with C=0; only then are the keys processed.
//! - A response longer than [`LOGIN_MAX_SEGMENT`] is sent in pieces with
//!   C=1 (and T=0); the initiator fetches each next piece with an empty
//!   request.
//! - Once the machine has failed or completed, every further request fails
//!   with 0x0200.

use super::{
    Authorization, ConnectionIdentity, LoginEvent, LoginOutcome, LoginPolicy, LoginRequest,
    LoginResponse, LoginStatus, Stage,
};
use crate::chap::{ChapAnswer, ChapCredentials, TargetChap};
use crate::negotiation::{
    Negotiator, SessionType, TargetLimits, DEFAULT_MAX_RECV_DATA_SEGMENT_LENGTH,
};
use crate::text::{self, value};

/// The largest data segment of a login response: the initiator's
/// MaxRecvDataSegmentLength only applies after login, the default before.
pub const LOGIN_MAX_SEGMENT: usize = DEFAULT_MAX_RECV_DATA_SEGMENT_LENGTH as usize;
/// The most text one login exchange (C-bit sequence) may carry: RFC 7143
/// §6.1 asks for at least 8192 bytes, 64 KiB for long authentication items.
pub const MAX_LOGIN_TEXT: usize = 65_536;
/// The most requests one login may take before the target gives up.
pub const MAX_LOGIN_PDUS: u32 = 256;

/// Keys the first request carries and no later one may repeat.
const SESSION_KEYS: &[&str] = &[
    "InitiatorName",
    "InitiatorAlias",
    "TargetName",
    "SessionType",
];
/// Keys of the security stage this target speaks.
const SECURITY_KEYS: &[&str] = &[
    "AuthMethod",
    "CHAP_A",
    "CHAP_I",
    "CHAP_C",
    "CHAP_N",
    "CHAP_R",
];
/// Keys only a target sends (or only sent in full feature phase): refused.
const REFUSED_KEYS: &[&str] = &[
    "TargetAlias",
    "TargetAddress",
    "TargetPortalGroupTag",
    "SendTargets",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Active,
    Complete,
    Failed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Auth {
    NotStarted,
    AwaitAlgorithm,
    AwaitResponse,
    Done,
}

/// The header fields that must not change during the login.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Identity {
    isid: [u8; 6],
    tsih: u16,
    itt: u32,
    cid: u16,
}

/// What the first complete request established.
#[derive(Debug, Clone)]
struct Session {
    session_type: SessionType,
    initiator_name: String,
    initiator_alias: Option<String>,
    target_name: Option<String>,
    /// None: open access.
    credentials: Option<ChapCredentials>,
    negotiator: Negotiator,
}

/// A response too long for one PDU: the part still to send.
#[derive(Debug, Clone)]
struct Pending {
    data: Vec<u8>,
    sent: usize,
    /// The stage to move to once the last piece is sent, if agreed.
    transit_to: Option<Stage>,
}

/// One connection's login phase.
#[derive(Debug, Clone)]
pub struct LoginMachine {
    limits: TargetLimits,
    chap: TargetChap,
    phase: Phase,
    stage: Stage,
    identity: Option<Identity>,
    stat_sn: u32,
    requests: u32,
    incoming: Vec<u8>,
    outgoing: Option<Pending>,
    session: Option<Session>,
    auth: Auth,
    authenticated_user: Option<String>,
    last_csg: Stage,
    last_cmd_sn: u32,
}

type Pairs = Vec<(String, String)>;

impl LoginMachine {
    /// A machine for a new connection. `challenge` and `identifier` must be
    /// fresh random values (the CHAP challenge of this login, if any).
    pub fn new(limits: TargetLimits, challenge: [u8; 16], identifier: u8) -> LoginMachine {
        LoginMachine {
            limits,
            chap: TargetChap::new(identifier, &challenge),
            phase: Phase::Active,
            stage: Stage::Security,
            identity: None,
            stat_sn: 0,
            requests: 0,
            incoming: Vec::new(),
            outgoing: None,
            session: None,
            auth: Auth::NotStarted,
            authenticated_user: None,
            last_csg: Stage::Security,
            last_cmd_sn: 0,
        }
    }

    /// The StatSN the next response (login or full feature) carries, once
    /// the first request has been seen.
    pub fn next_stat_sn(&self) -> Option<u32> {
        self.identity.map(|_| self.stat_sn)
    }

    /// Whether the login is over (completed or failed).
    pub fn is_finished(&self) -> bool {
        self.phase != Phase::Active
    }

    /// Handles one login request.
    pub fn receive<P: LoginPolicy + ?Sized>(
        &mut self,
        req: &LoginRequest,
        policy: &P,
    ) -> (LoginResponse, LoginEvent) {
        match self.step(req, policy) {
            Ok(step) => step,
            Err(status) => self.fail(req, status),
        }
    }

    /// Ends the login with `status` from the caller's side, e.g. when the
    /// outcome of [`LoginEvent::Complete`] cannot be honoured (unknown
    /// session, too many connections, out of resources): send this
    /// response instead of the successful one, then close.
    pub fn reject(&mut self, status: LoginStatus) -> LoginResponse {
        let identity = self.identity.unwrap_or(Identity {
            isid: [0; 6],
            tsih: 0,
            itt: 0,
            cid: 0,
        });
        self.phase = Phase::Failed;
        let stat_sn = self.take_stat_sn();
        LoginResponse {
            transit: false,
            cont: false,
            csg: self.last_csg,
            nsg: Stage::Security,
            version_max: 0,
            version_active: 0,
            isid: identity.isid,
            tsih: identity.tsih,
            itt: identity.itt,
            stat_sn,
            exp_cmd_sn: self.last_cmd_sn,
            max_cmd_sn: self.last_cmd_sn,
            status_class: status.class(),
            status_detail: status.detail(),
            data: Vec::new(),
        }
    }

    fn fail(&mut self, req: &LoginRequest, status: LoginStatus) -> (LoginResponse, LoginEvent) {
        self.last_csg = req.csg;
        self.last_cmd_sn = req.cmd_sn;
        let mut response = self.reject(status);
        // Echo what this request carried, even if it broke consistency.
        response.isid = req.isid;
        response.tsih = req.tsih;
        response.itt = req.itt;
        (response, LoginEvent::Failed(status))
    }

    fn take_stat_sn(&mut self) -> u32 {
        let sn = self.stat_sn;
        self.stat_sn = sn.wrapping_add(1);
        sn
    }

    fn step<P: LoginPolicy + ?Sized>(
        &mut self,
        req: &LoginRequest,
        policy: &P,
    ) -> Result<(LoginResponse, LoginEvent), LoginStatus> {
        if self.phase != Phase::Active {
            return Err(LoginStatus::InitiatorError);
        }
        self.requests = self.requests.saturating_add(1);
        if self.requests > MAX_LOGIN_PDUS {
            return Err(LoginStatus::InitiatorError);
        }
        self.check_header(req)?;
        self.last_csg = req.csg;
        self.last_cmd_sn = req.cmd_sn;

        if self.outgoing.is_some() {
            if !req.data.is_empty() || req.cont {
                return Err(LoginStatus::InitiatorError);
            }
            return self.send_pending(req);
        }

        if self.incoming.len().saturating_add(req.data.len()) > MAX_LOGIN_TEXT {
            return Err(LoginStatus::OutOfResources);
        }
        self.incoming.extend_from_slice(&req.data);
        if req.cont {
            let response = self.response(req, false, false, Stage::Security, Vec::new());
            return Ok((response, LoginEvent::Continue));
        }
        let text = std::mem::take(&mut self.incoming);
        let pairs = text::parse(&text).map_err(|_| LoginStatus::InitiatorError)?;

        let mut replies = Pairs::new();
        let transit_to = self.process(req, &pairs, policy, &mut replies)?;
        let mut data = Vec::new();
        text::encode(&replies, &mut data);
        self.outgoing = Some(Pending {
            data,
            sent: 0,
            transit_to,
        });
        self.send_pending(req)
    }

    /// Version, stage fields and header consistency.
    fn check_header(&mut self, req: &LoginRequest) -> Result<(), LoginStatus> {
        let identity = Identity {
            isid: req.isid,
            tsih: req.tsih,
            itt: req.itt,
            cid: req.cid,
        };
        match self.identity {
            None => {
                self.stat_sn = req.exp_stat_sn;
                self.identity = Some(identity);
                // Only version 0x00 exists (RFC 7143 §11.12.4).
                if req.version_min > 0 || req.version_max < req.version_min {
                    return Err(LoginStatus::UnsupportedVersion);
                }
                if !matches!(req.csg, Stage::Security | Stage::Operational) {
                    return Err(LoginStatus::InitiatorError);
                }
                self.stage = req.csg;
            }
            Some(first) if first != identity => return Err(LoginStatus::InitiatorError),
            Some(_) => {}
        }
        if req.csg != self.stage || (req.transit && req.cont) {
            return Err(LoginStatus::InitiatorError);
        }
        if req.transit {
            let allowed = matches!(
                (req.csg, req.nsg),
                (Stage::Security, Stage::Operational | Stage::FullFeature)
                    | (Stage::Operational, Stage::FullFeature)
            );
            if !allowed {
                return Err(LoginStatus::InitiatorError);
            }
        }
        Ok(())
    }

    /// Processes the keys of one complete request; returns the stage to
    /// move to if the target agrees to transit.
    fn process<P: LoginPolicy + ?Sized>(
        &mut self,
        req: &LoginRequest,
        pairs: &Pairs,
        policy: &P,
        replies: &mut Pairs,
    ) -> Result<Option<Stage>, LoginStatus> {
        let rest: Pairs = if self.session.is_none() {
            self.start_session(req, pairs, policy, replies)?;
            pairs
                .iter()
                .filter(|(k, _)| !SESSION_KEYS.contains(&k.as_str()))
                .cloned()
                .collect()
        } else {
            if pairs
                .iter()
                .any(|(k, _)| SESSION_KEYS.contains(&k.as_str()))
            {
                return Err(LoginStatus::InitiatorError);
            }
            pairs.clone()
        };
        match self.stage {
            Stage::Security => self.security(req, &rest, replies),
            _ => self.operational(req, &rest, replies),
        }
    }

    fn start_session<P: LoginPolicy + ?Sized>(
        &mut self,
        req: &LoginRequest,
        pairs: &Pairs,
        policy: &P,
        replies: &mut Pairs,
    ) -> Result<(), LoginStatus> {
        let get = |key: &str| {
            pairs
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.as_str())
        };
        let initiator_name = get("InitiatorName")
            .filter(|n| !n.is_empty())
            .ok_or(LoginStatus::MissingParameter)?;
        let session_type = match get("SessionType") {
            None => SessionType::Normal,
            Some(v) => SessionType::parse(v).ok_or(LoginStatus::SessionTypeNotSupported)?,
        };
        let target_name = match session_type {
            SessionType::Discovery => None,
            SessionType::Normal => {
                let name = get("TargetName")
                    .filter(|n| !n.is_empty())
                    .ok_or(LoginStatus::MissingParameter)?;
                if !policy.target_exists(name) {
                    return Err(LoginStatus::NotFound);
                }
                Some(name)
            }
        };
        let credentials = match policy.authorization(initiator_name, target_name) {
            Authorization::Denied => return Err(LoginStatus::AuthorizationFailure),
            Authorization::Open => None,
            Authorization::Chap {
                initiator_user,
                initiator_secret,
                mutual,
            } => Some(
                // Secrets that break the rules are a configuration error.
                ChapCredentials::new(initiator_user, initiator_secret, mutual)
                    .map_err(|_| LoginStatus::TargetError)?,
            ),
        };
        policy.admit_connection(&ConnectionIdentity {
            session_type,
            initiator_name,
            target_name,
            isid: req.isid,
            tsih: req.tsih,
            cid: req.cid,
        })?;
        if credentials.is_some() && self.stage != Stage::Security {
            // The initiator skipped the security stage.
            return Err(LoginStatus::AuthenticationFailure);
        }
        if target_name.is_some() {
            // Returned with the first response when TargetName is given
            // (RFC 7143 §13.9).
            replies.push((
                "TargetPortalGroupTag".into(),
                self.limits.target_portal_group_tag.to_string(),
            ));
        }
        self.session = Some(Session {
            session_type,
            initiator_name: initiator_name.to_owned(),
            initiator_alias: get("InitiatorAlias").map(str::to_owned),
            target_name: target_name.map(str::to_owned),
            credentials,
            negotiator: Negotiator::new(self.limits.clone(), session_type),
        });
        Ok(())
    }

    fn security(
        &mut self,
        req: &LoginRequest,
        pairs: &Pairs,
        replies: &mut Pairs,
    ) -> Result<Option<Stage>, LoginStatus> {
        let session = self.session.as_ref().ok_or(LoginStatus::TargetError)?;
        let chap_required = session.credentials.is_some();
        let get = |key: &str| {
            pairs
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.as_str())
        };
        for (key, _) in pairs {
            if SECURITY_KEYS.contains(&key.as_str()) {
                continue;
            }
            if Negotiator::is_operational_key(key) {
                // Operational keys belong to the operational stage.
                return Err(LoginStatus::InitiatorError);
            }
            let answer = if REFUSED_KEYS.contains(&key.as_str()) {
                value::REJECT
            } else {
                value::NOT_UNDERSTOOD
            };
            replies.push((key.clone(), answer.to_owned()));
        }

        if let Some(methods) = get("AuthMethod") {
            if self.auth != Auth::NotStarted {
                return Err(LoginStatus::InitiatorError);
            }
            let wanted = if chap_required { "CHAP" } else { value::NONE };
            if !value::list(methods).any(|m| m == wanted) {
                return Err(LoginStatus::AuthenticationFailure);
            }
            replies.push(("AuthMethod".into(), wanted.to_owned()));
            self.auth = if chap_required {
                Auth::AwaitAlgorithm
            } else {
                Auth::Done
            };
        } else if self.auth == Auth::AwaitAlgorithm && get("CHAP_A").is_none() {
            return Err(LoginStatus::AuthenticationFailure);
        }

        let chap_a = get("CHAP_A");
        if let Some(algorithms) = chap_a {
            if self.auth != Auth::AwaitAlgorithm {
                return Err(LoginStatus::InitiatorError);
            }
            let challenge = self
                .chap
                .offer(algorithms)
                .map_err(|_| LoginStatus::AuthenticationFailure)?;
            replies.extend(challenge.to_pairs());
            self.auth = Auth::AwaitResponse;
        }

        let answer = ChapAnswer {
            name: get("CHAP_N"),
            response: get("CHAP_R"),
            identifier: get("CHAP_I"),
            challenge: get("CHAP_C"),
        };
        let answered = answer != ChapAnswer::default();
        if answered {
            if self.auth != Auth::AwaitResponse || chap_a.is_some() {
                return Err(LoginStatus::InitiatorError);
            }
            let credentials = session
                .credentials
                .as_ref()
                .ok_or(LoginStatus::TargetError)?;
            let mutual = self
                .chap
                .verify(&answer, credentials)
                .map_err(|_| LoginStatus::AuthenticationFailure)?;
            if let Some(mutual) = mutual {
                replies.extend(mutual.to_pairs());
            }
            self.authenticated_user = answer.name.map(str::to_owned);
            self.auth = Auth::Done;
        } else if self.auth == Auth::AwaitResponse && chap_a.is_none() {
            return Err(LoginStatus::AuthenticationFailure);
        }

        if !req.transit {
            return Ok(None);
        }
        match (self.auth, chap_required) {
            (Auth::Done, _) => {}
            (Auth::NotStarted, false) => self.auth = Auth::Done,
            (Auth::NotStarted, true) => return Err(LoginStatus::AuthenticationFailure),
            (Auth::AwaitAlgorithm | Auth::AwaitResponse, _) => return Ok(None),
        }
        if req.nsg == Stage::FullFeature && self.needs_operational_stage() {
            // The defaults do not suit the target: go through the
            // operational stage instead (a lower stage than asked).
            return Ok(Some(Stage::Operational));
        }
        Ok(Some(req.nsg))
    }

    /// Whether the target must negotiate or declare something before the
    /// full feature phase, which skipping the operational stage prevents.
    fn needs_operational_stage(&self) -> bool {
        let Some(session) = &self.session else {
            return false;
        };
        let mut probe = session.negotiator.clone();
        probe.make_offers(&mut Vec::new())
            || self.limits.max_recv_data_segment_length < DEFAULT_MAX_RECV_DATA_SEGMENT_LENGTH
    }

    fn operational(
        &mut self,
        req: &LoginRequest,
        pairs: &Pairs,
        replies: &mut Pairs,
    ) -> Result<Option<Stage>, LoginStatus> {
        let session = self.session.as_mut().ok_or(LoginStatus::TargetError)?;
        let mut keys = Pairs::new();
        for (key, v) in pairs {
            if SECURITY_KEYS.contains(&key.as_str()) {
                return Err(LoginStatus::InitiatorError);
            }
            if REFUSED_KEYS.contains(&key.as_str()) {
                replies.push((key.clone(), value::REJECT.to_owned()));
            } else {
                keys.push((key.clone(), v.clone()));
            }
        }
        let negotiator = &mut session.negotiator;
        let was_awaiting = negotiator.awaiting_answers();
        negotiator
            .receive_all(&keys, replies)
            .map_err(|_| LoginStatus::InitiatorError)?;
        if was_awaiting && negotiator.awaiting_answers() {
            // The request after the target's offers must answer them.
            return Err(LoginStatus::InitiatorError);
        }
        negotiator.declare(replies);
        if !req.transit || negotiator.make_offers(replies) {
            return Ok(None);
        }
        Ok(Some(Stage::FullFeature))
    }

    /// Sends the next piece of the pending response.
    fn send_pending(
        &mut self,
        req: &LoginRequest,
    ) -> Result<(LoginResponse, LoginEvent), LoginStatus> {
        let pending = self.outgoing.take().ok_or(LoginStatus::TargetError)?;
        let end = pending
            .sent
            .saturating_add(LOGIN_MAX_SEGMENT)
            .min(pending.data.len());
        let piece = pending
            .data
            .get(pending.sent..end)
            .unwrap_or_default()
            .to_vec();
        if end < pending.data.len() {
            let response = self.response(req, false, true, Stage::Security, piece);
            self.outgoing = Some(Pending {
                sent: end,
                ..pending
            });
            return Ok((response, LoginEvent::Continue));
        }
        // The transit decision was taken on the request that carried the
        // keys; the empty requests fetching pieces do not change it.
        let Some(next) = pending.transit_to else {
            let response = self.response(req, false, false, Stage::Security, piece);
            return Ok((response, LoginEvent::Continue));
        };
        if next != Stage::FullFeature {
            self.stage = next;
            let response = self.response(req, true, false, next, piece);
            return Ok((response, LoginEvent::Continue));
        }
        let outcome = self.outcome(req)?;
        let response = self.response(req, true, false, next, piece);
        self.stage = Stage::FullFeature;
        self.phase = Phase::Complete;
        let outcome = LoginOutcome {
            next_stat_sn: self.stat_sn,
            ..outcome
        };
        Ok((response, LoginEvent::Complete(Box::new(outcome))))
    }

    fn outcome(&self, req: &LoginRequest) -> Result<LoginOutcome, LoginStatus> {
        let session = self.session.as_ref().ok_or(LoginStatus::TargetError)?;
        let (params, connection) = session
            .negotiator
            .finish()
            .map_err(|_| LoginStatus::InitiatorError)?;
        Ok(LoginOutcome {
            session_type: session.session_type,
            initiator_name: session.initiator_name.clone(),
            initiator_alias: session.initiator_alias.clone(),
            target_name: session.target_name.clone(),
            isid: req.isid,
            tsih: req.tsih,
            new_session: req.tsih == 0,
            cid: req.cid,
            authenticated_user: self.authenticated_user.clone(),
            session: params,
            connection,
            exp_cmd_sn: req.cmd_sn,
            next_stat_sn: self.stat_sn,
        })
    }

    fn response(
        &mut self,
        req: &LoginRequest,
        transit: bool,
        cont: bool,
        nsg: Stage,
        data: Vec<u8>,
    ) -> LoginResponse {
        let stat_sn = self.take_stat_sn();
        LoginResponse {
            transit,
            cont,
            csg: req.csg,
            nsg: if transit { nsg } else { Stage::Security },
            version_max: 0,
            version_active: 0,
            isid: req.isid,
            tsih: req.tsih,
            itt: req.itt,
            stat_sn,
            exp_cmd_sn: req.cmd_sn,
            max_cmd_sn: req.cmd_sn,
            status_class: 0,
            status_detail: 0,
            data,
        }
    }
}
