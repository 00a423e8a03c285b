//! Placement: which nodes hold a volume's replicas, and which of them is
//! primary.
//!
//! Pure: nodes and their load in, a choice out. Rules, in priority order:
//! 1. replicas go to distinct nodes that are alive and accept replicas;
//! 2. they spread over as many distinct zones as possible (a zone holds a
//!    second replica only when every zone already holds one);
//! 3. among equals, the node with the most free capacity wins, ties broken
//!    by fewer primaries, then by node id (deterministic);
//! 4. the primary is the chosen node with the fewest primaries; among
//!    equals, not the coordinator's node (a coordinator that dies with a
//!    primary adds its own election to that failover), then the most free
//!    capacity, then node id.
//!
//! Fewer eligible nodes than replicas is not an error: the volume is placed
//! degraded on what there is and the caller records how many are missing.
//!
//! Eligibility includes room: a node takes a replica only while the sizes of
//! the volumes it holds replicas of, plus the new one, stay within its
//! provisioning limit (capacity × overcommit ratio), the rule a single node
//! applies to its own volumes ([`provisioned_by_node`], [`has_room`]).
//! Volumes are thin, so physical free space is not a condition; it only
//! orders the candidates (rule 3, as last published by each node).

use basalt_replication::{Membership, NodeId, VolumeId, BLOCK_SIZE};
use std::collections::{BTreeMap, HashMap};

/// Bytes of volume sizes each node holds replicas of: for every volume, the
/// larger of its catalog size (`sizes`, which a grow raises first) and its
/// recorded size.
pub fn provisioned_by_node(
    records: &[Membership],
    sizes: &HashMap<VolumeId, u64>,
) -> HashMap<NodeId, u64> {
    let mut out = HashMap::new();
    for r in records {
        let recorded = r.blocks.saturating_mul(BLOCK_SIZE);
        let size = sizes
            .get(&r.volume)
            .map_or(recorded, |s| (*s).max(recorded));
        for n in r.replicas.keys() {
            provision(&mut out, *n, size);
        }
    }
    out
}

/// Whether a node that has `provisioned` bytes and may provision `limit`
/// can take `size` bytes more.
pub fn has_room(provisioned: u64, limit: u64, size: u64) -> bool {
    provisioned
        .checked_add(size)
        .is_some_and(|total| total <= limit)
}

/// [`has_room`] for `node`, with what it holds from [`provisioned_by_node`].
pub fn node_has_room(
    provisioned: &HashMap<NodeId, u64>,
    node: NodeId,
    limit: u64,
    size: u64,
) -> bool {
    has_room(provisioned.get(&node).copied().unwrap_or(0), limit, size)
}

/// Counts `size` more bytes on `node` (a replica just placed there).
pub fn provision(provisioned: &mut HashMap<NodeId, u64>, node: NodeId, size: u64) {
    let e = provisioned.entry(node).or_default();
    *e = e.saturating_add(size);
}

/// A node that may receive replicas, with its current load.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub id: NodeId,
    pub zone: Option<String>,
    pub free_bytes: u64,
    /// Volumes this node is primary of.
    pub primaries: usize,
}

/// A new volume's replicas.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Distinct nodes, the primary first.
    pub nodes: Vec<NodeId>,
    pub primary: NodeId,
    /// Replicas that could not be placed (too few eligible nodes).
    pub missing: usize,
}

