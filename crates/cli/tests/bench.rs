//! `basalt bench`: short `--quick` runs of the profiles against an
//! ephemeral Basalt server, a running one, a file, and fio's client/server
//! mode on loopback; every output file must exist and parse. Timing
//! figures are never asserted — only that they were measured.

mod common;

use basalt_bench::model::{CellOutcome, RunSummary, SCHEMA_VERSION};
use common::*;
use serde_json::Value;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Generous: a run is a few seconds of fio, plus starting servers.
const BENCH_TIMEOUT: Duration = Duration::from_secs(240);

fn bench(dir: &Path, args: &[&str]) -> CmdOutput {
    let mut cmd = Command::new(bin());
    cmd.current_dir(dir)
        .arg("bench")
        .args(args)
        .env_remove("BASALT_DATA_DIR")
        .env_remove("BASALT_URL")
        .env_remove("BASALT_TOKEN");
    run_cmd(&mut cmd, BENCH_TIMEOUT)
}

/// Reads summary.json, checks that it round-trips through the model, and
/// checks every output file: the raw fio JSON of each measured cell (and
/// its job file), results.md, report.html and the SVG charts.
#[track_caller]
fn check_outputs(out: &Path) -> RunSummary {
    let text = std::fs::read_to_string(out.join("summary.json"))
        .unwrap_or_else(|e| panic!("{}/summary.json: {e}", out.display()));
    let summary: RunSummary = serde_json::from_str(&text).expect("summary.json parses");
    assert_eq!(summary.schema_version, SCHEMA_VERSION);
    let again: RunSummary =
        serde_json::from_str(&serde_json::to_string(&summary).unwrap()).unwrap();
    assert_eq!(again, summary, "summary.json round-trips");
    assert!(!summary.cells.is_empty());
    assert!(summary.versions.contains_key("fio"));
    assert!(summary.versions.contains_key("basalt"));
    assert!(summary.machine.cpus > 0);
    for cell in &summary.cells {
        if let CellOutcome::Ok { metrics } = &cell.outcome {
            let raw = out.join(&cell.raw_output);
            let raw_text =
                std::fs::read_to_string(&raw).unwrap_or_else(|e| panic!("{}: {e}", raw.display()));
            let v: Value = serde_json::from_str(&raw_text)
                .unwrap_or_else(|e| panic!("{} is not JSON: {e}", raw.display()));
            assert!(v.get("fio version").is_some(), "{}", raw.display());
            assert!(
                raw.with_extension("fio").exists(),
                "job file of {}",
                raw.display()
            );
            let ios: u64 = [&metrics.read, &metrics.write]
                .iter()
                .filter_map(|d| d.as_ref().map(|d| d.ios))
                .sum();
            assert!(ios > 0, "a measured cell did I/O: {cell:?}");
        }
    }
    for file in ["results.md", "report.html"] {
        let path = out.join(file);
        let len = std::fs::metadata(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .len();
        assert!(len > 0, "{} is empty", path.display());
    }
    let svgs: Vec<PathBuf> = std::fs::read_dir(out.join("charts"))
        .expect("charts/")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "svg"))
        .collect();
    assert!(!svgs.is_empty(), "no SVG charts in {}", out.display());
    for svg in svgs {
        let text = std::fs::read_to_string(&svg).unwrap();
        assert!(
            text.contains("<svg") && text.trim_end().ends_with("</svg>"),
            "{}",
            svg.display()
        );
    }
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("<svg"), "report.html embeds its charts");
    summary
}

fn targets_of(summary: &RunSummary) -> Vec<&str> {
    summary.cells.iter().map(|c| c.target.as_str()).collect()
}

