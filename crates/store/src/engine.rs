//! `Store`: formats, opens (with crash recovery), commits and checkpoints the
//! metadata, and creates, resizes and deletes volumes. The data path lives in
//! `volume.rs`.
//!
//! Lock order, always: a volume's map lock, then `journal`, then `meta`.
//! Durability: every metadata change is applied in memory first and queued
//! in `Meta::pending`; `commit` writes the queue to the journal and flushes
//! the device, which also makes every completed data write durable. A
//! checkpoint writes the changed table pages in place and advances the
//! journal tail in the superblock.

use crate::alloc::FreeExtents;
use crate::buf::AlignedBuf;
use crate::device::{BlockDevice, IoOp};
use crate::error::StoreError;
use crate::format::{
    decode_journal_block, ExtentOwner, FormatError, JournalEntry, Layout, Superblock, VolumeSlot,
    DEFAULT_EXTENT_SIZE, EXTENT_ENTRY_SIZE, FORMAT_VERSION, PAGE, SUPERBLOCK_COPIES,
    VOLUME_SLOT_SIZE,
};
use crate::journal::Journal;
use crate::meta::MetaState;
use crate::volume::{LocalVolume, MapEntry, VolumeState};
use crate::{VolumeId, BLOCK_SIZE};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// Choices made once, when a device is formatted.
#[derive(Debug, Clone, Default)]
pub struct FormatOptions {
    /// Allocation unit of thin provisioning; default 1 MiB (see docs/format.md).
    pub extent_size: Option<u32>,
}

/// Space accounting of the whole store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreUsage {
    pub capacity_bytes: u64,
    pub allocated_bytes: u64,
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
}

pub(crate) struct Meta {
    pub state: MetaState,
    pub free: FreeExtents,
    /// Changes applied in memory, not yet written to the journal.
    pub pending: Vec<JournalEntry>,
    /// Unmapped extents waiting for their unmap to be durable.
    pub pending_free: Vec<u32>,
    /// Entries ever queued; shared with `Store::queued_entries` so the data
    /// path can ask "is everything durable?" without taking this lock.
    pub appended: Arc<AtomicU64>,
    pub volumes: HashMap<VolumeId, Arc<VolumeState>>,
}

impl Meta {
    pub fn push(&mut self, entry: JournalEntry) -> Result<(), StoreError> {
        let mut freed = Vec::new();
        self.state
            .apply(&entry, &mut freed)
            .map_err(StoreError::Format)?;
        self.pending_free.extend(freed);
        self.pending.push(entry);
        self.appended.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }
}

