//! `basalt bench …`: the command line of the benchmark suite (crate
//! `basalt-bench`): `list`, `run PROFILE`, `report DIR…`, `floor` and
//! `failover`. This module only turns flags into the library's
//! configurations and results into output and exit status.

use crate::client::{ApiClient, ClientArgs, ConnArgs, Output};
use crate::output::{table, Align};
use anyhow::{anyhow, bail, Context, Result};
use basalt_bench::failover::{FailoverConfig, Victim};
use basalt_bench::fio::process::Fio;
use basalt_bench::floor::{FloorFiles, FloorResult};
use basalt_bench::profiles::{ProfileOptions, PROFILES};
use basalt_bench::runner::{self, RunConfig};
use basalt_bench::targets::BasaltServer;
use basalt_volume::parse_size;
use clap::{Args, Subcommand, ValueEnum};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    conn: ConnArgs,
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// List the profiles, one line each.
    List,
    /// Run a profile against Basalt and its peers (one fio job group per
    /// cell; results, charts and an HTML report in the output directory).
    Run(Box<RunArgs>),
    /// Re-render an earlier run, or merge several (e.g. before and after a
    /// change) into one report.
    Report(ReportArgs),
    /// Measure this machine's replication floor: the QD1 4 KiB write
    /// latency of the shortest chain a replicated write can take here
    /// (loopback TCP, one O_DIRECT write per replica, nothing else), for
    /// each replica count. What Basalt measures above it is Basalt's cost.
    Floor(FloorArgs),
    /// Client I/O through a primary's death and a rebuild: starts a local
    /// cluster (etcd and --nodes servers on 127.0.0.1), kills the volume's
    /// primary under fio, then removes that node and times the rebuild of
    /// its replica on another one.
    Failover(FailoverArgs),
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum VictimArg {
    /// The volume's primary.
    Primary,
    /// The coordinator's node (not the primary's).
    Coordinator,
    /// A secondary's node that is not the coordinator's.
    Secondary,
}

#[derive(Args, Debug)]
struct FailoverArgs {
    /// Node processes to start (at least one more than --replicas).
    #[arg(long, default_value_t = 4, value_name = "N")]
    nodes: usize,

    /// The volume's replica count.
    #[arg(long, default_value_t = 3, value_name = "N")]
    replicas: usize,

    /// The volume's size.
    #[arg(long, default_value = "2G", value_name = "SIZE")]
    size: String,

    /// Written sequentially before the phases (what the rebuild copies); fio
    /// then writes within it.
    #[arg(long, default_value = "1G", value_name = "SIZE")]
    fill: String,

    /// fio's queue depth (4 KiB random writes).
    #[arg(long, default_value_t = 16, value_name = "N")]
    iodepth: u32,

    /// The node the failover phase kills.
    #[arg(long, value_enum, default_value_t = VictimArg::Primary)]
    victim: VictimArg,

    /// Seconds into the failover phase at which the node is killed.
    #[arg(long, default_value_t = 10, value_name = "S")]
    kill_at: u64,

    /// Length of the failover phase, in seconds.
    #[arg(long, default_value_t = 40, value_name = "S")]
    runtime: u64,

    /// How long the rebuild may take, in seconds.
    #[arg(long, default_value_t = 300, value_name = "S")]
    rebuild_timeout: u64,

    /// Each node's capacity.
    #[arg(long, default_value = "4G", value_name = "SIZE")]
    capacity: String,

    /// An extra `basalt server` argument for every node (repeatable), e.g.
    /// --server-arg=--resync-rate --server-arg=32.
    #[arg(long = "server-arg", value_name = "ARG", allow_hyphen_values = true)]
    server_args: Vec<String>,

    /// Where the cluster's data goes (a disk filesystem) [default: /var/tmp].
    #[arg(long, value_name = "DIR")]
    work_dir: Option<PathBuf>,

    /// Keep the cluster's directory (node logs, fio's logs) afterwards.
    #[arg(long)]
    keep: bool,

    /// The etcd binary (Debian: apt-get install etcd-server).
    #[arg(long, default_value = "etcd", value_name = "PATH")]
    etcd: PathBuf,

    /// The fio binary.
    #[arg(long, default_value = "fio", value_name = "PATH")]
    fio: PathBuf,
}

