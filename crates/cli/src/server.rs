//! `basalt server`: runs an all-in-one node — control plane, store, NBD and
//! NVMe/TCP frontends in one process — on a data directory.
//!
//! Start-up order, each step needing the one before:
//! 1. open the catalog (its file lock makes this the only server on the
//!    directory),
//! 2. open the store, or at first start create the data file (or format
//!    `--device`) and write `node.json`,
//! 3. load or generate the admin token,
//! 4. reconcile the store with the catalog, create the demo volume,
//! 5. bind the NBD, NVMe/TCP and API listeners, then write `server.json`.
//!
//! Shutdown (SIGTERM or SIGINT): stop NBD and NVMe/TCP (disconnects
//! clients), stop the
//! API, close the store (flush, mark clean), remove `server.json`. The store
//! is closed whenever it was opened, even if a later step failed.

use crate::datadir::{self, Backing, DataDir, NodeConfig, ServerInfo};
use crate::exports::{CatalogPskKeys, VolumeExports};
use crate::iscsi_targets::VolumeTargets;
use crate::subsystems::VolumeSubsystems;
use anyhow::{anyhow, bail, Context, Result};
use basalt_catalog::{Catalog, EtcdCatalog, EtcdConfig, RedbCatalog};
use basalt_cluster::secret::ClusterSecret;
use basalt_cluster::{ClientAddrs, ClusterMember, MemberConfig};
use basalt_frontend_iscsi::IscsiServer;
use basalt_frontend_nbd::{Listen, NbdServer, ServerLimits, TlsPsk};
use basalt_frontend_nvme::{cluster_cntlid_range, NvmeServer, TargetConfig};
use basalt_store::{BlockDevice, FileDevice, FormatOptions, OpenOptions, Store};
use basalt_volume::{
    format_size, parse_size, validate_volume_name, validate_volume_size, KeySource, Keyring,
    VolumeError, VolumeService, DEFAULT_OVERCOMMIT_RATIO,
};
use clap::Args;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// How long in-flight API requests may take to finish at shutdown.
const API_DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Args, Debug)]
pub struct ServerArgs {
    /// Size of the data file DIR/basalt.data, created at first start (e.g.
    /// 20G); ignored on later starts.
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true)]
    pub capacity: Option<String>,

    /// Keep the store on this block device (or existing file) instead of a
    /// data file; it is formatted at first start.
    #[arg(long, value_name = "PATH")]
    pub device: Option<PathBuf>,

    /// Allocate the whole data file at first start instead of a sparse file.
    #[arg(long, conflicts_with = "device")]
    pub preallocate: bool,

    /// Volume sizes may add up to store capacity x this ratio.
    #[arg(long, default_value_t = DEFAULT_OVERCOMMIT_RATIO, value_parser = parse_ratio, value_name = "RATIO")]
    pub overcommit: f64,

    /// NBD's Unix socket, for clients on this host (QEMU, qemu-img,
    /// nbdinfo, nbd-client -unix). Created 0600, so only this server's user
    /// may connect unless the operator changes its mode or group (the data
    /// directory is 0700: to share the socket, put it elsewhere).
    /// Default: nbd.sock in the data directory.
    #[arg(long, value_name = "PATH")]
    pub nbd_socket: Option<PathBuf>,

    /// Serve NBD over TCP with TLS and pre-shared keys on ADDR: a client
    /// must complete STARTTLS with a key from `basalt nbd-key create`
    /// before anything else, and sees the volumes of the key's project
    /// (qemu: tls-creds-psk; libnbd: nbds://IDENTITY@ADDR/VOLUME?tls-psk-file=FILE).
    /// With --nbd-insecure: plain TCP instead. Port 0 picks a free port;
    /// ":PORT" means 127.0.0.1:PORT.
    #[arg(long, value_parser = parse_listen, value_name = "ADDR")]
    pub nbd_listen: Option<SocketAddr>,

    /// Serve NBD over plain TCP (on --nbd-listen, default 127.0.0.1:10809)
    /// instead of TLS. Plain NBD has no authentication: whoever reaches the
    /// address can read and write every volume. The server warns about it
    /// when it starts.
    #[arg(long)]
    pub nbd_insecure: bool,

    /// Event loops serving NBD connections and NVMe/TCP I/O queues, shared
    /// by both (each connection lives on one loop, which receives, executes
    /// and answers its requests without a thread hand-off; a replicated
    /// volume's requests go to its primary in batches, completed through
    /// the loop's mailbox). Default: one per CPU. 0 serves every NBD
    /// connection with lanes (`--nbd-lanes`) and every NVMe/TCP queue on
    /// its own thread instead.
    #[arg(long, alias = "nbd-event-loops", value_name = "N",
        value_parser = clap::value_parser!(u32).range(0..=256))]
    pub event_loops: Option<u32>,

    /// Threads per NBD connection not served by an event loop (with
    /// `--event-loops 0`): with 2 or more, one
    /// gathers a pipelining client's next requests while another waits for
    /// the disk.
    #[arg(long, default_value_t = basalt_frontend_nbd::DEFAULT_LANES_PER_CONNECTION as u32,
        value_parser = clap::value_parser!(u32).range(1..=16), value_name = "N")]
    pub nbd_lanes: u32,

    /// Most connections one IP address may hold open at once, to NBD, to
    /// NVMe/TCP and to iSCSI each (default: 64 NBD, 256 NVMe/TCP queues or
    /// iSCSI connections; of 1024 in total per frontend), so that one host
    /// cannot lock every other out. A client must also finish each step of
    /// its handshake within --handshake-timeout.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024), value_name = "N")]
    pub max_connections_per_address: Option<u32>,

    /// Seconds a client has for each step of connecting: an NBD client for
    /// each read of its handshake, an NVMe/TCP host for ICReq and Connect,
    /// an iSCSI initiator for its login. A connection that is slower is
    /// closed, so stalled sockets cannot hold places. (Negotiated
    /// connections may idle; one whose host vanished is found by TCP
    /// keepalive within about a minute.)
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600), value_name = "SECS")]
    pub handshake_timeout: u64,

    /// How often the background scrubber reads each volume whole, checking
    /// every block against its checksum (e.g. 7d, 12h, 30m; 0 turns it
    /// off). Passes are spread over a tenth of the interval.
    #[arg(long, default_value = "7d", value_parser = parse_interval, value_name = "DURATION")]
    pub scrub_interval: Duration,

    /// Most bytes per second the background scrubber reads (e.g. 16M).
    #[arg(long, default_value = "16M", value_parser = parse_rate, value_name = "BYTES")]
    pub scrub_rate: u64,

    /// Most logical bytes per second the background compactor compresses
    /// (e.g. 32M; 0 turns it off): it compresses the data of compressed
    /// volumes (`volume create --compression`) not written for
    /// `--compact-after`.
    /// `basalt volume compact` works either way. [default: 32M]
    #[arg(long, value_parser = parse_rate_or_off, value_name = "BYTES")]
    pub compaction_rate: Option<u64>,

    /// How long data of a compressed volume must go unwritten before the
    /// background compactor compresses it (a write to compressed data
    /// decompresses its extent first, so data still being written is
    /// better left alone).
    #[arg(long, default_value = "10m", value_parser = parse_interval, value_name = "DURATION")]
    pub compact_after: Duration,

    /// The master key of encrypted volumes: a file of 64 hex digits, mode
    /// 0600 (refused otherwise). A missing file is created with a fresh
    /// random key: keep a copy, as the volumes cannot be read without it.
    #[arg(long, value_name = "PATH", conflicts_with = "master_key_command")]
    pub master_key_file: Option<PathBuf>,

    /// Get the master key from a command that prints its 64 hex digits
    /// (run with sh -c at start; e.g. a Vault, Barbican or KMS client).
    #[arg(long, value_name = "CMD")]
    pub master_key_command: Option<String>,

    /// NVMe/TCP listen address (port 0 picks a free port; ":PORT" means 127.0.0.1:PORT).
    #[arg(long, default_value = "127.0.0.1:4420", value_parser = parse_listen, value_name = "ADDR")]
    pub nvme_listen: SocketAddr,

    /// Address NVMe discovery log pages report for this node (default: the
    /// NVMe listen address).
    #[arg(long, value_parser = parse_listen, value_name = "ADDR")]
    pub nvme_advertise: Option<SocketAddr>,

    /// Host NQN allowed to discover and connect to every volume over
    /// NVMe/TCP (repeatable). Without it no NVMe host may connect.
    #[arg(long = "nvme-allow-host", value_name = "NQN", value_parser = parse_host_nqn)]
    pub nvme_allow_hosts: Vec<String>,

    /// iSCSI listen address (port 0 picks a free port; ":PORT" means 127.0.0.1:PORT).
    #[arg(long, default_value = "127.0.0.1:3260", value_parser = parse_listen, value_name = "ADDR")]
    pub iscsi_listen: SocketAddr,

    /// Portal SendTargets reports for this node (default: the iSCSI listen
    /// address).
    #[arg(long, value_parser = parse_listen, value_name = "ADDR")]
    pub iscsi_advertise: Option<SocketAddr>,

    /// Initiator IQN allowed to discover and log in to every volume over
    /// iSCSI (repeatable). Without it only initiators attached to a volume
    /// (basalt volume attach VOL --initiator-iqn IQN) may log in.
    #[arg(long = "iscsi-allow-initiator", value_name = "IQN", value_parser = parse_initiator_iqn)]
    pub iscsi_allow_initiators: Vec<String>,

    /// REST API listen address (port 0 picks a free port; ":PORT" means 127.0.0.1:PORT).
    #[arg(long, default_value = "127.0.0.1:8080", value_parser = parse_listen, value_name = "ADDR")]
    pub api_listen: SocketAddr,

    /// Create this volume if absent and print how to use it, e.g. demo:10G.
    #[arg(long, value_name = "NAME:SIZE")]
    pub demo_volume: Option<String>,

    /// Join a cluster whose metadata lives in etcd at these client URLs
    /// (comma-separated, e.g. http://10.0.0.1:2379,http://10.0.0.2:2379).
    /// Without it the node is a single-node server with embedded metadata.
    #[arg(long, value_name = "URL[,URL...]", value_delimiter = ',', requires_all = ["node_name", "peer_listen", "cluster_secret_file"])]
    pub etcd: Vec<String>,

    /// File holding the secret every node of the cluster shares (64 hex
    /// digits, mode 0600): peer connections prove both ends hold it, so a
    /// process that can reach the peer port or read etcd cannot join the
    /// replication stream. A missing file is created with a fresh secret;
    /// copy it to every other node.
    #[arg(long, value_name = "PATH")]
    pub cluster_secret_file: Option<PathBuf>,

    /// Key prefix of this cluster in etcd (several clusters may share one etcd).
    #[arg(long, default_value = basalt_catalog::DEFAULT_ETCD_PREFIX, value_name = "PREFIX")]
    pub etcd_prefix: String,

    /// This node's name in the cluster (stable across restarts).
    #[arg(long, value_name = "NAME")]
    pub node_name: Option<String>,

    /// Address the node-to-node replication protocol listens on (a fixed
    /// port: peers find it in etcd; ":PORT" means 127.0.0.1:PORT).
    #[arg(long, value_parser = parse_listen, value_name = "ADDR")]
    pub peer_listen: Option<SocketAddr>,

    /// Address peers should dial for this node (default: --peer-listen).
    #[arg(long, value_parser = parse_listen, value_name = "ADDR")]
    pub peer_advertise: Option<SocketAddr>,

    /// Failure domain of this node (rack, room …): replicas of a volume go to
    /// distinct zones where possible.
    #[arg(long, value_name = "ZONE")]
    pub zone: Option<String>,

    /// Replication timing: primary lease in milliseconds (failover takes
    /// lease + grace after a primary is lost).
    #[arg(long, default_value_t = 1500, value_name = "MS", hide = true)]
    pub lease_ms: u64,

    /// A replica whose node stays unreachable this long (seconds) is rebuilt
    /// on another node; a shorter outage only resyncs what changed.
    #[arg(long, default_value_t = 600, value_name = "SECS")]
    pub replace_after: u64,

    /// Cap on resync and rebuild copies this node makes, in MiB/s (0: no
    /// cap), shared by the volumes it copies as primary.
    /// The default leaves client I/O most of the disk and network.
    #[arg(long, default_value_t = 64, value_name = "MIB_PER_S")]
    pub resync_rate: u64,
}

