//! Read repair and replica compares, the primary's half: blocks whose
//! copy here fails its checksum are read from an in-sync replica and
//! rewritten here; a compare's checksums decide which replicas' copies are
//! rewritten from this one.
//!
//! Invariants:
//! - a repair read's data is used only if no write to its regions was
//!   issued here since the replica was asked, and the replica reads only
//!   after applying every entry streamed to it before the request;
//! - a compare is checksummed at the same point of the stream here and on
//!   every InSync link it was sent to; a link whose checksum differs from
//!   this copy's (read with its checksums verified, or repaired) gets the
//!   compared regions in its dirty set and is copied to like a resyncing
//!   link, while it stays InSync.

use super::{Kind, Mode, Op, Out, PrimTag, Primary};
use crate::msg::{Compared, DiskOp, Endpoint, Msg};
use crate::payload::Payload;
use crate::types::{Epoch, NodeId};
use std::collections::BTreeSet;

/// Blocks whose local copy failed its checksum, being read from an in-sync
/// replica (`RepairRead`).
pub(super) struct Repair {
    /// The client read waiting for them (its vseq), if any.
    pub(super) op: Option<u64>,
    pub(super) lba: u64,
    pub(super) blocks: u64,
    /// The generation of each region the blocks cover when the replica
    /// last asked was asked (it reads after applying every entry sent to
    /// it by then): the local copy is rewritten only if no write was issued
    /// to them since.
    pub(super) gens: Vec<(usize, u64)>,
    /// Replicas asked so far, and when the last was asked.
    pub(super) asked: BTreeSet<NodeId>,
    pub(super) asked_at: u64,
}

impl Primary {
    /// A read's data failed its checksum here: the blocks are asked of an
    /// in-sync replica (a client read waits for them; a resync copy is
    /// dropped and its region read again once the copy here is rewritten).
    pub(crate) fn on_disk_corrupt(&mut self, now: u64, tag: PrimTag, out: &mut Out) {
        let (op, lba, blocks) = match tag {
            PrimTag::Op(v) => match self.ops.get_mut(&v) {
                Some(o) => match o.read {
                    Some((lba, blocks)) => (Some(v), lba, blocks),
                    // A read of a snapshot layer (`ClientReq::ReadLayer`):
                    // no replica is asked (repairs read heads).
                    None => {
                        if o.kind == Kind::Read {
                            o.unreadable = true;
                            o.local_done = true;
                        }
                        return;
                    }
                },
                None => return,
            },
            PrimTag::ResyncRead {
                peer,
                session,
                region,
                blocks,
                ..
            } => {
                if let Some(l) = self.links.get_mut(&peer) {
                    if l.session == session {
                        l.copying.remove(&region);
                    }
                }
                (None, region as u64 * self.cfg.region_blocks, blocks)
            }
            // A snapshot layer's block failed its checksum here: no replica
            // is asked (repairs read heads); the region is read again later.
            PrimTag::LayerRead {
                peer,
                session,
                region,
                ..
            } => {
                if let Some(b) = self
                    .links
                    .get_mut(&peer)
                    .filter(|l| l.session == session)
                    .and_then(|l| l.build.as_mut())
                {
                    b.copying.remove(&region);
                }
                return;
            }
            PrimTag::Rewrite | PrimTag::LayerDiff { .. } | PrimTag::HeadDiff { .. } => return,
        };
        // Set again whenever a replica is asked (`ask_repair`).
        let gens = self
            .regions_of(lba, blocks)
            .into_iter()
            .map(|r| (r, self.region_gen[r]))
            .collect();
        let id = self.next_repair;
        self.next_repair += 1;
        self.repairs.insert(
            id,
            Repair {
                op,
                lba,
                blocks,
                gens,
                asked: BTreeSet::new(),
                asked_at: now,
            },
        );
        self.ask_repair(now, id, out);
    }

