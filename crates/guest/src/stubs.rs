//! Placeholder shared libraries for libraries that a guest binary links but
//! the guest never uses: Debian's fio links the libraries of every I/O
//! engine it was built with (Ceph's librbd and librados, GlusterFS, RDMA,
//! PMDK, libnbd: tens of megabytes with their dependencies), and libnvme-mi
//! links D-Bus. Those binaries are linked with `BIND_NOW`, so the dynamic
//! loader refuses to start them unless every needed library exists, defines
//! every symbol version they require and every symbol they import.
//!
//! A stub is a real shared library with the same soname, built with the
//! host's C compiler (`$CC`, else `cc`; the Rust toolchain needs one to
//! link anyway), that defines exactly those versions and symbols: functions
//! that trap (`ud2`) if ever called, and data objects of the imported size.
//!
//! Invariants:
//! - A symbol goes into a stub only if no real library of the image defines
//!   it; versioned imports go to the stub their version names, unversioned
//!   ones to a stub the importing object needs.
//! - Every version an object requires from a stubbed library is defined by
//!   that stub, even when no imported symbol carries it.
//! - Stubs need nothing themselves (`-nostdlib`): they add no dependencies.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt::Write as _;
use std::fs;
use std::path::Path;
use std::process::Command;

use crate::elf::{DynSymbol, Elf, SymKind, SymVersion};
use crate::error::{Error, Result};

/// What the planner needs to know about one object of the image.
#[derive(Debug, Clone)]
pub struct Object {
    /// For messages only.
    pub name: String,
    pub needed: Vec<String>,
    pub symbols: Vec<DynSymbol>,
    pub version_needs: Vec<SymVersion>,
}

/// The symbols one stub defines, per version (`""`: unversioned).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StubLib {
    pub versions: BTreeMap<String, BTreeSet<(String, SymKind, u64)>>,
}

/// Decides what each stubbed soname must define, from the real objects of
/// the image (binaries and real libraries). Only sonames some object needs
/// get a stub.
pub fn plan(objects: &[Object], stubbed: &BTreeSet<String>) -> BTreeMap<String, StubLib> {
    let defined: HashSet<&str> = objects
        .iter()
        .flat_map(|o| o.symbols.iter())
        .filter(|s| s.defined)
        .map(|s| s.name.as_str())
        .collect();
    let mut stubs: BTreeMap<String, StubLib> = BTreeMap::new();
    for o in objects {
        let stubbed_needed: Vec<&String> =
            o.needed.iter().filter(|n| stubbed.contains(*n)).collect();
        if stubbed_needed.is_empty() {
            continue;
        }
        for n in &stubbed_needed {
            stubs.entry((*n).clone()).or_default();
        }
        for v in &o.version_needs {
            if let Some(file) = v.file.as_ref().filter(|f| stubbed.contains(*f)) {
                stubs
                    .entry(file.clone())
                    .or_default()
                    .versions
                    .entry(v.name.clone())
                    .or_default();
            }
        }
        let versioned_files: HashSet<&str> = o
            .version_needs
            .iter()
            .filter_map(|v| v.file.as_deref())
            .collect();
        // Unversioned imports go to a stub without version requirements if
        // the object needs one (as librados and librbd are for fio).
        let unversioned_home = stubbed_needed
            .iter()
            .find(|n| !versioned_files.contains(n.as_str()))
            .unwrap_or(&stubbed_needed[0]);
        let mut stubbed_imports = 0usize;
        for s in o.symbols.iter().filter(|s| !s.defined && !s.weak) {
            let (soname, version) = match &s.version {
                Some(SymVersion {
                    name,
                    file: Some(file),
                }) => {
                    if !stubbed.contains(file) {
                        continue;
                    }
                    (file.clone(), name.clone())
                }
                _ => {
                    if defined.contains(s.name.as_str()) {
                        continue;
                    }
                    ((*unversioned_home).clone(), String::new())
                }
            };
            stubs
                .entry(soname)
                .or_default()
                .versions
                .entry(version)
                .or_default()
                .insert((s.name.clone(), s.kind, s.size));
            stubbed_imports += 1;
        }
        tracing::debug!(object = %o.name, stubbed_imports, "imports satisfied by stubs");
    }
    stubs
}

fn c_symbol(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\')
}