pub struct Store {
    pub(crate) device: Arc<dyn BlockDevice>,
    pub(crate) layout: Layout,
    pub(crate) journal: Mutex<Journal>,
    pub(crate) meta: Mutex<Meta>,
    pub(crate) failed: AtomicBool,
    /// Journal entries ever queued, and how many of them are durable. Both
    /// only grow; `durable_entries` is advanced under the journal lock.
    queued_entries: Arc<AtomicU64>,
    durable_entries: AtomicU64,
    /// Serialises read-modify-write of partial blocks, striped by block.
    pub(crate) rmw_locks: Vec<Mutex<()>>,
    closed: AtomicBool,
    superblock: Mutex<Superblock>,
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn read_region(device: &dyn BlockDevice, offset: u64, len: u64) -> Result<AlignedBuf, StoreError> {
    let mut buf = AlignedBuf::zeroed(len as usize);
    const CHUNK: usize = 8 << 20;
    let mut ops: Vec<IoOp<'_>> = buf
        .chunks_mut(CHUNK)
        .enumerate()
        .map(|(i, c)| IoOp::read(offset + (i * CHUNK) as u64, c))
        .collect();
    device.submit(&mut ops);
    for op in ops {
        op.result?;
    }
    Ok(buf)
}

impl Store {
    /// Formats `device` as an empty store (destroying what it held) and opens it.
    pub fn create(
        device: Arc<dyn BlockDevice>,
        options: &FormatOptions,
    ) -> Result<Arc<Store>, StoreError> {
        let size = device.size();
        let layout = Layout::plan(size, options.extent_size.unwrap_or(DEFAULT_EXTENT_SIZE))
            .map_err(StoreError::DeviceTooSmall)?;
        // Tables and journal start as zeros; so does all data space.
        device.zero_range(
            layout.volume_table_offset,
            layout.data_offset - layout.volume_table_offset,
        )?;
        device.discard_zeroes(layout.data_offset, layout.capacity_bytes())?;
        device.flush()?;
        let sb = Superblock {
            version: FORMAT_VERSION,
            incompat_features: 0,
            compat_features: 0,
            store_id: uuid::Uuid::new_v4(),
            generation: 1,
            device_size: size,
            layout,
            journal_tail_seq: 1,
            journal_tail_position: 1 % layout.journal_blocks,
            clean: true,
            created_unix: now_unix(),
        };
        let mut page = AlignedBuf::zeroed(PAGE as usize);
        for (i, at) in SUPERBLOCK_COPIES.iter().enumerate() {
            let mut copy = sb.clone();
            copy.generation = 1 - i as u64; // copy B starts older
            page.copy_from_slice(&copy.encode());
            device.write_at(&page, *at, false)?;
        }
        device.flush()?;
        tracing::info!(store = %sb.store_id, capacity = layout.capacity_bytes(), extent_size = layout.extent_size, "formatted store");
        Store::open(device)
    }

    /// Opens a formatted device, replaying the journal after a crash.
    pub fn open(device: Arc<dyn BlockDevice>) -> Result<Arc<Store>, StoreError> {
        let sb = Self::read_superblock(device.as_ref())?;
        let layout = sb.layout;
        if device.size() < sb.device_size {
            return Err(StoreError::Format(format!(
                "the device has {} bytes but the store was formatted for {}",
                device.size(),
                sb.device_size
            )));
        }
        // Tables as of the last checkpoint.
        let vt = read_region(
            device.as_ref(),
            layout.volume_table_offset,
            layout.volume_table_pages() * PAGE,
        )?;
        let slots: Vec<Option<VolumeSlot>> = (0..layout.volume_slots as usize)
            .map(|i| VolumeSlot::decode(&vt[i * VOLUME_SLOT_SIZE as usize..]))
            .collect();
        let et = read_region(
            device.as_ref(),
            layout.extent_table_offset,
            layout.extent_table_pages() * PAGE,
        )?;
        let owners: Vec<ExtentOwner> = (0..layout.extent_count as usize)
            .map(|i| ExtentOwner::decode(&et[i * EXTENT_ENTRY_SIZE as usize..]))
            .collect();
        let mut state = MetaState::new(layout, owners, slots);

        // Replay the journal from the tail.
        let mut seq = sb.journal_tail_seq;
        let mut block = AlignedBuf::zeroed(PAGE as usize);
        let mut replayed = 0u64;
        let mut ignored = Vec::new();
        while seq - sb.journal_tail_seq < layout.journal_blocks {
            device.read_at(&mut block, layout.journal_block_offset(seq))?;
            let Some(entries) = decode_journal_block(sb.store_id, seq, &block) else {
                break;
            };
            for e in &entries {
                state
                    .apply(e, &mut ignored)
                    .map_err(|m| StoreError::Format(format!("corrupt journal: {m}")))?;
            }
            replayed += entries.len() as u64;
            seq += 1;
        }
        let head_seq = seq;

        let volumes = Self::build_volumes(&mut state)?;
        let mut free = FreeExtents::new(layout.extent_count);
        for (phys, o) in state.owners.iter().enumerate() {
            if o.is_free() {
                free.release(phys as u32);
            }
        }
        if !sb.clean {
            // Data written into extents whose mapping never became durable
            // may sit in free extents: zero them all before reuse.
            for (first, n) in free.runs() {
                device.discard_zeroes(
                    layout.extent_offset(first),
                    n as u64 * layout.extent_size as u64,
                )?;
            }
        }
        tracing::info!(
            store = %sb.store_id,
            clean = sb.clean,
            replayed_entries = replayed,
            volumes = volumes.len(),
            "opened store"
        );
        let queued_entries = Arc::new(AtomicU64::new(0));
        let store = Arc::new(Store {
            device,
            layout,
            journal: Mutex::new(Journal {
                store_id: sb.store_id,
                ring_blocks: layout.journal_blocks,
                head_seq,
                tail_seq: sb.journal_tail_seq,
                generation: sb.generation,
            }),
            meta: Mutex::new(Meta {
                state,
                free,
                pending: Vec::new(),
                pending_free: Vec::new(),
                appended: queued_entries.clone(),
                volumes,
            }),
            failed: AtomicBool::new(false),
            queued_entries,
            durable_entries: AtomicU64::new(0),
            rmw_locks: (0..64).map(|_| Mutex::new(())).collect(),
            closed: AtomicBool::new(false),
            superblock: Mutex::new(sb),
        });
        // Fold the replayed journal into the tables and mark the store open.
        {
            let mut j = store.journal.lock();
            store
                .checkpoint_locked(&mut j, false)
                .map_err(|e| store.fail(e))?;
        }
        Ok(store)
    }

