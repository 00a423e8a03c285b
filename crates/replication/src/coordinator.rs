//! The elected coordinator of the cluster.
//!
//! Job: track node liveness through heartbeats (leases) and restarts (boot
//! ids), and change the membership record accordingly: mark lost secondaries
//! Faulty, returning ones OutOfSync, and promote an InSync secondary with
//! epoch + 1 when the primary is lost or restarted.
//!
//! Invariants:
//! - only a replica that is InSync in the current record (and has not
//!   restarted since) is ever promoted; failing that, a restarted primary is
//!   re-appointed; otherwise nobody is (the volume waits);
//! - a primary is declared lost only once `lease + grace` has passed since its
//!   last heartbeat arrived; a primary stops acknowledging at
//!   `heartbeat sent_at + lease`, so the old primary's last acknowledgement
//!   precedes the promotion (no clock skew assumed beyond `grace`);
//! - a heartbeat is answered with the record's current epoch and primary, so a
//!   deposed primary never extends its lease;
//! - every change goes through CAS on the record version.

use crate::msg::{Endpoint, Msg};
use crate::types::{Epoch, Membership, NodeId, ReplicaState};
use std::collections::BTreeMap;

#[derive(Clone, Copy, Debug)]
struct Liveness {
    last_heard: u64,
    boot: u64,
}

pub struct Coordinator {
    lease_ms: u64,
    grace_ms: u64,
    nodes: BTreeMap<NodeId, Liveness>,
}

impl Coordinator {
    /// `nodes` are considered heard at `now` with boot 0.
    pub fn new(lease_ms: u64, grace_ms: u64, nodes: &[NodeId], now: u64) -> Self {
        Coordinator {
            lease_ms,
            grace_ms,
            nodes: nodes
                .iter()
                .map(|n| {
                    (
                        *n,
                        Liveness {
                            last_heard: now,
                            boot: 0,
                        },
                    )
                })
                .collect(),
        }
    }

    /// Makes `node` known as heard at `now` if it is not known yet: for a
    /// node that joined the cluster after the coordinator started and has
    /// sent no heartbeat yet (it holds no replica), so that placing a
    /// replica on it does not count it as lost before it could speak.
    pub fn know(&mut self, node: NodeId, now: u64) {
        self.nodes.entry(node).or_insert(Liveness {
            last_heard: now,
            boot: 0,
        });
    }

    /// Counts `node` as heard at `now`: for a node that holds no replica
    /// (so sends no heartbeats) but is alive by other means (its registry
    /// lease). A replica placed on it then has `lease + grace` to start
    /// heartbeating before it counts as lost, however long the node idled.
    pub fn vouch(&mut self, node: NodeId, now: u64) {
        let l = self.nodes.entry(node).or_insert(Liveness {
            last_heard: now,
            boot: 0,
        });
        l.last_heard = l.last_heard.max(now);
    }

    /// A heartbeat arrived; returns the answer.
    pub fn on_heartbeat(
        &mut self,
        now: u64,
        from: NodeId,
        boot: u64,
        sent_at: u64,
        rec: &Membership,
    ) -> (Endpoint, Msg) {
        let l = self.nodes.entry(from).or_insert(Liveness {
            last_heard: now,
            boot,
        });
        l.last_heard = l.last_heard.max(now);
        l.boot = l.boot.max(boot);
        (
            Endpoint::Node(from),
            Msg::HeartbeatAck {
                sent_at,
                vol: rec.volume,
                epoch: rec.epoch,
                primary: rec.primary,
            },
        )
    }

    fn alive(&self, now: u64, n: NodeId) -> bool {
        self.nodes
            .get(&n)
            .is_some_and(|l| now <= l.last_heard + self.lease_ms + self.grace_ms)
    }

