//! One `basalt bench run`: plans the cells, starts the targets, runs every
//! cell on every target interleaved by cell (cell 1 on each target, then
//! cell 2, … — machine noise spreads over all targets alike), shows
//! progress, writes the output directory (raw fio output per cell,
//! `summary.json`) and has it rendered; and `basalt bench report`.
//!
//! Invariants:
//! - Every planned cell × target appears in the summary exactly once, in
//!   plan order then target order: measured, or `Failed` with the reason
//!   (fio's error and the tail of what it printed) — never as zeros, never
//!   dropped. A failed cell does not stop the run.
//! - Nothing is written outside the output directory and the temporary
//!   work directory, which is removed at the end; the servers the bench
//!   started are stopped, and the volume it created deleted, whatever
//!   happens (also on Ctrl-C: the current fio is stopped, the remaining
//!   cells are recorded as not run, and the outputs are still written).
//! - Output layout: `raw/<target>/<cell>.fio` (the job file),
//!   `raw/<target>/<cell>.json` (fio's JSON document, when it printed one),
//!   `raw/<target>/<cell>.log` (anything else fio printed, when it did),
//!   `summary.json`, then what `render::render_run` writes.

use crate::fio::parse::{self, CellFailure};
use crate::fio::process::{self, Ending, Invocation};
use crate::fio::{jobfile, Fio, FioError};
use crate::machine;
use crate::model::{CellOutcome, CellResult, Metrics, RunSummary, SampleEstimate, SCHEMA_VERSION};
use crate::profiles::{
    self, format_bs, CellSpec, Duration as JobDuration, JobSpec, Plan, Profile, ProfileError,
    ProfileOptions,
};
use crate::render::{self, RenderError};
use crate::stats;
use crate::switches::{SwitchProbe, Switches};
use crate::targets::{self, BasaltServer, Target, TargetContext, TargetError, TargetSpec};
use serde_json::json;
use std::collections::BTreeMap;
use std::fs;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

