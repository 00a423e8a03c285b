//! The listening side: a listener (TCP, or a Unix socket), its acceptor
//! thread and one thread per connection while it negotiates.
//!
//! Invariants:
//! - Every live connection is registered (with a clone of its socket) before
//!   its thread starts and unregistered when the thread ends, even by panic;
//!   [`NbdServer::connections`] counts them.
//! - [`NbdServer::shutdown`] (also run on drop) first stops the acceptor, so
//!   no connection can be registered afterwards, then shuts every registered
//!   socket down with `shutdown(2)` — which wakes a thread blocked in `recv`
//!   or `send` — and joins every thread.
//! - Resources per client are bounded: at most `max_connections` live
//!   connections, and `max_connections_per_address` from one IP address
//!   (or, on a Unix socket, one local user)
//!   (more are closed at once, with a log line per order of magnitude: see
//!   `basalt_volume::admission`), so one host cannot lock the others out; a
//!   client that does not finish each step of the handshake within
//!   `handshake_timeout` is disconnected, so half-open sockets cannot pin
//!   handshake threads. A negotiated connection may then stay idle as long
//!   as it likes, before its first request too: NBD has no keep-alive, a
//!   virtual machine's disk is idle for hours between bursts, and the
//!   kernel's client (`nbd-client -C N`) opens connections that carry no
//!   request until the device is used. An idle connection costs nothing on
//!   its event loop; one whose host vanished is found by TCP keepalive
//!   (`basalt_loop_io::listener::detect_dead_peers`).

use crate::evented::EventedConnection;
use crate::handshake::{self, HandshakeOutcome, Security};
use crate::stream::{Peer, Stream};
use crate::tls::TlsPsk;
use crate::transmission::{self, SessionEnd};
use crate::ConnectionError;
use crate::Exports;
use basalt_loop_io::listener::{accept_loop, detect_dead_peers, reachable_address};
use basalt_reactor::{Loops, Reactor};
use basalt_volume::admission::{Admission, AdmissionLimits, Admitted};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// Lanes per connection unless configured: two keep a pipelining client's
/// requests flowing while a batch waits for the disk (measured against one
/// and three in BENCHMARKS.md).
pub const DEFAULT_LANES_PER_CONNECTION: usize = 2;

/// Connections one IP address may hold unless configured: plenty for the
/// hypervisors and tools of one host, a sixteenth of the total.
pub const DEFAULT_MAX_CONNECTIONS_PER_ADDRESS: usize = 64;

/// Where an NBD server listens.
#[derive(Debug, Clone)]
pub enum Listen {
    /// Plain TCP: anyone who can reach the address can use every export.
    Tcp(SocketAddr),
    /// TCP requiring TLS with a pre-shared key before anything else; each
    /// key opens the exports of its scope.
    Tls(SocketAddr, Arc<TlsPsk>),
    /// A Unix socket at this path (mode 0600: only this user, unless the
    /// operator changes its mode or group); a stale socket file left by an
    /// earlier run is replaced.
    Unix(PathBuf),
}

/// A bound listener.
enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener, PathBuf),
}

impl Listener {
    fn bind(listen: &Listen) -> io::Result<Listener> {
        match listen {
            Listen::Tcp(addr) | Listen::Tls(addr, _) => Ok(Listener::Tcp(TcpListener::bind(addr)?)),
            Listen::Unix(path) => {
                remove_stale_socket(path)?;
                let listener = UnixListener::bind(path)?;
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
                Ok(Listener::Unix(listener, path.clone()))
            }
        }
    }

    fn accept(&self) -> io::Result<(Stream, Peer)> {
        match self {
            Listener::Tcp(l) => l.accept().map(|(s, addr)| {
                detect_dead_peers(&s);
                (Stream::Tcp(s), Peer::Tcp(addr))
            }),
            Listener::Unix(l, _) => {
                let (s, _) = l.accept()?;
                let peer = Peer::of_unix(&s)?;
                Ok((Stream::Unix(s), peer))
            }
        }
    }

