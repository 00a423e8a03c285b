//! Test fixtures: a real store (on a `SimDevice` or a data file) behind a
//! `Targets` implementation with an allow-list of initiator names, CHAP
//! credentials per initiator, a settable ALUA path state and extra port
//! groups; target constructors with small test limits; and a small
//! blocking iSCSI initiator (module `initiator`) built only on
//! basalt-iscsi-wire, talking to the target over real TCP sockets.

#![allow(dead_code)]

use basalt_frontend_iscsi::{
    ChapCredentials, IscsiServer, OpenError, PathState, ServerLimits, TargetConfig, Targets,
};
use basalt_reactor::Reactor;
use basalt_store::{FormatOptions, SimDevice, Store, VolumeId};
use basalt_volume::{VolumeHandle, VolumeStats};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

mod initiator;
mod scsi;
pub use initiator::*;

pub const KIB: u64 = 1024;
pub const MIB: u64 = 1024 * 1024;
/// The initiator every fixture allows.
pub const INITIATOR: &str = "iqn.2026-01.io.basalt.test:initiator";
/// An initiator no fixture allows.
pub const INTRUDER: &str = "iqn.2026-01.io.basalt.test:intruder";

pub fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_test_writer()
        .try_init();
}

/// Panics seen on the target's threads (connections, acceptor, watchdog,
/// event loops and their offload pools) since the process started.
static TARGET_PANICS: AtomicUsize = AtomicUsize::new(0);

/// Counts panics on the target's threads (see [`target_panics`]), then
/// reports them as usual.
fn watch_target_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let report = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let thread = std::thread::current();
            let name = thread.name().unwrap_or("");
            if ["iscsi-", "t-loop-", "t-offload-"]
                .iter()
                .any(|p| name.starts_with(p))
            {
                TARGET_PANICS.fetch_add(1, Ordering::SeqCst);
            }
            report(info);
        }));
    });
}

/// How many target threads have panicked.
pub fn target_panics() -> usize {
    TARGET_PANICS.load(Ordering::SeqCst)
}

/// The iSCSI name of `volume`'s target.
pub fn target_name(volume: &str) -> String {
    basalt_volume::iscsi_target_name(volume)
}

/// Login options of [`INITIATOR`] for `volume`.
pub fn options(volume: &str) -> LoginOptions {
    LoginOptions::new(INITIATOR, &target_name(volume))
}

/// Logs [`INITIATOR`] in to `volume` and clears the new I_T nexus's POWER
/// ON RESET unit attention with TEST UNIT READY (as libiscsi does).
pub fn session(addr: std::net::SocketAddr, opts: &LoginOptions) -> Initiator {
    let mut s = Initiator::login(addr, opts).expect("login");
    s.test_unit_ready().check(SENSE_UNIT_ATTENTION, 0x29, 0x00);
    s.test_unit_ready().ok();
    s
}

/// Volumes of one store. The allowed initiators may log in to every
/// volume; an initiator with CHAP credentials must prove them. Every path
/// is in the state [`StoreTargets::set_path_state`] last set (initially
/// optimized), and REPORT TARGET PORT GROUPS also lists the groups of
/// [`StoreTargets::set_other_groups`].
pub struct StoreTargets {
    pub store: Arc<Store>,
    volumes: Mutex<BTreeMap<String, (VolumeId, Arc<VolumeStats>)>>,
    allowed: Mutex<Vec<String>>,
    chap: Mutex<HashMap<String, ChapCredentials>>,
    path: Mutex<PathState>,
    other_groups: Mutex<Vec<(u16, PathState)>>,
}

impl StoreTargets {
    pub fn sim(device_size: u64, allowed: &[&str]) -> Arc<StoreTargets> {
        StoreTargets::on_device(SimDevice::new(device_size, 7), allowed)
    }

    /// A store on a data file in `dir`.
    pub fn file(dir: &std::path::Path, device_size: u64, allowed: &[&str]) -> Arc<StoreTargets> {
        let device = basalt_store::FileDevice::create(&dir.join("basalt.data"), device_size, false)
            .expect("create data file");
        StoreTargets::on_device(device, allowed)
    }

