//! The client commands (`basalt volume …`, `basalt status`): one REST call
//! each, printed as a table or key/value block, or as the API's JSON with
//! `--output json`.

use crate::client::{ApiClient, ClientArgs, Output};
use crate::output::{fields, table, Align};
use crate::windows::{compact, flatten, scrub, walk_flatten};
use anyhow::{anyhow, bail, Context, Result};
use basalt_api::types::{
    AttachedHost, AttachedInitiator, Node, NodeList, Status, Volume, VolumeList,
};
use basalt_volume::qos::QosSpec;
use basalt_volume::{format_size, parse_size};
use clap::Subcommand;
use serde_json::{json, Value};

#[derive(Subcommand, Debug)]
pub enum VolumeCommand {
    /// Create a thin-provisioned volume, empty or as a clone of a snapshot.
    Create {
        /// Volume name: 1-64 of A-Z a-z 0-9 . _ - (not starting with . or -).
        name: String,
        /// Size, e.g. 10G, 512M, 1.5T or bytes (a multiple of 4096);
        /// required unless --from (then: at least the snapshot's).
        #[arg(long, allow_hyphen_values = true, required_unless_present = "from")]
        size: Option<String>,
        /// Create it as a clone of VOLUME@SNAPSHOT, or of VOLUME (a snapshot
        /// named clone-NAME is taken first): instant, copy-on-write.
        #[arg(long, value_name = "VOLUME[@SNAPSHOT]")]
        from: Option<String>,
        /// Copies kept on distinct nodes of a cluster, 1-5 (default: 3, or
        /// the node count if smaller).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=5))]
        replicas: Option<u32>,
        /// Accept more replicas than the cluster has nodes: the volume is
        /// placed on the nodes there are, with the write quorum it would
        /// have at full strength capped at that (the refusal without this
        /// flag says what that costs).
        #[arg(long)]
        allow_degraded: bool,
        /// Volume type: its replica count (unless --replicas) and QoS
        /// limits (default: the default type, if one is set).
        #[arg(long = "type", value_name = "TYPE")]
        volume_type: Option<String>,
        /// Project it belongs to (with a cluster-admin token; a project
        /// token's volumes always belong to its project).
        #[arg(long)]
        project: Option<String>,
        /// Encrypt its data at rest (AES-256-XTS, a data key of its own
        /// wrapped by the server's master key: basalt server
        /// --master-key-file). A clone is encrypted exactly when its source
        /// is.
        #[arg(long, conflicts_with = "from")]
        encrypted: bool,
        /// Keep its cold data compressed: lz4, zstd, zstd:LEVEL (1-19) or
        /// off (default: its volume type's; a clone's: its source's). Data
        /// is compressed once it has gone cold, or now by `volume compact`.
        #[arg(long, value_name = "CODEC")]
        compression: Option<String>,
    },
    /// Give a volume another volume type's policies, online (QoS at once,
    /// compression from its next compaction, replica count through the
    /// cluster's placement). Between an encrypted and a plain type, the
    /// volume is re-encrypted online, with a progress bar (new writes are
    /// under the new key at once; its snapshots keep theirs).
    Retype {
        name: String,
        #[arg(value_name = "TYPE")]
        volume_type: String,
        /// Re-encryption: most bytes resealed per second, e.g. 64M
        /// (default: as fast as the disk allows; client I/O goes on).
        #[arg(long)]
        rate: Option<String>,
    },
    /// List volumes.
    List,
    /// Show one volume.
    Show { name: String },
    /// Change a volume's size, online (a replicated volume only grows).
    Resize {
        /// Volume name: 1-64 of A-Z a-z 0-9 . _ - (not starting with . or -).
        name: String,
        /// New size, e.g. 20G.
        #[arg(long, allow_hyphen_values = true)]
        size: String,
        /// Allow a smaller size; the data beyond it is lost (single node
        /// only: a replicated volume never shrinks).
        #[arg(long)]
        allow_shrink: bool,
    },
    /// Delete a volume and its data (refused while clients are connected,
    /// unless --force).
    Delete {
        name: String,
        /// Disconnect the volume's clients on this node first (as `volume
        /// disconnect`), then delete.
        #[arg(long)]
        force: bool,
    },
    /// Make a volume hold exactly what one of its snapshots holds (size
    /// included); what was written since is lost. Refused while clients
    /// are connected, unless --force.
    Rollback {
        name: String,
        /// The snapshot to return to (its name, or VOLUME@SNAPSHOT).
        #[arg(long = "to", value_name = "SNAPSHOT")]
        to: String,
        /// Disconnect the volume's clients on this node first.
        #[arg(long)]
        force: bool,
    },
    /// Copy into a clone every block it still reads from its source
    /// snapshot, online, then detach it (the source can then be deleted).
    Flatten {
        name: String,
        /// Most bytes copied per second, e.g. 64M (default: as fast as the
        /// disk allows; client I/O goes on meanwhile).
        #[arg(long)]
        rate: Option<String>,
    },
    /// Create a volume from a disk image (raw or qcow2), streamed over NBD;
    /// holes stay holes and blocks of zeros are not written.
    Import {
        /// The new volume's name.
        name: String,
        file: std::path::PathBuf,
        /// raw, qcow2, or auto (from the file's first bytes).
        #[arg(long, default_value = "auto")]
        format: String,
        /// Volume size (default: the image's, rounded up to 4 KiB).
        #[arg(long)]
        size: Option<String>,
        #[arg(long = "type", value_name = "TYPE")]
        volume_type: Option<String>,
        #[arg(long)]
        project: Option<String>,
        /// Copies kept on distinct nodes of a cluster, 1-5.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=5))]
        replicas: Option<u32>,
        /// Encrypt its data at rest (as `volume create --encrypted`): the
        /// image's bytes reach the disk only as ciphertext.
        #[arg(long)]
        encrypted: bool,
        /// Keep its cold data compressed: lz4, zstd, zstd:LEVEL (1-19) or
        /// off (as `volume create --compression`; default: its type's).
        #[arg(long, value_name = "CODEC")]
        compression: Option<String>,
        #[command(flatten)]
        nbd: crate::transfer::NbdArgs,
    },
    /// Write a volume or snapshot to a disk image (raw or qcow2), streamed
    /// over NBD; holes stay holes.
    Export {
        #[arg(value_name = "VOLUME[@SNAPSHOT]")]
        source: String,
        file: std::path::PathBuf,
        /// raw or qcow2 (default: qcow2 for a .qcow2 file, else raw).
        #[arg(long)]
        format: Option<String>,
        /// Overwrite FILE if it exists.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        nbd: crate::transfer::NbdArgs,
    },
    /// List the byte ranges that may differ between a snapshot and a later
    /// snapshot or the volume now (found from the layers, no data read).
    Diff {
        /// The older side: VOLUME@SNAPSHOT (or VOLUME: every range with data).
        #[arg(value_name = "VOLUME@SNAPSHOT")]
        from: String,
        /// The newer side (default: FROM's volume now).
        #[arg(value_name = "VOLUME[@SNAPSHOT]")]
        to: Option<String>,
    },
    /// Write the changes of VOLUME[@SNAPSHOT] since --from-snap (or all its
    /// data) as a checksummed stream that import-diff applies elsewhere.
    ExportDiff {
        #[arg(value_name = "VOLUME[@SNAPSHOT]")]
        source: String,
        /// The stream's file, or - for standard output.
        file: std::path::PathBuf,
        /// The snapshot the diff starts from: SNAPSHOT of the same volume or
        /// VOLUME@SNAPSHOT (e.g. a clone's source).
        #[arg(long, value_name = "SNAPSHOT")]
        from_snap: Option<String>,
        /// Overwrite FILE if it exists.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        nbd: crate::transfer::NbdArgs,
    },
    /// Apply a stream from export-diff to a volume that has the snapshot
    /// it starts from, then take the snapshot it leads to.
    ImportDiff {
        /// The stream's file, or - for standard input.
        file: std::path::PathBuf,
        volume: String,
        #[command(flatten)]
        nbd: crate::transfer::NbdArgs,
    },
    /// Close every NBD and NVMe/TCP connection this node serves a volume
    /// on; clients see the connection drop, as after a server crash (writes
    /// acknowledged with FUA or covered by a completed FLUSH stay).
    Disconnect { name: String },
    /// Set a volume's QoS limits, online, with Cinder's QoS spec keys:
    /// total_iops_sec, read_iops_sec, write_iops_sec, total_bytes_sec,
    /// read_bytes_sec, write_bytes_sec; the same with _per_gb (times the
    /// size in GiB) and _max (a burst rate, for burst_length_sec seconds);
    /// size_iops_sec. Replaces the whole spec; "none" removes every limit.
    SetQos {
        name: String,
        /// KEY=VALUE[,KEY=VALUE...], e.g. total_iops_sec=500,write_bytes_sec=50M
        /// (byte rates take K/M/G suffixes), or none.
        #[arg(value_name = "SPEC")]
        spec: String,
    },
    /// Let an NVMe/TCP host (by host NQN) or an iSCSI initiator (by IQN)
    /// discover and connect to a volume.
    #[command(group(clap::ArgGroup::new("client").required(true).args(["host_nqn", "initiator_iqn"])))]
    Attach {
        name: String,
        /// The NVMe host's NQN, e.g. the content of /etc/nvme/hostnqn.
        #[arg(long = "host-nqn", value_name = "NQN")]
        host_nqn: Option<String>,
        /// Also make the host authenticate in-band (NVMe DH-HMAC-CHAP):
        /// prints fresh secrets once, for nvme connect --dhchap-secret
        /// (and --dhchap-ctrl-secret to authenticate the target too).
        #[arg(long)]
        dhchap: bool,
        /// The iSCSI initiator's name, e.g. the InitiatorName in
        /// /etc/iscsi/initiatorname.iscsi.
        #[arg(
            long = "initiator-iqn",
            value_name = "IQN",
            conflicts_with = "host_nqn"
        )]
        initiator_iqn: Option<String>,
        /// Also make the initiator authenticate with CHAP at login: prints
        /// fresh credentials once, for iscsiadm's node.session.auth.*.
        #[arg(long)]
        chap: bool,
        /// Mutual CHAP: the target authenticates itself too (implies --chap).
        #[arg(long = "mutual-chap")]
        mutual_chap: bool,
    },
    /// Read every allocated block of this node's copy of a volume (its
    /// replica in a cluster) and check it against its checksum; lists the
    /// damaged blocks and exits non-zero if there are any.
    Scrub {
        name: String,
        /// Most bytes read per second, e.g. 64M (default: as fast as the
        /// disk allows; client I/O goes on meanwhile).
        #[arg(long)]
        rate: Option<String>,
    },
    /// Compress every extent of a compressed volume and of its snapshots
    /// now, with the volume's codec (the server's background compactor
    /// only compresses data not written for a while); a replicated volume
    /// on every replica.
    Compact {
        name: String,
        /// Most bytes compressed per second on each copy, e.g. 64M
        /// (default: as fast as it goes; client I/O goes on meanwhile).
        #[arg(long)]
        rate: Option<String>,
    },
    /// CRC32C of this node's local copy of a volume (its replica in a
    /// cluster): equal on every in-sync replica once I/O has stopped.
    #[command(name = "local-digest")]
    LocalDigest { name: String },
    /// Revoke an NVMe/TCP host's access to a volume (a connected host keeps
    /// its connection until it disconnects).
    #[command(group(clap::ArgGroup::new("client").required(true).args(["host_nqn", "initiator_iqn"])))]
    Detach {
        name: String,
        #[arg(long = "host-nqn", value_name = "NQN")]
        host_nqn: Option<String>,
        #[arg(
            long = "initiator-iqn",
            value_name = "IQN",
            conflicts_with = "host_nqn"
        )]
        initiator_iqn: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
