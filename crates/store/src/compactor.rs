//! Compression policy and compaction: which volumes are kept compressed
//! (`Store::set_compression`, set by the volume service from each volume's
//! record), compacting a volume and its snapshots now
//! (`Store::compact_volume`), and the background compactor, which packs the
//! *cold* extents of compressed volumes — those not written for the
//! store's `compact_after` (10 minutes by default) — at a bounded rate.
//!
//! Compression is post-process: writes land uncompressed (a 4 KiB write
//! costs what it always did), and data that has gone cold is packed. A
//! write to a packed extent unpacks it first (one extent read and
//! written), after which it stays unpacked until it is cold again.
//!
//! Invariants:
//! - A layer is compacted only through `Store::pack_extent`, whose
//!   checks make a compaction racing writes, TRIM or layer operations lose
//!   nothing (`packing.rs`).
//! - An extent found incompressible is not compressed again until it is
//!   written (its write stamp changes): the compactor does not burn CPU on
//!   the same random or encrypted data every pass.
//! - The background thread checks for a stop between extents: a close
//!   waits for at most one extent's compaction (and its pacing).

use crate::engine::Store;
use crate::error::StoreError;
use crate::format::Codec;
use crate::packing::PackOutcome;
use crate::VolumeId;
use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

/// What `Store::compact_volume` did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompactReport {
    /// Extents packed by this call, and their logical bytes.
    pub packed_extents: u64,
    pub packed_bytes: u64,
    /// Bytes their runs store.
    pub stored_bytes: u64,
    /// Extents left as they were: compressing saved less than an eighth.
    pub incompressible_extents: u64,
}

#[derive(Default)]
struct Signal {
    stop: bool,
}

/// The store's compression policy and background compactor.
#[derive(Default)]
pub(crate) struct Compactor {
    /// Volumes kept compressed, with their codec (their snapshots too).
    policy: Mutex<HashMap<VolumeId, Codec>>,
    /// (physical extent, write stamp) found incompressible.
    incompressible: Mutex<HashSet<(u32, u32)>>,
    signal: Arc<(Mutex<Signal>, Condvar)>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Cooling rounds an extent must go unwritten to be compacted.
    idle_rounds: std::sync::atomic::AtomicU32,
}

impl Store {
    /// Keeps volume `id` (and its snapshots) compressed with `codec`, or
    /// stops compacting it (`None`: what is packed stays packed until
    /// written). In memory: the volume service sets it at every start.
    pub fn set_compression(&self, id: VolumeId, codec: Option<Codec>) {
        let mut p = self.compactor.policy.lock();
        match codec {
            Some(c) => p.insert(id, c),
            None => p.remove(&id),
        };
    }

    /// Whether this store can keep data compressed (it was formatted with
    /// packed extents; stores formatted before them cannot).
    pub fn supports_compression(&self) -> bool {
        self.packing.is_some()
    }

    /// The codec volume `id` is kept compressed with, if any.
    pub fn compression(&self, id: VolumeId) -> Option<Codec> {
        self.compactor.policy.lock().get(&id).copied()
    }

    /// The layers of volume `id` to compact: its snapshots, then itself.
    fn layers_of(&self, id: VolumeId) -> Vec<(VolumeId, usize)> {
        let m = self.meta.lock();
        let mut out: Vec<(VolumeId, usize)> = m
            .volumes
            .values()
            .filter(|v| v.snapshot_of == Some(id) && !v.is_retired())
            .map(|v| (v.id, self.layout.extents_for_size(v.size()) as usize))
            .collect();
        if let Some(v) = m.volumes.get(&id) {
            out.push((id, self.layout.extents_for_size(v.size()) as usize));
        }
        out
    }

