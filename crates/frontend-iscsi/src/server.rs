//! The listening side: an acceptor thread, one thread per connection for
//! its login (and for the whole of a discovery session), and a watchdog
//! thread for volume resizes and ALUA state changes.
//!
//! Invariants:
//! - Every live connection is registered (with a clone of its socket)
//!   before its thread starts and unregistered when it ends, on its thread
//!   or on an event loop, even by panic; [`IscsiServer::connections`]
//!   counts them.
//! - A normal session is recorded with its initiator, ISID and target once
//!   logged in: a new login of the same initiator and ISID to the same
//!   target with TSIH 0 reinstates the session (RFC 7143 §6.3.5), which
//!   ends the old one's connection first.
//! - [`IscsiServer::shutdown`] (also run on drop) stops the acceptor and
//!   the watchdog, shuts every registered socket down with `shutdown(2)`
//!   (which wakes a thread blocked in `recv`/`send` and ends a connection
//!   on a loop), joins every thread and waits for the loops' connections.
//! - Resources per client are bounded by [`ServerLimits`]: live
//!   connections in total and per IP address (`basalt_volume::admission`),
//!   and the time a connection has to log in.

use crate::units::Units;
use crate::{connection, Targets};
use basalt_loop_io::listener::{
    accept_loop, detect_dead_peers, reachable_address, wake_acceptor, Connections,
};
use basalt_reactor::{Loops, Reactor};
use basalt_volume::admission::{Admission, AdmissionLimits};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::{Arc, Weak};
use std::thread::{self, JoinHandle};
use std::time::Duration;
/// Connections one IP address may hold unless configured (dm-multipath
/// hosts open one session per path and volume).
pub const DEFAULT_MAX_CONNECTIONS_PER_ADDRESS: usize = 256;
/// How often the watchdog checks volume sizes and path states.
pub const WATCHDOG_TICK: Duration = Duration::from_millis(100);

/// Per-server bounds on what clients can hold, and the limits offered at
/// login.
#[derive(Debug, Clone, Copy)]
pub struct ServerLimits {
    /// Live connections at most; further ones are closed on accept.
    pub max_connections: usize,
    /// Live connections from one IP address at most.
    pub max_connections_per_address: usize,
    /// Time a connection has to complete its login (each read of it).
    pub login_timeout: Duration,
    /// Time one send may block before the connection is dropped.
    pub send_timeout: Duration,
    /// MaxRecvDataSegmentLength the target declares: the largest data
    /// segment it accepts in one PDU.
    pub max_recv_data_segment: u32,
    /// MaxBurstLength the target offers: the largest solicited Data-Out or
    /// Data-In sequence.
    pub max_burst: u32,
    /// FirstBurstLength the target offers: unsolicited data at most.
    pub first_burst: u32,
    /// The largest transfer of one command (Block Limits' maximum
    /// transfer length), a multiple of 4096.
    pub max_transfer: u32,
    /// Commands a session may have outstanding (MaxCmdSN − ExpCmdSN + 1).
    pub command_window: u32,
    /// Accept CRC32C header and data digests when the initiator offers
    /// them.
    pub digests: bool,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            max_connections: 1024,
            max_connections_per_address: DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
            login_timeout: Duration::from_secs(30),
            send_timeout: Duration::from_secs(60),
            max_recv_data_segment: 256 * 1024,
            max_burst: 1024 * 1024,
            first_burst: 256 * 1024,
            max_transfer: 1024 * 1024,
            command_window: 128,
            digests: true,
        }
    }
}

/// How the target presents itself.
#[derive(Debug, Clone, Copy)]
pub struct TargetConfig {
    /// The portal SendTargets reports; default: the bound address (a
    /// wildcard bind reports loopback).
    pub advertise: Option<SocketAddr>,
    /// This node's target port group (and portal group tag): distinct per
    /// node of a cluster, so that ALUA tells the paths apart. Also the
    /// relative target port identifier of its one port. At least 1.
    pub port_group: u16,
    pub limits: ServerLimits,
}

impl Default for TargetConfig {
    fn default() -> Self {
        TargetConfig {
            advertise: None,
            port_group: 1,
            limits: ServerLimits::default(),
        }
    }
}

