//! The replicas' clock: a fixed set of threads that drives every replica
//! on this node when its next tick is due, or at once when it is woken
//! (background disk work to run, a stop to finish).
//!
//! Threads do not grow with volumes: a node with 5000 replicas runs the same
//! few ticker threads as one with 5. A tick is short (heartbeats, timeouts,
//! the state machine's timers), except when it runs a replica's background
//! disk operations (resync reads); those are why there are several threads.
//!
//! Invariants:
//! - a registered replica is ticked by at most one thread at a time, and
//!   again no later than the delay its last tick asked for (or at once if it
//!   was woken meanwhile, including while that tick ran);
//! - a replica leaves the ticker when its tick answers `None` (stopped) or
//!   it was dropped; the ticker holds replicas weakly, never keeping one
//!   alive;
//! - dropping the ticker stops and joins its threads.

use parking_lot::{Condvar, Mutex};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Something the ticker drives.
pub(crate) trait Tick: Send + Sync + 'static {
    /// Runs one tick; how long until the next one is due, or `None` once
    /// this no longer needs ticking (stopped).
    fn tick(&self) -> Option<Duration>;
}

/// A registered replica's place in the ticker: wakes it.
#[derive(Clone)]
pub(crate) struct TickSlot {
    shared: Weak<Shared>,
    key: u64,
}

impl TickSlot {
    /// Ticks the replica as soon as a thread is free (after the tick in
    /// progress, if one is).
    pub(crate) fn wake(&self) {
        if let Some(shared) = self.shared.upgrade() {
            shared.wake(self.key);
        }
    }
}

struct Slot {
    target: Weak<dyn Tick>,
    /// When it is due (the heap may hold older entries for it: only the
    /// one matching `due` counts).
    due: Instant,
    running: bool,
    /// Woken while its tick ran: tick again at once.
    rewake: bool,
}

#[derive(Default)]
struct Queue {
    slots: HashMap<u64, Slot>,
    heap: BinaryHeap<Reverse<(Instant, u64)>>,
    next_key: u64,
    stopping: bool,
    /// The deadline the one thread waiting for the next due slot sleeps
    /// until (None: no thread waits for a time; the others wait to be
    /// told).
    timer: Option<Instant>,
    /// Threads waiting on `ready`.
    idle: usize,
}

/// How late a tick may run so that ticks due close together are run in one
/// wake-up: thousands of replicas ticking every 50 ms cost a few hundred
/// wake-ups a second, not thousands.
const SLACK: Duration = Duration::from_millis(5);

struct Shared {
    queue: Mutex<Queue>,
    /// Idle threads with nothing to wait for but work.
    ready: Condvar,
    /// The thread waiting for the next due slot.
    timer: Condvar,
}

impl Shared {
    /// Puts `key` in line at `due`, and makes sure a thread will run it
    /// then (`worker`: the caller is a ticker thread about to look for work
    /// itself).
    fn schedule(&self, q: &mut Queue, key: u64, due: Instant, worker: bool) {
        q.heap.push(Reverse((due, key)));
        let now = Instant::now();
        if due <= now {
            if !worker && q.idle > 0 {
                self.ready.notify_one();
            } else if !worker {
                self.timer.notify_one();
            }
            return;
        }
        match q.timer {
            Some(deadline) if due + SLACK < deadline => {
                self.timer.notify_one();
            }
            Some(_) => {}
            None if !worker && q.idle > 0 => {
                self.ready.notify_one();
            }
            None => {}
        }
    }

    fn wake(&self, key: u64) {
        let mut q = self.queue.lock();
        let now = Instant::now();
        let Some(slot) = q.slots.get_mut(&key) else {
            return;
        };
        if slot.running {
            slot.rewake = true;
            return;
        }
        if slot.due <= now {
            return;
        }
        slot.due = now;
        self.schedule(&mut q, key, now, false);
    }

