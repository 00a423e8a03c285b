//! The target's side of the operational negotiation of one login: answers
//! each operational key the initiator offers with the RFC 7143 result
//! function, records the initiator's declarations, produces the target's
//! own declaration and the offers the target must make itself, and yields
//! the final [`SessionParams`] and [`ConnectionParams`].
//!
//! Invariants: see the parent module. In addition, unknown keys (including
//! `X-` and `X#` extensions) are answered `NotUnderstood`; the obsolete
//! marker keys are answered as RFC 7143 §13.25 says (IFMarker/OFMarker `No`,
//! IFMarkInt/OFMarkInt `Reject`, never `NotUnderstood`).

use super::{
    ConnectionParams, Digest, NegotiationError, SessionParams, SessionType, TargetLimits,
    DEFAULT_MAX_RECV_DATA_SEGMENT_LENGTH, MAX_DATA_LENGTH, MAX_TIME2, MIN_DATA_LENGTH,
};
use crate::text::value::{self, IRRELEVANT, NOT_UNDERSTOOD, REJECT};
use std::collections::BTreeSet;

/// Every key this module negotiates (operational keys of RFC 7143 §13).
pub const OPERATIONAL_KEYS: &[&str] = &[
    "HeaderDigest",
    "DataDigest",
    "MaxConnections",
    "InitialR2T",
    "ImmediateData",
    "MaxRecvDataSegmentLength",
    "MaxBurstLength",
    "FirstBurstLength",
    "DefaultTime2Wait",
    "DefaultTime2Retain",
    "MaxOutstandingR2T",
    "DataPDUInOrder",
    "DataSequenceInOrder",
    "ErrorRecoveryLevel",
    "IFMarker",
    "OFMarker",
    "IFMarkInt",
    "OFMarkInt",
];

/// Keys RFC 7143 §13 declares irrelevant in a Discovery session.
const NORMAL_ONLY_KEYS: &[&str] = &[
    "MaxConnections",
    "InitialR2T",
    "ImmediateData",
    "MaxBurstLength",
    "FirstBurstLength",
    "MaxOutstandingR2T",
    "DataPDUInOrder",
    "DataSequenceInOrder",
];

/// An offer the target made and awaits the initiator's answer to.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Offer {
    key: &'static str,
    value: u32,
}

/// The operational negotiation state of one login.
#[derive(Debug, Clone)]
pub struct Negotiator {
    limits: TargetLimits,
    session_type: SessionType,
    session: SessionParams,
    connection: ConnectionParams,
    /// Keys offered by the initiator or answered, in this login.
    settled: BTreeSet<String>,
    /// Target offers awaiting an answer.
    offers: Vec<Offer>,
    declared: bool,
}

/// The numeric range and result function of a numeric key.
#[derive(Debug, Clone, Copy)]
enum Numeric {
    Min,
    Max,
}

impl Negotiator {
    pub fn new(limits: TargetLimits, session_type: SessionType) -> Negotiator {
        Negotiator {
            limits,
            session_type,
            session: SessionParams::default(),
            connection: ConnectionParams::default(),
            settled: BTreeSet::new(),
            offers: Vec::new(),
            declared: false,
        }
    }

    /// Whether `key` is one of [`OPERATIONAL_KEYS`].
    pub fn is_operational_key(key: &str) -> bool {
        OPERATIONAL_KEYS.contains(&key)
    }

    /// Handles the operational (and unknown) keys of one complete request,
    /// appending the replies. MaxBurstLength is settled before
    /// FirstBurstLength so the latter can be bounded by the former.
    pub fn receive_all(
        &mut self,
        pairs: &[(String, String)],
        replies: &mut Vec<(String, String)>,
    ) -> Result<(), NegotiationError> {
        let first_burst = |k: &str| k == "FirstBurstLength";
        for (key, value) in pairs.iter().filter(|(k, _)| !first_burst(k)) {
            self.receive(key, value, replies)?;
        }
        for (key, value) in pairs.iter().filter(|(k, _)| first_burst(k)) {
            self.receive(key, value, replies)?;
        }
        Ok(())
    }

    /// Handles one key from the initiator: an offer (answered in
    /// `replies`), a declaration (no reply) or the answer to an offer of the
    /// target.
    pub fn receive(
        &mut self,
        key: &str,
        value: &str,
        replies: &mut Vec<(String, String)>,
    ) -> Result<(), NegotiationError> {
        if let Some(pos) = self.offers.iter().position(|o| o.key == key) {
            let offer = self.offers.remove(pos);
            self.settled.insert(key.to_owned());
            return self.answer_to_offer(&offer, value);
        }
        if !self.settled.insert(key.to_owned()) {
            return Err(NegotiationError::Renegotiated(key.to_owned()));
        }
        if !Self::is_operational_key(key) {
            replies.push((key.to_owned(), NOT_UNDERSTOOD.to_owned()));
            return Ok(());
        }
        if matches!(value, NOT_UNDERSTOOD | REJECT | IRRELEVANT) {
            return Err(NegotiationError::UnexpectedAnswer {
                key: key.to_owned(),
                value: value.to_owned(),
            });
        }
        if key == "MaxRecvDataSegmentLength" {
            return self.declaration(key, value);
        }
        let reply =
            if self.session_type == SessionType::Discovery && NORMAL_ONLY_KEYS.contains(&key) {
                IRRELEVANT.to_owned()
            } else {
                self.offer(key, value)
            };
        replies.push((key.to_owned(), reply));
        Ok(())
    }

