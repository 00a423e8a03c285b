//! Reads the guest's view of a qcow2 image: the two-level L1/L2 cluster map,
//! plain, zero-flagged and compressed clusters, and the map itself as runs
//! of data and zeros.
//!
//! Every host offset taken from a table is checked (alignment, inside the
//! file) when it is used; a bad one is an error, never a read of something
//! else. L2 tables are loaded on demand into a small cache, so a sequential
//! read loads each table once.

use std::sync::{Mutex, MutexGuard};

use crate::compress::decompress;
use crate::header::{self, check_table, Header, COMPRESSED, OFFSET_MASK, ZERO};
use crate::{ImageError, ReadAt};

/// L2 tables kept in memory: at 64 KiB clusters each maps 512 MiB, and at
/// the 2 MiB maximum the cache holds 32 MiB.
const L2_CACHE_TABLES: usize = 16;

/// What a run of the guest's disk holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExtentKind {
    /// Bytes stored in the image (which may still happen to be zeros).
    Data,
    /// Bytes that read as zeros: never written, or written as zeros.
    Zero,
}

/// A run of the guest's disk of one kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Extent {
    pub offset: u64,
    pub len: u64,
    pub kind: ExtentKind,
}

/// Where one guest cluster's bytes come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mapping {
    Zero,
    Data(u64),
    /// Host byte offset and the length of its sector run.
    Compressed(u64, u64),
}

struct L2Slot {
    offset: u64,
    table: Vec<u64>,
    last_used: u64,
}

#[derive(Default)]
struct Cache {
    l2: Vec<L2Slot>,
    tick: u64,
    /// The last decompressed cluster, by its L2 entry: reads smaller than a
    /// cluster would otherwise inflate it again for each piece.
    cluster: Option<(u64, Vec<u8>)>,
}

/// A qcow2 image opened for reading. Shareable between threads when `R` is:
/// reads are positional and the cache sits behind a mutex.
pub struct Qcow2Reader<R: ReadAt> {
    src: R,
    file_len: u64,
    header: Header,
    /// The L1 entries covering the virtual size.
    l1: Vec<u64>,
    cache: Mutex<Cache>,
}

impl<R: ReadAt> std::fmt::Debug for Qcow2Reader<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qcow2Reader")
            .field("file_len", &self.file_len)
            .field("header", &self.header)
            .finish_non_exhaustive()
    }
}

impl<R: ReadAt> Qcow2Reader<R> {
    /// Opens `src` as a qcow2 image, refusing any feature it cannot read
    /// (see [`ImageError`]), and loads and checks its L1 table.
    pub fn open(src: R) -> Result<Self, ImageError> {
        let file_len = src.len()?;
        let header = header::parse(&src, file_len)?;
        let needed = header.l1_entries_needed();
        // Bounded: parse checked the table against the file and the L1 limit.
        let mut raw = vec![0u8; (needed * 8) as usize];
        if needed > 0 {
            src.read_at(&mut raw, header.l1_table_offset)?;
        }
        let l1: Vec<u64> = raw.chunks_exact(8).map(be64).collect();
        let cluster_size = header.cluster_size();
        for &entry in &l1 {
            let offset = entry & OFFSET_MASK;
            if offset != 0 {
                check_table("an L2 table", offset, cluster_size, cluster_size, file_len)?;
            }
        }
        Ok(Qcow2Reader {
            src,
            file_len,
            header,
            l1,
            cache: Mutex::new(Cache::default()),
        })
    }

    /// The guest disk's size in bytes.
    pub fn virtual_size(&self) -> u64 {
        self.header.virtual_size
    }

    /// The image's cluster size in bytes.
    pub fn cluster_size(&self) -> u64 {
        self.header.cluster_size()
    }

    /// The qcow2 version, 2 or 3.
    pub fn version(&self) -> u32 {
        self.header.version
    }

    /// Gives back the source.
    pub fn into_inner(self) -> R {
        self.src
    }

