//! The lifecycle of this node's replicas: the records the watch brings
//! start, update and stop replica drivers (creating, growing or restoring
//! the local copy first), and `Env` is what the drivers call back into.
//!
//! Invariants: a replica driver runs for exactly the volumes whose newest
//! record seen names this node; its local store volume exists, at least as
//! large as the record's size, before the driver starts; a stopped driver
//! has no work in progress when its stop returns (bounded wait).

use super::{uuid_of, Inner};
use crate::coordinator::CoordinatorTask;
use crate::meta::{CasOutcome, NodeStatus};
use crate::replica::{Event, Origin, Replica, ReplicaEnv, ReplicaSpec};
use crate::ticker::Tick;
use crate::ClusterError;
use crate::{crash_logs, saved_logs};
use basalt_catalog::VolumeRecord;
use basalt_replication::{
    ClientReply, Config, DiskOp, DiskResult, Membership, Msg, NodeId, ReplicaState, SavedLogs,
    VolumeId,
};
use basalt_store::{StoreError, BLOCK_SIZE};
use std::sync::{Arc, Weak};
use std::time::Duration;

pub(super) struct ReplicaHandle {
    pub(super) replica: Arc<Replica<Env>>,
}

/// How long a stop waits for a replica's work in progress (a disk batch)
/// to finish.
const REPLICA_STOP_WAIT: Duration = Duration::from_secs(10);

impl ReplicaHandle {
    pub(super) fn stop(self) {
        if !self.replica.stop_and_wait(REPLICA_STOP_WAIT) {
            tracing::warn!(
                "a stopped replica still had work in progress after {REPLICA_STOP_WAIT:?}"
            );
        }
    }

    /// Stops for a clean restart: the logs to save (see
    /// `Replica::stop_for_restart`).
    pub(super) fn stop_for_restart(self) -> Option<SavedLogs> {
        self.replica.stop_for_restart()
    }
}

/// The replica drivers' view of the member.
pub(super) struct Env(pub(super) Weak<Inner>);

impl ReplicaEnv for Env {
    fn send_peer(&self, to: NodeId, vol: VolumeId, msgs: Vec<Msg>) {
        if let Some(inner) = self.0.upgrade() {
            let repairs = msgs
                .iter()
                .filter(|m| matches!(m, Msg::RepairRead { .. }))
                .count();
            if repairs > 0 {
                inner
                    .read_repairs
                    .fetch_add(repairs as u64, std::sync::atomic::Ordering::Relaxed);
            }
            inner.peers.send_batch(to, vol, msgs);
        }
    }

    fn send_control(&self, vol: VolumeId, msg: Msg) {
        let Some(inner) = self.0.upgrade() else {
            return;
        };
        match msg {
            Msg::Heartbeat { boot, sent_at } => {
                let responder = inner.coordinator.lock().as_ref().map(|c| c.responder());
                if let Some(responder) = responder {
                    // Posted: this runs while the replica carries out its
                    // actions, and the same round takes it in.
                    let acks = responder.answer(&*inner, inner.me, &[(vol, boot, sent_at)]);
                    if let Some(replica) = inner.replica(vol) {
                        for (_, ack) in acks {
                            replica.post(Event::Control(ack));
                        }
                    }
                    return;
                }
                // Left for the heartbeat sender, which sends the node's
                // heartbeats to the coordinator together.
                inner.heartbeats.lock().push((vol, boot, sent_at));
            }
            // Answered from the watched copy: the watch delivers every new
            // version anyway; this closes the gap of a missed one.
            // Posted: this runs while the replica carries out its actions.
            Msg::MetaGet { vol } => {
                let rec = inner.records.read().get(&vol).cloned();
                if let (Some(record), Some(replica)) = (rec, inner.replica(vol)) {
                    replica.post(Event::Control(Msg::MetaReply {
                        record,
                        cas_ok: None,
                    }));
                }
            }
            Msg::MetaCas { expected, record } => {
                // etcd round trips must not stall the driver: run the CAS on
                // a short-lived thread; its answer comes back as a message.
                let weak = self.0.clone();
                let spawned = std::thread::Builder::new()
                    .name("membership-cas".into())
                    .spawn(move || {
                        let Some(inner) = weak.upgrade() else { return };
                        tracing::debug!(volume = %uuid_of(vol), expected, replicas = ?record.replicas, "replica asks for a membership change");
                        let reply = match inner.meta.cas_membership(expected, record) {
                            Ok(CasOutcome::Applied(r)) => Some((r, true)),
                            Ok(CasOutcome::Conflict(r)) => Some((r, false)),
                            Ok(CasOutcome::Invalid(reason)) => {
                                tracing::warn!(%reason, "membership change refused");
                                inner.records.read().get(&vol).cloned().map(|r| (r, false))
                            }
                            Ok(CasOutcome::Missing) => None,
                            Err(e) => {
                                tracing::warn!(error = %e, "membership change failed; the replica retries");
                                None
                            }
                        };
                        if let Some((record, ok)) = reply {
                            inner.on_record_arc(record.clone());
                            inner.to_replica(
                                vol,
                                Event::Control(Msg::MetaReply {
                                    record,
                                    cas_ok: Some(ok),
                                }),
                            );
                        }
                    });
                if let Err(e) = spawned {
                    tracing::warn!(error = %e, "could not start a membership change");
                }
            }
            _ => {}
        }
    }

