//! Test fixtures: a real store on a `SimDevice` behind a `Subsystems`
//! implementation with an allow-list of host NQNs, and a small NVMe/TCP
//! host built on the wire crate that talks to the target over a real TCP
//! socket.

#![allow(dead_code)]

use basalt_frontend_nvme::{
    NvmeServer, OpenError, PathState, ServerLimits, Subsystems, TargetConfig,
};
use basalt_store::{FormatOptions, SimDevice, Store, VolumeId};
use basalt_volume::{VolumeHandle, VolumeStats};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod host;
/// A stand-in for a replicated volume's data path (the NBD frontend's
/// tests use it too).
#[path = "../../../frontend-nbd/tests/common/relayed.rs"]
pub mod relayed;
pub use host::*;

pub fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_test_writer()
        .try_init();
}

/// Volumes of one store; every volume is visible to the allowed hosts.
/// Every path is in the state [`StoreSubsystems::set_path_state`] last
/// set (initially optimized).
pub struct StoreSubsystems {
    pub store: Arc<Store>,
    volumes: Mutex<BTreeMap<String, (VolumeId, Arc<VolumeStats>)>>,
    allowed: Vec<String>,
    path: Mutex<PathState>,
    /// Opens get a replicated volume's kind of data path
    /// ([`relayed::Relayed`]) over the store's volume, its batches
    /// completing after up to this many µs (`u64::MAX`: the store's own
    /// data path).
    pub relay_delay_us: std::sync::atomic::AtomicU64,
}

impl StoreSubsystems {
    pub fn sim(device_size: u64, allowed: &[&str]) -> Arc<StoreSubsystems> {
        StoreSubsystems::on_device(SimDevice::new(device_size, 7), allowed)
    }

    /// A store on a data file in `dir` (its I/O goes to an event loop's
    /// ring).
    pub fn file(dir: &std::path::Path, device_size: u64, allowed: &[&str]) -> Arc<StoreSubsystems> {
        let device = basalt_store::FileDevice::create(&dir.join("basalt.data"), device_size, false)
            .expect("create data file");
        StoreSubsystems::on_device(device, allowed)
    }

    fn on_device(
        device: Arc<dyn basalt_store::BlockDevice>,
        allowed: &[&str],
    ) -> Arc<StoreSubsystems> {
        let store = Store::create(
            device,
            &FormatOptions {
                extent_size: Some(64 * KIB as u32),
                ..Default::default()
            },
        )
        .expect("format test store");
        Arc::new(StoreSubsystems {
            store,
            volumes: Mutex::new(BTreeMap::new()),
            allowed: allowed.iter().map(|s| s.to_string()).collect(),
            path: Mutex::new(PathState::Optimized),
            relay_delay_us: std::sync::atomic::AtomicU64::new(u64::MAX),
        })
    }

    pub fn add_volume(&self, name: &str, size: u64) -> VolumeId {
        let id = uuid::Uuid::new_v4();
        self.store.create_volume(id, size).expect("create volume");
        self.volumes
            .lock()
            .insert(name.to_owned(), (id, Arc::new(VolumeStats::default())));
        id
    }

    pub fn id_of(&self, name: &str) -> VolumeId {
        self.volumes.lock().get(name).expect("volume").0
    }

    pub fn resize(&self, name: &str, size: u64) {
        let (id, _) = self.volumes.lock().get(name).cloned().expect("volume");
        self.store.resize_volume(id, size).expect("resize");
    }

    pub fn set_path_state(&self, state: PathState) {
        *self.path.lock() = state;
    }

    pub fn open_handles(&self, name: &str) -> usize {
        self.volumes
            .lock()
            .get(name)
            .map_or(0, |(_, stats)| stats.open_handles())
    }
}

impl Subsystems for StoreSubsystems {
    fn visible(&self, host_nqn: &str) -> Vec<String> {
        if self.allowed.iter().any(|h| h == host_nqn) {
            self.volumes.lock().keys().cloned().collect()
        } else {
            Vec::new()
        }
    }

