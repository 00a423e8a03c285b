//! Reading figures out of cells: one metric (IOPS, MiB/s, a latency, server
//! CPU per I/O) of one direction (read, write, fsync) of one cell, for the
//! tables and the charts alike.
//!
//! Invariant: a failed cell yields `Figure::Failed` with its error, never a
//! number; a figure the cell did not measure (a direction it has not, CPU
//! when the bench did not start the server) is `Figure::Absent`.

use super::format;
use crate::model::{CellOutcome, CellResult, DirectionMetrics, LatencyMetrics, Metrics};

const MIB: f64 = 1024.0 * 1024.0;

/// A direction of I/O within a cell, in fio's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Direction {
    Read,
    Write,
    /// fsync/fdatasync: latency only.
    Sync,
}

impl Direction {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Direction::Read => "read",
            Direction::Write => "write",
            Direction::Sync => "fsync",
        }
    }
}

/// A figure a table row or a chart point shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Metric {
    Iops,
    MibPerSec,
    LatencyMean,
    LatencyP50,
    LatencyP99,
    LatencyP99_9,
    /// Server CPU (user + system) per completed I/O, over all directions.
    CpuPerIo,
    /// Server context switches per completed I/O, over all directions.
    SwitchesPerIo,
}

impl Metric {
    /// Column header / row label, with its unit.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Metric::Iops => "IOPS",
            Metric::MibPerSec => "MiB/s",
            Metric::LatencyMean => "mean lat (µs)",
            Metric::LatencyP50 => "p50 lat (µs)",
            Metric::LatencyP99 => "p99 lat (µs)",
            Metric::LatencyP99_9 => "p99.9 lat (µs)",
            Metric::CpuPerIo => "server CPU per I/O (µs)",
            Metric::SwitchesPerIo => "server ctx switches per I/O",
        }
    }

    /// A figure of this metric as written in tables: whole IOPS (from 100),
    /// latencies to 0.1 µs (whole from 100 ms), CPU to 0.01 µs.
    pub(crate) fn text(self, v: f64) -> String {
        match self {
            Metric::Iops if v.abs() >= 100.0 => format::fixed(v, 0),
            Metric::Iops | Metric::MibPerSec => format::value(v),
            Metric::LatencyMean
            | Metric::LatencyP50
            | Metric::LatencyP99
            | Metric::LatencyP99_9 => format::fixed(v, if v.abs() >= 100_000.0 { 0 } else { 1 }),
            Metric::CpuPerIo | Metric::SwitchesPerIo => format::fixed(v, 2),
        }
    }

    /// Whether the metric belongs to a cell rather than to one direction.
    pub(crate) fn is_per_cell(self) -> bool {
        matches!(self, Metric::CpuPerIo | Metric::SwitchesPerIo)
    }
}

/// One figure of a cell.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Figure<'a> {
    Value(f64),
    /// The cell failed; its error.
    Failed(&'a str),
    /// Not measured or not applicable.
    Absent,
}

impl Figure<'_> {
    pub(crate) fn value(self) -> Option<f64> {
        match self {
            Figure::Value(v) => Some(v),
            _ => None,
        }
    }
}

/// The metrics of an ok cell, or its error.
pub(crate) fn metrics(cell: &CellResult) -> Result<&Metrics, &str> {
    match &cell.outcome {
        CellOutcome::Ok { metrics } => Ok(metrics),
        CellOutcome::Failed { error } => Err(error.as_str()),
    }
}

/// The error of a failed cell.
pub(crate) fn failure(cell: &CellResult) -> Option<&str> {
    metrics(cell).err()
}

/// `metric` of `direction` in `cell` (per-cell metrics ignore the direction).
pub(crate) fn figure(cell: &CellResult, direction: Direction, metric: Metric) -> Figure<'_> {
    let metrics = match metrics(cell) {
        Ok(metrics) => metrics,
        Err(error) => return Figure::Failed(error),
    };
    match metric {
        Metric::CpuPerIo => return per_io(cell.server_cpu_seconds.map(|s| s * 1e6), metrics),
        Metric::SwitchesPerIo => {
            return per_io(cell.server_context_switches.map(|n| n as f64), metrics)
        }
        _ => {}
    }
    let found = match direction {
        Direction::Read => metrics.read.as_ref().and_then(|d| of_direction(d, metric)),
        Direction::Write => metrics.write.as_ref().and_then(|d| of_direction(d, metric)),
        Direction::Sync => metrics.sync.as_ref().and_then(|l| of_latency(l, metric)),
    };
    found.map_or(Figure::Absent, Figure::Value)
}

/// IOPS or MiB/s summed over read and write (other metrics: `Absent`).
pub(crate) fn total(cell: &CellResult, metric: Metric) -> Figure<'_> {
    let metrics = match metrics(cell) {
        Ok(metrics) => metrics,
        Err(error) => return Figure::Failed(error),
    };
    let parts: Vec<f64> = [&metrics.read, &metrics.write]
        .into_iter()
        .flatten()
        .filter_map(|d| match metric {
            Metric::Iops | Metric::MibPerSec => of_direction(d, metric),
            _ => None,
        })
        .collect();
    if parts.is_empty() {
        Figure::Absent
    } else {
        Figure::Value(parts.iter().sum())
    }
}

