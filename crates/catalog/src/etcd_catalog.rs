//! The cluster catalog: volume records in etcd (v3 API), shared by every
//! node, with exactly the [`Catalog`] semantics of the crate docs.
//!
//! Layout: `<prefix>volumes/<name>` → the record's JSON, the same bytes
//! [`crate::RedbCatalog`] stores ([`VolumeRecord::to_json`]); the policy
//! entries beside them under `<prefix><collection>/<name>` (`projects/`,
//! `tokens/`, `volume-types/`, `settings/`, `nbd-keys/`; see
//! [`Collection`]). The prefix is
//! [`DEFAULT_ETCD_PREFIX`] unless configured, so several clusters (or tests)
//! can share one etcd.
//!
//! How the crate's invariants map onto etcd:
//! - A record's [`Revision`] is its key's `mod_revision`. etcd's revision
//!   counter is global, grows with every write and is never reused, so a
//!   record deleted and created again gets a higher revision.
//! - `insert` is one transaction `create_revision(key) == 0 → put`: of
//!   concurrent inserters exactly one wins, the others get `AlreadyExists`.
//! - `update`/`delete` are one transaction `mod_revision(key) == expected ∧
//!   create_revision(key) > 0 → put/delete`, else `get(key)`: the read that
//!   tells `NotFound` (no key) from `Conflict` (its current revision) is
//!   atomic with the failed comparison.
//! - etcd acknowledges a write only once the raft log entry is committed (in
//!   the WAL, fsynced, on a majority), so every successful call is durable;
//!   reads are linearizable (etcd's default), so any node sees it at once.
//! - `list` reads pages of [`LIST_PAGE`] keys pinned at the first page's
//!   revision: one consistent snapshot, in key order, which is name order
//!   (bytewise, like redb). If etcd compacts that revision between two pages
//!   the list fails (`Request`) and can simply be retried.
//! - No call hangs: each is bounded by [`EtcdConfig::request_timeout`]
//!   ([`CatalogError::Timeout`]); other transport or server failures are
//!   [`CatalogError::Request`]. Both name the endpoints and the key. After
//!   either, a mutation may or may not have been applied: re-read.
//!
//! Endpoints: one etcd client per configured endpoint; a call goes to the
//! endpoint that last answered and moves on to the next one as etcd's own Go
//! client does: a read whenever the member is unavailable, a write only when
//! no connection could be made at all (once sent, it may have been applied,
//! and resending it could report a spurious `AlreadyExists` or `Conflict`).
//! A member that accepts connections but never answers holds a call until
//! its timeout.
//!
//! Threading: the trait is synchronous and is called from blocking threads
//! (the API server calls the control plane inside tokio's `spawn_blocking`;
//! other callers are plain threads). The catalog owns a small tokio runtime
//! with one worker thread that keeps etcd-client's gRPC connections running
//! between calls (and reconnects after an etcd restart). A
//! call spawns its future on that runtime and waits on a std channel. Unlike
//! `Runtime::block_on`, that is allowed on any thread: a plain one, a
//! `spawn_blocking` thread of another runtime, even an async worker (which it
//! blocks, but it never panics with "cannot start a runtime from within a
//! runtime"). Dropping the catalog shuts its runtime down in the background,
//! which is also allowed anywhere.

use crate::{Catalog, CatalogError, Collection, Revision, Versioned, VolumeRecord};
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, KeyValue, KvClient, ResponseHeader,
    SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

/// The key prefix used unless [`EtcdConfig::prefix`] says otherwise.
pub const DEFAULT_ETCD_PREFIX: &str = "/basalt/";
/// Keys read per request by `list`.
const LIST_PAGE: i64 = 512;
/// Largest response accepted from etcd. Pages are far smaller than this
/// unless records are huge (etcd itself caps a value at 1.5 MiB by default).
const MAX_RESPONSE_BYTES: usize = 64 << 20;
/// Extra time the caller's thread waits beyond the request timeout for the
/// runtime to report that timeout itself.
const WAIT_GRACE: Duration = Duration::from_secs(1);