pub enum KeyCommand {
    /// Rotate the server's master key: every encrypted volume's data key
    /// is rewrapped with a new one, which then replaces the key file (no
    /// data is rewritten).
    Rotate,
}

pub fn run_key(command: KeyCommand, client: &ClientArgs) -> Result<()> {
    let api = ApiClient::discover(client)?;
    match command {
        KeyCommand::Rotate => {
            let value = api.post("/api/v1/keys/rotate", json!({}))?;
            if client.output == Output::Json {
                return print_json(&value);
            }
            let r: basalt_api::types::KeyRotation = decode(value)?;
            println!(
                "rotated the master key: now {}, {} data key(s) rewrapped",
                r.master_key_id, r.rewrapped
            );
        }
    }
    Ok(())
}

#[derive(Subcommand, Debug)]
pub enum NodeCommand {
    /// List the cluster's nodes.
    List,
    /// Move every replica off a node, online (its volumes stay served).
    Drain { name: String },
    /// Take a node out of the cluster for good: its replicas are rebuilt on
    /// other nodes and it may not rejoin under that name.
    Remove { name: String },
    /// Make a drained node take replicas again.
    Activate { name: String },
}

/// The URL path of a volume; the name is percent-encoded so that whatever
/// was typed reaches the server as one path segment (which validates it).
pub(crate) fn volume_path(name: &str) -> String {
    format!("/api/v1/volumes/{}", path_segment(name))
}

