//! A replicated volume's reads and writes on the loop: the ones a round
//! started leave together as one batch to the volume's primary
//! (`VolumeHandle::start`), and come back through the loop's mailbox,
//! delivered by the thread that completed the batch; that thread also
//! sends the early replies of the batch's successful writes
//! (`crate::ReplyGate`).
//!
//! Invariants:
//! - every slot of a batch is delivered back exactly once: with its op and
//!   outcome, or failed if the batch was lost (its completion dropped);
//! - a slot's buffer is away only while its batch is;
//! - a slot marked replied had its success reply sent whole (or its rest
//!   left for the loop to send first): the frontend sends none.

use super::{BlockIo, Delivery, Outcome};
use crate::gate::{EarlyReply, ReplyGate};
use basalt_reactor::{Deliverer, Io};
use basalt_volume::{IoError, OnComplete, OwnedOp};
use std::sync::Arc;

/// A replicated volume's batch from this many bytes runs on the offload
/// pool when this node is its primary (measured: 1 MiB writes gain a
/// quarter, 4k batches lose a fifth of their IOPS to the two hand-offs;
/// BENCHMARKS.md, "Replicated volumes on the event loops").
const OFFLOAD_BATCH_BYTES: usize = 256 << 10;

/// The completion of a replicated volume's batch: delivers it to the
/// connection's loop, or, dropped uncalled (the batch was lost), delivers
/// the slots without their ops, which then fail.
struct RemoteDone<C: Send + 'static> {
    deliverer: Option<Deliverer>,
    slots: Vec<usize>,
    /// Each op's early reply, and where to send them.
    early: Vec<Option<EarlyReply>>,
    gate: Option<Arc<ReplyGate>>,
    _c: std::marker::PhantomData<fn() -> C>,
}

impl<C: Send + 'static> RemoteDone<C> {
    /// On the thread that completed the batch: the early replies of the
    /// writes that succeeded go to the client from here, if the socket is
    /// free; then the batch goes back to the loop.
    fn finish(mut self, ops: Vec<OwnedOp>) {
        let mut replied = vec![false; ops.len()];
        if let Some(gate) = &self.gate {
            let mut replies = Vec::new();
            for (k, op) in ops.iter().enumerate() {
                if let (Ok(()), Some(Some(early))) = (&op.result, self.early.get(k)) {
                    replies.extend_from_slice(early.bytes());
                    replied[k] = true;
                }
            }
            if replies.is_empty() || !gate.send_now(&replies) {
                replied.iter_mut().for_each(|r| *r = false);
            }
        }
        self.deliver(ops, replied);
    }

    /// Hands the slots back to the loop (once: the deliverer is taken).
    fn deliver(&mut self, ops: Vec<OwnedOp>, replied: Vec<bool>) {
        if let Some(d) = self.deliverer.take() {
            let slots = std::mem::take(&mut self.slots);
            d.deliver(Box::new(Delivery::<C>::Remote {
                slots,
                ops,
                replied,
            }));
        }
    }
}

impl<C: Send + 'static> Drop for RemoteDone<C> {
    fn drop(&mut self) {
        // Not finished: the batch was lost; its slots fail.
        self.deliver(Vec::new(), Vec::new());
    }
}

impl<T: Send + 'static, C: Send + 'static> BlockIo<T, C> {
    /// Sends the reads and writes of a replicated volume started since the
    /// last call to its primary, as one batch. A frontend calls this after
    /// each round (its `Connection::flush`); a batch that completes at once
    /// (a local primary) is still delivered through the mailbox.
    pub fn submit_started(&mut self, io: &mut Io<'_>) {
        if self.remote.is_empty() {
            return;
        }
        let mut slots = std::mem::take(&mut self.remote);
        let mut ops = Vec::with_capacity(slots.len());
        let mut early = Vec::with_capacity(slots.len());
        let mut broken = Vec::new();
        slots.retain(|&slot| {
            let Some(data) = self
                .slots
                .get_mut(slot)
                .and_then(Option::as_mut)
                .and_then(|r| r.data.as_mut())
            else {
                return false;
            };
            let Some(buf) = data.buf.take() else {
                // (Cannot happen: a request's buffer is only away while
                // its batch is.) Still, it finishes, failed.
                broken.push(slot);
                return false;
            };
            ops.push(if data.write {
                OwnedOp::write(data.offset, buf, data.fua)
            } else {
                OwnedOp::read(data.offset, buf)
            });
            early.push(data.early);
            true
        });
        if !broken.is_empty() {
            let none = vec![false; broken.len()];
            self.remote_done(broken, Vec::new(), none);
        }
        if slots.is_empty() {
            return;
        }
        // A lone request with nothing else on the loop runs here, disk I/O
        // and all: nobody waits for the loop meanwhile.
        let lone = slots.len() == 1
            && io.loop_in_flight() == 0
            && slots
                .first()
                .and_then(|&s| self.slots.get(s))
                .and_then(Option::as_ref)
                .is_some_and(|r| r.lone);
        let done = RemoteDone::<C> {
            deliverer: Some(io.deliverer()),
            slots,
            early,
            gate: self.gate.clone(),
            _c: std::marker::PhantomData,
        };
        let done: OnComplete = Box::new(move |ops: Vec<OwnedOp>| done.finish(ops));
        let bytes: usize = ops.iter().map(|op| op.buf.len()).sum();
        if !lone && bytes >= OFFLOAD_BATCH_BYTES && self.handle.start_runs_disk_io() {
            // This node's primary runs the batch's disk I/O on the thread
            // that starts it: a large one not on the loop's, which keeps
            // receiving meanwhile. (A small one costs less than the two
            // hand-offs the pool would add.)
            let handle = self.handle.clone();
            io.offload(move || {
                handle.start(ops, done);
                Box::new(Delivery::<C>::Started)
            });
        } else {
            self.handle.start(ops, done);
        }
    }

    /// A replicated volume's batch came back: each slot gets its buffer
    /// and outcome (a slot without an op: the batch was lost, it fails).
    pub(super) fn remote_done(&mut self, slots: Vec<usize>, ops: Vec<OwnedOp>, replied: Vec<bool>) {
        let mut ops = ops.into_iter();
        for (k, slot) in slots.into_iter().enumerate() {
            let op = ops.next();
            let Some(req) = self.slots.get_mut(slot).and_then(Option::as_mut) else {
                continue;
            };
            req.jobs_left = req.jobs_left.saturating_sub(1);
            req.replied = replied.get(k).copied().unwrap_or(false);
            let result = match op {
                Some(op) => {
                    if let Some(data) = req.data.as_mut() {
                        data.buf = Some(op.buf);
                    }
                    op.result
                }
                None => Err(IoError::Failed),
            };
            req.outcome = Some(Outcome::Data(result));
            self.maybe_finish(slot);
        }
    }
}