    fn client_reply(&self, vol: VolumeId, origin: Origin, id: u64, reply: ClientReply) {
        let Some(inner) = self.0.upgrade() else {
            return;
        };
        match origin {
            Origin::Local => inner.complete(id, reply),
            Origin::Node(n) => inner.peers.send(n, vol, Msg::ClientReply { id, reply }),
        }
    }

    fn now_ms(&self) -> u64 {
        self.0.upgrade().map_or(0, |i| i.now_ms())
    }

    fn grow_local(&self, vol: VolumeId, bytes: u64) -> Result<(), String> {
        let inner = self.0.upgrade().ok_or("the cluster member is stopping")?;
        let id = uuid_of(vol);
        let current = inner
            .store
            .volumes()
            .into_iter()
            .find(|v| v.id == id)
            .map(|v| v.size)
            .ok_or("the local replica is gone")?;
        if current >= bytes {
            return Ok(());
        }
        inner
            .grow_local_copy(id, current, bytes)
            .map_err(|e| e.to_string())
    }

    fn layer_op(&self, vol: VolumeId, op: &DiskOp) -> Result<Option<Vec<u8>>, String> {
        let inner = self.0.upgrade().ok_or("the cluster member is stopping")?;
        inner.layer_disk_op(vol, op)
    }

    fn layer_op_async(&self, vol: VolumeId, instance: u64, id: u64, op: DiskOp) {
        let weak = self.0.clone();
        let spawned = std::thread::Builder::new()
            .name("layer-op".into())
            .spawn(move || {
                let Some(inner) = weak.upgrade() else { return };
                let result = match inner.layer_disk_op(vol, &op) {
                    Ok(data) => DiskResult::Done { data },
                    Err(e) => {
                        tracing::warn!(volume = %uuid_of(vol), ?op, error = %e,
                            "replica layer operation failed; trying again in a second");
                        // The state machine issues it again at once: a
                        // failure that lasts must not spin.
                        std::thread::sleep(std::time::Duration::from_secs(1));
                        DiskResult::Error
                    }
                };
                inner.to_replica(
                    vol,
                    Event::Disk {
                        instance,
                        id,
                        result,
                    },
                );
            });
        if let Err(e) = spawned {
            // Retried by the state machine, like a failed operation.
            tracing::warn!(volume = %uuid_of(vol), error = %e, "cannot start a layer operation");
            if let Some(inner) = self.0.upgrade() {
                inner.to_replica(
                    vol,
                    Event::Disk {
                        instance,
                        id,
                        result: DiskResult::Error,
                    },
                );
            }
        }
    }

    fn save_crash_logs(&self, vol: VolumeId, logs: &SavedLogs) -> Result<(), String> {
        let inner = self.0.upgrade().ok_or("the cluster member is stopping")?;
        let dir = inner
            .cfg
            .log_dir
            .as_ref()
            .ok_or("the node keeps no replication logs")?;
        crash_logs::save(dir, inner.store.store_id(), vol, logs).map_err(|e| e.to_string())
    }
}

