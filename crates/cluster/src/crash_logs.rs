//! The replicas' crash-safe copies of their uncertain-region logs.
//!
//! Job: keep, per local replica, the copy the replication state machine
//! asks to save (`DiskOp::SaveLogs`, see `basalt_replication::Config::
//! crash_log_regions`) in a file of its own under the data directory, and
//! hand it back at the next start when there is no clean stop's save. A
//! node that crashed (SIGKILL, power loss) is then resynced after a
//! failover only in the regions the copy names, not in full.
//!
//! Invariants:
//! - a save is durable when `save` returns: written to a temporary file,
//!   synced, renamed over the previous copy, directory synced; a crash at
//!   any point leaves the previous copy or the new one, whole;
//! - a copy is used only with the store it was written for (same store id)
//!   and only for a local replica that existed when the node started (the
//!   caller checks), so a fresh copy never inherits an old one's file;
//! - every region of a crash-saved log is at vseq `u64::MAX` (the state
//!   machine saves them so), which is why the file keeps regions only.

use crate::saved_logs::{replace_file, sync_dir};
use basalt_replication::{SavedLog, SavedLogs, VolumeId};
use serde::{Deserialize, Serialize};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

const DIR: &str = "replication-logs";
const FORMAT: u32 = 1;

#[derive(Serialize, Deserialize)]
struct CrashFile {
    format: u32,
    store: uuid::Uuid,
    current: Option<CrashLog>,
    previous: Option<CrashLog>,
}

/// A `SavedLog` whose entries are all at vseq `u64::MAX`, so only their
/// regions are written.
#[derive(Serialize, Deserialize)]
struct CrashLog {
    #[serde(flatten)]
    log: SavedLog,
    region_ids: Vec<u32>,
}

impl From<&SavedLog> for CrashLog {
    fn from(l: &SavedLog) -> Self {
        CrashLog {
            region_ids: l.regions.iter().map(|(r, _)| *r).collect(),
            log: SavedLog {
                regions: Vec::new(),
                ..l.clone()
            },
        }
    }
}

impl From<CrashLog> for SavedLog {
    fn from(c: CrashLog) -> Self {
        SavedLog {
            regions: c.region_ids.into_iter().map(|r| (r, u64::MAX)).collect(),
            ..c.log
        }
    }
}

fn file_name(vol: VolumeId) -> String {
    format!("{}.json", uuid::Uuid::from_u128(vol.0))
}

fn path(dir: &Path, vol: VolumeId) -> PathBuf {
    dir.join(DIR).join(file_name(vol))
}

/// Makes `logs` the crash-safe copy of `vol`'s logs (durable on return).
pub(crate) fn save(
    dir: &Path,
    store: uuid::Uuid,
    vol: VolumeId,
    logs: &SavedLogs,
) -> io::Result<()> {
    let file = CrashFile {
        format: FORMAT,
        store,
        current: logs.current.as_ref().map(CrashLog::from),
        previous: logs.previous.as_ref().map(CrashLog::from),
    };
    let bytes = serde_json::to_vec(&file).map_err(io::Error::other)?;
    let logs_dir = dir.join(DIR);
    if !logs_dir.is_dir() {
        fs::create_dir_all(&logs_dir)?;
        sync_dir(dir)?;
    }
    replace_file(&logs_dir, &file_name(vol), &bytes)
}

/// The crash-safe copy of `vol`'s logs, if there is a usable one.
pub(crate) fn load(dir: &Path, store: uuid::Uuid, vol: VolumeId) -> Option<SavedLogs> {
    let p = path(dir, vol);
    let bytes = match fs::read(&p) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::warn!(path = %p.display(), error = %e, "cannot read the replica's crash-safe log copy; it will be copied in full after a failover");
            return None;
        }
    };
    let file: CrashFile = match serde_json::from_slice(&bytes) {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(path = %p.display(), error = %e, "the replica's crash-safe log copy is unreadable; not used");
            return None;
        }
    };
    if file.format != FORMAT || file.store != store {
        tracing::warn!(path = %p.display(), format = file.format, saved_for = %file.store, %store,
            "the replica's crash-safe log copy is for another store or format; not used");
        return None;
    }
    Some(SavedLogs {
        current: file.current.map(SavedLog::from),
        previous: file.previous.map(SavedLog::from),
    })
}

/// Deletes `vol`'s copy, durably (before a fresh local replica of the
/// volume is created, so it can never be taken for that one's).
pub(crate) fn remove(dir: &Path, vol: VolumeId) -> io::Result<()> {
    match fs::remove_file(path(dir, vol)) {
        Ok(()) => sync_dir(&dir.join(DIR)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use basalt_replication::Epoch;

    fn logs() -> SavedLogs {
        SavedLogs {
            current: Some(SavedLog {
                epoch: Epoch(7),
                synced: u64::MAX,
                floor: 40,
                overflow: None,
                own: true,
                complete: true,
                regions: vec![(3, u64::MAX), (9, u64::MAX)],
            }),
            previous: None,
        }
    }

    #[test]
    fn a_saved_copy_loads_back_for_its_store_only() {
        let dir = tempfile::tempdir().unwrap();
        let store = uuid::Uuid::new_v4();
        let vol = VolumeId(42);
        assert_eq!(load(dir.path(), store, vol), None);
        save(dir.path(), store, vol, &logs()).unwrap();
        assert_eq!(load(dir.path(), store, vol), Some(logs()));
        assert_eq!(
            load(dir.path(), uuid::Uuid::new_v4(), vol),
            None,
            "another store"
        );
        assert_eq!(
            load(dir.path(), store, VolumeId(43)),
            None,
            "another volume"
        );
        // A newer save replaces it whole.
        let mut newer = logs();
        newer.previous = newer.current.take();
        save(dir.path(), store, vol, &newer).unwrap();
        assert_eq!(load(dir.path(), store, vol), Some(newer));
        remove(dir.path(), vol).unwrap();
        assert_eq!(load(dir.path(), store, vol), None);
        remove(dir.path(), vol).unwrap();
    }
}
