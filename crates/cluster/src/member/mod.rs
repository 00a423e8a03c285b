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

mod admin;
mod batches;
mod clients;
mod compare;
mod config;
mod housekeeping;
mod layers;
mod lifecycle;
mod rmw;
mod routing;
mod snapshot_io;
mod volume_io;

pub use config::{MemberConfig, Timing};

use crate::coordinator::{self, CoordinatorTask};
use crate::meta::{ClusterMeta, NodeInfo, NodeStatus, Registration, WatchGuard};
use crate::peer::{PeerConfig, PeerHandler, PeerNet};
use crate::saved_logs;
use crate::ticker::Ticker;
use crate::ClusterError;
use basalt_catalog::{Catalog, VolumeRecord};
use basalt_replication::{Membership, Msg, NodeId, SavedLogs, VolumeId};
use basalt_store::Store;
use basalt_volume::VolumeError;
use batches::{retry_batches, Pending, Retries};
pub use clients::DisconnectListener;
use clients::{publish_clients, OpenClients};
use housekeeping::{housekeeping, send_heartbeats};
use lifecycle::{Env, ReplicaHandle};
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;
use volume_io::ClusterVolume;

pub(crate) struct Inner {
    cfg: MemberConfig,
    me: NodeId,
    boot: u64,
    /// CLOCK_BOOTTIME at start, in milliseconds (see [`boottime_ms`]).
    clock: u64,
    meta: Arc<ClusterMeta>,
    registration: Mutex<Option<Registration>>,
    peers: PeerNet,
    store: Arc<Store>,
    catalog: Arc<dyn Catalog>,
    records: RwLock<HashMap<VolumeId, Membership>>,
    nodes: RwLock<Vec<NodeStatus>>,
    /// The catalog's volume records by name, as the catalog watch last
    /// saw them.
    volumes: RwLock<std::collections::BTreeMap<String, VolumeRecord>>,
    /// Told of every volume record the catalog watch delivers (e.g. the
    /// volume service, to apply a QoS change made through another node).
    record_listeners: RwLock<Vec<RecordListener>>,
    /// The opens of replicated volumes on this node (`clients.rs`).
    open_clients: Arc<OpenClients>,
    /// Told of other nodes' requests to drop a volume's clients here (the
    /// volume service: `ClusterMember::on_disconnect_request`).
    disconnect_listeners: RwLock<Vec<DisconnectListener>>,
    replicas: Mutex<HashMap<VolumeId, ReplicaHandle>>,
    /// Drives every replica's clock on a fixed set of threads.
    ticker: Ticker,
    /// The replicas' heartbeats to a coordinator on another node, until
    /// the heartbeat sender sends them as one batch.
    heartbeats: Mutex<Vec<coordinator::Heartbeat>>,
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
    /// Batches to send again after a backoff (`batches.rs`).
    retries: Retries,
    /// The coordinator's node id as last looked up.
    coordinator_id: RwLock<Option<NodeId>>,
    coordinator: Mutex<Option<CoordinatorTask>>,
    /// The watches of the catalog, the node registry and the membership
    /// records, in that order (kept alive here; see `caught_up`).
    watches: Mutex<Vec<WatchGuard>>,
    /// Keeps the campaign alive.
    guards: Mutex<Vec<Box<dyn std::any::Any + Send>>>,
    stopping: std::sync::atomic::AtomicBool,
    /// Reads this node's primaries asked of an in-sync replica because
    /// their own copy failed its checksum (read repair).
    read_repairs: AtomicU64,
    /// Replica compares: regions found differing (asked for and
    /// background), and complete background passes.
    compare_differing: AtomicU64,
    compare_passes: AtomicU64,
    /// The client addresses the frontends were bound to, once known
    /// ([`ClusterMember::set_client_addrs`]): published instead of the
    /// configured ones (which may name port 0).
    client_addrs: Mutex<Option<ClientAddrs>>,
}

/// Where clients reach this node: NBD over TCP (if offered), NVMe/TCP,
/// iSCSI and the API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientAddrs {
    pub nbd: Option<std::net::SocketAddr>,
    pub nvme: Option<std::net::SocketAddr>,
    pub iscsi: Option<std::net::SocketAddr>,
    pub api: Option<std::net::SocketAddr>,
}

/// See [`ClusterMember::on_volume_record`].
pub type RecordListener = Box<dyn Fn(&VolumeRecord) + Send + Sync>;

