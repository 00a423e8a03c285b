//! The target side of the iSCSI login phase (RFC 7143 §6.2-6.3, §11.12-
//! 11.13) as a pure state machine, [`LoginMachine`], one per connection:
//! login request fields in, login response fields and a [`LoginEvent`] out.
//! Also the Text Request answers of the full feature phase (SendTargets) in
//! [`send_targets`].
//!
//! Invariants:
//! - The machine never panics, whatever the requests; it performs no I/O and
//!   draws no randomness (the CHAP identifier and challenge are given to
//!   [`LoginMachine::new`]); policy questions go to a [`LoginPolicy`].
//! - Every request gets exactly one response. A response with a non-zero
//!   status class ends the login ([`LoginEvent::Failed`]): the target sends
//!   it and closes the connection. [`LoginEvent::Complete`] comes with the
//!   response that moves the connection to the full feature phase.
//! - StatSN starts at the first request's ExpStatSN and increases by one per
//!   response.
//! - The target sets T only when the initiator did and the target agrees,
//!   and never moves to a later stage than the initiator asked for.
//! - Authentication is never skipped: with [`Authorization::Chap`] the
//!   security stage must end with a verified CHAP response.

mod machine;
pub mod send_targets;

use crate::negotiation::{ConnectionParams, SessionParams, SessionType};

pub use machine::{LoginMachine, LOGIN_MAX_SEGMENT, MAX_LOGIN_PDUS, MAX_LOGIN_TEXT};

/// A login stage (CSG/NSG fields). Value 2 is reserved: a request naming it
/// fails the login.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Stage {
    Security = 0,
    Operational = 1,
    Reserved = 2,
    FullFeature = 3,
}

impl Stage {
    /// The stage encoded in the low two bits of `bits`.
    pub fn from_bits(bits: u8) -> Stage {
        match bits & 0x03 {
            0 => Stage::Security,
            1 => Stage::Operational,
            2 => Stage::Reserved,
            _ => Stage::FullFeature,
        }
    }

    /// The two-bit field value.
    pub fn bits(self) -> u8 {
        self as u8
    }
}

/// Status-Class and Status-Detail of a login response (RFC 7143 §11.13.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LoginStatus {
    Success,
    TargetMovedTemporarily,
    TargetMovedPermanently,
    InitiatorError,
    AuthenticationFailure,
    AuthorizationFailure,
    NotFound,
    TargetRemoved,
    UnsupportedVersion,
    TooManyConnections,
    MissingParameter,
    CantIncludeInSession,
    SessionTypeNotSupported,
    SessionDoesNotExist,
    InvalidDuringLogin,
    TargetError,
    ServiceUnavailable,
    OutOfResources,
}

impl LoginStatus {
    /// The status as `class << 8 | detail`.
    pub fn code(self) -> u16 {
        use LoginStatus::*;
        match self {
            Success => 0x0000,
            TargetMovedTemporarily => 0x0101,
            TargetMovedPermanently => 0x0102,
            InitiatorError => 0x0200,
            AuthenticationFailure => 0x0201,
            AuthorizationFailure => 0x0202,
            NotFound => 0x0203,
            TargetRemoved => 0x0204,
            UnsupportedVersion => 0x0205,
            TooManyConnections => 0x0206,
            MissingParameter => 0x0207,
            CantIncludeInSession => 0x0208,
            SessionTypeNotSupported => 0x0209,
            SessionDoesNotExist => 0x020a,
            InvalidDuringLogin => 0x020b,
            TargetError => 0x0300,
            ServiceUnavailable => 0x0301,
            OutOfResources => 0x0302,
        }
    }

    pub fn class(self) -> u8 {
        (self.code() >> 8) as u8
    }

    pub fn detail(self) -> u8 {
        (self.code() & 0xff) as u8
    }
}

/// The fields of one Login Request PDU the machine needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginRequest {
    pub transit: bool,
    pub cont: bool,
    pub csg: Stage,
    pub nsg: Stage,
    pub version_max: u8,
    pub version_min: u8,
    pub isid: [u8; 6],
    pub tsih: u16,
    pub itt: u32,
    pub cid: u16,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
    /// The data segment (text keys), without padding or digest.
    pub data: Vec<u8>,
}

/// The fields of the Login Response PDU to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginResponse {
    pub transit: bool,
    pub cont: bool,
    pub csg: Stage,
    /// Meaningful only with `transit` (zero otherwise).
    pub nsg: Stage,
    pub version_max: u8,
    pub version_active: u8,
    pub isid: [u8; 6],
    /// The request's TSIH. For the final response of a new session the
    /// caller writes the TSIH it assigned here.
    pub tsih: u16,
    pub itt: u32,
    pub stat_sn: u32,
    /// The request's CmdSN (login requests are immediate).
    pub exp_cmd_sn: u32,
    /// Equal to `exp_cmd_sn`; the caller may widen the command window in
    /// the final response.
    pub max_cmd_sn: u32,
    pub status_class: u8,
    pub status_detail: u8,
    pub data: Vec<u8>,
}

