//! `Store`: formats and opens a store, commits metadata (group commit),
//! checkpoints the tables, and creates, resizes and deletes volumes. Opening
//! (replay, upgrade) lives in `recovery.rs`, allocation and zeroing in
//! `space.rs`, the data path in `volume.rs`.
//!
//! Lock order, always: a volume's map lock, then `durable`, then `meta`.
//!
//! Durability (docs/format.md states the rules and why they suffice):
//! - A metadata change is queued in `Meta::pending` and applied to the
//!   journaled state (`Durable::state`) only when `commit` writes it to the
//!   journal, so a checkpoint never writes tables the journal does not lead
//!   to. `commit` then flushes the device, which also makes every completed
//!   data write durable.
//! - Concurrent commits share one journal write and one flush: a caller
//!   whose request was covered by a flush that started after it asked
//!   returns without I/O (`flush_requests` / `flushes_done`).
//! - A failed commit fails the store: `failed` is checked under the
//!   `durable` lock, so no later commit can report its entries durable.

use crate::alloc::FreeExtents;
use crate::buf::AlignedBuf;
use crate::device::{BlockDevice, IoOp};
use crate::error::StoreError;
use crate::format::{
    ExtentState, JournalEntry, Layout, SlotState, Superblock, DEFAULT_EXTENT_SIZE, FORMAT_VERSION,
    INCOMPAT_DATA_CHECKSUMS, INCOMPAT_LAYERS, PAGE, SUPERBLOCK_COPIES,
};
use crate::integrity::DataChecksums;
use crate::intent::Intent;
use crate::journal::Journal;
use crate::layer_map::VolumeState;
use crate::meta::MetaState;
use crate::presence::Presence;
use crate::recovery;
use crate::scrub::{ScrubCounters, Scrubber};
use crate::space::Zeroer;
use crate::volume::LocalVolume;
use crate::{VolumeId, BLOCK_SIZE};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Choices made once, when a device is formatted.
#[derive(Debug, Clone, Default)]
pub struct FormatOptions {
    /// Allocation unit of thin provisioning; default 1 MiB (see docs/format.md).
    pub extent_size: Option<u32>,
    /// Journal ring size in 4 KiB blocks; default device size / 512,
    /// clamped to 1–64 MiB. Tests use tiny rings so that they wrap.
    pub journal_blocks: Option<u64>,
    /// A CRC32C of every 4 KiB data block, checked on every read (default:
    /// on; `Some(false)` formats without the checksum region).
    pub data_checksums: Option<bool>,
    /// Layers: snapshots and clones (default: on; `Some(false)` formats
    /// without the presence region).
    pub layers: Option<bool>,
    /// Key slots: each volume's wrapped data key, for encryption at rest
    /// (default: on; `Some(false)` formats without the key slot region).
    pub key_slots: Option<bool>,
    /// Packed extents: compressed logical extents in shared pack extents
    /// (default: on; needs data checksums and layers; `Some(false)`
    /// formats without the virtual extent table).
    pub packed: Option<bool>,
}

impl FormatOptions {
    /// The incompatible feature bits a store formatted with these has.
    pub fn features(&self) -> u64 {
        let mut bits = 0;
        if self.data_checksums.unwrap_or(true) {
            bits |= INCOMPAT_DATA_CHECKSUMS;
        }
        if self.layers.unwrap_or(true) {
            bits |= INCOMPAT_LAYERS;
        }
        if self.key_slots.unwrap_or(true) {
            bits |= crate::format::INCOMPAT_KEY_SLOTS;
        }
        let prerequisites = INCOMPAT_DATA_CHECKSUMS | INCOMPAT_LAYERS;
        if self.packed.unwrap_or(true) && bits & prerequisites == prerequisites {
            bits |= crate::format::INCOMPAT_PACKED;
        }
        bits
    }
}

/// Choices made at every open.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// Zero freed extents on a background thread (default). Without it,
    /// they are zeroed only by `Store::zero_freed` and when an allocation
    /// finds nothing else free: the deterministic mode the crash tests use.
    /// The same thread runs cooling rounds (`Store::cool`).
    pub background_zeroing: bool,
    /// How often the background thread runs a cooling round.
    pub cooling_interval: Duration,
    /// An extent not written for this long is cooled: its checksums are
    /// written and its write intent cleared, so that after a crash its
    /// blocks are checked against them (a hot extent's are taken as they
    /// are at their first read). Long enough that a working set written
    /// now and then stays hot and its writes never wait for an intent.
    pub cool_after: Duration,
    /// Hot extents beyond this many bytes are cooled even if busy (`None`:
    /// no limit; an unclean start's work does not depend on it).
    pub max_hot_bytes: Option<u64>,
    /// The background scrubber reads every volume whole once per this
    /// interval (`None`: no background scrubbing).
    pub scrub_interval: Option<Duration>,
    /// Most bytes per second the background scrubber reads.
    pub scrub_rate: u64,
    /// Most logical bytes per second the background compactor packs
    /// (cold extents of compressed volumes); `None`: no background
    /// compaction (`Store::compact_volume` still works).
    pub compaction_rate: Option<u64>,
    /// How often the background compactor looks for cold extents.
    pub compaction_interval: Duration,
    /// An extent not written for this long is cold enough to compress
    /// (measured in cooling rounds, so at `cooling_interval` granularity).
    pub compact_after: Duration,
}

