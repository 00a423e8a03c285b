//! A secondary's memory of the writes it received in one epoch that are
//! not known to be on every in-sync replica ("uncertain regions"), so that
//! after a failover a new primary resyncs only those regions (DRBD's
//! activity log, Raft's commit index).
//!
//! Job: from the `commit` and `floor` watermarks the primary piggybacks on
//! every `Repl`, keep the regions of every write or copy received above the
//! highest `floor`, and the highest `commit` received (`synced`). A primary
//! keeps one of its own writes the same way, reported when it is deposed.
//!
//! Invariants (the argument is in `docs/simulation.md`, "Failover
//! resync"):
//! - a region is in the log iff a write or copy of it above the highest
//!   `floor` was received (only its highest `vseq` is kept, so the log
//!   holds at most one entry per region however long the floor stays put:
//!   the primary holds the floor back while a replica is out of sync);
//! - entries are dropped only when the `floor` passes them, or on
//!   overflow; after an overflow the log is usable again only once a
//!   `floor` reaches the highest `vseq` dropped;
//! - at most `limit` regions are kept.
//!
//! Kept in memory; a node stopped cleanly saves its logs ([`SavedLog`])
//! after its disk is flushed and restores them when it starts again (see
//! `Node::save_logs`). With `Config::crash_log_regions`, the node also
//! keeps a crash-safe copy ([`Uncertain::crash_save`]): a superset of the
//! regions, every entry at vseq `u64::MAX` (never dropped by a floor, in
//! every `regions_above`), and for a primary's own log `synced = u64::MAX`
//! (a deposed primary applied every write it acknowledged; the new primary
//! adds its own regions above its own `synced` instead, for the writes the
//! deposed one sent but never applied: see docs/simulation.md, "Crash
//! logs"). Without either, a node that crashed is fully resynced after a
//! failover.

use crate::msg::Prior;
use crate::types::Epoch;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// An uncertain-region log as a cleanly stopped node keeps it on disk.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedLog {
    pub epoch: Epoch,
    pub synced: u64,
    pub floor: u64,
    /// Entries up to this vseq were dropped on overflow.
    pub overflow: Option<u64>,
    /// (region, its highest vseq above `floor`).
    pub regions: Vec<(u32, u64)>,
    /// The log of a primary's own writes (kept when it was deposed).
    #[serde(default)]
    pub own: bool,
    /// False for a log begun in the middle of its epoch by a node that
    /// restarted without any log (see [`Uncertain`]'s `complete`).
    #[serde(default = "complete_by_default")]
    pub complete: bool,
}

fn complete_by_default() -> bool {
    true
}

