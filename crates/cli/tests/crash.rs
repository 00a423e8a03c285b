//! Durability across `kill -9`: everything acknowledged with FUA, or written
//! before a completed FLUSH, survives; the server restarts with no repair
//! step. The workload and the checking are in tests/nbdsh/crash_writer.py.

mod common;

use std::time::{Duration, Instant};

use common::*;

const ROUNDS: u32 = 6;

#[test]
fn kill9_during_writes_keeps_flushed_data() {
    let seed = test_seed("kill9_during_writes_keeps_flushed_data");
    let mut rng = Rng(seed);
    let mut s = Server::start("64M");
    s.create_volume("crash", "16M");
    let scratch = Scratch::new();
    let state = scratch.path("state.json");
    let py_seed = (seed % 1_000_000).to_string();

    for round in 0..ROUNDS {
        let mut cmd = python_cmd("crash_writer.py");
        cmd.arg(s.uri("crash"))
            .arg(&state)
            .arg(&py_seed)
            .args(["--max-seconds", "60"])
            // Even rounds use FLUSH only: FUA writes would make other writes'
            // metadata durable as a side effect and hide a FLUSH that does too little.
            .args(["--fua-rate", if round % 2 == 0 { "0" } else { "0.3" }]);
        let mut w = Background::spawn(cmd);
        // READY comes after the writer verified everything from the previous rounds.
        w.wait_line("READY", Duration::from_secs(60));
        let delay = rng.range(50, 900);
        std::thread::sleep(Duration::from_millis(delay));
        s.kill9();
        let (st, out, err) = w.finish(Duration::from_secs(60));
        eprintln!(
            "round {round}: killed after {delay} ms; writer: {}",
            out.lines().last().unwrap_or("")
        );
        assert!(
            st.success(),
            "round {round}: crash writer failed (seed {seed}):\n{out}\n{err}"
        );
        assert!(
            out.contains("\"lost\": \"nbd"),
            "round {round}: writer did not see the connection drop:\n{out}\n{err}"
        );

        let t = Instant::now();
        s.restart();
        eprintln!("round {round}: restart took {:?}", t.elapsed());
        let list = s.cli_json(&["volume", "list"]);
        assert!(
            find_volume(&list, "crash").is_some(),
            "volume lost after kill -9: {list}"
        );
    }

    // Final check, and then the volume still takes writes after all the crashes.
    let out = nbd_script(
        "crash_writer.py",
        [
            s.uri("crash"),
            state.display().to_string(),
            py_seed.clone(),
            "--verify-only".into(),
        ],
    );
    assert!(
        out.status.success(),
        "final verification failed (seed {seed}):\n{}",
        out.describe()
    );
    let uri = s.uri("crash");
    nbd_script(
        "nbdtool.py",
        [
            "write", &uri, "--seed", "9", "--offset", "0", "--length", "1048576", "--flush",
        ],
    )
    .ok();
    nbd_script(
        "nbdtool.py",
        [
            "verify", &uri, "--seed", "9", "--offset", "0", "--length", "1048576",
        ],
    )
    .ok();
}

#[test]
fn kill9_right_after_flush_keeps_data() {
    // The smallest durability case: write, FLUSH on the same connection, kill -9 at once.
    let mut s = Server::start("64M");
    s.create_volume("f", "8M");
    let uri = s.uri("f");
    nbd_script(
        "nbdtool.py",
        [
            "write", &uri, "--seed", "5", "--offset", "1048576", "--length", "2097152", "--flush",
        ],
    )
    .ok();
    s.kill9();
    s.restart();
    let uri = s.uri("f");
    nbd_script(
        "nbdtool.py",
        [
            "verify", &uri, "--seed", "5", "--offset", "1048576", "--length", "2097152",
        ],
    )
    .ok();
    // and the same for a TRIM + FLUSH of a whole extent-sized range
    nbd_script(
        "nbdtool.py",
        [
            "trim", &uri, "--offset", "1048576", "--length", "1048576", "--flush",
        ],
    )
    .ok();
    s.kill9();
    s.restart();
    let uri = s.uri("f");
    nbd_script(
        "nbdtool.py",
        [
            "verify", &uri, "--zero", "--offset", "1048576", "--length", "1048576",
        ],
    )
    .ok();
}

#[test]
fn kill9_after_fua_and_flush_on_two_volumes() {
    // Deterministic companion: FUA-only data on one volume, FLUSH-covered data on another
    // (flushed from a different connection than the one that wrote), then kill -9 at once.
    let mut s = Server::start("64M");
    s.create_volume("fua", "8M");
    s.create_volume("flushed", "8M");
    let fua = s.uri("fua");
    let fl = s.uri("flushed");
    nbd_script(
        "nbdtool.py",
        [
            "write", &fua, "--seed", "1", "--offset", "0", "--length", "2097152", "--fua",
            "--chunk", "65536",
        ],
    )
    .ok();
    nbd_script(
        "nbdtool.py",
        [
            "write", &fl, "--seed", "2", "--offset", "4194304", "--length", "2097152",
        ],
    )
    .ok();
    // flush from a new connection: covers the completed writes of the earlier one (multi-conn)
    let mut cmd = std::process::Command::new(require_tool("nbdsh"));
    cmd.env("PATH", path_for_nbdsh())
        .args(["-u", &fl, "-c", "h.flush()"]);
    run_cmd(&mut cmd, CMD_TIMEOUT).ok();
    // a trim + flush must also be durable: trimmed blocks read zeros after the crash
    nbd_script(
        "nbdtool.py",
        [
            "trim", &fl, "--offset", "4194304", "--length", "65536", "--flush",
        ],
    )
    .ok();
    s.kill9();
    s.restart();
    // (ports are new after a restart)
    let (fua, fl) = (s.uri("fua"), s.uri("flushed"));
    nbd_script(
        "nbdtool.py",
        [
            "verify", &fua, "--seed", "1", "--offset", "0", "--length", "2097152",
        ],
    )
    .ok();
    nbd_script(
        "nbdtool.py",
        [
            "verify", &fl, "--zero", "--offset", "4194304", "--length", "65536",
        ],
    )
    .ok();
    nbd_script(
        "nbdtool.py",
        [
            "verify", &fl, "--seed", "2", "--offset", "4259840", "--length", "2031616",
        ],
    )
    .ok();
    nbd_script(
        "nbdtool.py",
        [
            "verify", &fl, "--zero", "--offset", "0", "--length", "4194304",
        ],
    )
    .ok();
    // Twice in a row, with nothing written in between.
    s.kill9();
    s.restart();
    let (fua, fl) = (s.uri("fua"), s.uri("flushed"));
    nbd_script(
        "nbdtool.py",
        [
            "verify", &fua, "--seed", "1", "--offset", "0", "--length", "2097152",
        ],
    )
    .ok();
    nbd_script(
        "nbdtool.py",
        [
            "verify", &fl, "--seed", "2", "--offset", "4259840", "--length", "2031616",
        ],
    )
    .ok();
}
