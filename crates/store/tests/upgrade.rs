//! Upgrading a version-1 store (kept as fixtures, `tests/fixtures/`) to
//! version 2 at open: the volumes, sizes and acknowledged data are all
//! there afterwards, and an upgrade interrupted by a power cut at any of
//! its device operations is simply done again at the next open.

use basalt_store::{inspect, BlockDevice, OpenOptions, SimDevice, Store};
use std::sync::Arc;

const A: u128 = 0xa11ce;
const B: u128 = 0xb0b;
const C: u128 = 0xc0ffee;

fn load(name: &str) -> Arc<SimDevice> {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    let img = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    assert_eq!(&img[..8], b"BSTIMG1\0");
    let size = u64::from_le_bytes(img[8..16].try_into().unwrap());
    let dev = SimDevice::new(size, 1);
    for rec in img[16..].chunks(8 + 4096) {
        let off = u64::from_le_bytes(rec[..8].try_into().unwrap());
        dev.write_at(&rec[8..], off, false).unwrap();
    }
    dev.flush().unwrap();
    dev
}

fn pattern(vol: u8, block: u64) -> Vec<u8> {
    (0..4096u64)
        .map(|i| (vol as u64 * 31 + block * 7 + i / 3) as u8 | 1)
        .collect()
}

fn quiet() -> OpenOptions {
    OpenOptions {
        background_zeroing: false,
        ..Default::default()
    }
}

/// The fixture's acknowledged content, read through the upgraded store.
fn check_content(store: &Arc<Store>, crashed: bool) {
    let ids: Vec<_> = store
        .volumes()
        .iter()
        .map(|v| (v.id.as_u128(), v.size))
        .collect();
    assert_eq!(
        ids,
        vec![(B, 768 << 10), (A, 1 << 20)],
        "volumes after the upgrade"
    );
    let a = store.volume(uuid::Uuid::from_u128(A)).unwrap();
    let b = store.volume(uuid::Uuid::from_u128(B)).unwrap();
    let mut buf = vec![0u8; 4096];
    for blk in 0..256u64 {
        a.read(blk * 4096, &mut buf).unwrap();
        let expected = match blk {
            0 | 1 | 100 | 255 => pattern(1, blk),
            200 if crashed => {
                // Written without a flush before the crash: any sector may
                // hold the new bytes or zeros.
                let new = pattern(1, 200);
                for (s, got) in buf.chunks(512).enumerate() {
                    let n = &new[s * 512..(s + 1) * 512];
                    assert!(
                        got == n || got.iter().all(|&x| x == 0),
                        "a block 200 sector {s}"
                    );
                }
                continue;
            }
            _ => vec![0u8; 4096], // 17 was trimmed
        };
        assert!(buf == expected, "volume a block {blk}");
    }
    for blk in 0..192u64 {
        b.read(blk * 4096, &mut buf).unwrap();
        let expected = if [3, 64, 127].contains(&blk) {
            pattern(2, blk)
        } else {
            vec![0u8; 4096]
        };
        assert!(buf == expected, "volume b block {blk}");
    }
    assert!(
        store.volume(uuid::Uuid::from_u128(C)).is_err(),
        "c was deleted"
    );
    store.check().unwrap();
}

#[test]
fn version_1_stores_are_upgraded_at_open() {
    for (name, crashed) in [("v1-clean.img", false), ("v1-crashed.img", true)] {
        let dev = load(name);
        let info = inspect(dev.as_ref()).unwrap();
        assert_eq!(info.version, 1);
        assert_eq!(info.clean, !crashed);
        assert_eq!(info.volumes, 2);
        assert!(info.upgrade_pages > 0);
        // The dry run changed nothing.
        let writes = dev.op_count();
        let store = Store::open_with(dev.clone(), &quiet()).unwrap();
        assert!(writes < dev.op_count());
        assert!(store.recovery().upgraded_from_v1, "{name}");
        check_content(&store, crashed);
        // A crashed v1 store's free extents may hold data: all are dirty.
        assert_eq!(store.recovery().dirty_extents > 0, crashed, "{name}");
        store.zero_freed().unwrap();
        store.check().unwrap();
        store.close().unwrap();
        drop(store);
        assert_eq!(inspect(dev.as_ref()).unwrap().version, 2);
        let store = Store::open_with(dev.clone(), &quiet()).unwrap();
        assert!(!store.recovery().upgraded_from_v1);
        assert!(!store.recovery().unclean);
        check_content(&store, crashed);
    }
}

#[test]
fn an_upgrade_cut_short_at_any_device_operation_is_done_again() {
    for name in ["v1-clean.img", "v1-crashed.img"] {
        // Device operations of an upgrade and the open after it.
        let dev = load(name);
        let start = dev.op_count();
        drop(Store::open_with(dev.clone(), &quiet()).unwrap());
        let total = dev.op_count() - start;
        for k in 0..total {
            let dev = load(name);
            dev.cut_power_after(k);
            assert!(
                Store::open_with(dev.clone(), &quiet()).is_err(),
                "{name}: cut after op {k}"
            );
            dev.crash();
            let store = Store::open_with(dev.clone(), &quiet()).unwrap_or_else(|e| {
                panic!("{name}: open after a cut at upgrade op {k} of {total}: {e}")
            });
            check_content(&store, name.contains("crashed"));
        }
    }
}
