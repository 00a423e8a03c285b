//! Per-volume compression through the whole server: a volume created with
//! `--compression lz4` and filled with text over NBD is compacted by
//! `basalt volume compact` (more than 2:1), `volume show`/`list`,
//! `status` and `/metrics` report it, its data reads back byte for byte,
//! writes into the middle of compressed extents (aligned and not) read
//! back with the old data around them, and everything holds across a
//! restart (the compactor's policy is set again from the catalog). A bad
//! codec is one line naming the accepted ones; a volume type's
//! `zstd:3` reaches its volumes; compacting an uncompressed volume is one
//! line; a clone has its source's codec unless it asks for another; an
//! image imported with `--compression --encrypted` is both; a retype
//! changes the codec the background compactor packs with, online.

mod common;

use basalt_nbd_client::{ClientError, Endpoint, NbdClient, WriteOp};
use common::*;
use std::time::Duration;

const CHUNK: usize = 1 << 20;
const DATA_LEN: usize = 8 << 20;

/// `len` bytes of log-like text: compresses well, but no two 4 KiB
/// blocks are alike (each line has its number).
fn text(len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 128);
    let mut i = 0u64;
    while out.len() < len {
        out.extend_from_slice(
            format!(
                "{i:>10} INFO basalt::volume: request served volume=db offset={} len=4096 status=ok\n",
                i * 4096
            )
            .as_bytes(),
        );
        i += 1;
    }
    out.truncate(len);
    out
}

fn connect(s: &Server, volume: &str) -> NbdClient {
    let (endpoint, _) = Endpoint::parse_uri(&s.uri(volume)).unwrap();
    NbdClient::connect(&endpoint, volume).unwrap_or_else(|e| panic!("NBD {volume}: {e}"))
}

/// Writes `data` at `offset` in 1 MiB requests, then flushes.
fn write(c: &mut NbdClient, offset: u64, data: &[u8]) {
    let ops = data.chunks(CHUNK).enumerate().map(|(i, chunk)| {
        Ok::<_, ClientError>(WriteOp::Data {
            offset: offset + (i * CHUNK) as u64,
            data: chunk.to_vec(),
        })
    });
    c.write_pipelined(ops, 8).unwrap();
    c.flush().unwrap();
}

/// Reads `len` bytes at `offset`.
fn read(c: &mut NbdClient, offset: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    let ranges = (0..len)
        .step_by(CHUNK)
        .map(|at| (offset + at as u64, CHUNK.min(len - at) as u32));
    c.read_pipelined::<ClientError>(ranges, 8, |at, bytes| {
        let from = (at - offset) as usize;
        out[from..from + bytes.len()].copy_from_slice(&bytes);
        Ok(())
    })
    .unwrap();
    out
}

#[track_caller]
fn assert_same(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(at) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!("{what}: first difference at byte {at}");
    }
}

fn u64_of(v: &serde_json::Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("no number {key} in {v}"))
}

