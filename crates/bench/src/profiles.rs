//! The built-in profiles — the published fio methodologies `basalt bench`
//! reproduces — and their expansion into cells: one fio job group each,
//! independent of the target (origins and facts in docs/benchmarks.md).
//!
//! Invariants:
//! - Expansion is pure and deterministic: the same profile and options give
//!   the same cells in the same order (the order the runner measures them
//!   in, and the order tables and charts follow).
//! - Every cell of a profile has a distinct `CellSpec::id` (the raw output
//!   file name), and each `Workload` (plus `sample`) is distinct.
//! - Options a profile does not take are refused with the list of those it
//!   does take, and filter values outside a profile's grid with the list of
//!   valid ones: nothing given on the command line is silently ignored.

use crate::model::Workload;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::fmt;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const GIB: u64 = 1024 * MIB;

/// Default volume / backing file size for targets the bench creates.
pub const DEFAULT_SIZE_BYTES: u64 = 4 * GIB;
/// The same with `--quick`.
pub const QUICK_SIZE_BYTES: u64 = GIB;

/// Runtime and ramp of the time-based profiles, full and `--quick`.
const RUNTIME_SECS: u64 = 120;
const RAMP_SECS: u64 = 5;
const QUICK_RUNTIME_SECS: u64 = 5;
const QUICK_RAMP_SECS: u64 = 1;
/// `sweep`: the seed's `--runtime=20`, no ramp.
const SWEEP_RUNTIME_SECS: u64 = 20;

/// `fio-samples`: the seed's 40 samples of a 1 GiB job; `--quick` 10 of 64 MiB.
const SAMPLES: u32 = 40;
const SAMPLE_BYTES: u64 = GIB;
const QUICK_SAMPLES: u32 = 10;
const QUICK_SAMPLE_BYTES: u64 = 64 * MIB;
/// Bootstrap of `fio-samples`: 10 000 resamples, 95%, fixed seed.
pub const BOOTSTRAP_RESAMPLES: usize = 10_000;
pub const BOOTSTRAP_CONFIDENCE: f64 = 0.95;
pub const BOOTSTRAP_SEED: u64 = 0x0ba5_a17b_e7c4;

/// A command-line option of `basalt bench run` that some profiles take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Param {
    Rw,
    Bs,
    Numjobs,
    Iodepth,
    Runtime,
    Samples,
    Precondition,
}

impl Param {
    pub fn flag(self) -> &'static str {
        match self {
            Param::Rw => "--rw",
            Param::Bs => "--bs",
            Param::Numjobs => "--numjobs",
            Param::Iodepth => "--iodepth",
            Param::Runtime => "--runtime",
            Param::Samples => "--samples",
            Param::Precondition => "--precondition",
        }
    }
}

/// The profiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    Matrix,
    Sweep,
    DbLatency,
    FioSamples,
    Parallel,
    DataPath,
    Precondition,
}

/// What `basalt bench list` shows about a profile.
#[derive(Debug, Clone, Copy)]
pub struct ProfileInfo {
    pub profile: Profile,
    pub name: &'static str,
    /// One line.
    pub summary: &'static str,
    /// The options it takes besides the common ones (--target, --compare,
    /// --quick, --size, --out, --hosts).
    pub params: &'static [Param],
}

pub const PROFILES: &[ProfileInfo] = &[
    ProfileInfo {
        profile: Profile::Matrix,
        name: "matrix",
        summary: "IOPS and latency vs concurrency: randread, randwrite, randrw 70/30 x 4k, 8k, 32k x numjobs 1, 4, 8, 12 (QD 1 unless --iodepth)",
        params: &[
            Param::Rw,
            Param::Bs,
            Param::Numjobs,
            Param::Iodepth,
            Param::Runtime,
            Param::Precondition,
        ],
    },
    ProfileInfo {
        profile: Profile::Sweep,
        name: "sweep",
        summary: "throughput vs I/O size: randread and randwrite, 512 B to 512 KiB doubling, numjobs 4, QD 32",
        params: &[
            Param::Rw,
            Param::Bs,
            Param::Iodepth,
            Param::Runtime,
            Param::Precondition,
        ],
    },
    ProfileInfo {
        profile: Profile::DbLatency,
        name: "db-latency",
        summary: "the database pattern: 8k random writes, QD 1, one job, fsync after every write; IOPS and p50/p99/p99.9",
        params: &[Param::Runtime, Param::Precondition],
    },
    ProfileInfo {
        profile: Profile::FioSamples,
        name: "fio-samples",
        summary: "40 runs of 4k randwrite over 1 GiB (sync engine, direct=1): median and 95% bootstrap CI",
        params: &[Param::Samples, Param::Precondition],
    },
    ProfileInfo {
        profile: Profile::Parallel,
        name: "parallel",
        summary: "many concurrent streams: randrw 50/50, numjobs 1, 10, 20 × QD 4, 20, 40; a region per job",
        params: &[
            Param::Numjobs,
            Param::Iodepth,
            Param::Runtime,
            Param::Precondition,
        ],
    },
    ProfileInfo {
        profile: Profile::DataPath,
        name: "datapath",
        summary: "the data-path targets: 4k randread and randwrite at QD 1, at QD 32 and at numjobs 2 × QD 16, 8k randwrite QD 1 with fsync after each, 1 MiB sequential read and write at QD 8",
        params: &[Param::Runtime, Param::Precondition],
    },
    ProfileInfo {
        profile: Profile::Precondition,
        name: "precondition",
        summary: "fill the target once sequentially (1 MiB writes); the other profiles do it first with --precondition",
        params: &[],
    },
];