/// Picks up to `count` more nodes for a volume whose replicas are already on
/// `existing`, by the rules of the module docs. `candidates` are the eligible
/// nodes (alive, accepting replicas); members of `existing` among them are
/// skipped.
pub fn choose(candidates: &[Candidate], existing: &[Candidate], count: usize) -> Vec<NodeId> {
    let mut zone_use: BTreeMap<Option<&str>, usize> = BTreeMap::new();
    for e in existing {
        *zone_use.entry(e.zone.as_deref()).or_default() += 1;
    }
    let mut pool: Vec<&Candidate> = candidates
        .iter()
        .filter(|c| !existing.iter().any(|e| e.id == c.id))
        .collect();
    // Deterministic order among equals: most free, fewest primaries, id.
    pool.sort_by(|a, b| {
        b.free_bytes
            .cmp(&a.free_bytes)
            .then(a.primaries.cmp(&b.primaries))
            .then(a.id.cmp(&b.id))
    });
    // A node listed twice counts once (its best entry).
    let mut seen = std::collections::BTreeSet::new();
    pool.retain(|c| seen.insert(c.id));
    let mut chosen = Vec::new();
    while chosen.len() < count && !pool.is_empty() {
        // The least used zone among the remaining candidates; `pool` is
        // sorted, so the first candidate of that zone is the best one.
        let best = pool
            .iter()
            .enumerate()
            .min_by_key(|(i, c)| (zone_use.get(&c.zone.as_deref()).copied().unwrap_or(0), *i))
            .map(|(i, _)| i);
        let Some(i) = best else { break };
        let c = pool.remove(i);
        *zone_use.entry(c.zone.as_deref()).or_default() += 1;
        chosen.push(c.id);
    }
    chosen
}

