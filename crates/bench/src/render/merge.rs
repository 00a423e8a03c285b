//! Before/after comparisons between runs merged by `basalt bench report
//! DIR…`: for every pair of runs (the earlier is "before"), the cells they
//! share by target and workload side by side with the after/before ratio,
//! and likewise their `fio-samples` estimates.
//!
//! Invariants: only what both runs measured for the same target and
//! workload is compared (the rest is in each run's own tables); a failed
//! side shows `FAILED` and no ratio; nothing is compared across sample
//! cells, whose comparison is that of their estimates.

use super::figures::Figure;
use super::report::{Profile, RunReport, ViewKey};
use super::table::{self, Cell, Column, Row, Table, WorkloadColumns};
use crate::model::{CellResult, SampleEstimate, Workload};
use std::collections::{BTreeMap, BTreeSet};

/// The comparison of two runs.
pub(crate) struct BeforeAfter {
    pub title: String,
    pub anchor: String,
    pub tables: Vec<Table>,
}

/// Every pair of runs that share a target and workload, earlier first.
pub(crate) fn comparisons(runs: &[RunReport<'_>]) -> Vec<BeforeAfter> {
    let mut comparisons = Vec::new();
    for (a, after) in runs.iter().enumerate() {
        for before in &runs[..a] {
            if let Some(comparison) = compare(before, after) {
                comparisons.push(comparison);
            }
        }
    }
    comparisons
}

const NOTE: &str = "after/before is the later run's figure divided by the earlier one's: above 1 means more IOPS or MiB/s — or a higher latency or CPU cost — after. Only targets and workloads measured in both runs are listed.";

fn compare(before: &RunReport<'_>, after: &RunReport<'_>) -> Option<BeforeAfter> {
    let (before_cells, after_cells) = (measured(before), measured(after));
    let shared: Vec<&CellResult> = after_cells
        .iter()
        .filter(|c| find(&before_cells, &c.target, &c.workload).is_some())
        .copied()
        .collect();

    let (profile, whole) = if before.summary.profile == after.summary.profile {
        (
            Profile::of(&after.summary.profile),
            after.summary.profile.as_str(),
        )
    } else {
        (Profile::Other, "shared cells")
    };
    let mut groups: BTreeMap<ViewKey, Vec<&CellResult>> = BTreeMap::new();
    for cell in &shared {
        groups
            .entry(profile.view_of(&cell.workload))
            .or_default()
            .push(cell);
    }
    let mut tables: Vec<Table> = groups
        .into_iter()
        .map(|(key, cells)| {
            let targets: Vec<String> = after
                .targets
                .iter()
                .filter(|t| cells.iter().any(|c| &c.target == *t))
                .cloned()
                .collect();
            let workload_columns =
                WorkloadColumns::for_workloads(cells.iter().map(|c| &c.workload), false);
            let mut columns = workload_columns.headers();
            columns.push(Column::text("dir"));
            columns.push(Column::text("metric"));
            for target in &targets {
                columns.push(Column::number(format!("{target} before")));
                columns.push(Column::number(format!("{target} after")));
                columns.push(Column::number(format!("{target} after/before")));
            }
            let workloads: BTreeSet<&Workload> = cells.iter().map(|c| &c.workload).collect();
            let mut rows = Vec::new();
            for workload in workloads {
                let sides: Vec<(Option<&CellResult>, Option<&CellResult>)> = targets
                    .iter()
                    .map(|t| (find(&before_cells, t, workload), find(&cells, t, workload)))
                    .collect();
                let all_cells: Vec<Option<&CellResult>> =
                    sides.iter().flat_map(|&(b, a)| [b, a]).collect();
                for (direction, metric) in
                    table::figure_lines(workload, &all_cells, profile.compared_metrics())
                {
                    let figures: Vec<(Figure<'_>, Figure<'_>)> = sides
                        .iter()
                        .map(|&(b, a)| {
                            (
                                table::line_figure(b, direction, metric),
                                table::line_figure(a, direction, metric),
                            )
                        })
                        .collect();
                    let flat: Vec<Figure<'_>> = figures.iter().flat_map(|&(b, a)| [b, a]).collect();
                    if !table::line_shown(&flat, metric) {
                        continue;
                    }
                    let mut row = workload_columns.cells(workload, None);
                    row.push(Cell::Text(direction.map_or("all", |d| d.label()).into()));
                    row.push(Cell::Text(metric.label().into()));
                    for &(b, a) in &figures {
                        row.push(Cell::figure(metric, b));
                        row.push(Cell::figure(metric, a));
                        row.push(table::ratio_cell(a, b));
                    }
                    rows.push(Row::Values(row));
                }
            }
            Table {
                title: format!(
                    "{}: run {} vs run {}",
                    key.title(whole),
                    after.number,
                    before.number
                ),
                note: Some(NOTE.into()),
                columns,
                rows,
            }
        })
        .collect();

    tables.extend(compare_estimates(before, after));
    if tables.is_empty() {
        return None;
    }
    Some(BeforeAfter {
        title: format!(
            "Run {} ({}) → run {} ({})",
            before.number, before.label, after.number, after.label
        ),
        anchor: format!("before-after-{}-{}", before.number, after.number),
        tables,
    })
}

/// The cells of a run that are not samples.
fn measured<'a>(run: &RunReport<'a>) -> Vec<&'a CellResult> {
    run.summary
        .cells
        .iter()
        .filter(|c| c.sample.is_none())
        .collect()
}

