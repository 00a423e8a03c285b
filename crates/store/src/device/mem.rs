//! `MemDevice`: a RAM disk. Every completed write is durable (like
//! battery-backed memory), so `flush` costs nothing. Used to measure the
//! store's own software cost without a disk in the way (criterion
//! benchmarks) and for RAM-backed stores; it cannot simulate crashes — that
//! is `SimDevice`'s job.
//!
//! Invariant: reads return the latest completed write to each byte; ranges
//! are checked like a real device's and fail with EINVAL, never panic.

use super::{BlockDevice, IoKind, IoOp};
use std::cell::UnsafeCell;
use std::io;

pub struct MemDevice {
    bytes: Box<[UnsafeCell<u8>]>,
}

// SAFETY: like a real disk, concurrent I/O to overlapping ranges has no
// defined result; the engine never issues it (overlapping requests are
// serialised by the volume map and read-modify-write locks). Distinct ranges
// are distinct memory.
unsafe impl Sync for MemDevice {}

impl MemDevice {
    pub fn new(size: u64) -> std::sync::Arc<MemDevice> {
        let size = (size / 4096 * 4096) as usize;
        std::sync::Arc::new(MemDevice {
            bytes: (0..size).map(|_| UnsafeCell::new(0)).collect(),
        })
    }

    fn range(&self, offset: u64, len: usize) -> io::Result<*mut u8> {
        match (offset as usize).checked_add(len) {
            Some(end) if end <= self.bytes.len() => {
                Ok(self.bytes[offset as usize..].as_ptr() as *mut u8)
            }
            _ => Err(io::Error::from_raw_os_error(libc::EINVAL)),
        }
    }
}

impl BlockDevice for MemDevice {
    fn size(&self) -> u64 {
        self.bytes.len() as u64
    }

    fn submit(&self, ops: &mut [IoOp<'_>]) {
        for op in ops.iter_mut() {
            let len = op.len();
            op.result = self.range(op.offset, len).map(|at| match &mut op.kind {
                // SAFETY: `range` checked bounds; see the Sync note above.
                IoKind::Read(buf) => unsafe {
                    std::ptr::copy_nonoverlapping(at, buf.as_mut_ptr(), len)
                },
                IoKind::Write(data) | IoKind::WriteFua(data) => unsafe {
                    std::ptr::copy_nonoverlapping(data.as_ptr(), at, len)
                },
            });
        }
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn discard_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        let at = self.range(offset, len as usize)?;
        // SAFETY: bounds checked above.
        unsafe { std::ptr::write_bytes(at, 0, len as usize) };
        Ok(())
    }

    fn zero_range(&self, offset: u64, len: u64) -> io::Result<()> {
        self.discard_zeroes(offset, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_zero_and_bounds() {
        let d = MemDevice::new(1 << 20);
        d.write_at(&[9u8; 4096], 8192, false).unwrap();
        let mut b = [0u8; 4096];
        d.read_at(&mut b, 8192).unwrap();
        assert_eq!(b, [9u8; 4096]);
        d.discard_zeroes(8192, 4096).unwrap();
        d.read_at(&mut b, 8192).unwrap();
        assert_eq!(b, [0u8; 4096]);
        assert!(d.read_at(&mut b, (1 << 20) - 2048).is_err());
        assert!(d.write_at(&b, u64::MAX - 10, false).is_err());
    }
}
