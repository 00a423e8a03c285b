//! The guest image: what goes into it and building it into the cache.
//!
//! A guest is Debian 12's current kernel (booted as an uncompressed
//! `vmlinux`) and one initramfs holding busybox, the block initiators' user
//! space (nbd-client, nvme-cli, open-iscsi's iscsiadm and iscsid,
//! multipath-tools' multipath and multipathd with the plugins of
//! `PLUGINS`), fio and e2fsprogs, the shared libraries those need (found
//! in the listed packages by their `DT_NEEDED`, or replaced by placeholders
//! built by the `stubs` module), the kernel modules of [`MODULES`] with
//! their dependencies, and the init program ([`init_script`]).
//!
//! Invariants:
//! - An image lives in `CACHE/images/<kernel version>-<key>/`, where the key
//!   hashes every package name and version that goes in and the harness's
//!   own assembly code, so a Debian update or a harness change builds a new
//!   image and an unchanged one is reused as is.
//! - An image directory appears (by `rename`) only once complete.
//! - Every shared library a binary needs is either in the image or stubbed;
//!   a library found in none of the packages is an error naming it and who
//!   needs it, never a guest that fails to run the binary.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;
use std::fs;
use std::path::{Component, Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use crate::apt::{self, Package};
use crate::cache::Cache;
use crate::cpio::CpioWriter;
use crate::elf::Elf;
use crate::error::{Error, Result};
use crate::kernel;
use crate::modules::ModuleTree;
use crate::stubs;
use crate::GuestKernel;

/// The Debian packages of the guest besides the kernel, which is whatever
/// `linux-image-amd64` depends on. Libraries are listed explicitly: the
/// harness takes only the files it needs from them.
pub const PACKAGES: &[&str] = &[
    "busybox-static",
    "nbd-client",
    "nvme-cli",
    "fio",
    "e2fsprogs",
    "open-iscsi",
    "multipath-tools",
    // their shared libraries
    "libc6",
    "libaio1",
    "libnuma1",
    "zlib1g",
    "libnvme1",
    "libjson-c5",
    "libssl3",
    "libext2fs2",
    "libcom-err2",
    "libblkid1",
    "libuuid1",
    "libgnutls30",
    "libp11-kit0",
    "libidn2-0",
    "libunistring2",
    "libtasn1-6",
    "libnettle8",
    "libhogweed6",
    "libgmp10",
    "libffi8",
    "libnl-3-200",
    "libnl-genl-3-200",
    "libopeniscsiusr",
    "libisns0",
    "libkmod2",
    "libmount1",
    "libselinux1",
    "libpcre2-8-0",
    // iscsid calls sd_notify at run time: a stub would trap.
    "libsystemd0",
    "libcap2",
    "libgcrypt20",
    "libgpg-error0",
    "liblzma5",
    "libzstd1",
    "liblz4-1",
    "libdevmapper1.02.1",
    "libudev1",
    "liburcu8",
    "libgcc-s1",
];

/// Kernel modules loaded at boot (with their dependencies, in order):
/// the NIC, then the initiators and what the tests format volumes with.
/// `crc32c_generic` provides the `crc32c` that ext4 (softdep) and the
/// NVMe/TCP and iSCSI digests ask the crypto API for. `sd_mod` turns the
/// LUNs the iSCSI initiator finds into `/dev/sdX` (nothing loads it on
/// demand: the guest has no udev). dm-multipath with its path selectors
/// (`service-time` is multipath-tools' default) and the ALUA device
/// handler, which must be loaded before the LUNs appear to attach to them
/// (it then reports each path's `access_state` in sysfs).
pub const MODULES: &[&str] = &[
    "virtio_pci",
    "virtio_net",
    "crc32c_generic",
    "ext4",
    "nbd",
    "nvme_tcp",
    "iscsi_tcp",
    "sd_mod",
    "scsi_dh_alua",
    "dm_mod",
    "dm_multipath",
    "dm_service_time",
    "dm_round_robin",
];

/// Libraries the guest's binaries link but never use, replaced by stubs:
/// fio's engines for Ceph, GlusterFS, RDMA, PMDK and NBD-via-libnbd (the
/// tests use libaio and io_uring), and libnvme-mi's D-Bus.
pub const STUBBED: &[&str] = &[
    "libgfapi.so.0",
    "librados.so.2",
    "librbd.so.1",
    "libibverbs.so.1",
    "librdmacm.so.1",
    "libpmem.so.1",
    "libpmemblk.so.1",
    "libnbd.so.0",
    "libdbus-1.so.3",
];

/// A program taken from a package into the guest.
struct Binary {
    package: &'static str,
    name: &'static str,
    /// Directory in the guest.
    dir: &'static str,
    /// Other names for it in the same directory.
    links: &'static [&'static str],
}

