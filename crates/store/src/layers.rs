//! Layers: snapshots, clones, rollback, flattening and snapshot deletion,
//! and the space each layer holds. A snapshot freezes a volume's layer where it
//! stands (its extents do not move) and gives the volume a new, empty
//! layer over it; a clone is a new volume whose layer starts empty over a
//! snapshot. Blocks are tracked per 4 KiB (`presence.rs`), so the first
//! write to a block after a snapshot writes that block, not its extent.
//!
//! Invariants:
//! - Every change of a layer's place (slot, parent) happens with that
//!   layer's map locked exclusively, child before parent, and is one
//!   journal entry (`Snapshot` is two slots wide, never split), so no
//!   reader and no crash sees half of it.
//! - Deleting a snapshot with one child merges it into the child without
//!   changing what the child reads at any moment: blocks the child lacks
//!   are copied into the child's extents (durable before their presence,
//!   `Store::commit`), extents only the snapshot has move to the child
//!   (with every block present if the snapshot had no parent), and only
//!   then is the snapshot unlinked. The snapshot is retired first (a
//!   journaled flag): half merged, it no longer reads what it held, so no
//!   one may read it, and the open after a stop finishes the merge.
//! - Flattening copies into a layer, extent by extent under its map lock,
//!   the blocks it reads through its parents (present once durable, as
//!   above); it is detached only once it holds every block it reads. The
//!   layer is a volume's head (`flatten`), or, to detach a clone and its
//!   snapshots from their source, the oldest layer of the volume's own
//!   (`flatten_source`): a snapshot then holds more blocks, never other
//!   content.
//! - One layer operation runs at a time (`Store::layer_ops`); flattening
//!   takes it only to detach.
//! - A merge or a flatten takes a layer's map lock extent by extent and
//!   hands it over fairly after each, so I/O waiting for it goes first.

use crate::buf::AlignedBuf;
use crate::engine::{now_unix, Store};
use crate::error::{IoError, StoreError};
use crate::format::JournalEntry;
use crate::layer_map::{stack_states, LayerGuard, LayerMap, VolumeState};
use crate::{VolumeId, BLOCK_SIZE};
use basalt_crypt::BlockCipher;
use std::sync::Arc;

/// The layers a flattened volume reads through, for `read_through`.
struct Through<'a> {
    below: &'a LayerGuard,
    rest: &'a [LayerGuard],
    /// The volume's cipher.
    cipher: Option<&'a BlockCipher>,
    /// Of a re-encrypted volume: each layer's (`stack_states` order);
    /// empty when all share the volume's.
    keys: &'a [Option<Arc<BlockCipher>>],
    /// The volume's block the extent read starts at.
    first_block: u64,
}

/// What `copy_missing_blocks` writes into the blocks a layer lacks.
enum Source<'a> {
    /// The blocks of another extent (a snapshot's; `bottom`: it has no
    /// parent, so it holds every block; `cipher`: the snapshot's, should
    /// the extent be an encrypted volume's packed one).
    Extent {
        phys: u32,
        bottom: bool,
        cipher: Option<&'a BlockCipher>,
        /// The layer written to has another key (a re-encrypted volume's):
        /// reseal each block for it; the extent is the volume's logical
        /// extent starting at this block.
        reseal: Option<(Option<&'a BlockCipher>, u64)>,
    },
    /// Zeros.
    Zeros,
    /// The buffer already holds the whole extent's content.
    Filled,
}

/// The oldest layer of volume `head`'s own: its oldest snapshot that its
/// head reaches through its own snapshots only, or the head. A snapshot
/// being merged away (retired) is passed over: its child takes its place.
fn oldest_own_layer(head: &Arc<VolumeState>) -> Arc<VolumeState> {
    let mut oldest = head.clone();
    let mut next = head.map.read().parent.clone();
    while let Some(layer) = next.filter(|l| l.snapshot_of == Some(head.id)) {
        next = layer.map.read().parent.clone();
        if !layer.is_retired() {
            oldest = layer;
        }
    }
    oldest
}

/// The first layer below volume `head`'s own (its clone source), if any.
fn source_layer(head: &Arc<VolumeState>) -> Option<Arc<VolumeState>> {
    let mut next = head.map.read().parent.clone();
    while let Some(layer) = next {
        if layer.snapshot_of != Some(head.id) {
            return Some(layer);
        }
        next = layer.map.read().parent.clone();
    }
    None
}

