//! Per-volume I/O statistics for metrics: operations, bytes, errors and a
//! latency histogram per kind of request, plus the number of open handles.
//!
//! Lock-free (relaxed atomics): recording costs a few uncontended atomic
//! adds per request and never blocks the data path. Counters only grow.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// Upper bounds of the latency buckets, in microseconds.
const BUCKETS_US: [u64; 14] = [
    10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 100_000, 1_000_000, 10_000_000,
];

/// The kinds of request counted separately.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    Read,
    Write,
    Flush,
    Trim,
    WriteZeroes,
}

impl OpKind {
    const ALL: [OpKind; 5] = [
        OpKind::Read,
        OpKind::Write,
        OpKind::Flush,
        OpKind::Trim,
        OpKind::WriteZeroes,
    ];

    fn label(self) -> &'static str {
        match self {
            OpKind::Read => "read",
            OpKind::Write => "write",
            OpKind::Flush => "flush",
            OpKind::Trim => "trim",
            OpKind::WriteZeroes => "write_zeroes",
        }
    }
}

#[derive(Default)]
struct OpStats {
    ops: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
    latency_sum_ns: AtomicU64,
    buckets: [AtomicU64; BUCKETS_US.len()],
}

#[derive(Default)]
pub struct VolumeStats {
    per_op: [OpStats; 5],
    open_handles: AtomicUsize,
}

impl VolumeStats {
    pub fn record(&self, kind: OpKind, bytes: u64, latency: Duration, ok: bool) {
        let s = &self.per_op[kind as usize];
        s.ops.fetch_add(1, Ordering::Relaxed);
        s.bytes.fetch_add(bytes, Ordering::Relaxed);
        if !ok {
            s.errors.fetch_add(1, Ordering::Relaxed);
        }
        let ns = latency.as_nanos().min(u64::MAX as u128) as u64;
        s.latency_sum_ns.fetch_add(ns, Ordering::Relaxed);
        let us = ns / 1000;
        if let Some(b) = BUCKETS_US.iter().position(|&le| us <= le) {
            s.buckets[b].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Handles (frontend connections) open on the volume now.
    pub fn open_handles(&self) -> usize {
        self.open_handles.load(Ordering::Acquire)
    }

    pub(crate) fn handle_opened(&self) {
        self.open_handles.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn handle_closed(&self) {
        self.open_handles.fetch_sub(1, Ordering::AcqRel);
    }

    /// HELP and TYPE lines for the samples `render_prometheus` writes; once
    /// per exposition.
    pub fn render_prometheus_header(out: &mut String) {
        for (name, kind, help) in [
            (
                "basalt_volume_ops_total",
                "counter",
                "Requests completed, by kind.",
            ),
            (
                "basalt_volume_bytes_total",
                "counter",
                "Bytes read, written, trimmed or zeroed, by kind.",
            ),
            (
                "basalt_volume_errors_total",
                "counter",
                "Requests that failed, by kind.",
            ),
            (
                "basalt_volume_latency_seconds",
                "histogram",
                "Request latency inside the server, by kind.",
            ),
            (
                "basalt_volume_open_connections",
                "gauge",
                "Frontend connections open on the volume.",
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        }
    }

    /// Appends this volume's samples in Prometheus text format.
    pub fn render_prometheus(&self, out: &mut String, name: &str, uuid: &str) {
        let labels = format!(
            "volume=\"{}\",id=\"{}\"",
            escape_label(name),
            escape_label(uuid)
        );
        for kind in OpKind::ALL {
            let s = &self.per_op[kind as usize];
            let op = kind.label();
            let ops = s.ops.load(Ordering::Relaxed);
            let _ = writeln!(out, "basalt_volume_ops_total{{{labels},op=\"{op}\"}} {ops}");
            let _ = writeln!(
                out,
                "basalt_volume_bytes_total{{{labels},op=\"{op}\"}} {}",
                s.bytes.load(Ordering::Relaxed)
            );
            let _ = writeln!(
                out,
                "basalt_volume_errors_total{{{labels},op=\"{op}\"}} {}",
                s.errors.load(Ordering::Relaxed)
            );
            let mut cumulative = 0;
            for (le, b) in BUCKETS_US.iter().zip(&s.buckets) {
                cumulative += b.load(Ordering::Relaxed);
                let le = *le as f64 / 1e6;
                let _ = writeln!(out, "basalt_volume_latency_seconds_bucket{{{labels},op=\"{op}\",le=\"{le}\"}} {cumulative}");
            }
            let _ = writeln!(
                out,
                "basalt_volume_latency_seconds_bucket{{{labels},op=\"{op}\",le=\"+Inf\"}} {ops}"
            );
            let sum = s.latency_sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
            let _ = writeln!(
                out,
                "basalt_volume_latency_seconds_sum{{{labels},op=\"{op}\"}} {sum}"
            );
            let _ = writeln!(
                out,
                "basalt_volume_latency_seconds_count{{{labels},op=\"{op}\"}} {ops}"
            );
        }
        let _ = writeln!(
            out,
            "basalt_volume_open_connections{{{labels}}} {}",
            self.open_handles()
        );
    }
}

fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative_and_counts_match() {
        let s = VolumeStats::default();
        s.record(OpKind::Read, 4096, Duration::from_micros(40), true);
        s.record(OpKind::Read, 4096, Duration::from_millis(3), false);
        let mut out = String::new();
        s.render_prometheus(&mut out, "db", "u");
        assert!(out.contains("basalt_volume_ops_total{volume=\"db\",id=\"u\",op=\"read\"} 2"));
        assert!(out.contains("basalt_volume_bytes_total{volume=\"db\",id=\"u\",op=\"read\"} 8192"));
        assert!(out.contains("basalt_volume_errors_total{volume=\"db\",id=\"u\",op=\"read\"} 1"));
        assert!(out.contains("op=\"read\",le=\"0.00005\"} 1"));
        assert!(out.contains("op=\"read\",le=\"0.005\"} 2"));
        assert!(out.contains("op=\"read\",le=\"+Inf\"} 2"));
    }
}