#[test]
fn compressed_volumes_compact_read_back_and_survive_a_restart() {
    let mut s = Server::start("256M");
    s.cli(&[
        "volume",
        "create",
        "logs",
        "--size",
        "32M",
        "--compression",
        "lz4",
    ])
    .ok();
    s.create_volume("plain", "8M");

    let mut expected = text(DATA_LEN);
    let mut c = connect(&s, "logs");
    write(&mut c, 0, &expected);

    // Compacted now (the data is hot: only compact packs it this soon).
    let report = s.cli_json(&["volume", "compact", "logs"]);
    assert_eq!(report["volume"], "logs", "{report}");
    assert_eq!(report["compression"], "lz4", "{report}");
    let (packed_extents, packed, stored) = (
        u64_of(&report, "packed_extents"),
        u64_of(&report, "packed_bytes"),
        u64_of(&report, "stored_bytes"),
    );
    assert!(packed_extents >= 8, "{report}");
    assert_eq!(packed, packed_extents * CHUNK as u64, "{report}");
    assert!(stored * 2 < packed, "less than 2:1 on text: {report}");
    let table = s.cli(&["volume", "compact", "logs"]).ok().to_string();
    assert!(
        table.contains("COMPRESSION") && table.contains("lz4"),
        "{table}"
    );

    let shown = s.cli_json(&["volume", "show", "logs"]);
    assert_eq!(shown["compression"], "lz4", "{shown}");
    assert!(u64_of(&shown, "packed_bytes") >= packed, "{shown}");
    let ratio = shown["compression_ratio"].as_f64().unwrap();
    assert!(ratio > 2.0, "{shown}");
    let plain = s.cli_json(&["volume", "show", "plain"]);
    assert!(plain["compression"].is_null(), "{plain}");
    assert_eq!(plain["compression_ratio"].as_f64(), Some(1.0), "{plain}");
    let text_view = s.cli(&["volume", "show", "logs"]).ok().to_string();
    assert!(
        text_view
            .lines()
            .any(|l| l.starts_with("compression:") && l.contains("lz4, ratio")),
        "{text_view}"
    );
    let list = s.cli_json(&["volume", "list"]);
    let listed = find_volume(&list, "logs").unwrap();
    assert_eq!(listed["compression"], "lz4", "{listed}");
    assert!(s.cli(&["volume", "list"]).ok().contains("COMPRESSION"));
    let status = s.cli_json(&["status"]);
    assert!(u64_of(&status, "packed_bytes") >= packed, "{status}");
    assert!(
        status["compression_ratio"].as_f64().unwrap() > 2.0,
        "{status}"
    );
    let metrics = http(s.api_url(), "GET", "/metrics", Some(&s.token()), None);
    assert_eq!(metrics.status, 200);
    for needle in [
        "\nbasalt_store_packed_bytes ",
        "\nbasalt_store_packed_stored_bytes ",
        "\nbasalt_store_compression_ratio ",
        "\nbasalt_volume_packed_bytes{volume=\"logs\"",
    ] {
        assert!(metrics.body.contains(needle), "no {needle:?} in /metrics");
    }

    // What was compressed reads back byte for byte.
    assert_same(&read(&mut c, 0, DATA_LEN), &expected, "after compact");

    // Writes into compressed extents: 64 KiB aligned, and 1000 bytes at
    // an odd offset (read-modify-write); the data around them stays.
    let patch = vec![0xA5u8; 64 << 10];
    let at = (3 << 20) + (12 << 10);
    write(&mut c, at as u64, &patch);
    expected[at..at + patch.len()].copy_from_slice(&patch);
    let odd = vec![0x5Au8; 1000];
    let at = (5 << 20) + 123;
    write(&mut c, at as u64, &odd);
    expected[at..at + odd.len()].copy_from_slice(&odd);
    assert_same(&read(&mut c, 0, DATA_LEN), &expected, "after writes");
    // The rewritten extents are compressed again.
    let again = s.cli_json(&["volume", "compact", "logs"]);
    assert!(u64_of(&again, "packed_extents") >= 1, "{again}");
    assert_same(&read(&mut c, 0, DATA_LEN), &expected, "after recompact");
    c.disconnect().unwrap();

    // A codec nobody knows: one line naming those there are.
    for args in [
        &[
            "volume",
            "create",
            "bad",
            "--size",
            "8M",
            "--compression",
            "gzip",
        ][..],
        &["type", "create", "bad", "--compression", "zstd:99"][..],
    ] {
        let line = s.cli(args).cli_error(1);
        assert!(line.contains("lz4") && line.contains("zstd"), "{line}");
    }
    assert!(find_volume(&s.cli_json(&["volume", "list"]), "bad").is_none());
    // Compacting a volume without compression: one line.
    let line = s.cli(&["volume", "compact", "plain"]).cli_error(1);
    assert!(line.contains("not compressed"), "{line}");

    // A volume type's codec reaches its volumes; a create's own wins.
    s.cli(&["type", "create", "cold", "--compression", "zstd:3"])
        .ok();
    assert_eq!(
        s.cli_json(&["type", "show", "cold"])["compression"],
        "zstd:3"
    );
    s.cli(&[
        "volume", "create", "archive", "--size", "8M", "--type", "cold",
    ])
    .ok();
    let archive = s.cli_json(&["volume", "show", "archive"]);
    assert_eq!(archive["compression"], "zstd:3", "{archive}");
    s.cli(&[
        "volume",
        "create",
        "hot",
        "--size",
        "8M",
        "--type",
        "cold",
        "--compression",
        "off",
    ])
    .ok();
    assert!(s.cli_json(&["volume", "show", "hot"])["compression"].is_null());
    let mut a = connect(&s, "archive");
    let some = text(2 << 20);
    write(&mut a, 0, &some);
    a.disconnect().unwrap();
    let zstd = s.cli_json(&["volume", "compact", "archive"]);
    assert_eq!(zstd["compression"], "zstd:3", "{zstd}");
    assert!(u64_of(&zstd, "stored_bytes") * 2 < u64_of(&zstd, "packed_bytes"));

    // After a restart: the data reads back and the volume is still lz4
    // (its compactor policy comes back from the catalog).
    assert!(s.sigterm(Duration::from_secs(30)).success());
    s.restart();
    assert!(s.log().contains("compression policy set for volumes"));
    let shown = s.cli_json(&["volume", "show", "logs"]);
    assert_eq!(shown["compression"], "lz4", "{shown}");
    assert!(u64_of(&shown, "packed_bytes") > 0, "{shown}");
    let mut c = connect(&s, "logs");
    assert_same(&read(&mut c, 0, DATA_LEN), &expected, "after restart");
    c.disconnect().unwrap();
    let mut a = connect(&s, "archive");
    assert_same(&read(&mut a, 0, some.len()), &some, "zstd after restart");
    a.disconnect().unwrap();
    let after = s.cli_json(&["volume", "compact", "logs"]);
    assert_eq!(after["compression"], "lz4", "{after}");

    // A clone has its source's codec unless it asks for another, and
    // reads the compressed snapshot's data.
    s.cli(&["snapshot", "create", "logs", "s1"]).ok();
    s.cli(&["volume", "create", "copy", "--from", "logs@s1"])
        .ok();
    assert_eq!(
        s.cli_json(&["volume", "show", "copy"])["compression"],
        "lz4"
    );
    s.cli(&[
        "volume",
        "create",
        "copy2",
        "--from",
        "logs@s1",
        "--compression",
        "zstd",
    ])
    .ok();
    assert_eq!(
        s.cli_json(&["volume", "show", "copy2"])["compression"],
        "zstd"
    );
    let mut c = connect(&s, "copy");
    assert_same(&read(&mut c, 0, DATA_LEN), &expected, "clone");
    c.disconnect().unwrap();
}

