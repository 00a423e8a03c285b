//! `basalt snapshot …`: snapshots of volumes, addressed as `VOLUME@SNAPSHOT`
//! the way Ceph's `rbd snap` does. One REST call each, printed as a table
//! or key/value block, or as the API's JSON with `--output json`.

use crate::client::{ApiClient, ClientArgs, Output};
use crate::commands::{bytes_and_human, decode, path_segment, print_json, volume_path};
use crate::output::{fields, table, Align};
use anyhow::{anyhow, Result};
use basalt_api::types::{Snapshot, SnapshotList};
use basalt_volume::format_size;
use clap::Subcommand;
use serde_json::json;

#[derive(Subcommand, Debug)]
pub enum SnapshotCommand {
    /// Take a snapshot of a volume: instant, crash-consistent, read-only.
    /// It is served over NBD as the export VOLUME@SNAPSHOT.
    Create {
        volume: String,
        /// Snapshot name: the rules of volume names.
        name: String,
    },
    /// List snapshots, of one volume or of all.
    List { volume: Option<String> },
    /// Show one snapshot, with the space it holds.
    Show {
        #[arg(value_name = "VOLUME@SNAPSHOT")]
        snapshot: String,
    },
    /// Delete a snapshot, freeing the blocks no other layer needs (refused
    /// while it has clones or connections).
    Delete {
        #[arg(value_name = "VOLUME@SNAPSHOT")]
        snapshot: String,
    },
    /// Let an NVMe/TCP host read a snapshot, as its own write-protected
    /// subsystem (e.g. a backup host).
    Attach {
        #[arg(value_name = "VOLUME@SNAPSHOT")]
        snapshot: String,
        /// The host's NQN, e.g. the content of /etc/nvme/hostnqn.
        #[arg(long = "host-nqn", value_name = "NQN")]
        host_nqn: String,
    },
    /// Revoke an NVMe/TCP host's access to a snapshot.
    Detach {
        #[arg(value_name = "VOLUME@SNAPSHOT")]
        snapshot: String,
        #[arg(long = "host-nqn", value_name = "NQN")]
        host_nqn: String,
    },
}

/// Splits `VOLUME@SNAPSHOT`, or says what was expected.
fn split(full: &str) -> Result<(&str, &str)> {
    full.split_once('@')
        .filter(|(v, s)| !v.is_empty() && !s.is_empty())
        .ok_or_else(|| anyhow!("{full:?} is not VOLUME@SNAPSHOT"))
}

fn snapshot_path(volume: &str, name: &str) -> String {
    format!("{}/snapshots/{}", volume_path(volume), path_segment(name))
}

fn snapshot_fields(s: &Snapshot, api: &ApiClient) -> String {
    let mut pairs = vec![
        ("name", format!("{}@{}", s.volume, s.name)),
        ("id", s.id.to_string()),
        ("size", bytes_and_human(s.size_bytes)),
        ("written", format_size(s.written_bytes)),
        ("exclusive", format_size(s.exclusive_bytes)),
        ("created", s.created_at.clone()),
        ("connections", s.open_connections.to_string()),
    ];
    if !s.clones.is_empty() {
        pairs.push(("clones", s.clones.join(", ")));
    }
    if !s.nvme_hosts.is_empty() {
        pairs.push(("nvme hosts", s.nvme_hosts.join(", ")));
    }
    if s.encrypted {
        pairs.push(("encrypted", "yes (AES-256-XTS)".into()));
    }
    if let Some(server) = &api.server {
        let export = format!("{}@{}", s.volume, s.name);
        pairs.extend(
            server
                .nbd_uris(&export)
                .map(|uri| ("nbd", format!("{uri} (read-only)"))),
        );
    }
    fields(&pairs)
}

pub fn run_snapshot(command: SnapshotCommand, client: &ClientArgs) -> Result<()> {
    let api = ApiClient::discover(client)?;
    match command {
        SnapshotCommand::Create { volume, name } => {
            let value = api.post(
                &format!("{}/snapshots", volume_path(&volume)),
                json!({ "name": name }),
            )?;
            if client.output == Output::Json {
                return print_json(&value);
            }
            let s: Snapshot = decode(value)?;
            println!("created snapshot {}@{}", s.volume, s.name);
            print!("{}", snapshot_fields(&s, &api));
        }
        SnapshotCommand::List { volume } => {
            let path = match &volume {
                Some(v) => format!("{}/snapshots", volume_path(v)),
                None => "/api/v1/snapshots".to_string(),
            };
            let value = api.get(&path)?;
            if client.output == Output::Json {
                return print_json(&value);
            }
            let list: SnapshotList = decode(value)?;
            let rows: Vec<Vec<String>> = list
                .snapshots
                .iter()
                .map(|s| {
                    vec![
                        format!("{}@{}", s.volume, s.name),
                        format_size(s.size_bytes),
                        format_size(s.written_bytes),
                        format_size(s.exclusive_bytes),
                        s.clones.len().to_string(),
                        s.created_at.clone(),
                    ]
                })
                .collect();
            print!(
                "{}",
                table(
                    &[
                        ("SNAPSHOT", Align::Left),
                        ("SIZE", Align::Right),
                        ("WRITTEN", Align::Right),
                        ("EXCLUSIVE", Align::Right),
                        ("CLONES", Align::Right),
                        ("CREATED", Align::Left),
                    ],
                    &rows,
                )
            );
        }
        SnapshotCommand::Show { snapshot } => {
            let (volume, name) = split(&snapshot)?;
            let value = api.get(&snapshot_path(volume, name))?;
            if client.output == Output::Json {
                return print_json(&value);
            }
            print!("{}", snapshot_fields(&decode(value)?, &api));
        }
        SnapshotCommand::Attach { snapshot, host_nqn } => {
            let (volume, name) = split(&snapshot)?;
            let value = api.post(
                &format!("{}/nvme-hosts", snapshot_path(volume, name)),
                json!({ "host_nqn": host_nqn }),
            )?;
            if client.output == Output::Json {
                return print_json(&value);
            }
            println!(
                "host {host_nqn} may read {snapshot} over NVMe/TCP as {} (write protected)",
                basalt_frontend_nvme::subsystem_nqn(&snapshot)
            );
        }
        SnapshotCommand::Detach { snapshot, host_nqn } => {
            let (volume, name) = split(&snapshot)?;
            let value = api.delete(&format!(
                "{}/nvme-hosts/{}",
                snapshot_path(volume, name),
                path_segment(&host_nqn)
            ))?;
            if client.output == Output::Json {
                return print_json(&value);
            }
            println!("host {host_nqn} detached from snapshot {snapshot}");
        }
        SnapshotCommand::Delete { snapshot } => {
            let (volume, name) = split(&snapshot)?;
            let value = api.delete(&snapshot_path(volume, name))?;
            if client.output == Output::Json {
                return print_json(&value);
            }
            println!("deleted snapshot {volume}@{name}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn snapshot_names_split_at_the_at_sign() {
        assert_eq!(split("vol@s1").unwrap(), ("vol", "s1"));
        for bad in ["vol", "@s", "vol@", ""] {
            assert!(split(bad).is_err(), "{bad}");
        }
    }
}