/// `--demo-volume NAME:SIZE`.
#[derive(Clone, Debug)]
pub struct DemoVolume {
    pub name: String,
    pub size: u64,
}

fn parse_ratio(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(r) if r.is_finite() && r > 0.0 => Ok(r),
        _ => Err(format!(
            "{s:?} is not a positive number (e.g. 1.0 for no overcommit, 2.0)"
        )),
    }
}

/// A duration such as `7d`, `12h`, `30m`, `90s` (a bare number is seconds).
fn parse_interval(s: &str) -> Result<Duration, String> {
    let (digits, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (e.g. 7d, 12h, 30m, 90s)"))?;
    let scale = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86400,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (use s, m, h or d)")),
    };
    n.checked_mul(scale)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("{s:?} is too long"))
}

/// A positive byte rate such as `16M`.
fn parse_rate(s: &str) -> Result<u64, String> {
    match basalt_volume::parse_size(s) {
        Ok(0) => Err(format!("{s:?}: the rate must be more than 0")),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// A byte rate such as `32M`, or 0 (off).
fn parse_rate_or_off(s: &str) -> Result<u64, String> {
    basalt_volume::parse_size(s).map_err(|e| e.to_string())
}

/// A listen address: `IP:PORT`, `localhost:PORT` or `:PORT` (loopback).
/// NBD's TCP port unless --nbd-listen says otherwise.
const DEFAULT_NBD_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 10809);

impl ServerArgs {
    /// Where NBD over TCP listens, when it does (--nbd-listen or
    /// --nbd-insecure).
    fn nbd_tcp_listen(&self) -> SocketAddr {
        self.nbd_listen.unwrap_or(DEFAULT_NBD_LISTEN)
    }
}

fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    let loopback = |port: &str| {
        port.parse::<u16>()
            .map(|p| SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), p))
            .map_err(|_| format!("{s:?}: {port:?} is not a port number"))
    };
    if let Some(port) = s.strip_prefix(':') {
        return loopback(port);
    }
    if let Some(port) = s.strip_prefix("localhost:") {
        return loopback(port);
    }
    s.parse().map_err(|_| {
        format!("{s:?} is not a listen address; use IP:PORT, e.g. 127.0.0.1:8080 or [::1]:8080")
    })
}