/// Everything `basalt bench run` was asked to do.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub profile: String,
    pub options: ProfileOptions,
    /// Target specs in order; empty means `basalt`.
    pub targets: Vec<String>,
    /// Volume / backing file size [default: 4 GiB, `--quick` 1 GiB].
    pub size_bytes: Option<u64>,
    /// [default: ./bench-results/<timestamp>-<profile>/]
    pub out_dir: Option<PathBuf>,
    /// Where the temporary work directory goes [default: /var/tmp].
    pub work_dir: Option<PathBuf>,
    /// Load hosts for fio's client/server mode.
    pub hosts: Vec<String>,
    pub basalt: BasaltServer,
    /// Recorded in the summary's versions.
    pub basalt_version: String,
    /// The fio binary [default: `fio` in PATH].
    pub fio: PathBuf,
    /// Show the progress line on stderr.
    pub progress: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Profile(#[from] ProfileError),
    #[error(transparent)]
    Fio(#[from] FioError),
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error("{0}")]
    Usage(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Render(#[from] RenderError),
}

fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> RunError {
    let context = context.into();
    move |source| RunError::Io { context, source }
}

/// What a finished run produced.
#[derive(Debug)]
pub struct RunOutcome {
    pub out_dir: PathBuf,
    pub summary: RunSummary,
    /// Files `render::render_run` wrote.
    pub rendered: Vec<PathBuf>,
    /// Why rendering failed (summary.json and the raw outputs stand).
    pub render_error: Option<RenderError>,
    pub failed_cells: usize,
    pub interrupted: bool,
    /// Problems stopping targets (the results stand).
    pub warnings: Vec<String>,
}

// ---------------------------------------------------------------------------
// Interruption (Ctrl-C, SIGTERM)

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    if INTERRUPTED.swap(true, Ordering::SeqCst) {
        // A second signal: stop now (the servers die with us).
        // SAFETY: _exit is async-signal-safe.
        unsafe { libc::_exit(130) };
    }
}

/// SIGINT and SIGTERM set `INTERRUPTED` while this lives.
struct SignalGuard {
    old: [(libc::c_int, libc::sighandler_t); 2],
}

impl SignalGuard {
    fn install() -> SignalGuard {
        INTERRUPTED.store(false, Ordering::SeqCst);
        let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        // SAFETY: installing a handler that only touches an atomic (and
        // calls the async-signal-safe _exit).
        let old =
            [libc::SIGINT, libc::SIGTERM].map(|sig| (sig, unsafe { libc::signal(sig, handler) }));
        SignalGuard { old }
    }
}

impl Drop for SignalGuard {
    fn drop(&mut self) {
        for (sig, old) in self.old {
            // SAFETY: restoring the disposition saved at install.
            unsafe { libc::signal(sig, old) };
        }
    }
}

// ---------------------------------------------------------------------------
// Progress

/// The progress line on stderr: `\r`-updated on a terminal, one line per
/// cell otherwise.
struct Progress {
    enabled: bool,
    tty: bool,
    total: usize,
    started: Instant,
    /// Expected seconds of each run not yet finished (by index).
    expected: Vec<f64>,
    done: usize,
    /// Actual seconds of finished sized runs, for estimating the others.
    sized_actual: Vec<f64>,
    current: Option<(usize, String, Instant)>,
    last_draw: Option<Instant>,
}

fn hms(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

/// Seconds a job is expected to take, when that is known in advance.
fn planned_secs(job: &JobSpec) -> Option<f64> {
    match job.duration {
        JobDuration::TimeBased {
            runtime_secs,
            ramp_secs,
        } => Some((runtime_secs + ramp_secs) as f64 + 1.0),
        _ => None,
    }
}

impl Progress {
    fn new(enabled: bool, runs: &[&JobSpec]) -> Progress {
        Progress {
            enabled,
            tty: std::io::stderr().is_terminal(),
            total: runs.len(),
            started: Instant::now(),
            expected: runs
                .iter()
                .map(|j| planned_secs(j).unwrap_or(-1.0))
                .collect(),
            done: 0,
            sized_actual: Vec::new(),
            current: None,
            last_draw: None,
        }
    }

    fn unknown_estimate(&self) -> f64 {
        if self.sized_actual.is_empty() {
            10.0
        } else {
            self.sized_actual.iter().sum::<f64>() / self.sized_actual.len() as f64
        }
    }

    fn eta(&self) -> f64 {
        let guess = self.unknown_estimate();
        let mut left: f64 = self.expected[self.done.min(self.total)..]
            .iter()
            .map(|&e| if e < 0.0 { guess } else { e })
            .sum();
        if let Some((i, _, since)) = &self.current {
            let e = self.expected[*i];
            let e = if e < 0.0 { guess } else { e };
            left -= since.elapsed().as_secs_f64().min(e);
        }
        left
    }

    fn line(&self) -> String {
        let (index, label) = match &self.current {
            Some((i, label, _)) => (i + 1, label.as_str()),
            None => (self.done, ""),
        };
        format!(
            "[{index}/{}] {label}  elapsed {}  ETA {}",
            self.total,
            hms(self.started.elapsed().as_secs_f64()),
            hms(self.eta())
        )
    }

    fn begin(&mut self, index: usize, label: String) {
        self.current = Some((index, label, Instant::now()));
        self.last_draw = None;
        self.draw();
    }

    /// Redraws the line (at most once a second, on a terminal only).
    fn tick(&mut self) {
        if self.tty
            && self
                .last_draw
                .is_none_or(|t| t.elapsed() >= Duration::from_secs(1))
        {
            self.draw();
        }
    }

    fn draw(&mut self) {
        if !self.enabled {
            return;
        }
        self.last_draw = Some(Instant::now());
        let mut err = std::io::stderr().lock();
        if self.tty {
            let _ = write!(err, "\r\x1b[2K{}", self.line());
        } else {
            let _ = writeln!(err, "{}", self.line());
        }
        let _ = err.flush();
    }

    fn end(&mut self, failure: Option<&str>) {
        if let Some((i, _, since)) = self.current.take() {
            if self.expected[i] < 0.0 {
                self.sized_actual.push(since.elapsed().as_secs_f64());
            }
            self.done = i + 1;
        }
        if let Some(error) = failure {
            let short = process::tail(error, 3, 300);
            self.note(&format!("  cell failed: {short}"));
        }
    }

    /// A transient status line, on a terminal only (cleared by the next).
    fn status(&mut self, text: &str) {
        if self.enabled && self.tty {
            let _ = write!(std::io::stderr(), "\r\x1b[2K{text}");
            let _ = std::io::stderr().flush();
        }
    }

    /// A line of its own (the progress line is redrawn after it).
    fn note(&mut self, text: &str) {
        if !self.enabled {
            return;
        }
        let mut err = std::io::stderr().lock();
        if self.tty {
            let _ = write!(err, "\r\x1b[2K");
        }
        let _ = writeln!(err, "{text}");
        drop(err);
        if self.tty && self.current.is_some() {
            self.draw();
        }
    }

    fn finish(&mut self) {
        if self.enabled && self.tty {
            let _ = writeln!(
                std::io::stderr(),
                "\r\x1b[2K[{}/{}] done in {}",
                self.done,
                self.total,
                hms(self.started.elapsed().as_secs_f64())
            );
        }
    }
}

// ---------------------------------------------------------------------------
// Output directory

/// `2026-11-21T13:03:12Z` → `20261121-130312`.
fn compact_timestamp(rfc3339: &str) -> String {
    let digits: String = rfc3339
        .chars()
        .filter(|c| c.is_ascii_digit())
        .take(14)
        .collect();
    if digits.len() == 14 {
        format!("{}-{}", &digits[..8], &digits[8..])
    } else {
        digits
    }
}

fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}

/// Refuses an output directory that holds files already.
fn check_out_dir(path: &Path) -> Result<(), RunError> {
    if let Ok(mut entries) = fs::read_dir(path) {
        if entries.next().is_some() {
            return Err(RunError::Usage(format!(
                "output directory {} exists and is not empty; choose another with --out",
                path.display()
            )));
        }
    }
    Ok(())
}

/// Writes a file atomically (temporary file, then rename).
fn write_atomically(path: &Path, text: &str) -> Result<(), RunError> {
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, text)
        .and_then(|()| fs::rename(&tmp, path))
        .map_err(io_err(format!("cannot write {}", path.display())))
}

