//! Writes cpio archives in the "newc" format, the one the Linux kernel
//! unpacks as an initramfs (`Documentation/driver-api/early-userspace/buffer-format.rst`).
//!
//! Invariants:
//! - Every entry gets its own inode number (1, 2, ...) and link count 1 (2
//!   for directories), so the kernel never treats two entries as hard links.
//! - Names are stored without a leading `/`; headers, names and data are
//!   padded to 4 bytes, and [`CpioWriter::finish`] writes the `TRAILER!!!`
//!   entry, so archives can be concatenated (the kernel unpacks them in turn,
//!   later entries replacing earlier ones).
//! - Owner is root, mtime is 0: the same inputs give the same bytes.

use std::io::{self, Write};

const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFLNK: u32 = 0o120000;
const S_IFCHR: u32 = 0o020000;

/// Sequential newc writer over any `Write`.
pub struct CpioWriter<W: Write> {
    out: W,
    next_ino: u32,
    written: u64,
}

impl<W: Write> CpioWriter<W> {
    pub fn new(out: W) -> CpioWriter<W> {
        CpioWriter {
            out,
            next_ino: 1,
            written: 0,
        }
    }

    /// A directory (`perm` without file-type bits, e.g. 0o755).
    pub fn dir(&mut self, path: &str, perm: u32) -> io::Result<()> {
        self.entry(path, S_IFDIR | (perm & 0o7777), 2, (0, 0), &[])
    }

    /// A regular file with the given content.
    pub fn file(&mut self, path: &str, perm: u32, data: &[u8]) -> io::Result<()> {
        self.entry(path, S_IFREG | (perm & 0o7777), 1, (0, 0), data)
    }

    /// A symbolic link to `target` (stored as the entry's data).
    pub fn symlink(&mut self, path: &str, target: &str) -> io::Result<()> {
        self.entry(path, S_IFLNK | 0o777, 1, (0, 0), target.as_bytes())
    }

    /// A character device node.
    pub fn char_device(&mut self, path: &str, perm: u32, major: u32, minor: u32) -> io::Result<()> {
        self.entry(path, S_IFCHR | (perm & 0o7777), 1, (major, minor), &[])
    }

    /// Writes the trailer and returns the inner writer.
    pub fn finish(mut self) -> io::Result<W> {
        self.entry_raw("TRAILER!!!", 0, 0, 1, (0, 0), &[])?;
        self.out.flush()?;
        Ok(self.out)
    }

