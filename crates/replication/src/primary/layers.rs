//! Snapshot layers of a replicated volume, the primary's half
//! (`docs/simulation.md`, "Snapshots of replicated volumes"): snapshots,
//! layer deletions and rollbacks as barriers in the stream, and the
//! rebuild of the layers a replica lacks.
//!
//! Invariants:
//! - a snapshot is streamed, at its place in the stream, only to links
//!   whose copy equals this one there (InSync with nothing dirty,
//!   Finishing, Joining); a link being resynced that misses it is failed,
//!   one rebuilding its layers adds it to what it builds, and the snapshot
//!   is acknowledged like a FUA write (so every replica InSync in the
//!   record holds it, or was marked OutOfSync first);
//! - a link is made InSync only once it holds exactly this node's layers:
//!   at each `Start` the replica names its layers; extras are deleted, and
//!   if any layer is missing the link rebuilds (`Mode::Layering`, no
//!   client write streamed to it, writes kept dirty): its head is rebased
//!   onto the newest layer both hold, each missing layer is copied (the
//!   regions `Changed` since the one before) into the head and sealed with
//!   a `Snapshot`, oldest first, and then the head is resynced from the
//!   regions `Changed` since the newest layer, from a point of the stream
//!   after which every write is streamed to it again;
//! - a rollback is a rebase of every replica's head at one point of the
//!   stream, a write of every region for everything else (dirty sets,
//!   logs, copies);
//! - a replica due a full copy (new, or no usable log after a failover)
//!   that keeps some of the layers is rebuilt from the newest of them the
//!   same way, with nothing left to build: only the regions `Changed`
//!   since it are copied, so its head does not copy what its layers hold;
//! - a clone's copies read through its source, a snapshot of another
//!   volume (`Primary::base`), until flattened: a replica reading through
//!   the same one names it first at `Start`, is never asked to delete it,
//!   and when it holds none of the layers (or is due a full copy) is
//!   rebased onto it and rebuilt from it, so only what the clone changed
//!   is copied; a replica reading through another (the primary's copy was
//!   flattened) is asked to delete it, which detaches it. No diff from the
//!   base is taken while a flatten runs here, and a flatten that detaches
//!   this copy fails the links still to diff from it;
//! - a rebuild diffs nothing before its replica acknowledged the rebase
//!   (durable then), and copies, besides the regions of the diff, those
//!   with writes not yet applied here (the diff cannot see them).

use super::{copy_op, is_zero, Kind, Mode, Out, Pend, PrimTag, Primary};
use crate::msg::{decode_regions, ClientReply, ClientReq, DiskOp, ReplOp};
use crate::types::{LayerId, NodeId};
use std::collections::{BTreeSet, VecDeque};

/// A link's rebuild of the snapshot layers its replica lacks.
#[derive(Debug)]
pub(super) struct Build {
    /// The newest layer the replica holds (its head was rebased onto it).
    pub(super) prev: Option<LayerId>,
    /// The layers still to rebuild, oldest first.
    pub(super) todo: VecDeque<LayerId>,
    /// The regions of `todo`'s first layer still to copy (None: not known
    /// yet).
    pub(super) regions: Option<BTreeSet<usize>>,
    /// The `Changed` of `todo`'s first layer is in flight here.
    pub(super) diffing: bool,
    /// Regions being read here, and sent and not yet acknowledged.
    pub(super) copying: BTreeSet<usize>,
    pub(super) sent: BTreeSet<usize>,
    /// The sealing `Snapshot` is sent and not yet acknowledged.
    pub(super) sealing: bool,
    /// The `Rebase` that started it is not acknowledged yet.
    pub(super) rebasing: bool,
}

impl Build {
    pub(super) fn copies_in_flight(&self) -> usize {
        self.copying.len() + self.sent.len()
    }
}

impl Primary {
    /// This copy stopped reading through its base (a flatten detached
    /// it): rebuilds that would still diff from it start again (their
    /// replicas are asked to drop it at their next `Start`).
    pub(crate) fn drop_base(&mut self) {
        let Some(base) = self.base.take() else {
            return;
        };
        let building: Vec<NodeId> = self
            .links
            .iter()
            .filter(|(_, l)| l.build.as_ref().is_some_and(|b| b.prev == Some(base)))
            .map(|(n, _)| *n)
            .collect();
        for n in building {
            self.link_failed(n);
        }
    }