/// The cell of `target` and `workload` among `cells`.
fn find<'a>(cells: &[&'a CellResult], target: &str, workload: &Workload) -> Option<&'a CellResult> {
    cells
        .iter()
        .find(|c| c.target == target && &c.workload == workload)
        .copied()
}

/// The estimates both runs made for the same target, workload and metric.
fn compare_estimates(before: &RunReport<'_>, after: &RunReport<'_>) -> Option<Table> {
    let matching = |e: &SampleEstimate| {
        before
            .summary
            .estimates
            .iter()
            .find(|b| b.target == e.target && b.workload == e.workload && b.metric == e.metric)
    };
    let pairs: Vec<(&SampleEstimate, &SampleEstimate)> = after
        .summary
        .estimates
        .iter()
        .filter_map(|a| matching(a).map(|b| (b, a)))
        .collect();
    if pairs.is_empty() {
        return None;
    }
    let workload_columns =
        WorkloadColumns::for_workloads(pairs.iter().map(|(_, a)| &a.workload), false);
    let mut columns = vec![Column::text("target")];
    columns.extend(workload_columns.headers());
    columns.extend([
        Column::text("metric"),
        Column::number("before median [CI]"),
        Column::number("after median [CI]"),
        Column::number("after/before"),
        Column::text("intervals overlap"),
    ]);
    let rows = pairs
        .into_iter()
        .map(|(b, a)| {
            let (be, ae) = (&b.estimate, &a.estimate);
            let value = |v: f64| {
                if v.is_finite() {
                    Figure::Value(v)
                } else {
                    Figure::Absent
                }
            };
            let overlap = if [be.ci_low, be.ci_high, ae.ci_low, ae.ci_high]
                .iter()
                .all(|v| v.is_finite())
            {
                let overlaps = be.ci_low <= ae.ci_high && ae.ci_low <= be.ci_high;
                Cell::Text(if overlaps { "yes" } else { "no" }.into())
            } else {
                Cell::Empty
            };
            let mut row = vec![Cell::Text(a.target.clone())];
            row.extend(workload_columns.cells(&a.workload, None));
            row.extend([
                Cell::Text(a.metric.clone()),
                Cell::Number(table::estimate_text(be)),
                Cell::Number(table::estimate_text(ae)),
                table::ratio_cell(value(ae.median), value(be.median)),
                overlap,
            ]);
            Row::Values(row)
        })
        .collect();
    Some(Table {
        title: format!("Medians: run {} vs run {}", after.number, before.number),
        note: Some(
            "after/before is the ratio of medians. Overlapping intervals mean the change may be noise."
                .into(),
        ),
        columns,
        rows,
    })
}
