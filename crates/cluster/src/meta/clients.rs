//! Which node serves clients of which volume, and requests to drop them:
//! what lets a rollback, a `volume disconnect` or a forced delete through
//! one node see and close the clients connected through every other.
//!
//! Keys (under the cluster's prefix):
//! - `clients/<node name>/<volume uuid>` = the number of opens of the
//!   volume on that node (frontend connections, an NVMe controller, an
//!   export), written by that node only, bound to its liveness lease: a
//!   node that dies takes its entries with it when its lease runs out.
//!   Absent when the node serves none.
//! - `disconnect/<volume uuid>` = a request id: every node drops its
//!   clients of the volume when the key is put. Bound to a lease of its
//!   own ([`DISCONNECT_REQUEST_TTL`]), so requests never pile up.
//!
//! Neither is a coordinator write: a node writes its own entries, and a
//! disconnect request changes no placement or record, so neither is
//! fenced by the coordinator's election revision.

use super::watch::{self, Change};
use super::{ClusterMeta, MetaError, Registration, WatchGuard};
use basalt_replication::VolumeId;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Who writes a node's entries: its name and its liveness lease as it is
/// now (the registration renews an expired one), shareable with a thread.
#[derive(Clone)]
pub struct EntryOwner {
    name: String,
    lease: Arc<AtomicI64>,
}

impl Registration {
    /// The owner of this node's entries (see [`EntryOwner`]).
    pub fn entry_owner(&self) -> EntryOwner {
        EntryOwner {
            name: self.name.clone(),
            lease: Arc::clone(&self.lease),
        }
    }
}

/// How long a disconnect request stays in etcd.
pub const DISCONNECT_REQUEST_TTL: Duration = Duration::from_secs(30);

fn uuid_of(vol: VolumeId) -> uuid::Uuid {
    uuid::Uuid::from_u128(vol.0)
}

/// An entry's count (0 if unreadable: an entry only this code writes).
fn count_of(value: &[u8]) -> usize {
    std::str::from_utf8(value)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

impl ClusterMeta {
    /// Records that this node has `count` opens of `vol` (0: deletes the
    /// entry).
    pub fn publish_clients(
        &self,
        owner: &EntryOwner,
        vol: VolumeId,
        count: usize,
    ) -> Result<(), MetaError> {
        let key = format!("clients/{}/{}", owner.name, uuid_of(vol));
        if count == 0 {
            return self.core.delete(&key);
        }
        let lease = owner.lease.load(Ordering::SeqCst);
        if lease == 0 {
            return Err(MetaError::Internal("the node left the cluster".into()));
        }
        self.core
            .put_with_lease(&key, count.to_string().into_bytes(), lease)
    }

    /// This node's entries as etcd holds them (they vanish with an expired
    /// lease, so the publisher compares them with what it meant to write).
    pub fn published_clients(
        &self,
        owner: &EntryOwner,
    ) -> Result<BTreeMap<VolumeId, usize>, MetaError> {
        let prefix = format!("clients/{}/", owner.name);
        let full = self.core.key(&prefix);
        let mut out = BTreeMap::new();
        for (key, value, _) in self.core.list(&prefix)? {
            let Some(vol) = key
                .strip_prefix(&full)
                .and_then(|u| uuid::Uuid::parse_str(u).ok())
            else {
                continue;
            };
            let count = count_of(&value);
            out.insert(VolumeId(vol.as_u128()), count);
        }
        Ok(out)
    }

    /// The nodes other than `me` that have opens of `vol`, with how many.
    pub fn clients_elsewhere(
        &self,
        vol: VolumeId,
        me: &str,
    ) -> Result<Vec<(String, usize)>, MetaError> {
        let full = self.core.key("clients/");
        let suffix = format!("/{}", uuid_of(vol));
        let mut out = Vec::new();
        for (key, value, _) in self.core.list("clients/")? {
            let Some(node) = key
                .strip_prefix(&full)
                .and_then(|rest| rest.strip_suffix(&suffix))
            else {
                continue;
            };
            if node == me || node.contains('/') {
                continue;
            }
            let count = count_of(&value);
            if count > 0 {
                out.push((node.to_string(), count));
            }
        }
        Ok(out)
    }

    /// Asks every node to drop its clients of `vol`.
    pub fn request_disconnect(&self, vol: VolumeId) -> Result<(), MetaError> {
        let lease = self.core.grant(DISCONNECT_REQUEST_TTL)?;
        let id = uuid::Uuid::new_v4().to_string();
        self.core.put_with_lease(
            &format!("disconnect/{}", uuid_of(vol)),
            id.into_bytes(),
            lease,
        )
    }

    /// Follows disconnect requests: `f(vol)` for each one put from now on
    /// (requests already there when the watch starts are old: this node
    /// had no clients then).
    pub fn watch_disconnect_requests(
        &self,
        f: Box<dyn Fn(VolumeId) + Send>,
    ) -> Result<WatchGuard, MetaError> {
        let prefix = self.core.key("disconnect/");
        let mut started = false;
        watch::watch_prefixes(
            self.core.clone(),
            "watch-disconnect",
            &["disconnect/"],
            Box::new(move |_, changes| {
                if !started {
                    started = true;
                    return;
                }
                for change in changes {
                    let Change::Put { key, .. } = change else {
                        continue;
                    };
                    if let Some(vol) = key
                        .strip_prefix(&prefix)
                        .and_then(|u| uuid::Uuid::parse_str(u).ok())
                    {
                        f(VolumeId(vol.as_u128()));
                    }
                }
            }),
        )
    }
}
