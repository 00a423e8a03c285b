//! A cluster of `basalt server` processes (`node0`, `node1`, ...) sharing
//! a real etcd, helpers reading `volume show` output (replicas, primary,
//! epoch), and pattern I/O through `nbdtool.py`; used by `cluster.rs`,
//! `cluster_partition.rs` and `guest_nvme_cluster.rs`.
//!
//! A cluster runs on 127.0.0.1 ([`Cluster::start`]), or in a private
//! network of namespaces ([`Cluster::start_in_netns`]) whose links the test
//! can cut: etcd in the switch namespace, node `i` on host `i`, and one more
//! host for the test's clients.
//!
//! Invariant: node `i` is named `node{i}` and is `nodes[i]`.

use super::netns::TestNet;
use super::{
    in_netns, monotonic_secs, python_cmd, require_tool, run_cmd, CmdOutput, Scratch, Server,
};
use basalt_etcd_fixture::{EtcdNet, EtcdServer};
use serde_json::Value;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Fields drop in order: etcd, then the nodes, then the network they ran in.
pub struct Cluster {
    pub etcd: EtcdServer,
    pub nodes: Vec<Server>,
    /// The namespaces of a [`Cluster::start_in_netns`] cluster.
    pub net: Option<TestNet>,
    /// Holds the cluster secret file every node is started with.
    pub secrets: Scratch,
}

/// A cluster secret file (64 hex digits, mode 0600) in `dir`.
pub fn cluster_secret_file(dir: &Scratch) -> String {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.path("cluster-secret");
    let seed = std::process::id() as u64 ^ monotonic_secs().to_bits();
    let hex: String = (0..32u64)
        .map(|i| {
            format!(
                "{:02x}",
                (seed.rotate_left(i as u32 * 7) ^ i.wrapping_mul(0x9e)) as u8
            )
        })
        .collect();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .expect("cluster secret file");
    writeln!(f, "{hex}").expect("write the cluster secret");
    path.display().to_string()
}

/// A free port on 127.0.0.1 for a node's peer listener, below the
/// ephemeral range, so that no outbound connection takes it while the node
/// is down for a restart (see `basalt_etcd_fixture::stable_free_ports`).
pub fn free_port() -> u16 {
    basalt_etcd_fixture::stable_free_ports([127, 0, 0, 1].into(), 1)
        .ok()
        .and_then(|p| p.first().copied())
        .expect("free port")
}

/// The peer port of a node in its own namespace (nothing else listens there).
const NETNS_PEER_PORT: u16 = 7000;

impl Cluster {
    pub fn start(n: usize, zones: &[&str]) -> Cluster {
        Cluster::start_with(n, zones, |_| Vec::new())
    }

    /// [`Cluster::start`] with `extra(i)` appended to node `i`'s server
    /// arguments.
    pub fn start_with(n: usize, zones: &[&str], extra: impl Fn(usize) -> Vec<String>) -> Cluster {
        Cluster::launch(None, n, zones, extra, |_| "512M")
    }

