//! Resync, the primary's half: copying the regions a replica may lack to
//! it, at the resync rate, and narrowing what a replica is copied after a
//! failover to where it may differ.
//!
//! Invariants: see the parent module's (dirty sets, copies in flight, the
//! rate bucket, failover narrowing).

use super::{Mode, Out, Pend, PrimTag, Primary};
use crate::msg::{DiskOp, Endpoint, Prior};
use crate::types::{Epoch, LayerId, NodeId};
use crate::Config;
use std::collections::BTreeSet;

/// The resync rate limit: a token bucket in milli-bytes (bytes × 1000, so
/// that `rate × elapsed ms` adds whole units and the arithmetic stays exact
/// and deterministic on the state machine's clock).
pub(super) struct Bucket {
    /// Bytes per second; 0: unlimited.
    pub(super) rate: u64,
    /// The most the bucket holds, in milli-bytes.
    pub(super) cap: i128,
    /// Milli-bytes available (negative never: a copy is admitted only when
    /// its whole region's worth is there).
    pub(super) tokens: i128,
    /// When `tokens` was last refilled (ms).
    pub(super) at: u64,
}

impl Bucket {
    pub(super) fn new(cfg: &Config, now: u64) -> Self {
        let region = i128::from(cfg.region_blocks.max(1)) * i128::from(cfg.block_len.max(1));
        let cap = region * cfg.resync_inflight.max(1) as i128 * 1000;
        Bucket {
            rate: cfg.resync_rate,
            cap,
            tokens: cap,
            at: now,
        }
    }

    pub(super) fn refill(&mut self, now: u64) {
        let elapsed = now.saturating_sub(self.at);
        self.at = self.at.max(now);
        self.tokens = (self.tokens + i128::from(self.rate) * i128::from(elapsed)).min(self.cap);
    }

    /// Takes `bytes` if the bucket holds them.
    pub(super) fn take(&mut self, bytes: u64) -> bool {
        if self.rate == 0 {
            return true;
        }
        let want = i128::from(bytes) * 1000;
        if self.tokens < want {
            return false;
        }
        self.tokens -= want;
        true
    }

    /// Gives back the part of a reservation a copy did not use.
    pub(super) fn refund(&mut self, bytes: u64) {
        if self.rate != 0 {
            self.tokens = (self.tokens + i128::from(bytes) * 1000).min(self.cap);
        }
    }
}

impl Primary {
    /// A secondary applied the `Start` of `session`, reporting `prior`.
    /// The first one after a failover narrows its dirty set (see the
    /// module's invariants).
    pub(crate) fn on_started(
        &mut self,
        now: u64,
        from: NodeId,
        epoch: Epoch,
        session: u64,
        started: (Option<Prior>, Vec<LayerId>),
        out: &mut Out,
    ) {
        if epoch != self.epoch {
            return;
        }
        let (prior, layers) = started;
        let starting = self.links.get(&from).is_some_and(|l| {
            l.session == session && l.mode == Mode::Starting && l.inflight.contains_key(&0)
        });
        let keep = self.failover_regions(prior.as_ref());
        let total = self.region_gen.len();
        // A replica whose copy reads through this one's base names it
        // first. Due a full copy, a replica holding a layer (or the base)
        // is rebuilt from the newest it holds instead: only what differs
        // from it is copied, and its head stays thin. Not from the base
        // while a flatten is under way: one streamed after its `Start`
        // may detach it before the rebase (it is then asked to drop it).
        let flattening = self.ops.values().any(|o| o.flatten);
        let their_base = self.base.is_some() && layers.first() == self.base.as_ref() && !flattening;
        let own = &layers[usize::from(their_base)..];
        let full_copy = self
            .links
            .get(&from)
            .is_some_and(|l| l.dirty.len() == total && !(l.narrow && keep.is_some()));
        let thin = full_copy && (their_base || !own.is_empty());
        if starting
            && (own != self.layers.as_slice() || thin)
            && self.start_layers(now, from, own, (their_base, thin), out)
        {
            self.on_ack(from, epoch, session, 0);
            if let Some(l) = self.links.get_mut(&from) {
                l.mode = Mode::Layering;
            }
            return;
        }
        let written = &self.written;
        let Some(l) = self.links.get_mut(&from) else {
            return;
        };
        if l.session == session
            && l.mode == Mode::Starting
            && l.inflight.contains_key(&0)
            && l.narrow
        {
            l.narrow = false;
            match keep {
                Some(keep) => {
                    let clean = |r: &usize| keep.contains(r) || written.contains(r);
                    let left: Vec<usize> = l.dirty.iter().copied().filter(|r| !clean(r)).collect();
                    l.dirty.retain(clean);
                    // The replica holds the regions left out, but perhaps
                    // not durably: like streamed writes, they are dirty
                    // again if the link fails before it acknowledges a
                    // flush of this stream (a crash may lose them).
                    if !left.is_empty() {
                        l.unflushed.entry(0).or_default().extend(left);
                    }
                    out.narrowed.push((from, Some((l.dirty.len(), total))));
                }
                None => out.narrowed.push((from, None)),
            }
        }
        self.on_ack(from, epoch, session, 0);
    }

