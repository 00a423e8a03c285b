//! Which charts each profile gets, and their data taken from the cells:
//! `matrix` IOPS and mean/p99 latency vs numjobs, `sweep` MiB/s vs block
//! size, `parallel` IOPS vs numjobs per iodepth, `db-latency` bars of IOPS
//! and latency percentiles, `fio-samples` medians with their intervals.
//!
//! Invariants: every target keeps one colour (its index in the run's target
//! order) in every chart; a failed cell never becomes a value: it breaks its
//! line and becomes a failed mark at its position, described with its
//! target, position and error; a figure a cell did not measure is left out.

use super::figures::{self, Direction, Figure, Metric};
use super::format;
use super::svg::{self, BarSeries, Body, Chart, FailedMark, Interval, Line, MarkAt};
use crate::model::{CellResult, RunSummary, Workload};
use std::collections::BTreeSet;

/// A chart with a file-name fragment unique within its view.
pub(crate) struct NamedChart {
    pub slug: String,
    pub chart: Chart,
}

/// Most x ticks drawn; beyond, every other one (or fewer) is labelled.
const MAX_X_TICKS: usize = 16;

/// What a line's y is.
#[derive(Clone, Copy)]
enum Y {
    /// Summed over read and write.
    Total(Metric),
    Of(Direction, Metric),
}

impl Y {
    fn figure(self, cell: &CellResult) -> Figure<'_> {
        match self {
            Y::Total(metric) => figures::total(cell, metric),
            Y::Of(direction, metric) => figures::figure(cell, direction, metric),
        }
    }
}

/// The workload field on a line chart's x axis.
#[derive(Clone, Copy, PartialEq, Eq)]
enum XField {
    Numjobs,
    /// On a log2 axis.
    BlockSize,
}

impl XField {
    fn of(self, w: &Workload) -> f64 {
        match self {
            XField::Numjobs => f64::from(w.numjobs),
            XField::BlockSize => w.block_size_bytes as f64,
        }
    }

    fn text(self, x: f64) -> String {
        match self {
            XField::Numjobs => format!("{x:.0}"),
            XField::BlockSize => format::block_size(x as u64),
        }
    }

    fn label(self) -> &'static str {
        match self {
            XField::Numjobs => "numjobs",
            XField::BlockSize => "block size",
        }
    }
}

/// One line per target and per entry of `lines`: `(name suffix, dashed, y)`.
struct LineSpec<'a> {
    title: String,
    y_label: String,
    x: XField,
    lines: Vec<(&'a str, bool, Y)>,
}

/// The targets having a cell, in order.
fn present<'a>(cells: &[&CellResult], targets: &'a [String]) -> Vec<(usize, &'a String)> {
    targets
        .iter()
        .enumerate()
        .filter(|(_, t)| cells.iter().any(|c| &c.target == *t))
        .collect()
}

/// What tells apart cells of one target at one x: the workload fields other
/// than x that vary across `cells` (e.g. `QD16` when several iodepths).
fn distinguishing_label(w: &Workload, cells: &[&CellResult], x: XField) -> String {
    let varies = |f: fn(&Workload) -> String| {
        cells
            .iter()
            .map(|c| f(&c.workload))
            .collect::<BTreeSet<_>>()
            .len()
            > 1
    };
    let mut parts = Vec::new();
    if varies(|w| w.rw.clone()) {
        parts.push(w.rw.clone());
    }
    if x != XField::BlockSize && varies(|w| w.block_size_bytes.to_string()) {
        parts.push(format::block_size(w.block_size_bytes));
    }
    if x != XField::Numjobs && varies(|w| w.numjobs.to_string()) {
        parts.push(format!("{}j", w.numjobs));
    }
    if varies(|w| w.iodepth.to_string()) {
        parts.push(format!("QD{}", w.iodepth));
    }
    if varies(|w| format!("{:?}", w.rwmixread)) {
        parts.push(format!("mix {:?}", w.rwmixread));
    }
    if varies(|w| format!("{:?}", w.fsync)) {
        parts.push(format!("fsync {:?}", w.fsync));
    }
    parts.join(" ")
}

