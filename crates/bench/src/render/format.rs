//! How numbers, sizes and ratios are written in every output (tables, charts,
//! HTML), so that results.md and report.html show identical text.
//!
//! Invariants: a non-finite value is written as `–`, never as `0` or `NaN`; a
//! ratio with a zero, negative or non-finite side is `–`; the output is
//! plain text (escaping is the job of each output format).

/// Written in place of a figure that does not exist (not measured, not
/// applicable, or not finite).
pub(crate) const NONE: &str = "–";

/// A measured figure with sensible precision: integers from 1000 up, one
/// decimal from 100, two below, three significant digits under 1.
pub(crate) fn value(v: f64) -> String {
    if !v.is_finite() {
        return NONE.to_string();
    }
    let magnitude = v.abs();
    if magnitude >= 1000.0 {
        format!("{v:.0}")
    } else if magnitude >= 100.0 {
        format!("{v:.1}")
    } else if magnitude >= 1.0 || magnitude == 0.0 {
        format!("{v:.2}")
    } else {
        // Three significant digits: 0.0123, 0.000456.
        let decimals = (2.0 - magnitude.log10().floor()).clamp(0.0, 12.0) as usize;
        format!("{v:.decimals$}")
    }
}

/// `v` with a fixed number of decimals, or `–` when not finite.
pub(crate) fn fixed(v: f64, decimals: usize) -> String {
    if v.is_finite() {
        format!("{v:.decimals$}")
    } else {
        NONE.to_string()
    }
}

/// `a / b` as a factor (`2.00×`), or `None` when it has no meaning.
pub(crate) fn ratio(a: f64, b: f64) -> Option<f64> {
    (a.is_finite() && b.is_finite() && a >= 0.0 && b > 0.0).then(|| a / b)
}

/// A ratio as written in tables: two decimals and `×`, or `–`.
pub(crate) fn ratio_text(ratio: Option<f64>) -> String {
    match ratio {
        Some(r) => format!("{r:.2}×"),
        None => NONE.to_string(),
    }
}

/// A block size in fio's notation: `512`, `4k`, `1m` (powers of 1024),
/// falling back to bytes when not a whole multiple.
pub(crate) fn block_size(bytes: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "g"), (1 << 20, "m"), (1 << 10, "k")];
    for (unit, suffix) in UNITS {
        if bytes >= unit && bytes.is_multiple_of(unit) {
            return format!("{}{suffix}", bytes / unit);
        }
    }
    bytes.to_string()
}

/// A memory size in GiB with one decimal.
pub(crate) fn memory(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// An axis tick: compact SI (`500`, `1.5k`, `12k`, `2M`), up to three
/// significant digits, trailing zeros dropped.
pub(crate) fn tick(v: f64) -> String {
    if !v.is_finite() {
        return NONE.to_string();
    }
    const UNITS: [(f64, &str); 3] = [(1e9, "G"), (1e6, "M"), (1e3, "k")];
    let (scaled, suffix) = UNITS
        .iter()
        .find(|(unit, _)| v.abs() >= *unit)
        .map(|(unit, suffix)| (v / unit, *suffix))
        .unwrap_or((v, ""));
    let text = format!("{scaled:.2}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    let text = if text == "-0" { "0" } else { text };
    format!("{text}{suffix}")
}

/// A parameter value from summary.json: strings bare, everything else as
/// compact JSON.
pub(crate) fn parameter(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Collapses whitespace (newlines included) to single spaces and shortens
/// text beyond `max_chars` characters with an ellipsis.
pub(crate) fn one_line(text: &str, max_chars: usize) -> String {
    let collapsed = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if collapsed.chars().count() <= max_chars {
        return collapsed;
    }
    let mut shortened: String = collapsed
        .chars()
        .take(max_chars.saturating_sub(1))
        .collect();
    shortened.push('…');
    shortened
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_have_sensible_precision_and_never_print_nan() {
        assert_eq!(value(52584.4), "52584");
        assert_eq!(value(108.44), "108.4");
        assert_eq!(value(8.5), "8.50");
        assert_eq!(value(0.0), "0.00");
        assert_eq!(value(0.012345), "0.0123");
        assert_eq!(value(f64::NAN), NONE);
        assert_eq!(value(f64::INFINITY), NONE);
    }

    #[test]
    fn ratios_are_two_decimals_and_undefined_without_a_positive_divisor() {
        assert_eq!(ratio_text(ratio(2000.0, 1000.0)), "2.00×");
        assert_eq!(ratio_text(ratio(1000.0, 3000.0)), "0.33×");
        assert_eq!(ratio(1.0, 0.0), None);
        assert_eq!(ratio(f64::NAN, 1.0), None);
        assert_eq!(ratio(-1.0, 1.0), None);
        assert_eq!(ratio_text(None), NONE);
    }

    #[test]
    fn block_sizes_use_fio_notation() {
        assert_eq!(block_size(512), "512");
        assert_eq!(block_size(4096), "4k");
        assert_eq!(block_size(524_288), "512k");
        assert_eq!(block_size(1 << 20), "1m");
        assert_eq!(block_size(1536), "1536");
    }

    #[test]
    fn ticks_are_compact() {
        assert_eq!(tick(0.0), "0");
        assert_eq!(tick(500.0), "500");
        assert_eq!(tick(1500.0), "1.5k");
        assert_eq!(tick(12_000.0), "12k");
        assert_eq!(tick(2_000_000.0), "2M");
        assert_eq!(tick(0.25), "0.25");
    }

    #[test]
    fn one_line_collapses_and_shortens() {
        assert_eq!(one_line("a\n  b\tc", 10), "a b c");
        assert_eq!(one_line("abcdefghij", 5), "abcd…");
    }
}
