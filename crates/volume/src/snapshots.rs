//! Snapshots, clones and rollback of a node's volumes: the catalog keeps
//! their names (a volume's snapshots live in its record, a clone's record
//! names its source), the store keeps their data (`Store::snapshot`,
//! `clone_snapshot`, `rollback`, `delete_snapshot`). A snapshot is
//! addressed as `VOLUME@SNAPSHOT`, as in Ceph's `rbd`.
//!
//! Invariants:
//! - A snapshot with clones is not deleted, and a volume with snapshots is
//!   not deleted (`VolumeService::delete`), so a clone's source always
//!   exists and a volume name named by a clone is never reused.
//! - Mutations run under the service's control lock, like every other.
//!
//! Crash safety, as for volumes (`service.rs`): each mutation's two steps
//! come in the order `reconcile` resolves:
//! - snapshot: the store first, then the record. A crash in between leaves
//!   a store snapshot no record names, which nobody was told exists;
//!   reconcile deletes it.
//! - snapshot deletion: the record first, then the store; reconcile deletes
//!   the orphan.
//! - clone: the record first (naming its source), then the store; reconcile
//!   makes a missing clone from its source.
//! - rollback: the store first, then the record's size. A crash in between
//!   leaves the old size in the record, and reconcile grows the volume back
//!   to it (the snapshot's content, then zeros).
//!
//! In a cluster, snapshots, deletions and rollbacks are ordered operations
//! of the replication protocol (through the volume's primary); a clone is a
//! catalog record naming its source, placed by the cluster layer on the
//! nodes that hold the snapshot, which make their replicas from it; a
//! flatten goes to every replica through the primary, and the record drops
//! its source once the primary's copy is detached (a replica that missed
//! it is flattened where the source snapshot is deleted).

use crate::error::VolumeError;
use crate::service::{
    catalog_error, validate_volume_name, LayerRequest, VolumeInfo, VolumeService,
};
use crate::size::format_size;
use crate::tenancy::Growth;
use basalt_catalog::{CloneSource, SnapshotRecord, Versioned, VolumeRecord};
use basalt_store::VolumeId;
use std::collections::HashMap;
use std::time::{Duration, SystemTime};

/// How long a forced rollback waits for the volume's clients to go.
const DISCONNECT_WAIT: Duration = Duration::from_secs(10);

/// A per-snapshot gauge: metric name, help text, value from (written,
/// exclusive) bytes.
type SpaceGauge = (&'static str, &'static str, fn((u64, u64)) -> u64);

/// A snapshot as the control plane reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct SnapshotInfo {
    pub volume: String,
    pub name: String,
    pub id: VolumeId,
    /// The volume's size when it was taken.
    pub size_bytes: u64,
    pub created_at: String,
    /// Bytes written while this snapshot's layer was the volume's.
    pub written_bytes: u64,
    /// Bytes only this snapshot holds (what deleting it frees).
    pub exclusive_bytes: u64,
    /// Volumes cloned from it.
    pub clones: Vec<String>,
    /// Connections reading it (NBD exports of `VOLUME@SNAPSHOT`, NVMe/TCP).
    pub open_connections: usize,
    /// Hosts that may read it over NVMe/TCP, as its own subsystem.
    pub nvme_hosts: Vec<String>,
    /// Its data is encrypted at rest (its volume's key, or the one a
    /// re-encryption of the volume left it).
    pub encrypted: bool,
}

/// How far the flattening of a clone has come on this node: windows are
/// copied one call at a time (`basalt volume flatten` walks the volume), and
/// `volume show` reports the last one until the clone is detached.
#[derive(Clone, Debug, PartialEq)]
pub struct FlattenProgress {
    /// The end of the last window copied.
    pub done_bytes: u64,
    /// The clone's size.
    pub total_bytes: u64,
    /// Bytes copied into the clone so far by this flattening.
    pub copied_bytes: u64,
    /// When the last window ended.
    pub updated: std::time::Instant,
}

/// Splits `VOLUME@SNAPSHOT`; `None` for a plain name.
pub fn split_snapshot_name(full: &str) -> Option<(&str, &str)> {
    full.split_once('@')
}

