//! Presence at runtime: which 4 KiB blocks of each extent hold data of the
//! layer that owns the extent (layers feature). One bit per data block,
//! laid out like the presence region, set lock-free by writers.
//!
//! Invariants:
//! - Only the extents of a layer with a parent consult their bits; a layer
//!   without one holds every block of its extents.
//! - A bit is set only after the write it records completed, and its
//!   `Present` entry is queued only then, so a commit that makes the entry
//!   durable (it flushes the device after writing the journal) makes the
//!   data durable too: after a power loss a block reads either what its
//!   layer wrote or, through the parent, what it held before.
//! - An extent handed to a layer starts with no bits (`clear_extent` at
//!   allocation; the journal's `Free` clears them on disk).
//! - Virtual (packed) extents have no bits and read as wholly present.

use crate::format::{presence_bit, JournalEntry, Layout, PRESENCE_WORDS_PER_SECTOR};
use std::sync::atomic::{AtomicU64, Ordering};

pub(crate) struct Presence {
    words: Vec<AtomicU64>,
    blocks_per_extent: u64,
    /// Blocks of physical extents; past them are the virtual extents'.
    data_blocks: u64,
}

impl Presence {
    /// Runtime bits starting from the journaled ones.
    pub fn new(layout: &Layout, journaled: &[u64]) -> Presence {
        debug_assert_eq!(
            journaled.len(),
            layout.presence_sectors as usize * PRESENCE_WORDS_PER_SECTOR
        );
        Presence {
            words: journaled.iter().map(|&w| AtomicU64::new(w)).collect(),
            blocks_per_extent: layout.blocks_per_extent(),
            data_blocks: layout.data_blocks(),
        }
    }

    /// Whether data block `block` (counted from the data region's start)
    /// holds data of its extent's layer.
    /// A block of a virtual (packed) extent is always present: its run
    /// holds every block.
    pub fn is_present(&self, block: u64) -> bool {
        if block >= self.data_blocks {
            return true;
        }
        let (word, mask) = presence_bit(block);
        self.words[word].load(Ordering::Acquire) & mask != 0
    }

    /// Marks blocks `first..first+count` present; queues (into `entries`)
    /// `Present` entries for those that were not.
    pub fn mark(&self, first: u64, count: u64, entries: &mut Vec<JournalEntry>) {
        let bpe = self.blocks_per_extent;
        let mut run: Option<(u64, u64)> = None;
        let flush = |run: (u64, u64), entries: &mut Vec<JournalEntry>| {
            entries.push(JournalEntry::Present {
                phys: (run.0 / bpe) as u32,
                first: (run.0 % bpe) as u32,
                count: run.1 as u32,
            });
        };
        for block in first..(first + count).min(self.data_blocks) {
            let (word, mask) = presence_bit(block);
            let was = self.words[word].fetch_or(mask, Ordering::AcqRel) & mask != 0;
            if was {
                continue;
            }
            run = match run {
                // Runs stay within one extent.
                Some((start, n)) if start + n == block && block % bpe != 0 => Some((start, n + 1)),
                Some(r) => {
                    flush(r, entries);
                    Some((block, 1))
                }
                None => Some((block, 1)),
            };
        }
        if let Some(r) = run {
            flush(r, entries);
        }
    }

    /// Clears every bit of extent `phys` (it is being handed to a layer).
    pub fn clear_extent(&self, phys: u32) {
        self.fill_extent(phys, false);
    }

    /// Sets every bit of extent `phys` in memory (an unpacked extent: its
    /// `Unpack` entry sets them on disk).
    pub fn set_extent(&self, phys: u32) {
        self.fill_extent(phys, true);
    }

    fn fill_extent(&self, phys: u32, present: bool) {
        let first = phys as u64 * self.blocks_per_extent;
        let end = (first + self.blocks_per_extent).min(self.data_blocks);
        for block in first..end {
            let (word, mask) = presence_bit(block);
            if present {
                self.words[word].fetch_or(mask, Ordering::AcqRel);
            } else {
                self.words[word].fetch_and(!mask, Ordering::AcqRel);
            }
        }
    }
}
