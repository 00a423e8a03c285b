//! The node-to-node transport: carries replication [`Msg`]s between node
//! processes over TCP, in frames of `basalt-peer-wire`.
//!
//! Job: `send(to, vol, msg)` from any thread returns at once; the message
//! reaches `to`'s [`PeerHandler`] unless the connection breaks, the
//! destination's queue is full or the destination is unknown.
//!
//! Shape: every node dials the peers it sends to, so A→B and B→A are two
//! TCP connections, each used in one direction after the `Hello` exchange
//! (the dialer sends its Hello; the acceptor checks the cluster id and
//! answers with its own; the dialer checks cluster and node id). Threads:
//! one acceptor, one reader per inbound connection (which calls the
//! handler), one writer per destination (which dials lazily on the first
//! send, reconnects with backoff 50 ms → 1 s while frames are queued, and
//! writes everything queued with one `writev` per wake-up, write data
//! straight from the messages). Idle threads block in `accept`, `read` or on
//! a condition variable: no polling.
//!
//! Fast path: when the connection is up, nothing is queued and nobody is
//! writing, `send` writes the frame itself without blocking
//! (`MSG_DONTWAIT`); whatever the socket does not take at once is queued
//! first in line for the writer. A replicated write then costs no wake-up
//! of a writer thread on either side. `send_batch` does the same for
//! several frames to one peer with one `sendmsg`, so a round's writes (or
//! acknowledgements) cost one system call and one wake-up of the reader.
//!
//! Invariants:
//! - Frames to one peer leave in `send` order over one connection at a time;
//!   when a connection breaks, frames already handed to it may be lost (the
//!   replication protocol retransmits on its own timeouts), but a later frame
//!   never overtakes an earlier one.
//! - The bytes queued per destination never exceed `max_queue_bytes`; what
//!   does not fit is dropped and counted, never blocked on.
//! - A connection whose peer sends anything undecodable, or a Hello from
//!   another cluster, is closed with a warning; other connections are not
//!   affected.
//! - After [`PeerNet::shutdown`] returns, every thread it started has ended.

mod reader;

use crate::secret::{self, ClusterSecret, HelloFields, Role};
use basalt_peer_wire::{self as wire, DecodeError, Frame, NONCE_LEN, PROOF_LEN};
use basalt_replication::{Msg, NodeId, VolumeId};
use parking_lot::{Condvar, Mutex};
use reader::{FrameReader, ReadError};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::{self, IoSlice, Write};
use std::net::{Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// How a node takes part in the peer network.
#[derive(Clone, Debug)]
pub struct PeerConfig {
    /// Cluster id; connections from another cluster are refused.
    pub cluster: [u8; 16],
    /// The secret both ends of every connection prove they hold (see
    /// `secret`); connections that cannot are refused.
    pub secret: ClusterSecret,
    pub me: NodeId,
    /// This process's boot id, sent in every Hello.
    pub boot: u64,
    /// Port 0 picks a free port (see [`PeerNet::local_addr`]).
    pub listen: SocketAddr,
    /// Bounds a dial and the Hello exchange of either side.
    pub connect_timeout: Duration,
    /// Per destination; beyond it new frames are dropped (and counted).
    pub max_queue_bytes: usize,
}

/// Receives the frames of every inbound connection.
pub trait PeerHandler: Send + Sync + 'static {
    /// A frame from node `from` (as it said in its Hello). Called on the
    /// connection's reader thread; must not block long.
    fn on_message(&self, from: NodeId, vol: VolumeId, msg: Msg);

    /// Frames that arrived together from node `from`, in order (all that
    /// were already received when the first was decoded). Lets the handler
    /// act on them as one batch; by default they go one by one.
    fn on_batch(&self, from: NodeId, batch: Vec<(VolumeId, Msg)>) {
        for (vol, msg) in batch {
            self.on_message(from, vol, msg);
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("cannot start the acceptor thread: {0}")]
    Spawn(#[source] io::Error),
}

/// Counters since start, and the state of every known destination.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeerStats {
    pub frames_sent: u64,
    pub bytes_sent: u64,
    pub frames_received: u64,
    pub bytes_received: u64,
    /// Frames given to `send` and never written: to self, unknown peer,
    /// unencodable, full queue, lost with a broken connection, or still
    /// queued at shutdown.
    pub frames_dropped: u64,
    /// Of `frames_dropped`: refused because the destination's queue was full.
    pub dropped_queue_full: u64,
    /// Outbound connections established (Hello exchange completed).
    pub connects: u64,
    /// Inbound connections accepted (Hello exchange completed).
    pub accepts: u64,
    /// Connections closed for a bad frame or a refused Hello (either side).
    pub protocol_errors: u64,
    pub peers: BTreeMap<NodeId, PeerLink>,
}

/// One destination as seen by its writer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerLink {
    pub addr: SocketAddr,
    pub connected: bool,
    pub queued_frames: usize,
    pub queued_bytes: usize,
    /// Frames to this peer dropped (full queue, broken connection, shutdown).
    pub dropped: u64,
}

