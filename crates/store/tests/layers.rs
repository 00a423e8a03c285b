//! Layers: snapshots are frozen copies that stay exact while their volume
//! moves on; clones read their snapshot and write their own blocks; a
//! rollback returns a volume to a snapshot; deleting a snapshot frees what
//! no other layer needs and changes nothing anyone reads; all of it
//! survives a reopen and a crash. (Power cuts at every device operation of
//! histories with snapshots are in `power_loss.rs`.)

mod common;

use basalt_store::format::{Layout, DEFAULT_FEATURES};
use basalt_store::{FormatOptions, IoError, SimDevice, Store, StoreError};
use common::{format_small, id, quiet};
use std::sync::Arc;
use uuid::Uuid;

const EXTENT: u64 = 64 * 1024;
const BLOCK: u64 = 4096;

fn format(dev: &Arc<SimDevice>) -> Arc<Store> {
    format_small(dev, EXTENT)
}

fn read_all(store: &Arc<Store>, v: Uuid) -> Vec<u8> {
    let h = store.volume(v).unwrap();
    let mut buf = vec![0u8; h.size() as usize];
    h.read(0, &mut buf).unwrap();
    buf
}

fn pattern(len: u64, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_add((i / 512) as u8) | 1)
        .collect()
}

#[test]
fn a_snapshot_keeps_its_content_while_the_volume_moves_on() {
    let dev = SimDevice::new(16 << 20, 1);
    let store = format(&dev);
    let (vol, snap) = (id(1), id(2));
    store.create_volume(vol, 4 * EXTENT).unwrap();
    let v = store.volume(vol).unwrap();
    let before = pattern(3 * EXTENT, 7);
    v.write(0, &before, false).unwrap();
    store.snapshot(vol, snap).unwrap();
    // Overwrite single blocks, a block straddling nothing, an unaligned
    // range and a hole.
    v.write(BLOCK, &pattern(BLOCK, 50), false).unwrap();
    v.write(EXTENT + 3 * BLOCK + 100, &pattern(5000, 60), true)
        .unwrap();
    v.write(3 * EXTENT, &pattern(BLOCK, 70), false).unwrap();
    let mut expect = before.clone();
    expect.resize(4 * EXTENT as usize, 0);
    let frozen = expect.clone();
    expect[BLOCK as usize..2 * BLOCK as usize].copy_from_slice(&pattern(BLOCK, 50));
    let at = (EXTENT + 3 * BLOCK + 100) as usize;
    expect[at..at + 5000].copy_from_slice(&pattern(5000, 60));
    expect[3 * EXTENT as usize..3 * EXTENT as usize + BLOCK as usize]
        .copy_from_slice(&pattern(BLOCK, 70));
    assert!(read_all(&store, vol) == expect, "volume after the snapshot");
    assert!(read_all(&store, snap) == frozen, "snapshot content");
    let s = store.volume(snap).unwrap();
    assert!(matches!(
        s.write(0, &[0u8; 4096], false),
        Err(IoError::ReadOnly)
    ));
    assert!(matches!(s.trim(0, 4096, false), Err(IoError::ReadOnly)));
    // The volume list holds volumes; snapshots are listed on their own.
    let vols = store.volumes();
    assert_eq!(vols.len(), 1);
    assert_eq!(vols[0].parent, Some(snap));
    let snaps = store.snapshots();
    assert_eq!(snaps.len(), 1);
    assert_eq!((snaps[0].id, snaps[0].volume), (snap, vol));
    assert_eq!(snaps[0].children, vec![vol]);
    // Written: the three extents written before; exclusive: the two
    // blocks (of the 48 written) the volume has overwritten since, counted
    // at 4 KiB (the unaligned write covered blocks 3..=4 of extent 1).
    assert_eq!(snaps[0].written_bytes, 3 * EXTENT);
    assert_eq!(snaps[0].exclusive_bytes, 3 * BLOCK);

    // Reopened cleanly, and after a crash: the same.
    store.close().unwrap();
    drop((v, s, store));
    let store = Store::open_with(dev.clone(), &quiet()).unwrap();
    assert!(read_all(&store, vol) == expect);
    assert!(read_all(&store, snap) == frozen);
    store
        .volume(vol)
        .unwrap()
        .write(0, &pattern(BLOCK, 90), true)
        .unwrap();
    expect[..BLOCK as usize].copy_from_slice(&pattern(BLOCK, 90));
    drop(store);
    dev.crash();
    let store = Store::open_with(dev.clone(), &quiet()).unwrap();
    assert!(read_all(&store, vol) == expect, "after a crash");
    assert!(read_all(&store, snap) == frozen, "snapshot after a crash");
    store.check().unwrap();
}

