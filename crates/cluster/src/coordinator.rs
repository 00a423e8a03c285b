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

use crate::meta::{CasOutcome, ClusterMeta, CoordinatorTerm, MetaError, NodeState, NodeStatus};
use crate::placement::{self, Candidate, Placement};
use crate::ClusterError;
use basalt_catalog::VolumeRecord;
use basalt_replication::Msg;
use basalt_replication::{
    Change, ChangeOutcome, Coordinator, Membership, NodeId, ReplicaInfo, ReplicaState, VolumeId,
    BLOCK_SIZE,
};
use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, HashSet};
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

/// Writes need this many in-sync replicas (primary included) by default: a
/// majority from three replicas on, so one failure never stops writes.
pub(crate) fn default_min_in_sync(replicas: usize) -> usize {
    if replicas <= 2 {
        1
    } else {
        replicas / 2 + 1
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
    let mut faulty_since: HashMap<(VolumeId, NodeId), Instant> = HashMap::new();
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
                reconfigure(host, term, coord, &catalog, &nodes, &mut faulty_since)?;
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

/// Each catalog volume's size.
fn catalog_sizes(catalog: &[VolumeRecord]) -> HashMap<VolumeId, u64> {
    catalog
        .iter()
        .map(|v| (VolumeId(v.id.as_u128()), v.size_bytes))
        .collect()
}

/// The replicas a volume is to have.
pub(crate) fn wanted_replicas(record: &VolumeRecord) -> usize {
    record.replicas.unwrap_or(1).max(1) as usize
}

/// The nodes' load as the placement of new volumes sees it: bytes of
/// volume sizes provisioned and primaries held, per node.
pub(crate) struct Load {
    provisioned: HashMap<NodeId, u64>,
    primaries: HashMap<NodeId, usize>,
}

impl Load {
    /// The load of the placed volumes (`records`), at their catalog sizes.
    pub(crate) fn of(records: &[Membership], catalog: &[VolumeRecord]) -> Load {
        let mut primaries = HashMap::new();
        for r in records {
            *primaries.entry(r.primary).or_default() += 1;
        }
        Load {
            provisioned: placement::provisioned_by_node(records, &catalog_sizes(catalog)),
            primaries,
        }
    }

    /// Where a new volume of `size` bytes with `want` replicas goes now, on
    /// alive, active nodes with room for it; `None` if none has.
    pub(crate) fn place(
        &self,
        nodes: &[NodeStatus],
        size: u64,
        want: usize,
        coordinator: Option<NodeId>,
    ) -> Option<Placement> {
        let candidates: Vec<Candidate> = nodes
            .iter()
            .filter(|n| n.alive && n.state == NodeState::Active)
            .filter(|n| {
                placement::node_has_room(&self.provisioned, n.id, n.info.provision_limit(), size)
            })
            .map(|n| Candidate {
                id: n.id,
                zone: n.info.zone.clone(),
                free_bytes: n.info.free_bytes,
                primaries: self.primaries.get(&n.id).copied().unwrap_or(0),
            })
            .collect();
        placement::place(&candidates, want, coordinator)
    }

    /// Bytes of volume sizes provisioned per node.
    pub(crate) fn into_provisioned(self) -> HashMap<NodeId, u64> {
        self.provisioned
    }

    /// Counts a volume of `size` bytes just placed as `p`.
    pub(crate) fn add(&mut self, p: &Placement, size: u64) {
        *self.primaries.entry(p.primary).or_default() += 1;
        for n in &p.nodes {
            placement::provision(&mut self.provisioned, *n, size);
        }
    }
}

/// Creates records for catalog volumes that have none, and deletes records
/// whose volume left the catalog. A node takes a replica only while it has
/// room for it (see [`placement`]); a replica that fits nowhere is missing
/// until one has.
fn place_new_volumes(
    host: &dyn Host,
    term: CoordinatorTerm,
    coord: &Mutex<Coordinator>,
    catalog: &[VolumeRecord],
    nodes: &[NodeStatus],
) -> Result<(), ClusterError> {
    let in_catalog: HashSet<VolumeId> = catalog.iter().map(|v| VolumeId(v.id.as_u128())).collect();
    let records: Vec<Membership> = coord.lock().records().cloned().collect();
    let gone: Vec<VolumeId> = records
        .iter()
        .map(|r| r.volume)
        .filter(|v| !in_catalog.contains(v))
        .collect();
    // Only the record as read now is deleted, by its mod_revision: one
    // changed since (placed again by another coordinator, failed over) is
    // left for the next round.
    for vol in gone {
        match host.meta().membership_at(vol)? {
            Some((_, rev)) => {
                if host.meta().delete_membership(term, vol, rev)? {
                    tracing::info!(volume = %uuid::Uuid::from_u128(vol.0), "volume deleted: dropped its membership record");
                    coord.lock().forget(vol);
                }
            }
            None => coord.lock().forget(vol),
        }
    }
    let placed: HashSet<VolumeId> = records.iter().map(|r| r.volume).collect();
    let mut load = Load::of(&records, catalog);
    for v in catalog {
        let vol = VolumeId(v.id.as_u128());
        if placed.contains(&vol) {
            continue;
        }
        let size = v.size_bytes;
        let want = wanted_replicas(v);
        let Some(p) = load.place(nodes, size, want, Some(host.node())) else {
            tracing::warn!(volume = %v.name, "no node can take a replica yet");
            continue;
        };
        let min = default_min_in_sync(want).min(p.nodes.len());
        let mut rec =
            Membership::new(vol, &p.nodes, p.primary, min).with_blocks(v.size_bytes / BLOCK_SIZE);
        for (id, info) in rec.replicas.iter_mut() {
            info.boot = nodes.iter().find(|n| n.id == *id).map_or(0, |n| n.boot);
        }
        if host.meta().create_membership(term, &rec)? {
            coord.lock().observe(rec.clone());
            load.add(&p, size);
            if p.missing > 0 {
                tracing::warn!(volume = %v.name, placed = p.nodes.len(), missing = p.missing,
                    "volume placed degraded: too few nodes");
            } else {
                tracing::info!(volume = %v.name, nodes = ?p.nodes, primary = p.primary.0, "volume placed");
            }
        } else if let Some(rec) = host.meta().membership(vol)? {
            // Placed already, and this view had not seen it yet.
            coord.lock().observe(rec);
        }
    }
    Ok(())
}

/// Keeps every volume at its wanted replica count on usable nodes:
/// - a replica Faulty for longer than `replace_after`, or on a node that was
///   removed, leaves the record (never the primary: failover handles that);
/// - while fewer replicas than wanted sit on active nodes, new ones are
///   added (OutOfSync: the primary resyncs them from its allocated data);
/// - a replica on a draining node leaves once enough replicas on active
///   nodes are InSync.
///
/// - the record's size (`blocks`) follows the catalog's when that is larger
///   (volumes only grow).
///
/// `min_in_sync` follows the replica count: lowered at once when replicas
/// leave, raised only once that many are InSync.
fn reconfigure(
    host: &dyn Host,
    term: CoordinatorTerm,
    coord: &Mutex<Coordinator>,
    catalog: &[VolumeRecord],
    nodes: &[NodeStatus],
    faulty_since: &mut HashMap<(VolumeId, NodeId), Instant>,
) -> Result<(), ClusterError> {
    let replace_after = host.settings().replace_after;
    // From the state machine's view, leaving alone the volumes it has a
    // change in flight for.
    let records: Vec<Membership> = {
        let c = coord.lock();
        c.records()
            .filter(|r| !c.has_pending(r.volume))
            .cloned()
            .collect()
    };
    let mut provisioned = placement::provisioned_by_node(&records, &catalog_sizes(catalog));
    let mut primaries = HashMap::<NodeId, usize>::new();
    for r in &records {
        *primaries.entry(r.primary).or_default() += 1;
    }
    let nodes_by_id: HashMap<NodeId, &NodeStatus> = nodes.iter().map(|n| (n.id, n)).collect();
    let state_of = |n: NodeId| nodes_by_id.get(&n).map(|s| s.state);
    let candidate = |id: NodeId| {
        nodes_by_id.get(&id).map(|s| Candidate {
            id,
            zone: s.info.zone.clone(),
            free_bytes: s.info.free_bytes,
            primaries: primaries.get(&id).copied().unwrap_or(0),
        })
    };
    let now = Instant::now();
    let faulty: HashSet<(VolumeId, NodeId)> = records
        .iter()
        .flat_map(|r| {
            r.replicas
                .iter()
                .filter(|(_, i)| i.state == ReplicaState::Faulty)
                .map(|(n, _)| (r.volume, *n))
        })
        .collect();
    faulty_since.retain(|key, _| faulty.contains(key));
    let mut changes = Vec::new();
    let by_id: HashMap<VolumeId, &VolumeRecord> = catalog
        .iter()
        .map(|v| (VolumeId(v.id.as_u128()), v))
        .collect();
    for rec in records {
        let Some(v) = by_id.get(&rec.volume).copied() else {
            continue;
        };
        let wanted = wanted_replicas(v);
        let mut new = rec.clone();
        // The catalog's size is the volume's: a grow whose record step was
        // lost (or a record from before sizes were recorded) catches up.
        let blocks = v.size_bytes / BLOCK_SIZE;
        if blocks > new.blocks {
            tracing::info!(volume = %v.name, from = new.blocks, to = blocks, "recording the volume's size for its replicas");
            new.blocks = blocks;
        }
        for (n, info) in &rec.replicas {
            if *n == rec.primary {
                continue;
            }
            let removed = matches!(state_of(*n), None | Some(NodeState::Removed));
            let faulty_long = info.state == ReplicaState::Faulty
                && now.duration_since(*faulty_since.entry((rec.volume, *n)).or_insert(now))
                    >= replace_after;
            if removed || faulty_long {
                tracing::warn!(volume = %v.name, node = n.0, removed, "replica given up: it will be rebuilt elsewhere");
                new.replicas.remove(n);
            }
        }
        let draining = |n: &NodeId| state_of(*n) == Some(NodeState::Draining);
        let active = new.replicas.keys().filter(|n| !draining(n)).count();
        if active < wanted {
            let pool: Vec<Candidate> = nodes
                .iter()
                .filter(|s| s.alive && s.state == NodeState::Active)
                .filter(|s| !new.replicas.contains_key(&s.id))
                .filter(|s| {
                    placement::node_has_room(
                        &provisioned,
                        s.id,
                        s.info.provision_limit(),
                        v.size_bytes,
                    )
                })
                .filter_map(|s| candidate(s.id))
                .collect();
            let existing: Vec<Candidate> =
                new.replicas.keys().filter_map(|n| candidate(*n)).collect();
            for id in placement::choose(&pool, &existing, wanted - active) {
                let boot = nodes.iter().find(|s| s.id == id).map_or(0, |s| s.boot);
                tracing::info!(volume = %v.name, node = id.0, "adding a replica");
                placement::provision(&mut provisioned, id, v.size_bytes);
                new.replicas.insert(
                    id,
                    ReplicaInfo {
                        state: ReplicaState::OutOfSync,
                        boot,
                    },
                );
            }
        }
        let settled = new
            .replicas
            .iter()
            .filter(|(n, i)| !draining(n) && i.state == ReplicaState::InSync)
            .count();
        if settled >= wanted {
            let leaving: Vec<NodeId> = new
                .replicas
                .keys()
                .copied()
                .filter(|n| draining(n) && *n != rec.primary)
                .collect();
            for n in leaving {
                tracing::info!(volume = %v.name, node = n.0, "replica moved off a draining node");
                new.replicas.remove(&n);
            }
        }
        let target = default_min_in_sync(wanted).min(new.replicas.len()).max(1);
        if target < new.min_in_sync || new.in_sync_count() >= target {
            new.min_in_sync = target;
        }
        new.min_in_sync = new.min_in_sync.clamp(1, new.replicas.len().max(1));
        if new != rec {
            changes.push(Change {
                expected: rec.version,
                record: new,
            });
        }
    }
    write(host, term, coord, changes)
}
