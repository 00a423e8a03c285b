//! Positional, exact reads from an image source: files (without moving a
//! file position, so one source can serve several readers) and memory.

use std::fs::File;
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::FileExt;

/// A source that can be read at any offset without a cursor.
pub trait ReadAt {
    /// Fills all of `buf` from `offset`; a range past the end is an
    /// [`io::ErrorKind::UnexpectedEof`] error.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;

    /// The source's length in bytes.
    fn len(&self) -> io::Result<u64>;

    /// Whether the source holds no bytes.
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }
}

impl ReadAt for File {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.read_exact_at(buf, offset)
    }

    fn len(&self) -> io::Result<u64> {
        // Seeking, not metadata: a block device's metadata length is 0.
        let mut f = self;
        f.seek(SeekFrom::End(0))
    }
}

impl ReadAt for [u8] {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let src = usize::try_from(offset)
            .ok()
            .and_then(|start| self.get(start..start.checked_add(buf.len())?))
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "read of {} bytes at {offset} past the end of {} bytes",
                        buf.len(),
                        <[u8]>::len(self)
                    ),
                )
            })?;
        buf.copy_from_slice(src);
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        Ok(<[u8]>::len(self) as u64)
    }
}

impl ReadAt for Vec<u8> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.as_slice().read_at(buf, offset)
    }

    fn len(&self) -> io::Result<u64> {
        Ok(Vec::len(self) as u64)
    }
}

impl<T: ReadAt + ?Sized> ReadAt for &T {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        (**self).read_at(buf, offset)
    }

    fn len(&self) -> io::Result<u64> {
        (**self).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_reads_are_exact() {
        let data: Vec<u8> = (0..10).collect();
        let mut buf = [0u8; 4];
        data.read_at(&mut buf, 6).unwrap();
        assert_eq!(buf, [6, 7, 8, 9]);
        let err = data.read_at(&mut buf, 7).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        let err = data.as_slice().read_at(&mut buf, u64::MAX).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        assert_eq!(ReadAt::len(&data).unwrap(), 10);
        assert_eq!(ReadAt::len(&&data[..3]).unwrap(), 3);
    }

    #[test]
    fn file_reads_are_exact() {
        use std::io::Write;
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(b"hello world").unwrap();
        let mut buf = [0u8; 5];
        ReadAt::read_at(&f, &mut buf, 6).unwrap();
        assert_eq!(&buf, b"world");
        assert_eq!(ReadAt::len(&f).unwrap(), 11);
        assert_eq!(
            ReadAt::read_at(&f, &mut buf, 7).unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
    }
}
