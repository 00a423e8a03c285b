//! The replication floor: the queue-depth-1 latency of the shortest chain a
//! replicated 4 KiB write can take on this machine, with no storage system
//! in it — the RF-N counterpart of running fio on the local file.
//!
//! A client thread sends a write over loopback TCP to a "primary" thread,
//! which forwards it to N−1 "secondary" threads over their own connections,
//! writes it to its own file, waits for every secondary's acknowledgement
//! and answers the client. Each secondary writes it to its own file
//! (`O_DIRECT`, a synchronous `pwrite`, files fully written beforehand so no
//! write allocates) and acknowledges. Every role blocks in its own system
//! calls, one thread each, so a write costs the fewest wake-ups any design
//! can: client → primary, primary → each secondary, each secondary's disk
//! completion, secondary → primary, primary → client. No checksums, no
//! metadata, no state machine: whatever a real system measures above this
//! on the same machine is its own cost; what this measures is the
//! machine's (disk shared by every replica, wake-ups across vCPUs).
//!
//! Threads of one process rather than processes: a switch between threads
//! of one process is, if anything, cheaper than between processes, so the
//! floor errs low — a ratio measured here is not inflated by the probe.
//!
//! Invariants: every role ends when its inbound connection closes; the
//! files are removed when the run ends (or fails).

use rand::Rng;
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::Instant;

/// Bytes per write.
pub const BLOCK: usize = 4096;
/// Offset header before each write's data; the acknowledgement echoes it.
const HEADER: usize = 8;

/// The replicas' files, written in full once and reused by every
/// measurement; removed when dropped.
pub struct FloorFiles {
    paths: Vec<PathBuf>,
    size: u64,
}

/// QD1 write latency through the chain, in microseconds.
#[derive(Clone, Debug, PartialEq)]
pub struct FloorResult {
    pub replicas: usize,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
}

/// A 4 KiB-aligned buffer for `O_DIRECT`.
struct Block {
    ptr: *mut u8,
    layout: Layout,
}

// SAFETY: the buffer is owned by one `Block` and only reached through it.
unsafe impl Send for Block {}