fn relative(out_dir: &Path, path: &Path) -> String {
    path.strip_prefix(out_dir)
        .unwrap_or(path)
        .to_string_lossy()
        .into_owned()
}

// ---------------------------------------------------------------------------
// Cells

fn label(cell: &CellSpec) -> String {
    let w = &cell.job.workload;
    let mut s = w.rw.clone();
    if let Some(mix) = w.rwmixread {
        s.push_str(&format!(" {mix}/{}", 100 - mix));
    }
    s.push_str(&format!(
        " {} numjobs {} QD {}",
        format_bs(w.block_size_bytes),
        w.numjobs,
        w.iodepth
    ));
    if let Some(n) = w.fsync {
        s.push_str(&format!(" fsync={n}"));
    }
    if let Some(sample) = cell.sample {
        s.push_str(&format!(" sample {}", sample + 1));
    }
    s
}

/// How long fio may take for a job before it is killed.
fn time_limit(job: &JobSpec, size: Option<u64>) -> Duration {
    match job.duration {
        JobDuration::TimeBased {
            runtime_secs,
            ramp_secs,
        } => Duration::from_secs((runtime_secs + ramp_secs) * 2 + 120),
        JobDuration::Sized { bytes } => {
            let bytes = size.map_or(bytes, |s| bytes.min(s));
            // At least 1 MiB/s.
            Duration::from_secs(bytes / (1 << 20) + 300)
        }
        JobDuration::WholeTarget => {
            let bytes = size.unwrap_or(64 << 30);
            // At least 4 MiB/s.
            Duration::from_secs(bytes / (4 << 20) + 300)
        }
    }
}

/// What running one fio job gave.
struct JobRun {
    /// Path (relative to the run directory) of the JSON, or of the log.
    raw_output: String,
    outcome: Result<Metrics, String>,
    server_cpu_seconds: Option<f64>,
    switches: Option<Switches>,
}

struct CellEnv<'a> {
    fio: &'a Fio,
    out_dir: &'a Path,
    work_dir: &'a Path,
    hosts: &'a [String],
    profile: Profile,
}