/// A week, as Ceph's default deep-scrub interval.
pub const DEFAULT_SCRUB_INTERVAL: Duration = Duration::from_secs(7 * 24 * 3600);
/// 16 MiB/s: a TiB in under a day, a small share of any disk's bandwidth.
pub const DEFAULT_SCRUB_RATE: u64 = 16 << 20;
/// 32 MiB/s of cold data: a TiB in about nine hours, at most about one
/// core's share of LZ4 or zstd time.
pub const DEFAULT_COMPACTION_RATE: u64 = 32 << 20;

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            background_zeroing: true,
            cooling_interval: Duration::from_secs(5),
            cool_after: Duration::from_secs(600),
            max_hot_bytes: None,
            scrub_interval: Some(DEFAULT_SCRUB_INTERVAL),
            scrub_rate: DEFAULT_SCRUB_RATE,
            compaction_rate: Some(DEFAULT_COMPACTION_RATE),
            compaction_interval: Duration::from_secs(30),
            compact_after: Duration::from_secs(600),
        }
    }
}

/// Space accounting of the whole store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreUsage {
    pub capacity_bytes: u64,
    /// Bytes of physical extents in use: volumes' and snapshots' own
    /// extents, and pack extents (which hold the packed ones).
    pub allocated_bytes: u64,
    /// Logical bytes kept packed (compressed), and the bytes their runs
    /// store: the compression ratio is the first over the second.
    pub packed_bytes: u64,
    pub packed_stored_bytes: u64,
    /// Bytes of pack extents (what the packed data takes of the capacity).
    pub pack_extent_bytes: u64,
    pub provisioned_bytes: u64,
    pub extent_size: u64,
    pub volumes: u64,
}

/// Size and allocation of one volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeUsage {
    pub id: VolumeId,
    pub size: u64,
    pub allocated_bytes: u64,
    pub created_unix: u64,
    /// When a scrub last read the whole volume (Unix seconds; 0 = never).
    pub last_scrub_unix: u64,
    /// The snapshot this volume reads through (its latest snapshot, or the
    /// one it was cloned from); `None`: it has no parent layer.
    pub parent: Option<VolumeId>,
    /// Logical bytes of the volume's own layer kept packed (compressed),
    /// and the bytes their runs store.
    pub packed_bytes: u64,
    pub packed_stored_bytes: u64,
}

/// Flushes asked for and commits done; requests / commits is how many
/// flushes one journal write and device flush served on average.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlushStats {
    pub requests: u64,
    pub commits: u64,
}

/// What the last open found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// The store had not been closed cleanly.
    pub unclean: bool,
    /// The store was upgraded from format version 1 by this open.
    pub upgraded_from_v1: bool,
    pub replayed_entries: u64,
    /// Free extents that may hold data (freed or reserved when the store
    /// stopped), zeroed before reuse: the whole of an unclean start's work.
    pub dirty_extents: u64,
    /// Table entries that failed their checksum and were set aside.
    pub quarantined_extents: u64,
    pub quarantined_slots: u64,
    /// Extents owned by no live volume, or a second copy of a logical
    /// extent: never produced by this engine; freed with a warning.
    pub stray_extents: u64,
    /// Extents marked hot at the stop (written recently, checksums not
    /// durable): their blocks are taken as they are at their first read.
    pub hot_extents: u64,
    /// Extents covered by a checksum page that failed to verify: their
    /// checksums were recomputed from their data.
    pub recomputed_extents: u64,
    /// Checksum pages that failed to verify (torn by the stop, or
    /// damaged); the blocks they cover were recomputed and the pages
    /// rewritten.
    pub bad_checksum_pages: u64,
    /// Presence sectors that failed to verify (damaged: a stop leaves every
    /// sector old or new); the layered blocks they cover are taken as
    /// present, and the event is logged.
    pub bad_presence_sectors: u64,
    /// Key slot entries that failed to verify (damaged: a stop leaves every
    /// entry old or new); their volumes read as having no key.
    pub bad_key_slots: u64,
}

/// Data checksums at work.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IntegrityStats {
    /// The store keeps data checksums (stores upgraded from format 1 do not).
    pub data_checksums: bool,
    /// Reads that found a block not holding what was written to it
    /// (answered with an error, never with the data).
    pub checksum_errors: u64,
    /// Extents whose checksums are not yet durable (write intent).
    pub hot_extents: u64,
    /// Bytes scrubbed since the open (background and asked for).
    pub scrubbed_bytes: u64,
    /// Damaged blocks scrubs found since the open.
    pub scrub_damaged_blocks: u64,
    /// Complete background passes over a volume since the open.
    pub scrub_passes: u64,
}

/// The journal and the state it leads to, under one lock: only a commit
/// (or a checkpoint) changes either.
pub(crate) struct Durable {
    pub journal: Journal,
    pub state: MetaState,
}