#[test]
fn matrix_quick_on_ephemeral_basalt_and_a_file() {
    require_tool("fio");
    let dir = Scratch::new();
    let out = dir.path("matrix");
    let run = bench(
        &dir.0,
        &[
            "run",
            "matrix",
            "--quick",
            "--runtime",
            "1",
            "--rw",
            "randread,randwrite",
            "--bs",
            "4k",
            "--numjobs",
            "1",
            "--size",
            "128M",
            "--compare",
            "basalt,file",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    let stdout = run.ok();
    assert!(stdout.contains("results.md"), "{}", run.describe());
    assert!(
        run.stderr.contains("[1/4]"),
        "progress lines:\n{}",
        run.stderr
    );
    assert!(run.stderr.contains("ETA"), "{}", run.stderr);
    let summary = check_outputs(&out);
    assert_eq!(summary.profile, "matrix");
    assert_eq!(summary.targets, ["basalt", "file"]);
    // Interleaved by cell: each cell on every target in turn.
    assert_eq!(targets_of(&summary), ["basalt", "file", "basalt", "file"]);
    assert_eq!(summary.cells[0].workload.rw, "randread");
    assert_eq!(summary.cells[2].workload.rw, "randwrite");
    for cell in &summary.cells {
        assert!(matches!(cell.outcome, CellOutcome::Ok { .. }), "{cell:?}");
        // CPU only for the server the bench started.
        assert_eq!(
            cell.server_cpu_seconds.is_some(),
            cell.target == "basalt",
            "{cell:?}"
        );
    }

    // `report` re-renders into another directory, and merges two runs.
    let again = dir.path("again");
    bench(
        &dir.0,
        &[
            "report",
            out.to_str().unwrap(),
            "--out",
            again.to_str().unwrap(),
        ],
    )
    .ok();
    assert!(again.join("results.md").exists() && again.join("report.html").exists());
    let merged = dir.path("merged");
    bench(
        &dir.0,
        &[
            "report",
            out.to_str().unwrap(),
            out.to_str().unwrap(),
            "--out",
            merged.to_str().unwrap(),
        ],
    )
    .ok();
    assert!(merged.join("report.html").exists());
}

#[test]
fn db_latency_and_fio_samples_quick() {
    require_tool("fio");
    let dir = Scratch::new();
    let out = dir.path("db");
    bench(
        &dir.0,
        &[
            "run",
            "db-latency",
            "--quick",
            "--runtime",
            "1",
            "--size",
            "256M",
            "--compare",
            "basalt,file",
            "--out",
            out.to_str().unwrap(),
        ],
    )
    .ok();
    let summary = check_outputs(&out);
    assert_eq!(summary.cells.len(), 2);
    for cell in &summary.cells {
        assert_eq!(cell.workload.fsync, Some(1));
        let CellOutcome::Ok { metrics } = &cell.outcome else {
            panic!("{cell:?}")
        };
        let sync = metrics.sync.as_ref().expect("fsync latency measured");
        assert!(
            sync.p99_us > 0.0 && sync.p99_9_us >= sync.p99_us,
            "{cell:?}"
        );
        assert!(metrics.write.is_some());
    }

    // fio-samples: two samples per target (16 MiB each: the job is capped
    // at the target size), and a bootstrap estimate per target.
    let out = dir.path("samples");
    bench(
        &dir.0,
        &[
            "run",
            "fio-samples",
            "--quick",
            "--samples",
            "2",
            "--size",
            "16M",
            "--compare",
            "basalt,file",
            "--out",
            out.to_str().unwrap(),
        ],
    )
    .ok();
    let summary = check_outputs(&out);
    assert_eq!(summary.cells.len(), 4);
    assert_eq!(summary.cells[1].sample, Some(0));
    assert_eq!(summary.cells[2].sample, Some(1));
    for target in ["basalt", "file"] {
        let e = summary
            .estimates
            .iter()
            .find(|e| e.target == target && e.metric == "write_iops")
            .unwrap_or_else(|| {
                panic!(
                    "no write_iops estimate for {target}: {:?}",
                    summary.estimates
                )
            });
        assert_eq!(e.estimate.samples, 2);
        assert_eq!(e.estimate.resamples, 10_000);
        assert!(e.estimate.ci_low <= e.estimate.median && e.estimate.median <= e.estimate.ci_high);
    }
    let job = std::fs::read_to_string(out.join("raw/file/randwrite-4k-j1-qd1-s000.fio")).unwrap();
    assert!(job.contains("ioengine=sync\n"), "{job}");
    let job = std::fs::read_to_string(out.join("raw/basalt/randwrite-4k-j1-qd1-s000.fio")).unwrap();
    assert!(
        job.contains("ioengine=nbd\n") && job.contains("iodepth=1\n"),
        "{job}"
    );
}

#[test]
fn peers_qemu_nbd_and_nbdkit() {
    require_tool("fio");
    require_tool("qemu-nbd");
    require_tool("nbdkit");
    let dir = Scratch::new();
    let out = dir.path("peers");
    bench(
        &dir.0,
        &[
            "run",
            "db-latency",
            "--quick",
            "--runtime",
            "1",
            "--size",
            "64M",
            "--compare",
            "qemu-nbd,nbdkit",
            "--out",
            out.to_str().unwrap(),
        ],
    )
    .ok();
    let summary = check_outputs(&out);
    assert_eq!(targets_of(&summary), ["qemu-nbd", "nbdkit"]);
    for cell in &summary.cells {
        assert!(matches!(cell.outcome, CellOutcome::Ok { .. }), "{cell:?}");
        assert!(
            cell.server_cpu_seconds.is_some(),
            "CPU of the peer: {cell:?}"
        );
    }
    assert!(
        summary.versions["qemu-nbd"].starts_with("qemu-nbd "),
        "{:?}",
        summary.versions
    );
    assert!(
        summary.versions["nbdkit"].starts_with("nbdkit "),
        "{:?}",
        summary.versions
    );
}

#[test]
fn a_running_server_gets_a_volume_that_is_deleted_afterwards() {
    require_tool("fio");
    let server = Server::start("2G");
    let dir = Scratch::new();
    let out = dir.path("running");
    bench(
        &dir.0,
        &[
            "--data-dir",
            server.data_dir().to_str().unwrap(),
            "run",
            "matrix",
            "--quick",
            "--runtime",
            "1",
            "--rw",
            "randwrite",
            "--bs",
            "4k",
            "--numjobs",
            "1",
            "--size",
            "128M",
            "--precondition",
            "--out",
            out.to_str().unwrap(),
        ],
    )
    .ok();
    let summary = check_outputs(&out);
    assert_eq!(summary.targets, ["basalt"]);
    let uri = summary.parameters["targets"]["basalt"]["uri"]
        .as_str()
        .unwrap();
    assert!(
        uri.starts_with(&format!("nbd://{}/bench-", server.nbd_addr())),
        "{uri}"
    );
    // Not a server the bench started: no CPU accounting.
    assert!(summary.cells[0].server_cpu_seconds.is_none());
    assert_eq!(summary.parameters["precondition"], Value::Bool(true));
    let fill: Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("raw/basalt/precondition.json")).unwrap(),
    )
    .unwrap();
    let written = fill["jobs"][0]["write"]["io_bytes"].as_u64().unwrap();
    assert_eq!(written, 128 << 20, "the fill wrote the whole volume once");
    let list = server.cli_json(&["volume", "list"]);
    assert!(
        volume_list(&list).is_empty(),
        "the bench's volume was deleted: {list}"
    );
}

