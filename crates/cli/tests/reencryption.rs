//! Re-encryption through the whole server (a retype between encrypted and
//! plain volume types), with clients nobody here wrote. A plain volume
//! written over NBD is retyped to an encrypted type while fio writes and
//! verifies (`verify=crc32c`) another region of it; afterwards qemu-img
//! reads back exactly what was written, the data file holds no 16-byte
//! window of the volume's text, and its snapshot taken before (plain)
//! still reads its old content; across a restart too. A retype started
//! through the API alone leaves the volume re-encrypting: snapshots and
//! rollbacks are refused with one line, a restart in between loses
//! nothing, and `volume flatten` finishes it. A replicated volume's retype
//! across encryption is refused with one line.

mod common;

use common::plaintext::{fio_verify_region, text, windows_in_file};
use common::*;
use std::path::Path;
use std::time::Duration;

/// The first 4 MiB of `export` equal `file`.
fn same_as(s: &Server, export: &str, file: &Path) {
    common::plaintext::same_as(s, export, file).ok();
}

fn fio_verify(s: &Server, dir: &Scratch, volume: &str) -> std::process::Child {
    fio_verify_region(s, &dir.0, volume, "32M")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("fio")
}

#[test]
fn a_retype_across_encryption_reencrypts_the_volume_online() {
    require_tool("fio");
    let dir = Scratch::new();
    let key = dir.path("master.key");
    let mut s = Server::start_with("256M", &["--master-key-file", key.to_str().unwrap()]);
    s.cli(&["type", "create", "secure", "--encrypted"]).ok();
    s.cli(&["type", "create", "open"]).ok();
    s.create_volume("db", "64M");

    // Text A, a snapshot of it (plain), then text B over it.
    let (a, b) = (dir.path("a.txt"), dir.path("b.txt"));
    let (text_a, text_b) = (text(21), text(22));
    std::fs::write(&a, &text_a).unwrap();
    std::fs::write(&b, &text_b).unwrap();
    let write = |file: &Path| {
        let cmd = format!("write -s {} 0 4M", file.display());
        qemu_io(&s.uri("db"), &[&cmd]).ok();
    };
    write(&a);
    s.cli(&["snapshot", "create", "db", "before"]).ok();
    write(&b);

    // Encrypted online, while fio writes and verifies elsewhere.
    let fio = fio_verify(&s, &dir, "db");
    let out = s
        .cli(&["volume", "retype", "db", "secure", "--rate", "32M"])
        .ok()
        .to_string();
    assert!(out.contains("re-encrypted volume db"), "{out}");
    let fio = fio.wait_with_output().unwrap();
    assert!(
        fio.status.success(),
        "fio: {}",
        String::from_utf8_lossy(&fio.stderr)
    );
    let shown = s.cli_json(&["volume", "show", "db"]);
    assert_eq!(shown["encrypted"], true, "{shown}");
    assert_eq!(shown["reencrypting"], false, "{shown}");
    let before = s.cli_json(&["snapshot", "show", "db@before"]);
    assert_eq!(
        before["encrypted"], false,
        "the snapshot keeps its key: {before}"
    );
    same_as(&s, "db", &b);
    same_as(&s, "db@before", &a);

    // Stopped: the volume's text is nowhere in the data file; the plain
    // snapshot's still is (a snapshot keeps the key it was taken under).
    assert!(s.sigterm(Duration::from_secs(30)).success());
    let data = s.data_dir().join("basalt.data");
    assert_eq!(
        windows_in_file(&data, &text_b),
        0,
        "plaintext of the re-encrypted volume on disk"
    );
    assert!(
        windows_in_file(&data, &text_a) > 1000,
        "the plain snapshot's text"
    );
    s.restart();
    same_as(&s, "db", &b);
    same_as(&s, "db@before", &a);

    // Started through the API alone: the volume is re-encrypting until it
    // is flattened; what would stack a layer on it waits, with one line.
    let r = http(
        s.api_url(),
        "POST",
        "/api/v1/volumes/db/retype",
        Some(&s.token()),
        Some(r#"{"type":"open"}"#),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let shown = s.cli_json(&["volume", "show", "db"]);
    assert_eq!(
        (shown["reencrypting"].clone(), shown["encrypted"].clone()),
        (true.into(), false.into()),
        "{shown}"
    );
    assert!(s
        .cli(&["volume", "show", "db"])
        .ok()
        .contains("re-encrypting"));
    let line = s.cli(&["snapshot", "create", "db", "during"]).cli_error(1);
    assert!(line.contains("being re-encrypted"), "{line}");
    let line = s
        .cli(&["volume", "rollback", "db", "--to", "before"])
        .cli_error(1);
    assert!(line.contains("being re-encrypted"), "{line}");
    same_as(&s, "db", &b);
    // A restart in between: still re-encrypting, nothing lost.
    assert!(s.sigterm(Duration::from_secs(30)).success());
    s.restart();
    assert_eq!(s.cli_json(&["volume", "show", "db"])["reencrypting"], true);
    same_as(&s, "db", &b);
    let out = s.cli(&["volume", "flatten", "db"]).ok().to_string();
    assert!(out.contains("flattened volume db"), "{out}");
    let shown = s.cli_json(&["volume", "show", "db"]);
    assert_eq!(
        (shown["reencrypting"].clone(), shown["encrypted"].clone()),
        (false.into(), false.into()),
        "{shown}"
    );
    same_as(&s, "db", &b);
    same_as(&s, "db@before", &a);
    // Plain again: its text is on the device as it is.
    assert!(s.sigterm(Duration::from_secs(30)).success());
    assert!(windows_in_file(&s.data_dir().join("basalt.data"), &text_b) > 1000);
    s.restart();
    same_as(&s, "db", &b);
    // Now a snapshot may be taken again.
    s.cli(&["snapshot", "create", "db", "after"]).ok();
}
