//! `basalt bench failover`: what a client sees when a replicated volume's
//! primary dies, and while the lost replica is rebuilt elsewhere.
//!
//! The bench starts its own cluster on 127.0.0.1 — a real etcd and `nodes`
//! `basalt server` processes (one more than the replica count, so there is
//! a node to rebuild on) — creates one volume, fills part of it, and runs
//! fio's nbd engine (4 KiB random writes) through a node that is neither
//! the primary nor the one killed, so the client's connection outlives the
//! kill and what is measured is the cluster's failover, not a client
//! reconnect.
//!
//! - Phase 1, failover: SIGKILL of a node's process `kill_at` into the run:
//!   the primary's ([`Victim::Primary`], the default), the coordinator's
//!   (a node holding a secondary, or no replica, while the coordinator
//!   role moves) or a secondary's that is not the coordinator. From fio's
//!   per-second IOPS log: the baseline (mean of the seconds before the
//!   kill, the first one skipped), the outage (seconds after the kill below
//!   10% of the baseline) and the IOPS once recovered (the last third of
//!   the run after the kill, at most 10 s).
//! - Phase 2, rebuild: `basalt node remove` of the killed node while fio
//!   writes again (skipped when it held no replica of the volume, which the
//!   coordinator's node may not); the rebuild time runs from the removal until the volume
//!   has all its replicas in sync again, its throughput is the data filled
//!   before phase 1 over that time (a rebuild copies allocated regions
//!   only), and the client's IOPS meanwhile are compared with phase 1's
//!   baseline.
//!
//! Invariants: the bench signals only processes it spawned, through their
//! handles; every one is stopped when the run ends, on error too, and the
//! work directory is removed unless kept (always kept when the run failed,
//! for its logs).

use crate::fio::process::{self as fio_process, Fio, Invocation};
use crate::targets::{which, ServerProcess, TargetError, EPHEMERAL_LISTENERS};
use serde::Serialize;
use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

/// The volume the bench creates.
const VOLUME: &str = "failover";
/// How long the cluster gets to start, place the volume and settle.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Seconds of phase 2 before the node is removed (a baseline under load).
const REMOVE_AFTER: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum FailoverError {
    #[error(transparent)]
    Start(#[from] TargetError),
    #[error("`basalt {command}` failed: {detail}")]
    Cli { command: String, detail: String },
    #[error("{0}")]
    Fio(String),
    #[error("timed out after {timeout:?} waiting for {what}")]
    Timeout { what: String, timeout: Duration },
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Config(String),
    /// A run that failed keeps its directory: the nodes' and etcd's logs
    /// say why.
    #[error("{source} (the cluster's logs are kept in {})", dir.display())]
    Kept {
        source: Box<FailoverError>,
        dir: PathBuf,
    },
}

fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> FailoverError {
    let context = context.into();
    move |source| FailoverError::Io { context, source }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct FailoverConfig {
    /// The `basalt` binary the nodes and CLI calls run.
    pub basalt: PathBuf,
    /// The `etcd` binary.
    pub etcd: PathBuf,
    pub fio: Fio,
    /// The cluster's data goes in a fresh directory under this one.
    pub work_dir: PathBuf,
    pub nodes: usize,
    pub replicas: usize,
    pub volume_size: u64,
    /// Bytes written sequentially before phase 1 (what a rebuild copies).
    pub fill: u64,
    pub iodepth: u32,
    /// Which node phase 1 kills.
    pub victim: Victim,
    /// When phase 1 kills it.
    pub kill_at: Duration,
    /// Length of phase 1.
    pub runtime: Duration,
    /// How long phase 2 may wait for the rebuild.
    pub rebuild_timeout: Duration,
    /// Each node's capacity.
    pub capacity: u64,
    /// Extra `basalt server` arguments for every node.
    pub server_args: Vec<String>,
    /// Keep the work directory (logs, fio's logs).
    pub keep: bool,
}

impl FailoverConfig {
    /// Refuses what cannot be measured: no etcd to run, no node to rebuild
    /// on, no baseline before the kill or no run after it, a fill beyond
    /// the volume.
    pub fn check(&self) -> Result<(), FailoverError> {
        let bare = self.etcd.components().count() == 1;
        let found = if bare {
            which(&self.etcd.to_string_lossy()).is_some()
        } else {
            self.etcd.is_file()
        };
        if !found {
            return Err(FailoverError::Config(format!(
                "no etcd at {}: install Debian's etcd-server (apt-get install etcd-server) or pass --etcd PATH",
                self.etcd.display()
            )));
        }
        if self.replicas < 2 || self.nodes <= self.replicas {
            return Err(FailoverError::Config(format!(
                "a failover needs at least 2 replicas and a node more than the replicas to rebuild on (got {} replicas on {} nodes)",
                self.replicas, self.nodes
            )));
        }
        if self.kill_at < Duration::from_secs(3)
            || self.runtime < self.kill_at + Duration::from_secs(3)
        {
            return Err(FailoverError::Config(
                "the kill needs at least 3 s of baseline before it and 3 s of run after it".into(),
            ));
        }
        if self.fill == 0 || self.fill > self.volume_size {
            return Err(FailoverError::Config(
                "the fill must be between 1 byte and the volume's size".into(),
            ));
        }
        Ok(())
    }
}

/// What phase 1 measured, from its per-second IOPS.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Outage {
    pub baseline_iops: f64,
    /// Seconds after the kill with fewer than 10% of the baseline's IOPS.
    pub outage_s: u32,
    pub recovered_iops: f64,
}

/// Which node phase 1 kills.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Victim {
    /// The volume's primary (a failover with epoch + 1).
    Primary,
    /// The coordinator's node, which does not hold the primary (every
    /// primary's lease waits for a new coordinator).
    Coordinator,
    /// A node holding a secondary, not the coordinator (the primary marks
    /// it out of sync and goes on).
    Secondary,
}

