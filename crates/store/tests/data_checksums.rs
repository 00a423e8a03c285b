//! Data checksums end to end: damage to data blocks of a real store file
//! is answered with an error (never with the damaged bytes) and found by
//! scrub; damage to a checksum page costs a recomputation, not data;
//! cooling racing writers on many threads never leaves a checksum that
//! disagrees with its block, even across a power cut; the hot set stays
//! within its bound.

mod common;

use basalt_store::{FileDevice, FormatOptions, IoError, OpenOptions, SimDevice, Store, BLOCK_SIZE};
use common::flip;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const EXTENT: u64 = 64 << 10;
const VOLUME: u64 = 16 * EXTENT;

fn quiet() -> OpenOptions {
    OpenOptions {
        background_zeroing: false,
        ..Default::default()
    }
}

fn format() -> FormatOptions {
    FormatOptions {
        extent_size: Some(EXTENT as u32),
        journal_blocks: Some(64),
        ..Default::default()
    }
}

fn pattern(len: u64, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ (i / 4096) as u8 ^ salt)
        .collect()
}

/// A closed store file holding one volume written in full; the device
/// offset of each of its 4 KiB blocks, in volume order.
fn written_store(path: &Path) -> (Vec<u8>, Vec<u64>) {
    let store = Store::create_with(
        FileDevice::create(path, 16 << 20, false).unwrap(),
        &format(),
        &quiet(),
    )
    .unwrap();
    let id = uuid::Uuid::from_u128(1);
    store.create_volume(id, VOLUME).unwrap();
    let data = pattern(VOLUME, 5);
    store.volume(id).unwrap().write(0, &data, false).unwrap();
    store.close().unwrap();
    drop(store);
    // Where each block lives: find it in the file by content.
    let file = std::fs::read(path).unwrap();
    let offsets = data
        .chunks(BLOCK_SIZE as usize)
        .map(|block| {
            let at = file
                .chunks(BLOCK_SIZE as usize)
                .position(|b| b == block)
                .expect("block on disk");
            at as u64 * BLOCK_SIZE
        })
        .collect();
    (data, offsets)
}

fn open(path: &Path) -> Arc<Store> {
    Store::open_with(FileDevice::open(path).unwrap(), &quiet()).unwrap()
}

#[test]
fn flipped_data_bits_are_errors_and_scrub_finds_every_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.img");
    let (data, offsets) = written_store(&path);
    let mut rng = StdRng::seed_from_u64(18);
    let mut victims: Vec<usize> = (0..offsets.len()).filter(|_| rng.gen_bool(0.1)).collect();
    victims.push(0);
    victims.sort_unstable();
    victims.dedup();
    for &v in &victims {
        flip(
            &path,
            offsets[v] + rng.gen_range(0..BLOCK_SIZE),
            rng.gen_range(0..8),
        );
    }
    let store = open(&path);
    assert!(store.integrity().data_checksums);
    let vol = store.volume(uuid::Uuid::from_u128(1)).unwrap();
    let b = BLOCK_SIZE as usize;
    for (i, block) in data.chunks(b).enumerate() {
        let mut got = vec![0u8; b];
        let r = vol.read(i as u64 * BLOCK_SIZE, &mut got);
        if victims.contains(&i) {
            assert!(
                matches!(r, Err(IoError::Corrupt { .. })),
                "block {i}: {r:?}"
            );
        } else {
            r.unwrap();
            assert_eq!(got, block, "block {i}");
        }
    }
    assert_eq!(store.integrity().checksum_errors, victims.len() as u64);
    // A read spanning a damaged block fails as a whole.
    let mut big = vec![0u8; 8 * b];
    assert!(vol.read(0, &mut big).is_err());

    let mut calls = 0;
    let report = vol.scrub(0..VOLUME, None, &mut |_, _| calls += 1).unwrap();
    assert!(report.checksums);
    assert_eq!(report.bytes_checked, VOLUME);
    let found: Vec<u64> = victims.iter().map(|&v| v as u64 * BLOCK_SIZE).collect();
    assert_eq!(
        report.bad_blocks, found,
        "scrub finds exactly the damaged blocks"
    );
    assert_eq!(calls, (VOLUME / EXTENT) as usize);
    // A window scrubs the extents it overlaps.
    let part = vol
        .scrub(EXTENT + 1..3 * EXTENT, Some(1 << 30), &mut |_, _| {})
        .unwrap();
    assert_eq!(part.bytes_checked, 2 * EXTENT);
    let in_window: Vec<u64> = found
        .iter()
        .copied()
        .filter(|o| (EXTENT..3 * EXTENT).contains(o))
        .collect();
    assert_eq!(part.bad_blocks, in_window);

    // Rewriting a damaged block heals it.
    vol.write(0, &data[..b], false).unwrap();
    vol.read(0, &mut big[..b]).unwrap();
    assert_eq!(&big[..b], &data[..b]);
}

