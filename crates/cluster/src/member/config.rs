//! How this node joins a cluster: its name, addresses, etcd, and the
//! protocol's timing.

use crate::meta::EtcdConfig;
use crate::secret::ClusterSecret;
use std::net::SocketAddr;
use std::time::Duration;

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
    pub iscsi_addr: Option<SocketAddr>,
    pub api_addr: Option<SocketAddr>,
    pub etcd: EtcdConfig,
    /// The secret every node of the cluster holds; peer connections are
    /// authenticated with it (see `secret`).
    pub secret: ClusterSecret,
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
    pub fn new(
        name: impl Into<String>,
        peer_listen: SocketAddr,
        etcd: EtcdConfig,
        secret: ClusterSecret,
    ) -> Self {
        MemberConfig {
            name: name.into(),
            zone: None,
            peer_listen,
            peer_advertise: None,
            nbd_addr: None,
            nvme_addr: None,
            iscsi_addr: None,
            api_addr: None,
            etcd,
            secret,
            node_ttl: Duration::from_secs(3),
            timing: Timing::default(),
            request_deadline: Duration::from_secs(60),
            log_dir: None,
            overcommit_ratio: 2.0,
        }
    }
}
