//! Human-readable byte sizes, as typed on the command line and in API
//! requests, and as shown back to people.
//!
//! Units are binary: `K`/`KiB` = 1024, `M`/`MiB` = 1024², `G`/`GiB` = 1024³,
//! `T`/`TiB` = 1024⁴, `P`/`PiB` = 1024⁵ (case-insensitive, optional space
//! before the unit; `B` or no unit means bytes). A decimal fraction is
//! accepted when the result is a whole number of bytes (`1.5G`). Decimal SI
//! units (`GB`, `MB`, …) are refused rather than guessed at, since `10GB`
//! means 10⁹ bytes to some people and 2³⁰ to others. [`format_size`] output
//! parses back with [`parse_size`] whenever it is exact.

use std::fmt;

/// A size string that could not be parsed; its message says what to write.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid size {input:?}: {reason}")]
pub struct ParseSizeError {
    input: String,
    reason: String,
}

impl ParseSizeError {
    fn new(input: &str, reason: impl fmt::Display) -> Self {
        ParseSizeError {
            input: input.to_string(),
            reason: reason.to_string(),
        }
    }
}

const EXAMPLES: &str =
    "use a number of bytes or a binary unit, like 4096, 512M, 10G, 1.5T or 10GiB";

const UNITS: [(&str, &str, u32); 6] = [
    ("B", "B", 0),
    ("K", "KiB", 1),
    ("M", "MiB", 2),
    ("G", "GiB", 3),
    ("T", "TiB", 4),
    ("P", "PiB", 5),
];

/// The power of 1024 a unit suffix stands for.
fn unit_exponent(input: &str, unit: &str) -> Result<u32, ParseSizeError> {
    if unit.is_empty() {
        return Ok(0);
    }
    let upper = unit.to_ascii_uppercase();
    for (short, long, exp) in UNITS {
        if upper == short || upper == long.to_ascii_uppercase() {
            return Ok(exp);
        }
    }
    if let Some(&(short, long, _)) = UNITS[1..]
        .iter()
        .find(|(short, _, _)| upper == format!("{short}B"))
    {
        return Err(ParseSizeError::new(
            input,
            format!(
                "decimal unit {unit:?} is ambiguous; use {short} or {long} (binary, 1024-based)"
            ),
        ));
    }
    Err(ParseSizeError::new(
        input,
        format!("unknown unit {unit:?}; {EXAMPLES}"),
    ))
}

/// Parses a human size such as `4096`, `512M`, `10G`, `1.5T` or `10 GiB`
/// into bytes.
pub fn parse_size(input: &str) -> Result<u64, ParseSizeError> {
    let text = input.trim();
    if text.is_empty() {
        return Err(ParseSizeError::new(input, format!("empty; {EXAMPLES}")));
    }
    let number_end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(number_end);
    let (whole, fraction) = match number.split_once('.') {
        Some((w, f)) => (w, f),
        None => (number, ""),
    };
    if whole.is_empty() && fraction.is_empty()
        || !whole.chars().all(|c| c.is_ascii_digit())
        || !fraction.chars().all(|c| c.is_ascii_digit())
    {
        return Err(ParseSizeError::new(
            input,
            format!("not a number; {EXAMPLES}"),
        ));
    }
    let exp = unit_exponent(input, unit.trim_start())?;
    // Exact arithmetic: value = (whole + fraction / 10^len) * 1024^exp.
    let too_large = || ParseSizeError::new(input, "too large (the limit is 16 EiB - 1)");
    if fraction.len() > 18 {
        return Err(ParseSizeError::new(input, "too many decimal places"));
    }
    let multiplier = 1u128 << (10 * exp);
    let whole: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| too_large())?
    };
    let scale = 10u128.pow(fraction.len() as u32);
    let fraction: u128 = if fraction.is_empty() {
        0
    } else {
        fraction.parse().map_err(|_| too_large())?
    };
    let fraction_bytes = fraction * multiplier;
    if !fraction_bytes.is_multiple_of(scale) {
        return Err(ParseSizeError::new(
            input,
            "not a whole number of bytes; use fewer decimal places or a smaller unit",
        ));
    }
    let bytes = whole
        .checked_mul(multiplier)
        .and_then(|b| b.checked_add(fraction_bytes / scale))
        .ok_or_else(too_large)?;
    u64::try_from(bytes).map_err(|_| too_large())
}

