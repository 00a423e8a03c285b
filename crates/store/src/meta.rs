//! The store's journaled metadata as a pure state machine: what each
//! physical extent is (owned, free and clean, free and dirty) and which
//! volume slots exist. It holds exactly what the tables on disk plus the
//! journal up to its head say: the engine applies an entry only when it
//! writes it to the journal, so a checkpoint (which writes these tables)
//! never puts on disk a state the journal does not lead to. The same
//! `apply` runs at runtime and at replay; it records the table pages it
//! changed, for the next checkpoint.
//!
//! With the layers feature it also holds the presence bits of every data
//! block (which blocks of a layer's extent hold that layer's data), laid
//! out like the presence region.
//!
//! With the packed-extents feature, `extents` also holds the virtual
//! extents (numbered after the physical ones), and `runs` where each
//! virtual extent's run lies; both are written to the virtual extent table.
//!
//! Invariant (the replay rule, docs/format.md): what an entry does to a
//! field depends only on that field and the entry, and a stale entry is a
//! no-op, never an error. An entry naming an extent or slot outside the
//! tables is corruption and is refused.

use crate::format::{
    encode_presence_sector, encode_virtual_entry, presence_bit, ExtentState, JournalEntry, Layout,
    RunLoc, SlotState, VolumeSlot, EXTENT_ENTRY_SIZE, PACK_SLOT, PAGE, PRESENCE_SECTOR,
    PRESENCE_WORDS_PER_SECTOR, SLOT_RETIRED, SLOT_SNAPSHOT, VIRTUAL_ENTRY_SIZE, VOLUME_SLOT_SIZE,
};
use std::collections::BTreeSet;

pub(crate) struct MetaState {
    pub layout: Layout,
    /// Indexed by extent number: physical extents, then virtual ones.
    pub extents: Vec<ExtentState>,
    /// Indexed by virtual extent number - `extent_count`: the run of an
    /// owned virtual extent (meaningless for a free one).
    pub runs: Vec<RunLoc>,
    /// Indexed by slot - 1.
    pub slots: Vec<SlotState>,
    /// Presence bits, `PRESENCE_WORDS_PER_SECTOR` words per sector of the
    /// region (empty without the layers feature).
    pub presence: Vec<u64>,
    pub dirty_extent_pages: BTreeSet<u64>,
    pub dirty_slot_pages: BTreeSet<u64>,
    /// Pages of the presence region.
    pub dirty_presence_pages: BTreeSet<u64>,
    /// Pages of the virtual extent table.
    pub dirty_virtual_pages: BTreeSet<u64>,
}

impl MetaState {
    /// `extents`: the physical extents' entries, then (packed-extents
    /// feature) the virtual ones', whose runs are `runs`.
    pub fn new(
        layout: Layout,
        extents: Vec<ExtentState>,
        runs: Vec<RunLoc>,
        slots: Vec<SlotState>,
    ) -> MetaState {
        debug_assert_eq!(extents.len(), layout.all_extents() as usize);
        MetaState {
            layout,
            extents,
            runs,
            slots,
            presence: vec![0; layout.presence_sectors as usize * PRESENCE_WORDS_PER_SECTOR],
            dirty_extent_pages: BTreeSet::new(),
            dirty_slot_pages: BTreeSet::new(),
            dirty_presence_pages: BTreeSet::new(),
            dirty_virtual_pages: BTreeSet::new(),
        }
    }

    /// Marks every page of the tables and the presence region for the
    /// next checkpoint (format, upgrade).
    pub fn mark_all_dirty(&mut self) {
        self.dirty_extent_pages = (0..self.layout.extent_table_pages()).collect();
        self.dirty_slot_pages = (0..self.layout.volume_table_pages()).collect();
        self.dirty_presence_pages = (0..self.layout.presence_len() / PAGE).collect();
        self.dirty_virtual_pages = (0..self.layout.virtual_table_pages()).collect();
    }

    /// Sets (or clears) the presence bits of blocks `first..first+count` of
    /// extent `phys`.
    /// A virtual extent has no presence bits: its run holds every block.
    fn set_presence(&mut self, phys: u32, first: u64, count: u64, present: bool) {
        if self.presence.is_empty() || self.layout.is_virtual(phys) {
            return;
        }
        let base = phys as u64 * self.layout.blocks_per_extent();
        for block in base + first..base + first + count {
            let (word, mask) = presence_bit(block);
            let old = self.presence[word];
            let new = if present { old | mask } else { old & !mask };
            if new != old {
                self.presence[word] = new;
                let sector = (word / PRESENCE_WORDS_PER_SECTOR) as u64;
                self.dirty_presence_pages
                    .insert(sector * PRESENCE_SECTOR as u64 / PAGE);
            }
        }
    }

