//! The coordinator task: runs on the node that won the etcd election, and
//! only while it holds it.
//!
//! Job: drive [`basalt_replication::Coordinator`] with real I/O: feed it
//! heartbeats (the primaries' leases) and the records the member's watch
//! sees, write its decisions (faulty secondaries, failover with a new epoch)
//! to the membership records in etcd and feed their outcomes back; place new
//! volumes, rebuild and drain replicas, and drop the records of deleted
//! volumes. It sees the node it runs on only through [`Host`].
//!
//! Threads: the state machine sits behind a mutex. Heartbeats are answered
//! by the thread that received them ([`Responder`]: a peer reader, a local
//! replica's ticker, the heartbeat sender), holding the mutex once per
//! batch of a node's heartbeats; the task's own thread decides under the mutex and writes to etcd
//! without it, a round's changes all at once. So no heartbeat waits behind
//! an etcd round trip (the simulator's `HeartbeatsBehindWrites` shows what
//! that costs).
//!
//! Invariants:
//! - every write is fenced by this tenure's [`CoordinatorTerm`] (the
//!   election key's create revision) in the same etcd transaction, and is a
//!   compare-and-swap on the version this task decided from (a delete: on
//!   the record's `mod_revision`), so a coordinator that lost its role (a
//!   paused process, a partition) changes nothing, and none overwrites a
//!   newer decision; a fenced write ends the task;
//! - the state machine's view includes this task's own successful writes at
//!   once, so heartbeats are never answered from a record older than what
//!   it wrote;
//! - a task that starts considers every registered node heard when the
//!   previous coordinator may last have extended a lease (one third of the
//!   role's TTL before this task's election: see
//!   `ClusterMeta::role_handover_credit_ms`), so it replaces no primary
//!   before `lease + grace` has passed since then;
//! - a record is created only for a volume that is in the catalog, with the
//!   boot ids the nodes registered with, so only the current incarnation of
//!   each node takes part.

use crate::meta::{CasOutcome, ClusterMeta, CoordinatorTerm, MetaError, NodeStatus};
use crate::plan;
use crate::ClusterError;
use basalt_catalog::VolumeRecord;
use basalt_replication::Msg;
use basalt_replication::{Change, ChangeOutcome, Coordinator, Membership, NodeId, VolumeId};
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What the coordinator task needs of the node it runs on (the cluster
/// member): its metadata client, its clock, and the copies its watches keep
/// of the node registry, the membership records and the catalog.
pub(crate) trait Host: Send + Sync + 'static {
    fn meta(&self) -> &ClusterMeta;
    /// This node's id.
    fn node(&self) -> NodeId;
    /// Milliseconds on the node's lease clock (CLOCK_BOOTTIME).
    fn now_ms(&self) -> u64;
    fn settings(&self) -> Settings;
    /// The node registry as last watched.
    fn nodes(&self) -> Vec<NodeStatus>;
    /// Calls `f` with the membership records as last watched.
    fn with_records(&self, f: &mut dyn FnMut(&HashMap<VolumeId, Membership>));
    /// The catalog's volumes as last watched.
    fn volumes(&self) -> Vec<VolumeRecord>;
    /// Waits (briefly) until the watched catalog holds every change up to
    /// etcd revision `revision`; false if it did not get there.
    fn catalog_caught_up(&self, revision: i64) -> bool;
}

/// The protocol timing the coordinator works with (milliseconds).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Settings {
    pub lease_ms: u64,
    pub grace_ms: u64,
    pub heartbeat_ms: u64,
    /// A replica Faulty this long is rebuilt on another node.
    pub replace_after: Duration,
}

/// What the task's thread and the threads answering heartbeats share.
struct Shared {
    /// The state machine.
    coord: Mutex<Coordinator>,
    /// Set once the state machine holds the task's first view; until then
    /// heartbeats go unanswered (the safe side).
    ready: AtomicBool,
    stop: Mutex<bool>,
    wake: Condvar,
}

