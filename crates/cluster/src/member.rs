//! This process as a member of a cluster: joins it in etcd, keeps the peer
//! transport's address book current, runs a replica driver for every volume
//! that has a replica here, routes client I/O to each volume's primary, and
//! runs the coordinator while elected.
//!
//! Invariants:
//! - a replica driver runs for exactly the volumes whose membership record
//!   (as last seen from etcd) names this node; its local store volume exists
//!   before the driver starts, at least as large as the record's size
//!   (`blocks`: a replica that was away during a resize, or is rebuilt on
//!   a new node, is grown before its state machine starts);
//! - a volume grows (online resize) only through its membership record's
//!   size, after every node holding a replica was checked to have room for
//!   it; each node grows its own copy before its state machine uses the new
//!   blocks (see `basalt_replication`'s `Node`), so no write beyond the old
//!   end is acknowledged unless every replica the ack rule counts holds it;
//! - client requests go to the primary named by the newest record seen; a
//!   request answered NotPrimary, or not answered in time, is sent again to
//!   the then-current primary until the request deadline (block writes are
//!   idempotent, so a repeat is harmless); the client sees an error only
//!   after the deadline;
//! - the coordinator (at most one, by etcd election) changes records only by
//!   compare-and-swap, with the rules of `basalt_replication`.

use crate::coordinator::{default_min_in_sync, wanted_replicas, CoordinatorTask, Load};
use crate::meta::{
    CasOutcome, ClusterMeta, EtcdConfig, NodeInfo, NodeState, NodeStatus, Registration, WatchGuard,
};
use crate::peer::{PeerConfig, PeerHandler, PeerNet};
use crate::placement;
use crate::replica::{Event, Origin, Replica, ReplicaEnv, ReplicaSpec};
use crate::ticker::{Tick, Ticker};
use crate::ClusterError;
use crate::{crash_logs, saved_logs};
use basalt_catalog::{Catalog, VolumeRecord};
use basalt_replication::{
    ClientReply, ClientReq, Config, Membership, Msg, NodeId, ReplicaState, SavedLogs, VolumeId,
};
use basalt_store::{DataKind, DataOp, IoError, Store, StoreError, BLOCK_SIZE};
use basalt_volume::{
    BlockIo, ClusterVolumes, NodeView, ProvisioningGuard, ReplicaStatus, VolumeError, WriteAck,
};
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Timing of the replication protocol in a cluster (milliseconds).
#[derive(Clone, Debug)]
pub struct Timing {
    pub heartbeat_ms: u64,
    /// A primary acknowledges nothing later than this after the heartbeat
    /// that extended its lease was sent.
    pub lease_ms: u64,
    /// The coordinator waits `lease + grace` of silence before it replaces a
    /// primary (covers clock rate differences and delivery delays).
    pub grace_ms: u64,
    pub ack_timeout_ms: u64,
    pub cas_timeout_ms: u64,
    pub poll_ms: u64,
    pub resync_retry_ms: u64,
    /// Blocks per dirty-tracking region.
    pub region_blocks: u64,
    /// A replica Faulty this long is rebuilt on another node.
    pub replace_after: Duration,
    /// Cap on this node's resync and rebuild copies, bytes per second (0:
    /// none), shared by the volumes it copies as primary; see
    /// `basalt_replication::Config::resync_rate`.
    pub resync_rate: u64,
    /// Region copies in flight per replica being resynced.
    pub resync_inflight: usize,
    /// Regions the crash-safe copy of a replica's logs keeps before it is
    /// cut down to what it must hold (its hot set; 0: no crash-safe copy,
    /// a crashed node is copied in full after a failover); see
    /// `basalt_replication::Config::crash_log_regions`.
    pub crash_log_regions: usize,
    /// How often a crash-safe copy holding more than `crash_log_regions`
    /// is checked for cutting down; see
    /// `basalt_replication::Config::crash_log_compact_ms`.
    pub crash_log_compact_ms: u64,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            heartbeat_ms: 100,
            lease_ms: 1500,
            grace_ms: 1000,
            ack_timeout_ms: 1000,
            cas_timeout_ms: 3000,
            poll_ms: 1000,
            resync_retry_ms: 500,
            region_blocks: 256,
            replace_after: Duration::from_secs(600),
            resync_rate: 64 << 20,
            resync_inflight: 4,
            // 4 GiB of 1 MiB regions: some 25 KiB of file per log.
            crash_log_regions: 4096,
            crash_log_compact_ms: 10_000,
        }
    }
}

/// How this node joins the cluster.
#[derive(Clone, Debug)]
pub struct MemberConfig {
    pub name: String,
    pub zone: Option<String>,
    /// Where the peer transport listens (a fixed port: peers find it in etcd).
    pub peer_listen: SocketAddr,
    /// The address peers dial (default: `peer_listen`).
    pub peer_advertise: Option<SocketAddr>,
    pub nbd_addr: Option<SocketAddr>,
    pub nvme_addr: Option<SocketAddr>,
    pub api_addr: Option<SocketAddr>,
    pub etcd: EtcdConfig,
    /// Node liveness key TTL in etcd (for `node list`; replication uses
    /// its own heartbeats).
    pub node_ttl: Duration,
    pub timing: Timing,
    /// How long a client request is retried across failovers before the
    /// client gets an I/O error.
    pub request_deadline: Duration,
    /// Where a clean stop saves the replicas' uncertain-region logs for the
    /// next start (the data directory); None: not saved.
    pub log_dir: Option<std::path::PathBuf>,
    /// This node's overcommit ratio: volumes of up to capacity × ratio
    /// bytes in all may have a replica here (published for the capacity
    /// check of other nodes' resizes).
    pub overcommit_ratio: f64,
}

impl MemberConfig {
    pub fn new(name: impl Into<String>, peer_listen: SocketAddr, etcd: EtcdConfig) -> Self {
        MemberConfig {
            name: name.into(),
            zone: None,
            peer_listen,
            peer_advertise: None,
            nbd_addr: None,
            nvme_addr: None,
            api_addr: None,
            etcd,
            node_ttl: Duration::from_secs(3),
            timing: Timing::default(),
            request_deadline: Duration::from_secs(60),
            log_dir: None,
            overcommit_ratio: 2.0,
        }
    }
}

struct ReplicaHandle {
    replica: Arc<Replica<Env>>,
}

/// How long a stop waits for a replica's work in progress (a disk batch)
/// to finish.
const REPLICA_STOP_WAIT: Duration = Duration::from_secs(10);

impl ReplicaHandle {
    fn stop(self) {
        if !self.replica.stop_and_wait(REPLICA_STOP_WAIT) {
            tracing::warn!(
                "a stopped replica still had work in progress after {REPLICA_STOP_WAIT:?}"
            );
        }
    }

