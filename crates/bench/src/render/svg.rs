//! Drawing charts as SVG: line charts (linear or log2 x axis), grouped bar
//! charts and median-with-interval (whisker) charts, each with title, axes,
//! ticks, axis labels and a legend. It knows nothing of fio or cells: it
//! draws the `Chart` it is given.
//!
//! Invariants: the output is well-formed XML with no external reference (no
//! `href`, no web fonts — only the generic `sans-serif` family — no script)
//! and no element `id`, so that several charts can be inlined in one HTML
//! page; all text is escaped. A failed point is never drawn as a value: it
//! is a ✕ on the x axis with a `<title>` saying why, and is listed under the
//! plot. The y axis of lines and bars starts at 0.

use super::format;
use std::fmt::Write as _;

/// Colour-blind-safe palette (Okabe–Ito), by target index.
const PALETTE: [&str; 7] = [
    "#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000",
];

/// The colour of the `index`-th target.
pub(crate) fn color(index: usize) -> &'static str {
    PALETTE[index % PALETTE.len()]
}

const WIDTH: f64 = 860.0;
const PLOT_LEFT: f64 = 80.0;
const PLOT_TOP: f64 = 56.0;
const PLOT_HEIGHT: f64 = 300.0;
const LEGEND_WIDTH: f64 = 210.0;
const RIGHT_MARGIN: f64 = 28.0;
/// Below the plot: tick labels and the x axis label.
const X_AXIS_SPACE: f64 = 58.0;
const FAILED_LINE: f64 = 16.0;
const MAX_FAILED_LINES: usize = 12;
const FAILED_COLOR: &str = "#B00020";