/// A host NQN for `--nvme-allow-host`.
fn parse_host_nqn(s: &str) -> Result<String, String> {
    if s.is_empty()
        || s.len() > basalt_frontend_nvme::NQN_MAX_LEN
        || !s.chars().all(|c| c.is_ascii_graphic())
    {
        return Err(format!(
            "{s:?} is not a host NQN (1 to 223 printable ASCII characters, e.g. the content of /etc/nvme/hostnqn)"
        ));
    }
    Ok(s.to_string())
}

/// An initiator name for `--iscsi-allow-initiator`.
fn parse_initiator_iqn(s: &str) -> Result<String, String> {
    basalt_volume::validate_iscsi_name(s).map_err(|e| e.to_string())?;
    Ok(s.to_string())
}

fn parse_demo(s: &str) -> Result<DemoVolume> {
    let (name, size) = s
        .split_once(':')
        .ok_or_else(|| anyhow!("--demo-volume {s:?} is not NAME:SIZE (e.g. demo:10G)"))?;
    validate_volume_name(name)?;
    let size = parse_size(size)?;
    validate_volume_size(size)?;
    Ok(DemoVolume {
        name: name.to_string(),
        size,
    })
}

/// The address clients should use for a bound address (a wildcard bind is
/// reachable on loopback).
fn client_addr(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), addr.port())
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), addr.port())
        }
        _ => addr,
    }
}