    /// Stops for a clean restart: the logs to save (see
    /// `Replica::stop_for_restart`).
    fn stop_for_restart(self) -> Option<SavedLogs> {
        self.replica.stop_for_restart()
    }
}

/// Client requests waiting for their reply, by this node's request id.
#[derive(Default)]
struct Pending {
    next: u64,
    waiting: HashMap<u64, Waiting>,
}

struct Waiting {
    /// The channel of the batch the request belongs to.
    tx: mpsc::SyncSender<(usize, ClientReply)>,
    /// Its index in the batch.
    index: usize,
    /// The volume and the remote primary it was forwarded to (None: run
    /// locally, or not sent).
    forwarded: Option<(VolumeId, NodeId)>,
    /// The batch's early acknowledgement, if its frontend gave one.
    early: Option<Arc<EarlyAck>>,
}

impl Waiting {
    /// Hands `reply` to the batch's submitter — after acknowledging the
    /// batch to the client, on this thread, if it was its last write.
    fn answer(self, reply: ClientReply) {
        if let Some(early) = &self.early {
            early.reply(matches!(reply, ClientReply::Ok { .. }));
        }
        let _ = self.tx.try_send((self.index, reply));
    }
}

/// A batch of client writes whose frontend acknowledges them itself
/// ([`WriteAck`]): the thread that brings the batch's last successful reply
/// calls it, so the submitting thread's wake-up is off the client's path.
///
/// Invariant: `ack` is called at most once, only when every write of the
/// batch's first attempt succeeded, and never after the submitter closed the
/// batch — the state lock is held across the call, so after `close` returns
/// the outcome is final.
struct EarlyAck {
    ack: Arc<dyn WriteAck>,
    state: Mutex<EarlyAckState>,
}

enum EarlyAckState {
    /// This many writes not answered yet, all answers so far successes.
    Waiting(usize),
    Acknowledged,
    /// A write failed, or the submitter closed the batch first.
    Off,
}

impl EarlyAck {
    fn new(ack: Arc<dyn WriteAck>, writes: usize) -> EarlyAck {
        EarlyAck {
            ack,
            state: Mutex::new(EarlyAckState::Waiting(writes)),
        }
    }

    fn reply(&self, ok: bool) {
        let mut st = self.state.lock();
        let EarlyAckState::Waiting(remaining) = *st else {
            return;
        };
        *st = if !ok {
            EarlyAckState::Off
        } else if remaining <= 1 {
            self.ack.acknowledge();
            EarlyAckState::Acknowledged
        } else {
            EarlyAckState::Waiting(remaining - 1)
        };
    }

    /// Ends the first attempt: no acknowledgement after this. Returns
    /// whether the batch was acknowledged (then every write succeeded).
    fn close(&self) -> bool {
        let mut st = self.state.lock();
        if matches!(*st, EarlyAckState::Acknowledged) {
            return true;
        }
        *st = EarlyAckState::Off;
        false
    }
}

pub(crate) struct Inner {
    cfg: MemberConfig,
    pub(crate) me: NodeId,
    boot: u64,
    /// CLOCK_BOOTTIME at start, in milliseconds (see [`boottime_ms`]).
    clock: u64,
    pub(crate) meta: Arc<ClusterMeta>,
    registration: Mutex<Option<Registration>>,
    peers: PeerNet,
    store: Arc<Store>,
    pub(crate) catalog: Arc<dyn Catalog>,
    pub(crate) records: RwLock<HashMap<VolumeId, Membership>>,
    pub(crate) nodes: RwLock<Vec<NodeStatus>>,
    /// The catalog's volume records by name, as the catalog watch last
    /// saw them.
    pub(crate) volumes: RwLock<std::collections::BTreeMap<String, VolumeRecord>>,
    replicas: Mutex<HashMap<VolumeId, ReplicaHandle>>,
    /// Drives every replica's clock on a fixed set of threads.
    ticker: Ticker,
    /// The replicas' heartbeats to a coordinator on another node, until
    /// the heartbeat sender sends them as one batch.
    heartbeats: Mutex<Vec<(VolumeId, Msg)>>,
    /// Each copying volume's share of the node's resync rate, as last set.
    resync_share: Mutex<u64>,
    /// Logs saved at the last clean stop, until each replica's driver
    /// starts.
    restored: Mutex<HashMap<VolumeId, SavedLogs>>,
    /// The size opens of each volume on this node serve (see
    /// `ClusterVolume::size`), raised by records showing it grown, so that
    /// connected NVMe/TCP hosts see a resize (the target notices it and
    /// raises a namespace-changed event).
    open_sizes: Mutex<HashMap<VolumeId, Arc<AtomicU64>>>,
    pending: Mutex<Pending>,
    /// The coordinator's node id as last looked up.
    coordinator_id: RwLock<Option<NodeId>>,
    coordinator: Mutex<Option<CoordinatorTask>>,
    /// The watches of the catalog, the node registry and the membership
    /// records (kept alive here; see `caught_up`).
    watches: Mutex<Vec<WatchGuard>>,
    /// Keeps the campaign alive.
    guards: Mutex<Vec<Box<dyn std::any::Any + Send>>>,
    stopping: std::sync::atomic::AtomicBool,
}

/// A running cluster member; see the module docs.
pub struct ClusterMember {
    inner: Arc<Inner>,
    /// Housekeeping and the heartbeat sender.
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// What this node publishes about itself in the registry.
fn node_info(cfg: &MemberConfig, store: &Store) -> NodeInfo {
    let usage = store.usage();
    NodeInfo {
        name: cfg.name.clone(),
        peer_addr: cfg.peer_advertise.unwrap_or(cfg.peer_listen),
        nbd_addr: cfg.nbd_addr,
        nvme_addr: cfg.nvme_addr,
        api_addr: cfg.api_addr,
        zone: cfg.zone.clone(),
        capacity_bytes: usage.capacity_bytes,
        free_bytes: usage.capacity_bytes.saturating_sub(usage.allocated_bytes),
        // `as` saturates: an absurd ratio cannot wrap.
        provision_limit_bytes: Some(
            (usage.capacity_bytes as f64 * cfg.overcommit_ratio).floor() as u64
        ),
    }
}

fn vol_of(id: uuid::Uuid) -> VolumeId {
    VolumeId(id.as_u128())
}

fn uuid_of(vol: VolumeId) -> uuid::Uuid {
    uuid::Uuid::from_u128(vol.0)
}

/// Routes peer messages into the member; holds it weakly so that the
/// transport's threads never keep a stopped member alive. Messages that
/// arrive before the member is wired up are dropped (the protocol retries).
struct Router(std::sync::OnceLock<Weak<Inner>>);

impl PeerHandler for Router {
    fn on_message(&self, from: NodeId, vol: VolumeId, msg: Msg) {
        self.on_batch(from, vec![(vol, msg)]);
    }

