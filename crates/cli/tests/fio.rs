//! fio's nbd engine: concurrent multi-connection random I/O with verification.

mod common;

use common::*;
use serde_json::Value;

/// Runs fio with JSON output to a file; checks its exit code and that no job reports an error.
#[track_caller]
fn fio(dir: &Scratch, tag: &str, args: &[&str]) -> Value {
    let (out, json) = run_fio(dir, tag, args);
    let text = std::fs::read_to_string(&json).unwrap_or_default();
    assert!(
        out.status.success(),
        "fio {tag} failed:\n{}\n--- json ---\n{text}",
        out.describe()
    );
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!(
            "fio {tag}: output is not JSON ({e}):\n{text}\n{}",
            out.describe()
        )
    });
    let jobs = v["jobs"]
        .as_array()
        .unwrap_or_else(|| panic!("fio {tag}: no jobs: {text}"));
    assert_eq!(jobs.len(), 4, "fio {tag}: expected 4 jobs (numjobs=4)");
    for j in jobs {
        assert_eq!(j["error"].as_u64(), Some(0), "fio {tag}: job error: {j}");
    }
    v
}

/// Runs fio in the scratch dir (fio drops verify state files in its cwd otherwise).
fn run_fio(dir: &Scratch, tag: &str, args: &[&str]) -> (CmdOutput, std::path::PathBuf) {
    let json = dir.path(&format!("{tag}.json"));
    let mut cmd = std::process::Command::new(require_tool("fio"));
    cmd.current_dir(&dir.0)
        .args(args)
        .arg("--verify_state_save=0")
        .arg("--output-format=json")
        .arg(format!("--output={}", json.display()));
    (run_cmd(&mut cmd, CMD_TIMEOUT), json)
}

fn total(v: &Value, dir: &str) -> u64 {
    v["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j[dir]["total_ios"].as_u64().unwrap())
        .sum()
}

#[test]
fn fio_multi_conn_randrw_verified() {
    require_tool("fio");
    let s = Server::start("128M");
    s.create_volume("fio", "96M");
    let uri = format!("--uri={}", s.uri("fio"));
    let dir = Scratch::new();
    // Each of 4 jobs is its own NBD connection working on its own 8 MiB region.
    let common = [
        "--ioengine=nbd",
        uri.as_str(),
        "--bs=4k",
        "--numjobs=4",
        "--iodepth=8",
        "--size=8M",
        "--offset_increment=8M",
        "--verify=crc32c",
        "--randrepeat=1",
    ];

    // 1. random writes, each job reading back and verifying its blocks afterwards
    let mut a = vec!["--name=w", "--rw=randwrite", "--do_verify=1"];
    a.extend(common);
    let v = fio(&dir, "write", &a);
    assert_eq!(
        total(&v, "write"),
        4 * 2048,
        "every 4k block of 4 x 8 MiB written once"
    );
    assert_eq!(total(&v, "read"), 4 * 2048, "every written block verified");

    // 2. verify again from new connections (same job name and seed: fio replays the layout)
    let mut a = vec!["--name=w", "--rw=randwrite", "--verify_only"];
    a.extend(common);
    let v = fio(&dir, "verify", &a);
    assert_eq!(
        total(&v, "read"),
        4 * 2048,
        "verify_only pass read every block"
    );

    // 3. mixed random read/write with verification of what was written, in the upper half
    let mut a = vec![
        "--name=m",
        "--rw=randrw",
        "--rwmixread=50",
        "--do_verify=1",
        "--offset=32M",
    ];
    a.extend(common);
    let v = fio(&dir, "randrw", &a);
    assert!(
        total(&v, "write") > 1000,
        "randrw did few writes: {}",
        total(&v, "write")
    );
    assert!(
        total(&v, "read") > total(&v, "write"),
        "randrw reads (incl. verify) <= writes"
    );

    // Negative control: verifying the never-written 64M..96M must fail.
    let mut a = vec![
        "--name=w",
        "--rw=randwrite",
        "--verify_only",
        "--offset=64M",
    ];
    a.extend(common);
    let (out, _) = run_fio(&dir, "negative", &a);
    assert!(
        !out.status.success(),
        "fio verify of foreign data passed:\n{}",
        out.describe()
    );
}