/// What a connection holds until it ends, wherever it is served: its
/// registration with the server and its admission.
pub(crate) type Guards = Box<dyn Send>;

/// A logged-in normal session, for reinstatement and disconnects.
pub(crate) struct SessionEntry {
    pub initiator: String,
    pub isid: [u8; 6],
    pub volume: String,
    pub tsih: u16,
}

pub(crate) struct Shared {
    pub targets: Arc<dyn Targets>,
    /// The event loops serving normal sessions.
    pub loops: Loops,
    pub limits: ServerLimits,
    pub advertise: SocketAddr,
    pub port_group: u16,
    pub units: Units,
    admission: Arc<Admission>,
    stopping: AtomicBool,
    next_tsih: AtomicU16,
    /// Every live connection, by connection id.
    connections: Arc<Connections>,
    /// Logged-in normal sessions, by connection id.
    sessions: Mutex<HashMap<u64, SessionEntry>>,
}

impl Shared {
    pub fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// A TSIH for a new session: never 0 (which means "new" on the wire).
    pub fn new_tsih(&self) -> u16 {
        loop {
            let tsih = self.next_tsih.fetch_add(1, Ordering::Relaxed);
            if tsih != 0 {
                return tsih;
            }
        }
    }

    /// Records connection `id`'s logged-in session, first ending any
    /// session of the same initiator and ISID on the same target
    /// (reinstatement). Returns how many were ended.
    pub fn register_session(&self, id: u64, entry: SessionEntry) -> usize {
        let mut sessions = self.sessions.lock();
        let old: Vec<u64> = sessions
            .iter()
            .filter(|(_, s)| {
                s.initiator == entry.initiator && s.isid == entry.isid && s.volume == entry.volume
            })
            .map(|(id, _)| *id)
            .collect();
        for old_id in &old {
            sessions.remove(old_id);
            self.connections.shutdown(*old_id);
        }
        sessions.insert(id, entry);
        old.len()
    }
}

/// Ends the iSCSI sessions of one volume (see [`IscsiServer::disconnector`]).
/// Holds the server weakly: the volume service keeps it, and the server
/// (through its targets) keeps the service.
pub struct Disconnector(Weak<Shared>);

impl basalt_volume::ClientDisconnect for Disconnector {
    /// Shuts down the connection of every session logged in to `volume`;
    /// returns how many.
    fn disconnect(&self, volume: &str) -> usize {
        let Some(shared) = self.0.upgrade() else {
            return 0;
        };
        let sessions = shared.sessions.lock();
        let mut n = 0;
        for (id, session) in sessions.iter().filter(|(_, s)| s.volume == volume) {
            if shared.connections.shutdown(*id) {
                tracing::info!(initiator = %session.initiator, tsih = session.tsih, volume,
                    "iSCSI session ended: its volume's clients are being disconnected");
                n += 1;
            }
        }
        n
    }
}

/// A running iSCSI target.
pub struct IscsiServer {
    local_addr: SocketAddr,
    listener: Arc<TcpListener>,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
    watchdog: Option<JoinHandle<()>>,
}

