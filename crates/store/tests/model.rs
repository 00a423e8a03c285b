//! The store engine against a plain in-memory model: random sequences of
//! creates, deletes, resizes, (unaligned) writes, zeroes, trims, flushes,
//! clean restarts and crashes on a `SimDevice` that drops or tears unflushed
//! writes. After every crash the store must open without repair, every
//! volume must exist with its size, every flushed or FUA byte must be there,
//! and every other byte must hold a value that was written to it (or zero).
//!
//! Seeded by proptest; a failure prints the minimal sequence and replays.

use basalt_store::{BlockDevice, FormatOptions, IoError, OpenOptions, SimDevice, Store};

/// No background zeroing: a simulated crash must not race a thread of the
/// store it replaces.
fn quiet() -> OpenOptions {
    OpenOptions {
        background_zeroing: false,
    }
}
use proptest::prelude::*;
use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

const SECTOR: usize = 512;
const EXTENT: u32 = 64 * 1024;
const BLOCK: u64 = 4096;

#[derive(Debug, Clone)]
enum Op {
    Create {
        blocks: u64,
    },
    Delete {
        vol: usize,
    },
    Resize {
        vol: usize,
        blocks: u64,
    },
    Write {
        vol: usize,
        at: u64,
        len: u64,
        aligned: bool,
        seed: u8,
        fua: bool,
    },
    Zeroes {
        vol: usize,
        at: u64,
        len: u64,
        may_unmap: bool,
        fua: bool,
    },
    Flush,
    Crash,
    CleanRestart,
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (1u64..48).prop_map(|blocks| Op::Create { blocks }),
        1 => any::<usize>().prop_map(|vol| Op::Delete { vol }),
        1 => (any::<usize>(), 1u64..48).prop_map(|(vol, blocks)| Op::Resize { vol, blocks }),
        10 => (any::<usize>(), any::<u64>(), 1u64..40_000, any::<bool>(), any::<u8>(), prop::bool::weighted(0.2))
            .prop_map(|(vol, at, len, aligned, seed, fua)| Op::Write { vol, at, len, aligned, seed, fua }),
        3 => (any::<usize>(), any::<u64>(), 1u64..200_000, any::<bool>(), prop::bool::weighted(0.2))
            .prop_map(|(vol, at, len, may_unmap, fua)| Op::Zeroes { vol, at, len, may_unmap, fua }),
        2 => Just(Op::Flush),
        2 => Just(Op::Crash),
        1 => Just(Op::CleanRestart),
    ]
}

fn hash(b: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    b.hash(&mut h);
    h.finish()
}

/// What one volume must hold.
struct ModelVolume {
    id: uuid::Uuid,
    current: Vec<u8>,
    /// Content as of the last point it was known durable.
    stable: Vec<u8>,
    /// Sectors written since: every content they held (any may survive).
    since: HashMap<usize, Vec<u64>>,
}

impl ModelVolume {
    fn touch(&mut self, at: usize, len: usize, durable: bool) {
        for s in at / SECTOR..(at + len).div_ceil(SECTOR) {
            let sector = &self.current[s * SECTOR..(s + 1) * SECTOR];
            if durable {
                self.stable[s * SECTOR..(s + 1) * SECTOR].copy_from_slice(sector);
                self.since.remove(&s);
            } else {
                self.since.entry(s).or_default().push(hash(sector));
            }
        }
    }
    fn everything_durable(&mut self) {
        self.stable.clone_from(&self.current);
        self.since.clear();
    }
}

struct Harness {
    dev: Arc<SimDevice>,
    store: Arc<Store>,
    model: Vec<ModelVolume>,
    capacity_blocks: u64,
}

impl Harness {
    fn new(seed: u64) -> Harness {
        let dev = SimDevice::new(8 << 20, seed);
        let store = Store::create_with(
            dev.clone(),
            &FormatOptions {
                extent_size: Some(EXTENT),
                ..Default::default()
            },
            &quiet(),
        )
        .expect("format");
        let capacity_blocks = store.usage().capacity_bytes / BLOCK;
        Harness {
            dev,
            store,
            model: Vec::new(),
            capacity_blocks,
        }
    }