    /// The initiator's MaxRecvDataSegmentLength: below 512 or not a number
    /// is a protocol error; above 2^24-1 is capped (the target never sends
    /// more than that anyway).
    fn declaration(&mut self, key: &str, value: &str) -> Result<(), NegotiationError> {
        let n = value::parse_number(value)
            .ok()
            .filter(|&n| n >= u64::from(MIN_DATA_LENGTH))
            .ok_or_else(|| NegotiationError::InvalidDeclaration {
                key: key.to_owned(),
                value: value.to_owned(),
            })?;
        self.connection.initiator_max_recv_data_segment_length = u32::try_from(n)
            .unwrap_or(MAX_DATA_LENGTH)
            .min(MAX_DATA_LENGTH);
        Ok(())
    }

    /// Answers one offer; the returned value is the reply.
    fn offer(&mut self, key: &str, value: &str) -> String {
        let limits = &self.limits;
        let s = &mut self.session;
        let data = (MIN_DATA_LENGTH, MAX_DATA_LENGTH);
        let reply = match key {
            "HeaderDigest" => pick_digest(value, limits.header_digest_crc32c).map(|d| {
                self.connection.header_digest = d;
                d.as_str().to_owned()
            }),
            "DataDigest" => pick_digest(value, limits.data_digest_crc32c).map(|d| {
                self.connection.data_digest = d;
                d.as_str().to_owned()
            }),
            "MaxConnections" => numeric(
                value,
                (1, 65535),
                limits.max_connections.into(),
                Numeric::Min,
            )
            .map(|n| set_u16(&mut s.max_connections, n)),
            "InitialR2T" => boolean(value, |offer| offer || limits.initial_r2t)
                .map(|b| set_bool(&mut s.initial_r2t, b)),
            "ImmediateData" => boolean(value, |offer| offer && limits.immediate_data)
                .map(|b| set_bool(&mut s.immediate_data, b)),
            "MaxBurstLength" => numeric(value, data, limits.max_burst_length, Numeric::Min)
                .map(|n| set_u32(&mut s.max_burst_length, n)),
            "FirstBurstLength" => {
                let ours = limits.first_burst_length.min(s.max_burst_length);
                numeric(value, data, ours, Numeric::Min)
                    .map(|n| set_u32(&mut s.first_burst_length, n))
            }
            "DefaultTime2Wait" => numeric(
                value,
                (0, MAX_TIME2.into()),
                limits.default_time2wait.into(),
                Numeric::Max,
            )
            .map(|n| set_u16(&mut s.default_time2wait, n)),
            "DefaultTime2Retain" => numeric(
                value,
                (0, MAX_TIME2.into()),
                limits.default_time2retain.into(),
                Numeric::Min,
            )
            .map(|n| set_u16(&mut s.default_time2retain, n)),
            "MaxOutstandingR2T" => numeric(
                value,
                (1, 65535),
                limits.max_outstanding_r2t.into(),
                Numeric::Min,
            )
            .map(|n| set_u16(&mut s.max_outstanding_r2t, n)),
            // Basalt's data path wants data in order: OR with Yes.
            "DataPDUInOrder" => {
                boolean(value, |_| true).map(|b| set_bool(&mut s.data_pdu_in_order, b))
            }
            "DataSequenceInOrder" => {
                boolean(value, |_| true).map(|b| set_bool(&mut s.data_sequence_in_order, b))
            }
            // Only level 0 is implemented.
            "ErrorRecoveryLevel" => numeric(value, (0, 2), 0, Numeric::Min).map(|n| {
                s.error_recovery_level = u8::try_from(n).unwrap_or(0);
                n.to_string()
            }),
            // Markers are obsolete (RFC 7143 §13.25): No, or Reject.
            "IFMarker" | "OFMarker" => boolean(value, |_| false)
                .map(value::bool_str)
                .map(str::to_owned),
            _ => None,
        };
        reply.unwrap_or_else(|| REJECT.to_owned())
    }

    fn answer_to_offer(&mut self, offer: &Offer, answer: &str) -> Result<(), NegotiationError> {
        let invalid = || NegotiationError::InvalidAnswer {
            key: offer.key.to_owned(),
            value: answer.to_owned(),
        };
        if offer.key == "ImmediateData" {
            // AND with the target's No: No whatever the answer, but the
            // answer must be a legal one.
            value::parse_bool(answer).map_err(|_| invalid())?;
            self.session.immediate_data = false;
            return Ok(());
        }
        // The numeric offers use the minimum function: the answer must not
        // exceed the offer.
        let n = value::parse_number(answer)
            .ok()
            .and_then(|n| u32::try_from(n).ok())
            .filter(|&n| (MIN_DATA_LENGTH..=offer.value).contains(&n))
            .ok_or_else(invalid)?;
        match offer.key {
            "MaxBurstLength" => self.session.max_burst_length = n,
            "FirstBurstLength" => self.session.first_burst_length = n,
            _ => return Err(invalid()),
        }
        Ok(())
    }

