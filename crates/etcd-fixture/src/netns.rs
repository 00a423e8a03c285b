//! Running processes and threads inside a Linux network namespace made with
//! `ip netns add NAME` (a file under `/run/netns`), for tests that cut
//! network links between processes on one machine.
//!
//! Entering a network namespace needs CAP_SYS_ADMIN (root). A namespace is
//! entered with `setns(2)`, which for network namespaces affects only the
//! calling thread: [`command_in`] enters it in the forked child before
//! `exec`, [`run_in`] on a short-lived thread of its own, so the caller's
//! threads never change namespace.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;

/// The file `ip netns add NAME` bind-mounts the namespace on.
pub fn path(name: &str) -> PathBuf {
    PathBuf::from("/run/netns").join(name)
}

/// Makes `cmd` run in network namespace `name`: the child enters it after
/// `fork` and before `exec` (so its PID is the process's own, not that of a
/// wrapper such as `ip netns exec`). Spawning fails if the namespace does
/// not exist or cannot be entered.
pub fn command_in(cmd: &mut Command, name: &str) {
    let path = CString::new(path(name).into_os_string().into_encoded_bytes())
        .expect("a namespace name has no NUL byte");
    // SAFETY: the closure runs in the forked child before exec and only
    // calls async-signal-safe functions (open, setns, close) on memory
    // allocated before the fork.
    unsafe {
        cmd.pre_exec(move || {
            let fd = libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            let rc = libc::setns(fd, libc::CLONE_NEWNET);
            let err = io::Error::last_os_error();
            libc::close(fd);
            if rc != 0 {
                return Err(err);
            }
            Ok(())
        });
    }
}

/// Runs `f` on a new thread inside network namespace `name` and returns its
/// result (sockets it opens live in that namespace).
pub fn run_in<T: Send>(name: &str, f: impl FnOnce() -> T + Send) -> io::Result<T> {
    let file = File::open(path(name))?;
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: setns(2) on a file descriptor we own; it changes the
            // network namespace of this (scoped, short-lived) thread only.
            if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(f())
        })
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}