impl Block {
    fn new() -> Block {
        let layout = Layout::from_size_align(BLOCK, BLOCK).expect("4096 is a valid alignment");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Block { ptr, layout }
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` points to `BLOCK` initialised bytes owned by self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, BLOCK) }
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.ptr, self.layout) }
    }
}

impl Drop for FloorFiles {
    fn drop(&mut self) {
        for path in &self.paths {
            let _ = std::fs::remove_file(path);
        }
    }
}

impl FloorFiles {
    /// Writes `size` bytes of zeros (a multiple of 4 KiB, at least one
    /// block) to each of `replicas` new files in `dir`, so that no measured
    /// write allocates.
    pub fn create(dir: &Path, replicas: usize, size: u64) -> io::Result<FloorFiles> {
        if replicas == 0 || size < BLOCK as u64 || !size.is_multiple_of(BLOCK as u64) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the floor needs at least one replica and a whole number of 4 KiB blocks",
            ));
        }
        let pid = std::process::id();
        let mut files = FloorFiles {
            paths: Vec::new(),
            size,
        };
        let chunk = vec![0u8; 1 << 20];
        for i in 0..replicas {
            let path = dir.join(format!("basalt-floor-{pid}-{i}.img"));
            let mut file = File::create(&path)?;
            files.paths.push(path);
            let mut left = size;
            while left > 0 {
                let n = left.min(chunk.len() as u64) as usize;
                file.write_all(&chunk[..n])?;
                left -= n as u64;
            }
            file.sync_all()?;
        }
        Ok(files)
    }

    fn open(&self, i: usize) -> io::Result<File> {
        let path = self.paths.get(i).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "more replicas than files were created for",
            )
        })?;
        OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
    }

    /// Runs the chain with `replicas` copies (at most as many as files)
    /// and times `writes` writes (after a warm-up of a tenth as many).
    pub fn measure(&self, replicas: usize, writes: usize) -> io::Result<FloorResult> {
        if replicas == 0 || writes == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the floor needs at least one replica and one write",
            ));
        }
        let opened = (0..replicas)
            .map(|i| self.open(i))
            .collect::<io::Result<Vec<_>>>()?;
        measure(opened, writes, self.size)
    }
}

fn listener() -> io::Result<TcpListener> {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
}

fn connect(port: u16) -> io::Result<TcpStream> {
    let s = TcpStream::connect((Ipv4Addr::LOCALHOST, port))?;
    s.set_nodelay(true)?;
    Ok(s)
}

fn accept(l: &TcpListener) -> io::Result<TcpStream> {
    let (s, _) = l.accept()?;
    s.set_nodelay(true)?;
    Ok(s)
}

/// Reads one write (offset, data) into `data`; `None` at end of stream.
fn read_write(s: &mut TcpStream, data: &mut [u8]) -> io::Result<Option<u64>> {
    let mut header = [0u8; HEADER];
    match s.read_exact(&mut header) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    s.read_exact(data)?;
    Ok(Some(u64::from_le_bytes(header)))
}

fn send_write(s: &mut TcpStream, offset: u64, data: &[u8]) -> io::Result<()> {
    let header = offset.to_le_bytes();
    let mut parts = [io::IoSlice::new(&header), io::IoSlice::new(data)];
    let mut parts: &mut [io::IoSlice<'_>] = &mut parts;
    while !parts.is_empty() {
        let n = s.write_vectored(parts)?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        io::IoSlice::advance_slices(&mut parts, n);
    }
    Ok(())
}

fn secondary(conn: TcpListener, file: File) -> io::Result<()> {
    let mut s = accept(&conn)?;
    let mut block = Block::new();
    while let Some(offset) = read_write(&mut s, block.bytes())? {
        file.write_all_at(block.bytes(), offset)?;
        s.write_all(&offset.to_le_bytes())?;
    }
    Ok(())
}

fn primary(client: TcpListener, secondaries: Vec<u16>, file: File) -> io::Result<()> {
    let mut links = secondaries
        .into_iter()
        .map(connect)
        .collect::<io::Result<Vec<_>>>()?;
    let mut s = accept(&client)?;
    let mut block = Block::new();
    while let Some(offset) = read_write(&mut s, block.bytes())? {
        for link in &mut links {
            send_write(link, offset, block.bytes())?;
        }
        file.write_all_at(block.bytes(), offset)?;
        for link in &mut links {
            let mut ack = [0u8; HEADER];
            link.read_exact(&mut ack)?;
        }
        s.write_all(&offset.to_le_bytes())?;
    }
    Ok(())
}

fn spawn(
    name: &str,
    f: impl FnOnce() -> io::Result<()> + Send + 'static,
) -> io::Result<JoinHandle<io::Result<()>>> {
    std::thread::Builder::new().name(name.to_string()).spawn(f)
}

fn measure(files: Vec<File>, writes: usize, size: u64) -> io::Result<FloorResult> {
    let replicas = files.len();
    let mut opened = files.into_iter();
    let mut threads = Vec::new();
    let mut secondary_ports = Vec::new();
    let primary_file = opened.next().ok_or(io::ErrorKind::InvalidInput)?;
    for (i, file) in opened.enumerate() {
        let l = listener()?;
        secondary_ports.push(l.local_addr()?.port());
        threads.push(spawn(&format!("floor-sec-{}", i + 1), move || {
            secondary(l, file)
        })?);
    }
    let l = listener()?;
    let port = l.local_addr()?.port();
    threads.push(spawn("floor-primary", move || {
        primary(l, secondary_ports, primary_file)
    })?);

    let timed = (|| {
        let mut s = connect(port)?;
        let mut block = Block::new();
        block.bytes().fill(0xb5);
        let blocks = size / BLOCK as u64;
        let warmup = writes / 10;
        let mut latencies = Vec::with_capacity(writes);
        let mut rng = rand::thread_rng();
        for k in 0..warmup + writes {
            let offset = rng.gen_range(0..blocks) * BLOCK as u64;
            let start = Instant::now();
            send_write(&mut s, offset, block.bytes())?;
            let mut ack = [0u8; HEADER];
            s.read_exact(&mut ack)?;
            if k >= warmup {
                latencies.push(start.elapsed().as_secs_f64() * 1e6);
            }
        }
        Ok::<_, io::Error>(latencies)
    })();
    // The client's socket is closed by now: the primary ends, and with it
    // its links, which ends the secondaries.
    let mut ended = Ok(());
    for t in threads {
        let r = t
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("a floor thread panicked")));
        if ended.is_ok() {
            ended = r;
        }
    }
    let mut latencies = timed?;
    ended?;
    latencies.sort_by(f64::total_cmp);
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q).round() as usize];
    Ok(FloorResult {
        replicas,
        mean_us: latencies.iter().sum::<f64>() / latencies.len() as f64,
        p50_us: at(0.5),
        p99_us: at(0.99),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_replica_count_completes_and_cleans_up() {
        let dir = tempfile::tempdir().unwrap();
        let files = FloorFiles::create(dir.path(), 3, 1 << 20).unwrap();
        for replicas in 1..=3 {
            let r = files.measure(replicas, 50).unwrap();
            assert_eq!(r.replicas, replicas);
            assert!(r.mean_us > 0.0 && r.p50_us <= r.p99_us);
        }
        drop(files);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn nonsense_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert!(FloorFiles::create(dir.path(), 0, 1 << 20).is_err());
        assert!(FloorFiles::create(dir.path(), 1, 1000).is_err());
        let files = FloorFiles::create(dir.path(), 1, 1 << 20).unwrap();
        assert!(files.measure(2, 10).is_err());
        assert!(files.measure(1, 0).is_err());
    }
}