    fn cache(&self) -> MutexGuard<'_, Cache> {
        // A panic elsewhere cannot leave the cache inconsistent (slots are
        // replaced whole), so a poisoned lock is still usable.
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the L2 table at `offset` (already validated by open).
    fn with_l2<T>(&self, offset: u64, f: impl FnOnce(&[u64]) -> T) -> Result<T, ImageError> {
        let mut cache = self.cache();
        cache.tick += 1;
        let tick = cache.tick;
        if let Some(slot) = cache.l2.iter_mut().find(|s| s.offset == offset) {
            slot.last_used = tick;
            return Ok(f(&slot.table));
        }
        let mut raw = vec![0u8; self.cluster_size() as usize];
        self.src.read_at(&mut raw, offset)?;
        let table: Vec<u64> = raw.chunks_exact(8).map(be64).collect();
        let result = f(&table);
        let slot = L2Slot {
            offset,
            table,
            last_used: tick,
        };
        if cache.l2.len() < L2_CACHE_TABLES {
            cache.l2.push(slot);
        } else if let Some(oldest) = cache.l2.iter_mut().min_by_key(|s| s.last_used) {
            *oldest = slot;
        }
        Ok(result)
    }

    /// Decodes an L2 entry, checking any host offset it holds.
    fn classify(&self, entry: u64) -> Result<Mapping, ImageError> {
        let cluster_bits = self.header.cluster_bits;
        if entry & COMPRESSED != 0 {
            // Bits 0..x are the byte offset, bits x..62 the count of 512-byte
            // sectors after the first that the compressed data spans.
            let x = 62 - (cluster_bits - 8);
            let offset = entry & ((1u64 << x) - 1);
            let sectors = ((entry >> x) & ((1u64 << (cluster_bits - 8)) - 1)) + 1;
            let len = sectors * 512 - (offset & 511);
            if offset >= self.file_len {
                return Err(ImageError::Truncated {
                    what: "a compressed cluster",
                    offset,
                    file_len: self.file_len,
                });
            }
            return Ok(Mapping::Compressed(offset, len));
        }
        // QEMU honours the zero flag in version 2 images too.
        if entry & ZERO != 0 {
            return Ok(Mapping::Zero);
        }
        let offset = entry & OFFSET_MASK;
        if offset == 0 {
            return Ok(Mapping::Zero);
        }
        if !offset.is_multiple_of(self.cluster_size()) {
            return Err(ImageError::Misaligned {
                what: "a data cluster",
                offset,
                alignment: self.cluster_size(),
            });
        }
        if offset >= self.file_len {
            return Err(ImageError::Truncated {
                what: "a data cluster",
                offset,
                file_len: self.file_len,
            });
        }
        Ok(Mapping::Data(offset))
    }

    /// Where guest cluster `cluster` lives, and its raw L2 entry.
    fn mapping(&self, cluster: u64) -> Result<(Mapping, u64), ImageError> {
        let l2_bits = self.header.l2_bits();
        let l2_offset = usize::try_from(cluster >> l2_bits)
            .ok()
            .and_then(|i| self.l1.get(i))
            .map_or(0, |e| e & OFFSET_MASK);
        if l2_offset == 0 {
            return Ok((Mapping::Zero, 0));
        }
        let index = (cluster & ((1u64 << l2_bits) - 1)) as usize;
        let entry = self.with_l2(l2_offset, |t| t.get(index).copied().unwrap_or(0))?;
        Ok((self.classify(entry)?, entry))
    }