/// The running coordinator task; see the module docs.
pub(crate) struct CoordinatorTask {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// Answers heartbeats from the coordinator's view, on the caller's thread:
/// never behind an etcd write.
#[derive(Clone)]
pub(crate) struct Responder(Arc<Shared>);

/// A heartbeat as the coordinator takes it in: the volume, the sender's
/// boot and when it stamped it.
pub(crate) type Heartbeat = (VolumeId, u64, u64);

impl Responder {
    /// The answers due to node `from`'s `heartbeats` (a node's batch),
    /// taken in under one lock: none while this node's role is not
    /// confirmed current (an unanswered heartbeat lets the primary's lease
    /// lapse: the safe side when the role may have passed to another node).
    pub(crate) fn answer(
        &self,
        host: &dyn Host,
        from: NodeId,
        heartbeats: &[Heartbeat],
    ) -> Vec<(VolumeId, Msg)> {
        if !self.0.ready.load(Ordering::Acquire) || heartbeats.is_empty() {
            return Vec::new();
        }
        let now = host.now_ms();
        let mut coord = self.0.coord.lock();
        let answers: Vec<(VolumeId, Msg)> = heartbeats
            .iter()
            .filter_map(|&(vol, boot, sent_at)| {
                let (_, msg) = coord.on_heartbeat(now, from, boot, sent_at, vol)?;
                Some((vol, msg))
            })
            .collect();
        drop(coord);
        if host.meta().coordinator_role_current() {
            answers
        } else {
            Vec::new()
        }
    }
}

impl CoordinatorTask {
    pub(crate) fn start(host: Weak<dyn Host>) -> Result<CoordinatorTask, ClusterError> {
        let shared = Arc::new(Shared {
            coord: Mutex::new(Coordinator::new(0, 0, &[], 0)),
            ready: AtomicBool::new(false),
            stop: Mutex::new(false),
            wake: Condvar::new(),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("coordinator".into())
            .spawn(move || run(host, &s))
            .map_err(|e| ClusterError::Thread(e.to_string()))?;
        Ok(CoordinatorTask {
            shared,
            thread: Some(thread),
        })
    }

    pub(crate) fn responder(&self) -> Responder {
        Responder(self.shared.clone())
    }

    pub(crate) fn stop(mut self) {
        *self.shared.stop.lock() = true;
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The state machine's first view: every registered node counts as heard
/// when the previous coordinator may last have extended its lease (see the
/// module docs); the records as etcd has them after the election (the
/// member's watched copy may lag behind the previous coordinator's last
/// writes).
fn first_view(host: &dyn Host) -> Coordinator {
    let t = host.settings();
    let known: Vec<NodeId> = match host.meta().nodes() {
        Ok(nodes) => nodes.iter().map(|n| n.id).collect(),
        Err(_) => host.nodes().iter().map(|n| n.id).collect(),
    };
    let heard = host
        .now_ms()
        .saturating_sub(ClusterMeta::role_handover_credit_ms());
    let mut coord = Coordinator::new(t.lease_ms, t.grace_ms, &known, heard);
    match host.meta().memberships() {
        Ok(records) => records.into_iter().for_each(|r| coord.observe(r)),
        Err(e) => {
            tracing::warn!(error = %e, "coordinator starts from the watched records");
            host.with_records(&mut |records| {
                records.values().for_each(|r| coord.observe(r.clone()))
            });
        }
    }
    coord.expect_replicas(heard);
    coord
}

fn run(weak: Weak<dyn Host>, shared: &Shared) {
    let Some(host) = weak.upgrade() else { return };
    let Some(term) = host.meta().coordinator_term() else {
        return;
    };
    let t = host.settings();
    *shared.coord.lock() = first_view(&*host);
    shared.ready.store(true, Ordering::Release);
    let coord = &shared.coord;
    tracing::info!(term = term.0, "coordinator tenure starts");
    drop(host);
    let tick = Duration::from_millis((t.heartbeat_ms / 2).clamp(10, 500));
    let mut next_tick = Instant::now();
    let mut next_placement = Instant::now();
    let mut timers = plan::Timers::default();
    loop {
        {
            let mut stop = shared.stop.lock();
            let wait = next_tick.saturating_duration_since(Instant::now());
            if !*stop && !wait.is_zero() {
                shared.wake.wait_for(&mut stop, wait);
            }
            if *stop {
                return;
            }
        }
        let Some(host) = weak.upgrade() else { return };
        let host = &*host;
        let result = (|| -> Result<(), ClusterError> {
            if Instant::now() >= next_tick {
                next_tick = Instant::now() + tick;
                let now = host.now_ms();
                let changes = {
                    let mut c = coord.lock();
                    follow_watch(host, &mut c);
                    // Nodes without replicas send no heartbeats: their
                    // registry lease vouches for them, so a volume placed
                    // on a long-idle node is not failed over before its
                    // replica could speak.
                    for n in host.nodes().iter() {
                        if n.alive && !c.records().any(|r| r.replicas.contains_key(&n.id)) {
                            c.vouch(n.id, now);
                        } else {
                            c.know(n.id, now);
                        }
                    }
                    if host.meta().coordinator_role_current() {
                        c.tick(now)
                    } else {
                        Vec::new()
                    }
                };
                write(host, term, coord, changes)?;
            }
            if Instant::now() >= next_placement {
                next_placement = Instant::now() + Duration::from_secs(1);
                // The member's watched copies: a round costs etcd nothing
                // unless it changes something.
                let catalog = host.volumes();
                let nodes = host.nodes();
                if let Err(e) = place_new_volumes(host, term, coord, &catalog, &nodes) {
                    if matches!(e, ClusterError::Meta(MetaError::Fenced(_))) {
                        return Err(e);
                    }
                    tracing::warn!(error = %e, "placement round failed; retrying");
                }
                reconfigure(host, term, coord, &catalog, &nodes, &mut timers)?;
            }
            Ok(())
        })();
        match result {
            Ok(()) => {}
            Err(ClusterError::Meta(MetaError::Fenced(rev))) => {
                tracing::warn!(
                    term = rev,
                    "coordinator write fenced: the role has moved on; this tenure ends"
                );
                return;
            }
            Err(e) => tracing::warn!(error = %e, "coordinator round failed; retrying"),
        }
    }
}

/// Takes the records the member's watch saw since the last round into the
/// state machine's view (newer versions only), and forgets deleted ones.
fn follow_watch(host: &dyn Host, coord: &mut Coordinator) {
    host.with_records(&mut |records| {
        let gone: Vec<VolumeId> = coord
            .records()
            .map(|r| r.volume)
            .filter(|v| !records.contains_key(v))
            .collect();
        for v in gone {
            coord.forget(v);
        }
        for rec in records.values() {
            if coord
                .record(rec.volume)
                .is_none_or(|r| rec.version > r.version)
            {
                coord.observe(rec.clone());
            }
        }
    });
}

/// Writes `changes` (decided from `coord`'s view) to etcd, fenced by
/// `term`, all at once and without holding the state machine (heartbeats
/// are answered meanwhile, from the view with the changes pending), then
/// feeds each outcome back. Err only when fenced.
fn write(
    host: &dyn Host,
    term: CoordinatorTerm,
    coord: &Mutex<Coordinator>,
    changes: Vec<Change>,
) -> Result<(), ClusterError> {
    if changes.is_empty() {
        return Ok(());
    }
    let before: Vec<Option<Membership>> = {
        let c = coord.lock();
        changes
            .iter()
            .map(|ch| c.record(ch.record.volume).cloned())
            .collect()
    };
    let outcomes = host.meta().cas_memberships_fenced(
        term,
        changes
            .iter()
            .map(|ch| (ch.expected, ch.record.clone()))
            .collect(),
    );
    let mut fenced = None;
    let mut c = coord.lock();
    for ((change, before), outcome) in changes.iter().zip(before).zip(outcomes) {
        let vol = uuid::Uuid::from_u128(change.record.volume.0);
        let outcome = match outcome {
            Ok(CasOutcome::Applied(rec)) => {
                if before.as_ref().is_some_and(|b| b.epoch != rec.epoch) {
                    tracing::warn!(volume = %vol, epoch = rec.epoch.0, primary = rec.primary.0,
                        "failover: new primary");
                } else {
                    tracing::info!(volume = %vol, version = rec.version,
                        before = ?before.map(|b| b.replicas), after = ?rec.replicas,
                        min_in_sync = rec.min_in_sync, "replica states changed");
                }
                ChangeOutcome::Applied(rec)
            }
            Ok(CasOutcome::Conflict(rec)) => ChangeOutcome::Conflict(rec),
            Ok(CasOutcome::Missing) => ChangeOutcome::Missing,
            Ok(CasOutcome::Invalid(reason)) => {
                tracing::error!(volume = %vol, %reason, "coordinator produced an invalid membership change");
                ChangeOutcome::Failed
            }
            Err(MetaError::Fenced(rev)) => {
                fenced = Some(rev);
                ChangeOutcome::Failed
            }
            Err(e) => {
                tracing::warn!(volume = %vol, error = %e, "could not update a membership record");
                ChangeOutcome::Failed
            }
        };
        c.on_outcome(change, outcome);
    }
    match fenced {
        Some(rev) => Err(MetaError::Fenced(rev).into()),
        None => Ok(()),
    }
}

/// Creates records for catalog volumes that have none, and deletes records
/// whose volume left the catalog (see [`plan`] for both rules).
fn place_new_volumes(
    host: &dyn Host,
    term: CoordinatorTerm,
    coord: &Mutex<Coordinator>,
    catalog: &[VolumeRecord],
    nodes: &[NodeStatus],
) -> Result<(), ClusterError> {
    let records: Vec<Membership> = coord.lock().records().cloned().collect();
    for vol in plan::orphaned(catalog, &records) {
        drop_orphan(host, term, coord, vol)?;
    }
    let (placed, _) = plan::new_records(catalog, &records, nodes, Some(host.node()));
    for new in placed {
        let rec = new.record;
        if host.meta().create_membership(term, &rec)? {
            coord.lock().observe(rec.clone());
            if new.missing > 0 {
                tracing::warn!(volume = %new.name, placed = rec.replicas.len(), missing = new.missing,
                    "volume placed degraded: too few nodes");
            } else {
                tracing::info!(volume = %new.name, nodes = ?rec.replicas.keys().collect::<Vec<_>>(),
                    primary = rec.primary.0, "volume placed");
            }
        } else if let Some(rec) = host.meta().membership(rec.volume)? {
            // Placed already, and this view had not seen it yet.
            coord.lock().observe(rec);
        }
    }
    Ok(())
}

/// Deletes the record of `vol`, which the catalog copy lacks, if that copy
/// proves the volume deleted: only the record as read now is deleted (by
/// its `mod_revision`, so one changed since is left for the next round),
/// and only once the catalog copy holds every change up to that revision
/// and still lacks the volume. A volume's catalog entry is written before
/// its record, so a lagging copy (a watch that reconnects, a tenure that
/// starts from records read straight from etcd) would otherwise drop the
/// record of a live volume, which the next round would place again as a
/// fresh record whose replicas all count as in sync.
fn drop_orphan(
    host: &dyn Host,
    term: CoordinatorTerm,
    coord: &Mutex<Coordinator>,
    vol: VolumeId,
) -> Result<(), ClusterError> {
    let Some((_, rev)) = host.meta().membership_at(vol)? else {
        coord.lock().forget(vol);
        return Ok(());
    };
    if !host.catalog_caught_up(rev) {
        tracing::debug!(volume = %uuid::Uuid::from_u128(vol.0), revision = rev,
            "catalog copy behind a record it lacks; deciding next round");
        return Ok(());
    }
    if host.volumes().iter().any(|v| v.id.as_u128() == vol.0) {
        return Ok(());
    }
    if host.meta().delete_membership(term, vol, rev)? {
        tracing::info!(volume = %uuid::Uuid::from_u128(vol.0), "volume deleted: dropped its membership record");
        coord.lock().forget(vol);
    }
    Ok(())
}

/// Asks for the record changes [`plan::reconfigure`] calls for, from the
/// state machine's view, leaving alone the volumes it has a change in
/// flight for.
fn reconfigure(
    host: &dyn Host,
    term: CoordinatorTerm,
    coord: &Mutex<Coordinator>,
    catalog: &[VolumeRecord],
    nodes: &[NodeStatus],
    timers: &mut plan::Timers,
) -> Result<(), ClusterError> {
    let replace_after_ms = host.settings().replace_after.as_millis() as u64;
    let records: Vec<Membership> = {
        let c = coord.lock();
        c.records()
            .filter(|r| !c.has_pending(r.volume))
            .cloned()
            .collect()
    };
    let changes = plan::reconfigure(
        &records,
        catalog,
        nodes,
        host.now_ms(),
        replace_after_ms,
        timers,
    );
    write(host, term, coord, changes)
}
