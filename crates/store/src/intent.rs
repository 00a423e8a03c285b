//! Write intent: which extents may hold writes whose data checksums are not
//! durable ("hot" extents), and cooling, which makes their checksums
//! durable and marks them cold again. This is what lets a 4 KiB overwrite
//! in place cost one device write and no metadata while its checksum lives
//! in the checksum region, apart from the data.
//!
//! Invariants (docs/format.md, "Data checksums"):
//! - A write reaches an owned extent only while the extent is durably hot
//!   (a `Hot` entry, or the `Map` that gave it to its volume, is journaled;
//!   a write into a mapping not yet durable lands in an extent recovery
//!   zeroes). After a crash a hot extent's blocks are taken as they are at
//!   their first read, so a crash between a data write and its checksum
//!   never makes a block fail verification.
//! - An extent turns cold only after every write to it that passed the hot
//!   check has completed and its checksum pages are written and flushed
//!   (with the data they describe); the `Cold` entry follows. A writer
//!   that finds it cooling heats it again (a `Hot` entry, committed before
//!   it writes).
//! - Hot and cold marks change under the metadata lock, in journal order.
//!
//! Per extent, `state` is 0 (cold), `HOT` (durably hot), or the number of a
//! queued `Hot` entry (hot once that entry is durable), with `COOLING` set
//! while a cooling round works on it.

use crate::buf::AlignedBuf;
use crate::device::{BlockDevice, IoOp};
use crate::engine::Store;
use crate::error::StoreError;
use crate::format::{encode_checksum_page, JournalEntry, Layout, CHECKSUMS_PER_PAGE, PAGE};
use crate::integrity::DataChecksums;
use crate::space::runs;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

const HOT: u64 = 1 << 62;
const COOLING: u64 = 1 << 63;

pub(crate) struct Intent {
    state: Vec<AtomicU64>,
    /// The cooling round during which each extent was last written.
    last_write: Vec<AtomicU32>,
    /// Writes (and in-place zeroings) that ever passed the hot check of
    /// each extent, wrapping: compaction packs an extent only if its stamp
    /// did not change while it was compressed (`packing.rs`).
    stamps: Vec<AtomicU32>,
    round: AtomicU32,
    /// Hot extents beyond this many are cooled even if recently written.
    max_hot: usize,
    /// Rounds an extent must go unwritten to be cooled.
    idle_rounds: u32,
}

impl Intent {
    pub fn new(
        extents: u32,
        hot: impl Fn(u32) -> bool,
        max_hot: usize,
        idle_rounds: u32,
    ) -> Intent {
        Intent {
            state: (0..extents)
                .map(|p| AtomicU64::new(if hot(p) { HOT } else { 0 }))
                .collect(),
            last_write: (0..extents).map(|_| AtomicU32::new(0)).collect(),
            stamps: (0..extents).map(|_| AtomicU32::new(0)).collect(),
            round: AtomicU32::new(1),
            max_hot,
            idle_rounds,
        }
    }

    /// A newly mapped extent is hot at once (its `Map` entry says so). A
    /// virtual (packed) extent is never written, and has no intent.
    pub fn mapped(&self, phys: u32) {
        if let Some(s) = self.state.get(phys as usize) {
            s.store(HOT, Ordering::Release);
        }
    }

    /// Cooling rounds since extent `phys` was last written (since the
    /// open, if it was not).
    pub fn idle_rounds(&self, phys: u32) -> u32 {
        let last = self
            .last_write
            .get(phys as usize)
            .map_or(0, |w| w.load(Ordering::Relaxed));
        self.round.load(Ordering::Relaxed).saturating_sub(last)
    }

    /// Extent `phys`'s write stamp (see `stamps`).
    pub fn stamp(&self, phys: u32) -> u32 {
        self.stamps
            .get(phys as usize)
            .map_or(0, |s| s.load(Ordering::Acquire))
    }

    /// Extents currently marked hot (durably or queued).
    pub fn hot_count(&self) -> usize {
        self.state
            .iter()
            .filter(|s| s.load(Ordering::Relaxed) & !COOLING != 0)
            .count()
    }
}

impl Store {
    /// Whether a write to extent `phys` can go ahead without a commit
    /// (it is durably hot, or nothing tracks write intent).
    pub(crate) fn is_hot(&self, phys: u32) -> bool {
        if self.layout.is_virtual(phys) {
            return false; // a packed extent is unpacked before any write
        }
        self.intent
            .as_ref()
            .is_none_or(|intent| intent.state[phys as usize].load(Ordering::Acquire) == HOT)
    }