pub(crate) struct Meta {
    /// Changes made in memory, not yet written to the journal.
    pub pending: Vec<JournalEntry>,
    /// Entries ever queued; shared with `Store::queued_entries` so the data
    /// path can ask "is everything durable?" without taking this lock.
    pub appended: Arc<AtomicU64>,
    /// Free, durably zero, not reserved.
    pub free: FreeExtents,
    /// Durably marked dirty: may be handed to a volume.
    pub reserved: Vec<u32>,
    /// Marked dirty by a queued entry; reserved once it is committed.
    pub reserving: Vec<u32>,
    /// Freed by a committed entry; zeroed (and flushed) before reuse.
    pub to_zero: Vec<u32>,
    /// Extents the next reservation takes (`space.rs`: grows in bursts of
    /// first writes), and when the background thread last refilled.
    pub reserve_batch: u64,
    pub last_refill: Option<std::time::Instant>,
    pub volumes: HashMap<VolumeId, Arc<VolumeState>>,
    /// Indexed by slot - 1: held by a live (or quarantined) volume.
    pub slots_used: Vec<bool>,
}

impl Meta {
    pub fn push(&mut self, entry: JournalEntry) {
        self.pending.push(entry);
        self.appended.fetch_add(1, Ordering::AcqRel);
    }

    pub fn free_slot(&self) -> Option<u32> {
        self.slots_used
            .iter()
            .position(|used| !used)
            .map(|i| i as u32 + 1)
    }
}

pub struct Store {
    pub(crate) device: Arc<dyn BlockDevice>,
    pub(crate) layout: Layout,
    pub(crate) durable: Mutex<Durable>,
    pub(crate) meta: Mutex<Meta>,
    pub(crate) failed: AtomicBool,
    /// Journal entries ever queued, and how many of them are durable. Both
    /// only grow; `durable_entries` is advanced under the durable lock.
    queued_entries: Arc<AtomicU64>,
    durable_entries: AtomicU64,
    /// Group commit: flush requests ever made, and the highest request
    /// number a completed flush covered.
    flush_requests: AtomicU64,
    flushes_done: AtomicU64,
    /// Commits that wrote and flushed (the leaders of group commits).
    commits: AtomicU64,
    /// Serialises read-modify-write of partial blocks, striped by block.
    pub(crate) rmw_locks: Vec<Mutex<()>>,
    /// One zeroing pass at a time.
    pub(crate) zeroing: Mutex<()>,
    /// One layer operation (snapshot, clone, rollback, deletion) at a time.
    pub(crate) layer_ops: Mutex<()>,
    pub(crate) zeroer: Zeroer,
    /// Data checksums and write intent; `None` in a store without the
    /// checksum region.
    pub(crate) checksums: Option<DataChecksums>,
    pub(crate) intent: Option<Intent>,
    /// Presence bits of layered extents; `None` in a store without layers.
    pub(crate) presence: Option<Presence>,
    /// Packed extents' runs and space; `None` in a store without them.
    pub(crate) packing: Option<crate::packing::Packing>,
    /// Wrapped volume keys; `None` in a store without key slots.
    pub(crate) keys: Option<crate::keys::KeySlots>,
    /// One cooling round at a time.
    pub(crate) cooling: Mutex<()>,
    pub(crate) cooling_interval: Duration,
    pub(crate) scrubber: Scrubber,
    pub(crate) scrubbed: ScrubCounters,
    pub(crate) compactor: crate::compactor::Compactor,
    closed: AtomicBool,
    superblock: Mutex<Superblock>,
    recovery: RecoveryReport,
}

pub(crate) fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Which region a dirty metadata page belongs to.
#[derive(Clone, Copy)]
enum Region {
    Extents,
    Slots,
    Presence,
    Virtual,
}

/// Writes the table and presence pages `state` marked dirty (without
/// flushing).
pub(crate) fn write_dirty_pages(
    device: &dyn BlockDevice,
    state: &mut MetaState,
) -> Result<u64, StoreError> {
    let layout = state.layout;
    let mut pages: Vec<(u64, Region)> = Vec::new();
    pages.extend(
        std::mem::take(&mut state.dirty_extent_pages)
            .into_iter()
            .map(|p| (p, Region::Extents)),
    );
    pages.extend(
        std::mem::take(&mut state.dirty_slot_pages)
            .into_iter()
            .map(|p| (p, Region::Slots)),
    );
    pages.extend(
        std::mem::take(&mut state.dirty_presence_pages)
            .into_iter()
            .map(|p| (p, Region::Presence)),
    );
    pages.extend(
        std::mem::take(&mut state.dirty_virtual_pages)
            .into_iter()
            .map(|p| (p, Region::Virtual)),
    );
    // Bounded batches: a format or an upgrade writes every page.
    const BATCH: usize = 2048;
    let mut buf = AlignedBuf::zeroed(0);
    for group in pages.chunks(BATCH) {
        buf.set_len(group.len() * PAGE as usize);
        let mut offsets = Vec::with_capacity(group.len());
        for (i, &(p, region)) in group.iter().enumerate() {
            let out = &mut buf[i * PAGE as usize..(i + 1) * PAGE as usize];
            match region {
                Region::Extents => {
                    state.encode_extent_page(p, out);
                    offsets.push(layout.extent_table_offset + p * PAGE);
                }
                Region::Slots => {
                    state.encode_slot_page(p, out);
                    offsets.push(layout.volume_table_offset + p * PAGE);
                }
                Region::Presence => {
                    state.encode_presence_page(p, out);
                    offsets.push(layout.presence_offset + p * PAGE);
                }
                Region::Virtual => {
                    state.encode_virtual_page(p, out);
                    offsets.push(layout.virtual_offset + p * PAGE);
                }
            }
        }
        let mut ops: Vec<IoOp<'_>> = buf
            .chunks(PAGE as usize)
            .zip(&offsets)
            .map(|(chunk, off)| IoOp::write(*off, chunk, false))
            .collect();
        device.submit(&mut ops);
        for op in ops {
            op.result?;
        }
    }
    Ok(pages.len() as u64)
}