    fn provisioned_blocks(&self) -> u64 {
        self.model
            .iter()
            .map(|v| v.current.len() as u64 / BLOCK)
            .sum()
    }

    fn all_durable(&mut self) {
        for v in &mut self.model {
            v.everything_durable();
        }
    }

    fn pick(&self, vol: usize) -> Option<usize> {
        (!self.model.is_empty()).then(|| vol % self.model.len())
    }

    fn check_current(&self, i: usize) {
        let v = &self.model[i];
        let h = self.store.volume(v.id).expect("volume exists");
        assert_eq!(h.size(), v.current.len() as u64, "size");
        let mut buf = vec![0u8; v.current.len()];
        h.read(0, &mut buf).expect("read");
        if buf != v.current {
            let first = buf
                .iter()
                .zip(&v.current)
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            panic!("volume {i}: content differs from the model at byte {first}");
        }
        // Unallocated runs read as zeros.
        let mut off = 0usize;
        for run in h.mapping(0, v.current.len() as u64).expect("mapping") {
            if !run.allocated {
                assert!(
                    buf[off..off + run.len as usize].iter().all(|&b| b == 0),
                    "hole with data"
                );
            }
            off += run.len as usize;
        }
        assert_eq!(off, v.current.len());
    }

    /// After a crash: every sector holds its durable content or one it was
    /// given since; then the recovered content becomes the model.
    fn check_after_crash(&mut self) {
        let mut ids: Vec<_> = self.store.volumes().into_iter().map(|u| u.id).collect();
        ids.sort();
        let mut expected: Vec<_> = self.model.iter().map(|v| v.id).collect();
        expected.sort();
        assert_eq!(ids, expected, "volumes after crash");
        for (i, v) in self.model.iter_mut().enumerate() {
            let h = self.store.volume(v.id).expect("volume");
            assert_eq!(h.size(), v.current.len() as u64, "size after crash");
            let mut buf = vec![0u8; v.current.len()];
            h.read(0, &mut buf).expect("read after crash");
            for s in 0..buf.len() / SECTOR {
                let got = &buf[s * SECTOR..(s + 1) * SECTOR];
                let stable = &v.stable[s * SECTOR..(s + 1) * SECTOR];
                let ok = got == stable || v.since.get(&s).is_some_and(|c| c.contains(&hash(got)));
                assert!(
                    ok,
                    "volume {i} sector {s}: content after crash was never written there"
                );
            }
            v.current.clone_from(&buf);
            v.everything_durable();
        }
        let usage = self.store.usage();
        let per_volume: u64 = self.store.volumes().iter().map(|u| u.allocated_bytes).sum();
        assert_eq!(usage.allocated_bytes, per_volume);
        assert!(usage.allocated_bytes <= usage.capacity_bytes);
    }