#[derive(Args, Debug)]
struct FloorArgs {
    /// Replica counts to measure, e.g. 1,2,3.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1,3",
        value_name = "N[,N...]"
    )]
    replicas: Vec<usize>,

    /// Timed writes per measurement.
    #[arg(long, default_value_t = 20000, value_name = "N")]
    writes: usize,

    /// Measurements per replica count, interleaved (the median is reported).
    #[arg(long, default_value_t = 3, value_name = "N")]
    rounds: usize,

    /// Where each replica's file goes (a disk filesystem) [default: /var/tmp].
    #[arg(long, value_name = "DIR")]
    work_dir: Option<PathBuf>,

    /// Size of each replica's file (written in full first).
    #[arg(long, default_value = "1G", value_name = "SIZE")]
    size: String,
}

#[derive(Args, Debug)]
#[command(
    after_help = "Targets: basalt (default: an ephemeral server on a sparse file; with --url or \
--data-dir, a volume on that running server), qemu-nbd (as its users start it), qemu-nbd-shared \
(with --shared=N), nbdkit, file (peers the bench starts on equal sparse files), basalt-iscsi \
(an ephemeral server's volume over iSCSI) and tgt (tgtd on a preallocated file), both through a \
qemu-nbd bridge (QEMU's libiscsi driver exported as NBD), nbd://HOST:PORT/EXPORT, or the path of a file or block device (written to!).\n\
Example: basalt bench run matrix --quick --precondition --compare basalt,qemu-nbd,nbdkit,file"
)]
struct RunArgs {
    /// The profile: matrix, sweep, db-latency, fio-samples, parallel or
    /// precondition (see `basalt bench list`).
    profile: String,

    /// What to measure [default: basalt]; repeat it to measure several
    /// targets, as with --compare.
    #[arg(long, value_name = "TARGET", conflicts_with = "compare")]
    target: Vec<String>,

    /// Measure several targets in turn, interleaved by cell, with every
    /// pairwise ratio, e.g. basalt,qemu-nbd,nbdkit,file.
    #[arg(long, value_name = "T1,T2,...")]
    compare: Option<String>,

    /// Short runs: 5 s per cell after a 1 s ramp, 1 GiB targets
    /// (fio-samples: 10 samples of 64 MiB).
    #[arg(long)]
    quick: bool,

    /// Seconds per cell of the time-based profiles [default: 120; sweep 20;
    /// with --quick 5].
    #[arg(long, value_name = "S")]
    runtime: Option<u64>,

    /// Queue depth(s): matrix [default: 1; e.g. 1,16,32], sweep [default:
    /// 32]; for parallel, only these of 4,20,40.
    #[arg(long, value_delimiter = ',', value_name = "N[,N...]")]
    iodepth: Vec<u32>,

    /// Only these access patterns (matrix: randread,randwrite,randrw;
    /// sweep: randread,randwrite).
    #[arg(long, value_delimiter = ',', value_name = "RW[,RW...]")]
    rw: Vec<String>,

    /// Only these block sizes (matrix: 4k,8k,32k; sweep: 512 to 512k).
    #[arg(long, value_delimiter = ',', value_name = "BS[,BS...]")]
    bs: Vec<String>,

    /// Only these numbers of jobs (matrix: 1,4,8,12; parallel: 1,10,20).
    #[arg(long, value_delimiter = ',', value_name = "N[,N...]")]
    numjobs: Vec<u32>,

    /// fio-samples: how many samples [default: 40; with --quick 10].
    #[arg(long, value_name = "N")]
    samples: Option<u32>,

    /// Size of the volume and of the peers' backing files [default: 4G;
    /// with --quick 1G].
    #[arg(long, value_name = "SIZE")]
    size: Option<String>,

    /// Fill each target once, sequentially, before measuring.
    #[arg(long)]
    precondition: bool,

    /// Output directory [default: ./bench-results/<timestamp>-<profile>/].
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,

    /// Run fio on these load hosts, in fio's client/server mode (each runs
    /// `fio --server`): HOST or HOST:PORT, comma-separated.
    #[arg(long, value_delimiter = ',', value_name = "H1,H2")]
    hosts: Vec<String>,

    /// Where the temporary backing files and server data go: a disk
    /// filesystem, or /dev/shm to measure software cost with the data in RAM
    /// (needs O_DIRECT: tmpfs from Linux 6.6) [default: /var/tmp].
    #[arg(long, value_name = "DIR")]
    work_dir: Option<PathBuf>,

    /// NBD address of the server given with --url, when this machine has
    /// no server.json for it [default: the URL's host, port 10809].
    #[arg(long, value_name = "HOST:PORT")]
    nbd_address: Option<String>,

