//! The listening side: an acceptor thread and one thread per connection.
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
//!   (more are closed at once, with a log line per order of magnitude: see
//!   `basalt_volume::admission`), so one host cannot lock the others out; a
//!   client that does not finish each step of the handshake, or does not
//!   send its first request, within `handshake_timeout` is disconnected, so
//!   idle or half-open sockets cannot pin threads forever. A connection
//!   that has sent a request may then stay idle as long as it likes: NBD
//!   has no keep-alive, and a virtual machine's disk connection is idle for
//!   hours between bursts.

use crate::evented::EventedConnection;
use crate::handshake::{self, HandshakeOutcome};
use crate::transmission::{self, SessionEnd};
use crate::ConnectionError;
use crate::Exports;
use basalt_reactor::Reactor;
use basalt_volume::admission::{Admission, AdmissionLimits, Admitted};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// Pause after an accept error caused by resource exhaustion, so a full
/// file table does not turn the acceptor into a busy loop.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Lanes per connection unless configured: two keep a pipelining client's
/// requests flowing while a batch waits for the disk (measured against one
/// and three in BENCHMARKS.md).
pub const DEFAULT_LANES_PER_CONNECTION: usize = 2;

/// Connections one IP address may hold unless configured: plenty for the
/// hypervisors and tools of one host, a sixteenth of the total.
pub const DEFAULT_MAX_CONNECTIONS_PER_ADDRESS: usize = 64;