/// `ServerArgs` with the values clap leaves as text checked.
struct Settings {
    capacity: Option<u64>,
    demo_volume: Option<DemoVolume>,
    /// The master key of encrypted volumes (loaded before anything else,
    /// so a bad key file stops the start with nothing created).
    keyring: Option<Arc<Keyring>>,
}

/// The master key `--master-key-file` or `--master-key-command` gives.
fn load_keyring(args: &ServerArgs) -> Result<Option<Arc<Keyring>>> {
    let source = match (&args.master_key_file, &args.master_key_command) {
        (Some(path), _) => KeySource::File(path.clone()),
        (None, Some(cmd)) => KeySource::Command(cmd.clone()),
        (None, None) => return Ok(None),
    };
    let keyring = Keyring::load(source).context("cannot load the master key")?;
    tracing::info!(
        master_key = format!("{:08x}", keyring.current().id()),
        "master key loaded"
    );
    Ok(Some(Arc::new(keyring)))
}

/// Runs the node on `data_dir` until SIGTERM or SIGINT.
pub fn run(args: ServerArgs, data_dir: &Path) -> Result<()> {
    let settings = Settings {
        capacity: args
            .capacity
            .as_deref()
            .map(parse_size)
            .transpose()
            .context("--capacity")?,
        demo_volume: args.demo_volume.as_deref().map(parse_demo).transpose()?,
        keyring: load_keyring(&args)?,
    };
    datadir::private_umask();
    let data = DataDir::new(data_dir);
    data.create()?;
    let node = data.read_node()?;
    if !args.etcd.is_empty() {
        let config = EtcdConfig::new(args.etcd.clone()).with_prefix(args.etcd_prefix.clone());
        let catalog: Arc<dyn Catalog> =
            Arc::new(EtcdCatalog::connect(config).context("cannot reach the cluster's etcd")?);
        let store = open_store(&data, node, &args, &settings)?;
        let result = serve(&data, catalog, store.clone(), &args, &settings);
        return close(&data, &store, result);
    }
    if node.is_some() && !data.catalog().exists() {
        bail!(
            "{} is missing, but {} shows this node was initialised; refusing to start, because \
             reconciling with an empty catalog would delete every volume in the store. Restore the \
             catalog, or move the data directory aside to start afresh",
            data.catalog().display(),
            data.node_json().display()
        );
    }
    let catalog = Arc::new(RedbCatalog::open(data.catalog())?);
    let store = open_store(&data, node, &args, &settings)?;

    let result = serve(&data, catalog, store.clone(), &args, &settings);
    close(&data, &store, result)
}

/// Closes the store and removes `server.json`, whatever `result` is.
fn close(data: &DataDir, store: &Store, result: Result<()>) -> Result<()> {
    let closed = store
        .close()
        .context("cannot close the store cleanly; it will recover at next start");
    let removed = data.remove_server();
    if result.is_ok() && closed.is_ok() {
        tracing::info!("store closed cleanly");
    }
    result.and(closed).and(removed)
}