#[test]
fn the_first_write_to_a_block_after_a_snapshot_writes_that_block_only() {
    let dev = SimDevice::new(16 << 20, 2);
    let store = format(&dev);
    let (vol, snap) = (id(1), id(2));
    store.create_volume(vol, 4 * EXTENT).unwrap();
    let v = store.volume(vol).unwrap();
    v.write(0, &pattern(4 * EXTENT, 3), false).unwrap();
    store.snapshot(vol, snap).unwrap();
    // A first write maps an extent from the reserved pool; do it once so
    // that the measured write below finds the pool ready.
    v.write(0, &pattern(BLOCK, 4), false).unwrap();
    store.flush().unwrap();
    let layout = Layout::plan(16 << 20, EXTENT as u32, Some(16), DEFAULT_FEATURES).unwrap();
    let data = layout.data_offset..layout.data_offset + layout.capacity_bytes();
    v.write(EXTENT + 5 * BLOCK, &pattern(BLOCK, 5), false)
        .unwrap();
    let written: u64 = dev
        .volatile_writes()
        .into_iter()
        .filter(|(off, _)| data.contains(off))
        .map(|(_, len)| len)
        .sum();
    assert_eq!(
        written, BLOCK,
        "data bytes written by one 4 KiB write after a snapshot"
    );
    // Its neighbours still read the snapshot's bytes.
    let mut got = vec![0u8; 3 * BLOCK as usize];
    v.read(EXTENT + 4 * BLOCK, &mut got).unwrap();
    let old = pattern(4 * EXTENT, 3);
    let at = (EXTENT + 4 * BLOCK) as usize;
    assert!(got[..4096] == old[at..at + 4096]);
    assert!(got[4096..8192] == pattern(BLOCK, 5)[..]);
    assert!(got[8192..] == old[at + 8192..at + 12288]);
}

#[test]
fn clones_read_their_snapshot_and_write_their_own_blocks() {
    let dev = SimDevice::new(16 << 20, 3);
    let store = format(&dev);
    let (golden, snap) = (id(1), id(2));
    store.create_volume(golden, 2 * EXTENT).unwrap();
    let image = pattern(2 * EXTENT, 11);
    store
        .volume(golden)
        .unwrap()
        .write(0, &image, false)
        .unwrap();
    store.snapshot(golden, snap).unwrap();
    let clones: Vec<Uuid> = (10..14).map(id).collect();
    for (k, &c) in clones.iter().enumerate() {
        // One clone is larger than its image.
        let size = (k == 0).then_some(3 * EXTENT);
        store.clone_snapshot(snap, c, size).unwrap();
    }
    assert!(matches!(
        store.clone_snapshot(snap, id(20), Some(EXTENT)),
        Err(StoreError::InvalidSize(_))
    ));
    assert!(matches!(
        store.clone_snapshot(golden, id(21), None),
        Err(StoreError::Layers(_))
    ));
    for (k, &c) in clones.iter().enumerate() {
        let h = store.volume(c).unwrap();
        h.write(k as u64 * BLOCK, &pattern(BLOCK, 100 + k as u8), false)
            .unwrap();
    }
    // A TRIM in a clone over the image's data reads zeros, not the image.
    store
        .volume(clones[1])
        .unwrap()
        .trim(EXTENT, EXTENT, false)
        .unwrap();
    for (k, &c) in clones.iter().enumerate() {
        let mut expect = image.clone();
        if k == 0 {
            expect.resize(3 * EXTENT as usize, 0);
        }
        let at = k * BLOCK as usize;
        expect[at..at + BLOCK as usize].copy_from_slice(&pattern(BLOCK, 100 + k as u8));
        if k == 1 {
            expect[EXTENT as usize..2 * EXTENT as usize].fill(0);
        }
        assert!(read_all(&store, c) == expect, "clone {k}");
    }
    assert!(read_all(&store, snap) == image);
    assert!(read_all(&store, golden) == image);
    // A snapshot with clones reading through it cannot go.
    assert!(matches!(
        store.delete_snapshot(snap),
        Err(StoreError::Layers(_))
    ));
    assert!(matches!(
        store.delete_volume(golden),
        Err(StoreError::Layers(_))
    ));
    // Clones can go; with only the golden volume's own layer reading
    // through it, the snapshot merges into that layer.
    for &c in &clones[1..] {
        store.delete_volume(c).unwrap();
    }
    assert_eq!(store.snapshots()[0].children.len(), 2);
    assert!(matches!(
        store.delete_snapshot(snap),
        Err(StoreError::Layers(_))
    ));
    store.delete_volume(clones[0]).unwrap();
    store.delete_snapshot(snap).unwrap();
    assert!(read_all(&store, golden) == image);
    store.delete_volume(golden).unwrap();
    store.check().unwrap();
    store.zero_freed().unwrap();
    assert_eq!(store.usage().allocated_bytes, 0);
}

