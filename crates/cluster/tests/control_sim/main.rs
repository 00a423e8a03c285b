//! Deterministic simulation of the cluster's control plane: many volumes on
//! a few nodes, volumes created, retyped (a new replica count) and deleted
//! through the catalog, coordinators
//! competing for the role, watches that lag, and replicas that stop for good.
//!
//! Job: drive the production decision code — the coordinator's state
//! machine (`basalt_replication::Coordinator`), its placement round
//! (`basalt_cluster::plan`) and every replica's state machine
//! (`basalt_replication::Node`) — against a simulated etcd (revisions, the
//! election key with its lease, fenced transactions, per-node watches of the
//! catalog and of the membership records that deliver in revision order,
//! each on its own delay and sometimes stalled for seconds), with node
//! crashes and restarts, process pauses past the leases and the role's TTL,
//! long message delays, and replicas that stop while their node goes on
//! heartbeating for its other replicas; all from one seed. The data path's
//! own faults (lost caches, torn streams, resync rates) are
//! `basalt-replication`'s `tests/sim.rs`; this one keeps disks simple.
//!
//! The simulated member follows `basalt_cluster::member`: a node starts a
//! replica when its records watch shows a record naming it (fresh if the
//! record is the volume's first and carries its boot), feeds it newer
//! records, stops it when a record drops it or the record is deleted, and
//! sends its replicas' heartbeats to the coordinator it last read, in one
//! batch per tick. The simulated coordinator task follows
//! `basalt_cluster::coordinator`: it starts from the records etcd holds and
//! counts every node heard a third of the role's TTL before its election,
//! keeps the role's lease, answers heartbeats only while the role is
//! confirmed, follows its node's records watch, and writes its changes,
//! creates and deletes fenced by its election revision; an orphaned record
//! is deleted only at the revision it was read at and once the node's
//! catalog watch has caught up with that revision.
//!
//! Invariants checked:
//! - at every step, no two replicas of a volume hold an unexpired primary
//!   lease at once (so never two primaries acknowledging in overlapping
//!   lease windows);
//! - a membership record is deleted only when its volume has left the
//!   catalog, and a catalog volume is placed (given a first record) exactly
//!   once;
//! - at the end, after the faults heal: every catalog volume has a record,
//!   and only they do; every replica a record names runs on a live node and
//!   is InSync; the record holds as many replicas as the volume wants (or
//!   as there are nodes); its primary holds a lease; no replica that stopped
//!   is named InSync or primary.

use basalt_catalog::VolumeRecord;
use basalt_cluster::meta::{NodeInfo, NodeState, NodeStatus};
use basalt_cluster::plan;
use basalt_replication::{
    Action, Change, ChangeOutcome, Config, Coordinator, CoordinatorBug, DiskOp, DiskResult,
    Endpoint, Input, IoId, Membership, Msg, Node, NodeId, ReplicaState, RoleKind, VolumeId,
    BLOCK_SIZE,
};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};

mod coordinator;
mod etcd;
mod faults;
mod member;

/// splitmix64: tiny, seeded, identical on every platform.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
    fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }
}

/// Bytes per simulated block (the replicas' `block_len`).
const BL: u64 = 8;
/// Blocks per volume (its catalog size is this many 4 KiB blocks, which is
/// what the record's `blocks` counts).
const BLOCKS: u64 = 16;
const LEASE: u64 = 100;
const GRACE: u64 = 20;
/// The coordinator role's lease in etcd; a holder answers heartbeats only
/// within two thirds of it after its last confirmed keep-alive.
const ROLE_TTL: u64 = 300;
/// A node's registry lease (its `alive` key).
const NODE_TTL: u64 = 300;
/// A replica Faulty this long leaves its record.
const REPLACE_AFTER: u64 = 400;
/// Coordinator rounds and node ticks (ms).
const ROUND: u64 = 10;
const PLACEMENT_EVERY: u64 = 100;
/// Most volumes in the catalog at once.
const MAX_VOLUMES: usize = 12;
/// Nodes' clocks differ from the simulation's by up to this (ms).
const MAX_SKEW: u64 = 30;

/// A deliberately broken control plane, to prove the checks can fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bug {
    /// Orphaned records are deleted on the node's catalog copy as it is,
    /// without waiting for it to catch up with the record's revision (the
    /// coordinator before this simulator: a lagging catalog watch deletes
    /// a live volume's record, which is then placed again as a fresh one).
    OrphanFromStaleCatalog,
    /// The coordinator judges liveness per node only: a replica that stopped
    /// while its node heartbeats for other volumes is never marked Faulty or
    /// failed over.
    NodeLivenessOnly,
}