const BINARIES: &[Binary] = &[
    Binary {
        package: "busybox-static",
        name: "busybox",
        dir: "bin",
        links: &["sh"],
    },
    Binary {
        package: "nbd-client",
        name: "nbd-client",
        dir: "usr/sbin",
        links: &[],
    },
    Binary {
        package: "nvme-cli",
        name: "nvme",
        dir: "usr/sbin",
        links: &[],
    },
    Binary {
        package: "fio",
        name: "fio",
        dir: "usr/bin",
        links: &[],
    },
    Binary {
        package: "e2fsprogs",
        name: "mke2fs",
        dir: "usr/sbin",
        links: &["mkfs.ext4"],
    },
    Binary {
        package: "e2fsprogs",
        name: "e2fsck",
        dir: "usr/sbin",
        links: &["fsck.ext4"],
    },
    Binary {
        package: "open-iscsi",
        name: "iscsiadm",
        dir: "usr/sbin",
        links: &[],
    },
    Binary {
        package: "open-iscsi",
        name: "iscsid",
        dir: "usr/sbin",
        links: &[],
    },
    Binary {
        package: "multipath-tools",
        name: "multipath",
        dir: "usr/sbin",
        links: &[],
    },
    Binary {
        package: "multipath-tools",
        name: "multipathd",
        dir: "usr/sbin",
        links: &[],
    },
];

/// Shared objects loaded with `dlopen` (so no `DT_NEEDED` names them),
/// copied to the same path in the guest with the libraries they need:
/// multipath-tools' path checker and prioritizer plugins, which it looks
/// for in the compiled-in `/lib/multipath`, and libgcc_s, which glibc
/// loads for `pthread_cancel` (multipathd cancels its threads).
const PLUGINS: &[(&str, &str)] = &[
    ("libgcc-s1", "lib/x86_64-linux-gnu/libgcc_s.so.1"),
    ("multipath-tools", "lib/multipath/libchecktur.so"),
    ("multipath-tools", "lib/multipath/libprioalua.so"),
    ("multipath-tools", "lib/multipath/libprioconst.so"),
];

/// Plain files copied from a package: (package, path in package and guest).
const FILES: &[(&str, &str)] = &[
    ("e2fsprogs", "etc/mke2fs.conf"),
    // The defaults iscsiadm gives a node record it discovers.
    ("open-iscsi", "etc/iscsi/iscsid.conf"),
];

/// Where the guest keeps shared libraries.
const LIB_DIR: &str = "lib/x86_64-linux-gnu";

/// Marker lines the init writes to the console (each followed by the boot's
/// nonce and a value), so the host can tell setup, readiness and the
/// script's exit status apart from anything the script prints.
pub const MARK_READY: &str = "BASALT-GUEST-READY";
pub const MARK_SETUP_FAILED: &str = "BASALT-GUEST-SETUP-FAILED";
pub const MARK_EXIT: &str = "BASALT-GUEST-EXIT";
/// Where the per-boot archive puts the test's script.
pub const SCRIPT_PATH: &str = "basalt/script.sh";

/// A built image.
#[derive(Debug, Clone)]
pub struct Image {
    pub dir: PathBuf,
    pub vmlinux: PathBuf,
    pub initramfs: PathBuf,
    /// e.g. `linux-image-6.1.0-56-amd64 6.1.192-2`
    pub kernel: String,
    /// `name version` of every package, kernel first.
    pub packages: Vec<String>,
}

