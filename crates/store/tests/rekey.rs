//! Re-encryption of a volume (`Store::rekey_volume`, then `flatten`): plain
//! to encrypted and back while the volume is written, its older snapshots
//! keeping the key they were written with, across reopening; a rollback
//! onto a snapshot under another key, and that snapshot's deletion (a
//! merge that reseals), read what they should.

mod common;

use basalt_crypt::{DataKey, MasterKey};
use basalt_store::{BlockDevice, SimDevice, Store};
use common::{format_small, id, quiet};
use std::sync::Arc;
use uuid::Uuid;

const EXTENT: u64 = 64 * 1024;
const SIZE: u64 = 4 * EXTENT;

fn pattern(len: u64, seed: u8) -> Vec<u8> {
    let line = format!("basalt rekey {seed:03} ");
    line.bytes().cycle().take(len as usize).collect()
}

fn device_bytes(dev: &Arc<SimDevice>) -> Vec<u8> {
    let mut all = vec![0u8; dev.size() as usize];
    dev.read_at(&mut all, 0).unwrap();
    all
}

fn has_window(raw: &[u8], plain: &[u8]) -> bool {
    let wanted: std::collections::HashSet<&[u8]> = plain.windows(32).collect();
    raw.windows(32).any(|w| wanted.contains(w))
}

fn read_all(store: &Arc<Store>, v: Uuid) -> Vec<u8> {
    let h = store.volume(v).unwrap();
    let mut buf = vec![0u8; h.size() as usize];
    h.read(0, &mut buf).unwrap();
    buf
}

fn unlock_all(store: &Store, master: &MasterKey) {
    for (id, locked) in store.keyed_volumes() {
        if locked {
            let key = store.volume_key(id).unwrap().unwrap();
            let key = key.unwrap_with(master).unwrap();
            store.unlock_volume(id, Arc::new(key.cipher())).unwrap();
        }
    }
}

/// Re-encrypts `v` under a fresh key (`encrypt`) or none, flattens it and
/// deletes the snapshot that held its old layer.
fn rekey(store: &Arc<Store>, master: &MasterKey, v: Uuid, encrypt: bool, snap: Uuid) {
    let key = DataKey::generate();
    let wrapped = master.wrap(&key);
    let next = encrypt.then(|| (&wrapped, Arc::new(key.cipher())));
    store.rekey_volume(v, snap, next).unwrap();
    let report = store.flatten(v, 0..SIZE, None, &mut |_, _| {}).unwrap();
    assert!(report.detached);
    store.delete_snapshot(snap).unwrap();
}

