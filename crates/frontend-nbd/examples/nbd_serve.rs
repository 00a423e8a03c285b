//! Serves one freshly formatted store over NBD, for trying the frontend with
//! real clients (nbdinfo, nbdsh, qemu-img, fio) without the full `basalt`
//! binary.
//!
//! usage: nbd_serve LISTEN-ADDR DATA-FILE DEVICE-MIB SECONDS VOLUME=MIB...
//!   e.g. nbd_serve 127.0.0.1:10809 /tmp/nbd.data 1024 60 vol=512
//! The data file is created (overwritten); the server stops after SECONDS.

use basalt_frontend_nbd::{Exports, NbdServer, Scope};
use basalt_store::{FileDevice, FormatOptions, Store, VolumeId};
use basalt_volume::{VolumeHandle, VolumeStats};
use std::collections::BTreeMap;
use std::sync::Arc;

struct StoreExports {
    store: Arc<Store>,
    volumes: BTreeMap<String, (VolumeId, Arc<VolumeStats>)>,
}

impl Exports for StoreExports {
    fn list(&self, _scope: &Scope) -> Vec<String> {
        self.volumes.keys().cloned().collect()
    }

    fn open(&self, _scope: &Scope, name: &str) -> Option<VolumeHandle> {
        let (id, stats) = self.volumes.get(name)?;
        let local = self.store.volume(*id).ok()?;
        Some(VolumeHandle::new(local, name.to_owned(), Arc::clone(stats)))
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let args: Vec<String> = std::env::args().collect();
    let [_, listen, path, device_mib, seconds, volumes @ ..] = args.as_slice() else {
        return Err(
            "usage: nbd_serve LISTEN-ADDR DATA-FILE DEVICE-MIB SECONDS VOLUME=MIB...".into(),
        );
    };
    let device = FileDevice::create(path.as_ref(), device_mib.parse::<u64>()? << 20, false)?;
    let store = Store::create(device, &FormatOptions::default())?;
    let mut exports = StoreExports {
        store: Arc::clone(&store),
        volumes: BTreeMap::new(),
    };
    for spec in volumes {
        let (name, mib) = spec.split_once('=').ok_or("volume spec is NAME=MIB")?;
        let id = uuid::Uuid::new_v4();
        store.create_volume(id, mib.parse::<u64>()? << 20)?;
        exports
            .volumes
            .insert(name.to_owned(), (id, Arc::new(VolumeStats::default())));
    }
    let server = NbdServer::start(listen.parse()?, Arc::new(exports))?;
    std::thread::sleep(std::time::Duration::from_secs(seconds.parse()?));
    server.shutdown();
    store.close()?;
    Ok(())
}
