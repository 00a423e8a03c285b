//! What TCP frontends share around their listening socket, whatever their
//! protocol: the acceptor loop, the registry of live connections (each
//! served first by a thread of its own), and stopping both.
//!
//! Invariants:
//! - The acceptor ends when the server stops (checked after every accept)
//!   or when the listener itself fails (EBADF, EINVAL, ENOTSOCK); it backs
//!   off on resource exhaustion (EMFILE, ENFILE, ENOBUFS, ENOMEM) and skips
//!   the errors of one incoming connection.
//! - Every live connection is registered (with a clone of its socket)
//!   before its thread starts, and unregistered when its [`Registration`]
//!   drops — wherever the connection went meanwhile (an event loop), even by
//!   panic — so [`Connections::len`] counts exactly the live ones.
//! - [`Connections::shutdown_all`] shuts every registered socket down with
//!   `shutdown(2)`, which wakes a thread blocked in `recv` or `send` and
//!   ends a connection on an event loop; [`Connections::join`] then waits
//!   for every thread started.
//! - A client that vanishes without closing (its host crashed or lost
//!   power, a partition) does not hold its connection, its admission slot
//!   and its volume open forever: every accepted TCP connection gets
//!   [`detect_dead_peers`], so the kernel fails it within about
//!   [`DEAD_PEER_AFTER`] (keepalive probes while idle, a user timeout
//!   while data waits for acknowledgement); the failure reaches the
//!   connection as an error of its pending `recv`, `send` or poll.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// Pause after an accept error caused by resource exhaustion.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Idle time before the first keepalive probe, and between probes.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// Unanswered probes after which the peer is dead.
const KEEPALIVE_PROBES: u32 = 3;
/// How long a silent peer keeps its connection at most: idle + probes ×
/// interval for an idle connection, and the TCP user timeout for one with
/// data unacknowledged. Longer than any pause a live initiator makes
/// (NVMe/TCP's keep-alive, iSCSI's NOP-Outs and multipath checkers run
/// every few seconds), short enough that a crashed host's reconnection is
/// not refused for long by the per-address connection limit.
pub const DEAD_PEER_AFTER: Duration = Duration::from_secs(60);

/// Makes the kernel fail `stream` once its peer stops answering (see the
/// module's invariants). Best effort: a socket that refuses the options
/// is served without them, with a warning.
pub fn detect_dead_peers(stream: &TcpStream) {
    let socket = socket2::SockRef::from(stream);
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES);
    let set = socket
        .set_tcp_keepalive(&keepalive)
        .and_then(|()| socket.set_tcp_user_timeout(Some(DEAD_PEER_AFTER)));
    if let Err(err) = set {
        tracing::warn!("cannot enable dead peer detection on a client connection: {err}");
    }
}

/// Accepts connections with `accept` and hands each to `serve`, until
/// `stopping()` says so (checked after each accept, which a stop wakes) or
/// the listener fails. `protocol` names the frontend in log lines.
pub fn accept_loop<S, P>(
    protocol: &str,
    mut accept: impl FnMut() -> io::Result<(S, P)>,
    stopping: impl Fn() -> bool,
    mut serve: impl FnMut(S, P),
) {
    loop {
        let accepted = accept();
        if stopping() {
            return;
        }
        match accepted {
            Ok((stream, peer)) => serve(stream, peer),
            Err(err) => match err.raw_os_error() {
                // The listener itself is unusable: nothing will ever succeed.
                Some(libc::EBADF | libc::EINVAL | libc::ENOTSOCK) => {
                    tracing::error!("{protocol} acceptor stopped: {err}");
                    return;
                }
                Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM) => {
                    tracing::warn!("{protocol} accept failed, retrying: {err}");
                    thread::sleep(ACCEPT_BACKOFF);
                }
                // Errors of one incoming connection (aborted, network errors
                // passed on by Linux): skip it.
                _ => tracing::debug!("{protocol} accept failed: {err}"),
            },
        }
    }
}

