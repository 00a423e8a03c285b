//! The elected coordinator of the cluster, as a sans-I/O state machine.
//!
//! Job: track node liveness through heartbeats (leases) and restarts (boot
//! ids), and change the membership records accordingly: mark lost
//! secondaries Faulty, returning ones OutOfSync, and promote an InSync
//! secondary with epoch + 1 when the primary is lost or restarted. It keeps
//! its own view of the records (what it read, and what it wrote itself),
//! answers heartbeats from that view, and asks for changes as [`Change`]s
//! that the driver writes to the metadata store, fenced by the
//! coordinator's election revision, and whose outcome it feeds back.
//!
//! Invariants:
//! - only a replica that is InSync in the current record (and has not
//!   restarted since) is ever promoted; failing that, a restarted primary is
//!   re-appointed; otherwise nobody is (the volume waits);
//! - a primary is declared lost only once `lease + grace` has passed since its
//!   last heartbeat arrived; a primary stops acknowledging at
//!   `heartbeat sent_at + lease` (the lease this coordinator states in its
//!   answer), so the old primary's last acknowledgement precedes the
//!   promotion (no clock rate difference assumed beyond `grace`);
//! - a heartbeat is answered from the view, which includes this
//!   coordinator's own successful writes at once; while a promotion it asked
//!   for is unanswered (or its outcome unknown), the answer names the
//!   proposed epoch and primary, so a primary it declared lost is never
//!   renewed until the store shows that the promotion did not happen;
//! - at most one change per volume is in flight, and every change is a CAS
//!   on the version of the record the decision was made from;
//! - a coordinator that did not run for longer than `grace` (a process
//!   pause, a stalled host) counts every node as heard when it runs again:
//!   its own silence is not the nodes' (it replaces nobody for that);
//! - liveness is per node, and per replica once a replica has been heard:
//!   a replica that heartbeated and then fell silent for `lease + grace`
//!   while its node's other replicas kept heartbeating (a replica that
//!   stopped: its disk kept failing) is lost like a lost node's (failed
//!   over if primary, Faulty if secondary); one placed during this tenure
//!   counts as heard `lease + grace` after the coordinator first saw it in
//!   a record (time to start), so one that stops before its first heartbeat
//!   is lost too, while the replicas of the records a tenure starts from
//!   count as heard when the nodes do ([`Coordinator::expect_replicas`]).

use crate::msg::{Endpoint, Msg};
use crate::types::{Epoch, Membership, NodeId, ReplicaState, VolumeId};
use std::collections::BTreeMap;

#[derive(Clone, Copy, Debug)]
struct Liveness {
    last_heard: u64,
    boot: u64,
}

/// A record change the coordinator asks for: replace the record at version
/// `expected` with `record`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub expected: u64,
    pub record: Membership,
}

/// What became of a [`Change`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChangeOutcome {
    /// Written; the record as stored.
    Applied(Membership),
    /// Not written: the record is at another version (this one) now.
    Conflict(Membership),
    /// Not written: the record no longer exists.
    Missing,
    /// Not written: refused, fenced (the role moved on) or the store did not
    /// answer. Whether it was applied may be unknown: the view stays as it
    /// was until the store shows a newer record.
    Failed,
}

/// A change asked for and not yet settled.
#[derive(Clone, Debug)]
struct Pending {
    /// The version the change was decided from (its CAS token).
    expected: u64,
    /// Sent to the store and not answered yet (else: answered `Failed`,
    /// outcome unknown; the next tick decides again).
    in_flight: bool,
    /// The newest epoch and primary asked for since the record at
    /// `expected`: what heartbeats are answered with until the store
    /// shows a newer record (a settling write does not lower it).
    announce: (Epoch, NodeId),
}

pub struct Coordinator {
    lease_ms: u64,
    grace_ms: u64,
    nodes: BTreeMap<NodeId, Liveness>,
    /// When each replica's last heartbeat arrived (see the module docs).
    replicas_heard: BTreeMap<(VolumeId, NodeId), u64>,
    view: BTreeMap<VolumeId, Membership>,
    pending: BTreeMap<VolumeId, Pending>,
    /// When the coordinator last ran (handled any input).
    last_run: Option<u64>,
    stalls: u64,
    bug: Option<CoordinatorBug>,
}

