//! The simulated cluster member of each node (as `basalt_cluster::member`):
//! its watched copies, its replicas (real `basalt_replication::Node`s on
//! simple disks) started, fed and dropped as the records say, heartbeats
//! batched per tick to the coordinator it last read; crashes and restarts.

use super::*;

impl Sim {
    /// Delivers every change of the stream that is due, in order.
    pub(super) fn watch(&mut self, node: usize, stream: Stream) {
        let s = stream as usize;
        while self.nodes[node].queue[s]
            .front()
            .is_some_and(|q| q.1 <= self.now)
        {
            if let Some((_, _, change)) = self.nodes[node].queue[s].pop_front() {
                self.watched(node, change);
            }
        }
    }

    pub(super) fn watched(&mut self, node: usize, change: Change2) {
        match change {
            Change2::Catalog(vol, Some(rec)) => {
                self.nodes[node].catalog.insert(vol, *rec);
            }
            Change2::Catalog(vol, None) => {
                let n = &mut self.nodes[node];
                n.catalog.remove(&vol);
                if !n.records.contains_key(&vol) {
                    n.disks.remove(&vol);
                }
            }
            Change2::Record(_, Some(rec)) => self.on_record(node, rec),
            Change2::Record(vol, None) => {
                let n = &mut self.nodes[node];
                n.records.remove(&vol);
                n.replicas.remove(&vol);
                if !n.catalog.contains_key(&vol) {
                    n.disks.remove(&vol);
                }
            }
        }
    }

    /// The member's `on_record`.
    pub(super) fn on_record(&mut self, node: usize, rec: Membership) {
        let vol = rec.volume;
        let n = &mut self.nodes[node];
        if n.records
            .get(&vol)
            .is_some_and(|r| r.version >= rec.version)
        {
            return;
        }
        n.records.insert(vol, rec.clone());
        let me = NodeId(node as u32);
        let mine = rec.replicas.contains_key(&me);
        if mine && n.replicas.contains_key(&vol) {
            self.feed_record(node, rec);
        } else if mine {
            self.start_replica(node, &rec);
        } else if n.replicas.remove(&vol).is_some() {
            self.trace(format!("n{node}: no longer holds {vol:?}"));
        }
    }

    /// The metadata service's answer (a record, and a CAS's outcome)
    /// reaches incarnation `boot` of `node`'s replica after `delay`.
    pub(super) fn meta_reply(
        &mut self,
        node: usize,
        boot: u64,
        record: Membership,
        cas_ok: Option<bool>,
        delay: u64,
    ) {
        let vol = record.volume;
        self.at(
            delay,
            Ev::Deliver {
                to: node,
                boot,
                vol,
                from: Endpoint::Control,
                msg: Msg::MetaReply { record, cas_ok },
            },
        );
    }

    /// Gives a running replica a record its node's watch delivered, as the
    /// member does.
    fn feed_record(&mut self, node: usize, record: Membership) {
        let vol = record.volume;
        self.input(
            node,
            vol,
            Input::Msg {
                from: Endpoint::Control,
                msg: Msg::MetaReply {
                    record,
                    cas_ok: None,
                },
            },
        );
    }

    pub(super) fn start_replica(&mut self, node: usize, rec: &Membership) {
        let vol = rec.volume;
        let me = NodeId(node as u32);
        let n = &mut self.nodes[node];
        let fresh = rec.version == 1 && rec.replicas.get(&me).is_some_and(|r| r.boot == n.boot);
        let disk = n
            .disks
            .entry(vol)
            .or_insert_with(|| vec![0; (rec.blocks * BL) as usize]);
        let cfg = Config {
            volume_blocks: disk.len() as u64 / BL,
            ..self.cfg.clone()
        };
        let now = self.now + n.skew;
        let replica = Node::new(me, n.boot, vol, cfg, fresh.then(|| rec.clone()), now);
        n.replicas.insert(
            vol,
            Replica {
                node: replica,
                stopped: false,
            },
        );
        if !fresh {
            self.feed_record(node, rec.clone());
        }
    }

    /// Feeds `input` to the replica of `vol` on `node` (if running) and
    /// carries out its actions; heartbeats go to `outbox`.
    pub(super) fn input_into(
        &mut self,
        node: usize,
        vol: VolumeId,
        input: Input,
        outbox: &mut Vec<(VolumeId, u64, u64)>,
    ) {
        let now = self.clock(node);
        let Some(r) = self.nodes[node].replicas.get_mut(&vol) else {
            return;
        };
        if r.stopped {
            return;
        }
        let acts = r.node.handle(now, input);
        let boot = self.nodes[node].boot;
        for a in acts {
            match a {
                Action::Send {
                    to: Endpoint::Control,
                    msg: Msg::Heartbeat { boot, sent_at },
                } => outbox.push((vol, boot, sent_at)),
                Action::Send {
                    to: Endpoint::Control,
                    msg: Msg::MetaGet { .. },
                } => {
                    // Answered from the node's watched copy, as the member
                    // does.
                    if let Some(record) = self.nodes[node].records.get(&vol).cloned() {
                        let d = 1 + self.rng.below(3);
                        self.meta_reply(node, boot, record, None, d);
                    }
                }
                Action::Send {
                    to: Endpoint::Control,
                    msg: Msg::MetaCas { expected, record },
                } => {
                    let d = self.net_delay();
                    self.at(
                        d,
                        Ev::NodeCas {
                            node,
                            boot,
                            expected,
                            record,
                        },
                    );
                }
                Action::Send {
                    to: Endpoint::Node(peer),
                    msg,
                } => {
                    let to = peer.0 as usize;
                    let d = self.net_delay();
                    let peer_boot = self.nodes[to].boot;
                    self.at(
                        d,
                        Ev::Deliver {
                            to,
                            boot: peer_boot,
                            vol,
                            from: Endpoint::Node(NodeId(node as u32)),
                            msg,
                        },
                    );
                }
                Action::Send { .. } => {}
                Action::Disk { id, op } => {
                    let d = 1 + self.rng.below(3);
                    self.at(
                        d,
                        Ev::Disk {
                            node,
                            boot,
                            vol,
                            id,
                            op,
                        },
                    );
                }
            }
        }
    }

