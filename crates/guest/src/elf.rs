//! Reads the few things the guest image needs from ELF files: a binary's or
//! library's `DT_NEEDED` and `DT_SONAME`, its program interpreter, its
//! dynamic symbols with their symbol versions, named sections (a kernel
//! module's `.modinfo`) and notes (the kernel's PVH entry).
//!
//! Invariants: only 64-bit little-endian ELF is accepted (the guest is
//! x86_64); every offset and size read from the file is bounds-checked, so
//! a truncated or hostile file gives an [`ElfError`], never a panic.

use std::collections::HashMap;

/// Why a file could not be read as ELF.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ElfError {
    #[error("not an ELF file")]
    NotElf,
    #[error("not a 64-bit little-endian ELF file")]
    Unsupported,
    #[error("truncated or malformed ELF ({0})")]
    Malformed(&'static str),
}

type R<T> = Result<T, ElfError>;

const SHT_DYNAMIC: u32 = 6;
const SHT_DYNSYM: u32 = 11;
const SHT_GNU_VERDEF: u32 = 0x6fff_fffd;
const SHT_GNU_VERNEED: u32 = 0x6fff_fffe;
const SHT_GNU_VERSYM: u32 = 0x6fff_ffff;
const PT_INTERP: u32 = 3;
const PT_NOTE: u32 = 4;
const DT_NULL: u64 = 0;
const DT_NEEDED: u64 = 1;
const DT_SONAME: u64 = 14;

#[derive(Debug, Clone, Copy)]
struct Section {
    name: u32,
    kind: u32,
    offset: u64,
    size: u64,
    link: u32,
    info: u32,
}

#[derive(Debug, Clone, Copy)]
struct Segment {
    kind: u32,
    offset: u64,
    filesz: u64,
}

/// What kind of object a dynamic symbol names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SymKind {
    Func,
    Object,
    Tls,
    Other,
}

/// A symbol version as a dynamic symbol refers to it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SymVersion {
    /// The version name, e.g. `GLIBC_2.34`.
    pub name: String,
    /// For an undefined symbol: the library (its soname as in `DT_NEEDED`)
    /// that must define that version.
    pub file: Option<String>,
}

/// One entry of `.dynsym`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DynSymbol {
    pub name: String,
    /// Defined in this object (not `SHN_UNDEF`).
    pub defined: bool,
    pub weak: bool,
    pub kind: SymKind,
    pub size: u64,
    pub version: Option<SymVersion>,
}

/// Dynamic section entries and their string table.
type Dynamic<'a> = (Vec<(u64, u64)>, &'a [u8]);

/// A parsed view of an ELF file held in memory.
pub struct Elf<'a> {
    data: &'a [u8],
    sections: Vec<Section>,
    segments: Vec<Segment>,
    shstrndx: usize,
}