/// Writes `sb` to the copy its generation selects, then flushes.
pub(crate) fn write_superblock(
    device: &dyn BlockDevice,
    sb: &Superblock,
) -> Result<(), StoreError> {
    let mut page = AlignedBuf::zeroed(PAGE as usize);
    page.copy_from_slice(&sb.encode());
    device.write_at(
        &page,
        SUPERBLOCK_COPIES[(sb.generation % 2) as usize],
        false,
    )?;
    device.flush()?;
    Ok(())
}

impl Store {
    /// Formats `device` as an empty store (destroying what it held) and opens it.
    pub fn create(
        device: Arc<dyn BlockDevice>,
        options: &FormatOptions,
    ) -> Result<Arc<Store>, StoreError> {
        Self::create_with(device, options, &OpenOptions::default())
    }

    pub fn create_with(
        device: Arc<dyn BlockDevice>,
        options: &FormatOptions,
        open: &OpenOptions,
    ) -> Result<Arc<Store>, StoreError> {
        let size = device.size();
        let features = options.features();
        let checksums = features & INCOMPAT_DATA_CHECKSUMS != 0;
        let layout = Layout::plan(
            size,
            options.extent_size.unwrap_or(DEFAULT_EXTENT_SIZE),
            options.journal_blocks,
            features,
        )
        .map_err(StoreError::DeviceTooSmall)?;
        // Whatever was there must not look like a store while we format.
        device.zero_range(0, 2 * PAGE)?;
        device.zero_range(layout.journal_offset, layout.journal_blocks * PAGE)?;
        device.discard_zeroes(layout.data_offset, layout.capacity_bytes())?;
        // Every table entry and presence sector is written, with its
        // checksum: a zeroed one does not verify.
        let mut state = MetaState::new(
            layout,
            vec![ExtentState::CLEAN; layout.all_extents() as usize],
            vec![Default::default(); layout.virtual_extents as usize],
            vec![SlotState::Free; layout.volume_slots as usize],
        );
        state.mark_all_dirty();
        write_dirty_pages(device.as_ref(), &mut state)?;
        if checksums {
            // Every page verifies from the start: every block holds zeros.
            recovery::write_zero_checksum_pages(device.as_ref(), &layout)?;
        }
        if layout.has_key_slots() {
            crate::keys::KeySlots::format(device.as_ref(), &layout)?;
        }
        device.flush()?;
        let sb = Superblock {
            version: FORMAT_VERSION,
            incompat_features: features,
            compat_features: 0,
            store_id: uuid::Uuid::new_v4(),
            generation: 1,
            device_size: size,
            layout,
            journal_tail_seq: 1,
            journal_tail_position: 1 % layout.journal_blocks,
            clean: true,
            created_unix: now_unix(),
            journal_epoch: 1,
        };
        let mut older = sb.clone();
        older.generation = 0;
        write_superblock(device.as_ref(), &older)?;
        write_superblock(device.as_ref(), &sb)?;
        tracing::info!(store = %sb.store_id, capacity = layout.capacity_bytes(), extent_size = layout.extent_size, "formatted store");
        Store::open_with(device, open)
    }

    /// Opens a formatted device, replaying the journal after a crash and
    /// upgrading a version-1 store in place.
    pub fn open(device: Arc<dyn BlockDevice>) -> Result<Arc<Store>, StoreError> {
        Self::open_with(device, &OpenOptions::default())
    }

