//! The content of a report, built once from the runs and then written by
//! both results.md and report.html: the runs in chronological order, each
//! labelled by profile and start time with its facts (machine, versions,
//! parameters), its views (per profile: the charts and tables of one slice
//! of the cells), and the before/after comparisons between runs.
//!
//! Invariants: every cell of every run appears in a results table of its
//! run; chart file names are unique within the report and live under
//! `charts/`; runs whose start times all parse as RFC 3339 are ordered by
//! them (earliest = run 1 = "before"), otherwise kept in the order given.

use super::charts::{self, NamedChart};
use super::figures::Metric;
use super::format;
use super::merge::{self, BeforeAfter};
use super::svg;
use super::table::{self, Table};
use crate::model::{CellResult, RunSummary, Workload};
use std::collections::{BTreeMap, HashSet};

/// Everything results.md and report.html show.
pub(crate) struct Report<'a> {
    pub runs: Vec<RunReport<'a>>,
    pub before_after: Vec<BeforeAfter>,
}

/// One run as shown.
pub(crate) struct RunReport<'a> {
    /// 1-based, in chronological order.
    pub number: usize,
    /// `profile @ start time`.
    pub label: String,
    /// HTML anchor of the run's section.
    pub anchor: String,
    pub summary: &'a RunSummary,
    /// Target names in display (and colour) order.
    pub targets: Vec<String>,
    pub views: Vec<View>,
}

/// One slice of a run (e.g. `matrix` randread at 4k): its charts and tables.
pub(crate) struct View {
    pub title: String,
    pub anchor: String,
    pub charts: Vec<RenderedChart>,
    pub tables: Vec<Table>,
}

/// A chart drawn, with where its file goes.
pub(crate) struct RenderedChart {
    /// Path relative to the output directory: `charts/<name>.svg`.
    pub file: String,
    pub title: String,
    /// The `<svg>` element.
    pub svg: String,
    /// Descriptions of the failed points, listed under the chart.
    pub failed: Vec<String>,
}

/// The profiles whose views and charts are known; others get one view
/// with tables only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Profile {
    Matrix,
    Sweep,
    DbLatency,
    FioSamples,
    Parallel,
    Other,
}

impl Profile {
    pub(crate) fn of(name: &str) -> Self {
        match name {
            "matrix" => Profile::Matrix,
            "sweep" => Profile::Sweep,
            "db-latency" => Profile::DbLatency,
            "fio-samples" => Profile::FioSamples,
            "parallel" => Profile::Parallel,
            _ => Profile::Other,
        }
    }

    /// The view a measured cell belongs to: matrix splits by rw × bs,
    /// sweep by rw, the others have one view.
    pub(crate) fn view_of(self, workload: &Workload) -> ViewKey {
        match self {
            Profile::Matrix => ViewKey {
                rw: Some(workload.rw.clone()),
                block_size: Some(workload.block_size_bytes),
            },
            Profile::Sweep => ViewKey {
                rw: Some(workload.rw.clone()),
                block_size: None,
            },
            _ => ViewKey {
                rw: None,
                block_size: None,
            },
        }
    }

    /// The figures compared across targets and across runs.
    pub(crate) fn compared_metrics(self) -> &'static [Metric] {
        match self {
            Profile::Sweep => &[
                Metric::MibPerSec,
                Metric::LatencyMean,
                Metric::LatencyP99,
                Metric::CpuPerIo,
                Metric::SwitchesPerIo,
            ],
            Profile::DbLatency => &[
                Metric::Iops,
                Metric::LatencyMean,
                Metric::LatencyP50,
                Metric::LatencyP99,
                Metric::LatencyP99_9,
                Metric::CpuPerIo,
                Metric::SwitchesPerIo,
            ],
            Profile::Matrix | Profile::Parallel | Profile::FioSamples => &[
                Metric::Iops,
                Metric::LatencyMean,
                Metric::LatencyP99,
                Metric::CpuPerIo,
                Metric::SwitchesPerIo,
            ],
            Profile::Other => &[
                Metric::Iops,
                Metric::MibPerSec,
                Metric::LatencyMean,
                Metric::LatencyP99,
                Metric::LatencyP99_9,
                Metric::CpuPerIo,
                Metric::SwitchesPerIo,
            ],
        }
    }
}