/// Test-only: a coordinator deliberately broken in one way, to prove the
/// simulator catches it.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoordinatorBug {
    /// Its own successful writes do not update its view (heartbeats are
    /// answered from the record it read before them).
    IgnoreOwnWrites,
    /// After a stall it fails over every node it did not hear meanwhile.
    NoStallCredit,
    /// Liveness per node only: a replica that fell silent while its node
    /// kept heartbeating for others counts as alive.
    NodeLivenessOnly,
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
            replicas_heard: BTreeMap::new(),
            view: BTreeMap::new(),
            pending: BTreeMap::new(),
            last_run: None,
            stalls: 0,
            bug: None,
        }
    }

    #[doc(hidden)]
    pub fn with_bug(mut self, bug: CoordinatorBug) -> Self {
        self.bug = Some(bug);
        self
    }

    /// The lease length this coordinator grants (sent in every answer).
    pub fn lease_ms(&self) -> u64 {
        self.lease_ms
    }

    /// How many times the coordinator found it had not run for longer than
    /// `grace` (and counted every node as heard again).
    pub fn stalls(&self) -> u64 {
        self.stalls
    }

    /// Notes that the coordinator runs at `now`; after a stall, every known
    /// node counts as heard now (see the module docs).
    fn run(&mut self, now: u64) {
        if self.bug != Some(CoordinatorBug::NoStallCredit)
            && self
                .last_run
                .is_some_and(|t| now > t.saturating_add(self.grace_ms))
        {
            self.stalls += 1;
            for l in self.nodes.values_mut() {
                l.last_heard = l.last_heard.max(now);
            }
            for t in self.replicas_heard.values_mut() {
                *t = (*t).max(now);
            }
        }
        self.last_run = Some(self.last_run.map_or(now, |t| t.max(now)));
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

    /// A record read from the store (a list, a watch event, a node's
    /// answer): taken into the view if newer than what it holds. A record
    /// newer than the base of a pending change settles that change (it was
    /// applied, or superseded: the next tick decides from the new record).
    pub fn observe(&mut self, rec: Membership) {
        let vol = rec.volume;
        if self
            .pending
            .get(&vol)
            .is_some_and(|p| rec.version > p.expected)
        {
            self.pending.remove(&vol);
        }
        if self.view.get(&vol).is_none_or(|r| rec.version > r.version) {
            // A replica this coordinator has not heard yet (just placed:
            // its node must see the record and open it) gets `lease +
            // grace` on top of the usual `lease + grace` to be heard first;
            // one that never heartbeats (it stopped while starting) is then
            // lost like any silent replica, not kept alive by its node's
            // other replicas. (Before the first run, a tenure's start:
            // `expect_replicas` sets the clocks.)
            // A replica that left the record is forgotten, so that one
            // placed there again later starts afresh.
            if let Some(old) = self.view.get(&vol) {
                for n in old.replicas.keys() {
                    if !rec.replicas.contains_key(n) {
                        self.replicas_heard.remove(&(vol, *n));
                    }
                }
            }
            if let Some(t) = self.last_run {
                let starting = t + self.lease_ms + self.grace_ms;
                for n in rec.replicas.keys() {
                    self.replicas_heard.entry((vol, *n)).or_insert(starting);
                }
            }
            self.view.insert(vol, rec);
        }
    }

    /// Counts every replica of every record in the view as heard at `now`
    /// unless heard since: for a tenure's start, whose records' replicas
    /// are running (or stopped) already, so that one that never heartbeats
    /// to this coordinator is lost like a silent node, not kept alive by
    /// its node's other replicas.
    pub fn expect_replicas(&mut self, now: u64) {
        for rec in self.view.values() {
            for n in rec.replicas.keys() {
                self.replicas_heard.entry((rec.volume, *n)).or_insert(now);
            }
        }
    }

    /// The volume's record was deleted.
    pub fn forget(&mut self, vol: VolumeId) {
        self.view.remove(&vol);
        self.pending.remove(&vol);
        self.replicas_heard.retain(|(v, _), _| *v != vol);
    }

    /// The record of `vol` as this coordinator knows it.
    pub fn record(&self, vol: VolumeId) -> Option<&Membership> {
        self.view.get(&vol)
    }

    /// Every record as this coordinator knows it.
    pub fn records(&self) -> impl Iterator<Item = &Membership> {
        self.view.values()
    }

    /// Whether a change of `vol` is asked for and not settled.
    pub fn has_pending(&self, vol: VolumeId) -> bool {
        self.pending.contains_key(&vol)
    }

    /// A heartbeat arrived from `from` for volume `vol`; returns the answer
    /// (None for a volume the coordinator has no record of).
    pub fn on_heartbeat(
        &mut self,
        now: u64,
        from: NodeId,
        boot: u64,
        sent_at: u64,
        vol: VolumeId,
    ) -> Option<(Endpoint, Msg)> {
        self.run(now);
        let l = self.nodes.entry(from).or_insert(Liveness {
            last_heard: now,
            boot,
        });
        l.last_heard = l.last_heard.max(now);
        l.boot = l.boot.max(boot);
        let rec = self.view.get(&vol)?;
        if rec.replicas.contains_key(&from) {
            let t = self.replicas_heard.entry((vol, from)).or_insert(now);
            *t = (*t).max(now);
        }
        // A promotion asked for and not settled answers for the record: the
        // primary it replaces must not extend its lease meanwhile.
        let (epoch, primary) = match self.pending.get(&vol) {
            Some(p) if p.announce.0 > rec.epoch => p.announce,
            _ => (rec.epoch, rec.primary),
        };
        Some((
            Endpoint::Node(from),
            Msg::HeartbeatAck {
                sent_at,
                vol,
                epoch,
                primary,
                lease_ms: self.lease_ms,
            },
        ))
    }

    fn alive(&self, now: u64, n: NodeId) -> bool {
        self.nodes
            .get(&n)
            .is_some_and(|l| now <= l.last_heard + self.lease_ms + self.grace_ms)
    }

    /// Whether the replica of `vol` on `n` counts as alive: its node is,
    /// and the replica did not fall silent after it was heard.
    fn replica_alive(&self, now: u64, vol: VolumeId, n: NodeId) -> bool {
        self.alive(now, n)
            && (self.bug == Some(CoordinatorBug::NodeLivenessOnly)
                || self
                    .replicas_heard
                    .get(&(vol, n))
                    .is_none_or(|t| now <= t + self.lease_ms + self.grace_ms))
    }

    /// The changes to ask for at `now`: one per volume whose record (in the
    /// view) needs one and has none in flight.
    pub fn tick(&mut self, now: u64) -> Vec<Change> {
        self.run(now);
        let mut changes = Vec::new();
        for (vol, rec) in &self.view {
            let unsettled = match self.pending.get(vol) {
                Some(p) if p.in_flight => continue,
                Some(_) => true,
                None => false,
            };
            // A change whose outcome is unknown is settled by a write at
            // the same version: the decision again, or the record as it is
            // (which only bumps its version, so the lost write can never
            // land afterwards).
            let record = match self.decide(now, rec) {
                Some(r) => r,
                None if unsettled => rec.clone(),
                None => continue,
            };
            changes.push(Change {
                expected: rec.version,
                record,
            });
        }
        for c in &changes {
            let asked = (c.record.epoch, c.record.primary);
            let announce = match self.pending.get(&c.record.volume) {
                Some(p) if p.announce.0 > asked.0 => p.announce,
                _ => asked,
            };
            self.pending.insert(
                c.record.volume,
                Pending {
                    expected: c.expected,
                    in_flight: true,
                    announce,
                },
            );
        }
        changes
    }

    /// What became of `change`.
    pub fn on_outcome(&mut self, change: &Change, outcome: ChangeOutcome) {
        let vol = change.record.volume;
        match outcome {
            ChangeOutcome::Applied(_) if self.bug == Some(CoordinatorBug::IgnoreOwnWrites) => {
                self.pending.remove(&vol);
            }
            ChangeOutcome::Applied(rec) | ChangeOutcome::Conflict(rec) => self.observe(rec),
            ChangeOutcome::Missing => self.forget(vol),
            ChangeOutcome::Failed => {
                let ours = self.pending.get_mut(&vol);
                if let Some(p) = ours.filter(|p| p.expected == change.expected) {
                    p.in_flight = false;
                }
            }
        }
    }

    /// Whether [`Coordinator::decide`] may change `rec`: a replica
    /// restarted, one lost that is the primary or not yet Faulty, or a
    /// Faulty one alive again. False means it changes nothing.
    fn may_change(&self, now: u64, rec: &Membership) -> bool {
        rec.replicas.iter().any(|(n, info)| {
            let restarted = self.nodes.get(n).is_some_and(|l| l.boot > info.boot);
            let alive = self.replica_alive(now, rec.volume, *n);
            let faulty = info.state == ReplicaState::Faulty;
            restarted || (!alive && (*n == rec.primary || !faulty)) || (alive && faulty)
        })
    }

    /// The record the coordinator wants instead of `rec`, or None when
    /// `rec` is fine.
    fn decide(&self, now: u64, rec: &Membership) -> Option<Membership> {
        // Most records need nothing: tell without copying them (this runs
        // for every record at every tick).
        if !self.may_change(now, rec) {
            return None;
        }
        let mut m = rec.clone();
        let mut failover = false;
        let mut restarted = Vec::new();
        for (n, info) in m.replicas.iter_mut() {
            let alive = self.replica_alive(now, rec.volume, *n);
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
                        && self.replica_alive(now, rec.volume, **n)
                        && !restarted.contains(n)
                })
                .map(|(n, _)| *n)
                .or_else(|| {
                    (restarted.contains(&rec.primary)
                        && self.replica_alive(now, rec.volume, rec.primary))
                    .then_some(rec.primary)
                });
            if candidate.is_none() {
                // Nobody to appoint yet: the primary's restart stays
                // unrecorded, so that it is handled — by a new epoch — once
                // its replica is heard, never by a record that names the
                // new incarnation primary of the old epoch.
                if let (Some(info), Some(old)) = (
                    m.replicas.get_mut(&rec.primary),
                    rec.replicas.get(&rec.primary),
                ) {
                    info.boot = old.boot;
                }
            }
            if let Some(c) = candidate {
                m.epoch = Epoch(rec.epoch.0 + 1);
                m.primary = c;
                for (n, info) in m.replicas.iter_mut() {
                    info.state = if *n == c {
                        ReplicaState::InSync
                    } else if self.replica_alive(now, rec.volume, *n) {
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

    const VOL: VolumeId = VolumeId(7);

    #[test]
    fn a_replica_that_stops_before_its_first_heartbeat_is_lost() {
        // Found by the control-plane simulator: a replica placed during the
        // tenure that never heartbeated was judged by its node alone, so one
        // that stopped while starting stayed "alive" as long as its node
        // heartbeated for other volumes.
        let (a, b) = (NodeId(1), NodeId(2));
        let other = VolumeId(8);
        let mut c = Coordinator::new(100, 50, &[a, b], 0);
        c.observe(Membership::new(other, &[a, b], a, 1));
        c.tick(0);
        c.observe(Membership::new(VOL, &[a, b], a, 1));
        // Both nodes keep heartbeating for the other volume; VOL's replica
        // on b never speaks, a's does.
        let mut changes = Vec::new();
        for t in (10..=400).step_by(10) {
            for n in [a, b] {
                c.on_heartbeat(t, n, 0, t, other);
            }
            c.on_heartbeat(t, a, 0, t, VOL);
            changes = c.tick(t);
            if !changes.is_empty() {
                assert!(t > 300, "given time to start: lease + grace, twice");
                break;
            }
        }
        let change = changes.first().expect("the silent replica is lost");
        assert_eq!(change.record.replicas[&b].state, ReplicaState::Faulty);
    }

    #[test]
    fn a_restarted_primary_is_never_recorded_in_its_old_epoch() {
        // Found by the control-plane simulator: a primary restarted while
        // its replica was not heard yet and no secondary could take over;
        // the record got its new boot with the old epoch, so the restart
        // counted as handled and the new incarnation was named primary of
        // the epoch its predecessor served.
        let (a, b) = (NodeId(1), NodeId(2));
        let mut c = Coordinator::new(100, 50, &[a, b], 0);
        let mut rec = Membership::new(VOL, &[a, b], a, 1);
        rec.replicas.values_mut().for_each(|r| r.boot = 1);
        c.observe(rec.clone());
        let mut recorded = Vec::new();
        let run = |c: &mut Coordinator, t: u64, recorded: &mut Vec<Membership>| {
            for ch in c.tick(t) {
                let applied = Membership {
                    version: ch.expected + 1,
                    ..ch.record.clone()
                };
                c.on_outcome(&ch, ChangeOutcome::Applied(applied.clone()));
                recorded.push(applied);
            }
        };
        // b falls silent and is marked Faulty while a serves.
        for t in (0..=300).step_by(10) {
            c.on_heartbeat(t, a, 1, t, VOL);
            run(&mut c, t, &mut recorded);
        }
        assert_eq!(
            recorded.last().map(|r| r.replicas[&b].state),
            Some(ReplicaState::Faulty)
        );
        // a crashes, and restarts (boot 2) once lost: its node heartbeats
        // for another volume, its replica of VOL is not heard yet
        // (starting, or stuck).
        for t in (310..=500).step_by(10) {
            run(&mut c, t, &mut recorded);
        }
        for t in (510..=800).step_by(10) {
            c.on_heartbeat(t, a, 2, t, VolumeId(8));
            run(&mut c, t, &mut recorded);
        }
        for r in &recorded {
            assert!(
                r.epoch > rec.epoch || r.replicas[&a].boot == 1,
                "new boot in the old epoch: {r:?}"
            );
        }
        // Once its replica is heard, it is re-appointed in a new epoch.
        c.on_heartbeat(810, a, 2, 810, VOL);
        let ch = c.tick(810);
        assert_eq!(ch[0].record.epoch, Epoch(2));
        assert_eq!(ch[0].record.primary, a);
        assert_eq!(ch[0].record.replicas[&a].boot, 2);
    }

    #[test]
    fn idle_node_vouched_for_is_not_lost_when_a_volume_lands_on_it() {
        let (a, b) = (NodeId(1), NodeId(2));
        let mut c = Coordinator::new(100, 50, &[a, b], 0);
        // Long idle: neither node held a replica, so neither heartbeated
        // (the coordinator ran meanwhile, so it did not stall).
        for t in (0..=10_000).step_by(40) {
            assert!(c.tick(t).is_empty());
        }
        c.vouch(a, 10_000);
        c.vouch(b, 10_000);
        let rec = Membership::new(VOL, &[a, b], a, 1);
        c.observe(rec.clone());
        assert!(
            c.tick(10_010).is_empty(),
            "freshly placed volume left alone"
        );
        // Without heartbeats the primary is lost after lease + grace.
        for t in (10_050..10_150).step_by(40) {
            assert!(c.tick(t).is_empty());
        }
        assert_eq!(c.tick(10_151).len(), 1);
    }

    #[test]
    fn promotes_in_sync_secondary_after_lease_and_grace() {
        let nodes = [NodeId(0), NodeId(1), NodeId(2)];
        let mut rec = Membership::new(VolumeId(1), &nodes, NodeId(0), 2);
        rec.replicas.get_mut(&NodeId(1)).unwrap().state = ReplicaState::OutOfSync;
        let mut c = Coordinator::new(100, 20, &nodes, 0);
        c.observe(rec.clone());
        for t in [10, 30, 50, 70, 90, 100] {
            c.on_heartbeat(t, NodeId(1), 0, t, VolumeId(1));
            c.on_heartbeat(t, NodeId(2), 0, t, VolumeId(1));
        }
        assert!(c.tick(110).is_empty());
        assert!(c.tick(120).is_empty(), "primary still within lease + grace");
        let changes = c.tick(121);
        let m = &changes[0].record;
        assert_eq!(changes[0].expected, rec.version);
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
        c.observe(rec.clone());
        c.on_heartbeat(10, NodeId(1), 7, 10, VolumeId(1));
        let changes = c.tick(10);
        let m = &changes[0].record;
        assert_eq!(m.epoch, Epoch(1));
        assert_eq!(m.replicas[&NodeId(1)].boot, 7);
        assert_eq!(m.state(NodeId(1)), Some(ReplicaState::OutOfSync));
    }

    /// The primary `NodeId(0)` of a 2-replica record falls silent; the
    /// coordinator asks to promote `NodeId(1)` at `t = 121`.
    fn failover_asked() -> (Coordinator, Change) {
        let nodes = [NodeId(0), NodeId(1)];
        let rec = Membership::new(VOL, &nodes, NodeId(0), 1);
        let mut c = Coordinator::new(100, 20, &nodes, 0);
        c.observe(rec.clone());
        for t in (10..=120).step_by(10) {
            c.on_heartbeat(t, NodeId(1), 0, t, VOL);
            assert!(c.tick(t).is_empty());
        }
        let mut changes = c.tick(121);
        assert_eq!(changes.len(), 1);
        (c, changes.remove(0))
    }

    fn answer(c: &mut Coordinator, now: u64, from: NodeId) -> (Epoch, NodeId, u64) {
        match c.on_heartbeat(now, from, 0, now, VOL) {
            Some((
                _,
                Msg::HeartbeatAck {
                    epoch,
                    primary,
                    lease_ms,
                    ..
                },
            )) => (epoch, primary, lease_ms),
            other => panic!("unexpected answer {other:?}"),
        }
    }

    #[test]
    fn a_deposed_primary_is_not_renewed_once_its_successor_is_written() {
        let (mut c, change) = failover_asked();
        // The promotion is in flight: the old primary wakes and heartbeats.
        assert_eq!(answer(&mut c, 122, NodeId(0)), (Epoch(2), NodeId(1), 100));
        let mut applied = change.record.clone();
        applied.version = change.expected + 1;
        c.on_outcome(&change, ChangeOutcome::Applied(applied));
        // No watch event yet: the view has the coordinator's own write.
        assert_eq!(answer(&mut c, 123, NodeId(0)), (Epoch(2), NodeId(1), 100));
        assert_eq!(c.record(VOL).map(|r| r.version), Some(change.expected + 1));
        // It is alive again: back as a secondary to resync, in epoch 2.
        let back = c.tick(124);
        assert_eq!(back[0].record.epoch, Epoch(2));
        assert_eq!(
            back[0].record.state(NodeId(0)),
            Some(ReplicaState::OutOfSync)
        );
    }

    #[test]
    fn a_promotion_of_unknown_outcome_is_settled_before_anyone_is_renewed() {
        let (mut c, change) = failover_asked();
        c.on_outcome(&change, ChangeOutcome::Failed);
        // The old primary comes back; it is alive again, but whether the
        // promotion landed is unknown: no renewal.
        assert_eq!(answer(&mut c, 130, NodeId(0)).0, Epoch(2));
        let settle = c.tick(131);
        assert_eq!(settle.len(), 1, "a settling write at the same version");
        assert_eq!(settle[0].expected, change.expected);
        assert_eq!(
            answer(&mut c, 132, NodeId(0)).0,
            Epoch(2),
            "still unsettled"
        );
        let mut stored = settle[0].record.clone();
        stored.version = settle[0].expected + 1;
        c.on_outcome(&settle[0], ChangeOutcome::Applied(stored.clone()));
        assert_eq!(
            answer(&mut c, 133, NodeId(0)),
            (stored.epoch, stored.primary, 100)
        );
    }

    #[test]
    fn a_stalled_coordinator_fails_nobody_over_for_its_own_silence() {
        let nodes = [NodeId(0), NodeId(1)];
        let rec = Membership::new(VOL, &nodes, NodeId(0), 1);
        let mut c = Coordinator::new(100, 20, &nodes, 0);
        c.observe(rec.clone());
        for t in (10..=100).step_by(10) {
            c.on_heartbeat(t, NodeId(0), 0, t, VOL);
            c.on_heartbeat(t, NodeId(1), 0, t, VOL);
            assert!(c.tick(t).is_empty());
        }
        // Paused for 5 s: heartbeats queued meanwhile arrive after the tick.
        assert!(c.tick(5_100).is_empty(), "no failover after a stall");
        assert_eq!(c.stalls(), 1);
        // A primary that really is gone is still replaced, lease + grace
        // after the stall.
        for t in (5_110..=5_220).step_by(10) {
            c.on_heartbeat(t, NodeId(1), 0, t, VOL);
            assert!(c.tick(t).is_empty(), "t={t}");
        }
        c.on_heartbeat(5_230, NodeId(1), 0, 5_230, VOL);
        assert_eq!(c.tick(5_230).len(), 1);
        assert!(c.has_pending(VOL), "the silent primary is replaced");
    }

    /// Node 1 holds two volumes' replicas and keeps heartbeating for one;
    /// the other's replica stopped (its disk kept failing): as primary it is
    /// failed over, as secondary marked Faulty, while the node stays alive
    /// for the volume it still serves.
    #[test]
    fn a_stopped_replica_on_a_live_node_is_lost_alone() {
        let (a, b) = (NodeId(1), NodeId(2));
        let (served, stopped_p, stopped_s) = (VolumeId(1), VolumeId(2), VolumeId(3));
        let mut c = Coordinator::new(100, 20, &[a, b], 0);
        c.observe(Membership::new(served, &[a, b], a, 1));
        c.observe(Membership::new(stopped_p, &[a, b], a, 1));
        c.observe(Membership::new(stopped_s, &[a, b], b, 1));
        for t in (0..=40).step_by(10) {
            for v in [served, stopped_p, stopped_s] {
                c.on_heartbeat(t, a, 0, t, v);
                c.on_heartbeat(t, b, 0, t, v);
            }
        }
        // From 40 on, node 1 heartbeats only for `served`.
        for t in (50..=160).step_by(10) {
            c.on_heartbeat(t, a, 0, t, served);
            for v in [served, stopped_p, stopped_s] {
                c.on_heartbeat(t, b, 0, t, v);
            }
            assert!(c.tick(t).is_empty(), "at {t}: within lease + grace");
        }
        c.on_heartbeat(161, a, 0, 161, served);
        let changes = c.tick(161);
        let by_vol = |v: VolumeId| changes.iter().find(|ch| ch.record.volume == v);
        assert!(by_vol(served).is_none(), "{changes:?}");
        let p = &by_vol(stopped_p).expect("failover").record;
        assert_eq!((p.epoch, p.primary), (Epoch(2), b));
        assert_eq!(p.state(a), Some(ReplicaState::Faulty));
        let s = &by_vol(stopped_s).expect("marked faulty").record;
        assert_eq!((s.epoch, s.primary), (Epoch(1), b));
        assert_eq!(s.state(a), Some(ReplicaState::Faulty));
    }

    /// A tenure that starts from records whose replica on a live node
    /// never heartbeats to it (it stopped before) fails that replica over
    /// after lease + grace from the start, as it would a silent node.
    #[test]
    fn a_replica_silent_since_the_tenure_began_is_lost() {
        let (a, b) = (NodeId(1), NodeId(2));
        let (served, stopped) = (VolumeId(1), VolumeId(2));
        let mut c = Coordinator::new(100, 20, &[a, b], 0);
        c.observe(Membership::new(served, &[a, b], a, 1));
        c.observe(Membership::new(stopped, &[a, b], a, 1));
        c.expect_replicas(0);
        for t in (0..=120).step_by(10) {
            c.on_heartbeat(t, a, 0, t, served);
            c.on_heartbeat(t, b, 0, t, served);
            c.on_heartbeat(t, b, 0, t, stopped);
            assert!(c.tick(t).is_empty(), "at {t}");
        }
        c.on_heartbeat(121, a, 0, 121, served);
        let changes = c.tick(121);
        assert_eq!(changes.len(), 1, "{changes:?}");
        assert_eq!(changes[0].record.volume, stopped);
        assert_eq!(changes[0].record.primary, b);
    }
}
