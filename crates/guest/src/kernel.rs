//! Turns the kernel image Debian ships (`/boot/vmlinuz-*`, a bzImage) into
//! the uncompressed ELF `vmlinux` that QEMU boots directly through its PVH
//! entry point: under TCG that skips the kernel's self-decompression, the
//! slowest part of an emulated boot.
//!
//! The compressed payload is located from the x86 boot protocol header
//! (`payload_offset`/`payload_length`, protocol 2.08+; see the kernel's
//! `Documentation/arch/x86/boot.rst`) rather than by scanning for magic
//! bytes. Debian's 6.1 kernels compress it with xz (x86 BCJ + LZMA2),
//! newer ones (the backports 6.12) with zstd.
//!
//! Invariants: the result is an ELF file whose length matches the size the
//! kernel build appended to the payload, and which carries the PVH entry
//! note (`Xen` note of type `XEN_ELFNOTE_PHYS32_ENTRY`), without which QEMU
//! could not boot it; anything else is an error naming what was found.

use std::io::Read;

use crate::elf::Elf;

/// Why a bzImage could not be turned into a bootable vmlinux.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    #[error("not a bzImage (no `HdrS` boot header)")]
    NotBzImage,
    #[error("boot protocol {0:#x} is older than 2.08 (no payload fields)")]
    OldProtocol(u16),
    #[error("payload ({offset}+{len} bytes) lies outside the {file} byte image")]
    PayloadOutOfBounds {
        offset: usize,
        len: usize,
        file: usize,
    },
    #[error("payload is {0}-compressed; only xz (Debian's 6.1 kernels) and zstd (newer ones) are supported")]
    UnsupportedCompression(&'static str),
    #[error("xz payload: {0}")]
    Xz(String),
    #[error("zstd payload: {0}")]
    Zstd(String),
    #[error("decompressed {got} bytes, the image says {want}")]
    SizeMismatch { got: usize, want: usize },
    #[error("the decompressed kernel is not an ELF file ({0})")]
    NotElf(String),
    #[error("vmlinux has no PVH entry note (kernel built without CONFIG_PVH); QEMU cannot boot it directly")]
    NoPvhEntry,
}

/// `XEN_ELFNOTE_PHYS32_ENTRY`: the 32-bit PVH entry point QEMU jumps to.
const XEN_ELFNOTE_PHYS32_ENTRY: u32 = 18;

/// Magic numbers of the payload formats the kernel supports.
fn compression(payload: &[u8]) -> &'static str {
    const KINDS: &[(&[u8], &str)] = &[
        (&[0xfd, b'7', b'z', b'X', b'Z', 0], "xz"),
        (&[0x1f, 0x8b], "gzip"),
        (&[0x28, 0xb5, 0x2f, 0xfd], "zstd"),
        (b"BZh", "bzip2"),
        (&[0x5d, 0, 0], "lzma"),
        (&[0x89, b'L', b'Z', b'O'], "lzo"),
        (&[0x02, 0x21, 0x4c, 0x18], "lz4"),
        (b"\x7fELF", "uncompressed"),
    ];
    KINDS
        .iter()
        .find(|(magic, _)| payload.starts_with(magic))
        .map(|(_, name)| *name)
        .unwrap_or("unknown")
}

