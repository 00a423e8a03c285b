//! Space: handing extents to volumes and taking them back.
//!
//! Invariants (each is a rule of docs/format.md):
//! - An extent is handed to a volume only from the reserved pool: extents
//!   whose "free, dirty" entry is durable. Should the store stop before the
//!   volume's mapping is durable, recovery finds the extent dirty and zeroes
//!   it, so data written into it never shows up in another volume — and the
//!   work of an unclean start is bounded by the pool and the pending frees,
//!   not by capacity.
//! - An extent taken from a volume (TRIM, shrink, delete) is zeroed only
//!   after that release is durable, and returns to the free set only after
//!   the zeroing is flushed. Its "clean" entry may be lost in a crash; the
//!   extent is then zeroed again.
//! - Zeroing runs on a background thread (or on the allocating thread when
//!   nothing else is free), never inside a client's FLUSH.

use crate::engine::Store;
use crate::error::StoreError;
use crate::format::JournalEntry;
use crate::layer_map::{MapEntry, VolumeState};
use parking_lot::{Condvar, Mutex};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Extents reserved at a time at first: one commit per this many first
/// writes. The batch doubles each time a writer finds the pool empty (a
/// burst of first writes: a new volume filled, the first writes after a
/// snapshot), up to `MAX_RESERVED_BYTES`, and halves again when refills
/// are a second apart.
pub(crate) const RESERVE_BATCH: u64 = 64;
/// The most a batch reserves: what an unclean start may have to zero.
const MAX_RESERVED_BYTES: u64 = 1 << 30;
/// With background zeroing on, the pool is topped up by the background
/// thread when it holds fewer than this many extents (or a quarter of the
/// batch, if more).
const REFILL_BELOW: usize = 16;
/// Refills further apart than this halve the batch.
const CALM: std::time::Duration = std::time::Duration::from_secs(1);

/// Consecutive runs of sorted extent numbers, as (first, count).
pub(crate) fn runs(sorted: &[u32]) -> Vec<(u32, u32)> {
    let mut out: Vec<(u32, u32)> = Vec::new();
    for &p in sorted {
        match out.last_mut() {
            Some((first, n)) if *first + *n == p => *n += 1,
            _ => out.push((p, 1)),
        }
    }
    out
}

/// The most bytes one call zeroes (see `zero_freed`).
const ZEROING_PIECE: u64 = 32 << 20;

impl Store {
    /// Maps a reserved extent at `logical` of `vol` (whose layer is in
    /// `slot`), unless another writer mapped `entry` first. Called with the
    /// volume's map lock held.
    pub(crate) fn allocate(
        &self,
        vol: &VolumeState,
        slot: u32,
        logical: u32,
        entry: &MapEntry,
    ) -> Result<u32, StoreError> {
        for _ in 0..4 {
            let reserving = {
                let mut m = self.meta.lock();
                if let Some(phys) = entry.get() {
                    return Ok(phys);
                }
                let popped = m.reserved.pop();
                if popped.is_none() {
                    // A writer waits for a reservation: reserve more at once.
                    let max =
                        (MAX_RESERVED_BYTES / self.layout.extent_size as u64).max(RESERVE_BATCH);
                    m.reserve_batch = (m.reserve_batch * 2).min(max);
                }
                if let Some(phys) = popped {
                    m.push(JournalEntry::Map {
                        phys,
                        slot,
                        logical,
                    });
                    if let Some(intent) = &self.intent {
                        intent.mapped(phys);
                    }
                    if let Some(presence) = &self.presence {
                        presence.clear_extent(phys);
                    }
                    entry.set(Some(phys));
                    vol.add_allocated(1);
                    let low = m.reserved.len() + m.reserving.len() < Self::refill_below(&m);
                    drop(m);
                    if low {
                        // Top the pool up off the write path.
                        self.zeroer.wake();
                    }
                    return Ok(phys);
                }
                Self::reserve_batch(&mut m)
            };
            // Makes the reservation durable (or, with nothing free, the
            // pending releases, so they can be zeroed).
            self.commit()?;
            if !reserving {
                self.zero_freed()?;
            }
        }
        Err(StoreError::NoSpace)
    }

    fn refill_below(m: &crate::engine::Meta) -> usize {
        REFILL_BELOW.max(m.reserve_batch as usize / 4)
    }

    /// Takes up to a batch of free extents into `reserving`, queueing the
    /// entries that mark them dirty; whether it took any.
    pub(crate) fn reserve_batch(m: &mut crate::engine::Meta) -> bool {
        let want = m.reserve_batch.min(m.free.count()).max(1);
        let mut taken = Vec::new();
        while (taken.len() as u64) < want {
            match m.free.take() {
                Some(p) => taken.push(p),
                None => break,
            }
        }
        taken.sort_unstable();
        for (first, count) in runs(&taken) {
            m.push(JournalEntry::Free { first, count });
        }
        let got = !taken.is_empty();
        m.reserving.extend(taken);
        got
    }

    /// Background: when the reserved pool runs low, reserves another batch
    /// and commits it, so that first writes rarely wait for a commit.
    pub(crate) fn refill_reserved(&self) -> Result<(), StoreError> {
        let reserving = {
            let mut m = self.meta.lock();
            if m.reserved.len() + m.reserving.len() >= Self::refill_below(&m) {
                return Ok(());
            }
            let now = Instant::now();
            if m.last_refill.is_some_and(|t| now.duration_since(t) > CALM) {
                m.reserve_batch = (m.reserve_batch / 2).max(RESERVE_BATCH);
            }
            m.last_refill = Some(now);
            Self::reserve_batch(&mut m)
        };
        if reserving {
            self.commit()?;
        }
        Ok(())
    }