#[derive(Clone, Debug)]
enum Write {
    Change(Change),
    Create(Membership),
    Delete { vol: VolumeId, mod_rev: u64 },
}

#[derive(Clone, Debug)]
enum Outcome {
    Applied(Option<Membership>),
    Conflict(Option<Membership>),
    Fenced,
    Invalid,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stream {
    Catalog,
    Records,
}

enum Ev {
    /// A message reaches replica `vol` of node `to`'s incarnation `boot`.
    Deliver {
        to: usize,
        boot: u64,
        vol: VolumeId,
        from: Endpoint,
        msg: Msg,
    },
    /// Node `from`'s batch of heartbeats reaches the coordinator on `c`.
    Heartbeats {
        c: usize,
        from: usize,
        batch: Vec<(VolumeId, u64, u64)>,
    },
    Disk {
        node: usize,
        boot: u64,
        vol: VolumeId,
        id: IoId,
        op: DiskOp,
    },
    NodeTick {
        node: usize,
        boot: u64,
    },
    CoordRound {
        node: usize,
        boot: u64,
    },
    /// A coordinator's write reaches etcd.
    Etcd {
        node: usize,
        inc: u64,
        term: u64,
        w: Write,
    },
    /// etcd's answer reaches the coordinator.
    EtcdAnswer {
        node: usize,
        inc: u64,
        w: Write,
        outcome: Outcome,
    },
    /// A replica's own compare-and-swap reaches etcd.
    NodeCas {
        node: usize,
        boot: u64,
        expected: u64,
        record: Membership,
    },
    /// The next change of a node's watch stream is due.
    Watch {
        node: usize,
        boot: u64,
        stream: Stream,
    },
    /// Node `node` reads the election key.
    Learn {
        node: usize,
    },
    Api,
    Fault,
    Restart {
        node: usize,
    },
}

/// What a watch stream carries: the revision and the key's new value
/// (None: deleted).
enum Change2 {
    Catalog(VolumeId, Option<Box<VolumeRecord>>),
    Record(VolumeId, Option<Membership>),
}

struct Replica {
    node: Node,
    /// Stopped for good (its disk kept failing): takes no input, sends
    /// nothing, until its record drops it or the node restarts.
    stopped: bool,
}

/// The coordinator task of a node, while the node holds the role.
struct CoordRole {
    co: Coordinator,
    term: u64,
    /// Its last confirmed keep-alive.
    confirmed: u64,
    inc: u64,
    timers: plan::Timers,
    next_placement: u64,
    /// Creates and deletes sent and not answered: no placement round runs
    /// meanwhile (the production task makes them one after the other).
    placing: usize,
}

struct SimNode {
    /// This node's clock runs this far ahead of the simulation's (constant:
    /// the protocol assumes no rate difference beyond the grace).
    skew: u64,
    up: bool,
    boot: u64,
    paused_until: u64,
    catalog: BTreeMap<VolumeId, VolumeRecord>,
    records: BTreeMap<VolumeId, Membership>,
    /// Queued watch changes per stream: (revision, due time, change).
    queue: [VecDeque<(u64, u64, Change2)>; 2],
    /// A stream stalled until then (a watch reconnecting).
    stalled_until: [u64; 2],
    replicas: BTreeMap<VolumeId, Replica>,
    /// Local copies, kept across replica stops and process restarts until
    /// the catalog no longer has the volume.
    disks: BTreeMap<VolumeId, Vec<u8>>,
    coord: Option<CoordRole>,
    believed: Option<usize>,
    coord_inc: u64,
}

struct Election {
    holder: usize,
    rev: u64,
    expires: u64,
}

struct Sim {
    rng: Rng,
    bug: Option<Bug>,
    now: u64,
    seq: u64,
    queue: BinaryHeap<Reverse<(u64, u64)>>,
    events: HashMap<u64, Ev>,
    cfg: Config,
    fault_until: u64,
    end: u64,
    // etcd
    rev: u64,
    catalog: BTreeMap<VolumeId, VolumeRecord>,
    /// Records with their mod revision.
    records: BTreeMap<VolumeId, (Membership, u64)>,
    election: Option<Election>,
    alive_until: Vec<u64>,
    boots: Vec<u64>,
    /// First records created per volume ever.
    placements: HashMap<VolumeId, u32>,
    next_volume: u128,
    nodes: Vec<SimNode>,
    violation: Option<String>,
    trace: bool,
    /// What the run exercised.
    seen: Summary,
}

fn node_status(id: usize, boot: u64, alive: bool) -> NodeStatus {
    NodeStatus {
        id: NodeId(id as u32),
        info: NodeInfo {
            name: format!("n{id}"),
            peer_addr: "127.0.0.1:1".parse().expect("a socket address"),
            nbd_addr: None,
            nvme_addr: None,
            iscsi_addr: None,
            api_addr: None,
            zone: None,
            capacity_bytes: 1 << 40,
            free_bytes: 1 << 40,
            provision_limit_bytes: Some(1 << 40),
        },
        state: NodeState::Active,
        alive,
        boot,
    }
}

impl Sim {
    fn new(seed: u64, bug: Option<Bug>) -> Sim {
        let mut rng = Rng(seed);
        let n = 3 + rng.below(3) as usize;
        let cfg = Config {
            block_len: BL,
            volume_blocks: BLOCKS,
            region_blocks: 4,
            lease_ms: LEASE,
            ..Config::default()
        };
        let skews: Vec<u64> = (0..n).map(|_| rng.below(MAX_SKEW + 1)).collect();
        let nodes = skews
            .into_iter()
            .map(|skew| SimNode {
                skew,
                up: true,
                boot: 1,
                paused_until: 0,
                catalog: BTreeMap::new(),
                records: BTreeMap::new(),
                queue: [VecDeque::new(), VecDeque::new()],
                stalled_until: [0, 0],
                replicas: BTreeMap::new(),
                disks: BTreeMap::new(),
                coord: None,
                believed: None,
                coord_inc: 0,
            })
            .collect();
        let mut sim = Sim {
            rng,
            bug,
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            events: HashMap::new(),
            cfg,
            fault_until: 3_000,
            end: 7_500,
            rev: 1,
            catalog: BTreeMap::new(),
            records: BTreeMap::new(),
            election: None,
            alive_until: vec![NODE_TTL; n],
            boots: vec![1; n],
            placements: HashMap::new(),
            next_volume: 1,
            nodes,
            violation: None,
            trace: std::env::var_os("BASALT_SIM_TRACE").is_some(),
            seen: Summary::default(),
        };
        for node in 0..n {
            sim.at(1 + node as u64, Ev::NodeTick { node, boot: 1 });
            sim.at(2 + node as u64, Ev::CoordRound { node, boot: 1 });
        }
        sim.at(5, Ev::Api);
        sim.at(200, Ev::Fault);
        sim
    }