/// The init program: mounts the kernel file systems, loads the modules in
/// order, brings up the network, runs the script, reports its exit status
/// and powers off. `basalt_nonce` comes from the kernel command line (the
/// kernel passes unknown `name=value` parameters to init's environment).
pub fn init_script(release: &str, modules: &[String]) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        r#"#!/bin/busybox sh
# basalt-guest init (generated by the harness): set up, run {script}, report, power off.
/bin/busybox mkdir -p /proc /sys /dev /tmp /run /mnt /root /sbin /usr/bin /usr/sbin
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t sysfs sysfs /sys
/bin/busybox mount -t devtmpfs devtmpfs /dev 2>/dev/null
/bin/busybox --install -s /bin
export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
exec </dev/console >/dev/console 2>&1
setup_failed() {{
    echo
    echo "{setup_failed} $basalt_nonce $*"
    sync
    poweroff -f
    sleep 10
}}
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
"#,
        script = SCRIPT_PATH,
        setup_failed = MARK_SETUP_FAILED
    );
    for m in modules {
        let _ = writeln!(
            s,
            "insmod /lib/modules/{release}/{m}.ko || setup_failed insmod {m}"
        );
    }
    let _ = write!(
        s,
        r#"ip link set lo up || setup_failed lo
i=0
while [ ! -e /sys/class/net/eth0 ]; do
    i=$((i + 1))
    [ $i -le 100 ] || setup_failed "no eth0"
    usleep 50000
done
ip addr add {ip}/24 dev eth0 || setup_failed "eth0 address"
ip link set eth0 up || setup_failed "eth0 up"
echo
echo "{ready} $basalt_nonce $(cut -d' ' -f1 /proc/uptime)"
cd /root
/bin/sh /{script}
rc=$?
sync
echo
echo "{exit} $basalt_nonce $rc"
poweroff -f
sleep 10
"#,
        ip = crate::forward::GUEST_IP,
        ready = MARK_READY,
        script = SCRIPT_PATH,
        exit = MARK_EXIT
    );
    s
}

/// FNV-1a, 64 bit: stable across Rust releases (unlike `DefaultHasher`).
fn fnv1a(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in data {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Everything that determines the image's content.
fn image_key(packages: &[Package]) -> String {
    let mut desc = String::new();
    for p in packages {
        let _ = writeln!(desc, "{} {} {}", p.name, p.version, p.arch);
    }
    let _ = writeln!(desc, "modules {MODULES:?} stubbed {STUBBED:?}");
    // The assembly code itself: a changed harness builds a new image.
    for src in [
        include_str!("image.rs"),
        include_str!("stubs.rs"),
        include_str!("cpio.rs"),
        include_str!("kernel.rs"),
        include_str!("modules.rs"),
        include_str!("elf.rs"),
    ] {
        desc.push_str(src);
    }
    format!("{:016x}", fnv1a(desc.as_bytes()))
}

/// The `sources.list` line of Debian 12's backports suite.
const BACKPORTS: &str = "deb http://deb.debian.org/debian bookworm-backports main";

/// The guest's packages at their candidate versions, kernel first; asked
/// of apt once per process and kernel (each `apt-cache` call costs more
/// than a second).
fn resolved_packages(cache: &Cache, kernel: GuestKernel) -> Result<Vec<Package>> {
    static RESOLVED: Mutex<Vec<(GuestKernel, Vec<Package>)>> = Mutex::new(Vec::new());
    let mut slot = RESOLVED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, p)) = slot.iter().find(|(k, _)| *k == kernel) {
        return Ok(p.clone());
    }
    let lists = match kernel {
        GuestKernel::Debian12 => apt::Lists::host(),
        GuestKernel::Backports => {
            apt::Lists::suite(&cache.root().join("apt-bookworm-backports"), BACKPORTS)?
        }
    };
    let packages = apt::resolve_with_kernel(PACKAGES, &lists)?;
    slot.push((kernel, packages.clone()));
    Ok(packages)
}

