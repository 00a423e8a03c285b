//! One layer of a volume at runtime (`VolumeState`): its logical→physical
//! extent map, its place in the stack of layers (slot, parent), its size
//! and counters; and `resolve`, which finds where a block of a stack of
//! layers is read from.
//!
//! Invariants:
//! - A layer's map lock guards its map and its place: the data path holds
//!   it shared for a whole batch (including the device I/O), anything that
//!   unmaps extents or moves the layer holds it exclusively.
//! - Map locks are taken child before parent (`lock_ancestors`).
//! - A layer with a parent holds the blocks of its extents whose presence
//!   bit is set; the bottom layer holds every block of its mapped extents.

use crate::engine::Store;
use crate::VolumeId;
use parking_lot::lock_api::ArcRwLockReadGuard;
use parking_lot::{RawRwLock, RwLock};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// One logical extent's physical location (stored as phys + 1; 0 = unmapped).
#[derive(Default)]
pub(crate) struct MapEntry(AtomicU32);

impl MapEntry {
    pub fn get(&self) -> Option<u32> {
        self.0.load(Ordering::Acquire).checked_sub(1)
    }
    pub fn set(&self, phys: Option<u32>) {
        self.0.store(phys.map_or(0, |p| p + 1), Ordering::Release);
    }
}

/// One layer's logical→physical extent map, and where the layer sits: its
/// volume-table slot and the layer below it.
pub(crate) struct LayerMap {
    pub slot: u32,
    /// Read where this layer holds no data; `None`: this layer holds every
    /// block of its mapped extents, and unmapped ones read as zeros.
    pub parent: Option<Arc<VolumeState>>,
    extents: Vec<MapEntry>,
}

impl LayerMap {
    pub fn new(slot: u32, extents: usize) -> LayerMap {
        let mut map = LayerMap {
            slot,
            parent: None,
            extents: Vec::new(),
        };
        map.resize(extents);
        map
    }
    pub fn get(&self, logical: usize) -> Option<&MapEntry> {
        self.extents.get(logical)
    }
    pub fn len(&self) -> usize {
        self.extents.len()
    }
    pub fn resize(&mut self, extents: usize) {
        self.extents.resize_with(extents, MapEntry::default);
    }
    /// The physical extent holding `logical`, if mapped.
    pub fn phys(&self, logical: usize) -> Option<u32> {
        self.get(logical).and_then(MapEntry::get)
    }
}

/// A read lock on one layer's map that owns its layer.
pub(crate) type LayerGuard = ArcRwLockReadGuard<RawRwLock, LayerMap>;

/// One layer: a volume's writable head, or a snapshot (read-only).
pub(crate) struct VolumeState {
    pub id: VolumeId,
    pub created_unix: u64,
    size: AtomicU64,
    /// Extents this layer maps (including mappings not yet journaled).
    allocated: AtomicU64,
    pub map: Arc<RwLock<LayerMap>>,
    deleted: AtomicBool,
    /// When a scrub last read the whole volume (Unix seconds; 0 = never).
    last_scrub: AtomicU64,
    /// Of a snapshot: the volume it was taken of. `None`: a volume.
    pub snapshot_of: Option<VolumeId>,
    /// A snapshot being deleted: no new handle, clone or rollback uses it.
    retired: AtomicBool,
}

impl VolumeState {
    pub fn new(
        id: VolumeId,
        slot: u32,
        size: u64,
        extents: usize,
        created_unix: u64,
    ) -> VolumeState {
        Self::with_map(id, size, created_unix, LayerMap::new(slot, extents), None)
    }

    /// A layer over an existing map (a snapshot takes its volume's).
    pub fn with_map(
        id: VolumeId,
        size: u64,
        created_unix: u64,
        map: LayerMap,
        snapshot_of: Option<VolumeId>,
    ) -> VolumeState {
        let allocated = map.extents.iter().filter(|e| e.get().is_some()).count() as u64;
        VolumeState {
            id,
            created_unix,
            size: AtomicU64::new(size),
            allocated: AtomicU64::new(allocated),
            map: Arc::new(RwLock::new(map)),
            deleted: AtomicBool::new(false),
            last_scrub: AtomicU64::new(0),
            snapshot_of,
            retired: AtomicBool::new(false),
        }
    }

