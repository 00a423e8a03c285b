//! `Store::check`: a consistency check of a quiescent store, for tests and
//! operators (`fsck`). It checks the invariants the engine relies on:
//! every physical extent is in exactly one place (mapped once, free,
//! reserved, waiting to be zeroed, or quarantined), the journaled state
//! agrees with the runtime on every extent once everything queued is
//! committed, each volume's allocation count matches its map, and every
//! free extent reads as zeros on the device; with data checksums, every
//! mapped block matches its checksum and every cold extent's checksums are
//! durable. With packed extents, every virtual extent is mapped once or
//! free, pack extents' units in use are exactly the owned runs' (no two
//! overlap), and every run decodes and verifies.

use crate::buf::AlignedBuf;
use crate::engine::Store;
use crate::error::StoreError;
use crate::format::{
    decode_checksum_page, ExtentState, SlotState, CHECKSUMS_PER_PAGE, CHECKSUM_UNKNOWN, PAGE,
    QUARANTINE_SLOT,
};
use std::sync::Arc;

/// What `Store::check` counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckReport {
    pub mapped_extents: u64,
    pub free_extents: u64,
    pub reserved_extents: u64,
    pub to_zero_extents: u64,
    pub quarantined_extents: u64,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Place {
    Nowhere,
    Mapped {
        slot: u32,
        logical: u32,
    },
    Free,
    Reserved,
    ToZero,
    Quarantined,
    /// A physical extent holding runs.
    Pack,
}

fn bad<T>(m: String) -> Result<T, StoreError> {
    Err(StoreError::Format(format!("check: {m}")))
}

impl Store {
    /// Checks the invariants above; the first violation is an error. Run it
    /// on a store no client is writing to (concurrent I/O can show an
    /// allocation half made).
    pub fn check(self: &Arc<Self>) -> Result<CheckReport, StoreError> {
        let n = self.layout.all_extents() as usize;
        let mut place = vec![Place::Nowhere; n];
        let mut report = CheckReport::default();
        let put = |phys: u32, p: Place, place: &mut Vec<Place>| -> Result<(), StoreError> {
            let Some(slot) = place.get_mut(phys as usize) else {
                return bad(format!("extent {phys} is out of range ({p:?})"));
            };
            if *slot != Place::Nowhere {
                return bad(format!("extent {phys} is both {:?} and {p:?}", *slot));
            }
            *slot = p;
            Ok(())
        };
        // No zeroing pass may run meanwhile, and nothing may stay queued.
        let _pass = self.zeroing.lock();
        self.commit()?;
        // A commit that freed packed extents queues the release of pack
        // extents left empty: one more makes that durable too.
        if !self.meta.lock().pending.is_empty() {
            self.commit()?;
        }
        let volumes: Vec<_> = self.meta.lock().volumes.values().cloned().collect();
        for v in &volumes {
            let map = v.map.read();
            let mut mapped = 0;
            for logical in 0..map.len() {
                if let Some(phys) = map.get(logical).and_then(|e| e.get()) {
                    put(
                        phys,
                        Place::Mapped {
                            slot: map.slot,
                            logical: logical as u32,
                        },
                        &mut place,
                    )?;
                    mapped += 1;
                }
            }
            if mapped != v.allocated_extents() {
                return bad(format!(
                    "volume {} counts {} allocated extents but maps {mapped}",
                    v.id,
                    v.allocated_extents()
                ));
            }
            report.mapped_extents += mapped;
        }
        let d = self.durable.lock();
        let m = self.meta.lock();
        let mut free = Vec::new();
        for phys in 0..self.layout.extent_count {
            if m.free.contains(phys) {
                put(phys, Place::Free, &mut place)?;
                free.push(phys);
            }
        }
        let packs = self
            .packing
            .as_ref()
            .map(|p| p.units_in_use())
            .unwrap_or_default();
        let free_virtual = self
            .packing
            .as_ref()
            .map(|p| p.free_virtual())
            .unwrap_or_default();
        for &virt in &free_virtual {
            put(virt, Place::Free, &mut place)?;
        }
        for &pack in packs.keys() {
            put(pack, Place::Pack, &mut place)?;
        }
        report.free_extents = free.len() as u64;
        for &p in m.reserved.iter().chain(&m.reserving) {
            put(p, Place::Reserved, &mut place)?;
            report.reserved_extents += 1;
        }
        for &p in &m.to_zero {
            put(p, Place::ToZero, &mut place)?;
            report.to_zero_extents += 1;
        }
        if !m.pending.is_empty() {
            return bad(format!(
                "{} entries are queued after a commit: the store is not quiescent",
                m.pending.len()
            ));
        }
        // With nothing queued, the journaled state and the runtime agree
        // on every extent.
        for (phys, e) in d.state.extents.iter().enumerate() {
            let p = place[phys];
            let agrees = match *e {
                ExtentState::Owned {
                    slot: crate::format::PACK_SLOT,
                    ..
                } if !self.layout.is_virtual(phys as u32) => p == Place::Pack,
                ExtentState::Free { .. } if self.layout.is_virtual(phys as u32) => p == Place::Free,
                ExtentState::Owned { slot, logical, .. } => {
                    let quarantined = slot == QUARANTINE_SLOT
                        || d.state.slots.get((slot as usize).wrapping_sub(1))
                            == Some(&SlotState::Quarantined);
                    if quarantined && p == Place::Nowhere {
                        place[phys] = Place::Quarantined;
                        report.quarantined_extents += 1;
                        true
                    } else {
                        p == Place::Mapped { slot, logical }
                    }
                }
                ExtentState::Free { dirty: true } => matches!(p, Place::Reserved | Place::ToZero),
                ExtentState::Free { dirty: false } => p == Place::Free,
            };
            if !agrees {
                return bad(format!("extent {phys} is journaled as {e:?} but is {p:?}"));
            }
        }
        let hot: Vec<bool> = d
            .state
            .extents
            .iter()
            .map(|e| matches!(e, ExtentState::Owned { hot: true, .. }))
            .collect();
        drop(m);
        drop(d);
        if let Some(phys) = place.iter().position(|p| *p == Place::Nowhere) {
            return bad(format!(
                "extent {phys} is leaked (in no map and no free list)"
            ));
        }
        self.check_runs(&place, &packs)?;
        // Free extents read as zeros.
        let es = self.layout.extent_size as usize;
        let mut buf = AlignedBuf::zeroed(es);
        for phys in free {
            self.device
                .read_at(&mut buf, self.layout.extent_offset(phys))?;
            if let Some(at) = buf.iter().position(|&b| b != 0) {
                return bad(format!("free extent {phys} holds data at byte {at}"));
            }
        }
        self.check_checksums(&place, &hot)?;
        Ok(report)
    }

