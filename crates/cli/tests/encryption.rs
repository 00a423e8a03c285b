//! Encryption at rest through the whole server, with clients nobody here
//! wrote: a recognisable text written over NBD leaves no 16-byte window of
//! itself in the data file (a plain volume's text, written beside it, is
//! found by the same search); fio `verify=crc32c` passes on an encrypted
//! volume; snapshots and clones of it read back; a restart with the wrong
//! master key serves the plain volume and refuses the encrypted one with
//! one line; key rotation keeps everything readable; without a master
//! key, `--encrypted` is one line and a non-zero exit; a key from
//! `--master-key-command` works across restarts, and a failing command
//! stops the start with its error. Replicated: an RF3
//! encrypted volume written through a node that is not its primary leaves
//! no plaintext in any node's data file (the peer link and every replica
//! carry ciphertext), its replicas are identical, and it fails over,
//! resyncs and clones with its key.

mod common;

use common::cluster::*;
use common::plaintext::{fio_verify_region, same_as, text, windows_in_file};
use common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

const MIB: usize = 1 << 20;

fn write_text(s: &Server, volume: &str, file: &Path) {
    let cmd = format!("write -s {} 0 4M", file.display());
    qemu_io(&s.uri(volume), &[&cmd]).ok();
}

fn write_key(path: &Path, hex: &str) {
    let _ = std::fs::remove_file(path);
    std::fs::write(path, format!("{hex}\n")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

#[test]
fn encrypted_volumes_leave_no_plaintext_and_need_their_master_key() {
    require_tool("fio");
    let dir = Scratch::new();
    let key = dir.path("master.key");
    let mut s = Server::start_with("256M", &["--master-key-file", key.to_str().unwrap()]);
    let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "a created key file is private");
    let good_key = std::fs::read_to_string(&key).unwrap();

    s.cli(&["volume", "create", "secret", "--size", "64M", "--encrypted"])
        .ok();
    s.create_volume("plain", "64M");
    let shown = s.cli_json(&["volume", "show", "secret"]);
    assert_eq!(shown["encrypted"], true, "{shown}");
    assert!(s
        .cli(&["volume", "show", "secret"])
        .ok()
        .contains("AES-256-XTS"));

    let (secret_text, plain_text) = (dir.path("secret.txt"), dir.path("plain.txt"));
    let (a, b) = (text(1), text(2));
    std::fs::write(&secret_text, &a).unwrap();
    std::fs::write(&plain_text, &b).unwrap();
    write_text(&s, "secret", &secret_text);
    write_text(&s, "plain", &plain_text);
    same_as(&s, "secret", &secret_text).ok();

    // fio verifies its own data on the encrypted volume.
    let mut fio = fio_verify_region(&s, &dir.0, "secret", "8M");
    let out = run_cmd(&mut fio, CMD_TIMEOUT);
    assert!(out.status.success(), "fio: {}", out.describe());

    // TRIM frees what fio wrote at 8 MiB: it reads as zeros and
    // base:allocation reports a hole there, as on a plain volume.
    qemu_io(&s.uri("secret"), &["discard 8M 1M"]).ok();
    let zeros = qemu_io(&s.uri("secret"), &["read -P 0 8M 1M"]);
    assert!(zeros.status.success(), "{}", zeros.describe());
    let map = tool("nbdinfo", ["--map", &s.uri("secret")]);
    let hole_at_8m = map.ok().lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        match (
            f.first().map(|x| x.parse::<u64>()),
            f.get(1).map(|x| x.parse::<u64>()),
            f.get(2),
        ) {
            (Some(Ok(at)), Some(Ok(len)), Some(kind)) => {
                at <= 8 * MIB as u64
                    && 8 * MIB as u64 + MIB as u64 <= at + len
                    && kind.parse::<u8>().is_ok_and(|k| k & 1 == 1)
            }
            _ => false,
        }
    });
    assert!(hole_at_8m, "no hole at 8 MiB after TRIM:\n{}", map.stdout);

    // A volume type with encryption gives it to its volumes (a retype
    // across encryption re-encrypts: `reencryption.rs`).
    s.cli(&["type", "create", "secure", "--encrypted"]).ok();
    s.cli(&[
        "volume", "create", "typed", "--size", "8M", "--type", "secure",
    ])
    .ok();
    assert_eq!(s.cli_json(&["volume", "show", "typed"])["encrypted"], true);
    assert_eq!(s.cli_json(&["type", "show", "secure"])["encrypted"], true);

    // Stopped (everything on the device), the data file has the plain
    // volume's text and not one 16-byte window of the encrypted one's.
    assert!(s.sigterm(Duration::from_secs(30)).success());
    let data = s.data_dir().join("basalt.data");
    assert!(
        windows_in_file(&data, &b) > 1000,
        "the search finds plain text"
    );
    assert_eq!(
        windows_in_file(&data, &a),
        0,
        "plaintext of the encrypted volume on disk"
    );

    // A snapshot and a clone read with the volume's key.
    s.restart();
    same_as(&s, "secret", &secret_text).ok();
    s.cli(&["snapshot", "create", "secret", "s1"]).ok();
    s.cli(&["volume", "create", "copy", "--from", "secret@s1"])
        .ok();
    assert_eq!(s.cli_json(&["volume", "show", "copy"])["encrypted"], true);
    same_as(&s, "copy", &secret_text).ok();
    same_as(&s, "secret@s1", &secret_text).ok();

    // The wrong master key: the plain volume is served, the encrypted
    // ones are refused with one line each.
    assert!(s.sigterm(Duration::from_secs(30)).success());
    write_key(&key, &"ab".repeat(32));
    s.restart();
    same_as(&s, "plain", &plain_text).ok();
    let refused = qemu_io(&s.uri("secret"), &["read 0 4k"]);
    assert!(
        !refused.status.success(),
        "read with the wrong key: {}",
        refused.describe()
    );
    let log = s.log();
    assert!(
        log.lines().any(|l| l.contains("stays closed")
            && l.contains("secret")
            && l.contains("master key")),
        "{log}"
    );
    assert!(s.cli(&["volume", "list"]).ok().contains("secret"));

    // The right key again; then a rotation: a new key file, the same data.
    assert!(s.sigterm(Duration::from_secs(30)).success());
    write_key(&key, good_key.trim());
    s.restart();
    let rotated = s.cli(&["key", "rotate"]).ok().to_string();
    assert!(rotated.contains("3 data key(s) rewrapped"), "{rotated}");
    let new_key = std::fs::read_to_string(&key).unwrap();
    assert_ne!(new_key, good_key);
    assert_eq!(
        std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert!(!dir.path("master.key.next").exists());
    same_as(&s, "secret", &secret_text).ok();
    assert!(s.sigterm(Duration::from_secs(30)).success());
    s.restart();
    same_as(&s, "secret", &secret_text).ok();
    same_as(&s, "copy", &secret_text).ok();
    // The old key no longer opens them.
    assert!(s.sigterm(Duration::from_secs(30)).success());
    write_key(&key, good_key.trim());
    s.restart();
    assert!(!qemu_io(&s.uri("copy"), &["read 0 4k"]).status.success());

    // A damaged key slot entry (the store reads it as empty): the volume
    // is still refused, never served as plain.
    assert!(s.sigterm(Duration::from_secs(30)).success());
    write_key(&key, new_key.trim());
    damage_key_entry(&data, &s.log(), "secret");
    s.restart();
    same_as(&s, "copy", &secret_text).ok();
    assert!(!qemu_io(&s.uri("secret"), &["read 0 4k"]).status.success());
    assert!(s.log().contains("key slot entry is missing or damaged"));
}

