//! The replica driver: runs one volume's replication state machine
//! ([`basalt_replication::Node`]) on this node's store, the peer transport
//! and the metadata service.
//!
//! The state machine sits behind a mutex and is driven by whichever thread
//! has something for it: a frontend lane with client requests, a peer
//! connection's reader with replication messages, one of the node's ticker
//! threads (`crate::ticker`) with the clock. That thread feeds its events in, carries out the actions
//! outside the lock (sends go to the [`ReplicaEnv`]; disk operations run as
//! one batch on the local store: one device submission for reads and writes,
//! then zeroing, then flushes) and feeds the completions back, until no disk
//! operation is left. No request changes threads on its way to the disk, so
//! a single-replica write costs what a local write costs, and lanes and
//! readers run their disk I/O in parallel. The state machine's disk queue
//! only issues operations that may run concurrently (overlapping ones and
//! flushes wait for what they must follow), so parallel executors are safe.
//!
//! Background disk operations (resync reads) are the exception: the thread
//! that received them leaves them to the ticker, so a region copy
//! never stalls the client requests or replication messages of the thread
//! that happened to bring its turn.
//!
//! Invariants:
//! - every disk operation the state machine issued is executed by the
//!   thread whose [`Replica::deliver`] received it, or, if it is background
//!   work, by the ticker; its completion is fed back, under its id, before
//!   that thread's call returns;
//! - the state lock is never held across a disk operation, a send or a
//!   callback into the node (so callbacks may deliver again);
//! - client replies go to the origin that sent the request, under that
//!   origin's id; the state machine only sees the driver's own ids;
//! - once stopped, a replica answers every pending and every new client
//!   request with NotPrimary (the origin retries elsewhere) and issues
//!   nothing more;
//! - a layer operation (snapshot, layer deletion, rebase, changed regions,
//!   a read of a snapshot layer) is carried out by the node around it on
//!   its store ([`ReplicaEnv::layer_op`]); the state machine issues all but
//!   the layer reads alone, so they never share a batch with data I/O;
//! - a replica whose disk keeps failing stops (its heartbeats stop with it,
//!   so the coordinator marks it Faulty or replaces it as primary) rather
//!   than retrying forever; that includes a local store that cannot grow
//!   to the volume's new size (the state machine's `Grow`, which it issues
//!   alone, before anything beyond the old end).

use crate::ticker::{Tick, TickSlot};
use basalt_replication::{
    Action, ClientReply, ClientReq, Config, DiskOp, DiskResult, Endpoint, Input, LayerId,
    Membership, Msg, Node, NodeId, Payload, RoleKind, SavedLogs, VolumeId,
};
use basalt_store::{DataOp, IoError, LocalVolume};
use parking_lot::{Mutex, RwLock};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// Where a client request came from, to route its reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Origin {
    /// A frontend on this node.
    Local,
    /// A frontend on another node that forwarded the request.
    Node(NodeId),
}

pub(crate) enum Event {
    Peer {
        from: NodeId,
        msg: Msg,
    },
    /// A heartbeat answer or a membership record (MetaReply).
    Control(Msg),
    Client {
        id: u64,
        req: ClientReq,
        origin: Origin,
    },
    /// A disk operation carried out on a thread of its own completed
    /// ([`ReplicaEnv::layer_op_async`]); `instance` names the driver that
    /// issued it (another one for the same volume ignores it).
    Disk {
        instance: u64,
        id: u64,
        result: DiskResult,
    },
}

