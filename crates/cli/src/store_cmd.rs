//! `basalt store …`: offline operations on a node's store, with no server
//! running. `upgrade` rewrites a version-1 store as version 2 in place
//! (the server also does it at start); `--dry-run` only reports.

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
    let StoreCommand::Upgrade { dry_run } = command;
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
