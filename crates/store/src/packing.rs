//! Packed extents at runtime (the packed-extents feature): compacting a
//! cold extent into a compressed run (`Store::pack_extent`), reading
//! blocks of a packed extent (`Store::read_packed`), turning one back into
//! a physical extent before it is written (`Store::unpack_locked`), and
//! the space runs take: units of pack extents, and virtual extent numbers.
//!
//! Invariants (docs/format.md, "Packed extents"):
//! - A run is written into units no owned virtual extent's run covers and
//!   is never changed; the `Pack` entry that maps it is written only after
//!   the run is durable (`Store::commit` flushes first), and swaps the
//!   layer's mapping from the physical extent to the virtual one in one
//!   entry, so no crash leaves both or neither.
//! - The swap happens under the layer's map lock held exclusively, and
//!   only if the physical extent is still the one mapped and was not
//!   written since it was read (its write stamp, `Intent::stamp`): a write
//!   racing the compaction is never lost.
//! - A packed extent is never written in place: writes, partial zeroing
//!   and shrinking unpack it first, under the map lock held exclusively,
//!   into a reserved physical extent that holds every block (`Unpack`,
//!   written after that extent's data is durable).
//! - The units of a virtual extent that was freed (unpacked, trimmed,
//!   deleted, merged away) are reused only after the entry freeing it is
//!   durable (`Store::release_virtual`, called after the commit) — and no
//!   I/O can still read them: everything that frees a virtual extent holds
//!   its layer's map lock exclusively. A pack extent whose units are all
//!   free is freed (dirty) like any extent, and zeroed before reuse.
//! - Only extents that hold every block of their layer are packed (a
//!   layer without a parent, or all presence bits set): a virtual extent
//!   has no presence bits and reads as wholly present.
//! - An encrypted volume's extent is compressed from its plaintext, and
//!   its compressed records are sealed with the volume's cipher (compress,
//!   then encrypt); reading it back gives what the device held before it
//!   was packed — ciphertext, bit for bit (XTS is deterministic) — so
//!   every path above the run (decryption in the data path, unpacking,
//!   merges, flattening) treats it as a plain extent.

use crate::buf::AlignedBuf;
use crate::engine::Store;
use crate::error::{IoError, StoreError};
use crate::format::{
    encode_run, run_header_len, Codec, ExtentState, JournalEntry, RecordKind, RunError, RunHeader,
    RunIdentity, RunLoc, Sealing, PACK_SLOT,
};
use crate::layer_map::{LayerMap, VolumeState};
use crate::meta::MetaState;
use crate::BLOCK_SIZE;
use basalt_crypt::BlockCipher;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// What `Store::pack_extent` did with one logical extent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PackOutcome {
    /// Packed into a run of this many bytes.
    Packed { stored: u64 },
    /// Not worth it: the run would save less than an eighth.
    Incompressible,
    /// Nothing to do: unmapped, already packed, or not wholly held by its
    /// layer.
    Skipped,
    /// Written (or remapped) while it was being compressed: try later.
    Raced,
}

/// Space of packed extents.
#[derive(Default)]
struct PackSpace {
    /// Virtual extents not owned (durably free, or never used).
    free_virtual: Vec<u32>,
    /// Units in use (or being written) of each pack extent, a bit each.
    packs: BTreeMap<u32, u32>,
    /// Virtual extents mapped, and the bytes their runs store.
    owned: u64,
    stored: u64,
}

pub(crate) struct Packing {
    first_virtual: u32,
    /// Units of a pack extent (`Layout::units_per_extent`).
    units_per_extent: u32,
    /// The run of each virtual extent, as mapped (index: virtual extent -
    /// first virtual): `pack | unit << 32 | units << 40 | codec << 48`.
    runs: Vec<AtomicU64>,
    /// Bytes each run stores (for accounting), same index.
    stored: Vec<AtomicU64>,
    space: Mutex<PackSpace>,
}

fn encode_loc(r: RunLoc) -> u64 {
    r.pack as u64 | (r.unit as u64) << 32 | (r.units as u64) << 40 | (r.codec as u64) << 48
}

