//! The simulated coordinator task (as `basalt_cluster::coordinator`): the
//! election, the state machine's first view, heartbeat answers while the role
//! is confirmed, and rounds that write the state machine's changes and the
//! placement round's (`basalt_cluster::plan`) creates, deletes and
//! reconfigurations to etcd, fenced.

use super::*;

impl Sim {
    pub(super) fn heartbeats(&mut self, c: usize, from: usize, batch: Vec<(VolumeId, u64, u64)>) {
        let now = self.clock(c);
        let Some(role) = self.nodes[c].coord.as_mut() else {
            return;
        };
        // An unanswered heartbeat lets a primary's lease lapse: the safe
        // side while the role is not confirmed current.
        if now >= role.confirmed + ROLE_TTL * 2 / 3 {
            return;
        }
        let answers: Vec<(VolumeId, Msg)> = batch
            .iter()
            .filter_map(|&(vol, boot, sent_at)| {
                let (_, msg) =
                    role.co
                        .on_heartbeat(now, NodeId(from as u32), boot, sent_at, vol)?;
                Some((vol, msg))
            })
            .collect();
        let boot = self.nodes[from].boot;
        for (vol, msg) in answers {
            let d = self.net_delay();
            self.at(
                d,
                Ev::Deliver {
                    to: from,
                    boot,
                    vol,
                    from: Endpoint::Control,
                    msg,
                },
            );
        }
    }

    pub(super) fn registry(&self) -> Vec<NodeStatus> {
        (0..self.nodes.len())
            .map(|i| node_status(i, self.boots[i], self.alive_until[i] > self.now))
            .collect()
    }

    /// `node` wins the election: the records as etcd has them, every node
    /// heard a third of the role's TTL ago.
    pub(super) fn campaign(&mut self, node: usize) {
        self.rev += 1;
        let term = self.rev;
        self.election = Some(Election {
            holder: node,
            rev: term,
            expires: self.now + ROLE_TTL,
        });
        let known: Vec<NodeId> = (0..self.nodes.len() as u32).map(NodeId).collect();
        // The coordinator's own clock: etcd's lease (`expires`) is on the
        // simulation's.
        let clock = self.clock(node);
        let heard = clock.saturating_sub(ROLE_TTL / 3);
        let mut co = Coordinator::new(LEASE, GRACE, &known, heard);
        if self.bug == Some(Bug::NodeLivenessOnly) {
            co = co.with_bug(CoordinatorBug::NodeLivenessOnly);
        }
        for (rec, _) in self.records.values() {
            co.observe(rec.clone());
        }
        co.expect_replicas(heard);
        let n = &mut self.nodes[node];
        n.coord_inc += 1;
        n.coord = Some(CoordRole {
            co,
            term,
            confirmed: clock,
            inc: n.coord_inc,
            timers: plan::Timers::default(),
            next_placement: clock,
            placing: 0,
        });
        self.seen.elections += 1;
        self.trace(format!("n{node} elected coordinator at revision {term}"));
        for other in 0..self.nodes.len() {
            let d = if self.rng.chance(50) {
                100 + self.rng.below(400)
            } else {
                1 + self.rng.below(30)
            };
            self.at(d, Ev::Learn { node: other });
        }
    }