/// The C source and (if the stub has versions) the linker version script.
fn sources(soname: &str, lib: &StubLib) -> Result<(String, Option<String>)> {
    let mut c = String::from("/* generated by basalt-guest: placeholder for ");
    c.push_str(soname);
    c.push_str(" */\n");
    let mut n = 0usize;
    let mut nodes: Vec<(String, Vec<String>)> = Vec::new();
    let mut unversioned: Vec<String> = Vec::new();
    for (version, syms) in &lib.versions {
        let mut names = Vec::new();
        for (name, kind, size) in syms {
            if !c_symbol(name) {
                return Err(Error::Stub {
                    soname: soname.to_string(),
                    msg: format!("symbol name {name:?} cannot be written in C"),
                });
            }
            n += 1;
            match kind {
                SymKind::Object => {
                    let size = (*size).max(1);
                    let _ = writeln!(
                        c,
                        "unsigned char basalt_stub_{n}[{size}] __asm__(\"{name}\") __attribute__((used)) = {{ 0 }};"
                    );
                }
                SymKind::Tls => {
                    let size = (*size).max(1);
                    let _ = writeln!(
                        c,
                        "__thread unsigned char basalt_stub_{n}[{size}] __asm__(\"{name}\") __attribute__((used));"
                    );
                }
                SymKind::Func | SymKind::Other => {
                    let _ = writeln!(c, "void basalt_stub_{n}(void) __asm__(\"{name}\");");
                    let _ = writeln!(c, "void basalt_stub_{n}(void) {{ __builtin_trap(); }}");
                }
            }
            names.push(name.clone());
        }
        if version.is_empty() {
            unversioned = names;
        } else {
            if names.is_empty() {
                // A version node needs a symbol to be emitted.
                n += 1;
                let anchor = format!("basalt_stub_version_{n}");
                let _ = writeln!(c, "void {anchor}(void) {{ __builtin_trap(); }}");
                names.push(anchor);
            }
            nodes.push((version.clone(), names));
        }
    }
    if nodes.is_empty() {
        return Ok((c, None));
    }
    // Unversioned imports bind to a default-versioned definition as well.
    nodes[0].1.extend(unversioned);
    let mut script = String::new();
    for (i, (version, names)) in nodes.iter().enumerate() {
        let _ = writeln!(script, "{version} {{");
        let _ = writeln!(script, "  global:");
        for name in names {
            let _ = writeln!(script, "    {name};");
        }
        if i == 0 {
            let _ = writeln!(script, "  local: *;");
        }
        let _ = writeln!(script, "}};");
    }
    Ok((c, Some(script)))
}

