//! Which kernel modules the guest loads, and in which order: the closure of
//! the requested modules over the `depends=` field of their `.modinfo`
//! (what `depmod` turns into `modules.dep`, which the kernel package does not
//! ship: depmod runs at install time), dependencies first.
//!
//! Invariants:
//! - Module names compare with `-` and `_` as equal, as the kernel does
//!   (`nvme-tcp.ko` is module `nvme_tcp`).
//! - A module listed in `modules.builtin` is skipped (nothing to load); a
//!   module that is neither built in nor in the tree is an error naming who
//!   needed it.
//! - Soft dependencies (`softdep=`, e.g. ext4's `pre: crypto-crc32c`) name
//!   aliases, not modules, and are not followed: request their providers
//!   (`crc32c_generic`) explicitly.
//! - Modules are stored uncompressed (`.ko`); `.ko.xz` is decompressed
//!   here, other compressions are an error.

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::elf::{modinfo, Elf};
use crate::error::{Error, Result};

/// One module to load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Module {
    /// Normalized name (`_` for `-`).
    pub name: String,
    /// The uncompressed `.ko`.
    pub image: Vec<u8>,
}

/// The modules of one kernel release inside an extracted kernel package.
pub struct ModuleTree {
    release: String,
    files: BTreeMap<String, PathBuf>,
    builtin: HashSet<String>,
}

/// The kernel's notion of a module name.
pub fn normalize(name: &str) -> String {
    name.replace('-', "_")
}

fn module_name(file_name: &str) -> Option<&str> {
    file_name
        .strip_suffix(".ko")
        .or_else(|| file_name.strip_suffix(".ko.xz"))
        .or_else(|| file_name.strip_suffix(".ko.zst"))
        .or_else(|| file_name.strip_suffix(".ko.gz"))
}

fn walk(dir: &Path, out: &mut BTreeMap<String, PathBuf>) -> Result<()> {
    let entries = fs::read_dir(dir).map_err(|e| Error::io(format!("read {}", dir.display()), e))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(format!("read {}", dir.display()), e))?;
        let path = entry.path();
        let ft = entry
            .file_type()
            .map_err(|e| Error::io(format!("stat {}", path.display()), e))?;
        if ft.is_dir() {
            walk(&path, out)?;
        } else if let Some(name) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(module_name)
        {
            out.insert(normalize(name), path);
        }
    }
    Ok(())
}

impl ModuleTree {
    /// Indexes `ROOT/lib/modules/<release>/` of an extracted kernel package
    /// (exactly one release must be there).
    pub fn open(root: &Path) -> Result<ModuleTree> {
        let base = root.join("lib/modules");
        let mut releases = Vec::new();
        for entry in
            fs::read_dir(&base).map_err(|e| Error::io(format!("read {}", base.display()), e))?
        {
            let entry = entry.map_err(|e| Error::io(format!("read {}", base.display()), e))?;
            if entry.path().join("kernel").is_dir() {
                releases.push(entry.file_name().to_string_lossy().into_owned());
            }
        }
        let release = match releases.as_slice() {
            [one] => one.clone(),
            _ => {
                return Err(Error::Image(format!(
                    "expected one kernel release under {}, found {releases:?}",
                    base.display()
                )))
            }
        };
        let dir = base.join(&release);
        let mut files = BTreeMap::new();
        walk(&dir.join("kernel"), &mut files)?;
        let builtin = match fs::read_to_string(dir.join("modules.builtin")) {
            Ok(text) => text
                .lines()
                .filter_map(|l| l.rsplit('/').next())
                .filter_map(module_name)
                .map(normalize)
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => HashSet::new(),
            Err(e) => {
                return Err(Error::io(
                    format!("read {}/modules.builtin", dir.display()),
                    e,
                ))
            }
        };
        Ok(ModuleTree {
            release,
            files,
            builtin,
        })
    }

    /// The kernel release (`uname -r` in the guest).
    pub fn release(&self) -> &str {
        &self.release
    }

    fn read(&self, name: &str, path: &Path) -> Result<Vec<u8>> {
        let raw = fs::read(path).map_err(|e| Error::io(format!("read {}", path.display()), e))?;
        let file = path.to_string_lossy();
        if file.ends_with(".ko") {
            Ok(raw)
        } else if file.ends_with(".ko.xz") {
            let mut out = Vec::new();
            xz4rust::XzReader::new(std::io::Cursor::new(raw))
                .read_to_end(&mut out)
                .map_err(|e| Error::Module {
                    module: name.to_string(),
                    msg: format!("decompressing {}: {e}", path.display()),
                })?;
            Ok(out)
        } else {
            Err(Error::Module {
                module: name.to_string(),
                msg: format!(
                    "{} is compressed in a format the harness does not read",
                    path.display()
                ),
            })
        }
    }

    /// The modules to `insmod`, in an order where each one's dependencies
    /// come before it.
    pub fn load_order(&self, wanted: &[&str]) -> Result<Vec<Module>> {
        let mut order = Vec::new();
        let mut done = HashSet::new();
        for w in wanted {
            self.visit(
                &normalize(w),
                "requested",
                &mut Vec::new(),
                &mut done,
                &mut order,
            )?;
        }
        Ok(order)
    }

