//! Value encodings of text keys (RFC 7143 §6.1): decimal, hex (`0x…`) and
//! base64 (`0b…`) numbers, numeric ranges (`a~b`), lists (`a,b`), booleans,
//! binary strings, and the reserved answer constants.
//!
//! Invariants: every decoder takes `&str`, never panics, and refuses
//! anything §6.1 does not define (signs, spaces, leading zeros in decimals,
//! numbers above 2^64-1, misplaced base64 padding). Encoders produce the
//! forms §6.1 recommends: decimal numbers and lower-case hex binaries.

/// The responder does not understand the key.
pub const NOT_UNDERSTOOD: &str = "NotUnderstood";
/// The responder refuses the offered value(s).
pub const REJECT: &str = "Reject";
/// The key does not apply given other negotiated values.
pub const IRRELEVANT: &str = "Irrelevant";
/// The `None` value of digests and AuthMethod.
pub const NONE: &str = "None";
/// Boolean true.
pub const YES: &str = "Yes";
/// Boolean false.
pub const NO: &str = "No";

/// Why a value does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    #[error("empty value")]
    Empty,
    #[error("not a decimal, hex or base64 number: {0:?}")]
    NotANumber(String),
    #[error("number does not fit in 64 bits: {0:?}")]
    TooLarge(String),
    #[error("not a hex or base64 binary value: {0:?}")]
    NotBinary(String),
    #[error("not Yes or No: {0:?}")]
    NotBoolean(String),
    #[error("not a numeric range a~b with a <= b: {0:?}")]
    NotARange(String),
}

/// True when the value is written as a hex or base64 constant, whose length
/// limit applies to the decoded bytes rather than to the text.
pub(crate) fn is_binary_encoded(value: &[u8]) -> bool {
    matches!(value, [b'0', b'x' | b'X' | b'b' | b'B', ..])
}

/// Decodes a numerical value: decimal (no sign, no leading zero unless the
/// number is 0), hex `0x…` or base64 `0b…`, below 2^64.
pub fn parse_number(s: &str) -> Result<u64, ValueError> {
    if s.is_empty() {
        return Err(ValueError::Empty);
    }
    if is_binary_encoded(s.as_bytes()) {
        let bytes = decode_binary(s).map_err(|_| ValueError::NotANumber(s.to_owned()))?;
        // Leading zero bytes do not count toward the 64-bit limit.
        let significant = bytes
            .iter()
            .position(|&b| b != 0)
            .and_then(|i| bytes.get(i..))
            .unwrap_or_default();
        if significant.len() > 8 {
            return Err(ValueError::TooLarge(s.to_owned()));
        }
        return Ok(significant
            .iter()
            .fold(0u64, |acc, &b| (acc << 8) | u64::from(b)));
    }
    let digits = s.as_bytes();
    if !digits.iter().all(u8::is_ascii_digit) || (digits.len() > 1 && digits.first() == Some(&b'0'))
    {
        return Err(ValueError::NotANumber(s.to_owned()));
    }
    s.parse::<u64>()
        .map_err(|_| ValueError::TooLarge(s.to_owned()))
}

/// Decodes a numeric range `a~b` (RFC 7143 §6.1), requiring `a <= b`.
pub fn parse_range(s: &str) -> Result<(u64, u64), ValueError> {
    let (low, high) = s
        .split_once('~')
        .ok_or_else(|| ValueError::NotARange(s.to_owned()))?;
    let low = parse_number(low).map_err(|_| ValueError::NotARange(s.to_owned()))?;
    let high = parse_number(high).map_err(|_| ValueError::NotARange(s.to_owned()))?;
    if low > high {
        return Err(ValueError::NotARange(s.to_owned()));
    }
    Ok((low, high))
}

/// Decodes `Yes` or `No` (case-sensitive, as all iSCSI values).
pub fn parse_bool(s: &str) -> Result<bool, ValueError> {
    match s {
        YES => Ok(true),
        NO => Ok(false),
        _ => Err(ValueError::NotBoolean(s.to_owned())),
    }
}

