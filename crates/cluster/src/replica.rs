//! The replica driver: runs one volume's replication state machine
//! ([`basalt_replication::Node`]) on this node's store, the peer transport
//! and the metadata service.
//!
//! One thread per replica. It sleeps on its inbox (peer messages, control
//! answers, client requests) with a timeout at the next tick, feeds what
//! arrived to the state machine, and carries out the actions: sends go to
//! the [`ReplicaEnv`], disk operations are gathered and executed as one
//! batch on the local store (one device submission for reads and writes,
//! then flushes), and their completions are fed back before the thread
//! sleeps again.
//!
//! Invariants:
//! - every disk operation the state machine issued gets exactly one
//!   completion, under its id, before the driver sleeps (so the state
//!   machine's view of in-flight I/O is never stale across a wait);
//! - client replies go to the origin that sent the request, under that
//!   origin's id; the state machine only sees the driver's own ids;
//! - a replica whose disk keeps failing stops (its heartbeats stop with it,
//!   so the coordinator marks it Faulty or replaces it as primary) rather
//!   than retrying forever.

use basalt_replication::{
    Action, ClientReply, ClientReq, Config, DiskOp, DiskResult, Endpoint, Input, Membership, Msg,
    Node, NodeId, RoleKind, VolumeId,
};
use basalt_store::{DataOp, LocalVolume};
use std::collections::{BTreeMap, HashMap};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
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
    Stop,
}

/// What the driver needs from the node around it.
pub(crate) trait ReplicaEnv: Send + Sync + 'static {
    fn send_peer(&self, to: NodeId, vol: VolumeId, msg: Msg);
    /// Heartbeats (to the coordinator), MetaGet and MetaCas (to etcd).
    fn send_control(&self, vol: VolumeId, msg: Msg);
    fn client_reply(&self, vol: VolumeId, origin: Origin, id: u64, reply: ClientReply);
    /// Milliseconds on the node's monotonic clock.
    fn now_ms(&self) -> u64;
}

/// Which replica a driver runs: the state machine's identity and config,
/// and the volume's first record when it was created during this boot.
pub(crate) struct ReplicaSpec {
    pub vol: VolumeId,
    pub me: NodeId,
    pub boot: u64,
    pub cfg: Config,
    pub initial: Option<Membership>,
}

/// Consecutive failed disk batches after which the replica stops.
const MAX_DISK_FAILURES: u32 = 50;
/// Events taken from the inbox per state machine round.
const MAX_BATCH: usize = 256;

pub(crate) struct ReplicaDriver<E: ReplicaEnv> {
    pub vol: VolumeId,
    pub node: Node,
    pub local: LocalVolume,
    pub env: std::sync::Arc<E>,
    pub inbox: Receiver<Event>,
    pub tick: Duration,
    pub block_len: u64,
    /// The state machine's client ids → origin and the origin's id.
    pub clients: HashMap<u64, (Origin, u64)>,
    pub next_client: u64,
    /// Role as last logged (a change is logged once).
    pub last_role: RoleKind,
    /// Resync progress as last published (primary only): per replica,
    /// regions still to copy and regions in the volume.
    pub progress_out: std::sync::Arc<parking_lot::Mutex<BTreeMap<NodeId, (usize, usize)>>>,
}

impl<E: ReplicaEnv> ReplicaDriver<E> {
    pub(crate) fn new(
        spec: ReplicaSpec,
        local: LocalVolume,
        env: std::sync::Arc<E>,
        inbox: Receiver<Event>,
        tick: Duration,
    ) -> Self {
        let now = env.now_ms();
        let ReplicaSpec {
            vol,
            me,
            boot,
            cfg,
            initial,
        } = spec;
        let block_len = cfg.block_len;
        let node = Node::new(me, boot, vol, cfg, initial, now);
        let role = node.role();
        ReplicaDriver {
            vol,
            node,
            local,
            env,
            inbox,
            tick,
            block_len,
            clients: HashMap::new(),
            next_client: 1,
            last_role: role,
            progress_out: Default::default(),
        }
    }