/// What `Store::flatten` did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlattenReport {
    /// 4 KiB blocks copied into the clone (or zeroed in it).
    pub copied_blocks: u64,
    /// The clone no longer reads through a parent.
    pub detached: bool,
}

/// One snapshot and the space it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotUsage {
    pub id: VolumeId,
    /// The volume it was taken of.
    pub volume: VolumeId,
    pub size: u64,
    pub created_unix: u64,
    /// The older snapshot it reads through, if any.
    pub parent: Option<VolumeId>,
    /// Layers reading through it: its volume's newer layer and clones.
    pub children: Vec<VolumeId>,
    /// Bytes of blocks written while this layer was the volume's head.
    pub written_bytes: u64,
    /// Bytes of those that no child reads any more (every child wrote the
    /// block since): what deleting the snapshot frees, at 4 KiB.
    pub exclusive_bytes: u64,
}

impl Store {
    fn require_layers(&self) -> Result<(), StoreError> {
        self.check_usable()?;
        if self.presence.is_none() {
            return Err(StoreError::NoLayers);
        }
        Ok(())
    }

    /// A snapshot that is not being deleted.
    fn snapshot_state(&self, id: VolumeId) -> Result<Arc<VolumeState>, StoreError> {
        let s = self.volume_state(id)?;
        if s.is_retired() {
            return Err(StoreError::NotFound(id));
        }
        if !s.is_snapshot() {
            return Err(StoreError::Layers(format!(
                "{id} is a volume, not a snapshot"
            )));
        }
        Ok(s)
    }

    /// Layers whose parent is `layer`.
    fn children_of(&self, layer: &Arc<VolumeState>) -> Vec<Arc<VolumeState>> {
        let all: Vec<Arc<VolumeState>> = self.meta.lock().volumes.values().cloned().collect();
        all.into_iter()
            .filter(|v| {
                v.map
                    .read()
                    .parent
                    .as_ref()
                    .is_some_and(|p| Arc::ptr_eq(p, layer))
            })
            .collect()
    }

    /// Takes snapshot `snap` of `volume`: crash-consistent (every write
    /// completed before the call is in it), read-only, durable on return.
    /// Client I/O on the volume pauses only while in-flight requests drain
    /// and the entry is queued; the commit runs after.
    pub fn snapshot(&self, volume: VolumeId, snap: VolumeId) -> Result<(), StoreError> {
        self.require_layers()?;
        let _op = self.layer_ops.lock();
        let vol = self.volume_state(volume)?;
        if vol.is_snapshot() {
            return Err(StoreError::Layers(format!(
                "{volume} is a snapshot; snapshots of snapshots are taken by cloning first"
            )));
        }
        self.freeze_head(&vol, &mut vol.map.write(), snap)?;
        tracing::info!(%volume, snapshot = %snap, "snapshot taken");
        self.commit()
    }

    /// Queues snapshot `snap` of volume `vol`, whose map the caller holds
    /// exclusively as `map`: its layer becomes the snapshot, the volume
    /// goes on in a new empty layer over it. Durable with the next commit.
    pub(crate) fn freeze_head(
        &self,
        vol: &Arc<VolumeState>,
        map: &mut LayerMap,
        snap: VolumeId,
    ) -> Result<(), StoreError> {
        if vol.is_deleted() {
            return Err(StoreError::NotFound(vol.id));
        }
        let mut m = self.meta.lock();
        if m.volumes.contains_key(&snap) {
            return Err(StoreError::Exists(snap));
        }
        let new_slot = m
            .free_slot()
            .ok_or(StoreError::TooManyVolumes(self.layout.volume_slots))?;
        let now = now_unix();
        let size = vol.size();
        let frozen = std::mem::replace(map, LayerMap::new(new_slot, 0));
        map.resize(frozen.len());
        let old_slot = frozen.slot;
        let snapshot = Arc::new(VolumeState::with_map(snap, size, now, frozen, Some(vol.id)));
        snapshot.set_last_scrub(vol.last_scrub());
        map.parent = Some(snapshot.clone());
        vol.reset_allocated();
        m.push(JournalEntry::Snapshot {
            slot: old_slot,
            new_slot,
            snap_id: snap,
            snap_created: now,
            size,
            vol_id: vol.id,
            vol_created: vol.created_unix,
            last_scrub: vol.last_scrub(),
        });
        m.slots_used[new_slot as usize - 1] = true;
        m.volumes.insert(snap, snapshot);
        // Every first write to an extent of the new layer maps one: have
        // a batch reserved by this commit, so that the writes right
        // after the snapshot do not each wait for a commit of their own.
        if m.reserved.len() + m.reserving.len() < m.reserve_batch as usize {
            Self::reserve_batch(&mut m);
        }
        Ok(())
    }

