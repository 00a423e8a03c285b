//! Packed (compressed) extents through the store's public API: compaction
//! of compressible, incompressible and empty extents; reads, writes (which
//! unpack), TRIM, shrink and deletion of packed extents; snapshots, clones,
//! snapshot deletion and flattening over packed layers; reopening; a run
//! damaged on disk (an error, never data; scrub names the blocks); and
//! writes racing compaction. `Store::check` after each step checks that
//! every extent and unit is in exactly one place and every run decodes.

mod common;

use basalt_store::{
    Codec, FileDevice, FormatOptions, IoError, MemDevice, PackOutcome, Store, StoreError,
};
use common::{flip, quiet};
use std::sync::Arc;

const EXTENT: u64 = 64 << 10;
const BLOCK: u64 = 4096;

fn format(dev: Arc<dyn basalt_store::BlockDevice>) -> Arc<Store> {
    Store::create_with(
        dev,
        &FormatOptions {
            extent_size: Some(EXTENT as u32),
            journal_blocks: Some(16),
            ..Default::default()
        },
        &quiet(),
    )
    .unwrap()
}

/// Text-like bytes: compress well, and differ per `seed` and position.
fn text(len: u64, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| b"basalt keeps volumes packed "[(i % 28) as usize] ^ seed ^ (i / 4096) as u8)
        .collect()
}

fn noise(len: u64, seed: u64) -> Vec<u8> {
    let mut s = seed | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s as u8
        })
        .collect()
}

fn pack_all(store: &Store, id: uuid::Uuid, size: u64, codec: Codec) -> Vec<PackOutcome> {
    (0..size.div_ceil(EXTENT))
        .map(|l| store.pack_extent(id, l as u32, codec).unwrap())
        .collect()
}

fn read_all(store: &Arc<Store>, id: uuid::Uuid, size: u64) -> Vec<u8> {
    let mut buf = vec![0u8; size as usize];
    store.volume(id).unwrap().read(0, &mut buf).unwrap();
    buf
}

fn assert_same(got: &[u8], want: &[u8], what: &str) {
    if let Some(at) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!("{what}: differs at byte {at}");
    }
    assert_eq!(got.len(), want.len(), "{what}: length");
}

#[test]
fn packed_extents_read_back_through_reopens_and_save_space() {
    let dev = MemDevice::new(32 << 20);
    let store = format(dev.clone());
    let id = uuid::Uuid::from_u128(1);
    let size = 8 * EXTENT;
    store.create_volume(id, size).unwrap();
    let vol = store.volume(id).unwrap();
    let mut model = vec![0u8; size as usize];
    // Extents 0-3 compressible, 4 incompressible, 5 half zeros, 6-7 holes.
    for e in 0..4 {
        let d = text(EXTENT, e as u8);
        vol.write(e * EXTENT, &d, false).unwrap();
        model[(e * EXTENT) as usize..((e + 1) * EXTENT) as usize].copy_from_slice(&d);
    }
    let d = noise(EXTENT, 9);
    vol.write(4 * EXTENT, &d, false).unwrap();
    model[(4 * EXTENT) as usize..(5 * EXTENT) as usize].copy_from_slice(&d);
    let d = noise(EXTENT / 2, 3);
    vol.write(5 * EXTENT, &d, false).unwrap();
    model[(5 * EXTENT) as usize..(5 * EXTENT + EXTENT / 2) as usize].copy_from_slice(&d);
    store.flush().unwrap();

    let outcomes = pack_all(&store, id, size, Codec::Lz4);
    for o in &outcomes[..4] {
        assert!(matches!(o, PackOutcome::Packed { .. }), "{outcomes:?}");
    }
    assert_eq!(outcomes[4], PackOutcome::Incompressible);
    assert!(
        matches!(outcomes[5], PackOutcome::Packed { .. }),
        "half zeros: {outcomes:?}"
    );
    assert_eq!(
        &outcomes[6..],
        &[PackOutcome::Skipped, PackOutcome::Skipped]
    );
    // Packing again finds nothing to do.
    assert!(pack_all(&store, id, size, Codec::Lz4)[..4]
        .iter()
        .all(|o| *o == PackOutcome::Skipped));

    let usage = store.usage();
    assert_eq!(usage.packed_bytes, 5 * EXTENT);
    assert!(usage.pack_extent_bytes < usage.packed_bytes, "{usage:?}");
    assert!(
        usage.packed_stored_bytes * 2 < usage.packed_bytes,
        "{usage:?}"
    );
    // Physical use: the incompressible extent and the pack extents.
    assert_eq!(usage.allocated_bytes, EXTENT + usage.pack_extent_bytes);
    let v = &store.volumes()[0];
    assert_eq!(v.packed_bytes, 5 * EXTENT);
    assert_eq!(v.allocated_bytes, 6 * EXTENT);

    assert_same(&read_all(&store, id, size), &model, "after packing");
    // Unaligned and cross-extent reads.
    let mut part = vec![0u8; 10_000];
    vol.read(3 * EXTENT - 5_000, &mut part).unwrap();
    assert_same(
        &part,
        &model[(3 * EXTENT - 5_000) as usize..][..10_000],
        "across extents",
    );
    store.zero_freed().unwrap();
    store.check().unwrap();

    drop(vol);
    store.close().unwrap();
    drop(store);
    let store = Store::open_with(dev.clone(), &quiet()).unwrap();
    assert_eq!(store.recovery().dirty_extents, 0);
    assert_same(&read_all(&store, id, size), &model, "after a clean restart");
    assert_eq!(store.usage().packed_bytes, 5 * EXTENT);
    store.check().unwrap();
    // Without a clean close: the journal replays the packing.
    let id2 = uuid::Uuid::from_u128(2);
    store.create_volume(id2, 2 * EXTENT).unwrap();
    let d = text(2 * EXTENT, 77);
    store.volume(id2).unwrap().write(0, &d, false).unwrap();
    pack_all(&store, id2, 2 * EXTENT, Codec::Zstd(5));
    drop(store);
    let store = Store::open_with(dev, &quiet()).unwrap();
    assert_same(
        &read_all(&store, id2, 2 * EXTENT),
        &d,
        "zstd, after a crash",
    );
    assert_same(&read_all(&store, id, size), &model, "after a crash");
    store.check().unwrap();
}