/// Where and how to reach etcd.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdConfig {
    /// Client URLs of the etcd members, e.g. `http://10.0.0.1:2379`. A call
    /// goes to the one that last answered and fails over to the others.
    pub endpoints: Vec<String>,
    /// Prepended verbatim to every key (`<prefix>volumes/<name>`).
    pub prefix: String,
    /// Bound on opening a connection to one endpoint. Keep it well below
    /// `request_timeout`, so that a call can still fail over to another
    /// endpoint after one that does not answer at all (packets dropped).
    pub connect_timeout: Duration,
    /// Bound on one catalog call, all its round trips included.
    pub request_timeout: Duration,
}

impl EtcdConfig {
    /// A configuration for `endpoints` with the default prefix, a 1 s
    /// connect timeout and a 5 s request timeout.
    pub fn new<S: Into<String>>(endpoints: impl IntoIterator<Item = S>) -> Self {
        EtcdConfig {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            prefix: DEFAULT_ETCD_PREFIX.to_string(),
            connect_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_secs(5),
        }
    }

    /// The same configuration with another key prefix.
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The same configuration with other timeouts.
    pub fn with_timeouts(mut self, connect: Duration, request: Duration) -> Self {
        self.connect_timeout = connect;
        self.request_timeout = request;
        self
    }

    fn validate(&self) -> Result<(), CatalogError> {
        if self.endpoints.is_empty() {
            return Err(CatalogError::Config("no etcd endpoint given".into()));
        }
        if self.connect_timeout.is_zero() || self.request_timeout.is_zero() {
            return Err(CatalogError::Config(
                "etcd connect and request timeouts must be positive".into(),
            ));
        }
        Ok(())
    }
}

/// A [`Catalog`] stored in etcd under a key prefix, failing over between
/// endpoints, every call bounded by a timeout; callable from any thread (it
/// runs its own small tokio runtime). Details in the docs of its module,
/// `etcd_catalog.rs`.
pub struct EtcdCatalog {
    /// One client per endpoint, in configuration order.
    members: Arc<[Member]>,
    /// Index in `members` of the endpoint to try first: the last one that
    /// answered.
    preferred: Arc<AtomicUsize>,
    config: EtcdConfig,
    /// `<prefix>volumes/`: every record's key starts with it.
    volumes_prefix: String,
    /// `config.endpoints` joined, for errors.
    endpoints: String,
    handle: tokio::runtime::Handle,
    _runtime: OwnedRuntime,
}

/// The catalog's runtime, shut down in the background when dropped: unlike
/// a plain drop of a runtime, that never blocks and is allowed anywhere,
/// inside an async context too.
struct OwnedRuntime(Option<tokio::runtime::Runtime>);

impl Drop for OwnedRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// The client of one etcd endpoint. etcd-client can balance one client over
/// several endpoints, but its balancer sends requests to a dead member too
/// and fails them instead of trying another (etcdv3/etcd-client#39), so the
/// catalog keeps one client per endpoint and fails over itself.
struct Member {
    endpoint: String,
    client: Client,
}

impl std::fmt::Debug for EtcdCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdCatalog")
            .field("endpoints", &self.config.endpoints)
            .field("prefix", &self.config.prefix)
            .finish()
    }
}

/// Why an operation's future failed, before the caller adds context.
enum Failure {
    Etcd(etcd_client::Error),
    Catalog(CatalogError),
}

impl From<etcd_client::Error> for Failure {
    fn from(e: etcd_client::Error) -> Self {
        Failure::Etcd(e)
    }
}

impl From<CatalogError> for Failure {
    fn from(e: CatalogError) -> Self {
        Failure::Catalog(e)
    }
}

/// Whether an operation only reads, which decides when it may be retried on
/// another endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Access {
    Read,
    Write,
}

/// Whether a request that failed with `err` may be sent again to the next
/// endpoint: the policy of etcd's own Go client. A read may, whenever the
/// member was unavailable (down, cut off, without a leader). A write may only
/// if it provably never left this process (no connection could be made):
/// once sent, it may have been applied, and sending it again could turn a
/// success into a spurious `AlreadyExists` or `Conflict`.
fn may_retry_elsewhere(access: Access, err: &etcd_client::Error) -> bool {
    let status = match err {
        etcd_client::Error::GRpcStatus(status) => status,
        etcd_client::Error::TransportError(e) => return never_connected(e),
        _ => return false,
    };
    match access {
        Access::Read => status.code() == tonic::Code::Unavailable,
        Access::Write => never_connected(status),
    }
}