    /// A snapshot, layer deletion or rollback (see the module's
    /// invariants on layers).
    pub(super) fn on_layer_request(
        &mut self,
        now: u64,
        id: u64,
        req: ClientReq,
        layer: LayerId,
        out: &mut Out,
    ) {
        let held = self.layers.contains(&layer);
        let (by, epoch) = (self.me, self.epoch);
        match req {
            // A retry of a snapshot taken, or of a deletion done (here, or
            // by a primary before this one): answered as a flush is, once
            // this node and every replica the ack rule counts hold it
            // durably. Answered at once, it could name a snapshot only
            // this node holds, or one whose barrier is still on its way.
            ClientReq::Snapshot { .. } | ClientReq::DeleteSnapshot { .. }
                if held == matches!(req, ClientReq::Snapshot { .. }) =>
            {
                return self.serve(now, id, ClientReq::Flush, false, out);
            }
            ClientReq::Rollback { .. } if !held => {
                return self.reply(id, ClientReply::NoSuchLayer { by, epoch }, out);
            }
            _ => {}
        }
        let (commit, floor) = self.watermarks();
        let vseq = self.next_vseq;
        self.next_vseq += 1;
        let marks = (vseq, commit, floor);
        let peers: Vec<NodeId> = self.links.keys().copied().collect();
        let mut sent = BTreeSet::new();
        let (kind, regions, disk) = match req {
            ClientReq::Snapshot { .. } => {
                self.layers.push(layer);
                for n in peers {
                    let Some(l) = self.links.get_mut(&n) else {
                        continue;
                    };
                    let broken = self.cfg.snapshot_resyncing_replicas && l.mode == Mode::Resyncing;
                    if l.holds_head() || broken {
                        self.stream_op(n, now, marks, &[], ReplOp::Snapshot { layer }, out);
                        sent.insert(n);
                    } else if let Some(b) = l.build.as_mut() {
                        b.todo.push_back(layer);
                    } else if l.mode.streams() || l.mode == Mode::InSync {
                        // Being copied to: its copy of the head is not this
                        // one yet. It rebuilds the layer when it starts again.
                        self.link_failed(n);
                    }
                }
                (Kind::Layer, Vec::new(), DiskOp::Snapshot { layer })
            }
            ClientReq::DeleteSnapshot { .. } => {
                self.layers.retain(|l| *l != layer);
                for n in peers {
                    let Some(l) = self.links.get_mut(&n) else {
                        continue;
                    };
                    if let Some(b) = l.build.as_mut() {
                        if b.todo.front() == Some(&layer) || b.prev == Some(layer) {
                            // Being read here, or the base of the next one.
                            self.link_failed(n);
                            continue;
                        }
                        if b.todo.contains(&layer) {
                            b.todo.retain(|x| *x != layer);
                            continue;
                        }
                    } else if !l.mode.streams() {
                        // Deleted there when it starts again.
                        continue;
                    }
                    self.stream_op(n, now, marks, &[], ReplOp::DeleteLayer { layer }, out);
                    sent.insert(n);
                }
                (Kind::Background, Vec::new(), DiskOp::DeleteLayer { layer })
            }
            _ => {
                // A rollback changes every region.
                let regions: Vec<usize> = (0..self.region_gen.len()).collect();
                self.written.extend(regions.iter().copied());
                self.own.on_repl(vseq, commit, floor, &regions);
                for r in &regions {
                    self.region_gen[*r] += 1;
                    self.region_inflight[*r] += 1;
                }
                for n in peers {
                    let Some(l) = self.links.get_mut(&n) else {
                        continue;
                    };
                    // Neither a replica rebuilding its layers nor one that
                    // has not named them yet may lack the layer for long:
                    // they start again.
                    if l.build.is_some() || l.mode == Mode::Starting {
                        self.link_failed(n);
                        if let Some(l) = self.links.get_mut(&n) {
                            l.dirty.extend(regions.iter().copied());
                        }
                    } else if l.mode.streams() {
                        let op = ReplOp::Rebase { onto: Some(layer) };
                        self.stream_op(n, now, marks, &regions, op, out);
                        sent.insert(n);
                    } else {
                        l.dirty.extend(regions.iter().copied());
                    }
                }
                let disk = DiskOp::Rebase { onto: Some(layer) };
                (Kind::Write, regions, disk)
            }
        };
        self.queue_op(id, vseq, kind, sent, regions, None, disk, out);
    }