    /// Zeroes every extent whose release is durable, flushes, and returns
    /// them to the free set; the number zeroed.
    pub fn zero_freed(&self) -> Result<usize, StoreError> {
        let _pass = self.zeroing.lock();
        self.check_usable()?;
        let mut batch = std::mem::take(&mut self.meta.lock().to_zero);
        if batch.is_empty() {
            return Ok(0);
        }
        batch.sort_unstable();
        let es = self.layout.extent_size as u64;
        let runs = runs(&batch);
        for &(first, count) in &runs {
            // On failure the extents stay out of the free set (and dirty on
            // disk): a restart zeroes them. In pieces of at most
            // `ZEROING_PIECE`: a file device zeroes with `fallocate`, which
            // holds the file against direct I/O for its whole length, and
            // client writes must not wait for a whole deleted layer's.
            let (start, len) = (self.layout.extent_offset(first), count as u64 * es);
            let mut at = 0;
            while at < len {
                let piece = (len - at).min(ZEROING_PIECE.max(es));
                self.device
                    .discard_zeroes(start + at, piece)
                    .map_err(|e| self.fail(e.into()))?;
                at += piece;
            }
        }
        self.device.flush().map_err(|e| self.fail(e.into()))?;
        if let Some(sums) = &self.checksums {
            let bpe = self.layout.blocks_per_extent();
            for &p in &batch {
                sums.set_range(p as u64 * bpe, bpe, crate::integrity::zero_block_crc());
            }
        }
        let mut m = self.meta.lock();
        for (first, count) in runs {
            m.push(JournalEntry::Clean { first, count });
        }
        for &p in &batch {
            m.free.release(p);
        }
        Ok(batch.len())
    }

    /// At a clean close: reserved extents were never handed out, so they
    /// are still zero; mark them clean again.
    pub(crate) fn release_reserved(&self) {
        let mut m = self.meta.lock();
        let mut reserved = std::mem::take(&mut m.reserved);
        reserved.sort_unstable();
        for (first, count) in runs(&reserved) {
            m.push(JournalEntry::Clean { first, count });
        }
        for p in reserved {
            m.free.release(p);
        }
    }
}

#[derive(Default)]
struct Signal {
    wake: bool,
    stop: bool,
}

/// The background thread of a store: zeroes freed extents, tops up the
/// reserved pool, and runs a cooling round every `cooling_interval`.
#[derive(Default)]
pub(crate) struct Zeroer {
    signal: Arc<(Mutex<Signal>, Condvar)>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Zeroer {
    pub fn spawn(store: &Arc<Store>) {
        let weak: Weak<Store> = Arc::downgrade(store);
        let signal = store.zeroer.signal.clone();
        let interval = store.cooling_interval;
        let spawned = std::thread::Builder::new()
            .name("basalt-zeroer".into())
            .spawn(move || {
                let mut next_cooling = Instant::now() + interval;
                loop {
                    let cooling_due = {
                        let (lock, cv) = &*signal;
                        let mut s = lock.lock();
                        loop {
                            if s.stop {
                                return;
                            }
                            if s.wake {
                                s.wake = false;
                                break false;
                            }
                            if Instant::now() >= next_cooling {
                                break true;
                            }
                            // Wake now and then to notice a dropped store.
                            let wait = next_cooling
                                .saturating_duration_since(Instant::now())
                                .min(Duration::from_secs(1));
                            if cv.wait_for(&mut s, wait).timed_out() && weak.strong_count() == 0 {
                                return;
                            }
                        }
                    };
                    let Some(store) = weak.upgrade() else { return };
                    let result = if cooling_due {
                        next_cooling = Instant::now() + interval;
                        store.cool(false).map(drop)
                    } else {
                        store.zero_freed().and_then(|_| store.refill_reserved())
                    };
                    if let Err(e) = result {
                        tracing::warn!(error = %e, "background zeroing, reserving or cooling failed");
                    }
                }
            });
        match spawned {
            Ok(handle) => *store.zeroer.thread.lock() = Some(handle),
            Err(e) => {
                tracing::warn!(error = %e, "no background zeroing thread; freed extents are zeroed when space runs out")
            }
        }
        // At once: dirty extents from the last run, and a first batch of
        // reserved extents.
        store.zeroer.wake();
    }

    pub fn wake(&self) {
        let (lock, cv) = &*self.signal;
        lock.lock().wake = true;
        cv.notify_one();
    }

    /// Stops the thread and waits for it (unless called on it).
    pub fn stop(&self) {
        let (lock, cv) = &*self.signal;
        lock.lock().stop = true;
        cv.notify_one();
        if let Some(handle) = self.thread.lock().take() {
            if handle.thread().id() != std::thread::current().id() {
                let _ = handle.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::runs;

    #[test]
    fn runs_of_sorted_extents() {
        assert_eq!(runs(&[]), vec![]);
        assert_eq!(runs(&[1, 2, 3, 7, 9, 10]), vec![(1, 3), (7, 1), (9, 2)]);
    }
}