    pub fn open_with(
        device: Arc<dyn BlockDevice>,
        options: &OpenOptions,
    ) -> Result<Arc<Store>, StoreError> {
        let mut sb = recovery::read_superblock(device.as_ref())?;
        if device.size() < sb.device_size {
            return Err(StoreError::Format(format!(
                "the device has {} bytes but the store was formatted for {}",
                device.size(),
                sb.device_size
            )));
        }
        let mut upgraded_from_v1 = false;
        if sb.version == 1 {
            recovery::upgrade_v1(device.as_ref(), &sb)?;
            sb = recovery::read_superblock(device.as_ref())?;
            upgraded_from_v1 = true;
        }
        let layout = sb.layout;
        let loaded = recovery::load(device.as_ref(), &sb)?;
        let mut state = loaded.state;
        let mut built = recovery::build_runtime(&mut state);
        let packing = layout.has_packed().then(|| {
            let (packing, empty_packs) = crate::packing::Packing::load(&state);
            let mut ignored = Vec::new();
            for pack in empty_packs.into_iter().filter(|&p| !layout.is_virtual(p)) {
                // A pack extent no run uses (its last run was freed just
                // before a stop): freed like any extent.
                let _ = state.apply(
                    &JournalEntry::Free {
                        first: pack,
                        count: 1,
                    },
                    &mut ignored,
                );
                built.to_zero.push(pack);
            }
            packing
        });
        let integrity = if layout.has_data_checksums() {
            Some(recovery::load_checksums(device.as_ref(), &state, options)?)
        } else {
            None
        };
        let keys = if layout.has_key_slots() {
            Some(crate::keys::KeySlots::load(device.as_ref(), &layout)?)
        } else {
            None
        };
        let bad_key_slots = keys.as_ref().map_or(0, |k| k.bad_entries);
        let keys = keys.map(|k| k.slots);
        let report = RecoveryReport {
            unclean: !sb.clean,
            upgraded_from_v1,
            replayed_entries: loaded.replayed_entries,
            dirty_extents: built.to_zero.len() as u64,
            quarantined_extents: loaded.quarantined_extents,
            quarantined_slots: loaded.quarantined_slots,
            stray_extents: built.stray_extents,
            hot_extents: integrity.as_ref().map_or(0, |i| i.hot_extents),
            recomputed_extents: integrity.as_ref().map_or(0, |i| i.recomputed_extents),
            bad_checksum_pages: integrity.as_ref().map_or(0, |i| i.bad_pages),
            bad_presence_sectors: loaded.bad_presence_sectors,
            bad_key_slots,
        };
        if bad_key_slots > 0 {
            tracing::warn!(
                entries = bad_key_slots,
                "key slot entries fail their checksum (damaged); their volumes read as having no key"
            );
        }
        tracing::info!(
            store = %sb.store_id,
            clean = sb.clean,
            replayed_entries = report.replayed_entries,
            volumes = built.volumes.len(),
            dirty_extents = report.dirty_extents,
            hot_extents = report.hot_extents,
            recomputed_extents = report.recomputed_extents,
            data_checksums = integrity.is_some(),
            "opened store"
        );
        let (checksums, intent) = match integrity {
            Some(i) => (Some(i.checksums), Some(i.intent)),
            None => (None, None),
        };
        let presence = layout
            .has_layers()
            .then(|| Presence::new(&layout, &state.presence));
        let queued_entries = Arc::new(AtomicU64::new(0));
        let journal = Journal {
            store_id: sb.store_id,
            ring_blocks: layout.journal_blocks,
            head_seq: loaded.head_seq,
            tail_seq: sb.journal_tail_seq,
            // A new epoch: blocks this run writes are told apart from any a
            // torn commit of an earlier run left in the ring.
            epoch: sb.journal_epoch + 1,
            generation: sb.generation,
        };
        let store = Arc::new(Store {
            device,
            layout,
            durable: Mutex::new(Durable { journal, state }),
            meta: Mutex::new(Meta {
                pending: Vec::new(),
                appended: queued_entries.clone(),
                free: built.free,
                reserved: Vec::new(),
                reserving: Vec::new(),
                to_zero: built.to_zero,
                reserve_batch: crate::space::RESERVE_BATCH,
                last_refill: None,
                volumes: built.volumes,
                slots_used: built.slots_used,
            }),
            failed: AtomicBool::new(false),
            queued_entries,
            durable_entries: AtomicU64::new(0),
            flush_requests: AtomicU64::new(0),
            flushes_done: AtomicU64::new(0),
            commits: AtomicU64::new(0),
            rmw_locks: (0..64).map(|_| Mutex::new(())).collect(),
            zeroing: Mutex::new(()),
            layer_ops: Mutex::new(()),
            zeroer: Zeroer::default(),
            checksums,
            intent,
            presence,
            packing,
            keys,
            cooling: Mutex::new(()),
            cooling_interval: options.cooling_interval,
            scrubber: Scrubber::default(),
            scrubbed: ScrubCounters::default(),
            compactor: Default::default(),
            closed: AtomicBool::new(false),
            superblock: Mutex::new(sb),
            recovery: report,
        });
        // Fold the replayed journal into the tables and start the new epoch
        // before anything is written to the journal.
        {
            let mut d = store.durable.lock();
            store
                .checkpoint_locked(&mut d, false)
                .map_err(|e| store.fail(e))?;
        }
        if options.background_zeroing {
            Zeroer::spawn(&store);
        }
        let shredded = store.shred_orphan_keys()?;
        // Those whose layers are under keys not loaded yet wait for
        // `Store::finish_snapshot_deletions` after the unlock.
        store.finish_snapshot_deletions()?;
        if shredded > 0 {
            tracing::info!(
                keys = shredded,
                "emptied the key slots of volumes deleted before a crash"
            );
        }
        if let Some(interval) = options.scrub_interval.filter(|_| store.checksums.is_some()) {
            Scrubber::spawn(&store, interval, options.scrub_rate.max(1));
        }
        if let Some(rate) = options.compaction_rate.filter(|_| store.packing.is_some()) {
            let rounds = (options.compact_after.as_millis()
                / options.cooling_interval.as_millis().max(1))
            .clamp(1, u32::MAX as u128) as u32;
            store.compactor.set_idle_rounds(rounds);
            crate::compactor::Compactor::spawn(&store, rate.max(1), options.compaction_interval);
        }
        Ok(store)
    }

    /// Group commit at work: flushes asked for (FLUSH, FUA with metadata,
    /// control operations) and commits that did the I/O for them.
    pub fn flush_stats(&self) -> FlushStats {
        FlushStats {
            requests: self.flush_requests.load(Ordering::Relaxed),
            commits: self.commits.load(Ordering::Relaxed),
        }
    }

    /// What the last open found (recovery work, quarantined entries).
    pub fn recovery(&self) -> &RecoveryReport {
        &self.recovery
    }