    /// Returns the record the coordinator wants (to CAS at `rec.version`),
    /// or None when `rec` is fine.
    pub fn tick(&self, now: u64, rec: &Membership) -> Option<Membership> {
        let mut m = rec.clone();
        let mut failover = false;
        let mut restarted = Vec::new();
        for (n, info) in m.replicas.iter_mut() {
            let alive = self.alive(now, *n);
            let boot = self.nodes.get(n).map(|l| l.boot);
            // Boot ids only grow, so a higher one is a restart; a coordinator
            // that has not heard a node yet knows boot 0 and changes nothing.
            if let Some(b) = boot.filter(|b| *b > info.boot) {
                info.boot = b;
                restarted.push(*n);
                if *n == rec.primary {
                    failover = true;
                } else {
                    info.state = ReplicaState::OutOfSync;
                }
            } else if !alive {
                if *n == rec.primary {
                    failover = true;
                } else {
                    info.state = ReplicaState::Faulty;
                }
            } else if info.state == ReplicaState::Faulty {
                info.state = ReplicaState::OutOfSync;
            }
        }
        if failover {
            let candidate = rec
                .replicas
                .iter()
                .find(|(n, info)| {
                    **n != rec.primary
                        && info.state == ReplicaState::InSync
                        && self.alive(now, **n)
                        && !restarted.contains(n)
                })
                .map(|(n, _)| *n)
                .or_else(|| {
                    (restarted.contains(&rec.primary) && self.alive(now, rec.primary))
                        .then_some(rec.primary)
                });
            if let Some(c) = candidate {
                m.epoch = Epoch(rec.epoch.0 + 1);
                m.primary = c;
                for (n, info) in m.replicas.iter_mut() {
                    info.state = if *n == c {
                        ReplicaState::InSync
                    } else if self.alive(now, *n) {
                        ReplicaState::OutOfSync
                    } else {
                        ReplicaState::Faulty
                    };
                }
            }
        }
        (m != *rec).then_some(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::VolumeId;

    #[test]
    fn idle_node_vouched_for_is_not_lost_when_a_volume_lands_on_it() {
        let (a, b) = (NodeId(1), NodeId(2));
        let mut c = Coordinator::new(100, 50, &[a, b], 0);
        // Long idle: neither node held a replica, so neither heartbeated.
        c.vouch(a, 10_000);
        c.vouch(b, 10_000);
        let rec = Membership::new(VolumeId(7), &[a, b], a, 1);
        assert_eq!(
            c.tick(10_010, &rec),
            None,
            "freshly placed volume left alone"
        );
        // Without heartbeats the primary is lost after lease + grace.
        assert!(c.tick(10_151, &rec).is_some());
    }

    #[test]
    fn promotes_in_sync_secondary_after_lease_and_grace() {
        let nodes = [NodeId(0), NodeId(1), NodeId(2)];
        let mut rec = Membership::new(VolumeId(1), &nodes, NodeId(0), 2);
        rec.replicas.get_mut(&NodeId(1)).unwrap().state = ReplicaState::OutOfSync;
        let mut c = Coordinator::new(100, 20, &nodes, 0);
        for t in [50, 100] {
            c.on_heartbeat(t, NodeId(1), 0, t, &rec);
            c.on_heartbeat(t, NodeId(2), 0, t, &rec);
        }
        assert_eq!(
            c.tick(120, &rec),
            None,
            "primary still within lease + grace"
        );
        let m = c.tick(121, &rec).unwrap();
        assert_eq!(m.epoch, Epoch(2));
        assert_eq!(m.primary, NodeId(2), "only InSync secondaries are promoted");
        assert_eq!(m.state(NodeId(1)), Some(ReplicaState::OutOfSync));
        assert_eq!(m.state(NodeId(0)), Some(ReplicaState::Faulty));
    }

    #[test]
    fn restarted_secondary_becomes_out_of_sync() {
        let nodes = [NodeId(0), NodeId(1)];
        let rec = Membership::new(VolumeId(1), &nodes, NodeId(0), 1);
        let mut c = Coordinator::new(100, 20, &nodes, 0);
        c.on_heartbeat(10, NodeId(1), 7, 10, &rec);
        let m = c.tick(10, &rec).unwrap();
        assert_eq!(m.epoch, Epoch(1));
        assert_eq!(m.replicas[&NodeId(1)].boot, 7);
        assert_eq!(m.state(NodeId(1)), Some(ReplicaState::OutOfSync));
    }
}