    /// Node `node`'s clock (its replicas' and its coordinator's `now`).
    fn clock(&self, node: usize) -> u64 {
        self.now + self.nodes[node].skew
    }

    fn at(&mut self, delay: u64, ev: Ev) {
        self.seq += 1;
        self.queue.push(Reverse((self.now + delay, self.seq)));
        self.events.insert(self.seq, ev);
    }

    fn trace(&self, s: String) {
        if self.trace {
            eprintln!("{:>6} {s}", self.now);
        }
    }

    fn fail(&mut self, what: String) {
        self.violation.get_or_insert(what);
    }

    fn faulty_phase(&self) -> bool {
        self.now < self.fault_until
    }

    /// A network delay: 1–8 ms, or 100–1000 ms one time in a hundred during
    /// the fault phase.
    fn net_delay(&mut self) -> u64 {
        if self.faulty_phase() && self.rng.chance(10) {
            100 + self.rng.below(900)
        } else {
            1 + self.rng.below(8)
        }
    }

    fn step(&mut self, ev: Ev) {
        // A paused process runs nothing until it resumes.
        let paused = |n: &SimNode| n.paused_until > self.now;
        let owner = match &ev {
            Ev::Deliver { to, .. } => Some(*to),
            Ev::Heartbeats { c, .. } => Some(*c),
            Ev::Disk { node, .. }
            | Ev::NodeTick { node, .. }
            | Ev::CoordRound { node, .. }
            | Ev::EtcdAnswer { node, .. }
            | Ev::Watch { node, .. }
            | Ev::Learn { node } => Some(*node),
            _ => None,
        };
        if let Some(o) = owner {
            if paused(&self.nodes[o]) {
                let d = self.nodes[o].paused_until - self.now;
                self.at(d, ev);
                return;
            }
        }
        let alive =
            |s: &Sim, node: usize, boot: u64| s.nodes[node].up && s.nodes[node].boot == boot;
        match ev {
            Ev::Deliver {
                to,
                boot,
                vol,
                from,
                msg,
            } => {
                if alive(self, to, boot) {
                    self.input(to, vol, Input::Msg { from, msg });
                }
            }
            Ev::Heartbeats { c, from, batch } => {
                if self.nodes[c].up {
                    self.heartbeats(c, from, batch);
                }
            }
            Ev::Disk {
                node,
                boot,
                vol,
                id,
                op,
            } => {
                if alive(self, node, boot) {
                    self.disk(node, vol, id, op);
                }
            }
            Ev::NodeTick { node, boot } => {
                if alive(self, node, boot) {
                    self.node_tick(node);
                }
            }
            Ev::CoordRound { node, boot } => {
                if alive(self, node, boot) {
                    self.coord_round(node);
                }
            }
            Ev::Etcd { node, inc, term, w } => self.etcd(node, inc, term, w),
            Ev::EtcdAnswer {
                node,
                inc,
                w,
                outcome,
            } => {
                if self.nodes[node].up {
                    self.etcd_answer(node, inc, w, outcome);
                }
            }
            Ev::NodeCas {
                node,
                boot,
                expected,
                record,
            } => self.node_cas(node, boot, expected, record),
            Ev::Watch { node, boot, stream } => {
                if alive(self, node, boot) {
                    self.watch(node, stream);
                }
            }
            Ev::Learn { node } => {
                if self.nodes[node].up {
                    self.nodes[node].believed = self.election.as_ref().map(|e| e.holder);
                }
            }
            Ev::Api => self.api(),
            Ev::Fault => self.fault(),
            Ev::Restart { node } => self.restart(node),
        }
        self.check_leases();
    }

