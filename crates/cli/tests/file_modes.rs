//! The data directory is private: 0700, and every file in it 0600, after a
//! fresh start and after a start on a directory other users could read
//! (fixed, with a log line).

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use common::*;

/// Every entry under `dir` (itself included) whose mode lets group or
/// others in, with its mode.
fn open_to_others(dir: &Path) -> Vec<(String, u32)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        let meta = fs::symlink_metadata(&path).expect("stat");
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            out.push((path.display().to_string(), mode));
        }
        if meta.is_dir() {
            for entry in fs::read_dir(&path).expect("list") {
                stack.push(entry.expect("entry").path());
            }
        }
    }
    out
}

#[test]
fn the_data_directory_is_private_from_the_first_start_and_fixed_on_later_ones() {
    let mut s = Server::start("64M");
    s.create_volume("v", "16M");
    let dir = s.data_dir().to_path_buf();
    for name in [
        "basalt.data",
        "catalog.redb",
        "node.json",
        "server.json",
        "api-token",
    ] {
        let mode = fs::metadata(dir.join(name))
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{name} is {:o}", mode & 0o777);
    }
    assert_eq!(open_to_others(&dir), vec![], "after a fresh start");

    // An operator (or an older version) opened the directory up.
    assert!(s.sigterm(Duration::from_secs(30)).success());
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).expect("chmod");
    for entry in fs::read_dir(&dir).expect("list") {
        let path = entry.expect("entry").path();
        if path.is_file() {
            fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).expect("chmod");
        }
    }
    assert!(!open_to_others(&dir).is_empty());
    s.restart();
    assert_eq!(
        open_to_others(&dir),
        vec![],
        "after a start on an open directory"
    );
    let log = s.log();
    assert!(
        log.contains("readable by other users; restricted it") && log.contains("basalt.data"),
        "each fix is logged: {log}"
    );
    // Still serves the volume.
    let uri = s.uri("v");
    nbd_script(
        "nbdtool.py",
        [
            "write", &uri, "--seed", "3", "--offset", "0", "--length", "65536", "--flush",
        ],
    )
    .ok();
}
