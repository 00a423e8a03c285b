//! Where the harness keeps what outlives one test run: downloaded `.deb`s
//! and built guest images. `$BASALT_GUEST_CACHE` if set, else
//! `$XDG_CACHE_HOME/basalt-guest`, else `~/.cache/basalt-guest`.
//!
//! Invariants:
//! - Filling the cache happens under an exclusive `flock` on `ROOT/lock`,
//!   so concurrent tests (threads or processes) never build the same thing
//!   twice or see it half-written; readers of a finished image need no lock
//!   because finished entries are only ever published by `rename`.
//! - The lock is released when the [`CacheLock`] is dropped (or the process
//!   dies: the kernel drops `flock`s with the file).

use std::fs::{self, File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Environment variable that overrides the cache location.
pub const CACHE_ENV: &str = "BASALT_GUEST_CACHE";

#[derive(Debug, Clone)]
pub struct Cache {
    root: PathBuf,
}

/// Held while the cache is being filled.
pub struct CacheLock {
    _file: File,
}

impl Cache {
    /// The cache at `explicit`, or at the default location.
    pub fn locate(explicit: Option<&Path>) -> Result<Cache> {
        let root = match explicit {
            Some(p) => p.to_path_buf(),
            None => default_root()?,
        };
        fs::create_dir_all(&root)
            .map_err(|e| Error::io(format!("create cache {}", root.display()), e))?;
        Ok(Cache { root })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn debs_dir(&self) -> PathBuf {
        self.root.join("debs")
    }

    pub fn images_dir(&self) -> PathBuf {
        self.root.join("images")
    }

    /// Blocks until this process holds the cache exclusively.
    pub fn lock(&self) -> Result<CacheLock> {
        let path = self.root.join("lock");
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| Error::io(format!("open {}", path.display()), e))?;
        loop {
            // SAFETY: flock on a descriptor this function owns.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
            if rc == 0 {
                return Ok(CacheLock { _file: file });
            }
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::Interrupted {
                return Err(Error::io(format!("lock {}", path.display()), err));
            }
        }
    }
}

fn default_root() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(CACHE_ENV).filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    if let Some(p) = std::env::var_os("XDG_CACHE_HOME").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p).join("basalt-guest"));
    }
    if let Some(p) = std::env::var_os("HOME").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p).join(".cache/basalt-guest"));
    }
    Err(Error::Config(format!(
        "no cache directory: set {CACHE_ENV}, XDG_CACHE_HOME or HOME"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn lock_is_exclusive_across_open_file_descriptions() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::locate(Some(dir.path())).unwrap();
        let held = cache.lock().unwrap();
        let got = Arc::new(AtomicBool::new(false));
        let t = {
            let cache = cache.clone();
            let got = got.clone();
            std::thread::spawn(move || {
                let _l = cache.lock().unwrap();
                got.store(true, Ordering::SeqCst);
            })
        };
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            !got.load(Ordering::SeqCst),
            "second lock acquired while the first is held"
        );
        drop(held);
        t.join().unwrap();
        assert!(got.load(Ordering::SeqCst));
    }
}