    fn read_superblock(device: &dyn BlockDevice) -> Result<Superblock, StoreError> {
        let mut page = AlignedBuf::zeroed(PAGE as usize);
        let mut best: Option<Superblock> = None;
        let mut first_err: Option<FormatError> = None;
        for at in SUPERBLOCK_COPIES {
            device.read_at(&mut page, at)?;
            match Superblock::decode(&page) {
                Ok(sb) => {
                    if best.as_ref().is_none_or(|b| sb.generation > b.generation) {
                        best = Some(sb);
                    }
                }
                Err(e) => {
                    // A newer format in either copy must refuse, not fall back.
                    if matches!(
                        e,
                        FormatError::UnsupportedVersion { .. } | FormatError::UnknownFeatures(_)
                    ) {
                        return Err(StoreError::Format(e.to_string()));
                    }
                    first_err.get_or_insert(e);
                }
            }
        }
        best.ok_or_else(|| StoreError::Format(first_err.map(|e| e.to_string()).unwrap_or_default()))
    }

    /// Builds each live volume's logical→physical map from the extent table.
    fn build_volumes(
        state: &mut MetaState,
    ) -> Result<HashMap<VolumeId, Arc<VolumeState>>, StoreError> {
        let mut by_slot: HashMap<u32, Arc<VolumeState>> = HashMap::new();
        let mut volumes = HashMap::new();
        for (i, s) in state.slots.iter().enumerate() {
            if let Some(s) = s {
                let extents = state.extents_for_size(s.size);
                let v = Arc::new(VolumeState::new(
                    s.id,
                    i as u32 + 1,
                    s.size,
                    extents as usize,
                ));
                by_slot.insert(i as u32 + 1, v.clone());
                volumes.insert(s.id, v);
            }
        }
        let mut stray = Vec::new();
        for (phys, o) in state.owners.iter().enumerate() {
            if o.is_free() {
                continue;
            }
            let mapped = by_slot
                .get(&o.slot)
                .is_some_and(|v| v.set_mapping_at_open(o.logical, phys as u32));
            if !mapped {
                stray.push(phys as u32);
            }
        }
        if !stray.is_empty() {
            // Not produced by this engine; free rather than refuse to open.
            tracing::warn!(extents = stray.len(), "freeing extents with no valid owner");
            let mut ignored = Vec::new();
            for phys in stray {
                state
                    .apply(&JournalEntry::Unmap { phys }, &mut ignored)
                    .map_err(StoreError::Format)?;
            }
        }
        Ok(volumes)
    }

    pub(crate) fn fail(&self, e: StoreError) -> StoreError {
        if !self.failed.swap(true, Ordering::SeqCst) {
            tracing::error!(error = %e, "store failed; refusing further writes until restart");
        }
        e
    }