    fn entry(
        &mut self,
        path: &str,
        mode: u32,
        nlink: u32,
        rdev: (u32, u32),
        data: &[u8],
    ) -> io::Result<()> {
        let name = path.trim_start_matches('/');
        if name.is_empty() || name.contains('\0') {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("invalid cpio entry name {path:?}"),
            ));
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        self.entry_raw(name, ino, mode, nlink, rdev, data)
    }

    fn entry_raw(
        &mut self,
        name: &str,
        ino: u32,
        mode: u32,
        nlink: u32,
        rdev: (u32, u32),
        data: &[u8],
    ) -> io::Result<()> {
        let size = u32::try_from(data.len()).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{name}: {} bytes is too large for cpio newc", data.len()),
            )
        })?;
        let namesize = name.len() + 1;
        let fields: [u32; 13] = [
            ino,
            mode,
            0, // uid
            0, // gid
            nlink,
            0, // mtime
            size,
            0, // dev major
            0, // dev minor
            rdev.0,
            rdev.1,
            namesize as u32,
            0, // check (only for the "070702" format)
        ];
        let mut header = String::with_capacity(110);
        header.push_str("070701");
        for f in fields {
            header.push_str(&format!("{f:08X}"));
        }
        self.put(header.as_bytes())?;
        self.put(name.as_bytes())?;
        self.put(&[0])?;
        self.pad()?;
        self.put(data)?;
        self.pad()
    }

    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.out.write_all(bytes)?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    fn pad(&mut self) -> io::Result<()> {
        let rem = (4 - (self.written % 4) as usize) % 4;
        self.put(&[0u8; 3][..rem])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (name, mode, rdev, data) of one entry.
    type Entry = (String, u32, (u32, u32), Vec<u8>);

    /// A minimal newc reader, enough to check what the writer produced:
    /// the entries up to and without the trailer.
    fn parse(mut buf: &[u8]) -> Vec<Entry> {
        let mut out = Vec::new();
        let mut consumed = 0usize;
        loop {
            assert_eq!(&buf[..6], b"070701", "magic at offset {consumed}");
            let field = |i: usize| {
                u32::from_str_radix(
                    std::str::from_utf8(&buf[6 + 8 * i..14 + 8 * i]).unwrap(),
                    16,
                )
                .unwrap()
            };
            let mode = field(1);
            let size = field(6) as usize;
            let rdev = (field(9), field(10));
            let namesize = field(11) as usize;
            let name = std::str::from_utf8(&buf[110..110 + namesize - 1])
                .unwrap()
                .to_string();
            assert_eq!(buf[110 + namesize - 1], 0);
            let data_start = (110 + namesize).div_ceil(4) * 4;
            let data = buf[data_start..data_start + size].to_vec();
            let next = (data_start + size).div_ceil(4) * 4;
            consumed += next;
            buf = &buf[next..];
            if name == "TRAILER!!!" {
                assert!(buf.is_empty(), "bytes after the trailer");
                return out;
            }
            out.push((name, mode, rdev, data));
        }
    }

    #[test]
    fn entries_round_trip_with_alignment() {
        let mut w = CpioWriter::new(Vec::new());
        w.dir("/bin", 0o755).unwrap();
        w.file("bin/a", 0o755, b"hello").unwrap();
        w.file("bin/bc", 0o644, b"").unwrap();
        w.symlink("lib64/ld", "/lib/x/ld.so").unwrap();
        w.char_device("dev/console", 0o600, 5, 1).unwrap();
        let bytes = w.finish().unwrap();
        assert_eq!(bytes.len() % 4, 0);
        let entries = parse(&bytes);
        let names: Vec<&str> = entries.iter().map(|e| e.0.as_str()).collect();
        assert_eq!(names, ["bin", "bin/a", "bin/bc", "lib64/ld", "dev/console"]);
        assert_eq!(entries[0].1, 0o040755);
        assert_eq!(entries[1].1, 0o100755);
        assert_eq!(entries[1].3, b"hello");
        assert_eq!(entries[3].1, 0o120777);
        assert_eq!(entries[3].3, b"/lib/x/ld.so");
        assert_eq!(entries[4].1, 0o020600);
        assert_eq!(entries[4].2, (5, 1));
    }

    #[test]
    fn inode_numbers_are_unique_and_output_is_deterministic() {
        let build = || {
            let mut w = CpioWriter::new(Vec::new());
            for i in 0..10 {
                w.file(&format!("f{i}"), 0o644, &[i as u8; 3]).unwrap();
            }
            w.finish().unwrap()
        };
        let a = build();
        assert_eq!(a, build());
        let mut inos: Vec<&[u8]> = Vec::new();
        let mut off = 0;
        while off < a.len() {
            inos.push(&a[off + 6..off + 14]);
            let namesize =
                usize::from_str_radix(std::str::from_utf8(&a[off + 94..off + 102]).unwrap(), 16)
                    .unwrap();
            let size =
                usize::from_str_radix(std::str::from_utf8(&a[off + 54..off + 62]).unwrap(), 16)
                    .unwrap();
            off = ((off + 110 + namesize).div_ceil(4) * 4 + size).div_ceil(4) * 4;
        }
        let trailer = inos.pop().unwrap();
        assert_eq!(trailer, b"00000000");
        let mut sorted = inos.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), inos.len());
    }

    #[test]
    fn rejects_empty_and_nul_names() {
        let mut w = CpioWriter::new(Vec::new());
        assert!(w.file("/", 0o644, b"").is_err());
        assert!(w.file("a\0b", 0o644, b"").is_err());
    }
}