/// Returns the image for the current Debian packages with `kernel`,
/// building it first if the cache does not have it.
pub fn ensure(cache: &Cache, kernel: GuestKernel) -> Result<Image> {
    let packages = resolved_packages(cache, kernel)?;
    let key = image_key(&packages);
    let kernel = &packages[0];
    let dir = cache.images_dir().join(format!("{}-{key}", kernel.version));
    let image = Image {
        vmlinux: dir.join("vmlinux"),
        initramfs: dir.join("initramfs.cpio"),
        kernel: format!("{} {}", kernel.name, kernel.version),
        packages: packages
            .iter()
            .map(|p| format!("{} {}", p.name, p.version))
            .collect(),
        dir,
    };
    if image.dir.is_dir() {
        touch(&image.dir.join("manifest.txt"));
        return Ok(image);
    }
    let _lock = cache.lock()?;
    if image.dir.is_dir() {
        return Ok(image);
    }
    let debs = apt::download(&packages, &cache.debs_dir())?;
    apt::prune_superseded(&packages, &cache.debs_dir());
    let images = cache.images_dir();
    fs::create_dir_all(&images)
        .map_err(|e| Error::io(format!("create {}", images.display()), e))?;
    let tmp = tempfile::Builder::new()
        .prefix(".build-")
        .tempdir_in(&images)
        .map_err(|e| {
            Error::io(
                format!("create a build directory in {}", images.display()),
                e,
            )
        })?;
    let out = tmp.path().join("out");
    fs::create_dir_all(&out).map_err(|e| Error::io(format!("create {}", out.display()), e))?;
    let started = std::time::Instant::now();
    build(&packages, &debs, &tmp.path().join("work"), &out)?;
    fs::rename(&out, &image.dir)
        .map_err(|e| Error::io(format!("publish {}", image.dir.display()), e))?;
    tracing::info!(dir = %image.dir.display(), took = ?started.elapsed(), "built guest image");
    prune_images(&images, &image.dir);
    Ok(image)
}

fn touch(path: &Path) {
    if let Ok(f) = fs::File::options().append(true).open(path) {
        let _ = f.set_modified(SystemTime::now());
    }
}

/// Removes other images (another harness version's, or superseded
/// packages'): all but the two most recently used, and any unused for a
/// week (last use: their manifest's mtime).
fn prune_images(images: &Path, keep: &Path) {
    const UNUSED: Duration = Duration::from_secs(7 * 24 * 3600);
    const KEEP_OTHERS: usize = 2;
    let Ok(entries) = fs::read_dir(images) else {
        return;
    };
    let mut others: Vec<(Option<SystemTime>, PathBuf)> = entries
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .map(|e| e.path())
        .filter(|p| p != keep)
        .map(|p| {
            let used = fs::metadata(p.join("manifest.txt"))
                .and_then(|m| m.modified())
                .ok();
            (used, p)
        })
        .collect();
    others.sort_by_key(|o| std::cmp::Reverse(o.0));
    for (i, (used, p)) in others.iter().enumerate() {
        let old = used.is_none_or(|t| t.elapsed().map(|a| a > UNUSED).unwrap_or(false));
        if i >= KEEP_OTHERS || old {
            tracing::info!(dir = %p.display(), "removing unused guest image");
            let _ = fs::remove_dir_all(p);
        }
    }
}

/// Resolves `rel` inside an extracted package tree, following symlinks
/// (absolute ones relative to the tree's root), at most 16 of them.
fn resolve_in(root: &Path, rel: &Path) -> Result<PathBuf> {
    let mut parts: Vec<PathBuf> = Vec::new();
    let mut todo: VecDeque<PathBuf> = rel
        .components()
        .filter_map(|c| match c {
            Component::Normal(p) => Some(PathBuf::from(p)),
            _ => None,
        })
        .collect();
    let mut hops = 0;
    while let Some(part) = todo.pop_front() {
        if part.as_os_str() == ".." {
            parts.pop();
            continue;
        }
        if part.as_os_str() == "." {
            continue;
        }
        let mut here = root.to_path_buf();
        here.extend(&parts);
        here.push(&part);
        match fs::symlink_metadata(&here) {
            Ok(m) if m.file_type().is_symlink() => {
                hops += 1;
                if hops > 16 {
                    return Err(Error::Image(format!(
                        "too many symlinks resolving {}",
                        rel.display()
                    )));
                }
                let target = fs::read_link(&here)
                    .map_err(|e| Error::io(format!("readlink {}", here.display()), e))?;
                if target.is_absolute() {
                    parts.clear();
                }
                let mut rest: VecDeque<PathBuf> = target
                    .components()
                    .filter_map(|c| match c {
                        Component::Normal(p) => Some(PathBuf::from(p)),
                        Component::ParentDir => Some(PathBuf::from("..")),
                        _ => None,
                    })
                    .collect();
                rest.extend(todo.drain(..));
                todo = rest;
            }
            Ok(_) => parts.push(part),
            Err(e) => {
                return Err(Error::io(
                    format!("{} in {}", rel.display(), root.display()),
                    e,
                ))
            }
        }
    }
    let mut p = root.to_path_buf();
    p.extend(&parts);
    Ok(p)
}