/// Opens the node's store, creating it at first start.
fn open_store(
    data: &DataDir,
    node: Option<NodeConfig>,
    args: &ServerArgs,
    settings: &Settings,
) -> Result<Arc<Store>> {
    if let Some(node) = node {
        return open_existing_store(node, args, settings);
    }
    let (device, backing): (Arc<dyn BlockDevice>, Backing) = match &args.device {
        Some(path) => {
            let device = FileDevice::open(path)
                .with_context(|| format!("cannot open device {}", path.display()))?;
            // Read-only: opening would write (and upgrade) the store.
            if basalt_store::inspect(device.as_ref()).is_ok() {
                bail!(
                    "{} already holds a basalt store, but {} has no node.json; refusing to format it. \
                     Start with the data directory it was set up with, or wipe its first MiB to reuse it",
                    path.display(),
                    data.root().display()
                );
            }
            if settings.capacity.is_some() {
                tracing::info!("--capacity ignored: the store takes the whole device");
            }
            (device, Backing::Device { path: path.clone() })
        }
        None => {
            let capacity = settings.capacity.ok_or_else(|| {
                anyhow!(
                    "--capacity is required the first time: it sizes the data file {} (e.g. --capacity 20G)",
                    data.data_file().display()
                )
            })?;
            let path = data.data_file();
            if path.exists() {
                bail!(
                    "{} exists but {} does not: an earlier first start did not finish. \
                     Remove the data file to start afresh",
                    path.display(),
                    data.node_json().display()
                );
            }
            let device = FileDevice::create(&path, capacity, args.preallocate)
                .with_context(|| format!("cannot create data file {}", path.display()))?;
            let backing = Backing::File {
                path,
                capacity_bytes: capacity / 4096 * 4096,
                preallocated: args.preallocate,
            };
            (device, backing)
        }
    };
    let store = match Store::create_with(device, &FormatOptions::default(), &store_options(args)) {
        Ok(store) => store,
        Err(e) => {
            if let Backing::File { path, .. } = &backing {
                let _ = std::fs::remove_file(path);
            }
            return Err(e).context("cannot create the store");
        }
    };
    data.write_node(&NodeConfig {
        backing: backing.clone(),
        store_id: store.store_id().to_string(),
    })?;
    let usage = store.usage();
    tracing::info!(
        backing = %backing.path().display(),
        capacity = %format_size(usage.capacity_bytes),
        extent_size = %format_size(usage.extent_size),
        "created a new store"
    );
    Ok(store)
}

/// How the store runs: background zeroing, cooling, scrubbing and
/// compaction.
fn store_options(args: &ServerArgs) -> OpenOptions {
    let defaults = OpenOptions::default();
    OpenOptions {
        scrub_interval: (!args.scrub_interval.is_zero()).then_some(args.scrub_interval),
        scrub_rate: args.scrub_rate,
        compaction_rate: match args.compaction_rate {
            None => defaults.compaction_rate,
            Some(0) => None,
            Some(rate) => Some(rate),
        },
        compact_after: args.compact_after,
        // Looked for at least as often as data can turn cold.
        compaction_interval: defaults
            .compaction_interval
            .min(args.compact_after.max(Duration::from_secs(1))),
        // Idleness is counted in cooling rounds: a short wait needs short
        // rounds.
        cooling_interval: defaults
            .cooling_interval
            .min(args.compact_after.max(Duration::from_millis(100))),
        ..defaults
    }
}

fn open_existing_store(
    node: NodeConfig,
    args: &ServerArgs,
    settings: &Settings,
) -> Result<Arc<Store>> {
    match (&node.backing, &args.device) {
        (Backing::Device { path }, Some(dev)) if path != dev => bail!(
            "this node's store is on {}; --device {} does not match",
            path.display(),
            dev.display()
        ),
        (Backing::File { path, .. }, Some(dev)) => bail!(
            "this node's store is in the data file {}; drop --device {}",
            path.display(),
            dev.display()
        ),
        (Backing::File { capacity_bytes, .. }, None) => {
            if let Some(requested) = settings.capacity {
                if requested / 4096 * 4096 != *capacity_bytes {
                    tracing::info!(
                        "--capacity {} ignored: the data file was created with {}",
                        format_size(requested),
                        format_size(*capacity_bytes)
                    );
                }
            }
        }
        _ => {}
    }
    if args.preallocate {
        tracing::info!("--preallocate ignored: it applies only when the data file is created");
    }
    let path = node.backing.path();
    let device =
        FileDevice::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let store = Store::open_with(device, &store_options(args))
        .with_context(|| format!("cannot open the store on {}", path.display()))?;
    if store.store_id().to_string() != node.store_id {
        bail!(
            "{} holds store {}, but this data directory belongs to store {}",
            path.display(),
            store.store_id(),
            node.store_id
        );
    }
    Ok(store)
}

/// Everything between opening the store and closing it.
fn serve(
    data: &DataDir,
    catalog: Arc<dyn Catalog>,
    store: Arc<Store>,
    args: &ServerArgs,
    settings: &Settings,
) -> Result<()> {
    let token = data.load_or_create_token()?;
    let member = if args.etcd.is_empty() {
        None
    } else {
        Some(Arc::new(join_cluster(
            args,
            data.root(),
            store.clone(),
            catalog.clone(),
        )?))
    };
    let mut service = VolumeService::new(catalog, store, args.overcommit)?;
    if let Some(m) = &member {
        service = service.with_cluster(m.clone());
    }
    if let Some(keyring) = &settings.keyring {
        service = service.with_keyring(keyring.clone());
    }
    let service = Arc::new(service);
    if let Some(m) = &member {
        // QoS changed through another node applies here at once.
        let weak = Arc::downgrade(&service);
        m.on_volume_record(Box::new(move |record| {
            if let Some(service) = weak.upgrade() {
                service.volume_record_changed(record);
            }
        }));
        // `volume disconnect`, a forced rollback or delete through another
        // node drops this node's clients too.
        let weak = Arc::downgrade(&service);
        m.on_disconnect_request(Box::new(move |name| {
            if let Some(service) = weak.upgrade() {
                service.drop_clients_here(name);
            }
        }));
    }
    let result = serve_frontends(data, &service, member.as_deref(), token, args, settings);
    if let Some(m) = member {
        m.shutdown();
    }
    result
}