    fn raw_fd(&self) -> std::os::fd::RawFd {
        match self {
            Listener::Tcp(l) => l.as_raw_fd(),
            Listener::Unix(l, _) => l.as_raw_fd(),
        }
    }

    /// Wakes an acceptor blocked in `accept()`: `shutdown(2)` on the
    /// listening socket (which Linux supports for TCP), else a connection
    /// of our own.
    fn wake(&self) {
        // SAFETY: plain syscall on the listener's fd, which stays open as
        // long as `self` lives.
        let rc = unsafe { libc::shutdown(self.raw_fd(), libc::SHUT_RDWR) };
        match self {
            Listener::Tcp(l) if rc != 0 => {
                if let Ok(addr) = l.local_addr() {
                    let _ = TcpStream::connect_timeout(
                        &reachable_address(addr),
                        Duration::from_secs(1),
                    );
                }
            }
            Listener::Tcp(_) => {}
            Listener::Unix(_, path) => {
                let _ = UnixStream::connect(path);
            }
        }
    }
}

/// Removes a socket file left by an earlier run (never anything else: a
/// regular file or directory at the path is an operator's mistake to
/// report, not to delete).
fn remove_stale_socket(path: &Path) -> io::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path),
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{} exists and is not a socket", path.display()),
        )),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(err) => Err(err),
    }
}

/// Per-server bounds on what clients can hold.
#[derive(Debug, Clone, Copy)]
pub struct ServerLimits {
    /// Live connections at most; further ones are closed on accept.
    pub max_connections: usize,
    /// Live connections from one IP address (or local user) at most.
    pub max_connections_per_address: usize,
    /// Time a client has for each read of the handshake.
    pub handshake_timeout: Duration,
    /// Event loops serving connections (`evented`): each connection lives
    /// on one loop, which receives, executes and answers its requests
    /// without a thread hand-off. 0: serve every connection with lanes
    /// instead.
    pub event_loops: usize,
    /// Threads serving one connection in transmission when it is not on an
    /// event loop (with no loops). With more than one,
    /// a lane gathers the next batch of requests while another waits for
    /// the disk, so a pipelining client keeps the disk's queue full.
    pub lanes_per_connection: usize,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            max_connections: 1024,
            max_connections_per_address: DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
            handshake_timeout: Duration::from_secs(30),
            event_loops: default_event_loops(),
            lanes_per_connection: DEFAULT_LANES_PER_CONNECTION,
        }
    }
}

/// One event loop per CPU the process may run on. (On a small machine that
/// also runs the clients, fewer can serve disk-bound connections better:
/// on the 2-vCPU development VM one loop gave 2 × QD16 4k reads 82–91k
/// where two gave 70–82k, but RAM-backed volumes 185k where two gave
/// 277k; BENCHMARKS.md, issue 20. `basalt server --event-loops` sets it.)
pub fn default_event_loops() -> usize {
    basalt_reactor::default_loops()
}

struct Shared {
    exports: Arc<dyn Exports>,
    /// The listener requires TLS with these keys.
    tls: Option<Arc<TlsPsk>>,
    /// The event loops, if any.
    loops: Option<Loops>,
    limits: ServerLimits,
    admission: Arc<Admission>,
    stopping: AtomicBool,
    next_id: AtomicU64,
    /// Live connections: a socket clone, to shut them down on stop, and
    /// the export once negotiated, to disconnect a volume's clients.
    connections: Mutex<HashMap<u64, LiveConnection>>,
    /// Connection threads not yet joined.
    workers: Mutex<Vec<JoinHandle<()>>>,
}

struct LiveConnection {
    socket: Stream,
    export: Option<String>,
}

/// Drops the NBD clients of one volume (see [`NbdServer::disconnector`]).
/// Holds the server weakly: the volume service keeps it, and the server
/// (through its exports) keeps the service.
pub struct Disconnector(Weak<Shared>);