/// Writes a boolean value.
pub fn bool_str(b: bool) -> &'static str {
    if b {
        YES
    } else {
        NO
    }
}

/// The elements of a list-of-values, in the proposer's order of preference.
/// An empty value is an empty list.
pub fn list(s: &str) -> impl Iterator<Item = &str> {
    s.split(',').filter(|e| !e.is_empty())
}

/// Decodes a binary value written as hex (`0x`/`0X`; an odd digit count
/// has an implied leading zero nibble, §6.1) or base64 (`0b`/`0B`, RFC 4648
/// alphabet, padding optional but only at the end).
pub fn decode_binary(s: &str) -> Result<Vec<u8>, ValueError> {
    let bad = || ValueError::NotBinary(s.to_owned());
    let bytes = s.as_bytes();
    let body = bytes.get(2..).unwrap_or_default();
    if body.is_empty() {
        return Err(bad());
    }
    match bytes.get(..2) {
        Some(b"0x" | b"0X") => decode_hex(body).ok_or_else(bad),
        Some(b"0b" | b"0B") => decode_base64(body).ok_or_else(bad),
        _ => Err(bad()),
    }
}

fn hex_nibble(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn decode_hex(digits: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(digits.len().div_ceil(2));
    let (head, rest) = if digits.len() % 2 == 1 {
        digits.split_at(1)
    } else {
        digits.split_at(0)
    };
    for &d in head {
        out.push(hex_nibble(d)?);
    }
    for pair in rest.chunks_exact(2) {
        let hi = hex_nibble(*pair.first()?)?;
        let lo = hex_nibble(*pair.get(1)?)?;
        out.push((hi << 4) | lo);
    }
    Some(out)
}

const BASE64_ALPHABET: &[u8; 64] =
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn base64_sextet(b: u8) -> Option<u32> {
    let v = match b {
        b'A'..=b'Z' => b - b'A',
        b'a'..=b'z' => b - b'a' + 26,
        b'0'..=b'9' => b - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => return None,
    };
    Some(u32::from(v))
}

fn decode_base64(text: &[u8]) -> Option<Vec<u8>> {
    let data_len = text.iter().position(|&b| b == b'=').unwrap_or(text.len());
    let (data, padding) = text.split_at(data_len);
    // Padding: only '=' after the data, at most two, and it must complete
    // a 4-character group.
    if padding.len() > 2
        || padding.iter().any(|&b| b != b'=')
        || (!padding.is_empty() && !text.len().is_multiple_of(4))
    {
        return None;
    }
    // One leftover character cannot encode a byte.
    if data.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(data.len() / 4 * 3 + 2);
    for group in data.chunks(4) {
        let mut acc = 0u32;
        for &c in group {
            acc = (acc << 6) | base64_sextet(c)?;
        }
        match group.len() {
            4 => out.extend_from_slice(&acc.to_be_bytes()[1..]),
            3 => out.extend_from_slice(&((acc >> 2) as u16).to_be_bytes()),
            2 => out.push((acc >> 4) as u8),
            _ => return None,
        }
    }
    Some(out)
}

/// Appends a binary value as lower-case hex with the `0x` prefix.
pub fn encode_hex(bytes: &[u8], out: &mut String) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    out.reserve(2 + bytes.len() * 2);
    out.push_str("0x");
    for &b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
}

/// A binary value as lower-case hex with the `0x` prefix.
pub fn hex(bytes: &[u8]) -> String {
    let mut s = String::new();
    encode_hex(bytes, &mut s);
    s
}

