//! Power loss at every device operation. For each seeded history of store
//! calls (creates, deletes, resizes, aligned and unaligned writes, FUA,
//! zeroing and TRIM, flushes, zeroing passes, cooling rounds, snapshots,
//! clones, rollbacks, snapshot deletions, clean restarts; every other
//! volume encrypted, its wrapped key replaced now and then, volumes
//! re-encrypted between plain and encrypted), the history
//! is run once to count its device operations, then once per operation k
//! with the power cut after op k: the device fails from then on, and the
//! crash drops, reorders and tears (per 512 B sector) every write that was
//! not flushed — journal, tables and superblock included. The store is
//! reopened, checked, and the history goes on to a second cut at a seeded
//! random point (so a tear left by the first crash meets a later commit),
//! then to the end and a final crash.
//!
//! After every crash: the store opens; the volumes are the ones whose
//! create or delete completed (the one in flight may have happened or
//! not); every byte acknowledged durable (flush, FUA, a completed
//! create/resize/delete/close) reads back; every other byte holds a value
//! written to that volume (data patterns are per volume, so another
//! volume's bytes never match) or zero; every snapshot reads exactly what
//! its volume held when it was taken; `Store::check` finds every extent in
//! exactly one place and every free extent zero; nothing was stray; every
//! volume's key is the last one set (or the one being set), a snapshot's
//! its volume's unless a re-encryption pinned it to the key it was written
//! with, a clone's its source's, no volume exists without its key
//! or key without its volume, and no deleted volume's wrapped key is left
//! on the device. Encrypted volumes are checked like the others through
//! their cipher, with one difference: a 4 KiB block written and not
//! flushed may be torn across sectors, and a torn block of ciphertext
//! decrypts to neither version, so such a block may read as anything; so
//! may a block of the tail a shrink cut short was zeroing (it was being
//! dropped).
//!
//! The journal holds 6 (or 16) blocks, so it wraps and checkpoints
//! constantly. Two shapes of history: small volumes, and bulk writes and
//! TRIMs whose commits span several journal blocks (and can tear between
//! them). `BASALT_POWER_SEEDS=a..b` picks the seeds; `BASALT_POWER_CUTS`
//! caps the cuts tried per history (default 250 small, 100 bulk, spread
//! over it).

use basalt_crypt::{BlockCipher, DataKey};
use basalt_store::format::Superblock;
use basalt_store::{
    BlockDevice, Codec, FormatOptions, IoError, OpenOptions, PackOutcome, SimDevice, Store,
    StoreError, WrappedKey,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const SECTOR: usize = 512;

/// Extents the histories packed (a sweep that packed none tested nothing).
static PACKED: AtomicU64 = AtomicU64::new(0);
/// Re-encryptions the histories switched (likewise).
static REKEYED: AtomicU64 = AtomicU64::new(0);
/// Clones with snapshots of their own the histories detached from their
/// source (likewise).
static DEEP_FLATTENED: AtomicU64 = AtomicU64::new(0);
const EXTENT: u64 = 64 * 1024;
const BLOCK: u64 = 4096;

/// The size of things in a history.
#[derive(Clone, Copy)]
struct Shape {
    device: u64,
    journal_blocks: u64,
    /// Largest volume, write and zeroing, in 4 KiB blocks.
    volume_blocks: u64,
    write_blocks: u64,
    zero_blocks: u64,
    /// Compare each volume with the model after every call (not only after
    /// crashes): cheap for small volumes.
    check_every_call: bool,
}

/// Small volumes: every call is a handful of device operations.
const SMALL: Shape = Shape {
    device: 4 << 20,
    journal_blocks: 6,
    volume_blocks: 48,
    write_blocks: 10,
    zero_blocks: 50,
    check_every_call: true,
};

/// Writes and TRIMs of many extents between flushes, so that one commit
/// spans several journal blocks (84 entries each) and can be torn between
/// them.
const BULK: Shape = Shape {
    device: 24 << 20,
    journal_blocks: 16,
    volume_blocks: 1536,
    write_blocks: 640,
    zero_blocks: 1536,
    check_every_call: false,
};

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
    ZeroFreed,
    /// A cooling round over every hot extent (checksums written, write
    /// intent cleared).
    Cool,
    Snapshot {
        vol: usize,
    },
    Clone {
        snap: usize,
    },
    DeleteSnapshot {
        snap: usize,
    },
    Rollback {
        snap: usize,
    },
    /// Copy every block a volume reads through its parents into it, and
    /// detach it.
    Flatten {
        vol: usize,
    },
    CleanRestart,
    /// Sets (or replaces) a volume's wrapped key.
    SetKey {
        vol: usize,
        seed: u64,
    },
    /// Compacts every extent of a volume or snapshot into packed runs
    /// (those that compress; encrypted ones do not).
    Pack {
        layer: usize,
        zstd: bool,
    },
    /// Detaches a clone and its snapshots from its source: copies into its
    /// oldest layer what that reads through the source.
    FlattenSource {
        vol: usize,
    },
    /// Re-encrypts a volume (plain to encrypted under key `seed`, or
    /// encrypted to plain), flattens it and deletes the snapshot that
    /// took its old layer.
    Rekey {
        vol: usize,
        seed: u64,
    },
}