    /// The next slot due, marked running; waits for one. `None` when the
    /// ticker stops.
    fn next(&self) -> Option<(u64, Arc<dyn Tick>)> {
        let mut q = self.queue.lock();
        loop {
            if q.stopping {
                return None;
            }
            let now = Instant::now();
            match q.heap.peek().copied() {
                Some(Reverse((due, key))) if due <= now => {
                    q.heap.pop();
                    let Some(slot) = q.slots.get_mut(&key) else {
                        continue;
                    };
                    if slot.running || slot.due != due {
                        continue;
                    }
                    let Some(target) = slot.target.upgrade() else {
                        q.slots.remove(&key);
                        continue;
                    };
                    slot.running = true;
                    // More is due than this thread can run now: another
                    // idle thread takes it.
                    let more = q.heap.peek().is_some_and(|Reverse((d, _))| *d <= now);
                    if more && q.idle > 0 {
                        self.ready.notify_one();
                    }
                    return Some((key, target));
                }
                Some(Reverse((due, _))) if q.timer.is_none() => {
                    let deadline = due + SLACK;
                    q.timer = Some(deadline);
                    self.timer.wait_until(&mut q, deadline);
                    q.timer = None;
                    // Another thread may wait for the next deadline now.
                    if q.idle > 0 {
                        self.ready.notify_one();
                    }
                }
                _ => {
                    q.idle += 1;
                    self.ready.wait(&mut q);
                    q.idle -= 1;
                }
            }
        }
    }

    /// Reschedules `key` after its tick asked for `next`.
    fn done(&self, key: u64, next: Option<Duration>) {
        let mut q = self.queue.lock();
        let Some(next) = next else {
            q.slots.remove(&key);
            return;
        };
        let Some(slot) = q.slots.get_mut(&key) else {
            return;
        };
        slot.running = false;
        let now = Instant::now();
        slot.due = if std::mem::take(&mut slot.rewake) {
            now
        } else {
            now + next
        };
        let due = slot.due;
        self.schedule(&mut q, key, due, true);
    }
}