    /// A replica that started a stream holds `theirs`, not this node's
    /// layers: the layers it holds that are not a prefix of this node's are
    /// deleted there, and if it lacks any, its head is rebased onto the
    /// newest it keeps and its rebuild is set up (returns true: the link
    /// rebuilds, see the module's invariants). `base.0`: its copy reads
    /// through this one's base, which it then keeps, and is rebased onto
    /// if it holds none of the layers; `base.1`: it is due a full copy,
    /// which a rebuild from the newest layer it keeps (or the base)
    /// replaces even if it lacks none.
    pub(super) fn start_layers(
        &mut self,
        now: u64,
        n: NodeId,
        theirs: &[LayerId],
        base: (bool, bool),
        out: &mut Out,
    ) -> bool {
        let kept = self
            .layers
            .iter()
            .take_while(|l| theirs.contains(l))
            .count();
        let prefix = &self.layers[..kept];
        let delete: Vec<LayerId> = theirs
            .iter()
            .filter(|l| !prefix.contains(l))
            .copied()
            .collect();
        for layer in delete {
            self.stream_step(n, now, Pend::LayerStep, ReplOp::DeleteLayer { layer }, out);
        }
        let (their_base, thin) = base;
        let holds_base = their_base && kept == 0;
        if kept == self.layers.len() && !(thin && (kept > 0 || holds_base)) {
            return false;
        }
        let prev = match kept.checked_sub(1) {
            Some(i) => Some(self.layers[i]),
            None if holds_base => self.base,
            None => None,
        };
        let todo = self.layers[kept..].iter().copied().collect();
        self.stream_step(
            n,
            now,
            Pend::LayerRebase,
            ReplOp::Rebase { onto: prev },
            out,
        );
        let all = 0..self.region_gen.len();
        if let Some(l) = self.links.get_mut(&n) {
            // Rebased, its head may differ anywhere (all of it is copied if
            // the rebuild fails); once rebuilt, only where this one differs
            // from the newest layer.
            l.dirty.extend(all);
            l.narrow = false;
            l.build = Some(Build {
                prev,
                todo,
                regions: None,
                diffing: false,
                copying: BTreeSet::new(),
                sent: BTreeSet::new(),
                sealing: false,
                rebasing: true,
            });
        }
        true
    }

    /// The next steps of every layer rebuild that take no copy: the
    /// regions of the next layer, its seal once every copy of it is in,
    /// and at the end the regions of the head (from then on, client writes
    /// are streamed to the link). Copies go with the resync copies
    /// (`build_copy`).
    pub(super) fn build_steps(&mut self, now: u64, out: &mut Out) {
        let peers: Vec<NodeId> = self.links.keys().copied().collect();
        // A diff from the base waits for a flatten here to end: one that
        // detaches this copy takes the base away (and fails the link).
        let base_held = match self.base {
            Some(base) => {
                Some(base).filter(|_| !self.ops.values().any(|o| o.flatten && !o.local_done))
            }
            None => None,
        };
        for n in peers {
            let Some(l) = self.links.get_mut(&n) else {
                continue;
            };
            let session = l.session;
            let Some(b) = l.build.as_mut() else {
                continue;
            };
            if b.diffing || b.sealing || b.rebasing {
                continue;
            }
            if b.prev.is_some() && b.prev == self.base && base_held.is_none() {
                continue;
            }
            let Some(&layer) = b.todo.front() else {
                // Every layer is in: the head is copied where it differs
                // from the newest, and client writes streamed from here.
                let from = b.prev;
                l.build = None;
                // The diff sees the writes applied here; those still in
                // flight (streamed before the rebase that wiped them, or
                // kept from the link while it built) are copied as well.
                l.dirty.clear();
                l.dirty.extend(
                    self.region_inflight
                        .iter()
                        .enumerate()
                        .filter(|(_, n)| **n > 0)
                        .map(|(r, _)| r),
                );
                l.head_diff = true;
                l.mode = Mode::Resyncing;
                let op = DiskOp::Changed {
                    from,
                    to: None,
                    region_blocks: self.cfg.region_blocks,
                };
                out.disk.push((op, PrimTag::HeadDiff { peer: n, session }));
                continue;
            };
            match b.regions.as_ref() {
                None => {
                    b.diffing = true;
                    let op = DiskOp::Changed {
                        from: b.prev,
                        to: Some(layer),
                        region_blocks: self.cfg.region_blocks,
                    };
                    out.disk.push((op, PrimTag::LayerDiff { peer: n, session }));
                }
                Some(regions) if regions.is_empty() && b.copies_in_flight() == 0 => {
                    b.sealing = true;
                    self.stream_step(n, now, Pend::LayerSeal, ReplOp::Snapshot { layer }, out);
                }
                Some(_) => {}
            }
        }
    }