/// Runs one job on one target and keeps everything fio printed.
fn run_job(
    env: &CellEnv<'_>,
    target: &Target,
    job: &JobSpec,
    id: &str,
    progress: &mut Progress,
) -> Result<JobRun, RunError> {
    let dir = env.out_dir.join("raw").join(&target.slug);
    fs::create_dir_all(&dir).map_err(io_err(format!("cannot create {}", dir.display())))?;
    let job_path = dir.join(format!("{id}.fio"));
    let json_path = dir.join(format!("{id}.json"));
    let log_path = dir.join(format!("{id}.log"));
    let comment = format!(
        "basalt bench {}: cell {id} on target {}",
        env.profile, target.name
    );
    let text = match jobfile::render(job, id, &target.io, target.size_bytes, &comment) {
        Ok(text) => text,
        Err(e) => {
            return Ok(JobRun {
                raw_output: relative(env.out_dir, &job_path),
                outcome: Err(e.to_string()),
                server_cpu_seconds: None,
                switches: None,
            })
        }
    };
    fs::write(&job_path, &text).map_err(io_err(format!("cannot write {}", job_path.display())))?;

    // Server CPU over the measured part: from the end of the ramp (when fio
    // has been running ramp_time) to fio's exit.
    let ramp = match job.duration {
        JobDuration::TimeBased { ramp_secs, .. } => Duration::from_secs(ramp_secs),
        _ => Duration::ZERO,
    };
    let mut cpu_start: Option<f64> = None;
    let mut probe: Option<SwitchProbe> = None;
    let perf_path = dir.join(format!("{id}.perf.txt"));
    let finished = process::run(
        env.fio,
        &Invocation {
            job_file: &job_path,
            hosts: env.hosts,
            cwd: env.work_dir,
            timeout: time_limit(job, target.size_bytes),
        },
        &INTERRUPTED,
        &mut |elapsed| {
            if cpu_start.is_none() && elapsed >= ramp {
                cpu_start = target.server_cpu_seconds();
                probe = target
                    .server_pid()
                    .and_then(|pid| SwitchProbe::attach(pid, &perf_path));
            }
            progress.tick();
        },
    )?;
    let cpu_end = target.server_cpu_seconds();
    let switches = probe.and_then(SwitchProbe::finish);

    let split = parse::split_output(&finished.stdout);
    if let Some(json) = split.json {
        fs::write(&json_path, json)
            .map_err(io_err(format!("cannot write {}", json_path.display())))?;
    }
    let mut log = String::new();
    if !split.preamble.trim().is_empty() {
        log.push_str(split.preamble);
    }
    if !finished.stderr.trim().is_empty() {
        log.push_str(&finished.stderr);
    }
    if !log.is_empty() || split.json.is_none() {
        let mut text = format!("$ {}\n", finished.command);
        text.push_str(&log);
        fs::write(&log_path, text)
            .map_err(io_err(format!("cannot write {}", log_path.display())))?;
    }
    let raw_output = relative(
        env.out_dir,
        if split.json.is_some() {
            &json_path
        } else {
            &log_path
        },
    );
    let said = process::tail(&log, 8, 1500);
    let with_said = |msg: String| {
        if said.is_empty() {
            msg
        } else {
            format!("{msg}: {said}")
        }
    };
    let outcome = match finished.ending {
        Ending::Interrupted => Err("interrupted (Ctrl-C or SIGTERM)".to_string()),
        Ending::TimedOut => Err(with_said(format!(
            "fio did not finish within {}s and was killed",
            time_limit(job, target.size_bytes).as_secs()
        ))),
        Ending::Exited if !finished.success() => Err(with_said(match finished.status {
            Some(status) => format!("fio failed ({status})"),
            None => "fio failed".to_string(),
        })),
        Ending::Exited => match parse::parse_report(&finished.stdout) {
            Err(e) => Err(with_said(e.to_string())),
            Ok(report) => {
                parse::metrics(&report).map_err(|e: CellFailure| with_said(e.to_string()))
            }
        },
    };
    let server_cpu_seconds = match (&outcome, cpu_start, cpu_end) {
        (Ok(_), Some(a), Some(b)) => Some((b - a).max(0.0)),
        _ => None,
    };
    let switches = switches.filter(|_| outcome.is_ok());
    Ok(JobRun {
        raw_output,
        outcome,
        server_cpu_seconds,
        switches,
    })
}