/// A chart to draw.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub body: Body,
    /// Points that would be on the chart but whose cell failed.
    pub failed: Vec<FailedMark>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Body {
    /// Lines over a numeric x axis; ticks at the given x values.
    Lines {
        log2_x: bool,
        x_ticks: Vec<(f64, String)>,
        lines: Vec<Line>,
    },
    /// One group of bars per label, one bar per series in each group.
    Bars {
        groups: Vec<String>,
        series: Vec<BarSeries>,
    },
    /// One median with its interval per item.
    Intervals { items: Vec<Interval> },
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Line {
    pub name: String,
    pub color: &'static str,
    pub dashed: bool,
    /// `(x, y)`; `y = None` breaks the line there (a failed point).
    pub points: Vec<(f64, Option<f64>)>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct BarSeries {
    pub name: String,
    pub color: &'static str,
    /// One value per group; `None` draws no bar.
    pub values: Vec<Option<f64>>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Interval {
    pub label: String,
    pub color: &'static str,
    /// `(median, low, high)`; `None` draws nothing (see `failed`).
    pub estimate: Option<(f64, f64, f64)>,
}

/// A failed point: where its ✕ goes and what it says.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct FailedMark {
    pub at: MarkAt,
    pub color: &'static str,
    pub description: String,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum MarkAt {
    /// On a line chart, at this x.
    X(f64),
    /// On a bar chart, in this bar's slot.
    Bar { group: usize, series: usize },
    /// On an interval chart, at this item.
    Item(usize),
}

impl Chart {
    /// The distinct descriptions of the failed points, in order.
    pub(crate) fn failed_descriptions(&self) -> Vec<String> {
        let mut descriptions: Vec<String> = Vec::new();
        for mark in &self.failed {
            if !descriptions.contains(&mark.description) {
                descriptions.push(mark.description.clone());
            }
        }
        descriptions
    }
}

/// The chart as a standalone SVG file (XML declaration included).
#[cfg(test)]
pub(crate) fn document(chart: &Chart) -> String {
    standalone(&element(chart))
}

/// An `<svg>` element as a standalone SVG file.
pub(crate) fn standalone(element: &str) -> String {
    format!("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n{element}")
}

/// The chart as one `<svg>` element, for inlining into HTML.
pub(crate) fn element(chart: &Chart) -> String {
    let has_legend = !matches!(chart.body, Body::Intervals { .. });
    let failed = chart.failed_descriptions();
    let failed_lines =
        failed.len().min(MAX_FAILED_LINES) + usize::from(failed.len() > MAX_FAILED_LINES);
    let height = PLOT_TOP + PLOT_HEIGHT + X_AXIS_SPACE + failed_lines as f64 * FAILED_LINE + 12.0;
    let frame = Frame {
        left: PLOT_LEFT,
        right: WIDTH
            - if has_legend {
                LEGEND_WIDTH
            } else {
                RIGHT_MARGIN
            },
        top: PLOT_TOP,
        bottom: PLOT_TOP + PLOT_HEIGHT,
    };

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" \
         viewBox=\"0 0 {WIDTH} {height}\" font-family=\"sans-serif\" font-size=\"12\" \
         role=\"img\" class=\"basalt-chart\">"
    );
    let _ = writeln!(svg, "<title>{}</title>", escape(&chart.title));
    let _ = writeln!(
        svg,
        "<rect x=\"0\" y=\"0\" width=\"{WIDTH}\" height=\"{height}\" fill=\"#ffffff\"/>"
    );
    let _ = writeln!(
        svg,
        "<text x=\"{:.1}\" y=\"28\" text-anchor=\"middle\" font-size=\"16\" font-weight=\"bold\">{}</text>",
        WIDTH / 2.0,
        escape(&chart.title)
    );

    match &chart.body {
        Body::Lines {
            log2_x,
            x_ticks,
            lines,
        } => draw_lines(&mut svg, &frame, chart, *log2_x, x_ticks, lines),
        Body::Bars { groups, series } => draw_bars(&mut svg, &frame, chart, groups, series),
        Body::Intervals { items } => draw_intervals(&mut svg, &frame, chart, items),
    }

    // The axis labels.
    let _ = writeln!(
        svg,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
        (frame.left + frame.right) / 2.0,
        frame.bottom + 44.0,
        escape(&chart.x_label)
    );
    let _ = writeln!(
        svg,
        "<text transform=\"translate(18 {:.1}) rotate(-90)\" text-anchor=\"middle\">{}</text>",
        (frame.top + frame.bottom) / 2.0,
        escape(&chart.y_label)
    );

    // The failed points, listed under the chart.
    let mut y = frame.bottom + X_AXIS_SPACE + 6.0;
    for description in failed.iter().take(MAX_FAILED_LINES) {
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{y:.1}\" fill=\"{FAILED_COLOR}\">✕ {}</text>",
            frame.left,
            escape(&format::one_line(description, 120))
        );
        y += FAILED_LINE;
    }
    if failed.len() > MAX_FAILED_LINES {
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{y:.1}\" fill=\"{FAILED_COLOR}\">… and {} more failed points (see the tables)</text>",
            frame.left,
            failed.len() - MAX_FAILED_LINES
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// The plot area.
struct Frame {
    left: f64,
    right: f64,
    top: f64,
    bottom: f64,
}

/// A linear value axis: `lo..hi` mapped onto the frame's height.
struct ValueAxis {
    lo: f64,
    hi: f64,
    ticks: Vec<f64>,
}

impl ValueAxis {
    /// From 0 (or below, for negative data) to a round number above `max`.
    fn from_zero(values: impl Iterator<Item = f64>) -> Self {
        let (lo, hi) = values
            .filter(|v| v.is_finite())
            .fold((0.0_f64, 0.0_f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
        Self::nice(lo, hi)
    }

    /// Around the data, padded, not necessarily from zero.
    fn around(values: impl Iterator<Item = f64>) -> Self {
        let finite: Vec<f64> = values.filter(|v| v.is_finite()).collect();
        let lo = finite.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = finite.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if finite.is_empty() {
            return Self::nice(0.0, 1.0);
        }
        let pad = if hi > lo {
            (hi - lo) * 0.15
        } else {
            hi.abs().max(1.0) * 0.05
        };
        let lo_padded = if lo >= 0.0 {
            (lo - pad).max(0.0)
        } else {
            lo - pad
        };
        Self::nice(lo_padded, hi + pad)
    }

    /// Round bounds and about five ticks at 1, 2, 2.5 or 5 × 10^k steps.
    fn nice(lo: f64, hi: f64) -> Self {
        let (lo, hi) = if !(lo.is_finite() && hi.is_finite()) {
            (0.0, 1.0)
        } else if hi > lo {
            (lo, hi)
        } else if hi == 0.0 {
            (0.0, 1.0)
        } else {
            (lo - hi.abs() * 0.1, hi + hi.abs() * 0.1)
        };
        let raw_step = (hi - lo) / 5.0;
        let magnitude = 10f64.powf(raw_step.log10().floor());
        let step = [1.0, 2.0, 2.5, 5.0, 10.0]
            .iter()
            .map(|m| m * magnitude)
            .find(|&s| s >= raw_step)
            .unwrap_or(10.0 * magnitude);
        let first = (lo / step).floor() * step;
        let last = (hi / step).ceil() * step;
        if !(step > 0.0 && first.is_finite() && last.is_finite() && last > first) {
            // A span too small or too large for f64 steps: a plain 0..1 axis.
            return Self::nice(0.0, 1.0);
        }
        let count = ((last - first) / step).round().clamp(1.0, 50.0) as usize;
        let ticks = (0..=count).map(|i| first + i as f64 * step).collect();
        ValueAxis {
            lo: first,
            hi: first + count as f64 * step,
            ticks,
        }
    }

    fn y(&self, frame: &Frame, v: f64) -> f64 {
        frame.bottom - (v - self.lo) / (self.hi - self.lo) * (frame.bottom - frame.top)
    }

    fn draw(&self, svg: &mut String, frame: &Frame) {
        for &tick in &self.ticks {
            let y = self.y(frame, tick);
            let _ = writeln!(
                svg,
                "<line x1=\"{:.1}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#e3e3e3\"/>",
                frame.left, frame.right
            );
            let _ = writeln!(
                svg,
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
                frame.left - 8.0,
                y + 4.0,
                escape(&format::tick(tick))
            );
        }
        let _ = writeln!(
            svg,
            "<line x1=\"{l:.1}\" y1=\"{t:.1}\" x2=\"{l:.1}\" y2=\"{b:.1}\" stroke=\"#333333\"/>\n\
             <line x1=\"{l:.1}\" y1=\"{b:.1}\" x2=\"{r:.1}\" y2=\"{b:.1}\" stroke=\"#333333\"/>",
            l = frame.left,
            t = frame.top,
            b = frame.bottom,
            r = frame.right
        );
    }
}

/// The horizontal axis of a line chart.
struct XAxis {
    log2: bool,
    lo: f64,
    hi: f64,
}

impl XAxis {
    fn new(log2: bool, xs: impl Iterator<Item = f64>) -> Self {
        let transformed: Vec<f64> = xs
            .filter(|&x| x.is_finite() && (!log2 || x > 0.0))
            .map(|x| if log2 { x.log2() } else { x })
            .collect();
        let lo = transformed.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = transformed
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max);
        let (lo, hi) = if transformed.is_empty() {
            (0.0, 1.0)
        } else if hi > lo {
            let pad = (hi - lo) * 0.05;
            (lo - pad, hi + pad)
        } else {
            (lo - 1.0, hi + 1.0)
        };
        XAxis { log2, lo, hi }
    }

    fn x(&self, frame: &Frame, x: f64) -> Option<f64> {
        if !x.is_finite() || (self.log2 && x <= 0.0) {
            return None;
        }
        let t = if self.log2 { x.log2() } else { x };
        Some(frame.left + (t - self.lo) / (self.hi - self.lo) * (frame.right - frame.left))
    }
}

fn draw_lines(
    svg: &mut String,
    frame: &Frame,
    chart: &Chart,
    log2_x: bool,
    x_ticks: &[(f64, String)],
    lines: &[Line],
) {
    let y_axis = ValueAxis::from_zero(
        lines
            .iter()
            .flat_map(|l| l.points.iter().filter_map(|p| p.1)),
    );
    y_axis.draw(svg, frame);
    let mark_xs = chart.failed.iter().filter_map(|m| match m.at {
        MarkAt::X(x) => Some(x),
        _ => None,
    });
    let x_axis = XAxis::new(
        log2_x,
        x_ticks
            .iter()
            .map(|t| t.0)
            .chain(lines.iter().flat_map(|l| l.points.iter().map(|p| p.0)))
            .chain(mark_xs),
    );

    let tick_label = |x: f64| {
        x_ticks
            .iter()
            .find(|t| (t.0 - x).abs() <= f64::EPSILON * x.abs().max(1.0))
            .map_or_else(|| format::tick(x), |t| t.1.clone())
    };
    for (x, label) in x_ticks {
        let Some(px) = x_axis.x(frame, *x) else {
            continue;
        };
        let _ = writeln!(
            svg,
            "<line x1=\"{px:.1}\" y1=\"{b:.1}\" x2=\"{px:.1}\" y2=\"{:.1}\" stroke=\"#333333\"/>\n\
             <text x=\"{px:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            frame.bottom + 5.0,
            frame.bottom + 19.0,
            escape(label),
            b = frame.bottom
        );
    }

    for line in lines {
        let mut points = line.points.clone();
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        let _ = writeln!(
            svg,
            "<g class=\"series\" data-series=\"{}\">",
            escape(&line.name)
        );
        // Segments between failed points.
        let mut segments: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
        for &(x, y) in &points {
            match (y, x_axis.x(frame, x)) {
                (Some(y), Some(px)) if y.is_finite() => {
                    if let Some(segment) = segments.last_mut() {
                        segment.push((px, y_axis.y(frame, y)));
                    }
                }
                _ => segments.push(Vec::new()),
            }
        }
        let dash = if line.dashed {
            " stroke-dasharray=\"7 4\""
        } else {
            ""
        };
        for segment in segments.iter().filter(|s| s.len() >= 2) {
            let d: Vec<String> = segment
                .iter()
                .enumerate()
                .map(|(i, (px, py))| format!("{}{px:.1} {py:.1}", if i == 0 { "M" } else { "L" }))
                .collect();
            let _ = writeln!(
                svg,
                "<path d=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"{dash}/>",
                d.join(" "),
                line.color
            );
        }
        for &(x, y) in &points {
            let (Some(y), Some(px)) = (y, x_axis.x(frame, x)) else {
                continue;
            };
            if !y.is_finite() {
                continue;
            }
            let _ = writeln!(
                svg,
                "<circle cx=\"{px:.1}\" cy=\"{:.1}\" r=\"3.5\" fill=\"{}\"><title>{}</title></circle>",
                y_axis.y(frame, y),
                line.color,
                escape(&format!(
                    "{}, {} {}: {}",
                    line.name,
                    chart.x_label,
                    tick_label(x),
                    format::value(y)
                ))
            );
        }
        svg.push_str("</g>\n");
    }

    for mark in &chart.failed {
        if let MarkAt::X(x) = mark.at {
            if let Some(px) = x_axis.x(frame, x) {
                draw_failed_mark(svg, px, frame.bottom, mark);
            }
        }
    }
    draw_legend(
        svg,
        frame,
        lines
            .iter()
            .map(|l| (l.name.as_str(), l.color, l.dashed, false)),
    );
}

fn draw_bars(
    svg: &mut String,
    frame: &Frame,
    chart: &Chart,
    groups: &[String],
    series: &[BarSeries],
) {
    let y_axis = ValueAxis::from_zero(
        series
            .iter()
            .flat_map(|s| s.values.iter().flatten().copied()),
    );
    y_axis.draw(svg, frame);
    let group_width = (frame.right - frame.left) / groups.len().max(1) as f64;
    let bar_width = group_width * 0.8 / series.len().max(1) as f64;
    let slot_center = |group: usize, index: usize| {
        frame.left
            + group as f64 * group_width
            + group_width * 0.1
            + (index as f64 + 0.5) * bar_width
    };
    for (g, label) in groups.iter().enumerate() {
        let center = frame.left + (g as f64 + 0.5) * group_width;
        let _ = writeln!(
            svg,
            "<text x=\"{center:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            frame.bottom + 19.0,
            escape(&fit(label, group_width))
        );
    }
    for (s, bars) in series.iter().enumerate() {
        let _ = writeln!(
            svg,
            "<g class=\"series\" data-series=\"{}\">",
            escape(&bars.name)
        );
        for (g, value) in bars.values.iter().enumerate().take(groups.len()) {
            let Some(value) = value.filter(|v| v.is_finite()) else {
                continue;
            };
            let zero = y_axis.y(frame, 0.0_f64.max(y_axis.lo));
            let top = y_axis.y(frame, value);
            let (y, h) = if top <= zero {
                (top, zero - top)
            } else {
                (zero, top - zero)
            };
            let x = slot_center(g, s) - bar_width / 2.0;
            let _ = writeln!(
                svg,
                "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{h:.1}\" fill=\"{}\"><title>{}</title></rect>",
                (bar_width - 2.0).max(1.0),
                bars.color,
                escape(&format!("{}, {}: {}", bars.name, groups[g], format::value(value)))
            );
            let _ = writeln!(
                svg,
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"10\">{}</text>",
                slot_center(g, s),
                y - 4.0,
                escape(&format::value(value))
            );
        }
        svg.push_str("</g>\n");
    }
    for mark in &chart.failed {
        if let MarkAt::Bar { group, series } = mark.at {
            draw_failed_mark(svg, slot_center(group, series), frame.bottom, mark);
        }
    }
    draw_legend(
        svg,
        frame,
        series
            .iter()
            .map(|s| (s.name.as_str(), s.color, false, true)),
    );
}

fn draw_intervals(svg: &mut String, frame: &Frame, chart: &Chart, items: &[Interval]) {
    let y_axis = ValueAxis::around(
        items
            .iter()
            .flat_map(|i| i.estimate.into_iter().flat_map(|(m, lo, hi)| [m, lo, hi])),
    );
    y_axis.draw(svg, frame);
    let slot = (frame.right - frame.left) / items.len().max(1) as f64;
    let center = |i: usize| frame.left + (i as f64 + 0.5) * slot;
    for (i, item) in items.iter().enumerate() {
        let cx = center(i);
        let _ = writeln!(
            svg,
            "<text x=\"{cx:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            frame.bottom + 19.0,
            escape(&fit(&item.label, slot))
        );
        let Some((median, low, high)) = item.estimate else {
            continue;
        };
        if !median.is_finite() {
            continue;
        }
        let _ = writeln!(
            svg,
            "<g class=\"series\" data-series=\"{}\">",
            escape(&item.label)
        );
        let summary = if low.is_finite() && high.is_finite() {
            let (y_low, y_high) = (y_axis.y(frame, low), y_axis.y(frame, high));
            let _ = writeln!(
                svg,
                "<path d=\"M{cx:.1} {y_low:.1} L{cx:.1} {y_high:.1} M{:.1} {y_low:.1} L{:.1} {y_low:.1} M{:.1} {y_high:.1} L{:.1} {y_high:.1}\" stroke=\"{}\" stroke-width=\"2\" fill=\"none\"/>",
                cx - 10.0,
                cx + 10.0,
                cx - 10.0,
                cx + 10.0,
                item.color
            );
            format!(
                "{}: median {} [{}, {}]",
                item.label,
                format::value(median),
                format::value(low),
                format::value(high)
            )
        } else {
            format!("{}: median {}", item.label, format::value(median))
        };
        let y_median = y_axis.y(frame, median);
        let _ = writeln!(
            svg,
            "<circle cx=\"{cx:.1}\" cy=\"{y_median:.1}\" r=\"5\" fill=\"{}\"><title>{}</title></circle>",
            item.color,
            escape(&summary)
        );
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\">{}</text>",
            cx + 14.0,
            y_median + 4.0,
            escape(&format::value(median))
        );
        svg.push_str("</g>\n");
    }
    for mark in &chart.failed {
        if let MarkAt::Item(i) = mark.at {
            draw_failed_mark(svg, center(i), frame.bottom, mark);
        }
    }
}

/// A ✕ centred on `(x, y)` in the mark's colour, with its description as
/// tooltip.
fn draw_failed_mark(svg: &mut String, x: f64, y: f64, mark: &FailedMark) {
    let r = 6.0;
    let _ = writeln!(
        svg,
        "<path class=\"failed\" d=\"M{:.1} {:.1} L{:.1} {:.1} M{:.1} {:.1} L{:.1} {:.1}\" stroke=\"{}\" stroke-width=\"2.5\" fill=\"none\"><title>{}</title></path>",
        x - r,
        y - r,
        x + r,
        y + r,
        x - r,
        y + r,
        x + r,
        y - r,
        mark.color,
        escape(&mark.description)
    );
}

/// The legend right of the plot: `(name, colour, dashed, filled box)`.
fn draw_legend<'a>(
    svg: &mut String,
    frame: &Frame,
    entries: impl Iterator<Item = (&'a str, &'static str, bool, bool)>,
) {
    let x = frame.right + 18.0;
    let mut y = frame.top + 6.0;
    for (name, color, dashed, filled) in entries {
        if filled {
            let _ = writeln!(
                svg,
                "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"22\" height=\"10\" fill=\"{color}\"/>",
                y - 5.0
            );
        } else {
            let dash = if dashed {
                " stroke-dasharray=\"7 4\""
            } else {
                ""
            };
            let _ = writeln!(
                svg,
                "<line x1=\"{x:.1}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"{color}\" stroke-width=\"2\"{dash}/>",
                x + 22.0
            );
        }
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{:.1}\">{}<title>{}</title></text>",
            x + 30.0,
            y + 4.0,
            escape(&fit(name, LEGEND_WIDTH - 50.0)),
            escape(name)
        );
        y += 20.0;
    }
}

/// Shortens a label to about what fits in `width` pixels at 12 px.
fn fit(label: &str, width: f64) -> String {
    let max_chars = ((width / 7.0).floor() as usize).max(4);
    format::one_line(label, max_chars)
}

/// Escapes text for XML content and attribute values.
pub(crate) fn escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '"' => escaped.push_str("&quot;"),
            '\'' => escaped.push_str("&#39;"),
            // Control characters are not allowed in XML 1.0.
            c if c.is_control() && c != '\n' && c != '\t' => escaped.push(' '),
            c => escaped.push(c),
        }
    }
    escaped
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(svg: &str) -> roxmltree::Document<'_> {
        match roxmltree::Document::parse(svg) {
            Ok(doc) => doc,
            Err(e) => panic!("not well-formed XML: {e}\n{svg}"),
        }
    }

    #[test]
    fn nice_axes_are_round_and_cover_the_data() {
        let axis = ValueAxis::nice(0.0, 9300.0);
        assert_eq!(axis.lo, 0.0);
        assert_eq!(axis.hi, 10_000.0);
        assert_eq!(
            axis.ticks,
            vec![0.0, 2000.0, 4000.0, 6000.0, 8000.0, 10_000.0]
        );
        let flat = ValueAxis::nice(0.0, 0.0);
        assert_eq!((flat.lo, flat.hi), (0.0, 1.0));
        let nan = ValueAxis::nice(f64::NAN, 3.0);
        assert_eq!((nan.lo, nan.hi), (0.0, 1.0));
        for extreme in [1e-320, f64::MIN_POSITIVE, 1e300, f64::MAX] {
            let axis = ValueAxis::nice(0.0, extreme);
            assert!(axis.hi > axis.lo && axis.hi.is_finite(), "{extreme}");
            assert!(axis.ticks.iter().all(|t| t.is_finite()) && axis.ticks.len() <= 51);
        }
        let around = ValueAxis::around([990.0, 1000.0, 1010.0].into_iter());
        assert!(around.lo <= 990.0 && around.hi >= 1010.0 && around.lo > 0.0);
    }

    #[test]
    fn a_line_chart_is_well_formed_with_hostile_text() {
        let chart = Chart {
            title: "IOPS <&> \"quoted\"".into(),
            x_label: "numjobs".into(),
            y_label: "IOPS".into(),
            body: Body::Lines {
                log2_x: true,
                x_ticks: vec![(512.0, "512".into()), (4096.0, "4k".into())],
                lines: vec![Line {
                    name: "nbd://h/x?a=1&b=2".into(),
                    color: color(0),
                    dashed: true,
                    points: vec![
                        (512.0, Some(10.0)),
                        (1024.0, None),
                        (2048.0, Some(30.0)),
                        (4096.0, Some(f64::NAN)),
                    ],
                }],
            },
            failed: vec![FailedMark {
                at: MarkAt::X(1024.0),
                color: color(0),
                description: "nbd, bs 1k: FAILED: error <\u{1}>".into(),
            }],
        };
        let svg = element(&chart);
        let doc = parse(&svg);
        assert_eq!(doc.root_element().tag_name().name(), "svg");
        assert!(svg.contains("class=\"failed\""));
        assert!(svg.contains("FAILED: error &lt; &gt;"));
        assert!(!svg.contains("href"));
        assert!(!svg.contains(" id="));
        parse(&document(&chart));
    }

    #[test]
    fn empty_charts_still_draw() {
        for body in [
            Body::Lines {
                log2_x: false,
                x_ticks: vec![],
                lines: vec![],
            },
            Body::Bars {
                groups: vec![],
                series: vec![],
            },
            Body::Intervals { items: vec![] },
        ] {
            let chart = Chart {
                title: "empty".into(),
                x_label: "x".into(),
                y_label: "y".into(),
                body,
                failed: vec![],
            };
            parse(&element(&chart));
        }
    }

    #[test]
    fn long_failure_lists_are_capped() {
        let failed = (0..30)
            .map(|i| FailedMark {
                at: MarkAt::Item(0),
                color: FAILED_COLOR,
                description: format!("sample {i} failed"),
            })
            .collect();
        let chart = Chart {
            title: "t".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            body: Body::Intervals {
                items: vec![Interval {
                    label: "basalt".into(),
                    color: color(0),
                    estimate: None,
                }],
            },
            failed,
        };
        let svg = element(&chart);
        parse(&svg);
        assert!(svg.contains("and 18 more failed points"));
    }
}
