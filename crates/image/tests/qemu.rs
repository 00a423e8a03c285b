//! The reader and writer against real QEMU: images made by `qemu-img` and
//! `qemu-io` must read exactly as `qemu-img convert -O raw` says, their
//! extents must match `qemu-img map`, and the writer's images must pass
//! `qemu-img check` and `qemu-img compare` against the same content as raw.
//!
//! qemu-img and qemu-io are required (CI installs qemu-utils): a missing one
//! fails the test with a message rather than skipping it.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use basalt_image::{ExtentKind, Qcow2Reader, Qcow2Writer};
use rand::{Rng, SeedableRng};
use tempfile::TempDir;

const MIB: u64 = 1 << 20;

fn run(tool: &str, args: &[&str]) -> Output {
    let out = Command::new(tool).args(args).output().unwrap_or_else(|e| {
        panic!("cannot run {tool} ({e}): these tests need QEMU's tools; install qemu-utils")
    });
    assert!(
        out.status.success(),
        "{tool} {args:?} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn qemu_img(args: &[&str]) -> Output {
    run("qemu-img", args)
}

/// Runs each qemu-io command on the qcow2 image `img`.
fn qemu_io(img: &Path, commands: &[&str]) {
    let mut args = vec!["-f", "qcow2"];
    for c in commands {
        args.extend(["-c", c]);
    }
    let path = img.to_str().unwrap();
    args.push(path);
    run("qemu-io", &args);
}

fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// What QEMU says the guest sees: the image converted to raw.
fn qemu_raw(dir: &Path, img: &Path) -> Vec<u8> {
    let raw = dir.join("qemu.raw");
    qemu_img(&[
        "convert",
        "-f",
        "qcow2",
        "-O",
        "raw",
        path_str(img),
        path_str(&raw),
    ]);
    std::fs::read(&raw).unwrap()
}

/// Per 512-byte sector of the guest: does QEMU's map say it holds data?
fn qemu_data_sectors(img: &Path, virtual_size: u64) -> Vec<bool> {
    let out = qemu_img(&["map", "-f", "qcow2", "--output=json", path_str(img)]);
    let map: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut data = vec![false; virtual_size.div_ceil(512) as usize];
    for run in map.as_array().unwrap() {
        let start = run["start"].as_u64().unwrap();
        let len = run["length"].as_u64().unwrap();
        if run["data"].as_bool().unwrap() {
            for s in start / 512..(start + len).div_ceil(512) {
                data[s as usize] = true;
            }
        }
    }
    data
}

/// Reads the image with [`Qcow2Reader`] and checks it against QEMU: the
/// bytes against `convert -O raw`, the extents against `map`.
fn check_against_qemu(dir: &Path, img: &Path) {
    let expected = qemu_raw(dir, img);
    let reader = Qcow2Reader::open(File::open(img).unwrap()).unwrap();
    let size = reader.virtual_size();
    assert_eq!(size, expected.len() as u64, "virtual size");

    // Whole-image read in uneven chunks, so reads straddle clusters.
    let mut got = vec![0u8; size as usize];
    let mut at = 0usize;
    for chunk in [1usize, 511, 4097, 65536 + 3, 1 << 20].iter().cycle() {
        if at == got.len() {
            break;
        }
        let n = (*chunk).min(got.len() - at);
        reader.read(at as u64, &mut got[at..at + n]).unwrap();
        at += n;
    }
    assert!(
        got == expected,
        "{}: contents differ from qemu-img convert",
        img.display()
    );

    let extents = reader.extents().unwrap();
    let mut next = 0;
    for e in &extents {
        assert_eq!(e.offset, next, "extents must be contiguous: {extents:?}");
        assert!(e.len > 0);
        next += e.len;
    }
    assert_eq!(next, size, "extents must cover the virtual size");
    let qemu_data = qemu_data_sectors(img, size);
    for e in &extents {
        for s in e.offset / 512..(e.offset + e.len).div_ceil(512) {
            let ours = e.kind == ExtentKind::Data;
            assert_eq!(
                ours,
                qemu_data[s as usize],
                "{}: sector {s} is {:?} for us, data={} for qemu-img map",
                img.display(),
                e.kind,
                qemu_data[s as usize]
            );
        }
    }
}

fn create(dir: &Path, name: &str, opts: &str, size: u64) -> PathBuf {
    let img = dir.join(name);
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-o",
        opts,
        path_str(&img),
        &size.to_string(),
    ]);
    img
}

