//! Group commit: concurrent FLUSHes share one journal write and one device
//! flush, and a FLUSH that waited behind a commit whose I/O failed fails
//! too (it must never report durable the entries that commit lost).
//!
//! The interleavings are forced, not hoped for: `GatedDevice` holds the
//! first device flush until the test has seen every other caller queue up
//! (`Store::flush_stats` counts the requests).

use basalt_store::{BlockDevice, FormatOptions, IoOp, OpenOptions, SimDevice, Store};
use parking_lot::{Condvar, Mutex};
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Default)]
struct Gate {
    armed: bool,
    held: bool,
    release: Option<bool>, // Some(fail?)
}

/// A SimDevice whose next flush, once armed, waits for the test.
struct GatedDevice {
    inner: Arc<SimDevice>,
    gate: Mutex<Gate>,
    cv: Condvar,
}

impl GatedDevice {
    fn arm(&self) {
        *self.gate.lock() = Gate {
            armed: true,
            ..Gate::default()
        };
    }
    fn wait_held(&self) {
        let mut g = self.gate.lock();
        while !g.held {
            self.cv.wait(&mut g);
        }
    }
    fn release(&self, fail: bool) {
        self.gate.lock().release = Some(fail);
        self.cv.notify_all();
    }
}

impl BlockDevice for GatedDevice {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn submit(&self, ops: &mut [IoOp<'_>]) {
        self.inner.submit(ops)
    }
    fn flush(&self) -> io::Result<()> {
        let mut g = self.gate.lock();
        if g.armed {
            g.armed = false;
            g.held = true;
            self.cv.notify_all();
            while g.release.is_none() {
                self.cv.wait(&mut g);
            }
            if g.release == Some(true) {
                return Err(io::Error::from_raw_os_error(libc::EIO));
            }
        }
        drop(g);
        self.inner.flush()
    }
    fn discard_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.discard_zeroes(offset, len)
    }
    fn zero_range(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.zero_range(offset, len)
    }
}

fn setup() -> (Arc<GatedDevice>, Arc<Store>, uuid::Uuid) {
    let dev = Arc::new(GatedDevice {
        inner: SimDevice::new(8 << 20, 3),
        gate: Mutex::new(Gate::default()),
        cv: Condvar::new(),
    });
    let store = Store::create_with(
        dev.clone(),
        &FormatOptions {
            extent_size: Some(64 << 10),
            ..Default::default()
        },
        &OpenOptions {
            background_zeroing: false,
            ..Default::default()
        },
    )
    .unwrap();
    let id = uuid::Uuid::from_u128(9);
    store.create_volume(id, 1 << 20).unwrap();
    // Reserve extents now, so later first writes commit nothing themselves.
    store
        .volume(id)
        .unwrap()
        .write(0, &[1u8; 4096], false)
        .unwrap();
    store.flush().unwrap();
    (dev, store, id)
}

/// Waits (bounded) until `n` flushes have been asked for.
fn wait_requests(store: &Store, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while store.flush_stats().requests < n {
        assert!(Instant::now() < deadline, "flush callers never queued");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn concurrent_flushes_share_one_commit() {
    let (dev, store, id) = setup();
    let vol = store.volume(id).unwrap();
    let before = store.flush_stats();
    let device_flushes = dev.inner.flush_count();
    dev.arm();
    let flushers: Vec<_> = (0..8u64)
        .map(|i| {
            let vol = vol.clone();
            std::thread::spawn(move || {
                vol.write((i + 1) * (64 << 10), &[i as u8 + 2; 4096], false)
                    .unwrap();
                vol.flush().unwrap();
            })
        })
        .collect();
    dev.wait_held();
    wait_requests(&store, before.requests + 8);
    dev.release(false);
    for f in flushers {
        f.join().unwrap();
    }
    let after = store.flush_stats();
    assert_eq!(after.requests - before.requests, 8);
    // The first commit took whatever had queued when it started; every
    // flush asked for while it ran is served by one more.
    assert!(
        after.commits - before.commits <= 2,
        "{before:?} -> {after:?}"
    );
    assert!(dev.inner.flush_count() - device_flushes <= 2);
    for i in 0..8u64 {
        let mut b = [0u8; 4096];
        vol.read((i + 1) * (64 << 10), &mut b).unwrap();
        assert_eq!(b, [i as u8 + 2; 4096]);
    }
}

#[test]
fn a_flush_waiting_behind_a_failed_commit_fails() {
    let (dev, store, id) = setup();
    let vol = store.volume(id).unwrap();
    let before = store.flush_stats();
    // A first write: its mapping is queued, and the commit that writes it
    // will fail at the device flush.
    vol.write(64 << 10, &[7u8; 4096], false).unwrap();
    dev.arm();
    let leader = {
        let vol = vol.clone();
        std::thread::spawn(move || vol.flush())
    };
    dev.wait_held();
    let follower = {
        let vol = vol.clone();
        std::thread::spawn(move || vol.flush())
    };
    wait_requests(&store, before.requests + 2);
    dev.release(true);
    assert!(leader.join().unwrap().is_err(), "the failed commit's flush");
    assert!(
        follower.join().unwrap().is_err(),
        "a flush queued behind a failed commit reported success for entries never written"
    );
    assert!(store.flush().is_err(), "the store stays failed");
}