#[test]
fn deleting_a_snapshot_merges_it_and_frees_what_nobody_needs() {
    let dev = SimDevice::new(16 << 20, 4);
    let store = format(&dev);
    let (vol, s1, s2) = (id(1), id(2), id(3));
    store.create_volume(vol, 4 * EXTENT).unwrap();
    let v = store.volume(vol).unwrap();
    v.write(0, &pattern(3 * EXTENT, 1), false).unwrap();
    store.snapshot(vol, s1).unwrap();
    v.write(0, &pattern(EXTENT, 2), false).unwrap(); // extent 0 rewritten whole
    v.write(EXTENT + BLOCK, &pattern(BLOCK, 3), false).unwrap(); // one block of extent 1
    store.snapshot(vol, s2).unwrap();
    v.write(2 * EXTENT + 2 * BLOCK, &pattern(BLOCK, 4), false)
        .unwrap();
    v.write(3 * EXTENT, &pattern(BLOCK, 5), false).unwrap();
    let (cv, c1, c2) = (
        read_all(&store, vol),
        read_all(&store, s1),
        read_all(&store, s2),
    );
    let allocated = store.usage().allocated_bytes;
    // The oldest first: s1 (no parent) merges into s2.
    store.delete_snapshot(s1).unwrap();
    assert!(read_all(&store, vol) == cv);
    assert!(read_all(&store, s2) == c2);
    assert!(store.volume(s1).is_err());
    // s1's extent 0 was wholly overwritten in s2: freed. Its extent 1 was
    // partly: the rest copied into s2's, freed. Extent 2 moved to s2.
    assert_eq!(store.usage().allocated_bytes, allocated - 2 * EXTENT);
    store.check().unwrap();
    // Then s2 merges into the volume.
    store.delete_snapshot(s2).unwrap();
    assert!(read_all(&store, vol) == cv);
    assert!(store.snapshots().is_empty());
    assert_eq!(store.volumes()[0].parent, None);
    store.check().unwrap();
    drop(v);
    store.close().unwrap();
    drop(store);
    let store = Store::open_with(dev.clone(), &quiet()).unwrap();
    assert!(read_all(&store, vol) == cv);
    store.delete_volume(vol).unwrap();
    store.check().unwrap();
    let _ = c1;
}

#[test]
fn rollback_returns_a_volume_to_its_snapshot() {
    let dev = SimDevice::new(16 << 20, 5);
    let store = format(&dev);
    let (vol, s1, s2) = (id(1), id(2), id(3));
    store.create_volume(vol, 2 * EXTENT).unwrap();
    let v = store.volume(vol).unwrap();
    v.write(0, &pattern(EXTENT, 1), false).unwrap();
    store.snapshot(vol, s1).unwrap();
    let c1 = read_all(&store, s1);
    v.write(BLOCK, &pattern(EXTENT, 2), false).unwrap();
    store.resize_volume(vol, 3 * EXTENT).unwrap();
    assert!(matches!(
        store.resize_volume(vol, EXTENT),
        Err(StoreError::Layers(_))
    ));
    store.snapshot(vol, s2).unwrap();
    v.write(2 * EXTENT, &pattern(BLOCK, 3), false).unwrap();
    assert!(matches!(
        store.rollback(vol, id(9)),
        Err(StoreError::NotFound(_))
    ));
    store.rollback(vol, s1).unwrap();
    assert_eq!(v.size(), 2 * EXTENT);
    assert!(read_all(&store, vol) == c1);
    v.write(0, &pattern(BLOCK, 4), true).unwrap();
    // s2 is nobody's parent now: deleting it frees its extents outright.
    store.delete_snapshot(s2).unwrap();
    store.check().unwrap();
    drop(v);
    drop(store);
    dev.crash();
    let store = Store::open_with(dev.clone(), &quiet()).unwrap();
    let mut expect = c1.clone();
    expect[..BLOCK as usize].copy_from_slice(&pattern(BLOCK, 4));
    assert!(read_all(&store, vol) == expect);
    assert!(read_all(&store, s1) == c1);
    store.check().unwrap();
}

