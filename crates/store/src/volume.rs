//! The data path of one volume: batched reads and writes mapped onto
//! physical extents, thin allocation on first write, TRIM and write-zeroes,
//! and the allocation map for block-status queries. A volume is a stack of
//! layers (`LayerMap`): a block its own layer does not hold is read from
//! the parent layer (a snapshot, or the snapshot a clone was made from).
//!
//! Invariants:
//! - Reads and writes hold the volume's map lock shared for the whole batch,
//!   including the device I/O; anything that unmaps extents (trim, zeroing,
//!   shrink, delete) holds it exclusively. So no I/O can land in an extent
//!   after it was unmapped and handed to another volume.
//! - An overwrite of mapped space costs one device write and no metadata.
//! - A FUA write's data and the mapping it needs are durable when it returns.
//! - Map locks are taken child before parent (`layer_map.rs`); a
//!   snapshot's map is only ever written by the operations that merge or
//!   delete layers.
//! - In a layer with a parent, a block is read from the layer only once
//!   its presence bit is set (after its write completed, `presence.rs`),
//!   and a range made to read zeros is written as zeros, never unmapped,
//!   where an ancestor holds data.

use crate::buf::AlignedBuf;
use crate::engine::Store;
use crate::error::IoError;
use crate::format::JournalEntry;
use crate::integrity::zero_block_crc;
use crate::layer_map::VolumeState;
use crate::{VolumeId, BLOCK_SIZE};
use std::sync::Arc;

/// What a data operation does.
pub enum DataKind<'a> {
    Read(&'a mut [u8]),
    Write(&'a [u8]),
}

/// One read or write of a batch; `submit` stores its outcome in `result`.
pub struct DataOp<'a> {
    pub offset: u64,
    pub kind: DataKind<'a>,
    pub fua: bool,
    pub result: Result<(), IoError>,
}

impl<'a> DataOp<'a> {
    pub fn read(offset: u64, buf: &'a mut [u8]) -> Self {
        DataOp {
            offset,
            kind: DataKind::Read(buf),
            fua: false,
            result: Ok(()),
        }
    }
    pub fn write(offset: u64, data: &'a [u8], fua: bool) -> Self {
        DataOp {
            offset,
            kind: DataKind::Write(data),
            fua,
            result: Ok(()),
        }
    }
    /// Bytes read or written.
    pub fn len(&self) -> u64 {
        match &self.kind {
            DataKind::Read(b) => b.len() as u64,
            DataKind::Write(b) => b.len() as u64,
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether offset and length are multiples of 4 KiB (else the op is a
    /// read-modify-write).
    pub fn is_aligned(&self) -> bool {
        self.offset.is_multiple_of(BLOCK_SIZE) && self.len().is_multiple_of(BLOCK_SIZE)
    }
}

/// A run of a volume's address space that is either allocated or a hole
/// (reads as zeros).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MappingRun {
    pub len: u64,
    pub allocated: bool,
}

/// A handle to one volume's data path; clones share the volume.
#[derive(Clone)]
pub struct LocalVolume {
    store: Arc<Store>,
    vol: Arc<VolumeState>,
}

pub(crate) fn check_range(offset: u64, len: u64, size: u64) -> Result<(), IoError> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(IoError::OutOfRange { offset, len, size }),
    }
}

impl LocalVolume {
    pub(crate) fn new(store: Arc<Store>, vol: Arc<VolumeState>) -> LocalVolume {
        LocalVolume { store, vol }
    }

    pub fn id(&self) -> VolumeId {
        self.vol.id
    }

    pub(crate) fn store(&self) -> &Arc<Store> {
        &self.store
    }

    pub(crate) fn state(&self) -> &Arc<VolumeState> {
        &self.vol
    }

    pub fn size(&self) -> u64 {
        self.vol.size()
    }

    /// A snapshot: every write is refused with `IoError::ReadOnly`.
    pub fn is_read_only(&self) -> bool {
        self.vol.is_snapshot()
    }

