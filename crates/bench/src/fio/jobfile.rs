//! fio job files: one `JobSpec` (what to measure) on one target (how fio
//! reaches it) as the text of a job file. Pure.
//!
//! Invariants:
//! - Every job file sets `group_reporting=1` (one result per cell, however
//!   many jobs) and `lat_percentiles=1` (percentiles of total latency).
//! - Options that only mean something for files (`direct`, `invalidate`,
//!   `fsync_on_close`) are left out on NBD, where fio's nbd engine has no
//!   page cache and no file descriptor to apply them to.
//! - The synchronous engine is `sync` on files; on NBD, which fio reaches
//!   only through its nbd engine, it is the nbd engine with iodepth 1 (one
//!   I/O in flight, as with `sync`).
//! - A value that could break the job file's syntax (a newline) is refused;
//!   `:` in file names is escaped (fio splits file names at `:`).

use crate::profiles::{Duration, EngineKind, JobSpec};
use std::fmt::Write as _;
use std::path::PathBuf;

/// How fio reaches a target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetIo {
    /// An NBD export, through fio's nbd engine (libnbd).
    Nbd { uri: String },
    /// A file or block device, with O_DIRECT.
    File { path: PathBuf, engine: FileEngine },
}

/// The asynchronous engine used on files and block devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileEngine {
    IoUring,
    Libaio,
}

impl FileEngine {
    pub fn name(self) -> &'static str {
        match self {
            FileEngine::IoUring => "io_uring",
            FileEngine::Libaio => "libaio",
        }
    }
}

