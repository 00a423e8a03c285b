//! Snapshot layers of replicated volumes, the cluster half: asks a volume's
//! primary for a snapshot, a layer deletion or a rollback (the replication
//! protocol takes each at one point of the write stream on every replica,
//! see `basalt_replication`'s primary), and carries out the layer
//! operations a replica's state machine issues on this node's store.
//!
//! Invariants:
//! - a layer has the same id on every replica: the catalog's snapshot UUID,
//!   which is its id in each node's store;
//! - a snapshot layer is frozen only after a flush of the volume, so what it
//!   holds is durable before the layer is, and a power loss cannot leave a
//!   replica with a layer that lacks writes the others' hold;
//! - a rebase keeps the local copy's size (a replicated volume never
//!   shrinks; rolling back to a smaller snapshot reads zeros past its end);
//! - deleting a layer the store does not hold succeeds (the operation is
//!   retried after failures and sent again after restarts);
//! - a local copy is deleted together with its snapshot layers.

use super::{uuid_of, vol_of, Inner};
use basalt_catalog::VolumeRecord;
use basalt_replication::{encode_regions, ClientReq, DiskOp, LayerId, VolumeId};
use basalt_store::{StoreError, BLOCK_SIZE};
use basalt_volume::{IoError, LayerRequest, VolumeError};

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
        if !self.records.read().contains_key(&vol) {
            return Err(VolumeError::Cluster(format!(
                "volume {} is not placed yet; try again in a moment",
                record.name
            )));
        }
        let request = match req {
            LayerRequest::Snapshot(id) => ClientReq::Snapshot {
                layer: layer_of(id),
            },
            LayerRequest::Delete(id) => ClientReq::DeleteSnapshot {
                layer: layer_of(id),
            },
            LayerRequest::Rollback(id) => ClientReq::Rollback {
                layer: layer_of(id),
            },
        };
        let answer = self.execute(vol, 1, |_| request.clone(), None).pop();
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
            DiskOp::DeleteLayer { layer } => {
                match self.store.delete_snapshot(uuid_of_layer(*layer)) {
                    Ok(()) | Err(StoreError::NotFound(_)) => Ok(None),
                    Err(e) => Err(e.into()),
                }
            }
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
            _ => Err(StoreError::Layers(format!("{op:?} is not a layer operation")).into()),
        }
    }

    /// Deletes the local copy `id` and its snapshot layers (newest first).
    pub(super) fn delete_local_copy(&self, id: uuid::Uuid) -> Result<(), StoreError> {
        for layer in self.local_layers(vol_of(id)).into_iter().rev() {
            self.store.delete_snapshot(uuid_of_layer(layer))?;
        }
        self.store.delete_volume(id)
    }
}