    pub(crate) fn fail(&self, e: StoreError) -> StoreError {
        if !self.failed.swap(true, Ordering::SeqCst) {
            tracing::error!(error = %e, "store failed; refusing further writes until restart");
        }
        e
    }

    pub(crate) fn check_usable(&self) -> Result<(), StoreError> {
        if self.failed.load(Ordering::SeqCst) {
            return Err(StoreError::Failed);
        }
        Ok(())
    }

    /// Makes every completed write and every metadata change durable.
    pub fn flush(&self) -> Result<(), StoreError> {
        self.commit()
    }

    /// Data checksums at work: errors found, extents with write intent.
    pub fn integrity(&self) -> IntegrityStats {
        IntegrityStats {
            data_checksums: self.checksums.is_some(),
            checksum_errors: self.checksums.as_ref().map_or(0, |c| c.mismatches()),
            hot_extents: self.intent.as_ref().map_or(0, |i| i.hot_count() as u64),
            scrubbed_bytes: self.scrubbed.bytes.load(Ordering::Relaxed),
            scrub_damaged_blocks: self.scrubbed.bad_blocks.load(Ordering::Relaxed),
            scrub_passes: self.scrubbed.passes.load(Ordering::Relaxed),
        }
    }

    /// Whether the first `n` journal entries ever queued are durable.
    pub(crate) fn entries_durable(&self, n: u64) -> bool {
        self.durable_entries.load(Ordering::Acquire) >= n
    }

    /// Whether a metadata change is queued or being written. Lock-free: it
    /// sits on the path of every FUA write.
    pub(crate) fn metadata_pending(&self) -> bool {
        self.durable_entries.load(Ordering::Acquire) < self.queued_entries.load(Ordering::Acquire)
    }

    /// Writes every queued entry to the journal and flushes the device.
    pub(crate) fn commit(&self) -> Result<(), StoreError> {
        // Taken before anything else: every write and entry this caller
        // completed happened before its request number.
        let ticket = self.flush_requests.fetch_add(1, Ordering::SeqCst) + 1;
        let mut d = self.durable.lock();
        self.check_usable()?;
        if self.flushes_done.load(Ordering::SeqCst) >= ticket {
            return Ok(()); // a flush that started after we asked covered us
        }
        let covered = self.flush_requests.load(Ordering::SeqCst);
        self.commits.fetch_add(1, Ordering::Relaxed);
        let (entries, reserving, upto) = {
            let mut m = self.meta.lock();
            (
                std::mem::take(&mut m.pending),
                std::mem::take(&mut m.reserving),
                m.appended.load(Ordering::Acquire),
            )
        };
        tracing::debug!(entries = entries.len(), head = d.journal.head_seq, "commit");
        let mut freed = Vec::new();
        // A block's presence may become durable only after its data, and a
        // packed run or an unpacked extent before the entry that maps it:
        // the data writes they record completed before the entry was
        // queued, and this flush makes them durable before the journal
        // names them.
        let data_first = entries.iter().any(|e| {
            matches!(
                e,
                JournalEntry::Present { .. }
                    | JournalEntry::Pack { .. }
                    | JournalEntry::Unpack { .. }
            )
        });
        let result = (if data_first {
            self.device.flush().map_err(StoreError::from)
        } else {
            Ok(())
        })
        .and_then(|()| self.write_entries(&mut d, &entries, &mut freed))
        .and_then(|()| Ok(self.device.flush()?))
        .and_then(|()| {
            let j = &d.journal;
            if j.used_blocks() * 4 > j.ring_blocks * 3 {
                self.checkpoint_locked(&mut d, false)
            } else {
                Ok(())
            }
        });
        result.map_err(|e| self.fail(e))?;
        self.durable_entries.fetch_max(upto, Ordering::AcqRel);
        self.flushes_done.fetch_max(covered, Ordering::SeqCst);
        drop(d);
        // Freed virtual extents have no data of their own to zero: their
        // runs' units go back to the pack extents.
        let (freed_virtual, freed): (Vec<u32>, Vec<u32>) =
            freed.into_iter().partition(|&p| self.layout.is_virtual(p));
        let wake = !freed.is_empty();
        {
            let mut m = self.meta.lock();
            // Handed out in ascending order (popped from the end).
            m.reserved.extend(reserving.into_iter().rev());
            m.to_zero.extend(freed);
        }
        if !freed_virtual.is_empty() {
            self.release_virtual(&freed_virtual);
        }
        if wake {
            self.zeroer.wake();
        }
        Ok(())
    }

    /// Writes `entries` as journal blocks (unflushed) and applies them to
    /// the journaled state; checkpoints first whenever the ring is full.
    fn write_entries(
        &self,
        d: &mut Durable,
        entries: &[JournalEntry],
        freed: &mut Vec<u32>,
    ) -> Result<(), StoreError> {
        let mut rest = entries;
        let mut buf = AlignedBuf::zeroed(0);
        while !rest.is_empty() {
            let room = d.journal.room();
            if room == 0 {
                self.checkpoint_locked(d, false)?;
                continue;
            }
            let n = Journal::entries_fitting(rest, room);
            let (chunk, tail) = rest.split_at(n);
            let writes = d
                .journal
                .encode(chunk, self.layout.journal_offset, &mut buf);
            let mut ops: Vec<IoOp<'_>> = writes
                .iter()
                .map(|(off, r)| IoOp::write(*off, &buf[r.clone()], false))
                .collect();
            self.device.submit(&mut ops);
            for op in ops {
                op.result?;
            }
            d.journal.head_seq += crate::format::pack_journal_blocks(chunk).len() as u64;
            for e in chunk {
                d.state
                    .apply(e, freed)
                    .map_err(|m| StoreError::Format(format!("metadata change refused: {m}")))?;
            }
            rest = tail;
        }
        Ok(())
    }

