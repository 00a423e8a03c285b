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
        eprintln!("round {round}: killed after {delay} ms; writer said:");
        for l in out.lines().filter(|l| l.trim() != "READY") {
            eprintln!("    {l}");
        }
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

/// Allocates every 1 MiB extent in MiB `first..end` of a volume with a
/// 4 KiB write at its start, then checks the rest of each extent reads zeros
/// (a reused extent must not show its previous owner's data).
#[track_caller]
fn probe_extents_zeroed(uri: &str, first: u64, end: u64) {
    let code = format!(
        "MiB = 1 << 20\n\
         for i in range({first}, {end}):\n    h.pwrite(b'\\x01' * 4096, i * MiB)\n\
         h.flush()\n\
         for i in range({first}, {end}):\n    d = h.pread(MiB - 4096, i * MiB + 4096)\n    \
         assert d == bytes(len(d)), 'extent %d of the volume shows old data: %r' % (i, d[:32])\n"
    );
    let mut cmd = std::process::Command::new(require_tool("nbdsh"));
    cmd.env("PATH", path_for_nbdsh())
        .args(["-u", uri, "-c", &code]);
    run_cmd(&mut cmd, CMD_TIMEOUT).ok();
}

#[test]
fn freed_extents_never_leak_old_data() {
    // Space freed by delete and shrink is reused by other volumes: it must
    // read as zeros there, immediately and after a kill -9.
    let mut s = Server::start("32M");
    let nbdtool = |args: &[&str]| nbd_script("nbdtool.py", args).ok().to_string();
    s.create_volume("a", "8M");
    s.create_volume("b", "8M");
    let (a, b) = (s.uri("a"), s.uri("b"));
    nbdtool(&[
        "write", &a, "--seed", "1", "--offset", "0", "--length", "8388608", "--flush",
    ]);
    nbdtool(&[
        "write", &b, "--seed", "2", "--offset", "0", "--length", "8388608", "--flush",
    ]);

    // Immediately: delete a, create c and allocate all free space through it.
    s.cli(&["volume", "delete", "a"]).ok();
    s.create_volume("c", "24M");
    let c = s.uri("c");
    probe_extents_zeroed(&c, 0, 16);
    nbdtool(&[
        "write", &c, "--seed", "3", "--offset", "0", "--length", "16777216", "--flush",
    ]);
    s.cli(&["volume", "delete", "c"]).ok();

    // Shrink b, then crash.
    s.cli(&["volume", "resize", "b", "--size", "1M", "--allow-shrink"])
        .ok();
    s.kill9();
    s.restart();
    let list = s.cli_json(&["volume", "list"]);
    assert!(
        find_volume(&list, "a").is_none() && find_volume(&list, "c").is_none(),
        "{list}"
    );
    assert_eq!(volume_size(&find_volume(&list, "b").expect("b")), MIB);
    let b = s.uri("b");
    nbdtool(&[
        "verify", &b, "--seed", "2", "--offset", "0", "--length", "1048576",
    ]);
    s.cli(&["volume", "resize", "b", "--size", "8M"]).ok();
    nbdtool(&[
        "verify", &b, "--zero", "--offset", "1048576", "--length", "7340032",
    ]);
    // every extent freed by the deletes and the shrink, reused after the crash
    // (28 MiB usable: b's 8 extents + 20 of d's = all of them)
    probe_extents_zeroed(&b, 1, 8); // extent 0 holds b's own data
    s.create_volume("d", "24M");
    probe_extents_zeroed(&s.uri("d"), 0, 20);
}