#[test]
fn a_failed_cell_is_recorded_and_the_run_continues() {
    let fio = require_tool("fio");
    let dir = Scratch::new();
    // A fio that fails every randwrite job, and runs the others.
    let fake = dir.path("fake-fio");
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\nfor a in \"$@\"; do case \"$a\" in *.fio) \
             if grep -q '^rw=randwrite' \"$a\"; then echo 'fio: simulated failure' >&2; exit 1; fi;; \
             esac; done\nexec {} \"$@\"\n",
            fio.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = dir.path("failed");
    let run = bench(
        &dir.0,
        &[
            "run",
            "matrix",
            "--quick",
            "--runtime",
            "1",
            "--rw",
            "randwrite,randread",
            "--bs",
            "4k",
            "--numjobs",
            "1",
            "--size",
            "64M",
            "--target",
            "file",
            "--fio",
            fake.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
    );
    // Progress lines, then the error as the last line.
    assert_eq!(run.code(), Some(1), "{}", run.describe());
    let last = run.stderr.trim_end().lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error: 1 of 2 cells failed"),
        "{}",
        run.describe()
    );
    let summary = check_outputs(&out);
    let failed: Vec<_> = summary
        .cells
        .iter()
        .filter_map(|c| match &c.outcome {
            CellOutcome::Failed { error } => Some((c.workload.rw.as_str(), error.as_str())),
            CellOutcome::Ok { .. } => None,
        })
        .collect();
    assert_eq!(failed.len(), 1, "{:?}", summary.cells);
    assert_eq!(failed[0].0, "randwrite");
    assert!(failed[0].1.contains("simulated failure"), "{}", failed[0].1);
    let md = std::fs::read_to_string(out.join("results.md")).unwrap();
    assert!(md.contains("FAILED"), "results.md shows the failed cell");
}