/// What the driver needs from the node around it. Called without the
/// replica's lock held.
pub(crate) trait ReplicaEnv: Send + Sync + 'static {
    /// Sends `msgs` to node `to`, in order.
    fn send_peer(&self, to: NodeId, vol: VolumeId, msgs: Vec<Msg>);
    /// Heartbeats (to the coordinator), MetaGet and MetaCas (to etcd).
    fn send_control(&self, vol: VolumeId, msg: Msg);
    fn client_reply(&self, vol: VolumeId, origin: Origin, id: u64, reply: ClientReply);
    /// Milliseconds on the node's monotonic clock.
    fn now_ms(&self) -> u64;
    /// Grows the local store's copy of `vol` to at least `bytes` (durable
    /// on return; nothing if it is that large already).
    fn grow_local(&self, vol: VolumeId, bytes: u64) -> Result<(), String>;
    /// Makes `logs` the crash-safe copy of this node's logs of `vol`
    /// (durable on return).
    fn save_crash_logs(&self, vol: VolumeId, logs: &SavedLogs) -> Result<(), String>;
    /// Carries out a layer operation of `vol`'s state machine on the local
    /// store (`DiskOp::Snapshot`, `DeleteLayer`, `Rebase`, `Changed`,
    /// `ReadLayer`, `Flatten`), with the data it completes with.
    fn layer_op(&self, vol: VolumeId, op: &DiskOp) -> Result<Option<Vec<u8>>, String>;
    /// Carries out layer operation `op` (`id`) of `vol`'s driver `instance`
    /// on a thread of its own, and delivers its completion to the replica
    /// as [`Event::Disk`]: for one that may take long (a deletion merges a
    /// layer's blocks into the next, a flatten copies a clone's source's),
    /// which must hold up neither a client's
    /// thread nor the ticker (its replicas' heartbeats and leases).
    fn layer_op_async(&self, vol: VolumeId, instance: u64, id: u64, op: DiskOp);
}

/// Driver instances: each [`Replica`] takes the next.
static INSTANCES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Which replica a driver runs: the state machine's identity and config,
/// and the volume's first record when it was created during this boot.
pub(crate) struct ReplicaSpec {
    pub vol: VolumeId,
    pub me: NodeId,
    pub boot: u64,
    pub cfg: Config,
    pub initial: Option<Membership>,
    /// The logs this replica saved at the last clean stop, or else its
    /// crash-safe copy.
    pub saved: Option<SavedLogs>,
    /// The snapshot layers of the volume the local store holds, oldest
    /// first.
    pub layers: Vec<LayerId>,
    /// The snapshot of another volume its oldest layer reads through (a
    /// clone's source, until flattened).
    pub base: Option<LayerId>,
}

/// Consecutive failed disk batches after which the replica stops.
const MAX_DISK_FAILURES: u32 = 50;

/// One volume's replica on this node; see the module docs.
pub(crate) struct Replica<E: ReplicaEnv> {
    vol: VolumeId,
    /// This driver among all (`Event::Disk` names it).
    instance: u64,
    local: LocalVolume,
    env: Arc<E>,
    block_len: u64,
    tick_ms: u64,
    state: Mutex<State>,
    /// This replica's place in the node's [`Ticker`](crate::ticker::Ticker): wakes it early
    /// (stop, background work). Set once, right after registration.
    ticker: OnceLock<TickSlot>,
    /// Read-held by every `deliver` in progress (see `stop`).
    running: RwLock<()>,
}

struct State {
    node: Node,
    /// The state machine's client ids → origin and the origin's id.
    clients: HashMap<u64, (Origin, u64)>,
    next_client: u64,
    /// Role as last logged (a change is logged once).
    last_role: RoleKind,
    next_tick: u64,
    /// Consecutive failed disk batches.
    disk_failures: u32,
    stopped: bool,
    /// Events posted by callbacks of this replica's own actions, taken in
    /// by the next round of whichever thread drives.
    mailbox: Vec<Event>,
    /// Background disk operations (resync reads) left by a client's or a
    /// peer's thread for the ticker, so that a region copy never delays
    /// the requests of the thread that happened to bring its turn.
    background: Vec<(u64, DiskOp)>,
}

/// What one round under the lock decided.
#[derive(Default)]
struct Round {
    sends: Vec<(Endpoint, Msg)>,
    replies: Vec<(Origin, u64, ClientReply)>,
    disk: Vec<(u64, DiskOp)>,
}

impl State {
    /// The state machine's input for `ev`; None for a completion meant for
    /// another driver instance.
    fn input(&mut self, ev: Event, instance: u64) -> Option<Input> {
        Some(match ev {
            Event::Disk {
                instance: of,
                id,
                result,
            } => {
                if of != instance {
                    return None;
                }
                Input::Disk { id, result }
            }
            Event::Peer { from, msg } => Input::Msg {
                from: Endpoint::Node(from),
                msg,
            },
            Event::Control(msg) => Input::Msg {
                from: Endpoint::Control,
                msg,
            },
            Event::Client { id, req, origin } => {
                let own = self.next_client;
                self.next_client += 1;
                self.clients.insert(own, (origin, id));
                Input::Msg {
                    from: Endpoint::Client,
                    msg: Msg::ClientReq { id: own, req },
                }
            }
        })
    }