    /// Runs until [`Event::Stop`], the inbox closing, or a failed disk.
    pub(crate) fn run(mut self) {
        let tick_ms = self.tick.as_millis().max(1) as u64;
        let mut next_tick = self.env.now_ms();
        let mut disk_failures = 0u32;
        let mut batch = Vec::with_capacity(MAX_BATCH);
        loop {
            let now = self.env.now_ms();
            let wait = Duration::from_millis(next_tick.saturating_sub(now));
            match self.inbox.recv_timeout(wait) {
                Ok(ev) => batch.push(ev),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
            while batch.len() < MAX_BATCH {
                match self.inbox.try_recv() {
                    Ok(ev) => batch.push(ev),
                    Err(_) => break,
                }
            }
            let mut actions = Vec::new();
            for ev in batch.drain(..) {
                let now = self.env.now_ms();
                let input = match ev {
                    Event::Stop => {
                        self.fail_clients();
                        return;
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
                };
                actions.extend(self.node.handle(now, input));
            }
            let now = self.env.now_ms();
            if now >= next_tick {
                next_tick = now + tick_ms;
                actions.extend(self.node.handle(now, Input::Tick));
            }
            // Carry out actions until no disk operation is left.
            loop {
                let disk = self.dispatch(std::mem::take(&mut actions));
                if disk.is_empty() {
                    break;
                }
                let results = self.execute(disk);
                let failed = results.iter().any(|(_, r)| matches!(r, DiskResult::Error));
                if failed {
                    disk_failures += 1;
                    if disk_failures >= MAX_DISK_FAILURES {
                        tracing::error!(volume = %uuid::Uuid::from_u128(self.vol.0),
                            "local disk keeps failing; this replica stops (the coordinator will mark it faulty)");
                        self.fail_clients();
                        return;
                    }
                    // Transient errors are retried by the state machine;
                    // a short pause keeps a broken disk from spinning.
                    std::thread::sleep(Duration::from_millis(10));
                } else {
                    disk_failures = 0;
                }
                let now = self.env.now_ms();
                for (id, result) in results {
                    actions.extend(self.node.handle(now, Input::Disk { id, result }));
                }
            }
            *self.progress_out.lock() = self.node.resync_progress();
            let role = self.node.role();
            if self.last_role != role {
                tracing::info!(volume = %uuid::Uuid::from_u128(self.vol.0), ?role, "replica role changed");
                self.last_role = role;
            }
        }
    }

    /// Answers every client request still pending with NotPrimary (the
    /// origin retries elsewhere).
    fn fail_clients(&mut self) {
        for (_, (origin, id)) in self.clients.drain() {
            self.env
                .client_reply(self.vol, origin, id, ClientReply::NotPrimary);
        }
    }

    /// Sends what is to be sent; returns the disk operations.
    fn dispatch(&mut self, actions: Vec<Action>) -> Vec<(u64, DiskOp)> {
        let mut disk = Vec::new();
        for a in actions {
            match a {
                Action::Disk { id, op } => disk.push((id, op)),
                Action::Send { to, msg } => match to {
                    Endpoint::Node(n) => self.env.send_peer(n, self.vol, msg),
                    Endpoint::Control => self.env.send_control(self.vol, msg),
                    Endpoint::Client => {
                        if let Msg::ClientReply { id, reply } = msg {
                            if let Some((origin, their)) = self.clients.remove(&id) {
                                self.env.client_reply(self.vol, origin, their, reply);
                            }
                        }
                    }
                },
            }
        }
        disk
    }

    /// Executes one batch of disk operations on the local volume: reads and
    /// writes in one submission, then all-zero writes, then flushes.
    fn execute(&self, ops: Vec<(u64, DiskOp)>) -> Vec<(u64, DiskResult)> {
        let bl = self.block_len;
        let mut read_bufs: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut writes: Vec<(u64, u64, Vec<u8>, bool)> = Vec::new();
        let mut flushes = Vec::new();
        let mut zeroes = Vec::new();
        for (id, op) in ops {
            match op {
                DiskOp::Read { lba, blocks } => {
                    read_bufs.push((id, vec![0u8; (blocks * bl) as usize]));
                    writes.push((id, lba * bl, Vec::new(), false));
                }
                // All-zero writes (resync copies of never-written regions,
                // TRIM and WRITE_ZEROES of clients) free or skip extents
                // instead of allocating them: replicas stay thin.
                DiskOp::Write { lba, data, fua } if data.iter().all(|b| *b == 0) => {
                    zeroes.push((id, lba * bl, data.len() as u64, fua))
                }
                DiskOp::Write { lba, data, fua } => writes.push((id, lba * bl, data, fua)),
                DiskOp::WriteZeroes { lba, blocks, fua } => {
                    zeroes.push((id, lba * bl, blocks * bl, fua))
                }
                DiskOp::Flush => flushes.push(id),
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
                if let Err(e) = &op.result {
                    tracing::warn!(volume = %uuid::Uuid::from_u128(self.vol.0), error = %e, "replica disk operation failed");
                }
                results.push((*id, op.result.is_ok()));
            }
        }
        let mut out: Vec<(u64, DiskResult)> = Vec::with_capacity(results.len() + flushes.len());
        let mut reads: HashMap<u64, Vec<u8>> = read_bufs.into_iter().collect();
        for (id, ok) in results {
            out.push((
                id,
                if ok {
                    DiskResult::Done {
                        data: reads.remove(&id),
                    }
                } else {
                    DiskResult::Error
                },
            ));
        }
        for (id, offset, len, fua) in zeroes {
            let r = match self.local.write_zeroes(offset, len, true, fua) {
                Ok(()) => DiskResult::Done { data: None },
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