    fn open(&self, host_nqn: &str, volume: &str) -> Result<VolumeHandle, OpenError> {
        let (id, stats) = self
            .volumes
            .lock()
            .get(volume)
            .cloned()
            .ok_or(OpenError::NotFound)?;
        if !self.allowed.iter().any(|h| h == host_nqn) {
            return Err(OpenError::HostNotAllowed);
        }
        let local = self
            .store
            .volume(id)
            .map_err(|e| OpenError::Failed(e.to_string()))?;
        let delay = self
            .relay_delay_us
            .load(std::sync::atomic::Ordering::Relaxed);
        if delay != u64::MAX {
            let io = relayed::Relayed::with_delay(local, delay);
            return Ok(VolumeHandle::clustered(io, id, volume.to_owned(), stats));
        }
        Ok(VolumeHandle::new(local, volume.to_owned(), stats))
    }

    fn path_state(&self, _volume: &VolumeHandle) -> PathState {
        *self.path.lock()
    }
}

/// Limits of the test target: small MAXH2CDATA and in-capsule size so that
/// test-sized transfers need several PDUs.
pub fn test_limits() -> ServerLimits {
    ServerLimits {
        in_capsule_data: 8192,
        max_h2c_data: 32 * KIB as u32,
        max_transfer: 1024 * 1024,
        connect_timeout: Duration::from_secs(5),
        ..ServerLimits::default()
    }
}

/// A target on 127.0.0.1:0 over a fresh simulated store with the given
/// volumes, allowing [`HOST_NQN`].
pub fn target_with(volumes: &[(&str, u64)]) -> (NvmeServer, Arc<StoreSubsystems>) {
    target_with_limits(volumes, test_limits())
}

/// [`target_with`] with explicit limits.
pub fn target_with_limits(
    volumes: &[(&str, u64)],
    limits: ServerLimits,
) -> (NvmeServer, Arc<StoreSubsystems>) {
    target_with_config(
        volumes,
        TargetConfig {
            limits,
            ..TargetConfig::default()
        },
    )
}

/// [`target_with`] with an explicit configuration (the advertised address
/// is always 192.0.2.7:4420).
pub fn target_with_config(
    volumes: &[(&str, u64)],
    config: TargetConfig,
) -> (NvmeServer, Arc<StoreSubsystems>) {
    target_on(
        StoreSubsystems::sim(256 * MIB, &[HOST_NQN]),
        volumes,
        config,
    )
}

/// A target (test limits, event loops) over a fresh store on a data file in
/// `dir`, whose device I/O goes to the loops' rings.
pub fn file_target(dir: &std::path::Path, volumes: &[(&str, u64)]) -> NvmeServer {
    let subsystems = StoreSubsystems::file(dir, 256 * MIB, &[HOST_NQN]);
    let config = TargetConfig {
        limits: test_limits(),
        ..TargetConfig::default()
    };
    target_on(subsystems, volumes, config).0
}

/// Limits of a target that serves every queue on its own thread.
pub fn thread_limits() -> ServerLimits {
    ServerLimits {
        event_loops: 0,
        ..test_limits()
    }
}

/// A target over `subsystems` with the given volumes.
pub fn target_on(
    subsystems: Arc<StoreSubsystems>,
    volumes: &[(&str, u64)],
    config: TargetConfig,
) -> (NvmeServer, Arc<StoreSubsystems>) {
    init_logging();
    for (name, size) in volumes {
        subsystems.add_volume(name, *size);
    }
    let server = NvmeServer::start_with(
        "127.0.0.1:0".parse().expect("address"),
        Arc::clone(&subsystems) as Arc<dyn Subsystems>,
        TargetConfig {
            advertise: Some("192.0.2.7:4420".parse().expect("address")),
            ..config
        },
    )
    .expect("start target");
    (server, subsystems)
}

/// Waits until `cond` holds (polling), failing the test after 10 s.
pub fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}
