//! Text Requests of the full feature phase: SendTargets (RFC 7143 §13.3 and
//! Appendix C, "SendTargets Operation") and the splitting of long text
//! responses into PDUs.
//!
//! Invariants:
//! - A SendTargets response holds only `TargetName` and `TargetAddress`
//!   keys, one record per target: its name, then its addresses.
//! - A discovery session sees every target the caller passes (the caller
//!   passes those the initiator may access); a normal session only ever
//!   sees the target it is logged in to, whatever it asks (`All` included).
//! - A value that is neither `All`, empty, nor an iSCSI name is answered
//!   `SendTargets=Reject`; other keys are answered `NotUnderstood` (or
//!   `Reject` for operational keys, which are not renegotiated here).

use crate::negotiation::{Negotiator, SessionType};
use crate::text::{self, value, TextError};

/// Longest iSCSI name (RFC 7143 §4.2.7.1).
pub const MAX_ISCSI_NAME_LEN: usize = 223;

/// What a Text Request is answered from.
#[derive(Debug, Clone, Copy)]
pub struct TextContext<'a> {
    pub session_type: SessionType,
    /// The target a normal session is logged in to.
    pub current_target: Option<&'a str>,
    /// The targets the initiator may see, each with its addresses
    /// (`"host:port,tpgt"`; IPv6 hosts in brackets).
    pub targets: &'a [(String, Vec<String>)],
}

/// What a SendTargets value asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendTargetsQuery {
    /// `All`.
    All,
    /// Empty value: the target the session is logged in to.
    Current,
    /// One target by name.
    Named(String),
}

impl SendTargetsQuery {
    /// Decodes a SendTargets value; `None` if it is not a valid one.
    pub fn parse(value: &str) -> Option<SendTargetsQuery> {
        match value {
            "All" => Some(SendTargetsQuery::All),
            "" => Some(SendTargetsQuery::Current),
            name if is_iscsi_name(name) => Some(SendTargetsQuery::Named(name.to_owned())),
            _ => None,
        }
    }
}

/// Whether `name` looks like an iSCSI name: `iqn.`, `eui.` or `naa.`
/// followed by letters, digits, `-`, `.` and `:`, at most 223 bytes.
pub fn is_iscsi_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    let prefix_ok = bytes.get(..4).is_some_and(|p| {
        [b"iqn.", b"eui.", b"naa."]
            .iter()
            .any(|q| p.eq_ignore_ascii_case(*q))
    });
    prefix_ok
        && bytes.len() > 4
        && bytes.len() <= MAX_ISCSI_NAME_LEN
        && bytes
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b':'))
}

/// Appends the records of `targets`: `TargetName=<name>\0` followed by
/// `TargetAddress=<address>\0` for each of its addresses.
pub fn send_targets_response(targets: &[(String, Vec<String>)], out: &mut Vec<u8>) {
    for (name, addresses) in targets {
        text::encode_pair("TargetName", name, out);
        for address in addresses {
            text::encode_pair("TargetAddress", address, out);
        }
    }
}

/// The records a query selects.
pub fn select_targets<'a>(
    query: &SendTargetsQuery,
    ctx: &TextContext<'a>,
) -> Vec<&'a (String, Vec<String>)> {
    let visible = |name: &str| match ctx.session_type {
        SessionType::Discovery => true,
        SessionType::Normal => ctx.current_target == Some(name),
    };
    ctx.targets
        .iter()
        .filter(|(name, _)| visible(name))
        .filter(|(name, _)| match query {
            SendTargetsQuery::All => true,
            SendTargetsQuery::Current => ctx.current_target == Some(name.as_str()),
            SendTargetsQuery::Named(wanted) => name == wanted,
        })
        .collect()
}

/// Answers the (complete, reassembled) data segment of a Text Request,
/// appending the response text to `out`. A malformed segment is an error:
/// the caller answers it with a Reject PDU.
pub fn answer_text_request(
    request: &[u8],
    ctx: &TextContext<'_>,
    out: &mut Vec<u8>,
) -> Result<(), TextError> {
    let pairs = text::parse(request)?;
    for (key, val) in &pairs {
        if key == "SendTargets" {
            match SendTargetsQuery::parse(val) {
                Some(query) => {
                    let records: Vec<(String, Vec<String>)> =
                        select_targets(&query, ctx).into_iter().cloned().collect();
                    send_targets_response(&records, out);
                }
                None => text::encode_pair(key, value::REJECT, out),
            }
        } else if Negotiator::is_operational_key(key) {
            text::encode_pair(key, value::REJECT, out);
        } else {
            text::encode_pair(key, value::NOT_UNDERSTOOD, out);
        }
    }
    Ok(())
}