#[test]
fn the_background_scrubber_finds_damage_and_records_its_pass() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.img");
    let (_, offsets) = written_store(&path);
    for &v in &[3usize, 40, 41] {
        flip(&path, offsets[v] + 7, 1);
    }
    let options = OpenOptions {
        scrub_interval: Some(std::time::Duration::from_secs(1)),
        scrub_rate: 1 << 30,
        ..quiet()
    };
    let store = Store::open_with(FileDevice::open(&path).unwrap(), &options).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while store.integrity().scrub_passes == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no background scrub pass"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let stats = store.integrity();
    assert_eq!(stats.scrub_damaged_blocks, 3, "{stats:?}");
    assert!(stats.scrubbed_bytes >= VOLUME);
    let scrubbed = store.volumes()[0].last_scrub_unix;
    assert!(scrubbed > 0);
    store.close().unwrap();
    drop(store);
    // The pass is remembered (in the volume's slot) across a restart.
    let store = open(&path);
    assert_eq!(store.volumes()[0].last_scrub_unix, scrubbed);
}

#[test]
fn a_damaged_checksum_page_is_recomputed_not_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.img");
    let (data, _) = written_store(&path);
    let layout = basalt_store::format::Layout::plan(
        16 << 20,
        EXTENT as u32,
        Some(64),
        basalt_store::format::DEFAULT_FEATURES,
    )
    .unwrap();
    flip(&path, layout.checksum_offset + 40, 2);
    let store = open(&path);
    assert_eq!(store.recovery().bad_checksum_pages, 1);
    assert!(store.recovery().recomputed_extents > 0);
    let mut back = vec![0u8; VOLUME as usize];
    store
        .volume(uuid::Uuid::from_u128(1))
        .unwrap()
        .read(0, &mut back)
        .unwrap();
    assert!(back == data);
    store.check().unwrap();
    store.close().unwrap();
    drop(store);
    // Rewritten at that open.
    let store = open(&path);
    assert_eq!(store.recovery().bad_checksum_pages, 0);
    assert_eq!(store.recovery().recomputed_extents, 0);
    assert_eq!(store.recovery().hot_extents, 0);
}

