//! Snapshot layers of replicated volumes, the cluster half: asks a volume's
//! primary for a snapshot, a layer deletion or a rollback (the replication
//! protocol takes each at one point of the write stream on every replica,
//! see `basalt_replication`'s primary), and carries out the layer
//! operations a replica's state machine issues on this node's store.
//!
//! Invariants:
//! - a layer has the same id on every replica: the catalog's snapshot UUID,
//!   which is its id in each node's store; a snapshot is asked for once per
//!   id (never resent), so an id names one barrier's layer;
//! - a snapshot layer is frozen only after a flush of the volume, so what it
//!   holds is durable before the layer is, and a power loss cannot leave a
//!   replica with a layer that lacks writes the others' hold;
//! - a rebase keeps the local copy's size (a replicated volume never
//!   shrinks; rolling back to a smaller snapshot reads zeros past its end);
//! - deleting a layer the store does not hold succeeds (the operation is
//!   retried after failures and sent again after restarts);
//! - a local copy is deleted together with its snapshot layers; a local
//!   clone replica reading through one of them is flattened first, with
//!   its own snapshots (`Store::flatten_source`);
//! - a layer no catalog entry names (a snapshot its primary took but never
//!   answered, having failed over, or one whose catalog update failed and
//!   whose undo did not reach the primary) is deleted on every replica by
//!   the volume's primary once it is [`ORPHAN_LAYER_AGE`] old, through the
//!   protocol like any deletion; younger ones may still be on their way
//!   into the catalog.

use super::{uuid_of, vol_of, Inner};
use basalt_catalog::VolumeRecord;
use basalt_replication::{encode_regions, ClientReq, DiskOp, Flattened, LayerId, VolumeId};
use basalt_store::{CompactReport, FlattenReport, Pacer, StoreError, BLOCK_SIZE};
use basalt_volume::{IoError, LayerRequest, VolumeError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long a layer operation waits for a volume just created to be placed.
const PLACEMENT_WAIT: Duration = Duration::from_secs(10);

/// The most one flatten or compaction request covers (fewer bytes at a
/// low rate): it is done well within a request attempt, and progress
/// moves.
const RANGE_CHUNK: u64 = 64 << 20;

/// How old a snapshot layer no catalog entry names must be before its
/// volume's primary deletes it: far longer than a snapshot takes between
/// its layer and its catalog entry.
pub(super) const ORPHAN_LAYER_AGE: Duration = Duration::from_secs(600);

/// The layers of `layers` ((layer, created, Unix seconds), oldest first)
/// that `named` (the catalog's snapshot ids of the volume) lacks and that
/// are at least `age` old at `now`.
fn orphan_layers(
    layers: &[(LayerId, u64)],
    named: &[uuid::Uuid],
    now: u64,
    age: Duration,
) -> Vec<LayerId> {
    layers
        .iter()
        .filter(|(l, created)| {
            !named.contains(&uuid_of_layer(*l)) && now >= created.saturating_add(age.as_secs())
        })
        .map(|(l, _)| *l)
        .collect()
}

/// A compaction's report as a `Compact` request's answer carries it: four
/// u64, little-endian (extents packed, their logical bytes, the bytes their
/// runs store, extents left incompressible; `docs/peer-protocol.md`).
fn encode_compacted(r: &CompactReport) -> Vec<u8> {
    [
        r.packed_extents,
        r.packed_bytes,
        r.stored_bytes,
        r.incompressible_extents,
    ]
    .iter()
    .flat_map(|v| v.to_le_bytes())
    .collect()
}

/// Reads [`encode_compacted`]'s bytes back; None if they are not that.
fn decode_compacted(data: &[u8]) -> Option<CompactReport> {
    if data.len() != 32 {
        return None;
    }
    let field = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&data[i * 8..i * 8 + 8]);
        u64::from_le_bytes(b)
    };
    Some(CompactReport {
        packed_extents: field(0),
        packed_bytes: field(1),
        stored_bytes: field(2),
        incompressible_extents: field(3),
    })
}

fn layer_of(id: uuid::Uuid) -> LayerId {
    LayerId(id.as_u128())
}

fn uuid_of_layer(layer: LayerId) -> uuid::Uuid {
    uuid::Uuid::from_u128(layer.0)
}

/// Why a layer operation failed on the local store.
#[derive(Debug, thiserror::Error)]
enum LayerOpError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Io(#[from] basalt_store::IoError),
}