    fn on_batch(&self, from: NodeId, batch: Vec<(VolumeId, Msg)>) {
        if let Some(inner) = self.0.get().and_then(Weak::upgrade) {
            inner.on_peer_batch(from, batch);
        }
    }
}

impl ClusterMember {
    /// Joins the cluster and starts serving. `store` is this node's local
    /// store; `catalog` the cluster's catalog (in etcd).
    pub fn start(
        cfg: MemberConfig,
        store: Arc<Store>,
        catalog: Arc<dyn Catalog>,
    ) -> Result<ClusterMember, ClusterError> {
        let meta = Arc::new(ClusterMeta::connect(cfg.etcd.clone())?);
        let cluster = meta.cluster_id()?;
        let registration = meta.register_node(node_info(&cfg, &store), cfg.node_ttl)?;
        let me = registration.id();
        let boot = registration.boot();
        tracing::info!(node = %cfg.name, id = me.0, boot, "joined the cluster");
        let router = Arc::new(Router(std::sync::OnceLock::new()));
        let peers = PeerNet::start(
            PeerConfig {
                cluster,
                me,
                boot,
                listen: cfg.peer_listen,
                connect_timeout: Duration::from_secs(1),
                max_queue_bytes: 256 << 20,
            },
            router.clone(),
        )?;
        // Before any replica driver runs (see `saved_logs`).
        let restored = match &cfg.log_dir {
            Some(dir) => saved_logs::take(dir, store.store_id()),
            None => HashMap::new(),
        };
        let resync_rate = cfg.timing.resync_rate;
        let inner = Arc::new(Inner {
            restored: Mutex::new(restored),
            open_sizes: Mutex::new(HashMap::new()),
            cfg,
            me,
            boot,
            clock: boottime_ms(),
            meta,
            registration: Mutex::new(Some(registration)),
            peers,
            store,
            catalog,
            records: RwLock::new(HashMap::new()),
            nodes: RwLock::new(Vec::new()),
            volumes: RwLock::new(Default::default()),
            replicas: Mutex::new(HashMap::new()),
            ticker: Ticker::start(Ticker::default_threads())
                .map_err(|e| ClusterError::Thread(e.to_string()))?,
            heartbeats: Mutex::new(Vec::new()),
            resync_share: Mutex::new(resync_rate),
            pending: Mutex::new(Pending::default()),
            coordinator_id: RwLock::new(None),
            coordinator: Mutex::new(None),
            watches: Mutex::new(Vec::new()),
            guards: Mutex::new(Vec::new()),
            stopping: std::sync::atomic::AtomicBool::new(false),
        });
        let _ = router.0.set(Arc::downgrade(&inner));
        let member = ClusterMember {
            inner,
            threads: Mutex::new(Vec::new()),
        };
        member.wire()?;
        Ok(member)
    }

    fn wire(&self) -> Result<(), ClusterError> {
        let inner = &self.inner;
        let weak = Arc::downgrade(inner);
        let w = weak.clone();
        let catalog_guard = inner.meta.watch_catalog(Box::new(move |name, record| {
            if let Some(inner) = w.upgrade() {
                let mut volumes = inner.volumes.write();
                match record {
                    Some(r) => volumes.insert(name.to_string(), r),
                    None => volumes.remove(name),
                };
            }
        }))?;
        let w = weak.clone();
        let nodes_guard = inner.meta.watch_nodes(Box::new(move |nodes| {
            if let Some(inner) = w.upgrade() {
                inner.on_nodes(nodes);
            }
        }))?;
        let w = weak.clone();
        let w2 = weak.clone();
        let records_guard = inner.meta.watch_memberships(
            Box::new(move |rec| {
                if let Some(inner) = w.upgrade() {
                    inner.on_record(rec);
                }
            }),
            Box::new(move |vol| {
                if let Some(inner) = w2.upgrade() {
                    inner.on_record_deleted(vol);
                }
            }),
        )?;
        let w = weak.clone();
        let election = {
            let reg = inner.registration.lock();
            let Some(reg) = reg.as_ref() else {
                return Err(ClusterError::Stopped);
            };
            inner.meta.campaign(
                reg,
                Box::new(move |elected| {
                    if let Some(inner) = w.upgrade() {
                        inner.on_election(elected);
                    }
                }),
            )?
        };
        inner
            .watches
            .lock()
            .extend([catalog_guard, nodes_guard, records_guard]);
        inner.guards.lock().push(Box::new(election));
        type Loop = fn(Weak<Inner>);
        let loops: [(&str, Loop); 2] = [
            ("cluster-housekeeping", housekeeping),
            ("heartbeat-sender", send_heartbeats),
        ];
        for (name, body) in loops {
            let w = weak.clone();
            let thread = std::thread::Builder::new()
                .name(name.into())
                .spawn(move || body(w))
                .map_err(|e| ClusterError::Thread(e.to_string()))?;
            self.threads.lock().push(thread);
        }
        Ok(())
    }

    /// This node's id in the cluster.
    pub fn id(&self) -> NodeId {
        self.inner.me
    }

    /// Every node known to the cluster.
    pub fn nodes(&self) -> Result<Vec<NodeStatus>, ClusterError> {
        Ok(self.inner.meta.nodes()?)
    }

    /// The cluster's metadata service (node states for drain/remove).
    pub fn meta(&self) -> &Arc<ClusterMeta> {
        &self.inner.meta
    }

    /// The name of the node that coordinates the cluster now.
    pub fn coordinator(&self) -> Result<Option<String>, ClusterError> {
        Ok(self.inner.meta.coordinator()?)
    }

    /// Leaves the cluster: stops the coordinator, every replica driver and
    /// the transport, saves the replicas' logs for the next start (see
    /// `saved_logs`), and revokes the node's liveness key.
    pub fn shutdown(&self) {
        let inner = &self.inner;
        inner
            .stopping
            .store(true, std::sync::atomic::Ordering::SeqCst);
        inner.guards.lock().clear();
        inner.watches.lock().clear();
        if let Some(c) = inner.coordinator.lock().take() {
            c.stop();
        }
        let replicas: Vec<(VolumeId, ReplicaHandle)> = inner.replicas.lock().drain().collect();
        let mut saved = Vec::new();
        for (vol, r) in replicas {
            if let Some(logs) = r.stop_for_restart() {
                saved.push((vol, logs));
            }
        }
        inner.save_logs(saved);
        for t in self.threads.lock().drain(..) {
            let _ = t.join();
        }
        inner.peers.shutdown();
        inner.registration.lock().take();
    }
}

impl Drop for ClusterMember {
    fn drop(&mut self) {
        if !self
            .inner
            .stopping
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            self.shutdown();
        }
    }
}

/// How long a replica's heartbeat waits for the node's others, at most.
const HEARTBEAT_BATCH: Duration = Duration::from_millis(10);