/// The node `victim` names for a volume as `volume show` reports it, given
/// `node list`'s report: its index (node names are `n<index>`) and name.
pub fn choose_victim(
    victim: Victim,
    volume: &Value,
    nodes: &Value,
) -> Result<(usize, String), FailoverError> {
    let replicas = volume["replicas"].as_array().cloned().unwrap_or_default();
    let primary = replicas
        .iter()
        .find(|r| r["primary"] == true)
        .and_then(|r| r["node"].as_str())
        .ok_or_else(|| FailoverError::Config(format!("no primary in {volume}")))?;
    let coordinator = nodes["nodes"]
        .as_array()
        .and_then(|n| n.iter().find(|n| n["coordinator"] == true))
        .and_then(|n| n["name"].as_str())
        .ok_or_else(|| FailoverError::Config(format!("no coordinator in {nodes}")))?;
    let name = match victim {
        Victim::Primary => primary,
        Victim::Coordinator if coordinator == primary => {
            return Err(FailoverError::Config(format!(
                "the coordinator ({coordinator}) holds the volume's primary: that is --victim primary"
            )))
        }
        Victim::Coordinator => coordinator,
        Victim::Secondary => replicas
            .iter()
            .filter_map(|r| r["node"].as_str())
            .find(|n| *n != primary && *n != coordinator)
            .ok_or_else(|| {
                FailoverError::Config(format!(
                    "every secondary of the volume is on the coordinator's node ({coordinator})"
                ))
            })?,
    };
    let index = node_index(name)
        .ok_or_else(|| FailoverError::Config(format!("unexpected node name {name}")))?;
    Ok((index, name.to_string()))
}

/// What phase 2 measured.
#[derive(Debug, Clone, Serialize)]
pub struct Rebuild {
    pub rebuild_s: f64,
    pub rebuild_mib_per_s: f64,
    /// Mean client IOPS while the rebuild ran.
    pub rebuild_client_iops: f64,
    /// Phase 2's IOPS, one value per second; the node was removed after
    /// `removed_at_s`.
    pub rebuild_iops: Vec<f64>,
    pub removed_at_s: f64,
}

