//! The store's behaviour at its edges: a full store answers ENOSPC and gets
//! its space back, a fresh volume is one hole and an overwrite touches no
//! metadata, an unknown format is refused by name, and a failing disk stops
//! writes without losing what was flushed. (Random histories with power
//! cuts at every device operation are in `power_loss.rs`.)

use basalt_store::{BlockDevice, FormatOptions, IoError, OpenOptions, SimDevice, Store};

const EXTENT: u32 = 64 * 1024;

/// No background zeroing: a simulated crash must not race a thread of the
/// store it replaces.
fn quiet() -> OpenOptions {
    OpenOptions {
        background_zeroing: false,
        ..Default::default()
    }
}

/// A fresh store with 64 KiB extents on `dev`.
fn format(dev: &std::sync::Arc<SimDevice>) -> std::sync::Arc<Store> {
    Store::create_with(
        dev.clone(),
        &FormatOptions {
            extent_size: Some(EXTENT),
            ..Default::default()
        },
        &quiet(),
    )
    .unwrap()
}

#[test]
fn full_store_returns_no_space_and_recovers_space() {
    let dev = SimDevice::new(8 << 20, 1);
    let store = format(&dev);
    let cap = store.usage().capacity_bytes;
    let a = uuid::Uuid::new_v4();
    let b = uuid::Uuid::new_v4();
    store.create_volume(a, cap).unwrap();
    store.create_volume(b, cap).unwrap(); // thin: 2x overcommit at the store level is allowed
    let va = store.volume(a).unwrap();
    let vb = store.volume(b).unwrap();
    let data = vec![0x5au8; EXTENT as usize];
    let half = cap / 2 / EXTENT as u64 * EXTENT as u64;
    let mut off = 0;
    while off < half {
        va.write(off, &data, false).unwrap();
        off += EXTENT as u64;
    }
    let mut off = 0;
    let err = loop {
        match vb.write(off, &data, false) {
            Ok(()) => off += EXTENT as u64,
            Err(e) => break e,
        }
    };
    assert!(matches!(err, IoError::NoSpace), "{err:?}");
    assert_eq!(store.usage().allocated_bytes, cap);
    // overwriting allocated space still works when full
    va.write(0, &data, true).unwrap();
    // everything written reads back
    let mut buf = vec![0u8; EXTENT as usize];
    vb.read(0, &mut buf).unwrap();
    assert_eq!(buf, data);
    // TRIM frees space for a new write
    va.trim(0, EXTENT as u64, false).unwrap();
    vb.write(off, &data, false).unwrap();
    assert!(matches!(
        vb.write(off + EXTENT as u64, &data, false),
        Err(IoError::NoSpace)
    ));
    // deleting frees the rest
    store.delete_volume(a).unwrap();
    vb.write(off + EXTENT as u64, &data, false).unwrap();
    store.flush().unwrap();
    dev.crash();
    let store = Store::open_with(dev, &quiet()).unwrap();
    let vb = store.volume(b).unwrap();
    vb.read(off + EXTENT as u64, &mut buf).unwrap();
    assert_eq!(buf, data);
}

#[test]
fn fresh_volume_is_one_hole_and_overwrites_allocate_nothing() {
    let dev = SimDevice::new(8 << 20, 2);
    let store = format(&dev);
    let id = uuid::Uuid::new_v4();
    store.create_volume(id, 1 << 20).unwrap();
    let v = store.volume(id).unwrap();
    let runs = v.mapping(0, 1 << 20).unwrap();
    assert_eq!(runs.len(), 1);
    assert!(!runs[0].allocated);
    v.write(4096, &[7u8; 4096], false).unwrap();
    store.flush().unwrap();
    let flushes = dev.flush_count();
    let allocated = store.usage().allocated_bytes;
    // An overwrite plus FUA: one device write with FUA, no journal commit.
    v.write(4096, &[8u8; 4096], true).unwrap();
    assert_eq!(
        dev.flush_count(),
        flushes,
        "an overwrite must not flush metadata"
    );
    assert_eq!(store.usage().allocated_bytes, allocated);
    dev.crash();
    let store = Store::open_with(dev, &quiet()).unwrap();
    let mut b = [0u8; 4096];
    store.volume(id).unwrap().read(4096, &mut b).unwrap();
    assert_eq!(b, [8u8; 4096]);
}