    pub(crate) fn check_usable(&self) -> Result<(), StoreError> {
        if self.failed.load(Ordering::Relaxed) {
            return Err(StoreError::Failed);
        }
        Ok(())
    }

    /// Makes every completed write and every metadata change durable.
    pub fn flush(&self) -> Result<(), StoreError> {
        self.commit()
    }

    /// Whether a metadata change is queued or being written. Lock-free: it
    /// sits on the path of every FUA write.
    pub(crate) fn metadata_pending(&self) -> bool {
        self.durable_entries.load(Ordering::Acquire) < self.queued_entries.load(Ordering::Acquire)
    }

    pub(crate) fn commit(&self) -> Result<(), StoreError> {
        self.check_usable()?;
        let mut j = self.journal.lock();
        let (entries, freed, upto) = {
            let mut m = self.meta.lock();
            (
                std::mem::take(&mut m.pending),
                std::mem::take(&mut m.pending_free),
                m.appended.load(Ordering::Acquire),
            )
        };
        tracing::debug!(
            entries = entries.len(),
            freed = freed.len(),
            head = j.head_seq,
            "commit"
        );
        let result = if entries.is_empty() {
            self.device.flush().map_err(StoreError::from)
        } else if !j.fits(Journal::blocks_for(entries.len()))
            || j.used_blocks() * 4 > j.ring_blocks * 3
        {
            // The tables on disk will include these entries.
            self.checkpoint_locked(&mut j, false)
        } else {
            self.write_journal(&mut j, &entries)
        };
        result.map_err(|e| self.fail(e))?;
        self.durable_entries.fetch_max(upto, Ordering::AcqRel);
        drop(j);
        self.release_extents(freed)
    }

    fn write_journal(&self, j: &mut Journal, entries: &[JournalEntry]) -> Result<(), StoreError> {
        let mut buf = AlignedBuf::zeroed(0);
        let writes = j.encode(entries, self.layout.journal_offset, &mut buf);
        let mut ops: Vec<IoOp<'_>> = writes
            .iter()
            .map(|(off, r)| IoOp::write(*off, &buf[r.clone()], false))
            .collect();
        self.device.submit(&mut ops);
        for op in ops {
            op.result?;
        }
        self.device.flush()?;
        j.head_seq += Journal::blocks_for(entries.len());
        Ok(())
    }

    /// Zeroes extents whose unmap is now durable and makes them allocatable.
    fn release_extents(&self, mut freed: Vec<u32>) -> Result<(), StoreError> {
        if freed.is_empty() {
            return Ok(());
        }
        freed.sort_unstable();
        let es = self.layout.extent_size as u64;
        let mut i = 0;
        while i < freed.len() {
            let mut n = 1;
            while i + n < freed.len() && freed[i + n] == freed[i] + n as u32 {
                n += 1;
            }
            if let Err(e) = self
                .device
                .discard_zeroes(self.layout.extent_offset(freed[i]), n as u64 * es)
            {
                // The extents stay out of the free set; a restart re-zeroes them.
                return Err(self.fail(e.into()));
            }
            i += n;
        }
        let mut m = self.meta.lock();
        for p in freed {
            m.free.release(p);
        }
        Ok(())
    }