    pub fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }

    pub fn retire(&self) {
        self.retired.store(true, Ordering::Release)
    }

    pub fn is_snapshot(&self) -> bool {
        self.snapshot_of.is_some()
    }

    /// Read locks on every layer below `map` (child before parent).
    pub fn lock_ancestors(map: &LayerMap) -> Vec<LayerGuard> {
        let mut chain: Vec<LayerGuard> = Vec::new();
        let mut next = map.parent.clone();
        while let Some(layer) = next {
            let guard = layer.map.read_arc();
            next = guard.parent.clone();
            chain.push(guard);
        }
        chain
    }

    /// [`VolumeState::lock_ancestors`] without waiting: `None` if a lock
    /// is held or wanted exclusively.
    pub fn try_lock_ancestors(map: &LayerMap) -> Option<Vec<LayerGuard>> {
        let mut chain: Vec<LayerGuard> = Vec::new();
        let mut next = map.parent.clone();
        while let Some(layer) = next {
            let guard = layer.map.try_read_arc()?;
            next = guard.parent.clone();
            chain.push(guard);
        }
        Some(chain)
    }

    /// Resets the count of mapped extents (after a rollback emptied it).
    pub fn reset_allocated(&self) {
        self.allocated.store(0, Ordering::Release);
    }

    pub fn last_scrub(&self) -> u64 {
        self.last_scrub.load(Ordering::Acquire)
    }
    pub fn set_last_scrub(&self, unix: u64) {
        self.last_scrub.store(unix, Ordering::Release)
    }
    pub fn allocated_extents(&self) -> u64 {
        self.allocated.load(Ordering::Acquire)
    }
    pub fn add_allocated(&self, n: u64) {
        self.allocated.fetch_add(n, Ordering::AcqRel);
    }
    pub fn remove_allocated(&self, n: u64) {
        self.allocated.fetch_sub(n, Ordering::AcqRel);
    }
    /// Before a shrink to `keep` extents: stops counting the mapped extents
    /// beyond it (the journal frees them).
    pub fn forget_mapped_from(&self, map: &LayerMap, keep: usize) {
        let gone = map
            .extents
            .iter()
            .skip(keep)
            .filter(|e| e.get().is_some())
            .count();
        self.remove_allocated(gone as u64);
    }
    pub fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }
    pub fn set_size(&self, size: u64) {
        self.size.store(size, Ordering::Release)
    }
    pub fn mark_deleted(&self) {
        self.deleted.store(true, Ordering::Release)
    }
    pub(crate) fn is_deleted(&self) -> bool {
        self.deleted.load(Ordering::Acquire)
    }
    /// At open: records that `phys` holds `logical`; false if that does not
    /// fit the volume or the logical extent is already mapped.
    pub fn set_mapping_at_open(&self, logical: u32, phys: u32) -> bool {
        let map = self.map.read();
        match map.get(logical as usize) {
            Some(e) if e.get().is_none() => {
                e.set(Some(phys));
                self.add_allocated(1);
                true
            }
            _ => false,
        }
    }
}

/// Where the block at byte `within` of logical extent `logical` is read
/// from (a device offset), through `head` and then its `ancestors`; `None`:
/// no layer holds it, it reads as zeros. A layer with a parent holds the
/// blocks whose presence bit is set; the bottom layer holds every block of
/// its mapped extents.
pub(crate) fn resolve(
    store: &Store,
    head: &LayerMap,
    ancestors: &[LayerGuard],
    logical: usize,
    within: u64,
) -> Option<u64> {
    resolve_layer(store, head, ancestors, logical, within).map(|(at, _)| at)
}

/// [`resolve`], with the layer the block is read from: 0 for `head`, `k`
/// for `ancestors[k - 1]`.
pub(crate) fn resolve_layer(
    store: &Store,
    head: &LayerMap,
    ancestors: &[LayerGuard],
    logical: usize,
    within: u64,
) -> Option<(u64, usize)> {
    let layout = &store.layout;
    let layers = std::iter::once(head).chain(ancestors.iter().map(|g| &**g));
    for (k, layer) in layers.enumerate() {
        if let Some(phys) = layer.phys(logical) {
            let at = layout.extent_offset(phys) + within;
            if layer.parent.is_none() {
                return Some((at, k));
            }
            // A layer with a parent exists only in a store with presence.
            let block = layout.data_block_at(at);
            if store.presence.as_ref().is_some_and(|p| p.is_present(block)) {
                return Some((at, k));
            }
        }
    }
    None
}

/// The layers of a stack as `VolumeState`s: `head`'s, then each ancestor's
/// (those `lock_ancestors` locked, in that order).
pub(crate) fn stack_states(
    head: &Arc<VolumeState>,
    head_map: &LayerMap,
    ancestors: &[LayerGuard],
) -> Vec<Arc<VolumeState>> {
    let mut out = Vec::with_capacity(1 + ancestors.len());
    out.push(head.clone());
    let mut next = head_map.parent.clone();
    for guard in ancestors {
        match next {
            Some(layer) => out.push(layer),
            None => break,
        }
        next = guard.parent.clone();
    }
    out
}
