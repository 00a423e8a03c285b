//! The results data model of `basalt bench`: what one run measured, as
//! written to `summary.json` and read back by `basalt bench report`.
//!
//! Invariants: every planned cell appears in `cells`, measured or failed —
//! a failed cell carries its error and no metrics, never zeros. Units are in
//! the field names (`_us`, `_bytes`, `_per_sec`). `SCHEMA_VERSION` changes
//! whenever a field changes meaning; readers refuse versions they don't know.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub const SCHEMA_VERSION: u32 = 1;

/// One run of one profile against one or more targets.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunSummary {
    pub schema_version: u32,
    /// Profile name (`matrix`, `sweep`, `db-latency`, `fio-samples`, `parallel`).
    pub profile: String,
    /// RFC 3339 start and end times.
    pub started_at: String,
    pub finished_at: String,
    pub machine: Machine,
    /// Tool versions: "fio", "basalt", "qemu-nbd", "nbdkit", "kernel".
    pub versions: BTreeMap<String, String>,
    /// The profile's parameters after defaults and flags (runtime, iodepth, …).
    pub parameters: BTreeMap<String, serde_json::Value>,
    /// Target names in the order given (`basalt`, `qemu-nbd`, `nbdkit`, `file`, or a URI/path).
    pub targets: Vec<String>,
    /// Load hosts for fio client/server mode; empty when fio ran locally.
    #[serde(default)]
    pub hosts: Vec<String>,
    pub cells: Vec<CellResult>,
    /// Repeated-sample estimates (`fio-samples`): one per target × workload × metric.
    #[serde(default)]
    pub estimates: Vec<SampleEstimate>,
}

/// The bootstrap estimate over the sample cells of one target and workload.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SampleEstimate {
    pub target: String,
    pub workload: Workload,
    /// What was estimated, e.g. `write_iops`, `write_lat_mean_us`.
    pub metric: String,
    pub estimate: BootstrapEstimate,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct Machine {
    pub hostname: String,
    pub cpus: u32,
    pub cpu_model: String,
    pub memory_bytes: u64,
    pub kernel: String,
    pub os: String,
}

/// The workload of one cell (one fio job group), independent of target.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Workload {
    /// fio `rw`: randread, randwrite, randrw, read, write.
    pub rw: String,
    pub block_size_bytes: u64,
    pub numjobs: u32,
    pub iodepth: u32,
    /// fio `rwmixread` for mixed workloads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rwmixread: Option<u32>,
    /// fsync after every N writes (db-latency: 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fsync: Option<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum CellOutcome {
    Ok { metrics: Metrics },
    Failed { error: String },
}

/// One workload on one target. For `fio-samples`, one cell per sample
/// (`sample` = 0..n) plus the estimate in `estimate` on the cell set.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CellResult {
    pub target: String,
    pub workload: Workload,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample: Option<u32>,
    /// Path of the raw fio JSON, relative to the run directory.
    pub raw_output: String,
    pub outcome: CellOutcome,
    /// Server CPU (user + system) spent during the cell, when the bench
    /// started the server itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_cpu_seconds: Option<f64>,
    /// The server's context switches and CPU migrations over the same span
    /// (`perf stat`, every thread), when the bench started the server and
    /// perf could count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_context_switches: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_cpu_migrations: Option<u64>,
}

/// Aggregated over all jobs of a cell (fio group_reporting).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct Metrics {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read: Option<DirectionMetrics>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write: Option<DirectionMetrics>,
    /// fsync/fdatasync latency (db-latency).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync: Option<LatencyMetrics>,
    pub runtime_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct DirectionMetrics {
    pub iops: f64,
    pub bandwidth_bytes_per_sec: f64,
    pub ios: u64,
    /// Completion-to-submission latency (fio `lat_ns`), in microseconds.
    pub latency: LatencyMetrics,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct LatencyMetrics {
    pub mean_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p99_9_us: f64,
    pub max_us: f64,
}

/// Median with a percentile-bootstrap confidence interval.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BootstrapEstimate {
    pub median: f64,
    pub ci_low: f64,
    pub ci_high: f64,
    /// Confidence level, e.g. 0.95.
    pub confidence: f64,
    pub samples: usize,
    pub resamples: usize,
    pub seed: u64,
}