fn decode_loc(v: u64, stored: u64) -> RunLoc {
    RunLoc {
        pack: v as u32,
        unit: (v >> 32) as u8,
        units: (v >> 40) as u8,
        codec: (v >> 48) as u8,
        stored: stored as u32,
    }
}

/// The XTS data unit a sealed record of volume block `block` is
/// encrypted as: apart from the unit numbers of the volume's blocks.
fn sealed_unit(block: u64) -> u128 {
    1u128 << 127 | block as u128
}

pub(crate) fn unit_mask(unit: u8, units: u8) -> u32 {
    (((1u64 << units) - 1) << unit) as u32
}

impl Packing {
    /// The runtime view of the journaled state after an open: runs of
    /// owned virtual extents, pack extents' units, free virtual extents.
    /// Pack extents no run uses and virtual extents whose run is not in a
    /// pack extent (never left by this engine) are returned to be freed.
    pub fn load(state: &MetaState) -> (Packing, Vec<u32>) {
        let layout = state.layout;
        let first = layout.extent_count;
        let mut space = PackSpace::default();
        let mut stray = Vec::new();
        for (phys, e) in state.extents[..first as usize].iter().enumerate() {
            if matches!(
                e,
                ExtentState::Owned {
                    slot: PACK_SLOT,
                    ..
                }
            ) {
                space.packs.insert(phys as u32, 0);
            }
        }
        let mut runs = Vec::with_capacity(state.runs.len());
        let mut stored = Vec::with_capacity(state.runs.len());
        for (i, run) in state.runs.iter().enumerate() {
            let virt = first + i as u32;
            runs.push(AtomicU64::new(encode_loc(*run)));
            stored.push(AtomicU64::new(run.stored as u64));
            match state.extents[virt as usize] {
                ExtentState::Free { .. } => space.free_virtual.push(virt),
                ExtentState::Owned { slot, .. } if slot == crate::format::QUARANTINE_SLOT => {}
                ExtentState::Owned { .. } => {
                    let mask = unit_mask(run.unit, run.units);
                    let fits = run.unit as u32 + run.units as u32 <= layout.units_per_extent();
                    match space.packs.get_mut(&run.pack) {
                        Some(m) if fits && *m & mask == 0 => {
                            *m |= mask;
                            space.owned += 1;
                            space.stored += run.stored as u64;
                        }
                        _ => {
                            tracing::error!(
                                virt,
                                pack = run.pack,
                                "packed extent's run is not in a free part of a pack extent; freeing it"
                            );
                            stray.push(virt);
                        }
                    }
                }
            }
        }
        for (&pack, &mask) in &space.packs {
            if mask == 0 {
                stray.push(pack);
            }
        }
        space.packs.retain(|_, m| *m != 0);
        // Handed out lowest first.
        space.free_virtual.reverse();
        (
            Packing {
                first_virtual: first,
                units_per_extent: layout.units_per_extent(),
                runs,
                stored,
                space: Mutex::new(space),
            },
            stray,
        )
    }

    pub fn run(&self, virt: u32) -> RunLoc {
        let i = (virt - self.first_virtual) as usize;
        decode_loc(
            self.runs[i].load(Ordering::Acquire),
            self.stored[i].load(Ordering::Relaxed),
        )
    }

    fn set_run(&self, virt: u32, run: RunLoc) {
        let i = (virt - self.first_virtual) as usize;
        self.stored[i].store(run.stored as u64, Ordering::Relaxed);
        self.runs[i].store(encode_loc(run), Ordering::Release);
    }

    /// Owned virtual extents, the bytes their runs store, and pack
    /// extents in use (units taken for runs being written included).
    pub fn totals(&self) -> (u64, u64, u64) {
        let s = self.space.lock();
        (s.owned, s.stored, s.packs.len() as u64)
    }

    /// Pack extents and the units each uses, for `Store::check`.
    pub fn units_in_use(&self) -> BTreeMap<u32, u32> {
        self.space.lock().packs.clone()
    }

    /// Virtual extents not owned, for `Store::check`.
    pub fn free_virtual(&self) -> std::collections::HashSet<u32> {
        self.space.lock().free_virtual.iter().copied().collect()
    }

