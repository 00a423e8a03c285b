//! Data checksums through the whole server: bits flipped in the data file
//! (as a disk does it) make QEMU's reads of those blocks fail with EIO —
//! never return the flipped bytes — while the rest reads back; `basalt
//! volume scrub` lists exactly the damaged blocks and exits non-zero;
//! `basalt status` and /metrics count the errors.

mod common;

use common::*;
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::time::Duration;

const BLOCK: u64 = 4096;

/// Offsets in the data file of 4 KiB blocks filled with `byte`.
fn blocks_filled_with(path: &std::path::Path, byte: u8) -> Vec<u64> {
    let data = std::fs::read(path).expect("data file");
    data.chunks(BLOCK as usize)
        .enumerate()
        .filter(|(_, b)| b.iter().all(|&x| x == byte))
        .map(|(i, _)| i as u64 * BLOCK)
        .collect()
}

#[test]
fn flipped_bits_are_read_errors_and_scrub_finds_them() {
    let mut s = Server::start("256M");
    s.create_volume("db", "64M");
    let uri = s.uri("db");
    // Three recognisable blocks at known volume offsets, and a pattern
    // around them.
    qemu_io(&uri, &["write -P 0x11 0 8M"]).ok();
    for (i, at) in [1u64, 700, 1500].iter().enumerate() {
        qemu_io(&uri, &[&format!("write -P {} {} 4k", 0xa1 + i, at * BLOCK)]).ok();
    }
    assert_eq!(s.sigterm(Duration::from_secs(30)).code(), Some(0));

    let data = s.data_dir().join("basalt.data");
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&data)
        .unwrap();
    for (i, fill) in [0xa1u8, 0xa2, 0xa3].iter().enumerate() {
        let at = blocks_filled_with(&data, *fill);
        assert_eq!(at.len(), 1, "block {i} is in the data file once");
        let mut b = [0u8; 1];
        file.read_exact_at(&mut b, at[0] + 100 * i as u64).unwrap();
        b[0] ^= 1 << i;
        file.write_all_at(&b, at[0] + 100 * i as u64).unwrap();
    }
    file.sync_all().unwrap();
    drop(file);
    s.restart();
    let uri = s.uri("db"); // a new port

    // Reads of a damaged block fail; the blocks around it read back.
    let out = qemu_io(&uri, &["read -P 0xa2 2867200 4k"]);
    assert!(
        out.stdout.contains("Input/output error") || out.stderr.contains("Input/output error"),
        "a damaged block must be a read error:\n{}",
        out.describe()
    );
    qemu_io(&uri, &["read -P 0x11 8k 2M"]).ok();

    let json = s.cli(&["volume", "scrub", "db", "--output", "json"]);
    assert_eq!(json.code(), Some(1), "{}", json.describe());
    let report: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(
        report["bad_blocks"],
        serde_json::json!([BLOCK, 700 * BLOCK, 1500 * BLOCK]),
        "{report}"
    );
    assert!(report["bytes_checked"].as_u64().unwrap() >= 8 << 20);
    let table = s.cli(&["volume", "scrub", "db", "--rate", "512M"]);
    let err = table.cli_error(1);
    assert!(err.contains("3 damaged 4 KiB blocks"), "{err}");
    assert!(
        table.stdout.contains("damaged blocks"),
        "{}",
        table.describe()
    );

    let status = s.cli_json(&["status"]);
    assert_eq!(status["data_checksums"], true);
    assert!(status["checksum_errors"].as_u64().unwrap() >= 1, "{status}");
    let metrics = ureq::get(&format!("{}/metrics", s.api_url()))
        .set("Authorization", &format!("Bearer {}", s.token()))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    assert!(
        metrics.contains("basalt_store_data_checksums 1")
            && metrics.contains("basalt_store_checksum_errors_total"),
        "{metrics}"
    );

    // Rewriting the damaged blocks heals them.
    for (i, at) in [1u64, 700, 1500].iter().enumerate() {
        qemu_io(&uri, &[&format!("write -P {} {} 4k", 0xa1 + i, at * BLOCK)]).ok();
    }
    s.cli(&["volume", "scrub", "db"]).ok();
    assert!(
        s.cli(&["volume", "scrub", "nope"])
            .cli_error(1)
            .contains("nope"),
        "an unknown volume is one line"
    );
    let bad_rate = s.cli(&["volume", "scrub", "db", "--rate", "0"]);
    assert!(bad_rate.cli_error(1).contains("--rate"));
}