impl basalt_volume::ClientDisconnect for Disconnector {
    /// Shuts down the socket of every connection that opened `volume`; their
    /// threads then end and release the volume. Returns how many.
    fn disconnect(&self, volume: &str) -> usize {
        let Some(shared) = self.0.upgrade() else {
            return 0;
        };
        let connections = shared.connections.lock();
        let mut n = 0;
        for c in connections.values() {
            if c.export.as_deref() == Some(volume) {
                let _ = c.socket.shutdown(Shutdown::Both);
                n += 1;
            }
        }
        n
    }
}

/// A running NBD server.
pub struct NbdServer {
    local_addr: Option<SocketAddr>,
    listener: Arc<Listener>,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl NbdServer {
    /// Binds `listen`, starts accepting connections in a background thread
    /// and logs "NBD listening on ADDR".
    pub fn start(listen: SocketAddr, exports: Arc<dyn Exports>) -> io::Result<NbdServer> {
        Self::start_with_limits(listen, exports, ServerLimits::default())
    }

    /// [`NbdServer::start`] with explicit client limits, on event loops of
    /// its own (`limits.event_loops` of them).
    pub fn start_with_limits(
        listen: SocketAddr,
        exports: Arc<dyn Exports>,
        limits: ServerLimits,
    ) -> io::Result<NbdServer> {
        let loops = match limits.event_loops {
            0 => None,
            n => Some(Loops::Own(Reactor::start("nbd", n)?)),
        };
        Self::start_inner(Listen::Tcp(listen), exports, limits, loops)
    }

    /// [`NbdServer::start_with_limits`] on event loops shared with other
    /// frontends (`None`: lanes only); `limits.event_loops` is ignored. The
    /// caller stops `reactor` once every frontend on it has shut down.
    pub fn start_on(
        listen: Listen,
        exports: Arc<dyn Exports>,
        limits: ServerLimits,
        reactor: Option<Arc<Reactor>>,
    ) -> io::Result<NbdServer> {
        Self::start_inner(listen, exports, limits, reactor.map(Loops::Shared))
    }

    fn start_inner(
        listen: Listen,
        exports: Arc<dyn Exports>,
        limits: ServerLimits,
        loops: Option<Loops>,
    ) -> io::Result<NbdServer> {
        let listener = Arc::new(Listener::bind(&listen)?);
        let local_addr = match &*listener {
            Listener::Tcp(l) => Some(l.local_addr()?),
            Listener::Unix(..) => None,
        };
        let admission = Admission::new(
            "NBD",
            AdmissionLimits {
                max_total: limits.max_connections,
                max_per_address: limits.max_connections_per_address,
            },
        );
        let tls = match &listen {
            Listen::Tls(_, tls) => Some(Arc::clone(tls)),
            Listen::Tcp(_) | Listen::Unix(_) => None,
        };
        let shared = Arc::new(Shared {
            exports,
            tls,
            loops,
            limits,
            admission,
            stopping: AtomicBool::new(false),
            next_id: AtomicU64::new(0),
            connections: Mutex::new(HashMap::new()),
            workers: Mutex::new(Vec::new()),
        });
        let acceptor = thread::Builder::new().name("nbd-accept".into()).spawn({
            let listener = Arc::clone(&listener);
            let shared = Arc::clone(&shared);
            move || accept(&listener, &shared)
        })?;
        tracing::info!("NBD listening on {}", describe(&listen, local_addr));
        Ok(NbdServer {
            local_addr,
            listener,
            shared,
            acceptor: Some(acceptor),
        })
    }

    /// The TCP address actually bound (useful with port 0); `None` for a
    /// Unix socket.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local_addr
    }

    /// The Unix socket's path; `None` for TCP.
    pub fn socket_path(&self) -> Option<&Path> {
        match &*self.listener {
            Listener::Unix(_, path) => Some(path),
            Listener::Tcp(_) => None,
        }
    }

