//! Helpers of the tests that drive the Linux kernel's initiators inside a
//! QEMU guest (`guest_nbd.rs`, `guest_nvme.rs`, `guest_iscsi.rs`; the guest
//! itself is the basalt-guest crate): the shell prelude their scripts start
//! with, the shell functions for nvme-cli and for starting iscsid, booting
//! with the checks every such test makes, reading values the script printed
//! on the console, and fio's JSON results the script printed there.
//!
//! Invariant: a guest script fails as a whole on its first failing command
//! (`set -eu -o pipefail`), and [`boot_ok`] fails the test with the
//! console's tail unless the script exited 0 and printed its done marker.

use std::time::Instant;

use basalt_frontend_nvme::subsystem_nqn;
use basalt_guest::{Guest, GuestConfig, GuestRun, FORWARD_IP};

use super::{tool, Scratch};

/// First lines of every guest script: stop at the first failure, trace
/// commands, `step` prints progress with the guest's uptime (for reading a
/// slow run's console), `wait_until TENTHS CMD...` retries CMD every 0.1 s.
pub const SH_PRELUDE: &str = r#"set -eux -o pipefail
step() { echo "STEP $(cut -d' ' -f1 /proc/uptime)s: $*"; }
wait_until() {
    local tries=$1 tried=0
    shift
    until "$@"; do
        tried=$((tried + 1))
        [ $tried -le "$tries" ] || { echo "timed out waiting for: $*"; return 1; }
        usleep 100000
    done
}
"#;

/// Shell functions for the NVMe/TCP side of a script, for `volume` at the
/// guest-side `port`: sets SUB (the volume's subsystem NQN) and T (nvme-cli's
/// transport options); `nvme_ns` finds the one namespace block device (sets
/// NS; hidden multipath paths `nvmeXcYnZ` are skipped), `wait_ns` /
/// `wait_no_ns` wait for it to appear / go.
pub fn nvme_functions(volume: &str, port: u16) -> String {
    format!(
        r#"SUB={sub}
T="-t tcp -a {FORWARD_IP} -s {port}"
nvme_ns() {{
    local d name
    NS=
    for d in /sys/block/nvme*; do
        name=${{d##*/}}
        case "$name" in nvme\*|*c*) continue ;; esac
        NS=$name
    done
    [ -n "$NS" ]
}}
no_ns() {{ ! nvme_ns; }}
wait_ns() {{ wait_until 100 nvme_ns; echo "namespace: $NS"; }}
wait_no_ns() {{ wait_until 100 no_ns; }}
"#,
        sub = subsystem_nqn(volume),
    )
}

/// Script lines that start open-iscsi's iscsid with `initiator` as the
/// guest's initiator name and wait until iscsiadm can reach it.
///
/// iscsid reads the initiator name when it starts; iscsiadm keeps its node
/// records under /etc/iscsi and locks in /run/lock. iscsid serves only a
/// peer whose uid maps to the user "root" (getpwuid), so root needs a
/// passwd entry.
pub fn iscsid_start(initiator: &str) -> String {
    format!(
        r#"mkdir -p /etc/iscsi /var/lib/iscsi /run/lock/iscsi
echo "root:x:0:0:root:/root:/bin/sh" > /etc/passwd
echo "InitiatorName={initiator}" > /etc/iscsi/initiatorname.iscsi
iscsid -f &
iscsid_up() {{ grep -q ISCSIADM_ABSTRACT_NAMESPACE /proc/net/unix; }}
wait_until 50 iscsid_up
"#
    )
}

/// Script lines that run one fio job `label` on block device `dev` (4k
/// blocks, libaio, O_DIRECT, random offsets in its first `region` bytes,
/// for `seconds`; `rw` and `iodepth` as fio's) and print its JSON result
/// on one console line, `FIO-JSON <label> {...}`, for [`fio_result`].
/// Latency percentiles are of the total latency (submission included).
pub fn fio_json_job(
    label: &str,
    dev: &str,
    rw: &str,
    iodepth: u32,
    region: u64,
    seconds: u32,
) -> String {
    format!(
        r#"step {label}
fio --name={label} --filename={dev} --ioengine=libaio --direct=1 \
    --rw={rw} --bs=4k --iodepth={iodepth} --numjobs=1 --size={region} \
    --time_based --runtime={seconds} --norandommap \
    --lat_percentiles=1 --clat_percentiles=0 --percentile_list=50:99 \
    --output-format=json --output=/tmp/{label}.json
echo "FIO-JSON {label} $(tr -d '\n' < /tmp/{label}.json)"
"#
    )
}

/// What one fio job did in one direction (read or write): IOPS, and the
/// mean and 99th percentile of its total latency, in µs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FioResult {
    pub iops: f64,
    pub lat_mean_us: f64,
    pub lat_p99_us: f64,
}

