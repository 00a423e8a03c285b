//! The harness's one error type: what went wrong, where, and for guest
//! failures the tail of the serial console, so a failed test explains itself.
//!
//! Invariants: every variant names the thing that failed (file, package,
//! command, module, guest step); guest-side variants carry the console tail
//! verbatim.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

/// Everything [`crate::Guest`] can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file or process operation on the host failed.
    #[error("{what}: {source}")]
    Io {
        /// What the harness was doing.
        what: String,
        #[source]
        source: io::Error,
    },

    /// A host tool the harness runs is not installed.
    #[error("`{tool}` is not installed or not runnable ({detail}); {hint}")]
    MissingTool {
        tool: String,
        detail: String,
        hint: &'static str,
    },

    /// apt could not resolve or download a package.
    #[error("apt: {0}")]
    Apt(String),

    /// An extracted package lacks something the guest needs, or a needed
    /// shared library is in none of the guest's packages.
    #[error("guest image: {0}")]
    Image(String),

    /// An ELF file (binary, library, kernel module) could not be read.
    #[error("{}: {msg}", path.display())]
    Elf { path: PathBuf, msg: String },

    /// The kernel image could not be turned into a bootable vmlinux.
    #[error("kernel image {}: {msg}", path.display())]
    Kernel { path: PathBuf, msg: String },

    /// A requested kernel module (or one it depends on) is missing.
    #[error("kernel module `{module}`: {msg}")]
    Module { module: String, msg: String },

    /// Building the placeholder libraries failed.
    #[error("stub library {soname}: {msg}")]
    Stub { soname: String, msg: String },

    /// The configuration cannot be booted as given.
    #[error("guest config: {0}")]
    Config(String),

    /// QEMU could not be started, or exited before the guest reported an
    /// outcome (boot failure, kernel panic, QEMU error).
    #[error(
        "QEMU exited ({status}) before the guest reported an exit status\n--- qemu stderr ---\n{stderr}\n--- console tail ---\n{tail}"
    )]
    Boot {
        status: String,
        stderr: String,
        tail: String,
    },

    /// The guest's init failed before running the script (module load,
    /// network setup).
    #[error("guest setup failed at `{step}`\n--- console tail ---\n{tail}")]
    Setup { step: String, tail: String },

    /// The guest did not power off within the configured time; QEMU was
    /// killed.
    #[error("guest did not finish within {timeout:?} (QEMU killed); {phase}\n--- console tail ---\n{tail}")]
    Timeout {
        timeout: Duration,
        phase: &'static str,
        tail: String,
    },

    /// The script ran and exited with a non-zero status (only from
    /// [`crate::GuestRun::ensure_success`]).
    #[error("guest script exited with status {code}\n--- console tail ---\n{tail}")]
    ScriptFailed { code: i32, tail: String },
}

impl Error {
    pub(crate) fn io(what: impl Into<String>, source: io::Error) -> Error {
        Error::Io {
            what: what.into(),
            source,
        }
    }
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, Error>;