/// The writes every qemu-io test image gets: patterns, unaligned writes,
/// zero writes over data and over holes, and the last cluster.
fn write_patterns(img: &Path, size: u64) {
    let last = format!("write -P 0xcd {} 4k", size - 4096);
    qemu_io(
        img,
        &[
            "write -P 0xab 1M 64k",
            "write -P 0x12 3000 5000",
            "write -z 1040k 16k",
            "write -z 4M 1M",
            "write -P 0x77 2M 1M",
            "write -z 2M 512k",
            &last,
        ],
    );
}

#[test]
fn reads_qemu_v3_images_at_every_cluster_size() {
    let dir = TempDir::new().unwrap();
    for cluster_size in ["512", "4k", "64k", "2M"] {
        let size = 8 * MIB;
        let img = create(
            dir.path(),
            "v3.qcow2",
            &format!("cluster_size={cluster_size}"),
            size,
        );
        write_patterns(&img, size);
        check_against_qemu(dir.path(), &img);
    }
}

#[test]
fn reads_qemu_v2_images() {
    let dir = TempDir::new().unwrap();
    for cluster_size in ["4k", "64k"] {
        let size = 8 * MIB + 3 * 512;
        let img = create(
            dir.path(),
            "v2.qcow2",
            &format!("compat=0.10,cluster_size={cluster_size}"),
            size,
        );
        write_patterns(&img, size);
        let reader = Qcow2Reader::open(File::open(&img).unwrap()).unwrap();
        assert_eq!(reader.version(), 2);
        check_against_qemu(dir.path(), &img);
    }
}

/// A raw disk with random, compressible, zero and repeated-pattern regions.
fn mixed_raw(path: &Path, size: u64, seed: u64) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut data = vec![0u8; size as usize];
    for (i, chunk) in data.chunks_mut(48 * 1024 + 512).enumerate() {
        match i % 4 {
            0 => rng.fill(chunk),
            1 => chunk
                .iter_mut()
                .enumerate()
                .for_each(|(j, b)| *b = (j % 251) as u8 ^ (i as u8)),
            2 => {}
            _ => chunk.fill(0x5a),
        }
    }
    std::fs::write(path, &data).unwrap();
    data
}

#[test]
fn reads_deflate_and_zstd_compressed_images() {
    let dir = TempDir::new().unwrap();
    let raw = dir.path().join("source.raw");
    let size = 6 * MIB;
    let source = mixed_raw(&raw, size, 7);
    for (name, opts) in [
        ("deflate-4k.qcow2", "cluster_size=4k"),
        ("deflate-64k.qcow2", "cluster_size=64k"),
        ("deflate-2m.qcow2", "cluster_size=2M"),
        ("zstd-4k.qcow2", "cluster_size=4k,compression_type=zstd"),
        ("zstd-64k.qcow2", "cluster_size=64k,compression_type=zstd"),
        ("zstd-2m.qcow2", "cluster_size=2M,compression_type=zstd"),
    ] {
        let img = dir.path().join(name);
        qemu_img(&[
            "convert",
            "-c",
            "-f",
            "raw",
            "-O",
            "qcow2",
            "-o",
            opts,
            path_str(&raw),
            path_str(&img),
        ]);
        check_against_qemu(dir.path(), &img);
        // And a partly compressed image: qemu-io writes over compressed data.
        qemu_io(&img, &["write -P 0x42 100k 200k", "write -z 3M 64k"]);
        check_against_qemu(dir.path(), &img);
        let reader = Qcow2Reader::open(File::open(&img).unwrap()).unwrap();
        let mut head = vec![0u8; 100 * 1024];
        reader.read(0, &mut head).unwrap();
        assert!(head == source[..head.len()], "{name}");
    }
}