    fn visit(
        &self,
        name: &str,
        needed_by: &str,
        stack: &mut Vec<String>,
        done: &mut HashSet<String>,
        order: &mut Vec<Module>,
    ) -> Result<()> {
        if done.contains(name) || self.builtin.contains(name) {
            return Ok(());
        }
        if stack.iter().any(|s| s == name) {
            return Err(Error::Module {
                module: name.to_string(),
                msg: format!("dependency cycle: {} -> {name}", stack.join(" -> ")),
            });
        }
        let path = self.files.get(name).ok_or_else(|| Error::Module {
            module: name.to_string(),
            msg: format!("not in kernel {} (needed by {needed_by})", self.release),
        })?;
        let image = self.read(name, path)?;
        let deps: Vec<String> = {
            let elf = Elf::parse(&image).map_err(|e| Error::Elf {
                path: path.clone(),
                msg: e.to_string(),
            })?;
            let info = modinfo(&elf).map_err(|e| Error::Elf {
                path: path.clone(),
                msg: e.to_string(),
            })?;
            info.iter()
                .filter(|(k, _)| k == "depends")
                .flat_map(|(_, v)| v.split(','))
                .filter(|d| !d.is_empty())
                .map(normalize)
                .collect()
        };
        stack.push(name.to_string());
        for d in &deps {
            self.visit(d, name, stack, done, order)?;
        }
        stack.pop();
        done.insert(name.to_string());
        order.push(Module {
            name: name.to_string(),
            image,
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A relocatable ELF64 with only a `.modinfo` section (and the section
    /// name table): what the tree reads from a `.ko`.
    fn fake_ko(depends: &str) -> Vec<u8> {
        let modinfo = format!("license=GPL\0depends={depends}\0name=x\0");
        let shstr = b"\0.modinfo\0.shstrtab\0";
        let mut f = vec![0u8; 64];
        f[..4].copy_from_slice(b"\x7fELF");
        f[4] = 2;
        f[5] = 1;
        f[6] = 1;
        let modinfo_off = f.len() as u64;
        f.extend_from_slice(modinfo.as_bytes());
        let shstr_off = f.len() as u64;
        f.extend_from_slice(shstr);
        while !f.len().is_multiple_of(8) {
            f.push(0);
        }
        let shoff = f.len() as u64;
        let section = |name: u32, kind: u32, off: u64, size: u64| {
            let mut s = vec![0u8; 64];
            s[0..4].copy_from_slice(&name.to_le_bytes());
            s[4..8].copy_from_slice(&kind.to_le_bytes());
            s[24..32].copy_from_slice(&off.to_le_bytes());
            s[32..40].copy_from_slice(&size.to_le_bytes());
            s
        };
        f.extend(section(0, 0, 0, 0));
        f.extend(section(1, 1, modinfo_off, modinfo.len() as u64));
        f.extend(section(10, 3, shstr_off, shstr.len() as u64));
        f[0x28..0x30].copy_from_slice(&shoff.to_le_bytes());
        f[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        f[0x3c..0x3e].copy_from_slice(&3u16.to_le_bytes());
        f[0x3e..0x40].copy_from_slice(&2u16.to_le_bytes());
        f
    }

    fn tree(mods: &[(&str, &str)], builtin: &[&str]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let rel = dir.path().join("lib/modules/6.1.0-test/kernel/drivers");
        fs::create_dir_all(&rel).unwrap();
        for (file, deps) in mods {
            fs::write(rel.join(file), fake_ko(deps)).unwrap();
        }
        let b: String = builtin
            .iter()
            .map(|m| format!("kernel/x/{m}.ko\n"))
            .collect();
        fs::write(dir.path().join("lib/modules/6.1.0-test/modules.builtin"), b).unwrap();
        dir
    }

    fn names(m: &[Module]) -> Vec<&str> {
        m.iter().map(|m| m.name.as_str()).collect()
    }

    #[test]
    fn dependencies_come_first_and_once() {
        let d = tree(
            &[
                ("nvme-tcp.ko", "nvme-core,nvme-fabrics"),
                ("nvme-fabrics.ko", "nvme-core"),
                ("nvme-core.ko", "t10-pi"),
                ("t10-pi.ko", ""),
                ("nbd.ko", ""),
            ],
            &[],
        );
        let t = ModuleTree::open(d.path()).unwrap();
        assert_eq!(t.release(), "6.1.0-test");
        let order = t.load_order(&["nbd", "nvme-tcp", "nvme_fabrics"]).unwrap();
        assert_eq!(
            names(&order),
            ["nbd", "t10_pi", "nvme_core", "nvme_fabrics", "nvme_tcp"]
        );
        assert_eq!(&order[0].image[..4], b"\x7fELF");
    }

    #[test]
    fn builtin_modules_are_skipped() {
        let d = tree(&[("ext4.ko", "jbd2,crc16")], &["crc16", "jbd2"]);
        let t = ModuleTree::open(d.path()).unwrap();
        assert_eq!(names(&t.load_order(&["ext4", "crc16"]).unwrap()), ["ext4"]);
    }

    #[test]
    fn missing_dependency_names_who_needed_it() {
        let d = tree(&[("ext4.ko", "jbd2")], &[]);
        let t = ModuleTree::open(d.path()).unwrap();
        let err = t.load_order(&["ext4"]).unwrap_err().to_string();
        assert!(
            err.contains("jbd2") && err.contains("needed by ext4"),
            "{err}"
        );
    }

    #[test]
    fn cycles_are_errors() {
        let d = tree(&[("a.ko", "b"), ("b.ko", "a")], &[]);
        let t = ModuleTree::open(d.path()).unwrap();
        let err = t.load_order(&["a"]).unwrap_err().to_string();
        assert!(err.contains("cycle"), "{err}");
    }
}
