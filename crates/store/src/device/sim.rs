//! `SimDevice`: an in-memory disk with a volatile write cache, for tests.
//!
//! Reads see every completed write. Writes stay volatile until `flush` (or
//! until they were FUA); `crash` then keeps a random subset of the volatile
//! writes, decided per 512-byte sector, so a crash can drop any unflushed
//! write, keep a later one without an earlier one (reordering) and tear one
//! at sector granularity, exactly what a real disk may do. How much survives
//! varies from crash to crash (nothing, everything, or any mix).
//!
//! A power cut can be armed to strike after the next N device operations
//! (each write, zeroing and flush counts one): from then on every
//! operation fails with EIO and changes nothing, until `crash` applies the
//! power loss and brings the disk back. Crash tests sweep N over every
//! operation of a history. Seeded, so a failing sequence replays.

use super::{BlockDevice, IoKind, IoOp};
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::io;

const SECTOR: usize = 512;

enum Volatile {
    Write {
        offset: u64,
        data: Vec<u8>,
        fua: bool,
    },
    Zero {
        offset: u64,
        len: u64,
    },
}

struct SimState {
    /// What survives a crash.
    durable: Vec<u8>,
    /// What reads return now.
    current: Vec<u8>,
    /// Writes since the last flush, in completion order.
    volatile: Vec<Volatile>,
    rng: StdRng,
    fail_writes: bool,
    flushes: u64,
    /// Device operations so far, and the count at which power is lost.
    ops: u64,
    power_cut_at: Option<u64>,
}

impl SimState {
    /// Counts one operation that can change the disk (reads change
    /// nothing, so a cut before a read equals a cut before the next write);
    /// false once the power is cut.
    fn powered(&mut self, counts: bool) -> bool {
        if self.power_cut_at.is_some_and(|at| self.ops >= at) {
            return false;
        }
        self.ops += counts as u64;
        true
    }
}

fn power_lost() -> io::Error {
    io::Error::other("sim device: power lost")
}

pub struct SimDevice {
    size: u64,
    state: Mutex<SimState>,
}

impl SimDevice {
    pub fn new(size: u64, seed: u64) -> std::sync::Arc<SimDevice> {
        let size = size / 4096 * 4096;
        std::sync::Arc::new(SimDevice {
            size,
            state: Mutex::new(SimState {
                durable: vec![0; size as usize],
                current: vec![0; size as usize],
                volatile: Vec::new(),
                rng: StdRng::seed_from_u64(seed),
                fail_writes: false,
                flushes: 0,
                ops: 0,
                power_cut_at: None,
            }),
        })
    }

    /// Simulates power loss: every volatile write survives or not, sector by
    /// sector, at random; FUA writes always survive. The disk then works
    /// again (a pending power cut is disarmed).
    pub fn crash(&self) {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        st.power_cut_at = None;
        let keep = [0.0, 0.1, 0.5, 0.9, 1.0][st.rng.gen_range(0..5)];
        // Whole writes (reordered, not torn) or sector by sector (torn).
        let whole_writes = st.rng.gen_bool(0.5);
        for v in std::mem::take(&mut st.volatile) {
            let (offset, len, data) = match &v {
                Volatile::Write { offset, data, fua } => {
                    if *fua {
                        let at = *offset as usize;
                        st.durable[at..at + data.len()].copy_from_slice(data);
                        continue;
                    }
                    (*offset as usize, data.len(), Some(data))
                }
                Volatile::Zero { offset, len } => (*offset as usize, *len as usize, None),
            };
            let kept_whole = whole_writes && st.rng.gen_bool(keep);
            let mut at = 0;
            while at < len {
                let n = SECTOR.min(len - at);
                let kept = if whole_writes {
                    kept_whole
                } else {
                    st.rng.gen_bool(keep)
                };
                if kept {
                    let dst = &mut st.durable[offset + at..offset + at + n];
                    match data {
                        Some(d) => dst.copy_from_slice(&d[at..at + n]),
                        None => dst.fill(0),
                    }
                }
                at += n;
            }
        }
        st.current.clone_from(&st.durable);
    }

    /// Simulates power loss keeping exactly the volatile sectors at whose
    /// device offset `keep` says yes (FUA writes always survive): a chosen
    /// tear, for tests that need one particular crash state.
    pub fn crash_keeping(&self, keep: impl Fn(u64) -> bool) {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        st.power_cut_at = None;
        for v in std::mem::take(&mut st.volatile) {
            let (offset, len, data, fua) = match &v {
                Volatile::Write { offset, data, fua } => (*offset, data.len(), Some(data), *fua),
                Volatile::Zero { offset, len } => (*offset, *len as usize, None, false),
            };
            for at in (0..len).step_by(SECTOR) {
                let n = SECTOR.min(len - at);
                if fua || keep(offset + at as u64) {
                    let dst = offset as usize + at;
                    let dst = &mut st.durable[dst..dst + n];
                    match data {
                        Some(d) => dst.copy_from_slice(&d[at..at + n]),
                        None => dst.fill(0),
                    }
                }
            }
        }
        st.current.clone_from(&st.durable);
    }