    /// Asks the next in-sync replica for repair `id`; with none left, a
    /// waiting client read is answered `Unreadable` and the repair dropped.
    pub(super) fn ask_repair(&mut self, now: u64, id: u64, out: &mut Out) {
        let Some(r) = self.repairs.get_mut(&id) else {
            return;
        };
        // An in-sync replica acknowledged every write acknowledged to a
        // client (unless acknowledgements go out before the replicas').
        let next = self
            .links
            .iter()
            .filter(|(n, l)| l.mode == Mode::InSync && !r.asked.contains(n))
            .map(|(n, l)| (*n, l.session, l.next_lseq - 1))
            .next()
            .filter(|_| !self.cfg.ack_before_secondaries);
        match next {
            Some((n, session, after)) => {
                r.asked.insert(n);
                r.asked_at = now;
                // The replica reads once it applied every entry sent to it
                // so far, so its data holds every write issued here until
                // now: the generations to compare with at the answer.
                for (g, gen) in r.gens.iter_mut() {
                    *gen = self.region_gen[*g];
                }
                out.sends.push((
                    Endpoint::Node(n),
                    Msg::RepairRead {
                        vol: self.vol,
                        epoch: self.epoch,
                        id,
                        lba: r.lba,
                        blocks: r.blocks,
                        session,
                        after,
                    },
                ));
            }
            None => {
                let Some(r) = self.repairs.remove(&id) else {
                    return;
                };
                match r.op {
                    Some(v) => {
                        if let Some(op) = self.ops.get_mut(&v) {
                            op.unreadable = true;
                            op.local_done = true;
                        }
                    }
                    None => {
                        let region = (r.lba / self.cfg.region_blocks) as usize;
                        self.unrepaired
                            .insert(region, now + self.cfg.resync_retry_ms);
                    }
                }
            }
        }
    }

    /// A replica's answer to `RepairRead` `id`.
    pub(crate) fn on_repair_data(
        &mut self,
        now: u64,
        from: NodeId,
        epoch: Epoch,
        id: u64,
        data: Option<Vec<u8>>,
        out: &mut Out,
    ) {
        if epoch != self.epoch {
            return;
        }
        let Some(r) = self.repairs.get(&id) else {
            return;
        };
        let len = r.blocks * self.cfg.block_len;
        let usable = r.asked.contains(&from)
            && self
                .links
                .get(&from)
                .is_some_and(|l| l.mode == Mode::InSync);
        let Some(data) = data.filter(|d| usable && d.len() as u64 == len) else {
            self.ask_repair(now, id, out);
            return;
        };
        let Some(r) = self.repairs.remove(&id) else {
            return;
        };
        // Rewrite the copy here only if nothing was written to these
        // regions since the replica was asked (it read after applying every
        // write streamed to it by then, so its data holds them all) and no
        // write to them is unanswered: else a newer write could be
        // overwritten with older data. (The data was once taken without
        // waiting for the stream: a write the network delivered after the
        // request was then erased by the rewrite, found by the simulator
        // when compares changed its histories.)
        let unchanged = r.gens.iter().all(|&(g, gen)| self.region_gen[g] == gen);
        let settled = !self.ops.values().any(|o| {
            o.kind == Kind::Write
                && o.regions
                    .iter()
                    .any(|g| r.gens.iter().any(|&(x, _)| x == *g))
        });
        if unchanged && settled {
            out.disk.push((
                DiskOp::Write {
                    lba: r.lba,
                    data: Payload::copy_from_slice(&data),
                    fua: false,
                },
                PrimTag::Rewrite,
            ));
        }
        if let Some(op) = r.op.and_then(|v| self.ops.get_mut(&v)) {
            op.data = Some(data);
            op.local_done = true;
        }
    }

    /// Repairs unanswered for `ack_timeout_ms` go to the next replica.
    pub(super) fn chase_repairs(&mut self, now: u64, out: &mut Out) {
        let late: Vec<u64> = self
            .repairs
            .iter()
            .filter(|(_, r)| now > r.asked_at + self.cfg.ack_timeout_ms)
            .map(|(id, _)| *id)
            .collect();
        for id in late {
            self.ask_repair(now, id, out);
        }
    }

    /// A compare's outcome: the replicas still InSync whose checksum
    /// differs from this copy's get the regions it covers marked dirty
    /// (copied from here, as a resync copies, at the resync rate); returns
    /// the replicas compared and those, encoded as the reply's data.
    pub(super) fn compared(&mut self, op: &Op) -> Vec<u8> {
        let (Some((lba, blocks)), Some(data)) = (op.read, op.data.as_deref()) else {
            return Compared::default().encode();
        };
        let mine = crate::msg::digest(data);
        let regions = self.regions_of(lba, blocks);
        let mut outcome = Compared::default();
        for (n, theirs) in &op.digests {
            let Some(l) = self.links.get_mut(n).filter(|l| l.mode == Mode::InSync) else {
                continue;
            };
            outcome.replicas.push(*n);
            if *theirs != Some(mine) {
                l.dirty.extend(regions.iter().copied());
                outcome.differing.push(*n);
            }
        }
        outcome.encode()
    }
}
