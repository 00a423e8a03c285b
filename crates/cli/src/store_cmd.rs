//! `basalt store …`: offline operations on a node's store, with no server
//! running. `upgrade` rewrites a version-1 store as version 2 in place
//! (the server also does it at start; `--dry-run` only reports); `check`
//! recovers the store if it was not closed cleanly, then verifies it.

use crate::datadir::DataDir;
use anyhow::{bail, Context, Result};
use basalt_store::{inspect, FileDevice, OpenOptions, Store};
use clap::Subcommand;
use std::path::Path;

#[derive(Subcommand, Debug)]
pub enum StoreCommand {
    /// Upgrade the store's on-disk format to the one this build writes.
    Upgrade {
        /// Report what the upgrade would do, and change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Recover the store if needed, then check its consistency: every
    /// extent in exactly one place, free extents reading as zeros.
    Check,
}

pub fn run(command: StoreCommand, data_dir: &Path) -> Result<()> {
    let data = DataDir::new(data_dir);
    let Some(node) = data.read_node()? else {
        bail!(
            "{} holds no node (no node.json): nothing to upgrade",
            data.root().display()
        );
    };
    if data.read_server()?.is_some() {
        bail!(
            "{} exists: a server is running on this data directory (or was killed); stop it \
             first — starting the server also upgrades the store",
            data.server_json().display()
        );
    }
    let path = node.backing.path();
    let device =
        FileDevice::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let info = inspect(device.as_ref())
        .with_context(|| format!("cannot read the store on {}", path.display()))?;
    let dry_run = match command {
        StoreCommand::Upgrade { dry_run } => dry_run,
        StoreCommand::Check => return check(device, path),
    };
    println!(
        "store {} on {}: format version {}, {} volume(s), {} capacity, {}",
        info.store_id,
        path.display(),
        info.version,
        info.volumes,
        basalt_volume::format_size(info.capacity_bytes),
        if info.clean {
            "closed cleanly"
        } else {
            "not closed cleanly (recovered at open)"
        }
    );
    if info.upgrade_pages == 0 {
        println!(
            "already at format version {}: nothing to do",
            basalt_store::format::FORMAT_VERSION
        );
        return Ok(());
    }
    println!(
        "upgrade to version {}: rewrites {} table pages ({}) in place; data extents do not move",
        basalt_store::format::FORMAT_VERSION,
        info.upgrade_pages,
        basalt_volume::format_size(info.upgrade_pages * 4096)
    );
    if dry_run {
        println!("dry run: nothing written");
        return Ok(());
    }
    let store = Store::open_with(
        device,
        &OpenOptions {
            background_zeroing: false,
            ..Default::default()
        },
    )
    .with_context(|| format!("cannot upgrade the store on {}", path.display()))?;
    let zeroed = store.zero_freed().context("cannot zero freed extents")?;
    store.close().context("cannot close the upgraded store")?;
    println!(
        "upgraded to format version {} ({} free extent(s) zeroed)",
        basalt_store::format::FORMAT_VERSION,
        zeroed
    );
    Ok(())
}

fn check(device: std::sync::Arc<FileDevice>, path: &Path) -> Result<()> {
    let store = Store::open_with(
        device,
        &OpenOptions {
            background_zeroing: false,
            ..Default::default()
        },
    )
    .with_context(|| format!("cannot open the store on {}", path.display()))?;
    let recovery = store.recovery().clone();
    let zeroed = store.zero_freed().context("cannot zero freed extents")?;
    let report = store.check();
    let closed = store.close().context("cannot close the store");
    let report =
        report.with_context(|| format!("the store on {} is inconsistent", path.display()))?;
    closed?;
    let mut state = vec![if recovery.unclean {
        "recovered (it was not closed cleanly)"
    } else {
        "closed cleanly"
    }];
    if recovery.upgraded_from_v1 {
        state.push("upgraded from format version 1");
    }
    println!(
        "store {} on {}: {}",
        store.store_id(),
        path.display(),
        state.join(", ")
    );
    println!(
        "extents: {} mapped, {} free, {} zeroed now; journal entries replayed: {}",
        report.mapped_extents, report.free_extents, zeroed, recovery.replayed_entries
    );
    let quarantined = recovery.quarantined_extents + recovery.quarantined_slots;
    if quarantined > 0 {
        println!(
            "quarantined: {} extent and {} volume table entries failed their checksum (set aside; the log names them)",
            recovery.quarantined_extents, recovery.quarantined_slots
        );
    }
    println!("consistent");
    Ok(())
}