/// `text` percent-encoded as one URL path segment.
pub(crate) fn path_segment(text: &str) -> String {
    let mut out = String::new();
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

pub(crate) fn print_json(value: &Value) -> Result<()> {
    if !value.is_null() {
        println!("{}", serde_json::to_string_pretty(value)?);
    }
    Ok(())
}

pub(crate) fn decode<T: serde::de::DeserializeOwned>(value: Value) -> Result<T> {
    serde_json::from_value(value)
        .context("the server's answer has an unexpected shape (is it a different basalt version?)")
}

pub(crate) fn bytes_and_human(bytes: u64) -> String {
    format!("{} ({bytes} bytes)", format_size(bytes))
}

fn volume_fields(volume: &Volume, client: &ApiClient) -> String {
    let mut pairs = vec![
        ("name", volume.name.clone()),
        ("id", volume.id.to_string()),
        ("size", bytes_and_human(volume.size_bytes)),
        ("allocated", format_size(volume.allocated_bytes)),
        ("connections", volume.open_connections.to_string()),
        ("created", volume.created_at.clone()),
    ];
    if !volume.connections_elsewhere.is_empty() {
        let nodes: Vec<String> = volume
            .connections_elsewhere
            .iter()
            .map(|n| format!("{}: {}", n.node, n.connections))
            .collect();
        pairs.push(("connections elsewhere", nodes.join(", ")));
    }
    if let Some(project) = &volume.project {
        pairs.push(("project", project.clone()));
    }
    if let Some(t) = &volume.volume_type {
        pairs.push(("type", t.clone()));
    }
    if volume.encrypted {
        pairs.push(("encrypted", "yes (AES-256-XTS)".into()));
    }
    pairs.push(("compression", compression_text(volume)));
    if let Some(server) = &client.server {
        pairs.extend(server.nbd_uris(&volume.name).map(|uri| ("nbd", uri)));
        if let Some(nvme) = &server.nvme {
            pairs.push(("nvme", format!("{nvme} {}", nvme_nqn(&volume.name))));
        }
        if let Some(iscsi) = &server.iscsi {
            let target = basalt_volume::iscsi_target_name(&volume.name);
            pairs.push(("iscsi", format!("{iscsi} {target}")));
        }
    }
    if !volume.nvme_hosts.is_empty() {
        let hosts: Vec<String> = volume
            .nvme_hosts
            .iter()
            .map(|h| match volume.nvme_hosts_dhchap.contains(h) {
                true => format!("{h} (DH-HMAC-CHAP)"),
                false => h.clone(),
            })
            .collect();
        pairs.push(("nvme hosts", hosts.join(", ")));
    }
    if !volume.iscsi_initiators.is_empty() {
        let initiators: Vec<String> = volume
            .iscsi_initiators
            .iter()
            .map(|i| match volume.iscsi_initiators_chap.contains(i) {
                true => format!("{i} (CHAP)"),
                false => i.clone(),
            })
            .collect();
        pairs.push(("iscsi initiators", initiators.join(", ")));
    }
    if !volume.qos.is_empty() {
        pairs.push(("qos", QosSpec(volume.qos.clone()).to_text()));
        pairs.push((
            "qos throttled",
            format!("{:.1} s waiting for admission", volume.throttled_seconds),
        ));
    }
    if let Some(source) = &volume.clone_of {
        pairs.push(("clone of", source.clone()));
    }
    if volume.reencrypting {
        pairs.push((
            "re-encrypting",
            format!(
                "to {} (new writes already are); `basalt volume flatten {}` reseals the rest",
                if volume.encrypted {
                    "encrypted"
                } else {
                    "plain"
                },
                volume.name
            ),
        ));
    }
    if let Some(f) = &volume.flatten {
        pairs.push((
            "flattening",
            format!(
                "{}% ({} of {} walked, {} copied; last window {:.0} s ago)",
                f.done_bytes.saturating_mul(100) / f.total_bytes.max(1),
                format_size(f.done_bytes),
                format_size(f.total_bytes),
                format_size(f.copied_bytes),
                f.idle_seconds
            ),
        ));
    }
    if !volume.snapshots.is_empty() {
        pairs.push(("snapshots", volume.snapshots.join(", ")));
    }
    if let Some(n) = volume.replicas_wanted {
        let placed = volume.replicas.len();
        let summary = if placed == 0 {
            format!("{n} (not placed yet)")
        } else if (placed as u32) < n {
            format!("{n} ({placed} placed: degraded)")
        } else {
            n.to_string()
        };
        pairs.push(("replicas", summary));
    }
    for r in &volume.replicas {
        let role = if r.primary { "primary" } else { "secondary" };
        let progress = match (r.resync_percent, r.resync_remaining_bytes) {
            (Some(p), Some(left)) => format!(", resyncing {p}%, {} left", format_size(left)),
            (Some(p), None) => format!(", resyncing {p}%"),
            _ => String::new(),
        };
        pairs.push((
            "replica",
            format!(
                "{} {role} {}{progress} (epoch {})",
                r.node, r.state, r.epoch
            ),
        ));
    }
    fields(&pairs)
}

/// A volume's codec and, once some of its data is packed, how much.
fn compression_text(volume: &Volume) -> String {
    let Some(codec) = &volume.compression else {
        return match volume.packed_bytes {
            0 => "off".into(),
            // Packed while it had a codec: stays packed until written.
            n => format!("off ({} still compressed)", format_size(n)),
        };
    };
    match volume.packed_bytes {
        0 => format!("{codec} (nothing compressed yet)"),
        n => format!(
            "{codec}, ratio {:.2} ({} stored in {})",
            volume.compression_ratio,
            format_size(n),
            format_size(volume.packed_stored_bytes)
        ),
    }
}

/// Logical bytes over the bytes they take compressed (1.0 for none).
pub(crate) fn ratio(logical: u64, stored: u64) -> f64 {
    basalt_volume::compression_ratio(logical, stored)
}

pub fn run_volume(command: VolumeCommand, client: &ClientArgs) -> Result<()> {
    match command {
        VolumeCommand::Create {
            name,
            size,
            from,
            replicas,
            allow_degraded,
            volume_type,
            project,
            encrypted,
            compression,
        } => {
            let size = size.as_deref().map(parse_size).transpose()?;
            let api = ApiClient::discover(client)?;
            let mut body = json!({"name": name});
            if let Some(size) = size {
                body["size"] = json!(size);
            }
            if let Some(source) = &from {
                body["from"] = json!(source);
            }
            if let Some(n) = replicas {
                body["replicas"] = json!(n);
            }
            if allow_degraded {
                body["allow_degraded"] = json!(true);
            }
            if let Some(t) = &volume_type {
                body["type"] = json!(t);
            }
            if let Some(p) = &project {
                body["project"] = json!(p);
            }
            if encrypted {
                body["encrypted"] = json!(true);
            }
            if let Some(c) = &compression {
                body["compression"] = json!(c);
            }
            let value = api.post("/api/v1/volumes", body)?;
            if client.output == Output::Json {
                return print_json(&value);
            }
            let volume: Volume = decode(value)?;
            match &volume.clone_of {
                Some(source) => println!(
                    "created volume {} ({}) as a clone of {source}",
                    volume.name,
                    format_size(volume.size_bytes)
                ),
                None => println!(
                    "created volume {} ({})",
                    volume.name,
                    format_size(volume.size_bytes)
                ),
            }
            print!("{}", volume_fields(&volume, &api));
        }
        VolumeCommand::List => {
            let api = ApiClient::discover(client)?;
            let value = api.get("/api/v1/volumes")?;
            if client.output == Output::Json {
                return print_json(&value);
            }
            let list: VolumeList = decode(value)?;
            let rows: Vec<Vec<String>> = list
                .volumes
                .iter()
                .map(|v| {
                    vec![
                        v.name.clone(),
                        format_size(v.size_bytes),
                        format_size(v.allocated_bytes),
                        v.open_connections.to_string(),
                        v.project.clone().unwrap_or_else(|| "-".into()),
                        v.volume_type.clone().unwrap_or_else(|| "-".into()),
                        v.compression.clone().unwrap_or_else(|| "-".into()),
                        v.created_at.clone(),
                    ]
                })
                .collect();
            print!(
                "{}",
                table(
                    &[
                        ("NAME", Align::Left),
                        ("SIZE", Align::Right),
                        ("ALLOCATED", Align::Right),
                        ("CONNECTIONS", Align::Right),
                        ("PROJECT", Align::Left),
                        ("TYPE", Align::Left),
                        ("COMPRESSION", Align::Left),
                        ("CREATED", Align::Left),
                    ],
                    &rows,
                )
            );
        }
        VolumeCommand::Retype {
            name,
            volume_type,
            rate,
        } => {
            let rate = rate.as_deref().map(parse_size).transpose()?;
            if rate == Some(0) {
                bail!("--rate must be more than 0");
            }
            let api = ApiClient::discover(client)?;
            let value = api.post(
                &format!("{}/retype", volume_path(&name)),
                json!({ "type": volume_type }),
            )?;
            let mut volume: Volume = decode(value.clone())?;
            if volume.reencrypting {
                let walked = walk_flatten(&api, &volume, rate, "re-encrypting", client)?;
                if !walked.detached {
                    bail!("volume {name} still reads blocks under its old key (written meanwhile?); run `basalt volume flatten {name}`");
                }
                volume = decode(api.get(&volume_path(&name))?)?;
                if client.output != Output::Json {
                    println!(
                        "re-encrypted volume {name}: resealed {}; it is {} now",
                        format_size(walked.copied_bytes),
                        if volume.encrypted {
                            "encrypted"
                        } else {
                            "not encrypted"
                        }
                    );
                }
            }
            if client.output == Output::Json {
                return print_json(&serde_json::to_value(&volume)?);
            }
            println!("volume {} retyped to {volume_type}", volume.name);
            print!("{}", volume_fields(&volume, &api));
        }
        VolumeCommand::Show { name } => {
            let api = ApiClient::discover(client)?;
            let value = api.get(&volume_path(&name))?;
            if client.output == Output::Json {
                return print_json(&value);
            }
            print!("{}", volume_fields(&decode(value)?, &api));
        }
        VolumeCommand::Resize {
            name,
            size,
            allow_shrink,
        } => {
            let size = parse_size(&size)?;
            let api = ApiClient::discover(client)?;
            let value = api.post(
                &format!("{}/resize", volume_path(&name)),
                json!({"size": size, "allow_shrink": allow_shrink}),
            )?;
            if client.output == Output::Json {
                return print_json(&value);
            }
            let volume: Volume = decode(value)?;
            println!(
                "resized volume {} to {}",
                volume.name,
                format_size(volume.size_bytes)
            );
        }
        VolumeCommand::Delete { name, force } => {
            let api = ApiClient::discover(client)?;
            let path = if force {
                format!("{}?force=true", volume_path(&name))
            } else {
                volume_path(&name)
            };
            let value = api.delete(&path)?;
            if client.output == Output::Json {
                return print_json(&value);
            }
            println!("deleted volume {name}");
        }
        VolumeCommand::Rollback { name, to, force } => {
            // `--to VOL@SNAP` names the volume again: it must be this one.
            let snapshot = match to.split_once('@') {
                Some((volume, snapshot)) if volume == name => snapshot.to_string(),
                Some((volume, _)) => {
                    bail!("--to {to} is a snapshot of {volume}, not of {name}")
                }
                None => to,
            };
            let api = ApiClient::discover(client)?;
            let value = api.post(
                &format!("{}/rollback", volume_path(&name)),
                json!({"snapshot": snapshot, "force": force}),
            )?;
            if client.output == Output::Json {
                return print_json(&value);
            }
            let volume: Volume = decode(value)?;
            println!(
                "volume {} rolled back to {}@{snapshot} ({})",
                volume.name,
                volume.name,
                format_size(volume.size_bytes)
            );
        }
        VolumeCommand::Disconnect { name } => {
            let api = ApiClient::discover(client)?;
            let value = api.post(&format!("{}/disconnect", volume_path(&name)), json!({}))?;
            if client.output == Output::Json {
                return print_json(&value);
            }
            let n = value["disconnected"].as_u64().unwrap_or(0);
            println!(
                "disconnected {n} connection{} from volume {name}",
                if n == 1 { "" } else { "s" }
            );
        }
        VolumeCommand::Scrub { name, rate } => scrub(&name, rate.as_deref(), client)?,
        VolumeCommand::Compact { name, rate } => compact(&name, rate.as_deref(), client)?,
        VolumeCommand::Flatten { name, rate } => flatten(&name, rate.as_deref(), client)?,
        VolumeCommand::Import {
            name,
            file,
            format,
            size,
            volume_type,
            project,
            replicas,
            encrypted,
            compression,
            nbd,
        } => {
            let options = crate::images::ImportOptions {
                format,
                size,
                volume_type,
                project,
                replicas,
                encrypted,
                compression,
            };
            crate::images::import(&name, &file, &options, &nbd, client)?
        }
        VolumeCommand::Export {
            source,
            file,
            format,
            force,
            nbd,
        } => crate::images::export(&source, &file, format.as_deref(), force, &nbd, client)?,
        VolumeCommand::Diff { from, to } => crate::diffs::diff(&from, to.as_deref(), client)?,
        VolumeCommand::ExportDiff {
            source,
            file,
            from_snap,
            force,
            nbd,
        } => crate::diffs::export_diff(&source, &file, from_snap.as_deref(), force, &nbd, client)?,
        VolumeCommand::ImportDiff { file, volume, nbd } => {
            crate::diffs::import_diff(&file, &volume, &nbd, client)?
        }
        VolumeCommand::LocalDigest { name } => {
            let api = ApiClient::discover(client)?;
            let value = api.get(&format!("{}/local-digest", volume_path(&name)))?;
            if client.output == Output::Json {
                return print_json(&value);
            }
            println!(
                "crc32c {:08x} over {} bytes",
                value["crc32c"].as_u64().unwrap_or(0),
                value["size_bytes"].as_u64().unwrap_or(0)
            );
        }
        VolumeCommand::SetQos { name, spec } => {
            let spec = parse_qos(&spec)?;
            let api = ApiClient::discover(client)?;
            let value = api.put(
                &format!("{}/qos", volume_path(&name)),
                json!({ "qos": spec.0 }),
            )?;
            if client.output == Output::Json {
                return print_json(&value);
            }
            let volume: Volume = decode(value)?;
            match volume.qos.is_empty() {
                true => println!("volume {} has no QoS limits", volume.name),
                false => println!(
                    "volume {} QoS: {}",
                    volume.name,
                    QosSpec(volume.qos).to_text()
                ),
            }
        }
        VolumeCommand::Attach {
            name,
            initiator_iqn: Some(iqn),
            chap,
            mutual_chap,
            dhchap,
            ..
        } => {
            if dhchap {
                bail!("--dhchap is for NVMe hosts (--host-nqn); iSCSI initiators use --chap");
            }
            let api = ApiClient::discover(client)?;
            let body = json!({ "initiator_iqn": iqn, "chap": chap || mutual_chap, "mutual_chap": mutual_chap });
            let value = api.post(&format!("{}/iscsi-initiators", volume_path(&name)), body)?;
            if client.output == Output::Json {
                return print_json(&value);
            }
            let attached: AttachedInitiator = decode(value)?;
            println!(
                "initiator {iqn} may log in to {} ({})",
                attached.target_iqn, attached.volume.name
            );
            if let (Some(user), Some(password)) = (&attached.chap_username, &attached.chap_password)
            {
                println!(
                    "CHAP credentials (shown only now), for iscsiadm -m node -T {} -o update:",
                    attached.target_iqn
                );
                println!("  node.session.auth.authmethod = CHAP");
                println!("  node.session.auth.username = {user}");
                println!("  node.session.auth.password = {password}");
                if let (Some(user), Some(password)) =
                    (&attached.chap_username_in, &attached.chap_password_in)
                {
                    println!("  node.session.auth.username_in = {user}");
                    println!("  node.session.auth.password_in = {password}");
                }
            }
        }
        VolumeCommand::Attach {
            name,
            host_nqn,
            dhchap,
            chap,
            mutual_chap,
            ..
        } => {
            if chap || mutual_chap {
                bail!("--chap and --mutual-chap are for iSCSI initiators (--initiator-iqn); NVMe hosts use --dhchap");
            }
            let host_nqn = host_nqn.unwrap_or_default();
            let api = ApiClient::discover(client)?;
            let mut body = json!({ "host_nqn": host_nqn });
            if dhchap {
                body["dhchap"] = json!(true);
            }
            let value = api.post(&format!("{}/nvme-hosts", volume_path(&name)), body)?;
            if client.output == Output::Json {
                return print_json(&value);
            }
            let attached: AttachedHost = decode(value)?;
            let subnqn = nvme_nqn(&attached.volume.name);
            println!(
                "host {host_nqn} may connect to {subnqn} ({})",
                attached.volume.name
            );
            if let Some(secret) = &attached.dhchap_secret {
                println!("DH-HMAC-CHAP host secret:       {secret}");
                if let Some(ctrl) = &attached.dhchap_ctrl_secret {
                    println!("DH-HMAC-CHAP controller secret: {ctrl}");
                }
                println!("(shown only now) e.g.:\n  nvme connect -t tcp -a ADDR -s PORT -n {subnqn} --hostnqn {host_nqn} --dhchap-secret {secret}{}",
                    attached.dhchap_ctrl_secret.as_deref().map(|c| format!(" --dhchap-ctrl-secret {c}")).unwrap_or_default());
            }
        }
        VolumeCommand::Detach {
            name,
            initiator_iqn: Some(iqn),
            ..
        } => {
            let api = ApiClient::discover(client)?;
            let value = api.delete(&format!(
                "{}/iscsi-initiators/{}",
                volume_path(&name),
                path_segment(&iqn)
            ))?;
            if client.output == Output::Json {
                return print_json(&value);
            }
            println!("initiator {iqn} detached from volume {name}");
        }
        VolumeCommand::Detach { name, host_nqn, .. } => {
            let host_nqn = host_nqn.unwrap_or_default();
            let api = ApiClient::discover(client)?;
            let value = api.delete(&format!(
                "{}/nvme-hosts/{}",
                volume_path(&name),
                path_segment(&host_nqn)
            ))?;
            if client.output == Output::Json {
                return print_json(&value);
            }
            println!("host {host_nqn} detached from volume {name}");
        }
    }
    Ok(())
}

/// The NVMe subsystem NQN of a volume.
fn nvme_nqn(volume: &str) -> String {
    basalt_frontend_nvme::subsystem_nqn(volume)
}

fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "-".to_string();
    }
    format!("{:.1}%", part as f64 * 100.0 / whole as f64)
}

