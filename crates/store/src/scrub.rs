//! Scrub: reads every written block of a volume and checks it against its
//! checksum, so that damage is found before a client reads it (or before
//! the only other copy is lost), at a bounded rate.
//!
//! The background scrubber (`Scrubber`, one thread per store) takes the
//! volume most overdue — last complete scrub (kept in its volume slot) or
//! creation, plus the interval and a per-volume offset of up to a tenth
//! of it, so passes spread out — and scrubs it whole at the configured
//! rate, like Ceph's weekly deep scrub.
//!
//! Invariants: a scrub reads through the same checked path as a client
//! read (a block racing a client write is read again, never reported), and
//! holds the volume's map lock shared one extent at a time, so client I/O,
//! TRIM and resize interleave with it.

use crate::buf::AlignedBuf;
use crate::device::IoOp;
use crate::engine::{now_unix, Store};
use crate::error::IoError;
use crate::format::JournalEntry;
use crate::layer_map::MapEntry;
use crate::volume::LocalVolume;
use crate::{VolumeId, BLOCK_SIZE};
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Scrubbing done since the store was opened (client-asked and background).
#[derive(Default)]
pub(crate) struct ScrubCounters {
    pub bytes: AtomicU64,
    pub bad_blocks: AtomicU64,
    pub passes: AtomicU64,
}

/// What a scrub found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScrubReport {
    /// Bytes read and checked (allocated extents only).
    pub bytes_checked: u64,
    /// Volume offsets of 4 KiB blocks that fail their checksum.
    pub bad_blocks: Vec<u64>,
    /// False for a store without data checksums: nothing could be checked.
    pub checksums: bool,
}