fn history(seed: u64, shape: Shape) -> Vec<Op> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    let len = rng.gen_range(20..45);
    (0..len)
        .map(|_| match rng.gen_range(0..39) {
            0..=3 => Op::Create {
                blocks: rng.gen_range(1..shape.volume_blocks),
            },
            4 => Op::Delete { vol: rng.gen() },
            5..=6 => Op::Resize {
                vol: rng.gen(),
                blocks: rng.gen_range(1..shape.volume_blocks),
            },
            7..=18 => Op::Write {
                vol: rng.gen(),
                at: rng.gen(),
                len: rng.gen_range(1..shape.write_blocks * BLOCK),
                aligned: rng.gen_bool(0.7),
                seed: rng.gen(),
                fua: rng.gen_bool(0.2),
            },
            19..=22 => Op::Zeroes {
                vol: rng.gen(),
                at: rng.gen(),
                len: rng.gen_range(1..shape.zero_blocks * BLOCK),
                may_unmap: rng.gen_bool(0.7),
                fua: rng.gen_bool(0.2),
            },
            23..=25 => Op::Flush,
            26..=27 => Op::ZeroFreed,
            28..=29 => Op::Cool,
            30..=31 => Op::Snapshot { vol: rng.gen() },
            32 => Op::Clone { snap: rng.gen() },
            33..=34 => Op::DeleteSnapshot { snap: rng.gen() },
            35 => Op::Rollback { snap: rng.gen() },
            36 => Op::Flatten { vol: rng.gen() },
            _ => Op::CleanRestart,
        })
        .collect::<Vec<Op>>()
        .into_iter()
        // Key operations come from a stream of their own, between the
        // others (whose draws stay as they were).
        .flat_map({
            let mut keys = StdRng::seed_from_u64(seed ^ 0x6b65_7973);
            move |op| {
                let key = keys.gen_bool(0.15).then(|| Op::SetKey {
                    vol: keys.gen(),
                    seed: keys.gen(),
                });
                std::iter::once(op).chain(key)
            }
        })
        // So do compactions.
        .flat_map({
            let mut packs = StdRng::seed_from_u64(seed ^ 0x7061_636b);
            move |op| {
                let pack = packs.gen_bool(0.12).then(|| Op::Pack {
                    layer: packs.gen(),
                    zstd: packs.gen_bool(0.3),
                });
                std::iter::once(op).chain(pack)
            }
        })
        // And re-encryptions.
        .flat_map({
            let mut rekeys = StdRng::seed_from_u64(seed ^ 0x0072_656b_6579);
            move |op| {
                let rekey = rekeys.gen_bool(0.06).then(|| Op::Rekey {
                    vol: rekeys.gen(),
                    seed: rekeys.gen(),
                });
                std::iter::once(op).chain(rekey)
            }
        })
        // And deep flattens.
        .flat_map({
            let mut deep = StdRng::seed_from_u64(seed ^ 0x6465_6570);
            move |op| {
                let flatten = deep
                    .gen_bool(0.08)
                    .then(|| Op::FlattenSource { vol: deep.gen() });
                std::iter::once(op).chain(flatten)
            }
        })
        .collect()
}

/// The wrapped key a `SetKey` of `seed` sets: 72 bytes (a 64-byte key
/// wrapped by AES-KW), distinct per seed.
fn wrapped_key(seed: u64) -> WrappedKey {
    let mut rng = StdRng::seed_from_u64(seed);
    WrappedKey {
        suite: 1,
        master_key_id: rng.gen(),
        blob: (0..72).map(|_| rng.gen()).collect(),
    }
}

/// Blocks a layer of `size` bytes can hold: whole extents.
fn layer_blocks(size: u64) -> u64 {
    size.div_ceil(EXTENT) * EXTENT / BLOCK
}

/// A layer operation the store refused (a volume with snapshots, a
/// snapshot with clones, shrinking over a snapshot): no change, no cut.
fn refused<T>(r: &Result<T, StoreError>) -> bool {
    matches!(r, Err(StoreError::Layers(_)))
}

fn hash(b: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    b.hash(&mut h);
    h.finish()
}

/// What one volume must hold.
struct ModelVolume {
    id: uuid::Uuid,
    /// Distinguishes this volume's data from every other volume's.
    tag: u8,
    current: Vec<u8>,
    /// Content as of the last point it was known durable.
    stable: Vec<u8>,
    /// Sectors written since: every content they held (any may survive).
    since: HashMap<usize, Vec<u64>>,
    /// Its data is encrypted (a torn unflushed block reads as anything).
    encrypted: bool,
}

impl ModelVolume {
    fn new(id: uuid::Uuid, tag: u8, size: u64) -> ModelVolume {
        let zeros = vec![0u8; size as usize];
        ModelVolume {
            id,
            tag,
            current: zeros.clone(),
            stable: zeros,
            since: HashMap::new(),
            encrypted: false,
        }
    }
    fn write(&mut self, at: usize, data: &[u8]) {
        self.current[at..at + data.len()].copy_from_slice(data);
        for s in at / SECTOR..(at + data.len()).div_ceil(SECTOR) {
            let sector = &self.current[s * SECTOR..(s + 1) * SECTOR];
            self.since.entry(s).or_default().push(hash(sector));
        }
    }
    fn with_content(id: uuid::Uuid, tag: u8, content: Vec<u8>) -> ModelVolume {
        ModelVolume {
            id,
            tag,
            current: content.clone(),
            stable: content,
            since: HashMap::new(),
            encrypted: false,
        }
    }
    /// The volume now holds `content` (a rollback), durably.
    fn reset(&mut self, content: Vec<u8>) {
        self.current.clone_from(&content);
        self.stable = content;
        self.since.clear();
    }
    fn make_durable(&mut self, at: usize, len: usize) {
        for s in at / SECTOR..(at + len).div_ceil(SECTOR) {
            let r = s * SECTOR..(s + 1) * SECTOR;
            self.stable[r.clone()].copy_from_slice(&self.current[r]);
            self.since.remove(&s);
        }
    }
    fn everything_durable(&mut self) {
        self.stable.clone_from(&self.current);
        self.since.clear();
    }
}

/// A snapshot: what its volume held when it was taken, forever.
struct ModelSnapshot {
    id: uuid::Uuid,
    volume: uuid::Uuid,
    content: Vec<u8>,
}

/// A store call that was in flight when the power was cut, and may or may
/// not have taken effect.
enum InFlight {
    None,
    /// A create, or a clone of a snapshot (whose content it starts with);
    /// `key`: an encrypted one's.
    Create {
        id: uuid::Uuid,
        tag: u8,
        content: Vec<u8>,
        key: Option<WrappedKey>,
    },
    Delete {
        index: usize,
    },
    Resize {
        index: usize,
        old: u64,
        new: u64,
    },
    Snapshot {
        index: usize,
        id: uuid::Uuid,
    },
    DeleteSnapshot {
        snap: usize,
    },
    Rollback {
        index: usize,
        snap: usize,
    },
    SetKey {
        id: uuid::Uuid,
        key: WrappedKey,
    },
    /// A re-encryption's switch (`Store::rekey_volume`).
    Rekey {
        index: usize,
        snap: uuid::Uuid,
        /// Its snapshots without a pin yet: pinned to `old` if it got that far.
        unpinned: Vec<uuid::Uuid>,
        old: Option<WrappedKey>,
        new: Option<(WrappedKey, Arc<BlockCipher>)>,
    },
}

/// The power was cut during the call.
struct Cut;