impl Profile {
    pub fn parse(name: &str) -> Result<Profile, ProfileError> {
        PROFILES
            .iter()
            .find(|p| p.name == name)
            .map(|p| p.profile)
            .ok_or_else(|| ProfileError::UnknownProfile(name.to_string()))
    }

    pub fn info(self) -> &'static ProfileInfo {
        PROFILES
            .iter()
            .find(|p| p.profile == self)
            .expect("every profile is in PROFILES")
    }

    pub fn name(self) -> &'static str {
        self.info().name
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

fn profile_names() -> String {
    PROFILES
        .iter()
        .map(|p| p.name)
        .collect::<Vec<_>>()
        .join(", ")
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProfileError {
    #[error("unknown profile {0:?}; the profiles are: {names} (see `basalt bench list`)", names = profile_names())]
    UnknownProfile(String),
    #[error("{flag} does not apply to profile {profile}; it takes {accepted}")]
    UnsupportedParam {
        profile: Profile,
        flag: &'static str,
        accepted: String,
    },
    #[error("{flag} {value}: not one of profile {profile}'s values; valid: {valid}")]
    InvalidValue {
        profile: Profile,
        flag: &'static str,
        value: String,
        valid: String,
    },
    #[error("{flag} {value:?}: {reason}")]
    BadValue {
        flag: &'static str,
        value: String,
        reason: String,
    },
}

/// The profile options of `basalt bench run`, as given (empty or `None`:
/// not given).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProfileOptions {
    pub quick: bool,
    pub runtime_secs: Option<u64>,
    pub rw: Vec<String>,
    /// Block sizes as given (`4k`, `512`, `1m`).
    pub bs: Vec<String>,
    pub numjobs: Vec<u32>,
    pub iodepth: Vec<u32>,
    pub samples: Option<u32>,
    pub precondition: bool,
}

/// How long one fio job runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Duration {
    /// `time_based`, `runtime`, `ramp_time` (seconds).
    TimeBased { runtime_secs: u64, ramp_secs: u64 },
    /// Until this many bytes per job were transferred (`size`), capped at
    /// the target's size.
    Sized { bytes: u64 },
    /// Once over the whole target (sequential fill).
    WholeTarget,
}

/// Which kind of fio engine a job asks for; the target decides the actual
/// engine (see `fio::jobfile`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    /// Asynchronous: io_uring (libaio fallback) on files, nbd on NBD.
    Async,
    /// Synchronous `sync` engine (one I/O at a time) on files; nbd with
    /// iodepth 1 on NBD.
    Sync,
}

/// One fio job group: the target-independent part of a job file.
#[derive(Debug, Clone, PartialEq)]
pub struct JobSpec {
    pub workload: Workload,
    pub duration: Duration,
    pub engine: EngineKind,
    /// Each of the `numjobs` jobs on its own equal region
    /// (`size`/`offset_increment` = 100/numjobs %).
    pub region_per_job: bool,
    /// Further fio options of the methodology, in job-file order.
    pub options: Vec<(&'static str, String)>,
}

/// One planned measurement: a job, and for `fio-samples` its sample index.
#[derive(Debug, Clone, PartialEq)]
pub struct CellSpec {
    /// File-name-safe and unique within the plan, e.g. `randrw70-8k-j4-qd1`.
    pub id: String,
    pub sample: Option<u32>,
    pub job: JobSpec,
}

/// The cells of one profile, with its parameters as recorded in the summary.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub profile: Profile,
    pub cells: Vec<CellSpec>,
    pub parameters: BTreeMap<String, Value>,
    /// Whether to fill each target before the first cell.
    pub precondition: bool,
}

