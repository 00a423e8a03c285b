//! `BlockIo` on a real event loop over a real store: seeded mixes of
//! reads, writes (aligned and not, FUA or not) and commands, started all
//! at once or one at a time (the lone, inline paths), checked against a
//! model of the volume; a FUA write whose commit fails is reported
//! failed; QoS limits hold on the loop, and a stopping connection does not
//! wait for requests its volume's limits hold back.

use basalt_loop_io::{BlockIo, Outcome, Work};
use basalt_reactor::{Connection, Io, Payload, Reactor};
use basalt_store::{AlignedBuf, BlockDevice, FileDevice, FormatOptions, IoError, SimDevice, Store};
use basalt_volume::qos::{QosSpec, Throttle};
use basalt_volume::{VolumeHandle, VolumeStats};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

const EXTENT: u64 = 64 * 1024;
const VOLUME: u64 = 8 << 20;

type Result1 = Result<(), IoError>;

/// What one request ended with: its token, outcome and buffer.
type Done = (usize, Outcome<Result1>, Option<AlignedBuf>);

/// A connection that starts `works` (all at once, or each after the
/// previous finished) and reports what they ended with when dropped.
struct Driver {
    block_io: BlockIo<usize, Result1>,
    works: Vec<Work<Result1>>,
    next: usize,
    one_at_a_time: bool,
    done: Vec<Done>,
    report: Option<mpsc::Sender<Vec<Done>>>,
}

impl Driver {
    fn start_more(&mut self, io: &mut Io<'_>) {
        while self.next < self.works.len() {
            if self.one_at_a_time && self.block_io.in_flight() > 0 {
                return;
            }
            let work = std::mem::replace(
                &mut self.works[self.next],
                Work::Command(Box::new(|_| Ok(()))),
            );
            self.block_io.start(io, self.next, work, self.one_at_a_time);
            self.next += 1;
            self.collect();
        }
    }

    fn collect(&mut self) {
        while let Some(f) = self.block_io.pop_finished() {
            self.done.push((f.token, f.outcome, f.buf));
        }
    }

    fn progress(&mut self, io: &mut Io<'_>) {
        self.collect();
        self.start_more(io);
    }
}

