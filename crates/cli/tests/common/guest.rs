//! Helpers of the tests that drive the Linux kernel's initiators inside a
//! QEMU guest (`guest_nbd.rs`, `guest_nvme.rs`; the guest itself is the
//! basalt-guest crate): the shell prelude their scripts start with, booting
//! with the checks every such test makes, and reading values the script
//! printed on the console.
//!
//! Invariant: a guest script fails as a whole on its first failing command
//! (`set -eu -o pipefail`), and [`boot_ok`] fails the test with the
//! console's tail unless the script exited 0 and printed its done marker.

use std::time::Instant;

use basalt_guest::{Guest, GuestConfig, GuestRun};

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