    fn on_device(
        device: Arc<dyn basalt_store::BlockDevice>,
        allowed: &[&str],
    ) -> Arc<StoreTargets> {
        let store = Store::create(
            device,
            &FormatOptions {
                extent_size: Some(64 * KIB as u32),
                ..Default::default()
            },
        )
        .expect("format test store");
        Arc::new(StoreTargets {
            store,
            volumes: Mutex::new(BTreeMap::new()),
            allowed: Mutex::new(allowed.iter().map(|s| s.to_string()).collect()),
            chap: Mutex::new(HashMap::new()),
            path: Mutex::new(PathState::Optimized),
            other_groups: Mutex::new(Vec::new()),
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
        let id = self.id_of(name);
        self.store.resize_volume(id, size).expect("resize");
    }

    pub fn allow(&self, initiator: &str) {
        self.allowed.lock().push(initiator.to_owned());
    }

    /// Requires `initiator` to prove CHAP credentials `user`/`secret`.
    pub fn set_chap(&self, initiator: &str, user: &str, secret: &[u8]) {
        self.chap.lock().insert(
            initiator.to_owned(),
            ChapCredentials {
                user: user.to_owned(),
                secret: secret.to_vec(),
                mutual: None,
            },
        );
    }

    pub fn set_path_state(&self, state: PathState) {
        *self.path.lock() = state;
    }

    /// The port groups of the other nodes serving every volume.
    pub fn set_other_groups(&self, groups: &[(u16, PathState)]) {
        *self.other_groups.lock() = groups.to_vec();
    }

    pub fn open_handles(&self, name: &str) -> usize {
        self.volumes
            .lock()
            .get(name)
            .map_or(0, |(_, stats)| stats.open_handles())
    }

    fn is_allowed(&self, initiator: &str) -> bool {
        self.allowed.lock().iter().any(|i| i == initiator)
    }
}

impl Targets for StoreTargets {
    fn visible(&self, initiator: &str) -> Vec<String> {
        match self.is_allowed(initiator) {
            true => self.volumes.lock().keys().cloned().collect(),
            false => Vec::new(),
        }
    }

    fn allowed(&self, initiator: &str, _volume: &str) -> bool {
        self.is_allowed(initiator)
    }

    fn open(&self, initiator: &str, volume: &str) -> Result<VolumeHandle, OpenError> {
        if !self.is_allowed(initiator) {
            return Err(OpenError::NotAllowed);
        }
        let (id, stats) = self
            .volumes
            .lock()
            .get(volume)
            .cloned()
            .ok_or(OpenError::NotFound)?;
        let local = self
            .store
            .volume(id)
            .map_err(|e| OpenError::Failed(e.to_string()))?;
        Ok(VolumeHandle::new(local, volume.to_owned(), stats))
    }

    fn chap(&self, initiator: &str, _volume: &str) -> Option<ChapCredentials> {
        self.chap.lock().get(initiator).cloned()
    }

    fn path_state(&self, _volume: &VolumeHandle) -> PathState {
        *self.path.lock()
    }

    fn port_groups(&self, volume: &VolumeHandle, own: u16) -> Vec<(u16, PathState)> {
        let mut groups = vec![(own, self.path_state(volume))];
        groups.extend(self.other_groups.lock().iter().copied());
        groups
    }
}

/// Limits of the test target: bursts and segments small enough that
/// test-sized transfers need several PDUs, sequences and R2Ts.
pub fn test_limits() -> ServerLimits {
    ServerLimits {
        max_recv_data_segment: 32 * KIB as u32,
        max_burst: 256 * KIB as u32,
        first_burst: 64 * KIB as u32,
        max_transfer: 4 * MIB as u32,
        login_timeout: Duration::from_secs(5),
        send_timeout: Duration::from_secs(10),
        ..ServerLimits::default()
    }
}

/// A test target: its server, its targets, and the event loops it runs on
/// (when shared).
pub struct Fixture {
    pub server: IscsiServer,
    pub targets: Arc<StoreTargets>,
    pub reactor: Option<Arc<Reactor>>,
}

impl Fixture {
    pub fn addr(&self) -> std::net::SocketAddr {
        self.server.local_addr()
    }

    /// Waits until the target has `n` connections.
    pub fn wait_connections(&self, n: usize) {
        eventually(&format!("{n} connections"), || {
            self.server.connections() == n
        });
    }
}

/// A target on 127.0.0.1:0 over a fresh simulated store with the given
/// volumes, allowing [`INITIATOR`], on its own event loop.
pub fn target_with(volumes: &[(&str, u64)]) -> Fixture {
    target_on(
        StoreTargets::sim(128 * MIB, &[INITIATOR]),
        volumes,
        test_limits(),
        None,
    )
}

/// A target over `targets` with the given volumes and limits, on
/// `reactor`'s loops (or its own).
pub fn target_on(
    targets: Arc<StoreTargets>,
    volumes: &[(&str, u64)],
    limits: ServerLimits,
    reactor: Option<Arc<Reactor>>,
) -> Fixture {
    init_logging();
    watch_target_panics();
    for (name, size) in volumes {
        targets.add_volume(name, *size);
    }
    let server = IscsiServer::start_on(
        "127.0.0.1:0".parse().expect("address"),
        Arc::clone(&targets) as Arc<dyn Targets>,
        TargetConfig {
            limits,
            ..TargetConfig::default()
        },
        reactor.clone(),
    )
    .expect("start target");
    Fixture {
        server,
        targets,
        reactor,
    }
}

/// Waits until `cond` holds (polling), failing the test after 10 s.
pub fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Deterministic test data.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8)
        .collect()
}