impl LoginResponse {
    /// The status this response carries, if it is one RFC 7143 defines.
    pub fn status_code(&self) -> u16 {
        u16::from(self.status_class) << 8 | u16::from(self.status_detail)
    }
}

/// What happened with one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoginEvent {
    /// Send the response and wait for the next request.
    Continue,
    /// Send the response (after filling in the TSIH of a new session); the
    /// connection is in the full feature phase.
    Complete(Box<LoginOutcome>),
    /// Send the response and close the connection.
    Failed(LoginStatus),
}

/// What a successful login established.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginOutcome {
    pub session_type: SessionType,
    pub initiator_name: String,
    pub initiator_alias: Option<String>,
    /// The target logged in to (None for discovery sessions).
    pub target_name: Option<String>,
    pub isid: [u8; 6],
    /// The TSIH the initiator sent: 0 for a new session (leading
    /// connection), else the session to add this connection to or to
    /// reinstate a connection of.
    pub tsih: u16,
    /// `tsih == 0`: the caller assigns a TSIH and writes it into the final
    /// response.
    pub new_session: bool,
    pub cid: u16,
    /// The CHAP user that authenticated, if CHAP was used.
    pub authenticated_user: Option<String>,
    pub session: SessionParams,
    pub connection: ConnectionParams,
    /// The login's CmdSN, which the first full-feature command carries.
    pub exp_cmd_sn: u32,
    /// The StatSN of the first full-feature response.
    pub next_stat_sn: u32,
}

/// How an initiator must authenticate to a target.
#[derive(Clone, PartialEq, Eq)]
pub enum Authorization {
    /// The initiator may not log in (status 0x0202).
    Denied,
    /// No authentication (AuthMethod=None, or no security stage at all).
    Open,
    /// CHAP is required. `mutual` is the target's user and secret, used when
    /// the initiator also challenges the target.
    Chap {
        initiator_user: String,
        initiator_secret: Vec<u8>,
        mutual: Option<(String, Vec<u8>)>,
    },
}

impl std::fmt::Debug for Authorization {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Authorization::Denied => f.write_str("Denied"),
            Authorization::Open => f.write_str("Open"),
            Authorization::Chap {
                initiator_user,
                mutual,
                ..
            } => f
                .debug_struct("Chap")
                .field("initiator_user", initiator_user)
                .field("mutual_user", &mutual.as_ref().map(|(u, _)| u))
                .finish_non_exhaustive(),
        }
    }
}

/// The login's identity, as the policy sees it when admitting a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionIdentity<'a> {
    pub session_type: SessionType,
    pub initiator_name: &'a str,
    pub target_name: Option<&'a str>,
    pub isid: [u8; 6],
    pub tsih: u16,
    pub cid: u16,
}

/// The target's configuration, asked by the machine (keeps it pure).
pub trait LoginPolicy {
    /// Whether a target of this name exists (Normal sessions).
    fn target_exists(&self, target_name: &str) -> bool;
    /// How `initiator` must authenticate to `target` (None: discovery).
    fn authorization(&self, initiator: &str, target: Option<&str>) -> Authorization;
    /// Whether this connection may join or start a session, decided after
    /// the first request: for example 0x020a for an unknown TSIH, 0x0206 to
    /// add a connection beyond MaxConnections, 0x0302 when out of
    /// resources. The default admits every connection.
    fn admit_connection(&self, identity: &ConnectionIdentity<'_>) -> Result<(), LoginStatus> {
        let _ = identity;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes() {
        assert_eq!(LoginStatus::AuthenticationFailure.code(), 0x0201);
        assert_eq!(LoginStatus::OutOfResources.class(), 3);
        assert_eq!(LoginStatus::OutOfResources.detail(), 2);
        assert_eq!(LoginStatus::SessionDoesNotExist.code(), 0x020a);
    }

    #[test]
    fn stage_bits() {
        for b in 0..4u8 {
            assert_eq!(Stage::from_bits(b).bits(), b);
        }
        assert_eq!(Stage::from_bits(0x07), Stage::FullFeature);
    }

    #[test]
    fn authorization_debug_hides_secrets() {
        let a = Authorization::Chap {
            initiator_user: "u".into(),
            initiator_secret: b"very secret value".to_vec(),
            mutual: Some(("t".into(), b"other secret value".to_vec())),
        };
        let s = format!("{a:?}");
        assert!(!s.contains("secret value"));
    }
}
