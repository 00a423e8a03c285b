//! The listening side: an acceptor thread, one thread per connection
//! (queue), and a watchdog thread for keep-alive timeouts and resize
//! notices.
//!
//! Invariants:
//! - Every live connection is registered (with a clone of its socket)
//!   before its thread starts and unregistered when the thread ends, even by
//!   panic; [`NvmeServer::connections`] counts them.
//! - [`NvmeServer::shutdown`] (also run on drop) first stops the acceptor
//!   and the watchdog, then shuts every registered socket down with
//!   `shutdown(2)` — which wakes a thread blocked in `recv` or `send` — and
//!   joins every thread.
//! - Resources per client are bounded by [`ServerLimits`]: at most
//!   `max_connections` live connections, and `max_connections_per_address`
//!   from one IP address (more are closed at once, with a log line per order
//!   of magnitude: see `basalt_volume::admission`), so one host cannot lock
//!   the others out; a connection that has not completed ICReq and Connect
//!   within `connect_timeout` is closed, and after Connect the host's
//!   keep-alive timeout (KATO) governs idleness.
//! - The watchdog tears down a controller whose host sent no Keep Alive
//!   within its KATO, and updates every I/O controller's size and ANA
//!   state from the volume and [`Subsystems::path_state`] (each checked
//!   every [`WATCHDOG_TICK`]), notifying hosts of changes.

use crate::controller::Registry;
use crate::queue;
use crate::Subsystems;
use basalt_loop_io::listener::{
    accept_loop, detect_dead_peers, reachable_address, wake_acceptor, Connections,
};
use basalt_reactor::{Loops, Reactor};
use basalt_volume::admission::{Admission, AdmissionLimits};
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::{self, JoinHandle};
use std::time::Duration;
/// Connections (queues) one IP address may hold unless configured: a host
/// opens one per CPU and path, so this leaves room for large hosts.
pub const DEFAULT_MAX_CONNECTIONS_PER_ADDRESS: usize = 256;

/// How often the watchdog checks keep-alive deadlines and volume sizes.
pub const WATCHDOG_TICK: Duration = Duration::from_millis(100);

/// Per-server bounds on what clients can hold.
#[derive(Debug, Clone, Copy)]
pub struct ServerLimits {
    /// Live connections (queues) at most; further ones are closed on accept.
    pub max_connections: usize,
    /// Live connections (queues) from one IP address at most.
    pub max_connections_per_address: usize,
    /// Time a connection has to send ICReq and then a successful Connect
    /// (each read of them).
    pub connect_timeout: Duration,
    /// Time one send to a host may block before the connection is dropped.
    pub send_timeout: Duration,
    /// Largest queue (SQSIZE + 1) a Connect may ask for; CAP.MQES.
    pub max_queue_entries: u16,
    /// Most I/O queues per controller.
    pub max_io_queues: u16,
    /// In-capsule data accepted per command (IOCCSZ), a multiple of 16.
    pub in_capsule_data: u32,
    /// MAXH2CDATA: most bytes per H2CData PDU; also the size of the
    /// C2HData PDUs the target sends. A multiple of 4, at least 4096.
    pub max_h2c_data: u32,
    /// Largest data transfer of one command (MDTS), a power of two times
    /// 4096.
    pub max_transfer: u32,
    /// Write data a queue may hold while waiting for H2CData; commands
    /// beyond it wait for their R2T.
    pub max_inflight_per_queue: usize,
    /// Event loops serving the I/O queues; 0 serves every queue on its own
    /// thread.
    pub event_loops: usize,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            max_connections: 1024,
            max_connections_per_address: DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
            connect_timeout: Duration::from_secs(30),
            send_timeout: Duration::from_secs(60),
            max_queue_entries: 128,
            max_io_queues: 64,
            in_capsule_data: 8192,
            max_h2c_data: 128 * 1024,
            max_transfer: 1024 * 1024,
            max_inflight_per_queue: 8 * 1024 * 1024,
            event_loops: basalt_reactor::default_loops(),
        }
    }
}

