//! The store's metadata as a pure state machine: who owns each physical
//! extent and which volumes exist. The same `apply` runs at runtime and when
//! the journal is replayed, so both reach the same state; it also records
//! which table pages changed, for the next checkpoint.
//!
//! Invariant: `allocated[slot]` equals the number of extents whose owner is
//! `slot`, and every owned extent's slot holds a live volume.

use crate::format::{
    ExtentOwner, JournalEntry, Layout, VolumeSlot, EXTENT_ENTRY_SIZE, PAGE, VOLUME_SLOT_SIZE,
};
use std::collections::BTreeSet;

pub(crate) struct MetaState {
    pub layout: Layout,
    /// Indexed by physical extent.
    pub owners: Vec<ExtentOwner>,
    /// Indexed by slot - 1.
    pub slots: Vec<Option<VolumeSlot>>,
    /// Extents owned, indexed by slot - 1.
    pub allocated: Vec<u64>,
    pub dirty_extent_pages: BTreeSet<u64>,
    pub dirty_slot_pages: BTreeSet<u64>,
}

impl MetaState {
    pub fn new(
        layout: Layout,
        owners: Vec<ExtentOwner>,
        slots: Vec<Option<VolumeSlot>>,
    ) -> MetaState {
        let mut allocated = vec![0u64; slots.len()];
        for o in &owners {
            if let Some(a) = (o.slot as usize)
                .checked_sub(1)
                .and_then(|i| allocated.get_mut(i))
            {
                *a += 1;
            }
        }
        MetaState {
            layout,
            owners,
            slots,
            allocated,
            dirty_extent_pages: BTreeSet::new(),
            dirty_slot_pages: BTreeSet::new(),
        }
    }

    pub fn extents_for_size(&self, size: u64) -> u64 {
        size.div_ceil(self.layout.extent_size as u64)
    }

    pub fn slot(&self, slot: u32) -> Option<&VolumeSlot> {
        self.slots.get((slot as usize).checked_sub(1)?)?.as_ref()
    }

    pub fn free_slot(&self) -> Option<u32> {
        self.slots
            .iter()
            .position(|s| s.is_none())
            .map(|i| i as u32 + 1)
    }

    fn set_owner(&mut self, phys: u32, owner: ExtentOwner, freed: &mut Vec<u32>) {
        let old = self.owners[phys as usize];
        if old == owner {
            return;
        }
        if let Some(a) = (old.slot as usize)
            .checked_sub(1)
            .and_then(|i| self.allocated.get_mut(i))
        {
            *a -= 1;
        }
        if let Some(a) = (owner.slot as usize)
            .checked_sub(1)
            .and_then(|i| self.allocated.get_mut(i))
        {
            *a += 1;
        }
        if owner.is_free() && !old.is_free() {
            freed.push(phys);
        }
        self.owners[phys as usize] = owner;
        self.dirty_extent_pages
            .insert(phys as u64 * EXTENT_ENTRY_SIZE / PAGE);
    }

    fn set_slot(&mut self, slot: u32, value: Option<VolumeSlot>) {
        let i = slot as usize - 1;
        self.slots[i] = value;
        self.dirty_slot_pages
            .insert(i as u64 * VOLUME_SLOT_SIZE / PAGE);
    }

    /// Frees every extent of `slot` whose logical index is `>= first_gone`.
    fn free_from(&mut self, slot: u32, first_gone: u64, freed: &mut Vec<u32>) {
        for phys in 0..self.owners.len() {
            let o = self.owners[phys];
            if o.slot == slot && o.logical as u64 >= first_gone {
                self.set_owner(phys as u32, ExtentOwner::FREE, freed);
            }
        }
    }

    /// Applies one change; extents it frees are appended to `freed`. An
    /// entry that does not fit the tables (a corrupt journal) is an error.
    pub fn apply(&mut self, entry: &JournalEntry, freed: &mut Vec<u32>) -> Result<(), String> {
        let n_ext = self.owners.len() as u32;
        let n_slots = self.slots.len() as u32;
        let valid_slot = |s: u32| s >= 1 && s <= n_slots;
        match *entry {
            JournalEntry::Map {
                phys,
                slot,
                logical,
            } => {
                if phys >= n_ext || !valid_slot(slot) {
                    return Err(format!(
                        "journal maps extent {phys} to slot {slot}: out of range"
                    ));
                }
                self.set_owner(phys, ExtentOwner { slot, logical }, freed);
            }
            JournalEntry::Unmap { phys } => {
                if phys >= n_ext {
                    return Err(format!("journal unmaps extent {phys}: out of range"));
                }
                self.set_owner(phys, ExtentOwner::FREE, freed);
            }
            JournalEntry::CreateVolume {
                slot,
                id,
                size,
                created_unix,
            } => {
                if !valid_slot(slot) {
                    return Err(format!(
                        "journal creates volume in slot {slot}: out of range"
                    ));
                }
                let vs = VolumeSlot {
                    id,
                    size,
                    created_unix,
                    parent_slot: 0,
                    flags: 0,
                    epoch: 0,
                };
                self.set_slot(slot, Some(vs));
            }
            JournalEntry::ResizeVolume { slot, size } => {
                let Some(mut vs) = self.slot(slot).copied() else {
                    return Err(format!("journal resizes missing volume slot {slot}"));
                };
                vs.size = size;
                self.set_slot(slot, Some(vs));
                let keep = self.extents_for_size(size);
                self.free_from(slot, keep, freed);
            }
            JournalEntry::DeleteVolume { slot } => {
                if !valid_slot(slot) {
                    return Err(format!("journal deletes volume slot {slot}: out of range"));
                }
                self.set_slot(slot, None);
                self.free_from(slot, 0, freed);
            }
        }
        Ok(())
    }

    /// The on-disk bytes of extent-table page `page`.
    pub fn encode_extent_page(&self, page: u64, out: &mut [u8]) {
        out.fill(0);
        let per_page = (PAGE / EXTENT_ENTRY_SIZE) as usize;
        let first = page as usize * per_page;
        for (i, o) in self.owners.iter().skip(first).take(per_page).enumerate() {
            let at = i * EXTENT_ENTRY_SIZE as usize;
            out[at..at + EXTENT_ENTRY_SIZE as usize].copy_from_slice(&o.encode());
        }
    }

    /// The on-disk bytes of volume-table page `page`.
    pub fn encode_slot_page(&self, page: u64, out: &mut [u8]) {
        out.fill(0);
        let per_page = (PAGE / VOLUME_SLOT_SIZE) as usize;
        let first = page as usize * per_page;
        for (i, s) in self.slots.iter().skip(first).take(per_page).enumerate() {
            let at = i * VOLUME_SLOT_SIZE as usize;
            out[at..at + VOLUME_SLOT_SIZE as usize]
                .copy_from_slice(&VolumeSlot::encode(s.as_ref()));
        }
    }
}
