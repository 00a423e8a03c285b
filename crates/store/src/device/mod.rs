//! The narrow interface between the store engine and its disk.
//!
//! The engine reaches storage only through `BlockDevice`: batched reads and
//! writes, a flush barrier, and "make this range read as zeros". Keeping it
//! this small lets the same engine run on a data file or raw device
//! (`FileDevice`, O_DIRECT through io_uring), on `SimDevice`, the
//! simulated disk the crash tests use, and on `MemDevice`, a RAM disk.
//!
//! Contract: offsets and lengths given to a device are multiples of
//! `BLOCK_SIZE`; a write is durable once it was submitted as `WriteFua` or a
//! later `flush` returned; `discard_zeroes` / `zero_range` take effect at once
//! for reads and become durable with the next flush.

mod file;
mod mem;
mod sim;

pub use file::FileDevice;
pub use mem::MemDevice;
pub use sim::SimDevice;

use std::io;

/// What one I/O in a batch does.
pub enum IoKind<'a> {
    Read(&'a mut [u8]),
    Write(&'a [u8]),
    /// A write that is durable when it completes (forced unit access).
    WriteFua(&'a [u8]),
}

/// One I/O of a batch; the device stores its outcome in `result`.
pub struct IoOp<'a> {
    pub offset: u64,
    pub kind: IoKind<'a>,
    pub result: io::Result<()>,
}

impl<'a> IoOp<'a> {
    pub fn read(offset: u64, buf: &'a mut [u8]) -> Self {
        IoOp {
            offset,
            kind: IoKind::Read(buf),
            result: Ok(()),
        }
    }
    pub fn write(offset: u64, data: &'a [u8], fua: bool) -> Self {
        let kind = if fua {
            IoKind::WriteFua(data)
        } else {
            IoKind::Write(data)
        };
        IoOp {
            offset,
            kind,
            result: Ok(()),
        }
    }
    pub fn len(&self) -> usize {
        match &self.kind {
            IoKind::Read(b) => b.len(),
            IoKind::Write(b) | IoKind::WriteFua(b) => b.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

pub trait BlockDevice: Send + Sync {
    /// Usable size in bytes (a multiple of `BLOCK_SIZE`).
    fn size(&self) -> u64;

    /// Executes every op of the batch (in any order, concurrently where the
    /// device can) and stores each op's outcome in it.
    fn submit(&self, ops: &mut [IoOp<'_>]);

    /// Makes every completed write durable.
    fn flush(&self) -> io::Result<()>;

    /// Makes the range read as zeros, releasing its backing space where the
    /// device can (hole punch, discard with zeroing).
    fn discard_zeroes(&self, offset: u64, len: u64) -> io::Result<()>;

    /// Makes the range read as zeros while keeping its space reserved.
    fn zero_range(&self, offset: u64, len: u64) -> io::Result<()>;

    /// A descriptor an event loop may submit this device's reads and
    /// writes to with io_uring (`RWF_DSYNC` for FUA; buffers aligned to
    /// 4 KiB), where that is how the device is best driven; `None`: use
    /// [`BlockDevice::submit`].
    fn ring_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let mut ops = [IoOp::read(offset, buf)];
        self.submit(&mut ops);
        let [op] = ops;
        op.result
    }

    fn write_at(&self, data: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        let mut ops = [IoOp::write(offset, data, fua)];
        self.submit(&mut ops);
        let [op] = ops;
        op.result
    }
}