struct Harness {
    dev: Arc<SimDevice>,
    store: Arc<Store>,
    model: Vec<ModelVolume>,
    snapshots: Vec<ModelSnapshot>,
    capacity_blocks: u64,
    next_tag: u8,
    in_flight: InFlight,
    crashes: u32,
    shape: Shape,
    /// Each volume's key as last set.
    keys: HashMap<uuid::Uuid, WrappedKey>,
    /// The keys of volumes deleted: never again on the device once the
    /// store reopened.
    shredded: Vec<Vec<u8>>,
    /// Encrypted volumes' ciphers (from before their create or clone was
    /// called), to unlock them after each reopen; and pinned snapshots'.
    ciphers: HashMap<uuid::Uuid, Arc<BlockCipher>>,
    /// Snapshots a re-encryption pinned to their key (`None`: plain).
    pinned: HashMap<uuid::Uuid, Option<WrappedKey>>,
}

/// The data key of an encrypted volume created with `tag`.
fn data_key(tag: u8) -> DataKey {
    let mut rng = StdRng::seed_from_u64(0xd47a_0000 + u64::from(tag));
    let bytes: Vec<u8> = (0..64).map(|_| rng.gen()).collect();
    DataKey::from_bytes(&bytes).expect("64 bytes")
}

fn open_options() -> OpenOptions {
    OpenOptions {
        background_zeroing: false,
        ..Default::default()
    }
}

impl Harness {
    fn new(seed: u64, shape: Shape) -> Harness {
        let dev = SimDevice::new(shape.device, seed);
        let store = Store::create_with(
            dev.clone(),
            &FormatOptions {
                extent_size: Some(EXTENT as u32),
                journal_blocks: Some(shape.journal_blocks),
                ..Default::default()
            },
            &open_options(),
        )
        .expect("format");
        let capacity_blocks = store.usage().capacity_bytes / BLOCK;
        Harness {
            dev,
            store,
            model: Vec::new(),
            snapshots: Vec::new(),
            capacity_blocks,
            next_tag: 1,
            in_flight: InFlight::None,
            crashes: 0,
            shape,
            keys: HashMap::new(),
            shredded: Vec::new(),
            ciphers: HashMap::new(),
            pinned: HashMap::new(),
        }
    }

