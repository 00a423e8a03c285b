//! The `basalt` CLI against a running server: volume lifecycle, output
//! formats, and the error conventions (one `error:` line on stderr, exit 1;
//! usage errors exit 2).

mod common;

use std::time::{Duration, Instant};

use common::*;

#[test]
fn volume_lifecycle_json_and_table_output() {
    let s = Server::start("1G");

    // create, with a binary-suffixed size
    let created = s.cli_json(&["volume", "create", "alpha", "--size", "1G"]);
    assert!(created.is_object(), "create --output json: {created}");

    let shown = s.cli_json(&["volume", "show", "alpha"]);
    assert_eq!(
        shown["name"].as_str().or(shown["volume"]["name"].as_str()),
        Some("alpha"),
        "{shown}"
    );
    assert_eq!(volume_size(&shown), GIB, "1G must mean 1 GiB: {shown}");

    s.create_volume("beta", "64M");
    let list = s.cli_json(&["volume", "list"]);
    let alpha = find_volume(&list, "alpha").unwrap_or_else(|| panic!("alpha not in list: {list}"));
    assert_eq!(volume_size(&alpha), GIB);
    let beta = find_volume(&list, "beta").unwrap_or_else(|| panic!("beta not in list: {list}"));
    assert_eq!(volume_size(&beta), 64 * MIB);
    assert_eq!(volume_list(&list).len(), 2, "{list}");

    // human table: a header line, then one row per volume
    let out = s.cli(&["volume", "list"]);
    let table = out.ok();
    let lines: Vec<&str> = table.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(lines.len() >= 3, "expected header + 2 rows:\n{table}");
    let header = lines[0].to_ascii_uppercase();
    assert!(
        header.contains("NAME") && header.contains("SIZE"),
        "no header line (NAME, SIZE):\n{table}"
    );
    assert!(
        !lines[0].contains("alpha"),
        "first line is not a header:\n{table}"
    );
    assert!(lines[1..].iter().any(|l| l.contains("alpha")), "{table}");
    assert!(lines[1..].iter().any(|l| l.contains("beta")), "{table}");
    s.cli(&["volume", "show", "alpha"]).ok();

    // grow
    s.cli(&["volume", "resize", "alpha", "--size", "1536M"])
        .ok();
    assert_eq!(
        volume_size(&s.cli_json(&["volume", "show", "alpha"])),
        1536 * MIB
    );

    // shrink refused without --allow-shrink, size unchanged
    let e = s
        .cli(&["volume", "resize", "alpha", "--size", "512M"])
        .cli_error(1);
    assert!(
        e.to_lowercase().contains("shrink"),
        "error should mention shrinking: {e}"
    );
    assert_eq!(
        volume_size(&s.cli_json(&["volume", "show", "alpha"])),
        1536 * MIB
    );
    s.cli(&[
        "volume",
        "resize",
        "alpha",
        "--size",
        "512M",
        "--allow-shrink",
    ])
    .ok();
    assert_eq!(
        volume_size(&s.cli_json(&["volume", "show", "alpha"])),
        512 * MIB
    );

    // status
    let st = s.cli_json(&["status"]);
    assert!(st.is_object(), "status --output json: {st}");
    s.cli(&["status"]).ok();

    // delete
    s.cli(&["volume", "delete", "alpha"]).ok();
    let list = s.cli_json(&["volume", "list"]);
    assert!(
        find_volume(&list, "alpha").is_none(),
        "alpha still listed: {list}"
    );
    assert!(
        find_volume(&list, "beta").is_some(),
        "beta vanished: {list}"
    );
    let e = s.cli(&["volume", "show", "alpha"]).cli_error(1);
    assert!(e.contains("alpha"), "error should name the volume: {e}");
    // the name is free again
    s.create_volume("alpha", "4M");
}