/// Per-server bounds on what clients can hold.
#[derive(Debug, Clone, Copy)]
pub struct ServerLimits {
    /// Live connections at most; further ones are closed on accept.
    pub max_connections: usize,
    /// Live connections from one IP address at most.
    pub max_connections_per_address: usize,
    /// Time a client has for each read of the handshake, and then to send
    /// its first request.
    pub handshake_timeout: Duration,
    /// Event loops serving connections to volumes of this node's store
    /// (`evented`): each connection lives on one loop, which receives,
    /// executes and answers its requests without a thread hand-off. 0:
    /// serve every connection with lanes instead.
    pub event_loops: usize,
    /// Threads serving one connection in transmission when it is not on an
    /// event loop (a replicated volume's, or with no loops). With more than one,
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
/// 277k; BENCHMARKS.md, issue 20. `--nbd-event-loops` sets it.)
pub fn default_event_loops() -> usize {
    basalt_reactor::default_loops()
}

struct Shared {
    exports: Arc<dyn Exports>,
    /// The event loops, unless `limits.event_loops` is 0.
    reactor: Option<Arc<Reactor>>,
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
    socket: TcpStream,
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
    local_addr: SocketAddr,
    listener: Arc<TcpListener>,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl NbdServer {
    /// Binds `listen`, starts accepting connections in a background thread
    /// and logs "NBD listening on ADDR".
    pub fn start(listen: SocketAddr, exports: Arc<dyn Exports>) -> io::Result<NbdServer> {
        Self::start_with_limits(listen, exports, ServerLimits::default())
    }

    /// [`NbdServer::start`] with explicit client limits.
    pub fn start_with_limits(
        listen: SocketAddr,
        exports: Arc<dyn Exports>,
        limits: ServerLimits,
    ) -> io::Result<NbdServer> {
        let listener = Arc::new(TcpListener::bind(listen)?);
        let local_addr = listener.local_addr()?;
        let admission = Admission::new(
            "NBD",
            AdmissionLimits {
                max_total: limits.max_connections,
                max_per_address: limits.max_connections_per_address,
            },
        );
        let reactor = match limits.event_loops {
            0 => None,
            n => Some(Reactor::start("nbd", n)?),
        };
        let shared = Arc::new(Shared {
            exports,
            reactor,
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
            move || accept_loop(&listener, &shared)
        })?;
        tracing::info!("NBD listening on {local_addr}");
        Ok(NbdServer {
            local_addr,
            listener,
            shared,
            acceptor: Some(acceptor),
        })
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
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
        // SAFETY: plain syscall on the listener's fd, which stays open as
        // long as `self.listener` lives. On Linux, shutting a listening
        // socket down makes a blocked accept() return (with EINVAL).
        let rc = unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
        if rc != 0 {
            // Fall back to waking accept() with a connection of our own.
            let _ =
                TcpStream::connect_timeout(&wake_address(self.local_addr), Duration::from_secs(1));
        }
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
        // Connections on event loops: stopped (their sockets are shut down
        // already) and waited for.
        if let Some(reactor) = &self.shared.reactor {
            reactor.stop();
        }
        tracing::info!("NBD server on {} stopped", self.local_addr);
    }
}

impl Drop for NbdServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Where to connect to reach a listener bound to `addr` (an unspecified
/// address is reachable through loopback).
fn wake_address(addr: SocketAddr) -> SocketAddr {
    let mut addr = addr;
    if addr.ip().is_unspecified() {
        match addr {
            SocketAddr::V4(_) => addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into()),
            SocketAddr::V6(_) => addr.set_ip(std::net::Ipv6Addr::LOCALHOST.into()),
        }
    }
    addr
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    loop {
        let accepted = listener.accept();
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        match accepted {
            Ok((stream, peer)) => spawn_connection(shared, stream, peer),
            Err(err) => match err.raw_os_error() {
                // The listener itself is unusable: nothing will ever succeed.
                Some(libc::EBADF | libc::EINVAL | libc::ENOTSOCK) => {
                    tracing::error!("NBD acceptor stopped: {err}");
                    return;
                }
                Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM) => {
                    tracing::warn!("NBD accept failed, retrying: {err}");
                    thread::sleep(ACCEPT_BACKOFF);
                }
                // Errors of one incoming connection (aborted, network
                // errors passed on by Linux): skip it.
                _ => tracing::debug!("NBD accept failed: {err}"),
            },
        }
    }
}

fn spawn_connection(shared: &Arc<Shared>, stream: TcpStream, peer: SocketAddr) {
    // Refused: dropping the stream closes it before any greeting (the
    // admission logs it).
    let Ok(admitted) = shared.admission.admit(peer.ip()) else {
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
    mut stream: TcpStream,
    peer: SocketAddr,
) {
    let id = registration.id;
    // Replies are complete messages sent with one write; Nagle would only
    // delay them (the protocol asks for TCP_NODELAY).
    if let Err(err) = stream.set_nodelay(true) {
        tracing::debug!(%peer, "cannot set TCP_NODELAY: {err}");
    }
    let stopping = || shared.stopping.load(Ordering::SeqCst);
    if let Err(err) = stream.set_read_timeout(Some(shared.limits.handshake_timeout)) {
        tracing::warn!(%peer, "NBD connection refused, cannot set the handshake timeout: {err}");
        return;
    }
    let negotiated = match handshake::negotiate(&mut stream, shared.exports.as_ref()) {
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
    // The first request must come within the handshake timeout (which is
    // still set): a connection that negotiated and then sends nothing is
    // holding a place, not using a disk. After it, transmission waits for
    // requests as long as the client likes.
    let mut first = [0u8; 1];
    match stream.peek(&mut first) {
        Ok(_) => {}
        Err(err)
            if matches!(
                err.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            tracing::warn!(%peer, timeout = ?shared.limits.handshake_timeout,
                "NBD client sent no request after the handshake; closed");
            return;
        }
        Err(err) => {
            tracing::debug!(%peer, "NBD connection lost before its first request: {err}");
            return;
        }
    }
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
    if let (Some(reactor), true) = (&shared.reactor, negotiated.handle.local().is_some()) {
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
fn report_end(
    peer: SocketAddr,
    export: &str,
    end: Result<SessionEnd, ConnectionError>,
    stopping: bool,
) {
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