    /// Reads `buf.len()` bytes of the guest disk at `offset`; holes read as
    /// zeros. The range must lie within the virtual size.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ImageError> {
        let len = buf.len() as u64;
        if offset
            .checked_add(len)
            .is_none_or(|end| end > self.virtual_size())
        {
            return Err(ImageError::OutOfRange {
                offset,
                len,
                virtual_size: self.virtual_size(),
            });
        }
        let cluster_size = self.cluster_size();
        let mut done = 0usize;
        while done < buf.len() {
            let pos = offset + done as u64;
            let within = pos % cluster_size;
            let n = ((cluster_size - within) as usize).min(buf.len() - done);
            let out = &mut buf[done..done + n];
            match self.mapping(pos >> self.header.cluster_bits)? {
                (Mapping::Zero, _) => out.fill(0),
                (Mapping::Data(host), _) => self.read_host(out, host + within)?,
                (Mapping::Compressed(host, clen), entry) => {
                    self.read_compressed(out, within, host, clen, entry)?
                }
            }
            done += n;
        }
        Ok(())
    }

    /// Reads host bytes at `at`; the part of a cluster past the end of the
    /// file reads as zeros, as QEMU's file driver has it.
    fn read_host(&self, out: &mut [u8], at: u64) -> Result<(), ImageError> {
        let present = self.file_len.saturating_sub(at).min(out.len() as u64) as usize;
        let (head, tail) = out.split_at_mut(present);
        if !head.is_empty() {
            self.src.read_at(head, at)?;
        }
        tail.fill(0);
        Ok(())
    }

    fn read_compressed(
        &self,
        out: &mut [u8],
        within: u64,
        host: u64,
        clen: u64,
        entry: u64,
    ) -> Result<(), ImageError> {
        let start = within as usize;
        {
            let cache = self.cache();
            if let Some((cached, data)) = &cache.cluster {
                if *cached == entry {
                    out.copy_from_slice(&data[start..start + out.len()]);
                    return Ok(());
                }
            }
        }
        // The last sector run may be cut short by the end of the file.
        let clen = clen.min(self.file_len - host);
        let mut packed = vec![0u8; clen as usize];
        self.src.read_at(&mut packed, host)?;
        let mut data = vec![0u8; self.cluster_size() as usize];
        decompress(self.header.compression, &packed, &mut data).map_err(|reason| {
            ImageError::Decompress {
                offset: host,
                reason,
            }
        })?;
        out.copy_from_slice(&data[start..start + out.len()]);
        self.cache().cluster = Some((entry, data));
        Ok(())
    }

    /// The guest disk as coalesced runs of data and zeros covering exactly
    /// `[0, virtual_size)`. Compressed clusters and clusters that merely
    /// hold zero bytes count as data; unallocated and zero-flagged clusters
    /// as zeros. Fails on a table entry that points outside the file.
    pub fn extents(&self) -> Result<Vec<Extent>, ImageError> {
        let mut runs: Vec<Extent> = Vec::new();
        let mut push = |offset: u64, len: u64, kind: ExtentKind| match runs.last_mut() {
            Some(last) if last.kind == kind && last.offset + last.len == offset => last.len += len,
            _ => runs.push(Extent { offset, len, kind }),
        };
        let size = self.virtual_size();
        let cluster_bits = self.header.cluster_bits;
        let l2_bits = self.header.l2_bits();
        let span = 1u64 << (cluster_bits + l2_bits);
        for (i, &l1_entry) in self.l1.iter().enumerate() {
            let start = i as u64 * span;
            if start >= size {
                break;
            }
            let l2_offset = l1_entry & OFFSET_MASK;
            if l2_offset == 0 {
                push(start, span.min(size - start), ExtentKind::Zero);
                continue;
            }
            let entries = self.with_l2(l2_offset, |t| t.to_vec())?;
            for (j, &entry) in entries.iter().enumerate() {
                let at = start + ((j as u64) << cluster_bits);
                if at >= size {
                    break;
                }
                let kind = match self.classify(entry)? {
                    Mapping::Zero => ExtentKind::Zero,
                    Mapping::Data(_) | Mapping::Compressed(..) => ExtentKind::Data,
                };
                push(at, (1u64 << cluster_bits).min(size - at), kind);
            }
        }
        Ok(runs)
    }
}

fn be64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    u64::from_be_bytes(a)
}