/// The fixed set of ticker threads; see the module docs.
pub(crate) struct Ticker {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl Ticker {
    /// Starts `threads` ticker threads (at least one).
    pub(crate) fn start(threads: usize) -> std::io::Result<Ticker> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            ready: Condvar::new(),
            timer: Condvar::new(),
        });
        let mut handles = Vec::new();
        for i in 0..threads.max(1) {
            let s = shared.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("replica-ticker-{i}"))
                .spawn(move || {
                    while let Some((key, target)) = s.next() {
                        let next = target.tick();
                        drop(target);
                        s.done(key, next);
                    }
                });
            match spawned {
                Ok(h) => handles.push(h),
                Err(e) => {
                    let partial = Ticker {
                        shared,
                        threads: handles,
                    };
                    drop(partial);
                    return Err(e);
                }
            }
        }
        Ok(Ticker {
            shared,
            threads: handles,
        })
    }

    /// The default thread count: two per core, so that a replica's
    /// background disk work on one thread leaves the others ticking.
    pub(crate) fn default_threads() -> usize {
        std::thread::available_parallelism().map_or(2, |n| n.get()) * 2
    }

    /// Registers `target`, first ticked at once.
    pub(crate) fn register(&self, target: Weak<dyn Tick>) -> TickSlot {
        let mut q = self.shared.queue.lock();
        let key = q.next_key;
        q.next_key += 1;
        let now = Instant::now();
        q.slots.insert(
            key,
            Slot {
                target,
                due: now,
                running: false,
                rewake: false,
            },
        );
        self.shared.schedule(&mut q, key, now, false);
        drop(q);
        TickSlot {
            shared: Arc::downgrade(&self.shared),
            key,
        }
    }

    /// Replicas registered and not yet gone.
    #[cfg(test)]
    fn registered(&self) -> usize {
        self.shared.queue.lock().slots.len()
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.shared.queue.lock().stopping = true;
        self.shared.ready.notify_all();
        self.shared.timer.notify_all();
        for t in self.threads.drain(..) {
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

    struct Counter {
        ticks: AtomicU32,
        every: Duration,
        stop_after: u32,
        concurrent: AtomicBool,
        overlapped: AtomicBool,
    }

    impl Counter {
        fn new(every: Duration, stop_after: u32) -> Arc<Counter> {
            Arc::new(Counter {
                ticks: AtomicU32::new(0),
                every,
                stop_after,
                concurrent: AtomicBool::new(false),
                overlapped: AtomicBool::new(false),
            })
        }
    }

    impl Tick for Counter {
        fn tick(&self) -> Option<Duration> {
            if self.concurrent.swap(true, Ordering::SeqCst) {
                self.overlapped.store(true, Ordering::SeqCst);
            }
            std::thread::sleep(Duration::from_millis(1));
            let n = self.ticks.fetch_add(1, Ordering::SeqCst) + 1;
            self.concurrent.store(false, Ordering::SeqCst);
            (n < self.stop_after).then_some(self.every)
        }
    }

    fn wait_for(what: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !what() {
            assert!(Instant::now() < deadline, "timed out");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    #[test]
    fn many_targets_are_ticked_by_few_threads_until_they_stop() {
        let ticker = Ticker::start(2).unwrap();
        let targets: Vec<Arc<Counter>> = (0..200)
            .map(|_| Counter::new(Duration::from_millis(5), 3))
            .collect();
        for t in &targets {
            let weak: Weak<dyn Tick> = Arc::downgrade(&(t.clone() as Arc<dyn Tick>));
            ticker.register(weak);
        }
        wait_for(|| ticker.registered() == 0);
        for t in &targets {
            assert_eq!(t.ticks.load(Ordering::SeqCst), 3);
            assert!(!t.overlapped.load(Ordering::SeqCst));
        }
    }

    #[test]
    fn a_wake_ticks_at_once_and_a_dropped_target_leaves() {
        let ticker = Ticker::start(3).unwrap();
        let slow = Counter::new(Duration::from_secs(3600), u32::MAX);
        let as_tick: Arc<dyn Tick> = slow.clone();
        let slot = ticker.register(Arc::downgrade(&as_tick));
        wait_for(|| slow.ticks.load(Ordering::SeqCst) == 1);
        for n in 2..50 {
            slot.wake();
            wait_for(|| slow.ticks.load(Ordering::SeqCst) >= n);
        }
        assert!(!slow.overlapped.load(Ordering::SeqCst));
        // A dropped target leaves the ticker at its next turn.
        drop(as_tick);
        drop(slow);
        slot.wake();
        wait_for(|| ticker.registered() == 0);
    }

    /// Ticks once, telling the test it is inside the tick and waiting to be
    /// let go; asks for its next tick in an hour.
    struct Gated {
        entered: parking_lot::Mutex<std::sync::mpsc::Sender<()>>,
        release: parking_lot::Mutex<std::sync::mpsc::Receiver<()>>,
        ticks: AtomicU32,
    }

    impl Tick for Gated {
        fn tick(&self) -> Option<Duration> {
            let n = self.ticks.fetch_add(1, Ordering::SeqCst);
            if n == 0 {
                let _ = self.entered.lock().send(());
                let _ = self.release.lock().recv();
            }
            Some(Duration::from_secs(3600))
        }
    }

    #[test]
    fn a_wake_that_arrives_during_the_tick_ticks_again() {
        let ticker = Ticker::start(2).unwrap();
        let (entered_tx, entered) = std::sync::mpsc::channel();
        let (release, release_rx) = std::sync::mpsc::channel();
        let gated = Arc::new(Gated {
            entered: parking_lot::Mutex::new(entered_tx),
            release: parking_lot::Mutex::new(release_rx),
            ticks: AtomicU32::new(0),
        });
        let as_tick: Arc<dyn Tick> = gated.clone();
        let slot = ticker.register(Arc::downgrade(&as_tick));
        entered.recv().unwrap();
        slot.wake();
        release.send(()).unwrap();
        // Without the wake it would not run again for an hour.
        wait_for(|| gated.ticks.load(Ordering::SeqCst) >= 2);
    }
}