    /// Writes every changed table page in place, then advances the journal
    /// tail in the superblock. Called with the durable lock held.
    pub(crate) fn checkpoint_locked(&self, d: &mut Durable, clean: bool) -> Result<(), StoreError> {
        write_dirty_pages(self.device.as_ref(), &mut d.state)?;
        self.device.flush()?;
        let mut sb = self.superblock.lock();
        let j = &mut d.journal;
        let mut next = sb.clone();
        next.generation = j.generation + 1;
        next.journal_tail_seq = j.head_seq;
        next.journal_tail_position = j.head_seq % j.ring_blocks;
        next.journal_epoch = j.epoch;
        next.clean = clean;
        write_superblock(self.device.as_ref(), &next)?;
        *sb = next;
        j.generation = sb.generation;
        j.tail_seq = j.head_seq;
        Ok(())
    }

    /// Clean shutdown: finishes zeroing, commits, checkpoints and marks the
    /// store clean, so the next open has no work. Later calls to the store
    /// fail.
    pub fn close(&self) -> Result<(), StoreError> {
        if self.closed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        self.zeroer.stop();
        self.scrubber.stop();
        self.compactor.stop();
        self.commit()?;
        // Freed packed extents may have left pack extents empty: their
        // release is queued by that commit, and zeroed with the others.
        if self.metadata_pending() {
            self.commit()?;
        }
        self.zero_freed()?;
        self.release_reserved();
        // Checksums durable and every extent cold: the next open reads no data.
        self.cool(true)?;
        self.commit()?;
        let mut d = self.durable.lock();
        self.check_usable()?;
        let r = self.checkpoint_locked(&mut d, true);
        self.failed.store(true, Ordering::SeqCst);
        tracing::info!("store closed cleanly");
        r
    }

    pub fn usage(&self) -> StoreUsage {
        let m = self.meta.lock();
        let es = self.layout.extent_size as u64;
        // Snapshots hold space but provision none.
        let allocated: u64 = m.volumes.values().map(|v| v.allocated_extents()).sum();
        let heads = || m.volumes.values().filter(|v| !v.is_snapshot());
        let (packed, stored, packs) = self.packing.as_ref().map_or((0, 0, 0), |p| p.totals());
        StoreUsage {
            capacity_bytes: self.layout.capacity_bytes(),
            allocated_bytes: (allocated.saturating_sub(packed) + packs) * es,
            packed_bytes: packed * es,
            packed_stored_bytes: stored,
            pack_extent_bytes: packs * es,
            provisioned_bytes: heads().map(|v| v.size()).sum(),
            extent_size: es,
            volumes: heads().count() as u64,
        }
    }

    /// The volumes (not their snapshots: `Store::snapshots`).
    pub fn volumes(&self) -> Vec<VolumeUsage> {
        // Lock order: maps before meta, so the list is taken first.
        let all: Vec<Arc<VolumeState>> = self.meta.lock().volumes.values().cloned().collect();
        let es = self.layout.extent_size as u64;
        let mut v: Vec<VolumeUsage> = all
            .iter()
            .filter(|v| !v.is_snapshot())
            .map(|v| {
                let map = v.map.read();
                let (packed, stored) = self.packed_in(&map);
                VolumeUsage {
                    id: v.id,
                    size: v.size(),
                    allocated_bytes: v.allocated_extents() * es,
                    created_unix: v.created_unix,
                    last_scrub_unix: v.last_scrub(),
                    parent: map.parent.as_ref().map(|p| p.id),
                    packed_bytes: packed * es,
                    packed_stored_bytes: stored,
                }
            })
            .collect();
        v.sort_by_key(|u| u.id);
        v
    }

    pub(crate) fn check_size(&self, size: u64) -> Result<(), StoreError> {
        if size == 0 || !size.is_multiple_of(BLOCK_SIZE) {
            return Err(StoreError::InvalidSize(format!(
                "{size} bytes is not a positive multiple of {BLOCK_SIZE}"
            )));
        }
        if self.layout.extents_for_size(size) > u32::MAX as u64 {
            return Err(StoreError::InvalidSize(format!(
                "{size} bytes exceeds the largest volume this store holds"
            )));
        }
        Ok(())
    }

    /// Creates an empty (all-zero, nothing allocated) volume; durable on return.
    pub fn create_volume(&self, id: VolumeId, size: u64) -> Result<(), StoreError> {
        self.check_usable()?;
        self.check_size(size)?;
        self.add_layer(&mut self.meta.lock(), id, size, None)?;
        self.commit()
    }