/// Starts this node's cluster membership (`--etcd`).
fn join_cluster(
    args: &ServerArgs,
    data_dir: &Path,
    store: Arc<Store>,
    catalog: Arc<dyn Catalog>,
) -> Result<ClusterMember> {
    let (Some(name), Some(peer)) = (&args.node_name, args.peer_listen) else {
        bail!("--etcd needs --node-name and --peer-listen");
    };
    validate_volume_name(name)
        .map_err(|_| anyhow!("--node-name {name:?}: use 1-64 characters of A-Z a-z 0-9 . _ -"))?;
    let Some(secret_file) = &args.cluster_secret_file else {
        bail!("--etcd needs --cluster-secret-file (the secret every node shares; a missing file is created)");
    };
    let (secret, created) = ClusterSecret::load_or_create(secret_file)?;
    if created {
        tracing::warn!(path = %secret_file.display(),
            "created a new cluster secret: copy this file to every other node of the cluster");
    }
    let etcd = EtcdConfig::new(args.etcd.clone()).with_prefix(args.etcd_prefix.clone());
    let mut cfg = MemberConfig::new(name.clone(), peer, etcd, secret);
    cfg.zone = args.zone.clone();
    cfg.peer_advertise = args.peer_advertise;
    // Plain TCP NBD only where the operator asked for it.
    cfg.nbd_addr = args
        .nbd_insecure
        .then(|| client_addr(args.nbd_tcp_listen()));
    cfg.nvme_addr = Some(args.nvme_advertise.unwrap_or(client_addr(args.nvme_listen)));
    cfg.iscsi_addr = Some(
        args.iscsi_advertise
            .unwrap_or(client_addr(args.iscsi_listen)),
    );
    cfg.api_addr = Some(client_addr(args.api_listen));
    cfg.timing.lease_ms = args.lease_ms.max(100);
    cfg.timing.replace_after = Duration::from_secs(args.replace_after);
    cfg.timing.resync_rate = args.resync_rate.saturating_mul(1 << 20);
    cfg.log_dir = Some(data_dir.to_path_buf());
    cfg.overcommit_ratio = args.overcommit;
    ClusterMember::start(cfg, store, catalog).context("cannot join the cluster")
}

