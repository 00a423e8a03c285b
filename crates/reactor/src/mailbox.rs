//! The way into one event loop from other threads: a queue of messages and
//! a doorbell (an eventfd the loop always has a read armed on).
//!
//! Invariant (no lost wake-up): a loop that is about to sleep first sets
//! `sleeping` and then looks at the queue; a sender first queues and then
//! looks at `sleeping`. Both with sequentially consistent ordering, so
//! either the loop sees the message and does not sleep, or the sender sees
//! the loop sleeping and rings the doorbell. A loop that is awake is never
//! rung: a message costs one lock and no system call then. `loom` checks
//! this protocol (tests/loom.rs, `--cfg loom`), with the doorbell modelled
//! as a condition variable.

#[cfg(loom)]
use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

pub struct Mailbox<M> {
    queue: Mutex<Vec<M>>,
    doorbell: Doorbell,
    /// Set while the loop may be asleep.
    sleeping: AtomicBool,
    /// Connections the loop holds (for placing new ones).
    pub connections: AtomicUsize,
}

impl<M> Mailbox<M> {
    pub fn new() -> std::io::Result<Mailbox<M>> {
        Ok(Mailbox {
            queue: Mutex::new(Vec::new()),
            doorbell: Doorbell::new()?,
            sleeping: AtomicBool::new(false),
            connections: AtomicUsize::new(0),
        })
    }

    /// Queues a message, ringing the doorbell if the loop may be asleep.
    pub fn send(&self, message: M) {
        self.queue.lock().push(message);
        if self.sleeping.load(Ordering::SeqCst) {
            self.doorbell.ring();
        }
    }

    /// Every message queued so far, oldest first.
    pub fn take_all(&self) -> Vec<M> {
        std::mem::take(&mut *self.queue.lock())
    }

    /// Called by the loop before it sleeps: whether it may (nothing is
    /// queued; a later `send` rings the doorbell).
    pub fn prepare_sleep(&self) -> bool {
        self.sleeping.store(true, Ordering::SeqCst);
        self.queue.lock().is_empty()
    }

    /// Called by the loop once it is awake again.
    pub fn awake(&self) {
        self.sleeping.store(false, Ordering::SeqCst);
    }

    pub fn doorbell(&self) -> &Doorbell {
        &self.doorbell
    }
}

/// A lock whose `lock` cannot fail (parking_lot's, or loom's model).
#[cfg(not(loom))]
use parking_lot::Mutex;

#[cfg(loom)]
struct Mutex<T>(loom::sync::Mutex<T>);

#[cfg(loom)]
impl<T> Mutex<T> {
    fn new(value: T) -> Mutex<T> {
        Mutex(loom::sync::Mutex::new(value))
    }
    fn lock(&self) -> loom::sync::MutexGuard<'_, T> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// An eventfd: written to ring, read (on the loop's ring) to be woken.
#[cfg(not(loom))]
pub struct Doorbell(std::os::fd::OwnedFd);

#[cfg(not(loom))]
impl Doorbell {
    fn new() -> std::io::Result<Doorbell> {
        use std::os::fd::FromRawFd;
        // SAFETY: eventfd returns a new descriptor we own, or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor nobody else owns.
        Ok(Doorbell(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }))
    }

    fn ring(&self) {
        use std::os::fd::AsRawFd;
        let one: u64 = 1;
        // SAFETY: an 8-byte write from a live u64 to our own eventfd.
        let rc = unsafe {
            libc::write(
                self.0.as_raw_fd(),
                (&one as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
        if rc < 0 {
            // EAGAIN: the counter is saturated, the loop wakes anyway.
            tracing::trace!("eventfd write failed: {}", std::io::Error::last_os_error());
        }
    }

    pub fn fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.0.as_raw_fd()
    }
}

/// The doorbell as loom sees it: a counter and a condition variable.
#[cfg(loom)]
pub struct Doorbell {
    rung: loom::sync::Mutex<u64>,
    cv: loom::sync::Condvar,
}

#[cfg(loom)]
impl Doorbell {
    fn new() -> std::io::Result<Doorbell> {
        Ok(Doorbell {
            rung: loom::sync::Mutex::new(0),
            cv: loom::sync::Condvar::new(),
        })
    }

    fn ring(&self) {
        let mut rung = self.rung.lock().unwrap_or_else(|e| e.into_inner());
        *rung += 1;
        self.cv.notify_one();
    }

    /// Sleeps until rung (what the loop's armed eventfd read does).
    pub fn wait(&self) {
        let mut rung = self.rung.lock().unwrap_or_else(|e| e.into_inner());
        while *rung == 0 {
            rung = self.cv.wait(rung).unwrap_or_else(|e| e.into_inner());
        }
        *rung = 0;
    }
}

/// Run with `RUSTFLAGS="--cfg loom" cargo test -p basalt-reactor --lib`
/// (scripts/test.sh does): loom runs every interleaving of a loop going to
/// sleep against senders, and reports a deadlock if a message can be left
/// queued while the loop sleeps.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::Mailbox;
    use loom::sync::Arc;

    /// The loop's side of the protocol, as `EventLoop::run` drives it:
    /// drain, then sleep unless `prepare_sleep` saw messages, until it has
    /// received `expected` messages.
    fn run_loop(mailbox: &Mailbox<u32>, expected: usize) -> Vec<u32> {
        let mut got = Vec::new();
        loop {
            got.extend(mailbox.take_all());
            if got.len() == expected {
                return got;
            }
            if mailbox.prepare_sleep() {
                mailbox.doorbell().wait();
            }
            mailbox.awake();
        }
    }

    #[test]
    fn a_message_never_waits_for_a_sleeping_loop() {
        loom::model(|| {
            let mailbox = Arc::new(Mailbox::<u32>::new().expect("mailbox"));
            let senders: Vec<_> = (0..2)
                .map(|n| {
                    let mailbox = Arc::clone(&mailbox);
                    loom::thread::spawn(move || mailbox.send(n))
                })
                .collect();
            let mut got = run_loop(&mailbox, 2);
            for s in senders {
                s.join().expect("sender");
            }
            got.sort_unstable();
            assert_eq!(got, vec![0, 1]);
        });
    }

    #[test]
    fn messages_sent_while_awake_are_seen_before_sleeping_again() {
        loom::model(|| {
            let mailbox = Arc::new(Mailbox::<u32>::new().expect("mailbox"));
            let sender = {
                let mailbox = Arc::clone(&mailbox);
                loom::thread::spawn(move || {
                    mailbox.send(1);
                    mailbox.send(2);
                })
            };
            let got = run_loop(&mailbox, 2);
            sender.join().expect("sender");
            assert_eq!(got, vec![1, 2]);
        });
    }
}
