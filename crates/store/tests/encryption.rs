//! Encrypted volumes in the store: what reaches the device is ciphertext
//! (no trace of the plaintext, different for two volumes), what is read
//! back is the plaintext, unwritten blocks read as zeros and written
//! zeros stay data; snapshots and clones read with their lineage's key; a
//! volume whose key is not loaded cannot be opened; a crash between a key
//! and its volume leaves neither half behind.

mod common;

use basalt_crypt::{DataKey, MasterKey};
use basalt_store::{BlockDevice, SimDevice, Store, StoreError, WrappedKey};
use common::{format_small, id, quiet};
use std::sync::Arc;
use uuid::Uuid;

const EXTENT: u64 = 64 * 1024;
const BLOCK: u64 = 4096;

fn format(dev: &Arc<SimDevice>) -> Arc<Store> {
    format_small(dev, EXTENT)
}

/// A recognisable, non-repeating text.
fn pattern(len: u64, seed: u8) -> Vec<u8> {
    let line = format!("basalt secret {seed:03} ");
    line.bytes().cycle().take(len as usize).collect()
}

fn device_bytes(dev: &Arc<SimDevice>) -> Vec<u8> {
    let mut all = vec![0u8; dev.size() as usize];
    dev.read_at(&mut all, 0).unwrap();
    all
}

/// How many 16-byte windows of `raw` are 16-byte windows of `plain`.
fn plaintext_windows(raw: &[u8], plain: &[u8]) -> usize {
    let wanted: std::collections::HashSet<&[u8]> = plain.windows(16).collect();
    raw.windows(16).filter(|w| wanted.contains(w)).count()
}

fn encrypted(store: &Store, master: &MasterKey, vol: Uuid, size: u64) -> WrappedKey {
    let key = DataKey::generate();
    let wrapped = master.wrap(&key);
    store
        .create_encrypted_volume(vol, size, &wrapped, Arc::new(key.cipher()))
        .unwrap();
    wrapped
}

fn unlock(store: &Store, master: &MasterKey, vol: Uuid) {
    let wrapped = store.volume_key(vol).unwrap().unwrap();
    let key = wrapped.unwrap_with(master).unwrap();
    store.unlock_volume(vol, Arc::new(key.cipher())).unwrap();
}

#[test]
fn the_device_holds_only_ciphertext_and_reads_give_the_plaintext() {
    let dev = SimDevice::new(16 << 20, 1);
    let store = format(&dev);
    let master = MasterKey::generate();
    let (a, b, plain) = (id(1), id(2), id(3));
    encrypted(&store, &master, a, 4 * EXTENT);
    encrypted(&store, &master, b, 4 * EXTENT);
    store.create_volume(plain, 4 * EXTENT).unwrap();
    let data = pattern(2 * EXTENT, 1);
    let write = |v: Uuid| {
        let h = store.volume(v).unwrap();
        h.write(0, &data, true).unwrap();
        // Written zeros, then blocks left unwritten in the same extent.
        h.write(2 * EXTENT, &vec![0u8; BLOCK as usize], true)
            .unwrap();
    };
    write(a);
    write(b);
    // No 16-byte window of the plaintext anywhere on the device...
    assert_eq!(plaintext_windows(&device_bytes(&dev), &data), 0);
    // ...while the same search finds a plain volume's copy.
    write(plain);
    assert!(plaintext_windows(&device_bytes(&dev), &data) > 0);
    assert!(store.is_encrypted(a) && !store.is_encrypted(plain));

    for v in [a, b] {
        let h = store.volume(v).unwrap();
        let mut back = vec![0u8; 4 * EXTENT as usize];
        h.read(0, &mut back).unwrap();
        assert!(back[..data.len()] == data[..]);
        assert!(back[data.len()..].iter().all(|&x| x == 0));
        // Written zeros are data (allocated), unwritten ones a hole.
        let map = h.mapping(2 * EXTENT, 2 * EXTENT).unwrap();
        assert!(map[0].allocated && map[0].len >= BLOCK);
        // Unaligned I/O goes through the cipher too.
        h.write(100, b"hello", false).unwrap();
        let mut small = [0u8; 9];
        h.read(98, &mut small).unwrap();
        assert_eq!(
            &small,
            &[data[98], data[99], b'h', b'e', b'l', b'l', b'o', data[105], data[106]]
        );
    }
}