    pub fn slot(&self, slot: u32) -> Option<&VolumeSlot> {
        self.slots.get((slot as usize).checked_sub(1)?)?.live()
    }

    /// Sets extent `phys`; reports it in `freed` when an owned extent
    /// becomes free (its old owner's data must be zeroed before reuse).
    fn set_extent(&mut self, phys: u32, value: ExtentState, freed: &mut Vec<u32>) {
        let old = self.extents[phys as usize];
        if old == value {
            return;
        }
        if matches!(old, ExtentState::Owned { .. }) && matches!(value, ExtentState::Free { .. }) {
            freed.push(phys);
            self.clear_presence(phys);
        }
        self.extents[phys as usize] = value;
        self.mark_extent_dirty(phys);
    }

    /// Marks the table page holding extent `phys`'s entry (the extent
    /// table's, or the virtual extent table's) for the next checkpoint.
    pub fn mark_extent_dirty(&mut self, phys: u32) {
        match phys.checked_sub(self.layout.extent_count) {
            Some(v) => self
                .dirty_virtual_pages
                .insert(v as u64 * VIRTUAL_ENTRY_SIZE / PAGE),
            None => self
                .dirty_extent_pages
                .insert(phys as u64 * EXTENT_ENTRY_SIZE / PAGE),
        };
    }

    fn check_virtual(&self, virt: u32) -> Result<usize, String> {
        self.extent_range(virt, 1)?;
        virt.checked_sub(self.layout.extent_count)
            .map(|v| v as usize)
            .ok_or_else(|| format!("extent {virt} is not a virtual extent"))
    }

    fn check_physical(&self, phys: u32) -> Result<(), String> {
        if phys < self.layout.extent_count {
            Ok(())
        } else {
            Err(format!("extent {phys} is not a physical extent"))
        }
    }

    fn clear_presence(&mut self, phys: u32) {
        let bpe = self.layout.blocks_per_extent();
        self.set_presence(phys, 0, bpe, false);
    }

    fn set_slot(&mut self, slot: u32, value: SlotState) {
        let i = slot as usize - 1;
        if self.slots[i] == value {
            return;
        }
        self.slots[i] = value;
        self.dirty_slot_pages
            .insert(i as u64 * VOLUME_SLOT_SIZE / PAGE);
    }

    /// Frees (dirty) every extent of `slot` whose logical index is `>= first_gone`.
    fn free_from(&mut self, slot: u32, first_gone: u64, freed: &mut Vec<u32>) {
        for phys in 0..self.extents.len() {
            if let ExtentState::Owned {
                slot: s, logical, ..
            } = self.extents[phys]
            {
                if s == slot && logical as u64 >= first_gone {
                    self.set_extent(phys as u32, ExtentState::DIRTY, freed);
                }
            }
        }
    }

    fn extent_range(&self, first: u32, count: u32) -> Result<std::ops::Range<u32>, String> {
        let end = first
            .checked_add(count)
            .filter(|&e| e as usize <= self.extents.len())
            .ok_or_else(|| format!("extents {first}+{count} are out of range"))?;
        Ok(first..end)
    }