    /// The units of every pack extent in use are exactly those of the
    /// owned virtual extents' runs, no two runs overlap, and every run
    /// decodes with every record verified.
    fn check_runs(
        &self,
        place: &[Place],
        packs: &std::collections::BTreeMap<u32, u32>,
    ) -> Result<(), StoreError> {
        let Some(packing) = &self.packing else {
            return Ok(());
        };
        let mut used = std::collections::BTreeMap::<u32, u32>::new();
        for virt in self.layout.extent_count..self.layout.all_extents() {
            if !matches!(place[virt as usize], Place::Mapped { .. }) {
                continue;
            }
            let run = packing.run(virt);
            let mask = crate::packing::unit_mask(run.unit, run.units);
            let units = used.entry(run.pack).or_default();
            if *units & mask != 0 {
                return bad(format!(
                    "the run of virtual extent {virt} overlaps another in pack extent {}",
                    run.pack
                ));
            }
            *units |= mask;
            self.verify_packed(virt).map_err(|e| {
                StoreError::Format(format!("check: virtual extent {virt} does not verify: {e}"))
            })?;
        }
        if &used != packs {
            return bad(format!(
                "pack extents' units in use {packs:?} are not the runs' {used:?}"
            ));
        }
        Ok(())
    }

    /// Every block of every mapped extent holds what its checksum says (or
    /// its checksum is unknown), and a cold extent's checksums on disk are
    /// the ones in memory: a crash now would lose no checksum.
    fn check_checksums(&self, place: &[Place], hot: &[bool]) -> Result<(), StoreError> {
        let Some(sums) = &self.checksums else {
            return Ok(());
        };
        let layout = self.layout;
        let bpe = layout.blocks_per_extent();
        let per = CHECKSUMS_PER_PAGE as u64;
        let mut region = AlignedBuf::zeroed((layout.checksum_pages_needed() * PAGE) as usize);
        self.device.read_at(&mut region, layout.checksum_offset)?;
        let mut buf = AlignedBuf::zeroed(layout.extent_size as usize);
        let physical = &place[..layout.extent_count as usize];
        for (phys, p) in physical.iter().enumerate() {
            if !matches!(p, Place::Mapped { .. }) {
                continue;
            }
            self.device
                .read_at(&mut buf, layout.extent_offset(phys as u32))?;
            for (i, block) in buf.chunks(PAGE as usize).enumerate() {
                let n = phys as u64 * bpe + i as u64;
                let want = sums.get(n);
                let got = crc32c::crc32c(block);
                if want != got && want != CHECKSUM_UNKNOWN {
                    return bad(format!(
                        "block {i} of extent {phys} holds {got:#x}, its checksum says {want:#x}"
                    ));
                }
                if hot[phys] {
                    continue;
                }
                let page = n / per;
                let at = (page * PAGE) as usize;
                let Some(values) = decode_checksum_page(page, &region[at..at + PAGE as usize])
                else {
                    return bad(format!(
                        "checksum page {page} of cold extent {phys} fails to verify"
                    ));
                };
                let durable = values[(n % per) as usize];
                if durable != want && durable != CHECKSUM_UNKNOWN {
                    return bad(format!(
                        "cold extent {phys} block {i}: checksum {durable:#x} on disk, {want:#x} in memory"
                    ));
                }
            }
        }
        Ok(())
    }
}
