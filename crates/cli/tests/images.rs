//! Images and changed-block streams through the whole server, checked with
//! tools nobody here wrote: `volume import` of qcow2 (plain and compressed)
//! and raw images keeps their content (`qemu-img compare`) and their holes
//! (`nbdinfo --map`); `volume export` writes images `qemu-img check` finds
//! clean and equal to the source, a snapshot's as it was; `diff`,
//! `export-diff` and `import-diff` (through files and through a pipe) make
//! a second volume identical to the first, snapshot by snapshot; and bad
//! input (a truncated or foreign image, a damaged stream, a missing base
//! snapshot) gets one line and changes nothing.

mod common;

use common::cluster::{healthy, node_index, primary, Cluster};
use common::*;
use serde_json::Value;
use std::path::Path;

const MIB: u64 = 1 << 20;

fn qemu_img(args: &[&str]) -> CmdOutput {
    tool("qemu-img", args)
}

fn compare(a: &str, a_fmt: &str, b: &str, b_fmt: &str) -> CmdOutput {
    qemu_img(&["compare", "-f", a_fmt, "-F", b_fmt, a, b])
}

/// Bytes `nbdinfo --map` reports as allocated data (not hole/zero).
fn mapped_data(s: &Server, export: &str) -> u64 {
    let out = tool("nbdinfo", ["--map", "--json", &s.uri(export)]);
    let map: Value = serde_json::from_str(out.ok()).unwrap();
    map.as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"].as_u64() == Some(0))
        .map(|e| e["length"].as_u64().unwrap())
        .sum()
}

fn digest(s: &Server, volume: &str) -> u64 {
    s.cli_json(&["volume", "local-digest", volume])["crc32c"]
        .as_u64()
        .unwrap()
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[test]
fn import_and_export_keep_content_and_holes() {
    require_tool("qemu-img");
    require_tool("nbdinfo");
    let s = Server::start("1G");
    let dir = Scratch::new();
    let src = dir.path("src.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", p(&src), "64M"]).ok();
    tool(
        "qemu-io",
        [
            "-f",
            "qcow2",
            "-c",
            "write -P 0xab 1M 64k",
            "-c",
            "write -P 0x11 10M 3M",
            "-c",
            "write -z 20M 1M",
            "-c",
            "write -P 0x7e 63M 4k",
            p(&src),
        ],
    )
    .ok();

    // qcow2 in: same bytes, and only the written ranges take space.
    let out = s.cli_json(&["volume", "import", "img", p(&src)]);
    assert_eq!(out["format"], "qcow2");
    assert_eq!(out["size_bytes"], 64 * MIB);
    assert_eq!(out["written_bytes"], 64 * 1024 + 3 * MIB + 4096);
    compare(&s.uri("img"), "raw", p(&src), "qcow2").ok();
    let data = mapped_data(&s, "img");
    assert!(data <= 8 * MIB, "{data} bytes mapped for 3 MiB of data");

    // A compressed qcow2 (deflate) and a sparse raw file.
    let comp = dir.path("comp.qcow2");
    qemu_img(&["convert", "-c", "-O", "qcow2", p(&src), p(&comp)]).ok();
    let raw = dir.path("src.raw");
    qemu_img(&["convert", "-O", "raw", p(&src), p(&raw)]).ok();
    s.cli(&["volume", "import", "img-comp", p(&comp)]).ok();
    compare(&s.uri("img-comp"), "raw", p(&src), "qcow2").ok();
    s.cli(&["volume", "import", "img-raw", p(&raw), "--size", "80M"])
        .ok();
    compare(&s.uri("img-raw"), "raw", p(&src), "qcow2").ok();
    assert!(mapped_data(&s, "img-raw") <= 8 * MIB);

    // Out as qcow2: clean, equal, sparse. Then a snapshot, as it was.
    let out_q = dir.path("out.qcow2");
    s.cli(&["volume", "export", "img", p(&out_q)]).ok();
    qemu_img(&["check", "-q", p(&out_q)]).ok();
    compare(p(&out_q), "qcow2", p(&src), "qcow2").ok();
    let file_size = std::fs::metadata(&out_q).unwrap().len();
    assert!(file_size < 8 * MIB, "exported qcow2 is {file_size} bytes");

    s.cli(&["snapshot", "create", "img", "s1"]).ok();
    qemu_io(&s.uri("img"), &["write -P 0x44 0 8M"]).ok();
    let out_r = dir.path("snap.raw");
    let out = s.cli_json(&["volume", "export", "img@s1", p(&out_r)]);
    assert_eq!(out["format"], "raw");
    compare(p(&out_r), "raw", p(&src), "qcow2").ok();
    assert!(compare(p(&out_r), "raw", &s.uri("img"), "raw").code() == Some(1));

    // An existing file is not overwritten without --force.
    let err = s.cli(&["volume", "export", "img", p(&out_r)]).cli_error(1);
    assert!(err.contains("exists"), "{err}");
    compare(p(&out_r), "raw", p(&src), "qcow2").ok();
    s.cli(&["volume", "export", "img", p(&out_r), "--force"])
        .ok();
    compare(p(&out_r), "raw", &s.uri("img"), "raw").ok();

    // Bad images: one line, no volume left behind.
    let cut = dir.path("cut.qcow2");
    let bytes = std::fs::read(&src).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() - 512 * 1024]).unwrap();
    let err = s.cli(&["volume", "import", "bad", p(&cut)]).cli_error(1);
    assert!(err.contains("truncated"), "{err}");
    let junk = dir.path("junk.img");
    std::fs::write(&junk, vec![0x42u8; 4096]).unwrap();
    let err = s
        .cli(&["volume", "import", "bad", p(&junk), "--format", "qcow2"])
        .cli_error(1);
    assert!(err.contains("not a qcow2 image"), "{err}");
    let vmdk = dir.path("disk.vmdk");
    qemu_img(&["create", "-q", "-f", "vmdk", p(&vmdk), "8M"]).ok();
    let err = s.cli(&["volume", "import", "bad", p(&vmdk)]).cli_error(1);
    assert!(
        err.contains("VMDK image") && err.contains("qemu-img convert"),
        "{err}"
    );
    let err = s
        .cli(&["volume", "import", "bad", p(&raw), "--size", "1M"])
        .cli_error(1);
    assert!(err.contains("smaller than the image"), "{err}");
    let list = s.cli_json(&["volume", "list"]);
    let names: Vec<&str> = list["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["img", "img-comp", "img-raw"]);
}