/// How the target presents itself.
#[derive(Debug, Clone, Copy, Default)]
pub struct TargetConfig {
    /// The address discovery log pages report; default: the bound address
    /// (a wildcard bind reports loopback).
    pub advertise: Option<SocketAddr>,
    pub limits: ServerLimits,
    /// Controller IDs this target hands out, `(first, last)` inclusive,
    /// clamped to 1..=0xFFEF; default: all of them. Targets serving the
    /// same subsystems (the nodes of a cluster) need disjoint ranges, see
    /// [`cluster_cntlid_range`].
    pub cntlid_range: Option<(u16, u16)>,
    /// The port ID discovery log entries give this target's address
    /// (`None`: 1). Nodes of a cluster need distinct ones
    /// (`basalt_volume::node_port_id`).
    pub port_id: Option<u16>,
}

/// Controller IDs per cluster node.
const CNTLIDS_PER_NODE: u32 = 1000;

/// The controller IDs of cluster node `node_id`: `id × 1000 + 1 ..= id ×
/// 1000 + 999`, so that the paths a host opens to several nodes have
/// distinct IDs. IDs cover node ids 0..=64; larger ids reuse the ranges of
/// `node_id mod 65` (hosts then see distinct IDs unless they connect to
/// two nodes whose ids are congruent and happen to get equal IDs).
pub fn cluster_cntlid_range(node_id: u32) -> (u16, u16) {
    let slots = (u32::from(crate::controller::MAX_CNTLID) + 1) / CNTLIDS_PER_NODE;
    let base = (node_id % slots) * CNTLIDS_PER_NODE;
    // base + 999 <= 64_999 < 0xFFEF, so the conversions cannot fail.
    let first = u16::try_from(base + 1).unwrap_or(1);
    let last = u16::try_from(base + CNTLIDS_PER_NODE - 1).unwrap_or(first);
    (first, last)
}

/// What a connection holds until it ends, wherever it is served: its
/// registration with the server and its admission.
pub(crate) type Guards = Box<dyn Send>;

pub(crate) struct Shared {
    pub subsystems: Arc<dyn Subsystems>,
    /// The event loops serving I/O queues, if any.
    pub loops: Option<Loops>,
    pub limits: ServerLimits,
    pub advertise: SocketAddr,
    /// Its port ID in discovery log entries.
    pub port_id: u16,
    pub controllers: Registry,
    admission: Arc<Admission>,
    stopping: AtomicBool,
    connections: Arc<Connections>,
}

impl Shared {
    pub fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }
}

/// Drops the NVMe/TCP hosts of one volume (see [`NvmeServer::disconnector`]).
/// Holds the server weakly: the volume service keeps it, and the server
/// (through its exports) keeps the service.
pub struct Disconnector(Weak<Shared>);

impl basalt_volume::ClientDisconnect for Disconnector {
    /// Tears down every controller (and so every queue) of `volume`'s
    /// subsystem, as a keep-alive timeout would; returns how many.
    fn disconnect(&self, volume: &str) -> usize {
        let Some(shared) = self.0.upgrade() else {
            return 0;
        };
        let mut n = 0;
        for ctrl in shared.controllers.all() {
            if ctrl.volume().is_some_and(|v| v.name() == volume) {
                tracing::info!(cntlid = ctrl.cntlid, subnqn = %ctrl.subnqn, hostnqn = %ctrl.hostnqn,
                    "NVMe controller torn down: its volume's clients are being disconnected");
                shared.controllers.remove(&ctrl);
                n += 1;
            }
        }
        n
    }
}

/// A running NVMe/TCP target.
pub struct NvmeServer {
    local_addr: SocketAddr,
    listener: Arc<TcpListener>,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
    watchdog: Option<JoinHandle<()>>,
}

impl NvmeServer {
    /// Binds `listen`, starts accepting connections in a background thread
    /// and logs "NVMe/TCP listening on ADDR".
    pub fn start(listen: SocketAddr, subsystems: Arc<dyn Subsystems>) -> io::Result<NvmeServer> {
        Self::start_with(listen, subsystems, TargetConfig::default())
    }