    /// Starts the next copy of the layer link `n` rebuilds, if one is due
    /// and the in-flight limit allows: Some(false) if the rate bucket
    /// refused it, Some(true) if started, None if none was due.
    pub(super) fn build_copy(&mut self, n: NodeId, urgent: bool, out: &mut Out) -> Option<bool> {
        let limit = self.cfg.resync_inflight.max(1);
        let l = self.links.get_mut(&n)?;
        let session = l.session;
        let b = l.build.as_mut().filter(|b| !b.sealing && !b.diffing)?;
        if b.copies_in_flight() >= limit {
            return None;
        }
        let layer = *b.todo.front()?;
        let r = b
            .regions
            .as_ref()?
            .iter()
            .copied()
            .find(|r| !b.copying.contains(r) && !b.sent.contains(r))?;
        let blocks = self.cfg.region_len(r);
        let bytes = blocks * self.cfg.block_len;
        if urgent {
            self.unmetered_bytes += bytes;
        } else if !self.bucket.take(bytes) {
            return Some(false);
        }
        b.copying.insert(r);
        let lba = r as u64 * self.cfg.region_blocks;
        let tag = PrimTag::LayerRead {
            peer: n,
            session,
            region: r,
            charged: !urgent,
            blocks,
        };
        out.disk
            .push((DiskOp::ReadLayer { layer, lba, blocks }, tag));
        Some(true)
    }

    /// A local step of a layer rebuild completed (`data`: a `Changed`'s
    /// regions or a layer read's blocks).
    pub(super) fn on_build_done(
        &mut self,
        now: u64,
        tag: PrimTag,
        data: Option<Vec<u8>>,
        out: &mut Out,
    ) {
        let peer = match tag {
            PrimTag::LayerDiff { peer, .. }
            | PrimTag::LayerRead { peer, .. }
            | PrimTag::HeadDiff { peer, .. } => peer,
            _ => return,
        };
        let total = self.region_gen.len();
        let Some(l) = self.links.get_mut(&peer) else {
            return;
        };
        match tag {
            PrimTag::HeadDiff { session, .. } if l.session == session && l.head_diff => {
                l.head_diff = false;
                let regions = decode_regions(data.as_deref().unwrap_or_default());
                l.dirty.extend(
                    regions
                        .into_iter()
                        .map(|r| r as usize)
                        .filter(|r| *r < total),
                );
            }
            PrimTag::LayerDiff { session, .. } if l.session == session => {
                if let Some(b) = l.build.as_mut().filter(|b| b.diffing) {
                    b.diffing = false;
                    let regions = decode_regions(data.as_deref().unwrap_or_default());
                    b.regions = Some(
                        regions
                            .into_iter()
                            .map(|r| r as usize)
                            .filter(|r| *r < total)
                            .collect(),
                    );
                }
            }
            PrimTag::LayerRead {
                session,
                region,
                charged,
                blocks,
                ..
            } if l.session == session => {
                let Some(b) = l.build.as_mut() else {
                    return;
                };
                if !b.copying.remove(&region) {
                    return;
                }
                let data = data.unwrap_or_default();
                let zero = is_zero(&data);
                if zero && charged {
                    let reserved = blocks * self.cfg.block_len;
                    self.bucket
                        .refund(reserved - self.cfg.zero_copy_cost(reserved));
                }
                b.sent.insert(region);
                let op = copy_op(region as u64 * self.cfg.region_blocks, blocks, data, zero);
                self.stream_step(peer, now, Pend::LayerChunk(region), op, out);
            }
            _ => {}
        }
    }
}
