//! Replica compare: the cluster half of a scrub. Sends the volume's primary
//! a `ClientReq::Compare` per region of the range (a few at a time, at the
//! rate asked), which checksums every in-sync replica's copy at the same
//! point of the replication stream and rewrites the copies that differ
//! from the primary's (`basalt_replication`'s primary); collects what the
//! answers say.
//!
//! The background scrubber runs it too (`Store::on_scrub_pass`), at its
//! rate: after each complete pass over a volume's local copy on the
//! volume's primary node, over the whole volume, so every volume's replicas
//! are compared once per scrub interval; after a pass on another replica's
//! node that found damage, over the regions holding it, so the damage is
//! rewritten at once rather than at the primary's next pass.
//!
//! Invariants: regions are whole replication regions (the unit a differing
//! copy is rewritten in), the first and last clipped to the volume; a region
//! the primary cannot read from any replica is reported unreadable, never
//! retried as if transient; the rate is kept over the whole run, not per
//! batch; a stopping member ends a compare between batches.

use super::{vol_of, Inner};
use basalt_catalog::VolumeRecord;
use basalt_replication::{ClientReq, Compared};
use basalt_store::{Pacer, BLOCK_SIZE};
use basalt_volume::{DifferingRange, IoError, ReplicaComparison, VolumeError};
use std::sync::atomic::Ordering;
use std::time::Instant;

/// Regions compared concurrently (each one primary read and one checksum
/// per replica).
const IN_FLIGHT: u64 = 4;

