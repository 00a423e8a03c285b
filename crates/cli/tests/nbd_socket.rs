//! NBD access control on this host: the Unix socket in the data directory
//! serves qemu-io and nbdinfo (libnbd's `nbd+unix://` URIs) the same
//! volumes as TCP, only its owner may connect (another user gets
//! "permission denied"). TCP (TLS by default, plain with `--nbd-insecure`)
//! is `nbd_tls.rs`.

mod common;

use common::*;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::process::Command;
use std::time::Duration;

fn socket_uri(s: &Server, export: &str) -> String {
    let socket = s.data_dir().join("nbd.sock");
    format!("nbd+unix:///{export}?socket={}", socket.display())
}

#[test]
fn the_unix_socket_serves_the_same_volumes_to_its_owner_only() {
    let s = Server::start("128M");
    s.create_volume("local", "16M");
    let socket = s.data_dir().join("nbd.sock");
    let meta = std::fs::symlink_metadata(&socket).expect("nbd.sock exists");
    assert!(meta.file_type().is_socket(), "{socket:?} is not a socket");
    assert_eq!(meta.permissions().mode() & 0o777, 0o600, "socket mode");

    // Written over the socket, read back over TCP, and the other way.
    let unix = socket_uri(&s, "local");
    qemu_io(&unix, &["write -P 0x5a 0 64k"]).ok();
    qemu_io(
        &s.uri("local"),
        &["read -P 0x5a 0 64k", "write -P 0xa5 1M 4k"],
    )
    .ok();
    qemu_io(&unix, &["read -P 0xa5 1M 4k", "read -P 0x5a 0 64k"]).ok();

    let list = tool("nbdinfo", ["--list", "--json", &socket_uri(&s, "")]);
    assert!(list.ok().contains("\"local\""), "{}", list.describe());

    // Another user of the host cannot connect (the socket is 0600, in a
    // 0700 directory).
    let mut other = Command::new("setpriv");
    other
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "nbdinfo",
            "--size",
        ])
        .arg(&unix);
    let refused = run_cmd(&mut other, Duration::from_secs(30));
    assert_ne!(
        refused.code(),
        Some(0),
        "another user got in:\n{}",
        refused.describe()
    );
    assert!(
        refused
            .describe()
            .to_lowercase()
            .contains("permission denied"),
        "{}",
        refused.describe()
    );
    // The server goes on serving its owner.
    tool("nbdinfo", ["--size", &unix]).ok();
}
