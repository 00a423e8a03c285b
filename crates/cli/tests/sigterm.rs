//! SIGTERM is a clean stop: exit status 0, and a restart finds the catalog
//! and all flushed data.

mod common;

use std::time::Duration;

use common::*;

#[test]
fn sigterm_exits_0_and_restart_keeps_flushed_data() {
    let mut s = Server::start("64M");
    s.create_volume("keep", "16M");
    s.create_volume("other", "8M");
    let uri = s.uri("keep");
    nbd_script(
        "nbdtool.py",
        [
            "write", &uri, "--seed", "11", "--offset", "0", "--length", "4194304", "--flush",
        ],
    )
    .ok();
    nbd_script(
        "nbdtool.py",
        [
            "write", &uri, "--seed", "12", "--offset", "8388608", "--length", "1048576", "--fua",
        ],
    )
    .ok();
    s.cli(&["volume", "resize", "other", "--size", "12M"]).ok();

    let st = s.sigterm(Duration::from_secs(30));
    assert_eq!(
        st.code(),
        Some(0),
        "SIGTERM exit status {st:?}\n--- server log ---\n{}",
        s.log()
    );

    s.restart();
    let list = s.cli_json(&["volume", "list"]);
    assert_eq!(
        volume_size(&find_volume(&list, "keep").expect("keep")),
        16 * MIB
    );
    assert_eq!(
        volume_size(&find_volume(&list, "other").expect("other")),
        12 * MIB
    );
    let uri = s.uri("keep");
    nbd_script(
        "nbdtool.py",
        [
            "verify", &uri, "--seed", "11", "--offset", "0", "--length", "4194304",
        ],
    )
    .ok();
    nbd_script(
        "nbdtool.py",
        [
            "verify", &uri, "--seed", "12", "--offset", "8388608", "--length", "1048576",
        ],
    )
    .ok();
    nbd_script(
        "nbdtool.py",
        [
            "verify", &uri, "--zero", "--offset", "4194304", "--length", "4194304",
        ],
    )
    .ok();

    // A second clean stop right after a restart, with nothing written, is also clean.
    let st = s.sigterm(Duration::from_secs(30));
    assert_eq!(st.code(), Some(0), "second SIGTERM exit status {st:?}");
    s.restart();
    let uri = s.uri("keep");
    nbd_script(
        "nbdtool.py",
        [
            "verify", &uri, "--seed", "11", "--offset", "0", "--length", "4194304",
        ],
    )
    .ok();
}

#[test]
fn sigterm_with_connected_idle_client_exits_0() {
    let mut s = Server::start("64M");
    s.create_volume("idle", "8M");
    let uri = s.uri("idle");
    nbd_script(
        "nbdtool.py",
        [
            "write", &uri, "--seed", "3", "--offset", "0", "--length", "1048576", "--flush",
        ],
    )
    .ok();
    let mut cmd = python_cmd("nbdtool.py");
    cmd.args(["hold", &uri]);
    let mut holder = Background::spawn(cmd);
    holder.wait_line("READY", Duration::from_secs(30));

    let st = s.sigterm(Duration::from_secs(30));
    assert_eq!(
        st.code(),
        Some(0),
        "SIGTERM with a connected client: exit status {st:?}\n{}",
        s.log()
    );
    drop(holder);

    s.restart();
    nbd_script(
        "nbdtool.py",
        [
            "verify",
            &s.uri("idle"),
            "--seed",
            "3",
            "--offset",
            "0",
            "--length",
            "1048576",
        ],
    )
    .ok();
}