    fn run(&mut self, op: &Op) {
        match *op {
            Op::Create { blocks } => {
                if self.provisioned_blocks() + blocks > self.capacity_blocks
                    || self.model.len() >= 6
                {
                    return;
                }
                let id = uuid::Uuid::new_v4();
                self.store
                    .create_volume(id, blocks * BLOCK)
                    .expect("create");
                self.all_durable();
                let zeros = vec![0u8; (blocks * BLOCK) as usize];
                self.model.push(ModelVolume {
                    id,
                    current: zeros.clone(),
                    stable: zeros,
                    since: HashMap::new(),
                });
            }
            Op::Delete { vol } => {
                let Some(i) = self.pick(vol) else { return };
                let h = self.store.volume(self.model[i].id).expect("volume");
                self.store.delete_volume(self.model[i].id).expect("delete");
                assert!(matches!(h.read(0, &mut [0u8; 4096]), Err(IoError::Gone)));
                self.model.remove(i);
                self.all_durable();
            }
            Op::Resize { vol, blocks } => {
                let Some(i) = self.pick(vol) else { return };
                let old = self.model[i].current.len() as u64 / BLOCK;
                if self.provisioned_blocks() - old + blocks > self.capacity_blocks {
                    return;
                }
                self.store
                    .resize_volume(self.model[i].id, blocks * BLOCK)
                    .expect("resize");
                self.all_durable();
                let v = &mut self.model[i];
                let n = (blocks * BLOCK) as usize;
                v.current.resize(n, 0);
                v.stable.resize(n, 0);
                self.check_current(i);
            }
            Op::Write {
                vol,
                at,
                len,
                aligned,
                seed,
                fua,
            } => {
                let Some(i) = self.pick(vol) else { return };
                let size = self.model[i].current.len() as u64;
                let (mut at, mut len) = (at % size, len.min(size));
                if aligned {
                    at = at / BLOCK * BLOCK;
                    len = len.div_ceil(BLOCK) * BLOCK;
                }
                let len = len.min(size - at);
                let data: Vec<u8> = (0..len)
                    .map(|k| seed.wrapping_add((k * 7 + k / 511) as u8) | 1)
                    .collect();
                let h = self.store.volume(self.model[i].id).expect("volume");
                h.write(at, &data, fua).expect("write");
                let v = &mut self.model[i];
                v.current[at as usize..(at + len) as usize].copy_from_slice(&data);
                v.touch(at as usize, len as usize, fua);
                // Out of range is refused and changes nothing.
                assert!(matches!(
                    h.write(size - 1, &[1, 2], false),
                    Err(IoError::OutOfRange { .. })
                ));
                self.check_current(i);
            }
            Op::Zeroes {
                vol,
                at,
                len,
                may_unmap,
                fua,
            } => {
                let Some(i) = self.pick(vol) else { return };
                let size = self.model[i].current.len() as u64;
                let at = at % size;
                let len = len.min(size - at);
                let h = self.store.volume(self.model[i].id).expect("volume");
                h.write_zeroes(at, len, may_unmap, fua).expect("zeroes");
                let v = &mut self.model[i];
                v.current[at as usize..(at + len) as usize].fill(0);
                v.touch(at as usize, len as usize, false);
                if fua {
                    self.all_durable();
                }
                self.check_current(i);
            }
            Op::Flush => {
                self.store.flush().expect("flush");
                self.all_durable();
            }
            Op::Crash => {
                self.dev.crash();
                self.store =
                    Store::open_with(self.dev.clone(), &quiet()).expect("open after crash");
                self.check_after_crash();
            }
            Op::CleanRestart => {
                self.store.close().expect("close");
                self.all_durable();
                self.store =
                    Store::open_with(self.dev.clone(), &quiet()).expect("open after clean close");
                for i in 0..self.model.len() {
                    self.check_current(i);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(64)))]

    #[test]
    fn store_matches_model_across_crashes(seed in any::<u64>(), ops in prop::collection::vec(op_strategy(), 1..60)) {
        let mut h = Harness::new(seed);
        for op in &ops {
            h.run(op);
        }
        h.run(&Op::Crash);
    }
}

#[test]
fn full_store_returns_no_space_and_recovers_space() {
    let dev = SimDevice::new(8 << 20, 1);
    let store = Store::create_with(
        dev.clone(),
        &FormatOptions {
            extent_size: Some(EXTENT),
            ..Default::default()
        },
        &quiet(),
    )
    .unwrap();
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
    let store = Store::create_with(
        dev.clone(),
        &FormatOptions {
            extent_size: Some(EXTENT),
            ..Default::default()
        },
        &quiet(),
    )
    .unwrap();
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
    let store = Store::create_with(
        dev.clone(),
        &FormatOptions {
            extent_size: Some(EXTENT),
            ..Default::default()
        },
        &quiet(),
    )
    .unwrap();
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
    let store = Store::create_with(
        dev.clone(),
        &FormatOptions {
            extent_size: Some(EXTENT),
            ..Default::default()
        },
        &quiet(),
    )
    .unwrap();
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