    /// Blocks every layer (volume or snapshot) could hold, in whole extents.
    fn provisioned_blocks(&self) -> u64 {
        self.model
            .iter()
            .map(|v| v.current.len())
            .chain(self.snapshots.iter().map(|s| s.content.len()))
            .map(|len| layer_blocks(len as u64))
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

    /// Turns a failed call into `Cut` if the power is cut; any other
    /// failure is a bug.
    fn cut<T, E: std::fmt::Debug>(&self, r: Result<T, E>, what: &str) -> Result<T, Cut> {
        match r {
            Ok(v) => Ok(v),
            Err(_) if self.dev.power_is_cut() => Err(Cut),
            Err(e) => panic!("{what} failed with the device healthy: {e:?}"),
        }
    }

    fn check_current(&self, i: usize) -> Result<(), Cut> {
        if !self.shape.check_every_call {
            return Ok(());
        }
        let v = &self.model[i];
        let h = self.store.volume(v.id).expect("volume exists");
        assert_eq!(h.size(), v.current.len() as u64, "size");
        let mut buf = vec![0u8; v.current.len()];
        self.cut(h.read(0, &mut buf), "read")?;
        if let Some(first) = buf.iter().zip(&v.current).position(|(a, b)| a != b) {
            panic!(
                "volume {i}: content differs from the model at byte {first}: {} where {} was written",
                buf[first], v.current[first]
            );
        }
        Ok(())
    }

    fn run(&mut self, op: &Op) -> Result<(), Cut> {
        match *op {
            Op::Create { blocks } => {
                if self.provisioned_blocks() + layer_blocks(blocks * BLOCK) > self.capacity_blocks
                    || self.model.len() >= 6
                {
                    return Ok(());
                }
                let id = uuid::Uuid::new_v4();
                let tag = self.next_tag;
                self.next_tag = self.next_tag.wrapping_add(1).max(1);
                // Every other volume is encrypted.
                let key = tag.is_multiple_of(2).then(|| wrapped_key(u64::from(tag)));
                self.in_flight = InFlight::Create {
                    id,
                    tag,
                    content: vec![0; (blocks * BLOCK) as usize],
                    key: key.clone(),
                };
                let r = match &key {
                    Some(key) => {
                        let cipher = Arc::new(data_key(tag).cipher());
                        self.ciphers.insert(id, cipher.clone());
                        self.store
                            .create_encrypted_volume(id, blocks * BLOCK, key, cipher)
                    }
                    None => self.store.create_volume(id, blocks * BLOCK),
                };
                self.cut(r, "create")?;
                self.in_flight = InFlight::None;
                self.all_durable();
                let mut v = ModelVolume::new(id, tag, blocks * BLOCK);
                if let Some(key) = key {
                    v.encrypted = true;
                    self.keys.insert(id, key);
                }
                self.model.push(v);
            }
            Op::Delete { vol } => {
                let Some(i) = self.pick(vol) else {
                    return Ok(());
                };
                let h = self.store.volume(self.model[i].id).expect("volume");
                self.in_flight = InFlight::Delete { index: i };
                let r = self.store.delete_volume(self.model[i].id);
                let has_snapshots = self.snapshots.iter().any(|s| s.volume == self.model[i].id);
                if has_snapshots {
                    assert!(refused(&r), "deleting a volume with snapshots: {r:?}");
                    self.in_flight = InFlight::None;
                    return Ok(());
                }
                self.cut(r, "delete")?;
                self.in_flight = InFlight::None;
                assert!(matches!(h.read(0, &mut [0u8; 4096]), Err(IoError::Gone)));
                if let Some(k) = self.keys.remove(&self.model[i].id) {
                    self.shredded.push(k.blob);
                }
                self.model.remove(i);
                if self.shape.check_every_call {
                    self.check_keys()?;
                }
                self.all_durable();
            }
            Op::Resize { vol, blocks } => {
                let Some(i) = self.pick(vol) else {
                    return Ok(());
                };
                let old = self.model[i].current.len() as u64;
                let new = blocks * BLOCK;
                if self.provisioned_blocks() - layer_blocks(old) + layer_blocks(new)
                    > self.capacity_blocks
                {
                    return Ok(());
                }
                self.in_flight = InFlight::Resize { index: i, old, new };
                let r = self.store.resize_volume(self.model[i].id, new);
                if refused(&r) {
                    // Shrinking a volume that reads through a snapshot.
                    assert!(new < old, "{r:?}");
                    self.in_flight = InFlight::None;
                    return Ok(());
                }
                self.cut(r, "resize")?;
                self.in_flight = InFlight::None;
                self.all_durable();
                let v = &mut self.model[i];
                v.current.resize(new as usize, 0);
                v.stable.resize(new as usize, 0);
                v.since.retain(|s, _| (*s as u64) < new / SECTOR as u64);
                self.check_current(i)?;
            }
            Op::Write {
                vol,
                at,
                len,
                aligned,
                seed,
                fua,
            } => {
                let Some(i) = self.pick(vol) else {
                    return Ok(());
                };
                let size = self.model[i].current.len() as u64;
                let (mut at, mut len) = (at % size, len.min(size));
                if aligned {
                    at = at / BLOCK * BLOCK;
                    len = len.div_ceil(BLOCK) * BLOCK;
                }
                let len = len.min(size - at);
                let tag = self.model[i].tag;
                let data: Vec<u8> = (0..len)
                    .map(|k| {
                        (tag.wrapping_mul(37))
                            .wrapping_add(seed)
                            .wrapping_add((k * 7 + k / 511) as u8)
                            | 1
                    })
                    .collect();
                self.model[i].write(at as usize, &data);
                let h = self.store.volume(self.model[i].id).expect("volume");
                self.cut(h.write(at, &data, fua), "write")?;
                if fua {
                    self.model[i].make_durable(at as usize, len as usize);
                }
                assert!(matches!(
                    h.write(size - 1, &[1, 2], false),
                    Err(IoError::OutOfRange { .. })
                ));
                self.check_current(i)?;
            }
            Op::Zeroes {
                vol,
                at,
                len,
                may_unmap,
                fua,
            } => {
                let Some(i) = self.pick(vol) else {
                    return Ok(());
                };
                let size = self.model[i].current.len() as u64;
                let at = at % size;
                let len = len.min(size - at);
                self.model[i].write(at as usize, &vec![0u8; len as usize]);
                let h = self.store.volume(self.model[i].id).expect("volume");
                self.cut(h.write_zeroes(at, len, may_unmap, fua), "write zeroes")?;
                if fua {
                    self.all_durable();
                }
                self.check_current(i)?;
            }
            Op::Flush => {
                self.cut(self.store.flush(), "flush")?;
                self.all_durable();
            }
            Op::Pack { layer, zstd } => {
                let layers: Vec<(uuid::Uuid, usize)> = self
                    .model
                    .iter()
                    .map(|v| (v.id, v.current.len()))
                    .chain(self.snapshots.iter().map(|s| (s.id, s.content.len())))
                    .collect();
                if layers.is_empty() {
                    return Ok(());
                }
                let (id, size) = layers[layer % layers.len()];
                let codec = if zstd { Codec::Zstd(1) } else { Codec::Lz4 };
                for logical in 0..(size as u64).div_ceil(EXTENT) {
                    let r = self.store.pack_extent(id, logical as u32, codec);
                    if let PackOutcome::Packed { .. } = self.cut(r, "pack")? {
                        PACKED.fetch_add(1, Ordering::Relaxed);
                    }
                }
                // An extent packed commits, one skipped does not: flush.
                self.cut(self.store.flush(), "flush")?;
                self.all_durable();
            }
            Op::ZeroFreed => {
                self.cut(self.store.zero_freed(), "zeroing")?;
            }
            Op::Cool => {
                self.cut(self.store.cool(true), "cooling")?;
                assert_eq!(self.store.integrity().hot_extents, 0);
            }
            Op::Snapshot { vol } => {
                let Some(i) = self.pick(vol) else {
                    return Ok(());
                };
                let size = self.model[i].current.len() as u64;
                if self.snapshots.len() >= 4
                    || self.provisioned_blocks() + layer_blocks(size) > self.capacity_blocks
                {
                    return Ok(());
                }
                let id = uuid::Uuid::new_v4();
                self.in_flight = InFlight::Snapshot { index: i, id };
                let r = self.store.snapshot(self.model[i].id, id);
                self.cut(r, "snapshot")?;
                self.in_flight = InFlight::None;
                self.all_durable();
                self.snapshots.push(ModelSnapshot {
                    id,
                    volume: self.model[i].id,
                    content: self.model[i].current.clone(),
                });
                self.check_snapshots()?;
            }
            Op::Clone { snap } => {
                if self.snapshots.is_empty() || self.model.len() >= 6 {
                    return Ok(());
                }
                let s = &self.snapshots[snap % self.snapshots.len()];
                let size = s.content.len() as u64;
                if self.provisioned_blocks() + layer_blocks(size) > self.capacity_blocks {
                    return Ok(());
                }
                let (snap_id, content) = (s.id, s.content.clone());
                // An encrypted snapshot's clone has its key.
                let key = self.snapshot_key(s);
                let cipher = match self.pinned.contains_key(&s.id) {
                    true => self.ciphers.get(&s.id).cloned(),
                    false => self.ciphers.get(&s.volume).cloned(),
                };
                let id = uuid::Uuid::new_v4();
                let tag = self.next_tag;
                self.next_tag = self.next_tag.wrapping_add(1).max(1);
                self.in_flight = InFlight::Create {
                    id,
                    tag,
                    content: content.clone(),
                    key: key.clone(),
                };
                if let (Some(_), Some(c)) = (&key, cipher) {
                    self.ciphers.insert(id, c);
                }
                let r = self.store.clone_snapshot(snap_id, id, None);
                self.cut(r, "clone")?;
                self.in_flight = InFlight::None;
                self.all_durable();
                let mut v = ModelVolume::with_content(id, tag, content);
                if let Some(key) = key {
                    v.encrypted = true;
                    self.keys.insert(id, key);
                }
                self.model.push(v);
                self.check_current(self.model.len() - 1)?;
            }
            Op::DeleteSnapshot { snap } => {
                if self.snapshots.is_empty() {
                    return Ok(());
                }
                let k = snap % self.snapshots.len();
                self.in_flight = InFlight::DeleteSnapshot { snap: k };
                let r = self.store.delete_snapshot(self.snapshots[k].id);
                if refused(&r) {
                    self.in_flight = InFlight::None;
                    return Ok(());
                }
                self.cut(r, "delete snapshot")?;
                self.in_flight = InFlight::None;
                self.all_durable();
                self.snapshots.remove(k);
                for i in 0..self.model.len() {
                    self.check_current(i)?;
                }
                self.check_snapshots()?;
            }
            Op::Rollback { snap } => {
                if self.snapshots.is_empty() {
                    return Ok(());
                }
                let k = snap % self.snapshots.len();
                let s = &self.snapshots[k];
                let i = self
                    .model
                    .iter()
                    .position(|v| v.id == s.volume)
                    .expect("a volume with snapshots is never deleted");
                self.in_flight = InFlight::Rollback { index: i, snap: k };
                let r = self.store.rollback(s.volume, s.id);
                self.cut(r, "rollback")?;
                self.in_flight = InFlight::None;
                self.all_durable();
                let content = self.snapshots[k].content.clone();
                self.model[i].reset(content);
                self.check_current(i)?;
            }
            Op::Flatten { vol } => {
                let Some(i) = self.pick(vol) else {
                    return Ok(());
                };
                let (id, size) = (self.model[i].id, self.model[i].current.len() as u64);
                let r = self.store.flatten(id, 0..size, None, &mut |_, _| {});
                let report = self.cut(r, "flatten")?;
                assert!(report.detached, "a whole-volume flatten detaches");
                // Its commit made everything durable; nothing it reads changed.
                self.all_durable();
                assert!(self
                    .store
                    .volumes()
                    .iter()
                    .any(|v| v.id == id && v.parent.is_none()));
                self.check_current(i)?;
                self.check_snapshots()?;
            }
            Op::FlattenSource { vol } => {
                // A clone with snapshots of its own if there is one (the
                // case that copies into a snapshot), else any volume.
                let deep: Vec<usize> = (0..self.model.len())
                    .filter(|&i| {
                        let id = self.model[i].id;
                        self.snapshots.iter().any(|s| s.volume == id)
                            && matches!(self.store.clone_source(id), Ok(Some(_)))
                    })
                    .collect();
                let Some(i) = (match deep.is_empty() {
                    true => self.pick(vol),
                    false => Some(deep[vol % deep.len()]),
                }) else {
                    return Ok(());
                };
                let (id, size) = (self.model[i].id, self.model[i].current.len() as u64);
                let own_snapshots = self.snapshots.iter().any(|s| s.volume == id);
                let source = self.store.clone_source(id).expect("a volume");
                let r = self.store.flatten_source(id, 0..size, None, &mut |_, _| {});
                let report = self.cut(r, "flatten source")?;
                assert!(report.detached, "a whole-volume flatten detaches");
                self.all_durable();
                assert_eq!(self.store.clone_source(id).expect("a volume"), None);
                if source.is_some() && own_snapshots {
                    DEEP_FLATTENED.fetch_add(1, Ordering::Relaxed);
                }
                self.check_current(i)?;
                self.check_snapshots()?;
            }
            Op::SetKey { vol, seed } => {
                let Some(i) = self.pick(vol) else {
                    return Ok(());
                };
                // A key is replaced (as a master key rotation does); a
                // plain volume has none.
                if !self.model[i].encrypted {
                    return Ok(());
                }
                let (id, key) = (self.model[i].id, wrapped_key(seed));
                self.in_flight = InFlight::SetKey {
                    id,
                    key: key.clone(),
                };
                let r = self.store.set_volume_key(id, &key);
                self.cut(r, "set key")?;
                self.in_flight = InFlight::None;
                self.keys.insert(id, key.clone());
                assert_eq!(self.store.volume_key(id).expect("key"), Some(key));
            }
            Op::Rekey { vol, seed } => {
                let Some(i) = self.pick(vol) else {
                    return Ok(());
                };
                let (id, size) = (self.model[i].id, self.model[i].current.len() as u64);
                if self.snapshots.len() >= 4
                    || self.provisioned_blocks() + layer_blocks(size) > self.capacity_blocks
                {
                    return Ok(());
                }
                let old = self.keys.get(&id).cloned();
                let new = (!self.model[i].encrypted).then(|| {
                    let tag = self.next_tag;
                    self.next_tag = self.next_tag.wrapping_add(1).max(1);
                    (wrapped_key(seed), Arc::new(data_key(tag).cipher()))
                });
                let snap = uuid::Uuid::new_v4();
                let unpinned: Vec<uuid::Uuid> = self
                    .snapshots
                    .iter()
                    .filter(|s| s.volume == id && !self.pinned.contains_key(&s.id))
                    .map(|s| s.id)
                    .collect();
                // Pinned snapshots unlock with the volume's old cipher.
                if let Some(c) = self.ciphers.get(&id).cloned() {
                    for s in unpinned.iter().chain([&snap]) {
                        self.ciphers.insert(*s, c.clone());
                    }
                }
                self.in_flight = InFlight::Rekey {
                    index: i,
                    snap,
                    unpinned: unpinned.clone(),
                    old: old.clone(),
                    new: new.clone(),
                };
                let next = new.as_ref().map(|(k, c)| (k, c.clone()));
                let r = self.store.rekey_volume(id, snap, next);
                self.cut(r, "rekey")?;
                REKEYED.fetch_add(1, Ordering::Relaxed);
                self.in_flight = InFlight::None;
                self.all_durable();
                for s in unpinned.iter().chain([&snap]) {
                    self.pinned.insert(*s, old.clone());
                }
                self.switch_key(i, new);
                self.snapshots.push(ModelSnapshot {
                    id: snap,
                    volume: id,
                    content: self.model[i].current.clone(),
                });
                self.check_current(i)?;
                self.check_snapshots()?;
                let r = self.store.flatten(id, 0..size, None, &mut |_, _| {});
                assert!(self.cut(r, "flatten")?.detached);
                self.all_durable();
                self.check_current(i)?;
                let k = self.snapshots.len() - 1;
                self.in_flight = InFlight::DeleteSnapshot { snap: k };
                let r = self.store.delete_snapshot(snap);
                self.cut(r, "delete the re-encryption's snapshot")?;
                self.in_flight = InFlight::None;
                self.snapshots.remove(k);
                self.check_current(i)?;
                self.check_snapshots()?;
                self.check_keys()?;
            }
            Op::CleanRestart => {
                self.cut(self.store.close(), "close")?;
                self.all_durable();
                let r = Store::open_with(self.dev.clone(), &open_options());
                self.store = self.cut(r, "open after a clean close")?;
                self.unlock();
                assert!(!self.store.recovery().unclean);
                assert_eq!(
                    self.store.recovery().dirty_extents,
                    0,
                    "a clean close leaves nothing to zero"
                );
                assert_eq!(
                    (
                        self.store.recovery().hot_extents,
                        self.store.recovery().recomputed_extents
                    ),
                    (0, 0),
                    "a clean close leaves every checksum durable"
                );
                for i in 0..self.model.len() {
                    self.check_current(i)?;
                }
                self.check_snapshots()?;
            }
        }
        Ok(())
    }

    /// The key snapshot `s` reads with: its pinned one, else its volume's.
    fn snapshot_key(&self, s: &ModelSnapshot) -> Option<WrappedKey> {
        match self.pinned.get(&s.id) {
            Some(pinned) => pinned.clone(),
            None => self.keys.get(&s.volume).cloned(),
        }
    }

    /// Volume `i` is under `new` from now on (`None`: plain).
    fn switch_key(&mut self, i: usize, new: Option<(WrappedKey, Arc<BlockCipher>)>) {
        let id = self.model[i].id;
        self.model[i].encrypted = new.is_some();
        match new {
            Some((key, cipher)) => {
                self.keys.insert(id, key);
                self.ciphers.insert(id, cipher);
            }
            None => {
                // Its old key stays live while a pinned snapshot holds it.
                if let Some(old) = self.keys.remove(&id) {
                    self.shredded.push(old.blob);
                }
                self.ciphers.remove(&id);
            }
        }
    }

    /// Every snapshot reads exactly what it was taken with.
    fn check_snapshots(&self) -> Result<(), Cut> {
        if !self.shape.check_every_call {
            return Ok(());
        }
        for s in &self.snapshots {
            let h = self.store.volume(s.id).expect("snapshot exists");
            let mut buf = vec![0u8; s.content.len()];
            self.cut(h.read(0, &mut buf), "read snapshot")?;
            assert!(buf == s.content, "snapshot {} changed", s.id);
        }
        Ok(())
    }

    /// Power loss: the disk keeps an arbitrary part of what was not
    /// flushed; the store must reopen and hold what it acknowledged.
    fn crash_and_recover(&mut self) {
        self.crashes += 1;
        if std::env::var_os("BASALT_POWER_TRACE").is_some() {
            eprintln!("crash {}", self.crashes);
        }
        self.dev.crash();
        let store = Store::open_with(self.dev.clone(), &open_options())
            .unwrap_or_else(|e| panic!("open after crash {}: {e}", self.crashes));
        self.store = store;
        self.settle_rekey();
        self.unlock();
        self.store
            .finish_snapshot_deletions()
            .unwrap_or_else(|e| panic!("finishing deletions after crash {}: {e}", self.crashes));
        let report = self.store.recovery().clone();
        assert_eq!(
            report.stray_extents, 0,
            "stray extents after crash: {report:?}"
        );
        assert_eq!(
            report.quarantined_extents + report.quarantined_slots,
            0,
            "{report:?}"
        );

        let in_flight = std::mem::replace(&mut self.in_flight, InFlight::None);
        let mut present: HashMap<uuid::Uuid, u64> = self
            .store
            .volumes()
            .into_iter()
            .map(|u| (u.id, u.size))
            .collect();
        match &in_flight {
            InFlight::Create {
                id,
                tag,
                content,
                key,
            } => {
                if let Some(got) = present.get(id) {
                    assert_eq!(
                        *got,
                        content.len() as u64,
                        "size of a volume created during the crash"
                    );
                    let mut v = ModelVolume::with_content(*id, *tag, content.clone());
                    if let Some(key) = key {
                        v.encrypted = true;
                        self.keys.insert(*id, key.clone());
                    }
                    self.model.push(v);
                }
            }
            InFlight::Delete { index } if !present.contains_key(&self.model[*index].id) => {
                if let Some(k) = self.keys.remove(&self.model[*index].id) {
                    self.shredded.push(k.blob);
                }
                self.model.remove(*index);
            }
            InFlight::SetKey { id, key } => {
                let got = self.store.volume_key(*id).expect("key after crash");
                assert!(
                    got.as_ref() == Some(key) || got.as_ref() == self.keys.get(id),
                    "volume {id}'s key after crash {} is neither the one being set nor the one before",
                    self.crashes
                );
                if got.as_ref() == Some(key) {
                    self.keys.insert(*id, key.clone());
                }
            }
            InFlight::Rollback { index, snap } => {
                // Done (the snapshot's content, exactly) or not at all.
                let v = &mut self.model[*index];
                let content = &self.snapshots[*snap].content;
                if present[&v.id] == content.len() as u64 {
                    let h = self.store.volume(v.id).expect("volume");
                    let mut buf = vec![0u8; content.len()];
                    h.read(0, &mut buf).expect("read after crash");
                    if buf == *content {
                        v.reset(buf);
                    }
                }
            }
            InFlight::DeleteSnapshot { snap }
                if self.store.volume(self.snapshots[*snap].id).is_err() =>
            {
                self.snapshots.remove(*snap);
            }
            _ => {}
        }
        let mut resized = None;
        if let InFlight::Resize { index, old, new } = in_flight {
            let got = present[&self.model[index].id];
            assert!(
                got == old || got == new,
                "size {got} after a crash during a resize {old} -> {new}"
            );
            let v = &mut self.model[index];
            if got == new {
                v.current.resize(new as usize, 0);
                v.stable.resize(new as usize, 0);
                v.since.retain(|s, _| (*s as u64) < new / SECTOR as u64);
            } else if new < old {
                // The shrink zeroed the tail of its last kept extent first.
                let tail_end = (new.div_ceil(EXTENT) * EXTENT).min(old);
                resized = Some((index, new as usize..tail_end as usize));
            }
        }
        for v in &self.model {
            let got = present
                .remove(&v.id)
                .unwrap_or_else(|| panic!("volume {} lost in the crash", v.id));
            assert_eq!(got, v.current.len() as u64, "size after crash");
        }
        assert!(
            present.is_empty(),
            "volumes that were never created: {present:?}"
        );

        for (i, v) in self.model.iter_mut().enumerate() {
            let h = self.store.volume(v.id).expect("volume");
            let mut buf = vec![0u8; v.current.len()];
            h.read(0, &mut buf).expect("read after crash");
            for s in 0..buf.len() / SECTOR {
                let got = &buf[s * SECTOR..(s + 1) * SECTOR];
                let stable = &v.stable[s * SECTOR..(s + 1) * SECTOR];
                // A shrink cut short zeroes the tail it was dropping: each
                // sector zero or not, so an encrypted block there may be
                // torn (the data is being dropped; it reads as anything).
                let zeroed_tail = resized.as_ref().is_some_and(|(index, r)| {
                    *index == i
                        && r.contains(&(s * SECTOR))
                        && (v.encrypted || got.iter().all(|&b| b == 0))
                });
                // A torn unflushed block of ciphertext reads as anything.
                let block = s / (BLOCK as usize / SECTOR) * (BLOCK as usize / SECTOR);
                let torn_ciphertext = v.encrypted
                    && (block..block + BLOCK as usize / SECTOR).any(|b| v.since.contains_key(&b));
                let ok = got == stable
                    || zeroed_tail
                    || torn_ciphertext
                    || v.since.get(&s).is_some_and(|c| c.contains(&hash(got)));
                assert!(
                    ok,
                    "volume {i} sector {s}: content after crash {} was never written there (encrypted: {}, read {:02x?}, stable {:02x?})",
                    self.crashes,
                    v.encrypted,
                    &got[..8],
                    &stable[..8]
                );
            }
            v.current.clone_from(&buf);
            v.everything_durable();
        }
        if let InFlight::Snapshot { index, id } = in_flight {
            // Taken or not; if taken, of what the volume holds now.
            if let Ok(h) = self.store.volume(id) {
                let v = &self.model[index];
                let mut buf = vec![0u8; v.current.len()];
                h.read(0, &mut buf).expect("read snapshot after crash");
                assert!(
                    buf == v.current,
                    "a snapshot taken during crash {} differs from its volume",
                    self.crashes
                );
                self.snapshots.push(ModelSnapshot {
                    id,
                    volume: v.id,
                    content: buf,
                });
            }
        }
        let mut listed: Vec<uuid::Uuid> = self.store.snapshots().iter().map(|s| s.id).collect();
        let mut expected: Vec<uuid::Uuid> = self.snapshots.iter().map(|s| s.id).collect();
        listed.sort();
        expected.sort();
        assert_eq!(listed, expected, "snapshots after crash {}", self.crashes);
        for s in &self.snapshots {
            let h = self.store.volume(s.id).expect("snapshot");
            let mut buf = vec![0u8; s.content.len()];
            h.read(0, &mut buf).expect("read snapshot after crash");
            if let Some(at) = buf.iter().zip(&s.content).position(|(a, b)| a != b) {
                panic!(
                    "snapshot {} changed in crash {}: byte {at} is {} where it held {}",
                    s.id, self.crashes, buf[at], s.content[at]
                );
            }
        }
        if self.check_keys().is_err() {
            panic!("the device failed after crash {}", self.crashes);
        }
        self.store
            .check()
            .unwrap_or_else(|e| panic!("after crash {}: {e}", self.crashes));
    }

    /// After a crash during a re-encryption's switch: the pins it wrote,
    /// the snapshot it took, and whether the volume's key changed (all or
    /// nothing, each, in that order).
    fn settle_rekey(&mut self) {
        if !matches!(self.in_flight, InFlight::Rekey { .. }) {
            return;
        }
        let InFlight::Rekey {
            index,
            snap,
            unpinned,
            old,
            new,
        } = std::mem::replace(&mut self.in_flight, InFlight::None)
        else {
            return;
        };
        let id = self.model[index].id;
        for s in &unpinned {
            if self.store.has_own_key_entry(*s) {
                self.pinned.insert(*s, old.clone());
            }
        }
        let taken = self.store.snapshots().iter().any(|s| s.id == snap);
        let key = self.store.volume_key(id).expect("key after crash");
        let switched = key.as_ref() == new.as_ref().map(|(k, _)| k);
        assert!(
            switched || key == old,
            "volume {id}'s key after crash {} is neither its old one nor the new one",
            self.crashes
        );
        assert!(taken || !switched, "the key switched without the snapshot");
        if taken {
            self.pinned.insert(snap, old.clone());
            // Checked against the volume once its content is.
            self.in_flight = InFlight::Snapshot { index, id: snap };
        }
        if switched {
            self.switch_key(index, new);
        }
    }

    /// After a reopen: every encrypted volume gets its cipher (one the
    /// harness does not know was never created).
    fn unlock(&self) {
        for (id, locked) in self.store.keyed_volumes() {
            let cipher = self
                .ciphers
                .get(&id)
                .unwrap_or_else(|| panic!("volume {id} has a key it was never given"));
            if locked {
                self.store
                    .unlock_volume(id, cipher.clone())
                    .expect("unlock");
            }
        }
    }

    /// Every volume's key is the model's, a snapshot's its volume's, and no
    /// deleted volume's wrapped key is in the key slot region.
    fn check_keys(&self) -> Result<(), Cut> {
        for v in &self.model {
            let got = self.store.volume_key(v.id).expect("key");
            assert_eq!(got.as_ref(), self.keys.get(&v.id), "key of volume {}", v.id);
        }
        for s in &self.snapshots {
            let got = self.store.volume_key(s.id).expect("key");
            assert_eq!(got, self.snapshot_key(s), "key of snapshot {}", s.id);
        }
        let mut newest: Option<Superblock> = None;
        for at in [0u64, 4096] {
            let mut page = vec![0u8; 4096];
            self.cut(self.dev.read_at(&mut page, at), "read a superblock")?;
            if let Ok(sb) = Superblock::decode(&page) {
                if newest.as_ref().is_none_or(|n| sb.generation > n.generation) {
                    newest = Some(sb);
                }
            }
        }
        let l = newest.expect("a superblock").layout;
        let mut region = vec![0u8; l.key_len() as usize];
        self.cut(
            self.dev.read_at(&mut region, l.key_offset),
            "read key slots",
        )?;
        // A clone's key is its source's: the same blob stays on the device
        // while any volume still holds it.
        let live = |blob: &Vec<u8>| {
            self.keys.values().any(|k| &k.blob == blob)
                || self
                    .snapshots
                    .iter()
                    .filter_map(|s| self.pinned.get(&s.id).cloned().flatten())
                    .any(|k| &k.blob == blob)
        };
        for blob in self.shredded.iter().filter(|b| !live(b)) {
            assert!(
                !region.windows(blob.len()).any(|w| w == &blob[..]),
                "a deleted volume's wrapped key is still on the device after crash {}",
                self.crashes
            );
        }
        Ok(())
    }
}

/// Runs `ops`, cutting the power after device op `cut` (counted from the
/// end of the format) and once more at a seeded point after recovering;
/// returns the device ops the history took (without cuts).
fn run_history(seed: u64, shape: Shape, ops: &[Op], cut: Option<u64>) -> u64 {
    let mut h = Harness::new(seed, shape);
    let mut rng = StdRng::seed_from_u64(seed ^ cut.unwrap_or(u64::MAX));
    let start = h.dev.op_count();
    if let Some(k) = cut {
        h.dev.cut_power_after(k);
    }
    let mut cuts_left = u32::from(cut.is_some());
    let trace = std::env::var_os("BASALT_POWER_TRACE").is_some();
    for op in ops {
        if trace {
            eprintln!("op {op:?} (device op {})", h.dev.op_count() - start);
            for s in h.store.snapshots() {
                eprintln!(
                    "  snapshot {} of {} parent {:?} children {:?}",
                    s.id, s.volume, s.parent, s.children
                );
            }
        }
        if h.run(op).is_err() {
            h.crash_and_recover();
            if cuts_left > 0 {
                cuts_left -= 1;
                h.dev.cut_power_after(rng.gen_range(0..40));
            }
        } else if h.dev.power_is_cut() {
            // Struck after the call's last device op: nothing was in flight.
            h.in_flight = InFlight::None;
            h.crash_and_recover();
        }
    }
    let total = h.dev.op_count() - start;
    // The end: zero what was freed, check, and lose power once more.
    let end = h.store.zero_freed().and_then(|_| h.store.check());
    if let Err(e) = end {
        assert!(h.dev.power_is_cut(), "at the end: {e}");
    }
    h.crash_and_recover();
    total
}

/// Small-history seeds a wider sweep found bugs at, run with the default
/// range: each catches its bug when it is reintroduced (docs/format.md,
/// "Testing").
const REGRESSION_SEEDS: &[u64] = &[79];

/// The seeds to run: `BASALT_POWER_SEEDS=a..b`, or `default` plus
/// `regression`.
fn seeds(default: &str, regression: &[u64]) -> Vec<u64> {
    let (spec, extra) = match std::env::var("BASALT_POWER_SEEDS") {
        Ok(spec) => (spec, &[][..]),
        Err(_) => (default.to_string(), regression),
    };
    let (a, b) = spec.split_once("..").expect("BASALT_POWER_SEEDS=a..b");
    let range = a.parse().expect("seed")..b.parse().expect("seed");
    range.chain(extra.iter().copied()).collect()
}

#[test]
fn power_cut_at_every_device_operation() {
    sweep_capped(
        SMALL,
        seeds("0..40", REGRESSION_SEEDS),
        250,
        "power_cut_at_every_device_operation",
    );
}

#[test]
fn power_cut_at_every_device_operation_of_multi_block_commits() {
    sweep_capped(
        BULK,
        seeds("1000..1006", &[]),
        100,
        "power_cut_at_every_device_operation_of_multi_block_commits",
    );
}

fn sweep_capped(shape: Shape, seeds: Vec<u64>, default_cuts: u64, test: &str) {
    let max_cuts: u64 = std::env::var("BASALT_POWER_CUTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default_cuts);
    let mut runs = 0u64;
    for seed in seeds {
        let ops = history(seed, shape);
        let total = run_history(seed, shape, &ops, None);
        let step = total.div_ceil(max_cuts).max(1);
        let mut k = seed % step;
        while k <= total {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                run_history(seed, shape, &ops, Some(k))
            }));
            if let Err(e) = r {
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                panic!(
                    "seed {seed}, power cut after device op {k} of {total}: {msg}\n\
                     replay: BASALT_POWER_SEEDS={seed}..{} cargo test --release -p basalt-store --test power_loss {test}",
                    seed + 1
                );
            }
            runs += 1;
            k += step;
        }
    }
    eprintln!(
        "{runs} power cuts tried; {} extents packed, {} volumes re-encrypted, {} clones with snapshots detached from their source",
        PACKED.load(Ordering::Relaxed),
        REKEYED.load(Ordering::Relaxed),
        DEEP_FLATTENED.load(Ordering::Relaxed)
    );
    assert!(
        PACKED.load(Ordering::Relaxed) > 0,
        "no history packed an extent"
    );
    assert!(
        REKEYED.load(Ordering::Relaxed) > 0,
        "no history re-encrypted a volume"
    );
    assert!(
        DEEP_FLATTENED.load(Ordering::Relaxed) > 0,
        "no history detached a clone with snapshots from its source"
    );
}