impl LocalVolume {
    /// Reads and checks every allocated block of the extents that overlap
    /// `range` (of the volume's address space), at most `rate` bytes per
    /// second if given; `progress(done, total)` after every extent (bytes of
    /// allocated extents in the range).
    pub fn scrub(
        &self,
        range: std::ops::Range<u64>,
        rate: Option<u64>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<ScrubReport, IoError> {
        let store = self.store();
        let Some(sums) = store.checksums.as_ref() else {
            return Ok(ScrubReport::default());
        };
        let layout = store.layout;
        let es = layout.extent_size as u64;
        let (first, end) = {
            let map = self.state().map.read();
            let end = range.end.div_ceil(es).min(map.len() as u64) as usize;
            ((range.start / es) as usize, end)
        };
        let total = {
            let map = self.state().map.read();
            (first..end)
                .filter(|&l| map.get(l).and_then(MapEntry::get).is_some())
                .count() as u64
                * es
        };
        let mut report = ScrubReport {
            checksums: true,
            ..ScrubReport::default()
        };
        let mut buf = AlignedBuf::zeroed(es as usize);
        let pacer = crate::Pacer::new(rate);
        let b = BLOCK_SIZE as usize;
        for logical in first..end {
            {
                let map = self.state().map.read();
                if self.state().is_deleted() {
                    return Err(IoError::Gone);
                }
                let Some(phys) = map.get(logical).and_then(MapEntry::get) else {
                    continue;
                };
                if layout.is_virtual(phys) {
                    // A run verifies every record against its own CRC;
                    // block by block only to say which ones fail.
                    let cipher = store.cipher_of(self.state()).ok().flatten();
                    let cipher = cipher.as_deref();
                    match store.read_packed(phys, 0, &mut buf, cipher) {
                        Ok(()) => {}
                        Err(IoError::Corrupt { .. }) => {
                            for (i, block) in buf.chunks_mut(b).enumerate() {
                                let within = (i * b) as u64;
                                match store.read_packed(phys, within, block, cipher) {
                                    Ok(()) => {}
                                    Err(IoError::Corrupt { .. }) => {
                                        report.bad_blocks.push(logical as u64 * es + within)
                                    }
                                    Err(e) => return Err(e),
                                }
                            }
                        }
                        Err(e) => return Err(e),
                    }
                    drop(map);
                    report.bytes_checked += es;
                    store.scrubbed.bytes.fetch_add(es, Ordering::Relaxed);
                    progress(report.bytes_checked, total.max(report.bytes_checked));
                    pacer.wait(report.bytes_checked);
                    continue;
                }
                let at = layout.extent_offset(phys);
                let mut samples = Vec::with_capacity(buf.len() / b);
                sums.sample_blocks(layout.data_block_at(at), es / BLOCK_SIZE, &mut samples);
                let mut ops = [IoOp::read(at, &mut buf)];
                store.device.submit(&mut ops);
                let [op] = ops;
                op.result?;
                for (i, block) in buf.chunks_mut(b).enumerate() {
                    let off = at + (i * b) as u64;
                    match store.verify_read(sums, off, block, &samples[i..i + 1]) {
                        Ok(()) => {}
                        Err(IoError::Corrupt { .. }) => {
                            report.bad_blocks.push(logical as u64 * es + (i * b) as u64)
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
            report.bytes_checked += es;
            store.scrubbed.bytes.fetch_add(es, Ordering::Relaxed);
            progress(report.bytes_checked, total.max(report.bytes_checked));
            pacer.wait(report.bytes_checked);
        }
        store
            .scrubbed
            .bad_blocks
            .fetch_add(report.bad_blocks.len() as u64, Ordering::Relaxed);
        Ok(report)
    }
}

impl Store {
    /// Records that a scrub read all of volume `id` at `unix` (durable with
    /// the next commit: a lost record costs an early pass, nothing more).
    pub fn record_scrub(&self, id: VolumeId, unix: u64) {
        let Some(v) = self.meta.lock().volumes.get(&id).cloned() else {
            return;
        };
        // Lock order: the map (which names the layer's slot), then meta.
        let map = v.map.read();
        if v.is_deleted() {
            return;
        }
        v.set_last_scrub(unix);
        self.meta.lock().push(JournalEntry::Scrubbed {
            slot: map.slot,
            unix,
        });
    }

    /// The volume the background scrubber should scrub next, if one is due.
    fn next_scrub(&self, interval: Duration, now: u64) -> Option<VolumeId> {
        let m = self.meta.lock();
        let spread = (interval.as_secs() / 10).max(1);
        m.volumes
            .values()
            .filter(|v| !v.is_retired())
            .filter_map(|v| {
                let base = match v.last_scrub() {
                    0 => v.created_unix,
                    t => t,
                };
                let offset = (v.id.as_u128() as u64) % spread;
                let due = base
                    .saturating_add(interval.as_secs())
                    .saturating_add(offset);
                (due <= now).then_some((due, v.id))
            })
            .min()
            .map(|(_, id)| id)
    }
}

/// Bytes a background scrub reads per call: the thread notices a stop
/// between calls.
const SCRUB_WINDOW: u64 = 16 << 20;

#[derive(Default)]
struct Stop {
    stop: bool,
}

/// Called on the scrubbing thread after each complete background pass of
/// a volume, with the volume, the scrubber's rate and the volume offsets
/// of the blocks the pass found damaged: what a layer above adds to a
/// scrub (a cluster compares the volume's replicas, and has damage on a
/// secondary rewritten from the primary's copy).
pub type ScrubFollowUp = Arc<dyn Fn(VolumeId, u64, &[u64]) + Send + Sync>;

/// The background scrubbing thread of a store.
#[derive(Default)]
pub(crate) struct Scrubber {
    signal: Arc<(Mutex<Stop>, Condvar)>,
    thread: Mutex<Option<JoinHandle<()>>>,
    follow_up: Arc<Mutex<Option<ScrubFollowUp>>>,
}

impl Store {
    /// Sets what runs after each complete background scrub of a volume
    /// (replacing what was set before).
    pub fn on_scrub_pass(&self, follow_up: ScrubFollowUp) {
        *self.scrubber.follow_up.lock() = Some(follow_up);
    }
}

impl Scrubber {
    pub fn spawn(store: &Arc<Store>, interval: Duration, rate: u64) {
        let weak: Weak<Store> = Arc::downgrade(store);
        let signal = store.scrubber.signal.clone();
        let follow_up = store.scrubber.follow_up.clone();
        // Waits up to `d`; false once asked to stop or the store is gone.
        let pause = move |d: Duration, weak: &Weak<Store>| {
            let (lock, cv) = &*signal;
            let mut s = lock.lock();
            if !s.stop {
                cv.wait_for(&mut s, d);
            }
            !s.stop && weak.strong_count() > 0
        };
        let spawned = std::thread::Builder::new()
            .name("basalt-scrubber".into())
            .spawn(move || {
                let idle = (interval / 4).min(Duration::from_secs(10));
                while pause(idle, &weak) {
                    let Some(id) = weak
                        .upgrade()
                        .and_then(|s| s.next_scrub(interval, now_unix()))
                    else {
                        continue;
                    };
                    let mut at = 0;
                    let mut bad: Vec<u64> = Vec::new();
                    let started = Instant::now();
                    let finished = loop {
                        let Some(vol) = weak.upgrade().and_then(|s| s.volume(id).ok()) else {
                            break false; // deleted, or the store is gone
                        };
                        if at >= vol.size() {
                            break true;
                        }
                        match vol.scrub(at..at + SCRUB_WINDOW, Some(rate), &mut |_, _| {}) {
                            Ok(r) => bad.extend(r.bad_blocks),
                            Err(e) => {
                                tracing::warn!(volume = %id, error = %e, "background scrub stopped");
                                break false;
                            }
                        }
                        at += SCRUB_WINDOW;
                        drop(vol);
                        if !pause(Duration::ZERO, &weak) {
                            return;
                        }
                    };
                    if let (true, Some(store)) = (finished, weak.upgrade()) {
                        store.record_scrub(id, now_unix());
                        store.scrubbed.passes.fetch_add(1, Ordering::Relaxed);
                        if !bad.is_empty() {
                            tracing::error!(volume = %id, damaged_blocks = bad.len(), "background scrub found blocks that fail their checksum");
                        } else {
                            tracing::info!(volume = %id, seconds = started.elapsed().as_secs(), "background scrub found no damage");
                        }
                        drop(store);
                        let f = follow_up.lock().clone();
                        if let Some(f) = f {
                            f(id, rate, &bad);
                        }
                    }
                }
            });
        match spawned {
            Ok(handle) => *store.scrubber.thread.lock() = Some(handle),
            Err(e) => tracing::warn!(error = %e, "no background scrubbing thread"),
        }
    }

    /// Stops the thread and waits for it (unless called on it).
    pub fn stop(&self) {
        let (lock, cv) = &*self.signal;
        lock.lock().stop = true;
        cv.notify_all();
        if let Some(handle) = self.thread.lock().take() {
            if handle.thread().id() != std::thread::current().id() {
                let _ = handle.join();
            }
        }
    }
}