    /// Packs every extent of volume `id` and of its snapshots that
    /// compresses by at least an eighth, now (hot ones too), at most
    /// `rate` logical bytes per second; `progress(done, total)` in
    /// extents. Client I/O goes on meanwhile.
    pub fn compact_volume(
        &self,
        id: VolumeId,
        codec: Codec,
        rate: Option<u64>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<CompactReport, StoreError> {
        self.compact_range(id, codec, 0..u64::MAX, rate, progress)
    }

    /// [`Store::compact_volume`] of the extents whose first byte lies in
    /// `range` (bytes of the volume), in the volume and in each of its
    /// snapshots: consecutive ranges take every extent exactly once.
    pub fn compact_range(
        &self,
        id: VolumeId,
        codec: Codec,
        range: std::ops::Range<u64>,
        rate: Option<u64>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<CompactReport, StoreError> {
        self.volume_state(id)?;
        let es = self.layout.extent_size as u64;
        let first = range.start.div_ceil(es);
        let end = range.end.div_ceil(es);
        let layers: Vec<(VolumeId, std::ops::Range<usize>)> = self
            .layers_of(id)
            .into_iter()
            .map(|(layer, extents)| {
                let n = extents as u64;
                (layer, first.min(n) as usize..end.min(n) as usize)
            })
            .collect();
        let total: u64 = layers.iter().map(|(_, r)| r.len() as u64).sum();
        let pacer = crate::Pacer::new(rate);
        let mut report = CompactReport::default();
        let mut done = 0;
        for (layer, extents) in layers {
            for logical in extents {
                match self.pack_extent(layer, logical as u32, codec) {
                    Ok(o) => report.count(o, es),
                    // A snapshot deleted meanwhile.
                    Err(StoreError::NotFound(_)) if layer != id => break,
                    Err(e) => return Err(e),
                }
                done += 1;
                progress(done, total);
                pacer.wait(report.packed_bytes);
            }
        }
        Ok(report)
    }

    /// One background pass: packs the cold extents of every compressed
    /// volume and its snapshots, at most `rate` logical bytes per second;
    /// `keep_going` is asked between extents.
    pub(crate) fn compact_cold(&self, rate: u64, keep_going: &dyn Fn() -> bool) -> CompactReport {
        let policy: Vec<(VolumeId, Codec)> = self
            .compactor
            .policy
            .lock()
            .iter()
            .map(|(k, v)| (*k, *v))
            .collect();
        let pacer = crate::Pacer::new(Some(rate));
        let es = self.layout.extent_size as u64;
        let mut report = CompactReport::default();
        for (id, codec) in policy {
            for (layer, extents) in self.layers_of(id) {
                for logical in 0..extents {
                    if !keep_going() {
                        return report;
                    }
                    let Some((phys, stamp)) = self.cold_extent(layer, logical) else {
                        continue;
                    };
                    if self
                        .compactor
                        .incompressible
                        .lock()
                        .contains(&(phys, stamp))
                    {
                        continue;
                    }
                    match self.pack_extent(layer, logical as u32, codec) {
                        Ok(PackOutcome::Incompressible) => {
                            self.compactor.incompressible.lock().insert((phys, stamp));
                            report.count(PackOutcome::Incompressible, es);
                        }
                        Ok(o) => report.count(o, es),
                        Err(e) => {
                            tracing::debug!(volume = %layer, error = %e, "compaction skipped a layer");
                            break;
                        }
                    }
                    pacer.wait(report.packed_bytes + report.incompressible_extents * es);
                }
            }
        }
        if report.packed_extents > 0 {
            tracing::info!(
                extents = report.packed_extents,
                logical_bytes = report.packed_bytes,
                stored_bytes = report.stored_bytes,
                "compacted cold extents"
            );
        }
        report
    }

    /// Logical extent `logical` of layer `id`, if it is a physical extent
    /// not written for `compact_after`, with its write stamp.
    fn cold_extent(&self, id: VolumeId, logical: usize) -> Option<(u32, u32)> {
        let vol = self.volume_state(id).ok()?;
        let map = vol.map.try_read()?;
        let phys = map.phys(logical)?;
        if self.layout.is_virtual(phys) {
            return None;
        }
        let intent = self.intent.as_ref()?;
        let idle = self
            .compactor
            .idle_rounds
            .load(std::sync::atomic::Ordering::Relaxed);
        (intent.idle_rounds(phys) >= idle).then(|| (phys, intent.stamp(phys)))
    }
}

impl CompactReport {
    fn count(&mut self, o: PackOutcome, es: u64) {
        match o {
            PackOutcome::Packed { stored } => {
                self.packed_extents += 1;
                self.packed_bytes += es;
                self.stored_bytes += stored;
            }
            PackOutcome::Incompressible => self.incompressible_extents += 1,
            PackOutcome::Skipped | PackOutcome::Raced => {}
        }
    }
}

impl Compactor {
    pub fn set_idle_rounds(&self, rounds: u32) {
        self.idle_rounds
            .store(rounds, std::sync::atomic::Ordering::Relaxed);
    }

    /// Starts the background compactor of `store`: a pass every
    /// `interval`, at most `rate` logical bytes per second.
    pub fn spawn(store: &Arc<Store>, rate: u64, interval: Duration) {
        let weak: Weak<Store> = Arc::downgrade(store);
        let signal = store.compactor.signal.clone();
        let stopped = {
            let signal = signal.clone();
            move || signal.0.lock().stop
        };
        let spawned = std::thread::Builder::new()
            .name("basalt-compactor".into())
            .spawn(move || loop {
                {
                    let (lock, cv) = &*signal;
                    let mut s = lock.lock();
                    if !s.stop {
                        cv.wait_for(&mut s, interval);
                    }
                    if s.stop {
                        return;
                    }
                }
                let Some(store) = weak.upgrade() else { return };
                store.compact_cold(rate, &|| !stopped());
            });
        match spawned {
            Ok(handle) => *store.compactor.thread.lock() = Some(handle),
            Err(e) => tracing::warn!(error = %e, "no background compactor thread"),
        }
    }

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