    /// Connections currently open (in handshake or transmission).
    pub fn connections(&self) -> usize {
        self.shared.connections.lock().len()
    }

    /// What the volume service calls to drop a volume's NBD clients.
    pub fn disconnector(&self) -> Disconnector {
        Disconnector(Arc::downgrade(&self.shared))
    }

    /// Stops accepting, shuts down every client socket and joins every
    /// thread. In-flight requests are not answered: clients see the
    /// connection drop, as after a server crash, and keep every write that
    /// was acknowledged with FUA or covered by a completed FLUSH.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let Some(acceptor) = self.acceptor.take() else {
            return;
        };
        self.shared.stopping.store(true, Ordering::SeqCst);
        self.listener.wake();
        if acceptor.join().is_err() {
            tracing::error!("NBD acceptor thread panicked");
        }
        for c in self.shared.connections.lock().values() {
            let _ = c.socket.shutdown(Shutdown::Both);
        }
        let workers = std::mem::take(&mut *self.shared.workers.lock());
        for worker in workers {
            if worker.join().is_err() {
                tracing::error!("NBD connection thread panicked");
            }
        }
        // Connections on event loops: their sockets are shut down already;
        // wait for them to end.
        match &self.shared.loops {
            Some(Loops::Own(reactor)) => reactor.stop(),
            Some(Loops::Shared(_)) => {
                while !self.shared.connections.lock().is_empty() {
                    thread::sleep(Duration::from_millis(1));
                }
            }
            None => {}
        }
        if let Listener::Unix(_, path) = &*self.listener {
            let _ = std::fs::remove_file(path);
        }
        tracing::info!("NBD server stopped");
    }
}

impl Drop for NbdServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// How a listener is named in log lines.
fn describe(listen: &Listen, bound: Option<SocketAddr>) -> String {
    match (listen, bound) {
        (_, Some(addr)) => addr.to_string(),
        (Listen::Unix(path), None) => format!("unix socket {}", path.display()),
        (Listen::Tcp(addr) | Listen::Tls(addr, _), None) => addr.to_string(),
    }
}

fn accept(listener: &Listener, shared: &Arc<Shared>) {
    accept_loop(
        "NBD",
        || listener.accept(),
        || shared.stopping.load(Ordering::SeqCst),
        |stream, peer| spawn_connection(shared, stream, peer),
    );
}

fn spawn_connection(shared: &Arc<Shared>, stream: Stream, peer: Peer) {
    // Refused: dropping the stream closes it before any greeting (the
    // admission logs it).
    let Ok(admitted) = shared.admission.admit(peer.source()) else {
        return;
    };
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let registered = match stream.try_clone() {
        Ok(clone) => clone,
        Err(err) => {
            tracing::warn!(%peer, "NBD connection refused, cannot register its socket: {err}");
            return;
        }
    };
    shared.connections.lock().insert(
        id,
        LiveConnection {
            socket: registered,
            export: None,
        },
    );
    let spawned = thread::Builder::new()
        .name(format!("nbd-conn-{id}"))
        .spawn({
            let shared = Arc::clone(shared);
            move || {
                let registration = Registration {
                    shared: Arc::clone(&shared),
                    id,
                };
                serve_connection(&shared, registration, admitted, stream, peer);
            }
        });
    match spawned {
        Ok(worker) => {
            let mut workers = shared.workers.lock();
            // Finished threads need no join; dropping their handle is enough.
            workers.retain(|w| !w.is_finished());
            workers.push(worker);
        }
        Err(err) => {
            shared.connections.lock().remove(&id);
            tracing::warn!(%peer, "NBD connection refused, cannot start its thread: {err}");
        }
    }
}

/// Unregisters a connection when it ends, however it ends (its thread, or
/// its event loop, drops this).
struct Registration {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.shared.connections.lock().remove(&self.id);
    }
}

