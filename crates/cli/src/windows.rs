//! The volume operations a client walks window by window (1 GiB per
//! request) with a progress bar: scrub, flatten (of a clone, or to finish a
//! re-encryption) and compaction. One request per window keeps each well
//! inside the client's timeout and lets the bar move; the server paces
//! each window at the `--rate` asked for.

use crate::client::{ApiClient, ClientArgs, Output};
use crate::commands::{decode, print_json, ratio, volume_path};
use crate::output::{fields, table, Align};
use crate::transfer::Progress;
use anyhow::{bail, Context, Result};
use basalt_api::types::{CompactResult, Volume};
use basalt_volume::{format_size, parse_size};
use serde_json::{json, Value};

/// The window one scrub, flatten or compaction request covers: a request
/// stays well inside the client's timeout at any disk speed worth having,
/// and the progress bar moves.
const WINDOW: u64 = 1 << 30;

/// How long one compaction window may take: packing is CPU-bound (zstd
/// at high levels compresses at a few MiB/s per core), so far longer than
/// the client's usual timeout.
const COMPACT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3600);

/// What walking a volume's flatten windows did.
pub(crate) struct Walked {
    pub(crate) copied_bytes: u64,
    pub(crate) detached: bool,
}

/// Flattens `volume` window by window, with progress (`transfer::Progress`).
pub(crate) fn walk_flatten(
    api: &ApiClient,
    volume: &Volume,
    rate: Option<u64>,
    what: &str,
    client: &ClientArgs,
) -> Result<Walked> {
    let name = &volume.name;
    let mut bar = Progress::new(volume.size_bytes, what, name, client);
    let mut walked = Walked {
        copied_bytes: 0,
        detached: false,
    };
    let mut offset = 0;
    while offset < volume.size_bytes {
        let length = WINDOW.min(volume.size_bytes - offset);
        let mut body = json!({ "offset": offset, "length": length });
        if let Some(rate) = rate {
            body["rate"] = json!(rate);
        }
        let window = api.post(&format!("{}/flatten", volume_path(name)), body)?;
        walked.copied_bytes += window["copied_bytes"].as_u64().unwrap_or(0);
        walked.detached = window["detached"].as_bool().unwrap_or(false);
        offset += length;
        bar.set_position(offset);
    }
    bar.finish();
    Ok(walked)
}

/// Flattens a clone, or finishes a volume's re-encryption.
pub(crate) fn flatten(name: &str, rate: Option<&str>, client: &ClientArgs) -> Result<()> {
    let rate = rate.map(parse_size).transpose()?;
    if rate == Some(0) {
        bail!("--rate must be more than 0");
    }
    let api = ApiClient::discover(client)?;
    let volume: Volume = decode(api.get(&volume_path(name))?)?;
    let source = match (&volume.clone_of, volume.reencrypting) {
        (Some(source), _) => source.clone(),
        (None, true) => "its layer under the old key".to_string(),
        (None, false) => bail!("volume {name} is not a clone; there is nothing to flatten"),
    };
    let what = if volume.reencrypting {
        "re-encrypting"
    } else {
        "flattening"
    };
    let Walked {
        copied_bytes: copied,
        detached,
    } = walk_flatten(&api, &volume, rate, what, client)?;
    if client.output == Output::Json {
        return print_json(&json!({
            "volume": name, "copied_bytes": copied, "detached": detached,
        }));
    }
    if !detached {
        bail!(
            "volume {name} still reads blocks of {source} (written meanwhile?); run flatten again"
        );
    }
    println!(
        "flattened volume {name}: copied {} from {source}; it no longer depends on it",
        format_size(copied)
    );
    Ok(())
}

