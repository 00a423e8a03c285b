//! This node's opens of replicated volumes, published for the other nodes
//! (`meta::clients`), and other nodes' requests to drop them carried out
//! here: so that a rollback, a `volume disconnect` or a forced delete
//! through any node sees and closes the clients of every node.
//!
//! Invariants:
//! - Every open (`ClusterVolume`) holds one [`OpenCount`] from creation to
//!   drop, so `counts` is exactly the opens alive on this node.
//! - The publisher thread makes etcd's entries of this node equal to
//!   `counts` after every change (woken at once) and checks them again
//!   every [`RECHECK`] (an expired liveness lease takes them away; etcd
//!   may have been unreachable), so another node reads a client opened
//!   here within one etcd write of its open.
//! - A disconnect request is carried out on a thread of its own (the
//!   volume service waits there for the connections to close), never on
//!   the watch's thread.

use super::Inner;
use basalt_replication::VolumeId;
use parking_lot::{Condvar, Mutex};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// How often the publisher compares etcd's entries with the opens even
/// when nothing changed.
const RECHECK: Duration = Duration::from_secs(2);
/// Longest the publisher sleeps without a change (it checks the member is
/// still running in between).
const WAKE_UP: Duration = Duration::from_millis(500);
/// Pause after etcd failed a write or a read.
const RETRY: Duration = Duration::from_millis(200);

/// See [`super::ClusterMember::on_disconnect_request`]: drops this node's
/// clients of the named volume.
pub type DisconnectListener = Box<dyn Fn(&str) + Send + Sync>;

/// The opens of each volume on this node.
#[derive(Default)]
pub(super) struct OpenClients {
    counts: Mutex<HashMap<VolumeId, usize>>,
    changed: Condvar,
}

impl OpenClients {
    /// Wakes the publisher (to see the member stopping).
    pub(super) fn wake(&self) {
        self.changed.notify_all();
    }

    /// Counts one more open of `vol` until the returned guard drops.
    pub(super) fn open(self: &Arc<Self>, vol: VolumeId) -> OpenCount {
        *self.counts.lock().entry(vol).or_default() += 1;
        self.changed.notify_all();
        OpenCount {
            clients: Arc::clone(self),
            vol,
        }
    }
}

/// One open of a volume, counted while alive.
pub(super) struct OpenCount {
    clients: Arc<OpenClients>,
    vol: VolumeId,
}

impl Drop for OpenCount {
    fn drop(&mut self) {
        let mut counts = self.clients.counts.lock();
        if let Some(n) = counts.get_mut(&self.vol) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.vol);
            }
        }
        drop(counts);
        self.clients.changed.notify_all();
    }
}

/// The publisher thread: keeps this node's entries in etcd equal to its
/// opens.
pub(super) fn publish_clients(weak: Weak<Inner>) {
    let Some(owner) = weak.upgrade().and_then(|inner| {
        let reg = inner.registration.lock();
        reg.as_ref().map(|r| r.entry_owner())
    }) else {
        return;
    };
    // What etcd holds of this node, as last written or read (None: unknown,
    // read it first).
    let mut published: Option<BTreeMap<VolumeId, usize>> = None;
    let mut last_read = Instant::now();
    loop {
        let Some(inner) = weak.upgrade() else { return };
        if inner.stopping.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let want = snapshot(&inner.open_clients.counts.lock());
        if last_read.elapsed() >= RECHECK {
            published = None;
        }
        let meta = &inner.meta;
        let synced = match published.take() {
            Some(p) => Ok(p),
            None => {
                last_read = Instant::now();
                meta.published_clients(&owner)
            }
        }
        .and_then(|mut current| {
            for (vol, n) in &want {
                if current.get(vol) != Some(n) {
                    meta.publish_clients(&owner, *vol, *n)?;
                    current.insert(*vol, *n);
                }
            }
            let gone: Vec<VolumeId> = current
                .keys()
                .filter(|v| !want.contains_key(v))
                .copied()
                .collect();
            for vol in gone {
                meta.publish_clients(&owner, vol, 0)?;
                current.remove(&vol);
            }
            Ok(current)
        });
        let pause = match synced {
            Ok(current) => {
                published = Some(current);
                WAKE_UP
            }
            Err(e) => {
                tracing::debug!(error = %e, "cannot publish this node's clients; retrying");
                RETRY
            }
        };
        // Sleep until the opens change, at most `pause` (so a stopping
        // member and the recheck are not kept waiting).
        let clients = Arc::clone(&inner.open_clients);
        drop(inner);
        let mut counts = clients.counts.lock();
        if snapshot(&counts) == want {
            clients.changed.wait_for(&mut counts, pause);
        }
    }
}

fn snapshot(counts: &HashMap<VolumeId, usize>) -> BTreeMap<VolumeId, usize> {
    counts
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(v, n)| (*v, *n))
        .collect()
}

impl Inner {
    /// Carries out another node's request to drop the clients of `vol`
    /// here, if this node has any.
    pub(super) fn on_disconnect_request(self: &Arc<Self>, vol: VolumeId) {
        if !self.open_clients.counts.lock().contains_key(&vol) {
            return;
        }
        let name = self
            .volumes
            .read()
            .iter()
            .find(|(_, r)| r.id.as_u128() == vol.0)
            .map(|(name, _)| name.clone());
        let Some(name) = name else { return };
        let weak = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("disconnect".into())
            .spawn(move || {
                let Some(inner) = weak.upgrade() else { return };
                tracing::info!(volume = %name, "dropping this node's clients of the volume, as another node asked");
                for listener in inner.disconnect_listeners.read().iter() {
                    listener(&name);
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start a thread to drop a volume's clients");
        }
    }
}
