//! Test-only harness: boots a small Linux guest under QEMU (TCG) so that
//! Basalt can be tested against the Linux kernel's own block initiators —
//! the kernel NBD client, the nvme-tcp initiator with nvme-cli and the
//! iscsi_tcp initiator with open-iscsi — rather than only against
//! user-space clients. A script that needs the host to act mid-run (resize
//! a volume it has attached) asks through [`HostCalls`].
//!
//! [`Guest::boot`] runs a shell script inside a fresh guest and returns its
//! exit status and the serial console log:
//!
//! ```no_run
//! use basalt_guest::{Forward, Guest, GuestConfig};
//! # fn f(nbd_addr: std::net::SocketAddr) -> Result<(), basalt_guest::Error> {
//! let run = Guest::boot(
//!     GuestConfig {
//!         forwards: vec![Forward::new(10809, nbd_addr)],
//!         ..GuestConfig::default()
//!     },
//!     "set -eux\nnbd-client 10.0.2.100 10809 /dev/nbd0 -N demo\n",
//! )?
//! .ensure_success()?;
//! # Ok(()) }
//! ```
//!
//! The guest is Debian 12's current kernel (or its backports kernel,
//! [`GuestKernel`]) and a busybox initramfs with nbd-client, nvme-cli,
//! open-iscsi (iscsiadm, iscsid), multipath-tools (multipath, multipathd),
//! fio and e2fsprogs, built from Debian packages that are downloaded with
//! the host's apt on first use and cached (see [`image`], [`cache`]). Its
//! init loads the nbd, nvme-tcp (with nvme-fabrics, nvme-core), iscsi_tcp,
//! sd_mod, scsi_dh_alua and dm-multipath (with its path selectors)
//! modules, ext4 and the NIC driver, configures `10.0.2.15/24`, runs the
//! script with busybox `sh` in `/root`, prints the script's exit status in
//! a marker line and powers off.
//!
//! Invariants:
//! - The guest reaches only the host sockets listed as [`Forward`]s (QEMU
//!   user networking with `restrict=on`); a forward's guest-side address is
//!   what a target must advertise to the guest ([`Forward::guest`]).
//! - A run ends within [`GuestConfig::timeout`]: on timeout, error or panic
//!   QEMU is killed by its PID (and by the kernel if the test process dies).
//! - Every failure — the host lacking a tool, apt, the image build, a boot
//!   that never reaches the script, a setup step, a timeout — is an
//!   [`Error`] that says which, with the console tail for guest-side ones.
//!   A script's non-zero exit is a normal [`GuestRun`];
//!   [`GuestRun::ensure_success`] turns it into [`Error::ScriptFailed`].
//! - One vCPU (`-smp 1`) and no KVM: the machines running the tests have
//!   two cores shared with others, and TCG boots a stock kernel anywhere.
//!
//! Host requirements: Debian 12 with `apt-get`/`apt-cache`/`dpkg-deb`,
//! `qemu-system-x86_64` (package qemu-system-x86) and a C compiler (`cc`,
//! for the placeholder libraries; the Rust toolchain needs one anyway).
//! Set `BASALT_GUEST_ECHO=1` to see the console live, `BASALT_GUEST_CACHE`
//! to move the cache.

mod apt;
pub mod cache;
mod console;
mod cpio;
mod elf;
mod error;
pub mod forward;
pub mod host_calls;
pub mod image;
mod kernel;
mod modules;
mod qemu;
mod stubs;

use std::fs;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub use error::{Error, Result};
pub use forward::{Forward, FORWARD_IP, GUEST_IP};
pub use host_calls::HostCalls;
pub use image::Image;

/// Lines of console kept in error messages.
const TAIL_LINES: usize = 80;
/// How long QEMU gets to exit after the guest reported the script's exit.
const POWEROFF_GRACE: Duration = Duration::from_secs(15);
/// The guest's kernel (66 MB) and initramfs must fit with room to work.
const MIN_MEMORY_MIB: u32 = 256;

/// The guest's kernel.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum GuestKernel {
    /// Debian 12's current kernel (6.1).
    #[default]
    Debian12,
    /// Debian 12's backports kernel (6.12): what 6.1 lacks, such as NVMe
    /// in-band authentication (DH-HMAC-CHAP). Its package lists are fetched
    /// into the cache (the host's apt sources are not changed).
    Backports,
}

/// How to boot a guest.
#[derive(Debug, Clone)]
pub struct GuestConfig {
    /// Which kernel boots.
    pub kernel: GuestKernel,
    /// Guest-side addresses that lead to host sockets.
    pub forwards: Vec<Forward>,
    pub memory_mib: u32,
    /// The whole run (boot, script, power-off) must end within this.
    pub timeout: Duration,
    /// The cache directory; default: see [`cache`].
    pub cache_dir: Option<PathBuf>,
    /// Copy the console to stderr as it arrives (default: `$BASALT_GUEST_ECHO`).
    pub echo_console: bool,
}

impl Default for GuestConfig {
    fn default() -> GuestConfig {
        GuestConfig {
            kernel: GuestKernel::default(),
            forwards: Vec::new(),
            memory_mib: 512,
            timeout: Duration::from_secs(300),
            cache_dir: None,
            echo_console: std::env::var_os("BASALT_GUEST_ECHO")
                .is_some_and(|v| !v.is_empty() && v != "0"),
        }
    }
}

/// The outcome of a script that ran.
#[derive(Debug, Clone)]
pub struct GuestRun {
    /// The script's exit status.
    pub exit_code: i32,
    /// Everything the guest wrote to its serial console.
    pub console_log: String,
    /// From QEMU's start to the script's start, as the host measured it.
    pub boot_time: Option<Duration>,
    /// From QEMU's start to its exit.
    pub duration: Duration,
}

