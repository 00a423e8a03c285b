//! Client request batches of replicated volumes, in flight without a
//! thread waiting for them: a batch is sent to the volume's primary, its
//! replies are gathered by whichever threads bring them (a peer reader, the
//! thread that ran a local primary's disk I/O), and the batch's completion
//! is called once, by the thread that brought its last answer. What is not
//! answered finally (NotPrimary, no reply within the attempt window) is
//! sent again to the then-current primary by the member's retrier thread,
//! after a backoff, until the request deadline.
//!
//! Event loops start batches and hear of their completion through their
//! mailbox (one hand-over per batch); a thread that wants to wait
//! ([`Inner::execute`]) starts one and waits for its completion.
//!
//! Invariants:
//! - a batch's completion is called exactly once: with a final result for
//!   every request, or with an error for those left when the deadline
//!   passed or the member stopped (a batch dropped uncompleted — its
//!   member gone — drops its completion, which callers treat as failure);
//! - a request is in at most one attempt at a time: an attempt ends when
//!   each of its requests was answered (a reply, NotPrimary, a redirect, or
//!   the attempt window running out, each removing it from [`Pending`]),
//!   and only then is the next one sent, holding the requests without a
//!   final answer;
//! - block writes are idempotent, so a repeat after a failover is harmless;
//! - a batch with a [`WriteAck`] is acknowledged early at most once, only
//!   if every write of its first attempt succeeded, and never after that
//!   attempt ended ([`EarlyAck`]).

use super::Inner;
use crate::replica::{Event, Origin};
use basalt_replication::{ClientReply, ClientReq, Msg, NodeId, VolumeId};
use basalt_store::{IoError, BLOCK_SIZE};
use basalt_volume::WriteAck;
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc, Weak};
use std::time::{Duration, Instant};

/// A request's final result: a read's data, or the error the client sees.
pub(super) type ReqResult = Result<Option<Vec<u8>>, IoError>;
/// Called once with the results of a batch, in request order.
pub(super) type BatchDone = Box<dyn FnOnce(Vec<ReqResult>) + Send>;

/// A reply normally takes far less; past this the request (or its reply)
/// is assumed lost with a connection and is sent again. One window per
/// attempt of the whole batch, not per request.
const ATTEMPT: Duration = Duration::from_secs(5);
/// How often the retrier looks for attempts whose window ran out.
const SCAN: Duration = Duration::from_millis(250);
const FIRST_BACKOFF: Duration = Duration::from_millis(20);
const MAX_BACKOFF: Duration = Duration::from_millis(500);

/// Client requests waiting for their reply, by this node's request id.
#[derive(Default)]
pub(super) struct Pending {
    next: u64,
    waiting: HashMap<u64, Waiting>,
}

pub(super) struct Waiting {
    batch: Arc<Batch>,
    /// Its index in the batch.
    index: usize,
    /// The volume and the remote primary it was forwarded to (None: run
    /// locally, or not sent).
    forwarded: Option<(VolumeId, NodeId)>,
    /// When its attempt's window runs out.
    attempt_end: Instant,
}

/// Batches waiting to be sent again, and the retrier's wake-up.
#[derive(Default)]
pub(super) struct Retries {
    queue: Mutex<Vec<(Instant, Arc<Batch>)>>,
    wake: Condvar,
}

impl Retries {
    /// Wakes the retrier (to see the member stopping).
    pub(super) fn wake(&self) {
        self.wake.notify_all();
    }
}

pub(super) struct Batch {
    vol: VolumeId,
    /// One attempt only: what it leaves unanswered fails (no retry).
    once: bool,
    state: Mutex<BatchState>,
}

struct BatchState {
    reqs: Vec<ClientReq>,
    results: Vec<Option<ReqResult>>,
    /// Requests of the current attempt not answered yet.
    unanswered: usize,
    deadline: Instant,
    backoff: Duration,
    /// The first attempt's early acknowledgement (taken when it ends).
    early: Option<EarlyAck>,
    /// Taken when the batch completes.
    done: Option<BatchDone>,
}

impl BatchState {
    /// Takes the completion and the results, if the batch is complete and
    /// not completed yet.
    fn complete(&mut self) -> Option<(BatchDone, Vec<ReqResult>)> {
        if self.results.iter().any(Option::is_none) {
            return None;
        }
        let done = self.done.take()?;
        let results = std::mem::take(&mut self.results)
            .into_iter()
            .map(|r| r.unwrap_or(Err(IoError::Failed)))
            .collect();
        Some((done, results))
    }