/// Sends the replicas' heartbeats to the coordinator together: one batch
/// (one system call, one wake-up of the coordinator's reader, answered with
/// one batch) per node every few milliseconds, however many replicas the
/// node holds. A heartbeat waits [`HEARTBEAT_BATCH`] at most; its lease
/// counts from when the replica stamped it (`sent_at`), so the wait only
/// eats into the lease's margin, and never extends it.
fn send_heartbeats(weak: Weak<Inner>) {
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
            for (vol, msg) in batch {
                if let Msg::Heartbeat { boot, sent_at } = msg {
                    let ack = responder.answer(&inner, inner.me, vol, boot, sent_at);
                    if let Some(ack) = ack {
                        inner.to_replica(vol, Event::Control(ack));
                    }
                }
            }
            continue;
        }
        let coordinator = *inner.coordinator_id.read();
        if let Some(c) = coordinator.filter(|c| *c != inner.me) {
            inner.peers.send_many(c, batch);
        }
    }
}

/// Periodic work: the coordinator's address, free capacity in the node
/// record, local replicas of deleted volumes.
fn housekeeping(weak: Weak<Inner>) {
    let mut last_info = Instant::now();
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
    }
}

impl Inner {
    /// Milliseconds since this member started, on CLOCK_BOOTTIME: the clock
    /// of leases (the replicas' and the coordinator's).
    pub(crate) fn now_ms(&self) -> u64 {
        boottime_ms().saturating_sub(self.clock)
    }

    /// Waits until this node's watched copies (catalog, nodes, records)
    /// hold every change up to etcd revision `revision`.
    fn caught_up(&self, revision: i64) -> Result<(), VolumeError> {
        let timeout = self.cfg.etcd.request_timeout;
        for w in self.watches.lock().iter() {
            if !w.wait_caught_up(revision, timeout) {
                return Err(VolumeError::Cluster(format!(
                    "metadata store unreachable: this node's view of etcd did not reach revision {revision} within {timeout:?}"
                )));
            }
        }
        Ok(())
    }

    pub(crate) fn timing(&self) -> &Timing {
        &self.cfg.timing
    }