    /// Applies one entry; extents it takes from an owner are appended to
    /// `freed`.
    pub fn apply(&mut self, entry: &JournalEntry, freed: &mut Vec<u32>) -> Result<(), String> {
        let n_slots = self.slots.len() as u32;
        let check_slot = |s: u32| {
            if s >= 1 && s <= n_slots {
                Ok(s)
            } else {
                Err(format!("slot {s} is out of range"))
            }
        };
        match *entry {
            JournalEntry::Map {
                phys,
                slot,
                logical,
            } => {
                self.extent_range(phys, 1)?;
                check_slot(slot)?;
                // A new mapping is hot: its first writes go out before the
                // mapping (and their checksums) are durable.
                let hot = self.layout.has_data_checksums();
                self.set_extent(phys, ExtentState::Owned { slot, logical, hot }, freed);
            }
            JournalEntry::Hot { first, count } | JournalEntry::Cold { first, count } => {
                let want = matches!(entry, JournalEntry::Hot { .. });
                for phys in self.extent_range(first, count)? {
                    if let ExtentState::Owned { slot, logical, hot } = self.extents[phys as usize] {
                        if hot != want {
                            let value = ExtentState::Owned {
                                slot,
                                logical,
                                hot: want,
                            };
                            self.set_extent(phys, value, freed);
                        }
                    }
                }
            }
            JournalEntry::Free { first, count } => {
                for phys in self.extent_range(first, count)? {
                    self.set_extent(phys, ExtentState::DIRTY, freed);
                    // Whatever it was: a reserved extent starts with none
                    // (stale entries replayed over newer tables may have
                    // left bits on a free extent).
                    self.clear_presence(phys);
                }
            }
            JournalEntry::Clean { first, count } => {
                for phys in self.extent_range(first, count)? {
                    self.set_extent(phys, ExtentState::CLEAN, freed);
                }
            }
            JournalEntry::CreateVolume {
                slot,
                id,
                size,
                created_unix,
                parent,
            } => {
                check_slot(slot)?;
                if parent != 0 {
                    check_slot(parent)?;
                }
                let vs = VolumeSlot {
                    id,
                    size,
                    created_unix,
                    parent_slot: parent,
                    flags: 0,
                    epoch: 0,
                    last_scrub_unix: 0,
                    origin: uuid::Uuid::nil(),
                };
                self.set_slot(slot, SlotState::Live(vs));
            }
            JournalEntry::Present { phys, first, count } => {
                self.extent_range(phys, 1)?;
                let bpe = self.layout.blocks_per_extent();
                if first as u64 + count as u64 > bpe {
                    return Err(format!(
                        "blocks {first}+{count} are beyond extent {phys}'s {bpe}"
                    ));
                }
                self.set_presence(phys, first as u64, count as u64, true);
            }
            JournalEntry::Snapshot {
                slot,
                new_slot,
                snap_id,
                snap_created,
                size,
                vol_id,
                vol_created,
                last_scrub,
            } => {
                check_slot(slot)?;
                check_slot(new_slot)?;
                if let Some(mut vs) = self.slot(slot).copied() {
                    vs.id = snap_id;
                    vs.created_unix = snap_created;
                    vs.size = size;
                    vs.flags |= SLOT_SNAPSHOT;
                    vs.origin = vol_id;
                    self.set_slot(slot, SlotState::Live(vs));
                }
                let head = VolumeSlot {
                    id: vol_id,
                    size,
                    created_unix: vol_created,
                    parent_slot: slot,
                    flags: 0,
                    epoch: 0,
                    last_scrub_unix: last_scrub,
                    origin: uuid::Uuid::nil(),
                };
                self.set_slot(new_slot, SlotState::Live(head));
            }
            JournalEntry::Unlink {
                slot,
                child,
                parent,
            } => {
                check_slot(slot)?;
                check_slot(child)?;
                if parent != 0 {
                    check_slot(parent)?;
                }
                self.set_slot(slot, SlotState::Free);
                self.free_from(slot, 0, freed);
                if let Some(mut vs) = self.slot(child).copied() {
                    vs.parent_slot = parent;
                    self.set_slot(child, SlotState::Live(vs));
                }
            }
            JournalEntry::Reparent { slot, parent } => {
                check_slot(slot)?;
                if parent != 0 {
                    check_slot(parent)?;
                }
                if let Some(mut vs) = self.slot(slot).copied() {
                    vs.parent_slot = parent;
                    self.set_slot(slot, SlotState::Live(vs));
                }
            }
            JournalEntry::Retire { slot } => {
                check_slot(slot)?;
                if let Some(mut vs) = self.slot(slot).copied() {
                    vs.flags |= SLOT_RETIRED;
                    self.set_slot(slot, SlotState::Live(vs));
                }
            }
            JournalEntry::Rollback { slot, parent, size } => {
                check_slot(slot)?;
                if parent != 0 {
                    check_slot(parent)?;
                }
                if let Some(mut vs) = self.slot(slot).copied() {
                    vs.parent_slot = parent;
                    vs.size = size;
                    self.set_slot(slot, SlotState::Live(vs));
                }
                self.free_from(slot, 0, freed);
            }
            JournalEntry::ResizeVolume { slot, size } => {
                check_slot(slot)?;
                if let Some(mut vs) = self.slot(slot).copied() {
                    vs.size = size;
                    self.set_slot(slot, SlotState::Live(vs));
                }
                // Regardless of the slot (the replay rule): an extent's fate
                // depends on the extent alone.
                let keep = self.layout.extents_for_size(size);
                self.free_from(slot, keep, freed);
            }
            JournalEntry::Scrubbed { slot, unix } => {
                check_slot(slot)?;
                if let Some(mut vs) = self.slot(slot).copied() {
                    vs.last_scrub_unix = unix;
                    self.set_slot(slot, SlotState::Live(vs));
                }
            }
            JournalEntry::DeleteVolume { slot } => {
                check_slot(slot)?;
                self.set_slot(slot, SlotState::Free);
                self.free_from(slot, 0, freed);
            }
            JournalEntry::Pack {
                virt,
                slot,
                logical,
                from,
                run,
            } => {
                let v = self.check_virtual(virt)?;
                self.check_physical(from)?;
                self.check_physical(run.pack)?;
                check_slot(slot)?;
                self.set_extent(from, ExtentState::DIRTY, freed);
                let pack = ExtentState::Owned {
                    slot: PACK_SLOT,
                    logical: 0,
                    hot: false,
                };
                self.set_extent(run.pack, pack, freed);
                let owned = ExtentState::Owned {
                    slot,
                    logical,
                    hot: false,
                };
                self.set_extent(virt, owned, freed);
                if self.runs[v] != run {
                    self.runs[v] = run;
                    self.mark_extent_dirty(virt);
                }
            }
            JournalEntry::Unpack {
                virt,
                slot,
                logical,
                to,
            } => {
                self.check_virtual(virt)?;
                self.check_physical(to)?;
                check_slot(slot)?;
                self.set_extent(virt, ExtentState::DIRTY, freed);
                let hot = self.layout.has_data_checksums();
                self.set_extent(to, ExtentState::Owned { slot, logical, hot }, freed);
                let bpe = self.layout.blocks_per_extent();
                self.set_presence(to, 0, bpe, true);
            }
        }
        Ok(())
    }