    /// Creates volume `id` as a clone of snapshot `snap`: it reads the
    /// snapshot's content and writes its own blocks. `size`: at least the
    /// snapshot's (default: the same). Durable on return; nothing is copied.
    pub fn clone_snapshot(
        &self,
        snap: VolumeId,
        id: VolumeId,
        size: Option<u64>,
    ) -> Result<(), StoreError> {
        self.require_layers()?;
        let _op = self.layer_ops.lock();
        let parent = self.snapshot_state(snap)?;
        let size = size.unwrap_or(parent.size());
        self.check_size(size)?;
        if size < parent.size() {
            return Err(StoreError::InvalidSize(format!(
                "a clone of a {} byte snapshot cannot have {size} bytes",
                parent.size()
            )));
        }
        if self.meta.lock().volumes.contains_key(&id) {
            return Err(StoreError::Exists(id));
        }
        // An encrypted snapshot's clone has its key before it exists.
        let inherited = self.inherit_key(&parent, id)?;
        {
            // Held while the clone is queued: the parent cannot be merged
            // away meanwhile.
            let pmap = parent.map.read();
            let added = self.add_layer(&mut self.meta.lock(), id, size, Some((&parent, pmap.slot)));
            if let Err(e) = added {
                if inherited.is_some() {
                    self.shred_key(id)?;
                }
                return Err(e);
            }
        }
        tracing::info!(snapshot = %snap, clone = %id, "clone created");
        self.commit()?;
        if let Some(cipher) = inherited {
            self.set_inherited_cipher(id, cipher);
        }
        Ok(())
    }

    /// Makes `volume` read exactly what its snapshot `snap` holds (size
    /// included); its blocks written since are freed. `snap` may also be
    /// the snapshot the volume was cloned from (`Store::clone_source`).
    /// Durable on return.
    pub fn rollback(&self, volume: VolumeId, snap: VolumeId) -> Result<(), StoreError> {
        self.require_layers()?;
        let _op = self.layer_ops.lock();
        let s = self.snapshot_state(snap)?;
        let vol = self.volume_state(volume)?;
        // Its own snapshot, or the one it was cloned from (a replica's
        // rebuild from its clone source).
        let source = source_layer(&vol);
        if s.snapshot_of != Some(volume) && !source.is_some_and(|p| Arc::ptr_eq(&p, &s)) {
            return Err(StoreError::Layers(format!(
                "{snap} is not a snapshot of volume {volume}"
            )));
        }
        {
            // The volume is never below the snapshot: child before parent.
            let mut map = vol.map.write();
            let smap = s.map.read();
            let size = s.size();
            self.meta.lock().push(JournalEntry::Rollback {
                slot: map.slot,
                parent: smap.slot,
                size,
            });
            vol.forget_mapped_from(&map, 0);
            map.resize(0);
            map.resize(self.layout.extents_for_size(size) as usize);
            map.parent = Some(s.clone());
            vol.set_size(size);
        }
        tracing::info!(%volume, snapshot = %snap, "volume rolled back");
        self.commit()
    }

    /// Deletes snapshot `snap`, freeing what no other layer needs. With no
    /// layer reading through it, its extents are freed; with one (its
    /// volume's next layer, or a single clone), it is merged into that
    /// layer first; with more (clones), it is refused.
    pub fn delete_snapshot(&self, snap: VolumeId) -> Result<(), StoreError> {
        self.delete_snapshot_paced(snap, None)
    }

    /// [`Store::delete_snapshot`], its merge copying at most `rate` bytes
    /// per second (blocks copied; extents handed over whole cost no I/O),
    /// so that client writes beside it keep the disk: what a replica's
    /// deletion does, like its resync copies.
    pub fn delete_snapshot_paced(
        &self,
        snap: VolumeId,
        rate: Option<u64>,
    ) -> Result<(), StoreError> {
        self.delete_snapshot_layer(snap, rate)?;
        // A key of its own, if it had one, goes with it.
        self.shred_key(snap)
    }