    pub(super) fn coord_round(&mut self, node: usize) {
        self.expire_election();
        let (etcd_now, now) = (self.now, self.clock(node));
        if let Some(role) = self.nodes[node].coord.as_mut() {
            let mine = self
                .election
                .as_mut()
                .filter(|e| e.holder == node && e.rev == role.term);
            match mine {
                Some(e) => {
                    e.expires = etcd_now + ROLE_TTL;
                    role.confirmed = now;
                }
                None => {
                    self.trace(format!("n{node} lost the coordinator role"));
                    self.nodes[node].coord = None;
                }
            }
        } else if self.election.is_none() {
            self.campaign(node);
        }
        let boot = self.nodes[node].boot;
        self.at(ROUND, Ev::CoordRound { node, boot });
        let registry = self.registry();
        let n = &mut self.nodes[node];
        let Some(role) = n.coord.as_mut() else {
            return;
        };
        if now >= role.confirmed + ROLE_TTL * 2 / 3 {
            return;
        }
        // follow_watch: the node's records copy, newer versions only.
        let gone: Vec<VolumeId> = role
            .co
            .records()
            .map(|r| r.volume)
            .filter(|v| !n.records.contains_key(v))
            .collect();
        for v in gone {
            role.co.forget(v);
        }
        for rec in n.records.values() {
            if role
                .co
                .record(rec.volume)
                .is_none_or(|r| rec.version > r.version)
            {
                role.co.observe(rec.clone());
            }
        }
        for s in &registry {
            if s.alive && !role.co.records().any(|r| r.replicas.contains_key(&s.id)) {
                role.co.vouch(s.id, now);
            } else {
                role.co.know(s.id, now);
            }
        }
        let mut writes: Vec<Write> = role.co.tick(now).into_iter().map(Write::Change).collect();
        if now >= role.next_placement && role.placing == 0 {
            role.next_placement = now + PLACEMENT_EVERY;
            let catalog: Vec<VolumeRecord> = n.catalog.values().cloned().collect();
            let records: Vec<Membership> = role.co.records().cloned().collect();
            let mut placing = Vec::new();
            for vol in plan::orphaned(&catalog, &records) {
                // drop_orphan: read the record now; delete it at that
                // revision once the catalog copy has caught up with it and
                // still lacks the volume.
                let Some((_, rev)) = self.records.get(&vol) else {
                    role.co.forget(vol);
                    continue;
                };
                let s = Stream::Catalog as usize;
                let caught_up =
                    now >= n.stalled_until[s] && n.queue[s].front().is_none_or(|q| q.0 > *rev);
                let proven_gone = caught_up && !n.catalog.contains_key(&vol);
                if !proven_gone && self.bug != Some(Bug::OrphanFromStaleCatalog) {
                    self.seen.orphans_deferred += 1;
                    continue;
                }
                placing.push(Write::Delete { vol, mod_rev: *rev });
            }
            let (new, _) =
                plan::new_records(&catalog, &records, &registry, Some(NodeId(node as u32)));
            placing.extend(new.into_iter().map(|n| Write::Create(n.record)));
            let pending: Vec<Membership> = role
                .co
                .records()
                .filter(|r| !role.co.has_pending(r.volume))
                .cloned()
                .collect();
            writes.extend(
                plan::reconfigure(
                    &pending,
                    &catalog,
                    &registry,
                    now,
                    REPLACE_AFTER,
                    &mut role.timers,
                )
                .into_iter()
                .map(Write::Change),
            );
            role.placing = placing.len();
            writes.extend(placing);
        }
        let (inc, term) = (role.inc, role.term);
        for w in writes {
            let d = self.net_delay();
            self.at(d, Ev::Etcd { node, inc, term, w });
        }
    }

    pub(super) fn etcd_answer(&mut self, node: usize, inc: u64, w: Write, outcome: Outcome) {
        let Some(role) = self.nodes[node].coord.as_mut().filter(|r| r.inc == inc) else {
            return;
        };
        match w {
            Write::Change(ch) => {
                let fenced = matches!(outcome, Outcome::Fenced);
                let o = match outcome {
                    Outcome::Applied(Some(rec)) => ChangeOutcome::Applied(rec),
                    Outcome::Conflict(Some(rec)) => ChangeOutcome::Conflict(rec),
                    Outcome::Applied(None) | Outcome::Conflict(None) => ChangeOutcome::Missing,
                    Outcome::Fenced | Outcome::Invalid => ChangeOutcome::Failed,
                };
                role.co.on_outcome(&ch, o);
                if fenced {
                    self.trace(format!("n{node}: write fenced; tenure ends"));
                    self.nodes[node].coord = None;
                }
            }
            Write::Create(rec) => {
                role.placing = role.placing.saturating_sub(1);
                match outcome {
                    Outcome::Applied(_) => role.co.observe(rec),
                    Outcome::Conflict(Some(cur)) => role.co.observe(cur),
                    Outcome::Fenced => self.nodes[node].coord = None,
                    _ => {}
                }
            }
            Write::Delete { vol, .. } => {
                role.placing = role.placing.saturating_sub(1);
                match outcome {
                    Outcome::Applied(_) => role.co.forget(vol),
                    Outcome::Fenced => self.nodes[node].coord = None,
                    _ => {}
                }
            }
        }
    }
}
