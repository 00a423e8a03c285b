//! The coordinator's placement round, pure: what the catalog, the
//! membership records and the node registry call for, as records to create,
//! records to drop and record changes to ask for.
//!
//! The coordinator task ([`crate::coordinator`]) runs these on its watched
//! copies and writes their outcome to etcd, fenced; the control-plane
//! simulator (`tests/control_sim/`) runs the same functions on simulated
//! copies that lag, against a simulated etcd.
//!
//! Invariants:
//! - a new record is proposed only for a catalog volume no record places,
//!   on distinct alive, active nodes with room for it (see [`placement`]),
//!   with the boot ids the nodes registered with; a clone only on nodes
//!   whose replica of its source is InSync (they hold its snapshot);
//! - an orphan is a record whose volume the catalog copy lacks; the caller
//!   may drop it only once its catalog copy is known to hold every change up
//!   to the record's revision (a catalog entry is written before any record
//!   of its volume, so a copy that is caught up and lacks the volume proves
//!   the volume was deleted, while a lagging copy proves nothing);
//! - a reconfiguration never removes the primary (failover is the state
//!   machine's), adds replicas as OutOfSync, lowers `min_in_sync` at once
//!   when replicas leave and raises it only once that many are InSync.

use crate::meta::{NodeState, NodeStatus};
use crate::placement::{self, Candidate, Placement};
use basalt_catalog::VolumeRecord;
use basalt_replication::{
    Change, Membership, NodeId, ReplicaInfo, ReplicaState, VolumeId, BLOCK_SIZE,
};
use std::collections::{HashMap, HashSet};

