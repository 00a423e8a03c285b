//! The coordinator task: runs on the node that won the etcd election, and
//! only while it holds it.
//!
//! Job: answer heartbeats (the primaries' leases), apply
//! [`basalt_replication::Coordinator`]'s decisions (faulty secondaries,
//! failover with a new epoch) to the membership records in etcd, place new
//! volumes, and drop the records of deleted volumes.
//!
//! Invariants:
//! - every record change is a compare-and-swap on the version this task
//!   read, so a second coordinator (during an election change) can never
//!   overwrite a newer decision;
//! - a task that starts considers every registered node heard when the
//!   previous coordinator may last have extended a lease (one third of the
//!   role's TTL before this task's election: see
//!   `ClusterMeta::role_handover_credit_ms`), so it replaces no primary
//!   before `lease + grace` has passed since then;
//! - a record is created only for a volume that is in the catalog, with the
//!   boot ids the nodes registered with, so only the current incarnation of
//!   each node takes part.

use crate::member::Inner;
use crate::meta::{CasOutcome, ClusterMeta, NodeState, NodeStatus};
use crate::placement::{self, Candidate, Placement};
use crate::ClusterError;
use basalt_catalog::{Versioned, VolumeRecord};
use basalt_replication::{
    Coordinator, Membership, NodeId, ReplicaInfo, ReplicaState, VolumeId, BLOCK_SIZE,
};
use std::collections::{HashMap, HashSet};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::Weak;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

enum CoordEvent {
    Heartbeat {
        from: NodeId,
        vol: VolumeId,
        boot: u64,
        sent_at: u64,
    },
    Stop,
}

pub(crate) struct CoordinatorTask {
    tx: Sender<CoordEvent>,
    thread: Option<JoinHandle<()>>,
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
    pub(crate) fn start(inner: Weak<Inner>) -> Result<CoordinatorTask, ClusterError> {
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("coordinator".into())
            .spawn(move || run(inner, rx))
            .map_err(|e| ClusterError::Thread(e.to_string()))?;
        Ok(CoordinatorTask {
            tx,
            thread: Some(thread),
        })
    }

    pub(crate) fn heartbeat(&self, from: NodeId, vol: VolumeId, boot: u64, sent_at: u64) {
        let _ = self.tx.send(CoordEvent::Heartbeat {
            from,
            vol,
            boot,
            sent_at,
        });
    }