#[test]
fn writes_trims_and_shrinks_unpack_or_free_packed_extents() {
    let store = format(MemDevice::new(32 << 20));
    let id = uuid::Uuid::from_u128(1);
    let size = 6 * EXTENT;
    store.create_volume(id, size).unwrap();
    let vol = store.volume(id).unwrap();
    let mut model = text(size, 5);
    vol.write(0, &model, false).unwrap();
    pack_all(&store, id, size, Codec::Lz4);
    assert_eq!(store.usage().packed_bytes, size);

    // A 4 KiB write into a packed extent unpacks it, keeping the rest.
    let d = noise(BLOCK, 1);
    vol.write(EXTENT + 3 * BLOCK, &d, true).unwrap();
    model[(EXTENT + 3 * BLOCK) as usize..(EXTENT + 4 * BLOCK) as usize].copy_from_slice(&d);
    // An unaligned one too.
    vol.write(2 * EXTENT + 100, b"unaligned", false).unwrap();
    model[(2 * EXTENT + 100) as usize..(2 * EXTENT + 109) as usize].copy_from_slice(b"unaligned");
    // Zeroing part of one in place unpacks it; TRIM of a whole one frees it.
    vol.write_zeroes(3 * EXTENT + BLOCK, 2 * BLOCK, false, false)
        .unwrap();
    model[(3 * EXTENT + BLOCK) as usize..(3 * EXTENT + 3 * BLOCK) as usize].fill(0);
    vol.trim(4 * EXTENT, EXTENT, false).unwrap();
    model[(4 * EXTENT) as usize..(5 * EXTENT) as usize].fill(0);
    store.flush().unwrap();
    assert_same(&read_all(&store, id, size), &model, "after writes");
    assert_eq!(
        store.usage().packed_bytes,
        2 * EXTENT,
        "0 and 5 still packed"
    );
    store.zero_freed().unwrap();
    store.check().unwrap();

    // Shrinking into a packed extent unpacks it to zero its tail.
    let new = 5 * EXTENT + 3 * BLOCK;
    store.resize_volume(id, new).unwrap();
    store.resize_volume(id, size).unwrap();
    model[new as usize..].fill(0);
    assert_same(&read_all(&store, id, size), &model, "after shrink and grow");
    assert_eq!(store.usage().packed_bytes, EXTENT);

    // Deleting the volume frees its runs, and the pack extents with them.
    drop(vol);
    store.delete_volume(id).unwrap();
    store.flush().unwrap();
    store.zero_freed().unwrap();
    let usage = store.usage();
    assert_eq!(
        (
            usage.packed_bytes,
            usage.pack_extent_bytes,
            usage.allocated_bytes
        ),
        (0, 0, 0)
    );
    store.check().unwrap();
}