/// A replicated volume's compression reaches every replica's node: each
/// node's compactor packs its own copy once the data has gone unwritten for
/// `--compact-after`, the copies stay identical (replication, reads and
/// writes through either node see packed extents as any other), and a
/// write into packed data reaches both.
#[test]
fn replicated_volumes_are_compressed_on_every_replica() {
    use common::cluster::Cluster;
    let c = Cluster::start_with(2, &[], |_| vec!["--compact-after".into(), "1s".into()]);
    c.nodes[0]
        .cli(&[
            "volume",
            "create",
            "rlogs",
            "--size",
            "16M",
            "--replicas",
            "2",
            "--compression",
            "lz4",
        ])
        .ok();
    c.wait_volume(0, "rlogs", "placed and in sync", common::cluster::healthy);
    let mut expected = text(DATA_LEN);
    let mut client = connect(&c.nodes[0], "rlogs");
    write(&mut client, 0, &expected);
    // Each node looks for cold data every second here: wait for both.
    let packed = |i: usize| u64_of(&c.nodes[i].cli_json(&["status"]), "packed_bytes");
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    while packed(0) < DATA_LEN as u64 / 2 || packed(1) < DATA_LEN as u64 / 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the replicas were not compressed: {} and {} bytes packed\n{}",
            packed(0),
            packed(1),
            c.logs()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    c.assert_replicas_equal(&[0, 1], "rlogs");
    let mut other = connect(&c.nodes[1], "rlogs");
    assert_same(&read(&mut other, 0, DATA_LEN), &expected, "through node1");
    let patch = vec![0x3Cu8; 40 << 10];
    let at = (2 << 20) + (8 << 10);
    write(&mut other, at as u64, &patch);
    expected[at..at + patch.len()].copy_from_slice(&patch);
    assert_same(&read(&mut client, 0, DATA_LEN), &expected, "through node0");
    c.assert_replicas_equal(&[0, 1], "rlogs");

    // A retype gives a replicated volume a codec: every node holding a
    // replica follows the record and packs its copy.
    c.nodes[0]
        .cli(&["type", "create", "cold", "--compression", "zstd"])
        .ok();
    c.nodes[0]
        .cli(&[
            "volume",
            "create",
            "rplain",
            "--size",
            "16M",
            "--replicas",
            "2",
        ])
        .ok();
    c.wait_volume(0, "rplain", "placed and in sync", common::cluster::healthy);
    let plain = text(DATA_LEN);
    let mut client = connect(&c.nodes[0], "rplain");
    write(&mut client, 0, &plain);
    std::thread::sleep(Duration::from_secs(3));
    let base = [packed(0), packed(1)];
    c.nodes[1].cli(&["volume", "retype", "rplain", "cold"]).ok();
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    while packed(0) < base[0] + DATA_LEN as u64 / 2 || packed(1) < base[1] + DATA_LEN as u64 / 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the retyped replicas were not compressed: {} and {} bytes packed (before: {base:?})\n{}",
            packed(0),
            packed(1),
            c.logs()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    c.assert_replicas_equal(&[0, 1], "rplain");
    assert_same(&read(&mut client, 0, DATA_LEN), &plain, "retyped");
    // Re-encrypting a replicated volume is not built: one line, nothing
    // changed.
    c.nodes[0]
        .cli(&["type", "create", "sealed", "--encrypted"])
        .ok();
    let line = c.nodes[0]
        .cli(&["volume", "retype", "rplain", "sealed"])
        .cli_error(1);
    assert!(line.contains("replicated volume"), "{line}");
    assert_eq!(c.show(0, "rplain")["encrypted"], false);
}