    pub(crate) fn stop(mut self) {
        let _ = self.tx.send(CoordEvent::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(weak: Weak<Inner>, rx: mpsc::Receiver<CoordEvent>) {
    let Some(inner) = weak.upgrade() else { return };
    let t = inner.timing().clone();
    // Every registered node counts as heard when the previous coordinator
    // may last have extended its lease (see the module docs).
    let known: Vec<NodeId> = match inner.meta.nodes() {
        Ok(nodes) => nodes.iter().map(|n| n.id).collect(),
        Err(_) => inner.nodes.read().iter().map(|n| n.id).collect(),
    };
    let heard = inner
        .now_ms()
        .saturating_sub(ClusterMeta::role_handover_credit_ms());
    let mut coord = Coordinator::new(t.lease_ms, t.grace_ms, &known, heard);
    drop(inner);
    let tick = Duration::from_millis((t.heartbeat_ms / 2).clamp(10, 500));
    let mut next_tick = Instant::now();
    let mut next_placement = Instant::now();
    let mut faulty_since: HashMap<(VolumeId, NodeId), Instant> = HashMap::new();
    loop {
        let wait = next_tick.saturating_duration_since(Instant::now());
        let ev = rx.recv_timeout(wait);
        let Some(inner) = weak.upgrade() else { return };
        match ev {
            Ok(CoordEvent::Stop) | Err(RecvTimeoutError::Disconnected) => return,
            Ok(CoordEvent::Heartbeat {
                from,
                vol,
                boot,
                sent_at,
            }) => {
                let rec = inner.records.read().get(&vol).cloned();
                if let Some(rec) = rec {
                    // The node is alive either way; but an unanswered
                    // heartbeat lets the primary's lease lapse: the safe side
                    // when the role may have passed to another node.
                    let (_, reply) = coord.on_heartbeat(inner.now_ms(), from, boot, sent_at, &rec);
                    if inner.meta.coordinator_role_current() {
                        inner.send_heartbeat_ack(from, vol, reply);
                    }
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
        }
        if Instant::now() >= next_tick {
            next_tick = Instant::now() + tick;
            let now = inner.now_ms();
            let records: Vec<Membership> = inner.records.read().values().cloned().collect();
            // Nodes without replicas send no heartbeats: their registry
            // lease vouches for them, so a volume placed on a long-idle node
            // is not failed over before its replica could speak.
            for n in inner.nodes.read().iter() {
                if n.alive && !records.iter().any(|r| r.replicas.contains_key(&n.id)) {
                    coord.vouch(n.id, now);
                } else {
                    coord.know(n.id, now);
                }
            }
            for rec in records {
                if let Some(new) = coord.tick(inner.now_ms(), &rec) {
                    apply(&inner, &rec, new);
                }
            }
        }
        if Instant::now() >= next_placement {
            next_placement = Instant::now() + Duration::from_secs(1);
            // One read of the catalog and the node list serves the round.
            let state = inner
                .catalog
                .list()
                .map_err(ClusterError::from)
                .and_then(|c| Ok((c, inner.meta.nodes()?)));
            match state {
                Ok(_) if !still_coordinator(&inner) => {}
                Ok((catalog, nodes)) => {
                    if let Err(e) = place_new_volumes(&inner, &catalog, &nodes) {
                        tracing::warn!(error = %e, "placement round failed; retrying");
                    }
                    if let Err(e) = reconfigure(&inner, &catalog, &nodes, &mut faulty_since) {
                        tracing::warn!(error = %e, "replica reconfiguration round failed; retrying");
                    }
                }
                Err(e) => tracing::warn!(error = %e, "could not read the cluster state; retrying"),
            }
        }
    }
}

/// Whether the election key still names this node: checked before every
/// change, so that a coordinator that lost its role without noticing yet
/// (a frozen process waking up) changes nothing.
fn still_coordinator(inner: &Inner) -> bool {
    let mine = inner
        .nodes
        .read()
        .iter()
        .find(|n| n.id == inner.me)
        .map(|n| n.info.name.clone());
    matches!((inner.meta.coordinator(), mine), (Ok(Some(c)), Some(m)) if c == m)
}

fn apply(inner: &Inner, old: &Membership, new: Membership) {
    if !still_coordinator(inner) {
        return;
    }
    match inner.meta.cas_membership(old.version, new.clone()) {
        Ok(CasOutcome::Applied(rec)) => {
            if rec.epoch != old.epoch {
                tracing::warn!(volume = %uuid::Uuid::from_u128(rec.volume.0), epoch = rec.epoch.0,
                    primary = rec.primary.0, "failover: new primary");
            } else {
                tracing::info!(volume = %uuid::Uuid::from_u128(rec.volume.0), version = rec.version,
                    before = ?old.replicas, after = ?rec.replicas, min_in_sync = rec.min_in_sync,
                    "replica states changed");
            }
        }
        Ok(CasOutcome::Conflict(_)) | Ok(CasOutcome::Missing) => {}
        Ok(CasOutcome::Invalid(reason)) => {
            tracing::error!(%reason, "coordinator produced an invalid membership change")
        }
        Err(e) => tracing::warn!(error = %e, "could not update a membership record"),
    }
}

/// Each catalog volume's size.
fn catalog_sizes(catalog: &[Versioned<VolumeRecord>]) -> HashMap<VolumeId, u64> {
    catalog
        .iter()
        .map(|v| (VolumeId(v.record.id.as_u128()), v.record.size_bytes))
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
    pub(crate) fn of(records: &[Membership], catalog: &[Versioned<VolumeRecord>]) -> Load {
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
    inner: &Inner,
    catalog: &[Versioned<VolumeRecord>],
    nodes: &[NodeStatus],
) -> Result<(), ClusterError> {
    let records = inner.meta.memberships()?;
    let placed: HashSet<VolumeId> = records.iter().map(|r| r.volume).collect();
    let in_catalog: HashSet<VolumeId> = catalog
        .iter()
        .map(|v| VolumeId(v.record.id.as_u128()))
        .collect();
    for rec in records.iter().filter(|r| !in_catalog.contains(&r.volume)) {
        tracing::info!(volume = %uuid::Uuid::from_u128(rec.volume.0), "volume deleted: dropping its membership record");
        inner.meta.delete_membership(rec.volume)?;
    }
    let mut load = Load::of(&records, catalog);
    for v in catalog {
        let vol = VolumeId(v.record.id.as_u128());
        if placed.contains(&vol) {
            continue;
        }
        let size = v.record.size_bytes;
        let want = wanted_replicas(&v.record);
        let Some(p) = load.place(nodes, size, want, Some(inner.me)) else {
            tracing::warn!(volume = %v.record.name, "no node can take a replica yet");
            continue;
        };
        let min = default_min_in_sync(want).min(p.nodes.len());
        let mut rec = Membership::new(vol, &p.nodes, p.primary, min)
            .with_blocks(v.record.size_bytes / BLOCK_SIZE);
        for (id, info) in rec.replicas.iter_mut() {
            info.boot = nodes.iter().find(|n| n.id == *id).map_or(0, |n| n.boot);
        }
        if inner.meta.create_membership(&rec)? {
            load.add(&p, size);
            if p.missing > 0 {
                tracing::warn!(volume = %v.record.name, placed = p.nodes.len(), missing = p.missing,
                    "volume placed degraded: too few nodes");
            } else {
                tracing::info!(volume = %v.record.name, nodes = ?p.nodes, primary = p.primary.0, "volume placed");
            }
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
    inner: &Inner,
    catalog: &[Versioned<VolumeRecord>],
    nodes: &[NodeStatus],
    faulty_since: &mut HashMap<(VolumeId, NodeId), Instant>,
) -> Result<(), ClusterError> {
    let replace_after = inner.timing().replace_after;
    let records: Vec<Membership> = inner.records.read().values().cloned().collect();
    let mut provisioned = placement::provisioned_by_node(&records, &catalog_sizes(catalog));
    let mut primaries = HashMap::<NodeId, usize>::new();
    for r in &records {
        *primaries.entry(r.primary).or_default() += 1;
    }
    let state_of = |n: NodeId| nodes.iter().find(|s| s.id == n).map(|s| s.state);
    let candidate = |id: NodeId| {
        nodes.iter().find(|s| s.id == id).map(|s| Candidate {
            id,
            zone: s.info.zone.clone(),
            free_bytes: s.info.free_bytes,
            primaries: primaries.get(&id).copied().unwrap_or(0),
        })
    };
    let now = Instant::now();
    faulty_since.retain(|(v, n), _| {
        records
            .iter()
            .any(|r| r.volume == *v && r.state(*n) == Some(ReplicaState::Faulty))
    });
    for rec in records {
        let Some(v) = catalog
            .iter()
            .find(|v| v.record.id.as_u128() == rec.volume.0)
        else {
            continue;
        };
        let wanted = wanted_replicas(&v.record);
        let mut new = rec.clone();
        // The catalog's size is the volume's: a grow whose record step was
        // lost (or a record from before sizes were recorded) catches up.
        let blocks = v.record.size_bytes / BLOCK_SIZE;
        if blocks > new.blocks {
            tracing::info!(volume = %v.record.name, from = new.blocks, to = blocks, "recording the volume's size for its replicas");
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
                tracing::warn!(volume = %v.record.name, node = n.0, removed, "replica given up: it will be rebuilt elsewhere");
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
                        v.record.size_bytes,
                    )
                })
                .filter_map(|s| candidate(s.id))
                .collect();
            let existing: Vec<Candidate> =
                new.replicas.keys().filter_map(|n| candidate(*n)).collect();
            for id in placement::choose(&pool, &existing, wanted - active) {
                let boot = nodes.iter().find(|s| s.id == id).map_or(0, |s| s.boot);
                tracing::info!(volume = %v.record.name, node = id.0, "adding a replica");
                placement::provision(&mut provisioned, id, v.record.size_bytes);
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
                tracing::info!(volume = %v.record.name, node = n.0, "replica moved off a draining node");
                new.replicas.remove(&n);
            }
        }
        let target = default_min_in_sync(wanted).min(new.replicas.len()).max(1);
        if target < new.min_in_sync || new.in_sync_count() >= target {
            new.min_in_sync = target;
        }
        new.min_in_sync = new.min_in_sync.clamp(1, new.replicas.len().max(1));
        if new != rec {
            apply(inner, &rec, new);
        }
    }
    Ok(())
}