fn le16(d: &[u8], off: usize) -> Option<u16> {
    d.get(off..off + 2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
}

fn le32(d: &[u8], off: usize) -> Option<u32> {
    d.get(off..off + 4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// The bytes of the compressed kernel inside a bzImage.
fn payload(bzimage: &[u8]) -> Result<&[u8], KernelError> {
    if bzimage.get(0x202..0x206) != Some(b"HdrS".as_slice()) {
        return Err(KernelError::NotBzImage);
    }
    let version = le16(bzimage, 0x206).ok_or(KernelError::NotBzImage)?;
    if version < 0x208 {
        return Err(KernelError::OldProtocol(version));
    }
    let setup_sects = match bzimage[0x1f1] {
        0 => 4,
        n => usize::from(n),
    };
    let pm_start = (setup_sects + 1) * 512;
    let offset = le32(bzimage, 0x248).ok_or(KernelError::NotBzImage)? as usize;
    let len = le32(bzimage, 0x24c).ok_or(KernelError::NotBzImage)? as usize;
    let start = pm_start + offset;
    bzimage
        .get(start..start.saturating_add(len))
        .ok_or(KernelError::PayloadOutOfBounds {
            offset: start,
            len,
            file: bzimage.len(),
        })
}

/// Decompresses the kernel of a bzImage and checks it can be booted as an
/// ELF through PVH.
pub fn extract_vmlinux(bzimage: &[u8]) -> Result<Vec<u8>, KernelError> {
    let payload = payload(bzimage)?;
    let kind = compression(payload);
    if kind != "xz" && kind != "zstd" {
        return Err(KernelError::UnsupportedCompression(kind));
    }
    // The kernel build appends the uncompressed size (le32) to the stream.
    let (stream, size) = payload.split_at(payload.len().saturating_sub(4));
    let want = le32(size, 0).ok_or(KernelError::Xz(
        "payload shorter than its size trailer".into(),
    ))? as usize;
    let mut out = Vec::with_capacity(want);
    if kind == "xz" {
        let mut reader = xz4rust::XzReader::new(std::io::Cursor::new(stream.to_vec()));
        reader
            .read_to_end(&mut out)
            .map_err(|e| KernelError::Xz(e.to_string()))?;
    } else {
        let mut input = stream;
        let mut reader = ruzstd::decoding::StreamingDecoder::new(&mut input)
            .map_err(|e| KernelError::Zstd(e.to_string()))?;
        reader
            .read_to_end(&mut out)
            .map_err(|e| KernelError::Zstd(e.to_string()))?;
    }
    if out.len() != want {
        return Err(KernelError::SizeMismatch {
            got: out.len(),
            want,
        });
    }
    let elf = Elf::parse(&out).map_err(|e| KernelError::NotElf(e.to_string()))?;
    let entries = elf
        .notes("Xen", XEN_ELFNOTE_PHYS32_ENTRY)
        .map_err(|e| KernelError::NotElf(e.to_string()))?;
    if entries.is_empty() {
        return Err(KernelError::NoPvhEntry);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 140-byte ELF64 with one PT_NOTE segment holding a `Xen` note of
    /// type 18, compressed as the kernel build does (`xz --check=crc32
    /// --x86 --lzma2`), made once with Python's lzma module.
    const PVH_ELF_XZ: &[u8] = include_bytes!("../tests/data/pvh-elf.xz");
    const PVH_ELF_LEN: u32 = 140;

    fn bzimage(payload: &[u8], version: u16) -> Vec<u8> {
        let setup_sects = 1u8;
        let pm_start = (usize::from(setup_sects) + 1) * 512;
        let mut img = vec![0u8; pm_start + 64];
        img[0x1f1] = setup_sects;
        img[0x202..0x206].copy_from_slice(b"HdrS");
        img[0x206..0x208].copy_from_slice(&version.to_le_bytes());
        img[0x248..0x24c].copy_from_slice(&64u32.to_le_bytes());
        img[0x24c..0x250].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        img.extend_from_slice(payload);
        img.extend_from_slice(&[0u8; 32]); // what follows the payload (signature, padding)
        img
    }

    fn with_size(stream: &[u8], size: u32) -> Vec<u8> {
        let mut p = stream.to_vec();
        p.extend_from_slice(&size.to_le_bytes());
        p
    }

    #[test]
    fn extracts_an_xz_payload_with_pvh_note() {
        let img = bzimage(&with_size(PVH_ELF_XZ, PVH_ELF_LEN), 0x20f);
        let vmlinux = extract_vmlinux(&img).unwrap();
        assert_eq!(vmlinux.len(), PVH_ELF_LEN as usize);
        assert_eq!(&vmlinux[..4], b"\x7fELF");
    }

    #[test]
    fn wrong_size_trailer_is_an_error() {
        let img = bzimage(&with_size(PVH_ELF_XZ, PVH_ELF_LEN + 1), 0x20f);
        assert_eq!(
            extract_vmlinux(&img).err(),
            Some(KernelError::SizeMismatch {
                got: PVH_ELF_LEN as usize,
                want: PVH_ELF_LEN as usize + 1
            })
        );
    }

    #[test]
    fn rejects_non_bzimages_and_other_compressions() {
        assert_eq!(
            extract_vmlinux(&[0u8; 4096]).err(),
            Some(KernelError::NotBzImage)
        );
        assert_eq!(
            extract_vmlinux(&bzimage(&with_size(PVH_ELF_XZ, PVH_ELF_LEN), 0x206)).err(),
            Some(KernelError::OldProtocol(0x206))
        );
        let gz = with_size(&[0x1f, 0x8b, 8, 0, 0, 0], 10);
        assert_eq!(
            extract_vmlinux(&bzimage(&gz, 0x20f)).err(),
            Some(KernelError::UnsupportedCompression("gzip"))
        );
        let mut img = bzimage(&with_size(PVH_ELF_XZ, PVH_ELF_LEN), 0x20f);
        img[0x24c..0x250].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            extract_vmlinux(&img).err(),
            Some(KernelError::PayloadOutOfBounds { .. })
        ));
    }

    #[test]
    fn corrupt_stream_is_an_error() {
        let mut stream = PVH_ELF_XZ.to_vec();
        let mid = stream.len() / 2;
        stream[mid] ^= 0xff;
        let img = bzimage(&with_size(&stream, PVH_ELF_LEN), 0x20f);
        assert!(extract_vmlinux(&img).is_err());
    }
}