/// Flips a byte of the wrapped key in `volume`'s key slot entry (version
/// 1, suite 1, 72-byte blob, then the volume's UUID), found by the UUID the
/// server logged when it created the volume.
fn damage_key_entry(data: &Path, log: &str, volume: &str) {
    let line = log
        .lines()
        .find(|l| l.contains("created volume") && l.contains(&format!("volume=\"{volume}\"")))
        .expect("creation logged");
    let id = line
        .split("id=")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap();
    let uuid: Vec<u8> = (0..16)
        .map(|i| u8::from_str_radix(&id.replace('-', "")[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    let mut raw = std::fs::read(data).unwrap();
    let at = (8..raw.len() - 16)
        .find(|&i| {
            raw[i..i + 16] == uuid[..] && raw[i - 8] == 1 && raw[i - 7] == 1 && raw[i - 6] == 72
        })
        .expect("the key slot entry");
    raw[at + 16 + 10] ^= 0x01;
    std::fs::write(data, raw).unwrap();
}

#[test]
fn without_a_master_key_encryption_is_one_line() {
    let s = Server::start("64M");
    let out = s.cli(&["volume", "create", "x", "--size", "8M", "--encrypted"]);
    let line = out.cli_error(1);
    assert!(line.contains("--master-key-file"), "{line}");
    assert!(s
        .cli(&["volume", "list"])
        .ok()
        .lines()
        .all(|l| !l.starts_with("x ")));
    let bad = Scratch::new();
    let key = bad.path("k");
    std::fs::write(&key, format!("{}\n", "00".repeat(32))).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = cli_in(
        &bad.path("data"),
        &[
            "server",
            "--capacity",
            "64M",
            "--master-key-file",
            key.to_str().unwrap(),
        ],
    );
    let line = out.cli_error(1);
    assert!(line.contains("chmod 600"), "{line}");

    // A key from a command (as from a key manager): encrypted volumes are
    // created and unlocked across a restart with it.
    let held = bad.path("held");
    write_key(&held, &"3e".repeat(32));
    let cmd = format!("cat {}", held.display());
    let mut s = Server::start_with("64M", &["--master-key-command", &cmd]);
    s.cli(&["volume", "create", "kms", "--size", "8M", "--encrypted"])
        .ok();
    qemu_io(&s.uri("kms"), &["write -P 0x7b 0 64k"]).ok();
    assert!(s.sigterm(Duration::from_secs(30)).success());
    s.restart();
    qemu_io(&s.uri("kms"), &["read -P 0x7b 0 64k"]).ok();
    // A command that fails stops the start with its error line.
    let out = cli_in(
        &bad.path("data2"),
        &[
            "server",
            "--capacity",
            "64M",
            "--master-key-command",
            "echo vault sealed >&2; exit 2",
        ],
    );
    let line = out.cli_error(1);
    assert!(line.contains("vault sealed"), "{line}");
}

#[test]
fn replicated_encrypted_volumes_carry_ciphertext_and_fail_over() {
    let keys = Scratch::new();
    let key = keys.path("master.key");
    // Every node is started with the same master key.
    write_key(&key, &"5c".repeat(32));
    let key_arg = key.display().to_string();
    let mut c = Cluster::start_with(3, &[], |_| {
        vec!["--master-key-file".to_string(), key_arg.clone()]
    });
    c.nodes[0]
        .cli(&[
            "volume",
            "create",
            "sec",
            "--size",
            "32M",
            "--replicas",
            "3",
            "--encrypted",
        ])
        .ok();
    let v = c.wait_volume(0, "sec", "placed and in sync", healthy);
    assert_eq!(v["encrypted"], true, "{v}");
    let p = node_index(&primary(&v).expect("a primary"));
    let (via, other) = ((p + 1) % 3, (p + 2) % 3);

    // Written through a node that is not the primary, read through another.
    let dir = Scratch::new();
    let file = dir.path("text");
    let plain = text(7);
    std::fs::write(&file, &plain).unwrap();
    write_text(&c.nodes[via], "sec", &file);
    same_as(&c.nodes[other], "sec", &file).ok();
    c.assert_replicas_equal(&[0, 1, 2], "sec");
    for n in &c.nodes {
        let data = n.data_dir().join("basalt.data");
        assert_eq!(
            windows_in_file(&data, &plain),
            0,
            "plaintext of sec in {}",
            data.display()
        );
    }

    // The primary's node dies: a survivor takes over and serves the data.
    c.nodes[p].kill9();
    c.wait_volume(via, "sec", "served by another primary", |v| {
        primary(v).is_some_and(|n| node_index(&n) != p)
    });
    same_as(&c.nodes[via], "sec", &file).ok();
    c.nodes[p].restart();
    c.wait_volume(via, "sec", "in sync again", healthy);
    c.assert_replicas_equal(&[0, 1, 2], "sec");

    // A clone of its snapshot is encrypted with its key.
    c.nodes[via].cli(&["snapshot", "create", "sec", "s1"]).ok();
    // Its snapshot exported from a node's own copy reads the plaintext.
    same_as(&c.nodes[other], "sec@s1", &file).ok();
    c.nodes[via]
        .cli(&["volume", "create", "sec-copy", "--from", "sec@s1"])
        .ok();
    let copy = c.wait_volume(via, "sec-copy", "placed and in sync", healthy);
    assert_eq!(copy["encrypted"], true, "{copy}");
    same_as(&c.nodes[other], "sec-copy", &file).ok();
    // A node that holds no replica of a volume reads its snapshot from the
    // primary's copy, as ciphertext, and decrypts it itself.
    c.nodes[0]
        .cli(&[
            "volume",
            "create",
            "sec2",
            "--size",
            "32M",
            "--replicas",
            "2",
            "--encrypted",
        ])
        .ok();
    let v2 = c.wait_volume(0, "sec2", "placed and in sync", healthy);
    let holders: Vec<usize> = node_names(&v2).iter().map(|n| node_index(n)).collect();
    let outside = (0..3)
        .find(|i| !holders.contains(i))
        .expect("a node without a replica");
    write_text(&c.nodes[outside], "sec2", &file);
    c.nodes[outside]
        .cli(&["snapshot", "create", "sec2", "s1"])
        .ok();
    let other_file = dir.path("other");
    std::fs::write(&other_file, text(11)).unwrap();
    write_text(&c.nodes[outside], "sec2", &other_file);
    same_as(&c.nodes[outside], "sec2@s1", &file).ok();
    same_as(&c.nodes[outside], "sec2", &other_file).ok();
    // Master key rotation is refused in a cluster, with one line.
    let line = c.nodes[0].cli(&["key", "rotate"]).cli_error(1);
    assert!(line.contains("single-node"), "{line}");
}
