//! nbdcopy (libnbd, multi-connection) into and out of Basalt volumes.

mod common;

use std::fs;
use std::os::unix::fs::FileExt;

use common::*;

#[test]
fn nbdcopy_file_in_and_out() {
    let s = Server::start("128M");
    s.create_volume("copy", "48M");
    let uri = s.uri("copy");
    let dir = Scratch::new();
    let src = dir.path("src.raw");
    let back = dir.path("back.raw");

    // 48 MiB of seeded data, with some all-zero 4 KiB blocks mixed in.
    let seed = test_seed("nbdcopy_file_in_and_out");
    let mut rng = Rng(seed);
    let mut data = vec![0u8; (48 * MIB) as usize];
    rng.fill(&mut data);
    for blk in data.chunks_mut(4096) {
        if rng.range(0, 10) == 0 {
            blk.fill(0);
        }
    }
    fs::write(&src, &data).unwrap();

    let out = tool("nbdcopy", [src.to_str().unwrap(), &uri, "--flush"]);
    out.ok();
    tool("nbdcopy", [&uri, back.to_str().unwrap()]).ok();
    assert_files_equal(&src, &back);

    // one connection, small requests, a different code path
    fs::remove_file(&back).unwrap();
    tool(
        "nbdcopy",
        [
            "--connections=1",
            "--request-size=65536",
            &uri,
            back.to_str().unwrap(),
        ],
    )
    .ok();
    assert_files_equal(&src, &back);
}

#[test]
fn nbdcopy_sparse_source_keeps_volume_sparse() {
    let s = Server::start("128M");
    s.create_volume("sparse", "64M");
    let uri = s.uri("sparse");
    let dir = Scratch::new();
    let src = dir.path("sparse.raw");
    let back = dir.path("back.raw");

    let f = fs::File::create(&src).unwrap();
    f.set_len(64 * MIB).unwrap();
    f.write_all_at(&vec![0xa1u8; MIB as usize], 4 * MIB)
        .unwrap();
    f.write_all_at(&vec![0xb2u8; 512 * KIB as usize], 50 * MIB)
        .unwrap();
    // an explicit run of written zeros: nbdcopy detects them (--sparse) and sends no data
    f.write_all_at(&vec![0u8; 2 * MIB as usize], 20 * MIB)
        .unwrap();
    drop(f);

    tool("nbdcopy", [src.to_str().unwrap(), &uri, "--flush"]).ok();

    let map = nbd_map(&uri, 64 * MIB);
    let data = map_bytes(&map, 0, 64 * MIB, |t| t & 1 == 0);
    assert_eq!(
        map_bytes(&map, 4 * MIB, MIB, |t| t & 1 == 0),
        MIB,
        "data range not allocated: {map:?}"
    );
    assert_eq!(
        map_bytes(&map, 50 * MIB, 512 * KIB, |t| t & 1 == 0),
        512 * KIB,
        "{map:?}"
    );
    assert!(
        data <= 8 * MIB,
        "copying a sparse image with 1.5 MiB of data allocated {data} bytes: {map:?}"
    );
    assert_eq!(
        map_bytes(&map, 20 * MIB, 2 * MIB, |t| t & 2 == 2),
        2 * MIB,
        "zero run not reported zero: {map:?}"
    );

    tool("nbdcopy", [&uri, back.to_str().unwrap()]).ok();
    assert_files_equal(&src, &back);
}