    pub(super) fn input(&mut self, node: usize, vol: VolumeId, input: Input) {
        let mut outbox = Vec::new();
        self.input_into(node, vol, input, &mut outbox);
        self.send_heartbeats(node, outbox);
    }

    pub(super) fn send_heartbeats(&mut self, node: usize, batch: Vec<(VolumeId, u64, u64)>) {
        if batch.is_empty() {
            return;
        }
        if let Some(c) = self.nodes[node].believed {
            let d = self.net_delay();
            self.at(
                d,
                Ev::Heartbeats {
                    c,
                    from: node,
                    batch,
                },
            );
        }
    }

    pub(super) fn disk(&mut self, node: usize, vol: VolumeId, id: IoId, op: DiskOp) {
        let Some(disk) = self.nodes[node].disks.get_mut(&vol) else {
            return;
        };
        let mut data = None;
        match op {
            DiskOp::Write { lba, data: d, .. } => {
                let at = (lba * BL) as usize;
                if at + d.len() > disk.len() {
                    self.fail(format!("n{node} wrote beyond the disk of {vol:?}"));
                    return;
                }
                disk[at..at + d.len()].copy_from_slice(&d);
            }
            DiskOp::WriteZeroes { lba, blocks, .. } => {
                let at = (lba * BL) as usize;
                let end = at + (blocks * BL) as usize;
                if end > disk.len() {
                    self.fail(format!("n{node} zeroed beyond the disk of {vol:?}"));
                    return;
                }
                disk[at..end].fill(0);
            }
            DiskOp::Read { lba, blocks } => {
                let at = (lba * BL) as usize;
                let end = at + (blocks * BL) as usize;
                if end > disk.len() {
                    self.fail(format!("n{node} read beyond the disk of {vol:?}"));
                    return;
                }
                data = Some(disk[at..end].to_vec());
            }
            DiskOp::Grow { blocks } => {
                let len = (blocks * BL) as usize;
                if disk.len() < len {
                    disk.resize(len, 0);
                }
            }
            DiskOp::Flush | DiskOp::SaveLogs { .. } => {}
            // Its clients take no snapshots (the protocol's simulator does).
            DiskOp::Snapshot { .. }
            | DiskOp::DeleteLayer { .. }
            | DiskOp::Rebase { .. }
            | DiskOp::Changed { .. }
            | DiskOp::ReadLayer { .. }
            | DiskOp::Flatten { .. }
            | DiskOp::Compact { .. } => {
                self.fail(format!("n{node} got a layer operation: {op:?}"));
                return;
            }
        }
        self.input(
            node,
            vol,
            Input::Disk {
                id,
                result: DiskResult::Done { data },
            },
        );
    }

    pub(super) fn node_tick(&mut self, node: usize) {
        self.alive_until[node] = self.now + NODE_TTL;
        let vols: Vec<VolumeId> = self.nodes[node].replicas.keys().copied().collect();
        let mut outbox = Vec::new();
        for vol in vols {
            self.input_into(node, vol, Input::Tick, &mut outbox);
        }
        self.send_heartbeats(node, outbox);
        let boot = self.nodes[node].boot;
        self.at(ROUND, Ev::NodeTick { node, boot });
    }

    pub(super) fn crash(&mut self, node: usize) {
        self.seen.crashes += 1;
        self.trace(format!("n{node} crashes"));
        let n = &mut self.nodes[node];
        n.up = false;
        n.replicas.clear();
        n.coord = None;
        n.believed = None;
        n.queue = [VecDeque::new(), VecDeque::new()];
        let d = 100 + self.rng.below(800);
        self.at(d, Ev::Restart { node });
    }

    /// A new incarnation: registers with boot + 1, lists the catalog and the
    /// records, reads the election key, starts the replicas named.
    pub(super) fn restart(&mut self, node: usize) {
        let boot = self.boots[node] + 1;
        self.boots[node] = boot;
        self.alive_until[node] = self.now + NODE_TTL;
        self.trace(format!("n{node} starts with boot {boot}"));
        let catalog = self.catalog.clone();
        let records: Vec<Membership> = self.records.values().map(|(r, _)| r.clone()).collect();
        let believed = self.election.as_ref().map(|e| e.holder);
        let n = &mut self.nodes[node];
        n.up = true;
        n.boot = boot;
        n.paused_until = 0;
        n.stalled_until = [0, 0];
        n.catalog = catalog;
        n.records.clear();
        n.replicas.clear();
        n.believed = believed;
        let gone: Vec<VolumeId> = n
            .disks
            .keys()
            .copied()
            .filter(|v| !n.catalog.contains_key(v))
            .collect();
        for v in gone {
            n.disks.remove(&v);
        }
        for rec in records {
            self.on_record(node, rec);
        }
        self.at(1, Ev::NodeTick { node, boot });
        self.at(2, Ev::CoordRound { node, boot });
    }
}