#[test]
fn diff_export_diff_and_import_diff_replicate_a_volume_snapshot_by_snapshot() {
    let s = Server::start("1G");
    let dir = Scratch::new();
    s.create_volume("a", "32M");
    qemu_io(
        &s.uri("a"),
        &[
            "write -P 0x5a 0 4M",
            "write -P 0x21 16M 1M",
            "write -P 0x09 31M 1M",
        ],
    )
    .ok();
    s.cli(&["snapshot", "create", "a", "s1"]).ok();

    // Full stream of a@s1 onto an empty volume.
    let full = dir.path("full.diff");
    s.cli(&["volume", "export-diff", "a@s1", p(&full)]).ok();
    s.create_volume("b", "16M");
    let out = s.cli_json(&["volume", "import-diff", p(&full), "b"]);
    assert_eq!(out["snapshot"], "s1");
    assert_eq!(out["size_bytes"], 32 * MIB);
    compare(&s.uri("b@s1"), "raw", &s.uri("a@s1"), "raw").ok();

    // Changes: new data, zeros over data, a trim, growth.
    qemu_io(
        &s.uri("a"),
        &[
            "write -P 0x77 1M 8k",
            "write -z 16M 512k",
            "discard 31M 1M",
            "write -P 0x66 20M 4k",
        ],
    )
    .ok();
    s.cli(&["volume", "resize", "a", "--size", "40M"]).ok();
    qemu_io(&s.uri("a"), &["write -P 0x13 36M 4k"]).ok();
    s.cli(&["snapshot", "create", "a", "s2"]).ok();

    let d = s.cli_json(&["volume", "diff", "a@s1", "a@s2"]);
    assert_eq!(d["from"], "a@s1");
    assert_eq!(d["to"], "a@s2");
    assert_eq!(d["size_bytes"], 40 * MIB);
    let changed: u64 = d["extents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["length"].as_u64().unwrap())
        .sum();
    // 8k + 512k + 1M + 4k + 4k, at 4 KiB granularity: nothing else.
    assert_eq!(changed, 8192 + 512 * 1024 + MIB + 4096 + 4096, "{d}");
    let table = s.cli(&["volume", "diff", "a@s1", "a@s2"]).ok().to_string();
    assert!(table.contains("OFFSET") && table.contains("changed from a@s1 to a@s2"));

    let inc = dir.path("inc.diff");
    s.cli(&[
        "volume",
        "export-diff",
        "a@s2",
        p(&inc),
        "--from-snap",
        "s1",
    ])
    .ok();
    assert!(std::fs::metadata(&inc).unwrap().len() < 64 * 1024);

    // A damaged stream and a missing base change nothing.
    let mut bytes = std::fs::read(&inc).unwrap();
    let at = bytes.len() - 100;
    bytes[at] ^= 1;
    let bad = dir.path("bad.diff");
    std::fs::write(&bad, &bytes).unwrap();
    let before = digest(&s, "b");
    let err = s.cli(&["volume", "import-diff", p(&bad), "b"]).cli_error(1);
    assert!(err.contains("checksum"), "{err}");
    s.create_volume("c", "32M");
    let err = s.cli(&["volume", "import-diff", p(&inc), "c"]).cli_error(1);
    assert!(err.contains("has no snapshot s1"), "{err}");
    assert_eq!(digest(&s, "b"), before);
    let b = s.cli_json(&["volume", "show", "b"]);
    assert_eq!(b["snapshots"], serde_json::json!(["s1"]));

    s.cli(&["volume", "import-diff", p(&inc), "b"]).ok();
    compare(&s.uri("b@s2"), "raw", &s.uri("a@s2"), "raw").ok();
    assert_eq!(digest(&s, "b"), digest(&s, "a"));
    let err = s.cli(&["volume", "import-diff", p(&inc), "b"]).cli_error(1);
    assert!(err.contains("already has snapshot s2"), "{err}");

    // Through a pipe, from the volume's current content (no end snapshot).
    qemu_io(&s.uri("a"), &["write -P 0x31 8M 64k"]).ok();
    let bin = bin();
    let dd = s.data_dir().to_str().unwrap().to_string();
    let piped = run_cmd(
        std::process::Command::new("sh").arg("-c").arg(format!(
            "{bin} --data-dir {dd} volume export-diff a - --from-snap s2 | {bin} --data-dir {dd} volume import-diff - b"
        )),
        std::time::Duration::from_secs(60),
    );
    piped.ok();
    assert_eq!(digest(&s, "b"), digest(&s, "a"));
}

#[test]
fn import_and_export_over_tls_with_a_projects_key() {
    let s = Server::start_tls("512M");
    let dir = Scratch::new();
    s.cli(&["project", "create", "p1"]).ok();
    s.cli(&["project", "create", "p2"]).ok();
    s.cli(&[
        "volume",
        "create",
        "other",
        "--size",
        "8M",
        "--project",
        "p2",
    ])
    .ok();
    let keys = dir.path("p1.psk");
    let line = s
        .cli(&["nbd-key", "create", "--project", "p1"])
        .ok()
        .trim()
        .to_string();
    std::fs::write(&keys, format!("{line}\n")).unwrap();
    let identity = line.split_once(':').unwrap().0.to_string();
    let nbd = format!(
        "nbds://{identity}@{}/?tls-psk-file={}",
        s.nbd_addr(),
        keys.display()
    );

    let src = dir.path("src.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", p(&src), "16M"]).ok();
    tool(
        "qemu-io",
        ["-f", "qcow2", "-c", "write -P 0x3c 4M 1M", p(&src)],
    )
    .ok();
    s.cli(&[
        "volume",
        "import",
        "mine",
        p(&src),
        "--project",
        "p1",
        "--nbd",
        &nbd,
    ])
    .ok();
    let out = dir.path("mine.raw");
    s.cli(&["volume", "export", "mine", p(&out), "--nbd", &nbd])
        .ok();
    compare(p(&out), "raw", p(&src), "qcow2").ok();

    // Another project's volume is not there for this key; no file is left.
    let theirs = dir.path("theirs.raw");
    let err = s
        .cli(&["volume", "export", "other", p(&theirs), "--nbd", &nbd])
        .cli_error(1);
    assert!(err.contains("refused export other"), "{err}");
    assert!(!theirs.exists());
    // A wrong key gets no session.
    std::fs::write(&keys, format!("{identity}:{}\n", "00".repeat(32))).unwrap();
    let err = s
        .cli(&["volume", "export", "mine", p(&theirs), "--nbd", &nbd])
        .cli_error(1);
    assert!(err.contains("TLS"), "{err}");
}