    fn delete_snapshot_layer(&self, snap: VolumeId, rate: Option<u64>) -> Result<(), StoreError> {
        self.require_layers()?;
        let _op = self.layer_ops.lock();
        let s = self.volume_state(snap)?;
        if !s.is_snapshot() {
            return Err(StoreError::Layers(format!(
                "{snap} is a volume, not a snapshot"
            )));
        }
        let children = self.children_of(&s);
        match children.as_slice() {
            [] => {
                {
                    let mut map = s.map.write();
                    let mut m = self.meta.lock();
                    m.push(JournalEntry::DeleteVolume { slot: map.slot });
                    m.volumes.remove(&snap);
                    m.slots_used[map.slot as usize - 1] = false;
                    s.mark_deleted();
                    map.resize(0);
                    map.parent = None;
                }
                self.commit()
            }
            [child] => self.merge_into_child(&s, child, rate),
            more => Err(StoreError::Layers(format!(
                "snapshot {snap} has {} layers reading through it (clones); delete those clones first",
                more.len()
            ))),
        }
    }

    /// Finishes deleting the snapshots a stop interrupted: at open, and
    /// again once encrypted volumes are unlocked ([`Store::unlock_volume`])
    /// for those whose merge reads or writes a layer under a key (it
    /// cannot run before: a retired snapshot is never read, and its child
    /// reads what it did, so waiting costs only space).
    pub fn finish_snapshot_deletions(&self) -> Result<(), StoreError> {
        let retired: Vec<VolumeId> = self
            .meta
            .lock()
            .volumes
            .values()
            .filter(|v| v.is_retired())
            .map(|v| v.id)
            .collect();
        for id in retired {
            tracing::info!(snapshot = %id, "finishing the deletion of a snapshot a stop interrupted");
            match self.delete_snapshot(id) {
                Err(StoreError::Locked(layer)) => {
                    tracing::info!(snapshot = %id, %layer, "the deletion finishes once the layer's key is loaded");
                }
                other => other?,
            }
        }
        Ok(())
    }