/// Everything the run measured.
#[derive(Debug, Clone, Serialize)]
pub struct FailoverReport {
    pub nodes: usize,
    pub replicas: usize,
    pub iodepth: u32,
    pub fill_bytes: u64,
    /// Which node phase 1 killed.
    pub victim: Victim,
    /// The killed node (removed in phase 2).
    pub killed: String,
    /// Whether the killed node held a replica of the volume (the
    /// coordinator's node may hold none).
    pub killed_held_replica: bool,
    /// The volume's primary before the kill.
    pub primary: String,
    /// Whether the coordinator ran on the killed node (with the primary,
    /// the slower case: a new coordinator is elected before it promotes).
    pub coordinator_killed: bool,
    /// The node fio connected to.
    pub client_node: String,
    pub kill_at_s: u64,
    #[serde(flatten)]
    pub outage: Outage,
    /// Phase 1's IOPS, one value per second from the first.
    pub failover_iops: Vec<f64>,
    /// Phase 2; `None` when the killed node held no replica of the volume
    /// (nothing to rebuild).
    #[serde(flatten)]
    pub rebuild: Option<Rebuild>,
    /// The work directory, when kept.
    pub kept: Option<PathBuf>,
}

/// Per-second IOPS from a fio IOPS log written with `log_avg_msec=1000`
/// (`msec, iops, direction, bs[, prio]` per line): entry `i` is second
/// `i + 1`. A second without a line (fio logs nothing for a second without
/// completions) counts as 0; unparsable lines are skipped.
pub fn per_second(log: &str) -> Vec<f64> {
    let mut series: Vec<f64> = Vec::new();
    for line in log.lines() {
        let mut fields = line.split(',').map(str::trim);
        let (Some(ms), Some(iops)) = (fields.next(), fields.next()) else {
            continue;
        };
        let (Ok(ms), Ok(iops)) = (ms.parse::<u64>(), iops.parse::<f64>()) else {
            continue;
        };
        let second = ((ms + 500) / 1000) as usize;
        if second == 0 || second > 100_000 {
            continue;
        }
        if series.len() < second {
            series.resize(second, 0.0);
        }
        series[second - 1] = iops;
    }
    series
}

fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// Baseline, outage and recovery of a per-second series whose primary was
/// killed after second `kill_at_s`; `None` without a baseline (the kill came
/// before second 2) or without a second after it.
pub fn outage(series: &[f64], kill_at_s: usize) -> Option<Outage> {
    let before = series.get(1..kill_at_s.min(series.len()))?;
    let baseline_iops = mean(before)?;
    let after = series.get(kill_at_s..).filter(|a| !a.is_empty())?;
    let outage_s = after.iter().filter(|i| **i < 0.1 * baseline_iops).count() as u32;
    let tail = (after.len() / 3).clamp(1, 10);
    let recovered_iops = mean(&after[after.len() - tail..])?;
    Some(Outage {
        baseline_iops,
        outage_s,
        recovered_iops,
    })
}

/// The bench's cluster: etcd and the nodes, each stopped on drop.
struct LocalCluster {
    dir: PathBuf,
    basalt: PathBuf,
    etcd: Option<ServerProcess>,
    nodes: Vec<Option<ServerProcess>>,
}