    /// Sorts actions into sends, client replies (mapped back to their
    /// origin) and disk operations.
    fn route(&mut self, actions: Vec<Action>, round: &mut Round) {
        for a in actions {
            match a {
                Action::Disk { id, op } => round.disk.push((id, op)),
                Action::Send {
                    to: Endpoint::Client,
                    msg: Msg::ClientReply { id, reply },
                } => {
                    if let Some((origin, their)) = self.clients.remove(&id) {
                        round.replies.push((origin, their, reply));
                    }
                }
                Action::Send {
                    to: Endpoint::Client,
                    ..
                } => {}
                Action::Send { to, msg } => round.sends.push((to, msg)),
            }
        }
    }

    /// Marks the replica stopped; returns the replies owed to every pending
    /// client request.
    fn stop(&mut self) -> Vec<(Origin, u64, ClientReply)> {
        self.stopped = true;
        self.mailbox.clear();
        self.clients
            .drain()
            .map(|(_, (origin, id))| (origin, id, ClientReply::NotPrimary))
            .collect()
    }
}

impl<E: ReplicaEnv> Replica<E> {
    pub(crate) fn new(spec: ReplicaSpec, local: LocalVolume, env: Arc<E>, tick: Duration) -> Self {
        let now = env.now_ms();
        let ReplicaSpec {
            vol,
            me,
            boot,
            cfg,
            initial,
            saved,
            layers,
            base,
        } = spec;
        let block_len = cfg.block_len;
        let mut node = Node::new(me, boot, vol, cfg, initial, now)
            .with_layers(layers)
            .with_base(base);
        if let Some(saved) = &saved {
            node.restore_logs(saved);
        }
        let role = node.role();
        Replica {
            vol,
            instance: INSTANCES.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            local,
            env,
            block_len,
            tick_ms: tick.as_millis().max(1) as u64,
            state: Mutex::new(State {
                node,
                clients: HashMap::new(),
                next_client: 1,
                last_role: role,
                next_tick: now,
                disk_failures: 0,
                stopped: false,
                mailbox: Vec::new(),
                background: Vec::new(),
            }),
            ticker: OnceLock::new(),
            running: RwLock::new(()),
        }
    }

    /// Queues `ev` for the next round without driving (for callbacks made
    /// while this replica's actions are carried out).
    pub(crate) fn post(&self, ev: Event) {
        let mut st = self.state.lock();
        if !st.stopped {
            st.mailbox.push(ev);
        }
    }

    /// Feeds `events` to the state machine and carries out everything that
    /// follows on the calling thread, disk operations included, except
    /// background ones (resync reads), which the ticker runs.
    pub(crate) fn deliver(&self, events: Vec<Event>) {
        self.drive(events, false);
    }

