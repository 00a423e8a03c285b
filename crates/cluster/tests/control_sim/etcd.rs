//! The simulated etcd: revisions, the catalog and the membership records,
//! the election key with its lease, transactions fenced by the writer's
//! election revision, per-node watch streams in revision order, and the
//! catalog's client (the API creating and deleting volumes).

use super::*;

impl Sim {
    /// etcd changed a key: the change joins every live node's watch stream
    /// in revision order, due after 1–20 ms (or when a stall ends).
    pub(super) fn publish(&mut self, mk: impl Fn() -> Change2, stream: Stream) {
        let rev = self.rev;
        for node in 0..self.nodes.len() {
            if !self.nodes[node].up {
                continue;
            }
            let s = stream as usize;
            let last = self.nodes[node].queue[s].back().map_or(0, |q| q.1);
            let due = (self.now + 1 + self.rng.below(20))
                .max(last)
                .max(self.nodes[node].stalled_until[s]);
            self.nodes[node].queue[s].push_back((rev, due, mk()));
            let boot = self.nodes[node].boot;
            self.at(due - self.now, Ev::Watch { node, boot, stream });
        }
    }

    pub(super) fn put_record(&mut self, rec: Membership) {
        self.trace(format!("etcd: {rec:?}"));
        self.rev += 1;
        let vol = rec.volume;
        self.records.insert(vol, (rec.clone(), self.rev));
        self.publish(
            move || Change2::Record(vol, Some(rec.clone())),
            Stream::Records,
        );
    }

    pub(super) fn fenced(&mut self, term: u64) -> bool {
        self.expire_election();
        self.election.as_ref().is_none_or(|e| e.rev != term)
    }

    pub(super) fn etcd(&mut self, node: usize, inc: u64, term: u64, w: Write) {
        let outcome = if self.fenced(term) {
            Outcome::Fenced
        } else {
            match &w {
                Write::Change(ch) => self.cas(ch.expected, ch.record.clone()),
                Write::Create(rec) => match self.records.get(&rec.volume) {
                    Some((cur, _)) => Outcome::Conflict(Some(cur.clone())),
                    None => {
                        let n = self.placements.entry(rec.volume).or_default();
                        *n += 1;
                        if *n > 1 && self.catalog.contains_key(&rec.volume) {
                            self.fail(format!(
                                "volume {:?} placed a second time while in the catalog",
                                rec.volume
                            ));
                        }
                        self.seen.creates += 1;
                        self.trace(format!(
                            "etcd: record of {:?} created by n{node}",
                            rec.volume
                        ));
                        self.put_record(rec.clone());
                        Outcome::Applied(Some(rec.clone()))
                    }
                },
                Write::Delete { vol, mod_rev } => match self.records.get(vol) {
                    Some((_, rev))
                        if *rev == *mod_rev || self.bug == Some(Bug::OrphanFromStaleCatalog) =>
                    {
                        if self.catalog.contains_key(vol) {
                            self.fail(format!(
                                "n{node} deleted the record of {vol:?}, which is still in the catalog"
                            ));
                        }
                        self.seen.deletes += 1;
                        self.rev += 1;
                        self.records.remove(vol);
                        let v = *vol;
                        self.publish(move || Change2::Record(v, None), Stream::Records);
                        Outcome::Applied(None)
                    }
                    Some((cur, _)) => Outcome::Conflict(Some(cur.clone())),
                    None => Outcome::Conflict(None),
                },
            }
        };
        let d = self.net_delay();
        self.at(
            d,
            Ev::EtcdAnswer {
                node,
                inc,
                w,
                outcome,
            },
        );
    }

    /// etcd's compare-and-swap of a record (`Membership::check_change`
    /// applies, as in `ClusterMeta::cas_membership`).
    pub(super) fn cas(&mut self, expected: u64, mut record: Membership) -> Outcome {
        let Some((cur, _)) = self.records.get(&record.volume) else {
            return Outcome::Conflict(None);
        };
        if cur.version != expected {
            return Outcome::Conflict(Some(cur.clone()));
        }
        if cur.check_change(&record).is_err() {
            return Outcome::Invalid;
        }
        if record.epoch != cur.epoch {
            self.seen.failovers += 1;
        }
        record.version = expected + 1;
        self.put_record(record.clone());
        Outcome::Applied(Some(record))
    }

    pub(super) fn expire_election(&mut self) {
        if self
            .election
            .as_ref()
            .is_some_and(|e| e.expires <= self.now)
        {
            self.election = None;
        }
    }

    pub(super) fn api(&mut self) {
        let live: Vec<VolumeId> = self.catalog.keys().copied().collect();
        if !live.is_empty() && (live.len() >= MAX_VOLUMES || self.rng.chance(250)) {
            let vol = live[self.rng.below(live.len() as u64) as usize];
            self.rev += 1;
            self.catalog.remove(&vol);
            self.trace(format!("api: volume {vol:?} deleted"));
            self.publish(move || Change2::Catalog(vol, None), Stream::Catalog);
        } else if !live.is_empty() && self.rng.chance(200) {
            // A retype: the volume wants another replica count.
            let vol = live[self.rng.below(live.len() as u64) as usize];
            let mut rec = self.catalog[&vol].clone();
            rec.replicas = Some(1 + self.rng.below(3) as u32);
            self.rev += 1;
            self.catalog.insert(vol, rec.clone());
            self.seen.retypes += 1;
            self.trace(format!(
                "api: volume {vol:?} retyped ({:?} replicas)",
                rec.replicas
            ));
            self.publish(
                move || Change2::Catalog(vol, Some(Box::new(rec.clone()))),
                Stream::Catalog,
            );
        } else if live.len() < MAX_VOLUMES {
            let vol = VolumeId(self.next_volume);
            self.next_volume += 1;
            let mut rec = VolumeRecord::new(
                uuid::Uuid::from_u128(vol.0),
                format!("v{}", vol.0),
                BLOCKS * BLOCK_SIZE,
                std::time::UNIX_EPOCH,
            );
            rec.replicas = Some(1 + self.rng.below(3) as u32);
            self.rev += 1;
            self.catalog.insert(vol, rec.clone());
            self.trace(format!(
                "api: volume {vol:?} created ({:?} replicas)",
                rec.replicas
            ));
            self.publish(
                move || Change2::Catalog(vol, Some(Box::new(rec.clone()))),
                Stream::Catalog,
            );
        }
        let d = if self.faulty_phase() {
            20 + self.rng.below(200)
        } else {
            400 + self.rng.below(400)
        };
        if self.now + d < self.end - 3_000 {
            self.at(d, Ev::Api);
        }
    }

    pub(super) fn node_cas(&mut self, node: usize, boot: u64, expected: u64, record: Membership) {
        let vol = record.volume;
        let (record, ok) = match self.cas(expected, record) {
            Outcome::Applied(Some(rec)) => (Some(rec), true),
            _ => (self.records.get(&vol).map(|(r, _)| r.clone()), false),
        };
        if let Some(record) = record {
            let d = self.net_delay();
            self.meta_reply(node, boot, record, Some(ok), d);
        }
    }
}