#[test]
fn error_size_not_multiple_of_4096() {
    let s = Server::start("1G");
    s.create_volume("vol", "100M");
    let e = s
        .cli(&["volume", "create", "odd", "--size", "10000"])
        .cli_error(1);
    assert!(e.contains("4096"), "error should mention 4096: {e}");
    s.cli(&["volume", "create", "odd2", "--size", "4097K"])
        .cli_error(1);
    s.cli(&["volume", "resize", "vol", "--size", "1000"])
        .cli_error(1);
    let list = s.cli_json(&["volume", "list"]);
    assert!(
        find_volume(&list, "odd").is_none() && find_volume(&list, "odd2").is_none(),
        "{list}"
    );
    assert_eq!(volume_size(&find_volume(&list, "vol").unwrap()), 100 * MIB);
}

#[test]
fn error_bad_size_string() {
    let s = Server::start("1G");
    for bad in ["abc", "12X", "1.5.5G", "10GB", ""] {
        s.cli(&["volume", "create", "bad", "--size", bad])
            .cli_error(1);
    }
    s.cli(&["volume", "create", "bad", "--size=-4096"])
        .cli_error(1);
    assert!(find_volume(&s.cli_json(&["volume", "list"]), "bad").is_none());
}

#[test]
fn error_duplicate_name() {
    let s = Server::start("1G");
    s.create_volume("vol", "100M");
    let e = s
        .cli(&["volume", "create", "vol", "--size", "4M"])
        .cli_error(1);
    assert!(e.contains("vol"), "error should name the volume: {e}");
    let list = s.cli_json(&["volume", "list"]);
    assert_eq!(volume_list(&list).len(), 1, "{list}");
    assert_eq!(
        volume_size(&find_volume(&list, "vol").unwrap()),
        100 * MIB,
        "duplicate create changed the volume"
    );
}

#[test]
fn error_unknown_volume() {
    let s = Server::start("1G");
    for args in [
        &["volume", "show", "nope"][..],
        &["volume", "delete", "nope"][..],
        &["volume", "resize", "nope", "--size", "8M"][..],
    ] {
        let e = s.cli(args).cli_error(1);
        assert!(e.contains("nope"), "error should name the volume: {e}");
    }
}