#[test]
fn refuses_a_qemu_image_with_a_backing_file() {
    let dir = TempDir::new().unwrap();
    let base = create(dir.path(), "base.qcow2", "cluster_size=64k", 4 * MIB);
    let top = dir.path().join("top.qcow2");
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-F",
        "qcow2",
        "-b",
        path_str(&base),
        path_str(&top),
    ]);
    let err = Qcow2Reader::open(File::open(&top).unwrap()).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("base.qcow2") && msg.contains("qemu-img convert"),
        "{msg}"
    );
}

/// Writes `clusters` (index, fill seed) with the writer and the same content
/// as raw, then checks the pair with qemu-img check, compare and map.
fn check_writer(dir: &Path, size: u64, cluster_bits: u32, clusters: &[(u64, u8)]) {
    let cs = 1u64 << cluster_bits;
    let img = dir.join("written.qcow2");
    let raw = dir.join("written.raw");
    let mut content = vec![0u8; size as usize];
    let file = File::create(&img).unwrap();
    let mut w = Qcow2Writer::create(file, size, cluster_bits).unwrap();
    for &(index, seed) in clusters {
        let mut data: Vec<u8> = (0..cs)
            .map(|i| (i as u8).wrapping_mul(seed) ^ seed)
            .collect();
        let start = (index * cs) as usize;
        let end = (start + cs as usize).min(content.len());
        // The caller pads the last cluster with zeros.
        data[end - start..].fill(0);
        content[start..end].copy_from_slice(&data[..end - start]);
        w.write_cluster(index, &data).unwrap();
    }
    w.finish().unwrap().sync_all().unwrap();
    std::fs::write(&raw, &content).unwrap();

    let out = qemu_img(&["check", "-f", "qcow2", "--output=json", path_str(&img)]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for key in ["corruptions", "leaks", "check-errors"] {
        assert_eq!(report[key].as_u64().unwrap_or(0), 0, "{key}: {report}");
    }
    let info = qemu_img(&["info", "-f", "qcow2", "--output=json", path_str(&img)]);
    let info: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
    assert_eq!(info["virtual-size"].as_u64(), Some(size), "{info}");
    qemu_img(&[
        "compare",
        "-f",
        "qcow2",
        "-F",
        "raw",
        path_str(&img),
        path_str(&raw),
    ]);

    let data = qemu_data_sectors(&img, size);
    for (s, &is_data) in data.iter().enumerate() {
        let index = s as u64 * 512 / cs;
        let written = clusters.iter().any(|&(i, _)| i == index);
        assert_eq!(is_data, written, "sector {s} (cluster {index})");
    }
    check_against_qemu(dir, &img);
}

#[test]
fn writer_images_pass_qemu_img_check_and_compare() {
    let dir = TempDir::new().unwrap();
    // Holes, out-of-order writes, a written all-zero cluster, and a virtual
    // size that is not a multiple of the cluster size.
    let size = 10 * MIB + 4608;
    let clusters = [(3, 1), (0, 2), (1, 3), (60, 4), (100, 0), (160, 5), (9, 6)];
    check_writer(dir.path(), size, 16, &clusters);
    // Spread over several L2 tables and refcount blocks at 512-byte
    // clusters (64 entries per L2 table, 256 per refcount block).
    let clusters: Vec<(u64, u8)> = (0..2000u64)
        .filter(|i| i % 7 != 0 && i % 100 > 20)
        .map(|i| (i * 3 % 2000 + 1, (i % 250) as u8 + 1))
        .collect();
    check_writer(dir.path(), 2001 * 512, 9, &clusters);
    // The largest clusters.
    check_writer(dir.path(), 5 * MIB, 21, &[(2, 9), (0, 8)]);
}

#[test]
fn writer_empty_and_all_hole_images_pass_qemu_img_check() {
    let dir = TempDir::new().unwrap();
    check_writer(dir.path(), 0, 16, &[]);
    check_writer(dir.path(), 64 * MIB, 16, &[]);
    check_writer(dir.path(), 512, 16, &[(0, 3)]);
}
