//! Client I/O of a replicated volume: every request goes to the volume's
//! primary (this node's replica, or another node's over the peer
//! transport), and is sent again to the then-current primary when answered
//! NotPrimary or not answered in time, until the request deadline; and the
//! peer messages that arrive for this node's replicas.
//!
//! Invariants: a request is answered to its client once (the first reply
//! wins; a batch with a `WriteAck` is acknowledged once, by its last
//! success); block writes are idempotent, so a repeat after a failover is
//! harmless; the client sees an error only after the deadline.

use super::{Env, Inner};
use crate::coordinator::Heartbeat;
use crate::replica::{Event, Origin, Replica};
use basalt_replication::{
    payload, ClientReply, ClientReq, Membership, Msg, NodeId, Payload, VolumeId,
};
use basalt_store::{DataKind, DataOp, IoError, BLOCK_SIZE};
use basalt_volume::{BlockCipher, BlockIo, WriteAck};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// Client requests waiting for their reply, by this node's request id.
#[derive(Default)]
pub(super) struct Pending {
    next: u64,
    waiting: HashMap<u64, Waiting>,
}

struct Waiting {
    /// The channel of the batch the request belongs to.
    pub(super) tx: mpsc::SyncSender<(usize, ClientReply)>,
    /// Its index in the batch.
    pub(super) index: usize,
    /// The volume and the remote primary it was forwarded to (None: run
    /// locally, or not sent).
    pub(super) forwarded: Option<(VolumeId, NodeId)>,
    /// The batch's early acknowledgement, if its frontend gave one.
    pub(super) early: Option<Arc<EarlyAck>>,
}

impl Waiting {
    /// Hands `reply` to the batch's submitter — after acknowledging the
    /// batch to the client, on this thread, if it was its last write.
    pub(super) fn answer(self, reply: ClientReply) {
        if let Some(early) = &self.early {
            early.reply(matches!(reply, ClientReply::Ok { .. }));
        }
        let _ = self.tx.try_send((self.index, reply));
    }
}

/// A batch of client writes whose frontend acknowledges them itself
/// ([`WriteAck`]): the thread that brings the batch's last successful reply
/// calls it, so the submitting thread's wake-up is off the client's path.
///
/// Invariant: `ack` is called at most once, only when every write of the
/// batch's first attempt succeeded, and never after the submitter closed the
/// batch — the state lock is held across the call, so after `close` returns
/// the outcome is final.
struct EarlyAck {
    pub(super) ack: Arc<dyn WriteAck>,
    pub(super) state: Mutex<EarlyAckState>,
}

enum EarlyAckState {
    /// This many writes not answered yet, all answers so far successes.
    Waiting(usize),
    Acknowledged,
    /// A write failed, or the submitter closed the batch first.
    Off,
}

impl EarlyAck {
    pub(super) fn new(ack: Arc<dyn WriteAck>, writes: usize) -> EarlyAck {
        EarlyAck {
            ack,
            state: Mutex::new(EarlyAckState::Waiting(writes)),
        }
    }

    pub(super) fn reply(&self, ok: bool) {
        let mut st = self.state.lock();
        let EarlyAckState::Waiting(remaining) = *st else {
            return;
        };
        *st = if !ok {
            EarlyAckState::Off
        } else if remaining <= 1 {
            self.ack.acknowledge();
            EarlyAckState::Acknowledged
        } else {
            EarlyAckState::Waiting(remaining - 1)
        };
    }

    /// Ends the first attempt: no acknowledgement after this. Returns
    /// whether the batch was acknowledged (then every write succeeded).
    fn close(&self) -> bool {
        let mut st = self.state.lock();
        if matches!(*st, EarlyAckState::Acknowledged) {
            return true;
        }
        *st = EarlyAckState::Off;
        false
    }
}

/// A replicated volume's data path as frontends see it.
pub(super) struct ClusterVolume {
    pub(super) inner: Weak<Inner>,
    pub(super) vol: VolumeId,
    /// Bytes clients may address, shared by every open of the volume on
    /// this node and raised when a record shows the volume grown (read per
    /// request: an atomic, no lock).
    pub(super) size: Arc<AtomicU64>,
    /// Serialises read-modify-write of partial blocks.
    pub(super) partial: Mutex<()>,
    /// An encrypted volume's cipher: writes leave this node as ciphertext
    /// (the peer link and every replica carry nothing else), reads are
    /// decrypted here.
    pub(super) cipher: Option<Arc<BlockCipher>>,
    /// Counts this open among the node's clients of the volume, which
    /// other nodes see (`clients.rs`).
    pub(super) _open: super::clients::OpenCount,
}

