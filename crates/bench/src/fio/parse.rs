//! Parsing fio's JSON output into `model::Metrics`: pure functions from the
//! text fio printed to numbers, no processes and no files.
//!
//! Accepts `--output-format=json` and `json+`, local runs (`jobs`) and
//! client/server runs (`client_stats`, one entry per host plus fio's
//! "All clients" sum), with any text fio printed before the JSON document
//! (error lines, `<host> fio: connected to NBD server` notices).
//!
//! Invariants:
//! - A job that reported an error, or a run that completed no I/O at all,
//!   is a `CellFailure`, never metrics of zero.
//! - Several entries (hosts, or job groups) are aggregated: IOPS, bandwidth
//!   and I/O counts add up; mean latency is weighted by sample count;
//!   percentiles come from the merged latency histograms (`json+` bins),
//!   computed exactly as fio computes its own, or — only when an entry has
//!   no histogram — are the maximum over the entries (an upper bound).
//! - Latency is fio's total latency (`lat_ns`, submission to completion);
//!   percentiles come from `lat_ns` (the job files set `lat_percentiles=1`)
//!   and fall back to completion latency (`clat_ns`) for outputs without.

use crate::model::{DirectionMetrics, LatencyMetrics, Metrics};
use serde::Deserialize;
use std::collections::BTreeMap;

/// The text fio printed, split into the JSON document and what came before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitOutput<'a> {
    /// Lines before the JSON document (errors, notices), may be empty.
    pub preamble: &'a str,
    /// The JSON document, if fio printed one.
    pub json: Option<&'a str>,
}