/// Whether `err` (or an error it wraps) is tonic's "could not connect".
fn never_connected(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if e.is::<tonic::ConnectError>() {
            return true;
        }
        cur = e.source();
    }
    false
}

impl EtcdCatalog {
    /// Connects to etcd and checks, within the request timeout, that some
    /// endpoint answers: fails with [`CatalogError::Timeout`] or
    /// [`CatalogError::Request`] if none does, and with
    /// [`CatalogError::Config`] for an unusable configuration. Once
    /// connected, the catalog reconnects by itself after etcd restarts and
    /// moves to another endpoint when one fails.
    pub fn connect(config: EtcdConfig) -> Result<Self, CatalogError> {
        config.validate()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("basalt-etcd")
            .enable_all()
            .build()
            .map_err(CatalogError::backend)?;
        let handle = runtime.handle().clone();
        let runtime = OwnedRuntime(Some(runtime));
        // No per-request timeout here: the catalog bounds each whole call,
        // failovers included, and reports running out as `Timeout`.
        let options = ConnectOptions::new()
            .with_connect_timeout(config.connect_timeout)
            // Notice a dead connection even when the peer vanished without
            // closing it (power loss, partition).
            .with_keep_alive(Duration::from_secs(10), config.request_timeout)
            // A member cut off from its cluster answers at once (and a read
            // moves on) instead of waiting for a leader.
            .with_require_leader(true);
        let mut members = Vec::with_capacity(config.endpoints.len());
        for endpoint in &config.endpoints {
            // Client::connect does not talk to etcd yet (the channel is
            // lazy) but must run inside the runtime its tasks join.
            let (ep, opts) = (endpoint.clone(), options.clone());
            let client = run(&handle, config.request_timeout, async move {
                Ok(Client::connect([ep], Some(opts)).await?)
            })
            .map_err(|f| match f {
                Some(Failure::Etcd(
                    etcd_client::Error::InvalidArgs(msg) | etcd_client::Error::EndpointError(msg),
                )) => CatalogError::Config(format!("etcd endpoint {endpoint:?}: {msg}")),
                Some(Failure::Etcd(etcd_client::Error::InvalidUri(e))) => {
                    CatalogError::Config(format!("etcd endpoint {endpoint:?}: {e}"))
                }
                other => failure_error(other, endpoint, "", config.request_timeout),
            })?;
            members.push(Member {
                endpoint: endpoint.clone(),
                client,
            });
        }
        let catalog = EtcdCatalog {
            members: members.into(),
            preferred: Arc::new(AtomicUsize::new(0)),
            volumes_prefix: format!("{}volumes/", config.prefix),
            endpoints: config.endpoints.join(","),
            config,
            handle,
            _runtime: runtime,
        };
        // Probe: a count of the records proves etcd answers (and that we
        // may read our prefix) without transferring them.
        let prefix = catalog.volumes_prefix.clone();
        let count = catalog.call(Access::Read, prefix.clone(), move |mut kv| {
            let prefix = prefix.clone();
            async move {
                let opts = GetOptions::new().with_prefix().with_count_only();
                Ok(kv.get(prefix, Some(opts)).await?.count())
            }
        })?;
        tracing::info!(
            endpoints = %catalog.endpoints,
            prefix = %catalog.config.prefix,
            volumes = count,
            "connected to etcd"
        );
        Ok(catalog)
    }

    /// The configuration this catalog was connected with.
    pub fn config(&self) -> &EtcdConfig {
        &self.config
    }

    /// The etcd key of the record named `name`.
    pub fn key(&self, name: &str) -> String {
        format!("{}{name}", self.volumes_prefix)
    }