pub fn run_status(client: &ClientArgs) -> Result<()> {
    let api = ApiClient::discover(client)?;
    let value = api.get("/api/v1/status")?;
    if client.output == Output::Json {
        return print_json(&value);
    }
    let s: Status = decode(value)?;
    let limit = (s.capacity_bytes as f64 * s.overcommit_ratio) as u64;
    let mut pairs = Vec::new();
    if let Some(server) = &api.server {
        pairs.push(("api", server.api_url.clone()));
        if let Some(socket) = &server.nbd_socket {
            pairs.push(("nbd socket", socket.clone()));
        }
        if let Some(nbd) = &server.nbd {
            pairs.push(("nbd", nbd.clone()));
        }
        if let Some(nvme) = &server.nvme {
            pairs.push(("nvme", nvme.clone()));
        }
    }
    pairs.extend([
        ("capacity", format_size(s.capacity_bytes)),
        (
            "allocated",
            format!(
                "{} ({} of capacity)",
                format_size(s.allocated_bytes),
                percent(s.allocated_bytes, s.capacity_bytes)
            ),
        ),
        (
            "provisioned",
            format!(
                "{} ({} of capacity; limit {} at overcommit {})",
                format_size(s.provisioned_bytes),
                percent(s.provisioned_bytes, s.capacity_bytes),
                format_size(limit),
                s.overcommit_ratio
            ),
        ),
        ("volumes", s.volume_count.to_string()),
        ("extent size", format_size(s.extent_size)),
    ]);
    if s.packed_bytes > 0 {
        pairs.push((
            "compressed",
            format!(
                "{} stored in {} (ratio {:.2}; pack extents {})",
                format_size(s.packed_bytes),
                format_size(s.packed_stored_bytes),
                s.compression_ratio,
                format_size(s.pack_extent_bytes)
            ),
        ));
    }
    // Cluster only: replication health across every volume.
    if let (Some(degraded), Some(resyncing)) = (s.volumes_degraded, s.volumes_resyncing) {
        pairs.push((
            "replication",
            format!("{degraded} volumes degraded, {resyncing} resyncing"),
        ));
    }
    pairs.push((
        "data checksums",
        if !s.data_checksums {
            "off (store formatted before they existed)".to_string()
        } else if s.checksum_errors == 0 {
            "on, no errors".to_string()
        } else {
            format!(
                "on, {} reads failed their checksum since the start (see the server log; run `basalt volume scrub`)",
                s.checksum_errors
            )
        },
    ));
    if s.quarantined_entries > 0 {
        pairs.push((
            "metadata",
            format!(
                "{} store entries failed their checksum at the last start and were set aside (see the server log)",
                s.quarantined_entries
            ),
        ));
    }
    print!("{}", fields(&pairs));
    Ok(())
}