/// Shared libraries of the extracted packages by file name (sonames are
/// usually symlinks to the versioned file; they resolve inside the tree).
fn library_index(trees: &[(String, PathBuf)]) -> BTreeMap<String, (PathBuf, PathBuf)> {
    let mut index = BTreeMap::new();
    for (_, root) in trees {
        // multipath-tools keeps its libraries in /lib itself.
        for dir in [
            "lib/x86_64-linux-gnu",
            "usr/lib/x86_64-linux-gnu",
            "lib64",
            "lib",
        ] {
            let Ok(entries) = fs::read_dir(root.join(dir)) else {
                continue;
            };
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.contains(".so") {
                    index
                        .entry(name)
                        .or_insert_with(|| (root.clone(), Path::new(dir).join(e.file_name())));
                }
            }
        }
    }
    index
}

struct Content {
    files: BTreeMap<String, (u32, Vec<u8>)>,
    symlinks: BTreeMap<String, String>,
}

impl Content {
    fn dirs(&self) -> BTreeSet<String> {
        let mut dirs = BTreeSet::new();
        for p in self.files.keys().chain(self.symlinks.keys()) {
            let mut cur = Path::new(p).parent();
            while let Some(d) = cur.filter(|d| !d.as_os_str().is_empty()) {
                dirs.insert(d.to_string_lossy().into_owned());
                cur = d.parent();
            }
        }
        for d in [
            "proc", "sys", "dev", "tmp", "run", "mnt", "root", "sbin", "usr/bin", "usr/sbin",
        ] {
            dirs.insert(d.to_string());
        }
        dirs
    }
}

fn read(path: &Path) -> Result<Vec<u8>> {
    fs::read(path).map_err(|e| Error::io(format!("read {}", path.display()), e))
}

fn parse_elf<'a>(path: &Path, data: &'a [u8]) -> Result<Elf<'a>> {
    Elf::parse(data).map_err(|e| Error::Elf {
        path: path.to_path_buf(),
        msg: e.to_string(),
    })
}

fn elf_err(path: &Path) -> impl Fn(crate::elf::ElfError) -> Error + '_ {
    move |e| Error::Elf {
        path: path.to_path_buf(),
        msg: e.to_string(),
    }
}