/// The `fio-samples` estimates: per target and workload, the bootstrap
/// median of each figure over the measured samples.
pub fn sample_estimates(cells: &[CellResult]) -> Vec<SampleEstimate> {
    let mut groups: BTreeMap<(usize, String), Vec<&CellResult>> = BTreeMap::new();
    let mut target_order: Vec<&str> = Vec::new();
    for cell in cells.iter().filter(|c| c.sample.is_some()) {
        let t = match target_order.iter().position(|t| *t == cell.target) {
            Some(i) => i,
            None => {
                target_order.push(&cell.target);
                target_order.len() - 1
            }
        };
        let key = serde_json::to_string(&cell.workload).unwrap_or_default();
        groups.entry((t, key)).or_default().push(cell);
    }
    let mut estimates = Vec::new();
    for group in groups.values() {
        let metrics: Vec<&Metrics> = group
            .iter()
            .filter_map(|c| match &c.outcome {
                CellOutcome::Ok { metrics } => Some(metrics),
                CellOutcome::Failed { .. } => None,
            })
            .collect();
        if metrics.is_empty() {
            continue;
        }
        type Pick = fn(&Metrics) -> Option<f64>;
        let figures: [(&str, Pick); 9] = [
            ("read_iops", |m| m.read.as_ref().map(|d| d.iops)),
            ("read_bandwidth_bytes_per_sec", |m| {
                m.read.as_ref().map(|d| d.bandwidth_bytes_per_sec)
            }),
            ("read_lat_mean_us", |m| {
                m.read.as_ref().map(|d| d.latency.mean_us)
            }),
            ("write_iops", |m| m.write.as_ref().map(|d| d.iops)),
            ("write_bandwidth_bytes_per_sec", |m| {
                m.write.as_ref().map(|d| d.bandwidth_bytes_per_sec)
            }),
            ("write_lat_mean_us", |m| {
                m.write.as_ref().map(|d| d.latency.mean_us)
            }),
            ("write_lat_p99_us", |m| {
                m.write.as_ref().map(|d| d.latency.p99_us)
            }),
            ("read_lat_p99_us", |m| {
                m.read.as_ref().map(|d| d.latency.p99_us)
            }),
            ("runtime_ms", |m| Some(m.runtime_ms as f64)),
        ];
        for (name, pick) in figures {
            let values: Vec<f64> = metrics.iter().filter_map(|m| pick(m)).collect();
            if values.is_empty() {
                continue;
            }
            let estimate = stats::bootstrap_median(
                &values,
                profiles::BOOTSTRAP_RESAMPLES,
                profiles::BOOTSTRAP_CONFIDENCE,
                profiles::BOOTSTRAP_SEED,
            );
            if estimate.samples == 0
                || !estimate.ci_low.is_finite()
                || !estimate.ci_high.is_finite()
            {
                continue;
            }
            estimates.push(SampleEstimate {
                target: group[0].target.clone(),
                workload: group[0].workload.clone(),
                metric: name.to_string(),
                estimate,
            });
        }
    }
    estimates
}

// ---------------------------------------------------------------------------
// The run

fn default_work_parent() -> PathBuf {
    let var_tmp = PathBuf::from("/var/tmp");
    if var_tmp.is_dir() {
        var_tmp
    } else {
        std::env::temp_dir()
    }
}