#[test]
fn snapshots_clones_merges_and_flattening_over_packed_layers() {
    let store = format(MemDevice::new(32 << 20));
    let (vol_id, snap_id, clone_id) = (
        uuid::Uuid::from_u128(1),
        uuid::Uuid::from_u128(2),
        uuid::Uuid::from_u128(3),
    );
    let size = 4 * EXTENT;
    store.create_volume(vol_id, size).unwrap();
    let vol = store.volume(vol_id).unwrap();
    let at_snapshot = text(size, 1);
    vol.write(0, &at_snapshot, false).unwrap();
    store.snapshot(vol_id, snap_id).unwrap();
    // The golden image's extents packed: the snapshot is a bottom layer.
    let outcomes = pack_all(&store, snap_id, size, Codec::Zstd(3));
    assert!(outcomes
        .iter()
        .all(|o| matches!(o, PackOutcome::Packed { .. })));
    store.clone_snapshot(snap_id, clone_id, None).unwrap();
    assert_same(&read_all(&store, clone_id, size), &at_snapshot, "clone");
    assert_same(&read_all(&store, snap_id, size), &at_snapshot, "snapshot");

    // The volume diverges in part of extent 1 and all of extent 2; its own
    // partly written extent is not packed (it lacks blocks of its layer).
    let mut model = at_snapshot.clone();
    let d = noise(BLOCK, 4);
    vol.write(EXTENT, &d, false).unwrap();
    model[EXTENT as usize..(EXTENT + BLOCK) as usize].copy_from_slice(&d);
    let d = text(EXTENT, 9);
    vol.write(2 * EXTENT, &d, false).unwrap();
    model[(2 * EXTENT) as usize..(3 * EXTENT) as usize].copy_from_slice(&d);
    let outcomes = pack_all(&store, vol_id, size, Codec::Lz4);
    assert_eq!(
        outcomes,
        vec![
            PackOutcome::Skipped,
            PackOutcome::Skipped,
            outcomes[2],
            PackOutcome::Skipped
        ]
    );
    assert!(matches!(outcomes[2], PackOutcome::Packed { .. }));
    assert_same(
        &read_all(&store, vol_id, size),
        &model,
        "volume over a packed snapshot",
    );

    // A snapshot with a clone cannot be deleted; flatten the clone first,
    // reading through the packed snapshot.
    assert!(matches!(
        store.delete_snapshot(snap_id),
        Err(StoreError::Layers(_))
    ));
    let report = store
        .flatten(clone_id, 0..size, None, &mut |_, _| {})
        .unwrap();
    assert!(report.detached);
    assert_same(
        &read_all(&store, clone_id, size),
        &at_snapshot,
        "flattened clone",
    );
    // Deleting the snapshot merges its packed extents into the volume:
    // extents only it held move (still packed), the others are copied.
    store.delete_snapshot(snap_id).unwrap();
    assert_same(&read_all(&store, vol_id, size), &model, "after the merge");
    store.flush().unwrap();
    store.zero_freed().unwrap();
    store.check().unwrap();
    // A write to an extent the merge moved over unpacks it.
    vol.write(3 * EXTENT + BLOCK, b"after the merge", true)
        .unwrap();
    model[(3 * EXTENT + BLOCK) as usize..][..15].copy_from_slice(b"after the merge");
    assert_same(
        &read_all(&store, vol_id, size),
        &model,
        "write after the merge",
    );
    store.check().unwrap();
}

#[test]
fn a_damaged_run_is_an_error_never_data_and_scrub_names_its_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.img");
    let dev = FileDevice::create(&path, 32 << 20, false).unwrap();
    let store = format(dev);
    let id = uuid::Uuid::from_u128(1);
    store.create_volume(id, EXTENT).unwrap();
    let vol = store.volume(id).unwrap();
    let data = text(EXTENT, 3);
    vol.write(0, &data, false).unwrap();
    assert!(matches!(
        store.pack_extent(id, 0, Codec::Lz4).unwrap(),
        PackOutcome::Packed { .. }
    ));
    store.flush().unwrap();
    // Find the run on disk by its magic, and flip a byte of its records.
    let bytes = std::fs::read(&path).unwrap();
    let run = bytes
        .chunks(4096)
        .position(|page| &page[..4] == b"BRUN")
        .expect("the run is on disk") as u64
        * 4096;
    flip(&path, run + 4096 + 10, 3);
    let mut buf = vec![0u8; BLOCK as usize];
    assert!(matches!(
        vol.read(0, &mut buf),
        Err(IoError::Corrupt { .. })
    ));
    assert!(store.integrity().checksum_errors > 0);
    // Other blocks of the run still read.
    let mut rest = vec![0u8; (EXTENT - 8 * BLOCK) as usize];
    vol.read(8 * BLOCK, &mut rest).unwrap();
    assert_same(&rest, &data[(8 * BLOCK) as usize..], "undamaged blocks");
    let report = vol.scrub(0..EXTENT, None, &mut |_, _| {}).unwrap();
    assert_eq!(report.bad_blocks, vec![0]);
    // A damaged header fails every block of the run.
    flip(&path, run + 40, 0);
    assert!(matches!(
        vol.read(8 * BLOCK, &mut buf),
        Err(IoError::Corrupt { .. })
    ));
}