    /// Every request without a result gets `err()`.
    fn fail_rest(&mut self, err: impl Fn() -> IoError) {
        for r in self.results.iter_mut().filter(|r| r.is_none()) {
            *r = Some(Err(err()));
        }
    }
}

/// A batch of client writes whose frontend acknowledges them itself
/// ([`WriteAck`]): the thread that brings the batch's last successful reply
/// calls it, so the submitting thread's wake-up is off the client's path.
///
/// Invariant: `ack` is called at most once, only when every write of the
/// batch's first attempt succeeded, and never after the attempt was
/// closed — the state lock is held across the call, so after `close`
/// returns the outcome is final.
pub(super) struct EarlyAck {
    ack: Arc<dyn WriteAck>,
    state: Mutex<EarlyAckState>,
}

enum EarlyAckState {
    /// This many writes not answered yet, all answers so far successes.
    Waiting(usize),
    Acknowledged,
    /// A write failed, or the attempt was closed first.
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
    pub(super) fn close(&self) -> bool {
        let mut st = self.state.lock();
        if matches!(*st, EarlyAckState::Acknowledged) {
            return true;
        }
        *st = EarlyAckState::Off;
        false
    }
}

/// What a request left without an answer gets when it is not retried.
fn no_answer() -> IoError {
    IoError::Io(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "no primary answered before the request deadline",
    ))
}

/// The final result a reply gives its request; `None`: not final
/// (NotPrimary: to be sent again).
fn final_result(req: &ClientReq, reply: ClientReply) -> Option<ReqResult> {
    Some(match reply {
        ClientReply::Ok { data, .. } => Ok(data),
        // No replica holds a good copy: a media error, not retried.
        ClientReply::Unreadable { .. } => Err(IoError::Corrupt {
            offset: match req {
                ClientReq::Read { lba, .. } | ClientReq::Compare { lba, .. } => lba * BLOCK_SIZE,
                _ => 0,
            },
        }),
        ClientReply::NoSuchLayer { .. } => Err(IoError::Io(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "the primary holds no such snapshot",
        ))),
        // Not retried: the primary answers so only when no attempt could
        // succeed until space is freed.
        ClientReply::NoSpace { .. } => Err(IoError::NoSpace),
        ClientReply::NotPrimary => return None,
    })
}

impl Inner {
    /// Starts `reqs` against the volume's primary; `done` gets their
    /// results once each has a final one (see the module's invariants), on
    /// the thread that brings the last — possibly this one, before this
    /// returns (a local primary's disk I/O runs here). `ack`, given only
    /// for a batch of writes, is called if the first attempt succeeds, by
    /// the thread that brings its last reply (see [`EarlyAck`]).
    pub(super) fn start_batch(
        &self,
        vol: VolumeId,
        reqs: Vec<ClientReq>,
        ack: Option<&Arc<dyn WriteAck>>,
        done: BatchDone,
    ) {
        self.start(vol, reqs, ack, false, done);
    }

    fn start(
        &self,
        vol: VolumeId,
        reqs: Vec<ClientReq>,
        ack: Option<&Arc<dyn WriteAck>>,
        once: bool,
        done: BatchDone,
    ) {
        if reqs.is_empty() {
            done(Vec::new());
            return;
        }
        if self.stopping.load(Ordering::SeqCst) {
            done(reqs.iter().map(|_| Err(IoError::Gone)).collect());
            return;
        }
        let n = reqs.len();
        let batch = Arc::new(Batch {
            vol,
            once,
            state: Mutex::new(BatchState {
                reqs,
                results: (0..n).map(|_| None).collect(),
                unanswered: 0,
                deadline: Instant::now() + self.cfg.request_deadline,
                backoff: FIRST_BACKOFF,
                early: ack.map(|ack| EarlyAck::new(Arc::clone(ack), n)),
                done: Some(done),
            }),
        });
        self.send_attempt(&batch);
    }

    /// Runs `reqs` against the volume's primary, retrying across failovers
    /// until the request deadline, and waits for their results.
    pub(super) fn execute(
        &self,
        vol: VolumeId,
        reqs: Vec<ClientReq>,
        ack: Option<&Arc<dyn WriteAck>>,
    ) -> Vec<ReqResult> {
        let n = reqs.len();
        let (tx, rx) = mpsc::sync_channel(1);
        self.start_batch(
            vol,
            reqs,
            ack,
            Box::new(move |results| {
                let _ = tx.send(results);
            }),
        );
        // A batch dropped uncompleted (the member is gone) fails; the
        // bound is a backstop (the retrier ends every batch by then).
        rx.recv_timeout(self.cfg.request_deadline + ATTEMPT)
            .unwrap_or_else(|_| (0..n).map(|_| Err(no_answer())).collect())
    }

