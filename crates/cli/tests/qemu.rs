//! QEMU's NBD client (qemu-img, qemu-io) against a Basalt volume.

mod common;

use common::*;

#[track_caller]
fn qemu_io_ok(uri: &str, cmds: &[&str]) {
    let out = qemu_io(uri, cmds);
    out.ok();
    assert!(
        !out.stdout.contains("verification failed") && !out.stderr.contains("verification failed"),
        "qemu-io pattern mismatch:\n{}",
        out.describe()
    );
}

#[test]
fn qemu_img_convert_compare_roundtrip() {
    let s = Server::start("128M");
    s.create_volume("disk", "64M");
    let uri = s.uri("disk");
    let dir = Scratch::new();
    let src = dir.path("src.qcow2");
    let src_s = src.to_str().unwrap();

    // the virtual size as QEMU sees it
    let info = tool("qemu-img", ["info", "--output", "json", &uri]);
    let v: serde_json::Value = serde_json::from_str(info.ok()).expect("qemu-img info json");
    assert_eq!(v["virtual-size"].as_u64(), Some(64 * MIB), "{v}");

    // Old data in the volume that the conversion must overwrite with zeros (convert -n
    // cannot assume a zeroed target).
    qemu_io_ok(
        &uri,
        &[
            "write -P 0x77 10M 2M",
            "write -P 0x77 30M 64k",
            "write -P 0x77 63M 1M",
        ],
    );

    tool("qemu-img", ["create", "-q", "-f", "qcow2", src_s, "64M"]).ok();
    let out = tool(
        "qemu-io",
        [
            "-f",
            "qcow2",
            "-c",
            "write -P 0xab 0 1M",
            "-c",
            "write -P 0xcd 5M 512k",
            "-c",
            "write -P 0x11 20484k 8k",
            "-c",
            "write -P 0x3c 1536 2560",
            "-c",
            "write -P 0xef 63M 1M",
            src_s,
        ],
    );
    out.ok();

    tool(
        "qemu-img",
        ["convert", "-n", "-f", "qcow2", "-O", "raw", src_s, &uri],
    )
    .ok();
    let cmp = tool(
        "qemu-img",
        ["compare", "-f", "qcow2", "-F", "raw", src_s, &uri],
    );
    assert_eq!(
        cmp.code(),
        Some(0),
        "images differ after convert:\n{}",
        cmp.describe()
    );

    // The old 0x77 data is gone, the new data is there (independent of qemu-img compare).
    qemu_io_ok(
        &uri,
        &[
            "read -P 0xab 0 1536",
            "read -P 0x3c 1536 2560",
            "read -P 0xab 4096 1020k",
            "read -P 0 10M 2M",
            "read -P 0 30M 64k",
            "read -P 0x11 20484k 8k",
            "read -P 0xef 63M 1M",
        ],
    );

    // and back out into a new qcow2
    let back = dir.path("back.qcow2");
    let back_s = back.to_str().unwrap();
    tool(
        "qemu-img",
        ["convert", "-f", "raw", "-O", "qcow2", &uri, back_s],
    )
    .ok();
    let cmp = tool(
        "qemu-img",
        ["compare", "-f", "qcow2", "-F", "qcow2", src_s, back_s],
    );
    assert_eq!(
        cmp.code(),
        Some(0),
        "copy back out differs:\n{}",
        cmp.describe()
    );

    // Negative control: a change in the volume is detected by compare.
    qemu_io_ok(&uri, &["write -P 0x99 40M 4k"]);
    let cmp = tool(
        "qemu-img",
        ["compare", "-f", "qcow2", "-F", "raw", src_s, &uri],
    );
    assert_eq!(
        cmp.code(),
        Some(1),
        "compare should report a difference:\n{}",
        cmp.describe()
    );
}

#[test]
fn qemu_img_convert_target_is_zero_into_fresh_volume() {
    let s = Server::start("128M");
    s.create_volume("fresh", "32M");
    let uri = s.uri("fresh");
    let dir = Scratch::new();
    let src = dir.path("src.raw");
    let src_s = src.to_str().unwrap();
    tool("qemu-img", ["create", "-q", "-f", "raw", src_s, "32M"]).ok();
    tool(
        "qemu-io",
        [
            "-f",
            "raw",
            "-c",
            "write -P 0x42 3M 3M",
            "-c",
            "write -P 0x24 31M 1M",
            src_s,
        ],
    )
    .ok();
    tool(
        "qemu-img",
        [
            "convert",
            "-n",
            "--target-is-zero",
            "-f",
            "raw",
            "-O",
            "raw",
            src_s,
            &uri,
        ],
    )
    .ok();
    let cmp = tool(
        "qemu-img",
        ["compare", "-f", "raw", "-F", "raw", src_s, &uri],
    );
    assert_eq!(cmp.code(), Some(0), "images differ:\n{}", cmp.describe());
    // holes stayed holes: at most the written 4 MiB plus allocation rounding is data
    let map = nbd_map(&uri, 32 * MIB);
    let data = map_bytes(&map, 0, 32 * MIB, |t| t & 1 == 0);
    assert!(
        data >= 4 * MIB,
        "written ranges not reported allocated: {map:?}"
    );
    assert!(
        data <= 12 * MIB,
        "--target-is-zero convert allocated {data} bytes: {map:?}"
    );
}

#[test]
fn qemu_io_write_read_patterns() {
    let s = Server::start("64M");
    s.create_volume("qio", "16M");
    let uri = s.uri("qio");

    qemu_io_ok(
        &uri,
        &[
            "write -P 0x5a 0 64k",
            "read -P 0x5a 0 64k",
            "write -P 0xa5 1000 3000", // unaligned
            "read -P 0xa5 1000 3000",
            "read -P 0x5a 0 1000",
            "read -P 0x5a 4000 61536",
            "write -f -P 0x33 1M 128k", // FUA
            "write -z 1M 4k",           // write zeroes
            "read -P 0 1M 4k",
            "read -P 0x33 1028k 124k",
            "discard 1032k 8k",
            "read -P 0 1032k 8k",
            "flush",
            "aio_write -P 0x44 2M 256k",
            "aio_flush",
            "read -P 0x44 2M 256k",
            "read -P 0 8M 8M",
        ],
    );

    // A new connection sees the same data.
    qemu_io_ok(
        &uri,
        &[
            "read -P 0x5a 0 1000",
            "read -P 0xa5 1000 3000",
            "read -P 0x5a 4000 61536",
            "read -P 0 1M 4k",
            "read -P 0x33 1028k 4k",
            "read -P 0 1032k 8k",
            "read -P 0x33 1040k 88k",
            "read -P 0x44 2M 256k",
        ],
    );

    // Negative control: qemu-io does fail on a mismatch.
    let out = qemu_io(&uri, &["read -P 0x5a 8M 4k"]);
    assert_ne!(
        out.code(),
        Some(0),
        "qemu-io should fail on a pattern mismatch:\n{}",
        out.describe()
    );
}