#[test]
fn a_replicated_volume_imports_and_exports_through_any_node() {
    let c = Cluster::start(3, &[]);
    let dir = Scratch::new();
    let src = dir.path("src.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", p(&src), "24M"]).ok();
    tool(
        "qemu-io",
        [
            "-f",
            "qcow2",
            "-c",
            "write -P 0x61 0 2M",
            "-c",
            "write -P 0x62 20M 1M",
            p(&src),
        ],
    )
    .ok();
    c.nodes[0]
        .cli(&["volume", "import", "rep", p(&src), "--replicas", "3"])
        .ok();
    c.wait_volume(0, "rep", "placed and in sync", healthy);
    c.assert_replicas_equal(&[0, 1, 2], "rep");
    let out = dir.path("rep.raw");
    c.nodes[2].cli(&["volume", "export", "rep", p(&out)]).ok();
    compare(p(&out), "raw", p(&src), "qcow2").ok();
    // The live volume is diffed on its primary's node only (the head that
    // holds every acknowledged write); elsewhere, one clear line.
    let v = c.show(0, "rep");
    let p = node_index(&primary(&v).expect("a primary"));
    let d = c.nodes[p].cli_json(&["volume", "diff", "rep"]);
    let changed: u64 = d["extents"]
        .as_array()
        .expect("extents")
        .iter()
        .map(|e| e["length"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(changed, 3 * MIB, "the imported data, holes left out: {d}");
    let err = c.nodes[(p + 1) % 3]
        .cli(&["volume", "diff", "rep"])
        .cli_error(1);
    assert!(err.contains("its primary is on another node"), "{err}");
}