#[test]
fn two_volumes_with_the_same_plaintext_have_different_ciphertext() {
    let dev = SimDevice::new(16 << 20, 2);
    let store = format(&dev);
    let master = MasterKey::generate();
    encrypted(&store, &master, id(1), EXTENT);
    encrypted(&store, &master, id(2), EXTENT);
    let block = vec![0x42u8; BLOCK as usize];
    store.volume(id(1)).unwrap().write(0, &block, true).unwrap();
    let before = device_bytes(&dev);
    store.volume(id(2)).unwrap().write(0, &block, true).unwrap();
    let after = device_bytes(&dev);
    let bs = BLOCK as usize;
    let old: std::collections::HashSet<&[u8]> = before.chunks(bs).collect();
    let new: Vec<&[u8]> = after
        .chunks(bs)
        .zip(before.chunks(bs))
        .filter(|(a, b)| a != b)
        .map(|(a, _)| a)
        .collect();
    assert!(!new.is_empty());
    // The second volume's ciphertext is none of the blocks the first
    // volume's write left on the device, and neither is the plaintext.
    assert!(new.iter().all(|b| !old.contains(b) && *b != &block[..]));
    assert!(!old.contains(&block[..]));
}

#[test]
fn snapshots_and_clones_read_with_their_lineage_key_and_a_missing_key_locks() {
    let dev = SimDevice::new(16 << 20, 3);
    let store = format(&dev);
    let master = MasterKey::generate();
    let (vol, snap, clone) = (id(1), id(2), id(3));
    encrypted(&store, &master, vol, 4 * EXTENT);
    let gold = pattern(2 * EXTENT, 2);
    store.volume(vol).unwrap().write(0, &gold, true).unwrap();
    store.snapshot(vol, snap).unwrap();
    store
        .volume(vol)
        .unwrap()
        .write(0, &pattern(BLOCK, 3), true)
        .unwrap();
    store.clone_snapshot(snap, clone, None).unwrap();
    assert!(store.is_encrypted(snap) && store.is_encrypted(clone));
    let c = store.volume(clone).unwrap();
    c.write(EXTENT, &pattern(BLOCK, 4), true).unwrap();
    let mut expect = gold.clone();
    expect[EXTENT as usize..(EXTENT + BLOCK) as usize].copy_from_slice(&pattern(BLOCK, 4));
    let read = |store: &Arc<Store>, v: Uuid, len: usize| {
        let mut b = vec![0u8; len];
        store.volume(v).unwrap().read(0, &mut b).unwrap();
        b
    };
    assert!(read(&store, clone, gold.len()) == expect);
    assert!(read(&store, snap, gold.len()) == gold);
    store.close().unwrap();
    drop((c, store));

    // Reopened: every layer is locked until its volume's key is loaded.
    dev.crash();
    let store = Store::open_with(dev.clone(), &quiet()).unwrap();
    for v in [vol, snap, clone] {
        assert!(matches!(store.volume(v), Err(StoreError::Locked(_))), "{v}");
    }
    assert_eq!(store.keyed_volumes(), vec![(vol, true), (clone, true)]);
    unlock(&store, &master, vol);
    assert!(read(&store, snap, gold.len()) == gold);
    assert!(matches!(store.volume(clone), Err(StoreError::Locked(_))));
    unlock(&store, &master, clone);
    assert!(read(&store, clone, gold.len()) == expect);
    // A wrong master key never yields a cipher.
    let other = MasterKey::generate();
    assert!(store
        .volume_key(vol)
        .unwrap()
        .unwrap()
        .unwrap_with(&other)
        .is_err());
    // Flattened, the clone keeps reading with its own entry.
    let report = store
        .flatten(clone, 0..4 * EXTENT, None, &mut |_, _| ())
        .unwrap();
    assert!(report.detached, "{report:?}");
    store.delete_snapshot(snap).unwrap();
    assert!(read(&store, clone, gold.len()) == expect);
}