    /// Finds `units` consecutive free units in a pack extent and takes
    /// them — in the hole that fits them most tightly, so that holes left
    /// are as large as can be; `None`: no pack extent has room.
    fn take_units(&self, units: u8) -> Option<(u32, u8)> {
        let per = self.units_per_extent;
        let mut s = self.space.lock();
        let mut best: Option<(u32, u32, u8)> = None; // (hole, pack, unit)
        for (&pack, &mask) in s.packs.iter() {
            let mut unit = 0;
            while unit < per {
                if mask & (1 << unit) != 0 {
                    unit += 1;
                    continue;
                }
                let start = unit;
                while unit < per && mask & (1 << unit) == 0 {
                    unit += 1;
                }
                let hole = unit - start;
                if hole >= units as u32 && best.is_none_or(|(b, _, _)| hole < b) {
                    best = Some((hole, pack, start as u8));
                }
            }
            if best.is_some_and(|(hole, _, _)| hole == units as u32) {
                break; // an exact fit
            }
        }
        let (_, pack, unit) = best?;
        if let Some(mask) = s.packs.get_mut(&pack) {
            *mask |= unit_mask(unit, units);
        }
        Some((pack, unit))
    }

    /// Gives back units taken for a run that was not mapped; a pack
    /// extent left empty is returned (to be freed).
    fn untake_units(&self, pack: u32, unit: u8, units: u8) -> Option<u32> {
        let mut s = self.space.lock();
        let mask = s.packs.get_mut(&pack)?;
        *mask &= !unit_mask(unit, units);
        if *mask == 0 {
            s.packs.remove(&pack);
            return Some(pack);
        }
        None
    }
}

impl Store {
    fn packing(&self) -> Result<&Packing, StoreError> {
        self.packing.as_ref().ok_or_else(|| {
            StoreError::Format(
                "this store was formatted without packed extents (compression); format a new store to use it"
                    .into(),
            )
        })
    }

    /// Packed extents of a layer's own map, and the bytes their runs store.
    pub(crate) fn packed_in(&self, map: &LayerMap) -> (u64, u64) {
        let Some(packing) = &self.packing else {
            return (0, 0);
        };
        (0..map.len())
            .filter_map(|l| map.phys(l))
            .filter(|&p| self.layout.is_virtual(p))
            .fold((0, 0), |(n, b), v| {
                (n + 1, b + packing.run(v).stored as u64)
            })
    }

    /// Reads blocks of virtual extent `virt` from byte `within` on into
    /// `buf` (whole blocks), decompressing and verifying each record: what
    /// the extent held on the device before it was packed. `cipher`: the
    /// volume's, for a sealed run (an encrypted volume's).
    pub(crate) fn read_packed(
        &self,
        virt: u32,
        within: u64,
        buf: &mut [u8],
        cipher: Option<&BlockCipher>,
    ) -> Result<(), IoError> {
        let packing = self.packing().map_err(|_| IoError::Failed)?;
        let layout = self.layout;
        let run = packing.run(virt);
        let base = layout.extent_offset(run.pack) + run.unit as u64 * layout.unit_size();
        let run_len = run.units as u64 * layout.unit_size();
        let bpe = layout.blocks_per_extent() as usize;
        let header_len = run_header_len(bpe);
        let mut head = AlignedBuf::zeroed(header_len);
        self.device.read_at(&mut head, base)?;
        let corrupt = |what: String| {
            tracing::error!(
                virt,
                pack = run.pack,
                unit = run.unit,
                "packed extent: {what}"
            );
            if let Some(sums) = &self.checksums {
                sums.count_mismatch();
            }
            IoError::Corrupt { offset: base }
        };
        let header = RunHeader::decode(&head, bpe).map_err(|e| corrupt(e.to_string()))?;
        if header.identity.virt != virt || header.units != run.units {
            return Err(corrupt(format!(
                "its run header names virtual extent {} ({} units)",
                header.identity.virt, header.units
            )));
        }
        let bs = BLOCK_SIZE as usize;
        let first = (within / BLOCK_SIZE) as usize;
        let count = buf.len() / bs;
        let span = header.span(first, count);
        let start = span.start / bs * bs;
        let end = span.end.div_ceil(bs) * bs;
        if end as u64 > run_len {
            return Err(corrupt("records reach past its units".into()));
        }
        let mut records = AlignedBuf::zeroed(end - start);
        if end > start {
            self.device.read_at(&mut records, base + start as u64)?;
        }
        let bpe = bpe as u64;
        let first_block = header.identity.logical as u64 * bpe;
        let open = |i: u32, rec: &mut [u8]| {
            cipher.is_some_and(|c| {
                c.decrypt_unit(sealed_unit(first_block + i as u64), rec)
                    .is_ok()
            })
        };
        for (i, out) in buf.chunks_exact_mut(bs).enumerate() {
            let block = first + i;
            match header.decode_block(block, &records, start, out, Some(&open)) {
                // Plaintext: back to what the device held.
                Ok(RecordKind::Compressed) if header.sealed => {
                    let sealed = cipher
                        .ok_or(IoError::Failed)?
                        .encrypt(first_block + block as u64, out);
                    sealed.map_err(|_| IoError::Failed)?;
                }
                Ok(_) => {}
                Err(RunError::Sealed) => {
                    tracing::error!(
                        virt,
                        "packed extent of an encrypted volume read without its key"
                    );
                    return Err(IoError::Failed);
                }
                Err(e) => return Err(corrupt(e.to_string())),
            }
        }
        Ok(())
    }