impl LocalCluster {
    fn start(cfg: &FailoverConfig, dir: &Path) -> Result<LocalCluster, FailoverError> {
        // etcd's two ports and each node's peer port, distinct (all held
        // while they are picked; the other listeners bind port 0).
        let mut ports = free_ports(2 + cfg.nodes)?.into_iter();
        let mut port = || {
            ports
                .next()
                .ok_or_else(|| FailoverError::Config("fewer free ports than asked for".into()))
        };
        let (client, peer) = (port()?, port()?);
        let etcd_url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let mut cmd = Command::new(&cfg.etcd);
        cmd.arg("--name")
            .arg("bench")
            .arg("--data-dir")
            .arg(dir.join("etcd"))
            .arg("--listen-client-urls")
            .arg(&etcd_url)
            .arg("--advertise-client-urls")
            .arg(&etcd_url)
            .arg("--listen-peer-urls")
            .arg(&peer_url)
            .arg("--initial-advertise-peer-urls")
            .arg(&peer_url)
            .arg("--initial-cluster")
            .arg(format!("bench={peer_url}"));
        let etcd = ServerProcess::spawn("etcd", cmd, dir.join("etcd.log"))?;
        let mut cluster = LocalCluster {
            dir: dir.to_path_buf(),
            basalt: cfg.basalt.clone(),
            etcd: Some(etcd),
            nodes: Vec::new(),
        };
        cluster.wait("etcd to become healthy", |_| {
            Ok(ureq::get(&format!("{etcd_url}/health"))
                .timeout(Duration::from_secs(2))
                .call()
                .ok()
                .and_then(|r| r.into_string().ok())
                .is_some_and(|body| body.contains(r#""health":"true""#)))
        })?;
        for i in 0..cfg.nodes {
            let mut cmd = Command::new(&cfg.basalt);
            cmd.arg("server")
                .arg("--data-dir")
                .arg(dir.join(format!("n{i}")))
                .arg("--capacity")
                .arg(cfg.capacity.to_string())
                .arg("--etcd")
                .arg(&etcd_url)
                .arg("--node-name")
                .arg(format!("n{i}"))
                .arg("--peer-listen")
                .arg(format!("127.0.0.1:{}", port()?))
                // The first node to start creates it; all share it.
                .arg("--cluster-secret-file")
                .arg(dir.join("cluster-secret"))
                .args(EPHEMERAL_LISTENERS)
                .args(&cfg.server_args);
            let node =
                ServerProcess::spawn(&format!("node n{i}"), cmd, dir.join(format!("n{i}.log")))?;
            cluster.nodes.push(Some(node));
        }
        let want = cfg.nodes;
        cluster.wait("every node to join the cluster", |c| {
            let Ok(list) = c.cli_json(0, &["node", "list"]) else {
                return Ok(false);
            };
            Ok(list["nodes"]
                .as_array()
                .is_some_and(|n| n.iter().filter(|n| n["alive"] == true).count() == want))
        })?;
        Ok(cluster)
    }

    /// Polls `ok` every 200 ms until it holds, for at most
    /// `SETTLE_TIMEOUT`; fails early if a process the bench started has
    /// died.
    fn wait(
        &mut self,
        what: &str,
        mut ok: impl FnMut(&mut LocalCluster) -> Result<bool, FailoverError>,
    ) -> Result<(), FailoverError> {
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        loop {
            self.check_alive()?;
            if ok(self)? {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(FailoverError::Timeout {
                    what: what.to_string(),
                    timeout: SETTLE_TIMEOUT,
                });
            }
            thread::sleep(Duration::from_millis(200));
        }
    }

    fn check_alive(&mut self) -> Result<(), FailoverError> {
        let procs = self.etcd.iter_mut().chain(self.nodes.iter_mut().flatten());
        for p in procs {
            if let Some(status) = p.exited() {
                return Err(p.died(status).into());
            }
        }
        Ok(())
    }

    /// `basalt ARGS --data-dir <node via's dir> --output json`, parsed.
    fn cli_json(&self, via: usize, args: &[&str]) -> Result<Value, FailoverError> {
        let out = self.cli(via, args, true)?;
        serde_json::from_str(&out).map_err(|e| FailoverError::Cli {
            command: args.join(" "),
            detail: format!("unreadable JSON ({e}): {out}"),
        })
    }

    fn cli(&self, via: usize, args: &[&str], json: bool) -> Result<String, FailoverError> {
        let mut cmd = Command::new(&self.basalt);
        cmd.args(args)
            .arg("--data-dir")
            .arg(self.dir.join(format!("n{via}")));
        if json {
            cmd.args(["--output", "json"]);
        }
        let out = cmd.output().map_err(|e| FailoverError::Cli {
            command: args.join(" "),
            detail: e.to_string(),
        })?;
        if !out.status.success() {
            return Err(FailoverError::Cli {
                command: args.join(" "),
                detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The volume's NBD URI through node `via` (from its server.json).
    fn uri(&self, via: usize) -> Result<String, FailoverError> {
        let path = self.dir.join(format!("n{via}")).join("server.json");
        let text = fs::read_to_string(&path).map_err(io_err(format!("read {}", path.display())))?;
        let info: Value = serde_json::from_str(&text)
            .map_err(|e| FailoverError::Config(format!("{}: {e}", path.display())))?;
        let nbd = info["nbd"].as_str().ok_or_else(|| {
            FailoverError::Config(format!("no NBD address in {}", path.display()))
        })?;
        Ok(format!("nbd://{nbd}/{VOLUME}"))
    }

    fn kill9(&mut self, node: usize) {
        if let Some(mut p) = self.nodes.get_mut(node).and_then(Option::take) {
            p.kill9();
        }
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for p in self.nodes.iter_mut().flatten().chain(self.etcd.iter_mut()) {
            if let Err(e) = p.terminate() {
                tracing::warn!("{e}");
            }
        }
    }
}

/// `n` distinct ports on 127.0.0.1 that were free a moment ago: all are
/// bound at once, so no two picks can be the same port.
fn free_ports(n: usize) -> Result<Vec<u16>, FailoverError> {
    let held = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .map_err(io_err("find free ports on 127.0.0.1"))?;
    held.iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(io_err("find free ports on 127.0.0.1"))
}

/// Whether `v` (a `volume show` JSON) has `n` replicas, all in sync.
fn all_in_sync(v: &Value, n: usize) -> bool {
    v["replicas"]
        .as_array()
        .is_some_and(|r| r.len() == n && r.iter().all(|r| r["state"] == "in-sync"))
}

fn node_index(name: &str) -> Option<usize> {
    name.strip_prefix('n')?.parse().ok()
}

/// Runs fio on a job file in `dir`; `watch` sees the elapsed time about
/// every 100 ms and may stop fio (SIGINT, logs are still written) through
/// the flag it is given.
fn run_fio(
    cfg: &FailoverConfig,
    dir: &Path,
    name: &str,
    job: &str,
    timeout: Duration,
    watch: &mut dyn FnMut(Duration, &AtomicBool),
) -> Result<(), FailoverError> {
    let job_file = dir.join(format!("{name}.fio"));
    fs::write(&job_file, job).map_err(io_err(format!("write {}", job_file.display())))?;
    let stop = AtomicBool::new(false);
    let finished = fio_process::run(
        &cfg.fio,
        &Invocation {
            job_file: &job_file,
            hosts: &[],
            cwd: dir,
            timeout,
        },
        &stop,
        &mut |elapsed| watch(elapsed, &stop),
    )
    .map_err(|e| FailoverError::Fio(e.to_string()))?;
    // Stopped by `watch` (SIGINT): fio exits with its logs written.
    let stopped_on_purpose = stop.load(Ordering::Relaxed) && finished.status.is_some();
    if !(finished.success() || stopped_on_purpose) {
        return Err(FailoverError::Fio(format!(
            "fio ({name}) failed: {}",
            fio_process::tail(&finished.stderr, 8, 800)
        )));
    }
    Ok(())
}

/// The per-second series of the IOPS log fio wrote for job `name` in `dir`.
fn read_iops_log(dir: &Path, name: &str) -> Result<Vec<f64>, FailoverError> {
    let path = dir.join(format!("{name}_iops.1.log"));
    let text = fs::read_to_string(&path).map_err(io_err(format!("read {}", path.display())))?;
    Ok(per_second(&text))
}

fn randwrite_job(name: &str, uri: &str, cfg: &FailoverConfig, runtime: Duration) -> String {
    format!(
        "[{name}]\nioengine=nbd\nuri={uri}\nrw=randwrite\nbs=4k\niodepth={}\nsize={}\n\
         time_based=1\nruntime={}\nwrite_iops_log={name}\nlog_avg_msec=1000\n",
        cfg.iodepth,
        cfg.fill,
        runtime.as_secs().max(1)
    )
}

/// Runs both phases; see the module docs.
pub fn run(cfg: &FailoverConfig) -> Result<FailoverReport, FailoverError> {
    cfg.check()?;
    fs::create_dir_all(&cfg.work_dir)
        .map_err(io_err(format!("create {}", cfg.work_dir.display())))?;
    let work = tempfile::Builder::new()
        .prefix("basalt-failover-")
        .tempdir_in(&cfg.work_dir)
        .map_err(io_err(format!(
            "create a directory in {}",
            cfg.work_dir.display()
        )))?;
    let dir = work.path().to_path_buf();
    match run_in(cfg, &dir) {
        Ok(mut report) => {
            report.kept = cfg.keep.then(|| work.keep());
            Ok(report)
        }
        Err(e) => Err(FailoverError::Kept {
            source: Box::new(e),
            dir: work.keep(),
        }),
    }
}

fn run_in(cfg: &FailoverConfig, dir: &Path) -> Result<FailoverReport, FailoverError> {
    let mut cluster = LocalCluster::start(cfg, dir)?;
    let size = cfg.volume_size.to_string();
    let replicas = cfg.replicas.to_string();
    cluster.cli(
        0,
        &[
            "volume",
            "create",
            VOLUME,
            "--size",
            &size,
            "--replicas",
            &replicas,
        ],
        false,
    )?;
    let mut volume = Value::Null;
    cluster.wait("the volume to be placed and in sync", |c| {
        volume = c.cli_json(0, &["volume", "show", VOLUME])?;
        Ok(all_in_sync(&volume, cfg.replicas))
    })?;
    let nodes = cluster.cli_json(0, &["node", "list"])?;
    let (p, primary) = choose_victim(Victim::Primary, &volume, &nodes)?;
    let (v, killed) = choose_victim(cfg.victim, &volume, &nodes)?;
    let via = (0..cfg.nodes).find(|i| *i != p && *i != v).unwrap_or(0);
    let killed_held_replica = volume["replicas"]
        .as_array()
        .is_some_and(|r| r.iter().any(|r| r["node"] == killed.as_str()));
    let coordinator_killed = nodes["nodes"].as_array().is_some_and(|n| {
        n.iter()
            .any(|n| n["name"] == killed.as_str() && n["coordinator"] == true)
    });
    let uri = cluster.uri(via)?;
    tracing::info!(%primary, %killed, client = via, coordinator_killed, "filling the volume");
    let fill = format!(
        "[fill]\nioengine=nbd\nuri={uri}\nrw=write\nbs=1M\niodepth=8\nsize={}\n",
        cfg.fill
    );
    run_fio(
        cfg,
        dir,
        "fill",
        &fill,
        Duration::from_secs(600),
        &mut |_, _| {},
    )?;

    // Phase 1: the victim dies under the client.
    let job = randwrite_job("failover", &uri, cfg, cfg.runtime);
    let mut done = false;
    let timeout = cfg.runtime + Duration::from_secs(120);
    run_fio(cfg, dir, "failover", &job, timeout, &mut |elapsed, _| {
        if !done && elapsed >= cfg.kill_at {
            cluster.kill9(v);
            done = true;
        }
    })?;
    let failover_iops = read_iops_log(dir, "failover")?;
    let kill_at_s = cfg.kill_at.as_secs();
    let outage = outage(&failover_iops, kill_at_s as usize).ok_or_else(|| {
        FailoverError::Fio(format!("fio's IOPS log is too short: {failover_iops:?}"))
    })?;

    // Phase 2: the killed node is removed; its replica is rebuilt elsewhere.
    let rebuild = if killed_held_replica {
        Some(rebuild_phase(cfg, dir, &cluster, &uri, via, &killed)?)
    } else {
        None
    };
    Ok(FailoverReport {
        nodes: cfg.nodes,
        replicas: cfg.replicas,
        iodepth: cfg.iodepth,
        fill_bytes: cfg.fill,
        victim: cfg.victim,
        killed,
        killed_held_replica,
        primary,
        coordinator_killed,
        client_node: format!("n{via}"),
        kill_at_s,
        outage,
        failover_iops,
        rebuild,
        kept: None,
    })
}

/// Phase 2: `basalt node remove` of `killed` while fio writes through node
/// `via`, timed until the volume has all its replicas in sync elsewhere.
fn rebuild_phase(
    cfg: &FailoverConfig,
    dir: &Path,
    cluster: &LocalCluster,
    uri: &str,
    via: usize,
    killed: &str,
) -> Result<Rebuild, FailoverError> {
    let job = randwrite_job(
        "rebuild",
        uri,
        cfg,
        REMOVE_AFTER + cfg.rebuild_timeout + Duration::from_secs(10),
    );
    let mut removed_at: Option<Duration> = None;
    let mut rebuilt_at: Option<Duration> = None;
    let mut failure: Option<FailoverError> = None;
    let mut last_poll = Duration::ZERO;
    let timeout = REMOVE_AFTER + cfg.rebuild_timeout + Duration::from_secs(120);
    run_fio(cfg, dir, "rebuild", &job, timeout, &mut |elapsed, stop| {
        if failure.is_some() || rebuilt_at.is_some() {
            return;
        }
        match removed_at {
            None if elapsed >= REMOVE_AFTER => {
                match cluster.cli(via, &["node", "remove", killed], false) {
                    Ok(_) => removed_at = Some(elapsed),
                    Err(e) => {
                        failure = Some(e);
                        stop.store(true, Ordering::Relaxed);
                    }
                }
            }
            Some(at) if elapsed >= last_poll + Duration::from_millis(500) => {
                last_poll = elapsed;
                if let Ok(v) = cluster.cli_json(via, &["volume", "show", VOLUME]) {
                    let placed_elsewhere = v["replicas"]
                        .as_array()
                        .is_some_and(|r| r.iter().all(|r| r["node"] != killed));
                    if placed_elsewhere && all_in_sync(&v, cfg.replicas) {
                        rebuilt_at = Some(elapsed);
                        stop.store(true, Ordering::Relaxed);
                    }
                }
                if rebuilt_at.is_none() && elapsed > at + cfg.rebuild_timeout {
                    failure = Some(FailoverError::Timeout {
                        what: "the rebuild".into(),
                        timeout: cfg.rebuild_timeout,
                    });
                    stop.store(true, Ordering::Relaxed);
                }
            }
            _ => {}
        }
    })?;
    if let Some(e) = failure {
        return Err(e);
    }
    let (Some(removed), Some(rebuilt)) = (removed_at, rebuilt_at) else {
        return Err(FailoverError::Timeout {
            what: "the rebuild (fio ended first)".into(),
            timeout: cfg.rebuild_timeout,
        });
    };
    let rebuild_iops = read_iops_log(dir, "rebuild")?;
    let rebuild_s = (rebuilt - removed).as_secs_f64();
    let from = removed.as_secs_f64().ceil() as usize;
    let to = (rebuilt.as_secs_f64().floor() as usize).min(rebuild_iops.len());
    let rebuild_client_iops = rebuild_iops
        .get(from..to)
        .and_then(mean)
        .or_else(|| rebuild_iops.get(from.saturating_sub(1)).copied())
        .unwrap_or(0.0);
    Ok(Rebuild {
        rebuild_s,
        rebuild_mib_per_s: cfg.fill as f64 / (1u64 << 20) as f64 / rebuild_s.max(1e-3),
        rebuild_client_iops,
        rebuild_iops,
        removed_at_s: removed.as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_second_fills_silent_seconds_with_zero() {
        let log = "1000, 500, 1, 4096, 0\n2001, 600, 1, 4096, 0\n4000, 700, 1, 4096, 0\nbad line\n";
        assert_eq!(per_second(log), vec![500.0, 600.0, 0.0, 700.0]);
        assert!(per_second("").is_empty());
        // A 0 ms line (fio's first when averaging) has no second of its own.
        assert_eq!(per_second("0, 9, 1, 4096\n1000, 5, 1, 4096\n"), vec![5.0]);
    }

    #[test]
    fn outage_counts_seconds_below_a_tenth_of_the_baseline() {
        // Seconds 1..=5 before the kill (the first is skipped), then 3 s
        // of outage (one partial second above 10% does not count).
        let s = [
            50.0, 100.0, 100.0, 100.0, 100.0, 40.0, 0.0, 5.0, 0.0, 90.0, 100.0, 110.0,
        ];
        let o = outage(&s, 5).unwrap();
        assert_eq!(o.baseline_iops, 100.0);
        assert_eq!(o.outage_s, 3);
        // The last third of the 7 s after the kill: 2 s.
        assert_eq!(o.recovered_iops, 105.0);
        assert_eq!(outage(&s, 1), None);
        assert_eq!(outage(&s[..5], 5), None);
    }

    #[test]
    fn victims_are_the_primary_the_coordinator_or_another_secondary() {
        let volume = serde_json::json!({"replicas": [
            {"node": "n2", "primary": true},
            {"node": "n0", "primary": false},
            {"node": "n1", "primary": false},
        ]});
        let nodes = |coordinator: &str| {
            let list = ["n0", "n1", "n2", "n3"]
                .map(|n| serde_json::json!({"name": n, "coordinator": n == coordinator}));
            serde_json::json!({ "nodes": list })
        };
        let pick = |v, c: &str| choose_victim(v, &volume, &nodes(c)).map_err(|e| e.to_string());
        assert_eq!(pick(Victim::Primary, "n0"), Ok((2, "n2".into())));
        assert_eq!(pick(Victim::Coordinator, "n0"), Ok((0, "n0".into())));
        // The coordinator may hold no replica at all.
        assert_eq!(pick(Victim::Coordinator, "n3"), Ok((3, "n3".into())));
        assert_eq!(pick(Victim::Secondary, "n0"), Ok((1, "n1".into())));
        assert_eq!(pick(Victim::Secondary, "n3"), Ok((0, "n0".into())));
        let e = pick(Victim::Coordinator, "n2").unwrap_err();
        assert!(e.contains("holds the volume's primary"), "{e}");
        let lone = serde_json::json!({"replicas": [
            {"node": "n2", "primary": true}, {"node": "n0", "primary": false},
        ]});
        let e = choose_victim(Victim::Secondary, &lone, &nodes("n0")).unwrap_err();
        assert!(e.to_string().contains("on the coordinator's node"), "{e}");
    }

    #[test]
    fn free_ports_are_distinct() {
        let mut p = free_ports(16).unwrap();
        p.sort_unstable();
        p.dedup();
        assert_eq!(p.len(), 16);
    }

    #[test]
    fn refuses_configurations_it_cannot_measure() {
        let cfg = FailoverConfig {
            basalt: "basalt".into(),
            // Any existing file passes the etcd check; run() refuses the
            // configurations before it starts anything.
            etcd: "/bin/sh".into(),
            fio: Fio {
                path: "fio".into(),
                version: "fio-3.33".into(),
            },
            work_dir: std::env::temp_dir(),
            nodes: 3,
            replicas: 3,
            volume_size: 1 << 30,
            fill: 1 << 20,
            iodepth: 16,
            victim: Victim::Primary,
            kill_at: Duration::from_secs(10),
            runtime: Duration::from_secs(40),
            rebuild_timeout: Duration::from_secs(60),
            capacity: 4 << 30,
            server_args: vec![],
            keep: false,
        };
        assert!(matches!(run(&cfg), Err(FailoverError::Config(_))));
        let early = FailoverConfig {
            nodes: 4,
            kill_at: Duration::from_secs(1),
            ..cfg.clone()
        };
        assert!(matches!(run(&early), Err(FailoverError::Config(_))));
        let overfull = FailoverConfig {
            nodes: 4,
            fill: 2 << 30,
            ..cfg.clone()
        };
        assert!(matches!(run(&overfull), Err(FailoverError::Config(_))));
        let no_etcd = FailoverConfig {
            nodes: 4,
            etcd: "/nonexistent/etcd".into(),
            ..cfg
        };
        assert!(
            matches!(no_etcd.check(), Err(FailoverError::Config(m)) if m.contains("etcd-server"))
        );
    }
}