/// A running cluster member; see the module docs.
pub struct ClusterMember {
    inner: Arc<Inner>,
    /// Housekeeping and the heartbeat sender.
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// What this node publishes about itself in the registry: the client
/// addresses bound (`bound`) once known, else the configured ones.
fn node_info(cfg: &MemberConfig, store: &Store, bound: Option<ClientAddrs>) -> NodeInfo {
    let usage = store.usage();
    let addrs = bound.unwrap_or(ClientAddrs {
        nbd: cfg.nbd_addr,
        nvme: cfg.nvme_addr,
        iscsi: cfg.iscsi_addr,
        api: cfg.api_addr,
    });
    NodeInfo {
        name: cfg.name.clone(),
        peer_addr: cfg.peer_advertise.unwrap_or(cfg.peer_listen),
        nbd_addr: addrs.nbd,
        nvme_addr: addrs.nvme,
        iscsi_addr: addrs.iscsi,
        api_addr: addrs.api,
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
        let registration = meta.register_node(node_info(&cfg, &store, None), cfg.node_ttl)?;
        let me = registration.id();
        let boot = registration.boot();
        tracing::info!(node = %cfg.name, id = me.0, boot, "joined the cluster");
        let router = Arc::new(Router(std::sync::OnceLock::new()));
        let peers = PeerNet::start(
            PeerConfig {
                cluster,
                secret: cfg.secret.clone(),
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
            record_listeners: RwLock::new(Vec::new()),
            open_clients: Arc::new(OpenClients::default()),
            disconnect_listeners: RwLock::new(Vec::new()),
            replicas: Mutex::new(HashMap::new()),
            ticker: Ticker::start(Ticker::default_threads())
                .map_err(|e| ClusterError::Thread(e.to_string()))?,
            heartbeats: Mutex::new(Vec::new()),
            resync_share: Mutex::new(resync_rate),
            pending: Mutex::new(Pending::default()),
            retries: Retries::default(),
            coordinator_id: RwLock::new(None),
            coordinator: Mutex::new(None),
            watches: Mutex::new(Vec::new()),
            guards: Mutex::new(Vec::new()),
            stopping: std::sync::atomic::AtomicBool::new(false),
            read_repairs: AtomicU64::new(0),
            compare_differing: AtomicU64::new(0),
            compare_passes: AtomicU64::new(0),
            client_addrs: Mutex::new(None),
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
        inner
            .store
            .on_scrub_pass(Arc::new(move |id, rate, damaged| {
                if let Some(inner) = w.upgrade() {
                    inner.compare_after_scrub(id, rate, damaged);
                }
            }));
        let w = weak.clone();
        let catalog_guard = inner.meta.watch_catalog(Box::new(move |name, record| {
            if let Some(inner) = w.upgrade() {
                if let Some(r) = &record {
                    for listener in inner.record_listeners.read().iter() {
                        listener(r);
                    }
                }
                let mut volumes = inner.volumes.write();
                // A retype may change the codec of a volume with a replica
                // here: its store's compactor follows at once.
                let recoded = record.as_ref().and_then(|r| {
                    let old = volumes.get(name)?;
                    (old.compression != r.compression).then(|| vol_of(r.id))
                });
                match record {
                    Some(r) => volumes.insert(name.to_string(), r),
                    None => volumes.remove(name),
                };
                drop(volumes);
                if let Some(vol) = recoded {
                    if inner.replicas.lock().contains_key(&vol) {
                        inner.apply_compression(vol);
                    }
                }
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
        let w = weak.clone();
        let disconnects = inner.meta.watch_disconnect_requests(Box::new(move |vol| {
            if let Some(inner) = w.upgrade() {
                inner.on_disconnect_request(vol);
            }
        }))?;
        inner.guards.lock().push(Box::new(disconnects));
        type Loop = fn(Weak<Inner>);
        let loops: [(&str, Loop); 4] = [
            ("cluster-housekeeping", housekeeping),
            ("cluster-retries", retry_batches),
            ("heartbeat-sender", send_heartbeats),
            ("cluster-clients", publish_clients),
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
    /// Calls `listener` with every volume record the catalog watch
    /// delivers from now on (created or changed, through any node), on the
    /// watch's thread: it must not block.
    pub fn on_volume_record(&self, listener: RecordListener) {
        self.inner.record_listeners.write().push(listener);
    }

    /// Calls `listener` with the name of each volume another node asks
    /// this one to drop the clients of (`volume disconnect`, a forced
    /// rollback or delete through that node), on a thread of its own: it
    /// may wait for the connections to close.
    pub fn on_disconnect_request(&self, listener: DisconnectListener) {
        self.inner.disconnect_listeners.write().push(listener);
    }

    pub fn id(&self) -> NodeId {
        self.inner.me
    }

    /// The addresses the frontends were bound to: published in the node
    /// registry from now on (at once), in place of the configured ones,
    /// which name port 0 when the operating system picks the port.
    pub fn set_client_addrs(&self, addrs: ClientAddrs) {
        *self.inner.client_addrs.lock() = Some(addrs);
        self.inner.publish_usage();
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
        // The clients publisher sleeps on this; it sees `stopping` now.
        inner.open_clients.wake();
        inner.retries.wake();
        for t in self.threads.lock().drain(..) {
            let _ = t.join();
        }
        // Batches started after the retrier left complete (failed) now.
        inner.abandon_batches();
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
}

/// The coordinator task runs on this node through this narrow view of it.
impl coordinator::Host for Inner {
    fn meta(&self) -> &ClusterMeta {
        &self.meta
    }

    fn node(&self) -> NodeId {
        self.me
    }

    fn now_ms(&self) -> u64 {
        Inner::now_ms(self)
    }

    fn settings(&self) -> coordinator::Settings {
        let t = &self.cfg.timing;
        coordinator::Settings {
            lease_ms: t.lease_ms,
            grace_ms: t.grace_ms,
            heartbeat_ms: t.heartbeat_ms,
            replace_after: t.replace_after,
        }
    }

    fn nodes(&self) -> Vec<NodeStatus> {
        self.nodes.read().clone()
    }

    fn with_records(&self, f: &mut dyn FnMut(&HashMap<VolumeId, Membership>)) {
        f(&self.records.read())
    }

    fn volumes(&self) -> Vec<VolumeRecord> {
        self.volumes.read().values().cloned().collect()
    }

    fn catalog_caught_up(&self, revision: i64) -> bool {
        // The catalog's watch is the first (see `watches`).
        let timeout = self
            .cfg
            .etcd
            .request_timeout
            .min(Duration::from_millis(500));
        self.watches
            .lock()
            .first()
            .is_some_and(|w| w.wait_caught_up(revision, timeout))
    }
}