    /// Checks virtual extent `virt`'s run without decrypting: its header,
    /// and every record against its checksum (for `Store::check`).
    pub(crate) fn verify_packed(&self, virt: u32) -> Result<(), String> {
        let packing = self.packing().map_err(|e| e.to_string())?;
        let layout = self.layout;
        let run = packing.run(virt);
        let base = layout.extent_offset(run.pack) + run.unit as u64 * layout.unit_size();
        let mut bytes = AlignedBuf::zeroed((run.units as u64 * layout.unit_size()) as usize);
        self.device
            .read_at(&mut bytes, base)
            .map_err(|e| e.to_string())?;
        let bpe = layout.blocks_per_extent() as usize;
        let header = RunHeader::decode(&bytes, bpe).map_err(|e| e.to_string())?;
        if header.identity.virt != virt || header.units != run.units {
            return Err(format!(
                "its header names virtual extent {}",
                header.identity.virt
            ));
        }
        let mut out = [0u8; BLOCK_SIZE as usize];
        for b in 0..bpe {
            match header.decode_block(b, &bytes, 0, &mut out, None) {
                Ok(_) | Err(RunError::Sealed) => {}
                Err(e) => return Err(e.to_string()),
            }
        }
        Ok(())
    }

    /// Compacts logical extent `logical` of layer `id` (a volume or a
    /// snapshot) into a compressed run, if it is mapped to a physical
    /// extent, wholly held by its layer, and compresses by at least an
    /// eighth. Client I/O goes on meanwhile; durable on return.
    pub fn pack_extent(
        &self,
        id: crate::VolumeId,
        logical: u32,
        codec: Codec,
    ) -> Result<PackOutcome, StoreError> {
        self.check_usable()?;
        let packing = self.packing()?;
        let vol = self.volume_state(id)?;
        let layout = self.layout;
        let bpe = layout.blocks_per_extent();
        let es = layout.extent_size as usize;
        let mut data = AlignedBuf::zeroed(es);
        let (phys, slot, stamp) = {
            let map = vol.map.read();
            if vol.is_deleted() {
                return Err(StoreError::NotFound(id));
            }
            let Some(phys) = map.phys(logical as usize) else {
                return Ok(PackOutcome::Skipped);
            };
            if layout.is_virtual(phys) {
                return Ok(PackOutcome::Skipped);
            }
            if map.parent.is_some() {
                let presence = self.presence.as_ref().ok_or(StoreError::NoLayers)?;
                let first = phys as u64 * bpe;
                if !(first..first + bpe).all(|b| presence.is_present(b)) {
                    return Ok(PackOutcome::Skipped);
                }
            }
            let stamp = self.intent.as_ref().map_or(0, |i| i.stamp(phys));
            self.read_extent_verified(phys, &mut data, None)?;
            (phys, map.slot, stamp)
        };
        // An encrypted volume's: compressed from its plaintext, sealed.
        let cipher = match self.cipher_of(&vol) {
            Ok(c) => c,
            Err(_) => return Ok(PackOutcome::Skipped), // its key is not loaded
        };
        let first_block = logical as u64 * bpe;
        let plain = match &cipher {
            Some(c) => {
                let mut p = data.to_vec();
                if c.decrypt_written(first_block, &mut p).is_err() {
                    return Ok(PackOutcome::Skipped);
                }
                Some(p)
            }
            None => None,
        };
        let seal = |i: u32, rec: &mut [u8]| {
            cipher.as_ref().is_some_and(|c| {
                c.encrypt_unit(sealed_unit(first_block + i as u64), rec)
                    .is_ok()
            })
        };
        let sealing = plain.as_deref().map(|plain| Sealing { plain, seal: &seal });
        let virt = match packing.space.lock().free_virtual.pop() {
            Some(v) => v,
            None => return Ok(PackOutcome::Skipped),
        };
        let give_back_virtual = |v: u32| packing.space.lock().free_virtual.push(v);
        let identity = RunIdentity {
            virt,
            slot,
            logical,
        };
        let unit_size = layout.unit_size() as usize;
        let Some((run_bytes, units)) =
            encode_run(&data, identity, codec, unit_size, sealing.as_ref())
        else {
            give_back_virtual(virt);
            return Ok(PackOutcome::Incompressible);
        };
        let (pack, unit, new_pack) = match packing.take_units(units) {
            Some((pack, unit)) => (pack, unit, false),
            None => {
                let pack = match self.take_reserved() {
                    Ok(p) => p,
                    Err(e) => {
                        give_back_virtual(virt);
                        return Err(e);
                    }
                };
                packing.space.lock().packs.insert(pack, unit_mask(0, units));
                (pack, 0, true)
            }
        };
        let abandon = |store: &Store| {
            give_back_virtual(virt);
            if let Some(empty) = packing.untake_units(pack, unit, units) {
                // Journaled as a pack extent: freed like one. Never (a
                // fresh one, whose every run was abandoned, this one's
                // or a concurrent compaction's): still durably dirty, it
                // holds run bytes now and is zeroed before reuse.
                let journaled = matches!(
                    store.durable.lock().state.extents[empty as usize],
                    ExtentState::Owned {
                        slot: PACK_SLOT,
                        ..
                    }
                );
                let mut m = store.meta.lock();
                if journaled {
                    m.push(JournalEntry::Free {
                        first: empty,
                        count: 1,
                    });
                } else {
                    m.to_zero.push(empty);
                }
            }
        };
        if new_pack {
            if let Some(sums) = &self.checksums {
                // Pack extents are verified by their runs' own checksums.
                sums.set_range(pack as u64 * bpe, bpe, crate::format::CHECKSUM_UNKNOWN);
            }
        }
        let mut out = AlignedBuf::zeroed(run_bytes.len());
        out.copy_from_slice(&run_bytes);
        let at = layout.extent_offset(pack) + unit as u64 * layout.unit_size();
        if let Err(e) = self.device.write_at(&out, at, false) {
            abandon(self);
            return Err(self.fail(e.into()));
        }
        let run = RunLoc {
            pack,
            unit,
            units,
            codec: codec.id(),
            stored: run_bytes.len() as u32,
        };
        {
            let map = vol.map.write();
            let unchanged = !vol.is_deleted()
                && map.slot == slot
                && map.phys(logical as usize) == Some(phys)
                && self.intent.as_ref().map_or(0, |i| i.stamp(phys)) == stamp;
            if !unchanged {
                drop(map);
                abandon(self);
                return Ok(PackOutcome::Raced);
            }
            let Some(entry) = map.get(logical as usize) else {
                return Ok(PackOutcome::Raced);
            };
            packing.set_run(virt, run);
            {
                let mut s = packing.space.lock();
                s.owned += 1;
                s.stored += run.stored as u64;
            }
            self.meta.lock().push(JournalEntry::Pack {
                virt,
                slot,
                logical,
                from: phys,
                run,
            });
            entry.set(Some(virt));
        }
        self.commit()?;
        Ok(PackOutcome::Packed {
            stored: run_bytes.len() as u64,
        })
    }