    /// Merges snapshot `s` into its only child `c`, extent by extent, then
    /// unlinks it (see the module invariants). The snapshot is retired
    /// first: a merge half done changes what it reads (never what the
    /// child reads), so after a stop nobody may read it, and the open
    /// finishes the merge.
    fn merge_into_child(
        &self,
        s: &Arc<VolumeState>,
        c: &Arc<VolumeState>,
        rate: Option<u64>,
    ) -> Result<(), StoreError> {
        let pacer = crate::Pacer::new(rate);
        let presence = self.presence.as_ref().ok_or(StoreError::NoLayers)?;
        // Its packed extents of an encrypted volume are read through it
        // (so its key must be loaded).
        let s_cipher = self.cipher_of(s)?;
        // A re-encrypted volume's child may be under another key: its
        // extents are then resealed block by block, never handed over.
        let c_cipher = self.cipher_of(c)?;
        let recrypt = !crate::keys::same_key(&s_cipher, &c_cipher);
        {
            let smap = s.map.write();
            s.retire();
            self.meta
                .lock()
                .push(JournalEntry::Retire { slot: smap.slot });
        }
        let bpe = self.layout.blocks_per_extent();
        let extents = s.map.read().len().max(c.map.read().len());
        let mut buf = AlignedBuf::zeroed(self.layout.extent_size as usize);
        let (mut moved, mut copied) = (0u64, 0u64);
        for logical in 0..extents {
            let cmap = c.map.write();
            let smap = s.map.write();
            let s_root = smap.parent.is_none();
            let mut entries = Vec::new();
            let mut child = cmap.phys(logical);
            if let (true, Some(_), None, Some(entry)) =
                (recrypt, smap.phys(logical), child, cmap.get(logical))
            {
                child = Some(self.allocate(c, cmap.slot, logical as u32, entry)?);
            }
            match (smap.phys(logical), child) {
                (None, None) => continue,
                // Blocks the child lacks read through the snapshot, which
                // holds none here: zeros if it is the bottom layer. The
                // child becomes the bottom layer and reads every block of
                // its extent, and a block it lacks may hold a write whose
                // presence a crash lost: write the zeros.
                (None, Some(cphys)) if s_root => {
                    copied +=
                        self.copy_missing_blocks(Source::Zeros, cphys, &mut buf, &mut entries)?;
                }
                (None, Some(_)) => continue,
                (Some(sphys), None) => {
                    // The child takes the extent. Without a parent the
                    // snapshot held every block of it: say so, since the
                    // child has a parent and reads by presence.
                    if s_root {
                        presence.mark(sphys as u64 * bpe, bpe, &mut entries);
                    }
                    entries.push(JournalEntry::Map {
                        phys: sphys,
                        slot: cmap.slot,
                        logical: logical as u32,
                    });
                    if let Some(intent) = &self.intent {
                        intent.mapped(sphys);
                    }
                    if let Some(e) = cmap.get(logical) {
                        e.set(Some(sphys));
                    }
                    if let Some(e) = smap.get(logical) {
                        e.set(None);
                    }
                    c.add_allocated(1);
                    s.remove_allocated(1);
                    moved += 1;
                }
                (Some(sphys), Some(cphys)) => {
                    let from = Source::Extent {
                        phys: sphys,
                        bottom: s_root,
                        cipher: s_cipher.as_deref(),
                        reseal: recrypt.then(|| (c_cipher.as_deref(), logical as u64 * bpe)),
                    };
                    copied += self.copy_missing_blocks(from, cphys, &mut buf, &mut entries)?;
                    entries.push(JournalEntry::Free {
                        first: sphys,
                        count: 1,
                    });
                    if let Some(e) = smap.get(logical) {
                        e.set(None);
                    }
                    s.remove_allocated(1);
                }
            }
            {
                let mut m = self.meta.lock();
                for e in entries {
                    m.push(e);
                }
            }
            // Handed to the I/O waiting for them: this loop takes them again
            // at once for the next extent, and would otherwise keep writes
            // to the child out for the whole merge (seconds).
            parking_lot::RwLockWriteGuard::unlock_fair(smap);
            parking_lot::RwLockWriteGuard::unlock_fair(cmap);
            pacer.wait(copied * BLOCK_SIZE);
        }
        {
            let mut cmap = c.map.write();
            let mut smap = s.map.write();
            let parent_slot = smap.parent.as_ref().map_or(0, |p| p.map.read().slot);
            let mut m = self.meta.lock();
            m.push(JournalEntry::Unlink {
                slot: smap.slot,
                child: cmap.slot,
                parent: parent_slot,
            });
            m.volumes.remove(&s.id);
            m.slots_used[smap.slot as usize - 1] = false;
            s.mark_deleted();
            cmap.parent = smap.parent.take();
            smap.resize(0);
        }
        tracing::info!(snapshot = %s.id, into = %c.id, moved_extents = moved, copied_blocks = copied, "snapshot merged into its child and deleted");
        self.commit()
    }

    /// Writes into extent `cphys` (of a layer whose map is locked
    /// exclusively, as is the source's) every block it lacks that `from`
    /// provides, and queues their presence; the number written.
    fn copy_missing_blocks(
        &self,
        from: Source<'_>,
        cphys: u32,
        buf: &mut AlignedBuf,
        entries: &mut Vec<JournalEntry>,
    ) -> Result<u64, StoreError> {
        let presence = self.presence.as_ref().ok_or(StoreError::NoLayers)?;
        let bpe = self.layout.blocks_per_extent();
        let cfirst = cphys as u64 * bpe;
        let wanted: Vec<u64> = (0..bpe)
            .filter(|&j| !presence.is_present(cfirst + j))
            .filter(|&j| match from {
                Source::Extent { phys, bottom, .. } => {
                    bottom || presence.is_present(phys as u64 * bpe + j)
                }
                Source::Zeros | Source::Filled => true,
            })
            .collect();
        if wanted.is_empty() {
            return Ok(0);
        }
        match from {
            Source::Extent {
                phys,
                cipher,
                reseal,
                ..
            } => {
                self.read_extent_verified(phys, buf, cipher)?;
                if let Some((to, first_block)) = reseal {
                    crate::rekey::reseal(buf, first_block, cipher, to)?;
                }
            }
            Source::Zeros => buf.fill(0),
            Source::Filled => {}
        }
        self.heat(cphys)?;
        let bs = BLOCK_SIZE as usize;
        let to = self.layout.extent_offset(cphys);
        // Consecutive wanted blocks go out as one write.
        let mut k = 0;
        while k < wanted.len() {
            let mut n = 1;
            while k + n < wanted.len() && wanted[k + n] == wanted[k] + n as u64 {
                n += 1;
            }
            let j = wanted[k] as usize;
            let data = &buf[j * bs..(j + n) * bs];
            let mut crcs = Vec::new();
            if let Some(sums) = &self.checksums {
                sums.begin_writes(cfirst + j as u64, data, &mut crcs);
            }
            let r = self.device.write_at(data, to + (j * bs) as u64, false);
            if let Some(sums) = &self.checksums {
                sums.end_writes(cfirst + j as u64, &crcs, r.is_ok());
            }
            r.map_err(|e| self.fail(e.into()))?;
            presence.mark(cfirst + j as u64, n as u64, entries);
            k += n;
        }
        Ok(wanted.len() as u64)
    }

