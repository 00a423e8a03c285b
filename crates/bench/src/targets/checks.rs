//! Checks of where the bench runs and what it measures: the work
//! directory's filesystem (O_DIRECT must work), whether a host is
//! loopback, that a device is not mounted, and a target's size and first
//! read (`probe`).

use super::*;

/// Refuses a work directory where files cannot be opened with O_DIRECT
/// (tmpfs before Linux 6.6, some FUSE filesystems): the targets' backing
/// files would be cached and the comparison meaningless. Returns the name of
/// the directory's filesystem type for the summary (`tmpfs` means the data
/// lives in RAM, so the CPU rather than a disk is the limit).
pub fn check_work_dir(dir: &Path) -> Result<&'static str, TargetError> {
    use std::os::unix::fs::OpenOptionsExt;
    let probe = dir.join(format!(".basalt-bench-direct-probe.{}", std::process::id()));
    let opened = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_DIRECT)
        .open(&probe);
    let _ = fs::remove_file(&probe);
    match opened {
        Ok(_) => Ok(filesystem_kind(dir)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            Err(TargetError::NoDirectIo(dir.to_path_buf()))
        }
        Err(e) => Err(TargetError::Io {
            context: format!(
                "cannot create a file in the work directory {}",
                dir.display()
            ),
            source: e,
        }),
    }
}

/// The filesystem type of `dir`, by its statfs magic, for common ones.
pub(super) fn filesystem_kind(dir: &Path) -> &'static str {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c_path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return "unknown";
    };
    // SAFETY: statfs is plain old data; all-zero is a valid value.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid NUL-terminated path and a statfs buffer we own.
    let rc = unsafe { libc::statfs(c_path.as_ptr(), &mut stat) };
    if rc != 0 {
        return "unknown";
    }
    #[allow(clippy::unnecessary_cast)]
    match stat.f_type as i64 {
        0x0102_1994 => "tmpfs",
        0xEF53 => "ext4",
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs",
        0x794C_7630 => "overlayfs",
        _ => "other",
    }
}

/// Whether a load host (`HOST`, `HOST:PORT`, `[V6]:PORT`) is this machine's
/// loopback; unresolvable hosts are not.
pub fn is_loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split_once(']').map_or(rest, |(a, _)| a)
    } else {
        match host.rsplit_once(':') {
            Some((n, _)) if !n.contains(':') => n,
            _ => host,
        }
    };
    match (name, 0u16).to_socket_addrs() {
        Ok(addrs) => {
            let addrs: Vec<_> = addrs.collect();
            !addrs.is_empty() && addrs.iter().all(|a| a.ip().is_loopback())
        }
        Err(_) => false,
    }
}

/// Checks that fio reaches the target; on files, picks io_uring or, if
/// fio cannot use it here, libaio.
pub(super) fn probe(
    ctx: &TargetContext<'_>,
    name: &str,
    io: TargetIo,
    dir: &Path,
) -> Result<TargetIo, TargetError> {
    let candidates: Vec<TargetIo> = match &io {
        TargetIo::File { path, .. } => [FileEngine::IoUring, FileEngine::Libaio]
            .into_iter()
            .map(|engine| TargetIo::File {
                path: path.clone(),
                engine,
            })
            .collect(),
        TargetIo::Nbd { .. } => vec![io.clone()],
    };
    let mut last_error = String::new();
    for candidate in candidates {
        let text = jobfile::probe(&candidate).map_err(|e| TargetError::Unreachable {
            name: name.to_string(),
            detail: e.to_string(),
        })?;
        let job = dir.join(format!("probe-{}.fio", sanitize(name)));
        fs::write(&job, text).map_err(io_err(format!("cannot write {}", job.display())))?;
        let finished = process::run(
            ctx.fio,
            &Invocation {
                job_file: &job,
                hosts: ctx.hosts,
                cwd: dir,
                timeout: Duration::from_secs(60),
            },
            ctx.interrupted,
            &mut |_| {},
        )
        .map_err(|e| TargetError::Unreachable {
            name: name.to_string(),
            detail: e.to_string(),
        })?;
        let _ = fs::remove_file(&job);
        let ok = finished.success()
            && crate::fio::parse::parse_report(&finished.stdout)
                .ok()
                .is_some_and(|r| crate::fio::parse::metrics(&r).is_ok());
        if ok {
            return Ok(candidate);
        }
        // What fio said besides its JSON document.
        let said = format!(
            "{}\n{}",
            crate::fio::parse::split_output(&finished.stdout).preamble,
            finished.stderr
        );
        last_error = process::tail(&said, 3, 400);
        if last_error.contains("engine nbd not loadable") {
            last_error.push_str(" (this fio has no nbd engine; install Debian's fio package)");
        }
        if last_error.is_empty() {
            last_error = format!("fio exited with {:?}", finished.status);
        }
    }
    Err(TargetError::Unreachable {
        name: name.to_string(),
        detail: last_error,
    })
}

/// Size of a regular file or block device.
pub(super) fn path_size(path: &Path) -> Result<u64, TargetError> {
    let meta = fs::metadata(path).map_err(|_| TargetError::NoSuchPath(path.to_path_buf()))?;
    if meta.is_file() {
        return Ok(meta.len());
    }
    if meta.file_type().is_block_device() {
        let mut f =
            fs::File::open(path).map_err(io_err(format!("cannot open {}", path.display())))?;
        return f
            .seek(SeekFrom::End(0))
            .map_err(io_err(format!("cannot size {}", path.display())));
    }
    Err(TargetError::NotFileOrDevice(path.to_path_buf()))
}

/// Refuses a block device that is mounted (by device number).
pub(super) fn check_not_mounted(path: &Path) -> Result<(), TargetError> {
    let Ok(meta) = fs::metadata(path) else {
        return Ok(());
    };
    if !meta.file_type().is_block_device() {
        return Ok(());
    }
    let mut mounts = String::new();
    if fs::File::open("/proc/self/mounts")
        .and_then(|mut f| f.read_to_string(&mut mounts))
        .is_err()
    {
        return Ok(());
    }
    for line in mounts.lines() {
        let mut parts = line.split_whitespace();
        let (Some(source), Some(mount)) = (parts.next(), parts.next()) else {
            continue;
        };
        if !source.starts_with('/') {
            continue;
        }
        if let Ok(m) = fs::metadata(source) {
            if m.file_type().is_block_device() && m.rdev() == meta.rdev() {
                return Err(TargetError::Mounted {
                    device: path.to_path_buf(),
                    mount: mount.to_string(),
                });
            }
        }
    }
    Ok(())
}
