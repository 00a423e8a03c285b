//! The volume service's view of the cluster (`ClusterVolumes`): opening
//! volumes, capacity checks of creates and grows (under the provisioning
//! lock, from watched copies caught up with etcd), node states, and each
//! volume's replicas as the records show them.

use super::{vol_of, ClusterMember, ClusterVolume};
use crate::meta::{CasOutcome, NodeState, NodeStatus};
use crate::placement;
use crate::plan::{self, default_min_in_sync};
use basalt_catalog::VolumeRecord;
use basalt_replication::{Membership, NodeId, ReplicaState};
use basalt_store::BLOCK_SIZE;
use basalt_volume::{
    BlockCipher, BlockIo, ClusterVolumes, NodePortal, NodeView, ProvisioningGuard, ReplicaStatus,
    VolumeError,
};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

fn state_name(s: ReplicaState) -> &'static str {
    match s {
        ReplicaState::InSync => "in-sync",
        ReplicaState::OutOfSync => "out-of-sync",
        ReplicaState::Faulty => "faulty",
    }
}

impl ClusterVolumes for ClusterMember {
    fn open(
        &self,
        record: &VolumeRecord,
        cipher: Option<Arc<BlockCipher>>,
    ) -> Result<Arc<dyn BlockIo>, VolumeError> {
        let vol = vol_of(record.id);
        let recorded = self
            .inner
            .records
            .read()
            .get(&vol)
            .map_or(0, |r| r.blocks * BLOCK_SIZE);
        let size = self.inner.open_sizes.lock().entry(vol).or_default().clone();
        size.fetch_max(record.size_bytes.max(recorded), Ordering::Relaxed);
        Ok(Arc::new(ClusterVolume {
            inner: Arc::downgrade(&self.inner),
            vol,
            size,
            partial: Mutex::new(()),
            cipher,
            _open: self.inner.open_clients.open(vol),
        }))
    }

    fn open_snapshot(
        &self,
        record: &VolumeRecord,
        snapshot: uuid::Uuid,
        size: u64,
        cipher: Option<Arc<BlockCipher>>,
    ) -> Result<Arc<dyn BlockIo>, VolumeError> {
        Ok(Arc::new(super::snapshot_io::RemoteSnapshot {
            inner: Arc::downgrade(&self.inner),
            vol: vol_of(record.id),
            layer: basalt_replication::LayerId(snapshot.as_u128()),
            size,
            cipher,
        }))
    }

    fn default_replicas(&self) -> u32 {
        let alive = self
            .inner
            .nodes
            .read()
            .iter()
            .filter(|n| n.alive && n.state == NodeState::Active)
            .count() as u32;
        if alive < 3 {
            tracing::warn!(
                nodes = alive,
                "fewer than 3 nodes: new volumes get one replica per node"
            );
        }
        alive.clamp(1, 3)
    }

    fn clients_elsewhere(
        &self,
        record: &VolumeRecord,
    ) -> Result<Vec<(String, usize)>, VolumeError> {
        self.inner
            .meta
            .clients_elsewhere(vol_of(record.id), &self.inner.cfg.name)
            .map_err(|e| VolumeError::Cluster(e.to_string()))
    }