    /// Queues a new volume's layer: empty, reading through `parent` (a
    /// snapshot, whose map lock the caller holds) if any.
    pub(crate) fn add_layer(
        &self,
        m: &mut Meta,
        id: VolumeId,
        size: u64,
        parent: Option<(&Arc<VolumeState>, u32)>,
    ) -> Result<(), StoreError> {
        if m.volumes.contains_key(&id) {
            return Err(StoreError::Exists(id));
        }
        let slot = m
            .free_slot()
            .ok_or(StoreError::TooManyVolumes(self.layout.volume_slots))?;
        let created_unix = now_unix();
        m.push(JournalEntry::CreateVolume {
            slot,
            id,
            size,
            created_unix,
            parent: parent.map_or(0, |(_, slot)| slot),
        });
        m.slots_used[slot as usize - 1] = true;
        let extents = self.layout.extents_for_size(size) as usize;
        let layer = VolumeState::new(id, slot, size, extents, created_unix);
        layer.map.write().parent = parent.map(|(p, _)| p.clone());
        m.volumes.insert(id, Arc::new(layer));
        Ok(())
    }

    /// Changes a volume's size; durable on return. Shrinking drops the data
    /// beyond the new end, and a later grow reads zeros there.
    pub fn resize_volume(&self, id: VolumeId, size: u64) -> Result<(), StoreError> {
        self.check_usable()?;
        self.check_size(size)?;
        let vol = self.volume_state(id)?;
        if vol.is_snapshot() {
            return Err(StoreError::Layers(format!(
                "{id} is a snapshot; snapshots cannot be resized"
            )));
        }
        let es = self.layout.extent_size as u64;
        {
            // Exclusive: no I/O may be in flight on extents about to be freed.
            let mut map = vol.map.write();
            let old = vol.size();
            let keep = self.layout.extents_for_size(size) as usize;
            if size < old && map.parent.is_some() {
                // The parent's blocks beyond the new end would show again
                // when the volume grows back.
                return Err(StoreError::Layers(format!(
                    "volume {id} reads through a snapshot; it can grow but not shrink"
                )));
            }
            if size < old {
                if !size.is_multiple_of(es) {
                    // The tail of the last kept extent must read zeros if
                    // grown back: zeroed, and durably so before the smaller
                    // size can be.
                    if let Some(mut phys) = map.get(keep - 1).and_then(|p| p.get()) {
                        if self.layout.is_virtual(phys) {
                            phys = self.unpack_locked(&vol, &map, keep as u32 - 1, phys)?;
                        }
                        self.heat(phys)?;
                        let start = self.layout.extent_offset(phys) + size % es;
                        let end = self.layout.extent_offset(phys) + es;
                        self.device
                            .discard_zeroes(start, end - start)
                            .and_then(|()| self.device.flush())
                            .map_err(|e| self.fail(e.into()))?;
                        if let Some(sums) = &self.checksums {
                            let blocks = (end - start) / BLOCK_SIZE;
                            let first = self.layout.data_block_at(start);
                            sums.set_range(first, blocks, crate::integrity::zero_block_crc());
                        }
                    }
                }
                vol.forget_mapped_from(&map, keep);
            }
            self.meta.lock().push(JournalEntry::ResizeVolume {
                slot: map.slot,
                size,
            });
            map.resize(keep);
            vol.set_size(size);
        }
        self.commit()
    }

    /// Deletes a volume and frees its extents; durable on return. Open
    /// handles get `IoError::Gone` afterwards. A volume with snapshots is
    /// refused (delete them first, as `rbd rm` does); a snapshot is
    /// deleted with `delete_snapshot`.
    pub fn delete_volume(&self, id: VolumeId) -> Result<(), StoreError> {
        self.check_usable()?;
        let vol = self.volume_state(id)?;
        if vol.is_snapshot() {
            return Err(StoreError::Layers(format!(
                "{id} is a snapshot; delete it as one"
            )));
        }
        let _op = self.layer_ops.lock();
        {
            let mut map = vol.map.write();
            let mut m = self.meta.lock();
            let snapshots = m
                .volumes
                .values()
                .filter(|v| v.snapshot_of == Some(id))
                .count();
            if snapshots > 0 {
                return Err(StoreError::Layers(format!(
                    "volume {id} has {snapshots} snapshot(s); delete them first"
                )));
            }
            m.push(JournalEntry::DeleteVolume { slot: map.slot });
            m.volumes.remove(&id);
            m.slots_used[map.slot as usize - 1] = false;
            vol.mark_deleted();
            map.resize(0);
            map.parent = None;
        }
        self.commit()?;
        // Once the deletion is durable: the wrapped key leaves the device.
        self.shred_key(id)
    }

    pub(crate) fn volume_state(&self, id: VolumeId) -> Result<Arc<VolumeState>, StoreError> {
        self.meta
            .lock()
            .volumes
            .get(&id)
            .cloned()
            .ok_or(StoreError::NotFound(id))
    }

    /// A data-path handle to a volume or snapshot (not one being deleted).
    pub fn volume(self: &Arc<Self>, id: VolumeId) -> Result<LocalVolume, StoreError> {
        let v = self.volume_state(id)?;
        if v.is_retired() {
            return Err(StoreError::NotFound(id));
        }
        self.cipher_of(&v)?;
        Ok(LocalVolume::new(self.clone(), v))
    }

    pub fn extent_size(&self) -> u64 {
        self.layout.extent_size as u64
    }

    pub fn store_id(&self) -> uuid::Uuid {
        self.superblock.lock().store_id
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.zeroer.stop();
        self.scrubber.stop();
        self.compactor.stop();
    }
}