/// A line chart from `cells`: one line per target (× distinguishing
/// workload × spec entry), ticks at every x present.
fn line_chart(spec: LineSpec<'_>, cells: &[&CellResult], targets: &[String]) -> Chart {
    let x_field = spec.x;
    let xs: BTreeSet<u64> = cells
        .iter()
        .map(|c| x_field.of(&c.workload).to_bits())
        .collect();
    let mut xs: Vec<f64> = xs.into_iter().map(f64::from_bits).collect();
    xs.sort_by(f64::total_cmp);
    let stride = xs.len().div_ceil(MAX_X_TICKS).max(1);
    let x_ticks = xs
        .iter()
        .step_by(stride)
        .map(|&x| (x, x_field.text(x)))
        .collect();

    let mut lines = Vec::new();
    let mut failed: Vec<FailedMark> = Vec::new();
    for (index, target) in present(cells, targets) {
        let own: Vec<&CellResult> = cells
            .iter()
            .filter(|c| &c.target == target)
            .copied()
            .collect();
        let mut variants: Vec<String> = Vec::new();
        for cell in &own {
            let label = distinguishing_label(&cell.workload, cells, x_field);
            if !variants.contains(&label) {
                variants.push(label);
            }
        }
        for variant in &variants {
            let of_variant: Vec<&CellResult> = own
                .iter()
                .filter(|c| &distinguishing_label(&c.workload, cells, x_field) == variant)
                .copied()
                .collect();
            let who = if variant.is_empty() {
                target.clone()
            } else {
                format!("{target} {variant}")
            };
            for &(suffix, dashed, y) in &spec.lines {
                let name = if suffix.is_empty() {
                    who.clone()
                } else {
                    format!("{who} {suffix}")
                };
                let mut points = Vec::new();
                for cell in &of_variant {
                    let x = x_field.of(&cell.workload);
                    match y.figure(cell) {
                        Figure::Value(v) => points.push((x, Some(v))),
                        Figure::Failed(error) => {
                            points.push((x, None));
                            let description = format!(
                                "{who}, {} {}: FAILED: {}",
                                x_field.label(),
                                x_field.text(x),
                                format::one_line(error, 200)
                            );
                            let mark = FailedMark {
                                at: MarkAt::X(x),
                                color: svg::color(index),
                                description,
                            };
                            if !failed.contains(&mark) {
                                failed.push(mark);
                            }
                        }
                        Figure::Absent => {}
                    }
                }
                if !points.is_empty() {
                    lines.push(Line {
                        name,
                        color: svg::color(index),
                        dashed,
                        points,
                    });
                }
            }
        }
    }
    Chart {
        title: spec.title,
        x_label: x_field.label().to_string(),
        y_label: spec.y_label,
        body: Body::Lines {
            log2_x: x_field == XField::BlockSize,
            x_ticks,
            lines,
        },
        failed,
    }
}

/// The read/write directions measured by any cell (else implied by rw).
fn directions(cells: &[&CellResult]) -> Vec<Direction> {
    let measured: BTreeSet<Direction> = cells
        .iter()
        .flat_map(|c| figures::measured_directions(c))
        .collect();
    if measured.is_empty() {
        cells
            .first()
            .map(|c| figures::implied_directions(&c.workload.rw))
            .unwrap_or_default()
    } else {
        measured.into_iter().collect()
    }
}

/// `matrix`, one rw × bs: IOPS vs numjobs, and mean/p99 latency vs numjobs
/// for each direction.
pub(crate) fn matrix(view: &str, cells: &[&CellResult], targets: &[String]) -> Vec<NamedChart> {
    let mut charts = vec![NamedChart {
        slug: "iops".into(),
        chart: line_chart(
            LineSpec {
                title: format!("{view}: IOPS vs numjobs"),
                y_label: "IOPS (read + write)".into(),
                x: XField::Numjobs,
                lines: vec![("", false, Y::Total(Metric::Iops))],
            },
            cells,
            targets,
        ),
    }];
    for direction in directions(cells) {
        charts.push(NamedChart {
            slug: format!("latency-{}", direction.label()),
            chart: line_chart(
                LineSpec {
                    title: format!("{view}: {} latency vs numjobs", direction.label()),
                    y_label: format!("{} latency (µs)", direction.label()),
                    x: XField::Numjobs,
                    lines: vec![
                        ("mean", false, Y::Of(direction, Metric::LatencyMean)),
                        ("p99", true, Y::Of(direction, Metric::LatencyP99)),
                    ],
                },
                cells,
                targets,
            ),
        });
    }
    charts
}

