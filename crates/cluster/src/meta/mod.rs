//! The cluster's metadata in etcd: node registry with liveness leases,
//! membership records with compare-and-swap, and the coordinator election.
//!
//! Key layout under the configured prefix `P` (default `/basalt/`, shared
//! with the catalog's `P/volumes/<name>`):
//! - `P/cluster/id` — the cluster id (16 bytes as 32 hex digits), put-if-absent;
//! - `P/cluster/next-node-id` — the last node id handed out;
//! - `P/nodes/<name>` — a node's record (JSON: id, boot, state, info);
//! - `P/alive/<name>` — present while the node's lease is kept alive;
//! - `P/membership/<volume uuid>` — a volume's membership record (JSON);
//! - `P/coordinator` — the elected coordinator's name, bound to its lease;
//! - `P/locks/provisioning` — etcd's lock service's name for the lock that
//!   serialises creates and grows ([`ClusterMeta::lock_provisioning`]).
//!
//! Invariants:
//! - a node name keeps its id for ever; its boot grows by one at every
//!   registration (both changed only in transactions on the record's
//!   `mod_revision`);
//! - a membership record changes only through [`ClusterMeta::cas_membership`]:
//!   one transaction comparing the key's `mod_revision` with the one whose
//!   `version` was checked, applying `Membership::check_change`;
//! - every write of the coordinator (record changes, creates, deletes) is
//!   fenced by its [`CoordinatorTerm`]: the same transaction compares the
//!   coordinator key's create revision with the term, so a coordinator that
//!   lost its role without noticing (a paused process) changes nothing; a
//!   delete also compares the record's `mod_revision` with the one the
//!   coordinator decided from;
//! - at most one `P/coordinator` key exists (created only if absent), and it
//!   disappears when its holder's lease ends;
//! - no call waits longer than the request timeout.
//!
//! Node, membership and catalog changes arrive by etcd watches that resume
//! from their last revision after a broken stream and list again only
//! after a compaction (`watch`): idle, they cost etcd nothing per record.
//!
//! Threading: a small tokio runtime (one worker) keeps etcd-client's
//! connections; calls from any thread run on it and are waited for on a std
//! channel, as in `basalt_catalog::EtcdCatalog`.

mod clients;
mod core;
mod watch;

pub use clients::{EntryOwner, DISCONNECT_REQUEST_TTL};

use self::core::Core;
use basalt_catalog::VolumeRecord;
use basalt_replication::{Membership, NodeId, VolumeId};
use etcd_client::{Client, Compare, CompareOp, ConnectOptions, LockOptions, Txn, TxnOp};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

pub use basalt_catalog::EtcdConfig;

/// Why a metadata call failed.
#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    #[error("metadata store unreachable: etcd at {endpoints} did not answer for {key:?} within {timeout:?}")]
    Timeout {
        endpoints: String,
        key: String,
        timeout: Duration,
    },
    #[error("{}", basalt_catalog::describe_request_failure(endpoints, key, source))]
    Request {
        endpoints: String,
        key: String,
        #[source]
        source: etcd_client::Error,
    },
    #[error("invalid cluster metadata configuration: {0}")]
    Config(String),
    #[error("cluster metadata {key:?} in etcd is unreadable: {reason}")]
    Corrupt { key: String, reason: String },
    #[error("node {0:?} was removed from the cluster and may not rejoin under that name")]
    NodeRemoved(String),
    #[error("no node named {0:?} in the cluster")]
    UnknownNode(String),
    #[error("{0:?} changed concurrently too often; giving up")]
    Contention(String),
    #[error("no longer the coordinator: the election key is not at revision {0} any more")]
    Fenced(i64),
    #[error("cluster metadata client failed: {0}")]
    Internal(String),
}

/// What a node tells the cluster about itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub name: String,
    pub peer_addr: SocketAddr,
    pub nbd_addr: Option<SocketAddr>,
    pub nvme_addr: Option<SocketAddr>,
    /// The iSCSI portal (None: published by an older version).
    #[serde(default)]
    pub iscsi_addr: Option<SocketAddr>,
    pub api_addr: Option<SocketAddr>,
    pub zone: Option<String>,
    pub capacity_bytes: u64,
    pub free_bytes: u64,
    /// Bytes of volume sizes the node may hold: capacity × its overcommit
    /// ratio (None: published by an older version).
    #[serde(default)]
    pub provision_limit_bytes: Option<u64>,
}

impl NodeInfo {
    /// Bytes of volume sizes the node may hold (an older node that did not
    /// publish its limit gets the default overcommit ratio).
    pub fn provision_limit(&self) -> u64 {
        self.provision_limit_bytes.unwrap_or(
            (self.capacity_bytes as f64 * basalt_volume::DEFAULT_OVERCOMMIT_RATIO) as u64,
        )
    }
}

/// A node's administrative state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeState {
    Active,
    Draining,
    Removed,
}

