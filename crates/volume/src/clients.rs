//! The frontends' clients of a volume, and dropping them on request
//! (`basalt volume disconnect`, `volume delete --force`).
//!
//! Each frontend registers a [`ClientDisconnect`] with the volume service;
//! disconnecting a volume asks every one of them to close the connections
//! that opened it. A closed connection's thread ends and drops its
//! [`crate::VolumeHandle`], which is what the service's in-use check counts,
//! so the service then waits for that count to reach zero.
//!
//! Invariant: a disconnect closes connections the way a crash of the server
//! would for those clients: requests in flight get no reply, and every write
//! acknowledged with FUA or covered by a completed FLUSH stays durable.

use parking_lot::Mutex;
use std::sync::Arc;

/// A frontend's way to drop the clients of one volume.
pub trait ClientDisconnect: Send + Sync {
    /// Closes every connection serving `volume`; returns how many.
    fn disconnect(&self, volume: &str) -> usize;
}

/// The registered frontends.
#[derive(Default)]
pub(crate) struct Clients {
    frontends: Mutex<Vec<Arc<dyn ClientDisconnect>>>,
}

impl Clients {
    pub(crate) fn register(&self, frontend: Arc<dyn ClientDisconnect>) {
        self.frontends.lock().push(frontend);
    }

    /// Asks every frontend to drop `volume`'s clients; how many it closed.
    pub(crate) fn disconnect(&self, volume: &str) -> usize {
        let frontends = self.frontends.lock().clone();
        frontends.iter().map(|f| f.disconnect(volume)).sum()
    }
}