    /// Turns virtual extent `virt`, mapped at `logical` of the layer whose
    /// map the caller holds exclusively, back into a physical extent that
    /// holds every block; returns it. Its data is written now, the
    /// `Unpack` entry queued (durable with the next commit, after that
    /// data).
    pub(crate) fn unpack_locked(
        &self,
        vol: &VolumeState,
        map: &LayerMap,
        logical: u32,
        virt: u32,
    ) -> Result<u32, StoreError> {
        let layout = self.layout;
        let bpe = layout.blocks_per_extent();
        let es = layout.extent_size as usize;
        let mut data = AlignedBuf::zeroed(es);
        let cipher = self.cipher_of(vol)?;
        self.read_packed(virt, 0, &mut data, cipher.as_deref())
            .map_err(|e| match e {
                IoError::Io(e) => StoreError::Io(e),
                IoError::Corrupt { .. } => StoreError::Format(format!(
                    "packed extent {virt} fails its checksums; it cannot be written to"
                )),
                other => StoreError::Format(other.to_string()),
            })?;
        let phys = self.take_reserved()?;
        if let Some(intent) = &self.intent {
            intent.mapped(phys);
        }
        let first = phys as u64 * bpe;
        let mut crcs = Vec::new();
        if let Some(sums) = &self.checksums {
            sums.begin_writes(first, &data, &mut crcs);
        }
        let r = self
            .device
            .write_at(&data, layout.extent_offset(phys), false);
        if let Some(sums) = &self.checksums {
            sums.end_writes(first, &crcs, r.is_ok());
        }
        if let Err(e) = r {
            // The extent is dirty on disk and in no map: zeroed before reuse.
            self.meta.lock().to_zero.push(phys);
            return Err(self.fail(e.into()));
        }
        if let Some(presence) = &self.presence {
            presence.set_extent(phys);
        }
        let entry = map
            .get(logical as usize)
            .ok_or(StoreError::NotFound(vol.id))?;
        self.meta.lock().push(JournalEntry::Unpack {
            virt,
            slot: map.slot,
            logical,
            to: phys,
        });
        entry.set(Some(phys));
        Ok(phys)
    }