pub fn run_node(command: NodeCommand, client: &ClientArgs) -> Result<()> {
    let api = ApiClient::discover(client)?;
    let (name, state) = match command {
        NodeCommand::List => {
            let value = api.get("/api/v1/nodes")?;
            if client.output == Output::Json {
                return print_json(&value);
            }
            let list: NodeList = decode(value)?;
            let rows: Vec<Vec<String>> = list
                .nodes
                .iter()
                .map(|n| {
                    let mut state = n.state.clone();
                    if n.coordinator {
                        state.push_str(", coordinator");
                    }
                    vec![
                        n.name.clone(),
                        if n.alive { "up" } else { "down" }.to_string(),
                        state,
                        n.zone.clone().unwrap_or_else(|| "-".into()),
                        n.replicas.to_string(),
                        n.primaries.to_string(),
                        format_size(n.free_bytes),
                        format_size(n.capacity_bytes),
                        n.peer_addr.clone(),
                    ]
                })
                .collect();
            print!(
                "{}",
                table(
                    &[
                        ("NAME", Align::Left),
                        ("LIVE", Align::Left),
                        ("STATE", Align::Left),
                        ("ZONE", Align::Left),
                        ("REPLICAS", Align::Right),
                        ("PRIMARIES", Align::Right),
                        ("FREE", Align::Right),
                        ("CAPACITY", Align::Right),
                        ("PEER", Align::Left),
                    ],
                    &rows,
                )
            );
            return Ok(());
        }
        NodeCommand::Drain { name } => (name, "draining"),
        NodeCommand::Remove { name } => (name, "removed"),
        NodeCommand::Activate { name } => (name, "active"),
    };
    let value = api.post(
        &format!("/api/v1/nodes/{}/state", path_segment(&name)),
        json!({ "state": state }),
    )?;
    if client.output == Output::Json {
        return print_json(&value);
    }
    let node: Node = decode(value)?;
    println!("node {} is now {}", node.name, node.state);
    Ok(())
}

/// A QoS spec as `volume set-qos` takes it: Cinder keys, with size
/// suffixes allowed on byte rates, or `none`.
pub(crate) fn parse_qos(text: &str) -> Result<QosSpec> {
    if text.trim() == "none" {
        return Ok(QosSpec::default());
    }
    let mut pairs = Vec::new();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some((key, value)) if key.trim().contains("bytes_sec") => {
                let bytes = basalt_volume::parse_size(value.trim())
                    .map_err(|e| anyhow!("QoS key {}: {e}", key.trim()))?;
                pairs.push(format!("{}={bytes}", key.trim()));
            }
            _ => pairs.push(pair.to_string()),
        }
    }
    QosSpec::parse(&pairs.join(",")).map_err(|e| anyhow!("{e}"))
}

#[cfg(test)]
mod tests {
    use super::volume_path;

    #[test]
    fn volume_names_are_one_path_segment() {
        assert_eq!(volume_path("db-1.a_b"), "/api/v1/volumes/db-1.a_b");
        assert_eq!(volume_path("a/b?c d"), "/api/v1/volumes/a%2Fb%3Fc%20d");
    }
}