    /// Writes every changed table page in place, then advances the journal
    /// tail in the superblock. Called with the journal lock held.
    fn checkpoint_locked(&self, j: &mut Journal, clean: bool) -> Result<(), StoreError> {
        let (pages, mut buf) = {
            let mut m = self.meta.lock();
            let state = &mut m.state;
            let ext: Vec<u64> = std::mem::take(&mut state.dirty_extent_pages)
                .into_iter()
                .collect();
            let vol: Vec<u64> = std::mem::take(&mut state.dirty_slot_pages)
                .into_iter()
                .collect();
            let mut buf = AlignedBuf::zeroed((ext.len() + vol.len()) * PAGE as usize);
            let mut pages = Vec::with_capacity(ext.len() + vol.len());
            for (i, p) in ext.iter().enumerate() {
                state.encode_extent_page(*p, &mut buf[i * PAGE as usize..(i + 1) * PAGE as usize]);
                pages.push(self.layout.extent_table_offset + p * PAGE);
            }
            for (k, p) in vol.iter().enumerate() {
                let i = ext.len() + k;
                state.encode_slot_page(*p, &mut buf[i * PAGE as usize..(i + 1) * PAGE as usize]);
                pages.push(self.layout.volume_table_offset + p * PAGE);
            }
            // Everything queued so far is in these pages.
            m.pending.clear();
            (pages, buf)
        };
        if !pages.is_empty() {
            let mut ops: Vec<IoOp<'_>> = buf
                .chunks_mut(PAGE as usize)
                .zip(&pages)
                .map(|(chunk, off)| IoOp::write(*off, chunk, false))
                .collect();
            self.device.submit(&mut ops);
            for op in ops {
                op.result?;
            }
        }
        self.device.flush()?;
        let mut sb = self.superblock.lock();
        sb.generation = j.generation + 1;
        sb.journal_tail_seq = j.head_seq;
        sb.journal_tail_position = j.head_seq % j.ring_blocks;
        sb.clean = clean;
        buf.set_len(PAGE as usize);
        buf.copy_from_slice(&sb.encode());
        self.device.write_at(
            &buf[..PAGE as usize],
            SUPERBLOCK_COPIES[(sb.generation % 2) as usize],
            false,
        )?;
        self.device.flush()?;
        j.generation = sb.generation;
        j.tail_seq = j.head_seq;
        Ok(())
    }

    /// Clean shutdown: commits, checkpoints and marks the store clean, so the
    /// next open needs no recovery. Later calls to the store fail.
    pub fn close(&self) -> Result<(), StoreError> {
        if self.closed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        self.commit()?;
        let mut j = self.journal.lock();
        let r = self.checkpoint_locked(&mut j, true);
        self.failed.store(true, Ordering::SeqCst);
        tracing::info!("store closed cleanly");
        r
    }

    pub fn usage(&self) -> StoreUsage {
        let m = self.meta.lock();
        let es = self.layout.extent_size as u64;
        let allocated: u64 = m.state.allocated.iter().sum();
        let provisioned = m.state.slots.iter().flatten().map(|s| s.size).sum();
        StoreUsage {
            capacity_bytes: self.layout.capacity_bytes(),
            allocated_bytes: allocated * es,
            provisioned_bytes: provisioned,
            extent_size: es,
            volumes: m.volumes.len() as u64,
        }
    }

    pub fn volumes(&self) -> Vec<VolumeUsage> {
        let m = self.meta.lock();
        let es = self.layout.extent_size as u64;
        let mut v: Vec<VolumeUsage> = m
            .state
            .slots
            .iter()
            .zip(&m.state.allocated)
            .filter_map(|(s, a)| {
                s.map(|s| VolumeUsage {
                    id: s.id,
                    size: s.size,
                    allocated_bytes: a * es,
                    created_unix: s.created_unix,
                })
            })
            .collect();
        v.sort_by_key(|u| u.id);
        v
    }