fn serve_frontends(
    data: &DataDir,
    service: &Arc<VolumeService>,
    member: Option<&ClusterMember>,
    token: String,
    args: &ServerArgs,
    settings: &Settings,
) -> Result<()> {
    let node_id = member.map(|m| m.id().0);
    // Before reconciling: a clone it completes inherits an unlocked key.
    service.unlock_volumes();
    service.reconcile()?;
    if let Some(demo) = &settings.demo_volume {
        ensure_demo_volume(service, demo)?;
    }

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("basalt-api")
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        let api_listener = tokio::net::TcpListener::bind(args.api_listen)
            .await
            .with_context(|| format!("cannot listen for the API on {}", args.api_listen))?;
        let api_addr = client_addr(api_listener.local_addr()?);
        // One set of event loops for both frontends: one loop per core,
        // whichever protocol its connections speak.
        let loops = match args.event_loops.map_or_else(basalt_reactor::default_loops, |n| n as usize) {
            0 => None,
            n => Some(basalt_reactor::Reactor::start("basalt-loop", n).context("cannot start the event loops")?),
        };
        let limits = ServerLimits {
            lanes_per_connection: args.nbd_lanes as usize,
            max_connections_per_address: args.max_connections_per_address.map_or(
                basalt_frontend_nbd::DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
                |n| n as usize,
            ),
            handshake_timeout: Duration::from_secs(args.handshake_timeout),
            ..ServerLimits::default()
        };
        let exports: Arc<dyn basalt_frontend_nbd::Exports> = Arc::new(VolumeExports::new(service.clone()));
        let socket = args.nbd_socket.clone().unwrap_or_else(|| data.root().join("nbd.sock"));
        let socket = std::path::absolute(&socket).unwrap_or(socket);
        let tls = match (args.nbd_listen, args.nbd_insecure) {
            (Some(_), false) => Some(Arc::new(
                TlsPsk::new(Arc::new(CatalogPskKeys::new(service.clone())))
                    .context("cannot set up TLS for NBD")?,
            )),
            _ => None,
        };
        let nbd = NbdServers::start(&socket, args, exports, limits, loops.clone(), tls)?;
        for server in nbd.all() {
            service.register_frontend(Arc::new(server.disconnector()));
        }
        let tcp_addr = nbd.tcp.as_ref().and_then(|t| t.local_addr()).map(client_addr);
        let (nbd_addr, nbd_tls_addr) = match args.nbd_insecure {
            true => (tcp_addr, None),
            false => (None, tcp_addr),
        };
        if args.nvme_allow_hosts.is_empty() {
            tracing::info!("no --nvme-allow-host given: no NVMe/TCP host may connect");
        }
        let nvme = match NvmeServer::start_on(
            args.nvme_listen,
            Arc::new(VolumeSubsystems::new(service.clone(), &args.nvme_allow_hosts)),
            TargetConfig {
                advertise: args.nvme_advertise,
                cntlid_range: node_id.map(cluster_cntlid_range),
                port_id: node_id.map(basalt_volume::node_port_id),
                limits: basalt_frontend_nvme::ServerLimits {
                    max_connections_per_address: args.max_connections_per_address.map_or(
                        basalt_frontend_nvme::DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
                        |n| n as usize,
                    ),
                    connect_timeout: Duration::from_secs(args.handshake_timeout),
                    ..basalt_frontend_nvme::ServerLimits::default()
                },
            },
            loops.clone(),
        ) {
            Ok(nvme) => {
                service.register_frontend(Arc::new(nvme.disconnector()));
                nvme
            }
            Err(e) => {
                tokio::task::block_in_place(|| nbd.shutdown());
                return Err(anyhow!(e).context(format!("cannot listen for NVMe/TCP on {}", args.nvme_listen)));
            }
        };
        let nvme_addr = client_addr(nvme.local_addr());
        let iscsi = match IscsiServer::start_on(
            args.iscsi_listen,
            Arc::new(VolumeTargets::new(service.clone(), &args.iscsi_allow_initiators)),
            basalt_frontend_iscsi::TargetConfig {
                advertise: args.iscsi_advertise,
                // Distinct per node: the target port group ALUA reports.
                port_group: node_id.map_or(1, basalt_volume::node_port_id),
                limits: basalt_frontend_iscsi::ServerLimits {
                    max_connections_per_address: args.max_connections_per_address.map_or(
                        basalt_frontend_iscsi::DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
                        |n| n as usize,
                    ),
                    login_timeout: Duration::from_secs(args.handshake_timeout),
                    ..basalt_frontend_iscsi::ServerLimits::default()
                },
            },
            loops.clone(),
        ) {
            Ok(iscsi) => {
                service.register_frontend(Arc::new(iscsi.disconnector()));
                iscsi
            }
            Err(e) => {
                tokio::task::block_in_place(|| {
                    nbd.shutdown();
                    nvme.shutdown();
                });
                return Err(anyhow!(e).context(format!("cannot listen for iSCSI on {}", args.iscsi_listen)));
            }
        };
        let iscsi_addr = client_addr(iscsi.local_addr());
        if let Some(m) = member {
            // The ports bound, not the configured ones (port 0 lets the
            // system pick), for the node registry.
            let addrs = ClientAddrs {
                nbd: nbd_addr,
                nvme: Some(args.nvme_advertise.unwrap_or(nvme_addr)),
                iscsi: Some(args.iscsi_advertise.unwrap_or(iscsi_addr)),
                api: Some(api_addr),
            };
            // An etcd write: off the async worker.
            tokio::task::block_in_place(|| m.set_client_addrs(addrs));
        }

        let (stop_api, api_stopped) = tokio::sync::oneshot::channel::<()>();
        let mut api = tokio::spawn(basalt_api::serve(api_listener, service.clone(), token, async {
            let _ = api_stopped.await;
        }));

        let info = ServerInfo {
            api_url: format!("http://{api_addr}"),
            nbd: nbd_addr.map(|a| a.to_string()),
            nbd_tls: nbd_tls_addr.map(|a| a.to_string()),
            nbd_socket: Some(socket.display().to_string()),
            nvme: Some(nvme_addr.to_string()),
            iscsi: Some(iscsi_addr.to_string()),
            pid: std::process::id(),
        };
        if let Err(e) = data.write_server(&info) {
            tokio::task::block_in_place(|| {
                nbd.shutdown();
                nvme.shutdown();
                iscsi.shutdown();
            });
            return Err(e);
        }
        tracing::info!(api = %info.api_url, nbd_socket = %socket.display(), nbd = ?info.nbd,
            nbd_tls = ?info.nbd_tls, nvme = %nvme_addr, iscsi = %iscsi_addr, "basalt server ready");
        if let Some(demo) = &settings.demo_volume {
            print_demo_usage(&demo.name, &socket, nbd_addr, iscsi_addr, data);
        }

        let outcome = tokio::select! {
            signal = shutdown_signal() => signal.map(|name| tracing::info!("received {name}; shutting down")),
            ended = &mut api => Err(match ended {
                Ok(Ok(())) => anyhow!("the API server stopped unexpectedly"),
                Ok(Err(e)) => anyhow!(e).context("the API server failed"),
                Err(e) => anyhow!(e).context("the API server task failed"),
            }),
        };

        tokio::task::block_in_place(|| {
            nbd.shutdown();
            nvme.shutdown();
            iscsi.shutdown();
            if let Some(loops) = &loops {
                loops.stop();
            }
        });
        let _ = stop_api.send(());
        if !api.is_finished() {
            match tokio::time::timeout(API_DRAIN_TIMEOUT, &mut api).await {
                Ok(Ok(Err(e))) => tracing::error!(error = %e, "API server error at shutdown"),
                Ok(_) => {}
                Err(_) => {
                    tracing::warn!("API requests still running after {API_DRAIN_TIMEOUT:?}; dropping them");
                    api.abort();
                }
            }
        }
        outcome
    })
}