    /// [`NvmeServer::start`] with explicit limits.
    pub fn start_with_limits(
        listen: SocketAddr,
        subsystems: Arc<dyn Subsystems>,
        limits: ServerLimits,
    ) -> io::Result<NvmeServer> {
        Self::start_with(
            listen,
            subsystems,
            TargetConfig {
                limits,
                ..TargetConfig::default()
            },
        )
    }

    /// [`NvmeServer::start`] with an advertised address and limits, on
    /// event loops of its own (`limits.event_loops` of them).
    pub fn start_with(
        listen: SocketAddr,
        subsystems: Arc<dyn Subsystems>,
        config: TargetConfig,
    ) -> io::Result<NvmeServer> {
        let loops = match config.limits.event_loops {
            0 => None,
            n => Some(Loops::Own(Reactor::start("nvme", n)?)),
        };
        Self::start_inner(listen, subsystems, config, loops)
    }

    /// [`NvmeServer::start_with`] on event loops shared with other
    /// frontends (`None`: every queue on its own thread);
    /// `limits.event_loops` is ignored. The caller stops `reactor` once
    /// every frontend on it has shut down.
    pub fn start_on(
        listen: SocketAddr,
        subsystems: Arc<dyn Subsystems>,
        config: TargetConfig,
        reactor: Option<Arc<Reactor>>,
    ) -> io::Result<NvmeServer> {
        Self::start_inner(listen, subsystems, config, reactor.map(Loops::Shared))
    }

    fn start_inner(
        listen: SocketAddr,
        subsystems: Arc<dyn Subsystems>,
        config: TargetConfig,
        loops: Option<Loops>,
    ) -> io::Result<NvmeServer> {
        let mut limits = config.limits;
        limits.max_h2c_data = (limits.max_h2c_data.max(4096) / 4) * 4;
        limits.in_capsule_data = (limits.in_capsule_data / 16) * 16;
        limits.max_queue_entries = limits.max_queue_entries.max(2);
        limits.max_transfer = limits.max_transfer.max(4096).next_power_of_two();
        let listener = Arc::new(TcpListener::bind(listen)?);
        let local_addr = listener.local_addr()?;
        let advertise = config.advertise.unwrap_or(reachable_address(local_addr));
        let admission = Admission::new(
            "NVMe/TCP",
            AdmissionLimits {
                max_total: limits.max_connections,
                max_per_address: limits.max_connections_per_address,
            },
        );
        let shared = Arc::new(Shared {
            subsystems,
            loops,
            limits,
            advertise,
            port_id: config.port_id.unwrap_or(1),
            admission,
            controllers: match config.cntlid_range {
                Some((first, last)) => Registry::with_range(first, last),
                None => Registry::default(),
            },
            stopping: AtomicBool::new(false),
            connections: Arc::new(Connections::default()),
        });
        let acceptor = thread::Builder::new().name("nvme-accept".into()).spawn({
            let listener = Arc::clone(&listener);
            let shared = Arc::clone(&shared);
            move || accept(&listener, &shared)
        })?;
        let watchdog = thread::Builder::new().name("nvme-watchdog".into()).spawn({
            let shared = Arc::clone(&shared);
            move || watchdog(&shared)
        });
        let watchdog = match watchdog {
            Ok(w) => w,
            Err(err) => {
                let mut server = NvmeServer {
                    local_addr,
                    listener,
                    shared,
                    acceptor: Some(acceptor),
                    watchdog: None,
                };
                server.stop();
                return Err(err);
            }
        };
        tracing::info!("NVMe/TCP listening on {local_addr} (advertised as {advertise})");
        Ok(NvmeServer {
            local_addr,
            listener,
            shared,
            acceptor: Some(acceptor),
            watchdog: Some(watchdog),
        })
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The address discovery log pages report.
    pub fn advertised_addr(&self) -> SocketAddr {
        self.shared.advertise
    }

    /// Connections (queues) currently open.
    pub fn connections(&self) -> usize {
        self.shared.connections.len()
    }

    /// What the volume service calls to drop a volume's NVMe/TCP hosts.
    pub fn disconnector(&self) -> Disconnector {
        Disconnector(Arc::downgrade(&self.shared))
    }

    /// Controllers currently live.
    pub fn controllers(&self) -> usize {
        self.shared.controllers.len()
    }

    /// Stops accepting, shuts down every connection and joins every
    /// thread. In-flight commands are not completed: hosts see the
    /// connection drop and keep every write completed with FUA or covered
    /// by a completed Flush.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let Some(acceptor) = self.acceptor.take() else {
            return;
        };
        self.shared.stopping.store(true, Ordering::SeqCst);
        wake_acceptor(&self.listener, self.local_addr);
        if acceptor.join().is_err() {
            tracing::error!("NVMe/TCP acceptor thread panicked");
        }
        if let Some(w) = self.watchdog.take() {
            if w.join().is_err() {
                tracing::error!("NVMe/TCP watchdog thread panicked");
            }
        }
        self.shared.connections.shutdown_all();
        self.shared.connections.join("NVMe/TCP");
        // Queues on event loops: their sockets are shut down already; wait
        // for them to end.
        match &self.shared.loops {
            Some(Loops::Own(reactor)) => reactor.stop(),
            Some(Loops::Shared(_)) => self.shared.connections.wait_until_empty(),
            None => {}
        }
        for ctrl in self.shared.controllers.all() {
            self.shared.controllers.remove(&ctrl);
        }
        tracing::info!("NVMe/TCP target on {} stopped", self.local_addr);
    }
}