impl IscsiServer {
    /// Binds `listen` and starts accepting connections in a background
    /// thread, logging "iSCSI listening on ADDR". Normal sessions are
    /// served on `reactor`'s loops, or on one loop of the target's own when
    /// `None`. The caller stops a shared reactor once every frontend on it
    /// has shut down.
    pub fn start_on(
        listen: SocketAddr,
        targets: Arc<dyn Targets>,
        config: TargetConfig,
        reactor: Option<Arc<Reactor>>,
    ) -> io::Result<IscsiServer> {
        let loops = match reactor {
            Some(reactor) => Loops::Shared(reactor),
            None => Loops::Own(Reactor::start("iscsi", 1)?),
        };
        let mut limits = config.limits;
        limits.max_recv_data_segment = limits.max_recv_data_segment.clamp(512, (1 << 24) - 1);
        limits.max_burst = limits.max_burst.clamp(512, (1 << 24) - 1);
        limits.first_burst = limits.first_burst.clamp(512, limits.max_burst);
        limits.max_transfer = (limits.max_transfer.max(4096) / 4096) * 4096;
        limits.command_window = limits
            .command_window
            .clamp(1, basalt_loop_io::MAX_SLOTS as u32);
        let listener = Arc::new(TcpListener::bind(listen)?);
        let local_addr = listener.local_addr()?;
        let advertise = config.advertise.unwrap_or(reachable_address(local_addr));
        let admission = Admission::new(
            "iSCSI",
            AdmissionLimits {
                max_total: limits.max_connections,
                max_per_address: limits.max_connections_per_address,
            },
        );
        let shared = Arc::new(Shared {
            targets,
            loops,
            limits,
            advertise,
            port_group: config.port_group.max(1),
            units: Units::new(limits.max_transfer),
            admission,
            stopping: AtomicBool::new(false),
            next_tsih: AtomicU16::new(rand::random::<u16>().max(1)),
            connections: Arc::new(Connections::default()),
            sessions: Mutex::new(HashMap::new()),
        });
        let acceptor = thread::Builder::new().name("iscsi-accept".into()).spawn({
            let listener = Arc::clone(&listener);
            let shared = Arc::clone(&shared);
            move || accept(&listener, &shared)
        })?;
        let mut server = IscsiServer {
            local_addr,
            listener,
            shared: Arc::clone(&shared),
            acceptor: Some(acceptor),
            watchdog: None,
        };
        let watchdog = thread::Builder::new()
            .name("iscsi-watchdog".into())
            .spawn(move || watchdog(&shared));
        match watchdog {
            Ok(w) => server.watchdog = Some(w),
            Err(err) => {
                server.stop();
                return Err(err);
            }
        }
        tracing::info!("iSCSI listening on {local_addr} (portal {advertise})");
        Ok(server)
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The portal SendTargets reports.
    pub fn advertised_addr(&self) -> SocketAddr {
        self.shared.advertise
    }

    /// Connections currently open.
    pub fn connections(&self) -> usize {
        self.shared.connections.len()
    }

    /// Normal sessions currently logged in.
    pub fn sessions(&self) -> usize {
        self.shared.sessions.lock().len()
    }

    /// What the volume service calls to drop a volume's iSCSI sessions.
    pub fn disconnector(&self) -> Disconnector {
        Disconnector(Arc::downgrade(&self.shared))
    }

    /// Stops accepting, shuts down every connection and joins every
    /// thread. In-flight commands are not answered: initiators see the
    /// connection drop and keep every write completed with FUA (or with
    /// the write cache off) or covered by a completed SYNCHRONIZE CACHE.
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
            tracing::error!("iSCSI acceptor thread panicked");
        }
        if let Some(w) = self.watchdog.take() {
            if w.join().is_err() {
                tracing::error!("iSCSI watchdog thread panicked");
            }
        }
        self.shared.connections.shutdown_all();
        self.shared.connections.join("iSCSI");
        // Sessions on event loops: their sockets are shut down already;
        // wait for them to end.
        match &self.shared.loops {
            Loops::Own(reactor) => reactor.stop(),
            Loops::Shared(_) => self.shared.connections.wait_until_empty(),
        }
        tracing::info!("iSCSI target on {} stopped", self.local_addr);
    }
}

impl Drop for IscsiServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept(listener: &TcpListener, shared: &Arc<Shared>) {
    accept_loop(
        "iSCSI",
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
        "iSCSI",
        "iscsi-conn",
        stream,
        peer,
        move |stream, registration| {
            let id = registration.id;
            let session = SessionRegistration {
                shared: Arc::clone(&served),
                id,
            };
            let guards: Guards = Box::new((session, registration, admitted));
            connection::serve(&served, id, stream, peer, guards);
        },
    );
}

/// Forgets a connection's session when the connection ends, however it
/// ends.
struct SessionRegistration {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for SessionRegistration {
    fn drop(&mut self) {
        self.shared.sessions.lock().remove(&self.id);
    }
}

/// Resize and ALUA notices, until the server stops.
fn watchdog(shared: &Shared) {
    while !shared.stopping() {
        thread::sleep(WATCHDOG_TICK);
        shared
            .units
            .watch(shared.targets.as_ref(), shared.port_group);
    }
}