    /// [`Replica::deliver`] on the calling thread; `ticker`: it is the
    /// replica's ticker, which runs background disk operations too.
    fn drive(&self, events: Vec<Event>, ticker: bool) {
        // Held while this thread may carry out disk operations, so that
        // `stop` knows when none is left in progress. Recursive: a reply
        // carried out here may deliver to this replica again.
        let _running = self.running.read_recursive();
        let mut events = events;
        let mut completions: Vec<(u64, DiskResult)> = Vec::new();
        loop {
            let mut round = Round::default();
            {
                let mut st = self.state.lock();
                if st.stopped {
                    drop(st);
                    for ev in events {
                        if let Event::Client { id, origin, .. } = ev {
                            self.env
                                .client_reply(self.vol, origin, id, ClientReply::NotPrimary);
                        }
                    }
                    return;
                }
                let now = self.env.now_ms();
                let mut actions = Vec::new();
                for (id, result) in completions.drain(..) {
                    actions.extend(st.node.handle(now, Input::Disk { id, result }));
                }
                let mailbox = std::mem::take(&mut st.mailbox);
                for ev in events.drain(..).chain(mailbox) {
                    if let Some(input) = st.input(ev, self.instance) {
                        actions.extend(st.node.handle(now, input));
                    }
                }
                if now >= st.next_tick {
                    st.next_tick = now + self.tick_ms;
                    actions.extend(st.node.handle(now, Input::Tick));
                }
                st.route(actions, &mut round);
                if ticker {
                    round.disk.append(&mut st.background);
                } else if round.disk.iter().any(|(id, _)| st.node.is_background(*id)) {
                    let (bg, fg): (Vec<_>, Vec<_>) = std::mem::take(&mut round.disk)
                        .into_iter()
                        .partition(|(id, _)| st.node.is_background(*id));
                    round.disk = fg;
                    st.background.extend(bg);
                    self.wake_ticker();
                }
                for (replica, decided) in st.node.take_failover_resyncs() {
                    let volume = uuid::Uuid::from_u128(self.vol.0);
                    match decided {
                        Some((copy, total)) => tracing::info!(%volume, replica = replica.0,
                            "failover resync narrowed to {copy} of {total} regions"),
                        None => tracing::info!(%volume, replica = replica.0,
                            "failover resync copies every region: the replica has no usable log (it restarted or missed an epoch)"),
                    }
                }
                let role = st.node.role();
                if st.last_role != role {
                    tracing::info!(volume = %uuid::Uuid::from_u128(self.vol.0), ?role, "replica role changed");
                    st.last_role = role;
                }
            }
            self.carry_out(round.sends, round.replies);
            if round.disk.is_empty() {
                if self.state.lock().mailbox.is_empty() {
                    return;
                }
                continue;
            }
            completions = self.execute(round.disk);
            let failed = completions
                .iter()
                .any(|(_, r)| matches!(r, DiskResult::Error));
            let mut st = self.state.lock();
            if !failed {
                st.disk_failures = 0;
                continue;
            }
            st.disk_failures += 1;
            if st.disk_failures >= MAX_DISK_FAILURES {
                tracing::error!(volume = %uuid::Uuid::from_u128(self.vol.0),
                    "local disk keeps failing; this replica stops (the coordinator will mark it faulty)");
                let owed = st.stop();
                drop(st);
                self.wake_ticker();
                self.carry_out(Vec::new(), owed);
                return;
            }
            drop(st);
            // Transient errors are retried by the state machine; a short
            // pause keeps a broken disk from spinning.
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn carry_out(&self, sends: Vec<(Endpoint, Msg)>, replies: Vec<(Origin, u64, ClientReply)>) {
        // One batch per peer (a round's replicated writes, or their acks,
        // leave together); per-peer order is kept.
        let mut by_peer: Vec<(NodeId, Vec<Msg>)> = Vec::new();
        for (to, msg) in sends {
            match to {
                Endpoint::Node(n) => match by_peer.iter_mut().find(|(p, _)| *p == n) {
                    Some((_, msgs)) => msgs.push(msg),
                    None => by_peer.push((n, vec![msg])),
                },
                Endpoint::Control => self.env.send_control(self.vol, msg),
                Endpoint::Client => {}
            }
        }
        for (n, msgs) in by_peer {
            self.env.send_peer(n, self.vol, msgs);
        }
        for (origin, id, reply) in replies {
            self.env.client_reply(self.vol, origin, id, reply);
        }
    }

    /// Joins the node's ticker, which drives this replica's clock and its
    /// background disk work from then on (once; later calls are ignored).
    pub(crate) fn attach_ticker(&self, slot: TickSlot) {
        let _ = self.ticker.set(slot);
    }

    fn wake_ticker(&self) {
        if let Some(slot) = self.ticker.get() {
            slot.wake();
        }
    }

    /// Stops the replica: pending client requests are answered NotPrimary
    /// and it leaves the ticker.
    pub(crate) fn stop(&self) {
        let owed = self.state.lock().stop();
        self.wake_ticker();
        self.carry_out(Vec::new(), owed);
    }

    /// Stops the replica and waits (up to `bound`) until no thread carries
    /// out any of its work; whether that happened in time. Not to be
    /// called from a thread delivering to this replica.
    pub(crate) fn stop_and_wait(&self, bound: Duration) -> bool {
        self.stop();
        self.running.try_write_for(bound).is_some()
    }

    /// Stops the replica for a clean restart of this process: returns the
    /// logs to save for the next start once every disk batch in progress
    /// has finished and the local volume is flushed; None if that did not
    /// happen in time (the next start then goes without, which is safe).
    /// Not to be called from a thread delivering to this replica.
    pub(crate) fn stop_for_restart(&self) -> Option<SavedLogs> {
        if !self.stop_and_wait(Duration::from_secs(10)) {
            return None;
        }
        if let Err(e) = self.local.flush() {
            tracing::warn!(volume = %uuid::Uuid::from_u128(self.vol.0), error = %e,
                "cannot flush the replica at shutdown; its logs are not saved");
            return None;
        }
        Some(self.state.lock().node.save_logs())
    }

    /// Whether this replica, as primary, is copying regions to a replica.
    pub(crate) fn copying(&self) -> bool {
        self.state.lock().node.copying()
    }

    /// Sets this volume's share of the node's resync rate (bytes/s).
    pub(crate) fn set_resync_rate(&self, rate: u64) {
        let now = self.env.now_ms();
        self.state.lock().node.set_resync_rate(now, rate);
    }

    /// Per replica that is not in sync (primary only): regions still to
    /// copy and regions in the volume.
    pub(crate) fn resync_progress(&self) -> BTreeMap<NodeId, (usize, usize)> {
        self.state.lock().node.resync_progress()
    }

    /// Executes one batch of disk operations on the local volume: reads and
    /// writes in one submission, then zeroing, then flushes.
    fn execute(&self, ops: Vec<(u64, DiskOp)>) -> Vec<(u64, DiskResult)> {
        let bl = self.block_len;
        let mut read_bufs: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut writes: Vec<(u64, u64, Payload, bool)> = Vec::new();
        let mut flushes = Vec::new();
        let mut zeroes = Vec::new();
        let mut grows = Vec::new();
        let mut saves = Vec::new();
        let mut layer_ops = Vec::new();
        for (id, op) in ops {
            match op {
                DiskOp::Read { lba, blocks } => {
                    read_bufs.push((id, vec![0u8; (blocks * bl) as usize]));
                    writes.push((id, lba * bl, Payload::new(), false));
                }
                DiskOp::Write { lba, data, fua } => writes.push((id, lba * bl, data, fua)),
                // Zeroing (resync copies of never-written regions, TRIM and
                // WRITE_ZEROES of clients, all-zero writes) frees or skips
                // extents instead of allocating them: replicas stay thin.
                DiskOp::WriteZeroes { lba, blocks, fua } => {
                    zeroes.push((id, lba * bl, blocks * bl, fua))
                }
                DiskOp::Flush => flushes.push(id),
                // Issued alone by the state machine's disk queue: nothing
                // else is in this batch.
                DiskOp::Grow { blocks } => grows.push((id, blocks * bl)),
                // No write issued with it depends on it (the disk queue
                // holds later writes until it completed): any order.
                DiskOp::SaveLogs { logs } => saves.push((id, logs)),
                op @ (DiskOp::Snapshot { .. }
                | DiskOp::DeleteLayer { .. }
                | DiskOp::Rebase { .. }
                | DiskOp::Changed { .. }
                | DiskOp::ReadLayer { .. }
                | DiskOp::Flatten { .. }
                | DiskOp::Compact { .. }) => layer_ops.push((id, op)),
            }
        }
        let mut results = Vec::new();
        {
            let mut bufs: HashMap<u64, &mut Vec<u8>> =
                read_bufs.iter_mut().map(|(id, b)| (*id, b)).collect();
            let mut data_ops = Vec::with_capacity(writes.len());
            let mut ids = Vec::with_capacity(writes.len());
            for (id, offset, data, fua) in &writes {
                match bufs.remove(id) {
                    Some(buf) => data_ops.push(DataOp::read(*offset, buf.as_mut_slice())),
                    None => data_ops.push(DataOp::write(*offset, data, *fua)),
                }
                ids.push(*id);
            }
            if !data_ops.is_empty() {
                self.local.submit(&mut data_ops);
            }
            for (id, op) in ids.iter().zip(data_ops.iter()) {
                let outcome = match &op.result {
                    Ok(()) => Outcome::Done,
                    // Not a transient error: retrying reads the same bytes.
                    // A primary's state machine reads them from another
                    // replica; a secondary's reports them to the primary
                    // (a compare), which rewrites them.
                    Err(e @ IoError::Corrupt { .. }) => {
                        tracing::warn!(volume = %uuid::Uuid::from_u128(self.vol.0), error = %e,
                            "local copy fails its checksum; reading it from another replica (primary) or having it rewritten from the primary's (secondary)");
                        Outcome::Corrupt
                    }
                    Err(IoError::NoSpace) => {
                        tracing::warn!(volume = %uuid::Uuid::from_u128(self.vol.0),
                            "the local store has no space for a write of this replica");
                        Outcome::NoSpace
                    }
                    Err(e) => {
                        tracing::warn!(volume = %uuid::Uuid::from_u128(self.vol.0), error = %e, "replica disk operation failed");
                        Outcome::Failed
                    }
                };
                results.push((*id, outcome));
            }
        }
        let mut out: Vec<(u64, DiskResult)> = Vec::with_capacity(results.len() + flushes.len());
        for (id, logs) in saves {
            let r = match self.env.save_crash_logs(self.vol, &logs) {
                Ok(()) => DiskResult::Done { data: None },
                Err(e) => {
                    tracing::warn!(volume = %uuid::Uuid::from_u128(self.vol.0), error = %e,
                        "cannot save the replica's crash-safe log copy");
                    DiskResult::Error
                }
            };
            out.push((id, r));
        }
        for (id, bytes) in grows {
            let r = match self.env.grow_local(self.vol, bytes) {
                Ok(()) => DiskResult::Done { data: None },
                Err(e) => {
                    tracing::error!(volume = %uuid::Uuid::from_u128(self.vol.0), bytes, error = %e,
                        "cannot grow the local replica to the volume's new size");
                    DiskResult::Error
                }
            };
            out.push((id, r));
        }
        for (id, op) in layer_ops {
            if matches!(
                op,
                DiskOp::DeleteLayer { .. } | DiskOp::Flatten { .. } | DiskOp::Compact { .. }
            ) {
                self.env.layer_op_async(self.vol, self.instance, id, op);
                continue;
            }
            let r = match self.env.layer_op(self.vol, &op) {
                Ok(data) => DiskResult::Done { data },
                // A layer's block that fails its checksum, or a layer
                // gone (deleted meanwhile): reading again gives the same,
                // so the reader learns it (a client's read is answered
                // Unreadable, a rebuild reads the region again later).
                Err(e) if matches!(op, DiskOp::ReadLayer { .. }) => {
                    tracing::warn!(volume = %uuid::Uuid::from_u128(self.vol.0), ?op, error = %e,
                        "snapshot layer read failed");
                    DiskResult::Corrupt
                }
                Err(e) => {
                    tracing::warn!(volume = %uuid::Uuid::from_u128(self.vol.0), ?op, error = %e,
                        "replica layer operation failed");
                    DiskResult::Error
                }
            };
            out.push((id, r));
        }
        let mut reads: HashMap<u64, Vec<u8>> = read_bufs.into_iter().collect();
        for (id, outcome) in results {
            out.push((
                id,
                match outcome {
                    Outcome::Done => DiskResult::Done {
                        data: reads.remove(&id),
                    },
                    Outcome::Corrupt => DiskResult::Corrupt,
                    Outcome::NoSpace => DiskResult::NoSpace,
                    Outcome::Failed => DiskResult::Error,
                },
            ));
        }
        for (id, offset, len, fua) in zeroes {
            let r = match self.local.write_zeroes(offset, len, true, fua) {
                Ok(()) => DiskResult::Done { data: None },
                // Zeroing blocks a snapshot layer still holds writes the
                // head, which may need space.
                Err(IoError::NoSpace) => DiskResult::NoSpace,
                Err(e) => {
                    tracing::warn!(volume = %uuid::Uuid::from_u128(self.vol.0), error = %e, "replica zeroing failed");
                    DiskResult::Error
                }
            };
            out.push((id, r));
        }
        for id in flushes {
            let r = match self.local.flush() {
                Ok(()) => DiskResult::Done { data: None },
                Err(e) => {
                    tracing::warn!(volume = %uuid::Uuid::from_u128(self.vol.0), error = %e, "replica flush failed");
                    DiskResult::Error
                }
            };
            out.push((id, r));
        }
        out
    }
}

/// How one data operation of a round ended.
enum Outcome {
    Done,
    /// A read whose data fails its checksum.
    Corrupt,
    /// A write the store has no space for: not retried (the state machine
    /// answers the client, or leaves the stream).
    NoSpace,
    /// Anything else: retried by the state machine.
    Failed,
}

/// The clock: the node's [`Ticker`](crate::ticker::Ticker) drives a round when the next tick is
/// due, running the background disk operations left for it too.
impl<E: ReplicaEnv> Tick for Replica<E> {
    fn tick(&self) -> Option<Duration> {
        self.drive(Vec::new(), true);
        let st = self.state.lock();
        if st.stopped {
            return None;
        }
        if !st.background.is_empty() {
            return Some(Duration::ZERO);
        }
        let wait = st.next_tick.saturating_sub(self.env.now_ms()).max(1);
        Some(Duration::from_millis(wait))
    }
}