/// The transport of one node. Send + Sync; share it through an `Arc`.
/// Dropping it shuts it down.
pub struct PeerNet {
    inner: Arc<Inner>,
}

struct Inner {
    cfg: PeerConfig,
    local: SocketAddr,
    handler: Arc<dyn PeerHandler>,
    /// Set once by `shutdown`, under the `peers` lock (so that no
    /// destination is added, and no writer started, after shutdown looked).
    closing: AtomicBool,
    peers: Mutex<HashMap<NodeId, Arc<Dest>>>,
    inbound: Mutex<Inbound>,
    acceptor: Mutex<Option<JoinHandle<()>>>,
    c: Counters,
}

#[derive(Default)]
struct Counters {
    frames_sent: AtomicU64,
    bytes_sent: AtomicU64,
    frames_received: AtomicU64,
    bytes_received: AtomicU64,
    frames_dropped: AtomicU64,
    dropped_queue_full: AtomicU64,
    connects: AtomicU64,
    accepts: AtomicU64,
    protocol_errors: AtomicU64,
}

fn bump(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

/// Inbound connections: sockets (to break their reads at shutdown) and
/// reader threads.
#[derive(Default)]
struct Inbound {
    next_id: u64,
    streams: HashMap<u64, TcpStream>,
    threads: Vec<JoinHandle<()>>,
}

/// One destination: its queue and its writer.
struct Dest {
    node: NodeId,
    state: Mutex<DestState>,
    /// Signals the writer: frames queued, address changed, or stop.
    wake: Condvar,
    writer: Mutex<Option<JoinHandle<()>>>,
}

struct DestState {
    addr: SocketAddr,
    /// Bumped by an address change; the writer drops a connection made
    /// under an older generation.
    generation: u64,
    queue: VecDeque<Queued>,
    queued_bytes: usize,
    /// A clone of the writer's socket, so that an address change or
    /// shutdown can break a blocked dial handshake or write, and `send`'s
    /// fast path can write to it.
    conn: Option<Arc<TcpStream>>,
    connected: bool,
    /// Someone (the writer or a fast-path `send`) is writing to the socket;
    /// everybody else queues, which keeps frames in order.
    busy: bool,
    stop: bool,
    writer_started: bool,
    dropped: u64,
}

struct Queued {
    item: Item,
    len: usize,
}

enum Item {
    Frame(Frame),
    /// The unsent tail of a frame a fast-path `send` began.
    Tail(Vec<u8>),
}

impl PeerNet {
    /// Binds the listener and starts the acceptor thread.
    pub fn start(cfg: PeerConfig, handler: Arc<dyn PeerHandler>) -> Result<PeerNet, PeerError> {
        let listener = TcpListener::bind(cfg.listen).map_err(|source| PeerError::Listen {
            addr: cfg.listen,
            source,
        })?;
        let local = listener.local_addr().map_err(|source| PeerError::Listen {
            addr: cfg.listen,
            source,
        })?;
        let inner = Arc::new(Inner {
            cfg,
            local,
            handler,
            closing: AtomicBool::new(false),
            peers: Mutex::new(HashMap::new()),
            inbound: Mutex::new(Inbound::default()),
            acceptor: Mutex::new(None),
            c: Counters::default(),
        });
        let acceptor = {
            let inner = inner.clone();
            thread::Builder::new()
                .name(format!("peer-accept-{}", inner.cfg.me.0))
                .spawn(move || accept_loop(&inner, listener))
                .map_err(PeerError::Spawn)?
        };
        *inner.acceptor.lock() = Some(acceptor);
        tracing::info!(node = inner.cfg.me.0, %local, "peer transport listening");
        Ok(PeerNet { inner })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.inner.local
    }

    /// Where node `node` listens; a changed address drops the old connection.
    pub fn set_peer_addr(&self, node: NodeId, addr: SocketAddr) {
        let mut peers = self.inner.peers.lock();
        if self.inner.closing.load(Ordering::SeqCst) {
            return;
        }
        match peers.get(&node) {
            Some(dest) => {
                let mut st = dest.state.lock();
                if st.addr != addr {
                    tracing::info!(peer = node.0, old = %st.addr, new = %addr, "peer address changed");
                    st.addr = addr;
                    st.generation += 1;
                    if let Some(conn) = st.conn.take() {
                        let _ = conn.shutdown(Shutdown::Both);
                    }
                    dest.wake.notify_all();
                }
            }
            None => {
                peers.insert(
                    node,
                    Arc::new(Dest {
                        node,
                        state: Mutex::new(DestState {
                            addr,
                            generation: 0,
                            queue: VecDeque::new(),
                            queued_bytes: 0,
                            conn: None,
                            connected: false,
                            busy: false,
                            stop: false,
                            writer_started: false,
                            dropped: 0,
                        }),
                        wake: Condvar::new(),
                        writer: Mutex::new(None),
                    }),
                );
            }
        }
    }

    /// Queues `msg` for `to` and returns at once (never blocks on the
    /// network). Unknown peer, full queue, or `to == me`: dropped, counted,
    /// logged at debug.
    pub fn send(&self, to: NodeId, vol: VolumeId, msg: Msg) {
        self.send_batch(to, vol, vec![msg]);
    }

    /// [`PeerNet::send`] for several messages to one peer, in order. On the
    /// fast path they leave in one `sendmsg`, so a batch of replicated
    /// writes (or of their acknowledgements) costs one system call and
    /// wakes the receiver once instead of once per message.
    pub fn send_batch(&self, to: NodeId, vol: VolumeId, msgs: Vec<Msg>) {
        let n = msgs.len();
        self.send_frames(to, n, msgs.into_iter().map(|msg| (vol, msg)));
    }

    /// [`PeerNet::send_batch`] for messages of several volumes (a node's
    /// heartbeats, or the coordinator's answers to them), in order.
    pub fn send_many(&self, to: NodeId, msgs: Vec<(VolumeId, Msg)>) {
        let n = msgs.len();
        self.send_frames(to, n, msgs.into_iter());
    }

    fn send_frames(&self, to: NodeId, n: usize, msgs: impl Iterator<Item = (VolumeId, Msg)>) {
        let inner = &self.inner;
        if to == inner.cfg.me {
            for _ in 0..n {
                inner.dropped(to, "addressed to this node");
            }
            return;
        }
        let mut frames: Vec<(Frame, usize)> = Vec::with_capacity(n);
        for (vol, msg) in msgs {
            let frame = Frame::Msg { vol, msg };
            match wire::encoded_len(&frame) {
                Ok(len) => frames.push((frame, len)),
                Err(err) => {
                    tracing::debug!(peer = to.0, error = %err, "dropping unencodable frame");
                    bump(&inner.c.frames_dropped, 1);
                }
            }
        }
        if frames.is_empty() {
            return;
        }
        let Some(dest) = inner.peers.lock().get(&to).cloned() else {
            for _ in &frames {
                inner.dropped(to, "unknown peer");
            }
            return;
        };
        let mut st = dest.state.lock();
        if st.stop {
            for _ in &frames {
                inner.dropped(to, "transport shut down");
            }
            return;
        }
        // Admit frames while they fit under the queue bound (counting the
        // ones admitted before them); the rest are dropped.
        let mut admitted_bytes = 0usize;
        frames.retain(|(_, len)| {
            let fits = st
                .queued_bytes
                .saturating_add(admitted_bytes)
                .saturating_add(*len)
                <= inner.cfg.max_queue_bytes;
            if fits {
                admitted_bytes += len;
            } else {
                st.dropped += 1;
                bump(&inner.c.dropped_queue_full, 1);
                inner.dropped(to, "queue full");
            }
            fits
        });
        if frames.is_empty() {
            return;
        }
        if st.connected && !st.busy && st.queue.is_empty() {
            if let Some(sock) = st.conn.clone() {
                st.busy = true;
                drop(st);
                let sent = send_now(&sock, &frames);
                let mut st = dest.state.lock();
                st.busy = false;
                match sent {
                    Ok(out) => {
                        bump(&inner.c.bytes_sent, out.bytes as u64);
                        // A frame counts as sent once: here if it went out
                        // whole, else when the writer sends its tail.
                        bump(&inner.c.frames_sent, out.whole as u64);
                        // What did not go out goes first in line, in order:
                        // ahead of whatever others queued meanwhile.
                        for (frame, len) in frames.drain(..).skip(out.whole).rev() {
                            st.queued_bytes += len;
                            st.queue.push_front(Queued {
                                item: Item::Frame(frame),
                                len,
                            });
                        }
                        if let Some(tail) = out.tail {
                            // The partly sent frame was pushed above as a
                            // whole frame; replace it by its unsent tail.
                            if let Some(q) = st.queue.pop_front() {
                                st.queued_bytes -= q.len;
                            }
                            st.queued_bytes += tail.len();
                            st.queue.push_front(Queued {
                                len: tail.len(),
                                item: Item::Tail(tail),
                            });
                        }
                    }
                    Err(err) => {
                        // Nothing went out: the frames wait for the writer,
                        // which finds the connection closed and reconnects.
                        // Until then every send queues.
                        tracing::debug!(peer = to.0, error = %err, "peer connection broke on a direct send");
                        let _ = sock.shutdown(Shutdown::Both);
                        st.conn = None;
                        st.connected = false;
                        for (frame, len) in frames.into_iter().rev() {
                            st.queue.push_front(Queued {
                                item: Item::Frame(frame),
                                len,
                            });
                            st.queued_bytes += len;
                        }
                    }
                }
                if !st.queue.is_empty() {
                    self.start_writer(&dest, &mut st);
                    dest.wake.notify_one();
                }
                return;
            }
        }
        for (frame, len) in frames {
            st.queue.push_back(Queued {
                item: Item::Frame(frame),
                len,
            });
            st.queued_bytes += len;
        }
        self.start_writer(&dest, &mut st);
        dest.wake.notify_one();
    }

    /// Starts `dest`'s writer thread unless it runs already.
    fn start_writer(&self, dest: &Arc<Dest>, st: &mut DestState) {
        if st.writer_started {
            return;
        }
        let (inner2, dest2) = (self.inner.clone(), dest.clone());
        match thread::Builder::new()
            .name(format!("peer-tx-{}", dest.node.0))
            .spawn(move || writer_loop(&inner2, &dest2))
        {
            Ok(handle) => {
                st.writer_started = true;
                *dest.writer.lock() = Some(handle);
            }
            // The frames stay queued; the next send tries again.
            Err(err) => tracing::error!(peer = dest.node.0, error = %err, "cannot start writer"),
        }
    }

    pub fn stats(&self) -> PeerStats {
        let c = &self.inner.c;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let peers = self
            .inner
            .peers
            .lock()
            .values()
            .map(|dest| {
                let st = dest.state.lock();
                (
                    dest.node,
                    PeerLink {
                        addr: st.addr,
                        connected: st.connected,
                        queued_frames: st.queue.len(),
                        queued_bytes: st.queued_bytes,
                        dropped: st.dropped,
                    },
                )
            })
            .collect();
        PeerStats {
            frames_sent: load(&c.frames_sent),
            bytes_sent: load(&c.bytes_sent),
            frames_received: load(&c.frames_received),
            bytes_received: load(&c.bytes_received),
            frames_dropped: load(&c.frames_dropped),
            dropped_queue_full: load(&c.dropped_queue_full),
            connects: load(&c.connects),
            accepts: load(&c.accepts),
            protocol_errors: load(&c.protocol_errors),
            peers,
        }
    }

    /// Closes the listener and every connection and joins every thread.
    /// Idempotent. (Called from a handler, it cannot join the calling
    /// reader thread itself; that thread ends when the handler returns.)
    pub fn shutdown(&self) {
        let inner = &self.inner;
        let dests: Vec<Arc<Dest>> = {
            let peers = inner.peers.lock();
            inner.closing.store(true, Ordering::SeqCst);
            peers.values().cloned().collect()
        };
        // Wake the acceptor, blocked in accept(), with a connection of our own.
        let mut wake = inner.local;
        if wake.ip().is_unspecified() {
            wake.set_ip(match wake {
                SocketAddr::V4(_) => Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => Ipv6Addr::LOCALHOST.into(),
            });
        }
        let acceptor = inner.acceptor.lock().take();
        if acceptor.is_some() {
            if let Err(err) = TcpStream::connect_timeout(&wake, Duration::from_secs(5)) {
                tracing::warn!(error = %err, "cannot wake the peer acceptor");
            }
        }
        for dest in &dests {
            let mut st = dest.state.lock();
            st.stop = true;
            if let Some(conn) = st.conn.take() {
                let _ = conn.shutdown(Shutdown::Both);
            }
            dest.wake.notify_all();
        }
        let readers = {
            let mut inbound = inner.inbound.lock();
            for stream in inbound.streams.values() {
                let _ = stream.shutdown(Shutdown::Both);
            }
            std::mem::take(&mut inbound.threads)
        };
        let me = thread::current().id();
        let handles = acceptor
            .into_iter()
            .chain(dests.iter().filter_map(|d| d.writer.lock().take()))
            .chain(readers);
        for handle in handles {
            if handle.thread().id() != me && handle.join().is_err() {
                tracing::error!("a peer transport thread panicked");
            }
        }
    }
}

impl Drop for PeerNet {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Inner {
    fn dropped(&self, to: NodeId, why: &'static str) {
        bump(&self.c.frames_dropped, 1);
        tracing::debug!(peer = to.0, why, "dropping frame");
    }

    fn closing(&self) -> bool {
        self.closing.load(Ordering::SeqCst)
    }
}

// ------------------------------------------------------------------ inbound

fn accept_loop(inner: &Arc<Inner>, listener: TcpListener) {
    for conn in listener.incoming() {
        if inner.closing() {
            break;
        }
        let stream = match conn {
            Ok(stream) => stream,
            Err(err) => {
                // E.g. out of file descriptors: pause instead of spinning.
                tracing::warn!(error = %err, "accepting a peer connection failed");
                thread::sleep(BACKOFF_MIN);
                continue;
            }
        };
        let mut inbound = inner.inbound.lock();
        // Checked under the lock shutdown sweeps with, so no reader escapes.
        if inner.closing() {
            break;
        }
        inbound.threads.retain(|t| !t.is_finished());
        let id = inbound.next_id;
        inbound.next_id += 1;
        match stream.try_clone() {
            Ok(clone) => {
                inbound.streams.insert(id, clone);
            }
            Err(err) => {
                tracing::warn!(error = %err, "cannot clone a peer socket; closing it");
                continue;
            }
        }
        let inner2 = inner.clone();
        match thread::Builder::new()
            .name(format!("peer-rx-{}", inner.cfg.me.0))
            .spawn(move || {
                serve_inbound(&inner2, stream);
                inner2.inbound.lock().streams.remove(&id);
            }) {
            Ok(handle) => inbound.threads.push(handle),
            Err(err) => {
                inbound.streams.remove(&id);
                tracing::warn!(error = %err, "cannot start a peer reader; closing the connection");
            }
        }
    }
}

/// One inbound connection: Hello exchange, then frames to the handler until
/// the connection ends or misbehaves.
fn serve_inbound(inner: &Inner, mut stream: TcpStream) {
    let addr = stream
        .peer_addr()
        .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    let mut reader = FrameReader::new();
    let from = match accept_hello(inner, &mut stream, &mut reader) {
        Ok(from) => from,
        Err(err) => {
            if !inner.closing() {
                bump(&inner.c.protocol_errors, 1);
                tracing::warn!(%addr, error = %err, "refusing peer connection");
            }
            return;
        }
    };
    bump(&inner.c.accepts, 1);
    tracing::debug!(peer = from.0, %addr, "peer connected");
    let mut batch = Vec::new();
    loop {
        match reader.next(&mut stream) {
            Ok(Some((Frame::Msg { vol, msg }, len))) => {
                bump(&inner.c.frames_received, 1);
                bump(&inner.c.bytes_received, len as u64);
                batch.push((vol, msg));
                // Whatever else is already received goes with it.
                while let Ok(Some((vol, msg, len))) = reader.next_buffered_msg() {
                    bump(&inner.c.frames_received, 1);
                    bump(&inner.c.bytes_received, len as u64);
                    batch.push((vol, msg));
                }
                inner.handler.on_batch(from, std::mem::take(&mut batch));
            }
            Ok(Some((Frame::Hello { .. } | Frame::Auth { .. }, _))) => {
                bump(&inner.c.protocol_errors, 1);
                tracing::warn!(peer = from.0, %addr, "closing peer connection: a second Hello or Auth");
                return;
            }
            Ok(None) => {
                tracing::debug!(peer = from.0, %addr, "peer closed its connection");
                return;
            }
            Err(ReadError::Decode(err)) => {
                bump(&inner.c.protocol_errors, 1);
                tracing::warn!(peer = from.0, %addr, error = %err, "closing peer connection: bad frame");
                return;
            }
            Err(err) => {
                if !inner.closing() {
                    tracing::debug!(peer = from.0, %addr, error = %err, "peer connection lost");
                }
                return;
            }
        }
    }
}

fn accept_hello(
    inner: &Inner,
    stream: &mut TcpStream,
    reader: &mut FrameReader,
) -> Result<NodeId, HandshakeError> {
    stream.set_nodelay(true)?;
    let timeout = Some(inner.cfg.connect_timeout.max(Duration::from_millis(1)));
    stream.set_read_timeout(timeout)?;
    stream.set_write_timeout(timeout)?;
    let (dialer, _) = read_hello(inner, stream, reader)?;
    let (node, boot) = (NodeId(dialer.node), dialer.boot);
    if node == inner.cfg.me {
        return Err(HandshakeError::SameNode(node.0));
    }
    let me = inner.hello_fields(secret::nonce());
    let proof = inner.cfg.secret.proof(Role::Acceptor, &dialer, &me);
    let mut out = Vec::new();
    // A Hello always encodes.
    wire::encode(&inner.hello(&me, proof), &mut out).map_err(|_| HandshakeError::NoHello)?;
    stream.write_all(&out)?;
    // The dialer proves itself before anything it sends is taken.
    match reader.next(stream)? {
        Some((Frame::Auth { proof }, _))
            if inner.cfg.secret.verify(Role::Dialer, &dialer, &me, &proof) => {}
        Some((Frame::Auth { .. }, _)) => return Err(HandshakeError::AuthFailed("dialing")),
        Some(_) => return Err(HandshakeError::NoAuth),
        None => return Err(HandshakeError::Closed),
    }
    stream.set_read_timeout(None)?;
    stream.set_write_timeout(None)?;
    tracing::trace!(peer = node.0, boot, "Hello accepted");
    Ok(node)
}

/// Reads the peer's Hello (the first frame either side sends) and checks
/// that it comes from this cluster; returns what it said and its proof.
fn read_hello(
    inner: &Inner,
    stream: &mut TcpStream,
    reader: &mut FrameReader,
) -> Result<(HelloFields, [u8; PROOF_LEN]), HandshakeError> {
    match reader.next(stream)? {
        Some((
            Frame::Hello {
                cluster,
                node,
                boot,
                nonce,
                proof,
            },
            _,
        )) if cluster == inner.cfg.cluster => Ok((
            HelloFields {
                cluster,
                node: node.0,
                boot,
                nonce,
            },
            proof,
        )),
        Some((Frame::Hello { cluster, .. }, _)) => Err(HandshakeError::WrongCluster(hex(&cluster))),
        Some(_) => Err(HandshakeError::NoHello),
        None => Err(HandshakeError::Closed),
    }
}

impl Inner {
    /// This end's Hello fields, with a fresh `nonce`.
    fn hello_fields(&self, nonce: [u8; NONCE_LEN]) -> HelloFields {
        HelloFields {
            cluster: self.cfg.cluster,
            node: self.cfg.me.0,
            boot: self.cfg.boot,
            nonce,
        }
    }

    fn hello(&self, fields: &HelloFields, proof: [u8; PROOF_LEN]) -> Frame {
        Frame::Hello {
            cluster: fields.cluster,
            node: NodeId(fields.node),
            boot: fields.boot,
            nonce: fields.nonce,
            proof,
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[derive(Debug, thiserror::Error)]
enum HandshakeError {
    #[error("I/O: {0}")]
    Io(#[from] io::Error),
    #[error("bad frame: {0}")]
    Decode(DecodeError),
    #[error("connection closed during the Hello exchange")]
    Closed,
    #[error("first frame is not a Hello")]
    NoHello,
    #[error("Hello from another cluster ({0})")]
    WrongCluster(String),
    #[error("Hello from node {0}, which is this node")]
    SameNode(u32),
    #[error("Hello from node {got}, expected node {expected}")]
    WrongNode { expected: u32, got: u32 },
    #[error("the {0} end failed authentication: its cluster secret differs (check --cluster-secret-file on both nodes)")]
    AuthFailed(&'static str),
    #[error("second frame is not an Auth")]
    NoAuth,
}

impl From<ReadError> for HandshakeError {
    fn from(err: ReadError) -> Self {
        match err {
            ReadError::Io(e) => HandshakeError::Io(e),
            ReadError::Decode(e) => HandshakeError::Decode(e),
            ReadError::Truncated => HandshakeError::Closed,
        }
    }
}

// ----------------------------------------------------------------- outbound

/// The writer of one destination: waits for frames, dials, writes batches.
fn writer_loop(inner: &Inner, dest: &Dest) {
    let mut conn: Option<(TcpStream, u64)> = None;
    let mut backoff = BACKOFF_MIN;
    let mut failures = 0u32;
    let mut heads = Vec::new();
    loop {
        let (addr, generation) = {
            let mut st = dest.state.lock();
            loop {
                if st.stop {
                    let lost = st.queue.len() as u64;
                    st.dropped += lost;
                    bump(&inner.c.frames_dropped, lost);
                    st.queue.clear();
                    st.queued_bytes = 0;
                    st.conn = None;
                    st.connected = false;
                    return;
                }
                if !st.queue.is_empty() && !st.busy {
                    break;
                }
                dest.wake.wait(&mut st);
            }
            if matches!(&conn, Some((_, g)) if *g != st.generation) {
                conn = None;
                st.conn = None;
                st.connected = false;
                backoff = BACKOFF_MIN;
            }
            (st.addr, st.generation)
        };

        // The acceptor never sends after its Hello: a readable socket means
        // the peer closed it (e.g. restarted). Noticing that before writing
        // saves the batch the first write into a dead socket would lose.
        if matches!(&conn, Some((s, _)) if peer_closed(s)) {
            tracing::debug!(peer = dest.node.0, %addr, "peer closed the connection");
            conn = None;
            disconnected(dest);
        }

        let Some((stream, _)) = conn.as_mut() else {
            match dial(inner, dest, addr, generation) {
                Ok(stream) => {
                    // A tail belongs to the connection its frame began on.
                    {
                        let mut st = dest.state.lock();
                        let before = st.queue.len();
                        st.queue.retain(|q| !matches!(q.item, Item::Tail(_)));
                        let lost = (before - st.queue.len()) as u64;
                        st.dropped += lost;
                        bump(&inner.c.frames_dropped, lost);
                        st.queued_bytes = st.queue.iter().map(|q| q.len).sum();
                    }
                    bump(&inner.c.connects, 1);
                    failures = 0;
                    backoff = BACKOFF_MIN;
                    conn = Some((stream, generation));
                }
                Err(err) => {
                    failures += 1;
                    if failures == 1 {
                        tracing::warn!(peer = dest.node.0, %addr, error = %err, "cannot connect to peer; retrying");
                    } else {
                        tracing::debug!(peer = dest.node.0, %addr, error = %err, failures, "cannot connect to peer");
                    }
                    if matches!(
                        err,
                        HandshakeError::Decode(_)
                            | HandshakeError::WrongCluster(_)
                            | HandshakeError::WrongNode { .. }
                            | HandshakeError::NoHello
                    ) {
                        bump(&inner.c.protocol_errors, 1);
                    }
                    disconnected(dest);
                    // Sleep out the backoff: new frames do not shorten it,
                    // only an address change or shutdown.
                    let deadline = Instant::now() + backoff;
                    let mut st = dest.state.lock();
                    while !st.stop
                        && st.generation == generation
                        && !dest.wake.wait_until(&mut st, deadline).timed_out()
                    {
                    }
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
            }
            continue;
        };

        let batch: Vec<Queued> = {
            let mut st = dest.state.lock();
            if st.stop || st.generation != generation || st.busy {
                continue;
            }
            st.queued_bytes = 0;
            st.busy = true;
            st.queue.drain(..).collect()
        };
        let bytes: usize = batch.iter().map(|q| q.len).sum();
        let written = write_batch(stream, &batch, &mut heads);
        dest.state.lock().busy = false;
        match written {
            Ok(()) => {
                bump(&inner.c.frames_sent, batch.len() as u64);
                bump(&inner.c.bytes_sent, bytes as u64);
            }
            Err(err) => {
                let lost = batch.len() as u64;
                bump(&inner.c.frames_dropped, lost);
                dest.state.lock().dropped += lost;
                if !inner.closing() {
                    tracing::warn!(peer = dest.node.0, %addr, error = %err, lost, "peer connection broke; frames lost");
                }
                conn = None;
                disconnected(dest);
            }
        }
    }
}

fn disconnected(dest: &Dest) {
    let mut st = dest.state.lock();
    st.conn = None;
    st.connected = false;
}

/// Whether the peer closed (or broke) an outbound connection, without
/// blocking.
fn peer_closed(stream: &TcpStream) -> bool {
    if stream.set_nonblocking(true).is_err() {
        return true;
    }
    let closed = match stream.peek(&mut [0u8; 1]) {
        // End of stream, or bytes the acceptor must not send.
        Ok(_) => true,
        Err(e) => e.kind() != io::ErrorKind::WouldBlock,
    };
    stream.set_nonblocking(false).is_err() || closed
}

/// Connects to `addr` and exchanges Hellos; the socket is registered in the
/// destination's state so that shutdown or an address change can break it.
fn dial(
    inner: &Inner,
    dest: &Dest,
    addr: SocketAddr,
    generation: u64,
) -> Result<TcpStream, HandshakeError> {
    let timeout = inner.cfg.connect_timeout.max(Duration::from_millis(1));
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    {
        let mut st = dest.state.lock();
        if st.stop || st.generation != generation {
            return Err(HandshakeError::Closed);
        }
        st.conn = Some(Arc::new(stream.try_clone()?));
    }
    let me = inner.hello_fields(secret::nonce());
    let mut out = Vec::new();
    // The dialer's Hello carries no proof: it cannot make one before it
    // has the acceptor's nonce.
    wire::encode(&inner.hello(&me, [0; PROOF_LEN]), &mut out)
        .map_err(|_| HandshakeError::NoHello)?;
    stream.write_all(&out)?;
    let (acceptor, proof) = read_hello(inner, &mut stream, &mut FrameReader::new())?;
    let (node, boot) = (NodeId(acceptor.node), acceptor.boot);
    if node != dest.node {
        return Err(HandshakeError::WrongNode {
            expected: dest.node.0,
            got: node.0,
        });
    }
    if !inner
        .cfg
        .secret
        .verify(Role::Acceptor, &me, &acceptor, &proof)
    {
        return Err(HandshakeError::AuthFailed("accepting"));
    }
    out.clear();
    let auth = Frame::Auth {
        proof: inner.cfg.secret.proof(Role::Dialer, &me, &acceptor),
    };
    wire::encode(&auth, &mut out).map_err(|_| HandshakeError::NoAuth)?;
    stream.write_all(&out)?;
    stream.set_read_timeout(None)?;
    stream.set_write_timeout(None)?;
    dest.state.lock().connected = true;
    tracing::info!(peer = node.0, %addr, boot, "connected to peer");
    Ok(stream)
}

/// Writes `batch` with as few `writev`s as the kernel allows: headers and
/// small fields encoded into `heads`, write data straight from the frames.
/// Appends `frame`'s header and fields to `heads`; returns their range
/// there and the payload to send after them (straight from the message).
/// None if it does not encode (`send` admits only frames that do).
fn encode_frame<'f>(frame: &'f Frame, heads: &mut Vec<u8>) -> Option<(Range<usize>, &'f [u8])> {
    let start = heads.len();
    let data = wire::encode_split(frame, heads).ok()?;
    Some((start..heads.len(), data))
}

fn write_batch(stream: &mut TcpStream, batch: &[Queued], heads: &mut Vec<u8>) -> io::Result<()> {
    enum Part<'a> {
        Head(Range<usize>),
        Data(&'a [u8]),
    }
    heads.clear();
    let mut parts: Vec<Part<'_>> = Vec::with_capacity(batch.len() * 2);
    for q in batch {
        let frame = match &q.item {
            Item::Frame(frame) => frame,
            Item::Tail(tail) => {
                parts.push(Part::Data(tail));
                continue;
            }
        };
        let Some((head, data)) = encode_frame(frame, heads) else {
            continue;
        };
        match parts.last_mut() {
            Some(Part::Head(r)) if r.end == head.start => r.end = head.end,
            _ => parts.push(Part::Head(head)),
        }
        if !data.is_empty() {
            parts.push(Part::Data(data));
        }
    }
    let mut slices: Vec<IoSlice<'_>> = parts
        .iter()
        .map(|p| match p {
            Part::Head(r) => IoSlice::new(&heads[r.clone()]),
            Part::Data(d) => IoSlice::new(d),
        })
        .collect();
    let mut bufs = &mut slices[..];
    while !bufs.is_empty() {
        match stream.write_vectored(bufs) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// What a fast-path send put on the wire.
struct Sent {
    /// Frames that went out whole (a prefix of the batch).
    whole: usize,
    /// Bytes written.
    bytes: usize,
    /// The unsent part of the frame after those, if it went out in part.
    tail: Option<Vec<u8>>,
}

/// Frames per `sendmsg`: two iovecs each, well under IOV_MAX (1024).
const FRAMES_PER_SENDMSG: usize = 256;

/// Writes as much of `frames` as the socket takes without blocking, in
/// `sendmsg` calls of up to [`FRAMES_PER_SENDMSG`] frames. An error means
/// nothing went out; an error after whole chunks went out returns those
/// (the writer meets the error again with the rest).
fn send_now(sock: &TcpStream, frames: &[(Frame, usize)]) -> io::Result<Sent> {
    let mut out = Sent {
        whole: 0,
        bytes: 0,
        tail: None,
    };
    let mut heads = Vec::new();
    for chunk in frames.chunks(FRAMES_PER_SENDMSG) {
        heads.clear();
        let mut parts = Vec::with_capacity(chunk.len());
        for (frame, _) in chunk {
            let part = encode_frame(frame, &mut heads).ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidData, "a frame does not encode")
            })?;
            parts.push(part);
        }
        let slices: Vec<IoSlice<'_>> = parts
            .iter()
            .flat_map(|(head, data)| [IoSlice::new(&heads[head.clone()]), IoSlice::new(data)])
            .filter(|s| !s.is_empty())
            .collect();
        let total: usize = slices.iter().map(|s| s.len()).sum();
        let sent = match send_dontwait(sock, &slices) {
            Ok(n) => n,
            // Earlier chunks went out: report them, the rest waits.
            Err(_) if out.whole > 0 => return Ok(out),
            Err(e) => return Err(e),
        };
        out.bytes += sent;
        if sent >= total {
            out.whole += chunk.len();
            continue;
        }
        // Find the frame the socket stopped in.
        let mut left = sent;
        for (head, data) in &parts {
            let head = &heads[head.clone()];
            let len = head.len() + data.len();
            if left >= len {
                left -= len;
                out.whole += 1;
                continue;
            }
            if left > 0 {
                let mut tail = Vec::with_capacity(len - left);
                if left < head.len() {
                    tail.extend_from_slice(&head[left..]);
                    tail.extend_from_slice(data);
                } else {
                    tail.extend_from_slice(&data[left - head.len()..]);
                }
                out.tail = Some(tail);
            }
            break;
        }
        return Ok(out);
    }
    Ok(out)
}

/// One `sendmsg(MSG_DONTWAIT)` of `slices`: the bytes the socket took (0
/// when it took none).
fn send_dontwait(sock: &TcpStream, slices: &[IoSlice<'_>]) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    loop {
        // SAFETY: `IoSlice` is ABI-compatible with `iovec` on Unix; the
        // slices and what they point at outlive the call; the fd is owned
        // by `sock`.
        let n = unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = slices.as_ptr() as *mut libc::iovec;
            msg.msg_iovlen = slices.len() as _;
            libc::sendmsg(
                sock.as_raw_fd(),
                &msg,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        let err = io::Error::last_os_error();
        match err.kind() {
            io::ErrorKind::Interrupted => {}
            io::ErrorKind::WouldBlock => return Ok(0),
            _ => return Err(err),
        }
    }
}