#[test]
fn unknown_format_version_is_refused_clearly() {
    let dev = SimDevice::new(8 << 20, 3);
    let store = format(&dev);
    store.close().unwrap();
    drop(store);
    for at in [0u64, 4096] {
        let mut page = vec![0u8; 4096];
        dev.read_at(&mut page, at).unwrap();
        page[8..12].copy_from_slice(&9u32.to_le_bytes());
        dev.write_at(&page, at, true).unwrap();
    }
    let err = Store::open_with(dev.clone(), &quiet())
        .err()
        .expect("must refuse");
    assert!(
        err.to_string()
            .contains("unsupported store format version 9"),
        "{err}"
    );
    let blank = SimDevice::new(8 << 20, 4);
    let err = Store::open_with(blank, &quiet())
        .err()
        .expect("must refuse");
    assert!(err.to_string().contains("no Basalt store"), "{err}");
}

#[test]
fn a_failing_disk_stops_writes_and_loses_nothing_flushed() {
    let dev = SimDevice::new(8 << 20, 5);
    let store = format(&dev);
    let id = uuid::Uuid::new_v4();
    store.create_volume(id, 1 << 20).unwrap();
    let v = store.volume(id).unwrap();
    v.write(0, &[1u8; 4096], false).unwrap();
    store.flush().unwrap();

    dev.set_fail_writes(true);
    assert!(matches!(
        v.write(EXTENT as u64, &[2u8; 4096], false),
        Err(IoError::Io(_))
    ));
    assert!(
        store.flush().is_err(),
        "a journal write to a failing disk must fail the flush"
    );
    // The store stopped: no write is accepted any more, reads still work.
    assert!(matches!(
        v.write(0, &[3u8; 4096], false),
        Err(IoError::Failed)
    ));
    let mut b = [0u8; 4096];
    v.read(0, &mut b).unwrap();
    assert_eq!(b, [1u8; 4096]);

    // The disk comes back; after a restart the flushed data is there and
    // the never-durable write is not.
    dev.set_fail_writes(false);
    dev.crash();
    let store = Store::open_with(dev, &quiet()).unwrap();
    let v = store.volume(id).unwrap();
    v.read(0, &mut b).unwrap();
    assert_eq!(b, [1u8; 4096]);
    v.read(EXTENT as u64, &mut b).unwrap();
    assert_eq!(b, [0u8; 4096]);
}

/// Kept from the earlier proptest model's regression file: an unflushed
/// write across an extent boundary, a crash, then a one-byte unaligned
/// write into the same blocks (its read-modify-write must see what the
/// crash left, and the write must land).
#[test]
fn unaligned_write_after_a_crash_lost_an_unflushed_write() {
    let dev = SimDevice::new(8 << 20, 0);
    let store = format(&dev);
    let id = uuid::Uuid::from_u128(1);
    store.create_volume(id, 10 * 4096).unwrap();
    let data = vec![0x5bu8; 20480];
    store
        .volume(id)
        .unwrap()
        .write(12288, &data, false)
        .unwrap();
    drop(store);
    dev.crash();
    let store = Store::open_with(dev.clone(), &quiet()).unwrap();
    let v = store.volume(id).unwrap();
    let mut before = vec![0u8; 10 * 4096];
    v.read(0, &mut before).unwrap();
    for (s, sector) in before.chunks(512).enumerate() {
        let written = (12288..12288 + 20480).contains(&(s * 512));
        assert!(
            sector.iter().all(|&b| b == 0) || (written && sector.iter().all(|&b| b == 0x5b)),
            "sector {s} after the crash"
        );
    }
    v.write(16384, &[7], false).unwrap();
    let mut after = vec![0u8; 10 * 4096];
    v.read(0, &mut after).unwrap();
    before[16384] = 7;
    assert_eq!(after, before);
    store.check().unwrap();
}