/// Compiles one stub with the host C compiler; returns the `.so` bytes.
pub fn build(soname: &str, lib: &StubLib, workdir: &Path) -> Result<Vec<u8>> {
    let (c, script) = sources(soname, lib)?;
    let dir = workdir.join(format!("stub-{soname}"));
    fs::create_dir_all(&dir).map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
    let src = dir.join("stub.c");
    fs::write(&src, c).map_err(|e| Error::io(format!("write {}", src.display()), e))?;
    let out = dir.join(soname);
    let cc = std::env::var_os("CC").unwrap_or_else(|| "cc".into());
    let mut cmd = Command::new(&cc);
    cmd.args(["-shared", "-fPIC", "-nostdlib", "-O1", "-o"])
        .arg(&out)
        .arg(&src)
        .arg(format!("-Wl,-soname,{soname}"))
        .arg("-Wl,-z,noexecstack");
    if let Some(script) = script {
        let vs = dir.join("stub.map");
        fs::write(&vs, script).map_err(|e| Error::io(format!("write {}", vs.display()), e))?;
        cmd.arg(format!("-Wl,--version-script={}", vs.display()));
    }
    let output = cmd.output().map_err(|e| Error::MissingTool {
        tool: cc.to_string_lossy().into_owned(),
        detail: e.to_string(),
        hint: "a C compiler builds the placeholder libraries (apt-get install gcc, or set CC)",
    })?;
    if !output.status.success() {
        return Err(Error::Stub {
            soname: soname.to_string(),
            msg: format!(
                "{} failed ({}):\n{}",
                cc.to_string_lossy(),
                output.status,
                String::from_utf8_lossy(&output.stderr)
            ),
        });
    }
    let so = fs::read(&out).map_err(|e| Error::io(format!("read {}", out.display()), e))?;
    // What the loader will see: the right soname, and nothing needed.
    let elf = Elf::parse(&so).map_err(|e| Error::Stub {
        soname: soname.to_string(),
        msg: format!("the compiler's output is not readable ELF: {e}"),
    })?;
    let (got, needed) = elf
        .soname()
        .and_then(|s| elf.needed().map(|n| (s, n)))
        .map_err(|e| Error::Stub {
            soname: soname.to_string(),
            msg: e.to_string(),
        })?;
    if got.as_deref() != Some(soname) || !needed.is_empty() {
        return Err(Error::Stub {
            soname: soname.to_string(),
            msg: format!("built with soname {got:?} and DT_NEEDED {needed:?}"),
        });
    }
    Ok(so)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sym(name: &str, defined: bool, version: Option<(&str, Option<&str>)>) -> DynSymbol {
        DynSymbol {
            name: name.into(),
            defined,
            weak: false,
            kind: SymKind::Func,
            size: 0,
            version: version.map(|(n, f)| SymVersion {
                name: n.into(),
                file: f.map(Into::into),
            }),
        }
    }

    fn need(file: &str, version: &str) -> SymVersion {
        SymVersion {
            name: version.into(),
            file: Some(file.into()),
        }
    }

    fn fio_like() -> Vec<Object> {
        let mut data_obj = sym(
            "ibv_shared",
            false,
            Some(("IBVERBS_1.1", Some("libibverbs.so.1"))),
        );
        data_obj.kind = SymKind::Object;
        data_obj.size = 24;
        let mut weak = sym("__gmon_start__", false, None);
        weak.weak = true;
        vec![
            Object {
                name: "fio".into(),
                needed: vec![
                    "libc.so.6".into(),
                    "librados.so.2".into(),
                    "libibverbs.so.1".into(),
                ],
                symbols: vec![
                    sym("malloc", false, Some(("GLIBC_2.2.5", Some("libc.so.6")))),
                    sym("rados_connect", false, None),
                    sym(
                        "ibv_open_device",
                        false,
                        Some(("IBVERBS_1.1", Some("libibverbs.so.1"))),
                    ),
                    data_obj,
                    weak,
                    // defined by a real library: never stubbed
                    sym("zlibVersion", false, None),
                ],
                version_needs: vec![
                    need("libc.so.6", "GLIBC_2.2.5"),
                    need("libibverbs.so.1", "IBVERBS_1.1"),
                    need("libibverbs.so.1", "IBVERBS_1.8"),
                ],
            },
            Object {
                name: "libz.so.1".into(),
                needed: vec!["libc.so.6".into()],
                symbols: vec![sym("zlibVersion", true, None)],
                version_needs: vec![],
            },
        ]
    }

    #[test]
    fn plan_places_each_import_where_the_loader_looks() {
        let stubbed: BTreeSet<String> = ["librados.so.2", "libibverbs.so.1", "librbd.so.1"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let p = plan(&fio_like(), &stubbed);
        assert_eq!(
            p.keys().collect::<Vec<_>>(),
            ["libibverbs.so.1", "librados.so.2"]
        );
        let rados = &p["librados.so.2"];
        assert_eq!(rados.versions.len(), 1);
        assert!(rados.versions[""].contains(&("rados_connect".to_string(), SymKind::Func, 0)));
        let ibv = &p["libibverbs.so.1"];
        assert_eq!(
            ibv.versions.keys().collect::<Vec<_>>(),
            ["IBVERBS_1.1", "IBVERBS_1.8"]
        );
        assert!(ibv.versions["IBVERBS_1.1"].contains(&(
            "ibv_shared".to_string(),
            SymKind::Object,
            24
        )));
        assert!(ibv.versions["IBVERBS_1.8"].is_empty());
        let all: Vec<&String> = p
            .values()
            .flat_map(|l| l.versions.values())
            .flatten()
            .map(|s| &s.0)
            .collect();
        assert!(!all
            .iter()
            .any(|s| *s == "zlibVersion" || *s == "__gmon_start__" || *s == "malloc"));
    }

    /// Builds the planned stubs with the host compiler and reads them back:
    /// the loader-visible surface (soname, versions, symbols) is as planned.
    #[test]
    fn built_stubs_define_the_planned_versions_and_symbols() {
        let stubbed: BTreeSet<String> = ["librados.so.2", "libibverbs.so.1"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let p = plan(&fio_like(), &stubbed);
        let dir = tempfile::tempdir().unwrap();
        for (soname, lib) in &p {
            let so = build(soname, lib, dir.path()).unwrap();
            let elf = Elf::parse(&so).unwrap();
            assert_eq!(elf.soname().unwrap().as_deref(), Some(soname.as_str()));
            assert!(elf.needed().unwrap().is_empty(), "stubs need nothing");
            let syms = elf.dynamic_symbols().unwrap();
            for (version, wanted) in &lib.versions {
                for (name, kind, size) in wanted {
                    let s = syms
                        .iter()
                        .find(|s| s.defined && &s.name == name)
                        .unwrap_or_else(|| panic!("{soname}: {name} missing"));
                    if !version.is_empty() {
                        assert_eq!(
                            s.version.as_ref().map(|v| v.name.as_str()),
                            Some(version.as_str()),
                            "{name}"
                        );
                    }
                    if *kind == SymKind::Object {
                        assert_eq!(s.kind, SymKind::Object);
                        assert_eq!(s.size, *size);
                    }
                }
                if !version.is_empty() {
                    assert!(
                        syms.iter()
                            .any(|s| s.version.as_ref().is_some_and(|v| &v.name == version)),
                        "{soname} lacks version {version}"
                    );
                }
            }
        }
    }
}
