//! QoS through the CLI and fio's nbd engine: limits set online with
//! Cinder's key names hold for IOPS and bandwidth (on event loops and on
//! lanes), an unlimited volume served at the same time is not slowed, bad
//! specs are one-line errors, and the throttled time shows in `volume show`
//! and /metrics. Bounds are generous (the machine is shared with the
//! server); BENCHMARKS.md has the precise figures.

mod common;

use common::*;
use serde_json::Value;
use std::process::Command;

/// Runs fio (JSON output) and returns its jobs.
fn fio(dir: &Scratch, tag: &str, args: &[&str]) -> Vec<Value> {
    let json = dir.path(&format!("{tag}.json"));
    let mut cmd = Command::new(require_tool("fio"));
    cmd.current_dir(&dir.0)
        .args(args)
        .arg("--output-format=json")
        .arg(format!("--output={}", json.display()));
    let out = run_cmd(&mut cmd, CMD_TIMEOUT);
    let text = std::fs::read_to_string(&json).unwrap_or_default();
    assert!(
        out.status.success(),
        "fio {tag}:\n{}\n{text}",
        out.describe()
    );
    let v: Value = serde_json::from_str(&text).expect("fio JSON");
    v["jobs"].as_array().expect("jobs").clone()
}

fn job(uri: &str, name: &str, rw: &str, bs: &str, depth: u32) -> Vec<String> {
    [
        format!("--name={name}"),
        "--ioengine=nbd".into(),
        format!("--uri={uri}"),
        format!("--rw={rw}"),
        format!("--bs={bs}"),
        format!("--iodepth={depth}"),
        "--size=64M".into(),
        "--runtime=4".into(),
        "--time_based".into(),
        "--ramp_time=1".into(),
    ]
    .to_vec()
}

fn iops(job: &Value, dir: &str) -> f64 {
    job[dir]["iops"].as_f64().expect("iops")
}

fn assert_near(what: &str, got: f64, want: f64) {
    assert!(
        (got - want).abs() <= want * 0.15,
        "{what}: {got:.0}, want {want:.0} ± 15%"
    );
}

fn limits_hold(server_args: &[&str]) {
    require_tool("fio");
    let s = Server::start_with("512M", server_args);
    s.create_volume("slow", "128M");
    s.create_volume("fast", "128M");
    let dir = Scratch::new();

    s.cli(&["volume", "set-qos", "slow", "total_iops_sec=400"])
        .ok();
    let shown = s.cli_json(&["volume", "show", "slow"]);
    assert_eq!(shown["qos"]["total_iops_sec"], 400, "{shown}");

    // The limited volume at 400 IOPS while the unlimited one, in the same
    // fio run, goes as fast as the disk lets it.
    let mut args: Vec<String> = job(&s.uri("slow"), "slow", "randread", "4k", 8);
    args.extend(job(&s.uri("fast"), "fast", "randread", "4k", 8));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let jobs = fio(&dir, "iops", &args);
    assert_near("total_iops_sec=400", iops(&jobs[0], "read"), 400.0);
    let fast = iops(&jobs[1], "read");
    assert!(
        fast > 4000.0,
        "the unlimited volume was slowed to {fast:.0} IOPS"
    );

    // Bandwidth, by direction, changed online: writes at 8 MiB/s.
    s.cli(&["volume", "set-qos", "slow", "write_bytes_sec=8M"])
        .ok();
    let args = job(&s.uri("slow"), "bw", "randwrite", "64k", 4);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let jobs = fio(&dir, "bw", &args);
    let bw = jobs[0]["write"]["bw_bytes"].as_f64().expect("bw");
    assert_near("write_bytes_sec=8M", bw, 8.0 * 1048576.0);

    let shown = s.cli(&["volume", "show", "slow"]);
    assert!(
        shown.ok().contains("qos:") && shown.ok().contains("write_bytes_sec=8388608"),
        "{}",
        shown.describe()
    );
    let shown = s.cli_json(&["volume", "show", "slow"]);
    assert!(
        shown["throttled_seconds"].as_f64().unwrap_or(0.0) > 0.5,
        "{shown}"
    );

    // Removed: unlimited again.
    s.cli(&["volume", "set-qos", "slow", "none"]).ok();
    let shown = s.cli_json(&["volume", "show", "slow"]);
    assert!(shown.get("qos").is_none(), "{shown}");
}

#[test]
fn qos_limits_hold_on_event_loops() {
    limits_hold(&[]);
}

#[test]
fn qos_limits_hold_on_lanes() {
    limits_hold(&["--event-loops", "0"]);
}

#[test]
fn bad_specs_are_one_line_errors_and_metrics_count_throttling() {
    let s = Server::start("128M");
    s.create_volume("v", "64M");
    for (spec, says) in [
        ("iops=5", "unknown QoS key"),
        ("total_iops_sec=0", "not a positive integer"),
        (
            "total_iops_sec=100,total_iops_sec_max=10",
            "burst limit below",
        ),
        ("total_iops_sec", "KEY=VALUE"),
    ] {
        let err = s.cli(&["volume", "set-qos", "v", spec]).cli_error(1);
        assert!(err.contains(says), "{spec}: {err}");
    }
    let err = s
        .cli(&["volume", "set-qos", "nope", "total_iops_sec=5"])
        .cli_error(1);
    assert!(err.contains("nope"), "{err}");
    // Through the API as well: 400 with the reason.
    let out = Command::new("curl")
        .args(["-s", "-X", "PUT", "-H"])
        .arg(format!("Authorization: Bearer {}", s.token()))
        .args([
            "-H",
            "Content-Type: application/json",
            "-d",
            r#"{"qos":{"iops":5}}"#,
        ])
        .arg(format!("{}/api/v1/volumes/v/qos", s.api_url()))
        .output()
        .expect("curl");
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(body.contains("unknown QoS key"), "{body}");

    s.cli(&["volume", "set-qos", "v", "write_iops_sec=50"]).ok();
    qemu_io(&s.uri("v"), &["write -P 1 0 4k"; 60]).ok();
    let out = Command::new("curl")
        .args(["-s", "-H"])
        .arg(format!("Authorization: Bearer {}", s.token()))
        .arg(format!("{}/metrics", s.api_url()))
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("basalt_volume_qos_throttled_seconds_total{volume=\"v\""))
        .unwrap_or_else(|| panic!("no throttled metric:\n{text}"));
    let secs: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(secs > 0.5, "{line}");
}