/// The tear the journal epoch exists for: a commit spanning two journal
/// blocks loses its first block and keeps its second; recovery stops at the
/// first, and the next run's first commit rewrites only that position.
/// After a second crash, replay must stop there too: the second block is a
/// stale leftover whose entries (a TRIM that was never acknowledged) must
/// not free extents holding durable data.
#[test]
fn stale_journal_blocks_past_a_torn_commit_are_never_replayed() {
    let dev = SimDevice::new(16 << 20, 7);
    let format = FormatOptions {
        extent_size: Some(EXTENT as u32),
        journal_blocks: Some(64),
        ..Default::default()
    };
    let layout = basalt_store::format::Layout::plan(
        16 << 20,
        EXTENT as u32,
        Some(64),
        basalt_store::format::DEFAULT_FEATURES,
    )
    .unwrap();
    let store = Store::create_with(dev.clone(), &format, &open_options()).expect("format");
    let a = uuid::Uuid::from_u128(1);
    let extents = 100u64;
    store.create_volume(a, extents * EXTENT).unwrap();
    let va = store.volume(a).unwrap();
    let data: Vec<u8> = (0..EXTENT * extents)
        .map(|i| (i / 4096) as u8 | 1)
        .collect();
    va.write(0, &data, false).unwrap();
    store.flush().unwrap();
    // One commit of 100 Free entries: two journal blocks, 84 + 16.
    va.trim(0, extents * EXTENT, false).unwrap();
    dev.cut_power_after(1); // the journal write lands in the cache; its flush fails
    assert!(store.flush().is_err());
    drop(va);
    drop(store);
    let journal = layout.journal_offset..layout.journal_offset + layout.journal_blocks * BLOCK;
    // The failed commit's journal write: lose its first block only.
    let (first_torn, len) = dev
        .volatile_writes()
        .into_iter()
        .find(|(off, _)| journal.contains(off))
        .expect("the commit wrote the journal");
    assert_eq!(len, 2 * BLOCK, "the commit spans two journal blocks");
    dev.crash_keeping(|off| {
        !journal.contains(&off) || !(first_torn..first_torn + BLOCK).contains(&off)
    });

    let store = Store::open_with(dev.clone(), &open_options()).expect("open after the tear");
    let va = store.volume(a).unwrap();
    let mut back = vec![0u8; data.len()];
    va.read(0, &mut back).unwrap();
    assert!(back == data, "the unacknowledged TRIM was half applied");
    // The next commit rewrites only the torn block's position.
    store
        .create_volume(uuid::Uuid::from_u128(2), EXTENT)
        .unwrap();
    drop(va);
    drop(store);
    dev.crash();
    let store =
        Store::open_with(dev.clone(), &open_options()).expect("open after the second crash");
    let va = store.volume(a).unwrap();
    va.read(0, &mut back).unwrap();
    assert!(back == data, "stale journal entries freed durable data");
    store.check().unwrap();
}