/// Volumes of a peer batch grouped by a scan before an index is built.
const SCAN_VOLUMES: usize = 8;

pub(super) fn gone() -> IoError {
    IoError::Gone
}

fn op_len(op: &DataOp<'_>) -> u64 {
    match &op.kind {
        DataKind::Read(b) => b.len() as u64,
        DataKind::Write(b) => b.len() as u64,
    }
}

impl ClusterVolume {
    /// `data` (whole blocks from block `lba`) as it is sent: encrypted
    /// for an encrypted volume.
    fn sealed(&self, lba: u64, data: &[u8]) -> Result<Vec<u8>, IoError> {
        let mut out = data.to_vec();
        if let Some(c) = &self.cipher {
            c.encrypt(lba, &mut out).map_err(|e| {
                tracing::error!(volume = ?self.vol, error = %e, "encryption failed; the write fails");
                IoError::Failed
            })?;
        }
        Ok(out)
    }

    /// Decrypts `data` (whole blocks from block `lba`) as read, for an
    /// encrypted volume; never-written (all-zero) blocks stay zeros.
    fn unsealed(&self, lba: u64, data: &mut [u8]) -> Result<(), IoError> {
        match &self.cipher {
            None => Ok(()),
            Some(c) => c.decrypt_written(lba, data).map_err(|e| {
                tracing::error!(volume = ?self.vol, error = %e, "decryption failed; the read fails");
                IoError::Failed
            }),
        }
    }

