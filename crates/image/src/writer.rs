//! Writes a qcow2 (version 3) image in one streaming pass: data clusters are
//! appended as they come, after a first cluster reserved for the header,
//! and `finish` appends the L2 tables, the L1 table, the refcount table and
//! the refcount blocks, then writes the header at offset 0.
//!
//! Invariant of the result: every cluster of the file is referenced exactly
//! once (header, data, L2, L1, refcount table and blocks) and has refcount
//! 1, so `qemu-img check` finds neither errors nor leaks, and every entry
//! carries the COPIED flag that refcount 1 implies.

use std::collections::BTreeMap;
use std::io::{Seek, SeekFrom, Write};

use crate::header::{
    encode_v3, l1_entries_for, Layout, COPIED, MAX_CLUSTER_BITS, MAX_L1_ENTRIES, MAX_VIRTUAL_SIZE,
    MIN_CLUSTER_BITS,
};
use crate::ImageError;

/// Largest host offset an L1/L2 entry can hold (bits 9..=55).
const MAX_HOST_OFFSET: u64 = 1 << 56;

/// A qcow2 image being written. Each cluster may be written once, in any
/// order; clusters never written read as zeros.
pub struct Qcow2Writer<W: Write + Seek> {
    out: W,
    cluster_bits: u32,
    virtual_size: u64,
    /// Guest clusters in the virtual size (the last may be partial).
    clusters: u64,
    /// Guest cluster -> host offset of its data.
    map: BTreeMap<u64, u64>,
    /// Where the next data cluster goes; also the file's current length.
    next_host: u64,
    /// Set when a write failed part-way: the output is then unusable.
    failed: bool,
}

impl<W: Write + Seek> std::fmt::Debug for Qcow2Writer<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qcow2Writer")
            .field("cluster_bits", &self.cluster_bits)
            .field("virtual_size", &self.virtual_size)
            .field("written", &self.map.len())
            .finish_non_exhaustive()
    }
}

impl<W: Write + Seek> Qcow2Writer<W> {
    /// Starts an image of `virtual_size` bytes with clusters of
    /// `2^cluster_bits` bytes ([`crate::DEFAULT_CLUSTER_BITS`] is the usual
    /// choice) at the start of `out`, which should be empty. The size must be
    /// a multiple of 512 bytes, the granularity QEMU reads qcow2 sizes in.
    pub fn create(mut out: W, virtual_size: u64, cluster_bits: u32) -> Result<Self, ImageError> {
        if !(MIN_CLUSTER_BITS..=MAX_CLUSTER_BITS).contains(&cluster_bits) {
            return Err(ImageError::ClusterBits(cluster_bits));
        }
        if virtual_size > MAX_VIRTUAL_SIZE {
            return Err(ImageError::VirtualSizeTooLarge {
                size: virtual_size,
                max: MAX_VIRTUAL_SIZE,
            });
        }
        if !virtual_size.is_multiple_of(512) {
            return Err(ImageError::VirtualSizeUnaligned(virtual_size));
        }
        let l1_entries = l1_entries_for(virtual_size, cluster_bits);
        if l1_entries > MAX_L1_ENTRIES {
            // QEMU would refuse the image; a larger cluster size fixes it.
            return Err(ImageError::L1TooLarge {
                entries: l1_entries,
                max: MAX_L1_ENTRIES,
            });
        }
        let cluster_size = 1u64 << cluster_bits;
        // Cluster 0 is the header's; it is written for real at finish, but
        // zeros now give the data clusters their place.
        out.seek(SeekFrom::Start(0))?;
        out.write_all(&vec![0u8; cluster_size as usize])?;
        Ok(Qcow2Writer {
            out,
            cluster_bits,
            virtual_size,
            clusters: virtual_size.div_ceil(cluster_size),
            map: BTreeMap::new(),
            next_host: cluster_size,
            failed: false,
        })
    }

    /// The image's cluster size in bytes.
    pub fn cluster_size(&self) -> u64 {
        1 << self.cluster_bits
    }

    /// The guest disk's size in bytes.
    pub fn virtual_size(&self) -> u64 {
        self.virtual_size
    }

    /// Stores guest cluster `index` (bytes `index * cluster_size ..`). `data`
    /// is exactly one cluster; the caller pads the last, partial one.
    pub fn write_cluster(&mut self, index: u64, data: &[u8]) -> Result<(), ImageError> {
        if self.failed {
            return Err(ImageError::WriterFailed);
        }
        if index >= self.clusters {
            return Err(ImageError::ClusterIndexOutOfRange {
                index,
                clusters: self.clusters,
            });
        }
        if data.len() as u64 != self.cluster_size() {
            return Err(ImageError::ClusterLength {
                len: data.len(),
                cluster_size: self.cluster_size(),
            });
        }
        if self.map.contains_key(&index) {
            return Err(ImageError::ClusterWrittenTwice(index));
        }
        if let Err(e) = self.out.write_all(data) {
            self.failed = true;
            return Err(e.into());
        }
        self.map.insert(index, self.next_host);
        self.next_host += self.cluster_size();
        Ok(())
    }

