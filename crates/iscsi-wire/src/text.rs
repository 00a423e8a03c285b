//! The text data segment of Login and Text PDUs (RFC 7143 §6.1): a list of
//! `key=value` pairs, each followed by one NUL, and (in [`value`]) the value
//! encodings keys use (numbers, ranges, lists, booleans, binary strings).
//!
//! Invariants:
//! - [`parse`] never panics and accepts exactly what §6.1 allows, plus two
//!   harmless liberties real initiators take: a missing NUL after the last
//!   pair, and extra NULs (padding) between or after pairs.
//! - Keys are 1..=63 bytes of letters, digits and `.-+@_`; a key that does
//!   not start with a capital letter is still parsed (it cannot be a
//!   standard key, so the negotiation answers `NotUnderstood` instead of
//!   failing the whole segment).
//! - Values are UTF-8 without control characters. A simple value (one list
//!   element) is at most 255 bytes; a binary value written as hex or base64
//!   (`0x…`, `0b…`) may be up to 8192 bytes of text, enough for the 1024-byte
//!   CHAP challenges of §12.1.3.
//! - [`parse`] refuses a key that appears twice (a protocol error in a
//!   negotiation); [`parse_records`] keeps duplicates, for SendTargets
//!   responses, whose records repeat `TargetName`/`TargetAddress`.
//! - [`encode`] appends `key=value\0` for each pair in order and nothing
//!   else (no padding: the PDU encoder pads the data segment).

pub mod value;

/// Longest key name (RFC 7143 §6.1, standard-label).
pub const MAX_KEY_LEN: usize = 63;
/// Longest simple value, not counting its delimiter (RFC 7143 §6.1).
pub const MAX_SIMPLE_VALUE_LEN: usize = 255;
/// Longest value text of any kind: a binary value (hex or base64) or a list.
/// RFC 7143 §6.1 bounds a simple value's decoded length, not its encoding;
/// 8192 covers a 1024-byte CHAP_C in hex (2050 bytes) with room to spare.
pub const MAX_VALUE_LEN: usize = 8192;

/// Why a text data segment is malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TextError {
    /// A pair has no `=`.
    #[error("text pair at byte {offset} has no '='")]
    MissingEquals { offset: usize },
    /// A pair starts with `=`.
    #[error("text pair at byte {offset} has an empty key")]
    EmptyKey { offset: usize },
    /// A key is longer than [`MAX_KEY_LEN`].
    #[error("key at byte {offset} is {len} bytes long, more than {MAX_KEY_LEN}")]
    KeyTooLong { offset: usize, len: usize },
    /// A key contains a byte outside letters, digits and `.-+@_`.
    #[error("key at byte {offset} contains the illegal byte {byte:#04x}")]
    BadKeyChar { offset: usize, byte: u8 },
    /// A value (or one of its list elements) is too long.
    #[error("value of {key} is {len} bytes long, more than {limit}")]
    ValueTooLong {
        key: String,
        len: usize,
        limit: usize,
    },
    /// A value is not UTF-8.
    #[error("value of {key} is not UTF-8")]
    NotUtf8 { key: String },
    /// A value contains a control character.
    #[error("value of {key} contains the control character {byte:#04x}")]
    BadValueChar { key: String, byte: u8 },
    /// A key appears twice in one negotiation.
    #[error("key {key} appears twice")]
    DuplicateKey { key: String },
}

/// Parses a (complete, reassembled) text data segment into its pairs, in
/// order. A key that appears twice is an error.
pub fn parse(data: &[u8]) -> Result<Vec<(String, String)>, TextError> {
    let pairs = parse_records(data)?;
    let mut seen = std::collections::HashSet::with_capacity(pairs.len());
    if let Some((key, _)) = pairs.iter().find(|(k, _)| !seen.insert(k.as_str())) {
        return Err(TextError::DuplicateKey { key: key.clone() });
    }
    Ok(pairs)
}