impl Inner {
    /// Grows this node's copy of volume `id` from `from` to `to` bytes.
    fn grow_local_copy(&self, id: uuid::Uuid, from: u64, to: u64) -> Result<(), StoreError> {
        self.store.resize_volume(id, to)?;
        tracing::info!(volume = %id, from, to, "grew the local replica");
        Ok(())
    }

    pub(super) fn on_nodes(&self, nodes: Vec<NodeStatus>) {
        for n in &nodes {
            if n.id != self.me {
                self.peers.set_peer_addr(n.id, n.info.peer_addr);
            }
        }
        *self.nodes.write() = nodes;
    }

    pub(super) fn on_election(self: &Arc<Self>, elected: bool) {
        let mut slot = self.coordinator.lock();
        if elected {
            if slot.is_none() {
                tracing::info!(node = %self.cfg.name, "became the cluster coordinator");
                let me: Arc<dyn crate::coordinator::Host> = self.clone();
                let host = Arc::downgrade(&me);
                *slot = CoordinatorTask::start(host).ok();
            }
        } else if let Some(task) = slot.take() {
            tracing::warn!(node = %self.cfg.name, "no longer the cluster coordinator");
            task.stop();
        }
        drop(slot);
        self.refresh_coordinator();
    }

    pub(super) fn on_record(self: &Arc<Self>, rec: Membership) {
        let vol = rec.volume;
        {
            let mut records = self.records.write();
            if records.get(&vol).is_some_and(|r| r.version >= rec.version) {
                return;
            }
            records.insert(vol, rec.clone());
        }
        self.redirect(vol, rec.primary);
        self.raise_open_size(&rec);
        let mine = rec.replicas.contains_key(&self.me);
        let mut replicas = self.replicas.lock();
        let running = replicas.get(&vol).map(|h| h.replica.clone());
        if let (true, Some(replica)) = (mine, running) {
            drop(replicas);
            replica.deliver(vec![Event::Control(Msg::MetaReply {
                record: rec,
                cas_ok: None,
            })]);
        } else if mine {
            match self.start_replica(&rec) {
                Ok(h) => {
                    replicas.insert(vol, h);
                }
                Err(e) => {
                    tracing::error!(volume = %uuid_of(vol), error = %e, "could not start the local replica")
                }
            }
        } else if let Some(h) = replicas.remove(&vol) {
            drop(replicas);
            tracing::info!(volume = %uuid_of(vol), "this node no longer holds a replica");
            self.store.set_compression(uuid_of(vol), None);
            h.stop();
        }
    }

    /// The volume was deleted: stop its replica; housekeeping frees the
    /// local copy once the catalog no longer has the volume.
    pub(super) fn on_record_deleted(&self, vol: VolumeId) {
        self.records.write().remove(&vol);
        self.store.set_compression(uuid_of(vol), None);
        let handle = self.replicas.lock().remove(&vol);
        if let Some(h) = handle {
            tracing::info!(volume = %uuid_of(vol), "volume deleted: stopping its replica");
            h.stop();
        }
    }

    /// Hands the volume's compression (its record's) to this node's store,
    /// whose compactor packs the local replica's cold data (and its
    /// snapshots'): each replica is compacted on its own node, and
    /// replication, resync and scrub read and write it as any other.
    /// Called when the replica starts, and when the record's compression
    /// changes (a retype) while it runs.
    pub(super) fn apply_compression(&self, vol: VolumeId) {
        let id = uuid_of(vol);
        let text = match self.volume_record(vol) {
            Ok(Some(record)) => record.compression,
            _ => return,
        };
        let codec = text
            .as_deref()
            .and_then(|t| match basalt_store::Codec::parse(t) {
                Ok(c) => Some(c),
                Err(e) => {
                    tracing::error!(volume = %id, "compression left off: {e}");
                    None
                }
            });
        if codec.is_some() && !self.store.supports_compression() {
            tracing::warn!(volume = %id, "this node's store was formatted without packed extents; its replica stays uncompressed");
            return;
        }
        self.store.set_compression(id, codec);
    }