/// Appends a binary value as padded base64 with the `0b` prefix.
pub fn encode_base64(bytes: &[u8], out: &mut String) {
    out.push_str("0b");
    for chunk in bytes.chunks(3) {
        let b0 = chunk.first().copied().unwrap_or(0);
        let b1 = chunk.get(1).copied().unwrap_or(0);
        let b2 = chunk.get(2).copied().unwrap_or(0);
        let acc = (u32::from(b0) << 16) | (u32::from(b1) << 8) | u32::from(b2);
        let chars = chunk.len() + 1;
        for i in 0..4 {
            if i < chars {
                let sextet = (acc >> (18 - 6 * i)) & 0x3f;
                out.push(char::from(BASE64_ALPHABET[sextet as usize]));
            } else {
                out.push('=');
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers() {
        assert_eq!(parse_number("0"), Ok(0));
        assert_eq!(parse_number("8192"), Ok(8192));
        assert_eq!(parse_number("18446744073709551615"), Ok(u64::MAX));
        assert!(matches!(
            parse_number("18446744073709551616"),
            Err(ValueError::TooLarge(_))
        ));
        assert_eq!(parse_number("0x2000"), Ok(8192));
        assert_eq!(parse_number("0X2000"), Ok(8192));
        assert_eq!(parse_number("0x0000000000000000ff"), Ok(255));
        assert!(parse_number("0x1ffffffffffffffff").is_err());
        // "ACAA" is base64 of 00 20 00.
        assert_eq!(parse_number("0bACAA"), Ok(8192));
        for bad in ["", "012", "-1", "+1", " 1", "1 ", "1a", "0x", "0xg", "Yes"] {
            assert!(parse_number(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn ranges_booleans_lists() {
        assert_eq!(parse_range("512~16777215"), Ok((512, 16777215)));
        assert!(parse_range("2~1").is_err());
        assert!(parse_range("2").is_err());
        assert_eq!(parse_bool("Yes"), Ok(true));
        assert_eq!(parse_bool("No"), Ok(false));
        assert!(parse_bool("yes").is_err());
        assert_eq!(
            list("CRC32C,None").collect::<Vec<_>>(),
            vec!["CRC32C", "None"]
        );
        assert_eq!(list("").count(), 0);
    }

    #[test]
    fn binary_hex() {
        assert_eq!(decode_binary("0x00ff10"), Ok(vec![0x00, 0xff, 0x10]));
        assert_eq!(decode_binary("0XABC"), Ok(vec![0x0a, 0xbc]));
        assert!(decode_binary("0x").is_err());
        assert!(decode_binary("0xzz").is_err());
        assert!(decode_binary("ff").is_err());
        assert_eq!(hex(&[0x01, 0xab]), "0x01ab");
    }

    #[test]
    fn binary_base64_rfc4648_vectors() {
        // RFC 4648 §10 test vectors.
        let vectors: [(&str, &str); 7] = [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ];
        for (plain, encoded) in vectors {
            let mut s = String::new();
            encode_base64(plain.as_bytes(), &mut s);
            assert_eq!(s, format!("0b{encoded}"));
            if !encoded.is_empty() {
                assert_eq!(
                    decode_binary(&format!("0b{encoded}")),
                    Ok(plain.as_bytes().to_vec())
                );
                // Unpadded input is accepted.
                let unpadded = encoded.trim_end_matches('=');
                assert_eq!(
                    decode_binary(&format!("0B{unpadded}")),
                    Ok(plain.as_bytes().to_vec())
                );
            }
        }
        for bad in ["0bZ", "0bZg=", "0bZ=g=", "0bZg===", "0b====", "0bZ!=="] {
            assert!(decode_binary(bad).is_err(), "{bad:?}");
        }
    }

    mod props {
        use super::super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn decoders_never_panic(s in "\\PC{0,64}") {
                let _ = parse_number(&s);
                let _ = parse_range(&s);
                let _ = decode_binary(&s);
                let _ = parse_bool(&s);
            }

            #[test]
            fn binary_round_trips(bytes in proptest::collection::vec(any::<u8>(), 1..300)) {
                let mut h = String::new();
                encode_hex(&bytes, &mut h);
                prop_assert_eq!(decode_binary(&h).unwrap(), bytes.clone());
                let mut b = String::new();
                encode_base64(&bytes, &mut b);
                prop_assert_eq!(decode_binary(&b).unwrap(), bytes);
            }

            #[test]
            fn numbers_round_trip(n in any::<u64>()) {
                prop_assert_eq!(parse_number(&n.to_string()), Ok(n));
                prop_assert_eq!(parse_number(&format!("{n:#x}")), Ok(n));
            }
        }
    }
}