fn build(packages: &[Package], debs: &[PathBuf], work: &Path, out: &Path) -> Result<()> {
    // 1. unpack
    let mut trees: Vec<(String, PathBuf)> = Vec::new();
    for (p, deb) in packages.iter().zip(debs) {
        let root = work.join("pkgs").join(&p.name);
        apt::extract(deb, &root)?;
        trees.push((p.name.clone(), root));
    }
    let tree = |name: &str| -> Result<&PathBuf> {
        trees
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, r)| r)
            .ok_or_else(|| {
                Error::Image(format!("package {name} is not in the guest's package list"))
            })
    };
    let kernel_root = trees[0].1.clone();
    let mut manifest = String::new();
    for p in packages {
        let _ = writeln!(manifest, "package {} {}", p.name, p.version);
    }

    // 2. kernel
    let boot = kernel_root.join("boot");
    let vmlinuz = fs::read_dir(&boot)
        .map_err(|e| Error::io(format!("read {}", boot.display()), e))?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-"))
        })
        .ok_or_else(|| Error::Image(format!("no vmlinuz in {}", boot.display())))?;
    let vmlinux = kernel::extract_vmlinux(&read(&vmlinuz)?).map_err(|e| Error::Kernel {
        path: vmlinuz.clone(),
        msg: e.to_string(),
    })?;
    fs::write(out.join("vmlinux"), &vmlinux).map_err(|e| Error::io("write vmlinux", e))?;
    let _ = writeln!(
        manifest,
        "vmlinux {} bytes from {}",
        vmlinux.len(),
        vmlinuz.display()
    );
    drop(vmlinux);

    let mut content = Content {
        files: BTreeMap::new(),
        symlinks: BTreeMap::new(),
    };

    // 3. modules
    let modtree = ModuleTree::open(&kernel_root)?;
    let release = modtree.release().to_string();
    let modules = modtree.load_order(MODULES)?;
    let mut module_names = Vec::new();
    for m in modules {
        let _ = writeln!(manifest, "module {} {} bytes", m.name, m.image.len());
        content.files.insert(
            format!("lib/modules/{release}/{}.ko", m.name),
            (0o644, m.image),
        );
        module_names.push(m.name);
    }

    // 4. binaries and the libraries they need
    let index = library_index(&trees[1..]);
    let stubbed: BTreeSet<String> = STUBBED.iter().map(|s| s.to_string()).collect();
    let mut objects: Vec<stubs::Object> = Vec::new();
    let mut queue: VecDeque<(String, PathBuf, Vec<u8>)> = VecDeque::new();
    for b in BINARIES {
        let root = tree(b.package)?;
        let rel = ["usr/sbin", "usr/bin", "sbin", "bin"]
            .iter()
            .map(|d| Path::new(d).join(b.name))
            .find(|p| fs::symlink_metadata(root.join(p)).is_ok())
            .ok_or_else(|| Error::Image(format!("package {} has no {}", b.package, b.name)))?;
        let path = resolve_in(root, &rel)?;
        let data = read(&path)?;
        let guest = format!("{}/{}", b.dir, b.name);
        for l in b.links {
            content
                .symlinks
                .insert(format!("{}/{l}", b.dir), b.name.to_string());
        }
        queue.push_back((guest, path, data));
    }
    for (package, rel) in PLUGINS {
        let path = resolve_in(tree(package)?, Path::new(rel))?;
        let data = read(&path)?;
        queue.push_back((rel.to_string(), path, data));
    }
    let mut libs_included: BTreeSet<String> = BTreeSet::new();
    while let Some((guest, path, data)) = queue.pop_front() {
        {
            let elf = parse_elf(&path, &data)?;
            let needed = elf.needed().map_err(elf_err(&path))?;
            let mut wanted: Vec<String> = needed.clone();
            if let Some(interp) = elf.interp().map_err(elf_err(&path))? {
                let loader = Path::new(&interp)
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .ok_or_else(|| {
                        Error::Image(format!("{}: odd interpreter {interp}", path.display()))
                    })?;
                let canonical = format!("/{LIB_DIR}/{loader}");
                if interp != canonical {
                    content
                        .symlinks
                        .insert(interp.trim_start_matches('/').to_string(), canonical);
                }
                wanted.push(loader);
            }
            for lib in wanted {
                if stubbed.contains(&lib) || !libs_included.insert(lib.clone()) {
                    continue;
                }
                let (root, rel) = index.get(&lib).ok_or_else(|| {
                    Error::Image(format!(
                        "{lib} (needed by {guest}) is in none of the guest's packages: add its \
                         package to image::PACKAGES, or the library to image::STUBBED if the \
                         guest never uses it"
                    ))
                })?;
                let lpath = resolve_in(root, rel)?;
                let ldata = read(&lpath)?;
                queue.push_back((format!("{LIB_DIR}/{lib}"), lpath, ldata));
            }
            objects.push(stubs::Object {
                name: guest.clone(),
                needed,
                symbols: elf.dynamic_symbols().map_err(elf_err(&path))?,
                version_needs: elf.version_needs().map_err(elf_err(&path))?,
            });
        }
        let _ = writeln!(
            manifest,
            "file {guest} {} bytes from {}",
            data.len(),
            path.display()
        );
        content.files.insert(guest, (0o755, data));
    }

    // 5. placeholders for the stubbed libraries
    for (soname, lib) in stubs::plan(&objects, &stubbed) {
        let so = stubs::build(&soname, &lib, work)?;
        let count: usize = lib.versions.values().map(|s| s.len()).sum();
        let _ = writeln!(
            manifest,
            "stub {LIB_DIR}/{soname} {count} symbols, {} bytes",
            so.len()
        );
        content
            .files
            .insert(format!("{LIB_DIR}/{soname}"), (0o755, so));
    }

    // 6. plain files and init
    for (package, rel) in FILES {
        let path = resolve_in(tree(package)?, Path::new(rel))?;
        content.files.insert(rel.to_string(), (0o644, read(&path)?));
    }
    content.files.insert(
        "init".into(),
        (0o755, init_script(&release, &module_names).into_bytes()),
    );

    // 7. the archive
    let path = out.join("initramfs.cpio");
    let file =
        fs::File::create(&path).map_err(|e| Error::io(format!("create {}", path.display()), e))?;
    let mut w = CpioWriter::new(std::io::BufWriter::new(file));
    let wr = |e| Error::io(format!("write {}", path.display()), e);
    for d in content.dirs() {
        w.dir(&d, 0o755).map_err(wr)?;
    }
    w.char_device("dev/console", 0o600, 5, 1).map_err(wr)?;
    let mut total = 0usize;
    for (p, (mode, data)) in &content.files {
        total += data.len();
        w.file(p, *mode, data).map_err(wr)?;
    }
    for (p, target) in &content.symlinks {
        w.symlink(p, target).map_err(wr)?;
    }
    w.finish().map_err(wr)?;
    let _ = writeln!(
        manifest,
        "initramfs {total} bytes of files, kernel release {release}"
    );
    fs::write(out.join("manifest.txt"), manifest)
        .map_err(|e| Error::io("write manifest.txt", e))?;
    Ok(())
}