fn u16_at(d: &[u8], off: u64) -> R<u16> {
    let o = usize::try_from(off).map_err(|_| ElfError::Malformed("offset"))?;
    d.get(o..o + 2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .ok_or(ElfError::Malformed("u16 out of bounds"))
}

fn u32_at(d: &[u8], off: u64) -> R<u32> {
    let o = usize::try_from(off).map_err(|_| ElfError::Malformed("offset"))?;
    d.get(o..o + 4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .ok_or(ElfError::Malformed("u32 out of bounds"))
}

fn u64_at(d: &[u8], off: u64) -> R<u64> {
    let o = usize::try_from(off).map_err(|_| ElfError::Malformed("offset"))?;
    d.get(o..o + 8)
        .map(|b| {
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            u64::from_le_bytes(a)
        })
        .ok_or(ElfError::Malformed("u64 out of bounds"))
}

fn slice(d: &[u8], off: u64, len: u64) -> R<&[u8]> {
    let start = usize::try_from(off).map_err(|_| ElfError::Malformed("offset"))?;
    let len = usize::try_from(len).map_err(|_| ElfError::Malformed("size"))?;
    let end = start.checked_add(len).ok_or(ElfError::Malformed("size"))?;
    d.get(start..end)
        .ok_or(ElfError::Malformed("range out of bounds"))
}

/// The NUL-terminated string at `off` in `table`.
fn cstr(table: &[u8], off: u64) -> R<String> {
    let start = usize::try_from(off).map_err(|_| ElfError::Malformed("string offset"))?;
    let rest = table
        .get(start..)
        .ok_or(ElfError::Malformed("string offset"))?;
    let end = rest
        .iter()
        .position(|&b| b == 0)
        .ok_or(ElfError::Malformed("unterminated string"))?;
    Ok(String::from_utf8_lossy(&rest[..end]).into_owned())
}

impl<'a> Elf<'a> {
    pub fn parse(data: &'a [u8]) -> R<Elf<'a>> {
        if data.len() < 4 || &data[..4] != b"\x7fELF" {
            return Err(ElfError::NotElf);
        }
        if data.len() < 64 {
            return Err(ElfError::Malformed("header"));
        }
        if data[4] != 2 || data[5] != 1 {
            return Err(ElfError::Unsupported);
        }
        let phoff = u64_at(data, 0x20)?;
        let shoff = u64_at(data, 0x28)?;
        let phentsize = u64::from(u16_at(data, 0x36)?);
        let phnum = u64::from(u16_at(data, 0x38)?);
        let shentsize = u64::from(u16_at(data, 0x3a)?);
        let shnum = u64::from(u16_at(data, 0x3c)?);
        let shstrndx = usize::from(u16_at(data, 0x3e)?);

        let mut sections = Vec::new();
        if shoff != 0 {
            if shentsize < 64 {
                return Err(ElfError::Malformed("section header size"));
            }
            for i in 0..shnum {
                let h = shoff + i * shentsize;
                sections.push(Section {
                    name: u32_at(data, h)?,
                    kind: u32_at(data, h + 4)?,
                    offset: u64_at(data, h + 24)?,
                    size: u64_at(data, h + 32)?,
                    link: u32_at(data, h + 40)?,
                    info: u32_at(data, h + 44)?,
                });
            }
        }
        let mut segments = Vec::new();
        if phoff != 0 {
            if phentsize < 56 {
                return Err(ElfError::Malformed("program header size"));
            }
            for i in 0..phnum {
                let h = phoff + i * phentsize;
                segments.push(Segment {
                    kind: u32_at(data, h)?,
                    offset: u64_at(data, h + 8)?,
                    filesz: u64_at(data, h + 32)?,
                });
            }
        }
        Ok(Elf {
            data,
            sections,
            segments,
            shstrndx,
        })
    }

    fn section_bytes(&self, s: &Section) -> R<&'a [u8]> {
        // SHT_NOBITS (8) occupies no file space.
        if s.kind == 8 {
            return Ok(&[]);
        }
        slice(self.data, s.offset, s.size)
    }

    fn linked_strtab(&self, s: &Section) -> R<&'a [u8]> {
        let strtab = self
            .sections
            .get(s.link as usize)
            .ok_or(ElfError::Malformed("sh_link"))?;
        self.section_bytes(strtab)
    }

    fn first_of_kind(&self, kind: u32) -> Option<&Section> {
        self.sections.iter().find(|s| s.kind == kind)
    }

    /// The contents of the section called `name`, if there is one.
    pub fn section_data(&self, name: &str) -> R<Option<&'a [u8]>> {
        let Some(names) = self.sections.get(self.shstrndx) else {
            return Ok(None);
        };
        let names = self.section_bytes(names)?;
        for s in &self.sections {
            if cstr(names, u64::from(s.name))? == name {
                return self.section_bytes(s).map(Some);
            }
        }
        Ok(None)
    }

    /// The program interpreter (`PT_INTERP`), e.g. `/lib64/ld-linux-x86-64.so.2`.
    pub fn interp(&self) -> R<Option<String>> {
        for seg in &self.segments {
            if seg.kind == PT_INTERP {
                let bytes = slice(self.data, seg.offset, seg.filesz)?;
                return cstr(bytes, 0).map(Some);
            }
        }
        Ok(None)
    }

    /// (tag, value) pairs of the dynamic section, up to `DT_NULL`, and the
    /// string table they refer to.
    fn dynamic(&self) -> R<Dynamic<'a>> {
        let Some(dynsec) = self.first_of_kind(SHT_DYNAMIC) else {
            return Ok((Vec::new(), &[]));
        };
        let bytes = self.section_bytes(dynsec)?;
        let strtab = self.linked_strtab(dynsec)?;
        let mut out = Vec::new();
        for e in bytes.chunks_exact(16) {
            let tag = u64_at(e, 0)?;
            if tag == DT_NULL {
                break;
            }
            out.push((tag, u64_at(e, 8)?));
        }
        Ok((out, strtab))
    }

    /// The `DT_NEEDED` entries, in order.
    pub fn needed(&self) -> R<Vec<String>> {
        let (entries, strtab) = self.dynamic()?;
        entries
            .iter()
            .filter(|(t, _)| *t == DT_NEEDED)
            .map(|(_, v)| cstr(strtab, *v))
            .collect()
    }

    /// `DT_SONAME`, if set.
    pub fn soname(&self) -> R<Option<String>> {
        let (entries, strtab) = self.dynamic()?;
        match entries.iter().find(|(t, _)| *t == DT_SONAME) {
            Some((_, v)) => cstr(strtab, *v).map(Some),
            None => Ok(None),
        }
    }

    /// Version index -> (version name, file) from `.gnu.version_r` and
    /// `.gnu.version_d`.
    fn versions(&self) -> R<HashMap<u16, SymVersion>> {
        let mut map = HashMap::new();
        if let Some(sec) = self.first_of_kind(SHT_GNU_VERNEED) {
            let bytes = self.section_bytes(sec)?;
            let strtab = self.linked_strtab(sec)?;
            let mut off = 0u64;
            for _ in 0..sec.info {
                let cnt = u16_at(bytes, off + 2)?;
                let file = cstr(strtab, u64::from(u32_at(bytes, off + 4)?))?;
                let mut aux = off + u64::from(u32_at(bytes, off + 8)?);
                for _ in 0..cnt {
                    let other = u16_at(bytes, aux + 6)?;
                    let name = cstr(strtab, u64::from(u32_at(bytes, aux + 8)?))?;
                    map.insert(
                        other & 0x7fff,
                        SymVersion {
                            name,
                            file: Some(file.clone()),
                        },
                    );
                    let next = u32_at(bytes, aux + 12)?;
                    if next == 0 {
                        break;
                    }
                    aux += u64::from(next);
                }
                let next = u32_at(bytes, off + 12)?;
                if next == 0 {
                    break;
                }
                off += u64::from(next);
            }
        }
        if let Some(sec) = self.first_of_kind(SHT_GNU_VERDEF) {
            let bytes = self.section_bytes(sec)?;
            let strtab = self.linked_strtab(sec)?;
            let mut off = 0u64;
            for _ in 0..sec.info {
                let flags = u16_at(bytes, off + 2)?;
                let ndx = u16_at(bytes, off + 4)?;
                let aux = off + u64::from(u32_at(bytes, off + 12)?);
                let name = cstr(strtab, u64::from(u32_at(bytes, aux)?))?;
                // VER_FLG_BASE: the file's own name, not a version.
                if flags & 1 == 0 {
                    map.insert(ndx & 0x7fff, SymVersion { name, file: None });
                }
                let next = u32_at(bytes, off + 16)?;
                if next == 0 {
                    break;
                }
                off += u64::from(next);
            }
        }
        Ok(map)
    }

    /// Every (library, version) pair of `.gnu.version_r`: the versions the
    /// dynamic loader checks each needed library defines.
    pub fn version_needs(&self) -> R<Vec<SymVersion>> {
        let mut v: Vec<SymVersion> = self
            .versions()?
            .into_values()
            .filter(|v| v.file.is_some())
            .collect();
        v.sort();
        Ok(v)
    }

    /// All entries of `.dynsym` except the null symbol.
    pub fn dynamic_symbols(&self) -> R<Vec<DynSymbol>> {
        let Some(sec) = self.first_of_kind(SHT_DYNSYM) else {
            return Ok(Vec::new());
        };
        let bytes = self.section_bytes(sec)?;
        let strtab = self.linked_strtab(sec)?;
        let versym = match self.first_of_kind(SHT_GNU_VERSYM) {
            Some(s) => Some(self.section_bytes(s)?),
            None => None,
        };
        let versions = self.versions()?;
        let mut out = Vec::new();
        for (i, e) in bytes.chunks_exact(24).enumerate().skip(1) {
            let name = cstr(strtab, u64::from(u32_at(e, 0)?))?;
            let info = e[4];
            let shndx = u16_at(e, 6)?;
            let size = u64_at(e, 16)?;
            let kind = match info & 0xf {
                1 => SymKind::Object,
                2 | 10 => SymKind::Func,
                6 => SymKind::Tls,
                _ => SymKind::Other,
            };
            let version = match versym {
                Some(vs) => {
                    let idx = u16_at(vs, 2 * i as u64)? & 0x7fff;
                    if idx >= 2 {
                        versions.get(&idx).cloned()
                    } else {
                        None
                    }
                }
                None => None,
            };
            out.push(DynSymbol {
                name,
                defined: shndx != 0,
                weak: info >> 4 == 2,
                kind,
                size,
                version,
            });
        }
        Ok(out)
    }

    /// The descriptors of the notes called `name` with type `kind`, from the
    /// `PT_NOTE` segments.
    pub fn notes(&self, name: &str, kind: u32) -> R<Vec<&'a [u8]>> {
        let mut out = Vec::new();
        for seg in self.segments.iter().filter(|s| s.kind == PT_NOTE) {
            let bytes = slice(self.data, seg.offset, seg.filesz)?;
            let mut off = 0u64;
            while off + 12 <= bytes.len() as u64 {
                let namesz = u64::from(u32_at(bytes, off)?);
                let descsz = u64::from(u32_at(bytes, off + 4)?);
                let ty = u32_at(bytes, off + 8)?;
                let name_off = off + 12;
                let desc_off = name_off + namesz.div_ceil(4) * 4;
                let n = slice(bytes, name_off, namesz)?;
                let d = slice(bytes, desc_off, descsz)?;
                if ty == kind && n.strip_suffix(&[0]).unwrap_or(n) == name.as_bytes() {
                    out.push(d);
                }
                off = desc_off + descsz.div_ceil(4) * 4;
            }
        }
        Ok(out)
    }
}