/// Checks a snapshot name: the rules of volume names (`@` is reserved).
pub fn validate_snapshot_name(name: &str) -> Result<(), VolumeError> {
    validate_volume_name(name).map_err(|e| match e {
        VolumeError::InvalidName { name, reason } => {
            VolumeError::InvalidSnapshotName { name, reason }
        }
        other => other,
    })
}

/// The id of snapshot `name` of `record`'s volume.
pub(crate) fn snapshot_id(record: &VolumeRecord, name: &str) -> Result<VolumeId, VolumeError> {
    VolumeService::snapshot_of(record, name).map(|s| s.id)
}

impl VolumeService {
    /// Carries out layer operation `req` on `record`'s volume: in a
    /// cluster through its primary, at one point of the replication stream
    /// on every replica; else on the local store.
    fn layer_request(&self, record: &VolumeRecord, req: LayerRequest) -> Result<(), VolumeError> {
        if let Some(cluster) = &self.cluster {
            return cluster.layer_request(record, req);
        }
        match req {
            LayerRequest::Snapshot(snap) => self.store.snapshot(record.id, snap)?,
            LayerRequest::Delete(snap) => self.store.delete_snapshot(snap)?,
            LayerRequest::Rollback(snap) => self.store.rollback(record.id, snap)?,
        }
        Ok(())
    }