impl Plan {
    /// The precondition job: one sequential pass of 1 MiB writes, QD 8.
    pub fn precondition_job() -> JobSpec {
        JobSpec {
            workload: workload("write", MIB, 1, 8, None, None),
            duration: Duration::WholeTarget,
            engine: EngineKind::Async,
            region_per_job: false,
            options: opts(&[("direct", "1")]),
        }
    }
}

fn workload(
    rw: &str,
    bs: u64,
    numjobs: u32,
    iodepth: u32,
    rwmixread: Option<u32>,
    fsync: Option<u32>,
) -> Workload {
    Workload {
        rw: rw.to_string(),
        block_size_bytes: bs,
        numjobs,
        iodepth,
        rwmixread,
        fsync,
    }
}

/// A block size for people and file names: `512`, `4k`, `1m`.
pub fn format_bs(bytes: u64) -> String {
    if bytes >= MIB && bytes.is_multiple_of(MIB) {
        format!("{}m", bytes / MIB)
    } else if bytes >= KIB && bytes.is_multiple_of(KIB) {
        format!("{}k", bytes / KIB)
    } else {
        bytes.to_string()
    }
}

/// Parses a block size: bytes, or a number with k/m (KiB/MiB; `4k`, `4K`,
/// `4KiB`). Block sizes are multiples of 512 bytes.
pub fn parse_bs(text: &str) -> Result<u64, ProfileError> {
    let bad = |reason: &str| ProfileError::BadValue {
        flag: "--bs",
        value: text.to_string(),
        reason: reason.to_string(),
    };
    let t = text.trim();
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(digits_end);
    let number: u64 = number
        .parse()
        .map_err(|_| bad("not a block size (e.g. 512, 4k, 64k, 1m)"))?;
    let unit = unit.to_ascii_lowercase();
    let multiplier = match unit.as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => KIB,
        "m" | "mb" | "mib" => MIB,
        _ => return Err(bad("not a block size (e.g. 512, 4k, 64k, 1m)")),
    };
    let bytes = number
        .checked_mul(multiplier)
        .ok_or_else(|| bad("too large"))?;
    if bytes == 0 || bytes % 512 != 0 {
        return Err(bad("block sizes are positive multiples of 512 bytes"));
    }
    if bytes > 64 * MIB {
        return Err(bad("at most 64m (the largest NBD request fio sends)"));
    }
    Ok(bytes)
}

/// The cell id of a workload: `rw[mix]-bs-jN-qdN[-fsyncN]`.
fn cell_id(w: &Workload, sample: Option<u32>) -> String {
    let mut id = w.rw.clone();
    if let Some(mix) = w.rwmixread {
        id.push_str(&mix.to_string());
    }
    id.push_str(&format!(
        "-{}-j{}-qd{}",
        format_bs(w.block_size_bytes),
        w.numjobs,
        w.iodepth
    ));
    if let Some(n) = w.fsync {
        id.push_str(&format!("-fsync{n}"));
    }
    if let Some(s) = sample {
        id.push_str(&format!("-s{s:03}"));
    }
    id
}