    pub(super) fn check(&self, offset: u64, len: u64) -> Result<(), IoError> {
        let size = self.size.load(Ordering::Relaxed);
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(IoError::OutOfRange { offset, len, size });
        }
        Ok(())
    }

    /// Writes `data` at a byte offset that need not be block aligned.
    fn write_unaligned(
        &self,
        inner: &Inner,
        offset: u64,
        data: &[u8],
        fua: bool,
    ) -> Result<(), IoError> {
        let _guard = self.partial.lock();
        let first = offset / BLOCK_SIZE;
        let end = (offset + data.len() as u64).div_ceil(BLOCK_SIZE);
        let read = inner.execute(
            self.vol,
            1,
            |_| ClientReq::Read {
                lba: first,
                blocks: end - first,
            },
            None,
        );
        let mut buf = match read.into_iter().next() {
            Some(Ok(Some(d))) => d,
            Some(Err(e)) => return Err(e),
            _ => return Err(IoError::Failed),
        };
        self.unsealed(first, &mut buf)?;
        let at = (offset - first * BLOCK_SIZE) as usize;
        buf.get_mut(at..at + data.len())
            .ok_or(IoError::Failed)?
            .copy_from_slice(data);
        let buf = Payload::from(self.sealed(first, &buf)?);
        let w = inner.execute(
            self.vol,
            1,
            |_| ClientReq::Write {
                lba: first,
                data: buf.clone(),
                fua,
            },
            None,
        );
        w.into_iter()
            .next()
            .unwrap_or(Err(IoError::Failed))
            .map(|_| ())
    }

    /// [`BlockIo::submit`]; `ack` is passed on to the aligned round when
    /// that round is the whole batch and all writes (a refused op or a
    /// partial write, a read-modify-write of its own after the round, is
    /// answered outside it).
    pub(super) fn run(&self, ops: &mut [DataOp<'_>], ack: Option<&Arc<dyn WriteAck>>) {
        let Some(inner) = self.inner.upgrade() else {
            for op in ops.iter_mut() {
                op.result = Err(gone());
            }
            return;
        };
        // Reads and aligned writes go out together; partial writes one at a
        // time (read-modify-write).
        let mut aligned = Vec::new();
        for (i, op) in ops.iter_mut().enumerate() {
            let len = op_len(op);
            if let Err(e) = self.check(op.offset, len) {
                op.result = Err(e);
                continue;
            }
            let is_aligned = op.offset.is_multiple_of(BLOCK_SIZE) && len.is_multiple_of(BLOCK_SIZE);
            if is_aligned || matches!(op.kind, DataKind::Read(_)) {
                aligned.push(i);
            }
        }
        // An encrypted volume's writes, sealed once (every attempt shares
        // the payload); a write that cannot be sealed fails and is not sent.
        let mut sealed: Vec<Option<Payload>> = Vec::new();
        if self.cipher.is_some() {
            let mut kept = Vec::with_capacity(aligned.len());
            for &i in &aligned {
                let op = &mut ops[i];
                match &op.kind {
                    DataKind::Write(d) => match self.sealed(op.offset / BLOCK_SIZE, d) {
                        Ok(s) => sealed.push(Some(Payload::from(s))),
                        Err(e) => {
                            op.result = Err(e);
                            continue;
                        }
                    },
                    DataKind::Read(_) => sealed.push(None),
                }
                kept.push(i);
            }
            aligned = kept;
        }
        let results = if aligned.is_empty() {
            Vec::new()
        } else {
            let ops = &*ops;
            let sealed = &sealed;
            let request = |k: usize| {
                let op = &ops[aligned[k]];
                let first = op.offset / BLOCK_SIZE;
                match &op.kind {
                    DataKind::Read(_) => ClientReq::Read {
                        lba: first,
                        blocks: (op.offset + op_len(op)).div_ceil(BLOCK_SIZE) - first,
                    },
                    DataKind::Write(d) => ClientReq::Write {
                        lba: first,
                        data: match sealed.get(k) {
                            Some(Some(s)) => s.clone(),
                            // The one copy a write's bytes take on this
                            // node (the frontend reuses its buffer), into
                            // an aligned payload the local store writes
                            // with O_DIRECT as it is and every replica
                            // link shares.
                            _ => payload::aligned(d),
                        },
                        fua: op.fua,
                    },
                }
            };
            let whole = aligned.len() == ops.len()
                && ops.iter().all(|op| matches!(op.kind, DataKind::Write(_)));
            inner.execute(self.vol, aligned.len(), request, ack.filter(|_| whole))
        };
        for (i, r) in aligned.into_iter().zip(results) {
            let op = &mut ops[i];
            let offset = op.offset;
            op.result = match (&mut op.kind, r) {
                (DataKind::Read(buf), Ok(Some(mut data))) => {
                    let at = (offset % BLOCK_SIZE) as usize;
                    match self.unsealed(offset / BLOCK_SIZE, &mut data) {
                        Err(e) => Err(e),
                        Ok(()) => match data.get(at..at + buf.len()) {
                            Some(src) => {
                                buf.copy_from_slice(src);
                                Ok(())
                            }
                            None => Err(IoError::Failed),
                        },
                    }
                }
                (DataKind::Read(_), Ok(None)) => Err(IoError::Failed),
                (DataKind::Write(_), Ok(_)) => Ok(()),
                (_, Err(e)) => Err(e),
            };
        }
        for op in ops.iter_mut() {
            if let DataKind::Write(d) = &op.kind {
                let len = d.len() as u64;
                let partial =
                    !op.offset.is_multiple_of(BLOCK_SIZE) || !len.is_multiple_of(BLOCK_SIZE);
                if partial && self.check(op.offset, len).is_ok() {
                    op.result = self.write_unaligned(&inner, op.offset, d, op.fua);
                }
            }
        }
    }
}

impl BlockIo for ClusterVolume {
    fn size(&self) -> u64 {
        self.size.load(Ordering::Relaxed)
    }