    /// The catalog's record of `vol`: from the watched copy, or from etcd
    /// if that has not seen the volume yet.
    fn volume_record(&self, vol: VolumeId) -> Result<Option<VolumeRecord>, ClusterError> {
        let id = uuid_of(vol);
        if let Some(r) = self.volumes.read().values().find(|r| r.id == id) {
            return Ok(Some(r.clone()));
        }
        Ok(self
            .catalog
            .list()?
            .into_iter()
            .map(|v| v.record)
            .find(|r| r.id == id))
    }

    /// Saves the logs of the replicas stopped for a clean restart, once
    /// the store is flushed.
    pub(super) fn save_logs(&self, logs: Vec<(VolumeId, SavedLogs)>) {
        let Some(dir) = &self.cfg.log_dir else {
            return;
        };
        if let Err(e) = self.store.flush() {
            tracing::warn!(error = %e, "cannot flush the store at shutdown; the replication logs are not saved");
            return;
        }
        let n = logs.len();
        match saved_logs::save(dir, self.store.store_id(), logs) {
            Ok(()) => tracing::info!(volumes = n, "saved the replication logs for the next start"),
            Err(e) => {
                tracing::warn!(error = %e, "cannot save the replication logs; replicas here will be copied in full after a failover")
            }
        }
    }

    /// Whether `rec` still is its volume's first record and places this
    /// node with this boot: the volume was created while this process
    /// runs, every replica holds its first content and session 0 is open.
    fn first_placement(&self, rec: &Membership) -> bool {
        rec.version == 1
            && rec
                .replicas
                .get(&self.me)
                .is_some_and(|r| r.boot == self.boot)
    }

    /// Creates this node's copy of `record`'s volume, `size` bytes. A clone
    /// in its first placement is made from its source snapshot here (the
    /// coordinator placed it on nodes that hold it), so that its replicas
    /// start equal and thin; one added later is made from it too if this
    /// node holds it (the primary then rebuilds it from the snapshot: only
    /// what the clone changed is copied), else starts empty and is copied
    /// in full from the primary, like any new replica. An empty copy of a
    /// clone is never started as InSync (it would read zeros where the
    /// clone reads its source): that waits until the record no longer says
    /// so (the primary marks a replica that does not answer out of sync),
    /// and start is tried again at each record change.
    fn create_local_copy(
        &self,
        rec: &Membership,
        record: &VolumeRecord,
        size: u64,
    ) -> Result<(), ClusterError> {
        let id = record.id;
        match &record.clone_of {
            Some(source) if self.first_placement(rec) => {
                self.store
                    .clone_snapshot(source.snapshot_id, id, Some(size))
                    .map_err(|e| {
                        tracing::error!(volume = %record.name, %id, source = %format!("{}@{}", source.volume, source.snapshot), error = %e,
                            "cannot make the clone's local replica from its source snapshot; it will be rebuilt elsewhere");
                        e
                    })?;
                tracing::info!(volume = %record.name, %id, size, source = %format!("{}@{}", source.volume, source.snapshot), "created the local replica from its source snapshot");
            }
            Some(_)
                if rec
                    .replicas
                    .get(&self.me)
                    .is_some_and(|r| r.state == ReplicaState::InSync) =>
            {
                return Err(ClusterError::CloneNotCopied(record.name.clone()));
            }
            Some(source)
                if self
                    .store
                    .snapshots()
                    .iter()
                    .any(|s| s.id == source.snapshot_id) =>
            {
                self.store
                    .clone_snapshot(source.snapshot_id, id, Some(size))?;
                tracing::info!(volume = %record.name, %id, size, source = %format!("{}@{}", source.volume, source.snapshot),
                    "created the local replica from its source snapshot held here; it is rebuilt from it");
            }
            _ => {
                self.store.create_volume(id, size)?;
                tracing::info!(volume = %record.name, %id, size, "created the local replica");
            }
        }
        Ok(())
    }

