//! Every path of a 3-node cluster from one address: each node publishes
//! its iSCSI portal and NVMe/TCP address in the node registry (`node
//! list`), and discovery through any one node lists the volume at every
//! live node's address — iSCSI SendTargets (read with libiscsi's
//! `iscsi-ls`) with the node's target portal group tag, the port group
//! ALUA reports; the NVMe/TCP discovery log (read with the test host of
//! `frontend-nvme/tests`) with the node's port ID — so an initiator that
//! knows one address finds every path. A write through one node's iSCSI
//! portal reads back through another's (non-primary nodes forward, QEMU's
//! iSCSI driver); a dead node's addresses leave both lists. The ALUA and
//! ANA states themselves are checked by the Linux kernel in
//! `guest_iscsi_cluster.rs` and `guest_nvme_cluster.rs`, whose guests
//! also discover through one node.
//!
//! Needs etcd (like `cluster.rs`), libiscsi-bin and qemu-utils.

mod common;

#[path = "../../frontend-nvme/tests/common/host.rs"]
mod host;

use basalt_nvme_wire::command::log_id;
use basalt_nvme_wire::log_page::DiscoveryLog;
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

/// The NVMe/TCP discovery log through `addr`: `(subsystem NQN,
/// "ADDR:PORT", port ID)` per entry, sorted.
fn nvme_discover(addr: std::net::SocketAddr) -> Vec<(String, String, u16)> {
    let mut d = host::Host::discovery(addr, host::HOST_NQN);
    let page = d.get_log(log_id::DISCOVERY, 0, 4096, 0).ok().data.clone();
    let log = DiscoveryLog::parse(&page).expect("a discovery log page");
    let mut entries: Vec<_> = log
        .entries
        .iter()
        .map(|e| {
            (
                e.subnqn.clone(),
                format!("{}:{}", e.traddr, e.trsvcid),
                e.portid,
            )
        })
        .collect();
    entries.sort();
    entries
}

/// Node `node`'s entry in `node list`, and its port ID.
fn node_entry(nodes: &Value, node: usize) -> (&Value, u16) {
    let entry = nodes["nodes"]
        .as_array()
        .and_then(|n| n.iter().find(|n| n["name"] == format!("node{node}")))
        .unwrap_or_else(|| panic!("node{node} in {nodes:#}"));
    let id = entry["id"].as_u64().expect("a node id") as u32;
    (entry, basalt_volume::node_port_id(id))
}

/// What iSCSI discovery should list for node `node` of `nodes`.
fn portal_line(nodes: &Value, node: usize) -> String {
    let (entry, port_id) = node_entry(nodes, node);
    let addr = entry["iscsi_addr"].as_str().expect("an iSCSI portal");
    format!(
        "Target:{} Portal:{addr},{port_id}",
        basalt_volume::iscsi_target_name(VOLUME)
    )
}

/// What NVMe/TCP discovery should list for node `node` of `nodes`.
fn nvme_entry(nodes: &Value, node: usize) -> (String, String, u16) {
    let (entry, port_id) = node_entry(nodes, node);
    let addr = entry["nvme_addr"].as_str().expect("an NVMe/TCP address");
    (
        basalt_frontend_nvme::subsystem_nqn(VOLUME),
        addr.to_string(),
        port_id,
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
fn discovery_through_one_node_lists_every_live_nodes_address() {
    require_tool("iscsi-ls");
    require_tool("qemu-io");
    let mut c = Cluster::start_with(3, &[], |_| {
        vec![
            "--iscsi-allow-initiator".into(),
            INITIATOR.into(),
            "--nvme-allow-host".into(),
            host::HOST_NQN.into(),
        ]
    });
    let v = c.create_rf3(VOLUME, "16M");
    let first = node_index(&primary(&v).expect("a primary"));

    // The registry names every node's addresses, as each node bound them.
    let nodes = c.nodes[0].cli_json(&["node", "list"]);
    for (i, n) in c.nodes.iter().enumerate() {
        let line = portal_line(&nodes, i);
        assert!(
            line.contains(&format!("Portal:{},", n.iscsi_addr())),
            "{line} vs node{i} at {}",
            n.iscsi_addr()
        );
        assert_eq!(nvme_entry(&nodes, i).1, n.nvme_addr().to_string());
    }
    let mut all: Vec<String> = (0..3).map(|i| portal_line(&nodes, i)).collect();
    all.sort();
    let mut all_nvme: Vec<_> = (0..3).map(|i| nvme_entry(&nodes, i)).collect();
    all_nvme.sort();
    for n in &c.nodes {
        assert_eq!(discover(n.iscsi_addr()), all, "through {}", n.iscsi_addr());
        assert_eq!(
            nvme_discover(n.nvme_addr()),
            all_nvme,
            "through {}",
            n.nvme_addr()
        );
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

    // A dead node's addresses leave both lists once its liveness key
    // expires.
    let dead = others[1];
    let asked = others[0];
    c.nodes[dead].kill9();
    let dead_line = portal_line(&nodes, dead);
    let want: Vec<String> = all.iter().filter(|l| **l != dead_line).cloned().collect();
    let dead_nvme = nvme_entry(&nodes, dead);
    let want_nvme: Vec<_> = all_nvme
        .iter()
        .filter(|e| **e != dead_nvme)
        .cloned()
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let listed = discover(c.nodes[asked].iscsi_addr());
        let listed_nvme = nvme_discover(c.nodes[asked].nvme_addr());
        if listed == want && listed_nvme == want_nvme {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node{dead} still listed after 30 s: {listed:#?} {listed_nvme:#?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