    /// Writes the metadata and the header and gives back the output, flushed.
    pub fn finish(mut self) -> Result<W, ImageError> {
        if self.failed {
            return Err(ImageError::WriterFailed);
        }
        let result = self.write_metadata();
        if result.is_err() {
            self.failed = true;
        }
        result?;
        Ok(self.out)
    }

    fn write_metadata(&mut self) -> Result<(), ImageError> {
        let cs = self.cluster_size();
        let l2_bits = self.cluster_bits - 3;
        let l1_size = l1_entries_for(self.virtual_size, self.cluster_bits);
        let l1_clusters = (l1_size * 8).div_ceil(cs);
        let l2_tables: Vec<u64> = {
            let mut t: Vec<u64> = self.map.keys().map(|c| c >> l2_bits).collect();
            t.dedup();
            t
        };
        let n_l2 = l2_tables.len() as u64;

        // Refcount blocks must count every cluster, themselves and the
        // refcount table included: grow both until the counts settle (the
        // counts only grow, so this ends within a few rounds).
        let fixed_clusters = self.next_host / cs + n_l2 + l1_clusters;
        let per_block = cs / 2; // 16-bit refcounts
        let (mut rt_clusters, mut rb_count) = (0u64, 0u64);
        let total = loop {
            let total = fixed_clusters + rt_clusters + rb_count;
            let blocks = total.div_ceil(per_block);
            let table = (blocks * 8).div_ceil(cs);
            if (table, blocks) == (rt_clusters, rb_count) {
                break total;
            }
            (rt_clusters, rb_count) = (table, blocks);
        };
        if total * cs > MAX_HOST_OFFSET {
            return Err(ImageError::InvalidHeader(format!(
                "the image would need {} bytes, past qcow2's largest offset",
                total * cs
            )));
        }

        let l2_start = self.next_host;
        let l1_offset = l2_start + n_l2 * cs;
        let rt_offset = l1_offset + l1_clusters * cs;
        let rb_offset = rt_offset + rt_clusters * cs;

        // L2 tables, in the order of their L1 index.
        let mut block = vec![0u8; cs as usize];
        let mut entries = self.map.iter().peekable();
        for &table in &l2_tables {
            block.fill(0);
            while let Some((&cluster, &host)) = entries.next_if(|&(&c, _)| c >> l2_bits == table) {
                let at = ((cluster & ((1 << l2_bits) - 1)) * 8) as usize;
                block[at..at + 8].copy_from_slice(&(host | COPIED).to_be_bytes());
            }
            self.out.write_all(&block)?;
        }

        // L1 table: bounded by MAX_L1_ENTRIES (checked at create).
        let mut l1 = vec![0u8; (l1_clusters * cs) as usize];
        for (n, &table) in l2_tables.iter().enumerate() {
            let at = (table * 8) as usize;
            let l2_offset = l2_start + n as u64 * cs;
            l1[at..at + 8].copy_from_slice(&(l2_offset | COPIED).to_be_bytes());
        }
        self.out.write_all(&l1)?;

        // Refcount table: one entry per refcount block.
        let mut rt = vec![0u8; (rt_clusters * cs) as usize];
        for (n, entry) in rt.chunks_exact_mut(8).take(rb_count as usize).enumerate() {
            entry.copy_from_slice(&(rb_offset + n as u64 * cs).to_be_bytes());
        }
        self.out.write_all(&rt)?;

        // Refcount blocks: refcount 1 for clusters 0..total, 0 after.
        for b in 0..rb_count {
            block.fill(0);
            let first = b * per_block;
            let counted = total.saturating_sub(first).min(per_block) as usize;
            for entry in block.chunks_exact_mut(2).take(counted) {
                entry.copy_from_slice(&1u16.to_be_bytes());
            }
            self.out.write_all(&block)?;
        }

        let header = encode_v3(&Layout {
            cluster_bits: self.cluster_bits,
            virtual_size: self.virtual_size,
            l1_size: l1_size as u32,
            l1_table_offset: if l1_size == 0 { 0 } else { l1_offset },
            refcount_table_offset: rt_offset,
            refcount_table_clusters: rt_clusters as u32,
        });
        self.out.seek(SeekFrom::Start(0))?;
        self.out.write_all(&header)?;
        self.out.flush()?;
        Ok(())
    }
}