impl Inner {
    /// Compares the replicas of `record`'s volume over `range` (bytes,
    /// widened to whole regions), at most `rate` bytes per second;
    /// `progress(done, total)` in bytes after each batch.
    pub(super) fn compare(
        &self,
        record: &VolumeRecord,
        range: std::ops::Range<u64>,
        rate: Option<u64>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<ReplicaComparison, VolumeError> {
        let inner = self;
        let vol = vol_of(record.id);
        let region = inner.cfg.timing.region_blocks.max(1) * BLOCK_SIZE;
        let rec = inner.records.read().get(&vol).cloned().ok_or_else(|| {
            VolumeError::Cluster(format!(
                "volume {} is not placed yet; nothing to compare",
                record.name
            ))
        })?;
        let size = record.size_bytes.min(rec.blocks * BLOCK_SIZE);
        let end = range.end.min(size);
        let first = range.start - range.start % region;
        let name_of = |id| {
            inner
                .nodes
                .read()
                .iter()
                .find(|n| n.id == id)
                .map_or_else(|| format!("node-{}", id.0), |n| n.info.name.clone())
        };
        let mut out = ReplicaComparison {
            region_bytes: region,
            this_node: inner.cfg.name.clone(),
            this_node_primary: rec.primary == inner.me,
            ..ReplicaComparison::default()
        };
        let others = rec.replicas.len().saturating_sub(1);
        let total = end.saturating_sub(first);
        let pacer = Pacer::new(rate);
        let mut at = first;
        while at < end {
            if inner.stopping.load(Ordering::SeqCst) {
                return Err(VolumeError::Cluster(
                    "the cluster member is stopping".into(),
                ));
            }
            let starts: Vec<u64> = (0..IN_FLIGHT)
                .map(|k| at + k * region)
                .filter(|s| *s < end)
                .collect();
            let reqs = starts
                .iter()
                .map(|&s| ClientReq::Compare {
                    lba: s / BLOCK_SIZE,
                    blocks: (region.min(end - s)).div_ceil(BLOCK_SIZE),
                })
                .collect();
            let answers = inner.execute(vol, reqs, None);
            for (s, answer) in starts.iter().zip(answers) {
                let len = region.min(end - s);
                match answer {
                    Ok(data) => {
                        let found = data.as_deref().and_then(Compared::decode).ok_or_else(|| {
                            VolumeError::Cluster(
                                "the primary answered a replica compare with something else (a node of an older version?)"
                                    .into(),
                            )
                        })?;
                        out.bytes_compared += len;
                        if found.replicas.len() < others {
                            out.bytes_partial += len;
                        }
                        if !found.differing.is_empty() {
                            inner.compare_differing.fetch_add(1, Ordering::Relaxed);
                            out.differing.push(DifferingRange {
                                offset: *s,
                                length: len,
                                replicas: found.differing.into_iter().map(name_of).collect(),
                            });
                        }
                    }
                    Err(IoError::Corrupt { .. }) => out.unreadable.push(*s),
                    Err(e) => {
                        return Err(VolumeError::Cluster(format!(
                            "comparing the replicas of {} at offset {s}: {e}",
                            record.name
                        )))
                    }
                }
            }
            at = starts.last().map_or(end, |s| s + region);
            let done = at.min(end) - first;
            progress(done, total);
            pacer.wait(done);
        }
        Ok(out)
    }
}

impl Inner {
    /// After a background scrub pass over volume `id`'s local copy: if this
    /// node is the volume's primary, compares all its replicas at `rate`;
    /// else, if the pass found `damaged` blocks (volume offsets), has the
    /// primary compare the regions holding them at once (this copy is
    /// rewritten from the primary's), rather than wait for the primary's
    /// next pass.
    pub(super) fn compare_after_scrub(&self, id: uuid::Uuid, rate: u64, damaged: &[u64]) {
        let vol = vol_of(id);
        let (primary, replicated) = self.records.read().get(&vol).map_or((false, false), |r| {
            (r.primary == self.me, r.replicas.len() > 1)
        });
        let record = self.volumes.read().values().find(|r| r.id == id).cloned();
        let (true, Some(record)) = (replicated, record) else {
            return;
        };
        if !primary {
            let region = self.cfg.timing.region_blocks.max(1) * BLOCK_SIZE;
            let mut starts: Vec<u64> = damaged.iter().map(|b| b - b % region).collect();
            starts.dedup();
            if !starts.is_empty() {
                tracing::warn!(
                    volume = %record.name,
                    regions = starts.len(),
                    "asking the primary to compare the regions where this copy is damaged"
                );
            }
            for start in starts {
                let end = (start + region).min(record.size_bytes);
                match self.compare(&record, start..end, Some(rate), &mut |_, _| {}) {
                    Ok(c) => self.report_compare(&record.name, &c, None),
                    Err(e) => {
                        tracing::warn!(volume = %record.name, error = %e, "replica compare stopped");
                        return;
                    }
                }
            }
            return;
        }
        let started = Instant::now();
        match self.compare(&record, 0..record.size_bytes, Some(rate), &mut |_, _| {}) {
            Ok(c) => {
                self.compare_passes.fetch_add(1, Ordering::Relaxed);
                self.report_compare(&record.name, &c, Some(started));
            }
            Err(e) => {
                tracing::warn!(volume = %record.name, error = %e, "background replica compare stopped")
            }
        }
    }

    /// Logs what a background compare found (`started`: of a whole pass).
    fn report_compare(&self, volume: &str, c: &ReplicaComparison, started: Option<Instant>) {
        if let Some(started) = started.filter(|_| c.differing.is_empty() && c.unreadable.is_empty())
        {
            tracing::info!(
                volume,
                seconds = started.elapsed().as_secs(),
                partial_bytes = c.bytes_partial,
                "background replica compare found the copies identical"
            );
        }
        for d in &c.differing {
            tracing::warn!(
                volume,
                offset = d.offset,
                length = d.length,
                replicas = ?d.replicas,
                "background replica compare: copies differ from the primary's; rewriting them"
            );
        }
        for offset in &c.unreadable {
            tracing::error!(
                volume,
                offset,
                "background replica compare: no replica holds a good copy of this region"
            );
        }
    }
}
