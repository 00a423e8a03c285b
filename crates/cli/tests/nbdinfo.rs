//! nbdinfo (libnbd) against Basalt: export info, block sizes, --map, --list.

mod common;

use common::*;
use serde_json::Value;

#[test]
fn nbdinfo_export_info_and_block_sizes() {
    let s = Server::start("128M");
    s.create_volume("info", "64M");
    let uri = s.uri("info");

    let out = tool("nbdinfo", ["--json", &uri]);
    let v: Value = serde_json::from_str(out.ok()).expect("nbdinfo --json");
    assert_eq!(v["protocol"].as_str(), Some("newstyle-fixed"), "{v}");
    assert_eq!(
        v["structured"].as_bool(),
        Some(true),
        "structured replies: {v}"
    );
    let e = &v["exports"][0];
    assert_eq!(e["export-name"].as_str(), Some("info"), "{v}");
    assert_eq!(e["export-size"].as_u64(), Some(64 * MIB), "{v}");
    assert_eq!(e["block_size_minimum"].as_u64(), Some(512), "{v}");
    assert_eq!(e["block_size_preferred"].as_u64(), Some(4096), "{v}");
    let max = e["block_size_maximum"]
        .as_u64()
        .unwrap_or_else(|| panic!("no block_size_maximum: {v}"));
    assert!(max >= 4096 && max & 4095 == 0, "block_size_maximum {max}");
    assert!(
        e["contexts"]
            .as_array()
            .is_some_and(|c| c.iter().any(|x| x == "base:allocation")),
        "base:allocation not offered: {v}"
    );
    for flag in [
        "can_flush",
        "can_fua",
        "can_trim",
        "can_zero",
        "can_cache",
        "can_multi_conn",
    ] {
        assert_eq!(e[flag].as_bool(), Some(true), "{flag}: {v}");
    }
    assert_eq!(e["is_read_only"].as_bool(), Some(false), "{v}");

    let size = tool("nbdinfo", ["--size", &uri]);
    assert_eq!(size.ok().trim(), (64 * MIB).to_string());

    // An unknown export is refused, and the server keeps serving.
    let bad = tool("nbdinfo", ["--size", &s.uri("no-such-volume")]);
    assert_ne!(
        bad.code(),
        Some(0),
        "unknown export accepted:\n{}",
        bad.describe()
    );
    tool("nbdinfo", ["--size", &uri]).ok();
}

#[test]
fn nbdinfo_map_fresh_then_written() {
    let s = Server::start("128M");
    s.create_volume("map", "64M");
    let uri = s.uri("map");

    // A fresh volume: exactly one extent, hole+zero, covering it all.
    let map = nbd_map(&uri, 64 * MIB);
    assert_eq!(map, vec![(0, 64 * MIB, 3)], "fresh volume map");
    let text = tool("nbdinfo", ["--map", &uri]);
    assert!(text.ok().contains("hole,zero"), "{}", text.stdout);

    // Write 1 MiB at 8 MiB and 4 KiB at 40 MiB + 4 KiB.
    tool(
        "qemu-io",
        [
            "-f",
            "raw",
            "-c",
            "write -P 0x61 8M 1M",
            "-c",
            "write -P 0x62 40964k 4k",
            &uri,
        ],
    )
    .ok();
    let map = nbd_map(&uri, 64 * MIB);
    // written ranges are data (type 0: neither hole nor zero)
    assert_eq!(
        map_bytes(&map, 8 * MIB, MIB, |t| t == 0),
        MIB,
        "8M..9M not data: {map:?}"
    );
    assert_eq!(
        map_bytes(&map, 40964 * KIB, 4 * KIB, |t| t == 0),
        4 * KIB,
        "40M+4k not data: {map:?}"
    );
    // far-away ranges are still holes
    assert_eq!(
        map_bytes(&map, 0, 4 * MIB, |t| t == 3),
        4 * MIB,
        "0..4M not hole: {map:?}"
    );
    assert_eq!(
        map_bytes(&map, 48 * MIB, 16 * MIB, |t| t == 3),
        16 * MIB,
        "48M.. not hole: {map:?}"
    );
    // data is not over-reported wildly (allocation granularity may round up)
    let data = map_bytes(&map, 0, 64 * MIB, |t| t & 1 == 0);
    assert!(
        data <= 8 * MIB,
        "{data} bytes reported allocated for 1 MiB + 4 KiB written: {map:?}"
    );

    // --totals agrees
    let tot = tool("nbdinfo", ["--map", "--totals", "--json", &uri]);
    let v: Value = serde_json::from_str(tot.ok()).expect("--totals json");
    let data_tot: u64 = v
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"].as_u64().unwrap() & 1 == 0)
        .map(|e| e["size"].as_u64().unwrap())
        .sum();
    assert_eq!(data_tot, data, "--totals {v}");

    // trim everything: one hole again
    nbd_script(
        "nbdtool.py",
        [
            "trim",
            &uri,
            "--offset",
            "0",
            "--length",
            &(64 * MIB).to_string(),
            "--flush",
        ],
    )
    .ok();
    let map = nbd_map(&uri, 64 * MIB);
    assert_eq!(
        map_bytes(&map, 0, 64 * MIB, |t| t & 1 == 1),
        64 * MIB,
        "trimming the whole volume left allocated extents: {map:?}"
    );
}

#[test]
fn nbdinfo_list_exports() {
    let s = Server::start("128M");
    s.create_volume("one", "4M");
    s.create_volume("two", "8M");
    let out = tool(
        "nbdinfo",
        ["--list", "--json", &format!("nbd://{}/", s.nbd_addr())],
    );
    let v: Value = serde_json::from_str(out.ok()).expect("--list --json");
    let exports = v["exports"]
        .as_array()
        .unwrap_or_else(|| panic!("no exports: {v}"));
    let mut names: Vec<(String, u64)> = exports
        .iter()
        .map(|e| {
            (
                e["export-name"].as_str().unwrap().to_string(),
                e["export-size"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    names.sort();
    assert_eq!(
        names,
        vec![("one".to_string(), 4 * MIB), ("two".to_string(), 8 * MIB)],
        "{v}"
    );

    // A deleted volume disappears from the list.
    s.cli(&["volume", "delete", "one"]).ok();
    let out = tool(
        "nbdinfo",
        ["--list", "--json", &format!("nbd://{}/", s.nbd_addr())],
    );
    let v: Value = serde_json::from_str(out.ok()).expect("--list --json");
    let names: Vec<&str> = v["exports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["export-name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["two"], "{v}");
}