    /// Sends one request to the volume's primary, once (no retry), and
    /// waits for its result: a request that no primary answered (NotPrimary
    /// or nothing before the deadline) gets a `TimedOut` error.
    pub(super) fn execute_once(&self, vol: VolumeId, req: ClientReq) -> ReqResult {
        let (tx, rx) = mpsc::sync_channel(1);
        self.start(
            vol,
            vec![req],
            None,
            true,
            Box::new(move |results| {
                let _ = tx.send(results);
            }),
        );
        rx.recv_timeout(self.cfg.request_deadline + ATTEMPT)
            .ok()
            .and_then(|r| r.into_iter().next())
            .unwrap_or_else(|| Err(no_answer()))
    }

    /// Whether this node holds `vol`'s primary, as last recorded (its
    /// batches run their disk I/O on the thread that sends them).
    pub(super) fn primary_is_local(&self, vol: VolumeId) -> bool {
        self.records
            .read()
            .get(&vol)
            .is_some_and(|r| r.primary == self.me)
    }

    /// Sends the batch's requests that have no final result to the
    /// volume's current primary, as one attempt.
    fn send_attempt(&self, batch: &Arc<Batch>) {
        let now = Instant::now();
        let (todo, attempt_end) = {
            let mut st = batch.state.lock();
            let todo: Vec<(usize, ClientReq)> = st
                .results
                .iter()
                .enumerate()
                .filter(|(_, r)| r.is_none())
                .map(|(i, _)| (i, st.reqs[i].clone()))
                .collect();
            st.unanswered = todo.len();
            let window = if batch.once {
                st.deadline
            } else {
                now + ATTEMPT
            };
            (todo, window.min(st.deadline))
        };
        let vol = batch.vol;
        let primary = self.records.read().get(&vol).map(|r| r.primary);
        let forwarded = primary.filter(|p| *p != self.me).map(|p| (vol, p));
        let mut sent = Vec::with_capacity(todo.len());
        {
            let mut p = self.pending.lock();
            for (index, req) in todo {
                p.next += 1;
                let id = p.next;
                p.waiting.insert(
                    id,
                    Waiting {
                        batch: Arc::clone(batch),
                        index,
                        forwarded,
                        attempt_end,
                    },
                );
                sent.push((id, req));
            }
        }
        self.route(vol, primary, sent);
    }