    /// Before a write (or an in-place zeroing) reaches owned extent `phys`:
    /// makes sure it is durably hot, committing a `Hot` entry if it is not.
    /// Called with the volume's map lock held (shared or exclusive).
    pub(crate) fn heat(&self, phys: u32) -> Result<(), StoreError> {
        let Some(intent) = &self.intent else {
            return Ok(());
        };
        let Some(cell) = intent.state.get(phys as usize) else {
            return Err(StoreError::Format(format!(
                "extent {phys} is packed; it is unpacked before it is written"
            )));
        };
        intent.stamps[phys as usize].fetch_add(1, Ordering::AcqRel);
        intent.last_write[phys as usize]
            .store(intent.round.load(Ordering::Relaxed), Ordering::Relaxed);
        let s = cell.load(Ordering::Acquire);
        if s == HOT {
            return Ok(());
        }
        let seq = if s != 0 && s & COOLING == 0 {
            s
        } else {
            let mut m = self.meta.lock();
            let s = cell.load(Ordering::Acquire);
            if s != 0 && s & COOLING == 0 {
                s
            } else {
                m.push(JournalEntry::Hot {
                    first: phys,
                    count: 1,
                });
                let seq = m.appended.load(Ordering::Acquire);
                cell.store(seq, Ordering::Release);
                seq
            }
        };
        if seq != HOT && !self.entries_durable(seq) {
            self.commit()?;
        }
        let _ = cell.compare_exchange(seq, HOT, Ordering::AcqRel, Ordering::Acquire);
        Ok(())
    }

    /// One cooling round: extents not written for `cool_after` (all of them
    /// with `everything`, and the least recently written beyond the hot
    /// limit) get their checksums written and become cold. Returns how many
    /// did.
    pub fn cool(&self, everything: bool) -> Result<usize, StoreError> {
        let (Some(intent), Some(sums)) = (&self.intent, &self.checksums) else {
            return Ok(0);
        };
        let _round = self.cooling.lock();
        self.check_usable()?;
        let round = intent.round.fetch_add(1, Ordering::AcqRel) + 1;
        let mut hot: Vec<(u32, u32)> = Vec::new(); // (last written, extent)
        for (phys, s) in intent.state.iter().enumerate() {
            if s.load(Ordering::Acquire) == HOT {
                hot.push((intent.last_write[phys].load(Ordering::Relaxed), phys as u32));
            }
        }
        hot.sort_unstable();
        let idle = hot.partition_point(|&(w, _)| w.saturating_add(intent.idle_rounds) < round);
        let over = hot.len().saturating_sub(intent.max_hot);
        let take = if everything {
            hot.len()
        } else {
            idle.max(over)
        };
        let mut cooling: Vec<u32> = hot[..take]
            .iter()
            .map(|&(_, p)| p)
            .filter(|&p| {
                intent.state[p as usize]
                    .compare_exchange(HOT, HOT | COOLING, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            })
            .collect();
        if cooling.is_empty() {
            return Ok(0);
        }
        cooling.sort_unstable();
        // Every batch that passed the hot check before the marks holds its
        // volume's map lock until its writes complete: wait for them.
        let volumes: Vec<_> = self.meta.lock().volumes.values().cloned().collect();
        for v in volumes {
            drop(v.map.write());
        }
        // The checksums, flushed with the data they describe (the extents
        // are durably hot until the `Cold` entries that follow).
        let result = self.write_checksum_pages(sums, &cooling);
        let mut m = self.meta.lock();
        let mut cooled = Vec::with_capacity(cooling.len());
        for &p in &cooling {
            let done = if result.is_ok() { 0 } else { HOT };
            // Fails if a writer heated it again meanwhile.
            if intent.state[p as usize]
                .compare_exchange(HOT | COOLING, done, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
                && done == 0
            {
                cooled.push(p);
            }
        }
        result?;
        for (first, count) in runs(&cooled) {
            m.push(JournalEntry::Cold { first, count });
        }
        Ok(cooled.len())
    }

    /// Writes the checksum pages covering `extents` (sorted) from the
    /// in-memory values, and flushes.
    fn write_checksum_pages(
        &self,
        sums: &DataChecksums,
        extents: &[u32],
    ) -> Result<(), StoreError> {
        let layout = self.layout;
        let bpe = layout.blocks_per_extent();
        let per = CHECKSUMS_PER_PAGE as u64;
        let pages: BTreeSet<u64> = extents
            .iter()
            .flat_map(|&p| {
                let first = p as u64 * bpe;
                first / per..=(first + bpe - 1) / per
            })
            .collect();
        let pages: Vec<u64> = pages.into_iter().collect();
        write_pages(self.device.as_ref(), &layout, sums, &pages)
            .and_then(|()| Ok(self.device.flush()?))
            .map_err(|e| self.fail(e))
    }
}

/// Writes checksum pages `pages` from the in-memory values (unflushed).
pub(crate) fn write_pages(
    device: &dyn BlockDevice,
    layout: &Layout,
    sums: &DataChecksums,
    pages: &[u64],
) -> Result<(), StoreError> {
    let per = CHECKSUMS_PER_PAGE as u64;
    const BATCH: usize = 256;
    let mut buf = AlignedBuf::zeroed(0);
    for group in pages.chunks(BATCH) {
        buf.set_len(group.len() * PAGE as usize);
        for (i, &page) in group.iter().enumerate() {
            let first = page * per;
            let count = per.min(sums.blocks().saturating_sub(first));
            encode_checksum_page(
                page,
                &sums.values(first, count),
                &mut buf[i * PAGE as usize..(i + 1) * PAGE as usize],
            );
        }
        let mut ops: Vec<IoOp<'_>> = buf
            .chunks(PAGE as usize)
            .zip(group)
            .map(|(chunk, &page)| IoOp::write(layout.checksum_page_offset(page), chunk, false))
            .collect();
        device.submit(&mut ops);
        for op in ops {
            op.result?;
        }
    }
    Ok(())
}