/// `volume scrub`: window by window, with progress (`transfer::Progress`):
/// this node's copy checked against its checksums and, in a cluster, the
/// replicas compared (differing copies rewritten from the primary's).
pub(crate) fn scrub(name: &str, rate: Option<&str>, client: &ClientArgs) -> Result<()> {
    let rate = rate.map(parse_size).transpose()?;
    if rate == Some(0) {
        bail!("--rate must be more than 0");
    }
    let api = ApiClient::discover(client)?;
    let size = api.get(&volume_path(name))?["size_bytes"]
        .as_u64()
        .context("the server's volume record has no size")?;
    let mut bar = Progress::new(size, "scrubbing", name, client);
    let (mut checked, mut bad, mut checksums) = (0u64, Vec::<u64>::new(), true);
    let (mut repaired, mut local_copy) = (Vec::<u64>::new(), true);
    let mut cmp: Option<ScrubCompare> = None;
    let mut offset = 0;
    while offset < size {
        let length = WINDOW.min(size - offset);
        let mut body = json!({ "offset": offset, "length": length });
        if let Some(rate) = rate {
            body["rate"] = json!(rate);
        }
        let window = api.post(&format!("{}/scrub", volume_path(name)), body)?;
        checked += window["bytes_checked"].as_u64().unwrap_or(0);
        checksums &= window["data_checksums"].as_bool().unwrap_or(false);
        local_copy &= window["local_copy"].as_bool().unwrap_or(true);
        let offsets = |v: &Value| -> Vec<u64> {
            v.as_array()
                .map(|a| a.iter().filter_map(Value::as_u64).collect())
                .unwrap_or_default()
        };
        bad.extend(offsets(&window["bad_blocks"]));
        repaired.extend(offsets(&window["repaired_blocks"]));
        if let Some(r) = window.get("replicas").filter(|r| r.is_object()) {
            let c = cmp.get_or_insert_with(ScrubCompare::default);
            c.compared += r["bytes_compared"].as_u64().unwrap_or(0);
            c.partial += r["bytes_partial"].as_u64().unwrap_or(0);
            c.unreadable.extend(offsets(&r["unreadable"]));
            if let Some(d) = r["differing"].as_array() {
                c.differing.extend(d.iter().cloned());
            }
        }
        offset += length;
        bar.set_position(offset);
    }
    bar.finish();
    let unrepaired: Vec<u64> = bad
        .iter()
        .copied()
        .filter(|b| !repaired.contains(b))
        .collect();
    if client.output == Output::Json {
        let mut out = json!({
            "volume": name,
            "bytes_checked": checked,
            "bad_blocks": bad,
            "repaired_blocks": repaired,
            "data_checksums": checksums,
            "local_copy": local_copy,
        });
        if let Some(c) = &cmp {
            out["replicas"] = json!({
                "bytes_compared": c.compared,
                "bytes_partial": c.partial,
                "differing": c.differing,
                "unreadable": c.unreadable,
            });
        }
        print_json(&out)?;
    } else if !checksums && cmp.is_none() {
        println!("volume {name}: this store keeps no data checksums (formatted before they existed); nothing to check");
    } else {
        let mut pairs = vec![("volume", name.to_string())];
        if local_copy {
            pairs.push(("checked here", format_size(checked)));
            pairs.push(("damaged blocks here", bad.len().to_string()));
            if !bad.is_empty() {
                let shown: Vec<String> = bad.iter().take(8).map(|o| o.to_string()).collect();
                let more = if bad.len() > 8 { ", …" } else { "" };
                pairs.push(("at offsets", format!("{}{more}", shown.join(", "))));
                pairs.push(("repaired from replicas", repaired.len().to_string()));
            }
        } else {
            pairs.push(("checked here", "no copy on this node".to_string()));
        }
        if let Some(c) = &cmp {
            pairs.push(("replicas compared", format_size(c.compared)));
            if c.partial > 0 {
                pairs.push((
                    "compared without a replica out of sync",
                    format_size(c.partial),
                ));
            }
            pairs.push(("regions differing", c.differing.len().to_string()));
            for d in c.differing.iter().take(8) {
                pairs.push((
                    "  rewritten",
                    format!(
                        "{} at offset {} on {}",
                        format_size(d["length"].as_u64().unwrap_or(0)),
                        d["offset"].as_u64().unwrap_or(0),
                        d["replicas"]
                            .as_array()
                            .map(|r| r
                                .iter()
                                .filter_map(Value::as_str)
                                .collect::<Vec<_>>()
                                .join(", "))
                            .unwrap_or_default()
                    ),
                ));
            }
            if !c.unreadable.is_empty() {
                pairs.push(("regions unreadable", c.unreadable.len().to_string()));
            }
        }
        print!("{}", fields(&pairs));
    }
    if let Some(c) = cmp.as_ref().filter(|c| !c.unreadable.is_empty()) {
        bail!(
            "volume {name} has {} region{} no replica holds a good copy of (reads there fail; restore from a backup)",
            c.unreadable.len(),
            if c.unreadable.len() == 1 { "" } else { "s" }
        );
    }
    if !unrepaired.is_empty() {
        bail!(
            "volume {name} has {} damaged 4 KiB block{} (reads of them fail; rewrite them, or restore from a replica or backup)",
            unrepaired.len(),
            if unrepaired.len() == 1 { "" } else { "s" }
        );
    }
    Ok(())
}