/// A node as the registry knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeStatus {
    pub id: NodeId,
    pub info: NodeInfo,
    pub state: NodeState,
    pub alive: bool,
    pub boot: u64,
}

/// The coordinator role as this node won it: the election key's create
/// revision, which fences every write of its tenure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoordinatorTerm(pub i64);

/// The outcome of [`ClusterMeta::cas_membership`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CasOutcome {
    Applied(Membership),
    Conflict(Membership),
    Invalid(String),
    Missing,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct NodeRecord {
    id: NodeId,
    boot: u64,
    state: NodeState,
    info: NodeInfo,
}

fn corrupt(key: &str, e: impl std::fmt::Display) -> MetaError {
    MetaError::Corrupt {
        key: key.to_string(),
        reason: e.to_string(),
    }
}

/// Told of a catalog change: the volume's name and its record (None:
/// deleted).
pub type OnVolume = Box<dyn Fn(&str, Option<VolumeRecord>) + Send + Sync>;

/// One compare-and-swap of a membership record, runnable on the runtime;
/// see [`ClusterMeta::cas_membership`].
struct CasJob {
    key: String,
    full: String,
    err: Box<dyn Fn(etcd_client::Error) -> MetaError + Send + Sync>,
    /// The coordinator's fence, its key and term.
    fence: Option<(Compare, String, CoordinatorTerm)>,
    expected: u64,
    rec: Membership,
}

impl CasJob {
    async fn run(self, mut c: Client) -> Result<CasOutcome, MetaError> {
        let CasJob {
            key,
            full,
            err,
            fence,
            expected,
            mut rec,
        } = self;
        for _ in 0..10 {
            let resp = c.get(full.clone(), None).await.map_err(&err)?;
            let Some(kv) = resp.kvs().first() else {
                return Ok(CasOutcome::Missing);
            };
            let rev = kv.mod_revision();
            let cur: Membership =
                serde_json::from_slice(kv.value()).map_err(|e| corrupt(&key, e))?;
            if cur.version != expected {
                return Ok(CasOutcome::Conflict(cur));
            }
            if let Err(e) = cur.check_change(&rec) {
                return Ok(CasOutcome::Invalid(e.to_string()));
            }
            rec.version = expected + 1;
            let json = serde_json::to_vec(&rec).map_err(|e| corrupt(&key, e))?;
            let mut when = vec![Compare::mod_revision(full.clone(), CompareOp::Equal, rev)];
            when.extend(fence.as_ref().map(|(f, _, _)| f.clone()));
            let txn = Txn::new()
                .when(when)
                .and_then(vec![TxnOp::put(full.clone(), json, None)]);
            if c.txn(txn).await.map_err(&err)?.succeeded() {
                return Ok(CasOutcome::Applied(rec));
            }
            if let Some((_, coordinator_key, term)) = &fence {
                let resp = c.get(coordinator_key.clone(), None).await.map_err(&err)?;
                if resp.kvs().first().map(|kv| kv.create_revision()) != Some(term.0) {
                    return Err(MetaError::Fenced(term.0));
                }
            }
            // The key changed between the read and the transaction: read
            // again (it is a conflict unless only its bytes were rewritten).
        }
        Err(MetaError::Contention(key))
    }
}

/// The node list from the registry's records (`(key, JSON)`) and the keys
/// of the liveness leases (`alive_prefix` + name), by id.
fn node_list<'a>(
    records: impl Iterator<Item = (&'a str, &'a [u8])>,
    alive_keys: impl Iterator<Item = &'a str>,
    alive_prefix: &str,
) -> Result<Vec<NodeStatus>, MetaError> {
    let alive: std::collections::HashSet<&str> = alive_keys
        .filter_map(|k| k.strip_prefix(alive_prefix))
        .collect();
    let mut out = Vec::new();
    for (k, v) in records {
        let r: NodeRecord = serde_json::from_slice(v).map_err(|e| corrupt(k, e))?;
        out.push(NodeStatus {
            id: r.id,
            alive: alive.contains(r.info.name.as_str()),
            info: r.info,
            state: r.state,
            boot: r.boot,
        });
    }
    out.sort_by_key(|n| n.id);
    Ok(out)
}

fn vol_key(vol: VolumeId) -> String {
    format!("membership/{}", uuid::Uuid::from_u128(vol.0))
}

/// The cluster's metadata service; see the module docs.
#[derive(Clone)]
pub struct ClusterMeta {
    core: Arc<Core>,
    /// When etcd last confirmed that this node holds the coordinator role
    /// (the time the confirming keep-alive was sent); None while not held.
    role_confirmed: Arc<parking_lot::Mutex<Option<std::time::Instant>>>,
    /// The term of the role this node holds (None while not held).
    role_term: Arc<parking_lot::Mutex<Option<CoordinatorTerm>>>,
}