fn ensure_demo_volume(service: &VolumeService, demo: &DemoVolume) -> Result<()> {
    match service.get(&demo.name) {
        Ok(info) if info.size_bytes != demo.size => {
            tracing::info!(
                volume = %demo.name,
                "demo volume exists with size {}; --demo-volume size {} ignored",
                format_size(info.size_bytes),
                format_size(demo.size)
            );
            Ok(())
        }
        Ok(_) => Ok(()),
        Err(VolumeError::NotFound(_)) => {
            service
                .create(&demo.name, demo.size)
                .with_context(|| format!("cannot create demo volume {:?}", demo.name))?;
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

fn print_demo_usage(
    name: &str,
    socket: &Path,
    tcp: Option<SocketAddr>,
    iscsi: SocketAddr,
    data: &DataDir,
) {
    let path = socket.display();
    let uri = format!("'nbd+unix:///{name}?socket={path}'");
    let dir = data.root().display();
    println!(
        "\nVolume {name:?} is exported over NBD on the Unix socket {path}\n\
         (mode 0600: only this user may connect). Try it as this user:\n  \
         qemu-img info {uri}\n  \
         nbdinfo {uri}\n  \
         fio --name=demo --ioengine=nbd --uri={uri} --rw=randrw --bs=4k --iodepth=16 --runtime=30 --time_based\n  \
         nbd-client -unix {path} /dev/nbd0 -name {name}    (as root, with the nbd module)\n  \
         basalt volume show {name} --data-dir {dir}\n  \
         basalt volume list --data-dir {dir}"
    );
    if let Some(tcp) = tcp {
        println!(
            "Also over plain TCP (--nbd-insecure: no authentication): nbdinfo nbd://{tcp}/{name}"
        );
    }
    let target = basalt_volume::iscsi_target_name(name);
    println!(
        "Over iSCSI ({iscsi}, target {target}) once an initiator is let in:\n  \
         basalt volume attach {name} --initiator-iqn IQN --chap --data-dir {dir}"
    );
    println!();
}

/// The NBD servers of a node: the Unix socket always, TCP with
/// --nbd-listen (TLS) or --nbd-insecure (plain); one set of exports, limits
/// and event loops.
struct NbdServers {
    unix: NbdServer,
    tcp: Option<NbdServer>,
}

impl NbdServers {
    fn start(
        socket: &Path,
        args: &ServerArgs,
        exports: Arc<dyn basalt_frontend_nbd::Exports>,
        limits: ServerLimits,
        loops: Option<Arc<basalt_reactor::Reactor>>,
        tls: Option<Arc<TlsPsk>>,
    ) -> Result<NbdServers> {
        let unix = NbdServer::start_on(
            Listen::Unix(socket.to_path_buf()),
            Arc::clone(&exports),
            limits,
            loops.clone(),
        )
        .with_context(|| {
            format!(
                "cannot listen for NBD on the Unix socket {}",
                socket.display()
            )
        })?;
        let addr = args.nbd_tcp_listen();
        let listen = match (tls, args.nbd_insecure) {
            (Some(tls), _) => Some(Listen::Tls(addr, tls)),
            (None, true) => Some(Listen::Tcp(addr)),
            (None, false) => None,
        };
        let tcp = match listen {
            None => None,
            Some(listen) => {
                let server = NbdServer::start_on(listen, exports, limits, loops)
                    .with_context(|| format!("cannot listen for NBD on {addr}"));
                match server {
                    Ok(server) if args.nbd_insecure => {
                        tracing::warn!(listen = %addr,
                            "NBD over plain TCP (--nbd-insecure): anyone who can reach this address can read and write every volume");
                        Some(server)
                    }
                    Ok(server) => {
                        tracing::info!(listen = %addr, "NBD over TLS with pre-shared keys (basalt nbd-key create)");
                        Some(server)
                    }
                    Err(err) => {
                        unix.shutdown();
                        return Err(err);
                    }
                }
            }
        };
        Ok(NbdServers { unix, tcp })
    }

    fn all(&self) -> impl Iterator<Item = &NbdServer> {
        std::iter::once(&self.unix).chain(self.tcp.as_ref())
    }

    fn shutdown(self) {
        self.unix.shutdown();
        if let Some(tcp) = self.tcp {
            tcp.shutdown();
        }
    }
}

/// Waits for SIGTERM or SIGINT; returns which.
async fn shutdown_signal() -> Result<&'static str> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("cannot install the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot install the SIGINT handler")?;
    tokio::select! {
        _ = term.recv() => Ok("SIGTERM"),
        _ = int.recv() => Ok("SIGINT"),
    }
}