/// The replica compare of a scrub, summed over its windows.
#[derive(Default)]
struct ScrubCompare {
    compared: u64,
    partial: u64,
    differing: Vec<Value>,
    unreadable: Vec<u64>,
}

/// Compacts volume `name` (and its snapshots) window by window, with
/// progress; prints the summed report.
pub(crate) fn compact(name: &str, rate: Option<&str>, client: &ClientArgs) -> Result<()> {
    let rate = rate.map(parse_size).transpose()?;
    if rate == Some(0) {
        bail!("--rate must be more than 0");
    }
    let api = ApiClient::discover(client)?;
    let volume: Volume = decode(api.get(&volume_path(name))?)?;
    let mut bar = Progress::new(volume.size_bytes, "compacting", name, client);
    let mut sum = CompactResult {
        volume: name.to_string(),
        compression: volume.compression.clone().unwrap_or_default(),
        packed_extents: 0,
        packed_bytes: 0,
        stored_bytes: 0,
        incompressible_extents: 0,
    };
    let mut offset = 0;
    // The last window runs to the end of any layer: a snapshot taken before
    // the volume shrank is longer than it. A volume of size 0 still asks
    // once, for the server's refusals (not compressed, no packed extents).
    loop {
        let last = volume.size_bytes - offset <= WINDOW;
        let mut body = json!({ "offset": offset });
        if !last {
            body["length"] = json!(WINDOW);
        }
        if let Some(rate) = rate {
            body["rate"] = json!(rate);
        }
        let path = format!("{}/compact", volume_path(name));
        let window: CompactResult = decode(api.post_long(&path, body, COMPACT_TIMEOUT)?)?;
        sum.compression = window.compression;
        sum.packed_extents += window.packed_extents;
        sum.packed_bytes += window.packed_bytes;
        sum.stored_bytes += window.stored_bytes;
        sum.incompressible_extents += window.incompressible_extents;
        if last {
            bar.set_position(volume.size_bytes);
            break;
        }
        offset += WINDOW;
        bar.set_position(offset);
    }
    bar.finish();
    if client.output == Output::Json {
        return print_json(&serde_json::to_value(&sum)?);
    }
    let row = vec![
        sum.volume.clone(),
        sum.compression.clone(),
        sum.packed_extents.to_string(),
        format_size(sum.packed_bytes),
        format_size(sum.stored_bytes),
        format!("{:.2}", ratio(sum.packed_bytes, sum.stored_bytes)),
        sum.incompressible_extents.to_string(),
    ];
    print!(
        "{}",
        table(
            &[
                ("VOLUME", Align::Left),
                ("COMPRESSION", Align::Left),
                ("PACKED EXTENTS", Align::Right),
                ("PACKED", Align::Right),
                ("STORED", Align::Right),
                ("RATIO", Align::Right),
                ("INCOMPRESSIBLE", Align::Right),
            ],
            &[row],
        )
    );
    Ok(())
}
