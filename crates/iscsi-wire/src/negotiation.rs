//! Operational parameters of an iSCSI session and connection (RFC 7143
//! §13): their defaults, what the target supports ([`TargetLimits`]), and
//! the target's side of negotiating them ([`Negotiator`]).
//!
//! Invariants:
//! - [`SessionParams::default`] and [`ConnectionParams::default`] are the
//!   RFC defaults, which hold for every key not negotiated.
//! - A negotiated value always satisfies the key's result function against
//!   both the initiator's offer and [`TargetLimits`] (AND, OR, minimum,
//!   maximum), and lies in the key's legal range; an out-of-range offer is
//!   answered `Reject` and the key keeps its default.
//! - Each key is negotiated at most once per login; a second offer is a
//!   protocol error ([`NegotiationError::Renegotiated`]).
//! - The final parameters keep FirstBurstLength <= MaxBurstLength.

mod negotiator;

pub use negotiator::{Negotiator, OPERATIONAL_KEYS};

/// Smallest legal MaxRecvDataSegmentLength, MaxBurstLength and
/// FirstBurstLength (RFC 7143 §13.12-13.14).
pub const MIN_DATA_LENGTH: u32 = 512;
/// Largest legal value of those keys: 2^24 - 1.
pub const MAX_DATA_LENGTH: u32 = (1 << 24) - 1;
/// MaxRecvDataSegmentLength assumed until declared, and during login.
pub const DEFAULT_MAX_RECV_DATA_SEGMENT_LENGTH: u32 = 8192;
/// Largest DefaultTime2Wait / DefaultTime2Retain (RFC 7143 §13.15-13.16).
pub const MAX_TIME2: u16 = 3600;

/// A header or data digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Digest {
    #[default]
    None,
    Crc32c,
}

impl Digest {
    /// The key value: `None` or `CRC32C`.
    pub fn as_str(self) -> &'static str {
        match self {
            Digest::None => "None",
            Digest::Crc32c => "CRC32C",
        }
    }
}

/// The SessionType key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SessionType {
    #[default]
    Normal,
    Discovery,
}

impl SessionType {
    /// Decodes the key value (`Normal` or `Discovery`, case-sensitive).
    pub fn parse(value: &str) -> Option<SessionType> {
        match value {
            "Normal" => Some(SessionType::Normal),
            "Discovery" => Some(SessionType::Discovery),
            _ => None,
        }
    }
}

/// What Basalt's target supports and prefers. The negotiation never agrees
/// to more than this.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetLimits {
    /// The largest data segment the target receives (declared to the
    /// initiator as its MaxRecvDataSegmentLength).
    pub max_recv_data_segment_length: u32,
    pub max_burst_length: u32,
    pub first_burst_length: u32,
    /// Whether the target accepts immediate data (ImmediateData=Yes).
    pub immediate_data: bool,
    /// Whether the target requires an R2T before any unsolicited data
    /// (InitialR2T=Yes whatever the initiator offers).
    pub initial_r2t: bool,
    /// Whether CRC32C may be chosen for header / data digests.
    pub header_digest_crc32c: bool,
    pub data_digest_crc32c: bool,
    pub max_connections: u16,
    pub max_outstanding_r2t: u16,
    pub default_time2wait: u16,
    pub default_time2retain: u16,
    /// The portal group tag of the portal the connection arrived on,
    /// returned as TargetPortalGroupTag.
    pub target_portal_group_tag: u16,
}

impl Default for TargetLimits {
    fn default() -> TargetLimits {
        TargetLimits {
            max_recv_data_segment_length: 262_144,
            max_burst_length: 1_048_576,
            first_burst_length: 262_144,
            immediate_data: true,
            initial_r2t: false,
            header_digest_crc32c: true,
            data_digest_crc32c: true,
            max_connections: 1,
            max_outstanding_r2t: 1,
            default_time2wait: 2,
            // Error recovery level 0 keeps no tasks after a connection
            // fails, so promise no retention.
            default_time2retain: 0,
            target_portal_group_tag: 1,
        }
    }
}

/// Why a [`TargetLimits`] is outside what RFC 7143 allows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitsError {
    #[error("{field} is {value}, outside {min}..={max}")]
    OutOfRange {
        field: &'static str,
        value: u32,
        min: u32,
        max: u32,
    },
    #[error("first_burst_length {first} exceeds max_burst_length {max}")]
    FirstBurstAboveMaxBurst { first: u32, max: u32 },
}