    /// Unpacks every packed extent that writes to `ranges` of `vol` would
    /// reach (taking its map lock exclusively, only if there is one).
    pub(crate) fn unpack_for_writes(
        &self,
        vol: &Arc<VolumeState>,
        ranges: impl Iterator<Item = (u64, u64)> + Clone,
    ) -> Result<(), StoreError> {
        let Some(packing) = &self.packing else {
            return Ok(());
        };
        let _ = packing;
        let es = self.layout.extent_size as u64;
        let packed_in = |map: &LayerMap| -> Vec<(u32, u32)> {
            let mut out = Vec::new();
            for (offset, len) in ranges.clone() {
                if len == 0 {
                    continue;
                }
                let Some(end) = offset.checked_add(len) else {
                    continue;
                };
                for logical in offset / es..=(end - 1) / es {
                    if let Some(p) = map.phys(logical as usize) {
                        if self.layout.is_virtual(p) {
                            out.push((logical as u32, p));
                        }
                    }
                }
            }
            out
        };
        if packed_in(&vol.map.read()).is_empty() {
            return Ok(());
        }
        let map = vol.map.write();
        if vol.is_deleted() || vol.is_snapshot() {
            return Ok(()); // staging reports it
        }
        for (logical, virt) in packed_in(&map) {
            self.unpack_locked(vol, &map, logical, virt)?;
        }
        Ok(())
    }