    fn run(mut self) -> Result<Summary, String> {
        let heal_at = self.fault_until;
        let operator_at = heal_at + (self.end - heal_at) / 2;
        let mut operated = false;
        while let Some(Reverse((t, seq))) = self.queue.pop() {
            if t > self.end {
                break;
            }
            self.now = t;
            if !operated && t >= operator_at {
                operated = true;
                self.operator();
            }
            let Some(ev) = self.events.remove(&seq) else {
                continue;
            };
            self.step(ev);
            if let Some(v) = self.violation.take() {
                return Err(format!("at {} ms: {v}", self.now));
            }
        }
        self.now = self.end;
        self.check_end()?;
        Ok(self.seen)
    }
}

/// Coverage: how often each fault and decision happened.
#[derive(Default, Debug)]
struct Summary {
    elections: u64,
    stops: u64,
    stalls: u64,
    pauses: u64,
    crashes: u64,
    creates: u64,
    deletes: u64,
    retypes: u64,
    failovers: u64,
    orphans_deferred: u64,
}

impl Summary {
    fn add(&mut self, s: &Summary) {
        self.elections += s.elections;
        self.stops += s.stops;
        self.stalls += s.stalls;
        self.pauses += s.pauses;
        self.crashes += s.crashes;
        self.creates += s.creates;
        self.deletes += s.deletes;
        self.retypes += s.retypes;
        self.failovers += s.failovers;
        self.orphans_deferred += s.orphans_deferred;
    }
}

fn run_seed(seed: u64, bug: Option<Bug>) -> Result<Summary, String> {
    Sim::new(seed, bug).run()
}

fn seed_count() -> u64 {
    std::env::var("BASALT_CONTROL_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000)
}

#[test]
fn seeds() {
    if let Some(seed) = std::env::var("BASALT_SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        if let Err(e) = run_seed(seed, None) {
            panic!("seed {seed}: {e}");
        }
        return;
    }
    let mut total = Summary::default();
    let mut failures = Vec::new();
    for seed in 0..seed_count() {
        match run_seed(seed, None) {
            Ok(s) => total.add(&s),
            Err(e) => failures.push(format!("seed {seed}: {e}")),
        }
    }
    eprintln!("control-plane simulation: {total:?}");
    assert!(
        failures.is_empty(),
        "{} seeds failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // The faults happened (so the checks were exercised).
    assert!(total.elections > seed_count());
    assert!(total.stops > 0 && total.stalls > 0 && total.pauses > 0 && total.crashes > 0);
    assert!(total.deletes > 0 && total.failovers > 0 && total.orphans_deferred > 0);
    assert!(total.retypes > 0);
}

fn first_catch(bug: Bug, limit: u64) -> Option<(u64, String)> {
    (0..limit).find_map(|seed| run_seed(seed, Some(bug)).err().map(|e| (seed, e)))
}

#[test]
fn deleting_orphans_from_a_lagging_catalog_is_caught() {
    let (seed, e) = first_catch(Bug::OrphanFromStaleCatalog, 500).expect("caught");
    eprintln!("caught by seed {seed}: {e}");
}

#[test]
fn liveness_per_node_only_is_caught() {
    let (seed, e) = first_catch(Bug::NodeLivenessOnly, 500).expect("caught");
    eprintln!("caught by seed {seed}: {e}");
}
