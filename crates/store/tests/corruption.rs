//! Damage to a real store file, as a disk can do it after the data was
//! durable: a flipped bit in a superblock copy, an extent or volume table
//! entry, or a journal block. Every case is detected (never read as valid
//! metadata), named in the error or the recovery report, and loses nothing
//! that the damage did not itself destroy.

mod common;

use basalt_store::{FileDevice, FormatOptions, OpenOptions, Store};
use common::flip;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

const EXTENT: u64 = 64 << 10;
const JOURNAL_BLOCKS: u64 = 64;

fn quiet() -> OpenOptions {
    OpenOptions {
        background_zeroing: false,
        ..Default::default()
    }
}

fn layout() -> basalt_store::format::Layout {
    basalt_store::format::Layout::plan(
        16 << 20,
        EXTENT as u32,
        Some(JOURNAL_BLOCKS),
        basalt_store::format::DEFAULT_FEATURES,
    )
    .unwrap()
}

/// A store with volume 1 holding extents 0..4 written (each first write
/// committed on its own) and left without a clean close.
fn store_file(dir: &Path) -> (std::path::PathBuf, Vec<u8>) {
    let path = dir.join("store.img");
    let dev = FileDevice::create(&path, 16 << 20, false).unwrap();
    let store = Store::create_with(
        dev,
        &FormatOptions {
            extent_size: Some(EXTENT as u32),
            journal_blocks: Some(JOURNAL_BLOCKS),
            ..Default::default()
        },
        &quiet(),
    )
    .unwrap();
    let id = uuid::Uuid::from_u128(1);
    store.create_volume(id, 8 * EXTENT).unwrap();
    let vol = store.volume(id).unwrap();
    let data: Vec<u8> = (0..4 * EXTENT).map(|i| (i / 4096) as u8 | 1).collect();
    for e in 0..4 {
        let r = (e * EXTENT) as usize..((e + 1) * EXTENT) as usize;
        vol.write(e * EXTENT, &data[r], false).unwrap();
        store.flush().unwrap();
    }
    drop(vol);
    drop(store); // no close: the journal is what holds the mappings
    (path, data)
}

fn open(path: &Path) -> Result<Arc<Store>, basalt_store::StoreError> {
    Store::open_with(FileDevice::open(path).unwrap(), &quiet())
}

fn read_volume(store: &Arc<Store>, len: u64) -> Vec<u8> {
    let mut buf = vec![0u8; len as usize];
    store
        .volume(uuid::Uuid::from_u128(1))
        .unwrap()
        .read(0, &mut buf)
        .unwrap();
    buf
}

/// The journal blocks the store wrote, by sequence number order (block
/// offset, seq, commit_first).
fn journal_blocks(path: &Path) -> Vec<(u64, u64, u64)> {
    let l = layout();
    let f = std::fs::File::open(path).unwrap();
    let mut blocks = Vec::new();
    let mut page = vec![0u8; 4096];
    for i in 0..l.journal_blocks {
        let at = l.journal_offset + i * 4096;
        f.read_exact_at(&mut page, at).unwrap();
        if &page[..4] == b"BJN2" {
            let seq = u64::from_le_bytes(page[8..16].try_into().unwrap());
            let first = u64::from_le_bytes(page[48..56].try_into().unwrap());
            blocks.push((at, seq, first));
        }
    }
    blocks.sort_by_key(|b| b.1);
    blocks
}

#[test]
fn a_corrupted_journal_block_before_later_commits_refuses_the_open() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = store_file(dir.path());
    let blocks = journal_blocks(&path);
    assert!(blocks.len() >= 4, "one block per commit: {blocks:?}");
    // A block in the middle: later commits verify, so this is no tear.
    let (at, seq, _) = blocks[1];
    flip(&path, at + 200, 3);
    let err = open(&path).err().expect("a corrupt journal must not open");
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("journal block {seq}")) && msg.contains("corrupted"),
        "{msg}"
    );
}