#[test]
fn cooling_racing_writers_never_leaves_a_wrong_checksum_even_across_a_power_cut() {
    for seed in 0..12u64 {
        let dev = SimDevice::new(16 << 20, seed);
        let store = Store::create_with(dev.clone(), &format(), &quiet()).unwrap();
        let ids: Vec<uuid::Uuid> = (1..=2).map(uuid::Uuid::from_u128).collect();
        for id in &ids {
            store.create_volume(*id, VOLUME).unwrap();
        }
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for (t, id) in ids.iter().enumerate() {
            for lane in 0..2u64 {
                let (store, stop, id) = (store.clone(), stop.clone(), *id);
                threads.push(std::thread::spawn(move || {
                    let vol = store.volume(id).unwrap();
                    let mut rng = StdRng::seed_from_u64(seed * 100 + t as u64 * 10 + lane);
                    let mut n = 0u32;
                    while !stop.load(Ordering::Relaxed) {
                        let blocks = rng.gen_range(1..6u64);
                        let at = rng.gen_range(0..VOLUME / BLOCK_SIZE - blocks) * BLOCK_SIZE;
                        if rng.gen_bool(0.7) {
                            let data = pattern(blocks * BLOCK_SIZE, rng.gen());
                            vol.write(at, &data, rng.gen_bool(0.1)).unwrap();
                        } else {
                            let mut buf = vec![0u8; (blocks * BLOCK_SIZE) as usize];
                            vol.read(at, &mut buf).unwrap();
                        }
                        n += 1;
                        if n.is_multiple_of(50) {
                            store.flush().unwrap();
                        }
                    }
                }));
            }
        }
        for round in 0..400u32 {
            store.cool(round.is_multiple_of(4)).unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(store.integrity().checksum_errors, 0);
        store.check().unwrap();
        // Power cut: whatever was not flushed is dropped, torn or kept.
        store.cool(false).unwrap();
        drop(store);
        dev.crash();
        let store = Store::open_with(dev.clone(), &quiet()).unwrap();
        for id in &ids {
            let mut buf = vec![0u8; VOLUME as usize];
            store.volume(*id).unwrap().read(0, &mut buf).unwrap();
        }
        assert_eq!(store.integrity().checksum_errors, 0, "seed {seed}");
        store.check().unwrap();
    }
}

#[test]
fn the_hot_set_is_bounded_and_a_clean_close_leaves_none() {
    let dev = SimDevice::new(16 << 20, 3);
    let options = OpenOptions {
        max_hot_bytes: Some(4 * EXTENT),
        // Cooled after one idle round (a round is one `cool` call here).
        cool_after: quiet().cooling_interval,
        ..quiet()
    };
    let store = Store::create_with(dev.clone(), &format(), &options).unwrap();
    let id = uuid::Uuid::from_u128(1);
    store.create_volume(id, VOLUME).unwrap();
    let vol = store.volume(id).unwrap();
    // Every extent written in this round: none is idle, but the limit holds.
    vol.write(0, &pattern(VOLUME, 1), false).unwrap();
    assert_eq!(store.integrity().hot_extents, VOLUME / EXTENT);
    store.cool(false).unwrap();
    assert!(
        store.integrity().hot_extents <= 16,
        "limit is at least 16 extents"
    );
    // Idle for a round: cooled.
    store.cool(false).unwrap();
    store.cool(false).unwrap();
    assert_eq!(store.integrity().hot_extents, 0);
    // A write heats one extent again; after a crash its blocks are taken
    // as they are at their first read (nothing is read at the open).
    vol.write(EXTENT, &pattern(BLOCK_SIZE, 2), true).unwrap();
    assert_eq!(store.integrity().hot_extents, 1);
    drop(vol);
    drop(store);
    dev.crash();
    let store = Store::open_with(dev.clone(), &options).unwrap();
    assert_eq!(store.recovery().hot_extents, 1);
    assert_eq!(store.recovery().recomputed_extents, 0);
    let mut block = vec![0u8; BLOCK_SIZE as usize];
    store.volume(id).unwrap().read(EXTENT, &mut block).unwrap();
    assert_eq!(block, pattern(BLOCK_SIZE, 2));
    store.check().unwrap();
    store.close().unwrap();
    drop(store);
    let store = Store::open_with(dev, &options).unwrap();
    assert_eq!(store.recovery().hot_extents, 0);
    assert_eq!(store.integrity().hot_extents, 0);
}

#[test]
fn a_store_without_checksums_still_works() {
    let dev = SimDevice::new(16 << 20, 4);
    let store = Store::create_with(
        dev.clone(),
        &FormatOptions {
            data_checksums: Some(false),
            ..format()
        },
        &quiet(),
    )
    .unwrap();
    assert!(!store.integrity().data_checksums);
    let id = uuid::Uuid::from_u128(1);
    store.create_volume(id, VOLUME).unwrap();
    let vol = store.volume(id).unwrap();
    let data = pattern(VOLUME, 9);
    vol.write(0, &data, true).unwrap();
    let report = vol.scrub(0..VOLUME, None, &mut |_, _| {}).unwrap();
    assert!(!report.checksums);
    assert_eq!(store.cool(true).unwrap(), 0);
    drop(vol);
    drop(store);
    dev.crash();
    let store = Store::open_with(dev, &quiet()).unwrap();
    let mut back = vec![0u8; VOLUME as usize];
    store.volume(id).unwrap().read(0, &mut back).unwrap();
    assert!(back == data);
    store.check().unwrap();
}