    fn start_replica(self: &Arc<Self>, rec: &Membership) -> Result<ReplicaHandle, ClusterError> {
        let vol = rec.volume;
        let id = uuid_of(vol);
        // Saved logs describe a local copy that already existed.
        let saved = self.restored.lock().remove(&vol);
        let recorded = rec.blocks * BLOCK_SIZE;
        let local_copy = self.store.volumes().into_iter().find(|v| v.id == id);
        let existed = local_copy.is_some();
        let (size, saved) = match local_copy {
            // Grown while this node was away: grow before anything else.
            Some(v) if v.size < recorded => {
                self.grow_local_copy(id, v.size, recorded).map_err(|e| {
                    tracing::error!(volume = %id, from = v.size, to = recorded, error = %e,
                        "cannot grow the local replica to the volume's size; this node cannot hold it");
                    e
                })?;
                (recorded, saved)
            }
            Some(v) => (v.size, saved),
            None => {
                let Some(record) = self.volume_record(vol)? else {
                    return Err(ClusterError::UnknownVolume(id));
                };
                // A crash-safe log copy left by an earlier local replica of
                // this volume must never be taken for the new one's.
                if let Some(dir) = &self.cfg.log_dir {
                    crash_logs::remove(dir, vol).map_err(|e| {
                        tracing::error!(volume = %id, error = %e,
                            "cannot delete an old crash-safe log copy; not creating the local replica");
                        ClusterError::CrashLog(e)
                    })?;
                }
                let size = record.size_bytes.max(recorded);
                self.create_local_copy(rec, &record, size)?;
                (size, None)
            }
        };
        // No clean stop's logs: after a crash, the crash-safe copy.
        let saved = match (saved, &self.cfg.log_dir) {
            (None, Some(dir)) if existed => {
                let copy = crash_logs::load(dir, self.store.store_id(), vol);
                if copy.is_some() {
                    tracing::info!(volume = %id, "restored the replica's crash-safe log copy");
                }
                copy
            }
            (saved, _) => saved,
        };
        let local = self.store.volume(id)?;
        self.apply_compression(vol);
        let t = &self.cfg.timing;
        let cfg = Config {
            block_len: BLOCK_SIZE,
            volume_blocks: size / BLOCK_SIZE,
            region_blocks: t.region_blocks,
            heartbeat_ms: t.heartbeat_ms,
            lease_ms: t.lease_ms,
            ack_timeout_ms: t.ack_timeout_ms,
            cas_timeout_ms: t.cas_timeout_ms,
            poll_ms: t.poll_ms,
            resync_retry_ms: t.resync_retry_ms,
            resync_rate: t.resync_rate,
            resync_inflight: t.resync_inflight,
            uncertain_limit: Config::default().uncertain_limit,
            // A single copy has no failover to narrow; without a log
            // directory there is nowhere to keep the copy.
            crash_log_regions: if rec.replicas.len() > 1 && self.cfg.log_dir.is_some() {
                t.crash_log_regions
            } else {
                0
            },
            crash_log_compact_ms: t.crash_log_compact_ms,
            ack_before_secondaries: false,
            snapshot_resyncing_replicas: false,
            keep_links_without_space: false,
        };
        // A record that still is the volume's first one and carries this
        // boot describes a volume created while this process runs: every
        // replica is empty and session 0 is open. Anything else: learn the
        // role from the record (Idle until the coordinator has seen us).
        let fresh = self.first_placement(rec);
        let replica = Arc::new(Replica::new(
            ReplicaSpec {
                vol,
                me: self.me,
                boot: self.boot,
                cfg,
                initial: fresh.then(|| rec.clone()),
                saved,
                layers: self.local_layers(vol),
                base: self.local_base(vol),
            },
            local,
            Arc::new(Env(Arc::downgrade(self))),
            Duration::from_millis(t.heartbeat_ms.clamp(5, 1000)),
        ));
        // Posted, not delivered: the caller holds the replica map, which
        // the replica's callbacks take. The ticker's first round feeds it.
        if !fresh {
            replica.post(Event::Control(Msg::MetaReply {
                record: rec.clone(),
                cas_ok: None,
            }));
        }
        let as_tick: Arc<dyn Tick> = replica.clone();
        replica.attach_ticker(self.ticker.register(Arc::downgrade(&as_tick)));
        Ok(ReplicaHandle { replica })
    }

    /// Records a newer record learned outside the watch (a CAS answer).
    fn on_record_arc(&self, rec: Membership) {
        let mut records = self.records.write();
        if records
            .get(&rec.volume)
            .is_none_or(|r| r.version < rec.version)
        {
            let (vol, primary) = (rec.volume, rec.primary);
            self.raise_open_size(&rec);
            records.insert(vol, rec);
            drop(records);
            self.redirect(vol, primary);
        }
    }
}