#[test]
fn damage_to_the_last_commit_reads_as_a_tear() {
    // Indistinguishable from a crash during that commit: the store opens
    // without it, and everything committed before it is there.
    let dir = tempfile::tempdir().unwrap();
    let (path, data) = store_file(dir.path());
    let blocks = journal_blocks(&path);
    let (at, _, _) = *blocks.last().unwrap();
    flip(&path, at + 100, 0);
    let store = open(&path).unwrap();
    let back = read_volume(&store, 4 * EXTENT);
    assert!(back[..3 * EXTENT as usize] == data[..3 * EXTENT as usize]);
    store.check().unwrap();
}

#[test]
fn a_corrupted_superblock_copy_falls_back_to_the_other() {
    let dir = tempfile::tempdir().unwrap();
    let (path, data) = store_file(dir.path());
    let store = open(&path).unwrap();
    store.close().unwrap();
    drop(store);
    // Damage whichever copy is newer (both, one after the other).
    flip(&path, 300, 1);
    let store = open(&path).unwrap();
    assert_eq!(read_volume(&store, 4 * EXTENT), data);
    store.close().unwrap();
    drop(store);
    flip(&path, 4096 + 300, 1);
    let store = open(&path).unwrap();
    assert_eq!(read_volume(&store, 4 * EXTENT), data);
}

#[test]
fn a_corrupted_extent_entry_is_quarantined_not_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let (path, data) = store_file(dir.path());
    // Fold the journal into the tables, so the entry is the only record.
    let store = open(&path).unwrap();
    store.close().unwrap();
    drop(store);
    let l = layout();
    // The owner field of the extent holding logical extent 2.
    let f = std::fs::File::open(&path).unwrap();
    let mut entry = [0u8; 16];
    let mut victim = None;
    for phys in 0..l.extent_count as u64 {
        f.read_exact_at(&mut entry, l.extent_table_offset + phys * 16)
            .unwrap();
        if u32::from_le_bytes(entry[0..4].try_into().unwrap()) == 1
            && u32::from_le_bytes(entry[8..12].try_into().unwrap()) == 2
        {
            victim = Some(phys);
        }
    }
    let phys = victim.expect("logical extent 2 is mapped");
    flip(&path, l.extent_table_offset + phys * 16, 1); // owner slot 1 -> 3
    let store = open(&path).unwrap();
    assert_eq!(
        store.recovery().quarantined_extents,
        1,
        "{:?}",
        store.recovery()
    );
    // The flipped entry did not hand the extent to slot 3, nor free it.
    store.check().unwrap();
    let back = read_volume(&store, 4 * EXTENT);
    let (e0, e2, e3) = (
        0..2 * EXTENT as usize,
        2 * EXTENT as usize..3 * EXTENT as usize,
        3 * EXTENT as usize..,
    );
    assert!(back[e0.clone()] == data[e0] && back[e3.clone()] == data[e3]);
    // The lost extent is no longer mapped (its owner is unknown); its data
    // is kept on disk, out of use, for the operator.
    assert!(back[e2].iter().all(|&b| b == 0));
    store.close().unwrap();
    drop(store);
    let store = open(&path).unwrap();
    assert_eq!(
        store.recovery().quarantined_extents,
        0,
        "written back as quarantined"
    );
    store.check().unwrap();
}

#[test]
fn a_corrupted_volume_slot_is_quarantined_with_its_extents() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = store_file(dir.path());
    let store = open(&path).unwrap();
    store.close().unwrap();
    drop(store);
    flip(&path, layout().volume_table_offset + 30, 4); // slot 1's size
    let store = open(&path).unwrap();
    assert_eq!(store.recovery().quarantined_slots, 1);
    assert!(store.volumes().is_empty());
    let report = store.check().unwrap();
    assert_eq!(
        report.quarantined_extents, 4,
        "its extents are kept, not freed"
    );
    // The slot is not reused by the next volume.
    store
        .create_volume(uuid::Uuid::from_u128(2), EXTENT)
        .unwrap();
    store.check().unwrap();
}