impl Connection for Driver {
    fn start(&mut self, io: &mut Io<'_>) {
        self.start_more(io);
    }
    fn completed(&mut self, io: &mut Io<'_>, tag: u32, result: i32) {
        self.block_io.completed(io, tag, result);
        self.progress(io);
    }
    fn delivered(&mut self, io: &mut Io<'_>, payload: Payload) {
        assert!(
            self.block_io.delivered(io, payload).is_none(),
            "foreign message"
        );
        self.progress(io);
    }
    fn flush(&mut self, _io: &mut Io<'_>) {}
    fn retry(&mut self, io: &mut Io<'_>) {
        self.block_io.retry(io);
        self.progress(io);
    }
    fn stop(&mut self, io: &mut Io<'_>) {
        // Whatever was not started is given up.
        self.next = self.works.len();
        self.block_io.cancel_throttled(io);
        self.collect();
    }
    fn finished(&self) -> bool {
        self.next == self.works.len() && self.block_io.in_flight() == 0
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        if let Some(report) = self.report.take() {
            let _ = report.send(std::mem::take(&mut self.done));
        }
    }
}

fn store_on(device: Arc<dyn BlockDevice>) -> (Arc<Store>, VolumeHandle) {
    let store = Store::create(
        device,
        &FormatOptions {
            extent_size: Some(EXTENT as u32),
            ..Default::default()
        },
    )
    .expect("format store");
    let id = uuid::Uuid::new_v4();
    store.create_volume(id, VOLUME).expect("create volume");
    let local = store.volume(id).expect("open volume");
    let handle = VolumeHandle::new(local, "v".into(), Arc::new(VolumeStats::default()));
    (store, handle)
}

/// Runs `works` on a loop of `reactor`; what each ended with, by token.
fn run(
    reactor: &Reactor,
    handle: &VolumeHandle,
    works: Vec<Work<Result1>>,
    one_at_a_time: bool,
) -> Vec<Done> {
    let (tx, rx) = mpsc::channel();
    let driver = Driver {
        block_io: BlockIo::new(handle.clone()),
        works,
        next: 0,
        one_at_a_time,
        done: Vec::new(),
        report: Some(tx),
    };
    reactor.adopt(Box::new(driver));
    let mut done = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the requests finish");
    done.sort_by_key(|d| d.0);
    done
}

fn buf_of(bytes: &[u8]) -> AlignedBuf {
    let mut buf = AlignedBuf::zeroed(bytes.len());
    buf.copy_from_slice(bytes);
    buf
}

/// A small deterministic generator (the seed names a history).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One seeded history: rounds of writes to disjoint 4 KiB-aligned regions
/// (inside them, offsets and lengths may be unaligned), flushes and trims,
/// then reads of everything, compared with the model.
fn history(seed: u64, reactor: &Reactor, handle: &VolumeHandle, one_at_a_time: bool) {
    let mut rng = Lcg(seed);
    // The volume as earlier histories left it.
    let mut model = vec![0u8; VOLUME as usize];
    handle.read(0, &mut model).expect("read the volume");
    for round in 0..4 {
        let mut works = Vec::new();
        let mut expect_ok = Vec::new();
        let mut region = 0u64;
        while region < VOLUME {
            let end = (region + (1 + rng.below(24)) * 4096).min(VOLUME);
            let blocks = (end - region) / 4096;
            match rng.below(10) {
                0..=5 => {
                    // A write somewhere inside the region.
                    let unaligned = rng.below(4) == 0;
                    let (start, len) = if unaligned {
                        let s = region + rng.below(end - region - 1);
                        (s, 1 + rng.below(end - s))
                    } else {
                        let b = rng.below(blocks);
                        let n = 1 + rng.below(blocks - b);
                        (region + b * 4096, n * 4096)
                    };
                    let len = len.min(end - start);
                    let data: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
                    model[start as usize..(start + len) as usize].copy_from_slice(&data);
                    works.push(Work::Write {
                        offset: start,
                        buf: buf_of(&data),
                        fua: rng.below(3) == 0,
                        early: None,
                    });
                    expect_ok.push(true);
                }
                6 => {
                    // Trim whole blocks of the region: they read as zeros.
                    let (start, len) = (region, end - region);
                    model[start as usize..end as usize].fill(0);
                    works.push(Work::Command(Box::new(move |h: &VolumeHandle| {
                        h.trim(start, len, false)
                    })));
                    expect_ok.push(true);
                }
                7 => {
                    works.push(Work::Command(Box::new(|h: &VolumeHandle| h.flush())));
                    expect_ok.push(true);
                }
                _ => {}
            }
            region = end;
        }
        let done = run(reactor, handle, works, one_at_a_time);
        assert_eq!(done.len(), expect_ok.len(), "seed {seed} round {round}");
        for (token, outcome, _) in &done {
            match outcome {
                Outcome::Data(Ok(())) | Outcome::Command(Ok(Ok(()))) => {}
                other => panic!("seed {seed} round {round}: request {token} ended {other:?}"),
            }
        }
        // Read everything back, in pieces of varied size and alignment.
        let mut works = Vec::new();
        let mut at = 0u64;
        let mut ranges = Vec::new();
        while at < VOLUME {
            let len = if rng.below(5) == 0 {
                1 + rng.below(9000)
            } else {
                4096 * (1 + rng.below(32))
            }
            .min(VOLUME - at);
            works.push(Work::Read {
                offset: at,
                buf: AlignedBuf::zeroed(len as usize),
            });
            ranges.push((at, len));
            at += len;
        }
        let done = run(reactor, handle, works, one_at_a_time);
        assert_eq!(done.len(), ranges.len());
        for ((token, outcome, buf), (at, len)) in done.iter().zip(&ranges) {
            assert!(
                matches!(outcome, Outcome::Data(Ok(()))),
                "seed {seed}: read {token} ended {outcome:?}"
            );
            let buf = buf.as_ref().expect("a read's buffer comes back");
            let want = &model[*at as usize..(*at + *len) as usize];
            if buf[..] != *want {
                let first = (0..want.len()).find(|&i| buf[i] != want[i]).unwrap_or(0);
                let last = (0..want.len())
                    .rev()
                    .find(|&i| buf[i] != want[i])
                    .unwrap_or(0);
                panic!(
                    "seed {seed} round {round}: read of {len} bytes at {at} differs from the \
                     model at bytes {}..={} (got {:#x}, want {:#x})",
                    *at + first as u64,
                    *at + last as u64,
                    buf[first],
                    want[first]
                );
            }
        }
    }
}

#[test]
fn seeded_histories_on_the_ring_match_the_model() {
    let dir = tempfile::tempdir().expect("tempdir");
    let device = FileDevice::create(&dir.path().join("data"), 64 << 20, false).expect("data file");
    let (_store, handle) = store_on(device);
    let reactor = Reactor::start("test-loop", 1).expect("reactor");
    for seed in [1, 2, 3] {
        history(seed, &reactor, &handle, false);
    }
    // A queue-depth-1 client: lone requests, inline blocking work.
    history(4, &reactor, &handle, true);
    reactor.stop();
}

#[test]
fn seeded_histories_without_a_ring_match_the_model() {
    // A memory device has no ring: pieces run on the loop thread.
    let (_store, handle) = store_on(SimDevice::new(64 << 20, 5));
    let reactor = Reactor::start("test-loop", 2).expect("reactor");
    history(11, &reactor, &handle, false);
    history(12, &reactor, &handle, true);
    reactor.stop();
}

#[test]
fn a_fua_write_fails_with_the_commit_it_needed() {
    let device = SimDevice::new(64 << 20, 9);
    let (_store, handle) = store_on(Arc::clone(&device) as Arc<dyn BlockDevice>);
    let reactor = Reactor::start("test-loop", 1).expect("reactor");
    let block = vec![0x5au8; 4096];
    // Allocate two extents (committed on the pool), then leave metadata
    // pending: a trim without FUA.
    let setup = vec![
        Work::Write {
            offset: 0,
            buf: buf_of(&block),
            fua: true,
            early: None,
        },
        Work::Write {
            offset: EXTENT,
            buf: buf_of(&block),
            fua: true,
            early: None,
        },
    ];
    let done = run(&reactor, &handle, setup, false);
    assert!(done.iter().all(|d| matches!(d.1, Outcome::Data(Ok(())))));
    handle.trim(EXTENT, EXTENT, false).expect("trim");
    // The FUA write's data reaches the device; the commit it needs (the
    // trim's metadata is pending) does not.
    device.cut_power_after(1);
    let done = run(
        &reactor,
        &handle,
        vec![Work::Write {
            offset: 0,
            buf: buf_of(&block),
            fua: true,
            early: None,
        }],
        false,
    );
    assert!(
        matches!(done[0].1, Outcome::Data(Err(_))),
        "a FUA write whose commit failed must fail, got {:?}",
        done[0].1
    );
    reactor.stop();
}

fn throttled(handle: &VolumeHandle, spec: &str) -> VolumeHandle {
    let limits = QosSpec::parse(spec).expect("spec").limits(VOLUME);
    handle.clone_with_throttle(Arc::new(Throttle::new(&limits)))
}

#[test]
fn qos_limits_hold_on_the_loop_and_a_stop_does_not_wait_for_them() {
    let (_store, handle) = store_on(SimDevice::new(64 << 20, 3));
    let reactor = Reactor::start("test-loop", 1).expect("reactor");
    let reads = |n: usize| -> Vec<Work<Result1>> {
        (0..n)
            .map(|i| Work::Read {
                offset: (i as u64 % 256) * 4096,
                buf: AlignedBuf::zeroed(4096),
            })
            .collect()
    };
    // 120 reads at 200 IOPS: the first 20 pass at once (the bucket's
    // 100 ms), the others take about half a second.
    let limited = throttled(&handle, "read_iops_sec=200");
    let started = std::time::Instant::now();
    let done = run(&reactor, &limited, reads(120), false);
    let took = started.elapsed();
    assert_eq!(done.len(), 120);
    assert!(done.iter().all(|d| matches!(d.1, Outcome::Data(Ok(())))));
    assert!(
        took >= Duration::from_millis(400),
        "120 reads at 200 IOPS took only {took:?}"
    );
    assert!(limited.throttle().throttled() > Duration::ZERO);

    // At 1 IOPS, 50 reads would take most of a minute: a stop gives up
    // the ones still held back, at once.
    let crawling = throttled(&handle, "total_iops_sec=1");
    let (tx, rx) = mpsc::channel();
    reactor.adopt(Box::new(Driver {
        block_io: BlockIo::new(crawling.clone()),
        works: reads(50),
        next: 0,
        one_at_a_time: false,
        done: Vec::new(),
        report: Some(tx),
    }));
    std::thread::sleep(Duration::from_millis(300));
    let stopping = std::time::Instant::now();
    reactor.stop();
    assert!(
        stopping.elapsed() < Duration::from_secs(5),
        "stop waited {:?}",
        stopping.elapsed()
    );
    let done = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("the driver reports");
    assert_eq!(done.len(), 50);
    let given_up = done
        .iter()
        .filter(|d| matches!(d.1, Outcome::Data(Err(IoError::Failed))))
        .count();
    assert!(given_up >= 47, "{given_up} of 50 given up");
}