/// `sweep`, one rw: MiB/s vs block size on a log2 axis.
pub(crate) fn sweep(view: &str, cells: &[&CellResult], targets: &[String]) -> Vec<NamedChart> {
    vec![NamedChart {
        slug: "throughput".into(),
        chart: line_chart(
            LineSpec {
                title: format!("{view}: throughput vs block size"),
                y_label: "MiB/s".into(),
                x: XField::BlockSize,
                lines: vec![("", false, Y::Total(Metric::MibPerSec))],
            },
            cells,
            targets,
        ),
    }]
}

/// `parallel`: IOPS vs numjobs, one chart per iodepth.
pub(crate) fn parallel(cells: &[&CellResult], targets: &[String]) -> Vec<NamedChart> {
    let depths: BTreeSet<u32> = cells.iter().map(|c| c.workload.iodepth).collect();
    depths
        .into_iter()
        .map(|depth| {
            let of_depth: Vec<&CellResult> = cells
                .iter()
                .filter(|c| c.workload.iodepth == depth)
                .copied()
                .collect();
            let rw = of_depth.first().map_or("", |c| c.workload.rw.as_str());
            NamedChart {
                slug: format!("iops-qd{depth}"),
                chart: line_chart(
                    LineSpec {
                        title: format!("{rw} QD{depth}: IOPS vs numjobs"),
                        y_label: "IOPS (read + write)".into(),
                        x: XField::Numjobs,
                        lines: vec![("", false, Y::Total(Metric::Iops))],
                    },
                    &of_depth,
                    targets,
                ),
            }
        })
        .collect()
}

/// A short workload label: `randwrite 8k 1j QD1 fsync=1`.
pub(crate) fn workload_label(w: &Workload) -> String {
    let mut label = format!(
        "{} {} {}j QD{}",
        w.rw,
        format::block_size(w.block_size_bytes),
        w.numjobs,
        w.iodepth
    );
    if let Some(mix) = w.rwmixread {
        label.push_str(&format!(" read {mix}%"));
    }
    if let Some(fsync) = w.fsync {
        label.push_str(&format!(" fsync={fsync}"));
    }
    label
}

/// Bars with one group per label in `groups`, one bar per target.
fn target_bars(
    groups: Vec<String>,
    cells: &[&CellResult],
    targets: &[String],
    value: impl Fn(&CellResult, usize) -> Figure<'_>,
) -> (Body, Vec<FailedMark>) {
    let mut series = Vec::new();
    let mut failed = Vec::new();
    for (s, (index, target)) in present(cells, targets).into_iter().enumerate() {
        let cell = cells.iter().find(|c| &c.target == target);
        let values = (0..groups.len())
            .map(|g| match cell.map(|c| value(c, g)) {
                Some(Figure::Value(v)) => Some(v),
                Some(Figure::Failed(error)) => {
                    failed.push(FailedMark {
                        at: MarkAt::Bar {
                            group: g,
                            series: s,
                        },
                        color: svg::color(index),
                        description: format!("{target}: FAILED: {}", format::one_line(error, 200)),
                    });
                    None
                }
                _ => None,
            })
            .collect();
        series.push(BarSeries {
            name: target.clone(),
            color: svg::color(index),
            values,
        });
    }
    (Body::Bars { groups, series }, failed)
}

/// `db-latency`, per workload: IOPS per target, and p50/p99/p99.9 latency
/// per target for each direction (fsync included when measured).
pub(crate) fn db_latency(cells: &[&CellResult], targets: &[String]) -> Vec<NamedChart> {
    let workloads: BTreeSet<&Workload> = cells.iter().map(|c| &c.workload).collect();
    let several = workloads.len() > 1;
    let mut charts = Vec::new();
    for (w, workload) in workloads.into_iter().enumerate() {
        let of_workload: Vec<&CellResult> = cells
            .iter()
            .filter(|c| &c.workload == workload)
            .copied()
            .collect();
        let label = workload_label(workload);
        let prefix = if several {
            format!("w{}-", w + 1)
        } else {
            String::new()
        };

        let (body, failed) = target_bars(vec![label.clone()], &of_workload, targets, |cell, _| {
            figures::total(cell, Metric::Iops)
        });
        charts.push(NamedChart {
            slug: format!("{prefix}iops"),
            chart: Chart {
                title: format!("{label}: IOPS"),
                x_label: "workload".into(),
                y_label: "IOPS".into(),
                body,
                failed,
            },
        });

        let percentiles = [Metric::LatencyP50, Metric::LatencyP99, Metric::LatencyP99_9];
        let mut latency_directions = directions(&of_workload);
        let has_sync = of_workload
            .iter()
            .any(|c| figures::measured_directions(c).contains(&Direction::Sync));
        if has_sync && !latency_directions.contains(&Direction::Sync) {
            latency_directions.push(Direction::Sync);
        }
        for direction in latency_directions {
            let groups = vec!["p50".to_string(), "p99".into(), "p99.9".into()];
            let (body, failed) = target_bars(groups, &of_workload, targets, |cell, g| {
                figures::figure(cell, direction, percentiles[g])
            });
            charts.push(NamedChart {
                slug: format!("{prefix}latency-{}", direction.label()),
                chart: Chart {
                    title: format!("{label}: {} latency percentiles", direction.label()),
                    x_label: "percentile".into(),
                    y_label: format!("{} latency (µs)", direction.label()),
                    body,
                    failed,
                },
            });
        }
    }
    charts
}