/// The `key=value` pairs of a kernel module's `.modinfo` section.
pub fn modinfo(elf: &Elf<'_>) -> R<Vec<(String, String)>> {
    let Some(bytes) = elf.section_data(".modinfo")? else {
        return Ok(Vec::new());
    };
    Ok(bytes
        .split(|&b| b == 0)
        .filter_map(|kv| {
            let s = String::from_utf8_lossy(kv);
            s.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_what_is_not_elf64le() {
        assert_eq!(Elf::parse(b"").err(), Some(ElfError::NotElf));
        assert_eq!(Elf::parse(b"#!/bin/sh\n").err(), Some(ElfError::NotElf));
        let mut h = vec![0u8; 64];
        h[..4].copy_from_slice(b"\x7fELF");
        h[4] = 1; // 32-bit
        h[5] = 1;
        assert_eq!(Elf::parse(&h).err(), Some(ElfError::Unsupported));
        h[4] = 2;
        assert!(Elf::parse(&h[..40]).is_err());
    }

    #[test]
    fn hostile_offsets_are_errors_not_panics() {
        let mut h = vec![0u8; 64];
        h[..4].copy_from_slice(b"\x7fELF");
        h[4] = 2;
        h[5] = 1;
        h[0x28..0x30].copy_from_slice(&u64::MAX.to_le_bytes()); // e_shoff
        h[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        h[0x3c..0x3e].copy_from_slice(&3u16.to_le_bytes());
        assert!(Elf::parse(&h).is_err());
        h[0x28..0x30].copy_from_slice(&0u64.to_le_bytes());
        h[0x20..0x28].copy_from_slice(&(u64::MAX - 3).to_le_bytes()); // e_phoff
        h[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        h[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
        assert!(Elf::parse(&h).is_err());
    }

    /// The test binary itself is a dynamically linked x86_64 ELF built by
    /// the host toolchain: check the reader against what it must contain.
    #[test]
    fn reads_the_running_test_binary() {
        let exe = std::env::current_exe().unwrap();
        let data = std::fs::read(&exe).unwrap();
        let elf = Elf::parse(&data).unwrap();
        let needed = elf.needed().unwrap();
        assert!(
            needed.iter().any(|n| n.starts_with("libc.so")),
            "{needed:?}"
        );
        let interp = elf.interp().unwrap().expect("PT_INTERP");
        assert!(interp.contains("ld-linux"), "{interp}");
        let syms = elf.dynamic_symbols().unwrap();
        let malloc = syms
            .iter()
            .find(|s| s.name == "malloc" && !s.defined)
            .expect("undefined malloc");
        let v = malloc.version.as_ref().expect("versioned malloc");
        assert!(v.name.starts_with("GLIBC_"), "{v:?}");
        assert_eq!(v.file.as_deref(), Some("libc.so.6"));
        assert!(elf.section_data(".text").unwrap().is_some());
        assert!(elf.section_data(".no-such-section").unwrap().is_none());
    }

    #[test]
    fn reads_libc_soname_and_versioned_definitions() {
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let _ = Elf::parse(&exe).unwrap();
        // The libc the test binary runs with.
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let libc = maps
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .find(|p| p.contains("/libc.so"))
            .expect("libc mapped");
        let data = std::fs::read(libc).unwrap();
        let elf = Elf::parse(&data).unwrap();
        assert_eq!(elf.soname().unwrap().as_deref(), Some("libc.so.6"));
        let syms = elf.dynamic_symbols().unwrap();
        let malloc = syms
            .iter()
            .find(|s| s.name == "malloc" && s.defined)
            .unwrap();
        assert_eq!(malloc.kind, SymKind::Func);
        let v = malloc.version.as_ref().unwrap();
        assert!(v.name.starts_with("GLIBC_2."), "{v:?}");
        assert_eq!(v.file, None);
    }
}