    /// Copies into volume `id` (a clone, or a volume over its snapshots)
    /// every block of `range` it reads through its parent layers, so that
    /// it no longer needs them; once a call covers the volume's end and
    /// nothing is left to copy, the volume is detached from its parent.
    /// Its own snapshots keep reading through theirs. Client I/O goes on:
    /// each extent is copied under the volume's map lock, at most `rate`
    /// bytes per second; `progress(done, total)` after each. A stop in
    /// between loses nothing: copied blocks are present, the rest still
    /// read through the parent.
    pub fn flatten(
        &self,
        id: VolumeId,
        range: std::ops::Range<u64>,
        rate: Option<u64>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<FlattenReport, StoreError> {
        let head = self.flattened_head(id)?;
        self.flatten_layers(&head, &|| head.clone(), range, rate, progress)
    }

    /// Detaches volume `id` and its snapshots from the snapshot it was
    /// cloned from (what Ceph calls a deep flatten): copies into the
    /// oldest layer of the volume's own (its oldest snapshot, or its head
    /// if it has none) every block of `range` that layer reads through
    /// the source, and detaches that layer once a call covers the
    /// volume's end and nothing is left to copy. The volume and each of
    /// its snapshots read what they read before, throughout; only the
    /// oldest layer holds more. As [`Store::flatten`] otherwise. A
    /// snapshot taken or deleted meanwhile moves the copying to the
    /// layer that is then the oldest.
    pub fn flatten_source(
        &self,
        id: VolumeId,
        range: std::ops::Range<u64>,
        rate: Option<u64>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<FlattenReport, StoreError> {
        let head = self.flattened_head(id)?;
        let mut report =
            self.flatten_layers(&head, &|| oldest_own_layer(&head), range, rate, progress)?;
        // Detached, the layer may have stopped being the oldest (a
        // snapshot deleted meanwhile merged it away).
        report.detached = report.detached && self.clone_source(id)?.is_none();
        Ok(report)
    }

    /// The layer volume `id`'s oldest layer reads through (its oldest
    /// snapshot's parent, or its head's if it has none): the snapshot it
    /// was cloned from, or none.
    pub fn clone_source(&self, id: VolumeId) -> Result<Option<VolumeId>, StoreError> {
        let head = self.volume_state(id)?;
        Ok(source_layer(&head).map(|s| s.id))
    }

    fn flattened_head(&self, id: VolumeId) -> Result<Arc<VolumeState>, StoreError> {
        self.require_layers()?;
        let head = self.volume_state(id)?;
        if head.is_snapshot() {
            return Err(StoreError::Layers(format!(
                "{id} is a snapshot; flatten a clone of it"
            )));
        }
        Ok(head)
    }

    /// The loop of [`Store::flatten`] and [`Store::flatten_source`]:
    /// copies, extent by extent of `range` (bytes of volume `head`), into
    /// the layer `target()` names at that moment the blocks it reads
    /// through its parents, then detaches that layer if the range reached
    /// the volume's end.
    fn flatten_layers(
        &self,
        head: &Arc<VolumeState>,
        target: &dyn Fn() -> Arc<VolumeState>,
        range: std::ops::Range<u64>,
        rate: Option<u64>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<FlattenReport, StoreError> {
        let mut report = FlattenReport::default();
        let es = self.layout.extent_size as u64;
        let first = range.start / es;
        let last = range.end.min(head.size()).div_ceil(es);
        let mut buf = AlignedBuf::zeroed(es as usize);
        let pacer = crate::Pacer::new(rate);
        let mut copied_bytes = 0u64;
        let bpe = self.layout.blocks_per_extent();
        let mut logical = first;
        while logical < last {
            let layer = target();
            let mut entries = Vec::new();
            {
                let map = layer.map.write();
                if head.is_deleted() {
                    return Err(StoreError::NotFound(head.id));
                }
                if layer.is_deleted() {
                    // Merged into its child meanwhile: copy into that.
                    continue;
                }
                // Without its key, only packed blocks of an encrypted
                // layer fail.
                let cipher = self.cipher_of(&layer).ok().flatten();
                let ancestors = VolumeState::lock_ancestors(&map);
                // Of a re-encrypted volume: the key of each layer, to
                // reseal what it reads through them.
                let keys = match self.stacks_may_mix_keys() {
                    true => self.stack_ciphers(&stack_states(&layer, &map, &ancestors), &cipher)?,
                    false => Vec::new(),
                };
                let Some((below, rest)) = ancestors.split_first() else {
                    break; // nothing to read through
                };
                let l = logical as usize;
                let from_parents = ancestors.iter().any(|g| g.phys(l).is_some());
                let copied = match (from_parents, map.phys(l)) {
                    (false, None) => 0,
                    // A snapshot shorter than the volume reads nothing here.
                    (true, None) if l >= map.len() => 0,
                    // The blocks it lacks read as zeros now; once it is the
                    // bottom layer it reads them raw (docs/format.md, rule 12).
                    (false, Some(cphys)) => {
                        self.copy_missing_blocks(Source::Zeros, cphys, &mut buf, &mut entries)?
                    }
                    (true, phys) => {
                        let cphys = match phys {
                            Some(p) => p,
                            None => {
                                let entry = map.get(l).ok_or(StoreError::NotFound(layer.id))?;
                                self.allocate(&layer, map.slot, logical as u32, entry)?
                            }
                        };
                        let through = Through {
                            below,
                            rest,
                            cipher: cipher.as_deref(),
                            keys: &keys,
                            first_block: logical * bpe,
                        };
                        self.read_through(&through, l, &mut buf)?;
                        self.copy_missing_blocks(Source::Filled, cphys, &mut buf, &mut entries)?
                    }
                };
                report.copied_blocks += copied;
                copied_bytes += copied * BLOCK_SIZE;
                {
                    let mut m = self.meta.lock();
                    for e in entries {
                        m.push(e);
                    }
                }
                // Handed to the I/O waiting (see `merge_into_child`).
                drop(ancestors);
                parking_lot::RwLockWriteGuard::unlock_fair(map);
            }
            logical += 1;
            progress((logical - first) * es, (last - first) * es);
            pacer.wait(copied_bytes);
        }
        if range.end >= head.size() {
            report.detached = self.detach(&target())?;
        }
        self.commit()?;
        Ok(report)
    }

    /// Reads logical extent `logical` as the layers below a volume show it
    /// (zeros where none holds a block) into `buf`, every block read
    /// verified and, of a re-encrypted volume, sealed for the volume.
    fn read_through(
        &self,
        through: &Through<'_>,
        logical: usize,
        buf: &mut AlignedBuf,
    ) -> Result<(), StoreError> {
        let bs = BLOCK_SIZE as usize;
        let blocks = buf.len() / bs;
        let resolve = |j: usize| {
            crate::layer_map::resolve_layer(
                self,
                through.below,
                through.rest,
                logical,
                (j * bs) as u64,
            )
        };
        let mut j = 0;
        while j < blocks {
            let first = resolve(j);
            // A run of blocks read from one place (contiguous on the
            // device, so one extent of one layer): one read, not one per
            // block, so the volume's map is held briefly.
            let mut n = 1;
            while j + n < blocks {
                let contiguous = match (first, resolve(j + n)) {
                    (Some((a, _)), Some((b, _))) => b == a + (n * bs) as u64,
                    (None, None) => true,
                    _ => false,
                };
                if !contiguous {
                    break;
                }
                n += 1;
            }
            let span = &mut buf[j * bs..(j + n) * bs];
            let Some((at, k)) = first else {
                span.fill(0);
                j += n;
                continue;
            };
            // `keys[0]` is the volume's; layer `k` below it is `keys[k + 1]`.
            let from = match through.keys.get(k + 1) {
                Some(c) => c.as_deref(),
                None => through.cipher,
            };
            self.read_span_verified(at, span, from)
                .and_then(|()| {
                    if through.keys.is_empty() {
                        return Ok(());
                    }
                    crate::rekey::reseal(span, through.first_block + j as u64, from, through.cipher)
                        .map_err(|e| IoError::Io(std::io::Error::other(e.to_string())))
                })
                .map_err(|e| match e {
                    IoError::Corrupt { offset } => StoreError::Layers(format!(
                        "cannot copy the parent's data: its block at device offset {offset} fails its checksum"
                    )),
                    IoError::Io(e) => StoreError::Io(e),
                    other => StoreError::Layers(other.to_string()),
                })?;
            j += n;
        }
        Ok(())
    }

    /// Detaches `vol` from its parent if it holds every block it reads:
    /// whether it did (or had no parent).
    fn detach(&self, vol: &Arc<VolumeState>) -> Result<bool, StoreError> {
        let presence = self.presence.as_ref().ok_or(StoreError::NoLayers)?;
        let bpe = self.layout.blocks_per_extent();
        let _op = self.layer_ops.lock();
        let mut map = vol.map.write();
        if vol.is_deleted() {
            return Ok(false); // merged away: its child holds what it did
        }
        if map.parent.is_none() {
            return Ok(true);
        }
        {
            let ancestors = VolumeState::lock_ancestors(&map);
            let complete = (0..map.len()).all(|l| {
                let needed = map.phys(l).is_some() || ancestors.iter().any(|g| g.phys(l).is_some());
                !needed
                    || map.phys(l).is_some_and(|p| {
                        (p as u64 * bpe..(p as u64 + 1) * bpe).all(|b| presence.is_present(b))
                    })
            });
            if !complete {
                return Ok(false);
            }
        }
        self.meta.lock().push(JournalEntry::Reparent {
            slot: map.slot,
            parent: 0,
        });
        map.parent = None;
        tracing::info!(volume = %vol.id, "flattened: the volume no longer reads through a snapshot");
        Ok(true)
    }

    /// Every snapshot in the store, with the space it holds.
    pub fn snapshots(&self) -> Vec<SnapshotUsage> {
        let all: Vec<Arc<VolumeState>> = self.meta.lock().volumes.values().cloned().collect();
        let mut out: Vec<SnapshotUsage> = all
            .iter()
            .filter(|v| v.is_snapshot() && !v.is_retired())
            .map(|s| {
                let children: Vec<&Arc<VolumeState>> = all
                    .iter()
                    .filter(|v| {
                        v.map
                            .read()
                            .parent
                            .as_ref()
                            .is_some_and(|p| Arc::ptr_eq(p, s))
                    })
                    .collect();
                let (written, exclusive) = self.layer_blocks(s, &children);
                SnapshotUsage {
                    id: s.id,
                    volume: s.snapshot_of.unwrap_or_default(),
                    size: s.size(),
                    created_unix: s.created_unix,
                    parent: s.map.read().parent.as_ref().map(|p| p.id),
                    children: children.iter().map(|c| c.id).collect(),
                    written_bytes: written * BLOCK_SIZE,
                    exclusive_bytes: exclusive * BLOCK_SIZE,
                }
            })
            .collect();
        out.sort_by_key(|s| (s.volume, s.created_unix, s.id));
        out
    }

    /// Blocks `layer` holds, and those of them no child reads.
    fn layer_blocks(&self, layer: &VolumeState, children: &[&Arc<VolumeState>]) -> (u64, u64) {
        let Some(presence) = &self.presence else {
            return (0, 0);
        };
        let bpe = self.layout.blocks_per_extent();
        // Child before parent (the lock order of every layer operation).
        let child_maps: Vec<_> = children.iter().map(|c| c.map.read()).collect();
        let map = layer.map.read();
        let root = map.parent.is_none();
        let (mut written, mut exclusive) = (0, 0);
        for logical in 0..map.len() {
            let Some(phys) = map.phys(logical) else {
                continue;
            };
            let child_phys: Vec<Option<u32>> = child_maps.iter().map(|c| c.phys(logical)).collect();
            for j in 0..bpe {
                if !root && !presence.is_present(phys as u64 * bpe + j) {
                    continue;
                }
                written += 1;
                let shadowed = child_phys
                    .iter()
                    .all(|p| p.is_some_and(|p| presence.is_present(p as u64 * bpe + j)));
                if shadowed {
                    exclusive += 1;
                }
            }
        }
        (written, exclusive)
    }
}