impl TargetIo {
    /// The fio engine a job of this kind uses on this target.
    pub fn engine(&self, kind: EngineKind) -> &'static str {
        match (self, kind) {
            (TargetIo::Nbd { .. }, _) => "nbd",
            (TargetIo::File { .. }, EngineKind::Sync) => "sync",
            (TargetIo::File { engine, .. }, EngineKind::Async) => engine.name(),
        }
    }

    fn is_nbd(&self) -> bool {
        matches!(self, TargetIo::Nbd { .. })
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum JobFileError {
    #[error("{what} {value:?} contains a line break, which a fio job file cannot hold")]
    LineBreak { what: &'static str, value: String },
}

const FILE_ONLY_OPTIONS: &[&str] = &["direct", "invalidate", "fsync_on_close"];

fn checked<'a>(what: &'static str, value: &'a str) -> Result<&'a str, JobFileError> {
    if value.contains(['\n', '\r']) {
        return Err(JobFileError::LineBreak {
            what,
            value: value.to_string(),
        });
    }
    Ok(value)
}

/// The lines that point fio at the target.
fn target_lines(out: &mut String, target: &TargetIo, kind: EngineKind) -> Result<(), JobFileError> {
    let _ = writeln!(out, "ioengine={}", target.engine(kind));
    match target {
        TargetIo::Nbd { uri } => {
            let _ = writeln!(out, "uri={}", checked("NBD URI", uri)?);
        }
        TargetIo::File { path, .. } => {
            let name = path.to_string_lossy();
            let name = checked("file name", &name)?.replace(':', "\\:");
            let _ = writeln!(out, "filename={name}");
        }
    }
    Ok(())
}

/// The job file of `job` on `target`. `name` names the job (the cell id);
/// `target_size` (bytes), when known, caps a sized job; `comment` goes on
/// the first line.
pub fn render(
    job: &JobSpec,
    name: &str,
    target: &TargetIo,
    target_size: Option<u64>,
    comment: &str,
) -> Result<String, JobFileError> {
    let w = &job.workload;
    let mut out = String::new();
    let _ = writeln!(out, "; {}", checked("comment", comment)?);
    out.push_str("[global]\n");
    target_lines(&mut out, target, job.engine)?;
    let _ = writeln!(out, "rw={}", checked("rw", &w.rw)?);
    if let Some(mix) = w.rwmixread {
        let _ = writeln!(out, "rwmixread={mix}");
    }
    let _ = writeln!(out, "bs={}", w.block_size_bytes);
    let _ = writeln!(out, "numjobs={}", w.numjobs);
    let iodepth = if job.engine == EngineKind::Sync {
        1
    } else {
        w.iodepth
    };
    let _ = writeln!(out, "iodepth={iodepth}");
    if let Some(n) = w.fsync {
        let _ = writeln!(out, "fsync={n}");
    }
    match job.duration {
        Duration::TimeBased {
            runtime_secs,
            ramp_secs,
        } => {
            let _ = writeln!(out, "time_based=1\nruntime={runtime_secs}");
            if ramp_secs > 0 {
                let _ = writeln!(out, "ramp_time={ramp_secs}");
            }
        }
        Duration::Sized { bytes } => {
            let bytes = target_size.map_or(bytes, |t| bytes.min(t));
            let _ = writeln!(out, "size={bytes}");
        }
        Duration::WholeTarget => {}
    }
    if job.region_per_job && w.numjobs > 1 {
        let percent = 100 / w.numjobs.min(100);
        let _ = writeln!(out, "size={percent}%\noffset_increment={percent}%");
    }
    for (key, value) in &job.options {
        if target.is_nbd() && FILE_ONLY_OPTIONS.contains(key) {
            continue;
        }
        let _ = writeln!(out, "{key}={}", checked("option", value)?);
    }
    out.push_str("group_reporting=1\nlat_percentiles=1\n");
    let _ = writeln!(out, "\n[{}]", checked("job name", name)?);
    Ok(out)
}

/// A 4 KiB read at offset 0: checks that fio can reach the target with
/// this engine.
pub fn probe(target: &TargetIo) -> Result<String, JobFileError> {
    let mut out = String::from("; basalt bench: can fio reach the target?\n[global]\n");
    target_lines(&mut out, target, EngineKind::Async)?;
    if !target.is_nbd() {
        out.push_str("direct=1\n");
    }
    out.push_str("rw=read\nbs=4096\nsize=4096\nnumjobs=1\niodepth=1\n\n[probe]\n");
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profiles::{expand, Plan, Profile, ProfileOptions};

    fn nbd() -> TargetIo {
        TargetIo::Nbd {
            uri: "nbd://127.0.0.1:10809/bench".into(),
        }
    }

    fn file() -> TargetIo {
        TargetIo::File {
            path: "/var/tmp/a:b.img".into(),
            engine: FileEngine::IoUring,
        }
    }

    fn lines(text: &str) -> Vec<&str> {
        text.lines().collect()
    }

    fn first_cell(profile: Profile) -> crate::profiles::CellSpec {
        expand(profile, &ProfileOptions::default()).unwrap().cells[0].clone()
    }

    #[test]
    fn matrix_cell_on_nbd() {
        let cell = first_cell(Profile::Matrix);
        let text = render(&cell.job, &cell.id, &nbd(), Some(1 << 30), "matrix").unwrap();
        assert_eq!(
            lines(&text),
            [
                "; matrix",
                "[global]",
                "ioengine=nbd",
                "uri=nbd://127.0.0.1:10809/bench",
                "rw=randread",
                "bs=4096",
                "numjobs=1",
                "iodepth=1",
                "time_based=1",
                "runtime=120",
                "ramp_time=5",
                "norandommap=1",
                "randrepeat=0",
                "group_reporting=1",
                "lat_percentiles=1",
                "",
                "[randread-4k-j1-qd1]",
            ]
        );
    }

    #[test]
    fn matrix_cell_on_a_file_is_direct_and_escaped() {
        let cell = first_cell(Profile::Matrix);
        let text = render(&cell.job, &cell.id, &file(), None, "c").unwrap();
        assert!(
            text.contains("ioengine=io_uring\nfilename=/var/tmp/a\\:b.img\n"),
            "{text}"
        );
        assert!(text.contains("\ndirect=1\n"), "{text}");
    }

    #[test]
    fn db_latency_fsyncs_every_write() {
        let cell = first_cell(Profile::DbLatency);
        for target in [nbd(), file()] {
            let text = render(&cell.job, &cell.id, &target, None, "c").unwrap();
            assert!(
                text.contains("\nrw=randwrite\nbs=8192\nnumjobs=1\niodepth=1\nfsync=1\n"),
                "{text}"
            );
        }
    }

    #[test]
    fn fio_samples_sync_engine_and_nbd_deviation() {
        let cell = first_cell(Profile::FioSamples);
        let text = render(&cell.job, &cell.id, &file(), Some(4 << 30), "c").unwrap();
        assert!(text.contains("ioengine=sync\n"), "{text}");
        assert!(text.contains("size=1073741824\n"), "{text}");
        assert!(!text.contains("time_based"), "{text}");
        assert!(
            text.contains("direct=1\nrandrepeat=0\ninvalidate=1\nverify=0\n"),
            "{text}"
        );
        let text = render(&cell.job, &cell.id, &nbd(), Some(256 << 20), "c").unwrap();
        assert!(text.contains("ioengine=nbd\n"), "{text}");
        assert!(text.contains("iodepth=1\n"), "{text}");
        assert!(
            text.contains("size=268435456\n"),
            "capped at the target: {text}"
        );
        assert!(!text.contains("direct="), "{text}");
        assert!(!text.contains("invalidate="), "{text}");
    }

    #[test]
    fn parallel_gives_each_job_a_region() {
        let plan = expand(Profile::Parallel, &ProfileOptions::default()).unwrap();
        let ten = plan
            .cells
            .iter()
            .find(|c| c.job.workload.numjobs == 10)
            .unwrap();
        let text = render(&ten.job, &ten.id, &nbd(), None, "c").unwrap();
        assert!(text.contains("size=10%\noffset_increment=10%\n"), "{text}");
        assert!(text.contains("rwmixread=50\n"), "{text}");
        let one = &plan.cells[0];
        let text = render(&one.job, &one.id, &nbd(), None, "c").unwrap();
        assert!(!text.contains("offset_increment"), "{text}");
    }

    #[test]
    fn precondition_fills_the_whole_target() {
        let text = render(
            &Plan::precondition_job(),
            "precondition",
            &file(),
            None,
            "c",
        )
        .unwrap();
        assert!(
            text.contains("rw=write\nbs=1048576\nnumjobs=1\niodepth=8\ndirect=1\n"),
            "{text}"
        );
        assert!(!text.contains("size="), "{text}");
        assert!(!text.contains("runtime="), "{text}");
    }

    #[test]
    fn line_breaks_are_refused() {
        let cell = first_cell(Profile::Matrix);
        let bad = TargetIo::Nbd {
            uri: "nbd://h/x\nexec_prerun=rm -rf /".into(),
        };
        assert!(render(&cell.job, &cell.id, &bad, None, "c").is_err());
        assert!(probe(&bad).is_err());
    }

    #[test]
    fn probe_reads_4k() {
        let text = probe(&file()).unwrap();
        assert!(
            text.contains("direct=1\nrw=read\nbs=4096\nsize=4096\n"),
            "{text}"
        );
        let text = probe(&nbd()).unwrap();
        assert!(!text.contains("direct"), "{text}");
    }
}