/// Parses a text data segment like [`parse`] but keeps repeated keys, as
/// SendTargets responses need.
pub fn parse_records(data: &[u8]) -> Result<Vec<(String, String)>, TextError> {
    let mut pairs = Vec::new();
    let mut offset = 0usize;
    for item in data.split(|&b| b == 0) {
        let start = offset;
        // One NUL after each item; the last item has none, and the
        // arithmetic never exceeds data.len() + 1.
        offset = offset.saturating_add(item.len()).saturating_add(1);
        if item.is_empty() {
            // Padding, or the empty tail after the final NUL.
            continue;
        }
        pairs.push(parse_pair(item, start)?);
    }
    Ok(pairs)
}

fn parse_pair(item: &[u8], offset: usize) -> Result<(String, String), TextError> {
    let eq = item
        .iter()
        .position(|&b| b == b'=')
        .ok_or(TextError::MissingEquals { offset })?;
    let key_bytes = item.get(..eq).unwrap_or_default();
    let value_bytes = item.get(eq.saturating_add(1)..).unwrap_or_default();
    if key_bytes.is_empty() {
        return Err(TextError::EmptyKey { offset });
    }
    if key_bytes.len() > MAX_KEY_LEN {
        return Err(TextError::KeyTooLong {
            offset,
            len: key_bytes.len(),
        });
    }
    if let Some(&byte) = key_bytes.iter().find(|&&b| !is_key_byte(b)) {
        return Err(TextError::BadKeyChar { offset, byte });
    }
    // Key bytes are ASCII, checked above.
    let key: String = key_bytes.iter().map(|&b| char::from(b)).collect();
    check_value_len(&key, value_bytes)?;
    if let Some(&byte) = value_bytes.iter().find(|&&b| b < 0x20 || b == 0x7f) {
        return Err(TextError::BadValueChar { key, byte });
    }
    let value = match std::str::from_utf8(value_bytes) {
        Ok(v) => v.to_owned(),
        Err(_) => return Err(TextError::NotUtf8 { key }),
    };
    Ok((key, value))
}

fn check_value_len(key: &str, value: &[u8]) -> Result<(), TextError> {
    let too_long = |len, limit| TextError::ValueTooLong {
        key: key.to_owned(),
        len,
        limit,
    };
    if value.len() > MAX_VALUE_LEN {
        return Err(too_long(value.len(), MAX_VALUE_LEN));
    }
    if value::is_binary_encoded(value) {
        return Ok(());
    }
    match value
        .split(|&b| b == b',')
        .find(|e| e.len() > MAX_SIMPLE_VALUE_LEN)
    {
        Some(element) => Err(too_long(element.len(), MAX_SIMPLE_VALUE_LEN)),
        None => Ok(()),
    }
}

/// Letters, digits and `.-+@_` (RFC 7143 §6.1, standard-label).
fn is_key_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'+' | b'@' | b'_')
}

/// Appends one `key=value\0` pair.
pub fn encode_pair(key: &str, value: &str, out: &mut Vec<u8>) {
    out.extend_from_slice(key.as_bytes());
    out.push(b'=');
    out.extend_from_slice(value.as_bytes());
    out.push(0);
}