/// A free TCP port on loopback.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn distributed_load_through_fio_servers_on_loopback() {
    let fio = require_tool("fio");
    let dir = Scratch::new();
    let ports = [free_port(), free_port()];
    let _servers: Vec<Background> = ports
        .iter()
        .map(|p| {
            let mut cmd = Command::new(&fio);
            cmd.arg(format!("--server=127.0.0.1,{p}"))
                .current_dir(&dir.0);
            Background::spawn(cmd)
        })
        .collect();
    for p in ports {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", p)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "fio --server on {p} not listening"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let hosts = format!("127.0.0.1:{},127.0.0.1:{}", ports[0], ports[1]);
    let out = dir.path("hosts");
    bench(
        &dir.0,
        &[
            "run",
            "matrix",
            "--quick",
            "--runtime",
            "1",
            "--rw",
            "randread",
            "--bs",
            "4k",
            "--numjobs",
            "1",
            "--size",
            "128M",
            "--compare",
            "basalt,file",
            "--hosts",
            &hosts,
            "--out",
            out.to_str().unwrap(),
        ],
    )
    .ok();
    let summary = check_outputs(&out);
    assert_eq!(summary.hosts.len(), 2);
    for cell in &summary.cells {
        assert!(matches!(cell.outcome, CellOutcome::Ok { .. }), "{cell:?}");
        let raw: Value =
            serde_json::from_str(&std::fs::read_to_string(out.join(&cell.raw_output)).unwrap())
                .unwrap();
        let clients = raw["client_stats"]
            .as_array()
            .expect("client/server output");
        let names: Vec<&str> = clients
            .iter()
            .filter_map(|c| c["jobname"].as_str())
            .collect();
        assert_eq!(names.len(), 3, "two hosts and fio's sum: {names:?}");
        assert!(names.contains(&"All clients"));
        // Aggregated across hosts: our I/O count is fio's "All clients" one.
        let all = clients
            .iter()
            .find(|c| c["jobname"] == "All clients")
            .unwrap();
        let CellOutcome::Ok { metrics } = &cell.outcome else {
            unreachable!()
        };
        assert_eq!(
            metrics.read.as_ref().unwrap().ios,
            all["read"]["total_ios"].as_u64().unwrap()
        );
    }
}

#[test]
fn usage_errors_are_one_line_with_the_valid_choices() {
    let dir = Scratch::new();
    let list = bench(&dir.0, &["list"]);
    for profile in [
        "matrix",
        "sweep",
        "db-latency",
        "fio-samples",
        "parallel",
        "datapath",
        "precondition",
    ] {
        assert!(list.ok().contains(profile), "{}", list.describe());
    }
    let json: Value = serde_json::from_str(bench(&dir.0, &["list", "-o", "json"]).ok()).unwrap();
    assert_eq!(json.as_array().unwrap().len(), 7);

    let line = bench(&dir.0, &["run", "nosuch"]).cli_error(1);
    assert!(
        line.contains("matrix, sweep, db-latency, fio-samples, parallel, datapath, precondition"),
        "{line}"
    );
    let line = bench(&dir.0, &["run", "db-latency", "--bs", "4k"]).cli_error(1);
    assert!(
        line.contains("it takes --runtime, --precondition"),
        "{line}"
    );
    let line = bench(&dir.0, &["run", "sweep", "--bs", "3k"]).cli_error(1);
    assert!(line.contains("valid: 512, 1k, 2k, 4k"), "{line}");
    let line = bench(&dir.0, &["run", "matrix", "--target", "nosuch"]).cli_error(1);
    assert!(
        line.contains("basalt, basalt-iscsi, qemu-nbd, qemu-nbd-shared, nbdkit, tgt, file, nbd://"),
        "{line}"
    );
    let line = bench(&dir.0, &["run", "matrix", "--fio", "/nonexistent/fio"]).cli_error(1);
    assert!(line.contains("apt-get install fio"), "{line}");

    // An unreachable target: one line, nothing measured.
    require_tool("fio");
    let port = free_port();
    let out = dir.path("unreachable");
    let run = bench(
        &dir.0,
        &[
            "run",
            "db-latency",
            "--target",
            &format!("nbd://127.0.0.1:{port}/x"),
            "--out",
            out.to_str().unwrap(),
        ],
    );
    let line = run.cli_error(1);
    assert!(line.contains("unreachable"), "{line}");
    assert!(
        !out.exists(),
        "a run that cannot start leaves no output directory"
    );
    // A remote load host cannot reach targets the bench serves on loopback.
    let line = bench(
        &dir.0,
        &[
            "run",
            "db-latency",
            "--target",
            "file",
            "--hosts",
            "192.0.2.1",
        ],
    )
    .cli_error(1);
    assert!(line.contains("cannot reach target file"), "{line}");
}