    /// The target's own declaration (MaxRecvDataSegmentLength), once per
    /// login; nothing on later calls.
    pub fn declare(&mut self, out: &mut Vec<(String, String)>) {
        if self.declared {
            return;
        }
        self.declared = true;
        let mrdsl = self
            .limits
            .max_recv_data_segment_length
            .clamp(MIN_DATA_LENGTH, MAX_DATA_LENGTH);
        self.connection.target_max_recv_data_segment_length = mrdsl;
        out.push(("MaxRecvDataSegmentLength".into(), mrdsl.to_string()));
    }

    /// Whether the target has declared its MaxRecvDataSegmentLength.
    pub fn has_declared(&self) -> bool {
        self.declared
    }

    /// Offers the keys whose defaults the target cannot accept and that the
    /// initiator has not negotiated; returns whether any offer was made.
    pub fn make_offers(&mut self, out: &mut Vec<(String, String)>) -> bool {
        if self.session_type == SessionType::Discovery {
            return false;
        }
        let limits = self.limits.clone();
        let defaults = SessionParams::default();
        let mut wanted: Vec<Offer> = Vec::new();
        if !limits.immediate_data {
            wanted.push(Offer {
                key: "ImmediateData",
                value: 0,
            });
        }
        if limits.max_burst_length < defaults.max_burst_length {
            wanted.push(Offer {
                key: "MaxBurstLength",
                value: limits.max_burst_length,
            });
        }
        let first = limits.first_burst_length.min(limits.max_burst_length);
        if first < defaults.first_burst_length {
            wanted.push(Offer {
                key: "FirstBurstLength",
                value: first,
            });
        }
        let mut any = false;
        for offer in wanted {
            if self.settled.contains(offer.key) || self.offers.contains(&offer) {
                continue;
            }
            let text = if offer.key == "ImmediateData" {
                value::NO.to_owned()
            } else {
                offer.value.to_string()
            };
            out.push((offer.key.to_owned(), text));
            self.offers.push(offer);
            any = true;
        }
        any
    }

    /// Whether offers of the target still await answers.
    pub fn awaiting_answers(&self) -> bool {
        !self.offers.is_empty()
    }

    /// The negotiated parameters, once the stage is over.
    pub fn finish(&self) -> Result<(SessionParams, ConnectionParams), NegotiationError> {
        if let Some(offer) = self.offers.first() {
            return Err(NegotiationError::MissingAnswer(offer.key.to_owned()));
        }
        let mut connection = self.connection.clone();
        if !self.declared {
            connection.target_max_recv_data_segment_length = DEFAULT_MAX_RECV_DATA_SEGMENT_LENGTH;
        }
        if self.session_type == SessionType::Discovery {
            return Ok((SessionParams::default(), connection));
        }
        let s = &self.session;
        if s.first_burst_length > s.max_burst_length {
            return Err(NegotiationError::FirstBurstAboveMaxBurst {
                first: s.first_burst_length,
                max: s.max_burst_length,
            });
        }
        Ok((s.clone(), connection))
    }
}

/// The first digest of the initiator's list the target supports.
fn pick_digest(offer: &str, crc32c_allowed: bool) -> Option<Digest> {
    value::list(offer).find_map(|d| match d {
        "None" => Some(Digest::None),
        "CRC32C" if crc32c_allowed => Some(Digest::Crc32c),
        _ => None,
    })
}

/// The result of a numeric key, or `None` (Reject) when the offer is not a
/// number in `range`.
fn numeric(offer: &str, range: (u32, u32), ours: u32, function: Numeric) -> Option<u32> {
    let n = value::parse_number(offer).ok()?;
    let n = u32::try_from(n).ok()?;
    if !(range.0..=range.1).contains(&n) {
        return None;
    }
    let ours = ours.clamp(range.0, range.1);
    Some(match function {
        Numeric::Min => n.min(ours),
        Numeric::Max => n.max(ours),
    })
}

fn boolean(offer: &str, result: impl FnOnce(bool) -> bool) -> Option<bool> {
    value::parse_bool(offer).ok().map(result)
}

fn set_u32(field: &mut u32, n: u32) -> String {
    *field = n;
    n.to_string()
}

fn set_u16(field: &mut u16, n: u32) -> String {
    // Callers bound n to the u16 range.
    *field = u16::try_from(n).unwrap_or(u16::MAX);
    n.to_string()
}

fn set_bool(field: &mut bool, b: bool) -> String {
    *field = b;
    value::bool_str(b).to_owned()
}

#[cfg(test)]
mod tests;