/// Places a new volume with `replicas` copies; `None` if no node is
/// eligible. `coordinator`: the node deciding, which rule 4 spares the
/// primary role among equals.
pub fn place(
    candidates: &[Candidate],
    replicas: usize,
    coordinator: Option<NodeId>,
) -> Option<Placement> {
    let nodes = choose(candidates, &[], replicas);
    let primary = nodes
        .iter()
        .filter_map(|id| candidates.iter().find(|c| c.id == *id))
        .min_by_key(|c| {
            (
                c.primaries,
                Some(c.id) == coordinator,
                std::cmp::Reverse(c.free_bytes),
                c.id,
            )
        })?
        .id;
    let mut ordered = vec![primary];
    ordered.extend(nodes.iter().copied().filter(|n| *n != primary));
    Some(Placement {
        missing: replicas.saturating_sub(ordered.len()),
        nodes: ordered,
        primary,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cand(id: u32, zone: Option<&str>, free: u64, primaries: usize) -> Candidate {
        Candidate {
            id: NodeId(id),
            zone: zone.map(str::to_string),
            free_bytes: free,
            primaries,
        }
    }

    #[test]
    fn provisioned_counts_each_replica_at_the_larger_size() {
        let rec = |v: u128, nodes: &[u32], blocks: u64| {
            let ids: Vec<NodeId> = nodes.iter().map(|n| NodeId(*n)).collect();
            Membership::new(VolumeId(v), &ids, ids[0], 1).with_blocks(blocks)
        };
        let records = [rec(1, &[1, 2, 3], 4), rec(2, &[2], 10), rec(3, &[3], 1)];
        // Volume 1 grew in the catalog (its record not yet); volume 3's
        // catalog size is smaller than recorded (never shrinks).
        let sizes = HashMap::from([(VolumeId(1), 8 * BLOCK_SIZE), (VolumeId(3), 0)]);
        let p = provisioned_by_node(&records, &sizes);
        assert_eq!(p[&NodeId(1)], 8 * BLOCK_SIZE);
        assert_eq!(p[&NodeId(2)], 18 * BLOCK_SIZE);
        assert_eq!(p[&NodeId(3)], 9 * BLOCK_SIZE);
        assert!(!p.contains_key(&NodeId(4)));
        assert!(has_room(10, 20, 10));
        assert!(!has_room(10, 20, 11));
        assert!(!has_room(u64::MAX, u64::MAX, 1));
    }

    #[test]
    fn spreads_over_zones_before_filling_one() {
        let c = [
            cand(1, Some("a"), 100, 0),
            cand(2, Some("a"), 90, 0),
            cand(3, Some("b"), 10, 0),
            cand(4, Some("c"), 5, 0),
        ];
        let p = place(&c, 3, None).unwrap();
        let mut nodes = p.nodes.clone();
        nodes.sort();
        assert_eq!(nodes, vec![NodeId(1), NodeId(3), NodeId(4)]);
        assert_eq!(p.missing, 0);
    }

    #[test]
    fn prefers_free_capacity_then_fewer_primaries() {
        let c = [
            cand(1, None, 50, 3),
            cand(2, None, 80, 5),
            cand(3, None, 80, 1),
            cand(4, None, 10, 0),
        ];
        let p = place(&c, 2, None).unwrap();
        assert_eq!(p.nodes, vec![NodeId(3), NodeId(2)]);
        assert_eq!(p.primary, NodeId(3));
    }

    #[test]
    fn primary_avoids_the_coordinator_among_equals_only() {
        let c = [
            cand(1, None, 80, 0),
            cand(2, None, 80, 0),
            cand(3, None, 80, 0),
        ];
        assert_eq!(place(&c, 3, None).unwrap().primary, NodeId(1));
        let p = place(&c, 3, Some(NodeId(1))).unwrap();
        assert_eq!(p.primary, NodeId(2));
        assert_eq!(p.nodes[0], NodeId(2));
        // Balance first: the coordinator with the fewest primaries takes it.
        let c = [
            cand(1, None, 80, 0),
            cand(2, None, 80, 1),
            cand(3, None, 80, 1),
        ];
        assert_eq!(place(&c, 3, Some(NodeId(1))).unwrap().primary, NodeId(1));
    }

    #[test]
    fn degraded_when_too_few_nodes_and_none_when_no_node() {
        let c = [cand(1, None, 1, 0), cand(2, None, 1, 0)];
        let p = place(&c, 3, None).unwrap();
        assert_eq!(p.nodes.len(), 2);
        assert_eq!(p.missing, 1);
        assert_eq!(place(&[], 3, None), None);
    }

    #[test]
    fn choose_avoids_existing_members_and_their_zones() {
        let c = [
            cand(1, Some("a"), 100, 0),
            cand(2, Some("a"), 100, 0),
            cand(3, Some("b"), 1, 0),
        ];
        let existing = [c[0].clone()];
        assert_eq!(choose(&c, &existing, 1), vec![NodeId(3)]);
        assert_eq!(choose(&c, &existing, 5), vec![NodeId(3), NodeId(2)]);
    }

    proptest! {
        #[test]
        fn placement_is_distinct_and_zone_spread(
            nodes in prop::collection::vec((0u8..4, 0u64..1000, 0usize..8), 0..12),
            rf in 1usize..6,
        ) {
            let c: Vec<Candidate> = nodes
                .iter()
                .enumerate()
                .map(|(id, (z, f, p))| cand(id as u32, Some(["a", "b", "c", "d"][*z as usize]), *f, *p))
                .collect();
            let mut distinct: Vec<NodeId> = c.iter().map(|c| c.id).collect();
            distinct.sort();
            distinct.dedup();
            match place(&c, rf, c.first().map(|c| c.id)) {
                None => prop_assert!(c.is_empty()),
                Some(p) => {
                    let mut got = p.nodes.clone();
                    got.sort();
                    got.dedup();
                    prop_assert_eq!(got.len(), p.nodes.len(), "distinct nodes");
                    prop_assert_eq!(p.nodes.len(), rf.min(distinct.len()));
                    prop_assert_eq!(p.missing, rf - p.nodes.len());
                    prop_assert_eq!(p.nodes[0], p.primary);
                    // Zone spread: per-zone counts differ by at most one
                    // among zones that still had unused candidates.
                    let zone_of = |n: NodeId| c.iter().find(|x| x.id == n).and_then(|x| x.zone.clone());
                    let mut used: BTreeMap<Option<String>, usize> = BTreeMap::new();
                    for n in &p.nodes { *used.entry(zone_of(*n)).or_default() += 1; }
                    let max = used.values().copied().max().unwrap_or(0);
                    for cand in &c {
                        if !p.nodes.contains(&cand.id) {
                            let u = used.get(&cand.zone).copied().unwrap_or(0);
                            prop_assert!(u + 1 >= max, "zone {:?} had room but was skipped", cand.zone);
                        }
                    }
                }
            }
        }
    }
}
