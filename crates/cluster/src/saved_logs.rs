//! The replicas' uncertain-region logs kept across a clean restart.
//!
//! Job: at a clean stop, after every replica driver stopped and the store
//! was flushed, write each replica's logs (`basalt_replication::SavedLogs`)
//! to one file in the data directory; at the next start, read it and delete
//! it before any replica driver runs. A replica that comes back with its
//! logs is resynced in its uncertain regions only after a failover, like one
//! that was merely cut off; without them it is copied in full.
//!
//! Invariants:
//! - the file is written only after the store flush that made everything
//!   the logs describe durable, atomically (temporary file, fsync, rename,
//!   directory fsync);
//! - it is used at most once: deleted (and the deletion made durable)
//!   before the logs are handed out, so a crash after this start never
//!   finds logs its disk may no longer match; if it cannot be deleted, it
//!   is not used;
//! - it is used only with the store it was written for (same store id),
//!   and only for volumes that already existed in that store.

use basalt_replication::{SavedLogs, VolumeId};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

const FILE: &str = "replication-logs.json";
const FORMAT: u32 = 1;

#[derive(Serialize, Deserialize)]
struct Saved {
    format: u32,
    store: uuid::Uuid,
    volumes: Vec<SavedVolume>,
}

#[derive(Serialize, Deserialize)]
struct SavedVolume {
    volume: uuid::Uuid,
    logs: SavedLogs,
}

fn path(dir: &Path) -> PathBuf {
    dir.join(FILE)
}

pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Replaces `dir/name` with `bytes` atomically and durably: a temporary
/// file written and synced, renamed over it, the directory synced. A crash
/// at any point leaves the old file or the new one, whole.
pub(crate) fn replace_file(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    let mut f = File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    fs::rename(&tmp, dir.join(name))?;
    sync_dir(dir)
}

/// Writes `logs` for the store `store` (call only after the store flush).
pub(crate) fn save(
    dir: &Path,
    store: uuid::Uuid,
    logs: Vec<(VolumeId, SavedLogs)>,
) -> io::Result<()> {
    let saved = Saved {
        format: FORMAT,
        store,
        volumes: logs
            .into_iter()
            .map(|(v, logs)| SavedVolume {
                volume: uuid::Uuid::from_u128(v.0),
                logs,
            })
            .collect(),
    };
    let bytes = serde_json::to_vec(&saved).map_err(io::Error::other)?;
    replace_file(dir, FILE, &bytes)
}

/// Reads and deletes the logs saved for `store`; empty if there are none
/// or they cannot be used (each reason logged).
pub(crate) fn take(dir: &Path, store: uuid::Uuid) -> HashMap<VolumeId, SavedLogs> {
    let p = path(dir);
    let bytes = match fs::read(&p) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return HashMap::new(),
        Err(e) => {
            tracing::warn!(path = %p.display(), error = %e, "cannot read the saved replication logs; replicas will be copied in full after a failover");
            return HashMap::new();
        }
    };
    if let Err(e) = fs::remove_file(&p).and_then(|()| sync_dir(dir)) {
        tracing::warn!(path = %p.display(), error = %e, "cannot delete the saved replication logs, so they are not used");
        return HashMap::new();
    }
    let saved: Saved = match serde_json::from_slice(&bytes) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(path = %p.display(), error = %e, "the saved replication logs are unreadable; not used");
            return HashMap::new();
        }
    };
    if saved.format != FORMAT || saved.store != store {
        tracing::warn!(path = %p.display(), format = saved.format, saved_for = %saved.store, %store,
            "the saved replication logs are for another store or format; not used");
        return HashMap::new();
    }
    tracing::info!(
        volumes = saved.volumes.len(),
        "restored the replication logs saved at the last clean stop"
    );
    saved
        .volumes
        .into_iter()
        .map(|v| (VolumeId(v.volume.as_u128()), v.logs))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use basalt_replication::{Epoch, SavedLog};

    fn logs(epoch: u64) -> SavedLogs {
        SavedLogs {
            current: Some(SavedLog {
                epoch: Epoch(epoch),
                synced: 7,
                floor: 3,
                overflow: None,
                regions: vec![(1, 5), (4, 6)],
                own: false,
                complete: true,
            }),
            previous: None,
        }
    }

    #[test]
    fn saved_logs_are_taken_once_and_only_for_their_store() {
        let dir = tempfile::tempdir().unwrap();
        let (store, other) = (uuid::Uuid::from_u128(1), uuid::Uuid::from_u128(2));
        save(dir.path(), store, vec![(VolumeId(9), logs(2))]).unwrap();
        let got = take(dir.path(), store);
        assert_eq!(got.get(&VolumeId(9)), Some(&logs(2)));
        assert!(take(dir.path(), store).is_empty(), "used at most once");
        assert!(!path(dir.path()).exists());

        save(dir.path(), store, vec![(VolumeId(9), logs(3))]).unwrap();
        assert!(take(dir.path(), other).is_empty(), "another store's logs");
        assert!(!path(dir.path()).exists(), "deleted even when not used");

        fs::write(path(dir.path()), b"{not json").unwrap();
        assert!(take(dir.path(), store).is_empty());
    }
}