/// Appends every pair as `key=value\0`, in order.
pub fn encode<K: AsRef<str>, V: AsRef<str>>(pairs: &[(K, V)], out: &mut Vec<u8>) {
    for (key, value) in pairs {
        encode_pair(key.as_ref(), value.as_ref(), out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owned(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn parses_pairs_with_final_nul_padding_or_none() {
        let want = owned(&[("InitiatorName", "iqn.a:b"), ("SessionType", "Normal")]);
        assert_eq!(
            parse(b"InitiatorName=iqn.a:b\0SessionType=Normal\0").unwrap(),
            want
        );
        assert_eq!(
            parse(b"InitiatorName=iqn.a:b\0SessionType=Normal").unwrap(),
            want
        );
        assert_eq!(
            parse(b"InitiatorName=iqn.a:b\0SessionType=Normal\0\0\0").unwrap(),
            want
        );
        assert_eq!(
            parse(b"InitiatorName=iqn.a:b\0\0SessionType=Normal\0").unwrap(),
            want
        );
        assert!(parse(b"").unwrap().is_empty());
        assert!(parse(b"\0\0\0\0").unwrap().is_empty());
    }

    #[test]
    fn value_is_everything_after_the_first_equals() {
        assert_eq!(
            parse(b"X-a=b=c\0Empty=\0").unwrap(),
            owned(&[("X-a", "b=c"), ("Empty", "")])
        );
    }

    #[test]
    fn rejects_malformed_pairs() {
        assert_eq!(
            parse(b"A=1\0novalue\0"),
            Err(TextError::MissingEquals { offset: 4 })
        );
        assert_eq!(parse(b"=x\0"), Err(TextError::EmptyKey { offset: 0 }));
        assert_eq!(
            parse(b"Bad Key=1\0"),
            Err(TextError::BadKeyChar {
                offset: 0,
                byte: b' '
            })
        );
        assert_eq!(
            parse(b"A=1\0A=2\0"),
            Err(TextError::DuplicateKey { key: "A".into() })
        );
        assert!(matches!(
            parse(b"A=\x01\0"),
            Err(TextError::BadValueChar { byte: 1, .. })
        ));
        assert!(matches!(
            parse(b"A=\xff\xfe\0"),
            Err(TextError::NotUtf8 { .. })
        ));
    }

    #[test]
    fn key_length_limit_is_63() {
        let ok = format!("{}=1", "K".repeat(63));
        assert!(parse(ok.as_bytes()).is_ok());
        let long = format!("{}=1", "K".repeat(64));
        assert_eq!(
            parse(long.as_bytes()),
            Err(TextError::KeyTooLong { offset: 0, len: 64 })
        );
    }

    #[test]
    fn value_length_limits() {
        let ok = format!("A={}", "v".repeat(255));
        assert!(parse(ok.as_bytes()).is_ok());
        let long = format!("A={}", "v".repeat(256));
        assert!(matches!(
            parse(long.as_bytes()),
            Err(TextError::ValueTooLong { len: 256, .. })
        ));
        // A list may exceed 255 as long as each element does not.
        let list = format!("A={},{}", "v".repeat(200), "w".repeat(200));
        assert!(parse(list.as_bytes()).is_ok());
        // A 1024-byte binary value in hex is allowed.
        let hex = format!("CHAP_C=0x{}", "ab".repeat(1024));
        assert!(parse(hex.as_bytes()).is_ok());
        let huge = format!("CHAP_C=0x{}", "ab".repeat(4096));
        assert!(matches!(
            parse(huge.as_bytes()),
            Err(TextError::ValueTooLong { .. })
        ));
    }

    #[test]
    fn records_keep_duplicates() {
        let data =
            b"TargetName=iqn.x\0TargetAddress=1.2.3.4:3260,1\0TargetAddress=5.6.7.8:3260,1\0";
        assert_eq!(parse_records(data).unwrap().len(), 3);
        assert!(parse(data).is_err());
    }

    #[test]
    fn encodes_literal_bytes() {
        let mut out = Vec::new();
        encode(
            &[("HeaderDigest", "None"), ("MaxBurstLength", "1")],
            &mut out,
        );
        assert_eq!(out, b"HeaderDigest=None\0MaxBurstLength=1\0".to_vec());
    }

    mod props {
        use super::super::*;
        use proptest::prelude::*;

        fn key() -> impl Strategy<Value = String> {
            "[A-Z][A-Za-z0-9.+@_-]{0,62}"
        }

        fn value() -> impl Strategy<Value = String> {
            "[ -~]{0,255}"
        }

        proptest! {
            #[test]
            fn parse_never_panics(data in proptest::collection::vec(any::<u8>(), 0..2048)) {
                let _ = parse(&data);
                let _ = parse_records(&data);
            }

            #[test]
            fn round_trip(pairs in proptest::collection::btree_map(key(), value(), 0..16)) {
                let pairs: Vec<(String, String)> = pairs.into_iter().collect();
                let mut out = Vec::new();
                encode(&pairs, &mut out);
                prop_assert_eq!(parse(&out).unwrap(), pairs);
            }
        }
    }
}