/// Finds fio's JSON document in its output: the first line that starts
/// with `{`, up to the end of that JSON value.
pub fn split_output(text: &str) -> SplitOutput<'_> {
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        if line.starts_with('{') {
            let rest = &text[offset..];
            let mut stream =
                serde_json::Deserializer::from_str(rest).into_iter::<serde::de::IgnoredAny>();
            if let Some(Ok(_)) = stream.next() {
                let end = stream.byte_offset();
                return SplitOutput {
                    preamble: &text[..offset],
                    json: Some(&rest[..end]),
                };
            }
            break;
        }
        offset += line.len();
    }
    SplitOutput {
        preamble: text,
        json: None,
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ParseError {
    #[error("fio printed no JSON output")]
    NoJson,
    #[error("fio's JSON output does not parse: {0}")]
    Invalid(String),
}

/// Why a cell's fio output holds no measurement.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CellFailure {
    #[error("fio reported no jobs")]
    NoJobs,
    #[error("fio job {job} failed with error {code} ({message})")]
    JobError {
        job: String,
        code: i64,
        message: String,
    },
    #[error("fio completed no I/O")]
    NoIo,
    #[error("fio's output has no latency percentiles for {0}")]
    NoPercentiles(&'static str),
    /// fio's group figures assume its jobs ran together; these took
    /// `elapsed_s` for `jobs` jobs of `runtime_ms` each: one after another
    /// (a server that takes one connection at a time), so the group's IOPS
    /// would count their I/O as if concurrent.
    #[error("the {jobs} jobs ran one after another ({elapsed_s} s for {runtime_ms} ms each): the server took one connection at a time, so there is no concurrent figure")]
    JobsSerialized {
        jobs: u64,
        elapsed_s: u64,
        runtime_ms: u64,
    },
}

/// One fio output document.
#[derive(Debug, Clone, PartialEq)]
pub struct FioReport {
    /// e.g. `fio-3.33`.
    pub fio_version: Option<String>,
    /// One entry per job group (local run) or per host (client/server run).
    pub entries: Vec<JobEntry>,
    /// fio's own sum over hosts ("All clients"), present with two or more.
    pub all_clients: Option<JobEntry>,
    /// The job file's `ramp_time` (global), in seconds; 0 if none.
    pub ramp_secs: u64,
}

/// One job group (with `group_reporting`) as fio reported it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct JobEntry {
    pub jobname: String,
    #[serde(default)]
    pub error: i64,
    /// The fio server's host, in client/server runs.
    #[serde(default)]
    pub hostname: Option<String>,
    #[serde(default)]
    pub read: Option<RawDirection>,
    #[serde(default)]
    pub write: Option<RawDirection>,
    #[serde(default)]
    pub sync: Option<RawSync>,
    /// Wall-clock seconds the job group ran (ramp and start-up included).
    #[serde(default)]
    pub elapsed: u64,
    /// Milliseconds of I/O summed over the group's jobs.
    #[serde(default)]
    pub job_runtime: u64,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct RawDirection {
    #[serde(default)]
    pub iops: f64,
    #[serde(default)]
    pub bw_bytes: f64,
    #[serde(default)]
    pub total_ios: u64,
    /// Milliseconds.
    #[serde(default)]
    pub runtime: u64,
    #[serde(default)]
    pub lat_ns: RawLatency,
    #[serde(default)]
    pub clat_ns: RawLatency,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct RawSync {
    #[serde(default)]
    pub total_ios: u64,
    #[serde(default)]
    pub lat_ns: RawLatency,
}

/// A latency distribution in nanoseconds.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
pub struct RawLatency {
    #[serde(default)]
    pub max: f64,
    #[serde(default)]
    pub mean: f64,
    #[serde(rename = "N", default)]
    pub n: u64,
    /// Percentile (as fio prints it, e.g. "99.900000") → nanoseconds.
    #[serde(default)]
    pub percentile: Option<BTreeMap<String, f64>>,
    /// `json+`: histogram bucket value (ns) → count.
    #[serde(default)]
    pub bins: Option<BTreeMap<String, u64>>,
}

#[derive(Deserialize)]
struct RawDocument {
    #[serde(rename = "fio version", default)]
    fio_version: Option<String>,
    #[serde(default)]
    jobs: Vec<JobEntry>,
    #[serde(default)]
    client_stats: Vec<JobEntry>,
    #[serde(rename = "global options", default)]
    global_options: BTreeMap<String, String>,
}

const ALL_CLIENTS: &str = "All clients";

/// Parses fio's output (the whole text it printed, or just the JSON).
pub fn parse_report(text: &str) -> Result<FioReport, ParseError> {
    let json = split_output(text).json.ok_or(ParseError::NoJson)?;
    let doc: RawDocument =
        serde_json::from_str(json).map_err(|e| ParseError::Invalid(e.to_string()))?;
    let mut entries = doc.jobs;
    let mut all_clients = None;
    for entry in doc.client_stats {
        if entry.jobname == ALL_CLIENTS {
            all_clients = Some(entry);
        } else {
            entries.push(entry);
        }
    }
    let ramp_secs = doc
        .global_options
        .get("ramp_time")
        .and_then(|r| r.trim_end_matches('s').parse().ok())
        .unwrap_or(0);
    Ok(FioReport {
        ramp_secs,
        fio_version: doc.fio_version,
        entries,
        all_clients,
    })
}

/// The cell's metrics, aggregated over every entry of the report.
pub fn metrics(report: &FioReport) -> Result<Metrics, CellFailure> {
    if report.entries.is_empty() {
        return Err(CellFailure::NoJobs);
    }
    for entry in &report.entries {
        if entry.error != 0 {
            let job = match &entry.hostname {
                Some(host) => format!("{} on {host}", entry.jobname),
                None => entry.jobname.clone(),
            };
            let message = i32::try_from(entry.error)
                .map(|code| std::io::Error::from_raw_os_error(code).to_string())
                .unwrap_or_else(|_| "unknown error".to_string());
            return Err(CellFailure::JobError {
                job,
                code: entry.error,
                message,
            });
        }
    }
    let reads: Vec<&RawDirection> = report
        .entries
        .iter()
        .filter_map(|e| e.read.as_ref())
        .filter(|d| d.total_ios > 0)
        .collect();
    let writes: Vec<&RawDirection> = report
        .entries
        .iter()
        .filter_map(|e| e.write.as_ref())
        .filter(|d| d.total_ios > 0)
        .collect();
    if reads.is_empty() && writes.is_empty() {
        return Err(CellFailure::NoIo);
    }
    let syncs: Vec<&RawLatency> = report
        .entries
        .iter()
        .filter_map(|e| e.sync.as_ref())
        .filter(|s| s.total_ios > 0)
        .map(|s| &s.lat_ns)
        .collect();
    let runtime_ms = report
        .entries
        .iter()
        .flat_map(|e| [e.read.as_ref(), e.write.as_ref()])
        .flatten()
        .map(|d| d.runtime)
        .max()
        .unwrap_or(0);
    for entry in &report.entries {
        serialized(entry, runtime_ms, report.ramp_secs * 1000)?;
    }
    Ok(Metrics {
        read: direction(&reads, "reads")?,
        write: direction(&writes, "writes")?,
        sync: if syncs.is_empty() {
            None
        } else {
            Some(latency(&syncs, &[], "fsync")?)
        },
        runtime_ms,
    })
}

/// Refuses a group whose jobs ran one after another: together they would
/// have taken about one job's ramp and runtime, plus start-up (allowed 3 s,
/// as fio counts `elapsed` in whole seconds); in turn, at least `jobs`
/// times that.
fn serialized(entry: &JobEntry, runtime_ms: u64, ramp_ms: u64) -> Result<(), CellFailure> {
    if runtime_ms == 0 {
        return Ok(());
    }
    let jobs = (entry.job_runtime + runtime_ms / 2) / runtime_ms;
    let elapsed_ms = entry.elapsed * 1000;
    let one = runtime_ms + ramp_ms;
    if jobs >= 2 && elapsed_ms * 10 >= one * jobs * 9 && elapsed_ms >= one + 3000 {
        return Err(CellFailure::JobsSerialized {
            jobs,
            elapsed_s: entry.elapsed,
            runtime_ms,
        });
    }
    Ok(())
}

fn direction(
    dirs: &[&RawDirection],
    what: &'static str,
) -> Result<Option<DirectionMetrics>, CellFailure> {
    if dirs.is_empty() {
        return Ok(None);
    }
    let lat: Vec<&RawLatency> = dirs.iter().map(|d| &d.lat_ns).collect();
    let clat: Vec<&RawLatency> = dirs.iter().map(|d| &d.clat_ns).collect();
    Ok(Some(DirectionMetrics {
        iops: dirs.iter().map(|d| d.iops).sum(),
        bandwidth_bytes_per_sec: dirs.iter().map(|d| d.bw_bytes).sum(),
        ios: dirs.iter().map(|d| d.total_ios).sum(),
        latency: latency(&lat, &clat, what)?,
    }))
}

const P50: f64 = 50.0;
const P99: f64 = 99.0;
const P99_9: f64 = 99.9;

/// Aggregates latency distributions: the mean and max from `lat`, the
/// percentiles from `lat` or, failing that, from `clat` (`clat` may be
/// empty).
fn latency(
    lat: &[&RawLatency],
    clat: &[&RawLatency],
    what: &'static str,
) -> Result<LatencyMetrics, CellFailure> {
    let samples: u64 = lat.iter().map(|l| l.n).sum();
    let mean_ns = if samples > 0 {
        lat.iter().map(|l| l.mean * l.n as f64).sum::<f64>() / samples as f64
    } else {
        lat.iter().map(|l| l.mean).sum::<f64>() / lat.len().max(1) as f64
    };
    let max_ns = lat.iter().map(|l| l.max).fold(0.0, f64::max);
    let [p50, p99, p99_9] = percentiles(lat)
        .or_else(|| (!clat.is_empty()).then(|| percentiles(clat)).flatten())
        .ok_or(CellFailure::NoPercentiles(what))?;
    let us = |ns: f64| ns / 1000.0;
    Ok(LatencyMetrics {
        mean_us: us(mean_ns),
        p50_us: us(p50),
        p99_us: us(p99),
        p99_9_us: us(p99_9),
        max_us: us(max_ns),
    })
}

/// p50, p99 and p99.9 (ns) of the distributions together, or `None` if
/// they do not all report percentiles.
fn percentiles(dists: &[&RawLatency]) -> Option<[f64; 3]> {
    let wanted = [P50, P99, P99_9];
    if let [single] = dists {
        let map = single.percentile.as_ref()?;
        let mut out = [0.0; 3];
        for (slot, p) in out.iter_mut().zip(wanted) {
            *slot = lookup_percentile(map, p)?;
        }
        return Some(out);
    }
    if dists.iter().all(|d| d.bins.is_some()) {
        let mut merged: BTreeMap<u64, u64> = BTreeMap::new();
        for d in dists {
            for (value, count) in d.bins.iter().flatten() {
                let value: u64 = value.parse().ok()?;
                *merged.entry(value).or_default() += count;
            }
        }
        return percentiles_from_bins(&merged, &wanted);
    }
    // Without histograms percentiles cannot be combined exactly: report the
    // largest (an upper bound).
    let mut out = [0.0f64; 3];
    for d in dists {
        let map = d.percentile.as_ref()?;
        for (slot, p) in out.iter_mut().zip(wanted) {
            *slot = slot.max(lookup_percentile(map, p)?);
        }
    }
    Some(out)
}

fn lookup_percentile(map: &BTreeMap<String, f64>, p: f64) -> Option<f64> {
    map.iter()
        .find(|(k, _)| k.parse::<f64>().is_ok_and(|k| (k - p).abs() < 1e-6))
        .map(|(_, v)| *v)
}

/// Percentiles of a histogram (bucket value → count), as fio computes them
/// (`calc_clat_percentiles`): the value of the first bucket at which the
/// cumulative count reaches `p / 100 * total`.
pub fn percentiles_from_bins(bins: &BTreeMap<u64, u64>, wanted: &[f64; 3]) -> Option<[f64; 3]> {
    let total: u64 = bins.values().sum();
    if total == 0 {
        return None;
    }
    let mut out = [0.0; 3];
    for (slot, p) in out.iter_mut().zip(wanted) {
        let threshold = p / 100.0 * total as f64;
        let mut cumulative = 0u64;
        let mut value = None;
        for (&bucket, &count) in bins {
            cumulative += count;
            if cumulative as f64 >= threshold {
                value = Some(bucket as f64);
                break;
            }
        }
        *slot = value?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Real fio 3.33 outputs, recorded on the development machine (see
    /// testdata/README.md for the commands).
    fn testdata(name: &str) -> String {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata")
            .join(name);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    fn parse(name: &str) -> (FioReport, Result<Metrics, CellFailure>) {
        let report = parse_report(&testdata(name)).unwrap();
        let m = metrics(&report);
        (report, m)
    }

    fn percentile_of(lat: &RawLatency, p: f64) -> f64 {
        lookup_percentile(lat.percentile.as_ref().unwrap(), p).unwrap()
    }

    #[test]
    fn jobs_that_ran_one_after_another_have_no_group_figure() {
        // qemu-nbd at its defaults (--shared=1) serves the second of two
        // jobs only after the first: fio's group IOPS would double.
        let (report, m) = parse("serialized-2jobs.json");
        assert_eq!(report.entries[0].elapsed, 13);
        assert_eq!(
            m.unwrap_err(),
            CellFailure::JobsSerialized {
                jobs: 2,
                elapsed_s: 13,
                runtime_ms: 5045
            }
        );
        // The same cell on a server that took both at once.
        let (_, m) = parse("concurrent-2jobs.json");
        assert!(m.unwrap().read.unwrap().iops > 70_000.0);
        // Concurrent jobs with a ramp as long as their runtime (5 s each,
        // 11 s in all) are not mistaken for jobs in turn.
        let text = testdata("concurrent-2jobs.json")
            .replace("\"ramp_time\" : \"1\"", "\"ramp_time\" : \"5\"")
            .replace("\"elapsed\" : 7", "\"elapsed\" : 11");
        let report = parse_report(&text).unwrap();
        assert_eq!(report.ramp_secs, 5);
        assert_eq!(report.entries[0].elapsed, 11);
        assert!(metrics(&report).is_ok());
    }

    #[test]
    fn plain_randread() {
        let (report, m) = parse("plain-randread.json");
        let m = m.unwrap();
        assert_eq!(report.fio_version.as_deref(), Some("fio-3.33"));
        assert_eq!(report.entries.len(), 1);
        assert!(m.write.is_none(), "a read job has no write figures");
        assert!(m.sync.is_none());
        let r = m.read.unwrap();
        let raw = report.entries[0].read.as_ref().unwrap();
        assert_eq!(r.ios, raw.total_ios);
        assert!(r.ios > 0);
        assert_eq!(r.iops, raw.iops);
        assert_eq!(r.bandwidth_bytes_per_sec, raw.bw_bytes);
        assert_eq!(r.latency.mean_us, raw.lat_ns.mean / 1000.0);
        assert_eq!(r.latency.max_us, raw.lat_ns.max / 1000.0);
        assert_eq!(r.latency.p99_us, percentile_of(&raw.lat_ns, 99.0) / 1000.0);
        assert_eq!(
            r.latency.p99_9_us,
            percentile_of(&raw.lat_ns, 99.9) / 1000.0
        );
        assert!(r.latency.p50_us <= r.latency.p99_us && r.latency.p99_us <= r.latency.p99_9_us);
        assert!(r.latency.p99_9_us <= r.latency.max_us);
        assert!(m.runtime_ms > 0);
    }

    #[test]
    fn percentiles_fall_back_to_completion_latency() {
        // Recorded without lat_percentiles=1: only clat_ns has percentiles.
        let (report, m) = parse("plain-clat-only.json");
        let r = m.unwrap().read.unwrap();
        let raw = report.entries[0].read.as_ref().unwrap();
        assert!(raw.lat_ns.percentile.is_none());
        assert_eq!(r.latency.p50_us, percentile_of(&raw.clat_ns, 50.0) / 1000.0);
        assert_eq!(r.latency.mean_us, raw.lat_ns.mean / 1000.0);
    }

    #[test]
    fn mixed_randrw_has_both_directions() {
        let (report, m) = parse("mixed-randrw70.json");
        let m = m.unwrap();
        let (r, w) = (m.read.unwrap(), m.write.unwrap());
        assert!(r.ios > 0 && w.ios > 0);
        // rwmixread=70: reads are the larger share.
        assert!(r.ios > w.ios);
        let raw = report.entries[0].write.as_ref().unwrap();
        assert_eq!(w.latency.p99_us, percentile_of(&raw.lat_ns, 99.0) / 1000.0);
    }

    #[test]
    fn group_reporting_multi_job_is_one_entry() {
        let (report, m) = parse("multi-job-group.json");
        assert_eq!(
            report.entries.len(),
            1,
            "group_reporting: one entry for numjobs=4"
        );
        let w = m.unwrap().write.unwrap();
        let raw = report.entries[0].write.as_ref().unwrap();
        assert_eq!(w.ios, raw.total_ios);
        assert_eq!(w.iops, raw.iops);
    }

    #[test]
    fn fsync_job_reports_sync_latency() {
        let (report, m) = parse("fsync-randwrite.json");
        let m = m.unwrap();
        let sync = m.sync.unwrap();
        let raw = &report.entries[0].sync.as_ref().unwrap().lat_ns;
        assert_eq!(sync.mean_us, raw.mean / 1000.0);
        assert_eq!(sync.p99_us, percentile_of(raw, 99.0) / 1000.0);
        let w = m.write.unwrap();
        // fsync=1: one flush per write.
        assert_eq!(report.entries[0].sync.as_ref().unwrap().total_ios, w.ios);
    }

    #[test]
    fn client_server_aggregates_hosts() {
        let text = testdata("client-server-2hosts.json");
        let split = split_output(&text);
        assert!(
            split.preamble.contains("connected to NBD server"),
            "{}",
            split.preamble
        );
        let report = parse_report(&text).unwrap();
        assert_eq!(report.entries.len(), 2, "one entry per host");
        let all = report.all_clients.as_ref().unwrap();
        let r = metrics(&report).unwrap().read.unwrap();
        let all_r = all.read.as_ref().unwrap();
        // Our sums agree with fio's own "All clients" sums.
        assert_eq!(r.ios, all_r.total_ios);
        assert!(
            (r.iops - all_r.iops).abs() < 1e-3 * all_r.iops,
            "{} vs {}",
            r.iops,
            all_r.iops
        );
        assert!((r.bandwidth_bytes_per_sec - all_r.bw_bytes).abs() <= 2.0);
        assert!(
            (r.latency.mean_us - all_r.lat_ns.mean / 1000.0).abs() < 1e-3,
            "{} vs {}",
            r.latency.mean_us,
            all_r.lat_ns.mean / 1000.0
        );
        assert_eq!(r.latency.max_us, all_r.lat_ns.max / 1000.0);
        // fio prints no percentiles for "All clients"; ours come from the
        // merged histograms and lie within the hosts' own.
        assert!(all_r.lat_ns.percentile.is_none());
        let hosts: Vec<f64> = report
            .entries
            .iter()
            .map(|e| percentile_of(&e.read.as_ref().unwrap().lat_ns, 99.0) / 1000.0)
            .collect();
        let (lo, hi) = (hosts[0].min(hosts[1]), hosts[0].max(hosts[1]));
        assert!(
            lo <= r.latency.p99_us && r.latency.p99_us <= hi,
            "{lo} {} {hi}",
            r.latency.p99_us
        );
    }

    #[test]
    fn histogram_percentiles_match_fios_own() {
        // Per host, fio prints both its percentiles and the histogram: the
        // computation from bins must reproduce fio's numbers exactly.
        let report = parse_report(&testdata("client-server-2hosts.json")).unwrap();
        for entry in &report.entries {
            let lat = &entry.read.as_ref().unwrap().lat_ns;
            let bins: BTreeMap<u64, u64> = lat
                .bins
                .as_ref()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.parse().unwrap(), *v))
                .collect();
            let ours = percentiles_from_bins(&bins, &[P50, P99, P99_9]).unwrap();
            let fios = [50.0, 99.0, 99.9].map(|p| percentile_of(lat, p));
            assert_eq!(ours, fios);
        }
    }

    #[test]
    fn connection_refused_is_a_failure_not_zeros() {
        // fio exits 1 and prints the error on stderr, and JSON whose job
        // reports no error, only zeros.
        assert!(testdata("failed-connect.stderr").contains("Connection refused"));
        let report = parse_report(&testdata("failed-connect.json")).unwrap();
        assert_eq!(report.entries[0].error, 0);
        assert_eq!(metrics(&report), Err(CellFailure::NoIo));
    }

    #[test]
    fn job_error_is_a_failure() {
        let report = parse_report(&testdata("failed-job-error.json")).unwrap();
        let err = metrics(&report).unwrap_err();
        assert!(
            matches!(&err, CellFailure::JobError { code: 1, .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("Operation not permitted"), "{err}");
    }

    #[test]
    fn garbage_is_a_parse_error() {
        assert_eq!(parse_report(""), Err(ParseError::NoJson));
        assert_eq!(
            parse_report("fio: engine nbd not loadable\n"),
            Err(ParseError::NoJson)
        );
        assert!(matches!(
            parse_report("{\"jobs\": 3}"),
            Err(ParseError::Invalid(_))
        ));
        assert!(matches!(
            parse_report("{\"jobs\": ["),
            Err(ParseError::NoJson)
        ));
        assert_eq!(
            metrics(&parse_report("{}").unwrap()),
            Err(CellFailure::NoJobs)
        );
    }

    #[test]
    fn split_keeps_preamble_and_drops_trailing_text() {
        let s = split_output("note: x\n{\"a\": 1}\ntrailing\n");
        assert_eq!(s.preamble, "note: x\n");
        assert_eq!(s.json, Some("{\"a\": 1}"));
        let s = split_output("{\"a\": {}}");
        assert_eq!((s.preamble, s.json), ("", Some("{\"a\": {}}")));
    }

    #[test]
    fn bins_percentiles() {
        let bins: BTreeMap<u64, u64> = [(10, 50), (20, 49), (30, 1)].into();
        assert_eq!(
            percentiles_from_bins(&bins, &[50.0, 99.0, 99.9]),
            Some([10.0, 20.0, 30.0])
        );
        assert_eq!(
            percentiles_from_bins(&BTreeMap::new(), &[50.0, 99.0, 99.9]),
            None
        );
    }
}