/// Which view of a profile a cell is in.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct ViewKey {
    rw: Option<String>,
    block_size: Option<u64>,
}

impl ViewKey {
    /// `randread, bs 4k`, `randread`, or `whole` for a profile's only view.
    pub(crate) fn title(&self, whole: &str) -> String {
        match (&self.rw, self.block_size) {
            (Some(rw), Some(bs)) => format!("{rw}, bs {}", format::block_size(bs)),
            (Some(rw), None) => rw.clone(),
            (None, Some(bs)) => format!("bs {}", format::block_size(bs)),
            (None, None) => whole.into(),
        }
    }
}

/// A file-name-safe form: lowercase ASCII letters, digits and single dashes.
pub(crate) fn slug(text: &str) -> String {
    let mut slug = String::new();
    for c in text.chars() {
        if c.is_ascii_alphanumeric() {
            slug.push(c.to_ascii_lowercase());
        } else if c == '.' && slug.chars().last().is_some_and(|l| l.is_ascii_digit()) {
            // Keep "p99.9" readable.
            slug.push('.');
        } else if !slug.is_empty() && !slug.ends_with('-') {
            slug.push('-');
        }
    }
    let slug = slug.trim_end_matches(['-', '.']).to_string();
    if slug.is_empty() {
        "x".into()
    } else {
        slug
    }
}

