//! The peer messages that arrive for this node: replication messages and
//! client requests go to the volume's local replica (a burst for one
//! volume as one batch), replies to this node's client requests to their
//! batches (`batches.rs`), heartbeats to the coordinator's responder.
//!
//! Invariant: every client request from another node is answered, by the
//! local replica or with NotPrimary when there is none.

use super::{Env, Inner};
use crate::coordinator::Heartbeat;
use crate::replica::{Event, Origin, Replica};
use basalt_replication::{ClientReply, Membership, Msg, NodeId, VolumeId};
use basalt_store::BLOCK_SIZE;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Volumes of a peer batch grouped by a scan before an index is built.
const SCAN_VOLUMES: usize = 8;

impl Inner {
    /// Frames that arrived together: each replica gets its share as one
    /// batch (so a secondary writes a burst of replicated writes with one
    /// device submission), in arrival order.
    pub(super) fn on_peer_batch(&self, from: NodeId, batch: Vec<(VolumeId, Msg)>) {
        let mut by_volume: Vec<(VolumeId, Vec<Event>)> = Vec::new();
        // Built only for a batch of many volumes (a node's heartbeat
        // answers): a batch of replicated writes, one or a few volumes, is
        // grouped by a scan without allocating.
        let mut index: Option<HashMap<VolumeId, usize>> = None;
        // Heartbeats are answered here, on the peer's reader (never behind
        // the coordinator's etcd writes), all answers to one batch in one
        // send.
        let mut heartbeats: Vec<Heartbeat> = Vec::new();
        for (vol, msg) in batch {
            let ev = match msg {
                Msg::ClientReq { id, req } => Event::Client {
                    id,
                    req,
                    origin: Origin::Node(from),
                },
                Msg::HeartbeatAck { .. } => Event::Control(msg),
                Msg::Heartbeat { boot, sent_at } => {
                    heartbeats.push((vol, boot, sent_at));
                    continue;
                }
                Msg::ClientReply { id, reply } => {
                    self.complete(id, reply);
                    continue;
                }
                msg => Event::Peer { from, msg },
            };
            let at = match &index {
                Some(index) => index.get(&vol).copied(),
                None => by_volume.iter().position(|(v, _)| *v == vol),
            };
            match at {
                Some(i) => by_volume[i].1.push(ev),
                None => {
                    if let Some(index) = &mut index {
                        index.insert(vol, by_volume.len());
                    }
                    by_volume.push((vol, vec![ev]));
                    if index.is_none() && by_volume.len() > SCAN_VOLUMES {
                        index = Some(
                            by_volume
                                .iter()
                                .enumerate()
                                .map(|(i, (v, _))| (*v, i))
                                .collect(),
                        );
                    }
                }
            }
        }
        if !heartbeats.is_empty() {
            let responder = self.coordinator.lock().as_ref().map(|c| c.responder());
            if let Some(r) = responder {
                let acks = r.answer(self, from, &heartbeats);
                if !acks.is_empty() {
                    self.peers.send_many(from, acks);
                }
            }
        }
        for (vol, events) in by_volume {
            match self.replica(vol) {
                Some(replica) => replica.deliver(events),
                None => {
                    for ev in events {
                        if let Event::Client { id, .. } = ev {
                            self.peers.send(
                                from,
                                vol,
                                Msg::ClientReply {
                                    id,
                                    reply: ClientReply::NotPrimary,
                                },
                            );
                        }
                    }
                }
            }
        }
    }

    pub(super) fn replica(&self, vol: VolumeId) -> Option<Arc<Replica<Env>>> {
        self.replicas.lock().get(&vol).map(|h| h.replica.clone())
    }

    /// Delivers `ev` to the volume's local replica, on this thread.
    pub(super) fn to_replica(&self, vol: VolumeId, ev: Event) {
        if let Some(replica) = self.replica(vol) {
            replica.deliver(vec![ev]);
        }
    }

    /// Opens of `rec`'s volume serve its recorded size from now on (it
    /// only grows).
    pub(super) fn raise_open_size(&self, rec: &Membership) {
        if let Some(size) = self.open_sizes.lock().get(&rec.volume) {
            size.fetch_max(rec.blocks * BLOCK_SIZE, Ordering::Relaxed);
        }
    }
}