/// The result of the job [`fio_json_job`] ran as `label`, from its JSON on
/// the console: its read side if `write` is false, else its write side.
/// Fails the test unless there is exactly one such line, it did I/O, and
/// the job reported no error.
pub fn fio_result(run: &GuestRun, label: &str, write: bool) -> FioResult {
    let text = console_value(run, &format!("FIO-JSON {label} "));
    let r = parse_fio_json(&text, write).unwrap_or_else(|e| panic!("fio {label}: {e}: {text}"));
    assert!(r.iops > 0.0 && r.lat_mean_us > 0.0, "fio {label}: {text}");
    r
}

/// [`FioResult`] of the first job of fio's `--output-format=json` output
/// (run with `--lat_percentiles=1`).
pub fn parse_fio_json(text: &str, write: bool) -> Result<FioResult, String> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let job = &v["jobs"][0];
    if job["error"].as_i64() != Some(0) {
        return Err(format!("job error {}", job["error"]));
    }
    let side = &job[if write { "write" } else { "read" }];
    let num =
        |value: &serde_json::Value, what: &str| value.as_f64().ok_or_else(|| format!("no {what}"));
    let lat = &side["lat_ns"];
    Ok(FioResult {
        iops: num(&side["iops"], "iops")?,
        lat_mean_us: num(&lat["mean"], "lat_ns.mean")? / 1000.0,
        lat_p99_us: num(&lat["percentile"]["99.000000"], "lat_ns.percentile 99")? / 1000.0,
    })
}

/// Boots a guest running `script`, prints timings, and fails the test
/// unless the script exited 0 and printed `done_marker`.
pub fn boot_ok(config: GuestConfig, script: &str, done_marker: &str) -> GuestRun {
    let started = Instant::now();
    let run = Guest::boot(config, script).unwrap_or_else(|e| panic!("guest: {e}"));
    eprintln!(
        "guest: boot to script {:?}, run {:?}, with image preparation {:?}",
        run.boot_time,
        run.duration,
        started.elapsed()
    );
    assert_eq!(
        run.exit_code,
        0,
        "the guest script failed (exit {}); console tail:\n{}",
        run.exit_code,
        run.console_tail(120)
    );
    assert!(
        run.console_log.contains(done_marker),
        "no {done_marker:?} on the console:\n{}",
        run.console_tail(40)
    );
    run
}

/// The rest of every console line that starts with `prefix`, in order.
pub fn console_values(run: &GuestRun, prefix: &str) -> Vec<String> {
    run.console_log
        .lines()
        .filter_map(|l| l.trim_end_matches('\r').strip_prefix(prefix))
        .map(|v| v.trim().to_string())
        .collect()
}

/// The one value printed after `prefix`; fails the test unless exactly one.
pub fn console_value(run: &GuestRun, prefix: &str) -> String {
    let mut values = console_values(run, prefix);
    assert_eq!(
        values.len(),
        1,
        "want one {prefix:?} line, got {values:?}:\n{}",
        run.console_tail(40)
    );
    values.remove(0)
}

/// SHA-256 of `data` (hex) by sha256sum, as the guest computes it.
pub fn sha256_hex(data: &[u8], dir: &Scratch) -> String {
    let path = dir.path("sha256-input.bin");
    std::fs::write(&path, data).unwrap();
    let out = tool("sha256sum", [path.to_str().unwrap()]);
    out.ok().split_whitespace().next().unwrap().to_string()
}