    /// The fio binary.
    #[arg(long, default_value = "fio", value_name = "PATH")]
    fio: PathBuf,
}

#[derive(Args, Debug)]
struct ReportArgs {
    /// Run directories (each holding a summary.json), oldest first.
    #[arg(required = true, value_name = "DIR")]
    dirs: Vec<PathBuf>,

    /// Output directory [default: the run's own directory for one run,
    /// ./bench-results/<timestamp>-report/ for several].
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
}

/// Runs `basalt bench …`. `data_dir_given`: whether --data-dir (or
/// BASALT_DATA_DIR) was given, which, like --url and --token, points the
/// `basalt` target at a running server instead of an ephemeral one.
pub fn run(args: BenchArgs, data_dir: &Path, data_dir_given: bool) -> Result<()> {
    let client = ClientArgs::new(data_dir.to_path_buf(), args.conn);
    match args.command {
        BenchCommand::List => list(client.output),
        BenchCommand::Run(run_args) => run_profile(*run_args, &client, data_dir_given),
        BenchCommand::Floor(floor_args) => floor(floor_args, client.output),
        BenchCommand::Failover(args) => failover(args, client.output),
        BenchCommand::Report(report) => {
            let (out, files) = runner::report(&report.dirs, report.out)?;
            println!("report: {}", out.display());
            print_files(&out, &files);
            Ok(())
        }
    }
}

fn floor(args: FloorArgs, output: Output) -> Result<()> {
    if args.replicas.is_empty() || args.replicas.iter().any(|r| !(1..=5).contains(r)) {
        bail!("--replicas takes counts from 1 to 5");
    }
    if args.rounds == 0 || args.writes == 0 {
        bail!("--rounds and --writes must be at least 1");
    }
    let file_size = parse_size(&args.size).map_err(|e| anyhow!("--size {}: {e}", args.size))?;
    let dir = args
        .work_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from("/var/tmp"));
    let most = args.replicas.iter().copied().max().unwrap_or(1);
    let files = FloorFiles::create(&dir, most, file_size)
        .with_context(|| format!("cannot create the floor's files in {}", dir.display()))?;
    let mut runs: Vec<Vec<FloorResult>> = vec![Vec::new(); args.replicas.len()];
    for round in 1..=args.rounds {
        for (i, replicas) in args.replicas.iter().enumerate() {
            let r = files
                .measure(*replicas, args.writes)
                .with_context(|| format!("floor with {replicas} replica(s)"))?;
            if output != Output::Json {
                eprintln!(
                    "round {round}: {replicas} replica(s): mean {:.1} µs, p99 {:.1} µs",
                    r.mean_us, r.p99_us
                );
            }
            runs[i].push(r);
        }
    }
    let median = |v: &[FloorResult], f: fn(&FloorResult) -> f64| {
        let mut x: Vec<f64> = v.iter().map(f).collect();
        x.sort_by(f64::total_cmp);
        x[x.len() / 2]
    };
    let base = runs
        .first()
        .map(|v| median(v, |r| r.mean_us))
        .unwrap_or(1.0);
    let summary: Vec<(usize, f64, f64, f64)> = args
        .replicas
        .iter()
        .zip(&runs)
        .map(|(n, v)| {
            let mean = median(v, |r| r.mean_us);
            (*n, mean, median(v, |r| r.p99_us), mean / base)
        })
        .collect();
    if output == Output::Json {
        let rows: Vec<_> = summary
            .iter()
            .map(|(n, mean, p99, ratio)| json!({"replicas": n, "mean_us": mean, "p99_us": p99, "ratio_to_first": ratio}))
            .collect();
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = summary
        .iter()
        .map(|(n, mean, p99, ratio)| {
            vec![
                n.to_string(),
                format!("{mean:.1}"),
                format!("{p99:.1}"),
                format!("{ratio:.2}x"),
            ]
        })
        .collect();
    let ratio_header = format!("MEAN / MEAN OF {}", args.replicas[0]);
    print!(
        "{}",
        table(
            &[
                ("REPLICAS", Align::Right),
                ("MEAN µs", Align::Right),
                ("P99 µs", Align::Right),
                (ratio_header.as_str(), Align::Right)
            ],
            &rows
        )
    );
    println!(
        "(median of {} rounds, {} writes each, 4 KiB at queue depth 1)",
        args.rounds, args.writes
    );
    Ok(())
}