/// Runs a profile against its targets and writes the output directory.
///
/// Starts servers from the calling thread and stops them from it: call it
/// from a thread that lives until it returns (they are set to die with it).
pub fn run(config: RunConfig) -> Result<RunOutcome, RunError> {
    let profile = Profile::parse(&config.profile)?;
    let plan = profiles::expand(profile, &config.options)?;
    let specs = if config.targets.is_empty() {
        vec![TargetSpec::Basalt]
    } else {
        let mut specs: Vec<TargetSpec> = Vec::new();
        for text in &config.targets {
            for spec in TargetSpec::parse_list(text)? {
                if specs.contains(&spec) {
                    return Err(TargetError::Duplicate(spec.name()).into());
                }
                specs.push(spec);
            }
        }
        specs
    };
    let remote: Vec<&String> = config
        .hosts
        .iter()
        .filter(|h| !targets::is_loopback_host(h))
        .collect();
    if let (Some(host), Some(spec)) = (
        remote.first(),
        specs.iter().find(|s| s.local_only(&config.basalt)),
    ) {
        return Err(RunError::Usage(format!(
            "load host {host} cannot reach target {}, which the bench serves on 127.0.0.1 only; \
             with remote --hosts use --target nbd://HOST:PORT/EXPORT (or --url of a basalt server \
             listening on an address the hosts reach)",
            spec.name()
        )));
    }
    let fio = Fio::find(&config.fio)?;
    let size = config.size_bytes.unwrap_or(if config.options.quick {
        profiles::QUICK_SIZE_BYTES
    } else {
        profiles::DEFAULT_SIZE_BYTES
    });
    if size < (16 << 20) || !size.is_multiple_of(4096) {
        return Err(RunError::Usage(format!(
            "--size {size}: must be a multiple of 4096 bytes and at least 16M"
        )));
    }

    let started_at = now_rfc3339();
    let out_dir = config.out_dir.clone().unwrap_or_else(|| {
        PathBuf::from("bench-results").join(format!(
            "{}-{}",
            compact_timestamp(&started_at),
            profile.name()
        ))
    });
    let work_parent = config.work_dir.clone().unwrap_or_else(default_work_parent);
    // Absolute: fio runs in the work directory and reads job files by path.
    let absolute = |p: &Path| {
        std::path::absolute(p).map_err(io_err(format!("cannot resolve {}", p.display())))
    };
    let (out_dir, work_parent) = (absolute(&out_dir)?, absolute(&work_parent)?);
    let work_fs = if specs.iter().any(|s| s.local_only(&config.basalt)) {
        Some(targets::check_work_dir(&work_parent)?)
    } else {
        None
    };
    check_out_dir(&out_dir)?;
    let work = tempfile::Builder::new()
        .prefix("basalt-bench.")
        .tempdir_in(&work_parent)
        .map_err(io_err(format!(
            "cannot create a work directory in {}",
            work_parent.display()
        )))?;
    let _signals = SignalGuard::install();

    // Start every target before measuring anything: a target that cannot
    // start ends the run here, with nothing measured.
    let max_jobs = plan
        .cells
        .iter()
        .map(|c| c.job.workload.numjobs)
        .max()
        .unwrap_or(1);
    let max_connections = max_jobs * (config.hosts.len().max(1) as u32) + 4;
    let ctx = TargetContext {
        work_dir: work.path(),
        size_bytes: size,
        basalt: &config.basalt,
        max_connections,
        fio: &fio,
        hosts: &config.hosts,
        interrupted: &INTERRUPTED,
    };
    let mut progress = Progress::new(config.progress, &[]);
    let mut started: Vec<Target> = Vec::new();
    for spec in &specs {
        progress.status(&format!("starting target {}", spec.name()));
        let mut target = targets::start(spec, &ctx)?;
        // Unique raw directories even for look-alike paths.
        let base = target.slug.clone();
        let mut n = 2;
        while started.iter().any(|t| t.slug == target.slug) {
            target.slug = format!("{base}-{n}");
            n += 1;
        }
        started.push(target);
    }
    // Created once the targets are up: a run that cannot start leaves nothing.
    check_out_dir(&out_dir)?;
    fs::create_dir_all(&out_dir).map_err(io_err(format!("cannot create {}", out_dir.display())))?;
    let reads = plan
        .cells
        .iter()
        .any(|c| c.job.workload.rw.contains("read"));
    if reads && !plan.precondition && specs.iter().any(|s| s.local_only(&config.basalt)) {
        progress.note(
            "note: targets the bench creates start empty (sparse); reads of never-written \
             blocks measure the hole path, not the disk. Add --precondition to fill them first.",
        );
    }

    let env = CellEnv {
        fio: &fio,
        out_dir: &out_dir,
        work_dir: work.path(),
        hosts: &config.hosts,
        profile,
    };
    let mut parameters = plan.parameters.clone();
    parameters.insert("size_bytes".into(), json!(size));
    if let Some(fs) = work_fs {
        // tmpfs: the backing files live in RAM and the CPU is the limit.
        parameters.insert("work_dir_filesystem".into(), json!(fs));
    }
    parameters.insert(
        "cell_order".into(),
        json!("interleaved: each cell on every target in turn"),
    );
    parameters.insert(
        "targets".into(),
        json!(started
            .iter()
            .map(|t| (t.name.clone(), json!(t.details)))
            .collect::<BTreeMap<_, _>>()),
    );

    // Precondition: one sequential fill of each target.
    let mut blocked: Vec<Option<String>> = vec![None; started.len()];
    if plan.precondition {
        let job = Plan::precondition_job();
        let mut runs: BTreeMap<String, serde_json::Value> = BTreeMap::new();
        for (i, target) in started.iter().enumerate() {
            if INTERRUPTED.load(Ordering::Relaxed) {
                break;
            }
            progress.note(&format!("preconditioning {}: sequential fill", target.name));
            let run = run_job(&env, target, &job, "precondition", &mut progress)?;
            if let Err(e) = &run.outcome {
                blocked[i] = Some(format!("not run: precondition failed: {e}"));
                progress.note(&format!(
                    "  precondition of {} failed: {}",
                    target.name,
                    process::tail(e, 3, 300)
                ));
            }
            runs.insert(target.name.clone(), json!(run.raw_output));
        }
        parameters.insert("precondition_outputs".into(), json!(runs));
    }

    // The cells, interleaved by cell.
    let jobs: Vec<&JobSpec> = plan
        .cells
        .iter()
        .flat_map(|c| std::iter::repeat_n(&c.job, started.len()))
        .collect();
    let mut progress = Progress::new(config.progress, &jobs);
    let mut cells: Vec<CellResult> = Vec::with_capacity(jobs.len());
    let mut index = 0;
    for cell in &plan.cells {
        for (t, target) in started.iter_mut().enumerate() {
            if blocked[t].is_none() {
                if let Some(death) = target.server_died() {
                    progress.note(&format!("target {}: {death}", target.name));
                    blocked[t] = Some(format!("not run: {death}"));
                }
            }
            if blocked[t].is_none() && INTERRUPTED.load(Ordering::Relaxed) {
                blocked[t] = Some("not run: the run was interrupted".to_string());
            }
            progress.begin(index, format!("{}  {}", target.name, label(cell)));
            let (raw_output, outcome, server_cpu_seconds, switches) = match &blocked[t] {
                Some(reason) => (String::new(), Err(reason.clone()), None, None),
                None => {
                    let run = run_job(&env, target, &cell.job, &cell.id, &mut progress)?;
                    (
                        run.raw_output,
                        run.outcome,
                        run.server_cpu_seconds,
                        run.switches,
                    )
                }
            };
            progress.end(
                outcome
                    .as_ref()
                    .err()
                    .map(String::as_str)
                    .filter(|_| blocked[t].is_none()),
            );
            cells.push(CellResult {
                target: target.name.clone(),
                workload: cell.job.workload.clone(),
                sample: cell.sample,
                raw_output,
                outcome: match outcome {
                    Ok(metrics) => CellOutcome::Ok { metrics },
                    Err(error) => CellOutcome::Failed { error },
                },
                server_cpu_seconds,
                server_context_switches: switches.map(|s| s.context_switches),
                server_cpu_migrations: switches.map(|s| s.cpu_migrations),
            });
            index += 1;
        }
    }
    progress.finish();

    let interrupted = INTERRUPTED.load(Ordering::Relaxed);
    let mut warnings = Vec::new();
    for target in started.iter_mut().rev() {
        warnings.extend(target.stop());
    }
    let peers: Vec<(&str, String)> = started.iter().flat_map(|t| t.versions.clone()).collect();
    let estimates = sample_estimates(&cells);
    let failed_cells = cells
        .iter()
        .filter(|c| matches!(c.outcome, CellOutcome::Failed { .. }))
        .count();
    let summary = RunSummary {
        schema_version: SCHEMA_VERSION,
        profile: profile.name().to_string(),
        started_at,
        finished_at: now_rfc3339(),
        machine: machine::machine(),
        versions: machine::versions(&fio.version, &config.basalt_version, &peers),
        parameters,
        targets: started.iter().map(|t| t.name.clone()).collect(),
        hosts: config.hosts.clone(),
        cells,
        estimates,
    };
    drop(started);
    let text = serde_json::to_string_pretty(&summary)
        .map_err(|e| RunError::Usage(format!("cannot encode the summary: {e}")))?;
    write_atomically(&out_dir.join(render::SUMMARY_FILE), &(text + "\n"))?;
    let (rendered, render_error) =
        match render::render_run(&out_dir, std::slice::from_ref(&summary)) {
            Ok(files) => (files, None),
            Err(e) => (Vec::new(), Some(e)),
        };
    drop(work);
    Ok(RunOutcome {
        out_dir,
        summary,
        rendered,
        render_error,
        failed_cells,
        interrupted,
        warnings,
    })
}