#[test]
fn flattening_a_clone_detaches_it_without_changing_what_it_reads() {
    let dev = SimDevice::new(16 << 20, 7);
    let store = format(&dev);
    let (golden, s1, s2, clone) = (id(1), id(2), id(3), id(4));
    store.create_volume(golden, 3 * EXTENT).unwrap();
    let g = store.volume(golden).unwrap();
    g.write(0, &pattern(2 * EXTENT, 1), false).unwrap();
    store.snapshot(golden, s1).unwrap();
    g.write(EXTENT, &pattern(BLOCK, 2), false).unwrap();
    store.snapshot(golden, s2).unwrap();
    store.clone_snapshot(s2, clone, Some(4 * EXTENT)).unwrap();
    let c = store.volume(clone).unwrap();
    c.write(3 * BLOCK, &pattern(BLOCK, 3), false).unwrap();
    c.write(3 * EXTENT, &pattern(BLOCK, 4), false).unwrap();
    let before = read_all(&store, clone);
    // In two windows, with progress.
    let mut seen = Vec::new();
    let first = store
        .flatten(clone, 0..2 * EXTENT, None, &mut |done, total| {
            seen.push((done, total))
        })
        .unwrap();
    assert!(!first.detached);
    assert_eq!(seen.last(), Some(&(2 * EXTENT, 2 * EXTENT)));
    assert!(read_all(&store, clone) == before);
    let rest = store
        .flatten(clone, 2 * EXTENT..4 * EXTENT, None, &mut |_, _| {})
        .unwrap();
    assert!(rest.detached);
    assert_eq!(
        first.copied_blocks + rest.copied_blocks,
        // Two extents of the image less the clone's own block, plus the
        // clone's own extent 3 (zeros where it wrote nothing).
        2 * EXTENT / BLOCK - 1 + EXTENT / BLOCK - 1
    );
    assert!(read_all(&store, clone) == before);
    let vols = store.volumes();
    assert_eq!(vols.iter().find(|v| v.id == clone).unwrap().parent, None);
    // s2 has no clone now: it merges into the golden volume.
    store.delete_snapshot(s2).unwrap();
    store.delete_snapshot(s1).unwrap();
    store.check().unwrap();
    drop((g, c));
    drop(store);
    dev.crash();
    let store = Store::open_with(dev.clone(), &quiet()).unwrap();
    assert!(read_all(&store, clone) == before);
    store.check().unwrap();
}