    /// Runs the operation `op` on the catalog's runtime, bounded by the
    /// request timeout: first against the preferred endpoint, then against
    /// the others in turn while [`may_retry_elsewhere`] allows. `key` names
    /// what the operation touches in errors.
    fn call<T, F>(
        &self,
        access: Access,
        key: String,
        op: impl Fn(KvClient) -> F + Send + 'static,
    ) -> Result<T, CatalogError>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, Failure>> + Send + 'static,
    {
        let members = self.members.clone();
        let preferred = self.preferred.clone();
        let timeout = self.config.request_timeout;
        let attempts = async move {
            let first = preferred.load(Ordering::Relaxed);
            let mut last = None;
            for i in 0..members.len() {
                let at = (first + i) % members.len();
                let member = &members[at];
                let kv = member
                    .client
                    .kv_client()
                    .max_decoding_message_size(MAX_RESPONSE_BYTES);
                match op(kv).await {
                    Err(Failure::Etcd(e)) if may_retry_elsewhere(access, &e) => {
                        tracing::debug!(endpoint = %member.endpoint, error = %e, "etcd endpoint failed");
                        last = Some(e);
                    }
                    outcome => {
                        if at != first {
                            preferred.store(at, Ordering::Relaxed);
                            tracing::info!(endpoint = %member.endpoint, "now using etcd endpoint");
                        }
                        return outcome;
                    }
                }
            }
            Err(match last {
                Some(e) => Failure::Etcd(e),
                None => Failure::Catalog(CatalogError::Config("no etcd endpoint".into())),
            })
        };
        run(&self.handle, timeout, attempts).map_err(|f| {
            let err = failure_error(f, &self.endpoints, &key, timeout);
            if matches!(
                err,
                CatalogError::Timeout { .. } | CatalogError::Request { .. }
            ) {
                tracing::warn!(error = %err, "etcd request failed");
            }
            err
        })
    }

    fn list_pages(&self, page: i64) -> Result<Vec<Versioned<VolumeRecord>>, CatalogError> {
        self.raw_list(self.volumes_prefix.clone(), page)?
            .into_iter()
            .map(|raw| decode(&raw))
            .collect()
    }

    /// `<prefix><collection>/`: every key of the collection starts with it.
    fn collection_prefix(&self, collection: Collection) -> String {
        format!("{}{}/", self.config.prefix, collection.dir())
    }

    /// The entry `name` under `prefix`, if there is one.
    fn raw_get(&self, prefix: &str, name: &str) -> Result<Option<RawEntry>, CatalogError> {
        let key = format!("{prefix}{name}");
        let prefix_len = prefix.len();
        self.call(Access::Read, key.clone(), move |mut kv| {
            let key = key.clone();
            async move {
                let resp = kv.get(key.as_str(), None).await?;
                match resp.kvs().first() {
                    None => Ok(None),
                    Some(entry) => Ok(Some(RawEntry::read(entry, prefix_len)?)),
                }
            }
        })
    }

    fn raw_list(&self, prefix: String, page: i64) -> Result<Vec<RawEntry>, CatalogError> {
        self.call(Access::Read, prefix.clone(), move |kv| {
            list_op(kv, prefix.clone(), page)
        })
    }

    /// Put-if-absent of `json` at `key`; `name` names the entry in errors.
    fn raw_insert(
        &self,
        key: String,
        name: String,
        json: String,
    ) -> Result<Revision, CatalogError> {
        self.call(Access::Write, key.clone(), move |mut kv| {
            let (key, name) = (key.clone(), name.clone());
            let txn = Txn::new()
                .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(key.as_str(), json.as_str(), None)]);
            async move {
                let resp = kv.txn(txn).await?;
                if !resp.succeeded() {
                    return Err(CatalogError::AlreadyExists(name).into());
                }
                Ok(to_revision(header_revision(resp.header(), &key)?, &key)?)
            }
        })
    }

    /// Compare-and-swap of `key` from `expected` to `json` (`None`: delete).
    fn raw_swap(
        &self,
        key: String,
        name: String,
        json: Option<String>,
        expected: Revision,
    ) -> Result<Revision, CatalogError> {
        self.call(Access::Write, key.clone(), move |mut kv| {
            let (key, name) = (key.clone(), name.clone());
            let op = match &json {
                Some(json) => TxnOp::put(key.as_str(), json.as_str(), None),
                None => TxnOp::delete(key.as_str(), None),
            };
            let txn = Txn::new()
                .when(cas_compares(&key, expected))
                .and_then([op])
                .or_else([TxnOp::get(key.as_str(), None)]);
            async move {
                let resp = kv.txn(txn).await?;
                if !resp.succeeded() {
                    return Err(cas_failure(resp.op_responses(), &key, &name, expected).into());
                }
                Ok(to_revision(header_revision(resp.header(), &key)?, &key)?)
            }
        })
    }
}