    /// [`Cluster::start`] of one node per store capacity given.
    pub fn start_sized(capacities: &[&'static str]) -> Cluster {
        Cluster::launch(
            None,
            capacities.len(),
            &[],
            |_| Vec::new(),
            |i| capacities[i],
        )
    }

    /// `n` nodes, each in a network namespace of its own on a private
    /// bridge, etcd in the bridge's namespace, and a namespace for clients
    /// ([`Cluster::client_netns`]); [`TestNet::cut`] partitions a node.
    pub fn start_in_netns(n: usize) -> Cluster {
        Cluster::launch(
            Some(TestNet::new(n + 1)),
            n,
            &[],
            |_| Vec::new(),
            |_| "512M",
        )
    }

    fn launch(
        net: Option<TestNet>,
        n: usize,
        zones: &[&str],
        extra: impl Fn(usize) -> Vec<String>,
        capacity: impl Fn(usize) -> &'static str,
    ) -> Cluster {
        let etcd = match &net {
            None => EtcdServer::start().expect("start etcd"),
            Some(net) => EtcdServer::start_on(EtcdNet {
                host: net.switch_ip().into(),
                netns: Some(net.switch_netns().to_string()),
            })
            .expect("start etcd in the switch namespace"),
        };
        let endpoint = etcd.endpoint();
        let secrets = Scratch::new();
        let secret = cluster_secret_file(&secrets);
        let nodes = (0..n)
            .map(|i| {
                let host = net.as_ref().map(|net| net.host(i));
                let peer = match host {
                    Some(h) => format!("{}:{NETNS_PEER_PORT}", h.ip),
                    None => format!("127.0.0.1:{}", free_port()),
                };
                let name = format!("node{i}");
                let mut args = vec![
                    "--etcd",
                    &endpoint,
                    "--node-name",
                    &name,
                    "--peer-listen",
                    &peer,
                    "--cluster-secret-file",
                    &secret,
                    "--lease-ms",
                    "1000",
                ];
                if let Some(z) = zones.get(i) {
                    args.extend(["--zone", z]);
                }
                let more = extra(i);
                args.extend(more.iter().map(String::as_str));
                Server::start_on(capacity(i), &args, host)
            })
            .collect();
        Cluster {
            etcd,
            nodes,
            net,
            secrets,
        }
    }

    /// The network of a [`Cluster::start_in_netns`] cluster.
    #[track_caller]
    pub fn net(&self) -> &TestNet {
        self.net
            .as_ref()
            .expect("a cluster started with start_in_netns")
    }

    /// Where the test's clients run: the extra host of a namespaced
    /// cluster, or the test's own namespace.
    pub fn client_netns(&self) -> Option<&str> {
        self.net
            .as_ref()
            .map(|net| net.host(net.hosts() - 1).netns.as_str())
    }

    pub fn show(&self, via: usize, volume: &str) -> Value {
        self.nodes[via].cli_json(&["volume", "show", volume])
    }

    /// Creates volume `name` of `size` with 3 replicas through node 0 and
    /// waits until it is placed and every replica is in sync; returns its
    /// `volume show`.
    pub fn create_rf3(&self, name: &str, size: &str) -> Value {
        self.nodes[0]
            .cli(&["volume", "create", name, "--size", size, "--replicas", "3"])
            .ok();
        self.wait_volume(0, name, "placed and in sync", healthy)
    }

    /// Waits until `volume show` through node `via` satisfies `ok`.
    #[track_caller]
    pub fn wait_volume(
        &self,
        via: usize,
        volume: &str,
        what: &str,
        ok: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let v = self.show(via, volume);
            if ok(&v) {
                return v;
            }
            if Instant::now() >= deadline {
                panic!(
                    "volume {volume} never became {what}: {v:#}\n{}",
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The node that coordinates the cluster, as node `via` sees it.
    pub fn coordinator(&self, via: usize) -> Option<usize> {
        let nodes = self.nodes[via].cli_json(&["node", "list"]);
        nodes["nodes"]
            .as_array()
            .and_then(|n| n.iter().find(|n| n["coordinator"] == true))
            .and_then(|n| n["name"].as_str())
            .map(node_index)
    }

    /// `volume local-digest` of `volume` on each of `nodes`: (CRC32C, size
    /// of the local copy).
    fn digests(&self, nodes: &[usize], volume: &str) -> Vec<(u64, u64)> {
        nodes
            .iter()
            .map(|i| {
                let d = self.nodes[*i].cli_json(&["volume", "local-digest", volume]);
                let field = |f: &str| {
                    d[f].as_u64()
                        .unwrap_or_else(|| panic!("local-digest JSON has a numeric {f}: {d}"))
                };
                (field("crc32c"), field("size_bytes"))
            })
            .collect()
    }

    /// Asserts that every one of `nodes` holds an identical copy of `volume`.
    /// A replica that grew only as far as a write beyond its old end needed
    /// reaches the volume's size when it sees the grown record (within a
    /// poll or so), and one marked out of sync converges once resynced, so
    /// copies that differ are read again, for up to 10 s, before they are
    /// compared.
    #[track_caller]
    pub fn assert_replicas_equal(&self, nodes: &[usize], volume: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut d = self.digests(nodes, volume);
        while d.iter().any(|x| *x != d[0]) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
            d = self.digests(nodes, volume);
        }
        assert!(
            d.iter().all(|x| *x == d[0]),
            "replicas of {volume} on nodes {nodes:?} differ (crc32c, size): {d:?}\n{}",
            self.logs()
        );
    }

    /// Failover resyncs the nodes logged so far: (narrowed to the regions
    /// that may differ, full copies).
    pub fn failover_resyncs(&self) -> (usize, usize) {
        self.failover_resyncs_where(|_| true)
    }

    /// [`Cluster::failover_resyncs`] of volume `name` only.
    pub fn failover_resyncs_of(&self, via: usize, name: &str) -> (usize, usize) {
        let id = self.show(via, name)["id"]
            .as_str()
            .map(str::to_string)
            .expect("the volume's id");
        self.failover_resyncs_where(|line| line.contains(&format!("volume={id}")))
    }

    fn failover_resyncs_where(&self, keep: impl Fn(&str) -> bool) -> (usize, usize) {
        let logs: Vec<String> = self.nodes.iter().map(|n| n.log()).collect();
        let count = |what: &str| {
            logs.iter()
                .flat_map(|l| l.lines())
                .filter(|l| l.contains(what) && keep(l))
                .count()
        };
        (
            count("failover resync narrowed"),
            count("failover resync copies every region"),
        )
    }

    pub fn logs(&self) -> String {
        let mut s = String::new();
        for (i, n) in self.nodes.iter().enumerate() {
            let log = n.log();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            s.push_str(&format!("--- node{i} log (last lines) ---\n"));
            for l in tail.into_iter().rev() {
                s.push_str(l);
                s.push('\n');
            }
        }
        s
    }
}

pub fn replicas(v: &Value) -> Vec<Value> {
    v["replicas"].as_array().cloned().unwrap_or_default()
}

pub fn all_in_sync(v: &Value, n: usize) -> bool {
    let r = replicas(v);
    r.len() == n && r.iter().all(|r| r["state"] == "in-sync")
}

/// Every wanted replica placed (not degraded) and in sync.
pub fn healthy(v: &Value) -> bool {
    let wanted = v["replicas_wanted"].as_u64().unwrap_or(0) as usize;
    wanted > 0 && all_in_sync(v, wanted)
}

/// The state (`in-sync`, `out-of-sync`, `faulty`) of the replica on `node`.
pub fn replica_state(v: &Value, node: usize) -> Option<String> {
    replicas(v)
        .iter()
        .find(|r| r["node"].as_str() == Some(&format!("node{node}")))
        .and_then(|r| r["state"].as_str().map(str::to_string))
}

pub fn primary(v: &Value) -> Option<String> {
    replicas(v)
        .iter()
        .find(|r| r["primary"] == true)
        .and_then(|r| r["node"].as_str().map(str::to_string))
}

pub fn epoch(v: &Value) -> u64 {
    replicas(v)
        .first()
        .and_then(|r| r["epoch"].as_u64())
        .unwrap_or(0)
}

pub fn node_index(name: &str) -> usize {
    name.trim_start_matches("node").parse().expect("node name")
}

pub fn node_names(v: &Value) -> Vec<String> {
    let mut n: Vec<String> = replicas(v)
        .iter()
        .filter_map(|r| r["node"].as_str().map(str::to_string))
        .collect();
    n.sort();
    n
}

/// Runs `nbdtool.py ARGS` inside `netns` (`None`: the test's namespace).
pub fn nbdtool(netns: Option<&str>, args: &[&str]) -> CmdOutput {
    let mut cmd = python_cmd("nbdtool.py");
    in_netns(&mut cmd, netns);
    cmd.args(args);
    run_cmd(&mut cmd, Duration::from_secs(180))
}

/// Runs `nbdtool.py OP` (write or verify) over the pattern of `seed`/`gen`
/// in [offset, offset+length), from `netns`; `extra` adds flags (e.g.
/// --flush).
#[track_caller]
#[allow(clippy::too_many_arguments)]
pub fn pattern(
    netns: Option<&str>,
    op: &str,
    uri: &str,
    seed: u64,
    gen: u64,
    offset: u64,
    length: u64,
    extra: &[&str],
) {
    let (seed, gen, offset, length) = (
        seed.to_string(),
        gen.to_string(),
        offset.to_string(),
        length.to_string(),
    );
    let mut args = vec![
        op, uri, "--seed", &seed, "--gen", &gen, "--offset", &offset, "--length", &length,
    ];
    args.extend_from_slice(extra);
    let out = nbdtool(netns, &args);
    assert_eq!(
        out.code(),
        Some(0),
        "pattern {op} failed: {}",
        out.describe()
    );
}

/// Writes the pattern and flushes.
#[track_caller]
pub fn write_pattern(
    netns: Option<&str>,
    uri: &str,
    seed: u64,
    gen: u64,
    offset: u64,
    length: u64,
) {
    pattern(netns, "write", uri, seed, gen, offset, length, &["--flush"]);
}

#[track_caller]
pub fn verify_pattern(
    netns: Option<&str>,
    uri: &str,
    seed: u64,
    gen: u64,
    offset: u64,
    length: u64,
) {
    pattern(netns, "verify", uri, seed, gen, offset, length, &[]);
}

/// fio writing random 4 KiB blocks to `uri` with crc32c verification, the
/// backlog read back while it writes (so a lost or stale block fails the
/// job at once), for `runtime` seconds; run in `netns` if given, from `dir`.
pub fn fio_verify(
    netns: Option<&str>,
    dir: &Path,
    name: &str,
    uri: &str,
    iodepth: u32,
    runtime: u32,
) -> Command {
    let mut cmd = Command::new(require_tool("fio"));
    in_netns(&mut cmd, netns);
    cmd.current_dir(dir).args([
        format!("--name={name}"),
        "--ioengine=nbd".into(),
        format!("--uri={uri}"),
        "--rw=randwrite".into(),
        "--bs=4k".into(),
        format!("--iodepth={iodepth}"),
        "--size=16M".into(),
        "--time_based".into(),
        format!("--runtime={runtime}"),
        "--verify=crc32c".into(),
        "--verify_backlog=256".into(),
        "--verify_fatal=1".into(),
        "--verify_state_save=0".into(),
        "--output-format=json".into(),
    ]);
    cmd
}