/// `volume compact` of a replicated volume, asked through a node holding
/// no replica of it, packs every replica's copy and its snapshots before
/// it answers (the nodes' own compactors wait 10 minutes for cold data,
/// so nothing else packs them here); the copies stay identical, a write
/// into packed data reaches both, and the snapshot still reads as taken.
#[test]
fn compacting_a_replicated_volume_packs_every_replica_before_it_answers() {
    use common::cluster::{healthy, node_index, node_names, Cluster};
    let c = Cluster::start(3, &[]);
    c.nodes[0]
        .cli(&[
            "volume",
            "create",
            "rcold",
            "--size",
            "16M",
            "--replicas",
            "2",
            "--compression",
            "lz4",
        ])
        .ok();
    let v = c.wait_volume(0, "rcold", "placed and in sync", healthy);
    let holders: Vec<usize> = node_names(&v).iter().map(|n| node_index(n)).collect();
    let asker = (0..3)
        .find(|i| !holders.contains(i))
        .expect("a node without a replica");
    let old = text(DATA_LEN);
    let mut client = connect(&c.nodes[holders[0]], "rcold");
    write(&mut client, 0, &old);
    c.nodes[asker]
        .cli(&["snapshot", "create", "rcold", "before"])
        .ok();
    let mut expected = old.clone();
    let patch: Vec<u8> = text(2 << 20)
        .iter()
        .map(|b| b.to_ascii_uppercase())
        .collect();
    write(&mut client, 1 << 20, &patch);
    expected[1 << 20..(1 << 20) + patch.len()].copy_from_slice(&patch);
    let packed = |i: usize| u64_of(&c.nodes[i].cli_json(&["status"]), "packed_bytes");
    assert_eq!((packed(holders[0]), packed(holders[1])), (0, 0));

    let line = c.nodes[asker]
        .cli(&["volume", "compact", "rcold", "--rate", "0"])
        .cli_error(1);
    assert!(line.contains("--rate"), "{line}");
    let report = c.nodes[asker].cli_json(&["volume", "compact", "rcold", "--rate", "256M"]);
    // The volume's 8 MiB and the snapshot's own 2 MiB (the rest it shares
    // with the volume), on the primary's copy.
    assert!(
        u64_of(&report, "packed_bytes") >= DATA_LEN as u64 + (2 << 20),
        "{report}"
    );
    assert!(
        u64_of(&report, "stored_bytes") < u64_of(&report, "packed_bytes") / 2,
        "{report}"
    );
    for &i in &holders {
        assert!(
            packed(i) >= DATA_LEN as u64 + (2 << 20),
            "node{i} packed {} bytes when the compaction answered\n{}",
            packed(i),
            c.logs()
        );
    }
    assert_eq!(
        packed(asker),
        0,
        "a node without a replica packed something"
    );
    c.assert_replicas_equal(&holders, "rcold");
    let mut other = connect(&c.nodes[holders[1]], "rcold");
    assert_same(
        &read(&mut other, 0, DATA_LEN),
        &expected,
        "after compacting",
    );
    let at = (5 << 20) + (4 << 10);
    write(&mut other, at as u64, &patch[..12 << 10]);
    expected[at..at + (12 << 10)].copy_from_slice(&patch[..12 << 10]);
    assert_same(
        &read(&mut client, 0, DATA_LEN),
        &expected,
        "written into packed data",
    );
    c.assert_replicas_equal(&holders, "rcold");
    let mut snap = connect(&c.nodes[holders[0]], "rcold@before");
    assert_same(&read(&mut snap, 0, DATA_LEN), &old, "the snapshot");
    // Through a node holding no replica: read from the primary's copy, and
    // read-only.
    let mut snap = connect(&c.nodes[asker], "rcold@before");
    assert_same(
        &read(&mut snap, 0, DATA_LEN),
        &old,
        "the snapshot elsewhere",
    );
    assert!(
        snap.is_read_only(),
        "the snapshot's export is not read-only"
    );
    let one = WriteOp::Data {
        offset: 0,
        data: patch[..4096].to_vec(),
    };
    let refused = snap.write_pipelined(std::iter::once(Ok::<_, ClientError>(one)), 1);
    assert!(refused.is_err(), "a write to a snapshot went through");
    // A diff needs the layers here: one line naming where they are.
    c.nodes[asker]
        .cli(&["snapshot", "create", "rcold", "after"])
        .ok();
    let line = c.nodes[asker]
        .cli(&["volume", "diff", "rcold@before", "rcold@after"])
        .cli_error(1);
    assert!(line.contains("no in-sync replica"), "{line}");
    assert!(line.contains(&format!("node{}", holders[0])), "{line}");
}