    pub(crate) fn snapshot_of<'a>(
        record: &'a VolumeRecord,
        name: &str,
    ) -> Result<&'a SnapshotRecord, VolumeError> {
        record
            .snapshot(name)
            .ok_or_else(|| VolumeError::SnapshotNotFound {
                volume: record.name.clone(),
                name: name.to_string(),
            })
    }

    /// Names of the volumes cloned from snapshot `id`.
    fn clones_of(records: &[Versioned<VolumeRecord>], id: VolumeId) -> Vec<String> {
        records
            .iter()
            .filter(|v| {
                v.record
                    .clone_of
                    .as_ref()
                    .is_some_and(|c| c.snapshot_id == id)
            })
            .map(|v| v.record.name.clone())
            .collect()
    }

    fn snapshot_info(
        &self,
        volume: &VolumeRecord,
        snap: &SnapshotRecord,
        records: &[Versioned<VolumeRecord>],
        space: &HashMap<VolumeId, (u64, u64)>,
    ) -> SnapshotInfo {
        let (written_bytes, exclusive_bytes) = space.get(&snap.id).copied().unwrap_or_default();
        SnapshotInfo {
            volume: volume.name.clone(),
            name: snap.name.clone(),
            id: snap.id,
            size_bytes: snap.size_bytes,
            created_at: snap.created_at.clone(),
            written_bytes,
            exclusive_bytes,
            clones: Self::clones_of(records, snap.id),
            open_connections: self.open_handles(snap.id),
            nvme_hosts: snap.nvme_hosts.clone(),
            encrypted: self.snapshot_encrypted(volume, snap.id),
        }
    }

    /// Written and exclusive bytes of every snapshot in the store.
    fn snapshot_space(&self) -> HashMap<VolumeId, (u64, u64)> {
        self.store
            .snapshots()
            .into_iter()
            .map(|s| (s.id, (s.written_bytes, s.exclusive_bytes)))
            .collect()
    }

    /// The per-snapshot space gauges of `/metrics`.
    pub(crate) fn render_snapshot_space(
        &self,
        out: &mut String,
        records: &[Versioned<VolumeRecord>],
    ) {
        use std::fmt::Write as _;
        let space = self.snapshot_space();
        let gauges: [SpaceGauge; 2] = [
            (
                "basalt_snapshot_written_bytes",
                "Bytes written while the snapshot's layer was its volume's newest (4 KiB granularity).",
                |(written, _)| written,
            ),
            (
                "basalt_snapshot_exclusive_bytes",
                "Bytes only the snapshot holds: what deleting it frees.",
                |(_, exclusive)| exclusive,
            ),
        ];
        for (metric, help, value) in gauges {
            let _ = writeln!(out, "# HELP {metric} {help}\n# TYPE {metric} gauge");
            for v in records {
                for snap in &v.record.snapshots {
                    // Names are validated to [A-Za-z0-9._-]: no escaping.
                    let _ = writeln!(
                        out,
                        "{metric}{{volume=\"{}\",snapshot=\"{}\"}} {}",
                        v.record.name,
                        snap.name,
                        value(space.get(&snap.id).copied().unwrap_or_default())
                    );
                }
            }
        }
    }

    /// Takes snapshot `name` of `volume`: crash-consistent (every write
    /// completed before the call is in it), instant, read-only.
    pub fn create_snapshot(&self, volume: &str, name: &str) -> Result<SnapshotInfo, VolumeError> {
        validate_snapshot_name(name)?;
        let _control = self.control.lock();
        let snap = self.create_snapshot_locked(volume, name)?;
        self.snapshot_locked(volume, &snap.name)
    }

    fn create_snapshot_locked(
        &self,
        volume: &str,
        name: &str,
    ) -> Result<SnapshotRecord, VolumeError> {
        let current = self.record(volume)?;
        if current.record.reencryption.is_some() {
            return Err(self.busy_reencrypting(volume));
        }
        if current.record.snapshot(name).is_some() {
            return Err(VolumeError::SnapshotExists {
                volume: volume.to_string(),
                name: name.to_string(),
            });
        }
        if let Some(project) = current.record.project.as_deref() {
            let records = self.catalog.list().map_err(catalog_error)?;
            let growth = Growth {
                snapshots: 1,
                ..Growth::default()
            };
            self.check_quota(Some(project), &records, growth)?;
        }
        // In a cluster a snapshot id is asked for once (an id names one
        // barrier's layer): one the primary did not answer, because it
        // changed meanwhile, is asked again under a new id.
        let tries = if self.cluster.is_some() { 3 } else { 1 };
        let mut snap = None;
        for attempt in 1..=tries {
            let fresh = SnapshotRecord::new(
                VolumeId::new_v4(),
                name,
                current.record.size_bytes,
                SystemTime::now(),
            );
            match self.layer_request(&current.record, LayerRequest::Snapshot(fresh.id)) {
                Ok(()) => {
                    snap = Some(fresh);
                    break;
                }
                Err(e @ VolumeError::Cluster(_)) if attempt < tries => {
                    tracing::warn!(volume, snapshot = name, error = %e, "snapshot not answered; asking again under a new id");
                }
                Err(e) => return Err(e),
            }
        }
        let snap = snap.ok_or_else(|| VolumeError::Cluster("the snapshot was not taken".into()))?;
        let mut record = current.record.clone();
        record.snapshots.push(snap.clone());
        if let Err(e) = self.catalog.update(&record, current.revision) {
            if let Err(undo) = self.layer_request(&record, LayerRequest::Delete(snap.id)) {
                tracing::error!(volume, snapshot = name, error = %undo,
                    "could not remove the store snapshot after the catalog refused it; the next start will");
            }
            return Err(catalog_error(e));
        }
        tracing::info!(volume, snapshot = name, id = %snap.id, "snapshot created");
        Ok(snap)
    }

    /// Snapshot `name` of `volume`.
    pub fn snapshot(&self, volume: &str, name: &str) -> Result<SnapshotInfo, VolumeError> {
        let _control = self.control.lock();
        self.snapshot_locked(volume, name)
    }

    fn snapshot_locked(&self, volume: &str, name: &str) -> Result<SnapshotInfo, VolumeError> {
        let record = self.record(volume)?.record;
        let snap = Self::snapshot_of(&record, name)?;
        let records = self.catalog.list().map_err(catalog_error)?;
        Ok(self.snapshot_info(&record, snap, &records, &self.snapshot_space()))
    }

    /// The snapshots of `volume` (oldest first), or of every volume.
    pub fn snapshots(&self, volume: Option<&str>) -> Result<Vec<SnapshotInfo>, VolumeError> {
        let records = self.catalog.list().map_err(catalog_error)?;
        if let Some(name) = volume {
            if !records.iter().any(|v| v.record.name == name) {
                return Err(VolumeError::NotFound(name.to_string()));
            }
        }
        let space = self.snapshot_space();
        Ok(records
            .iter()
            .filter(|v| volume.is_none_or(|name| v.record.name == name))
            .flat_map(|v| {
                v.record
                    .snapshots
                    .iter()
                    .map(|s| self.snapshot_info(&v.record, s, &records, &space))
            })
            .collect())
    }

    /// Deletes snapshot `name` of `volume`, freeing the blocks no other
    /// layer needs. Refused while it has clones or open connections.
    pub fn delete_snapshot(&self, volume: &str, name: &str) -> Result<(), VolumeError> {
        let _control = self.control.lock();
        let current = self.record(volume)?;
        let snap = Self::snapshot_of(&current.record, name)?.clone();
        let records = self.catalog.list().map_err(catalog_error)?;
        let clones = Self::clones_of(&records, snap.id);
        if !clones.is_empty() {
            return Err(VolumeError::HasClones {
                snapshot: format!("{volume}@{name}"),
                clones,
            });
        }
        let handles = self.open_handles(snap.id);
        if handles > 0 {
            return Err(VolumeError::InUse {
                name: format!("{volume}@{name}"),
                handles,
            });
        }
        let mut record = current.record.clone();
        record.snapshots.retain(|s| s.id != snap.id);
        self.catalog
            .update(&record, current.revision)
            .map_err(catalog_error)?;
        self.stats.lock().remove(&snap.id);
        if let Err(e) = self.layer_request(&record, LayerRequest::Delete(snap.id)) {
            tracing::error!(volume, snapshot = name, error = %e,
                "snapshot removed from the catalog, but the store could not delete it; the next start will retry");
            return Err(e);
        }
        tracing::info!(volume, snapshot = name, "snapshot deleted");
        Ok(())
    }

    /// Lets host `nqn` read snapshot `name` of `volume` over NVMe/TCP, as
    /// its own (write-protected) subsystem (idempotent).
    pub fn attach_snapshot_host(
        &self,
        volume: &str,
        name: &str,
        nqn: &str,
    ) -> Result<SnapshotInfo, VolumeError> {
        crate::service::validate_host_nqn(nqn)?;
        self.update_snapshot_hosts(volume, name, |hosts| {
            if !hosts.iter().any(|h| h == nqn) {
                hosts.push(nqn.to_string());
            }
        })
    }

    /// Revokes host `nqn`'s access to snapshot `name` of `volume`
    /// (idempotent; a connected host keeps its controller).
    pub fn detach_snapshot_host(
        &self,
        volume: &str,
        name: &str,
        nqn: &str,
    ) -> Result<SnapshotInfo, VolumeError> {
        self.update_snapshot_hosts(volume, name, |hosts| hosts.retain(|h| h != nqn))
    }

    fn update_snapshot_hosts(
        &self,
        volume: &str,
        name: &str,
        change: impl FnOnce(&mut Vec<String>),
    ) -> Result<SnapshotInfo, VolumeError> {
        let _control = self.control.lock();
        let current = self.record(volume)?;
        Self::snapshot_of(&current.record, name)?;
        let mut record = current.record.clone();
        if let Some(snap) = record.snapshots.iter_mut().find(|s| s.name == name) {
            change(&mut snap.nvme_hosts);
        }
        if record != current.record {
            self.catalog
                .update(&record, current.revision)
                .map_err(catalog_error)?;
            tracing::info!(
                volume,
                snapshot = name,
                "NVMe hosts of the snapshot changed"
            );
        }
        self.snapshot_locked(volume, name)
    }

    /// Makes `volume` hold exactly what its snapshot `snapshot` holds (its
    /// size included, but for a replicated volume, which never shrinks: it
    /// reads zeros past the snapshot's end). Refused while clients have
    /// it open (in a cluster, through any node), unless `force`
    /// disconnects them first.
    pub fn rollback(
        &self,
        volume: &str,
        snapshot: &str,
        force: bool,
    ) -> Result<VolumeInfo, VolumeError> {
        let _control = self.control.lock();
        let current = self.record(volume)?;
        if current.record.reencryption.is_some() {
            return Err(self.busy_reencrypting(volume));
        }
        let snap = Self::snapshot_of(&current.record, snapshot)?.clone();
        let handles = self.open_handles(current.record.id);
        if force {
            // Here and on every other node of a cluster.
            self.disconnect_locked(volume, DISCONNECT_WAIT)?;
        } else if handles > 0 {
            return Err(VolumeError::InUse {
                name: volume.to_string(),
                handles,
            });
        } else {
            self.refuse_if_open_elsewhere(&current.record)?;
        }
        self.layer_request(&current.record, LayerRequest::Rollback(snap.id))?;
        let mut record = current.record.clone();
        if self.cluster.is_none() {
            record.size_bytes = snap.size_bytes;
        }
        self.catalog
            .update(&record, current.revision)
            .map_err(catalog_error)?;
        tracing::info!(volume, snapshot, size = %format_size(snap.size_bytes), "volume rolled back");
        Ok(self.info(&record, &self.allocated_by_volume()))
    }

    /// Copies into clone `name` the blocks of `range` it still reads from
    /// its source snapshot, online, at most `rate` bytes per second; when
    /// the range reaches the volume's end and nothing is left to copy, the
    /// clone and its own snapshots are detached from its source (which
    /// can then be deleted; copies go into its oldest snapshot). A
    /// volume being re-encrypted is flattened the same way, resealing what
    /// it reads under its old key; detached, its re-encryption is done.
    pub fn flatten(
        &self,
        name: &str,
        range: std::ops::Range<u64>,
        rate: Option<u64>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<basalt_store::FlattenReport, VolumeError> {
        let record = self.record(name)?.record;
        if record.clone_of.is_none() && record.reencryption.is_none() {
            return Err(VolumeError::NotSupported(format!(
                "volume {name:?} is not a clone; there is nothing to flatten"
            )));
        }
        // Not under the control lock: this copies data for a long time.
        let end = range.end.min(record.size_bytes);
        // A clone is detached from its source together with its own
        // snapshots (copies go into its oldest layer); a re-encryption
        // reseals into the head what it reads through every older layer.
        let report = match &self.cluster {
            Some(cluster) => cluster.flatten(&record, range, rate, progress)?,
            None if record.reencryption.is_some() => {
                self.store.flatten(record.id, range, rate, progress)?
            }
            None => self
                .store
                .flatten_source(record.id, range, rate, progress)?,
        };
        // A re-encrypted clone's snapshots may still read through its
        // source: it stays a clone until flattened again.
        let independent = report.detached
            && (self.cluster.is_some() || self.store.clone_source(record.id)?.is_none());
        {
            let mut flattening = self.flattening.lock();
            if report.detached {
                flattening.remove(&record.id);
            } else {
                let entry = flattening.entry(record.id).or_insert(FlattenProgress {
                    done_bytes: 0,
                    total_bytes: record.size_bytes,
                    copied_bytes: 0,
                    updated: std::time::Instant::now(),
                });
                entry.done_bytes = end;
                entry.total_bytes = record.size_bytes;
                entry.copied_bytes += report.copied_blocks * basalt_store::BLOCK_SIZE;
                entry.updated = std::time::Instant::now();
            }
        }
        if report.detached {
            let _control = self.control.lock();
            if independent {
                self.forget_clone_source(name)?;
            }
            self.finish_reencryption(name)?;
        }
        Ok(report)
    }

    /// Drops a detached clone's source from its record.
    pub(crate) fn forget_clone_source(&self, name: &str) -> Result<(), VolumeError> {
        let current = self.record(name)?;
        if let Some(source) = &current.record.clone_of {
            let mut record = current.record.clone();
            tracing::info!(volume = name, source = %format!("{}@{}", source.volume, source.snapshot), "clone flattened: it no longer depends on its source");
            record.clone_of = None;
            self.catalog
                .update(&record, current.revision)
                .map_err(catalog_error)?;
        }
        Ok(())
    }

    /// Creates volume `name` as a clone of `source`: `VOLUME@SNAPSHOT`, or
    /// `VOLUME` (a snapshot named `clone-NAME` is taken first). Instant:
    /// nothing is copied. `size`: at least the snapshot's (default: equal).
    /// `compression`: as for [`NewVolume`](crate::NewVolume) (`None`: the
    /// source volume's).
    pub fn create_clone(
        &self,
        name: &str,
        source: &str,
        size: Option<u64>,
        compression: Option<&str>,
    ) -> Result<VolumeInfo, VolumeError> {
        validate_volume_name(name)?;
        let requested_compression = compression
            .map(crate::compression::record_compression)
            .transpose()?;
        let _control = self.control.lock();
        if self.catalog.get(name).map_err(catalog_error)?.is_some() {
            return Err(VolumeError::AlreadyExists(name.to_string()));
        }
        // A clone belongs to its source's project and counts against it;
        // checked before an implicit snapshot is taken, so a refused clone
        // leaves nothing behind.
        let source_volume = split_snapshot_name(source).map_or(source, |(v, _)| v);
        let source_record = self.record(source_volume)?.record;
        if let Some(project) = source_record.project.as_deref() {
            let records = self.catalog.list().map_err(catalog_error)?;
            let snapshot_size = split_snapshot_name(source)
                .and_then(|(_, snap)| source_record.snapshot(snap))
                .map_or(source_record.size_bytes, |snap| snap.size_bytes);
            let capacity = size.unwrap_or(snapshot_size);
            let growth = Growth {
                capacity_bytes: capacity,
                volumes: 1,
                snapshots: u64::from(split_snapshot_name(source).is_none()),
            };
            self.check_quota(Some(project), &records, growth)?;
        }
        let (volume, snapshot) = match split_snapshot_name(source) {
            Some((volume, snapshot)) => (volume, snapshot.to_string()),
            None => {
                let implicit = format!("clone-{name}");
                validate_snapshot_name(&implicit)?;
                self.create_snapshot_locked(source, &implicit)?;
                (source, implicit)
            }
        };
        let parent = self.record(volume)?.record;
        let snap = Self::snapshot_of(&parent, &snapshot)?.clone();
        let size = size.unwrap_or(snap.size_bytes);
        crate::service::validate_volume_size(size)?;
        if size < snap.size_bytes {
            return Err(VolumeError::InvalidSize(format!(
                "a clone of {volume}@{snapshot} ({}) cannot be smaller than it",
                format_size(snap.size_bytes)
            )));
        }
        let mut record = VolumeRecord::new(VolumeId::new_v4(), name, size, SystemTime::now());
        record.clone_of = Some(CloneSource::new(volume, snapshot.clone(), snap.id));
        record.project = parent.project.clone();
        record.volume_type = parent.volume_type.clone();
        record.qos = parent.qos.clone();
        // The store gives the clone its parent's key: the volume's, or
        // the one a re-encryption pinned the snapshot to (whose type,
        // then, no longer describes the clone).
        record.encrypted = self.snapshot_encrypted(&parent, snap.id);
        if record.encrypted != parent.encrypted {
            record.volume_type = None;
        }
        record.wrapped_key = parent.wrapped_key.clone();
        // Its type is its source's, so the type's compression is already
        // the source's unless the source was created with another.
        record.compression = requested_compression.unwrap_or_else(|| parent.compression.clone());
        let codec = crate::compression::record_codec(&record);
        let source = format!("{volume}@{snapshot}");
        if let Some(cluster) = &self.cluster {
            // As many replicas as the source; the cluster layer places them
            // on the nodes holding the snapshot, each made from it there.
            let n = parent
                .replicas
                .unwrap_or_else(|| cluster.default_replicas());
            let _provisioning = cluster.lock_provisioning()?;
            cluster.check_create(name, size, n, false)?;
            record.replicas = Some(n);
            self.catalog.insert(&record).map_err(catalog_error)?;
            tracing::info!(volume = name, %source, size = %format_size(size), replicas = n, "replicated clone created");
            return Ok(self.info(&record, &HashMap::new()));
        }
        let records = self.catalog.list().map_err(catalog_error)?;
        self.check_capacity(Self::provisioned(&records), size)?;
        let revision = self.catalog.insert(&record).map_err(catalog_error)?;
        if let Err(e) = self.store.clone_snapshot(snap.id, record.id, Some(size)) {
            if let Err(undo) = self.catalog.delete(name, revision) {
                tracing::error!(volume = name, error = %undo,
                    "could not remove the catalog record after the store refused the clone; the next start will retry making it");
            }
            return Err(e.into());
        }
        if codec.is_some() {
            self.store.set_compression(record.id, codec);
        }
        tracing::info!(volume = name, %source, size = %format_size(size), compression = ?record.compression, "clone created");
        Ok(self.info(&record, &HashMap::new()))
    }
}