#[test]
fn error_overcommit_beyond_twice_capacity() {
    let s = Server::start("1G");
    s.create_volume("vol", "100M");
    s.cli(&["volume", "create", "huge", "--size", "3G"])
        .cli_error(1);
    s.create_volume("big", "1G"); // 1.1G provisioned in total, limit 2G
    s.cli(&["volume", "create", "more", "--size", "1G"])
        .cli_error(1);
    s.cli(&["volume", "resize", "big", "--size", "2G"])
        .cli_error(1);
    let list = s.cli_json(&["volume", "list"]);
    for gone in ["huge", "more"] {
        assert!(
            find_volume(&list, gone).is_none(),
            "refused create left {gone}: {list}"
        );
    }
    assert_eq!(volume_size(&find_volume(&list, "big").unwrap()), GIB);
    // Up to exactly the limit is fine, one block more is not.
    let st = s.cli_json(&["status"]);
    let cap = st["capacity_bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("status: {st}"));
    let prov = st["provisioned_bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("status: {st}"));
    assert_eq!(prov, GIB + 100 * MIB, "provisioned_bytes: {st}");
    assert!(
        cap > 900 * MIB && cap <= GIB,
        "capacity_bytes of a 1G store: {st}"
    );
    let room = (2 * cap - prov) / 4096 * 4096;
    let over = (room + 4096).to_string();
    s.cli(&["volume", "create", "rest", "--size", &over])
        .cli_error(1);
    s.create_volume("rest", &room.to_string());
}

#[test]
fn usage_errors_exit_2() {
    let s = Server::start("64M");
    s.cli(&["volume", "list", "--no-such-flag"]).cli_error(2);
    s.cli(&["volume", "frobnicate"]).cli_error(2);
    s.cli(&["volume", "create", "x"]).cli_error(2); // --size missing
    s.cli(&["volume", "list", "--output", "yaml"]).cli_error(2);
    let mut cmd = std::process::Command::new(bin());
    cmd.arg("--help");
    let help = run_cmd(&mut cmd, Duration::from_secs(60));
    assert!(help.ok().contains("volume"), "{}", help.stdout);
}

#[test]
fn data_dir_flag_before_the_subcommand() {
    // The documented form: `basalt --data-dir DIR volume create NAME --size 10G`.
    let s = Server::start("64M");
    let mut cmd = std::process::Command::new(bin());
    cmd.arg("--data-dir")
        .arg(s.data_dir())
        .args(["volume", "create", "front", "--size", "8M"]);
    run_cmd(&mut cmd, Duration::from_secs(60)).ok();
    let mut cmd = std::process::Command::new(bin());
    cmd.arg("--data-dir")
        .arg(s.data_dir())
        .args(["volume", "list", "--output", "json"]);
    let out = run_cmd(&mut cmd, Duration::from_secs(60));
    let v: serde_json::Value = serde_json::from_str(out.ok()).expect("json");
    assert!(find_volume(&v, "front").is_some(), "{v}");
}

#[test]
fn cli_without_server_fails_cleanly() {
    let dir = Scratch::new();
    for args in [
        &["volume", "list"][..],
        &["status"][..],
        &["volume", "create", "a", "--size", "4M"][..],
    ] {
        let out = cli_in(&dir.0, args);
        out.cli_error(1);
    }

    // A server killed with -9 leaves a stale server.json behind: the CLI must
    // still fail with one line and exit 1, promptly.
    let mut s = Server::start("64M");
    s.create_volume("v", "4M");
    s.kill9();
    let t = Instant::now();
    s.cli(&["volume", "list"]).cli_error(1);
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "CLI took {:?} to notice the dead server",
        t.elapsed()
    );

    // and a restart serves the catalog again
    s.restart();
    let list = s.cli_json(&["volume", "list"]);
    assert_eq!(
        volume_size(&find_volume(&list, "v").expect("v after restart")),
        4 * MIB
    );
}

#[test]
fn delete_refused_while_nbd_client_connected() {
    let s = Server::start("64M");
    s.create_volume("busy", "16M");
    let mut cmd = python_cmd("nbdtool.py");
    cmd.args(["hold", &s.uri("busy")]);
    let mut holder = Background::spawn(cmd);
    holder.wait_line("READY", Duration::from_secs(30));

    let e = s.cli(&["volume", "delete", "busy"]).cli_error(1);
    assert!(e.contains("busy"), "error should name the volume: {e}");
    assert!(find_volume(&s.cli_json(&["volume", "list"]), "busy").is_some());

    let (st, out, err) = holder.finish(Duration::from_secs(30));
    assert!(st.success(), "holder failed: {out}\n{err}");

    // Once the client is gone the delete goes through (the server may take a moment to notice).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = s.cli(&["volume", "delete", "busy"]);
        if out.status.success() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "delete still refused after the client left:\n{}",
            out.describe()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(find_volume(&s.cli_json(&["volume", "list"]), "busy").is_none());
}

#[test]
fn disconnect_drops_a_volumes_clients_and_delete_force_goes_through() {
    let s = Server::start("64M");
    s.create_volume("busy", "16M");
    s.create_volume("other", "16M");
    let hold = |name: &str| {
        let mut cmd = python_cmd("nbdtool.py");
        cmd.args(["hold", &s.uri(name), "--length", "4096"]);
        let mut holder = Background::spawn(cmd);
        holder.wait_line("READY", Duration::from_secs(30));
        holder
    };
    let busy = hold("busy");
    let other = hold("other");

    let out = s.cli(&["volume", "disconnect", "busy"]).ok().to_string();
    assert_eq!(out.trim(), "disconnected 1 connection from volume busy");
    // The disconnected client's next write fails; the other volume's
    // client is untouched.
    let (st, _, _) = busy.finish(Duration::from_secs(30));
    assert!(!st.success(), "a write after the disconnect must fail");
    let (st, out, err) = other.finish(Duration::from_secs(30));
    assert!(st.success(), "the other volume's client: {out}\n{err}");
    // JSON output.
    let v = s.cli_json(&["volume", "disconnect", "busy"]);
    assert_eq!(v["disconnected"], 0);
    let e = s.cli(&["volume", "disconnect", "nosuch"]).cli_error(1);
    assert!(e.contains("nosuch"), "{e}");

    // delete --force with a client connected: disconnects, then deletes.
    let held = hold("busy");
    s.cli(&["volume", "delete", "busy"]).cli_error(1);
    s.cli(&["volume", "delete", "busy", "--force"]).ok();
    assert!(find_volume(&s.cli_json(&["volume", "list"]), "busy").is_none());
    let (st, _, _) = held.finish(Duration::from_secs(30));
    assert!(!st.success());
}

#[test]
fn demo_volume_is_created_once_and_kept_across_restarts() {
    let mut s = Server::start_with("64M", &["--demo-volume", "demo:8M"]);
    let list = s.cli_json(&["volume", "list"]);
    let demo = find_volume(&list, "demo").unwrap_or_else(|| panic!("no demo volume: {list}"));
    assert_eq!(volume_size(&demo), 8 * MIB);
    let uri = s.uri("demo");
    nbd_script(
        "nbdtool.py",
        [
            "write", &uri, "--seed", "4", "--offset", "0", "--length", "65536", "--flush",
        ],
    )
    .ok();
    // Restarting with the same --demo-volume keeps the existing volume and its data.
    let st = s.sigterm(Duration::from_secs(30));
    assert_eq!(st.code(), Some(0));
    s.restart();
    let list = s.cli_json(&["volume", "list"]);
    assert_eq!(volume_list(&list).len(), 1, "{list}");
    nbd_script(
        "nbdtool.py",
        [
            "verify",
            &s.uri("demo"),
            "--seed",
            "4",
            "--offset",
            "0",
            "--length",
            "65536",
        ],
    )
    .ok();
}

#[test]
fn resize_online_and_shrink_drops_data() {
    let s = Server::start("64M");
    s.create_volume("rs", "8M");
    let uri = s.uri("rs");
    nbd_script(
        "nbdtool.py",
        [
            "write", &uri, "--seed", "8", "--offset", "0", "--length", "8388608", "--flush",
        ],
    )
    .ok();

    // Grow while a client is connected: new connections see the new size.
    let mut cmd = python_cmd("nbdtool.py");
    cmd.args(["hold", &uri]);
    let mut holder = Background::spawn(cmd);
    holder.wait_line("READY", Duration::from_secs(30));
    s.cli(&["volume", "resize", "rs", "--size", "16M"]).ok();
    let size = tool("nbdinfo", ["--size", &uri]);
    assert_eq!(
        size.ok().trim(),
        (16 * MIB).to_string(),
        "size seen by a new connection"
    );
    let (st, out, err) = holder.finish(Duration::from_secs(30));
    assert!(st.success(), "holder: {out}\n{err}");
    // the grown part reads zeros, the old data is intact
    nbd_script(
        "nbdtool.py",
        [
            "verify", &uri, "--zero", "--offset", "8388608", "--length", "8388608",
        ],
    )
    .ok();
    nbd_script(
        "nbdtool.py",
        [
            "verify", &uri, "--seed", "8", "--offset", "0", "--length", "8388608",
        ],
    )
    .ok();

    // Shrink (allowed) then grow again: the dropped data must not come back.
    s.cli(&["volume", "resize", "rs", "--size", "2M", "--allow-shrink"])
        .ok();
    assert_eq!(
        tool("nbdinfo", ["--size", &uri]).ok().trim(),
        (2 * MIB).to_string()
    );
    s.cli(&["volume", "resize", "rs", "--size", "8M"]).ok();
    nbd_script(
        "nbdtool.py",
        [
            "verify", &uri, "--seed", "8", "--offset", "0", "--length", "2097152",
        ],
    )
    .ok();
    nbd_script(
        "nbdtool.py",
        [
            "verify", &uri, "--zero", "--offset", "2097152", "--length", "6291456",
        ],
    )
    .ok();
}