#[test]
fn a_crash_between_a_key_and_its_volume_leaves_neither() {
    for cut in 1..12 {
        let dev = SimDevice::new(16 << 20, 10 + cut);
        let store = format(&dev);
        store.flush().unwrap();
        let master = MasterKey::generate();
        let key = DataKey::generate();
        dev.cut_power_after(cut);
        let made = store.create_encrypted_volume(
            id(1),
            EXTENT,
            &master.wrap(&key),
            Arc::new(key.cipher()),
        );
        drop(store);
        dev.crash();
        let store = Store::open_with(dev.clone(), &quiet()).unwrap();
        let exists = store.volumes().iter().any(|v| v.id == id(1));
        let keyed = !store.keyed_volumes().is_empty();
        assert_eq!(exists, keyed, "cut {cut}: volume {exists}, key {keyed}");
        if made.is_ok() {
            assert!(exists, "cut {cut}: created, then lost");
        }
        if exists {
            assert!(matches!(store.volume(id(1)), Err(StoreError::Locked(_))));
        }
    }
}

/// Compress, then encrypt: an encrypted volume's extents pack (they do not
/// compress as ciphertext), nothing of the plaintext reaches the device,
/// reads give the plaintext, a write unpacks back to ciphertext, and the
/// packed blocks of a volume whose key is not loaded are not read.
#[test]
fn encrypted_extents_are_compressed_before_they_are_encrypted() {
    use basalt_store::{Codec, PackOutcome};
    let dev = SimDevice::new(16 << 20, 9);
    let store = format(&dev);
    let master = MasterKey::generate();
    let vol = id(1);
    let size = 4 * EXTENT;
    encrypted(&store, &master, vol, size);
    let h = store.volume(vol).unwrap();
    let mut plain = pattern(size, 7);
    plain[(EXTENT as usize)..(EXTENT + BLOCK) as usize].fill(0); // written zeros
    h.write(0, &plain, false).unwrap();
    for l in 0..4 {
        let o = store.pack_extent(vol, l, Codec::Lz4).unwrap();
        assert!(matches!(o, PackOutcome::Packed { .. }), "extent {l}: {o:?}");
    }
    store.flush().unwrap();
    assert!(store.usage().packed_stored_bytes * 4 < size);
    // (Checked against the text: the device is full of zeros.)
    let secret = pattern(size, 7);
    assert_eq!(plaintext_windows(&device_bytes(&dev), &secret), 0);
    let mut back = vec![0u8; size as usize];
    h.read(0, &mut back).unwrap();
    assert!(back == plain, "reads give the plaintext");
    // A write into a packed extent unpacks it: ciphertext again, plaintext
    // nowhere.
    h.write(2 * EXTENT + BLOCK, &pattern(BLOCK, 8), false)
        .unwrap();
    plain[(2 * EXTENT + BLOCK) as usize..(2 * EXTENT + 2 * BLOCK) as usize]
        .copy_from_slice(&pattern(BLOCK, 8));
    store.flush().unwrap();
    h.read(0, &mut back).unwrap();
    assert!(back == plain);
    assert_eq!(plaintext_windows(&device_bytes(&dev), &secret), 0);
    store.zero_freed().unwrap();
    store.check().unwrap();
    // Reopened: locked until unlocked, then the same.
    drop(h);
    store.close().unwrap();
    drop(store);
    let store = Store::open_with(dev.clone(), &quiet()).unwrap();
    assert!(matches!(store.volume(vol), Err(StoreError::Locked(_))));
    unlock(&store, &master, vol);
    store.volume(vol).unwrap().read(0, &mut back).unwrap();
    assert!(back == plain, "after a restart");
    store.check().unwrap();
}