    fn submit(&self, ops: &mut [DataOp<'_>]) {
        self.run(ops, None);
    }

    fn submit_writes(&self, ops: &mut [DataOp<'_>], ack: &Arc<dyn WriteAck>) {
        self.run(ops, Some(ack));
    }

    fn flush(&self) -> Result<(), IoError> {
        let inner = self.inner.upgrade().ok_or_else(gone)?;
        inner
            .execute(self.vol, 1, |_| ClientReq::Flush, None)
            .into_iter()
            .next()
            .unwrap_or(Err(IoError::Failed))
            .map(|_| ())
    }

    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<(), IoError> {
        self.check(offset, len)?;
        const CHUNK: u64 = 1 << 20;
        let zeros = vec![0u8; CHUNK as usize];
        let mut at = offset;
        let end = offset + len;
        while at < end {
            // Up to the next chunk boundary, so middle chunks are aligned.
            let n = (CHUNK - at % CHUNK).min(end - at);
            let mut op = [DataOp::write(at, &zeros[..n as usize], fua)];
            self.submit(&mut op);
            let [op] = op;
            op.result?;
            at += n;
        }
        Ok(())
    }
}

impl Inner {
    /// Frames that arrived together: each replica gets its share as one
    /// batch (so a secondary writes a burst of replicated writes with one
    /// device submission), in arrival order.
    pub(super) fn on_peer_batch(&self, from: NodeId, batch: Vec<(VolumeId, Msg)>) {
        let mut by_volume: Vec<(VolumeId, Vec<Event>)> = Vec::new();
        // Built only for a batch of many volumes (a node's heartbeat
        // answers): a batch of replicated writes, one or a few volumes, is
        // grouped by a scan without allocating.
        let mut index: Option<HashMap<VolumeId, usize>> = None;
        // Heartbeats are answered here, on the peer's reader (never behind
        // the coordinator's etcd writes), all answers to one batch in one
        // send.
        let mut heartbeats: Vec<Heartbeat> = Vec::new();
        for (vol, msg) in batch {
            let ev = match msg {
                Msg::ClientReq { id, req } => Event::Client {
                    id,
                    req,
                    origin: Origin::Node(from),
                },
                Msg::HeartbeatAck { .. } => Event::Control(msg),
                Msg::Heartbeat { boot, sent_at } => {
                    heartbeats.push((vol, boot, sent_at));
                    continue;
                }
                Msg::ClientReply { id, reply } => {
                    self.complete(id, reply);
                    continue;
                }
                msg => Event::Peer { from, msg },
            };
            let at = match &index {
                Some(index) => index.get(&vol).copied(),
                None => by_volume.iter().position(|(v, _)| *v == vol),
            };
            match at {
                Some(i) => by_volume[i].1.push(ev),
                None => {
                    if let Some(index) = &mut index {
                        index.insert(vol, by_volume.len());
                    }
                    by_volume.push((vol, vec![ev]));
                    if index.is_none() && by_volume.len() > SCAN_VOLUMES {
                        index = Some(
                            by_volume
                                .iter()
                                .enumerate()
                                .map(|(i, (v, _))| (*v, i))
                                .collect(),
                        );
                    }
                }
            }
        }
        if !heartbeats.is_empty() {
            let responder = self.coordinator.lock().as_ref().map(|c| c.responder());
            if let Some(r) = responder {
                let acks = r.answer(self, from, &heartbeats);
                if !acks.is_empty() {
                    self.peers.send_many(from, acks);
                }
            }
        }
        for (vol, events) in by_volume {
            match self.replica(vol) {
                Some(replica) => replica.deliver(events),
                None => {
                    for ev in events {
                        if let Event::Client { id, .. } = ev {
                            self.peers.send(
                                from,
                                vol,
                                Msg::ClientReply {
                                    id,
                                    reply: ClientReply::NotPrimary,
                                },
                            );
                        }
                    }
                }
            }
        }
    }

    pub(super) fn replica(&self, vol: VolumeId) -> Option<Arc<Replica<Env>>> {
        self.replicas.lock().get(&vol).map(|h| h.replica.clone())
    }

    /// Delivers `ev` to the volume's local replica, on this thread.
    pub(super) fn to_replica(&self, vol: VolumeId, ev: Event) {
        if let Some(replica) = self.replica(vol) {
            replica.deliver(vec![ev]);
        }
    }

    pub(super) fn complete(&self, id: u64, reply: ClientReply) {
        let waiting = self.pending.lock().waiting.remove(&id);
        if let Some(w) = waiting {
            w.answer(reply);
        }
    }

    /// Opens of `rec`'s volume serve its recorded size from now on (it
    /// only grows).
    pub(super) fn raise_open_size(&self, rec: &Membership) {
        if let Some(size) = self.open_sizes.lock().get(&rec.volume) {
            size.fetch_max(rec.blocks * BLOCK_SIZE, Ordering::Relaxed);
        }
    }

    /// `vol`'s primary is now `primary`: requests forwarded to another node
    /// are answered NotPrimary here, so their batch is sent again at once
    /// rather than after its attempt window (the old primary may be dead).
    pub(super) fn redirect(&self, vol: VolumeId, primary: NodeId) {
        let mut p = self.pending.lock();
        let stale: Vec<u64> = p
            .waiting
            .iter()
            .filter(|(_, w)| w.forwarded.is_some_and(|(v, to)| v == vol && to != primary))
            .map(|(id, _)| *id)
            .collect();
        for id in stale {
            if let Some(w) = p.waiting.remove(&id) {
                w.answer(ClientReply::NotPrimary);
            }
        }
    }

    /// Sends client requests to the volume's primary; their replies arrive
    /// on the returned channel, tagged with the index given beside each
    /// request. Also returns the requests' ids. A local primary runs them on
    /// this thread, disk I/O included. `early` sees every reply first.
    fn submit(
        &self,
        vol: VolumeId,
        reqs: Vec<(usize, ClientReq)>,
        early: Option<&Arc<EarlyAck>>,
    ) -> (Vec<u64>, mpsc::Receiver<(usize, ClientReply)>) {
        let (tx, rx) = mpsc::sync_channel(reqs.len());
        let mut sent = Vec::with_capacity(reqs.len());
        let primary = self.records.read().get(&vol).map(|r| r.primary);
        let forwarded = primary.filter(|p| *p != self.me).map(|p| (vol, p));
        {
            let mut p = self.pending.lock();
            for (index, req) in reqs {
                p.next += 1;
                let id = p.next;
                let tx = tx.clone();
                p.waiting.insert(
                    id,
                    Waiting {
                        tx,
                        index,
                        forwarded,
                        early: early.cloned(),
                    },
                );
                sent.push((id, req));
            }
        }
        let ids = sent.iter().map(|(id, _)| *id).collect();
        match primary {
            Some(p) if p == self.me => match self.replica(vol) {
                Some(replica) => replica.deliver(
                    sent.into_iter()
                        .map(|(id, req)| Event::Client {
                            id,
                            req,
                            origin: Origin::Local,
                        })
                        .collect(),
                ),
                None => {
                    for (id, _) in sent {
                        self.complete(id, ClientReply::NotPrimary);
                    }
                }
            },
            Some(p) => {
                let msgs = sent
                    .into_iter()
                    .map(|(id, req)| Msg::ClientReq { id, req })
                    .collect();
                self.peers.send_batch(p, vol, msgs);
            }
            // Not placed yet: answer NotPrimary so the caller waits and
            // retries until the coordinator has placed the volume.
            None => {
                for (id, _) in sent {
                    self.complete(id, ClientReply::NotPrimary);
                }
            }
        }
        (ids, rx)
    }

    /// Drops the requests still waiting among `ids` (their replies, should
    /// they come, go nowhere).
    /// Sends one request to the volume's primary, once (no retry): its
    /// ids (for [`Inner::forget`]) and where its answer arrives.
    pub(super) fn submit_once(
        &self,
        vol: VolumeId,
        req: ClientReq,
    ) -> (Vec<u64>, mpsc::Receiver<(usize, ClientReply)>) {
        self.submit(vol, vec![(0, req)], None)
    }

    pub(super) fn forget(&self, ids: &[u64]) {
        let mut p = self.pending.lock();
        for id in ids {
            p.waiting.remove(id);
        }
    }

    /// Runs `reqs` against the volume's primary, retrying across failovers
    /// until the request deadline; returns each request's read data.
    ///
    /// `request(i)` builds request `i` of `n` for each attempt, so a
    /// request's data is copied from the caller's buffer once per attempt
    /// and kept nowhere else. `ack`, given only for a batch of writes, is
    /// called if the first attempt succeeds, by the thread that brings its
    /// last reply (see [`EarlyAck`]).
    pub(super) fn execute(
        &self,
        vol: VolumeId,
        n: usize,
        request: impl Fn(usize) -> ClientReq,
        ack: Option<&Arc<dyn WriteAck>>,
    ) -> Vec<Result<Option<Vec<u8>>, IoError>> {
        let deadline = Instant::now() + self.cfg.request_deadline;
        // A reply normally takes far less; past this the request (or its
        // reply) is assumed lost with a connection and is sent again.
        let attempt = Duration::from_secs(5);
        let mut results: Vec<Option<Result<Option<Vec<u8>>, IoError>>> =
            (0..n).map(|_| None).collect();
        let mut backoff = Duration::from_millis(20);
        let mut early = ack.map(|ack| Arc::new(EarlyAck::new(ack.clone(), n)));
        loop {
            let todo: Vec<(usize, ClientReq)> = (0..n)
                .filter(|i| results[*i].is_none())
                .map(|i| (i, request(i)))
                .collect();
            if todo.is_empty() {
                break;
            }
            let (ids, rx) = self.submit(vol, todo, early.as_ref());
            let mut unanswered = ids.len();
            let mut retry = false;
            // One attempt window for the whole batch: a batch sent to a dead
            // primary is retried after `attempt`, not after `attempt` per
            // request.
            let attempt_end = (Instant::now() + attempt).min(deadline);
            while unanswered > 0 {
                let wait = attempt_end.saturating_duration_since(Instant::now());
                match rx.recv_timeout(wait) {
                    Ok((i, ClientReply::Ok { data, .. })) => results[i] = Some(Ok(data)),
                    // No replica holds a good copy: a media error, not retried.
                    Ok((i, ClientReply::Unreadable { .. })) => {
                        let offset = match request(i) {
                            ClientReq::Read { lba, .. } | ClientReq::Compare { lba, .. } => {
                                lba * BLOCK_SIZE
                            }
                            _ => 0,
                        };
                        results[i] = Some(Err(IoError::Corrupt { offset }))
                    }
                    Ok((i, ClientReply::NoSuchLayer { .. })) => {
                        results[i] = Some(Err(IoError::Io(std::io::Error::new(
                            std::io::ErrorKind::NotFound,
                            "the primary holds no such snapshot",
                        ))))
                    }
                    // Not retried: the primary answers so only when no
                    // attempt could succeed until space is freed.
                    Ok((i, ClientReply::NoSpace { .. })) => {
                        results[i] = Some(Err(IoError::NoSpace))
                    }
                    Ok((_, ClientReply::NotPrimary)) => retry = true,
                    Err(_) => {
                        self.forget(&ids);
                        retry = true;
                        break;
                    }
                }
                unanswered -= 1;
            }
            // Only the first attempt may be acknowledged early. Acknowledged
            // means every write succeeded, even those whose reply this
            // thread gave up waiting for a moment ago.
            if let Some(early) = early.take() {
                if early.close() {
                    for r in results.iter_mut().filter(|r| r.is_none()) {
                        *r = Some(Ok(None));
                    }
                    break;
                }
            }
            if retry {
                if Instant::now() >= deadline {
                    for r in results.iter_mut().filter(|r| r.is_none()) {
                        *r = Some(Err(IoError::Io(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "no primary answered before the request deadline",
                        ))));
                    }
                    break;
                }
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_millis(500));
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or(Err(IoError::Failed)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[derive(Default)]
    struct Counted(AtomicUsize);

    impl WriteAck for Counted {
        fn acknowledge(&self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn batch(writes: usize) -> (Arc<Counted>, EarlyAck) {
        let counted = Arc::new(Counted::default());
        let ack: Arc<dyn WriteAck> = counted.clone();
        (counted, EarlyAck::new(ack, writes))
    }

    #[test]
    fn a_batch_is_acknowledged_once_by_its_last_success() {
        let (counted, early) = batch(3);
        early.reply(true);
        early.reply(true);
        assert_eq!(counted.0.load(Ordering::SeqCst), 0);
        early.reply(true);
        assert_eq!(counted.0.load(Ordering::SeqCst), 1);
        // A duplicate reply (a retransmission answered twice) changes nothing.
        early.reply(true);
        assert!(early.close());
        assert_eq!(counted.0.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_failed_write_or_a_closed_batch_is_never_acknowledged() {
        let (counted, early) = batch(2);
        early.reply(false);
        early.reply(true);
        early.reply(true);
        assert!(!early.close());
        assert_eq!(counted.0.load(Ordering::SeqCst), 0);

        // The submitter gave up on the first attempt: late replies go
        // nowhere, and the retry's replies are the submitter's to send.
        let (counted, early) = batch(1);
        assert!(!early.close());
        early.reply(true);
        assert_eq!(counted.0.load(Ordering::SeqCst), 0);
    }
}