/// fio `verify=crc32c` through compressed volumes: 50%-compressible data
/// (fio's `buffer_compress_percentage=50`) written, compacted (ratio
/// reported, at least 1.8×) and verified; incompressible data left as it
/// was (no packed extent) and verified; a snapshot compacted with its
/// volume and a clone of it verified; an encrypted and compressed volume
/// (compress, then encrypt) compacted and verified (the store's tests
/// check that no plaintext reaches the device).
#[test]
fn fio_verifies_compressible_incompressible_snapshot_clone_and_encrypted_volumes() {
    require_tool("fio");
    let scratch = Scratch::new();
    let key = scratch.path("master.key");
    let s = Server::start_with("512M", &["--master-key-file", key.to_str().unwrap()]);
    let fio = |volume: &str, write: bool, compressible: bool| {
        let mut cmd = std::process::Command::new(require_tool("fio"));
        cmd.current_dir(&scratch.0).args([
            format!("--name={volume}"),
            "--ioengine=nbd".into(),
            format!("--uri={}", s.uri(volume)),
            "--rw=write".into(),
            "--bs=64k".into(),
            "--iodepth=4".into(),
            "--size=16M".into(),
            "--verify=crc32c".into(),
            "--verify_fatal=1".into(),
            "--verify_state_save=0".into(),
            "--randseed=42".into(),
            format!("--verify_only={}", u8::from(!write)),
            format!("--do_verify={}", u8::from(!write)),
        ]);
        if compressible {
            cmd.args(["--buffer_compress_percentage=50", "--refill_buffers"]);
        } else {
            cmd.arg("--refill_buffers");
        }
        let out = cmd.output().expect("fio runs");
        assert!(
            out.status.success(),
            "fio {volume} (write: {write}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let create = |name: &str, extra: &[&str]| {
        let mut args = vec!["volume", "create", name, "--size", "16M"];
        args.extend_from_slice(extra);
        s.cli(&args).ok();
    };
    create("half", &["--compression", "lz4"]);
    create("noise", &["--compression", "zstd"]);
    create("sealed", &["--compression", "lz4", "--encrypted"]);
    for (v, compressible) in [("half", true), ("noise", false), ("sealed", true)] {
        fio(v, true, compressible);
    }
    s.cli(&["snapshot", "create", "half", "s1"]).ok();
    s.cli(&["volume", "create", "half-clone", "--from", "half@s1"])
        .ok();
    for v in ["half", "noise", "sealed"] {
        let r = s.cli_json(&["volume", "compact", v]);
        let (packed, stored) = (u64_of(&r, "packed_bytes"), u64_of(&r, "stored_bytes"));
        eprintln!("{v}: {r}");
        if v == "noise" {
            assert_eq!(packed, 0, "random data is left as it is: {r}");
            assert!(u64_of(&r, "incompressible_extents") >= 16, "{r}");
        } else {
            assert!(packed >= 16 << 20, "{r}");
            let ratio = packed as f64 / stored as f64;
            assert!(
                ratio >= 1.8,
                "{v}: 50%-compressible data saves {ratio:.2}x: {r}"
            );
        }
    }
    for v in ["half", "noise", "sealed", "half-clone"] {
        fio(v, false, v != "noise");
    }
}

/// `volume import --compression --encrypted`: the imported volume has the
/// codec and the encryption asked for, compacts, holds no plaintext of the
/// image on the device, and exports the image's bytes back.
#[test]
fn an_imported_image_is_compressed_and_encrypted_as_asked() {
    let dir = Scratch::new();
    let key = dir.path("master.key");
    let s = Server::start_with("256M", &["--master-key-file", key.to_str().unwrap()]);
    let image = dir.path("logs.raw");
    let data = text(DATA_LEN);
    std::fs::write(&image, &data).unwrap();
    let image = image.to_str().unwrap();
    s.cli(&[
        "volume",
        "import",
        "logs",
        image,
        "--format",
        "raw",
        "--compression",
        "zstd",
        "--encrypted",
    ])
    .ok();
    let shown = s.cli_json(&["volume", "show", "logs"]);
    assert_eq!(shown["compression"], "zstd", "{shown}");
    assert_eq!(shown["encrypted"], true, "{shown}");
    let report = s.cli_json(&["volume", "compact", "logs"]);
    assert!(
        u64_of(&report, "stored_bytes") * 2 < u64_of(&report, "packed_bytes"),
        "less than 2:1 on text: {report}"
    );
    let exported = dir.path("back.raw");
    s.cli(&["volume", "export", "logs", exported.to_str().unwrap()])
        .ok();
    assert_same(&std::fs::read(&exported).unwrap(), &data, "exported image");
    // The first line of the text is nowhere on the device.
    let device = std::fs::read(s.data_dir().join("basalt.data")).unwrap();
    let needle = &data[..64];
    assert!(
        !device.windows(needle.len()).any(|w| w == needle),
        "plaintext of the image on the device"
    );
}

/// A retype gives a volume its new type's compression online: the
/// background compactor packs it with the new codec (the store's policy
/// follows the record at once), data packed before stays readable, and a
/// retype to a type without compression stops the packing.
#[test]
fn a_retype_changes_compression_online() {
    let mut s = Server::start_with("128M", &["--compact-after", "1s"]);
    s.cli(&["type", "create", "cold", "--compression", "zstd"])
        .ok();
    s.cli(&["type", "create", "plain"]).ok();
    s.create_volume("v", "16M");
    let data = text(DATA_LEN);
    let mut c = connect(&s, "v");
    write(&mut c, 0, &data);
    let packed = |s: &Server| u64_of(&s.cli_json(&["volume", "show", "v"]), "packed_bytes");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(packed(&s), 0, "packed without a codec");

    // Retyped while connected: its cold data is packed in the background.
    s.cli(&["volume", "retype", "v", "cold"]).ok();
    assert_eq!(s.cli_json(&["volume", "show", "v"])["compression"], "zstd");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while packed(&s) < DATA_LEN as u64 {
        assert!(
            std::time::Instant::now() < deadline,
            "not packed after the retype: {}",
            s.cli_json(&["volume", "show", "v"])
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_same(&read(&mut c, 0, DATA_LEN), &data, "after the retype");

    // To a type without compression: a write unpacks its extent, which is
    // not packed again once cold; what stays packed reads back.
    s.cli(&["volume", "retype", "v", "plain"]).ok();
    let shown = s.cli_json(&["volume", "show", "v"]);
    assert!(shown["compression"].is_null(), "{shown}");
    let before = packed(&s);
    write(&mut c, 4096, &data[..4096]);
    let mut expected = data.clone();
    expected.copy_within(0..4096, 4096);
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        packed(&s),
        before - CHUNK as u64,
        "packed again without a codec"
    );
    assert_same(
        &read(&mut c, 0, DATA_LEN),
        &expected,
        "after the second retype",
    );
    drop(c);
    // The policy is the catalog's across a restart.
    assert!(s.sigterm(Duration::from_secs(30)).success());
    s.restart();
    let shown = s.cli_json(&["volume", "show", "v"]);
    assert!(shown["compression"].is_null(), "{shown}");
    let mut c = connect(&s, "v");
    assert_same(&read(&mut c, 0, DATA_LEN), &expected, "after a restart");
}