impl Drop for NvmeServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept(listener: &TcpListener, shared: &Arc<Shared>) {
    accept_loop(
        "NVMe/TCP",
        || {
            let accepted = listener.accept();
            if let Ok((stream, _)) = &accepted {
                detect_dead_peers(stream);
            }
            accepted
        },
        || shared.stopping(),
        |stream, peer| spawn_connection(shared, stream, peer),
    );
}

fn spawn_connection(shared: &Arc<Shared>, stream: TcpStream, peer: SocketAddr) {
    // Refused: dropping the stream closes it (the admission logs it).
    let Ok(admitted) = shared.admission.admit(peer.ip()) else {
        return;
    };
    let served = Arc::clone(shared);
    shared.connections.spawn(
        "NVMe/TCP",
        "nvme-conn",
        stream,
        peer,
        move |stream, registration| {
            let guards: Guards = Box::new((registration, admitted));
            queue::serve(&served, stream, peer, guards);
        },
    );
}

/// Keep-alive deadlines and resize notices, until the server stops.
fn watchdog(shared: &Shared) {
    while !shared.stopping() {
        thread::sleep(WATCHDOG_TICK);
        for ctrl in shared.controllers.all() {
            let expired = {
                let st = ctrl.state.lock();
                st.kato_ms > 0
                    && st.last_keep_alive.elapsed() > Duration::from_millis(u64::from(st.kato_ms))
            };
            if expired {
                tracing::warn!(
                    cntlid = ctrl.cntlid,
                    subnqn = %ctrl.subnqn,
                    hostnqn = %ctrl.hostnqn,
                    "NVMe keep alive timeout: tearing the controller down"
                );
                shared.controllers.remove(&ctrl);
                continue;
            }
            if let Some(volume) = ctrl.volume() {
                let size = volume.size();
                let changed = {
                    let mut st = ctrl.state.lock();
                    let changed = st.size_seen != size;
                    st.size_seen = size;
                    changed
                };
                if changed {
                    tracing::info!(cntlid = ctrl.cntlid, subnqn = %ctrl.subnqn, size,
                        "NVMe namespace resized: notifying the host");
                    ctrl.namespace_changed();
                }
                let state = shared.subsystems.path_state(volume);
                if ctrl.set_path_state(state) {
                    tracing::info!(cntlid = ctrl.cntlid, subnqn = %ctrl.subnqn, ?state,
                        "NVMe ANA state changed: notifying the host");
                }
            }
        }
    }
}