/// `basalt bench report DIR…`: re-renders one run (into its own directory
/// unless `out` is given) or merges several (into `out`, default
/// `./bench-results/<timestamp>-report/`). Returns the output directory and
/// the files written.
pub fn report(dirs: &[PathBuf], out: Option<PathBuf>) -> Result<(PathBuf, Vec<PathBuf>), RunError> {
    if dirs.is_empty() {
        return Err(RunError::Usage("give at least one run directory".into()));
    }
    let runs = render::load_summaries(dirs)?;
    let out = match (out, dirs) {
        (Some(out), _) => out,
        (None, [one]) if one.is_dir() => one.clone(),
        (None, _) => PathBuf::from("bench-results")
            .join(format!("{}-report", compact_timestamp(&now_rfc3339()))),
    };
    fs::create_dir_all(&out).map_err(io_err(format!("cannot create {}", out.display())))?;
    let files = render::render_run(&out, &runs)?;
    Ok((out, files))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{DirectionMetrics, LatencyMetrics, Workload};

    #[test]
    fn timestamps_for_directory_names() {
        assert_eq!(compact_timestamp("2026-11-21T13:03:12Z"), "20261121-130312");
        assert_eq!(compact_timestamp(&now_rfc3339()).len(), 15);
    }

    #[test]
    fn time_limits_cover_the_job() {
        let plan = profiles::expand(Profile::Matrix, &ProfileOptions::default()).unwrap();
        assert!(time_limit(&plan.cells[0].job, None) > Duration::from_secs(125));
        let fill = Plan::precondition_job();
        assert!(time_limit(&fill, Some(4 << 30)) >= Duration::from_secs(1024));
    }

    #[test]
    fn hms_format() {
        assert_eq!(hms(0.0), "0:00:00");
        assert_eq!(hms(3725.4), "1:02:05");
        assert_eq!(hms(-5.0), "0:00:00");
    }

    fn sample(target: &str, s: u32, iops: Option<f64>) -> CellResult {
        CellResult {
            target: target.into(),
            workload: Workload {
                rw: "randwrite".into(),
                block_size_bytes: 4096,
                numjobs: 1,
                iodepth: 1,
                rwmixread: None,
                fsync: None,
            },
            sample: Some(s),
            raw_output: String::new(),
            outcome: match iops {
                Some(iops) => CellOutcome::Ok {
                    metrics: Metrics {
                        write: Some(DirectionMetrics {
                            iops,
                            bandwidth_bytes_per_sec: iops * 4096.0,
                            ios: 100,
                            latency: LatencyMetrics {
                                mean_us: 1e6 / iops,
                                ..Default::default()
                            },
                        }),
                        runtime_ms: 1000,
                        ..Default::default()
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
    fn estimates_per_target_over_measured_samples() {
        let cells = vec![
            sample("basalt", 0, Some(100.0)),
            sample("file", 0, Some(1000.0)),
            sample("basalt", 1, Some(300.0)),
            sample("file", 1, None),
            sample("basalt", 2, Some(200.0)),
            sample("file", 2, Some(3000.0)),
        ];
        let est = sample_estimates(&cells);
        let basalt_iops = est
            .iter()
            .find(|e| e.target == "basalt" && e.metric == "write_iops")
            .unwrap();
        assert_eq!(basalt_iops.estimate.median, 200.0);
        assert_eq!(basalt_iops.estimate.samples, 3);
        assert_eq!(basalt_iops.estimate.resamples, 10_000);
        assert_eq!(basalt_iops.estimate.confidence, 0.95);
        assert!(basalt_iops.estimate.ci_low <= 200.0 && 200.0 <= basalt_iops.estimate.ci_high);
        let file_iops = est
            .iter()
            .find(|e| e.target == "file" && e.metric == "write_iops")
            .unwrap();
        assert_eq!(
            file_iops.estimate.samples, 2,
            "the failed sample is left out"
        );
        assert!(est.iter().all(|e| !e.metric.starts_with("read_")));
        assert_eq!(est[0].target, "basalt", "targets in order given");
        // Reproducible.
        assert_eq!(est, sample_estimates(&cells));
        // A target whose samples all failed has no estimate.
        let all_failed = vec![sample("x", 0, None)];
        assert!(sample_estimates(&all_failed).is_empty());
    }
}