/// Checks that only options the profile takes were given.
fn check_params(profile: Profile, opts: &ProfileOptions) -> Result<(), ProfileError> {
    let given = [
        (Param::Rw, !opts.rw.is_empty()),
        (Param::Bs, !opts.bs.is_empty()),
        (Param::Numjobs, !opts.numjobs.is_empty()),
        (Param::Iodepth, !opts.iodepth.is_empty()),
        (Param::Runtime, opts.runtime_secs.is_some()),
        (Param::Samples, opts.samples.is_some()),
        (Param::Precondition, opts.precondition),
    ];
    let accepted = profile.info().params;
    for (param, is_given) in given {
        if is_given && !accepted.contains(&param) {
            let list = if accepted.is_empty() {
                "none of the profile options (only --target, --compare, --quick, --size, --out, --hosts)".to_string()
            } else {
                accepted
                    .iter()
                    .map(|p| p.flag())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            return Err(ProfileError::UnsupportedParam {
                profile,
                flag: param.flag(),
                accepted: list,
            });
        }
    }
    if opts.runtime_secs == Some(0) {
        return Err(ProfileError::BadValue {
            flag: "--runtime",
            value: "0".into(),
            reason: "must be at least 1 second".into(),
        });
    }
    if opts.samples == Some(0) {
        return Err(ProfileError::BadValue {
            flag: "--samples",
            value: "0".into(),
            reason: "must be at least 1".into(),
        });
    }
    for &n in &opts.iodepth {
        if n == 0 || n > 65536 {
            return Err(ProfileError::BadValue {
                flag: "--iodepth",
                value: n.to_string(),
                reason: "must be 1 to 65536".into(),
            });
        }
    }
    Ok(())
}

/// Restricts `grid` to the values given with `flag` (all of it when none
/// were given); a value outside the grid is an error.
fn filter<T: PartialEq + Clone + fmt::Display>(
    profile: Profile,
    flag: &'static str,
    grid: &[T],
    given: &[T],
    show: impl Fn(&T) -> String,
) -> Result<Vec<T>, ProfileError> {
    if given.is_empty() {
        return Ok(grid.to_vec());
    }
    for value in given {
        if !grid.contains(value) {
            return Err(ProfileError::InvalidValue {
                profile,
                flag,
                value: show(value),
                valid: grid.iter().map(&show).collect::<Vec<_>>().join(", "),
            });
        }
    }
    // Grid order, whatever the order given.
    Ok(grid.iter().filter(|v| given.contains(v)).cloned().collect())
}

fn time_based(opts: &ProfileOptions, runtime: u64, ramp: u64) -> Duration {
    let (default_runtime, ramp) = if opts.quick {
        (QUICK_RUNTIME_SECS, ramp.min(QUICK_RAMP_SECS))
    } else {
        (runtime, ramp)
    };
    Duration::TimeBased {
        runtime_secs: opts.runtime_secs.unwrap_or(default_runtime),
        ramp_secs: ramp,
    }
}

fn opts(pairs: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
    pairs.iter().map(|(k, v)| (*k, v.to_string())).collect()
}

/// The fio options every random-I/O measurement of the matrix methodology
/// sets (seed 000): no random map, a different random sequence each run.
fn random_opts() -> Vec<(&'static str, String)> {
    opts(&[("norandommap", "1"), ("randrepeat", "0")])
}

/// Expands a profile into its cells.
pub fn expand(profile: Profile, o: &ProfileOptions) -> Result<Plan, ProfileError> {
    check_params(profile, o)?;
    let bs_given =
        o.bs.iter()
            .map(|b| parse_bs(b))
            .collect::<Result<Vec<u64>, _>>()?;
    let bs_show = |b: &u64| format_bs(*b);
    let mut parameters: BTreeMap<String, Value> = BTreeMap::new();
    parameters.insert("quick".into(), json!(o.quick));
    let mut cells = Vec::new();
    let mut push = |job: JobSpec, sample: Option<u32>| {
        cells.push(CellSpec {
            id: cell_id(&job.workload, sample),
            sample,
            job,
        });
    };
    match profile {
        Profile::Matrix => {
            let rws = filter(
                profile,
                "--rw",
                &["randread".to_string(), "randwrite".into(), "randrw".into()],
                &o.rw,
                |s| s.clone(),
            )?;
            let bss = filter(
                profile,
                "--bs",
                &[4 * KIB, 8 * KIB, 32 * KIB],
                &bs_given,
                bs_show,
            )?;
            let jobs = filter(profile, "--numjobs", &[1, 4, 8, 12], &o.numjobs, |n| {
                n.to_string()
            })?;
            let depths = if o.iodepth.is_empty() {
                vec![1]
            } else {
                o.iodepth.clone()
            };
            let duration = time_based(o, RUNTIME_SECS, RAMP_SECS);
            for rw in &rws {
                let mix = (rw == "randrw").then_some(70);
                for &bs in &bss {
                    for &qd in &depths {
                        for &nj in &jobs {
                            let mut options = random_opts();
                            options.insert(0, ("direct", "1".into()));
                            push(
                                JobSpec {
                                    workload: workload(rw, bs, nj, qd, mix, None),
                                    duration,
                                    engine: EngineKind::Async,
                                    region_per_job: false,
                                    options,
                                },
                                None,
                            );
                        }
                    }
                }
            }
            parameters.insert("rw".into(), json!(rws));
            parameters.insert("rwmixread".into(), json!(70));
            parameters.insert("bs_bytes".into(), json!(bss));
            parameters.insert("numjobs".into(), json!(jobs));
            parameters.insert("iodepth".into(), json!(depths));
            insert_duration(&mut parameters, duration);
        }
        Profile::Sweep => {
            let rws = filter(
                profile,
                "--rw",
                &["randread".to_string(), "randwrite".into()],
                &o.rw,
                |s| s.clone(),
            )?;
            let grid: Vec<u64> = (0..11).map(|i| 512u64 << i).collect();
            let bss = filter(profile, "--bs", &grid, &bs_given, bs_show)?;
            let depths = if o.iodepth.is_empty() {
                vec![32]
            } else {
                o.iodepth.clone()
            };
            let duration = time_based(o, SWEEP_RUNTIME_SECS, 0);
            for rw in &rws {
                for &qd in &depths {
                    for &bs in &bss {
                        push(
                            JobSpec {
                                workload: workload(rw, bs, 4, qd, None, None),
                                duration,
                                engine: EngineKind::Async,
                                region_per_job: false,
                                options: opts(&[
                                    ("direct", "1"),
                                    ("invalidate", "1"),
                                    ("fsync_on_close", "1"),
                                    ("norandommap", "1"),
                                ]),
                            },
                            None,
                        );
                    }
                }
            }
            parameters.insert("rw".into(), json!(rws));
            parameters.insert("bs_bytes".into(), json!(bss));
            parameters.insert("numjobs".into(), json!([4]));
            parameters.insert("iodepth".into(), json!(depths));
            insert_duration(&mut parameters, duration);
        }
        Profile::DbLatency => {
            let duration = time_based(o, RUNTIME_SECS, RAMP_SECS);
            let mut options = random_opts();
            options.insert(0, ("direct", "1".into()));
            push(
                JobSpec {
                    workload: workload("randwrite", 8 * KIB, 1, 1, None, Some(1)),
                    duration,
                    engine: EngineKind::Async,
                    region_per_job: false,
                    options,
                },
                None,
            );
            parameters.insert("rw".into(), json!(["randwrite"]));
            parameters.insert("bs_bytes".into(), json!([8 * KIB]));
            parameters.insert("numjobs".into(), json!([1]));
            parameters.insert("iodepth".into(), json!([1]));
            parameters.insert("fsync".into(), json!(1));
            insert_duration(&mut parameters, duration);
        }
        Profile::FioSamples => {
            let (default_samples, bytes) = if o.quick {
                (QUICK_SAMPLES, QUICK_SAMPLE_BYTES)
            } else {
                (SAMPLES, SAMPLE_BYTES)
            };
            let samples = o.samples.unwrap_or(default_samples);
            let duration = Duration::Sized { bytes };
            for s in 0..samples {
                push(
                    JobSpec {
                        workload: workload("randwrite", 4 * KIB, 1, 1, None, None),
                        duration,
                        engine: EngineKind::Sync,
                        region_per_job: false,
                        options: opts(&[
                            ("direct", "1"),
                            ("randrepeat", "0"),
                            ("invalidate", "1"),
                            ("verify", "0"),
                        ]),
                    },
                    Some(s),
                );
            }
            parameters.insert("rw".into(), json!(["randwrite"]));
            parameters.insert("bs_bytes".into(), json!([4 * KIB]));
            parameters.insert("samples".into(), json!(samples));
            parameters.insert("job_size_bytes".into(), json!(bytes));
            parameters.insert("engine".into(), json!("sync"));
            parameters.insert("bootstrap_resamples".into(), json!(BOOTSTRAP_RESAMPLES));
            parameters.insert("bootstrap_confidence".into(), json!(BOOTSTRAP_CONFIDENCE));
            parameters.insert("bootstrap_seed".into(), json!(BOOTSTRAP_SEED));
        }
        Profile::Parallel => {
            // The full grid; it contains the seed's two series (numjobs
            // 1, 10, 20 at QD 4, then QD 20 and 40 at numjobs 20).
            let jobs = filter(profile, "--numjobs", &[1, 10, 20], &o.numjobs, |n| {
                n.to_string()
            })?;
            let depths = filter(profile, "--iodepth", &[4, 20, 40], &o.iodepth, |n| {
                n.to_string()
            })?;
            let grid: Vec<(u32, u32)> = jobs
                .iter()
                .flat_map(|&nj| depths.iter().map(move |&qd| (nj, qd)))
                .collect();
            let duration = time_based(o, RUNTIME_SECS, RAMP_SECS);
            for &(nj, qd) in &grid {
                let mut options = random_opts();
                options.insert(0, ("direct", "1".into()));
                push(
                    JobSpec {
                        workload: workload("randrw", 4 * KIB, nj, qd, Some(50), None),
                        duration,
                        engine: EngineKind::Async,
                        region_per_job: true,
                        options,
                    },
                    None,
                );
            }
            parameters.insert("rw".into(), json!(["randrw"]));
            parameters.insert("rwmixread".into(), json!(50));
            parameters.insert("bs_bytes".into(), json!([4 * KIB]));
            parameters.insert("numjobs_iodepth".into(), json!(grid));
            parameters.insert("region_per_job".into(), json!(true));
            insert_duration(&mut parameters, duration);
        }
        Profile::DataPath => {
            let duration = time_based(o, RUNTIME_SECS, RAMP_SECS);
            // (rw, block size, numjobs, iodepth, fsync)
            let grid: [(&str, u64, u32, u32, Option<u32>); 9] = [
                ("randread", 4 * KIB, 1, 1, None),
                ("randwrite", 4 * KIB, 1, 1, None),
                ("randread", 4 * KIB, 1, 32, None),
                ("randwrite", 4 * KIB, 1, 32, None),
                ("randread", 4 * KIB, 2, 16, None),
                ("randwrite", 4 * KIB, 2, 16, None),
                ("randwrite", 8 * KIB, 1, 1, Some(1)),
                ("read", MIB, 1, 8, None),
                ("write", MIB, 1, 8, None),
            ];
            for (rw, bs, nj, qd, fsync) in grid {
                let options = if rw.starts_with("rand") {
                    let mut options = random_opts();
                    options.insert(0, ("direct", "1".into()));
                    options
                } else {
                    opts(&[("direct", "1")])
                };
                push(
                    JobSpec {
                        workload: workload(rw, bs, nj, qd, None, fsync),
                        duration,
                        engine: EngineKind::Async,
                        region_per_job: false,
                        options,
                    },
                    None,
                );
            }
            parameters.insert(
                "cells".into(),
                json!(grid
                    .iter()
                    .map(|(rw, bs, nj, qd, fsync)| json!({
                        "rw": rw, "bs_bytes": bs, "numjobs": nj, "iodepth": qd, "fsync": fsync
                    }))
                    .collect::<Vec<_>>()),
            );
            insert_duration(&mut parameters, duration);
        }
        Profile::Precondition => {
            push(Plan::precondition_job(), None);
        }
    }
    parameters.insert("precondition".into(), json!(o.precondition));
    Ok(Plan {
        profile,
        cells,
        parameters,
        precondition: o.precondition,
    })
}

fn insert_duration(parameters: &mut BTreeMap<String, Value>, duration: Duration) {
    if let Duration::TimeBased {
        runtime_secs,
        ramp_secs,
    } = duration
    {
        parameters.insert("runtime_secs".into(), json!(runtime_secs));
        parameters.insert("ramp_secs".into(), json!(ramp_secs));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn expand_ok(profile: &str, o: &ProfileOptions) -> Plan {
        expand(Profile::parse(profile).unwrap(), o).unwrap()
    }

    fn assert_distinct(plan: &Plan) {
        let ids: HashSet<_> = plan.cells.iter().map(|c| &c.id).collect();
        assert_eq!(ids.len(), plan.cells.len(), "duplicate cell ids");
        let keys: HashSet<_> = plan
            .cells
            .iter()
            .map(|c| (&c.job.workload, c.sample))
            .collect();
        assert_eq!(keys.len(), plan.cells.len(), "duplicate workloads");
    }

    #[test]
    fn matrix_is_rw_x_bs_x_numjobs() {
        let plan = expand_ok("matrix", &ProfileOptions::default());
        assert_eq!(plan.cells.len(), 3 * 3 * 4);
        assert_distinct(&plan);
        let first = &plan.cells[0].job;
        assert_eq!(first.workload, workload("randread", 4096, 1, 1, None, None));
        assert_eq!(
            first.duration,
            Duration::TimeBased {
                runtime_secs: 120,
                ramp_secs: 5
            }
        );
        for (k, v) in [("direct", "1"), ("norandommap", "1"), ("randrepeat", "0")] {
            assert!(first.options.contains(&(k, v.to_string())), "{k}");
        }
        let mixed: Vec<_> = plan
            .cells
            .iter()
            .filter(|c| c.job.workload.rw == "randrw")
            .collect();
        assert_eq!(mixed.len(), 12);
        assert!(mixed.iter().all(|c| c.job.workload.rwmixread == Some(70)));
        let numjobs: Vec<u32> = plan.cells[..4]
            .iter()
            .map(|c| c.job.workload.numjobs)
            .collect();
        assert_eq!(numjobs, [1, 4, 8, 12], "numjobs is the innermost axis");
        assert_eq!(plan.cells[35].id, "randrw70-32k-j12-qd1");
        assert_eq!(plan.parameters["runtime_secs"], json!(120));
    }

    #[test]
    fn matrix_quick_iodepth_and_filters() {
        let o = ProfileOptions {
            quick: true,
            iodepth: vec![1, 32],
            rw: vec!["randwrite".into(), "randread".into()],
            bs: vec!["4K".into()],
            ..Default::default()
        };
        let plan = expand_ok("matrix", &o);
        assert_eq!(plan.cells.len(), 2 * 2 * 4);
        assert_distinct(&plan);
        assert_eq!(plan.cells[0].job.workload.rw, "randread", "grid order kept");
        assert_eq!(
            plan.cells[0].job.duration,
            Duration::TimeBased {
                runtime_secs: 5,
                ramp_secs: 1
            }
        );
        let o = ProfileOptions {
            quick: true,
            runtime_secs: Some(2),
            numjobs: vec![1],
            rw: vec!["randread".into()],
            bs: vec!["4k".into()],
            ..Default::default()
        };
        let plan = expand_ok("matrix", &o);
        assert_eq!(plan.cells.len(), 1);
        assert_eq!(plan.cells[0].id, "randread-4k-j1-qd1");
        assert_eq!(
            plan.cells[0].job.duration,
            Duration::TimeBased {
                runtime_secs: 2,
                ramp_secs: 1
            }
        );
    }

    #[test]
    fn sweep_doubles_from_512_to_512k() {
        let plan = expand_ok("sweep", &ProfileOptions::default());
        assert_eq!(plan.cells.len(), 2 * 11);
        assert_distinct(&plan);
        let sizes: Vec<u64> = plan.cells[..11]
            .iter()
            .map(|c| c.job.workload.block_size_bytes)
            .collect();
        assert_eq!(sizes.first(), Some(&512));
        assert_eq!(sizes.last(), Some(&(512 * 1024)));
        assert!(sizes.windows(2).all(|w| w[1] == 2 * w[0]));
        for c in &plan.cells {
            assert_eq!((c.job.workload.numjobs, c.job.workload.iodepth), (4, 32));
        }
        assert_eq!(
            plan.cells[0].job.duration,
            Duration::TimeBased {
                runtime_secs: 20,
                ramp_secs: 0
            }
        );
        assert_eq!(plan.cells[0].id, "randread-512-j4-qd32");
        assert_eq!(plan.cells[21].id, "randwrite-512k-j4-qd32");
    }

    #[test]
    fn db_latency_is_one_fsync_cell() {
        let plan = expand_ok("db-latency", &ProfileOptions::default());
        assert_eq!(plan.cells.len(), 1);
        let w = &plan.cells[0].job.workload;
        assert_eq!(*w, workload("randwrite", 8192, 1, 1, None, Some(1)));
        assert_eq!(plan.cells[0].id, "randwrite-8k-j1-qd1-fsync1");
    }

    #[test]
    fn fio_samples_counts_and_sizes() {
        let plan = expand_ok("fio-samples", &ProfileOptions::default());
        assert_eq!(plan.cells.len(), 40);
        assert_distinct(&plan);
        assert!(plan.cells.iter().all(|c| c.job.engine == EngineKind::Sync));
        assert_eq!(plan.cells[0].job.duration, Duration::Sized { bytes: GIB });
        assert_eq!(plan.cells[7].sample, Some(7));
        assert_eq!(plan.cells[7].id, "randwrite-4k-j1-qd1-s007");
        let quick = expand_ok(
            "fio-samples",
            &ProfileOptions {
                quick: true,
                ..Default::default()
            },
        );
        assert_eq!(quick.cells.len(), 10);
        let three = expand_ok(
            "fio-samples",
            &ProfileOptions {
                samples: Some(3),
                ..Default::default()
            },
        );
        assert_eq!(three.cells.len(), 3);
    }

    #[test]
    fn parallel_is_the_full_grid() {
        let plan = expand_ok("parallel", &ProfileOptions::default());
        let pairs: Vec<(u32, u32)> = plan
            .cells
            .iter()
            .map(|c| (c.job.workload.numjobs, c.job.workload.iodepth))
            .collect();
        assert_eq!(
            pairs,
            [
                (1, 4),
                (1, 20),
                (1, 40),
                (10, 4),
                (10, 20),
                (10, 40),
                (20, 4),
                (20, 20),
                (20, 40)
            ]
        );
        assert!(plan.cells.iter().all(|c| c.job.region_per_job));
        assert!(plan
            .cells
            .iter()
            .all(|c| c.job.workload.rwmixread == Some(50)));
        let only20 = expand_ok(
            "parallel",
            &ProfileOptions {
                numjobs: vec![20],
                ..Default::default()
            },
        );
        assert_eq!(only20.cells.len(), 3);
        let one = expand_ok(
            "parallel",
            &ProfileOptions {
                numjobs: vec![1],
                iodepth: vec![40],
                ..Default::default()
            },
        );
        assert_eq!(one.cells.len(), 1);
        let err = expand(
            Profile::Parallel,
            &ProfileOptions {
                iodepth: vec![8],
                ..Default::default()
            },
        )
        .unwrap_err();
        assert!(err.to_string().contains("4, 20, 40"), "{err}");
    }

    #[test]
    fn datapath_has_the_nine_target_cells() {
        let plan = expand_ok("datapath", &ProfileOptions::default());
        let ids: Vec<&str> = plan.cells.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "randread-4k-j1-qd1",
                "randwrite-4k-j1-qd1",
                "randread-4k-j1-qd32",
                "randwrite-4k-j1-qd32",
                "randread-4k-j2-qd16",
                "randwrite-4k-j2-qd16",
                "randwrite-8k-j1-qd1-fsync1",
                "read-1m-j1-qd8",
                "write-1m-j1-qd8",
            ]
        );
        assert_distinct(&plan);
        let err = expand(
            Profile::DataPath,
            &ProfileOptions {
                numjobs: vec![4],
                ..Default::default()
            },
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("takes --runtime, --precondition"), "{err}");
    }

    #[test]
    fn precondition_is_one_fill() {
        let plan = expand_ok("precondition", &ProfileOptions::default());
        assert_eq!(plan.cells.len(), 1);
        assert_eq!(plan.cells[0].job.duration, Duration::WholeTarget);
        assert_eq!(plan.cells[0].id, "write-1m-j1-qd8");
    }

    #[test]
    fn errors_list_the_valid_choices() {
        let err = Profile::parse("matrx").unwrap_err().to_string();
        assert!(
            err.contains(
                "matrix, sweep, db-latency, fio-samples, parallel, datapath, precondition"
            ),
            "{err}"
        );

        let err = expand(
            Profile::DbLatency,
            &ProfileOptions {
                numjobs: vec![4],
                ..Default::default()
            },
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            err,
            "--numjobs does not apply to profile db-latency; it takes --runtime, --precondition"
        );

        let err = expand(
            Profile::Matrix,
            &ProfileOptions {
                bs: vec!["16k".into()],
                ..Default::default()
            },
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            err,
            "--bs 16k: not one of profile matrix's values; valid: 4k, 8k, 32k"
        );

        let err = expand(
            Profile::Matrix,
            &ProfileOptions {
                rw: vec!["read".into()],
                ..Default::default()
            },
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("valid: randread, randwrite, randrw"), "{err}");

        let err = expand(
            Profile::Precondition,
            &ProfileOptions {
                precondition: true,
                ..Default::default()
            },
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("does not apply to profile precondition"),
            "{err}"
        );
    }

    #[test]
    fn block_sizes() {
        assert_eq!(parse_bs("512").unwrap(), 512);
        assert_eq!(parse_bs("4k").unwrap(), 4096);
        assert_eq!(parse_bs("4KiB").unwrap(), 4096);
        assert_eq!(parse_bs("1M").unwrap(), MIB);
        assert!(parse_bs("100").is_err());
        assert!(parse_bs("0").is_err());
        assert!(parse_bs("4x").is_err());
        assert!(parse_bs("").is_err());
        assert!(parse_bs("99999999999999999999").is_err());
        assert_eq!(format_bs(512), "512");
        assert_eq!(format_bs(32 * KIB), "32k");
        assert_eq!(format_bs(MIB), "1m");
        assert_eq!(format_bs(1536), "1536");
    }

    #[test]
    fn every_profile_expands() {
        for info in PROFILES {
            let plan = expand(info.profile, &ProfileOptions::default()).unwrap();
            assert!(!plan.cells.is_empty(), "{}", info.name);
            assert_distinct(&plan);
            assert_eq!(Profile::parse(info.name).unwrap(), info.profile);
        }
    }
}