/// A clone with snapshots of its own: `flatten_source` copies the source's
/// blocks into the clone's oldest snapshot only, so the clone and every
/// snapshot of it read what they did, and the source can go.
#[test]
fn flattening_a_clone_with_snapshots_detaches_them_all_from_the_source() {
    let dev = SimDevice::new(16 << 20, 9);
    let store = format(&dev);
    let (golden, base, clone, mine1, mine2) = (id(1), id(2), id(3), id(4), id(5));
    store.create_volume(golden, 3 * EXTENT).unwrap();
    let g = store.volume(golden).unwrap();
    g.write(0, &pattern(3 * EXTENT, 1), false).unwrap();
    store.snapshot(golden, base).unwrap();
    store.clone_snapshot(base, clone, Some(4 * EXTENT)).unwrap();
    let c = store.volume(clone).unwrap();
    c.write(BLOCK, &pattern(BLOCK, 2), false).unwrap();
    store.snapshot(clone, mine1).unwrap();
    c.write(EXTENT + 2 * BLOCK, &pattern(BLOCK, 3), false)
        .unwrap();
    c.write(3 * EXTENT, &pattern(BLOCK, 4), false).unwrap();
    store.snapshot(clone, mine2).unwrap();
    c.write(2 * BLOCK, &pattern(2 * BLOCK, 5), false).unwrap();
    // The golden volume moves on: nothing of that reaches the clone.
    g.write(0, &pattern(EXTENT, 6), false).unwrap();
    let reads = |store: &Arc<Store>| [clone, mine1, mine2].map(|v| read_all(store, v));
    let before = reads(&store);
    assert_eq!(store.clone_source(clone).unwrap(), Some(base));
    let first = store
        .flatten_source(clone, 0..EXTENT, None, &mut |_, _| {})
        .unwrap();
    assert!(!first.detached);
    assert!(reads(&store) == before);
    // A snapshot taken halfway: the copying goes on into the oldest layer.
    let mine3 = id(6);
    store.snapshot(clone, mine3).unwrap();
    let rest = store
        .flatten_source(clone, EXTENT..4 * EXTENT, None, &mut |_, _| {})
        .unwrap();
    assert!(rest.detached);
    // The source's three extents less the clone's own first block.
    assert_eq!(
        first.copied_blocks + rest.copied_blocks,
        3 * EXTENT / BLOCK - 1
    );
    assert!(reads(&store) == before);
    assert_eq!(store.clone_source(clone).unwrap(), None);
    // Only the oldest snapshot took the copies: the newer layers hold
    // their own writes and nothing else.
    let written = |s: Uuid| {
        let all = store.snapshots();
        let s = all.iter().find(|x| x.id == s).unwrap();
        (s.written_bytes, s.parent)
    };
    assert_eq!(written(mine2), (2 * BLOCK, Some(mine1)));
    assert_eq!(written(mine3), (2 * BLOCK, Some(mine2)));
    assert_eq!(written(mine1).1, None);
    // The source has no clone left reading through it.
    store.delete_snapshot(base).unwrap();
    assert!(reads(&store) == before);
    store.check().unwrap();
    drop((g, c));
    drop(store);
    dev.crash();
    let store = Store::open_with(dev.clone(), &quiet()).unwrap();
    assert!(reads(&store) == before);
    store.check().unwrap();
}

/// A clone rolls back to the snapshot it was cloned from (a replica's
/// rebuild from its source), and to no other volume's snapshot.
#[test]
fn a_clone_rolls_back_to_its_source_and_to_no_other_volumes_snapshot() {
    let dev = SimDevice::new(16 << 20, 10);
    let store = format(&dev);
    let (golden, base, other, clone) = (id(1), id(2), id(3), id(4));
    store.create_volume(golden, 2 * EXTENT).unwrap();
    let g = store.volume(golden).unwrap();
    g.write(0, &pattern(2 * EXTENT, 1), false).unwrap();
    store.snapshot(golden, base).unwrap();
    g.write(0, &pattern(EXTENT, 2), false).unwrap();
    store.snapshot(golden, other).unwrap();
    store.clone_snapshot(base, clone, Some(3 * EXTENT)).unwrap();
    let c = store.volume(clone).unwrap();
    c.write(BLOCK, &pattern(2 * BLOCK, 3), false).unwrap();
    assert!(matches!(
        store.rollback(clone, other),
        Err(StoreError::Layers(_))
    ));
    store.rollback(clone, base).unwrap();
    let mut expect = pattern(2 * EXTENT, 1);
    expect.resize(2 * EXTENT as usize, 0);
    assert!(read_all(&store, clone) == expect);
    assert_eq!(store.clone_source(clone).unwrap(), Some(base));
    store.check().unwrap();
}

#[test]
fn a_store_without_layers_says_so() {
    let dev = SimDevice::new(16 << 20, 6);
    let store = Store::create_with(
        dev.clone(),
        &FormatOptions {
            extent_size: Some(EXTENT as u32),
            layers: Some(false),
            ..Default::default()
        },
        &quiet(),
    )
    .unwrap();
    store.create_volume(id(1), EXTENT).unwrap();
    let e = store.snapshot(id(1), id(2)).unwrap_err();
    assert!(matches!(e, StoreError::NoLayers), "{e}");
    assert!(e.to_string().contains("without layers"));
}