/// Writes need this many in-sync replicas (primary included) by default: a
/// majority from three replicas on, so one failure never stops writes.
pub fn default_min_in_sync(replicas: usize) -> usize {
    if replicas <= 2 {
        1
    } else {
        replicas / 2 + 1
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
pub fn wanted_replicas(record: &VolumeRecord) -> usize {
    record.replicas.unwrap_or(1).max(1) as usize
}

/// The nodes' load as the placement of new volumes sees it: bytes of
/// volume sizes provisioned and primaries held, per node.
pub struct Load {
    provisioned: HashMap<NodeId, u64>,
    primaries: HashMap<NodeId, usize>,
}

impl Load {
    /// The load of the placed volumes (`records`), at their catalog sizes.
    pub fn of(records: &[Membership], catalog: &[VolumeRecord]) -> Load {
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
    pub fn place(
        &self,
        nodes: &[NodeStatus],
        size: u64,
        want: usize,
        coordinator: Option<NodeId>,
    ) -> Option<Placement> {
        self.place_on(nodes, size, want, coordinator, None)
    }

    /// As [`Load::place`], on the nodes of `only` alone when given.
    fn place_on(
        &self,
        nodes: &[NodeStatus],
        size: u64,
        want: usize,
        coordinator: Option<NodeId>,
        only: Option<&HashSet<NodeId>>,
    ) -> Option<Placement> {
        let candidates: Vec<Candidate> = nodes
            .iter()
            .filter(|n| n.alive && n.state == NodeState::Active)
            .filter(|n| only.is_none_or(|o| o.contains(&n.id)))
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
    pub fn into_provisioned(self) -> HashMap<NodeId, u64> {
        self.provisioned
    }

    /// Counts a volume of `size` bytes just placed as `p`.
    pub fn add(&mut self, p: &Placement, size: u64) {
        *self.primaries.entry(p.primary).or_default() += 1;
        for n in &p.nodes {
            placement::provision(&mut self.provisioned, *n, size);
        }
    }
}

/// A record to create: a catalog volume placed now.
#[derive(Clone, Debug)]
pub struct NewRecord {
    pub record: Membership,
    /// The volume's name (for the log).
    pub name: String,
    /// Replicas it should have and no node could take yet.
    pub missing: usize,
}

/// What [`reconfigure`] keeps from one round to the next.
#[derive(Debug, Default)]
pub struct Timers {
    /// When each replica was first seen Faulty.
    pub faulty_since: HashMap<(VolumeId, NodeId), u64>,
    /// When each clone missing replicas started waiting for its source.
    pub clone_waits: HashMap<VolumeId, u64>,
}

/// How long a clone missing replicas waits for its source to have all of
/// its own in sync before it takes any node: a replica added on a node
/// holding the source snapshot is made from it and copies only what the
/// clone changed, one added elsewhere is a full copy.
pub const CLONE_WAIT_MS: u64 = 10 * 60 * 1000;

/// Whether clone `v`'s source may soon hold its snapshot on more nodes:
/// its record is being changed (left out of `records`), or has replicas
/// not in sync or fewer than it wants (a node receiving one of them will
/// hold the snapshot once it is in sync).
fn source_settling(v: &VolumeRecord, catalog: &[VolumeRecord], records: &[Membership]) -> bool {
    let Some(source) = v.clone_of.as_ref() else {
        return false;
    };
    let Some(source_record) = catalog.iter().find(|c| c.name == source.volume) else {
        return false;
    };
    let source_id = VolumeId(source_record.id.as_u128());
    records
        .iter()
        .find(|r| r.volume == source_id)
        .is_none_or(|rec| {
            rec.replicas.len() < wanted_replicas(source_record)
                || rec
                    .replicas
                    .values()
                    .any(|i| i.state != ReplicaState::InSync)
        })
}

/// The nodes that hold the snapshot clone `v` is made from: its source
/// volume's InSync replicas (an InSync replica holds every layer of its
/// volume). `None` for a volume that is not a clone.
fn clone_holders(
    v: &VolumeRecord,
    catalog: &[VolumeRecord],
    records: &[Membership],
) -> Option<HashSet<NodeId>> {
    let source = v.clone_of.as_ref()?;
    let source_id = catalog
        .iter()
        .find(|c| c.name == source.volume)
        .map(|c| VolumeId(c.id.as_u128()));
    let holders = records
        .iter()
        .find(|r| Some(r.volume) == source_id)
        .map(|r| {
            r.replicas
                .iter()
                .filter(|(_, i)| i.state == ReplicaState::InSync)
                .map(|(n, _)| *n)
                .collect()
        })
        .unwrap_or_default();
    Some(holders)
}

/// Records for the catalog volumes that no record in `records` places,
/// placed on `nodes` one after the other (each counts in the load the next
/// one sees); volumes that fit nowhere yet are left out. Returns the load
/// with them added.
///
/// A clone is placed only on nodes that hold its source snapshot (see
/// [`clone_holders`]): each makes its replica from the snapshot there,
/// so that every replica of the new record starts equal, as a new volume's
/// do. Replicas past the holders are added later as OutOfSync (copied in
/// full) by [`reconfigure`].
pub fn new_records(
    catalog: &[VolumeRecord],
    records: &[Membership],
    nodes: &[NodeStatus],
    coordinator: Option<NodeId>,
) -> (Vec<NewRecord>, Load) {
    let placed: HashSet<VolumeId> = records.iter().map(|r| r.volume).collect();
    let mut load = Load::of(records, catalog);
    let mut out = Vec::new();
    for v in catalog {
        let vol = VolumeId(v.id.as_u128());
        if placed.contains(&vol) {
            continue;
        }
        let size = v.size_bytes;
        let want = wanted_replicas(v);
        let holders = clone_holders(v, catalog, records);
        let Some(p) = load.place_on(nodes, size, want, coordinator, holders.as_ref()) else {
            if holders.is_some() {
                tracing::warn!(volume = %v.name, "no node holding the clone's source snapshot can take a replica yet");
            } else {
                tracing::warn!(volume = %v.name, "no node can take a replica yet");
            }
            continue;
        };
        let min = default_min_in_sync(want).min(p.nodes.len());
        let mut record =
            Membership::new(vol, &p.nodes, p.primary, min).with_blocks(size / BLOCK_SIZE);
        for (id, info) in record.replicas.iter_mut() {
            info.boot = nodes.iter().find(|n| n.id == *id).map_or(0, |n| n.boot);
        }
        load.add(&p, size);
        out.push(NewRecord {
            record,
            name: v.name.clone(),
            missing: p.missing,
        });
    }
    (out, load)
}

/// What each node has provisioned as the capacity checks of creates and
/// grows see it: the placed volumes and those about to be placed
/// ([`new_records`]), but not the records of deleted volumes that the
/// coordinator has not dropped yet. `catalog` must be caught up with etcd
/// (the checks pass a revision barrier first): a record whose volume it
/// lacks is then an orphan (see the module docs), whose replicas are being
/// freed. Counting them refused a create right after a delete with "no
/// room" (HTTP 507) for as long as the orphan lived; placement still
/// counts them, so a new volume only waits the moment it takes to drop
/// them, and no node is overfilled.
pub fn provisioned_for_checks(
    catalog: &[VolumeRecord],
    records: &[Membership],
    nodes: &[NodeStatus],
    coordinator: Option<NodeId>,
) -> HashMap<NodeId, u64> {
    let orphans: HashSet<VolumeId> = orphaned(catalog, records).into_iter().collect();
    let live: Vec<Membership> = records
        .iter()
        .filter(|r| !orphans.contains(&r.volume))
        .cloned()
        .collect();
    let (_, load) = new_records(catalog, &live, nodes, coordinator);
    load.into_provisioned()
}

/// The volumes of `records` that `catalog` lacks (see the module docs for
/// when one may be dropped).
pub fn orphaned(catalog: &[VolumeRecord], records: &[Membership]) -> Vec<VolumeId> {
    let in_catalog: HashSet<VolumeId> = catalog.iter().map(|v| VolumeId(v.id.as_u128())).collect();
    records
        .iter()
        .map(|r| r.volume)
        .filter(|v| !in_catalog.contains(v))
        .collect()
}

/// The record changes that keep every volume at its wanted replica count
/// on usable nodes, at `now_ms`:
/// - a replica Faulty for `replace_after_ms` or longer (since `timers`
///   first saw it so), or on a node that was
///   removed, leaves the record (never the primary: failover handles that);
///   its node is no candidate in the same change (a later one may place a
///   fresh replica there);
/// - while fewer replicas than wanted sit on active nodes, new ones are
///   added (OutOfSync: the primary resyncs them from its allocated data);
///   a clone's go to nodes holding its source snapshot first; with none
///   among the candidates, they wait (at most [`CLONE_WAIT_MS`], from when
///   `timers` first saw the clone short) while its source's replicas are
///   not all in sync, so that a source and its clones that lost a replica
///   on the same node are rebuilt together on one node, the clones from
///   the snapshot there;
/// - a replica on a draining node leaves once enough replicas on active
///   nodes are InSync;
/// - while more replicas than wanted sit on active nodes (the volume was
///   retyped to fewer) and enough of them are InSync, the surplus leaves,
///   replicas not InSync first, never the primary;
/// - the record's size (`blocks`) follows the catalog's when that is larger
///   (volumes only grow).
///
/// `min_in_sync` follows the replica count: lowered at once when replicas
/// leave, raised only once that many are InSync. `records` should leave out
/// volumes with a change in flight.
pub fn reconfigure(
    records: &[Membership],
    catalog: &[VolumeRecord],
    nodes: &[NodeStatus],
    now_ms: u64,
    replace_after_ms: u64,
    timers: &mut Timers,
) -> Vec<Change> {
    let Timers {
        faulty_since,
        clone_waits,
    } = timers;
    let mut provisioned = placement::provisioned_by_node(records, &catalog_sizes(catalog));
    let mut primaries = HashMap::<NodeId, usize>::new();
    for r in records {
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
    clone_waits.retain(|v, _| by_id.contains_key(v));
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
        // Nodes whose replica leaves now: not candidates in the same change
        // (their member must see the record without them, which stops the
        // old replica, before a later round may place a fresh one there;
        // re-adding at once would only turn Faulty into OutOfSync with the
        // stopped replica still in place, and back, for ever).
        let mut given_up = Vec::new();
        for (n, info) in &rec.replicas {
            if *n == rec.primary {
                continue;
            }
            let removed = matches!(state_of(*n), None | Some(NodeState::Removed));
            let faulty_long = info.state == ReplicaState::Faulty
                && now_ms.saturating_sub(*faulty_since.entry((rec.volume, *n)).or_insert(now_ms))
                    >= replace_after_ms;
            if removed || faulty_long {
                tracing::warn!(volume = %v.name, node = n.0, removed, "replica given up: it will be rebuilt elsewhere");
                new.replicas.remove(n);
                given_up.push(*n);
            }
        }
        let draining = |n: &NodeId| state_of(*n) == Some(NodeState::Draining);
        let active = new.replicas.keys().filter(|n| !draining(n)).count();
        if active >= wanted {
            clone_waits.remove(&rec.volume);
        } else {
            let pool: Vec<Candidate> = nodes
                .iter()
                .filter(|s| s.alive && s.state == NodeState::Active)
                .filter(|s| !new.replicas.contains_key(&s.id) && !given_up.contains(&s.id))
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
            // A clone's go to nodes holding its source snapshot first;
            // with none among the candidates, it waits while its source
            // may soon be on one.
            let holders = clone_holders(v, catalog, records).unwrap_or_default();
            let (holding, others): (Vec<Candidate>, Vec<Candidate>) =
                pool.into_iter().partition(|c| holders.contains(&c.id));
            let wait = holding.is_empty()
                && source_settling(v, catalog, records)
                && now_ms.saturating_sub(*clone_waits.entry(rec.volume).or_insert(now_ms))
                    < CLONE_WAIT_MS;
            if wait {
                tracing::info!(volume = %v.name, "a clone's replica waits for its source's replicas to be in sync");
            }
            let pool = match (wait, holding.is_empty()) {
                (true, _) => Vec::new(),
                (false, true) => others,
                (false, false) => holding,
            };
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
        // Fewer replicas wanted (the volume was retyped): once `wanted` are
        // in sync on active nodes, the surplus leaves, those not in sync
        // first, never the primary; `wanted` in-sync replicas remain.
        let staying: Vec<NodeId> = new
            .replicas
            .keys()
            .copied()
            .filter(|n| !draining(n))
            .collect();
        if staying.len() > wanted && settled >= wanted {
            let mut surplus: Vec<NodeId> = staying
                .iter()
                .copied()
                .filter(|n| *n != rec.primary)
                .collect();
            surplus.sort_by_key(|n| (new.replicas[n].state == ReplicaState::InSync, n.0));
            for n in surplus.into_iter().take(staying.len() - wanted) {
                tracing::info!(volume = %v.name, node = n.0, "replica removed: the volume wants fewer");
                new.replicas.remove(&n);
            }
        }
        let target = default_min_in_sync(wanted).min(new.replicas.len()).max(1);
        if target < new.min_in_sync || new.in_sync_count() >= target {
            new.min_in_sync = target;
        }
        new.min_in_sync = new.min_in_sync.clamp(1, new.replicas.len().max(1));
        if new != *rec {
            changes.push(Change {
                expected: rec.version,
                record: new,
            });
        }
    }
    changes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::NodeInfo;

    fn node(id: u32) -> NodeStatus {
        NodeStatus {
            id: NodeId(id),
            info: NodeInfo {
                name: format!("n{id}"),
                peer_addr: "127.0.0.1:1".parse().expect("an address"),
                nbd_addr: None,
                nvme_addr: None,
                iscsi_addr: None,
                api_addr: None,
                zone: None,
                capacity_bytes: 1 << 40,
                free_bytes: 1 << 40,
                provision_limit_bytes: None,
            },
            state: NodeState::Active,
            alive: true,
            boot: 1,
        }
    }

    #[test]
    fn a_volume_retyped_to_fewer_replicas_sheds_the_surplus_but_never_its_primary() {
        let id = uuid::Uuid::from_u128(7);
        let mut v = VolumeRecord::new(id, "v", 16 * BLOCK_SIZE, std::time::UNIX_EPOCH);
        v.replicas = Some(1);
        let vol = VolumeId(7);
        let nodes = [node(0), node(1), node(2)];
        let mut rec =
            Membership::new(vol, &[NodeId(0), NodeId(1), NodeId(2)], NodeId(1), 2).with_blocks(16);
        if let Some(r) = rec.replicas.get_mut(&NodeId(0)) {
            r.state = ReplicaState::OutOfSync;
        }
        let changes = reconfigure(&[rec], &[v.clone()], &nodes, 0, 500, &mut Timers::default());
        let new = &changes[0].record;
        assert_eq!(
            new.replicas.keys().copied().collect::<Vec<_>>(),
            [NodeId(1)],
            "{new:?}"
        );
        assert_eq!(new.min_in_sync, 1);
        // Down to two: the out-of-sync one goes first.
        v.replicas = Some(2);
        let rec =
            Membership::new(vol, &[NodeId(0), NodeId(1), NodeId(2)], NodeId(0), 2).with_blocks(16);
        let mut out_of_sync = rec.clone();
        if let Some(r) = out_of_sync.replicas.get_mut(&NodeId(1)) {
            r.state = ReplicaState::OutOfSync;
        }
        let changes = reconfigure(&[out_of_sync], &[v], &nodes, 0, 500, &mut Timers::default());
        let kept: Vec<_> = changes[0].record.replicas.keys().copied().collect();
        assert_eq!(kept, [NodeId(0), NodeId(2)]);
    }

    #[test]
    fn a_replica_given_up_is_not_placed_back_on_its_node_in_the_same_change() {
        // Found by the control-plane simulator: with three nodes and three
        // replicas, the only candidate for a Faulty replica's replacement is
        // its own node; re-adding it at once turned Faulty into OutOfSync
        // with the stopped replica still running there, and the coordinator
        // turned it Faulty again, for ever.
        let id = uuid::Uuid::from_u128(5);
        let mut v = VolumeRecord::new(id, "v", 16 * BLOCK_SIZE, std::time::UNIX_EPOCH);
        v.replicas = Some(3);
        let vol = VolumeId(5);
        let nodes = [node(0), node(1), node(2)];
        let mut rec =
            Membership::new(vol, &[NodeId(0), NodeId(1), NodeId(2)], NodeId(0), 2).with_blocks(16);
        if let Some(r) = rec.replicas.get_mut(&NodeId(2)) {
            r.state = ReplicaState::Faulty;
        }
        let mut since = Timers {
            faulty_since: HashMap::from([((vol, NodeId(2)), 0)]),
            ..Timers::default()
        };
        let changes = reconfigure(&[rec.clone()], &[v.clone()], &nodes, 1_000, 500, &mut since);
        let new = &changes[0].record;
        assert!(!new.replicas.contains_key(&NodeId(2)), "{new:?}");
        // A later round, from the record without it, places a fresh one.
        let mut later = new.clone();
        later.version += 1;
        let changes = reconfigure(&[later], &[v], &nodes, 2_000, 500, &mut since);
        assert_eq!(
            changes[0].record.replicas[&NodeId(2)].state,
            ReplicaState::OutOfSync
        );
    }

    #[test]
    fn a_deleted_volume_stops_counting_in_the_checks_before_its_record_goes() {
        let mut nodes = [node(0), node(1)];
        for n in &mut nodes {
            n.info.provision_limit_bytes = Some(24 * BLOCK_SIZE);
        }
        let kept = VolumeRecord::new(
            uuid::Uuid::from_u128(1),
            "kept",
            8 * BLOCK_SIZE,
            std::time::UNIX_EPOCH,
        );
        let rec = |v: u128| {
            Membership::new(VolumeId(v), &[NodeId(0), NodeId(1)], NodeId(0), 1).with_blocks(8)
        };
        // Volume 2 was deleted from the catalog; its record is not dropped
        // yet.
        let records = [rec(1), rec(2)];
        let checked = provisioned_for_checks(std::slice::from_ref(&kept), &records, &nodes, None);
        assert_eq!(checked.get(&NodeId(0)), Some(&(8 * BLOCK_SIZE)));
        assert_eq!(checked.get(&NodeId(1)), Some(&(8 * BLOCK_SIZE)));
        // Placement still counts it until the record goes.
        let placed = Load::of(&records, &[kept]).into_provisioned();
        assert_eq!(placed.get(&NodeId(0)), Some(&(16 * BLOCK_SIZE)));
    }

    /// Catalog records of a source "gold" (id 1) and its clone "vm1" (id
    /// 2, of gold@base), each wanting two replicas.
    fn gold_and_clone() -> (VolumeRecord, VolumeRecord) {
        let mut source = VolumeRecord::new(
            uuid::Uuid::from_u128(1),
            "gold",
            16 * BLOCK_SIZE,
            std::time::UNIX_EPOCH,
        );
        source.replicas = Some(2);
        let mut clone = VolumeRecord::new(
            uuid::Uuid::from_u128(2),
            "vm1",
            16 * BLOCK_SIZE,
            std::time::UNIX_EPOCH,
        );
        clone.replicas = Some(2);
        clone.clone_of = Some(basalt_catalog::CloneSource::new(
            "gold",
            "base",
            uuid::Uuid::from_u128(3),
        ));
        (source, clone)
    }

    #[test]
    fn a_clone_is_placed_only_where_its_source_is_in_sync() {
        let (source, mut clone) = gold_and_clone();
        let nodes = [node(0), node(1), node(2), node(3)];
        let mut rec = Membership::new(
            VolumeId(1),
            &[NodeId(1), NodeId(2), NodeId(3)],
            NodeId(1),
            2,
        )
        .with_blocks(16);
        if let Some(r) = rec.replicas.get_mut(&NodeId(3)) {
            r.state = ReplicaState::OutOfSync;
        }
        let catalog = [source.clone(), clone.clone()];
        let (new, _) = new_records(&catalog, &[rec.clone()], &nodes, None);
        let mut placed = new[0].record.replicas.keys().copied().collect::<Vec<_>>();
        placed.sort();
        assert_eq!(placed, [NodeId(1), NodeId(2)]);
        assert_eq!(new[0].missing, 0);
        // Three wanted, two holders: two now, the third copied later.
        clone.replicas = Some(3);
        let catalog = [source.clone(), clone.clone()];
        let (new, _) = new_records(&catalog, &[rec.clone()], &nodes, None);
        assert_eq!(new[0].record.replicas.len(), 2);
        assert_eq!(new[0].missing, 1);
        // No holder in sync (or the source not placed yet): not placed.
        let (new, _) = new_records(&catalog, &[], &nodes, None);
        assert!(new.iter().all(|r| r.name != "vm1"), "{new:?}");
    }

    /// A clone that lost a replica, with no candidate node holding its
    /// source snapshot, waits while its source's replicas are not all in
    /// sync (the source is being rebuilt on a node that will then hold the
    /// snapshot), then goes to that node; after [`CLONE_WAIT_MS`] it goes
    /// anywhere.
    #[test]
    fn a_clone_replica_waits_for_its_source_and_goes_where_the_snapshot_is() {
        let (source, clone) = gold_and_clone();
        let nodes = [node(0), node(1), node(2), node(3)];
        let catalog = [source, clone];
        // The source lost its replica on the clone's node too, and is being
        // rebuilt on node 3.
        let mut gold =
            Membership::new(VolumeId(1), &[NodeId(0), NodeId(3)], NodeId(0), 1).with_blocks(16);
        if let Some(r) = gold.replicas.get_mut(&NodeId(3)) {
            r.state = ReplicaState::OutOfSync;
        }
        let vm1 = Membership::new(VolumeId(2), &[NodeId(0)], NodeId(0), 1).with_blocks(16);
        let added = |changes: &[Change]| -> Vec<NodeId> {
            changes
                .iter()
                .filter(|c| c.record.volume == VolumeId(2))
                .flat_map(|c| c.record.replicas.keys().copied())
                .filter(|n| *n != NodeId(0))
                .collect()
        };
        let mut waits = Timers::default();
        let round = |gold: &Membership, now: u64, waits: &mut Timers| {
            let records = [gold.clone(), vm1.clone()];
            reconfigure(&records, &catalog, &nodes, now, 500, waits)
        };
        assert!(added(&round(&gold, 0, &mut waits)).is_empty(), "it waits");
        // The source's record being changed (left out): it still waits.
        let changes = reconfigure(
            std::slice::from_ref(&vm1),
            &catalog,
            &nodes,
            1,
            500,
            &mut waits,
        );
        assert!(added(&changes).is_empty(), "it waits: {changes:?}");
        // Past the bound: anywhere.
        let late = added(&round(&gold, CLONE_WAIT_MS, &mut waits));
        assert_eq!(late.len(), 1);
        // The source in sync everywhere: a node holding the snapshot.
        if let Some(r) = gold.replicas.get_mut(&NodeId(3)) {
            r.state = ReplicaState::InSync;
        }
        let mut waits = Timers::default();
        let placed = added(&round(&gold, 0, &mut waits));
        assert_eq!(placed, [NodeId(3)]);
    }
}