    /// The writes and zeroings not yet flushed, as (offset, length), in
    /// the order they were issued.
    pub fn volatile_writes(&self) -> Vec<(u64, u64)> {
        self.state
            .lock()
            .volatile
            .iter()
            .map(|v| match v {
                Volatile::Write { offset, data, .. } => (*offset, data.len() as u64),
                Volatile::Zero { offset, len } => (*offset, *len),
            })
            .collect()
    }

    /// Cuts the power after `ops` more device operations (0: the next one
    /// fails). `crash` applies the loss and restores power.
    pub fn cut_power_after(&self, ops: u64) {
        let mut st = self.state.lock();
        st.power_cut_at = Some(st.ops + ops);
    }

    /// Whether an armed power cut has struck.
    pub fn power_is_cut(&self) -> bool {
        let st = self.state.lock();
        st.power_cut_at.is_some_and(|at| st.ops >= at)
    }

    /// Device operations that could change the disk so far (each write,
    /// zeroing and flush; reads are not counted).
    pub fn op_count(&self) -> u64 {
        self.state.lock().ops
    }

    /// Makes every later write fail with EIO (a dying disk) until cleared.
    pub fn set_fail_writes(&self, fail: bool) {
        self.state.lock().fail_writes = fail;
    }

    pub fn flush_count(&self) -> u64 {
        self.state.lock().flushes
    }

    fn check(&self, offset: u64, len: usize) -> io::Result<()> {
        if !offset.is_multiple_of(512)
            || !len.is_multiple_of(512)
            || offset + len as u64 > self.size
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "sim device: bad I/O [{offset}, +{len}) on {} bytes",
                    self.size
                ),
            ));
        }
        Ok(())
    }

    fn zero(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check(offset, len as usize)?;
        let mut st = self.state.lock();
        if !st.powered(true) {
            return Err(power_lost());
        }
        if st.fail_writes {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        st.current[offset as usize..(offset + len) as usize].fill(0);
        st.volatile.push(Volatile::Zero { offset, len });
        Ok(())
    }
}

impl BlockDevice for SimDevice {
    fn size(&self) -> u64 {
        self.size
    }

    fn submit(&self, ops: &mut [IoOp<'_>]) {
        for op in ops.iter_mut() {
            let len = op.len();
            op.result = self.check(op.offset, len).and_then(|()| {
                let at = op.offset as usize;
                let fua = matches!(op.kind, IoKind::WriteFua(_));
                let mut st = self.state.lock();
                if !st.powered(!matches!(op.kind, IoKind::Read(_))) {
                    return Err(power_lost());
                }
                match &mut op.kind {
                    IoKind::Read(buf) => {
                        buf.copy_from_slice(&st.current[at..at + len]);
                        Ok(())
                    }
                    IoKind::Write(data) | IoKind::WriteFua(data) => {
                        if st.fail_writes {
                            return Err(io::Error::from_raw_os_error(libc::EIO));
                        }
                        st.current[at..at + len].copy_from_slice(data);
                        st.volatile.push(Volatile::Write {
                            offset: op.offset,
                            data: data.to_vec(),
                            fua,
                        });
                        Ok(())
                    }
                }
            });
        }
    }

    fn flush(&self) -> io::Result<()> {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        if !st.powered(true) {
            return Err(power_lost());
        }
        for v in std::mem::take(&mut st.volatile) {
            match v {
                Volatile::Write { offset, data, .. } => {
                    let at = offset as usize;
                    st.durable[at..at + data.len()].copy_from_slice(&data);
                }
                Volatile::Zero { offset, len } => {
                    st.durable[offset as usize..(offset + len) as usize].fill(0);
                }
            }
        }
        st.flushes += 1;
        Ok(())
    }

    fn discard_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.zero(offset, len)
    }

    fn zero_range(&self, offset: u64, len: u64) -> io::Result<()> {
        self.zero(offset, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flushed_writes_survive_crash_and_fua_too() {
        let d = SimDevice::new(1 << 20, 7);
        d.write_at(&[1u8; 4096], 0, false).unwrap();
        d.flush().unwrap();
        d.write_at(&[2u8; 4096], 4096, true).unwrap();
        d.write_at(&[3u8; 4096], 8192, false).unwrap();
        d.crash();
        let mut b = vec![0u8; 4096];
        d.read_at(&mut b, 0).unwrap();
        assert!(b.iter().all(|&x| x == 1));
        d.read_at(&mut b, 4096).unwrap();
        assert!(b.iter().all(|&x| x == 2));
        d.read_at(&mut b, 8192).unwrap();
        // each sector is either old (0) or new (3)
        assert!(b
            .chunks(512)
            .all(|s| s.iter().all(|&x| x == 0) || s.iter().all(|&x| x == 3)));
    }
}
