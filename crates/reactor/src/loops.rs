//! The reactor's threads: the event loops (each with its ring, its
//! connections and its mailbox) and the offload pool, and [`Io`], what a
//! connection may do from a callback.

use io_uring::{opcode, squeue, types, IoUring};
use parking_lot::{Condvar, Mutex};
use std::any::Any;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Entries of each loop's submission queue.
const RING_ENTRIES: u32 = 1024;
/// How soon a loop calls back a connection that asked for a retry.
pub const RETRY_INTERVAL: Duration = Duration::from_micros(200);
/// Threads that run offloaded (blocking) work for all loops.
pub const OFFLOAD_THREADS: usize = 4;
/// `user_data` of the loop's own eventfd read.
const WAKE: u64 = u64::MAX;
/// `user_data` bit of entries that wait rather than work ([`Io::push_wait`]).
const WAITS: u64 = 1 << 31;

/// The result of an offloaded job, delivered to the connection that asked.
pub type Payload = Box<dyn Any + Send>;
type Job = Box<dyn FnOnce() -> Payload + Send>;
/// A job, the mailbox of the loop to deliver its result to, and the slot
/// of the connection there.
type Queued = (Job, Arc<Mailbox>, u32);

/// A connection served by a loop: a state machine driven by the loop.
pub trait Connection: Send {
    /// Called once, on its loop, when adopted.
    fn start(&mut self, io: &mut Io<'_>);
    /// A ring entry this connection submitted with `tag` (below 2^31: the
    /// top bit is the loop's) completed with `result` (a byte count, or a
    /// negative errno).
    fn completed(&mut self, io: &mut Io<'_>, tag: u32, result: i32);
    /// A job it offloaded finished with `payload`.
    fn delivered(&mut self, io: &mut Io<'_>, payload: Payload);
    /// After each round of completions and messages in which the loop
    /// called this connection: the place to do once what the round made
    /// necessary (send the replies it produced in one write).
    fn flush(&mut self, io: &mut Io<'_>);
    /// It asked for a retry ([`Io::retry_later`]).
    fn retry(&mut self, io: &mut Io<'_>);
    /// The reactor is stopping: end the connection as soon as its I/O in
    /// flight allows (in-flight requests need not be answered).
    fn stop(&mut self, io: &mut Io<'_>);
    /// Nothing in flight and nothing left to do: the loop drops it.
    fn finished(&self) -> bool;
}

/// What a connection can do from inside a callback.
pub struct Io<'a> {
    ring: &'a mut IoUring,
    slot: u32,
    mailbox: &'a Arc<Mailbox>,
    offload: &'a Offload,
    retry: &'a mut Vec<u32>,
    in_flight: &'a mut usize,
}

impl Io<'_> {
    /// Submits a ring entry that does work (disk I/O, a send); its
    /// completion comes back as [`Connection::completed`] with `tag`.
    ///
    /// # Safety
    /// Every buffer and file descriptor the entry refers to must stay
    /// valid, and buffers unmoved, until that completion has been delivered.
    pub unsafe fn push(&mut self, entry: squeue::Entry, tag: u32) {
        *self.in_flight += 1;
        // SAFETY: passed on from the caller.
        unsafe { self.push_tagged(entry, u64::from(tag)) }
    }

    /// [`Io::push`] of an entry that waits for a peer (socket readiness),
    /// which does not count as work in flight ([`Io::loop_in_flight`]).
    ///
    /// # Safety
    /// As for [`Io::push`].
    pub unsafe fn push_wait(&mut self, entry: squeue::Entry, tag: u32) {
        // SAFETY: passed on from the caller.
        unsafe { self.push_tagged(entry, WAITS | u64::from(tag)) }
    }

    unsafe fn push_tagged(&mut self, entry: squeue::Entry, tag: u64) {
        let entry = entry.user_data((u64::from(self.slot) << 32) | tag);
        loop {
            // SAFETY: the caller guarantees the entry's buffers outlive it.
            let pushed = unsafe { self.ring.submission().push(&entry) };
            if pushed.is_ok() {
                return;
            }
            // The queue is full: hand what it holds to the kernel first.
            if let Err(e) = self.ring.submit() {
                if e.raw_os_error() != Some(libc::EBUSY) {
                    tracing::error!(error = %e, "io_uring submit failed");
                }
                std::thread::yield_now();
            }
        }
    }

    /// Runs `job` on the offload pool; its result comes back to this
    /// connection, on this loop, as [`Connection::delivered`].
    pub fn offload(&mut self, job: impl FnOnce() -> Payload + Send + 'static) {
        *self.in_flight += 1;
        self.offload
            .run(Box::new(job), Arc::clone(self.mailbox), self.slot);
    }

    /// A promise to deliver one payload to this connection, on this loop,
    /// from any thread: for work this connection started elsewhere that
    /// completes on a thread of its own (a replicated request completes on
    /// the thread that brings its last reply). Counts as work in flight
    /// until delivered; dropped undelivered, it delivers [`JobPanicked`].
    pub fn deliverer(&mut self) -> Deliverer {
        *self.in_flight += 1;
        Deliverer {
            mailbox: Some(Arc::clone(self.mailbox)),
            slot: self.slot,
        }
    }

    /// Calls [`Connection::retry`] after about [`RETRY_INTERVAL`] (or
    /// sooner, after the loop's next completions).
    pub fn retry_later(&mut self) {
        if !self.retry.contains(&self.slot) {
            self.retry.push(self.slot);
        }
    }

    /// Working ring entries ([`Io::push`]) and offloaded jobs of every
    /// connection on this loop still in flight. A connection that sees 0 here knows nobody else
    /// on the loop waits for it.
    pub fn loop_in_flight(&self) -> usize {
        *self.in_flight
    }
}

/// See [`Io::deliverer`].
pub struct Deliverer {
    mailbox: Option<Arc<Mailbox>>,
    slot: u32,
}

impl Deliverer {
    /// Hands `payload` to the connection as [`Connection::delivered`], on
    /// its loop (waking the loop if it sleeps).
    pub fn deliver(mut self, payload: Payload) {
        if let Some(mailbox) = self.mailbox.take() {
            mailbox.send(Message::Deliver {
                slot: self.slot,
                payload,
            });
        }
    }
}

impl Drop for Deliverer {
    fn drop(&mut self) {
        // Undelivered: the work was lost (its owner dropped it). The
        // connection still hears back, so its count of work in flight ends.
        if let Some(mailbox) = self.mailbox.take() {
            mailbox.send(Message::Deliver {
                slot: self.slot,
                payload: Box::new(JobPanicked),
            });
        }
    }
}

enum Message {
    Adopt(Box<dyn Connection>),
    Deliver { slot: u32, payload: Payload },
    Stop,
}

type Mailbox = crate::mailbox::Mailbox<Message>;

/// The pool of threads that run blocking work for the loops.
struct Offload {
    jobs: Mutex<Option<std::sync::mpsc::Sender<Queued>>>,
}

impl Offload {
    fn run(&self, job: Job, mailbox: Arc<Mailbox>, slot: u32) {
        let sent = match &*self.jobs.lock() {
            Some(tx) => tx.send((job, mailbox, slot)).map_err(|e| e.0),
            None => Err((job, mailbox, slot)),
        };
        // The pool is gone (reactor stopping): run it here rather than
        // leave the connection waiting forever.
        if let Err((job, mailbox, slot)) = sent {
            mailbox.send(Message::Deliver {
                slot,
                payload: run_job(job),
            });
        }
    }
}

/// The payload delivered for a job that panicked (the panic is logged).
#[derive(Debug)]
pub struct JobPanicked;

fn run_job(job: Job) -> Payload {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)) {
        Ok(payload) => payload,
        Err(_) => {
            tracing::error!("an offloaded job panicked");
            Box::new(JobPanicked)
        }
    }
}

/// One event loop per CPU the process may run on: the default of every
/// frontend. (On a small machine that also runs the clients, fewer can
/// serve disk-bound connections better; BENCHMARKS.md, issue 20.)
pub fn default_loops() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The event loops a frontend serves its connections on: its own (it
/// stops them when it shuts down) or a set shared with other frontends
/// (their owner stops them, after every frontend on them shut down; a
/// frontend then waits for its own connections to end instead).
#[derive(Clone)]
pub enum Loops {
    Own(Arc<Reactor>),
    Shared(Arc<Reactor>),
}

impl Loops {
    pub fn reactor(&self) -> &Arc<Reactor> {
        match self {
            Loops::Own(reactor) | Loops::Shared(reactor) => reactor,
        }
    }
}

/// A set of event loops and their offload pool.
pub struct Reactor {
    loops: Vec<Arc<Mailbox>>,
    next: AtomicUsize,
    offload: Arc<Offload>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Loops that have not exited yet, and a condvar signalled as each does.
    running: Arc<(Mutex<usize>, Condvar)>,
    /// Every loop has exited.
    stopped: AtomicBool,
}

impl Reactor {
    /// Starts `loops` event loops (at least one) named `{name}-loop-N`.
    pub fn start(name: &str, loops: usize) -> io::Result<Arc<Reactor>> {
        let (tx, rx) = std::sync::mpsc::channel::<Queued>();
        let mut reactor = Reactor {
            loops: Vec::new(),
            next: AtomicUsize::new(0),
            offload: Arc::new(Offload {
                jobs: Mutex::new(Some(tx)),
            }),
            threads: Mutex::new(Vec::new()),
            running: Arc::new((Mutex::new(0), Condvar::new())),
            stopped: AtomicBool::new(false),
        };
        // On error, dropping `reactor` stops what was started.
        let rx = Arc::new(Mutex::new(rx));
        for n in 0..OFFLOAD_THREADS {
            let rx = Arc::clone(&rx);
            let worker = std::thread::Builder::new()
                .name(format!("{name}-offload-{n}"))
                .spawn(move || loop {
                    let next = rx.lock().recv();
                    let Ok((job, mailbox, slot)) = next else {
                        return;
                    };
                    mailbox.send(Message::Deliver {
                        slot,
                        payload: run_job(job),
                    });
                })?;
            reactor.threads.lock().push(worker);
        }
        for n in 0..loops.max(1) {
            let mailbox = Arc::new(Mailbox::new()?);
            let offload = Arc::clone(&reactor.offload);
            let running = Arc::clone(&reactor.running);
            let (ready, started) = std::sync::mpsc::channel::<io::Result<()>>();
            *running.0.lock() += 1;
            let spawned = std::thread::Builder::new()
                .name(format!("{name}-loop-{n}"))
                .spawn({
                    let mailbox = Arc::clone(&mailbox);
                    let running = Arc::clone(&running);
                    move || {
                        // Built here: a single-issuer ring belongs to the
                        // thread that creates it.
                        match new_ring() {
                            Ok(ring) => {
                                let _ = ready.send(Ok(()));
                                EventLoop::new(ring, mailbox, offload).run();
                            }
                            Err(e) => {
                                let _ = ready.send(Err(e));
                            }
                        }
                        let (count, cv) = &*running;
                        *count.lock() -= 1;
                        cv.notify_all();
                    }
                });
            let thread = match spawned {
                Ok(thread) => thread,
                Err(e) => {
                    *running.0.lock() -= 1;
                    return Err(e);
                }
            };
            reactor.threads.lock().push(thread);
            reactor.loops.push(mailbox);
            started
                .recv()
                .unwrap_or_else(|_| Err(io::Error::other("event loop thread ended at start")))?;
        }
        Ok(Arc::new(reactor))
    }

    /// Loops in this reactor.
    pub fn loops(&self) -> usize {
        self.loops.len()
    }

    /// Gives a connection to the loop holding the fewest.
    pub fn adopt(&self, connection: Box<dyn Connection>) {
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let n = self.loops.len();
        let chosen = (0..n)
            .map(|k| &self.loops[(start + k) % n])
            .min_by_key(|m| m.connections.load(Ordering::Relaxed));
        if self.stopped.load(Ordering::SeqCst) {
            // No loop will take it: it ends here (it has nothing in flight).
            drop(connection);
            return;
        }
        if let Some(mailbox) = chosen {
            mailbox.connections.fetch_add(1, Ordering::Relaxed);
            mailbox.send(Message::Adopt(connection));
            // Stopped meanwhile: no loop will drain the mailbox now.
            if self.stopped.load(Ordering::SeqCst) {
                drop(mailbox.take_all());
            }
        }
    }

    /// Stops every connection, waits for the loops to empty and joins
    /// every thread. Idempotent.
    pub fn stop(&self) {
        let threads = std::mem::take(&mut *self.threads.lock());
        if threads.is_empty() {
            return;
        }
        for mailbox in &self.loops {
            mailbox.send(Message::Stop);
        }
        {
            let (count, cv) = &*self.running;
            let mut left = count.lock();
            while *left > 0 {
                cv.wait(&mut left);
            }
        }
        // Loops are gone: connections handed over since are dropped here
        // (never started, nothing in flight), and later ones at once.
        self.stopped.store(true, Ordering::SeqCst);
        for mailbox in &self.loops {
            drop(mailbox.take_all());
        }
        // Close the job queue so the workers end.
        self.offload.jobs.lock().take();
        for t in threads {
            if t.join().is_err() {
                tracing::error!("event loop or offload thread panicked");
            }
        }
    }
}

impl Drop for Reactor {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A loop's ring: only its thread submits and waits, so completions are
/// run when it waits (DEFER_TASKRUN) instead of interrupting whatever it is
/// doing; kernels before 6.1 get a plain ring.
fn new_ring() -> io::Result<IoUring> {
    IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .build(RING_ENTRIES)
        .or_else(|_| IoUring::builder().setup_coop_taskrun().build(RING_ENTRIES))
        .or_else(|_| IoUring::new(RING_ENTRIES))
}

struct EventLoop {
    ring: IoUring,
    mailbox: Arc<Mailbox>,
    offload: Arc<Offload>,
    connections: Vec<Option<Box<dyn Connection>>>,
    free: Vec<u32>,
    retry: Vec<u32>,
    /// Connections called back in this round, to flush after it.
    touched: Vec<u32>,
    in_flight: usize,
    stopping: bool,
    /// Where the eventfd read lands: leaked, because the kernel may still
    /// hold that read when the loop exits.
    wake_buf: &'static mut u64,
    completions: Vec<(u64, i32)>,
}

impl EventLoop {
    fn new(ring: IoUring, mailbox: Arc<Mailbox>, offload: Arc<Offload>) -> EventLoop {
        EventLoop {
            ring,
            mailbox,
            offload,
            connections: Vec::new(),
            free: Vec::new(),
            retry: Vec::new(),
            touched: Vec::new(),
            in_flight: 0,
            stopping: false,
            wake_buf: Box::leak(Box::new(0)),
            completions: Vec::with_capacity(RING_ENTRIES as usize),
        }
    }

    fn arm_wake(&mut self) {
        let entry = opcode::Read::new(
            types::Fd(self.mailbox.doorbell().fd()),
            (self.wake_buf as *mut u64).cast(),
            8,
        )
        .build()
        .user_data(WAKE);
        loop {
            // SAFETY: the eventfd and the boxed counter live as long as
            // the loop, which reaps this entry before it exits or leaks.
            if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                return;
            }
            let _ = self.ring.submit();
        }
    }

    fn run(mut self) {
        self.arm_wake();
        loop {
            self.drain_mailbox();
            self.flush_touched();
            if self.stopping && self.connections.iter().all(Option::is_none) {
                break;
            }
            if let Err(e) = self.wait() {
                tracing::error!(error = %e, "event loop cannot wait on its ring; stopping");
                // Buffers may still belong to the kernel: never free them.
                std::mem::forget(std::mem::take(&mut self.connections));
                std::mem::forget(self);
                return;
            }
            self.completions.clear();
            for cqe in self.ring.completion() {
                self.completions.push((cqe.user_data(), cqe.result()));
            }
            let completions = std::mem::take(&mut self.completions);
            for &(user_data, result) in &completions {
                if user_data == WAKE {
                    self.arm_wake();
                    continue;
                }
                if user_data & WAITS == 0 {
                    self.in_flight = self.in_flight.saturating_sub(1);
                }
                let slot = (user_data >> 32) as u32;
                let tag = (user_data & !WAITS) as u32;
                self.call(slot, |c, io| c.completed(io, tag, result));
            }
            self.completions = completions;
            for slot in std::mem::take(&mut self.retry) {
                self.call(slot, |c, io| c.retry(io));
            }
            self.flush_touched();
        }
    }

    /// Sleeps until at least one completion (or a retry is due).
    fn wait(&mut self) -> io::Result<()> {
        // A message queued between the drain and here must not be slept on.
        let pending = !self.mailbox.prepare_sleep();
        let result = if pending {
            self.ring.submit().map(|_| ())
        } else if self.retry.is_empty() {
            self.ring.submit_and_wait(1).map(|_| ())
        } else {
            let ts = types::Timespec::from(RETRY_INTERVAL);
            let args = types::SubmitArgs::new().timespec(&ts);
            self.ring.submitter().submit_with_args(1, &args).map(|_| ())
        };
        self.mailbox.awake();
        match result {
            Ok(()) => Ok(()),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR | libc::ETIME | libc::EBUSY)
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Calls `flush` on every connection called back since the last time.
    fn flush_touched(&mut self) {
        let mut touched = std::mem::take(&mut self.touched);
        // Flushing may call back more (a send that completes synchronously
        // does not, but stay general): loop until quiet.
        while !touched.is_empty() {
            for slot in touched.drain(..) {
                self.call_untouched(slot, |c, io| c.flush(io));
            }
            std::mem::swap(&mut touched, &mut self.touched);
        }
        self.touched = touched;
    }

    fn drain_mailbox(&mut self) {
        let messages = self.mailbox.take_all();
        for message in messages {
            match message {
                Message::Adopt(connection) => {
                    let slot = match self.free.pop() {
                        Some(slot) => slot,
                        None => {
                            self.connections.push(None);
                            (self.connections.len() - 1) as u32
                        }
                    };
                    self.connections[slot as usize] = Some(connection);
                    self.call(slot, |c, io| c.start(io));
                    if self.stopping {
                        self.call(slot, |c, io| c.stop(io));
                    }
                }
                Message::Deliver { slot, payload } => {
                    self.in_flight = self.in_flight.saturating_sub(1);
                    self.call(slot, |c, io| c.delivered(io, payload));
                }
                Message::Stop => {
                    self.stopping = true;
                    for slot in 0..self.connections.len() as u32 {
                        self.call(slot, |c, io| c.stop(io));
                    }
                }
            }
        }
    }

    /// Runs one callback of the connection in `slot`, then drops the
    /// connection if it finished.
    fn call(&mut self, slot: u32, f: impl FnOnce(&mut dyn Connection, &mut Io<'_>)) {
        if !self.touched.contains(&slot) {
            self.touched.push(slot);
        }
        self.call_untouched(slot, f);
    }

    fn call_untouched(&mut self, slot: u32, f: impl FnOnce(&mut dyn Connection, &mut Io<'_>)) {
        let Some(mut connection) = self
            .connections
            .get_mut(slot as usize)
            .and_then(Option::take)
        else {
            return;
        };
        let mut io = Io {
            ring: &mut self.ring,
            slot,
            mailbox: &self.mailbox,
            offload: &self.offload,
            retry: &mut self.retry,
            in_flight: &mut self.in_flight,
        };
        f(connection.as_mut(), &mut io);
        if connection.finished() {
            drop(connection);
            self.free.push(slot);
            self.mailbox.connections.fetch_sub(1, Ordering::Relaxed);
        } else {
            self.connections[slot as usize] = Some(connection);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::time::Instant;

    /// Offloads `jobs` jobs and submits `nops` ring entries, retries
    /// `retries` times, and finishes when all came back.
    struct Counter {
        jobs: u32,
        nops: u32,
        retries: u32,
        delivered: Vec<u32>,
        completed: u32,
        retried: u32,
        done: Arc<AtomicUsize>,
    }

    impl Connection for Counter {
        fn start(&mut self, io: &mut Io<'_>) {
            for n in 0..self.jobs {
                io.offload(move || {
                    std::thread::sleep(Duration::from_micros(u64::from(n % 7) * 50));
                    Box::new(n)
                });
            }
            for n in 0..self.nops {
                // SAFETY: a NOP refers to no buffer.
                unsafe { io.push(opcode::Nop::new().build(), n) };
            }
            if self.retries > 0 {
                io.retry_later();
            }
        }
        fn completed(&mut self, _io: &mut Io<'_>, tag: u32, result: i32) {
            assert_eq!(result, 0);
            assert!(tag < self.nops);
            self.completed += 1;
        }
        fn delivered(&mut self, _io: &mut Io<'_>, payload: Payload) {
            let n = *payload.downcast::<u32>().expect("a u32 payload");
            self.delivered.push(n);
        }
        fn flush(&mut self, _io: &mut Io<'_>) {}
        fn retry(&mut self, io: &mut Io<'_>) {
            self.retried += 1;
            if self.retried < self.retries {
                io.retry_later();
            }
        }
        fn stop(&mut self, _io: &mut Io<'_>) {}
        fn finished(&self) -> bool {
            self.delivered.len() == self.jobs as usize
                && self.completed == self.nops
                && self.retried == self.retries
        }
    }

    impl Drop for Counter {
        /// Dropped by its loop once finished: everything came back once.
        fn drop(&mut self) {
            let mut seen = std::mem::take(&mut self.delivered);
            seen.sort_unstable();
            if seen.iter().copied().eq(0..self.jobs) && self.completed == self.nops {
                self.done.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    #[test]
    fn jobs_entries_and_retries_come_back_to_their_connection() {
        let reactor = Reactor::start("test", 2).expect("reactor");
        let done = Arc::new(AtomicUsize::new(0));
        // Adopted from several threads at once, while the loops run.
        let adopters: Vec<_> = (0..4)
            .map(|_| {
                let reactor = Arc::clone(&reactor);
                let done = Arc::clone(&done);
                std::thread::spawn(move || {
                    for k in 0..50 {
                        reactor.adopt(Box::new(Counter {
                            jobs: k % 5,
                            nops: k % 3,
                            retries: k % 4,
                            delivered: Vec::new(),
                            completed: 0,
                            retried: 0,
                            done: Arc::clone(&done),
                        }));
                    }
                })
            })
            .collect();
        for a in adopters {
            a.join().expect("adopter");
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while done.load(Ordering::SeqCst) < 200 {
            assert!(Instant::now() < deadline, "connections did not finish");
            std::thread::sleep(Duration::from_millis(5));
        }
        reactor.stop();
    }

    /// Hands `n` deliverers to other threads, which deliver them (or drop
    /// every third undelivered); finishes when all came back.
    struct Promised {
        n: u32,
        back: u32,
        lost: u32,
        done: Arc<AtomicUsize>,
    }

    impl Connection for Promised {
        fn start(&mut self, io: &mut Io<'_>) {
            for k in 0..self.n {
                let d = io.deliverer();
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_micros(u64::from(k % 5) * 100));
                    if k % 3 == 0 {
                        drop(d);
                    } else {
                        d.deliver(Box::new(k));
                    }
                });
            }
        }
        fn completed(&mut self, _io: &mut Io<'_>, _tag: u32, _result: i32) {}
        fn delivered(&mut self, _io: &mut Io<'_>, payload: Payload) {
            if payload.is::<JobPanicked>() {
                self.lost += 1;
            }
            self.back += 1;
        }
        fn flush(&mut self, _io: &mut Io<'_>) {}
        fn retry(&mut self, _io: &mut Io<'_>) {}
        fn stop(&mut self, _io: &mut Io<'_>) {}
        fn finished(&self) -> bool {
            self.back == self.n
        }
    }

    impl Drop for Promised {
        fn drop(&mut self) {
            if self.back == self.n && self.lost == self.n.div_ceil(3) {
                self.done.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    /// Work a connection started elsewhere reports back once, from any
    /// thread, delivered or dropped: the connection counts it in flight
    /// until then and finishes only after.
    #[test]
    fn deliverers_report_back_once_delivered_or_dropped() {
        let reactor = Reactor::start("test", 2).expect("reactor");
        let done = Arc::new(AtomicUsize::new(0));
        for n in 0..20 {
            reactor.adopt(Box::new(Promised {
                n,
                back: 0,
                lost: 0,
                done: Arc::clone(&done),
            }));
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while done.load(Ordering::SeqCst) < 20 {
            assert!(Instant::now() < deadline, "connections did not finish");
            std::thread::sleep(Duration::from_millis(5));
        }
        reactor.stop();
    }

    /// Waits for a pipe to become readable; `stop` makes it so.
    struct Waiter {
        read: OwnedFd,
        write: Option<OwnedFd>,
        armed: bool,
    }

    impl Connection for Waiter {
        fn start(&mut self, io: &mut Io<'_>) {
            let entry =
                opcode::PollAdd::new(types::Fd(self.read.as_raw_fd()), libc::POLLIN as u32).build();
            // SAFETY: the pipe lives as long as the connection, which is
            // not dropped while the poll is armed.
            unsafe { io.push_wait(entry, 1) };
            self.armed = true;
        }
        fn completed(&mut self, _io: &mut Io<'_>, _tag: u32, _result: i32) {
            self.armed = false;
        }
        fn delivered(&mut self, _io: &mut Io<'_>, _payload: Payload) {}
        fn flush(&mut self, _io: &mut Io<'_>) {}
        fn retry(&mut self, _io: &mut Io<'_>) {}
        fn stop(&mut self, _io: &mut Io<'_>) {
            // Closing the write end makes the read end readable (EOF).
            self.write.take();
        }
        fn finished(&self) -> bool {
            !self.armed
        }
    }

    #[test]
    fn a_connection_handed_over_after_stop_is_dropped_not_leaked() {
        let reactor = Reactor::start("test", 1).expect("reactor");
        reactor.stop();
        let done = Arc::new(AtomicUsize::new(0));
        reactor.adopt(Box::new(Counter {
            jobs: 0,
            nops: 0,
            retries: 0,
            delivered: Vec::new(),
            completed: 0,
            retried: 0,
            done: Arc::clone(&done),
        }));
        assert_eq!(done.load(Ordering::SeqCst), 1, "dropped at once");
    }

    #[test]
    fn stop_waits_for_connections_to_end_what_they_wait_for() {
        let reactor = Reactor::start("test", 2).expect("reactor");
        for _ in 0..10 {
            let mut fds = [0; 2];
            // SAFETY: pipe2 fills two new descriptors we then own.
            assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
            // SAFETY: fresh descriptors nobody else owns.
            let (read, write) =
                unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
            reactor.adopt(Box::new(Waiter {
                read,
                write: Some(write),
                armed: false,
            }));
        }
        // Returns only once every waiter's poll completed and it was dropped.
        reactor.stop();
        assert!(reactor
            .loops
            .iter()
            .all(|m| m.connections.load(Ordering::SeqCst) == 0));
    }
}