/// The coordinator key's lease.
const COORDINATOR_TTL: Duration = Duration::from_secs(3);

/// How often a coordinator whose role etcd has not confirmed lately asks
/// again (an etcd outage ends within this of etcd answering).
const RECONFIRM_RETRY: Duration = Duration::from_millis(200);

/// The provisioning lock's lease: what a holder that dies keeps the lock
/// for. Holders keep it for a few etcd round trips.
const PROVISIONING_LOCK_TTL: Duration = Duration::from_secs(10);

/// Held while a create or grow checks the nodes' provisioning limits and
/// records its outcome, so that two of them through different nodes cannot
/// both pass a check only one of them fits. Released when dropped (its
/// lease is revoked), or by etcd when the lease runs out.
pub struct ProvisioningLock {
    core: Arc<Core>,
    lease: i64,
}

impl Drop for ProvisioningLock {
    fn drop(&mut self) {
        self.core.revoke(self.lease);
    }
}

/// This node's registration; see [`ClusterMeta::register_node`].
pub struct Registration {
    name: String,
    id: NodeId,
    boot: u64,
    /// The liveness lease now (the keeper replaces one that expired; 0
    /// once abandoned): what this node's own entries are bound to.
    lease: Arc<AtomicI64>,
    lost: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    keeper: Option<JoinHandle<()>>,
    core: Arc<Core>,
}

impl Registration {
    pub fn id(&self) -> NodeId {
        self.id
    }
    pub fn boot(&self) -> u64 {
        self.boot
    }
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Whether keeping the liveness lease alive failed (the node shows as
    /// down until it succeeds again).
    pub fn lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }
    /// Stops the keep-alive without revoking the lease, as if the process
    /// had been killed (tests).
    pub fn abandon(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.keeper.take() {
            let _ = t.join();
        }
        self.lease.store(0, Ordering::SeqCst);
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.keeper.take() {
            let _ = t.join();
        }
        let lease = self.lease.load(Ordering::SeqCst);
        if lease != 0 {
            self.core.revoke(lease);
        }
    }
}

/// Stops a watch or a campaign when dropped.
pub struct WatchGuard {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// A watch's progress (None: a campaign).
    progress: Option<Arc<watch::Progress>>,
}

impl WatchGuard {
    /// Waits until the watch has handed its owner every change up to etcd
    /// revision `revision` (from [`ClusterMeta::current_revision`]);
    /// whether it did within `timeout`. False for a campaign.
    pub fn wait_caught_up(&self, revision: i64, timeout: Duration) -> bool {
        self.progress
            .as_ref()
            .is_some_and(|p| p.wait_for(revision, timeout))
    }
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

/// The coordinator campaign; dropping it resigns.
pub type ElectionGuard = WatchGuard;

/// Sleeps `total` in small steps; false if `stop` was set meanwhile.
fn nap(stop: &AtomicBool, total: Duration) -> bool {
    let step = Duration::from_millis(50);
    let mut left = total;
    while !left.is_zero() {
        if stop.load(Ordering::SeqCst) {
            return false;
        }
        let d = left.min(step);
        std::thread::sleep(d);
        left -= d;
    }
    !stop.load(Ordering::SeqCst)
}

fn spawn_loop(
    name: &str,
    f: impl FnMut(&AtomicBool) + Send + 'static,
) -> Result<WatchGuard, MetaError> {
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let mut f = f;
    let thread = std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || f(&s))
        .map_err(|e| MetaError::Internal(format!("cannot start a thread: {e}")))?;
    Ok(WatchGuard {
        stop,
        thread: Some(thread),
        progress: None,
    })
}