impl TargetLimits {
    /// Checks every field against its key's legal range.
    pub fn validate(&self) -> Result<(), LimitsError> {
        let check = |field, value: u32, min: u32, max: u32| {
            if (min..=max).contains(&value) {
                Ok(())
            } else {
                Err(LimitsError::OutOfRange {
                    field,
                    value,
                    min,
                    max,
                })
            }
        };
        let (lo, hi) = (MIN_DATA_LENGTH, MAX_DATA_LENGTH);
        check(
            "max_recv_data_segment_length",
            self.max_recv_data_segment_length,
            lo,
            hi,
        )?;
        check("max_burst_length", self.max_burst_length, lo, hi)?;
        check("first_burst_length", self.first_burst_length, lo, hi)?;
        check("max_connections", self.max_connections.into(), 1, 65535)?;
        check(
            "max_outstanding_r2t",
            self.max_outstanding_r2t.into(),
            1,
            65535,
        )?;
        let t2 = u32::from(MAX_TIME2);
        check("default_time2wait", self.default_time2wait.into(), 0, t2)?;
        check(
            "default_time2retain",
            self.default_time2retain.into(),
            0,
            t2,
        )?;
        if self.first_burst_length > self.max_burst_length {
            return Err(LimitsError::FirstBurstAboveMaxBurst {
                first: self.first_burst_length,
                max: self.max_burst_length,
            });
        }
        Ok(())
    }
}

/// Session-wide operational parameters (RFC 7143 §13, scope SW).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionParams {
    pub max_connections: u16,
    pub initial_r2t: bool,
    pub immediate_data: bool,
    pub max_burst_length: u32,
    /// Meaningless when `initial_r2t && !immediate_data` (see
    /// [`SessionParams::first_burst_relevant`]).
    pub first_burst_length: u32,
    pub default_time2wait: u16,
    pub default_time2retain: u16,
    pub max_outstanding_r2t: u16,
    pub data_pdu_in_order: bool,
    pub data_sequence_in_order: bool,
    pub error_recovery_level: u8,
}

impl Default for SessionParams {
    /// The RFC 7143 defaults.
    fn default() -> SessionParams {
        SessionParams {
            max_connections: 1,
            initial_r2t: true,
            immediate_data: true,
            max_burst_length: 262_144,
            first_burst_length: 65_536,
            default_time2wait: 2,
            default_time2retain: 20,
            max_outstanding_r2t: 1,
            data_pdu_in_order: true,
            data_sequence_in_order: true,
            error_recovery_level: 0,
        }
    }
}

impl SessionParams {
    /// Whether unsolicited data can be sent at all, which is when
    /// FirstBurstLength matters (RFC 7143 §13.14).
    pub fn first_burst_relevant(&self) -> bool {
        !self.initial_r2t || self.immediate_data
    }
}

/// Per-connection operational parameters (RFC 7143 §13, scope CO).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionParams {
    pub header_digest: Digest,
    pub data_digest: Digest,
    /// The largest data segment the initiator receives: the target never
    /// sends a longer one.
    pub initiator_max_recv_data_segment_length: u32,
    /// The largest data segment the target declared it receives (8192 if
    /// the login ended before the target could declare it).
    pub target_max_recv_data_segment_length: u32,
}

impl Default for ConnectionParams {
    fn default() -> ConnectionParams {
        ConnectionParams {
            header_digest: Digest::None,
            data_digest: Digest::None,
            initiator_max_recv_data_segment_length: DEFAULT_MAX_RECV_DATA_SEGMENT_LENGTH,
            target_max_recv_data_segment_length: DEFAULT_MAX_RECV_DATA_SEGMENT_LENGTH,
        }
    }
}

/// Why the operational negotiation cannot continue (the login fails with
/// status 0x0200, initiator error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NegotiationError {
    #[error("key {0} was already negotiated in this login")]
    Renegotiated(String),
    #[error("{key}={value}: only valid as an answer to an offer the target made")]
    UnexpectedAnswer { key: String, value: String },
    #[error("{key}={value}: invalid declaration")]
    InvalidDeclaration { key: String, value: String },
    #[error("{key}={value}: invalid answer to the target's offer")]
    InvalidAnswer { key: String, value: String },
    #[error("the initiator did not answer the target's offer of {0}")]
    MissingAnswer(String),
    #[error("FirstBurstLength {first} exceeds MaxBurstLength {max}")]
    FirstBurstAboveMaxBurst { first: u32, max: u32 },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_rfc_defaults() {
        let s = SessionParams::default();
        assert_eq!(s.max_burst_length, 262144);
        assert_eq!(s.first_burst_length, 65536);
        assert!(s.initial_r2t && s.immediate_data);
        assert_eq!(s.default_time2retain, 20);
        let c = ConnectionParams::default();
        assert_eq!(c.initiator_max_recv_data_segment_length, 8192);
        assert_eq!(c.header_digest, Digest::None);
    }

    #[test]
    fn limits_validation() {
        assert_eq!(TargetLimits::default().validate(), Ok(()));
        let bad = TargetLimits {
            max_recv_data_segment_length: 511,
            ..TargetLimits::default()
        };
        assert!(matches!(
            bad.validate(),
            Err(LimitsError::OutOfRange { value: 511, .. })
        ));
        let bad = TargetLimits {
            first_burst_length: 2_000_000,
            ..TargetLimits::default()
        };
        assert!(matches!(
            bad.validate(),
            Err(LimitsError::FirstBurstAboveMaxBurst { .. })
        ));
    }
}
