//! A cluster of `basalt server` processes (`node0`, `node1`, ...) sharing
//! a real etcd, and helpers reading `volume show` output (replicas,
//! primary, epoch); used by `cluster.rs` and `guest_nvme_cluster.rs`.
//!
//! Invariant: node `i` is named `node{i}` and is `nodes[i]`.

use super::Server;
use basalt_etcd_fixture::EtcdServer;
use serde_json::Value;
use std::net::TcpListener;
use std::time::{Duration, Instant};

pub struct Cluster {
    pub etcd: EtcdServer,
    pub nodes: Vec<Server>,
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

impl Cluster {
    pub fn start(n: usize, zones: &[&str]) -> Cluster {
        Cluster::start_with(n, zones, |_| Vec::new())
    }

    /// [`Cluster::start`] with `extra(i)` appended to node `i`'s server
    /// arguments.
    pub fn start_with(n: usize, zones: &[&str], extra: impl Fn(usize) -> Vec<String>) -> Cluster {
        let etcd = EtcdServer::start().expect("start etcd");
        let endpoint = etcd.endpoint();
        let nodes = (0..n)
            .map(|i| {
                let peer = format!("127.0.0.1:{}", free_port());
                let name = format!("node{i}");
                let mut args = vec![
                    "--etcd",
                    &endpoint,
                    "--node-name",
                    &name,
                    "--peer-listen",
                    &peer,
                    "--lease-ms",
                    "1000",
                ];
                if let Some(z) = zones.get(i) {
                    args.extend(["--zone", z]);
                }
                let more = extra(i);
                args.extend(more.iter().map(String::as_str));
                Server::start_with("512M", &args)
            })
            .collect();
        Cluster { etcd, nodes }
    }

    pub fn show(&self, via: usize, volume: &str) -> Value {
        self.nodes[via].cli_json(&["volume", "show", volume])
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