impl Inner {
    /// Sends `req` to the primary of `record`'s volume and waits for its
    /// answer (retried on another primary until the request deadline).
    pub(super) fn layer_request(
        &self,
        record: &VolumeRecord,
        req: LayerRequest,
    ) -> Result<(), VolumeError> {
        let vol = vol_of(record.id);
        // A volume just created is placed within a coordinator round or
        // two: wait for it rather than fail a snapshot taken right away.
        let deadline = std::time::Instant::now() + PLACEMENT_WAIT;
        while !self.records.read().contains_key(&vol) {
            if std::time::Instant::now() >= deadline {
                return Err(VolumeError::Cluster(format!(
                    "volume {} is not placed yet; try again in a moment",
                    record.name
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let request = match req {
            LayerRequest::Snapshot(id) => return self.snapshot_once(record, vol, layer_of(id)),
            LayerRequest::Delete(id) => ClientReq::DeleteSnapshot {
                layer: layer_of(id),
            },
            LayerRequest::Rollback(id) => ClientReq::Rollback {
                layer: layer_of(id),
            },
        };
        let answer = self.execute(vol, vec![request.clone()], None).pop();
        match answer {
            Some(Ok(_)) => Ok(()),
            Some(Err(IoError::Io(e))) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(VolumeError::Cluster(format!(
                    "the primary of {} does not hold that snapshot",
                    record.name
                )))
            }
            Some(Err(e)) => Err(VolumeError::Cluster(format!(
                "{req:?} on volume {}: {e}",
                record.name
            ))),
            None => Err(VolumeError::Cluster("no answer from the primary".into())),
        }
    }

    /// Flattens `range` (bytes) of clone `record` on its replicas: a
    /// `ClientReq::Flatten` per chunk ([`Inner::in_chunks`]). Reports the
    /// primary's copies and whether its copy was detached (by a chunk
    /// reaching the volume's end: the store detaches a copy once a flatten
    /// reaching its end left nothing to read through the source).
    pub(super) fn flatten(
        &self,
        record: &VolumeRecord,
        range: std::ops::Range<u64>,
        rate: Option<u64>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<FlattenReport, VolumeError> {
        let mut report = FlattenReport::default();
        let what = "flattening";
        let request = |lba, blocks, rate| ClientReq::Flatten { lba, blocks, rate };
        self.in_chunks(record, range, rate, progress, what, request, &mut |data| {
            let done = data.and_then(Flattened::decode)?;
            report.copied_blocks += done.copied_blocks;
            report.detached = done.detached;
            Some(())
        })?;
        Ok(report)
    }

    /// Compacts `range` (bytes) of `record` and of its snapshots on its
    /// replicas, each with the codec its node keeps the volume compressed
    /// with: a `ClientReq::Compact` per chunk ([`Inner::in_chunks`]).
    /// Reports what the primary's copy did.
    pub(super) fn compact(
        &self,
        record: &VolumeRecord,
        range: std::ops::Range<u64>,
        rate: Option<u64>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<CompactReport, VolumeError> {
        let mut report = CompactReport::default();
        let what = "compacting";
        let request = |lba, blocks, rate| ClientReq::Compact { lba, blocks, rate };
        self.in_chunks(record, range, rate, progress, what, request, &mut |data| {
            let done = decode_compacted(data?)?;
            report.packed_extents += done.packed_extents;
            report.packed_bytes += done.packed_bytes;
            report.stored_bytes += done.stored_bytes;
            report.incompressible_extents += done.incompressible_extents;
            Some(())
        })?;
        Ok(report)
    }

    /// Runs a background range operation over `range` (bytes) of
    /// `record`'s volume on its replicas: `request(lba, blocks, rate)` per
    /// chunk, each small enough to finish well within a request attempt at
    /// `rate` (which each replica keeps, and the chunks keep over the whole
    /// run); `answer` takes each chunk's `Ok` data (None: not what the
    /// request answers, a node of an older version?), `progress(done,
    /// total)` in bytes after each.
    #[allow(clippy::too_many_arguments)]
    fn in_chunks(
        &self,
        record: &VolumeRecord,
        range: std::ops::Range<u64>,
        rate: Option<u64>,
        progress: &mut dyn FnMut(u64, u64),
        what: &str,
        request: impl Fn(u64, u64, u64) -> ClientReq,
        answer: &mut dyn FnMut(Option<&[u8]>) -> Option<()>,
    ) -> Result<(), VolumeError> {
        let vol = vol_of(record.id);
        let rec = self.records.read().get(&vol).cloned().ok_or_else(|| {
            VolumeError::Cluster(format!(
                "volume {} is not placed yet; try again in a moment",
                record.name
            ))
        })?;
        let size = record.size_bytes.max(rec.blocks * BLOCK_SIZE);
        let (start, end) = (range.start.min(size), range.end.min(size));
        let rate = rate.filter(|r| *r > 0);
        let chunk = rate.map_or(RANGE_CHUNK, |r| {
            (r.saturating_mul(2) / BLOCK_SIZE * BLOCK_SIZE).clamp(BLOCK_SIZE << 8, RANGE_CHUNK)
        });
        let pacer = Pacer::new(rate);
        let mut at = start;
        while at < end {
            if self.stopping.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(VolumeError::Cluster(
                    "the cluster member is stopping".into(),
                ));
            }
            let len = chunk.min(end - at);
            let req = request(at / BLOCK_SIZE, len.div_ceil(BLOCK_SIZE), rate.unwrap_or(0));
            match self.execute(vol, vec![req], None).pop() {
                Some(Ok(data)) => answer(data.as_deref()).ok_or_else(|| {
                    VolumeError::Cluster(format!(
                        "the primary answered {what} with something else (a node of an older version?)"
                    ))
                })?,
                Some(Err(e)) => {
                    return Err(VolumeError::Cluster(format!(
                        "{what} {} at offset {at}: {e}",
                        record.name
                    )))
                }
                None => return Err(VolumeError::Cluster("no answer from the primary".into())),
            };
            at += len;
            progress(at - start, end - start);
            pacer.wait(at - start);
        }
        Ok(())
    }

    /// Asks the primary for snapshot `layer` once, never again: a layer id
    /// is taken by one barrier only. Asked again of a primary that lacks it
    /// (the one that took it failed over before answering, and some
    /// replicas hold it), the id would be taken a second time at another
    /// point of the stream, and replicas holding the first one would
    /// count as holding the second. The caller asks for a new id instead;
    /// a layer the first try left behind is an orphan (see the module's
    /// invariants).
    fn snapshot_once(
        &self,
        record: &VolumeRecord,
        vol: VolumeId,
        layer: LayerId,
    ) -> Result<(), VolumeError> {
        match self.execute_once(vol, ClientReq::Snapshot { layer }) {
            Ok(_) => Ok(()),
            Err(IoError::Io(e)) if e.kind() == std::io::ErrorKind::TimedOut => {
                Err(VolumeError::Cluster(format!(
                    "the primary of {} did not answer the snapshot (it may have changed); nothing was recorded",
                    record.name
                )))
            }
            Err(other) => Err(VolumeError::Cluster(format!(
                "the primary of {} answered the snapshot with: {other}",
                record.name
            ))),
        }
    }

    /// The snapshot layers of `vol` this node's store holds, oldest first
    /// (the volume's chain of parents, down to the first layer that is not
    /// one of its own snapshots).
    pub(super) fn local_layers(&self, vol: VolumeId) -> Vec<LayerId> {
        let id = uuid_of(vol);
        let snapshots = self.store.snapshots();
        let mut next = self
            .store
            .volumes()
            .into_iter()
            .find(|v| v.id == id)
            .and_then(|v| v.parent);
        let mut chain = Vec::new();
        while let Some(s) = next.and_then(|p| snapshots.iter().find(|s| s.id == p)) {
            if s.volume != id {
                break;
            }
            chain.push(layer_of(s.id));
            next = s.parent;
        }
        chain.reverse();
        chain
    }

    /// Whether `layer` is one of volume `id`'s own snapshots, or no layer
    /// the store holds (a deletion of it then succeeds as a no-op).
    fn is_own_layer(&self, id: uuid::Uuid, layer: LayerId) -> bool {
        self.store
            .snapshots()
            .iter()
            .find(|s| s.id == uuid_of_layer(layer))
            .is_none_or(|s| s.volume == id)
    }

    /// The snapshot of another volume the local copy of `vol` reads
    /// through (its clone source, until flattened), if any.
    pub(super) fn local_base(&self, vol: VolumeId) -> Option<LayerId> {
        self.store
            .clone_source(uuid_of(vol))
            .ok()
            .flatten()
            .map(layer_of)
    }

    /// Carries out a replica's layer operation on the local store.
    pub(super) fn layer_disk_op(
        &self,
        vol: VolumeId,
        op: &DiskOp,
    ) -> Result<Option<Vec<u8>>, String> {
        self.try_layer_disk_op(vol, op).map_err(|e| e.to_string())
    }

    fn try_layer_disk_op(
        &self,
        vol: VolumeId,
        op: &DiskOp,
    ) -> Result<Option<Vec<u8>>, LayerOpError> {
        let id = uuid_of(vol);
        match op {
            DiskOp::Snapshot { layer } => {
                let snap = uuid_of_layer(*layer);
                if self.store.snapshots().iter().any(|s| s.id == snap) {
                    return Ok(None);
                }
                self.store.volume(id)?.flush()?;
                self.store.snapshot(id, snap)?;
                Ok(None)
            }
            // The clone source is another volume's layer: deleting it from
            // this copy's layers detaches the copy (its primary's copy was
            // flattened), and leaves the layer to its volume. Another
            // volume's layer that this copy no longer reads is left alone.
            DiskOp::DeleteLayer { layer } if !self.is_own_layer(id, *layer) => {
                if self.local_base(vol) != Some(*layer) {
                    return Ok(None);
                }
                let report = self
                    .store
                    .flatten_source(id, 0..u64::MAX, None, &mut |_, _| {})?;
                match report.detached {
                    true => Ok(None),
                    false => Err(StoreError::Layers(format!(
                        "the local replica of clone {id} could not be detached from its source"
                    ))
                    .into()),
                }
            }
            DiskOp::DeleteLayer { layer } => match self.delete_local_layer(uuid_of_layer(*layer)) {
                Ok(()) | Err(StoreError::NotFound(_)) => Ok(None),
                Err(e) => Err(e.into()),
            },
            DiskOp::Rebase { onto } => {
                let local = self.store.volume(id)?;
                let size = local.size();
                match onto {
                    Some(layer) => {
                        self.store.rollback(id, uuid_of_layer(*layer))?;
                        if self.store.volume(id)?.size() < size {
                            self.store.resize_volume(id, size)?;
                        }
                    }
                    None => local.write_zeroes(0, size, true, true)?,
                }
                Ok(None)
            }
            DiskOp::Changed {
                from,
                to,
                region_blocks,
            } => {
                let region = region_blocks.max(&1) * BLOCK_SIZE;
                let to = to.map_or(id, uuid_of_layer);
                let runs = self.store.changed_blocks(from.map(uuid_of_layer), to)?;
                let mut regions: Vec<u32> = Vec::new();
                for run in runs.iter().filter(|r| r.len > 0) {
                    let first = (run.offset / region) as u32;
                    let last = ((run.offset + run.len - 1) / region) as u32;
                    for r in first..=last {
                        if regions.last() != Some(&r) {
                            regions.push(r);
                        }
                    }
                }
                Ok(Some(encode_regions(regions)))
            }
            DiskOp::ReadLayer { layer, lba, blocks } => {
                let snap = self.store.volume(uuid_of_layer(*layer))?;
                let offset = lba * BLOCK_SIZE;
                let mut data = vec![0u8; (blocks * BLOCK_SIZE) as usize];
                // Past the layer's end it reads as zeros.
                let within = snap.size().saturating_sub(offset).min(data.len() as u64);
                if within > 0 {
                    snap.read(offset, &mut data[..within as usize])?;
                }
                Ok(Some(data))
            }
            DiskOp::Flatten { lba, blocks, rate } => {
                // The copy and its own snapshots together: every replica
                // holds the same layers (snapshots are ordered operations),
                // so each copies into the same oldest one.
                let range = lba * BLOCK_SIZE..(lba + blocks) * BLOCK_SIZE;
                let rate = (*rate > 0).then_some(*rate);
                let report = self.store.flatten_source(id, range, rate, &mut |_, _| {})?;
                let done = Flattened {
                    copied_blocks: report.copied_blocks,
                    detached: report.detached,
                };
                Ok(Some(done.encode()))
            }
            // Packs with the codec this node keeps the volume compressed
            // with (set from its record when the replica started): none
            // yet, or a store formatted without packed extents, nothing
            // to pack (an error would be retried for ever).
            DiskOp::Compact { lba, blocks, rate } => {
                let codec = self.store.compression(id);
                let Some(codec) = codec.filter(|_| self.store.supports_compression()) else {
                    return Ok(Some(encode_compacted(&CompactReport::default())));
                };
                let range = lba * BLOCK_SIZE..(lba + blocks) * BLOCK_SIZE;
                let rate = (*rate > 0).then_some(*rate);
                let report = self
                    .store
                    .compact_range(id, codec, range, rate, &mut |_, _| {})?;
                Ok(Some(encode_compacted(&report)))
            }
            _ => Err(StoreError::Layers(format!("{op:?} is not a layer operation")).into()),
        }
    }

    /// Deletes, through the protocol, the orphan layers (see the module's
    /// invariants) of the volumes this node is primary of.
    pub(super) fn drop_orphan_layers(&self) {
        let mine: Vec<VolumeId> = self
            .records
            .read()
            .values()
            .filter(|r| r.primary == self.me)
            .map(|r| r.volume)
            .collect();
        if mine.is_empty() {
            return;
        }
        let Ok(catalog) = self.catalog.list() else {
            return;
        };
        let created: Vec<(uuid::Uuid, u64)> = self
            .store
            .snapshots()
            .into_iter()
            .map(|s| (s.id, s.created_unix))
            .collect();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        for vol in mine {
            let id = uuid_of(vol);
            let Some(record) = catalog.iter().find(|v| v.record.id == id) else {
                continue;
            };
            let layers: Vec<(LayerId, u64)> = self
                .local_layers(vol)
                .into_iter()
                .filter_map(|l| {
                    let at = created.iter().find(|(s, _)| *s == uuid_of_layer(l))?.1;
                    Some((l, at))
                })
                .collect();
            let named: Vec<uuid::Uuid> = record.record.snapshots.iter().map(|s| s.id).collect();
            for layer in orphan_layers(&layers, &named, now, ORPHAN_LAYER_AGE) {
                let snap = uuid_of_layer(layer);
                tracing::warn!(volume = %record.record.name, snapshot = %snap,
                    "deleting a snapshot layer no catalog entry names");
                if let Err(e) = self.layer_request(&record.record, LayerRequest::Delete(snap)) {
                    tracing::warn!(volume = %record.record.name, snapshot = %snap, error = %e,
                        "could not delete an orphan snapshot layer; trying again later");
                }
            }
        }
    }

    /// Deletes the local copy `id` and its snapshot layers (newest first).
    pub(super) fn delete_local_copy(&self, id: uuid::Uuid) -> Result<(), StoreError> {
        for layer in self.local_layers(vol_of(id)).into_iter().rev() {
            self.delete_local_layer(uuid_of_layer(layer))?;
        }
        self.store.delete_volume(id)
    }

    /// Deletes snapshot layer `snap` from the local store. The store merges
    /// a snapshot into at most one layer above it, so the local replicas of
    /// clones that still read through it besides its own volume (a clone
    /// made here whose source leaves this node, or one that missed its
    /// flattening) are flattened first: they keep their content and no
    /// longer need it. The merge copies at most the resync rate.
    fn delete_local_layer(&self, snap: uuid::Uuid) -> Result<(), StoreError> {
        let snapshots = self.store.snapshots();
        if let Some(s) = snapshots.iter().find(|s| s.id == snap) {
            if s.children.len() > 1 {
                // A child is a clone's head, or its oldest snapshot.
                let clones = s.children.iter().filter_map(|c| {
                    let volume = snapshots
                        .iter()
                        .find(|o| o.id == *c)
                        .map_or(*c, |o| o.volume);
                    (volume != s.volume).then_some(volume)
                });
                for clone in clones {
                    tracing::info!(snapshot = %snap, %clone,
                        "flattening a local clone replica that reads through a snapshot layer being deleted here");
                    let report =
                        self.store
                            .flatten_source(clone, 0..u64::MAX, None, &mut |_, _| {})?;
                    if !report.detached {
                        return Err(StoreError::Layers(format!(
                            "the local replica of clone {clone} could not be detached from snapshot {snap}"
                        )));
                    }
                }
            }
        }
        // Paced like resync copies: merges on every replica at once would
        // otherwise take the disk from client writes.
        let rate = self.cfg.timing.resync_rate;
        self.store
            .delete_snapshot_paced(snap, (rate > 0).then_some(rate))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_old_layers_no_catalog_entry_names_are_orphans() {
        let (a, b, c) = (
            uuid::Uuid::new_v4(),
            uuid::Uuid::new_v4(),
            uuid::Uuid::new_v4(),
        );
        let layers = [(layer_of(a), 100), (layer_of(b), 100), (layer_of(c), 1000)];
        let age = Duration::from_secs(600);
        // b is named; c is too young at 1500; a is old and unnamed.
        assert_eq!(orphan_layers(&layers, &[b], 1500, age), vec![layer_of(a)]);
        assert_eq!(
            orphan_layers(&layers, &[b], 1600, age),
            vec![layer_of(a), layer_of(c)]
        );
        assert!(orphan_layers(&layers, &[a, b, c], 10_000, age).is_empty());
        assert!(orphan_layers(&layers, &[], 650, age).is_empty());
    }
}