fn serve_connection(
    shared: &Shared,
    registration: Registration,
    admitted: Admitted,
    mut stream: Stream,
    peer: Peer,
) {
    let id = registration.id;
    // Replies are complete messages sent with one write; Nagle would only
    // delay them (the protocol asks for TCP_NODELAY).
    if let Err(err) = stream.set_nodelay() {
        tracing::debug!(%peer, "cannot set TCP_NODELAY: {err}");
    }
    let stopping = || shared.stopping.load(Ordering::SeqCst);
    if let Err(err) = stream.set_read_timeout(Some(shared.limits.handshake_timeout)) {
        tracing::warn!(%peer, "NBD connection refused, cannot set the handshake timeout: {err}");
        return;
    }
    let security = match &shared.tls {
        Some(tls) => Security::TlsRequired {
            tls,
            timeout: shared.limits.handshake_timeout,
        },
        None => Security::Open,
    };
    let mut pump = None;
    let outcome = handshake::negotiate(&mut stream, shared.exports.as_ref(), security, &mut pump);
    if let Some(pump) = pump {
        // Ends with the connection; joined at stop like this thread.
        shared.workers.lock().push(pump);
    }
    let negotiated = match outcome {
        Ok(HandshakeOutcome::Transmission(negotiated)) => negotiated,
        Ok(HandshakeOutcome::Aborted) => {
            tracing::debug!(%peer, "NBD client ended the handshake (NBD_OPT_ABORT)");
            return;
        }
        Err(err) if stopping() => {
            tracing::debug!(%peer, "NBD handshake ended by server shutdown: {err}");
            return;
        }
        Err(err) => {
            tracing::warn!(%peer, "NBD handshake failed: {err}");
            return;
        }
    };
    // Transmission waits for requests as long as the client likes (see
    // the module's invariants).
    if let Err(err) = stream.set_read_timeout(None) {
        tracing::warn!(%peer, "NBD connection closed, cannot clear the handshake timeout: {err}");
        return;
    }
    let export = negotiated.handle.name().to_owned();
    if let Some(c) = shared.connections.lock().get_mut(&id) {
        c.export = Some(export.clone());
    }
    tracing::info!(%peer, %export, structured_replies = negotiated.structured,
        block_status = negotiated.base_allocation.is_some(), "NBD client connected");
    if stopping() {
        // The loops may be gone already: never hand them a connection.
        tracing::info!(%peer, %export, "NBD connection closed by server shutdown");
        return;
    }
    if let Some(loops) = &shared.loops {
        let reactor = loops.reactor();
        let report = {
            let export = export.clone();
            let stopping = Arc::clone(&registration.shared);
            move |end| {
                report_end(peer, &export, end, stopping.stopping.load(Ordering::SeqCst));
                drop(registration);
                drop(admitted);
            }
        };
        match EventedConnection::new(stream, peer, negotiated, Box::new(report)) {
            Ok(connection) => reactor.adopt(Box::new(connection)),
            Err(err) => tracing::warn!(%peer, %export, "NBD connection closed: {err}"),
        }
        return;
    }
    let end = transmission::serve(stream, peer, negotiated, shared.limits.lanes_per_connection);
    report_end(peer, &export, end, stopping());
    drop(registration);
    drop(admitted);
}

/// Logs how a connection's transmission phase ended.
fn report_end(peer: Peer, export: &str, end: Result<SessionEnd, ConnectionError>, stopping: bool) {
    match end {
        Ok(SessionEnd::Disconnect) => {
            tracing::info!(%peer, %export, "NBD client disconnected")
        }
        Ok(SessionEnd::ClientClosed) if stopping => {
            tracing::info!(%peer, %export, "NBD connection closed by server shutdown")
        }
        Ok(SessionEnd::ClientClosed) => {
            tracing::info!(%peer, %export, "NBD client closed the connection without NBD_CMD_DISC")
        }
        Err(err) if stopping => {
            tracing::info!(%peer, %export, "NBD connection closed by server shutdown ({err})")
        }
        Err(err) => tracing::warn!(%peer, %export, "NBD connection closed: {err}"),
    }
}