    /// Bytes of the volume held by allocated extents (at most its size;
    /// includes allocations not yet committed to the journal).
    pub fn allocated_bytes(&self) -> u64 {
        self.vol
            .allocated_extents()
            .saturating_mul(self.store.extent_size())
            .min(self.vol.size())
    }

    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), IoError> {
        let mut ops = [DataOp::read(offset, buf)];
        self.submit(&mut ops);
        let [op] = ops;
        op.result
    }

    pub fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), IoError> {
        let mut ops = [DataOp::write(offset, data, fua)];
        self.submit(&mut ops);
        let [op] = ops;
        op.result
    }

    /// Makes every completed write of the store durable (all volumes, all
    /// handles: a flush on one connection covers writes done on the others).
    pub fn flush(&self) -> Result<(), IoError> {
        Ok(self.store.commit()?)
    }

    /// Executes a batch of reads and writes: extent lookups and allocations
    /// first, then every device I/O in one submission.
    pub fn submit(&self, ops: &mut [DataOp<'_>]) {
        self.submit_aligned(ops);
        for op in ops.iter_mut() {
            if op.result.is_ok() && !op.is_aligned() {
                op.result = match &mut op.kind {
                    DataKind::Read(buf) => self.read_unaligned(op.offset, buf),
                    DataKind::Write(data) => self.write_unaligned(op.offset, data, op.fua),
                };
            }
        }
    }

    fn submit_aligned(&self, ops: &mut [DataOp<'_>]) {
        // Writes to packed extents unpack them first; a compaction racing
        // in between packs one again only if it was not written since, so
        // a few rounds settle it.
        let mut rounds = 0;
        let staged = loop {
            let writes = ops.iter().filter_map(|o| match o.kind {
                DataKind::Write(d) if o.is_aligned() => Some((o.offset, d.len() as u64)),
                _ => None,
            });
            let unpacked = self.store.unpack_for_writes(&self.vol, writes);
            let error = match unpacked {
                Err(e) => Some(IoError::from(e)),
                Ok(()) if rounds == 8 => Some(IoError::Failed),
                Ok(()) => None,
            };
            if let Some(e) = error {
                for op in ops.iter_mut() {
                    op.result = Err(e.duplicate());
                }
                return;
            }
            rounds += 1;
            match self.stage(ops) {
                Some(s) if s.needs_unpack() => continue,
                s => break s,
            }
        };
        let Some(staged) = staged else {
            return;
        };
        let results = staged.run(ops);
        if staged.finish(ops, results) {
            self.commit_fua_writes(ops);
        }
    }

    fn stripe(&self, block: u64) -> usize {
        ((self.vol.id.as_u64_pair().0).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ block) as usize
            % self.store.rmw_locks.len()
    }

    fn read_unaligned(&self, offset: u64, buf: &mut [u8]) -> Result<(), IoError> {
        let a0 = offset / BLOCK_SIZE * BLOCK_SIZE;
        let a1 = (offset + buf.len() as u64).div_ceil(BLOCK_SIZE) * BLOCK_SIZE;
        let mut bounce = AlignedBuf::zeroed((a1 - a0) as usize);
        self.read(a0, &mut bounce)?;
        let at = (offset - a0) as usize;
        buf.copy_from_slice(&bounce[at..at + buf.len()]);
        Ok(())
    }

    /// Read-modify-write of the partial blocks at either end, serialised per
    /// block so two small writes into one block cannot lose each other.
    fn write_unaligned(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), IoError> {
        let end = offset + data.len() as u64;
        let a0 = offset / BLOCK_SIZE * BLOCK_SIZE;
        let a1 = end.div_ceil(BLOCK_SIZE) * BLOCK_SIZE;
        let (head, tail) = (a0 / BLOCK_SIZE, a1 / BLOCK_SIZE - 1);
        let (s0, s1) = (self.stripe(head), self.stripe(tail));
        let (first, second) = (s0.min(s1), s0.max(s1));
        let _g0 = self.store.rmw_locks[first].lock();
        let _g1 = (second != first).then(|| self.store.rmw_locks[second].lock());
        let mut bounce = AlignedBuf::zeroed((a1 - a0) as usize);
        let b = BLOCK_SIZE as usize;
        if offset != a0 {
            self.read(a0, &mut bounce[..b])?;
        }
        if end != a1 && (tail != head || offset == a0) {
            let at = bounce.len() - b;
            self.read(a1 - BLOCK_SIZE, &mut bounce[at..])?;
        }
        let at = (offset - a0) as usize;
        bounce[at..at + data.len()].copy_from_slice(data);
        self.write(a0, &bounce, fua)
    }

    /// Makes [offset, offset+len) read as zeros. With `may_unmap`, whole
    /// extents are returned to the store (thin space is freed); without it
    /// (NBD's NO_HOLE), the space stays allocated.
    pub fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        may_unmap: bool,
        fua: bool,
    ) -> Result<(), IoError> {
        check_range(offset, len, self.vol.size())?;
        if len == 0 {
            return Ok(());
        }
        let end = offset + len;
        let a0 = offset.div_ceil(BLOCK_SIZE) * BLOCK_SIZE;
        let a1 = end / BLOCK_SIZE * BLOCK_SIZE;
        if a0 >= a1 {
            self.write_unaligned(offset, &vec![0u8; len as usize], false)?;
        } else {
            if offset < a0 {
                self.write_unaligned(offset, &vec![0u8; (a0 - offset) as usize], false)?;
            }
            if a1 < end {
                self.write_unaligned(a1, &vec![0u8; (end - a1) as usize], false)?;
            }
            self.zero_aligned(a0, a1, may_unmap)?;
        }
        if fua {
            self.store.commit()?;
        }
        Ok(())
    }

    /// TRIM: the range reads as zeros afterwards and whole extents are freed.
    pub fn trim(&self, offset: u64, len: u64, fua: bool) -> Result<(), IoError> {
        self.write_zeroes(offset, len, true, fua)
    }

    fn zero_aligned(&self, start: u64, end: u64, may_unmap: bool) -> Result<(), IoError> {
        let es = self.store.extent_size();
        let layout = self.store.layout;
        let map = self.vol.map.write();
        if self.vol.is_deleted() {
            return Err(IoError::Gone);
        }
        if self.vol.is_snapshot() {
            return Err(IoError::ReadOnly);
        }
        self.store.check_usable()?;
        // Where a layer below holds data, unmapping would show it again:
        // such ranges are zeroed in this layer and marked present.
        let ancestors = VolumeState::lock_ancestors(&map);
        let mut present = Vec::new();
        let size = self.vol.size();
        let mut unmap = Vec::new();
        let mut off = start;
        while off < end {
            let logical = off / es;
            let extent_end = ((logical + 1) * es).min(size);
            let piece_end = extent_end.min(end);
            let whole = off == logical * es && piece_end == extent_end;
            let Some(entry) = map.get(logical as usize) else {
                break;
            };
            let below = ancestors.iter().any(|g| g.phys(logical as usize).is_some());
            let unmapped_whole = whole && may_unmap && !below;
            let current = match entry.get() {
                // Zeroed in place, so no longer packed.
                Some(v) if layout.is_virtual(v) && !unmapped_whole => Some(
                    self.store
                        .unpack_locked(&self.vol, &map, logical as u32, v)?,
                ),
                other => other,
            };
            let phys = match current {
                Some(phys) if whole && may_unmap && !below => {
                    unmap.push((entry, phys));
                    None
                }
                Some(phys) => {
                    // In place, like a write: the extent must be hot.
                    self.store.heat(phys)?;
                    let at = layout.extent_offset(phys) + off % es;
                    let r = if may_unmap {
                        self.store.device.discard_zeroes(at, piece_end - off)
                    } else {
                        self.store.device.zero_range(at, piece_end - off)
                    };
                    r.map_err(|e| IoError::from(self.store.fail(e.into())))?;
                    if let Some(sums) = &self.store.checksums {
                        // No I/O on this volume meanwhile (exclusive map lock).
                        let blocks = (piece_end - off) / BLOCK_SIZE;
                        sums.set_range(layout.data_block_at(at), blocks, zero_block_crc());
                    }
                    Some(phys)
                }
                // NO_HOLE on a hole, or a hole over a parent's data: map a
                // fresh (zero) extent.
                None if !may_unmap || below => {
                    Some(
                        self.store
                            .allocate(&self.vol, map.slot, logical as u32, entry)?,
                    )
                }
                None => None,
            };
            if let (Some(phys), Some(presence)) = (phys, &self.store.presence) {
                if below {
                    let at = layout.extent_offset(phys) + off % es;
                    let blocks = (piece_end - off) / BLOCK_SIZE;
                    presence.mark(layout.data_block_at(at), blocks, &mut present);
                }
            }
            off = piece_end;
        }
        let mut m = self.store.meta.lock();
        for e in present {
            m.push(e);
        }
        if !unmap.is_empty() {
            self.vol.remove_allocated(unmap.len() as u64);
            for (entry, phys) in unmap {
                m.push(JournalEntry::Free {
                    first: phys,
                    count: 1,
                });
                entry.set(None);
            }
        }
        Ok(())
    }

    /// Allocated and unallocated runs covering [offset, offset+len).
    pub fn mapping(&self, offset: u64, len: u64) -> Result<Vec<MappingRun>, IoError> {
        check_range(offset, len, self.vol.size())?;
        let map = self.vol.map.read();
        let ancestors = VolumeState::lock_ancestors(&map);
        self.mapping_locked(&map, &ancestors, offset, len)
    }

    /// [`LocalVolume::mapping`] without waiting for a map lock: `None` when
    /// one is held or wanted exclusively (for an event loop, which must
    /// never wait for a writer).
    pub fn try_mapping(&self, offset: u64, len: u64) -> Option<Result<Vec<MappingRun>, IoError>> {
        if let Err(e) = check_range(offset, len, self.vol.size()) {
            return Some(Err(e));
        }
        let map = self.vol.map.try_read()?;
        let ancestors = VolumeState::try_lock_ancestors(&map)?;
        Some(self.mapping_locked(&map, &ancestors, offset, len))
    }

    fn mapping_locked(
        &self,
        map: &crate::layer_map::LayerMap,
        ancestors: &[crate::layer_map::LayerGuard],
        offset: u64,
        len: u64,
    ) -> Result<Vec<MappingRun>, IoError> {
        let es = self.store.extent_size();
        if self.vol.is_deleted() {
            return Err(IoError::Gone);
        }
        let mut runs: Vec<MappingRun> = Vec::new();
        let (mut off, end) = (offset, offset + len);
        while off < end {
            let logical = off / es;
            let piece_end = ((logical + 1) * es).min(end);
            // Conservative through layers: a parent's extent may read zeros
            // where this reports data, never the other way round.
            let allocated = std::iter::once(map)
                .chain(ancestors.iter().map(|g| &**g))
                .any(|layer| layer.phys(logical as usize).is_some());
            match runs.last_mut() {
                Some(r) if r.allocated == allocated => r.len += piece_end - off,
                _ => runs.push(MappingRun {
                    len: piece_end - off,
                    allocated,
                }),
            }
            off = piece_end;
        }
        Ok(runs)
    }
}