    fn check_size(&self, size: u64) -> Result<(), StoreError> {
        if size == 0 || !size.is_multiple_of(BLOCK_SIZE) {
            return Err(StoreError::InvalidSize(format!(
                "{size} bytes is not a positive multiple of {BLOCK_SIZE}"
            )));
        }
        if size.div_ceil(self.layout.extent_size as u64) > u32::MAX as u64 {
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
        {
            let mut m = self.meta.lock();
            if m.volumes.contains_key(&id) {
                return Err(StoreError::Exists(id));
            }
            let slot = m
                .state
                .free_slot()
                .ok_or(StoreError::TooManyVolumes(self.layout.volume_slots))?;
            m.push(JournalEntry::CreateVolume {
                slot,
                id,
                size,
                created_unix: now_unix(),
            })?;
            let extents = m.state.extents_for_size(size) as usize;
            m.volumes
                .insert(id, Arc::new(VolumeState::new(id, slot, size, extents)));
        }
        self.commit()
    }

    /// Changes a volume's size; durable on return. Shrinking drops the data
    /// beyond the new end, and a later grow reads zeros there.
    pub fn resize_volume(&self, id: VolumeId, size: u64) -> Result<(), StoreError> {
        self.check_usable()?;
        self.check_size(size)?;
        let vol = self.volume_state(id)?;
        let es = self.layout.extent_size as u64;
        {
            // Exclusive: no I/O may be in flight on extents about to be freed.
            let mut map = vol.map.write();
            let mut m = self.meta.lock();
            let old = vol.size();
            if size < old && !size.is_multiple_of(es) {
                // The tail of the last kept extent must read zeros if grown back.
                if let Some(phys) = map.get((size / es) as usize).and_then(|p| p.get()) {
                    let start = self.layout.extent_offset(phys) + size % es;
                    let end = self.layout.extent_offset(phys) + es;
                    self.device
                        .discard_zeroes(start, end - start)
                        .map_err(|e| self.fail(e.into()))?;
                }
            }
            m.push(JournalEntry::ResizeVolume {
                slot: vol.slot,
                size,
            })?;
            let extents = m.state.extents_for_size(size) as usize;
            map.resize(extents);
            vol.set_size(size);
        }
        self.commit()
    }

    /// Deletes a volume and frees its extents; durable on return. Open
    /// handles get `IoError::Gone` afterwards.
    pub fn delete_volume(&self, id: VolumeId) -> Result<(), StoreError> {
        self.check_usable()?;
        let vol = self.volume_state(id)?;
        {
            let mut map = vol.map.write();
            let mut m = self.meta.lock();
            m.push(JournalEntry::DeleteVolume { slot: vol.slot })?;
            m.volumes.remove(&id);
            vol.mark_deleted();
            map.resize(0);
        }
        self.commit()
    }

    fn volume_state(&self, id: VolumeId) -> Result<Arc<VolumeState>, StoreError> {
        self.meta
            .lock()
            .volumes
            .get(&id)
            .cloned()
            .ok_or(StoreError::NotFound(id))
    }

    /// A data-path handle to a volume.
    pub fn volume(self: &Arc<Self>, id: VolumeId) -> Result<LocalVolume, StoreError> {
        Ok(LocalVolume::new(self.clone(), self.volume_state(id)?))
    }

    pub fn extent_size(&self) -> u64 {
        self.layout.extent_size as u64
    }

    /// Extents allocated to the volume in `slot` (slots count from 1; 0
    /// for an unused slot).
    pub(crate) fn allocated_extents(&self, slot: u32) -> u64 {
        let m = self.meta.lock();
        (slot as usize)
            .checked_sub(1)
            .and_then(|i| m.state.allocated.get(i))
            .copied()
            .unwrap_or(0)
    }

    pub fn store_id(&self) -> uuid::Uuid {
        self.superblock.lock().store_id
    }

    /// Takes a zeroed free extent and maps it at `logical` of the volume in
    /// `slot`, unless another writer mapped `entry` first. Called with the
    /// volume's map lock held.
    pub(crate) fn allocate(
        &self,
        slot: u32,
        logical: u32,
        entry: &MapEntry,
    ) -> Result<u32, StoreError> {
        for attempt in 0..2 {
            {
                let mut m = self.meta.lock();
                if let Some(phys) = entry.get() {
                    return Ok(phys);
                }
                if let Some(phys) = m.free.take() {
                    m.push(JournalEntry::Map {
                        phys,
                        slot,
                        logical,
                    })?;
                    entry.set(Some(phys));
                    return Ok(phys);
                }
                if attempt == 1 || m.pending_free.is_empty() {
                    break;
                }
            }
            // Extents are waiting for their unmap to be durable: commit.
            self.commit()?;
        }
        Err(StoreError::NoSpace)
    }
}