#[cfg(test)]
mod tests {
    use crate::service::tests::small_node;
    use crate::VolumeError;
    use basalt_catalog::{Catalog, CloneSource, VolumeRecord};
    use basalt_store::VolumeId;
    use std::time::SystemTime;

    const MIB: u64 = 1 << 20;

    fn read_all(n: &crate::service::tests::Node, name: &str) -> Vec<u8> {
        let h = n.service.open(name).unwrap();
        let mut buf = vec![0u8; h.size() as usize];
        h.read(0, &mut buf).unwrap();
        buf
    }

    #[test]
    fn reconcile_finishes_what_a_stop_cut_short() {
        let n = small_node();
        n.service.create("v", 4 * MIB).unwrap();
        n.service
            .open("v")
            .unwrap()
            .write(0, &[7; 8192], true)
            .unwrap();
        let s1 = n.service.create_snapshot("v", "s1").unwrap();
        n.service
            .open("v")
            .unwrap()
            .write(0, &[8; 4096], true)
            .unwrap();
        let v_id = n.service.get("v").unwrap().id;
        assert!(n.service.reconcile().unwrap().is_clean());

        // A snapshot whose catalog step a stop cut short: deleted.
        let orphan = VolumeId::new_v4();
        n.store.snapshot(v_id, orphan).unwrap();
        // A clone whose store step a stop cut short: made from its source.
        let mut clone = VolumeRecord::new(VolumeId::new_v4(), "c", 4 * MIB, SystemTime::now());
        clone.clone_of = Some(CloneSource::new("v", "s1", s1.id));
        n.catalog.insert(&clone).unwrap();
        // A clone flattened in the store whose record still names its source.
        let d = n.service.create_clone("d", "v@s1", None, None).unwrap();
        n.store
            .flatten(d.id, 0..4 * MIB, None, &mut |_, _| {})
            .unwrap();

        let report = n.service.reconcile().unwrap();
        assert_eq!(report.deleted_orphans, [orphan], "{report:?}");
        assert_eq!(report.created, ["c"], "{report:?}");
        assert!(report.failed.is_empty(), "{report:?}");
        assert!(n.store.snapshots().iter().all(|s| s.id != orphan));
        let s1_content = read_all(&n, "v@s1");
        assert_eq!(&s1_content[..8192], &[7; 8192][..]);
        assert!(read_all(&n, "c") == s1_content);
        assert!(read_all(&n, "d") == s1_content);
        assert_eq!(n.service.get("d").unwrap().clone_of, None);
        assert_eq!(
            n.service.get("c").unwrap().clone_of.as_deref(),
            Some("v@s1")
        );
        assert!(n.service.reconcile().unwrap().is_clean());

        // What depends on what is refused, by name.
        let err = n.service.delete_snapshot("v", "s1").unwrap_err();
        assert!(
            matches!(&err, VolumeError::HasClones { clones, .. } if clones == &["c"]),
            "{err}"
        );
        let err = n.service.delete("v").unwrap_err();
        assert!(matches!(err, VolumeError::HasSnapshots { .. }), "{err}");
        n.service.delete("c").unwrap();
        n.service.delete_snapshot("v", "s1").unwrap();
        n.service.delete("v").unwrap();
        assert!(n.store.snapshots().is_empty());
    }
}
