//! What goes into the guest image: the Debian packages, the kernel modules,
//! the libraries replaced by placeholders, the programs and plugins taken
//! from the packages, and the files copied as they are.

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
pub(super) struct Binary {
    pub(super) package: &'static str,
    pub(super) name: &'static str,
    /// Directory in the guest.
    pub(super) dir: &'static str,
    /// Other names for it in the same directory.
    pub(super) links: &'static [&'static str],
}

pub(super) const BINARIES: &[Binary] = &[
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
pub(super) const PLUGINS: &[(&str, &str)] = &[
    ("libgcc-s1", "lib/x86_64-linux-gnu/libgcc_s.so.1"),
    ("multipath-tools", "lib/multipath/libchecktur.so"),
    ("multipath-tools", "lib/multipath/libprioalua.so"),
    ("multipath-tools", "lib/multipath/libprioconst.so"),
];

/// Plain files copied from a package: (package, path in package and guest).
pub(super) const FILES: &[(&str, &str)] = &[
    ("e2fsprogs", "etc/mke2fs.conf"),
    // The defaults iscsiadm gives a node record it discovers.
    ("open-iscsi", "etc/iscsi/iscsid.conf"),
];

/// Where the guest keeps shared libraries.
pub(super) const LIB_DIR: &str = "lib/x86_64-linux-gnu";
