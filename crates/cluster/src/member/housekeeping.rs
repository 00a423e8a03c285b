//! The member's periodic work: the coordinator's address, the node's
//! published capacity, local replicas of deleted volumes, orphan snapshot
//! layers (`layers.rs`), the nodes' share
//! of the resync rate, and the heartbeat sender that sends this node's
//! heartbeats to the coordinator as one batch.

use super::{node_info, vol_of, Env, Inner};
use crate::crash_logs;
use crate::replica::{Event, Replica};
use basalt_replication::Msg;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// How long a replica's heartbeat waits for the node's others, at most.
const HEARTBEAT_BATCH: Duration = Duration::from_millis(10);

/// Sends the replicas' heartbeats to the coordinator together: one batch
/// (one system call, one wake-up of the coordinator's reader, answered with
/// one batch) per node every few milliseconds, however many replicas the
/// node holds. A heartbeat waits [`HEARTBEAT_BATCH`] at most; its lease
/// counts from when the replica stamped it (`sent_at`), so the wait only
/// eats into the lease's margin, and never extends it.
pub(super) fn send_heartbeats(weak: Weak<Inner>) {
    loop {
        std::thread::sleep(HEARTBEAT_BATCH);
        let Some(inner) = weak.upgrade() else { return };
        if inner.stopping.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let batch = std::mem::take(&mut *inner.heartbeats.lock());
        if batch.is_empty() {
            continue;
        }
        let responder = inner.coordinator.lock().as_ref().map(|c| c.responder());
        if let Some(responder) = responder {
            // This node became the coordinator since they were queued.
            for (vol, ack) in responder.answer(&*inner, inner.me, &batch) {
                inner.to_replica(vol, Event::Control(ack));
            }
            continue;
        }
        let coordinator = *inner.coordinator_id.read();
        if let Some(c) = coordinator.filter(|c| *c != inner.me) {
            let msgs = batch
                .into_iter()
                .map(|(vol, boot, sent_at)| (vol, Msg::Heartbeat { boot, sent_at }))
                .collect();
            inner.peers.send_many(c, msgs);
        }
    }
}

/// Periodic work: the coordinator's address, free capacity in the node
/// record, local replicas of deleted volumes, orphan snapshot layers.
pub(super) fn housekeeping(weak: Weak<Inner>) {
    let mut last_info = Instant::now();
    let mut last_layers = Instant::now();
    loop {
        for _ in 0..5 {
            std::thread::sleep(Duration::from_millis(100));
            match weak.upgrade() {
                Some(inner) if !inner.stopping.load(std::sync::atomic::Ordering::SeqCst) => {}
                _ => return,
            }
        }
        let Some(inner) = weak.upgrade() else { return };
        inner.refresh_coordinator();
        inner.remove_orphans();
        inner.share_resync_rate();
        if last_info.elapsed() >= Duration::from_secs(10) {
            last_info = Instant::now();
            inner.publish_usage();
        }
        if last_layers.elapsed() >= Duration::from_secs(60) {
            last_layers = Instant::now();
            inner.drop_orphan_layers();
        }
    }
}

impl Inner {
    pub(super) fn refresh_coordinator(&self) {
        let id = match self.meta.coordinator() {
            Ok(Some(name)) => self
                .nodes
                .read()
                .iter()
                .find(|n| n.info.name == name)
                .map(|n| n.id),
            Ok(None) => None,
            Err(e) => {
                tracing::debug!(error = %e, "could not look up the coordinator");
                return;
            }
        };
        *self.coordinator_id.write() = id;
    }

    /// `--resync-rate` is the node's: the volumes it is copying regions of
    /// (as primary) share it equally, so rebuilding many volumes from one
    /// node at once takes no more of its disk and network than one. Runs
    /// twice a second; a volume that starts copying meanwhile uses the
    /// share it was last given.
    fn share_resync_rate(&self) {
        let rate = self.cfg.timing.resync_rate;
        if rate == 0 {
            return;
        }
        let replicas: Vec<Arc<Replica<Env>>> = self
            .replicas
            .lock()
            .values()
            .map(|h| h.replica.clone())
            .collect();
        let copying = replicas.iter().filter(|r| r.copying()).count();
        let share = rate / copying.max(1) as u64;
        let mut last = self.resync_share.lock();
        if *last != share {
            tracing::info!(
                copying,
                share_bytes_per_s = share,
                "resync rate shared by the volumes this node copies"
            );
            *last = share;
        }
        for r in &replicas {
            r.set_resync_rate(share);
        }
    }

    pub(super) fn publish_usage(&self) {
        let info = node_info(&self.cfg, &self.store, *self.client_addrs.lock());
        if let Some(reg) = self.registration.lock().as_ref() {
            if let Err(e) = self.meta.update_node_info(reg, info) {
                tracing::debug!(error = %e, "could not publish the node's free capacity");
            }
        }
    }

    /// Deletes local store volumes that no record places here any more and
    /// whose volume is gone from the catalog.
    fn remove_orphans(&self) {
        let local: Vec<uuid::Uuid> = self.store.volumes().into_iter().map(|v| v.id).collect();
        if local.is_empty() {
            return;
        }
        let records = self.records.read();
        let candidates: Vec<uuid::Uuid> = local
            .into_iter()
            .filter(|id| {
                records
                    .get(&vol_of(*id))
                    .is_none_or(|r| !r.replicas.contains_key(&self.me))
            })
            .collect();
        drop(records);
        if candidates.is_empty() {
            return;
        }
        let Ok(catalog) = self.catalog.list() else {
            return;
        };
        let records = self.records.read().clone();
        for id in candidates {
            // Keep a copy whose volume exists but has no record yet: it may
            // be about to be placed here.
            let moved_away = records.contains_key(&vol_of(id));
            if !moved_away && catalog.iter().any(|v| v.record.id == id) {
                continue;
            }
            if self.replicas.lock().contains_key(&vol_of(id)) {
                continue;
            }
            match self.delete_local_copy(id) {
                Ok(()) => {
                    if moved_away {
                        tracing::info!(volume = %id, "deleted the local copy of a replica that left this node");
                    } else {
                        tracing::info!(volume = %id, "deleted the local replica of a deleted volume");
                    }
                    if let Some(dir) = &self.cfg.log_dir {
                        if let Err(e) = crash_logs::remove(dir, vol_of(id)) {
                            tracing::warn!(volume = %id, error = %e,
                                "cannot delete the deleted replica's crash-safe log copy");
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(volume = %id, error = %e, "could not delete a local replica")
                }
            }
        }
    }
}