/// A metric name of summary.json as a label: `write_lat_p99_us` →
/// `write p99 latency (µs)`.
pub(crate) fn metric_label(metric: &str) -> String {
    const WORDS: [(&str, &str); 6] = [
        ("_lat_mean_us", " mean latency (µs)"),
        ("_lat_p50_us", " p50 latency (µs)"),
        ("_lat_p99_us", " p99 latency (µs)"),
        ("_lat_p99_9_us", " p99.9 latency (µs)"),
        ("_iops", " IOPS"),
        ("_bandwidth_bytes_per_sec", " bandwidth (bytes/s)"),
    ];
    WORDS
        .iter()
        .find_map(|(suffix, words)| {
            metric
                .strip_suffix(suffix)
                .map(|rest| format!("{rest}{words}"))
        })
        .unwrap_or_else(|| metric.to_string())
}

/// Whether an estimated metric gets a chart: IOPS and latencies do (the
/// others, e.g. bandwidth or runtime, are in the tables); when no metric
/// is one of those, all do.
fn charted(metric: &str, all: &BTreeSet<&String>) -> bool {
    let headline = |m: &str| m.contains("iops") || m.contains("_lat_");
    headline(metric) || !all.iter().any(|m| headline(m))
}

/// `fio-samples`: for each workload and metric estimated (see `charted`),
/// every target's median with its interval; targets without an estimate,
/// or with failed samples, are marked.
pub(crate) fn fio_samples(run: &RunSummary, targets: &[String]) -> Vec<NamedChart> {
    let metrics: BTreeSet<&String> = run.estimates.iter().map(|e| &e.metric).collect();
    let keys: BTreeSet<(&Workload, &String)> = run
        .estimates
        .iter()
        .filter(|e| charted(&e.metric, &metrics))
        .map(|e| (&e.workload, &e.metric))
        .collect();
    let several_workloads = keys.iter().map(|k| k.0).collect::<BTreeSet<_>>().len() > 1;
    let mut charts = Vec::new();
    for (workload, metric) in keys {
        let in_chart: Vec<(usize, &String)> = targets
            .iter()
            .enumerate()
            .filter(|(_, t)| {
                run.estimates
                    .iter()
                    .any(|e| &e.target == *t && &e.workload == workload)
                    || run
                        .cells
                        .iter()
                        .any(|c| c.sample.is_some() && &c.target == *t && &c.workload == workload)
            })
            .collect();
        let mut items = Vec::new();
        let mut failed = Vec::new();
        for (item, &(index, target)) in in_chart.iter().enumerate() {
            let estimate = run
                .estimates
                .iter()
                .find(|e| &e.target == target && &e.workload == workload && &e.metric == metric)
                .map(|e| &e.estimate)
                .filter(|e| e.median.is_finite());
            let samples: Vec<&CellResult> = run
                .cells
                .iter()
                .filter(|c| c.sample.is_some() && &c.target == target && &c.workload == workload)
                .collect();
            let errors: Vec<&str> = samples.iter().filter_map(|c| figures::failure(c)).collect();
            if estimate.is_none() || !errors.is_empty() {
                let what = if estimate.is_none() {
                    "no estimate"
                } else {
                    "estimate from the rest"
                };
                let first = errors.first().map_or(String::new(), |e| {
                    format!(", first error: {}", format::one_line(e, 160))
                });
                failed.push(FailedMark {
                    at: MarkAt::Item(item),
                    color: svg::color(index),
                    description: format!(
                        "{target}: {} of {} samples FAILED ({what}){first}",
                        errors.len(),
                        samples.len()
                    ),
                });
            }
            items.push(Interval {
                label: target.clone(),
                color: svg::color(index),
                estimate: estimate.map(|e| (e.median, e.ci_low, e.ci_high)),
            });
        }
        let level = run
            .estimates
            .iter()
            .find(|e| &e.workload == workload && &e.metric == metric)
            .map_or(0.95, |e| e.estimate.confidence);
        let mut slug = super::report::slug(metric);
        if several_workloads {
            slug = format!("{}-{slug}", super::report::slug(&workload_label(workload)));
        }
        charts.push(NamedChart {
            slug,
            chart: Chart {
                title: format!(
                    "{}: {}, median with {:.0}% CI",
                    workload_label(workload),
                    metric_label(metric),
                    level * 100.0
                ),
                x_label: "target".into(),
                y_label: metric_label(metric),
                body: Body::Intervals { items },
                failed,
            },
        });
    }
    charts
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{CellOutcome, DirectionMetrics, LatencyMetrics, Metrics};

    fn cell(target: &str, numjobs: u32, iodepth: u32, iops: Option<f64>) -> CellResult {
        CellResult {
            target: target.into(),
            workload: Workload {
                rw: "randread".into(),
                block_size_bytes: 4096,
                numjobs,
                iodepth,
                rwmixread: None,
                fsync: None,
            },
            sample: None,
            raw_output: String::new(),
            outcome: match iops {
                Some(iops) => CellOutcome::Ok {
                    metrics: Metrics {
                        read: Some(DirectionMetrics {
                            iops,
                            bandwidth_bytes_per_sec: iops * 4096.0,
                            ios: 1,
                            latency: LatencyMetrics::default(),
                        }),
                        ..Metrics::default()
                    },
                },
                None => CellOutcome::Failed {
                    error: "boom".into(),
                },
            },
            server_cpu_seconds: None,
            server_context_switches: None,
            server_cpu_migrations: None,
        }
    }

    #[test]
    fn failed_cells_break_lines_and_become_marks() {
        let cells = [
            cell("a", 1, 1, Some(10.0)),
            cell("a", 4, 1, None),
            cell("a", 8, 1, Some(30.0)),
            cell("b", 1, 1, Some(5.0)),
        ];
        let refs: Vec<&CellResult> = cells.iter().collect();
        let targets = vec!["a".to_string(), "b".to_string()];
        let charts = matrix("randread 4k", &refs, &targets);
        let Body::Lines { lines, x_ticks, .. } = &charts[0].chart.body else {
            panic!("IOPS is a line chart");
        };
        assert_eq!(
            x_ticks.iter().map(|t| t.1.as_str()).collect::<Vec<_>>(),
            ["1", "4", "8"]
        );
        assert_eq!(lines.len(), 2);
        assert_eq!(
            lines[0].points,
            vec![(1.0, Some(10.0)), (4.0, None), (8.0, Some(30.0))]
        );
        assert_eq!(charts[0].chart.failed.len(), 1);
        assert_eq!(
            charts[0].chart.failed[0].description,
            "a, numjobs 4: FAILED: boom"
        );
    }

    #[test]
    fn metric_names_read_as_words() {
        assert_eq!(metric_label("write_iops"), "write IOPS");
        assert_eq!(metric_label("read_lat_p99_us"), "read p99 latency (µs)");
        assert_eq!(metric_label("runtime_ms"), "runtime_ms");
        let all: BTreeSet<&String> = BTreeSet::new();
        assert!(charted("write_lat_mean_us", &all));
        let runtime = "runtime_ms".to_string();
        let iops = "write_iops".to_string();
        assert!(!charted("runtime_ms", &BTreeSet::from([&runtime, &iops])));
        assert!(charted("runtime_ms", &BTreeSet::from([&runtime])));
    }

    #[test]
    fn lines_are_split_by_a_varying_iodepth() {
        let cells = [cell("a", 1, 1, Some(1.0)), cell("a", 1, 32, Some(2.0))];
        let refs: Vec<&CellResult> = cells.iter().collect();
        let charts = matrix("v", &refs, &["a".to_string()]);
        let Body::Lines { lines, .. } = &charts[0].chart.body else {
            panic!("IOPS is a line chart");
        };
        let names: Vec<&str> = lines.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["a QD1", "a QD32"]);
    }
}