/// The per-boot archive appended to the image's initramfs: the script.
pub fn script_archive(script: &str) -> std::io::Result<Vec<u8>> {
    let mut w = CpioWriter::new(Vec::new());
    w.dir("basalt", 0o755)?;
    w.file(SCRIPT_PATH, 0o755, script.as_bytes())?;
    w.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn resolve_follows_relative_and_absolute_links_inside_the_tree() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        fs::create_dir_all(r.join("lib/x86_64-linux-gnu")).unwrap();
        fs::create_dir_all(r.join("lib64")).unwrap();
        fs::write(r.join("lib/x86_64-linux-gnu/libfoo.so.1.2"), b"real").unwrap();
        symlink("libfoo.so.1.2", r.join("lib/x86_64-linux-gnu/libfoo.so.1")).unwrap();
        symlink("/lib/x86_64-linux-gnu/libfoo.so.1", r.join("lib64/ld.so")).unwrap();
        symlink(
            "../lib/x86_64-linux-gnu/libfoo.so.1",
            r.join("lib64/rel.so"),
        )
        .unwrap();
        for p in [
            "lib/x86_64-linux-gnu/libfoo.so.1",
            "lib64/ld.so",
            "lib64/rel.so",
        ] {
            let got = resolve_in(r, Path::new(p)).unwrap();
            assert_eq!(got, r.join("lib/x86_64-linux-gnu/libfoo.so.1.2"), "{p}");
        }
        symlink("loop", r.join("loop")).unwrap();
        assert!(resolve_in(r, Path::new("loop")).is_err());
        assert!(resolve_in(r, Path::new("missing")).is_err());
    }

    #[test]
    fn init_loads_modules_in_order_and_reports_with_the_nonce() {
        let s = init_script("6.1.0-x", &["virtio_pci".into(), "nbd".into()]);
        let a = s.find("insmod /lib/modules/6.1.0-x/virtio_pci.ko").unwrap();
        let b = s.find("insmod /lib/modules/6.1.0-x/nbd.ko").unwrap();
        assert!(a < b);
        assert!(s.contains(&format!("{MARK_EXIT} $basalt_nonce $rc")));
        assert!(s.contains(&format!("{MARK_READY} $basalt_nonce")));
        assert!(s.contains(&format!("/bin/sh /{SCRIPT_PATH}")));
        assert!(s.starts_with("#!/bin/busybox sh\n"));
    }

    #[test]
    fn prune_keeps_the_current_and_two_recent_images() {
        let d = tempfile::tempdir().unwrap();
        let now = SystemTime::now();
        let mk = |name: &str, age_s: u64| {
            let p = d.path().join(name);
            fs::create_dir_all(&p).unwrap();
            let f = fs::File::create(p.join("manifest.txt")).unwrap();
            f.set_modified(now - Duration::from_secs(age_s)).unwrap();
            p
        };
        let current = mk("cur", 10 * 24 * 3600);
        mk("a", 60);
        mk("b", 120);
        mk("c", 180);
        mk("old", 8 * 24 * 3600);
        fs::create_dir_all(d.path().join(".build-x")).unwrap();
        prune_images(d.path(), &current);
        let mut left: Vec<String> = fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, [".build-x", "a", "b", "cur"]);
    }

    #[test]
    fn key_depends_on_package_versions() {
        let p = |v: &str| Package {
            name: "fio".into(),
            version: v.into(),
            arch: "amd64".into(),
            depends: String::new(),
            lists: apt::Lists::host(),
        };
        assert_eq!(image_key(&[p("1")]), image_key(&[p("1")]));
        assert_ne!(image_key(&[p("1")]), image_key(&[p("2")]));
    }
}