    /// Sends requests (registered in [`Pending`]) to `primary`: this
    /// node's replica runs them on this thread, disk I/O included; another
    /// node's gets them over the peer transport; none (the volume is not
    /// placed yet) answers NotPrimary, so they are sent again until the
    /// coordinator has placed it.
    fn route(&self, vol: VolumeId, primary: Option<NodeId>, sent: Vec<(u64, ClientReq)>) {
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
            None => {
                for (id, _) in sent {
                    self.complete(id, ClientReply::NotPrimary);
                }
            }
        }
    }

    /// The reply to request `id` of this node's, if it still waits for one.
    pub(super) fn complete(&self, id: u64, reply: ClientReply) {
        let waiting = self.pending.lock().waiting.remove(&id);
        if let Some(w) = waiting {
            self.answer(w, reply);
        }
    }

    /// `vol`'s primary is now `primary`: requests forwarded to another node
    /// are answered NotPrimary here, so their batch is sent again soon
    /// rather than after its attempt window (the old primary may be dead).
    pub(super) fn redirect(&self, vol: VolumeId, primary: NodeId) {
        let stale: Vec<Waiting> = {
            let mut p = self.pending.lock();
            let ids: Vec<u64> = p
                .waiting
                .iter()
                .filter(|(_, w)| w.forwarded.is_some_and(|(v, to)| v == vol && to != primary))
                .map(|(id, _)| *id)
                .collect();
            ids.iter().filter_map(|id| p.waiting.remove(id)).collect()
        };
        for w in stale {
            self.answer(w, ClientReply::NotPrimary);
        }
    }

    /// Records an answer to one request of a batch; the attempt's last
    /// answer completes the batch, or queues it to be sent again.
    fn answer(&self, w: Waiting, reply: ClientReply) {
        let Waiting { batch, index, .. } = w;
        let mut st = batch.state.lock();
        if st.done.is_none() {
            return;
        }
        if let Some(early) = &st.early {
            early.reply(matches!(reply, ClientReply::Ok { .. }));
        }
        let result = match st.reqs.get(index) {
            Some(req) => final_result(req, reply),
            None => Some(Err(IoError::Failed)),
        };
        if let Some(slot) = st.results.get_mut(index) {
            if slot.is_none() {
                *slot = result.or_else(|| batch.once.then(|| Err(no_answer())));
            }
        }
        st.unanswered = st.unanswered.saturating_sub(1);
        if st.unanswered > 0 {
            return;
        }
        // The attempt is over. Acknowledged early means every write
        // succeeded, even those whose reply was given up on.
        if let Some(early) = st.early.take() {
            if early.close() {
                for r in st.results.iter_mut().filter(|r| r.is_none()) {
                    *r = Some(Ok(None));
                }
            }
        }
        if batch.once || Instant::now() >= st.deadline {
            st.fail_rest(no_answer);
        }
        if let Some((done, results)) = st.complete() {
            drop(st);
            done(results);
            return;
        }
        if self.stopping.load(Ordering::SeqCst) {
            // The retrier is gone or going: nothing would send it again.
            st.fail_rest(|| IoError::Gone);
            if let Some((done, results)) = st.complete() {
                drop(st);
                done(results);
            }
            return;
        }
        let at = Instant::now() + st.backoff;
        st.backoff = (st.backoff * 2).min(MAX_BACKOFF);
        drop(st);
        self.retries.queue.lock().push((at, batch));
        self.retries.wake.notify_one();
    }

    /// Batches whose attempt window ran out: their unanswered requests
    /// are answered NotPrimary (forgotten here: a late reply goes nowhere),
    /// which ends the attempt.
    fn expire_attempts(&self, now: Instant) {
        let expired: Vec<Waiting> = {
            let mut p = self.pending.lock();
            let ids: Vec<u64> = p
                .waiting
                .iter()
                .filter(|(_, w)| w.attempt_end <= now)
                .map(|(id, _)| *id)
                .collect();
            ids.iter().filter_map(|id| p.waiting.remove(id)).collect()
        };
        for w in expired {
            self.answer(w, ClientReply::NotPrimary);
        }
    }

    /// The member stops: every batch in flight or waiting to be sent again
    /// completes now, its unanswered requests failed.
    pub(super) fn abandon_batches(&self) {
        let waiting: Vec<Waiting> = self
            .pending
            .lock()
            .waiting
            .drain()
            .map(|(_, w)| w)
            .collect();
        let queued: Vec<Arc<Batch>> = self
            .retries
            .queue
            .lock()
            .drain(..)
            .map(|(_, b)| b)
            .collect();
        let batches = waiting.into_iter().map(|w| w.batch).chain(queued);
        for batch in batches {
            let mut st = batch.state.lock();
            st.fail_rest(|| IoError::Gone);
            if let Some((done, results)) = st.complete() {
                drop(st);
                done(results);
            }
        }
    }
}

/// The retrier: sends batches again when their backoff is over, and ends
/// attempts whose window ran out. Exits when the member stops, completing
/// every batch still in flight.
pub(super) fn retry_batches(weak: Weak<Inner>) {
    let mut next_scan = Instant::now() + SCAN;
    loop {
        let Some(inner) = weak.upgrade() else { return };
        if inner.stopping.load(Ordering::SeqCst) {
            inner.abandon_batches();
            return;
        }
        let now = Instant::now();
        let (due, next_due) = {
            let mut queue = inner.retries.queue.lock();
            let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut *queue)
                .into_iter()
                .partition(|(at, _)| *at <= now);
            *queue = later;
            let next = queue.iter().map(|(at, _)| *at).min();
            (due, next)
        };
        for (_, batch) in due {
            inner.send_attempt(&batch);
        }
        if now >= next_scan {
            inner.expire_attempts(now);
            next_scan = now + SCAN;
        }
        let until = next_due.map_or(next_scan, |d| d.min(next_scan));
        let mut queue = inner.retries.queue.lock();
        // Woken by a new entry, or at the next due time or scan.
        if queue.iter().all(|(at, _)| *at > Instant::now()) {
            inner.retries.wake.wait_until(&mut queue, until);
        }
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