impl GuestRun {
    pub fn success(&self) -> bool {
        self.exit_code == 0
    }

    /// The last `lines` lines of the console.
    pub fn console_tail(&self, lines: usize) -> String {
        console::tail(&self.console_log, lines)
    }

    /// `Ok(self)` if the script exited 0, else [`Error::ScriptFailed`] with
    /// the console tail.
    pub fn ensure_success(self) -> Result<GuestRun> {
        if self.success() {
            Ok(self)
        } else {
            Err(Error::ScriptFailed {
                code: self.exit_code,
                tail: self.console_tail(TAIL_LINES),
            })
        }
    }
}

/// A guest image ready to boot (built or found in the cache).
#[derive(Debug, Clone)]
pub struct Guest {
    image: Image,
}

fn nonce() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let x = t
        ^ (u64::from(std::process::id()) << 32)
        ^ N.fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15);
    format!("{x:016x}")
}

impl Guest {
    /// Finds or builds the guest image (downloading packages on first use).
    pub fn prepare(config: &GuestConfig) -> Result<Guest> {
        let cache = cache::Cache::locate(config.cache_dir.as_deref())?;
        let started = Instant::now();
        let image = image::ensure(&cache, config.kernel)?;
        tracing::info!(kernel = %image.kernel, dir = %image.dir.display(), took = ?started.elapsed(), "guest image ready");
        Ok(Guest { image })
    }

    pub fn image(&self) -> &Image {
        &self.image
    }

    /// [`Guest::prepare`], then [`Guest::run`].
    pub fn boot(config: GuestConfig, script: &str) -> Result<GuestRun> {
        Guest::prepare(&config)?.run(&config, script)
    }

    /// Boots the guest, runs `script` (busybox `sh`, in `/root`, after the
    /// modules are loaded and the network is up), powers it off.
    pub fn run(&self, config: &GuestConfig, script: &str) -> Result<GuestRun> {
        forward::validate(&config.forwards)?;
        if config.memory_mib < MIN_MEMORY_MIB {
            return Err(Error::Config(format!(
                "memory_mib {} is below {MIN_MEMORY_MIB}",
                config.memory_mib
            )));
        }
        // The image's initramfs with the script appended as a second archive.
        let dir = tempfile::Builder::new()
            .prefix("basalt-guest-")
            .tempdir()
            .map_err(|e| Error::io("create a temporary directory", e))?;
        let initrd = dir.path().join("initrd.cpio");
        fs::copy(&self.image.initramfs, &initrd)
            .map_err(|e| Error::io(format!("copy {}", self.image.initramfs.display()), e))?;
        let extra =
            image::script_archive(script).map_err(|e| Error::io("build the script archive", e))?;
        fs::OpenOptions::new()
            .append(true)
            .open(&initrd)
            .and_then(|mut f| f.write_all(&extra))
            .map_err(|e| Error::io(format!("append to {}", initrd.display()), e))?;

        let nonce = nonce();
        let cmd = qemu::command(&qemu::Spec {
            vmlinux: &self.image.vmlinux,
            initrd: &initrd,
            memory_mib: config.memory_mib,
            nonce: &nonce,
            forwards: &config.forwards,
        });
        tracing::debug!(?cmd, "starting QEMU");
        let started = Instant::now();
        let (mut qemu, stdout, mut stderr) = qemu::QemuProcess::spawn(cmd)?;
        tracing::info!(pid = qemu.pid(), forwards = ?config.forwards, "guest booting");
        let console = console::Console::capture(stdout, nonce.clone(), config.echo_console);
        let stderr_thread = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stderr.read_to_string(&mut s);
            s
        });

        let deadline = started + config.timeout;
        let mut exit_seen_at: Option<Instant> = None;
        let mut last_check = Instant::now();
        let status = loop {
            if let Some(st) = qemu.try_wait()? {
                break st;
            }
            let now = Instant::now();
            if now >= deadline {
                qemu.kill();
                let phase = if console.ready_at().is_some() {
                    "the script was running"
                } else {
                    "the guest never reached the script"
                };
                let text = console.finish();
                return Err(Error::Timeout {
                    timeout: config.timeout,
                    phase,
                    tail: console::tail(&text, TAIL_LINES),
                });
            }
            if now.duration_since(last_check) >= Duration::from_secs(1) {
                last_check = now;
                if exit_seen_at.is_none()
                    && console::parse_markers(&console.text(), &nonce)
                        .exit_code
                        .is_some()
                {
                    exit_seen_at = Some(now);
                }
                if exit_seen_at.is_some_and(|t| now.duration_since(t) > POWEROFF_GRACE) {
                    tracing::warn!("guest reported its exit status but did not power off");
                    qemu.kill();
                    continue;
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let duration = started.elapsed();
        let ready_at = console.ready_at();
        let text = console.finish();
        let qemu_stderr = stderr_thread.join().unwrap_or_default();
        drop(qemu);
        let markers = console::parse_markers(&text, &nonce);
        if let Some(step) = markers.setup_failed {
            return Err(Error::Setup {
                step,
                tail: console::tail(&text, TAIL_LINES),
            });
        }
        let Some(exit_code) = markers.exit_code else {
            return Err(Error::Boot {
                status: status.to_string(),
                stderr: qemu_stderr.trim().to_string(),
                tail: console::tail(&text, TAIL_LINES),
            });
        };
        let boot_time = ready_at.map(|t| t.duration_since(started));
        tracing::info!(
            exit_code,
            ?boot_time,
            guest_uptime_at_ready = ?markers.ready_uptime,
            ?duration,
            "guest finished"
        );
        Ok(GuestRun {
            exit_code,
            console_log: text,
            boot_time,
            duration,
        })
    }
}