#[test]
fn writes_racing_compaction_are_never_lost() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let store = format(MemDevice::new(32 << 20));
    let id = uuid::Uuid::from_u128(1);
    let size = 4 * EXTENT;
    store.create_volume(id, size).unwrap();
    let vol = store.volume(id).unwrap();
    vol.write(0, &text(size, 0), false).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let packed = Arc::new(AtomicU64::new(0));
    let packer = {
        let (store, stop, packed) = (store.clone(), stop.clone(), packed.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                for o in pack_all(&store, id, size, Codec::Lz4) {
                    if matches!(o, PackOutcome::Packed { .. }) {
                        packed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        })
    };
    // Writes go on until the packer packed extents between them many
    // times (each write to a packed extent unpacks it again).
    let mut model = text(size, 0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut round = 0u64;
    while round < 400 || packed.load(Ordering::Relaxed) < 50 {
        assert!(
            std::time::Instant::now() < deadline,
            "the packer never caught up"
        );
        let block = (round * 7919) % (size / BLOCK);
        let d = text(BLOCK, (round % 251) as u8 + 1);
        vol.write(block * BLOCK, &d, false).unwrap();
        model[(block * BLOCK) as usize..((block + 1) * BLOCK) as usize].copy_from_slice(&d);
        round += 1;
    }
    stop.store(true, Ordering::Relaxed);
    packer.join().unwrap();
    assert_same(&read_all(&store, id, size), &model, "after racing");
    store.flush().unwrap();
    store.zero_freed().unwrap();
    store.check().unwrap();
}

#[test]
fn compressed_volumes_are_compacted_now_or_once_cold() {
    let dev = MemDevice::new(32 << 20);
    let options = basalt_store::OpenOptions {
        cooling_interval: std::time::Duration::from_millis(50),
        compact_after: std::time::Duration::from_millis(100),
        compaction_interval: std::time::Duration::from_millis(50),
        ..Default::default()
    };
    let store = Store::create_with(
        dev,
        &FormatOptions {
            extent_size: Some(EXTENT as u32),
            journal_blocks: Some(16),
            ..Default::default()
        },
        &options,
    )
    .unwrap();
    let (a, b, snap) = (
        uuid::Uuid::from_u128(1),
        uuid::Uuid::from_u128(2),
        uuid::Uuid::from_u128(3),
    );
    let size = 4 * EXTENT;
    for id in [a, b] {
        store.create_volume(id, size).unwrap();
        store
            .volume(id)
            .unwrap()
            .write(0, &text(size, 1), false)
            .unwrap();
    }
    // Now: a volume and its snapshot, hot or not.
    store.snapshot(a, snap).unwrap();
    store
        .volume(a)
        .unwrap()
        .write(0, &text(EXTENT, 2), false)
        .unwrap();
    let mut calls = 0;
    let report = store
        .compact_volume(a, Codec::Lz4, None, &mut |_, _| calls += 1)
        .unwrap();
    assert_eq!(
        report.packed_extents, 5,
        "four of the snapshot, one of the volume: {report:?}"
    );
    assert!(report.stored_bytes * 2 < report.packed_bytes);
    assert_eq!(calls, 8);
    // Once cold: volume b, whose policy says lz4; nothing of a volume
    // without one.
    let c = uuid::Uuid::from_u128(4);
    store.create_volume(c, size).unwrap();
    store
        .volume(c)
        .unwrap()
        .write(0, &text(size, 3), false)
        .unwrap();
    store.set_compression(b, Some(Codec::Lz4));
    assert_eq!(store.compression(b), Some(Codec::Lz4));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let packed = |id| {
        store
            .volumes()
            .into_iter()
            .find(|v| v.id == id)
            .map_or(0, |v| v.packed_bytes)
    };
    while packed(b) < size {
        assert!(
            std::time::Instant::now() < deadline,
            "the background compactor did not pack volume b"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(packed(c), 0);
    assert_same(
        &read_all(&store, b, size),
        &text(size, 1),
        "b packed in the background",
    );
    store.close().unwrap();
}
