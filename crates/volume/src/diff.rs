//! Changed blocks between a snapshot and a later point of a volume, named as
//! users name them (`VOLUME@SNAPSHOT`): what `volume diff` lists and what
//! `export-diff` streams. The store finds the blocks (`Store::changed_blocks`);
//! this module turns names into layers.
//!
//! Invariants:
//! - `from` is a snapshot: of the volume itself, or (`VOL@SNAP`) of any
//!   volume, such as the snapshot a clone was made from; `to` is the volume
//!   or one of its snapshots. Everything a diff names exists when it is
//!   computed (looked up under the control lock).
//! - A replicated volume is diffed from this node's replica: between
//!   snapshots on any node holding one (every replica's layers are the
//!   same), up to the live volume only on its primary's node (the only
//!   head that holds every acknowledged write).

use crate::error::VolumeError;
use crate::service::VolumeService;
use crate::snapshots::split_snapshot_name;
use basalt_store::{ChangedRun, VolumeId};

/// The changed ranges of one diff.
#[derive(Clone, Debug, PartialEq)]
pub struct VolumeDiff {
    pub volume: String,
    /// `VOL@SNAP` the diff starts from; `None`: from an empty volume.
    pub from: Option<String>,
    /// `VOL@SNAP`, or the volume's name for its current content.
    pub to: String,
    /// The size of `to`.
    pub size_bytes: u64,
    /// Ranges that may differ, in order; `data: false` reads as zeros in
    /// `to`.
    pub extents: Vec<ChangedRun>,
}

impl VolumeDiff {
    /// Bytes `to` reads as data in the changed ranges.
    pub fn data_bytes(&self) -> u64 {
        self.extents.iter().filter(|e| e.data).map(|e| e.len).sum()
    }
}

impl VolumeService {
    /// The layer of `VOL@SNAP` (or of snapshot `SNAP` of `volume`) and its
    /// full name.
    fn snapshot_layer(&self, volume: &str, name: &str) -> Result<(VolumeId, String), VolumeError> {
        let (owner, snap) = split_snapshot_name(name).unwrap_or((volume, name));
        let record = self.record(owner)?.record;
        let found = Self::snapshot_of(&record, snap)?;
        Ok((found.id, format!("{owner}@{snap}")))
    }

    /// The ranges of `volume` (or its snapshot `to`) that may differ from
    /// snapshot `from` (`SNAP` of this volume or `VOL@SNAP`); without
    /// `from`, every range that holds data.
    pub fn diff(
        &self,
        volume: &str,
        from: Option<&str>,
        to: Option<&str>,
    ) -> Result<VolumeDiff, VolumeError> {
        let _control = self.control.lock();
        let record = self.record(volume)?.record;
        // In a cluster, from this node's replica: its snapshot layers are
        // every replica's, but its head is current only on the primary.
        if let Some(cluster) = &self.cluster {
            match cluster.is_local_primary(record.id) {
                Some(true) => {}
                Some(false) if to.is_some() => {}
                _ => {
                    return Err(VolumeError::NotSupported(format!(
                        "{volume} is replicated and its primary is on another node: diff one of its snapshots here, or the live volume through the node named primary in `volume show {volume}`"
                    )))
                }
            }
        }
        let (to_id, to_name, size_bytes) = match to {
            Some(snap) => {
                let found = Self::snapshot_of(&record, snap)?;
                (found.id, format!("{volume}@{snap}"), found.size_bytes)
            }
            None => (record.id, volume.to_string(), record.size_bytes),
        };
        let from = from.map(|f| self.snapshot_layer(volume, f)).transpose()?;
        if from.as_ref().is_some_and(|(id, _)| *id == to_id) {
            return Err(VolumeError::NotSupported(format!(
                "{to_name} is both ends of the diff"
            )));
        }
        if let Some(cluster) = &self.cluster {
            // A node without a replica (or one still rebuilding the
            // layers) has nothing to compare: say where to ask.
            let held = self.store.snapshots();
            let here = |id: VolumeId| id == record.id || held.iter().any(|s| s.id == id);
            if !here(to_id) || from.as_ref().is_some_and(|(id, _)| !here(*id)) {
                let nodes: Vec<String> = cluster
                    .replicas(&record)
                    .into_iter()
                    .filter(|r| r.state == "in-sync")
                    .map(|r| r.node)
                    .collect();
                return Err(VolumeError::NotSupported(format!(
                    "this node holds no in-sync replica of {volume}: diff through a node that does ({})",
                    nodes.join(", ")
                )));
            }
        }
        let extents = self
            .store
            .changed_blocks(from.as_ref().map(|(id, _)| *id), to_id)?;
        Ok(VolumeDiff {
            volume: volume.to_string(),
            from: from.map(|(_, name)| name),
            to: to_name,
            size_bytes,
            extents,
        })
    }
}