    fn disconnect_elsewhere(
        &self,
        record: &VolumeRecord,
        wait: std::time::Duration,
    ) -> Result<usize, VolumeError> {
        let before = self.clients_elsewhere(record)?;
        if before.is_empty() {
            return Ok(0);
        }
        self.inner
            .meta
            .request_disconnect(vol_of(record.id))
            .map_err(|e| VolumeError::Cluster(e.to_string()))?;
        let deadline = std::time::Instant::now() + wait;
        loop {
            let now = self.clients_elsewhere(record)?;
            if now.is_empty() {
                let nodes: Vec<&str> = before.iter().map(|(n, _)| n.as_str()).collect();
                tracing::info!(volume = %record.name, nodes = ?nodes,
                    "other nodes dropped their clients of the volume");
                return Ok(before.iter().map(|(_, c)| c).sum());
            }
            if std::time::Instant::now() >= deadline {
                return Err(VolumeError::InUseElsewhere {
                    name: record.name.clone(),
                    nodes: now,
                });
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    fn nodes(&self) -> Result<Vec<NodeView>, VolumeError> {
        let nodes = self
            .inner
            .meta
            .nodes()
            .map_err(|e| VolumeError::Cluster(e.to_string()))?;
        let coordinator = self.inner.meta.coordinator().ok().flatten();
        let records = self.inner.records.read();
        Ok(nodes
            .into_iter()
            .map(|n| NodeView {
                coordinator: coordinator.as_deref() == Some(n.info.name.as_str()),
                replicas: records
                    .values()
                    .filter(|r| r.replicas.contains_key(&n.id))
                    .count(),
                primaries: records.values().filter(|r| r.primary == n.id).count(),
                name: n.info.name,
                id: n.id.0,
                zone: n.info.zone,
                alive: n.alive,
                state: match n.state {
                    NodeState::Active => "active",
                    NodeState::Draining => "draining",
                    NodeState::Removed => "removed",
                }
                .to_string(),
                capacity_bytes: n.info.capacity_bytes,
                free_bytes: n.info.free_bytes,
                peer_addr: n.info.peer_addr.to_string(),
                nbd_addr: n.info.nbd_addr.map(|a| a.to_string()),
                nvme_addr: n.info.nvme_addr.map(|a| a.to_string()),
                iscsi_addr: n.info.iscsi_addr.map(|a| a.to_string()),
                api_addr: n.info.api_addr.map(|a| a.to_string()),
            })
            .collect())
    }

    fn lock_provisioning(&self) -> Result<ProvisioningGuard, VolumeError> {
        match self.inner.meta.lock_provisioning() {
            Ok(lock) => Ok(Box::new(lock)),
            Err(e) => Err(VolumeError::Cluster(format!(
                "cannot take the cluster's provisioning lock (another create or grow may be holding it; try again): {e}"
            ))),
        }
    }

    fn set_node_state(&self, name: &str, state: &str) -> Result<(), VolumeError> {
        let state = match state {
            "active" => NodeState::Active,
            "draining" => NodeState::Draining,
            "removed" => NodeState::Removed,
            other => return Err(VolumeError::InvalidNodeState(other.to_string())),
        };
        let known = self
            .inner
            .meta
            .nodes()
            .map_err(|e| VolumeError::Cluster(e.to_string()))?
            .iter()
            .any(|n| n.info.name == name);
        if !known {
            return Err(VolumeError::NoSuchNode(name.to_string()));
        }
        self.inner
            .meta
            .set_node_state(name, state)
            .map_err(|e| VolumeError::Cluster(e.to_string()))?;
        tracing::info!(node = name, ?state, "node state changed");
        Ok(())
    }

    fn compare_replicas(
        &self,
        record: &VolumeRecord,
        range: std::ops::Range<u64>,
        rate: Option<u64>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<basalt_volume::ReplicaComparison, VolumeError> {
        self.inner.compare(record, range, rate, progress)
    }

    fn layer_request(
        &self,
        record: &VolumeRecord,
        req: basalt_volume::LayerRequest,
    ) -> Result<(), VolumeError> {
        self.inner.layer_request(record, req)
    }

    fn flatten(
        &self,
        record: &VolumeRecord,
        range: std::ops::Range<u64>,
        rate: Option<u64>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<basalt_store::FlattenReport, VolumeError> {
        self.inner.flatten(record, range, rate, progress)
    }

    fn compact(
        &self,
        record: &VolumeRecord,
        range: std::ops::Range<u64>,
        rate: Option<u64>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<basalt_store::CompactReport, VolumeError> {
        self.inner.compact(record, range, rate, progress)
    }

    fn replicas(&self, record: &VolumeRecord) -> Vec<ReplicaStatus> {
        let rec = self.inner.records.read().get(&vol_of(record.id)).cloned();
        let Some(rec) = rec else {
            return Vec::new();
        };
        let progress = self
            .inner
            .replica(rec.volume)
            .map(|r| r.resync_progress())
            .unwrap_or_default();
        let nodes = self.inner.nodes.read();
        let region_bytes = self.inner.cfg.timing.region_blocks * BLOCK_SIZE;
        rec.replicas
            .iter()
            .map(|(id, info)| ReplicaStatus {
                resync_percent: progress
                    .get(id)
                    .filter(|_| rec.primary == self.inner.me)
                    .map(|(left, total)| {
                        (100 * total.saturating_sub(*left) / (*total).max(1)).min(99) as u8
                    }),
                // Regions left × region size: the last region may be short.
                resync_remaining_bytes: progress
                    .get(id)
                    .filter(|_| rec.primary == self.inner.me)
                    .map(|(left, _)| {
                        (*left as u64)
                            .saturating_mul(region_bytes)
                            .min(record.size_bytes)
                    }),
                node: nodes
                    .iter()
                    .find(|n| n.id == *id)
                    .map_or_else(|| format!("node-{}", id.0), |n| n.info.name.clone()),
                primary: *id == rec.primary,
                state: state_name(info.state).to_string(),
                epoch: rec.epoch.0,
            })
            .collect()
    }

    fn check_create(
        &self,
        name: &str,
        size: u64,
        replicas: u32,
        allow_degraded: bool,
    ) -> Result<(), VolumeError> {
        let (nodes, provisioned) = self.provisioning()?;
        // Nodes that may take replicas, up or down: a node that is down now
        // still counts, so a create while a node is away succeeds.
        let active: Vec<_> = nodes
            .iter()
            .filter(|n| n.state == NodeState::Active)
            .collect();
        let wanted = replicas as usize;
        if wanted > active.len() && !allow_degraded {
            return Err(VolumeError::TooFewNodes {
                volume: name.to_string(),
                replicas: wanted,
                nodes: active.len(),
                quorum: default_min_in_sync(wanted).min(active.len()).max(1),
            });
        }
        let with_room = active
            .iter()
            .filter(|n| {
                placement::node_has_room(&provisioned, n.id, n.info.provision_limit(), size)
            })
            .count();
        let needed = (replicas as usize).min(active.len()).max(1);
        if with_room < needed {
            return Err(VolumeError::ClusterFull {
                volume: name.to_string(),
                size,
                replicas: needed,
                with_room,
                nodes: active.len(),
            });
        }
        Ok(())
    }

    fn check_grow(&self, record: &VolumeRecord, size: u64) -> Result<(), VolumeError> {
        let growth = size.saturating_sub(record.size_bytes);
        let vol = vol_of(record.id);
        let Some(rec) = self.inner.records.read().get(&vol).cloned() else {
            // Not placed yet: placement takes the catalog's (new) size.
            return Ok(());
        };
        if growth == 0 {
            return Ok(());
        }
        let (nodes, provisioned) = self.provisioning()?;
        for n in rec.replicas.keys() {
            let Some(node) = nodes.iter().find(|x| x.id == *n) else {
                continue;
            };
            let limit = node.info.provision_limit();
            let have = provisioned.get(n).copied().unwrap_or(0);
            if !placement::has_room(have, limit, growth) {
                return Err(VolumeError::ReplicaNodeFull {
                    node: node.info.name.clone(),
                    volume: record.name.clone(),
                    requested: growth,
                    provisioned: have,
                    limit,
                });
            }
        }
        Ok(())
    }

    fn grow(&self, record: &VolumeRecord, size: u64) -> Result<(), VolumeError> {
        let vol = vol_of(record.id);
        let blocks = size / BLOCK_SIZE;
        let failed = |e: &dyn std::fmt::Display| VolumeError::Cluster(e.to_string());
        for _ in 0..10 {
            let Some(cur) = self.inner.meta.membership(vol).map_err(|e| failed(&e))? else {
                return Ok(()); // not placed yet: placed at the catalog's size
            };
            if cur.blocks >= blocks {
                return Ok(());
            }
            let want = cur.clone().with_blocks(blocks);
            match self
                .inner
                .meta
                .cas_membership(cur.version, want)
                .map_err(|e| failed(&e))?
            {
                CasOutcome::Applied(rec) => {
                    tracing::info!(volume = %record.name, blocks, version = rec.version,
                        "volume size recorded for its replicas");
                    // This node's replica learns it now, the others at their
                    // next poll of the records.
                    self.inner.on_record(rec);
                    return Ok(());
                }
                CasOutcome::Conflict(_) => continue,
                CasOutcome::Invalid(reason) => return Err(VolumeError::Cluster(reason)),
                CasOutcome::Missing => return Ok(()),
            }
        }
        Err(VolumeError::Cluster(format!(
            "the membership record of {} changed too often to record its new size; the coordinator will",
            record.name
        )))
    }

    fn replica_compares(&self) -> (u64, u64) {
        (
            self.inner.compare_passes.load(Ordering::Relaxed),
            self.inner.compare_differing.load(Ordering::Relaxed),
        )
    }

    fn read_repairs(&self) -> u64 {
        self.inner
            .read_repairs
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    fn is_local_primary(&self, id: uuid::Uuid) -> Option<bool> {
        let records = self.inner.records.read();
        let rec = records.get(&vol_of(id))?;
        if rec.replicas.is_empty() {
            return None;
        }
        Some(rec.primary == self.inner.me)
    }

    fn primary_node(&self, id: uuid::Uuid) -> Option<u32> {
        let records = self.inner.records.read();
        let rec = records.get(&vol_of(id))?;
        (!rec.replicas.is_empty()).then_some(rec.primary.0)
    }

    fn portals(&self) -> Vec<NodePortal> {
        self.inner
            .nodes
            .read()
            .iter()
            .filter(|n| n.state != NodeState::Removed)
            .map(|n| NodePortal {
                id: n.id.0,
                alive: n.alive,
                local: n.id == self.inner.me,
                nvme_addr: n.info.nvme_addr,
                iscsi_addr: n.info.iscsi_addr,
            })
            .collect()
    }
}

impl ClusterMember {
    /// Every node, and the bytes of volume sizes each holds replicas of.
    ///
    /// Volumes in the catalog that are not placed yet (created a moment ago,
    /// or waiting for room) count too, on the nodes the coordinator's rules
    /// would place them on now: a create checked right after another must
    /// leave room for it.
    fn provisioning(&self) -> Result<(Vec<NodeStatus>, HashMap<NodeId, u64>), VolumeError> {
        let unavailable = |e: &dyn std::fmt::Display| VolumeError::Cluster(e.to_string());
        // This node's watched copies, once they hold everything etcd had
        // when asked: a volume created or placed a moment ago through
        // another node counts even before it shows up here otherwise.
        let revision = self
            .inner
            .meta
            .current_revision()
            .map_err(|e| unavailable(&e))?;
        self.inner.caught_up(revision)?;
        let nodes = self.inner.nodes.read().clone();
        let catalog: Vec<VolumeRecord> = self.inner.volumes.read().values().cloned().collect();
        let records: Vec<Membership> = self.inner.records.read().values().cloned().collect();
        let coordinator = *self.inner.coordinator_id.read();
        let provisioned = plan::provisioned_for_checks(&catalog, &records, &nodes, coordinator);
        Ok((nodes, provisioned))
    }
}