/// Wakes an acceptor blocked in `accept()` on `listener` (bound to
/// `local_addr`) so it sees the stop: `shutdown(2)` on the listening
/// socket, which makes a blocked `accept()` return on Linux, or else a
/// connection of our own.
pub fn wake_acceptor(listener: &TcpListener, local_addr: SocketAddr) {
    // SAFETY: plain syscall on the listener's fd, which stays open as long
    // as `listener` is borrowed.
    let rc = unsafe { libc::shutdown(listener.as_raw_fd(), libc::SHUT_RDWR) };
    if rc != 0 {
        let _ = TcpStream::connect_timeout(&reachable_address(local_addr), Duration::from_secs(1));
    }
}

/// Where to connect to reach a listener bound to `addr` (an unspecified
/// address is reachable through loopback).
pub fn reachable_address(addr: SocketAddr) -> SocketAddr {
    let mut addr = addr;
    if addr.ip().is_unspecified() {
        match addr {
            SocketAddr::V4(_) => addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into()),
            SocketAddr::V6(_) => addr.set_ip(std::net::Ipv6Addr::LOCALHOST.into()),
        }
    }
    addr
}

/// The live connections of one TCP frontend and the threads they started
/// on.
#[derive(Default)]
pub struct Connections {
    next_id: AtomicU64,
    sockets: Mutex<HashMap<u64, TcpStream>>,
    workers: Mutex<Vec<JoinHandle<()>>>,
}

/// A connection's place in [`Connections`]; dropping it unregisters the
/// connection.
pub struct Registration {
    connections: Arc<Connections>,
    pub id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.connections.sockets.lock().remove(&self.id);
    }
}

impl Connections {
    /// Registers `stream` and serves it on a new thread named
    /// `{thread_prefix}-{id}`: `serve` gets the stream and the
    /// registration, which it keeps as long as the connection lives.
    /// Returns false (the stream is closed) if the socket cannot be
    /// cloned or the thread cannot start.
    pub fn spawn(
        self: &Arc<Self>,
        protocol: &str,
        thread_prefix: &str,
        stream: TcpStream,
        peer: SocketAddr,
        serve: impl FnOnce(TcpStream, Registration) + Send + 'static,
    ) -> bool {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let registered = match stream.try_clone() {
            Ok(clone) => clone,
            Err(err) => {
                tracing::warn!(%peer, "{protocol} connection refused, cannot register its socket: {err}");
                return false;
            }
        };
        self.sockets.lock().insert(id, registered);
        let registration = Registration {
            connections: Arc::clone(self),
            id,
        };
        let spawned = thread::Builder::new()
            .name(format!("{thread_prefix}-{id}"))
            .spawn(move || serve(stream, registration));
        match spawned {
            Ok(worker) => {
                let mut workers = self.workers.lock();
                workers.retain(|w| !w.is_finished());
                workers.push(worker);
                true
            }
            Err(err) => {
                // (The registration dropped with the closure.)
                tracing::warn!(%peer, "{protocol} connection refused, cannot start its thread: {err}");
                false
            }
        }
    }

    /// Live connections.
    pub fn len(&self) -> usize {
        self.sockets.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Shuts down the socket of connection `id`, if it is live.
    pub fn shutdown(&self, id: u64) -> bool {
        match self.sockets.lock().get(&id) {
            Some(stream) => {
                let _ = stream.shutdown(Shutdown::Both);
                true
            }
            None => false,
        }
    }

    /// Shuts down every live connection's socket.
    pub fn shutdown_all(&self) {
        for stream in self.sockets.lock().values() {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }

    /// Waits for every connection thread started; a panicked one is
    /// logged.
    pub fn join(&self, protocol: &str) {
        let workers = std::mem::take(&mut *self.workers.lock());
        for worker in workers {
            if worker.join().is_err() {
                tracing::error!("{protocol} connection thread panicked");
            }
        }
    }

    /// Waits until no connection is live (those on event loops end after
    /// their sockets were shut down).
    pub fn wait_until_empty(&self) {
        while !self.is_empty() {
            thread::sleep(Duration::from_millis(1));
        }
    }
}