/// Splits a text response into the data segments of successive Text
/// Response PDUs, each at most `max_segment` bytes (the initiator's
/// MaxRecvDataSegmentLength; values below 512 are taken as 512). There is
/// always at least one segment, possibly empty.
///
/// The continuation rule (RFC 7143 §11.11): every PDU but the last has C=1,
/// F=0 and a Target Transfer Tag other than 0xffffffff chosen by the target;
/// the initiator asks for the next piece with an empty Text Request carrying
/// that tag. The last PDU has C=0, F=1 and TTT 0xffffffff. Pieces may split
/// a key=value pair.
pub fn split_text_response(data: &[u8], max_segment: u32) -> Vec<&[u8]> {
    let max = usize::try_from(max_segment.max(512)).unwrap_or(usize::MAX);
    if data.is_empty() {
        return vec![data];
    }
    data.chunks(max).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn targets() -> Vec<(String, Vec<String>)> {
        vec![
            (
                "iqn.2024-01.io.basalt:vol1".into(),
                vec!["10.0.0.1:3260,1".into(), "[fd00::1]:3260,1".into()],
            ),
            (
                "iqn.2024-01.io.basalt:vol2".into(),
                vec!["10.0.0.1:3260,1".into()],
            ),
        ]
    }

    fn answer(req: &[u8], session_type: SessionType, current: Option<&str>) -> Vec<u8> {
        let t = targets();
        let ctx = TextContext {
            session_type,
            current_target: current,
            targets: &t,
        };
        let mut out = Vec::new();
        answer_text_request(req, &ctx, &mut out).unwrap();
        out
    }

    #[test]
    fn discovery_all_lists_every_record() {
        let out = answer(b"SendTargets=All\0", SessionType::Discovery, None);
        assert_eq!(
            out,
            b"TargetName=iqn.2024-01.io.basalt:vol1\0TargetAddress=10.0.0.1:3260,1\0\
TargetAddress=[fd00::1]:3260,1\0TargetName=iqn.2024-01.io.basalt:vol2\0\
TargetAddress=10.0.0.1:3260,1\0"
                .to_vec()
        );
        let named = answer(
            b"SendTargets=iqn.2024-01.io.basalt:vol2\0",
            SessionType::Discovery,
            None,
        );
        assert_eq!(
            named,
            b"TargetName=iqn.2024-01.io.basalt:vol2\0TargetAddress=10.0.0.1:3260,1\0".to_vec()
        );
        // Unknown but well-formed name: no records.
        assert!(answer(
            b"SendTargets=iqn.2024-01.io.basalt:nope\0",
            SessionType::Discovery,
            None
        )
        .is_empty());
        // Empty value in discovery: no current target.
        assert!(answer(b"SendTargets=\0", SessionType::Discovery, None).is_empty());
    }

    #[test]
    fn normal_session_only_sees_its_target() {
        let current = Some("iqn.2024-01.io.basalt:vol2");
        for req in [
            &b"SendTargets=All\0"[..],
            b"SendTargets=\0",
            b"SendTargets=iqn.2024-01.io.basalt:vol2\0",
        ] {
            let out = answer(req, SessionType::Normal, current);
            assert_eq!(
                out,
                b"TargetName=iqn.2024-01.io.basalt:vol2\0TargetAddress=10.0.0.1:3260,1\0".to_vec()
            );
        }
        assert!(answer(
            b"SendTargets=iqn.2024-01.io.basalt:vol1\0",
            SessionType::Normal,
            current
        )
        .is_empty());
    }

    /// The invalid requests of libiscsi's test_iscsi_sendtargets_invalid
    /// must get answers other than target records.
    #[test]
    fn libiscsi_invalid_requests() {
        let d = SessionType::Discovery;
        assert_eq!(
            answer(b"SendTargetsPlease=All\0", d, None),
            b"SendTargetsPlease=NotUnderstood\0".to_vec()
        );
        assert_eq!(
            answer(b"SendTargets=Alle\0", d, None),
            b"SendTargets=Reject\0".to_vec()
        );
        assert_eq!(
            answer(b"SendTargets=A\0", d, None),
            b"SendTargets=Reject\0".to_vec()
        );
        assert_eq!(
            answer(b"sENDtARGETS=aLL\0", d, None),
            b"sENDtARGETS=NotUnderstood\0".to_vec()
        );
        assert_eq!(
            answer(b"MaxRecvDataSegmentLength=65536\0", d, None),
            b"MaxRecvDataSegmentLength=Reject\0".to_vec()
        );
    }

    #[test]
    fn iscsi_names() {
        assert!(is_iscsi_name(
            "iqn.2007-10.com.github:sahlberg:libiscsi:iscsi-test"
        ));
        assert!(is_iscsi_name("eui.02004567A425678D"));
        assert!(is_iscsi_name("naa.52004567BA64678D"));
        assert!(!is_iscsi_name("iqn."));
        assert!(!is_iscsi_name("Alle"));
        assert!(!is_iscsi_name("iqn.a b"));
        assert!(!is_iscsi_name(&format!("iqn.{}", "a".repeat(220))));
    }

    #[test]
    fn splitting() {
        let data = vec![b'x'; 1300];
        let parts = split_text_response(&data, 512);
        assert_eq!(
            parts.iter().map(|p| p.len()).collect::<Vec<_>>(),
            vec![512, 512, 276]
        );
        assert_eq!(split_text_response(&data, 8192).len(), 1);
        assert_eq!(split_text_response(&[], 8192), vec![&[][..]]);
        assert_eq!(split_text_response(&data, 1).len(), 3);
    }

    mod props {
        use super::super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn answer_never_panics(data in proptest::collection::vec(any::<u8>(), 0..512), discovery in any::<bool>()) {
                let t = vec![("iqn.2024-01.io.basalt:v".to_string(), vec!["1.2.3.4:3260,1".to_string()])];
                let ctx = TextContext {
                    session_type: if discovery { SessionType::Discovery } else { SessionType::Normal },
                    current_target: Some("iqn.2024-01.io.basalt:v"),
                    targets: &t,
                };
                let mut out = Vec::new();
                let _ = answer_text_request(&data, &ctx, &mut out);
            }
        }
    }
}