impl SavedLog {
    /// Names `regions` too, each at vseq `u64::MAX` as
    /// [`Uncertain::crash_save`] names them: a crash-safe copy not written
    /// yet taking the regions of writes submitted after it. `regions` stays
    /// sorted by region.
    pub(crate) fn name_regions(&mut self, regions: impl Iterator<Item = usize>) {
        for r in regions {
            let r = r as u32;
            if let Err(at) = self.regions.binary_search_by_key(&r, |(region, _)| *region) {
                self.regions.insert(at, (r, u64::MAX));
            }
        }
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Uncertain {
    pub(crate) epoch: Epoch,
    /// The highest `commit` received (0: none).
    pub(crate) synced: u64,
    /// The highest `floor` received.
    pub(crate) floor: u64,
    /// Writes and copies received above `floor`: vseq → regions whose
    /// highest vseq it is.
    log: BTreeMap<u64, Vec<usize>>,
    /// region → its vseq in `log` (the index that keeps one entry per
    /// region).
    latest: BTreeMap<usize, u64>,
    /// Entries up to this vseq were dropped on overflow.
    overflow: Option<u64>,
    limit: usize,
    /// A primary's own writes, not a received stream.
    pub(crate) own: bool,
    /// Whether the log holds every write of its epoch this node received.
    /// A node that restarts with no logs at all (a crash without a
    /// crash-safe copy) begins one on its new stream, but it may hold
    /// writes of the epoch received before, durably and so never copied
    /// again, that the new log lacks: such a log answers no
    /// `regions_above` (a new primary promoted from it resyncs the others
    /// fully).
    pub(crate) complete: bool,
}

impl Uncertain {
    pub(crate) fn new(epoch: Epoch, limit: usize) -> Self {
        Uncertain {
            epoch,
            synced: 0,
            floor: 0,
            log: BTreeMap::new(),
            latest: BTreeMap::new(),
            overflow: None,
            limit: limit.max(1),
            own: false,
            complete: true,
        }
    }

    /// Marks the log as a primary's own.
    pub(crate) fn owned(mut self) -> Self {
        self.own = true;
        self
    }

    /// The regions in the log.
    pub(crate) fn regions(&self) -> impl Iterator<Item = usize> + '_ {
        self.latest.keys().copied()
    }

    /// The log as the crash-safe copy keeps it, with `extra` regions (those
    /// of writes not yet flushed, and of the hot set) added: every entry at
    /// vseq `u64::MAX`, and a primary's own log with `synced = u64::MAX`.
    pub(crate) fn crash_save(&self, extra: &BTreeSet<usize>) -> SavedLog {
        let mut saved = self.save();
        if self.own {
            saved.synced = u64::MAX;
        }
        for (_, vseq) in &mut saved.regions {
            *vseq = u64::MAX;
        }
        saved.name_regions(extra.iter().copied());
        saved
    }

    /// A `Repl` of this epoch was received: `regions` written by it (empty
    /// for a flush or a start).
    pub(crate) fn on_repl(&mut self, vseq: u64, commit: u64, floor: u64, regions: &[usize]) {
        if vseq > self.floor {
            for &r in regions {
                match self.latest.get(&r).copied() {
                    // Entries may arrive out of order: keep the highest.
                    Some(v) if v >= vseq => continue,
                    Some(v) => self.unlog(v, r),
                    None => {}
                }
                self.latest.insert(r, vseq);
                self.log.entry(vseq).or_default().push(r);
            }
        }
        self.advance(commit, floor);
        if self.latest.len() > self.limit {
            let top = self.log.keys().next_back().copied().unwrap_or(0);
            self.overflow = Some(self.overflow.unwrap_or(0).max(top));
            self.log.clear();
            self.latest.clear();
        }
    }

    /// The watermarks moved to (`commit`, `floor`); lower ones change
    /// nothing.
    pub(crate) fn advance(&mut self, commit: u64, floor: u64) {
        self.synced = self.synced.max(commit);
        if floor > self.floor {
            self.floor = floor;
            let kept = self.log.split_off(&floor.saturating_add(1));
            for (v, regions) in std::mem::replace(&mut self.log, kept) {
                for r in regions {
                    if self.latest.get(&r) == Some(&v) {
                        self.latest.remove(&r);
                    }
                }
            }
            if self.overflow.is_some_and(|v| v <= floor) {
                self.overflow = None;
            }
        }
    }

    fn unlog(&mut self, vseq: u64, region: usize) {
        if let Some(rs) = self.log.get_mut(&vseq) {
            rs.retain(|r| *r != region);
            if rs.is_empty() {
                self.log.remove(&vseq);
            }
        }
    }

    pub(crate) fn save(&self) -> SavedLog {
        SavedLog {
            epoch: self.epoch,
            synced: self.synced,
            floor: self.floor,
            overflow: self.overflow,
            regions: self.latest.iter().map(|(r, v)| (*r as u32, *v)).collect(),
            own: self.own,
            complete: self.complete,
        }
    }

    pub(crate) fn restore(saved: &SavedLog, limit: usize) -> Self {
        let mut u = Uncertain::new(saved.epoch, limit);
        u.synced = saved.synced;
        u.floor = saved.floor;
        u.overflow = saved.overflow;
        u.own = saved.own;
        u.complete = saved.complete;
        for &(r, v) in &saved.regions {
            if v > u.floor && u.latest.insert(r as usize, v).is_none() {
                u.log.entry(v).or_default().push(r as usize);
            }
        }
        if u.latest.len() > u.limit {
            let top = u.log.keys().next_back().copied().unwrap_or(0);
            u.overflow = Some(u.overflow.unwrap_or(0).max(top));
            u.log.clear();
            u.latest.clear();
        }
        u
    }

    /// Whether entries were dropped on overflow (then nothing is usable).
    #[cfg(test)]
    pub(crate) fn overflowed(&self) -> bool {
        self.overflow.is_some()
    }

    /// Regions of the entries above `x`, or None if they are not all known
    /// (`x` below the floor, or an entry above `x` dropped on overflow).
    pub(crate) fn regions_above(&self, x: u64) -> Option<BTreeSet<usize>> {
        if !self.complete || x < self.floor || self.overflow.is_some_and(|v| v > x) {
            return None;
        }
        Some(
            self.log
                .range(x.saturating_add(1)..)
                .flat_map(|(_, r)| r.iter().copied())
                .collect(),
        )
    }

    /// What to tell a new primary; None if the log overflowed.
    pub(crate) fn report(&self) -> Option<Prior> {
        let regions = self.regions_above(self.floor)?;
        Some(Prior {
            epoch: self.epoch,
            synced: self.synced,
            regions: regions.into_iter().map(|r| r as u32).collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floor_forgets_and_commit_is_remembered() {
        let mut u = Uncertain::new(Epoch(3), 100);
        u.on_repl(5, 0, 0, &[1]);
        u.on_repl(6, 4, 2, &[2, 3]);
        u.on_repl(7, 5, 5, &[4]);
        assert_eq!(u.synced, 5);
        let p = u.report().unwrap();
        assert_eq!(p.epoch, Epoch(3));
        assert_eq!(p.regions, vec![2, 3, 4], "vseq 5 is at the floor");
        assert_eq!(u.regions_above(6), Some(BTreeSet::from([4])));
        assert_eq!(u.regions_above(4), None, "below the floor: forgotten");
        // A stale (lower) floor changes nothing.
        u.on_repl(8, 3, 1, &[]);
        assert_eq!(u.floor, 5);
        assert_eq!(u.synced, 5);
    }

    #[test]
    fn a_region_written_again_is_kept_once_at_its_highest_vseq() {
        let mut u = Uncertain::new(Epoch(2), 2);
        for v in 1..=100 {
            u.on_repl(v, 0, 0, &[(v % 2) as usize]);
        }
        assert!(!u.overflowed(), "two regions, however many writes");
        assert_eq!(u.regions_above(98), Some(BTreeSet::from([0, 1])));
        assert_eq!(u.regions_above(99), Some(BTreeSet::from([0])));
        // An older write arriving late changes nothing.
        u.on_repl(50, 0, 0, &[1]);
        assert_eq!(u.regions_above(99), Some(BTreeSet::from([0])));
        // The floor passing a region's highest write forgets it.
        u.on_repl(101, 99, 99, &[]);
        assert_eq!(u.report().unwrap().regions, vec![0]);
        assert_eq!(u.latest.len(), 1);
    }

    #[test]
    fn a_saved_log_restores_to_the_same_answers() {
        let mut u = Uncertain::new(Epoch(4), 100);
        u.on_repl(3, 0, 0, &[1, 2]);
        u.on_repl(5, 2, 2, &[2]);
        u.on_repl(6, 4, 3, &[7]);
        let back = Uncertain::restore(&u.save(), 100);
        assert_eq!(back.report(), u.report());
        for x in 0..8 {
            assert_eq!(back.regions_above(x), u.regions_above(x), "above {x}");
        }
        assert_eq!(back.save(), u.save());
    }

    #[test]
    fn overflow_falls_back_until_the_floor_passes_it() {
        let mut u = Uncertain::new(Epoch(1), 2);
        u.on_repl(1, 0, 0, &[0]);
        u.on_repl(2, 0, 0, &[1]);
        assert!(u.report().is_some());
        u.on_repl(3, 0, 0, &[2]);
        assert!(u.overflowed());
        assert_eq!(u.report(), None, "three entries over a limit of two");
        u.on_repl(4, 1, 1, &[3]);
        assert_eq!(u.report(), None, "entries 2 and 3 were dropped");
        assert_eq!(u.regions_above(3).map(|s| s.len()), Some(1));
        u.on_repl(5, 3, 3, &[4]);
        assert!(!u.overflowed());
        assert_eq!(u.report().unwrap().regions, vec![3, 4]);
    }
}