    fn refresh_coordinator(&self) {
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

    /// Grows this node's copy of volume `id` from `from` to `to` bytes.
    fn grow_local_copy(&self, id: uuid::Uuid, from: u64, to: u64) -> Result<(), StoreError> {
        self.store.resize_volume(id, to)?;
        tracing::info!(volume = %id, from, to, "grew the local replica");
        Ok(())
    }

    fn publish_usage(&self) {
        let info = node_info(&self.cfg, &self.store);
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
            match self.store.delete_volume(id) {
                Ok(()) => {
                    tracing::info!(volume = %id, "deleted the local replica of a deleted volume");
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

    fn on_nodes(&self, nodes: Vec<NodeStatus>) {
        for n in &nodes {
            if n.id != self.me {
                self.peers.set_peer_addr(n.id, n.info.peer_addr);
            }
        }
        *self.nodes.write() = nodes;
    }

    fn on_election(self: &Arc<Self>, elected: bool) {
        let mut slot = self.coordinator.lock();
        if elected {
            if slot.is_none() {
                tracing::info!(node = %self.cfg.name, "became the cluster coordinator");
                *slot = CoordinatorTask::start(Arc::downgrade(self)).ok();
            }
        } else if let Some(task) = slot.take() {
            tracing::warn!(node = %self.cfg.name, "no longer the cluster coordinator");
            task.stop();
        }
        drop(slot);
        self.refresh_coordinator();
    }

    fn on_record(self: &Arc<Self>, rec: Membership) {
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
            h.stop();
        }
    }

    /// The volume was deleted: stop its replica; housekeeping frees the
    /// local copy once the catalog no longer has the volume.
    fn on_record_deleted(&self, vol: VolumeId) {
        self.records.write().remove(&vol);
        let handle = self.replicas.lock().remove(&vol);
        if let Some(h) = handle {
            tracing::info!(volume = %uuid_of(vol), "volume deleted: stopping its replica");
            h.stop();
        }
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
    fn save_logs(&self, logs: Vec<(VolumeId, SavedLogs)>) {
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
                self.store.create_volume(id, size)?;
                tracing::info!(volume = %record.name, %id, size, "created the local replica");
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
        };
        // A record that still is the volume's first one and carries this
        // boot describes a volume created while this process runs: every
        // replica is empty and session 0 is open. Anything else: learn the
        // role from the record (Idle until the coordinator has seen us).
        let fresh = rec.version == 1
            && rec
                .replicas
                .get(&self.me)
                .is_some_and(|r| r.boot == self.boot);
        let replica = Arc::new(Replica::new(
            ReplicaSpec {
                vol,
                me: self.me,
                boot: self.boot,
                cfg,
                initial: fresh.then(|| rec.clone()),
                saved,
            },
            local,
            Arc::new(Env(Arc::downgrade(self))),
            Duration::from_millis(t.heartbeat_ms.clamp(5, 1000) / 2),
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

    /// Frames that arrived together: each replica gets its share as one
    /// batch (so a secondary writes a burst of replicated writes with one
    /// device submission), in arrival order.
    fn on_peer_batch(&self, from: NodeId, batch: Vec<(VolumeId, Msg)>) {
        let mut by_volume: Vec<(VolumeId, Vec<Event>)> = Vec::new();
        let mut index: HashMap<VolumeId, usize> = HashMap::new();
        // Heartbeats are answered here, on the peer's reader (never behind
        // the coordinator's etcd writes), all answers to one batch in one
        // send.
        let mut acks: Vec<(VolumeId, Msg)> = Vec::new();
        let mut responder = None;
        for (vol, msg) in batch {
            let ev = match msg {
                Msg::ClientReq { id, req } => Event::Client {
                    id,
                    req,
                    origin: Origin::Node(from),
                },
                Msg::HeartbeatAck { .. } => Event::Control(msg),
                Msg::Heartbeat { boot, sent_at } => {
                    let r = responder.get_or_insert_with(|| {
                        self.coordinator.lock().as_ref().map(|c| c.responder())
                    });
                    if let Some(ack) = r
                        .as_ref()
                        .and_then(|r| r.answer(self, from, vol, boot, sent_at))
                    {
                        acks.push((vol, ack));
                    }
                    continue;
                }
                Msg::ClientReply { id, reply } => {
                    self.complete(id, reply);
                    continue;
                }
                msg => Event::Peer { from, msg },
            };
            match index.get(&vol) {
                Some(&i) => by_volume[i].1.push(ev),
                None => {
                    index.insert(vol, by_volume.len());
                    by_volume.push((vol, vec![ev]));
                }
            }
        }
        if !acks.is_empty() {
            self.peers.send_many(from, acks);
        }
        for (vol, events) in by_volume {
            match self.replica(vol) {
                Some(replica) => replica.deliver(events),
                None => {
                    for ev in events {
                        if let Event::Client { id, .. } = ev {
                            self.peers.send(
                                from,
                                vol,
                                Msg::ClientReply {
                                    id,
                                    reply: ClientReply::NotPrimary,
                                },
                            );
                        }
                    }
                }
            }
        }
    }

    fn replica(&self, vol: VolumeId) -> Option<Arc<Replica<Env>>> {
        self.replicas.lock().get(&vol).map(|h| h.replica.clone())
    }

    /// Delivers `ev` to the volume's local replica, on this thread.
    fn to_replica(&self, vol: VolumeId, ev: Event) {
        if let Some(replica) = self.replica(vol) {
            replica.deliver(vec![ev]);
        }
    }

    fn complete(&self, id: u64, reply: ClientReply) {
        let waiting = self.pending.lock().waiting.remove(&id);
        if let Some(w) = waiting {
            w.answer(reply);
        }
    }

    /// Opens of `rec`'s volume serve its recorded size from now on (it
    /// only grows).
    fn raise_open_size(&self, rec: &Membership) {
        if let Some(size) = self.open_sizes.lock().get(&rec.volume) {
            size.fetch_max(rec.blocks * BLOCK_SIZE, Ordering::Relaxed);
        }
    }

    /// `vol`'s primary is now `primary`: requests forwarded to another node
    /// are answered NotPrimary here, so their batch is sent again at once
    /// rather than after its attempt window (the old primary may be dead).
    fn redirect(&self, vol: VolumeId, primary: NodeId) {
        let mut p = self.pending.lock();
        let stale: Vec<u64> = p
            .waiting
            .iter()
            .filter(|(_, w)| w.forwarded.is_some_and(|(v, to)| v == vol && to != primary))
            .map(|(id, _)| *id)
            .collect();
        for id in stale {
            if let Some(w) = p.waiting.remove(&id) {
                w.answer(ClientReply::NotPrimary);
            }
        }
    }

    /// Sends client requests to the volume's primary; their replies arrive
    /// on the returned channel, tagged with the index given beside each
    /// request. Also returns the requests' ids. A local primary runs them on
    /// this thread, disk I/O included. `early` sees every reply first.
    fn submit(
        &self,
        vol: VolumeId,
        reqs: Vec<(usize, ClientReq)>,
        early: Option<&Arc<EarlyAck>>,
    ) -> (Vec<u64>, mpsc::Receiver<(usize, ClientReply)>) {
        let (tx, rx) = mpsc::sync_channel(reqs.len());
        let mut sent = Vec::with_capacity(reqs.len());
        let primary = self.records.read().get(&vol).map(|r| r.primary);
        let forwarded = primary.filter(|p| *p != self.me).map(|p| (vol, p));
        {
            let mut p = self.pending.lock();
            for (index, req) in reqs {
                p.next += 1;
                let id = p.next;
                let tx = tx.clone();
                p.waiting.insert(
                    id,
                    Waiting {
                        tx,
                        index,
                        forwarded,
                        early: early.cloned(),
                    },
                );
                sent.push((id, req));
            }
        }
        let ids = sent.iter().map(|(id, _)| *id).collect();
        match primary {
            Some(p) if p == self.me => match self.replica(vol) {
                Some(replica) => replica.deliver(
                    sent.into_iter()
                        .map(|(id, req)| Event::Client {
                            id,
                            req,
                            origin: Origin::Local,
                        })
                        .collect(),
                ),
                None => {
                    for (id, _) in sent {
                        self.complete(id, ClientReply::NotPrimary);
                    }
                }
            },
            Some(p) => {
                let msgs = sent
                    .into_iter()
                    .map(|(id, req)| Msg::ClientReq { id, req })
                    .collect();
                self.peers.send_batch(p, vol, msgs);
            }
            // Not placed yet: answer NotPrimary so the caller waits and
            // retries until the coordinator has placed the volume.
            None => {
                for (id, _) in sent {
                    self.complete(id, ClientReply::NotPrimary);
                }
            }
        }
        (ids, rx)
    }

    /// Drops the requests still waiting among `ids` (their replies, should
    /// they come, go nowhere).
    fn forget(&self, ids: &[u64]) {
        let mut p = self.pending.lock();
        for id in ids {
            p.waiting.remove(id);
        }
    }

    /// Runs `reqs` against the volume's primary, retrying across failovers
    /// until the request deadline; returns each request's read data.
    ///
    /// `request(i)` builds request `i` of `n` for each attempt, so a
    /// request's data is copied from the caller's buffer once per attempt
    /// and kept nowhere else. `ack`, given only for a batch of writes, is
    /// called if the first attempt succeeds, by the thread that brings its
    /// last reply (see [`EarlyAck`]).
    fn execute(
        &self,
        vol: VolumeId,
        n: usize,
        request: impl Fn(usize) -> ClientReq,
        ack: Option<&Arc<dyn WriteAck>>,
    ) -> Vec<Result<Option<Vec<u8>>, IoError>> {
        let deadline = Instant::now() + self.cfg.request_deadline;
        // A reply normally takes far less; past this the request (or its
        // reply) is assumed lost with a connection and is sent again.
        let attempt = Duration::from_secs(5);
        let mut results: Vec<Option<Result<Option<Vec<u8>>, IoError>>> =
            (0..n).map(|_| None).collect();
        let mut backoff = Duration::from_millis(20);
        let mut early = ack.map(|ack| Arc::new(EarlyAck::new(ack.clone(), n)));
        loop {
            let todo: Vec<(usize, ClientReq)> = (0..n)
                .filter(|i| results[*i].is_none())
                .map(|i| (i, request(i)))
                .collect();
            if todo.is_empty() {
                break;
            }
            let (ids, rx) = self.submit(vol, todo, early.as_ref());
            let mut unanswered = ids.len();
            let mut retry = false;
            // One attempt window for the whole batch: a batch sent to a dead
            // primary is retried after `attempt`, not after `attempt` per
            // request.
            let attempt_end = (Instant::now() + attempt).min(deadline);
            while unanswered > 0 {
                let wait = attempt_end.saturating_duration_since(Instant::now());
                match rx.recv_timeout(wait) {
                    Ok((i, ClientReply::Ok { data, .. })) => results[i] = Some(Ok(data)),
                    Ok((_, ClientReply::NotPrimary)) => retry = true,
                    Err(_) => {
                        self.forget(&ids);
                        retry = true;
                        break;
                    }
                }
                unanswered -= 1;
            }
            // Only the first attempt may be acknowledged early. Acknowledged
            // means every write succeeded, even those whose reply this
            // thread gave up waiting for a moment ago.
            if let Some(early) = early.take() {
                if early.close() {
                    for r in results.iter_mut().filter(|r| r.is_none()) {
                        *r = Some(Ok(None));
                    }
                    break;
                }
            }
            if retry {
                if Instant::now() >= deadline {
                    for r in results.iter_mut().filter(|r| r.is_none()) {
                        *r = Some(Err(IoError::Io(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "no primary answered before the request deadline",
                        ))));
                    }
                    break;
                }
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_millis(500));
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or(Err(IoError::Failed)))
            .collect()
    }
}

/// CLOCK_BOOTTIME in milliseconds. Leases are measured on it rather than on
/// CLOCK_MONOTONIC (`Instant`), which stops while the host is suspended: a
/// primary resumed after a suspend must find its lease expired, as the
/// coordinator on another host did.
fn boottime_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec. CLOCK_BOOTTIME exists on
    // every Linux since 2.6.39, and clock_gettime fails only for an unknown
    // clock id, so `ts` is always set.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// The replica drivers' view of the member.
struct Env(Weak<Inner>);

impl ReplicaEnv for Env {
    fn send_peer(&self, to: NodeId, vol: VolumeId, msgs: Vec<Msg>) {
        if let Some(inner) = self.0.upgrade() {
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
                    let ack = responder.answer(&inner, inner.me, vol, boot, sent_at);
                    if let (Some(ack), Some(replica)) = (ack, inner.replica(vol)) {
                        replica.post(Event::Control(ack));
                    }
                    return;
                }
                // Left for the heartbeat sender, which sends the node's
                // heartbeats to the coordinator together.
                inner
                    .heartbeats
                    .lock()
                    .push((vol, Msg::Heartbeat { boot, sent_at }));
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

/// A replicated volume's data path as frontends see it.
struct ClusterVolume {
    inner: Weak<Inner>,
    vol: VolumeId,
    /// Bytes clients may address, shared by every open of the volume on
    /// this node and raised when a record shows the volume grown (read per
    /// request: an atomic, no lock).
    size: Arc<AtomicU64>,
    /// Serialises read-modify-write of partial blocks.
    partial: Mutex<()>,
}

fn gone() -> IoError {
    IoError::Gone
}

fn op_len(op: &DataOp<'_>) -> u64 {
    match &op.kind {
        DataKind::Read(b) => b.len() as u64,
        DataKind::Write(b) => b.len() as u64,
    }
}

impl ClusterVolume {
    fn check(&self, offset: u64, len: u64) -> Result<(), IoError> {
        let size = self.size.load(Ordering::Relaxed);
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(IoError::OutOfRange { offset, len, size });
        }
        Ok(())
    }

    /// Writes `data` at a byte offset that need not be block aligned.
    fn write_unaligned(
        &self,
        inner: &Inner,
        offset: u64,
        data: &[u8],
        fua: bool,
    ) -> Result<(), IoError> {
        let _guard = self.partial.lock();
        let first = offset / BLOCK_SIZE;
        let end = (offset + data.len() as u64).div_ceil(BLOCK_SIZE);
        let read = inner.execute(
            self.vol,
            1,
            |_| ClientReq::Read {
                lba: first,
                blocks: end - first,
            },
            None,
        );
        let mut buf = match read.into_iter().next() {
            Some(Ok(Some(d))) => d,
            Some(Err(e)) => return Err(e),
            _ => return Err(IoError::Failed),
        };
        let at = (offset - first * BLOCK_SIZE) as usize;
        buf.get_mut(at..at + data.len())
            .ok_or(IoError::Failed)?
            .copy_from_slice(data);
        let w = inner.execute(
            self.vol,
            1,
            |_| ClientReq::Write {
                lba: first,
                data: buf.clone(),
                fua,
            },
            None,
        );
        w.into_iter()
            .next()
            .unwrap_or(Err(IoError::Failed))
            .map(|_| ())
    }

    /// [`BlockIo::submit`]; `ack` is passed on to the aligned round when
    /// that round is the whole batch and all writes (a refused op or a
    /// partial write, a read-modify-write of its own after the round, is
    /// answered outside it).
    fn run(&self, ops: &mut [DataOp<'_>], ack: Option<&Arc<dyn WriteAck>>) {
        let Some(inner) = self.inner.upgrade() else {
            for op in ops.iter_mut() {
                op.result = Err(gone());
            }
            return;
        };
        // Reads and aligned writes go out together; partial writes one at a
        // time (read-modify-write).
        let mut aligned = Vec::new();
        for (i, op) in ops.iter_mut().enumerate() {
            let len = op_len(op);
            if let Err(e) = self.check(op.offset, len) {
                op.result = Err(e);
                continue;
            }
            let is_aligned = op.offset.is_multiple_of(BLOCK_SIZE) && len.is_multiple_of(BLOCK_SIZE);
            if is_aligned || matches!(op.kind, DataKind::Read(_)) {
                aligned.push(i);
            }
        }
        let results = if aligned.is_empty() {
            Vec::new()
        } else {
            let ops = &*ops;
            let request = |k: usize| {
                let op = &ops[aligned[k]];
                let first = op.offset / BLOCK_SIZE;
                match &op.kind {
                    DataKind::Read(_) => ClientReq::Read {
                        lba: first,
                        blocks: (op.offset + op_len(op)).div_ceil(BLOCK_SIZE) - first,
                    },
                    DataKind::Write(d) => ClientReq::Write {
                        lba: first,
                        data: d.to_vec(),
                        fua: op.fua,
                    },
                }
            };
            let whole = aligned.len() == ops.len()
                && ops.iter().all(|op| matches!(op.kind, DataKind::Write(_)));
            inner.execute(self.vol, aligned.len(), request, ack.filter(|_| whole))
        };
        for (i, r) in aligned.into_iter().zip(results) {
            let op = &mut ops[i];
            let offset = op.offset;
            op.result = match (&mut op.kind, r) {
                (DataKind::Read(buf), Ok(Some(data))) => {
                    let at = (offset % BLOCK_SIZE) as usize;
                    match data.get(at..at + buf.len()) {
                        Some(src) => {
                            buf.copy_from_slice(src);
                            Ok(())
                        }
                        None => Err(IoError::Failed),
                    }
                }
                (DataKind::Read(_), Ok(None)) => Err(IoError::Failed),
                (DataKind::Write(_), Ok(_)) => Ok(()),
                (_, Err(e)) => Err(e),
            };
        }
        for op in ops.iter_mut() {
            if let DataKind::Write(d) = &op.kind {
                let len = d.len() as u64;
                let partial =
                    !op.offset.is_multiple_of(BLOCK_SIZE) || !len.is_multiple_of(BLOCK_SIZE);
                if partial && self.check(op.offset, len).is_ok() {
                    op.result = self.write_unaligned(&inner, op.offset, d, op.fua);
                }
            }
        }
    }
}

impl BlockIo for ClusterVolume {
    fn size(&self) -> u64 {
        self.size.load(Ordering::Relaxed)
    }

    fn submit(&self, ops: &mut [DataOp<'_>]) {
        self.run(ops, None);
    }

    fn submit_writes(&self, ops: &mut [DataOp<'_>], ack: &Arc<dyn WriteAck>) {
        self.run(ops, Some(ack));
    }

    fn flush(&self) -> Result<(), IoError> {
        let inner = self.inner.upgrade().ok_or_else(gone)?;
        inner
            .execute(self.vol, 1, |_| ClientReq::Flush, None)
            .into_iter()
            .next()
            .unwrap_or(Err(IoError::Failed))
            .map(|_| ())
    }

    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<(), IoError> {
        self.check(offset, len)?;
        const CHUNK: u64 = 1 << 20;
        let zeros = vec![0u8; CHUNK as usize];
        let mut at = offset;
        let end = offset + len;
        while at < end {
            // Up to the next chunk boundary, so middle chunks are aligned.
            let n = (CHUNK - at % CHUNK).min(end - at);
            let mut op = [DataOp::write(at, &zeros[..n as usize], fua)];
            self.submit(&mut op);
            let [op] = op;
            op.result?;
            at += n;
        }
        Ok(())
    }
}

fn state_name(s: ReplicaState) -> &'static str {
    match s {
        ReplicaState::InSync => "in-sync",
        ReplicaState::OutOfSync => "out-of-sync",
        ReplicaState::Faulty => "faulty",
    }
}

impl ClusterMember {
    /// Every node, and the bytes of volume sizes each holds replicas of.
    ///
    /// Volumes in the catalog that are not placed yet (created a moment ago,
    /// or waiting for room) count too, on the nodes the coordinator's rules
    /// would place them on now: a create checked right after another must
    /// leave room for it.
    fn provisioning(&self) -> Result<(Vec<NodeStatus>, HashMap<NodeId, u64>), VolumeError> {
        let unavailable = |e: &dyn std::fmt::Display| VolumeError::Cluster(e.to_string());
        // This node's watched copies, once they hold everything etcd had
        // when asked: a volume created or placed a moment ago through
        // another node counts even before it shows up here otherwise.
        let revision = self
            .inner
            .meta
            .current_revision()
            .map_err(|e| unavailable(&e))?;
        self.inner.caught_up(revision)?;
        let nodes = self.inner.nodes.read().clone();
        let catalog: Vec<VolumeRecord> = self.inner.volumes.read().values().cloned().collect();
        let records: Vec<Membership> = self.inner.records.read().values().cloned().collect();
        let mut load = Load::of(&records, &catalog);
        let coordinator = *self.inner.coordinator_id.read();
        let placed: std::collections::HashSet<VolumeId> =
            records.iter().map(|r| r.volume).collect();
        for v in &catalog {
            if placed.contains(&vol_of(v.id)) {
                continue;
            }
            let size = v.size_bytes;
            if let Some(p) = load.place(&nodes, size, wanted_replicas(v), coordinator) {
                load.add(&p, size);
            }
        }
        Ok((nodes, load.into_provisioned()))
    }
}

impl ClusterVolumes for ClusterMember {
    fn open(&self, record: &VolumeRecord) -> Result<Arc<dyn BlockIo>, VolumeError> {
        let vol = vol_of(record.id);
        let recorded = self
            .inner
            .records
            .read()
            .get(&vol)
            .map_or(0, |r| r.blocks * BLOCK_SIZE);
        let size = self.inner.open_sizes.lock().entry(vol).or_default().clone();
        size.fetch_max(record.size_bytes.max(recorded), Ordering::Relaxed);
        Ok(Arc::new(ClusterVolume {
            inner: Arc::downgrade(&self.inner),
            vol,
            size,
            partial: Mutex::new(()),
        }))
    }

    fn default_replicas(&self) -> u32 {
        let alive = self
            .inner
            .nodes
            .read()
            .iter()
            .filter(|n| n.alive && n.state == NodeState::Active)
            .count() as u32;
        if alive < 3 {
            tracing::warn!(
                nodes = alive,
                "fewer than 3 nodes: new volumes get one replica per node"
            );
        }
        alive.clamp(1, 3)
    }

    fn nodes(&self) -> Result<Vec<NodeView>, VolumeError> {
        let nodes = self
            .inner
            .meta
            .nodes()
            .map_err(|e| VolumeError::Cluster(e.to_string()))?;
        let coordinator = self.inner.meta.coordinator().ok().flatten();
        let records = self.inner.records.read();
        Ok(nodes
            .into_iter()
            .map(|n| NodeView {
                coordinator: coordinator.as_deref() == Some(n.info.name.as_str()),
                replicas: records
                    .values()
                    .filter(|r| r.replicas.contains_key(&n.id))
                    .count(),
                primaries: records.values().filter(|r| r.primary == n.id).count(),
                name: n.info.name,
                id: n.id.0,
                zone: n.info.zone,
                alive: n.alive,
                state: match n.state {
                    NodeState::Active => "active",
                    NodeState::Draining => "draining",
                    NodeState::Removed => "removed",
                }
                .to_string(),
                capacity_bytes: n.info.capacity_bytes,
                free_bytes: n.info.free_bytes,
                peer_addr: n.info.peer_addr.to_string(),
                nbd_addr: n.info.nbd_addr.map(|a| a.to_string()),
                nvme_addr: n.info.nvme_addr.map(|a| a.to_string()),
                api_addr: n.info.api_addr.map(|a| a.to_string()),
            })
            .collect())
    }

    fn lock_provisioning(&self) -> Result<ProvisioningGuard, VolumeError> {
        match self.inner.meta.lock_provisioning() {
            Ok(lock) => Ok(Box::new(lock)),
            Err(e) => Err(VolumeError::Cluster(format!(
                "cannot take the cluster's provisioning lock (another create or grow may be holding it; try again): {e}"
            ))),
        }
    }

    fn set_node_state(&self, name: &str, state: &str) -> Result<(), VolumeError> {
        let state = match state {
            "active" => NodeState::Active,
            "draining" => NodeState::Draining,
            "removed" => NodeState::Removed,
            other => return Err(VolumeError::InvalidNodeState(other.to_string())),
        };
        let known = self
            .inner
            .meta
            .nodes()
            .map_err(|e| VolumeError::Cluster(e.to_string()))?
            .iter()
            .any(|n| n.info.name == name);
        if !known {
            return Err(VolumeError::NoSuchNode(name.to_string()));
        }
        self.inner
            .meta
            .set_node_state(name, state)
            .map_err(|e| VolumeError::Cluster(e.to_string()))?;
        tracing::info!(node = name, ?state, "node state changed");
        Ok(())
    }

    fn replicas(&self, record: &VolumeRecord) -> Vec<ReplicaStatus> {
        let rec = self.inner.records.read().get(&vol_of(record.id)).cloned();
        let Some(rec) = rec else {
            return Vec::new();
        };
        let progress = self
            .inner
            .replica(rec.volume)
            .map(|r| r.resync_progress())
            .unwrap_or_default();
        let nodes = self.inner.nodes.read();
        let region_bytes = self.inner.cfg.timing.region_blocks * BLOCK_SIZE;
        rec.replicas
            .iter()
            .map(|(id, info)| ReplicaStatus {
                resync_percent: progress
                    .get(id)
                    .filter(|_| rec.primary == self.inner.me)
                    .map(|(left, total)| {
                        (100 * total.saturating_sub(*left) / (*total).max(1)).min(99) as u8
                    }),
                // Regions left × region size: the last region may be short.
                resync_remaining_bytes: progress
                    .get(id)
                    .filter(|_| rec.primary == self.inner.me)
                    .map(|(left, _)| {
                        (*left as u64)
                            .saturating_mul(region_bytes)
                            .min(record.size_bytes)
                    }),
                node: nodes
                    .iter()
                    .find(|n| n.id == *id)
                    .map_or_else(|| format!("node-{}", id.0), |n| n.info.name.clone()),
                primary: *id == rec.primary,
                state: state_name(info.state).to_string(),
                epoch: rec.epoch.0,
            })
            .collect()
    }

    fn check_create(
        &self,
        name: &str,
        size: u64,
        replicas: u32,
        allow_degraded: bool,
    ) -> Result<(), VolumeError> {
        let (nodes, provisioned) = self.provisioning()?;
        // Nodes that may take replicas, up or down: a node that is down now
        // still counts, so a create while a node is away succeeds.
        let active: Vec<_> = nodes
            .iter()
            .filter(|n| n.state == NodeState::Active)
            .collect();
        let wanted = replicas as usize;
        if wanted > active.len() && !allow_degraded {
            return Err(VolumeError::TooFewNodes {
                volume: name.to_string(),
                replicas: wanted,
                nodes: active.len(),
                quorum: default_min_in_sync(wanted).min(active.len()).max(1),
            });
        }
        let with_room = active
            .iter()
            .filter(|n| {
                placement::node_has_room(&provisioned, n.id, n.info.provision_limit(), size)
            })
            .count();
        let needed = (replicas as usize).min(active.len()).max(1);
        if with_room < needed {
            return Err(VolumeError::ClusterFull {
                volume: name.to_string(),
                size,
                replicas: needed,
                with_room,
                nodes: active.len(),
            });
        }
        Ok(())
    }

    fn check_grow(&self, record: &VolumeRecord, size: u64) -> Result<(), VolumeError> {
        let growth = size.saturating_sub(record.size_bytes);
        let vol = vol_of(record.id);
        let Some(rec) = self.inner.records.read().get(&vol).cloned() else {
            // Not placed yet: placement takes the catalog's (new) size.
            return Ok(());
        };
        if growth == 0 {
            return Ok(());
        }
        let (nodes, provisioned) = self.provisioning()?;
        for n in rec.replicas.keys() {
            let Some(node) = nodes.iter().find(|x| x.id == *n) else {
                continue;
            };
            let limit = node.info.provision_limit();
            let have = provisioned.get(n).copied().unwrap_or(0);
            if !placement::has_room(have, limit, growth) {
                return Err(VolumeError::ReplicaNodeFull {
                    node: node.info.name.clone(),
                    volume: record.name.clone(),
                    requested: growth,
                    provisioned: have,
                    limit,
                });
            }
        }
        Ok(())
    }

    fn grow(&self, record: &VolumeRecord, size: u64) -> Result<(), VolumeError> {
        let vol = vol_of(record.id);
        let blocks = size / BLOCK_SIZE;
        let failed = |e: &dyn std::fmt::Display| VolumeError::Cluster(e.to_string());
        for _ in 0..10 {
            let Some(cur) = self.inner.meta.membership(vol).map_err(|e| failed(&e))? else {
                return Ok(()); // not placed yet: placed at the catalog's size
            };
            if cur.blocks >= blocks {
                return Ok(());
            }
            let want = cur.clone().with_blocks(blocks);
            match self
                .inner
                .meta
                .cas_membership(cur.version, want)
                .map_err(|e| failed(&e))?
            {
                CasOutcome::Applied(rec) => {
                    tracing::info!(volume = %record.name, blocks, version = rec.version,
                        "volume size recorded for its replicas");
                    // This node's replica learns it now, the others at their
                    // next poll of the records.
                    self.inner.on_record(rec);
                    return Ok(());
                }
                CasOutcome::Conflict(_) => continue,
                CasOutcome::Invalid(reason) => return Err(VolumeError::Cluster(reason)),
                CasOutcome::Missing => return Ok(()),
            }
        }
        Err(VolumeError::Cluster(format!(
            "the membership record of {} changed too often to record its new size; the coordinator will",
            record.name
        )))
    }

    fn is_local_primary(&self, id: uuid::Uuid) -> Option<bool> {
        let records = self.inner.records.read();
        let rec = records.get(&vol_of(id))?;
        if rec.replicas.is_empty() {
            return None;
        }
        Some(rec.primary == self.inner.me)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[derive(Default)]
    struct Counted(AtomicUsize);

    impl WriteAck for Counted {
        fn acknowledge(&self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn batch(writes: usize) -> (Arc<Counted>, EarlyAck) {
        let counted = Arc::new(Counted::default());
        let ack: Arc<dyn WriteAck> = counted.clone();
        (counted, EarlyAck::new(ack, writes))
    }

    #[test]
    fn a_batch_is_acknowledged_once_by_its_last_success() {
        let (counted, early) = batch(3);
        early.reply(true);
        early.reply(true);
        assert_eq!(counted.0.load(Ordering::SeqCst), 0);
        early.reply(true);
        assert_eq!(counted.0.load(Ordering::SeqCst), 1);
        // A duplicate reply (a retransmission answered twice) changes nothing.
        early.reply(true);
        assert!(early.close());
        assert_eq!(counted.0.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_failed_write_or_a_closed_batch_is_never_acknowledged() {
        let (counted, early) = batch(2);
        early.reply(false);
        early.reply(true);
        early.reply(true);
        assert!(!early.close());
        assert_eq!(counted.0.load(Ordering::SeqCst), 0);

        // The submitter gave up on the first attempt: late replies go
        // nowhere, and the retry's replies are the submitter's to send.
        let (counted, early) = batch(1);
        assert!(!early.close());
        early.reply(true);
        assert_eq!(counted.0.load(Ordering::SeqCst), 0);
    }
}