/// One stored key, as read: its name (the key past the collection's
/// prefix), revision and UTF-8 value.
struct RawEntry {
    key: String,
    name: String,
    revision: Revision,
    json: String,
}

impl RawEntry {
    /// `entry`, whose key is a prefix of `prefix_len` bytes and a name.
    fn read(entry: &KeyValue, prefix_len: usize) -> Result<Self, CatalogError> {
        let key = String::from_utf8_lossy(entry.key()).into_owned();
        let corrupt = |reason: String| CatalogError::Corrupt {
            key: key.clone(),
            reason,
        };
        let name = entry
            .key()
            .get(prefix_len..)
            .and_then(|n| std::str::from_utf8(n).ok())
            .ok_or_else(|| corrupt("key is not a UTF-8 name under the prefix".into()))?
            .to_string();
        let json = std::str::from_utf8(entry.value())
            .map_err(|e| corrupt(e.to_string()))?
            .to_string();
        Ok(RawEntry {
            revision: to_revision(entry.mod_revision(), &key)?,
            key,
            name,
            json,
        })
    }
}

/// Every entry under `prefix`, read `page` keys at a time from one
/// snapshot.
async fn list_op(mut kv: KvClient, prefix: String, page: i64) -> Result<Vec<RawEntry>, Failure> {
    let end = prefix_end(prefix.as_bytes());
    let mut from = prefix.as_bytes().to_vec();
    let mut snapshot = None;
    let mut out = Vec::new();
    loop {
        let mut opts = GetOptions::new()
            .with_range(end.clone())
            .with_limit(page)
            .with_sort(SortTarget::Key, SortOrder::Ascend);
        if let Some(rev) = snapshot {
            opts = opts.with_revision(rev);
        }
        let resp = kv.get(from.clone(), Some(opts)).await?;
        if snapshot.is_none() {
            snapshot = Some(header_revision(resp.header(), &prefix)?);
        }
        for entry in resp.kvs() {
            out.push(RawEntry::read(entry, prefix.len())?);
        }
        match resp.kvs().last() {
            Some(last) if resp.more() => {
                from = last.key().to_vec();
                from.push(0); // the next key after `last`
            }
            _ => return Ok(out),
        }
    }
}

/// Spawns `fut` on `handle` bounded by `timeout` and waits for it on this
/// (non-async) thread. `Err(None)` means the time ran out.
fn run<T: Send + 'static>(
    handle: &tokio::runtime::Handle,
    timeout: Duration,
    fut: impl Future<Output = Result<T, Failure>> + Send + 'static,
) -> Result<T, Option<Failure>> {
    let (tx, rx) = mpsc::sync_channel(1);
    let task = handle.spawn(async move {
        let out = tokio::time::timeout(timeout, fut).await;
        // The receiver is gone only if the caller already gave up.
        let _ = tx.send(out);
    });
    match rx.recv_timeout(timeout + WAIT_GRACE) {
        Ok(Ok(result)) => result.map_err(Some),
        Ok(Err(_elapsed)) => Err(None),
        Err(mpsc::RecvTimeoutError::Timeout) => {
            task.abort();
            Err(None)
        }
        // The task ended without sending: it panicked (etcd-client panics on
        // some malformed responses) or the runtime is shutting down.
        Err(mpsc::RecvTimeoutError::Disconnected) => Err(Some(Failure::Catalog(
            CatalogError::Backend("etcd request task ended without an answer".into()),
        ))),
    }
}

fn failure_error(
    failure: Option<Failure>,
    endpoints: &str,
    key: &str,
    timeout: Duration,
) -> CatalogError {
    match failure {
        None => CatalogError::Timeout {
            endpoints: endpoints.to_string(),
            key: key.to_string(),
            timeout,
        },
        Some(Failure::Catalog(e)) => e,
        Some(Failure::Etcd(e)) => CatalogError::Request {
            endpoints: endpoints.to_string(),
            key: key.to_string(),
            source: Box::new(e),
        },
    }
}

