//! The tables of a report as plain data, built once and written by both
//! results.md and report.html so that they always show the same content:
//! the per-cell results table, the comparison across targets (with every
//! pairwise ratio), and the `fio-samples` estimates.
//!
//! Invariants: every cell given to `results` yields at least one row; a
//! failed cell's row says `FAILED: <error>` and shows no figure; in
//! comparisons a failed cell shows `FAILED` and its ratios `–`, never a
//! number; rows follow workload order, then target order as given.

use super::figures::{self, Direction, Figure, Metric};
use super::format;
use crate::model::{BootstrapEstimate, CellResult, RunSummary, SampleEstimate, Workload};
use std::collections::BTreeSet;

/// Longest error text shown in a table cell; summary.json keeps the whole.
const ERROR_CHARS: usize = 300;

/// One table: a title, an optional note under it, columns and rows.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Table {
    pub title: String,
    pub note: Option<String>,
    pub columns: Vec<Column>,
    pub rows: Vec<Row>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Column {
    pub header: String,
    /// Right-aligned figures rather than left-aligned text.
    pub numeric: bool,
}

impl Column {
    pub(crate) fn text(header: impl Into<String>) -> Self {
        Column {
            header: header.into(),
            numeric: false,
        }
    }
    pub(crate) fn number(header: impl Into<String>) -> Self {
        Column {
            header: header.into(),
            numeric: true,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Cell {
    Text(String),
    Number(String),
    /// A failed measurement: the text to show, starting with `FAILED`.
    Failed(String),
    /// Nothing to show (`–`).
    Empty,
}

impl Cell {
    pub(crate) fn figure(metric: Metric, figure: Figure<'_>) -> Cell {
        match figure {
            Figure::Value(v) => Cell::Number(metric.text(v)),
            Figure::Failed(_) => Cell::Failed("FAILED".into()),
            Figure::Absent => Cell::Empty,
        }
    }

    /// The text as written in either output (before escaping).
    pub(crate) fn text(&self) -> &str {
        match self {
            Cell::Text(t) | Cell::Number(t) | Cell::Failed(t) => t,
            Cell::Empty => format::NONE,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Row {
    /// One cell per column.
    Values(Vec<Cell>),
    /// A failed measurement: `key` fills the first columns, then
    /// `FAILED: <error>` spans the rest.
    Failed { key: Vec<Cell>, error: String },
}

impl Row {
    /// The text of the spanning cell of a failed row.
    pub(crate) fn failed_text(error: &str) -> String {
        format!("FAILED: {}", format::one_line(error, ERROR_CHARS))
    }
}

/// The workload columns of a table: rw, bs, jobs, QD always; read %, fsync
/// and sample only when some row has them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WorkloadColumns {
    mix: bool,
    fsync: bool,
    sample: bool,
}

impl WorkloadColumns {
    pub(crate) fn for_workloads<'a>(
        workloads: impl IntoIterator<Item = &'a Workload>,
        with_sample: bool,
    ) -> Self {
        let mut columns = WorkloadColumns {
            mix: false,
            fsync: false,
            sample: with_sample,
        };
        for workload in workloads {
            columns.mix |= workload.rwmixread.is_some();
            columns.fsync |= workload.fsync.is_some();
        }
        columns
    }

    pub(crate) fn headers(&self) -> Vec<Column> {
        let mut headers = vec![
            Column::text("rw"),
            Column::number("bs"),
            Column::number("jobs"),
            Column::number("QD"),
        ];
        if self.mix {
            headers.push(Column::number("read %"));
        }
        if self.fsync {
            headers.push(Column::number("fsync"));
        }
        if self.sample {
            headers.push(Column::number("sample"));
        }
        headers
    }

    pub(crate) fn cells(&self, workload: &Workload, sample: Option<u32>) -> Vec<Cell> {
        let optional =
            |value: Option<u32>| value.map_or(Cell::Empty, |v| Cell::Number(v.to_string()));
        let mut cells = vec![
            Cell::Text(workload.rw.clone()),
            Cell::Number(format::block_size(workload.block_size_bytes)),
            Cell::Number(workload.numjobs.to_string()),
            Cell::Number(workload.iodepth.to_string()),
        ];
        if self.mix {
            cells.push(optional(workload.rwmixread));
        }
        if self.fsync {
            cells.push(optional(workload.fsync));
        }
        if self.sample {
            cells.push(optional(sample));
        }
        cells
    }
}

/// Target names in display order: the run's order, then any other name a
/// cell or estimate carries.
pub(crate) fn target_order(run: &RunSummary) -> Vec<String> {
    let mut order = run.targets.clone();
    let others = run
        .cells
        .iter()
        .map(|c| &c.target)
        .chain(run.estimates.iter().map(|e| &e.target));
    for name in others {
        if !order.contains(name) {
            order.push(name.clone());
        }
    }
    order
}

fn target_rank(targets: &[String], name: &str) -> usize {
    targets
        .iter()
        .position(|t| t == name)
        .unwrap_or(targets.len())
}

/// Cells sorted by workload, target order, sample.
pub(crate) fn sorted_cells<'a>(
    cells: &[&'a CellResult],
    targets: &[String],
) -> Vec<&'a CellResult> {
    let mut sorted = cells.to_vec();
    sorted.sort_by(|a, b| {
        (
            &a.workload,
            target_rank(targets, &a.target),
            &a.target,
            a.sample,
        )
            .cmp(&(
                &b.workload,
                target_rank(targets, &b.target),
                &b.target,
                b.sample,
            ))
    });
    sorted
}

/// The metric columns of the results table.
const RESULT_METRICS: [Metric; 6] = [
    Metric::Iops,
    Metric::MibPerSec,
    Metric::LatencyMean,
    Metric::LatencyP50,
    Metric::LatencyP99,
    Metric::LatencyP99_9,
];

/// Every cell with every figure: one row per measured direction, or one
/// `FAILED` row.
pub(crate) fn results(title: &str, cells: &[&CellResult], targets: &[String]) -> Table {
    let cells = sorted_cells(cells, targets);
    let workload_columns = WorkloadColumns::for_workloads(
        cells.iter().map(|c| &c.workload),
        cells.iter().any(|c| c.sample.is_some()),
    );
    let with_cpu = cells.iter().any(|c| c.server_cpu_seconds.is_some());
    let mut metrics = RESULT_METRICS.to_vec();
    if with_cpu {
        metrics.push(Metric::CpuPerIo);
    }
    if cells.iter().any(|c| c.server_context_switches.is_some()) {
        metrics.push(Metric::SwitchesPerIo);
    }

    let mut columns = workload_columns.headers();
    columns.push(Column::text("target"));
    columns.push(Column::text("dir"));
    columns.extend(metrics.iter().map(|m| Column::number(m.label())));

    let mut rows = Vec::new();
    for cell in cells {
        let mut key = workload_columns.cells(&cell.workload, cell.sample);
        key.push(Cell::Text(cell.target.clone()));
        if let Some(error) = figures::failure(cell) {
            rows.push(Row::Failed {
                key,
                error: error.to_string(),
            });
            continue;
        }
        let directions = figures::measured_directions(cell);
        if directions.is_empty() {
            let mut row = key;
            row.push(Cell::Empty);
            row.extend(metrics.iter().map(|_| Cell::Empty));
            rows.push(Row::Values(row));
            continue;
        }
        for direction in directions {
            let mut row = key.clone();
            row.push(Cell::Text(direction.label().into()));
            row.extend(metrics.iter().map(|&metric| {
                if metric.is_per_cell() && direction == Direction::Sync {
                    Cell::Empty
                } else {
                    Cell::figure(metric, figures::figure(cell, direction, metric))
                }
            }));
            rows.push(Row::Values(row));
        }
    }
    Table {
        title: format!("{title}: results"),
        note: None,
        columns,
        rows,
    }
}

/// The targets of `targets` that have a cell among `cells`, in order.
fn present_targets(cells: &[&CellResult], targets: &[String]) -> Vec<String> {
    targets
        .iter()
        .filter(|t| cells.iter().any(|c| &c.target == *t))
        .cloned()
        .collect()
}

/// Every unordered pair of targets, earlier first: (a, b) reads `a/b`.
pub(crate) fn pairs(targets: &[String]) -> Vec<(usize, usize)> {
    (0..targets.len())
        .flat_map(|a| (a + 1..targets.len()).map(move |b| (a, b)))
        .collect()
}

pub(crate) const RATIO_NOTE: &str =
    "A/B is A's figure divided by B's: above 1 means more IOPS or MiB/s for A — or a higher latency or CPU cost. FAILED cells have no ratio.";

/// For each workload, direction and metric: the figure of every target and
/// the ratio of every pair. `None` with fewer than two targets.
pub(crate) fn comparison(
    title: &str,
    cells: &[&CellResult],
    targets: &[String],
    metrics: &[Metric],
) -> Option<Table> {
    let cells: Vec<&CellResult> = sorted_cells(cells, targets)
        .into_iter()
        .filter(|c| c.sample.is_none())
        .collect();
    let targets = present_targets(&cells, targets);
    if targets.len() < 2 {
        return None;
    }
    let pairs = pairs(&targets);
    let workload_columns = WorkloadColumns::for_workloads(cells.iter().map(|c| &c.workload), false);
    let mut columns = workload_columns.headers();
    columns.push(Column::text("dir"));
    columns.push(Column::text("metric"));
    columns.extend(targets.iter().map(|t| Column::number(t.clone())));
    columns.extend(
        pairs
            .iter()
            .map(|&(a, b)| Column::number(format!("{}/{}", targets[a], targets[b]))),
    );

    let workloads: BTreeSet<&Workload> = cells.iter().map(|c| &c.workload).collect();
    let mut rows = Vec::new();
    for workload in workloads {
        let of_target: Vec<Option<&CellResult>> = targets
            .iter()
            .map(|t| {
                cells
                    .iter()
                    .find(|c| &c.workload == workload && &c.target == t)
                    .copied()
            })
            .collect();
        let lines = figure_lines(workload, &of_target, metrics);
        for (direction, metric) in lines {
            let figures: Vec<Figure> = of_target
                .iter()
                .map(|cell| line_figure(*cell, direction, metric))
                .collect();
            if !line_shown(&figures, metric) {
                continue;
            }
            let mut row = workload_columns.cells(workload, None);
            row.push(Cell::Text(direction.map_or("all", |d| d.label()).into()));
            row.push(Cell::Text(metric.label().into()));
            row.extend(figures.iter().map(|&f| Cell::figure(metric, f)));
            row.extend(
                pairs
                    .iter()
                    .map(|&(a, b)| ratio_cell(figures[a], figures[b])),
            );
            rows.push(Row::Values(row));
        }
    }
    Some(Table {
        title: format!("{title}: targets compared"),
        note: Some(RATIO_NOTE.into()),
        columns,
        rows,
    })
}

/// The rows (direction, metric) comparing `cells` of one workload: each
/// direction measured by any of them (else implied by rw) × each per-
/// direction metric (no IOPS or MiB/s for fsync), then the per-cell
/// metrics with no direction.
pub(crate) fn figure_lines(
    workload: &Workload,
    cells: &[Option<&CellResult>],
    metrics: &[Metric],
) -> Vec<(Option<Direction>, Metric)> {
    let mut directions: Vec<Direction> = cells
        .iter()
        .flatten()
        .flat_map(|c| figures::measured_directions(c))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    if directions.is_empty() {
        directions = figures::implied_directions(&workload.rw);
    }
    let mut lines: Vec<(Option<Direction>, Metric)> = Vec::new();
    for &direction in &directions {
        for &metric in metrics.iter().filter(|m| !m.is_per_cell()) {
            let throughput = matches!(metric, Metric::Iops | Metric::MibPerSec);
            if !(throughput && direction == Direction::Sync) {
                lines.push((Some(direction), metric));
            }
        }
    }
    lines.extend(
        metrics
            .iter()
            .filter(|m| m.is_per_cell())
            .map(|&m| (None, m)),
    );
    lines
}

/// The figure of one comparison line for a cell that may not exist.
pub(crate) fn line_figure(
    cell: Option<&CellResult>,
    direction: Option<Direction>,
    metric: Metric,
) -> Figure<'_> {
    match cell {
        Some(cell) => figures::figure(cell, direction.unwrap_or(Direction::Read), metric),
        None => Figure::Absent,
    }
}

/// Whether a comparison line is shown: when anything was measured, or a
/// cell failed (but not for a per-cell figure, such as CPU, that the
/// others did not measure either).
pub(crate) fn line_shown(figures: &[Figure<'_>], metric: Metric) -> bool {
    let any_value = figures.iter().any(|f| f.value().is_some());
    let any_failed = figures.iter().any(|f| matches!(f, Figure::Failed(_)));
    any_value || (any_failed && !metric.is_per_cell())
}

/// A ratio cell: `a/b` when both are values.
pub(crate) fn ratio_cell(a: Figure<'_>, b: Figure<'_>) -> Cell {
    match (a.value(), b.value()) {
        (Some(va), Some(vb)) => Cell::Number(format::ratio_text(format::ratio(va, vb))),
        _ => Cell::Empty,
    }
}

/// A bootstrap estimate as `median [low, high]`.
pub(crate) fn estimate_text(estimate: &BootstrapEstimate) -> String {
    if !estimate.median.is_finite() {
        return format::NONE.to_string();
    }
    if !(estimate.ci_low.is_finite() && estimate.ci_high.is_finite()) {
        return format::value(estimate.median);
    }
    format!(
        "{} [{}, {}]",
        format::value(estimate.median),
        format::value(estimate.ci_low),
        format::value(estimate.ci_high)
    )
}

fn percent(confidence: f64) -> String {
    let text = format!("{:.1}", confidence * 100.0);
    format!("{}%", text.trim_end_matches('0').trim_end_matches('.'))
}

/// The `fio-samples` estimates: one row per target × workload × metric,
/// plus a `FAILED` row for each target and workload whose samples produced
/// no estimate. `None` when the run has neither estimates nor samples.
pub(crate) fn estimates(run: &RunSummary, targets: &[String]) -> Option<Table> {
    let sample_cells: Vec<&CellResult> = run.cells.iter().filter(|c| c.sample.is_some()).collect();
    if run.estimates.is_empty() && sample_cells.is_empty() {
        return None;
    }
    let workload_columns = WorkloadColumns::for_workloads(
        run.estimates
            .iter()
            .map(|e| &e.workload)
            .chain(sample_cells.iter().map(|c| &c.workload)),
        false,
    );
    let mut columns = vec![Column::text("target")];
    columns.extend(workload_columns.headers());
    columns.extend([
        Column::text("metric"),
        Column::number("median"),
        Column::number("CI low"),
        Column::number("CI high"),
        Column::number("level"),
        Column::number("samples used"),
        Column::number("samples failed"),
        Column::number("resamples"),
        Column::number("seed"),
    ]);

    let failed_samples = |target: &str, workload: &Workload| {
        sample_cells
            .iter()
            .filter(|c| c.target == target && &c.workload == workload)
            .filter(|c| figures::failure(c).is_some())
            .count()
    };

    let mut estimates: Vec<&SampleEstimate> = run.estimates.iter().collect();
    estimates.sort_by(|a, b| {
        (&a.workload, &a.metric, target_rank(targets, &a.target)).cmp(&(
            &b.workload,
            &b.metric,
            target_rank(targets, &b.target),
        ))
    });
    let mut rows = Vec::new();
    for estimate in estimates {
        let e = &estimate.estimate;
        let mut row = vec![Cell::Text(estimate.target.clone())];
        row.extend(workload_columns.cells(&estimate.workload, None));
        row.extend([
            Cell::Text(estimate.metric.clone()),
            number_or_empty(e.median),
            number_or_empty(e.ci_low),
            number_or_empty(e.ci_high),
            Cell::Number(percent(e.confidence)),
            Cell::Number(e.samples.to_string()),
            Cell::Number(failed_samples(&estimate.target, &estimate.workload).to_string()),
            Cell::Number(e.resamples.to_string()),
            Cell::Number(e.seed.to_string()),
        ]);
        rows.push(Row::Values(row));
    }

    // Targets whose samples yielded no estimate at all still show up.
    let mut without_estimate: Vec<(&String, &Workload)> = Vec::new();
    for cell in &sample_cells {
        let has_estimate = run
            .estimates
            .iter()
            .any(|e| e.target == cell.target && e.workload == cell.workload);
        if !has_estimate && !without_estimate.contains(&(&cell.target, &cell.workload)) {
            without_estimate.push((&cell.target, &cell.workload));
        }
    }
    for (target, workload) in without_estimate {
        let total = sample_cells
            .iter()
            .filter(|c| &c.target == target && &c.workload == workload)
            .count();
        let failed = failed_samples(target, workload);
        let mut key = vec![Cell::Text(target.clone())];
        key.extend(workload_columns.cells(workload, None));
        rows.push(Row::Failed {
            key,
            error: format!("no estimate: {failed} of {total} samples failed"),
        });
    }

    Some(Table {
        title: "Median with bootstrap confidence interval per target".into(),
        note: Some(
            "Percentile bootstrap of the median over the samples (seeded, reproducible).".into(),
        ),
        columns,
        rows,
    })
}

fn number_or_empty(v: f64) -> Cell {
    if v.is_finite() {
        Cell::Number(format::value(v))
    } else {
        Cell::Empty
    }
}

/// For each workload and metric estimated: every target's median with its
/// interval, and the ratio of medians of every pair. `None` with fewer than
/// two targets.
pub(crate) fn estimates_comparison(run: &RunSummary, targets: &[String]) -> Option<Table> {
    let targets: Vec<String> = targets
        .iter()
        .filter(|t| {
            run.estimates.iter().any(|e| &e.target == *t)
                || run
                    .cells
                    .iter()
                    .any(|c| c.sample.is_some() && &c.target == *t)
        })
        .cloned()
        .collect();
    if targets.len() < 2 || run.estimates.is_empty() {
        return None;
    }
    let pairs = pairs(&targets);
    let workload_columns =
        WorkloadColumns::for_workloads(run.estimates.iter().map(|e| &e.workload), false);
    let mut columns = workload_columns.headers();
    columns.push(Column::text("metric"));
    columns.extend(
        targets
            .iter()
            .map(|t| Column::number(format!("{t} median [CI]"))),
    );
    columns.extend(
        pairs
            .iter()
            .map(|&(a, b)| Column::number(format!("{}/{}", targets[a], targets[b]))),
    );
    let keys: BTreeSet<(&Workload, &String)> = run
        .estimates
        .iter()
        .map(|e| (&e.workload, &e.metric))
        .collect();
    let mut rows = Vec::new();
    for (workload, metric) in keys {
        let found: Vec<Option<&BootstrapEstimate>> = targets
            .iter()
            .map(|t| {
                run.estimates
                    .iter()
                    .find(|e| &e.target == t && &e.workload == workload && &e.metric == metric)
                    .map(|e| &e.estimate)
            })
            .collect();
        let mut row = workload_columns.cells(workload, None);
        row.push(Cell::Text(metric.clone()));
        for (target, estimate) in targets.iter().zip(&found) {
            row.push(match estimate {
                Some(e) if e.median.is_finite() => Cell::Number(estimate_text(e)),
                _ => {
                    let failed = run.cells.iter().any(|c| {
                        &c.target == target
                            && &c.workload == workload
                            && figures::failure(c).is_some()
                    });
                    if failed {
                        Cell::Failed("FAILED".into())
                    } else {
                        Cell::Empty
                    }
                }
            });
        }
        let median = |i: usize| found[i].map(|e| e.median);
        row.extend(pairs.iter().map(|&(a, b)| match (median(a), median(b)) {
            (Some(va), Some(vb)) => Cell::Number(format::ratio_text(format::ratio(va, vb))),
            _ => Cell::Empty,
        }));
        rows.push(Row::Values(row));
    }
    Some(Table {
        title: "Medians compared".into(),
        note: Some(format!(
            "{RATIO_NOTE} Ratios are of medians; compare the intervals before reading much into them."
        )),
        columns,
        rows,
    })
}