impl ClusterMeta {
    pub fn connect(cfg: EtcdConfig) -> Result<ClusterMeta, MetaError> {
        if cfg.endpoints.is_empty() {
            return Err(MetaError::Config("no etcd endpoint given".into()));
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("cluster-meta")
            .enable_all()
            .build()
            .map_err(|e| MetaError::Internal(format!("cannot start a runtime: {e}")))?;
        let endpoints = cfg.endpoints.join(",");
        let options = ConnectOptions::new()
            .with_connect_timeout(cfg.connect_timeout)
            .with_timeout(cfg.request_timeout);
        let eps = cfg.endpoints.clone();
        let client = runtime
            .block_on(async move {
                tokio::time::timeout(cfg.request_timeout, Client::connect(eps, Some(options))).await
            })
            .map_err(|_| MetaError::Timeout {
                endpoints: endpoints.clone(),
                key: "connect".into(),
                timeout: cfg.request_timeout,
            })?
            .map_err(|source| MetaError::Request {
                endpoints: endpoints.clone(),
                key: "connect".into(),
                source,
            })?;
        let handle = runtime.handle().clone();
        Ok(ClusterMeta {
            role_confirmed: Default::default(),
            role_term: Default::default(),
            core: Arc::new(Core {
                client,
                prefix: cfg.prefix,
                endpoints,
                timeout: cfg.request_timeout,
                handle,
                runtime: parking_lot::Mutex::new(Some(runtime)),
            }),
        })
    }

    /// Waits (up to the request timeout) for the cluster's provisioning
    /// lock, through etcd's lock service.
    pub fn lock_provisioning(&self) -> Result<ProvisioningLock, MetaError> {
        let lease = self.core.grant(PROVISIONING_LOCK_TTL)?;
        let key = self.core.key("locks/provisioning");
        let err = self.core.request_error(&key);
        let name = key.clone();
        let locked = self.core.call(&key, move |mut c| async move {
            c.lock(name, Some(LockOptions::new().with_lease(lease)))
                .await
                .map_err(&err)?;
            Ok(())
        });
        // From here the lease is released either way: by the guard, or now
        // (which also withdraws a lock request still waiting in etcd).
        let lock = ProvisioningLock {
            core: self.core.clone(),
            lease,
        };
        locked.map(|()| lock)
    }

    /// The cluster's id, created by whichever node asks first.
    pub fn cluster_id(&self) -> Result<[u8; 16], MetaError> {
        let key = "cluster/id";
        for _ in 0..2 {
            if let Some((v, _)) = self.core.get(key)? {
                let text = String::from_utf8_lossy(&v).into_owned();
                return uuid::Uuid::parse_str(&text)
                    .map(|u| *u.as_bytes())
                    .map_err(|e| corrupt(key, e));
            }
            let id = uuid::Uuid::new_v4();
            self.core
                .put_if(key, 0, id.simple().to_string().into_bytes())?;
        }
        Err(MetaError::Contention(key.into()))
    }

    fn node_record(&self, name: &str) -> Result<Option<(NodeRecord, i64)>, MetaError> {
        let key = format!("nodes/{name}");
        match self.core.get(&key)? {
            None => Ok(None),
            Some((v, rev)) => serde_json::from_slice(&v)
                .map(|r| Some((r, rev)))
                .map_err(|e| corrupt(&key, e)),
        }
    }

    /// Joins (or rejoins) the cluster as `info.name`; see the module docs.
    pub fn register_node(&self, info: NodeInfo, ttl: Duration) -> Result<Registration, MetaError> {
        if ttl.is_zero() {
            return Err(MetaError::Config("node ttl must be positive".into()));
        }
        let name = info.name.clone();
        let key = format!("nodes/{name}");
        let mut record = None;
        for _ in 0..20 {
            match self.node_record(&name)? {
                Some((r, _)) if r.state == NodeState::Removed => {
                    return Err(MetaError::NodeRemoved(name))
                }
                Some((mut r, rev)) => {
                    r.boot += 1;
                    r.info = info.clone();
                    let json = serde_json::to_vec(&r).map_err(|e| corrupt(&key, e))?;
                    if self.core.put_if(&key, rev, json)? {
                        record = Some(r);
                        break;
                    }
                }
                None => {
                    let counter = "cluster/next-node-id";
                    let (last, crev) = match self.core.get(counter)? {
                        Some((v, rev)) => (
                            String::from_utf8_lossy(&v)
                                .parse::<u32>()
                                .map_err(|e| corrupt(counter, e))?,
                            rev,
                        ),
                        None => (0, 0),
                    };
                    let r = NodeRecord {
                        id: NodeId(last + 1),
                        boot: 1,
                        state: NodeState::Active,
                        info: info.clone(),
                    };
                    let json = serde_json::to_vec(&r).map_err(|e| corrupt(&key, e))?;
                    let applied = self.core.txn_put(vec![
                        (
                            counter.to_string(),
                            crev,
                            (last + 1).to_string().into_bytes(),
                        ),
                        (key.clone(), 0, json),
                    ])?;
                    if applied {
                        record = Some(r);
                        break;
                    }
                }
            }
        }
        let record = record.ok_or_else(|| MetaError::Contention(key.clone()))?;
        let lease = self.core.grant(ttl)?;
        let alive = format!("alive/{name}");
        self.core
            .put_with_lease(&alive, record.boot.to_string().into_bytes(), lease)?;
        let lost = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let core = self.core.clone();
        let shared_lease = Arc::new(AtomicI64::new(lease));
        let (l, s, n, current) = (
            lost.clone(),
            stop.clone(),
            name.clone(),
            shared_lease.clone(),
        );
        let boot = record.boot;
        let keeper = std::thread::Builder::new()
            .name("node-lease".into())
            .spawn(move || {
                let mut lease = lease;
                let mut last_ok = std::time::Instant::now();
                while nap(&s, ttl / 3) {
                    // etcd reports an expired lease as an error or a zero
                    // ttl; either way, once `ttl` passed without a
                    // successful keep-alive the lease is gone.
                    let kept = match core.keep_alive(lease) {
                        Ok(true) => Ok(true),
                        Ok(false) => Ok(false),
                        Err(_) if last_ok.elapsed() >= ttl => Ok(false),
                        Err(e) => Err(e),
                    };
                    match kept {
                        Ok(true) => {
                            last_ok = std::time::Instant::now();
                            l.store(false, Ordering::SeqCst)
                        }
                        // The lease expired (etcd was away longer than
                        // the ttl): take a new one, so a live node shows
                        // as alive again.
                        Ok(false) => {
                            l.store(true, Ordering::SeqCst);
                            if let Ok(new) = core.grant(ttl) {
                                if core
                                    .put_with_lease(&alive, boot.to_string().into_bytes(), new)
                                    .is_ok()
                                {
                                    lease = new;
                                    current.store(new, Ordering::SeqCst);
                                    last_ok = std::time::Instant::now();
                                    l.store(false, Ordering::SeqCst);
                                    tracing::warn!(node = %n, "liveness lease renewed after it expired");
                                }
                            }
                        }
                        Err(e) => {
                            l.store(true, Ordering::SeqCst);
                            tracing::warn!(node = %n, error = %e, "could not keep the liveness lease");
                        }
                    }
                }
            })
            .map_err(|e| MetaError::Internal(format!("cannot start a thread: {e}")))?;
        Ok(Registration {
            name,
            id: record.id,
            boot: record.boot,
            lease: shared_lease,
            lost,
            stop,
            keeper: Some(keeper),
            core: self.core.clone(),
        })
    }

    /// Updates what the registry says about this node (free capacity …);
    /// writes nothing when it already says that.
    pub fn update_node_info(&self, reg: &Registration, info: NodeInfo) -> Result<(), MetaError> {
        let key = format!("nodes/{}", reg.name);
        for _ in 0..10 {
            let Some((mut r, rev)) = self.node_record(&reg.name)? else {
                return Err(MetaError::UnknownNode(reg.name.clone()));
            };
            if r.info == info {
                return Ok(());
            }
            r.info = info.clone();
            let json = serde_json::to_vec(&r).map_err(|e| corrupt(&key, e))?;
            if self.core.put_if(&key, rev, json)? {
                return Ok(());
            }
        }
        Err(MetaError::Contention(key))
    }

    /// Every node ever registered, alive or not, by id.
    pub fn nodes(&self) -> Result<Vec<NodeStatus>, MetaError> {
        let records = self.core.list("nodes/")?;
        let alive = self.core.list("alive/")?;
        node_list(
            records.iter().map(|(k, v, _)| (k.as_str(), v.as_slice())),
            alive.iter().map(|(k, _, _)| k.as_str()),
            &self.core.key("alive/"),
        )
    }

    pub fn set_node_state(&self, name: &str, state: NodeState) -> Result<(), MetaError> {
        let key = format!("nodes/{name}");
        for _ in 0..10 {
            let Some((mut r, rev)) = self.node_record(name)? else {
                return Err(MetaError::UnknownNode(name.to_string()));
            };
            if r.state == NodeState::Removed && state != NodeState::Removed {
                return Err(MetaError::NodeRemoved(name.to_string()));
            }
            r.state = state;
            let json = serde_json::to_vec(&r).map_err(|e| corrupt(&key, e))?;
            if self.core.put_if(&key, rev, json)? {
                return Ok(());
            }
        }
        Err(MetaError::Contention(key))
    }

    /// Calls `f` with the node list now and after every change (an etcd
    /// watch: see `watch`).
    pub fn watch_nodes(
        &self,
        f: Box<dyn Fn(Vec<NodeStatus>) + Send + Sync>,
    ) -> Result<WatchGuard, MetaError> {
        let (records, alive) = (self.core.key("nodes/"), self.core.key("alive/"));
        let mut last: Option<Vec<NodeStatus>> = None;
        watch::watch_prefixes(
            self.core.clone(),
            "watch-nodes",
            &["nodes/", "alive/"],
            Box::new(move |mirror, _| {
                let nodes = node_list(
                    mirror.under(&records).map(|(k, v, _)| (k, v)),
                    mirror.under(&alive).map(|(k, _, _)| k),
                    &alive,
                );
                match nodes {
                    Ok(nodes) if last.as_ref() != Some(&nodes) => {
                        last = Some(nodes.clone());
                        f(nodes);
                    }
                    Ok(_) => {}
                    Err(e) => tracing::error!(error = %e, "unreadable node record"),
                }
            }),
        )
    }

    pub fn membership(&self, vol: VolumeId) -> Result<Option<Membership>, MetaError> {
        let key = vol_key(vol);
        match self.core.get(&key)? {
            None => Ok(None),
            Some((v, _)) => serde_json::from_slice(&v)
                .map(Some)
                .map_err(|e| corrupt(&key, e)),
        }
    }

    /// One record with its key's `mod_revision` (what a fenced delete
    /// compares).
    pub fn membership_at(&self, vol: VolumeId) -> Result<Option<(Membership, i64)>, MetaError> {
        let key = vol_key(vol);
        match self.core.get(&key)? {
            None => Ok(None),
            Some((v, rev)) => serde_json::from_slice(&v)
                .map(|rec| Some((rec, rev)))
                .map_err(|e| corrupt(&key, e)),
        }
    }

    pub fn memberships(&self) -> Result<Vec<Membership>, MetaError> {
        Ok(self
            .memberships_at()?
            .into_iter()
            .map(|(rec, _)| rec)
            .collect())
    }

    /// Every record with its key's `mod_revision` (what a fenced delete
    /// compares).
    pub fn memberships_at(&self) -> Result<Vec<(Membership, i64)>, MetaError> {
        self.core
            .list("membership/")?
            .into_iter()
            .map(|(k, v, rev)| {
                serde_json::from_slice(&v)
                    .map(|rec| (rec, rev))
                    .map_err(|e| corrupt(&k, e))
            })
            .collect()
    }

    /// Put-if-absent by the coordinator of `term`; false if the volume has
    /// a record already, Err(Fenced) if the role has moved on.
    pub fn create_membership(
        &self,
        term: CoordinatorTerm,
        rec: &Membership,
    ) -> Result<bool, MetaError> {
        let key = vol_key(rec.volume);
        let json = serde_json::to_vec(rec).map_err(|e| corrupt(&key, e))?;
        let full = self.core.key(&key);
        let when = vec![
            Compare::create_revision(full.clone(), CompareOp::Equal, 0),
            self.core.fence(term),
        ];
        let created = self
            .core
            .txn(&key, when, vec![TxnOp::put(full, json, None)])?;
        if !created {
            self.core.check_fence(term)?;
        }
        Ok(created)
    }

    /// Replaces the record if its version is still `expected` and the change
    /// is allowed (`Membership::check_change`); the stored record gets
    /// version `expected + 1`.
    pub fn cas_membership(&self, expected: u64, rec: Membership) -> Result<CasOutcome, MetaError> {
        self.cas(None, expected, rec)
    }

    /// [`ClusterMeta::cas_membership`] by the coordinator of `term`:
    /// Err(Fenced) if the role has moved on.
    pub fn cas_membership_fenced(
        &self,
        term: CoordinatorTerm,
        expected: u64,
        rec: Membership,
    ) -> Result<CasOutcome, MetaError> {
        self.cas(Some(term), expected, rec)
    }

    fn cas(
        &self,
        term: Option<CoordinatorTerm>,
        expected: u64,
        rec: Membership,
    ) -> Result<CasOutcome, MetaError> {
        let key = vol_key(rec.volume);
        let job = self.cas_job(term, expected, rec);
        self.core.call(&key, move |c| job.run(c))
    }

    /// Every change `(expected version, record)` by the coordinator of
    /// `term`, as [`ClusterMeta::cas_membership_fenced`] would make it one
    /// by one, but all sent at once (etcd commits concurrent proposals
    /// together, so a failover of many volumes costs a few fsyncs, not one
    /// per volume). One outcome per change, in order; all are bounded by one
    /// request timeout together.
    pub fn cas_memberships_fenced(
        &self,
        term: CoordinatorTerm,
        changes: Vec<(u64, Membership)>,
    ) -> Vec<Result<CasOutcome, MetaError>> {
        let n = changes.len();
        if n == 0 {
            return Vec::new();
        }
        let jobs: Vec<CasJob> = changes
            .into_iter()
            .map(|(expected, rec)| self.cas_job(Some(term), expected, rec))
            .collect();
        let all = self.core.call("membership/", move |c| async move {
            let mut set = tokio::task::JoinSet::new();
            for (i, job) in jobs.into_iter().enumerate() {
                let c = c.clone();
                set.spawn(async move { (i, job.run(c).await) });
            }
            let mut out: Vec<Option<Result<CasOutcome, MetaError>>> =
                (0..n).map(|_| None).collect();
            while let Some(done) = set.join_next().await {
                if let Ok((i, r)) = done {
                    out[i] = Some(r);
                }
            }
            Ok(out)
        });
        match all {
            Ok(out) => out
                .into_iter()
                .map(|r| {
                    r.unwrap_or_else(|| {
                        Err(MetaError::Internal("a membership change was lost".into()))
                    })
                })
                .collect(),
            Err(e) => {
                let msg = e.to_string();
                (0..n)
                    .map(|_| Err(MetaError::Internal(msg.clone())))
                    .collect()
            }
        }
    }

    fn cas_job(&self, term: Option<CoordinatorTerm>, expected: u64, rec: Membership) -> CasJob {
        let key = vol_key(rec.volume);
        let full = self.core.key(&key);
        CasJob {
            err: Box::new(self.core.request_error(&full)),
            fence: term.map(|t| (self.core.fence(t), self.core.key("coordinator"), t)),
            key,
            full,
            expected,
            rec,
        }
    }

    /// Deletes the record of `vol` by the coordinator of `term` if it is
    /// still at `mod_revision` (the one the coordinator decided from);
    /// whether it was deleted. Err(Fenced) if the role has moved on.
    pub fn delete_membership(
        &self,
        term: CoordinatorTerm,
        vol: VolumeId,
        mod_revision: i64,
    ) -> Result<bool, MetaError> {
        let key = vol_key(vol);
        let full = self.core.key(&key);
        let when = vec![
            Compare::mod_revision(full.clone(), CompareOp::Equal, mod_revision),
            self.core.fence(term),
        ];
        let deleted = self.core.txn(&key, when, vec![TxnOp::delete(full, None)])?;
        if !deleted {
            self.core.check_fence(term)?;
        }
        Ok(deleted)
    }

    /// Calls `f` with every record now, then with every newer version seen,
    /// and `gone` with every volume whose record was deleted (an etcd
    /// watch: see `watch`).
    pub fn watch_memberships(
        &self,
        f: Box<dyn Fn(Membership) + Send + Sync>,
        gone: Box<dyn Fn(VolumeId) + Send + Sync>,
    ) -> Result<WatchGuard, MetaError> {
        let prefix = self.core.key("membership/");
        let mut seen: BTreeMap<VolumeId, u64> = BTreeMap::new();
        watch::watch_prefixes(
            self.core.clone(),
            "watch-membership",
            &["membership/"],
            Box::new(move |_, changes| {
                for change in changes {
                    match change {
                        watch::Change::Put { key, value, .. } => {
                            match serde_json::from_slice::<Membership>(value) {
                                Ok(rec) => {
                                    if seen.get(&rec.volume).is_none_or(|v| rec.version > *v) {
                                        seen.insert(rec.volume, rec.version);
                                        f(rec);
                                    }
                                }
                                Err(e) => {
                                    tracing::error!(key, error = %e, "unreadable membership record")
                                }
                            }
                        }
                        watch::Change::Delete { key } => {
                            let id = key.strip_prefix(&prefix).and_then(|id| id.parse().ok());
                            if let Some(vol) = id.map(|id: uuid::Uuid| VolumeId(id.as_u128())) {
                                seen.remove(&vol);
                                gone(vol);
                            }
                        }
                    }
                }
            }),
        )
    }

    /// Calls `f` with every volume record of the catalog now, then with
    /// every change: `Some(record)` when a volume appears or changes,
    /// `None` with its name when it is deleted (an etcd watch on the
    /// catalog's keys: see `watch`).
    pub fn watch_catalog(&self, f: OnVolume) -> Result<WatchGuard, MetaError> {
        let prefix = self.core.key("volumes/");
        watch::watch_prefixes(
            self.core.clone(),
            "watch-catalog",
            &["volumes/"],
            Box::new(move |_, changes| {
                for change in changes {
                    let Some(name) = change.key().strip_prefix(&prefix) else {
                        continue;
                    };
                    match change {
                        watch::Change::Put { key, value, .. } => {
                            let record = std::str::from_utf8(value)
                                .map_err(|e| e.to_string())
                                .and_then(|json| {
                                    VolumeRecord::from_json(key, json).map_err(|e| e.to_string())
                                });
                            match record {
                                Ok(record) => f(name, Some(record)),
                                Err(e) => {
                                    tracing::error!(key, error = %e, "unreadable volume record")
                                }
                            }
                        }
                        watch::Change::Delete { .. } => f(name, None),
                    }
                }
            }),
        )
    }

    /// Campaigns for the coordinator role in the background; `f(true)` when
    /// this node becomes coordinator, `f(false)` when it loses the role.
    pub fn campaign(
        &self,
        reg: &Registration,
        f: Box<dyn Fn(bool) + Send + Sync>,
    ) -> Result<ElectionGuard, MetaError> {
        let core = self.core.clone();
        let name = reg.name.clone();
        let confirmed = self.role_confirmed.clone();
        let role_term = self.role_term.clone();
        // The coordinator key lives on a lease of its own, so that losing
        // the role and the node's liveness are independent.
        let ttl = COORDINATOR_TTL;
        spawn_loop("coordinator-election", move |stop| {
            let mut held: Option<i64> = None;
            let mut last_ok = std::time::Instant::now();
            let mut warned = false;
            loop {
                match held {
                    None => {
                        // A read first: while another node holds the role,
                        // a standby costs etcd no writes (a lease grant and
                        // revoke are raft proposals, each an fsync).
                        let vacant = matches!(core.get("coordinator"), Ok(None));
                        if vacant {
                            if let Ok(lease) = core.grant(ttl) {
                                match core.create_with_lease(
                                    "coordinator",
                                    name.clone().into_bytes(),
                                    lease,
                                ) {
                                    Ok(Some(rev)) => {
                                        held = Some(lease);
                                        last_ok = std::time::Instant::now();
                                        *role_term.lock() = Some(CoordinatorTerm(rev));
                                        *confirmed.lock() = Some(last_ok);
                                        f(true);
                                    }
                                    _ => core.revoke(lease),
                                }
                            }
                        }
                        if !nap(stop, Duration::from_millis(500)) {
                            break;
                        }
                    }
                    Some(lease) => {
                        // While etcd does not answer, ask again often: the
                        // role resumes as soon as it does.
                        let pause = if last_ok.elapsed() > ttl / 3 {
                            RECONFIRM_RETRY
                        } else {
                            ttl / 3
                        };
                        if !nap(stop, pause) {
                            break;
                        }
                        // An unanswered keep-alive is not a lost role: the
                        // lease lasts `ttl` after the last one that worked
                        // (etcd cannot elect anyone else before that), and
                        // an etcd that was down for everyone renews it when
                        // it comes back. Until a keep-alive is answered
                        // again, `coordinator_role_current` is false (no
                        // lease is extended); the role is lost only when
                        // etcd says so: the lease or the key is gone, or the
                        // key is not this tenure's.
                        let sent = std::time::Instant::now();
                        // The key is read whatever the keep-alive said: a
                        // keep-alive of a lease etcd let expire fails
                        // rather than answering "gone", and only the key
                        // tells a lost role from an unreachable etcd.
                        let kept = core.keep_alive(lease);
                        let key = core.get_with_create_revision("coordinator");
                        let ours = matches!(&key, Ok(Some((v, rev)))
                            if v.as_slice() == name.as_bytes()
                                && role_term.lock().is_some_and(|t| t.0 == *rev));
                        let lost = matches!(kept, Ok(false))
                            || matches!(&key, Ok(None))
                            || (key.is_ok() && !ours);
                        let ok = matches!(kept, Ok(true)) && ours;
                        if ok {
                            if last_ok.elapsed() >= ttl * 2 / 3 {
                                tracing::info!(node = %name, "etcd answers again: the coordinator role resumes");
                            }
                            last_ok = sent;
                            *confirmed.lock() = Some(sent);
                        } else if !lost && last_ok.elapsed() >= ttl * 2 / 3 && !warned {
                            tracing::warn!(node = %name, "etcd does not confirm the coordinator role: leases are not extended until it does");
                        }
                        warned = !ok && last_ok.elapsed() >= ttl * 2 / 3;
                        if lost {
                            tracing::warn!(node = %name, "lost the coordinator role");
                            held = None;
                            *confirmed.lock() = None;
                            *role_term.lock() = None;
                            f(false);
                        }
                    }
                }
            }
            if let Some(lease) = held {
                *confirmed.lock() = None;
                *role_term.lock() = None;
                core.revoke(lease);
                f(false);
            }
        })
    }

    /// Whether etcd confirmed this node's coordinator role recently enough
    /// that nobody else can hold it yet, with a margin: within two thirds of
    /// the role's lease. The election thread notices a lost role only when
    /// its keep-alive returns, which a partition delays by the request
    /// timeout; this check does not wait for that. A coordinator answers
    /// heartbeats (which extend primaries' leases) only while it holds, so
    /// a partitioned coordinator cannot keep a partitioned primary serving
    /// after another coordinator may have promoted a new one.
    pub fn coordinator_role_current(&self) -> bool {
        self.role_confirmed
            .lock()
            .is_some_and(|at| at.elapsed() < COORDINATOR_TTL * 2 / 3)
    }

    /// How much of a lease the previous coordinator granted has surely run
    /// out when a new coordinator is elected, in milliseconds: a
    /// coordinator extends leases only within two thirds of the role's TTL
    /// after its last confirmed keep-alive (`coordinator_role_current`),
    /// and etcd lets another node take the role only a full TTL after that
    /// keep-alive, so a lease extended to `sent_at + lease` ends at most
    /// `lease − TTL/3` after the election. A new coordinator counts every
    /// node as heard this long before its start.
    pub fn role_handover_credit_ms() -> u64 {
        (COORDINATOR_TTL / 3).as_millis() as u64
    }

    /// The term of the coordinator role this node holds, if it holds it.
    pub fn coordinator_term(&self) -> Option<CoordinatorTerm> {
        *self.role_term.lock()
    }

    /// etcd's current revision, read linearizably: every write etcd had
    /// acknowledged to anyone when this was asked is at or below it.
    pub fn current_revision(&self) -> Result<i64, MetaError> {
        self.core.current_revision()
    }

    /// The current coordinator's node name, if any.
    pub fn coordinator(&self) -> Result<Option<String>, MetaError> {
        Ok(self
            .core
            .get("coordinator")?
            .map(|(v, _)| String::from_utf8_lossy(&v).into_owned()))
    }
}