/// Formats `bytes` for people: the largest binary unit in which the value is
/// at least 1, exact when it is a whole number of that unit (`10 GiB`),
/// otherwise with up to two decimals (`1.5 GiB`, `9.77 GiB`).
pub fn format_size(bytes: u64) -> String {
    let (_, long, exp) = UNITS
        .iter()
        .rev()
        .find(|(_, _, exp)| bytes >> (10 * exp) > 0)
        .copied()
        .unwrap_or(UNITS[0]);
    let unit = 1u64 << (10 * exp);
    if bytes.is_multiple_of(unit) {
        return format!("{} {long}", bytes / unit);
    }
    let value = bytes as f64 / unit as f64;
    let text = format!("{value:.2}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    format!("{text} {long}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1 << 30;

    #[test]
    fn parses_plain_bytes_and_units() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("0").unwrap(), 0);
        assert_eq!(parse_size("4096B").unwrap(), 4096);
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("10G").unwrap(), 10 * G);
        assert_eq!(parse_size("10g").unwrap(), 10 * G);
        assert_eq!(parse_size("1T").unwrap(), 1 << 40);
        assert_eq!(parse_size("4K").unwrap(), 4096);
        assert_eq!(parse_size("10GiB").unwrap(), 10 * G);
        assert_eq!(parse_size("10gib").unwrap(), 10 * G);
        assert_eq!(parse_size(" 10 GiB ").unwrap(), 10 * G);
        assert_eq!(parse_size("2PiB").unwrap(), 2 << 50);
    }

    #[test]
    fn parses_exact_fractions() {
        assert_eq!(parse_size("1.5G").unwrap(), 3 * G / 2);
        assert_eq!(parse_size("0.5K").unwrap(), 512);
        assert_eq!(parse_size(".25M").unwrap(), 256 << 10);
        assert_eq!(parse_size("2.G").unwrap(), 2 * G);
        let err = parse_size("0.3K").unwrap_err().to_string();
        assert!(err.contains("whole number of bytes"), "{err}");
        assert!(parse_size("1.5").is_err(), "1.5 bytes");
    }

    #[test]
    fn rejects_garbage_with_guidance() {
        for bad in [
            "", "  ", "abc", "G", "1.2.3G", "-5G", "10X", "1e9", ".", "10 G B",
        ] {
            let err = parse_size(bad).unwrap_err().to_string();
            assert!(err.starts_with("invalid size"), "{bad:?}: {err}");
        }
        let err = parse_size("abc").unwrap_err().to_string();
        assert!(err.contains("10G"), "error shows examples: {err}");
    }

    #[test]
    fn decimal_units_are_refused_with_a_hint() {
        let err = parse_size("10GB").unwrap_err().to_string();
        assert!(err.contains("ambiguous") && err.contains("GiB"), "{err}");
        assert!(parse_size("5mb").is_err());
    }

    #[test]
    fn rejects_overflow() {
        assert_eq!(parse_size("18446744073709551615").unwrap(), u64::MAX);
        for big in [
            "18446744073709551616",
            "16384P",
            "99999999999999999999999999999999999999999T",
        ] {
            let err = parse_size(big).unwrap_err().to_string();
            assert!(err.contains("too large"), "{big}: {err}");
        }
    }

    #[test]
    fn formats_for_people() {
        assert_eq!(format_size(0), "0 B");
        assert_eq!(format_size(1), "1 B");
        assert_eq!(format_size(1023), "1023 B");
        assert_eq!(format_size(1024), "1 KiB");
        assert_eq!(format_size(4096), "4 KiB");
        assert_eq!(format_size(10 * G), "10 GiB");
        assert_eq!(format_size(3 * G / 2), "1.5 GiB");
        assert_eq!(format_size(10_000_000_000), "9.31 GiB");
        assert_eq!(format_size(1 << 40), "1 TiB");
        assert_eq!(format_size(u64::MAX), "16384 PiB");
    }

    #[test]
    fn exact_formats_parse_back() {
        for bytes in [0, 512, 4096, 1536 << 20, 10 * G, 3 << 40] {
            assert_eq!(parse_size(&format_size(bytes)).unwrap(), bytes);
        }
    }
}
