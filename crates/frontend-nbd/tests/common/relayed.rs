//! The data path of a replicated volume as the event loops see it, over a
//! volume of the local store: a batch a loop starts completes later, on
//! one of a few threads of its own, in any order (as a batch of a
//! replicated volume completes on whichever peer reader brings its last
//! acknowledgement), after a random delay standing for the acknowledgement's
//! round trip. Shared by the NBD and NVMe/TCP frontends' tests.

use basalt_store::{DataOp, IoError, LocalVolume};
use basalt_volume::{submit_owned, BlockIo, OnComplete, OwnedOp};
use std::sync::{mpsc, Arc};
use std::time::Duration;

pub struct Relayed {
    local: LocalVolume,
    batches: parking_lot::Mutex<mpsc::Sender<(Vec<OwnedOp>, OnComplete)>>,
}

impl Relayed {
    /// Batches complete after up to 300 µs.
    pub fn over(local: LocalVolume) -> Arc<dyn BlockIo> {
        Relayed::with_delay(local, 300)
    }

    /// Batches complete after a random delay below `max_delay_us`
    /// (none for 0).
    pub fn with_delay(local: LocalVolume, max_delay_us: u64) -> Arc<dyn BlockIo> {
        let (tx, rx) = mpsc::channel::<(Vec<OwnedOp>, OnComplete)>();
        let rx = Arc::new(parking_lot::Mutex::new(rx));
        for k in 0..3u64 {
            let (rx, local) = (Arc::clone(&rx), local.clone());
            std::thread::spawn(move || {
                // xorshift64*: delays differ per thread and per batch.
                let mut x = 0x9e37_79b9_7f4a_7c15 ^ (k + 1);
                loop {
                    let Ok((mut ops, done)) = rx.lock().recv() else {
                        return;
                    };
                    x ^= x >> 12;
                    x ^= x << 25;
                    x ^= x >> 27;
                    if max_delay_us > 0 {
                        let delay = x.wrapping_mul(0x2545_f491_4f6c_dd1d) % max_delay_us;
                        std::thread::sleep(Duration::from_micros(delay));
                    }
                    submit_owned(&mut ops, |data| local.submit(data));
                    done(ops);
                }
            });
        }
        Arc::new(Relayed {
            local,
            batches: parking_lot::Mutex::new(tx),
        })
    }
}

impl BlockIo for Relayed {
    fn size(&self) -> u64 {
        self.local.size()
    }
    fn submit(&self, ops: &mut [DataOp<'_>]) {
        self.local.submit(ops)
    }
    fn start(&self, ops: Vec<OwnedOp>, done: OnComplete) {
        let _ = self.batches.lock().send((ops, done));
    }
    fn flush(&self) -> Result<(), IoError> {
        self.local.flush()
    }
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<(), IoError> {
        self.local.write_zeroes(offset, len, true, fua)
    }
}
