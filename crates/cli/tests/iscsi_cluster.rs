//! iSCSI across a 3-node cluster, from the host with libiscsi's tools and
//! QEMU's iSCSI driver: every node publishes its portal in the node
//! registry (`node list`), discovery through any one node lists the volume
//! at every live node's portal (with the node's target portal group tag,
//! the port group ALUA reports), so an initiator that knows one address
//! finds every path; a write through one node's portal reads back through
//! another's (non-primary nodes forward); a dead node's portal leaves the
//! list. The ALUA states themselves are checked by the kernel's device
//! handler and dm-multipath in `guest_iscsi_cluster.rs`.
//!
//! Needs etcd (like `cluster.rs`), libiscsi-bin and qemu-utils.

mod common;

use common::cluster::*;
use common::*;
use serde_json::Value;
use std::time::{Duration, Instant};

const INITIATOR: &str = "iqn.2026-11.io.test:cluster-host";
const VOLUME: &str = "paths";

/// `iscsi-ls` through `portal`: the `Target:... Portal:...` lines.
fn discover(portal: std::net::SocketAddr) -> Vec<String> {
    let ls = tool("iscsi-ls", ["-i", INITIATOR, &format!("iscsi://{portal}")]);
    ls.ok();
    let mut lines: Vec<String> = ls
        .stdout
        .lines()
        .filter(|l| l.starts_with("Target:"))
        .map(str::to_string)
        .collect();
    lines.sort();
    lines
}

/// What discovery should list for node `node` of `nodes` (`node list`).
fn portal_line(nodes: &Value, node: usize) -> String {
    let entry = nodes["nodes"]
        .as_array()
        .and_then(|n| n.iter().find(|n| n["name"] == format!("node{node}")))
        .unwrap_or_else(|| panic!("node{node} in {nodes:#}"));
    let id = entry["id"].as_u64().expect("a node id") as u32;
    let addr = entry["iscsi_addr"].as_str().expect("an iSCSI portal");
    format!(
        "Target:{} Portal:{addr},{}",
        basalt_volume::iscsi_target_name(VOLUME),
        basalt_frontend_iscsi::port_group_of_node(id)
    )
}

fn qemu_io(portal: std::net::SocketAddr, cmd: &str) -> CmdOutput {
    let opts = format!(
        "driver=iscsi,transport=tcp,portal={portal},target={},lun=0,initiator-name={INITIATOR}",
        basalt_volume::iscsi_target_name(VOLUME)
    );
    tool("qemu-io", ["--image-opts", &opts, "-c", cmd])
}

#[test]
fn discovery_through_one_node_lists_every_live_nodes_portal() {
    require_tool("iscsi-ls");
    require_tool("qemu-io");
    let mut c = Cluster::start_with(3, &[], |_| {
        vec!["--iscsi-allow-initiator".into(), INITIATOR.into()]
    });
    let v = c.create_rf3(VOLUME, "16M");
    let first = node_index(&primary(&v).expect("a primary"));

    // The registry names every node's portal, as each node bound it.
    let nodes = c.nodes[0].cli_json(&["node", "list"]);
    for (i, n) in c.nodes.iter().enumerate() {
        let line = portal_line(&nodes, i);
        assert!(
            line.contains(&format!("Portal:{},", n.iscsi_addr())),
            "{line} vs node{i} at {}",
            n.iscsi_addr()
        );
    }
    let all: Vec<String> = {
        let mut l: Vec<String> = (0..3).map(|i| portal_line(&nodes, i)).collect();
        l.sort();
        l
    };
    for n in &c.nodes {
        assert_eq!(discover(n.iscsi_addr()), all, "through {}", n.iscsi_addr());
    }

    // A write through a node that is not the primary (forwarded) reads
    // back through another such node and through the primary.
    let others: Vec<usize> = (0..3).filter(|&i| i != first).collect();
    qemu_io(c.nodes[others[0]].iscsi_addr(), "write -P 0x5a 1M 64k").ok();
    for i in [others[1], first] {
        let read = qemu_io(c.nodes[i].iscsi_addr(), "read -P 0x5a 1M 64k");
        read.ok();
        assert!(
            !read.stdout.contains("Pattern verification failed"),
            "{}",
            read.describe()
        );
    }

    // A dead node's portal leaves the list once its liveness key expires.
    let dead = others[1];
    let asked = others[0];
    c.nodes[dead].kill9();
    let want: Vec<String> = {
        let mut l: Vec<String> = (0..3)
            .filter(|&i| i != dead)
            .map(|i| portal_line(&nodes, i))
            .collect();
        l.sort();
        l
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let listed = discover(c.nodes[asked].iscsi_addr());
        if listed == want {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node{dead} still listed after 30 s: {listed:#?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
