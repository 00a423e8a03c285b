//! Snapshots, clones and rollback through the whole server, with clients
//! nobody here wrote: a snapshot exported as `VOLUME@SNAPSHOT` stays equal
//! (`qemu-img compare`) to a copy taken when it was made while fio with
//! `verify=crc32c` rewrites the volume; it is read-only to NBD clients; a
//! clone reads its source and diverges on write without touching it; a
//! rollback restores exactly; everything survives a restart; bad requests
//! get one line and change nothing.

mod common;

use common::*;
use std::time::Duration;

fn copy_of(s: &Server, export: &str, dir: &Scratch, file: &str) -> std::path::PathBuf {
    let path = dir.path(file);
    tool(
        "qemu-img",
        [
            "convert",
            "-f",
            "raw",
            "-O",
            "raw",
            &s.uri(export),
            path.to_str().unwrap(),
        ],
    )
    .ok();
    path
}

fn compare(s: &Server, export: &str, file: &std::path::Path) -> CmdOutput {
    tool(
        "qemu-img",
        [
            "compare",
            "-f",
            "raw",
            "-F",
            "raw",
            &s.uri(export),
            file.to_str().unwrap(),
        ],
    )
}

#[test]
fn snapshots_clones_and_rollback_with_real_clients() {
    require_tool("fio");
    let s = Server::start("512M");
    let dir = Scratch::new();
    s.create_volume("db", "64M");
    qemu_io(
        &s.uri("db"),
        &["write -P 0x5a 0 16M", "write -P 0x33 40M 4M"],
    )
    .ok();

    let out = s.cli(&["snapshot", "create", "db", "s1"]);
    assert!(
        out.ok().contains("created snapshot db@s1"),
        "{}",
        out.describe()
    );
    let frozen = copy_of(&s, "db@s1", &dir, "s1.raw");

    // fio rewrites the volume, verifying what it wrote; the snapshot does
    // not move.
    let uri = format!("--uri={}", s.uri("db"));
    let mut fio = std::process::Command::new(require_tool("fio"));
    fio.current_dir(&dir.0).args([
        "--name=rewrite",
        "--ioengine=nbd",
        &uri,
        "--rw=randwrite",
        "--bs=4k",
        "--iodepth=8",
        "--size=32M",
        "--io_size=8M",
        "--verify=crc32c",
        "--do_verify=1",
        "--randrepeat=1",
        "--verify_state_save=0",
    ]);
    let out = run_cmd(&mut fio, Duration::from_secs(300));
    assert_eq!(out.code(), Some(0), "fio: {}", out.describe());
    compare(&s, "db@s1", &frozen).ok();
    assert_eq!(
        compare(&s, "db", &frozen).code(),
        Some(1),
        "the volume moved on"
    );

    // Read-only to NBD clients.
    let info = tool("nbdinfo", [s.uri("db@s1").as_str()]);
    assert!(info.ok().contains("is_read_only: true"), "{}", info.stdout);
    let write = qemu_io(&s.uri("db@s1"), &["write -P 1 0 4k"]);
    assert_ne!(write.code(), Some(0), "a write to a snapshot must fail");
    compare(&s, "db@s1", &frozen).ok();

    // A clone reads the snapshot and writes its own blocks.
    let out = s.cli(&["volume", "create", "c1", "--from", "db@s1", "--size", "80M"]);
    assert!(
        out.ok().contains("as a clone of db@s1"),
        "{}",
        out.describe()
    );
    qemu_io(&s.uri("c1"), &["read -P 0x5a 0 16M", "read -P 0x33 40M 4M"]).ok();
    qemu_io(&s.uri("c1"), &["read -P 0 64M 16M"]).ok();
    qemu_io(&s.uri("c1"), &["write -P 0x77 1M 1M", "write -z 41M 1M"]).ok();
    qemu_io(&s.uri("c1"), &["read -P 0x77 1M 1M", "read -P 0 41M 1M"]).ok();
    compare(&s, "db@s1", &frozen).ok();
    let show = s.cli_json(&["volume", "show", "c1"]);
    assert_eq!(show["clone_of"], "db@s1", "{show}");

    // What cannot be done, one line each, nothing changed.
    for (args, needle) in [
        (&["snapshot", "delete", "db@s1"][..], "has clones (c1)"),
        (&["volume", "delete", "db"][..], "has snapshots (s1)"),
        (
            &["snapshot", "create", "db", "s1"][..],
            "already has a snapshot",
        ),
        (
            &["snapshot", "create", "db", "bad@name"][..],
            "invalid snapshot name",
        ),
        (&["snapshot", "show", "db"][..], "is not VOLUME@SNAPSHOT"),
        (&["snapshot", "show", "db@nope"][..], "no snapshot named"),
        (
            &["volume", "create", "c2", "--from", "db@s1", "--size", "1M"][..],
            "cannot be smaller",
        ),
        (
            &["volume", "rollback", "db", "--to", "c1@s1"][..],
            "not of db",
        ),
    ] {
        let out = s.cli(args);
        let err = out.cli_error(1);
        assert!(err.contains(needle), "{args:?}: {err}");
    }

    // Rollback: refused while a client is connected, then exact.
    let mut cmd = python_cmd("nbdtool.py");
    cmd.args(["hold", &s.uri("db")]);
    let mut holder = Background::spawn(cmd);
    holder.wait_line("READY", Duration::from_secs(30));
    let err = s
        .cli(&["volume", "rollback", "db", "--to", "s1"])
        .cli_error(1);
    assert!(err.contains("in use"), "{err}");
    let out = s.cli(&["volume", "rollback", "db", "--to", "db@s1", "--force"]);
    assert!(
        out.ok().contains("rolled back to db@s1"),
        "{}",
        out.describe()
    );
    let _ = holder.finish(Duration::from_secs(10));
    compare(&s, "db", &frozen).ok();

    // Space is reported per snapshot.
    let list = s.cli_json(&["snapshot", "list", "db"]);
    let snap = &list["snapshots"][0];
    assert_eq!(snap["name"], "s1", "{list}");
    assert_eq!(snap["clones"], serde_json::json!(["c1"]));
    assert!(
        snap["written_bytes"].as_u64().unwrap() >= 20 << 20,
        "{snap}"
    );
    let table = s.cli(&["snapshot", "list"]);
    assert!(table.ok().contains("db@s1"), "{}", table.stdout);
    // Flattening the clone makes it independent, with its own snapshot
    // (which takes the source's blocks): the source snapshot can go, and
    // neither the clone, its snapshot nor the volume changes.
    s.cli(&["snapshot", "create", "c1", "mine"]).ok();
    qemu_io(&s.uri("c1"), &["write -P 0x5c 1M 2M"]).ok();
    let mine_before = copy_of(&s, "c1@mine", &dir, "mine.raw");
    let clone_before = copy_of(&s, "c1", &dir, "c1.raw");
    // One window through the API (as the CLI walks it): `volume show`
    // says how far the flattening has come.
    let window = http(
        s.api_url(),
        "POST",
        "/api/v1/volumes/c1/flatten",
        Some(&s.token()),
        Some(r#"{"offset": 0, "length": "16M"}"#),
    );
    assert_eq!(window.status, 200, "{}", window.body);
    let show = s.cli_json(&["volume", "show", "c1"]);
    assert_eq!(show["flatten"]["done_bytes"], 16 << 20, "{show}");
    assert_eq!(show["flatten"]["total_bytes"], show["size_bytes"], "{show}");
    let table = s.cli(&["volume", "show", "c1"]);
    assert!(table.ok().contains("flattening"), "{}", table.stdout);
    let out = s.cli(&["volume", "flatten", "c1", "--rate", "1G"]);
    assert!(
        out.ok().contains("no longer depends on it"),
        "{}",
        out.describe()
    );
    let show = s.cli_json(&["volume", "show", "c1"]);
    assert!(show.get("clone_of").is_none(), "{show}");
    assert!(show.get("flatten").is_none(), "{show}");
    let err = s.cli(&["volume", "flatten", "c1"]).cli_error(1);
    assert!(err.contains("not a clone"), "{err}");

    let token = s.token();
    let metrics = http(s.api_url(), "GET", "/metrics", Some(&token), None);
    assert!(
        metrics
            .body
            .contains("basalt_snapshot_exclusive_bytes{volume=\"db\",snapshot=\"s1\"}"),
        "{}",
        metrics.body
    );
    s.cli(&["snapshot", "delete", "db@s1"]).ok();
    compare(&s, "c1", &clone_before).ok();
    compare(&s, "c1@mine", &mine_before).ok();
    compare(&s, "db", &frozen).ok();
    assert!(s
        .cli(&["snapshot", "show", "db@s1"])
        .cli_error(1)
        .contains("no snapshot named"));
}

#[test]
fn snapshots_survive_a_restart_and_deleting_them_frees_their_space() {
    let mut s = Server::start("256M");
    let dir = Scratch::new();
    s.create_volume("vm", "32M");
    qemu_io(&s.uri("vm"), &["write -P 0x11 0 8M"]).ok();
    s.cli(&["snapshot", "create", "vm", "a"]).ok();
    qemu_io(&s.uri("vm"), &["write -P 0x22 4M 8M"]).ok();
    s.cli(&["snapshot", "create", "vm", "b"]).ok();
    qemu_io(&s.uri("vm"), &["write -P 0x33 0 1M"]).ok();
    let (a, b, now) = (
        copy_of(&s, "vm@a", &dir, "a.raw"),
        copy_of(&s, "vm@b", &dir, "b.raw"),
        copy_of(&s, "vm", &dir, "now.raw"),
    );
    s.kill9();
    s.restart();
    compare(&s, "vm@a", &a).ok();
    compare(&s, "vm@b", &b).ok();
    compare(&s, "vm", &now).ok();

    // Deleting the older snapshot merges it into the newer one; nothing
    // anyone reads changes.
    s.cli(&["snapshot", "delete", "vm@a"]).ok();
    compare(&s, "vm@b", &b).ok();
    compare(&s, "vm", &now).ok();
    s.cli(&["snapshot", "delete", "vm@b"]).ok();
    compare(&s, "vm", &now).ok();
    let vol = s.cli_json(&["volume", "show", "vm"]);
    assert!(vol.get("snapshots").is_none(), "{vol}");
    s.cli(&["volume", "delete", "vm"]).ok();
    // The freed extents are zeroed in the background.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let status = s.cli_json(&["status"]);
        if status["allocated_bytes"] == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "space not freed: {status}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