/// The directions an ok cell measured, in order read, write, fsync.
pub(crate) fn measured_directions(cell: &CellResult) -> Vec<Direction> {
    let Ok(metrics) = metrics(cell) else {
        return Vec::new();
    };
    let mut directions = Vec::new();
    if metrics.read.is_some() {
        directions.push(Direction::Read);
    }
    if metrics.write.is_some() {
        directions.push(Direction::Write);
    }
    if metrics.sync.is_some() {
        directions.push(Direction::Sync);
    }
    directions
}

/// The directions fio's `rw` implies, for cells that never measured any.
pub(crate) fn implied_directions(rw: &str) -> Vec<Direction> {
    let rw = rw.to_ascii_lowercase();
    let mixed = rw.contains("rw") || rw.contains("readwrite");
    if mixed {
        vec![Direction::Read, Direction::Write]
    } else if rw.contains("read") {
        vec![Direction::Read]
    } else {
        vec![Direction::Write]
    }
}

fn of_direction(direction: &DirectionMetrics, metric: Metric) -> Option<f64> {
    match metric {
        Metric::Iops => Some(direction.iops),
        Metric::MibPerSec => Some(direction.bandwidth_bytes_per_sec / MIB),
        _ => of_latency(&direction.latency, metric),
    }
}

fn of_latency(latency: &LatencyMetrics, metric: Metric) -> Option<f64> {
    match metric {
        Metric::LatencyMean => Some(latency.mean_us),
        Metric::LatencyP50 => Some(latency.p50_us),
        Metric::LatencyP99 => Some(latency.p99_us),
        Metric::LatencyP99_9 => Some(latency.p99_9_us),
        _ => None,
    }
}

/// `amount` (of a cell) per completed I/O over every direction.
fn per_io<'a>(amount: Option<f64>, metrics: &Metrics) -> Figure<'a> {
    let Some(amount) = amount else {
        return Figure::Absent;
    };
    let ios: u64 = [&metrics.read, &metrics.write]
        .into_iter()
        .flatten()
        .map(|d| d.ios)
        .sum();
    if ios == 0 || !amount.is_finite() {
        return Figure::Absent;
    }
    Figure::Value(amount / ios as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Workload;

    fn cell(outcome: CellOutcome, cpu: Option<f64>) -> CellResult {
        CellResult {
            target: "basalt".into(),
            workload: Workload {
                rw: "randrw".into(),
                block_size_bytes: 4096,
                numjobs: 1,
                iodepth: 1,
                rwmixread: Some(70),
                fsync: None,
            },
            sample: None,
            raw_output: "raw/x.json".into(),
            outcome,
            server_cpu_seconds: cpu,
            server_context_switches: None,
            server_cpu_migrations: None,
        }
    }

    fn direction(iops: f64, ios: u64) -> DirectionMetrics {
        DirectionMetrics {
            iops,
            bandwidth_bytes_per_sec: iops * 4096.0,
            ios,
            latency: LatencyMetrics {
                mean_us: 100.0,
                p50_us: 90.0,
                p99_us: 300.0,
                p99_9_us: 900.0,
                max_us: 2000.0,
            },
        }
    }

    #[test]
    fn failed_cells_yield_their_error_never_a_number() {
        let failed = cell(
            CellOutcome::Failed {
                error: "fio exited 1".into(),
            },
            Some(1.0),
        );
        for metric in [Metric::Iops, Metric::LatencyP99, Metric::CpuPerIo] {
            assert_eq!(
                figure(&failed, Direction::Read, metric),
                Figure::Failed("fio exited 1")
            );
        }
        assert_eq!(total(&failed, Metric::Iops), Figure::Failed("fio exited 1"));
        assert!(measured_directions(&failed).is_empty());
    }

    #[test]
    fn totals_sum_directions_and_cpu_divides_by_all_ios() {
        let ok = cell(
            CellOutcome::Ok {
                metrics: Metrics {
                    read: Some(direction(700.0, 7000)),
                    write: Some(direction(300.0, 3000)),
                    sync: None,
                    runtime_ms: 10_000,
                },
            },
            Some(0.5),
        );
        assert_eq!(total(&ok, Metric::Iops), Figure::Value(1000.0));
        assert_eq!(
            total(&ok, Metric::MibPerSec),
            Figure::Value(1000.0 * 4096.0 / MIB)
        );
        assert_eq!(
            figure(&ok, Direction::Write, Metric::CpuPerIo),
            Figure::Value(50.0)
        );
        assert_eq!(
            figure(&ok, Direction::Sync, Metric::LatencyP99),
            Figure::Absent
        );
        assert_eq!(
            measured_directions(&ok),
            vec![Direction::Read, Direction::Write]
        );
    }

    #[test]
    fn implied_directions_follow_fio_rw() {
        assert_eq!(implied_directions("randread"), vec![Direction::Read]);
        assert_eq!(implied_directions("randwrite"), vec![Direction::Write]);
        assert_eq!(
            implied_directions("randrw"),
            vec![Direction::Read, Direction::Write]
        );
        assert_eq!(
            implied_directions("readwrite"),
            vec![Direction::Read, Direction::Write]
        );
    }
}