#[test]
fn a_plain_volume_is_encrypted_online_and_back_its_snapshots_keep_their_keys() {
    let dev = SimDevice::new(16 << 20, 7);
    let store = format_small(&dev, EXTENT);
    let master = MasterKey::generate();
    let v = id(1);
    store.create_volume(v, SIZE).unwrap();
    let h = store.volume(v).unwrap();
    let old = pattern(2 * EXTENT + 8192, 1);
    h.write(0, &old, true).unwrap();
    // Written zeros stay data; a snapshot of the plain volume stays plain.
    h.write(3 * EXTENT, &[0u8; 4096], true).unwrap();
    store.snapshot(v, id(2)).unwrap();
    let before = read_all(&store, v);

    // Encrypt: the volume's layer becomes a snapshot under no key, and
    // writes go on under the new key while it is flattened.
    let key = DataKey::generate();
    let wrapped = master.wrap(&key);
    store
        .rekey_volume(v, id(3), Some((&wrapped, Arc::new(key.cipher()))))
        .unwrap();
    assert!(store.is_encrypted(v) && !store.is_encrypted(id(2)) && !store.is_encrypted(id(3)));
    assert!(store.has_own_key_entry(id(2)) && store.has_own_key_entry(id(3)));
    let fresh = pattern(EXTENT, 2);
    h.write(EXTENT / 2, &fresh, false).unwrap();
    let mut now = before.clone();
    now[(EXTENT / 2) as usize..(EXTENT / 2 + EXTENT) as usize].copy_from_slice(&fresh);
    assert_eq!(
        read_all(&store, v),
        now,
        "mixed layers read through their keys"
    );
    let report = store.flatten(v, 0..SIZE, None, &mut |_, _| {}).unwrap();
    assert!(report.detached);
    assert_eq!(read_all(&store, v), now);
    store.delete_snapshot(id(3)).unwrap();
    assert_eq!(read_all(&store, v), now);
    assert_eq!(
        read_all(&store, id(2)),
        before,
        "the plain snapshot kept its content"
    );
    // The old plaintext is still on the device only because snapshot 2
    // holds it; the volume's fresh data never was.
    assert!(!has_window(&device_bytes(&dev), &fresh));
    store.check().unwrap();

    // Reopened: the pinned snapshot still reads as plain.
    store.close().unwrap();
    let store = Store::open_with(dev.clone(), &quiet()).unwrap();
    unlock_all(&store, &master);
    assert_eq!(read_all(&store, v), now);
    assert_eq!(read_all(&store, id(2)), before);

    // Back to plain, then a rollback onto the plain snapshot: the volume
    // (plain) reads through it, and deleting it merges it in.
    rekey(&store, &master, v, false, id(4));
    assert!(!store.is_encrypted(v));
    assert_eq!(read_all(&store, v), now);
    rekey(&store, &master, v, true, id(5));
    assert_eq!(read_all(&store, v), now);
    store.rollback(v, id(2)).unwrap();
    assert_eq!(read_all(&store, v), before);
    let h = store.volume(v).unwrap();
    h.write(0, &fresh[..8192], true).unwrap();
    let mut rolled = before.clone();
    rolled[..8192].copy_from_slice(&fresh[..8192]);
    assert_eq!(read_all(&store, v), rolled);
    store.delete_snapshot(id(2)).unwrap();
    assert_eq!(
        read_all(&store, v),
        rolled,
        "the merge resealed the plain snapshot's blocks"
    );
    store.check().unwrap();
    // Nothing plain is left once freed extents are zeroed: the whole old
    // pattern went with snapshot 2 and the plain layer of snapshot 4.
    store.zero_freed().unwrap();
    assert!(!has_window(&device_bytes(&dev), &old));
    store.close().unwrap();
    let store = Store::open_with(dev.clone(), &quiet()).unwrap();
    unlock_all(&store, &master);
    assert_eq!(read_all(&store, v), rolled);
}

#[test]
fn an_encrypted_volume_with_a_clone_is_decrypted_and_its_clone_keeps_reading() {
    let dev = SimDevice::new(16 << 20, 8);
    let store = format_small(&dev, EXTENT);
    let master = MasterKey::generate();
    let v = id(1);
    let key = DataKey::generate();
    store
        .create_encrypted_volume(v, SIZE, &master.wrap(&key), Arc::new(key.cipher()))
        .unwrap();
    let data = pattern(SIZE, 3);
    store.volume(v).unwrap().write(0, &data, true).unwrap();
    store.snapshot(v, id(2)).unwrap();
    store.clone_snapshot(id(2), id(3), None).unwrap();
    rekey(&store, &master, v, false, id(4));
    assert!(!store.is_encrypted(v) && store.is_encrypted(id(2)) && store.is_encrypted(id(3)));
    assert_eq!(read_all(&store, v), data);
    assert_eq!(read_all(&store, id(2)), data);
    assert_eq!(read_all(&store, id(3)), data);
    // The volume is plain now: its copy is on the device as it is.
    assert!(has_window(&device_bytes(&dev), &data));
    store.close().unwrap();
    let store = Store::open_with(dev.clone(), &quiet()).unwrap();
    unlock_all(&store, &master);
    assert_eq!(read_all(&store, id(3)), data);
    assert_eq!(read_all(&store, id(2)), data);
    assert_eq!(read_all(&store, v), data);
}