    /// The regions where a replica that reported `prior` may differ from
    /// this node, or None if that cannot be told.
    pub(super) fn failover_regions(&self, prior: Option<&Prior>) -> Option<BTreeSet<usize>> {
        let (mine, prior) = (self.mine.as_ref()?, prior?);
        if prior.epoch != mine.epoch || mine.epoch.0 + 1 != self.epoch.0 || prior.synced == 0 {
            return None;
        }
        // Writes acknowledged after the replica last knew itself InSync
        // (above its `synced`) may be missing there: this node has them
        // all, and its log keeps every one above its own floor. A former
        // primary's crash-saved log (`synced = u64::MAX`) holds every write
        // it applied, but it may have sent writes it never applied (their
        // local write waited for the log save when it crashed): nobody
        // acknowledged those, so they are above every `commit` this node
        // received.
        let above = if prior.synced == u64::MAX {
            mine.synced
        } else {
            prior.synced
        };
        let mut keep = mine.regions_above(above)?;
        let total = self.region_gen.len();
        keep.extend(
            prior
                .regions
                .iter()
                .map(|r| *r as usize)
                .filter(|r| *r < total),
        );
        Some(keep)
    }

    /// Starts region copies (up to `resync_inflight` per link, as the rate
    /// bucket admits them, one link after the other so links share the
    /// rate), the final flush of links with nothing left to copy, and the
    /// flush announcing `commit` to links just made InSync.
    pub(super) fn resync_step(&mut self, now: u64, out: &mut Out) {
        self.bucket.refill(now);
        let limit = self.cfg.resync_inflight.max(1);
        // Below `min_in_sync` client writes wait for a resync to finish:
        // the copies then go as fast as they can, uncapped (blocked clients
        // are worse than a busy disk).
        let urgent = self.below_min_in_sync();
        self.build_steps(now, out);
        // Links in round-robin order, starting after the last one admitted.
        let mut order: Vec<NodeId> = self.links.keys().copied().collect();
        if let Some(last) = self.last_copy {
            let at = order.partition_point(|n| *n <= last);
            order.rotate_left(at);
        }
        'rounds: loop {
            let mut started = false;
            for n in &order {
                // A link rebuilding layers copies those in its turn.
                match self.build_copy(*n, urgent, out) {
                    Some(true) => {
                        self.last_copy = Some(*n);
                        started = true;
                        continue;
                    }
                    Some(false) => break 'rounds,
                    None => {}
                }
                let Some(l) = self.links.get_mut(n) else {
                    continue;
                };
                // InSync links have dirty regions only where a compare
                // found them differing.
                if !matches!(l.mode, Mode::Resyncing | Mode::InSync)
                    || l.copies_in_flight() >= limit
                {
                    continue;
                }
                // A region is copied only while no client write to it is in
                // flight here (the read must see every write streamed before
                // the copy) and while no earlier copy of it is unfinished.
                let region_inflight = &self.region_inflight;
                // Nor while its copy here is being repaired, or after no
                // replica could repair it, until `resync_retry_ms` passed.
                let region_blocks = self.cfg.region_blocks;
                let repairing = |r: usize| {
                    self.repairs
                        .values()
                        .any(|p| p.op.is_none() && p.lba / region_blocks == r as u64)
                        || self.unrepaired.get(&r).is_some_and(|&until| now < until)
                };
                let next = l.dirty.iter().copied().find(|r| {
                    !l.chunks.contains(r)
                        && !l.copying.contains(r)
                        && region_inflight[*r] == 0
                        && !repairing(*r)
                });
                let Some(r) = next else {
                    continue;
                };
                let blocks = self.cfg.region_len(r);
                let bytes = blocks * self.cfg.block_len;
                if urgent {
                    self.unmetered_bytes += bytes;
                } else if !self.bucket.take(bytes) {
                    // Out of tokens: no link gets another copy now.
                    break 'rounds;
                }
                l.copying.insert(r);
                self.last_copy = Some(*n);
                started = true;
                out.disk.push((
                    DiskOp::Read {
                        lba: r as u64 * self.cfg.region_blocks,
                        blocks,
                    },
                    PrimTag::ResyncRead {
                        peer: *n,
                        session: l.session,
                        region: r,
                        gen: self.region_gen[r],
                        charged: !urgent,
                        blocks,
                    },
                ));
            }
            if !started {
                break;
            }
        }
        let (commit, floor) = self.watermarks();
        for (n, l) in self.links.iter_mut() {
            if l.mode == Mode::InSync && l.announce_commit {
                // Every client operation up to `commit` was acknowledged,
                // and the replica holds each one (it was streamed, or its
                // region copied, before the link proposed InSync), so it
                // may claim `commit` as the next client write would tell it.
                l.announce_commit = false;
                let flush =
                    l.stream_flush(self.vol, self.epoch, now, Pend::CommitFlush, commit, floor);
                out.sends.push((Endpoint::Node(*n), flush));
            }
            if l.mode == Mode::Resyncing && l.dirty.is_empty() && !l.head_diff {
                l.mode = Mode::Finishing;
                let flush = l.stream_flush(self.vol, self.epoch, now, Pend::FinalFlush, 0, floor);
                out.sends.push((Endpoint::Node(*n), flush));
            }
        }
    }
}