    /// Reserved extent for a pack extent or an unpacked extent (committing
    /// a reservation, or zeroing released extents, if none is ready).
    pub(crate) fn take_reserved(&self) -> Result<u32, StoreError> {
        for _ in 0..4 {
            let reserving = {
                let mut m = self.meta.lock();
                if let Some(phys) = m.reserved.pop() {
                    return Ok(phys);
                }
                Self::reserve_batch(&mut m)
            };
            self.commit()?;
            if !reserving {
                self.zero_freed()?;
            }
        }
        Err(StoreError::NoSpace)
    }

    /// After a commit: virtual extents it freed give their units back
    /// (a pack extent left empty is freed in turn) and can be reused.
    pub(crate) fn release_virtual(&self, freed: &[u32]) {
        let Some(packing) = &self.packing else {
            return;
        };
        let mut empty = Vec::new();
        {
            let mut s = packing.space.lock();
            for &virt in freed {
                let run = packing.run(virt);
                s.owned = s.owned.saturating_sub(1);
                s.stored = s.stored.saturating_sub(run.stored as u64);
                if let Some(mask) = s.packs.get_mut(&run.pack) {
                    *mask &= !unit_mask(run.unit, run.units);
                    if *mask == 0 {
                        s.packs.remove(&run.pack);
                        empty.push(run.pack);
                    }
                }
                s.free_virtual.push(virt);
            }
        }
        if !empty.is_empty() {
            let mut m = self.meta.lock();
            for pack in empty {
                m.push(JournalEntry::Free {
                    first: pack,
                    count: 1,
                });
            }
        }
    }

    /// Reads extent `phys` whole into `buf`, every block verified against
    /// its checksum (a packed one's records against theirs; `cipher`: its
    /// volume's, for an encrypted volume's).
    pub(crate) fn read_extent_verified(
        &self,
        phys: u32,
        buf: &mut AlignedBuf,
        cipher: Option<&BlockCipher>,
    ) -> Result<(), StoreError> {
        if self.layout.is_virtual(phys) {
            return self.read_packed(phys, 0, buf, cipher).map_err(|e| match e {
                IoError::Io(e) => StoreError::Io(e),
                other => StoreError::Layers(format!("cannot read packed extent {phys}: {other}")),
            });
        }
        let from = self.layout.extent_offset(phys);
        let bpe = self.layout.blocks_per_extent();
        let mut samples = Vec::new();
        if let Some(sums) = &self.checksums {
            sums.sample_blocks(phys as u64 * bpe, bpe, &mut samples);
        }
        self.device.read_at(buf, from)?;
        if let Some(sums) = &self.checksums {
            self.verify_read(sums, from, buf, &samples)
                .map_err(|e| match e {
                    IoError::Corrupt { offset } => StoreError::Layers(format!(
                        "block at device offset {offset} fails its checksum"
                    )),
                    IoError::Io(e) => StoreError::Io(e),
                    other => StoreError::Layers(other.to_string()),
                })?;
        }
        Ok(())
    }

    /// Reads the blocks at device offset `at` (as `resolve` gives them:
    /// physical blocks, or blocks of a packed extent, within one extent)
    /// into `span`, a 4 KiB-aligned slice of an aligned buffer, verified
    /// (`cipher`: the layer's, for an encrypted layer's packed blocks,
    /// which come back sealed as the device would hold them unpacked).
    pub(crate) fn read_span_verified(
        &self,
        at: u64,
        span: &mut [u8],
        cipher: Option<&BlockCipher>,
    ) -> Result<(), IoError> {
        let layout = self.layout;
        if at >= layout.virtual_base() {
            let rel = at - layout.data_offset;
            let es = layout.extent_size as u64;
            return self.read_packed((rel / es) as u32, rel % es, span, cipher);
        }
        let mut samples = Vec::new();
        if let Some(sums) = &self.checksums {
            let blocks = span.len() as u64 / crate::BLOCK_SIZE;
            sums.sample_blocks(layout.data_block_at(at), blocks, &mut samples);
        }
        self.device.read_at(span, at)?;
        if let Some(sums) = &self.checksums {
            self.verify_read(sums, at, span, &samples)?;
        }
        Ok(())
    }
}
