//! Faults injected during the fault phase, the operator's restart during
//! the heal phase, and the checks (every step, and at the end).

use super::*;

impl Sim {
    pub(super) fn fault(&mut self) {
        let n = self.nodes.len();
        let node = self.rng.below(n as u64) as usize;
        let up = self.nodes.iter().filter(|x| x.up).count();
        match self.rng.below(100) {
            0..=14 if self.nodes[node].up && up > 2 => self.crash(node),
            15..=34 if self.nodes[node].up => {
                // Past the leases, sometimes past the role's TTL.
                let d = 100 + self.rng.below(900);
                self.seen.pauses += 1;
                self.trace(format!("n{node} pauses for {d} ms"));
                self.nodes[node].paused_until = self.now + d;
            }
            35..=59 => {
                let running: Vec<(usize, VolumeId)> = self
                    .nodes
                    .iter()
                    .enumerate()
                    .filter(|(_, x)| x.up)
                    .flat_map(|(i, x)| {
                        x.replicas
                            .iter()
                            .filter(|(_, r)| !r.stopped)
                            .map(move |(v, _)| (i, *v))
                    })
                    .collect();
                if !running.is_empty() {
                    let (i, vol) = running[self.rng.below(running.len() as u64) as usize];
                    if let Some(r) = self.nodes[i].replicas.get_mut(&vol) {
                        r.stopped = true;
                        self.seen.stops += 1;
                        self.trace(format!("n{i}: replica of {vol:?} stops for good"));
                    }
                }
            }
            60..=84 if self.nodes[node].up => {
                let s = if self.rng.chance(700) {
                    Stream::Catalog
                } else {
                    Stream::Records
                } as usize;
                let d = 300 + self.rng.below(1700);
                self.seen.stalls += 1;
                self.trace(format!("n{node}: watch stream {s} stalls for {d} ms"));
                let until = self.now + d;
                let x = &mut self.nodes[node];
                x.stalled_until[s] = until;
                for q in x.queue[s].iter_mut() {
                    q.1 = q.1.max(until);
                }
                let boot = x.boot;
                let stream = if s == 0 {
                    Stream::Catalog
                } else {
                    Stream::Records
                };
                self.at(d, Ev::Watch { node, boot, stream });
            }
            _ => {}
        }
        let d = 50 + self.rng.below(150);
        if self.now + d < self.fault_until {
            self.at(d, Ev::Fault);
        }
    }

    /// Half-way through the heal phase, the operator restarts the nodes
    /// whose stopped replica is still a record's primary with no replica
    /// in sync to take over (nothing else can bring such a volume back).
    pub(super) fn operator(&mut self) {
        for node in 0..self.nodes.len() {
            let stuck = self.nodes[node].replicas.iter().any(|(vol, r)| {
                r.stopped
                    && self
                        .records
                        .get(vol)
                        .is_some_and(|(rec, _)| rec.primary == NodeId(node as u32))
            });
            if stuck && self.nodes[node].up {
                self.crash(node);
            }
        }
    }

    pub(super) fn check_leases(&mut self) {
        let mut holders: BTreeMap<VolumeId, Vec<usize>> = BTreeMap::new();
        for (i, n) in self.nodes.iter().enumerate() {
            if !n.up {
                continue;
            }
            // A lease is on its node's clock.
            for (vol, r) in &n.replicas {
                if !r.stopped
                    && matches!(r.node.role(), RoleKind::Primary(_))
                    && r.node.lease_until() > self.now + n.skew
                {
                    holders.entry(*vol).or_default().push(i);
                }
            }
        }
        if let Some((vol, nodes)) = holders.into_iter().find(|(_, h)| h.len() > 1) {
            self.fail(format!(
                "two primaries of {vol:?} hold a lease at once: nodes {nodes:?}"
            ));
        }
    }

    pub(super) fn check_end(&self) -> Result<(), String> {
        for vol in self.records.keys() {
            if !self.catalog.contains_key(vol) {
                return Err(format!("record of deleted volume {vol:?} left"));
            }
        }
        let up = self.nodes.iter().filter(|n| n.up).count();
        for (vol, v) in &self.catalog {
            let Some((rec, _)) = self.records.get(vol) else {
                return Err(format!("volume {vol:?} has no record"));
            };
            let want = plan::wanted_replicas(v).min(up);
            if rec.replicas.len() != want {
                return Err(format!(
                    "{vol:?} wants {want} replicas, its record has {rec:?}"
                ));
            }
            for (n, info) in &rec.replicas {
                let node = &self.nodes[n.0 as usize];
                let r = node.replicas.get(vol);
                if !node.up || r.is_none_or(|r| r.stopped) {
                    return Err(format!(
                        "{vol:?}: record {rec:?} names n{} whose replica is not running",
                        n.0
                    ));
                }
                if info.state != ReplicaState::InSync {
                    return Err(format!("{vol:?}: replica on n{} not InSync: {rec:?}", n.0));
                }
            }
            let p = &self.nodes[rec.primary.0 as usize];
            let holds = p.replicas.get(vol).is_some_and(|r| {
                r.node.role() == RoleKind::Primary(rec.epoch)
                    && r.node.lease_until() > self.now + p.skew
            });
            if !holds {
                return Err(format!(
                    "{vol:?}: primary n{} of {rec:?} holds no lease",
                    rec.primary.0
                ));
            }
        }
        Ok(())
    }
}
