//! Event loops for the data path: a fixed set of threads ("loops"), each
//! owning one io_uring and the connections given to it. A connection lives
//! on one loop for its whole life: its socket readiness, its disk I/O and
//! its replies are all submitted to and completed on that loop's ring, so a
//! request is parsed, executed and answered without changing thread.
//! Blocking work (a flush that commits the journal, a trim that takes a
//! volume's map exclusively) runs on a small offload pool and comes back
//! to the connection's loop as a message.
//!
//! Shape: a frontend implements [`Connection`] (a state machine driven by
//! completions) and hands each connection to [`Reactor::adopt`]; the loop
//! calls it back through [`Io`], which submits ring entries tagged for
//! it, offloads work and asks for a retry.
//!
//! Invariants:
//! - A loop never drops a connection while the connection reports anything
//!   in flight: [`Connection::finished`] is only true once every ring entry
//!   it submitted has completed and every offloaded job has been delivered,
//!   because the kernel and the workers write into the connection's
//!   buffers until then.
//! - Idle costs nothing: a loop with no completions to reap sleeps in
//!   `io_uring_enter` and is woken by its eventfd (for mailbox messages) or
//!   by a completion; only a connection that asked for a retry makes it
//!   wake up periodically ([`RETRY_INTERVAL`]).
//! - Messages to a loop (a new connection, an offloaded job's result, stop)
//!   go through its mailbox: one lock and, when the loop may be asleep, one
//!   eventfd write.
//! - [`Reactor::stop`] (also on drop) tells every connection to stop, waits
//!   until each loop has no connection left, and joins every thread; a
//!   connection handed over after that is dropped at once, never left in
//!   a mailbox nobody drains.

// Under `--cfg loom` only the mailbox and its loom model are built (the
// loops need a real kernel); the model uses the mailbox from tests only.
#![cfg_attr(loom, allow(dead_code))]

#[cfg(not(loom))]
mod loops;
mod mailbox;

#[cfg(not(loom))]
pub use loops::*;