fn failover(args: FailoverArgs, output: Output) -> Result<()> {
    let size =
        |flag: &str, text: &str| parse_size(text).map_err(|e| anyhow!("--{flag} {text}: {e}"));
    let cfg = FailoverConfig {
        basalt: std::env::current_exe().context("cannot find the basalt binary")?,
        etcd: args.etcd,
        fio: Fio::find(&args.fio)?,
        work_dir: args.work_dir.unwrap_or_else(|| PathBuf::from("/var/tmp")),
        nodes: args.nodes,
        replicas: args.replicas,
        volume_size: size("size", &args.size)?,
        fill: size("fill", &args.fill)?,
        iodepth: args.iodepth,
        victim: match args.victim {
            VictimArg::Primary => Victim::Primary,
            VictimArg::Coordinator => Victim::Coordinator,
            VictimArg::Secondary => Victim::Secondary,
        },
        kill_at: Duration::from_secs(args.kill_at),
        runtime: Duration::from_secs(args.runtime),
        rebuild_timeout: Duration::from_secs(args.rebuild_timeout),
        capacity: size("capacity", &args.capacity)?,
        server_args: args.server_args,
        keep: args.keep,
    };
    cfg.check()?;
    if output != Output::Json {
        eprintln!(
            "starting etcd and {} nodes; the {} dies {} s into a {} s run, then its node is removed",
            cfg.nodes,
            match cfg.victim {
                Victim::Primary => "primary",
                Victim::Coordinator => "coordinator's node",
                Victim::Secondary => "node of a secondary",
            },
            args.kill_at,
            args.runtime
        );
    }
    let r = basalt_bench::failover::run(&cfg)?;
    if output == Output::Json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    let series = |v: &[f64]| {
        v.iter()
            .map(|i| format!("{i:.0}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let o = &r.outage;
    let mut rows = vec![
        vec![
            "killed node".into(),
            format!(
                "{} ({})",
                r.killed,
                match (
                    r.killed == r.primary,
                    r.coordinator_killed,
                    r.killed_held_replica,
                ) {
                    (true, true, _) => "the primary and the coordinator",
                    (true, false, _) => "the primary",
                    (false, true, true) => "the coordinator and a secondary",
                    (false, true, false) => "the coordinator, no replica",
                    (false, false, _) => "a secondary",
                }
            ),
        ],
        vec!["primary before".into(), r.primary.clone()],
        vec!["client through".into(), r.client_node.clone()],
        vec![
            "IOPS before the kill".into(),
            format!("{:.0}", o.baseline_iops),
        ],
        vec!["outage (s below 10%)".into(), o.outage_s.to_string()],
        vec![
            "IOPS after recovery".into(),
            format!(
                "{:.0} ({:.2}x)",
                o.recovered_iops,
                o.recovered_iops / o.baseline_iops.max(1.0)
            ),
        ],
    ];
    match &r.rebuild {
        Some(b) => rows.extend([
            vec!["rebuild time".into(), format!("{:.1} s", b.rebuild_s)],
            vec![
                "rebuild throughput".into(),
                format!(
                    "{:.0} MiB/s ({} MiB filled)",
                    b.rebuild_mib_per_s,
                    r.fill_bytes >> 20
                ),
            ],
            vec![
                "IOPS during the rebuild".into(),
                format!(
                    "{:.0} ({:.2}x the baseline)",
                    b.rebuild_client_iops,
                    b.rebuild_client_iops / o.baseline_iops.max(1.0)
                ),
            ],
        ]),
        None => rows.push(vec![
            "rebuild".into(),
            "none: the killed node held no replica".into(),
        ]),
    }
    print!(
        "{}",
        table(&[("MEASURE", Align::Left), ("VALUE", Align::Left)], &rows)
    );
    println!(
        "failover IOPS per second (kill after second {}): {}",
        r.kill_at_s,
        series(&r.failover_iops)
    );
    if let Some(b) = &r.rebuild {
        println!(
            "rebuild IOPS per second (node removed at {:.1} s): {}",
            b.removed_at_s,
            series(&b.rebuild_iops)
        );
    }
    if let Some(dir) = &r.kept {
        println!("kept {}", dir.display());
    }
    Ok(())
}

fn list(output: Output) -> Result<()> {
    if output == Output::Json {
        let list: Vec<_> = PROFILES
            .iter()
            .map(|p| {
                json!({
                    "name": p.name,
                    "summary": p.summary,
                    "options": p.params.iter().map(|o| o.flag()).collect::<Vec<_>>(),
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = PROFILES
        .iter()
        .map(|p| vec![p.name.to_string(), p.summary.to_string()])
        .collect();
    print!(
        "{}",
        table(
            &[("PROFILE", Align::Left), ("WHAT IT MEASURES", Align::Left)],
            &rows
        )
    );
    println!(
        "\nRun one: basalt bench run PROFILE [--compare basalt,qemu-nbd,nbdkit,file] [--quick]"
    );
    println!("Origins and options of each: docs/benchmarks.md");
    Ok(())
}

/// The `basalt` target: a running server when one was pointed at, else an
/// ephemeral one started from this very executable.
fn basalt_server(
    args: &RunArgs,
    client: &ClientArgs,
    data_dir_given: bool,
) -> Result<BasaltServer> {
    if client.url.is_none() && client.token.is_none() && !data_dir_given {
        let exe = std::env::current_exe()
            .context("cannot find the basalt executable to start an ephemeral server")?;
        return Ok(BasaltServer::Ephemeral { exe });
    }
    let api = ApiClient::discover(client)?;
    let nbd_address = args
        .nbd_address
        .clone()
        .or_else(|| api.server.as_ref().and_then(|s| s.nbd.clone()));
    Ok(BasaltServer::Running {
        api_url: api.base_url().to_string(),
        token: api.token().to_string(),
        nbd_address,
    })
}

fn run_profile(args: RunArgs, client: &ClientArgs, data_dir_given: bool) -> Result<()> {
    let targets: Vec<String> = args
        .compare
        .iter()
        .chain(args.target.iter())
        .cloned()
        .collect();
    let uses_basalt = targets.is_empty()
        || targets.iter().any(|t| {
            t.split(',')
                .any(|part| matches!(part.trim(), "basalt" | "basalt-iscsi"))
        });
    let basalt = if uses_basalt {
        basalt_server(&args, client, data_dir_given)?
    } else {
        BasaltServer::Ephemeral {
            exe: PathBuf::from("basalt"),
        }
    };
    let size_bytes = args
        .size
        .as_deref()
        .map(parse_size)
        .transpose()
        .context("--size")?;
    let config = RunConfig {
        profile: args.profile,
        options: ProfileOptions {
            quick: args.quick,
            runtime_secs: args.runtime,
            rw: args.rw,
            bs: args.bs,
            numjobs: args.numjobs,
            iodepth: args.iodepth,
            samples: args.samples,
            precondition: args.precondition,
        },
        targets,
        size_bytes,
        out_dir: args.out,
        work_dir: args.work_dir,
        hosts: args
            .hosts
            .into_iter()
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .collect(),
        basalt,
        basalt_version: env!("CARGO_PKG_VERSION").to_string(),
        fio: args.fio,
        progress: true,
    };
    let outcome = runner::run(config)?;
    for warning in &outcome.warnings {
        eprintln!("warning: {warning}");
    }
    let out = &outcome.out_dir;
    println!("results: {}", out.display());
    let mut files = vec![out.join(basalt_bench::render::SUMMARY_FILE)];
    files.extend(outcome.rendered.iter().cloned());
    print_files(out, &files);
    let total = outcome.summary.cells.len();
    if let Some(e) = &outcome.render_error {
        bail!(
            "cannot render the report: {e}; summary.json and the raw fio outputs are in {}",
            out.display()
        );
    }
    if outcome.interrupted {
        bail!(
            "interrupted: {} of {total} cells not measured; partial results in {}",
            outcome.failed_cells,
            out.display()
        );
    }
    if outcome.failed_cells > 0 {
        return Err(anyhow!(
            "{} of {total} cells failed (shown as FAILED in {})",
            outcome.failed_cells,
            out.join(basalt_bench::render::RESULTS_FILE).display()
        ));
    }
    Ok(())
}

/// Prints the files written, relative to the output directory; charts as
/// a count.
fn print_files(out: &Path, files: &[PathBuf]) {
    let mut charts = 0;
    for file in files {
        let rel = file.strip_prefix(out).unwrap_or(file);
        if rel.starts_with(basalt_bench::render::CHARTS_DIR) {
            charts += 1;
        } else {
            println!("  {}", rel.display());
        }
    }
    if charts > 0 {
        println!(
            "  {}/ ({charts} SVG charts)",
            basalt_bench::render::CHARTS_DIR
        );
    }
}