#[test]
fn floor_measures_each_replica_count_and_refuses_nonsense() {
    let dir = Scratch::new();
    let work = dir.path("work");
    std::fs::create_dir_all(&work).unwrap();
    let run = bench(
        &dir.0,
        &[
            "floor",
            "--replicas",
            "1,3",
            "--writes",
            "50",
            "--rounds",
            "1",
            "--size",
            "1M",
            "--work-dir",
            work.to_str().unwrap(),
            "-o",
            "json",
        ],
    );
    let rows: Value = serde_json::from_str(run.ok()).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 2, "{}", run.describe());
    for (row, replicas) in rows.iter().zip([1, 3]) {
        assert_eq!(row["replicas"], replicas);
        assert!(row["mean_us"].as_f64().unwrap() > 0.0, "{row}");
    }
    assert_eq!(rows[0]["ratio_to_first"], 1.0);
    assert_eq!(
        std::fs::read_dir(&work).unwrap().count(),
        0,
        "the replicas' files are removed"
    );

    let line = bench(&dir.0, &["floor", "--replicas", "0"]).cli_error(1);
    assert!(line.contains("from 1 to 5"), "{line}");
    let line = bench(&dir.0, &["floor", "--size", "1x"]).cli_error(1);
    assert!(line.contains("--size 1x"), "{line}");
    let line = bench(
        &dir.0,
        &["floor", "--work-dir", "/nonexistent/dir", "--writes", "5"],
    )
    .cli_error(1);
    assert!(line.contains("cannot create the floor's files"), "{line}");
}

/// `bench failover` on a small volume: the primary dies under fio and its
/// node is removed; the report has an outage that ended, a rebuild that
/// finished, and per-second series for both phases. The cluster's
/// directory is gone afterwards.
#[test]
fn failover_kills_the_primary_and_times_the_rebuild() {
    require_tool("fio");
    let etcd = std::env::var("BASALT_ETCD_BIN").unwrap_or_else(|_| "etcd".into());
    if !etcd.contains('/') {
        require_tool(&etcd);
    }
    let dir = Scratch::new();
    let work = dir.path("work");
    std::fs::create_dir_all(&work).unwrap();
    let run = bench(
        &dir.0,
        &[
            "failover",
            "--size",
            "128M",
            "--fill",
            "32M",
            "--kill-at",
            "5",
            "--runtime",
            "16",
            "--rebuild-timeout",
            "120",
            "--work-dir",
            work.to_str().unwrap(),
            "--etcd",
            &etcd,
            "-o",
            "json",
        ],
    );
    let r: Value = serde_json::from_str(run.ok()).unwrap();
    let failover = r["failover_iops"].as_array().unwrap();
    assert!(failover.len() >= 15, "{r:#}");
    assert!(r["baseline_iops"].as_f64().unwrap() > 0.0, "{r:#}");
    // I/O resumed: the last seconds carry writes again.
    assert!(r["recovered_iops"].as_f64().unwrap() > 0.0, "{r:#}");
    let outage = r["outage_s"].as_u64().unwrap();
    assert!(outage < 11, "the outage never ended: {r:#}");
    assert!(r["rebuild_s"].as_f64().unwrap() > 0.0, "{r:#}");
    assert!(r["rebuild_mib_per_s"].as_f64().unwrap() > 0.0, "{r:#}");
    assert!(!r["rebuild_iops"].as_array().unwrap().is_empty(), "{r:#}");
    assert_eq!(r["replicas"], 3);
    assert_ne!(r["primary"], r["client_node"]);
    assert_eq!(r["victim"], "primary");
    assert_eq!(r["killed"], r["primary"]);
    assert_eq!(
        std::fs::read_dir(&work).unwrap().count(),
        0,
        "the cluster's directory is removed"
    );

    let line = bench(&dir.0, &["failover", "--nodes", "3"]).cli_error(1);
    assert!(line.contains("a node more than the replicas"), "{line}");
    let line = bench(&dir.0, &["failover", "--fill", "1x"]).cli_error(1);
    assert!(line.contains("--fill 1x"), "{line}");
    let line = bench(&dir.0, &["failover", "--etcd", "/nonexistent/etcd"]).cli_error(1);
    assert!(line.contains("apt-get install etcd-server"), "{line}");
}