/// Why an etcd request failed, in one line without the gRPC client's debug
/// text, and whether it means etcd could not be reached at all.
pub fn etcd_failure(e: &etcd_client::Error) -> (bool, String) {
    fn innermost(mut e: &(dyn std::error::Error + 'static)) -> String {
        while let Some(next) = e.source() {
            e = next;
        }
        e.to_string()
    }
    let (unreachable, reason) = match e {
        etcd_client::Error::GRpcStatus(status) => match status.code() {
            tonic::Code::Unavailable => (true, innermost(status)),
            tonic::Code::DeadlineExceeded => (true, "no answer in time".to_string()),
            code => (
                false,
                format!("{}: {}", code.description(), status.message()),
            ),
        },
        etcd_client::Error::TransportError(t) => (true, innermost(t)),
        etcd_client::Error::IoError(io) => (true, io.to_string()),
        other => (false, other.to_string()),
    };
    let one_line = reason.lines().next().unwrap_or_default().to_string();
    (unreachable, one_line)
}

/// The text of `CatalogError::Request` (and of the cluster's metadata
/// errors): "metadata store unreachable: …" when etcd could not be reached.
pub fn describe_request_failure(
    endpoints: &str,
    key: &str,
    source: &(dyn std::error::Error + Send + Sync + 'static),
) -> String {
    let (unreachable, reason) = match source.downcast_ref::<etcd_client::Error>() {
        Some(e) => etcd_failure(e),
        None => (false, source.to_string()),
    };
    if unreachable && key.is_empty() {
        format!("metadata store unreachable: etcd at {endpoints}: {reason}")
    } else if unreachable {
        format!("metadata store unreachable: etcd at {endpoints} (for {key:?}): {reason}")
    } else {
        format!("metadata store request for {key:?} to etcd at {endpoints} failed: {reason}")
    }
}

/// The smallest key greater than every key starting with `prefix` (the
/// end of etcd's key range for that prefix).
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // All 0xff (or empty): no upper bound; etcd spells that "\0".
    vec![0]
}

fn to_revision(raw: i64, key: &str) -> Result<Revision, CatalogError> {
    u64::try_from(raw)
        .map(Revision::new)
        .map_err(|_| CatalogError::Corrupt {
            key: key.to_string(),
            reason: format!("etcd returned the negative revision {raw}"),
        })
}

/// The store revision in a response header: for a successful write
/// transaction, the revision of its writes.
fn header_revision(header: Option<&ResponseHeader>, key: &str) -> Result<i64, CatalogError> {
    header.map(ResponseHeader::revision).ok_or_else(|| {
        CatalogError::Backend(format!("etcd answered for {key:?} without a header").into())
    })
}

/// The volume record in `raw`, which must carry the name of its key.
fn decode(raw: &RawEntry) -> Result<Versioned<VolumeRecord>, CatalogError> {
    let record = VolumeRecord::from_json(&raw.key, &raw.json)?;
    if record.name != raw.name {
        return Err(CatalogError::Corrupt {
            key: raw.key.clone(),
            reason: format!("the record is named {:?}", record.name),
        });
    }
    Ok(Versioned {
        revision: raw.revision,
        record,
    })
}

/// The outcome of a failed compare-and-swap on `key`, from the `get` in the
/// transaction's else branch.
fn cas_failure(
    responses: Vec<TxnOpResponse>,
    key: &str,
    name: &str,
    expected: Revision,
) -> CatalogError {
    let current = responses.into_iter().find_map(|r| match r {
        TxnOpResponse::Get(get) => Some(get),
        _ => None,
    });
    let Some(current) = current else {
        return CatalogError::Backend(
            format!("etcd transaction on {key:?} failed without the read of its else branch")
                .into(),
        );
    };
    match current.kvs().first() {
        None => CatalogError::NotFound(name.to_string()),
        Some(entry) => match to_revision(entry.mod_revision(), key) {
            Ok(found) => CatalogError::Conflict {
                name: name.to_string(),
                expected,
                found,
            },
            Err(e) => e,
        },
    }
}

/// The comparisons of a compare-and-swap: the key exists at `expected`.
fn cas_compares(key: &str, expected: Revision) -> Vec<Compare> {
    // No stored revision is negative, so a revision etcd cannot represent
    // simply never matches.
    let expected = i64::try_from(expected.get()).unwrap_or(-1);
    vec![
        Compare::mod_revision(key, CompareOp::Equal, expected),
        Compare::create_revision(key, CompareOp::Greater, 0),
    ]
}

impl Catalog for EtcdCatalog {
    fn get(&self, name: &str) -> Result<Option<Versioned<VolumeRecord>>, CatalogError> {
        self.raw_get(&self.volumes_prefix, name)?
            .map(|raw| decode(&raw))
            .transpose()
    }

    fn list(&self) -> Result<Vec<Versioned<VolumeRecord>>, CatalogError> {
        self.list_pages(LIST_PAGE)
    }

    fn insert(&self, record: &VolumeRecord) -> Result<Revision, CatalogError> {
        self.raw_insert(
            self.key(&record.name),
            record.name.clone(),
            record.to_json(),
        )
    }

    fn update(&self, record: &VolumeRecord, expected: Revision) -> Result<Revision, CatalogError> {
        let key = self.key(&record.name);
        self.raw_swap(key, record.name.clone(), Some(record.to_json()), expected)
    }

    fn delete(&self, name: &str, expected: Revision) -> Result<(), CatalogError> {
        self.raw_swap(self.key(name), name.to_string(), None, expected)
            .map(drop)
    }

    fn get_entry(
        &self,
        collection: Collection,
        name: &str,
    ) -> Result<Option<Versioned<String>>, CatalogError> {
        let prefix = self.collection_prefix(collection);
        Ok(self.raw_get(&prefix, name)?.map(|raw| Versioned {
            revision: raw.revision,
            record: raw.json,
        }))
    }

    fn list_entries(
        &self,
        collection: Collection,
    ) -> Result<Vec<(String, Versioned<String>)>, CatalogError> {
        Ok(self
            .raw_list(self.collection_prefix(collection), LIST_PAGE)?
            .into_iter()
            .map(|raw| {
                let versioned = Versioned {
                    revision: raw.revision,
                    record: raw.json,
                };
                (raw.name, versioned)
            })
            .collect())
    }

    fn insert_entry(
        &self,
        collection: Collection,
        name: &str,
        json: &str,
    ) -> Result<Revision, CatalogError> {
        let key = format!("{}{name}", self.collection_prefix(collection));
        self.raw_insert(key, name.to_string(), json.to_string())
    }

    fn update_entry(
        &self,
        collection: Collection,
        name: &str,
        json: &str,
        expected: Revision,
    ) -> Result<Revision, CatalogError> {
        let key = format!("{}{name}", self.collection_prefix(collection));
        self.raw_swap(key, name.to_string(), Some(json.to_string()), expected)
    }

    fn delete_entry(
        &self,
        collection: Collection,
        name: &str,
        expected: Revision,
    ) -> Result<(), CatalogError> {
        let key = format!("{}{name}", self.collection_prefix(collection));
        self.raw_swap(key, name.to_string(), None, expected)
            .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use basalt_etcd_fixture::EtcdServer;
    use std::time::SystemTime;
    use uuid::Uuid;

    fn record(name: &str) -> VolumeRecord {
        VolumeRecord::new(Uuid::new_v4(), name, 4096, SystemTime::now())
    }

    #[test]
    fn prefix_end_is_the_first_key_past_the_prefix() {
        assert_eq!(prefix_end(b"/basalt/volumes/"), b"/basalt/volumes0");
        assert_eq!(prefix_end(b"a\xff\xff"), b"b");
        assert_eq!(prefix_end(b"\xff"), b"\0");
        assert_eq!(prefix_end(b""), b"\0");
    }

    #[test]
    fn only_unsent_writes_are_retried_elsewhere() {
        use etcd_client::Error::GRpcStatus;
        let no_leader = GRpcStatus(tonic::Status::unavailable("etcdserver: no leader"));
        assert!(may_retry_elsewhere(Access::Read, &no_leader));
        assert!(!may_retry_elsewhere(Access::Write, &no_leader));
        let compacted = GRpcStatus(tonic::Status::out_of_range(
            "mvcc: required revision has been compacted",
        ));
        assert!(!may_retry_elsewhere(Access::Read, &compacted));
        assert!(!may_retry_elsewhere(Access::Write, &compacted));

        // A real refused connection, as etcd-client reports it.
        let refused = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", refused.local_addr().unwrap());
        drop(refused);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let err = rt
            .block_on(async {
                let mut c = Client::connect([endpoint], None).await?;
                c.put("k", "v", None).await
            })
            .unwrap_err();
        assert!(may_retry_elsewhere(Access::Write, &err), "{err:?}");
        assert!(may_retry_elsewhere(Access::Read, &err), "{err:?}");
    }

    #[test]
    fn list_pages_form_one_ordered_snapshot() {
        let etcd = EtcdServer::start().unwrap();
        let cat = EtcdCatalog::connect(EtcdConfig::new([etcd.endpoint()])).unwrap();
        let mut names: Vec<String> = (0..23).map(|i| format!("v{:02}", (i * 7) % 23)).collect();
        for n in &names {
            cat.insert(&record(n)).unwrap();
        }
        // A key just past the prefix range must not leak into the list.
        let outside = format!("{}volumes0", cat.config().prefix);
        cat.handle
            .block_on(cat.members[0].client.kv_client().put(outside, "x", None))
            .unwrap();
        names.sort();
        for page in [1, 2, 5, 22, 23, 24, LIST_PAGE] {
            let got: Vec<String> = cat
                .list_pages(page)
                .unwrap()
                .into_iter()
                .map(|v| v.record.name)
                .collect();
            assert_eq!(got, names, "page size {page}");
        }
    }

    #[test]
    fn records_are_stored_as_the_shared_json_under_the_prefix() {
        let etcd = EtcdServer::start().unwrap();
        let cat =
            EtcdCatalog::connect(EtcdConfig::new([etcd.endpoint()]).with_prefix("/p1/")).unwrap();
        let rec = record("vol");
        let rev = cat.insert(&rec).unwrap();
        let mut kv = cat.members[0].client.kv_client();
        let resp = cat
            .handle
            .block_on(kv.get("/p1/volumes/vol", None))
            .unwrap();
        let entry = &resp.kvs()[0];
        assert_eq!(entry.value(), rec.to_json().as_bytes());
        assert_eq!(Revision::new(entry.mod_revision() as u64), rev);
    }

    #[test]
    fn corrupt_values_are_reported_with_their_key() {
        let etcd = EtcdServer::start().unwrap();
        let cat = EtcdCatalog::connect(EtcdConfig::new([etcd.endpoint()])).unwrap();
        let mut kv = cat.members[0].client.kv_client();
        cat.handle
            .block_on(kv.put("/basalt/volumes/bad", "{not json", None))
            .unwrap();
        let other = record("other").to_json();
        cat.handle
            .block_on(kv.put("/basalt/volumes/misnamed", other, None))
            .unwrap();
        for (name, err) in [
            ("bad", cat.get("bad").unwrap_err()),
            ("misnamed", cat.get("misnamed").unwrap_err()),
        ] {
            match err {
                CatalogError::Corrupt { key, .. } => {
                    assert_eq!(key, format!("/basalt/volumes/{name}"))
                }
                other => panic!("expected Corrupt for {name}, got {other}"),
            }
        }
        assert!(matches!(cat.list(), Err(CatalogError::Corrupt { .. })));
    }

    #[test]
    fn bad_configurations_are_refused() {
        for config in [
            EtcdConfig::new(Vec::<String>::new()),
            EtcdConfig::new(["http://127.0.0.1:1"])
                .with_timeouts(Duration::ZERO, Duration::from_secs(1)),
            EtcdConfig::new(["http://bad host:2379"]),
        ] {
            let err = EtcdCatalog::connect(config.clone()).unwrap_err();
            assert!(matches!(err, CatalogError::Config(_)), "{config:?}: {err}");
        }
    }
}