    /// The on-disk bytes of extent-table page `page`.
    pub fn encode_extent_page(&self, page: u64, out: &mut [u8]) {
        out.fill(0);
        let per_page = (PAGE / EXTENT_ENTRY_SIZE) as usize;
        let first = page as usize * per_page;
        let physical = &self.extents[..self.layout.extent_count as usize];
        for (i, e) in physical.iter().skip(first).take(per_page).enumerate() {
            let at = i * EXTENT_ENTRY_SIZE as usize;
            out[at..at + EXTENT_ENTRY_SIZE as usize].copy_from_slice(&e.encode((first + i) as u32));
        }
    }

    /// The on-disk bytes of virtual-extent-table page `page`.
    pub fn encode_virtual_page(&self, page: u64, out: &mut [u8]) {
        out.fill(0);
        let per_page = (PAGE / VIRTUAL_ENTRY_SIZE) as usize;
        let first = page as usize * per_page;
        let base = self.layout.extent_count as usize;
        let size = VIRTUAL_ENTRY_SIZE as usize;
        for (i, run) in self.runs.iter().skip(first).take(per_page).enumerate() {
            let virt = (base + first + i) as u32;
            let entry = encode_virtual_entry(virt, self.extents[virt as usize], *run);
            out[i * size..(i + 1) * size].copy_from_slice(&entry);
        }
    }

    /// The on-disk bytes of presence-region page `page`.
    pub fn encode_presence_page(&self, page: u64, out: &mut [u8]) {
        out.fill(0);
        let per_page = (PAGE as usize) / PRESENCE_SECTOR;
        for i in 0..per_page {
            let sector = page as usize * per_page + i;
            let words = sector * PRESENCE_WORDS_PER_SECTOR;
            if words >= self.presence.len() {
                break;
            }
            let at = i * PRESENCE_SECTOR;
            encode_presence_sector(
                sector as u64,
                &self.presence[words..words + PRESENCE_WORDS_PER_SECTOR],
                &mut out[at..at + PRESENCE_SECTOR],
            );
        }
    }

    /// The on-disk bytes of volume-table page `page`.
    pub fn encode_slot_page(&self, page: u64, out: &mut [u8]) {
        out.fill(0);
        let per_page = (PAGE / VOLUME_SLOT_SIZE) as usize;
        let first = page as usize * per_page;
        for (i, s) in self.slots.iter().skip(first).take(per_page).enumerate() {
            let at = i * VOLUME_SLOT_SIZE as usize;
            out[at..at + VOLUME_SLOT_SIZE as usize].copy_from_slice(&s.encode((first + i) as u32));
        }
    }
}