/// Seconds and nanoseconds since the Unix epoch of an RFC 3339 time
/// (`2026-11-21T10:00:00Z`, `…T10:00:00.123+01:00`), or `None`.
pub(crate) fn rfc3339_instant(text: &str) -> Option<(i64, u32)> {
    let text = text.trim();
    let number = |s: &str| -> Option<i64> {
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    let (date, rest) = text.split_at_checked(10)?;
    let mut date_parts = date.split('-');
    let year = number(date_parts.next()?)?;
    let month = number(date_parts.next()?)?;
    let day = number(date_parts.next()?)?;
    let rest = rest.strip_prefix(['T', 't', ' '])?;
    let (time, offset) = if let Some(time) = rest.strip_suffix(['Z', 'z']) {
        (time, 0)
    } else {
        let split = rest.len().checked_sub(6)?;
        let (time, offset) = rest.split_at_checked(split)?;
        let sign = match offset.as_bytes().first()? {
            b'+' => 1,
            b'-' => -1,
            _ => return None,
        };
        let (hours, minutes) = offset.get(1..)?.split_once(':')?;
        (time, sign * (number(hours)? * 3600 + number(minutes)? * 60))
    };
    let (clock, fraction) = match time.split_once('.') {
        Some((clock, fraction)) => (clock, Some(fraction)),
        None => (time, None),
    };
    let mut clock_parts = clock.split(':');
    let hour = number(clock_parts.next()?)?;
    let minute = number(clock_parts.next()?)?;
    let second = number(clock_parts.next()?)?;
    if clock_parts.next().is_some()
        || !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let nanos = match fraction {
        Some(f) => {
            number(f)?;
            let digits: String = f.chars().chain(std::iter::repeat('0')).take(9).collect();
            digits.parse().ok()?
        }
        None => 0,
    };
    // Days from civil (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let month_index = (month + 9) % 12;
    let day_of_year = (153 * month_index + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    let days = era * 146_097 + day_of_era - 719_468;
    Some((
        days * 86_400 + hour * 3600 + minute * 60 + second - offset,
        nanos,
    ))
}

/// The runs in report order: by start time when all parse, else as given.
fn chronological(runs: &[RunSummary]) -> Vec<&RunSummary> {
    let mut ordered: Vec<&RunSummary> = runs.iter().collect();
    let instants: Option<Vec<(i64, u32)>> = runs
        .iter()
        .map(|r| rfc3339_instant(&r.started_at))
        .collect();
    if let Some(instants) = instants {
        let mut indexed: Vec<(usize, (i64, u32))> = instants.into_iter().enumerate().collect();
        indexed.sort_by_key(|&(i, instant)| (instant, i));
        ordered = indexed.into_iter().map(|(i, _)| &runs[i]).collect();
    }
    ordered
}

impl<'a> Report<'a> {
    pub(crate) fn build(runs: &'a [RunSummary]) -> Self {
        let several = runs.len() > 1;
        let mut chart_files = HashSet::new();
        let runs: Vec<RunReport<'a>> = chronological(runs)
            .into_iter()
            .enumerate()
            .map(|(i, summary)| {
                let number = i + 1;
                let prefix = if several {
                    format!("run{number}-")
                } else {
                    String::new()
                };
                RunReport {
                    number,
                    label: format!("{} @ {}", summary.profile, summary.started_at),
                    anchor: format!("run-{number}"),
                    summary,
                    targets: table::target_order(summary),
                    views: views(summary, number, &prefix, &mut chart_files),
                }
            })
            .collect();
        let before_after = merge::comparisons(&runs);
        Report { runs, before_after }
    }
}

impl RunReport<'_> {
    /// The run's facts as label/value pairs, in display order.
    pub(crate) fn facts(&self) -> Vec<(&'static str, String)> {
        let run = self.summary;
        let m = &run.machine;
        let mut machine = Vec::new();
        if !m.hostname.is_empty() {
            machine.push(m.hostname.clone());
        }
        if m.cpus > 0 {
            let model = if m.cpu_model.is_empty() {
                String::new()
            } else {
                format!(" ({})", m.cpu_model)
            };
            machine.push(format!("{} CPUs{model}", m.cpus));
        }
        if m.memory_bytes > 0 {
            machine.push(format::memory(m.memory_bytes));
        }
        if !m.os.is_empty() {
            machine.push(m.os.clone());
        }
        if !m.kernel.is_empty() {
            machine.push(format!("kernel {}", m.kernel));
        }
        let or_none = |items: Vec<String>| {
            if items.is_empty() {
                format::NONE.to_string()
            } else {
                items.join(", ")
            }
        };
        vec![
            ("profile", run.profile.clone()),
            ("started", run.started_at.clone()),
            ("finished", run.finished_at.clone()),
            ("machine", or_none(machine)),
            (
                "versions",
                or_none(
                    run.versions
                        .iter()
                        .map(|(k, v)| format!("{k} {v}"))
                        .collect(),
                ),
            ),
            (
                "parameters",
                or_none(
                    run.parameters
                        .iter()
                        .map(|(k, v)| format!("{k}={}", format::parameter(v)))
                        .collect(),
                ),
            ),
            ("targets", or_none(self.targets.clone())),
            (
                "load hosts",
                if run.hosts.is_empty() {
                    "none (fio ran locally)".into()
                } else {
                    run.hosts.join(", ")
                },
            ),
            (
                "cells",
                format!(
                    "{} ({} failed)",
                    run.cells.len(),
                    run.cells
                        .iter()
                        .filter(|c| super::figures::failure(c).is_some())
                        .count()
                ),
            ),
        ]
    }
}

/// The views of one run.
fn views(
    run: &RunSummary,
    number: usize,
    prefix: &str,
    chart_files: &mut HashSet<String>,
) -> Vec<View> {
    let profile = Profile::of(&run.profile);
    let targets = table::target_order(run);
    let measured: Vec<&CellResult> = run.cells.iter().filter(|c| c.sample.is_none()).collect();
    let sampled: Vec<&CellResult> = run.cells.iter().filter(|c| c.sample.is_some()).collect();
    let mut views = Vec::new();
    // Chart files are named `[runN-]profile[-view]-chart.svg`, the view
    // only for profiles split into several.
    let split = matches!(profile, Profile::Matrix | Profile::Sweep);
    let mut add =
        |title: String, named: Vec<NamedChart>, tables: Vec<Table>, views: &mut Vec<View>| {
            let anchor = format!("run-{number}-view-{}", views.len() + 1);
            let view_slug = if split {
                format!("-{}", slug(&title))
            } else {
                String::new()
            };
            let charts = named
                .into_iter()
                .map(|n| {
                    let base = format!("{prefix}{}{view_slug}-{}", slug(&run.profile), n.slug);
                    let mut name = base.clone();
                    let mut counter = 2;
                    while !chart_files.insert(name.clone()) {
                        name = format!("{base}-{counter}");
                        counter += 1;
                    }
                    RenderedChart {
                        file: format!("charts/{name}.svg"),
                        title: n.chart.title.clone(),
                        svg: svg::element(&n.chart),
                        failed: n.chart.failed_descriptions(),
                    }
                })
                .collect();
            views.push(View {
                title,
                anchor,
                charts,
                tables,
            });
        };

    if profile == Profile::FioSamples {
        let mut tables: Vec<Table> = table::estimates(run, &targets).into_iter().collect();
        tables.extend(table::estimates_comparison(run, &targets));
        let all: Vec<&CellResult> = run.cells.iter().collect();
        tables.push(table::results("samples", &all, &targets));
        add(
            "samples".into(),
            charts::fio_samples(run, &targets),
            tables,
            &mut views,
        );
        return views;
    }

    let mut groups: BTreeMap<ViewKey, Vec<&CellResult>> = BTreeMap::new();
    for cell in &measured {
        groups
            .entry(profile.view_of(&cell.workload))
            .or_default()
            .push(cell);
    }
    for (key, cells) in groups {
        let title = key.title(&run.profile);
        let named = match profile {
            Profile::Matrix => charts::matrix(&title, &cells, &targets),
            Profile::Sweep => charts::sweep(&title, &cells, &targets),
            Profile::Parallel => charts::parallel(&cells, &targets),
            Profile::DbLatency => charts::db_latency(&cells, &targets),
            Profile::FioSamples | Profile::Other => Vec::new(),
        };
        let mut tables = vec![table::results(&title, &cells, &targets)];
        tables.extend(table::comparison(
            &title,
            &cells,
            &targets,
            profile.compared_metrics(),
        ));
        add(title, named, tables, &mut views);
    }
    // Samples or estimates outside `fio-samples` are still shown.
    if !sampled.is_empty() || !run.estimates.is_empty() {
        let mut tables: Vec<Table> = table::estimates(run, &targets).into_iter().collect();
        tables.extend(table::estimates_comparison(run, &targets));
        if !sampled.is_empty() {
            tables.push(table::results("samples", &sampled, &targets));
        }
        add(
            "repeated samples".into(),
            charts::fio_samples(run, &targets),
            tables,
            &mut views,
        );
    }
    if views.is_empty() {
        add(
            run.profile.clone(),
            Vec::new(),
            vec![table::results(&run.profile, &[], &targets)],
            &mut views,
        );
    }
    views
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_times_parse_with_offsets_and_fractions() {
        assert_eq!(rfc3339_instant("1970-01-01T00:00:00Z"), Some((0, 0)));
        assert_eq!(
            rfc3339_instant("2000-03-01T00:00:00Z"),
            Some((951_868_800, 0))
        );
        assert_eq!(
            rfc3339_instant("2026-11-21T10:00:00.5+01:00"),
            rfc3339_instant("2026-11-21T09:00:00.500Z")
        );
        assert_eq!(
            rfc3339_instant("2026-11-21T10:00:00.25Z").map(|t| t.1),
            Some(250_000_000)
        );
        assert_eq!(rfc3339_instant("yesterday"), None);
        assert_eq!(rfc3339_instant("2026-13-01T00:00:00Z"), None);
        assert_eq!(rfc3339_instant("2026-11-21T10:00:00"), None);
        assert_eq!(rfc3339_instant("2026-11-21T10:00:00+0100"), None);
        assert_eq!(rfc3339_instant("2026-11-21T10:0a:00Z"), None);
        assert_eq!(rfc3339_instant("2026-11-2"), None);
        assert_eq!(rfc3339_instant("2026-11-21T10:00:00.Z"), None);
        assert_eq!(rfc3339_instant("é026-11-21T10:00:00Z"), None);
    }

    #[test]
    fn slugs_are_file_name_safe() {
        assert_eq!(slug("randread, bs 4k"), "randread-bs-4k");
        assert_eq!(slug("write_lat_p99.9_us"), "write-lat-p99.9-us");
        assert_eq!(slug("../../etc"), "etc");
        assert_eq!(slug("…"), "x");
    }
}
