//! A private network of Linux network namespaces for cluster tests that cut
//! links: a "switch" namespace holding a bridge (and etcd, on the bridge's
//! address), and one namespace per host (a node, or the test's clients),
//! each attached to the bridge by a veth pair. [`TestNet::cut`] takes a
//! host's bridge port down (nothing reaches it or leaves it, while
//! everything inside its namespace keeps working), [`TestNet::heal`] brings
//! it up again.
//!
//! Invariants:
//! - Only namespaces this value created are touched, and interfaces inside
//!   them; every `ip` command names its namespace (`ip -n NS ...`), so the
//!   machine's own (root) namespace is never changed.
//! - Names carry the test process's PID and a per-process counter
//!   (`bsw<pid>-<k>`, `bn<pid>-<k>-<i>`), so concurrent tests and test
//!   binaries never share a namespace. Addresses are 10.231.X.0/24 with X
//!   derived from both; they exist only inside these namespaces, which have
//!   no route out (their only link is the private bridge).
//! - Dropping the value deletes every namespace it created, also when the
//!   test panicked; drop it after the processes running inside.
//!
//! Needs root (`ip netns add`).

use super::{require_tool, run_cmd};
use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// One host of a [`TestNet`]: its namespace and its address there.
#[derive(Clone, Debug)]
pub struct Host {
    pub netns: String,
    pub ip: Ipv4Addr,
    /// Its bridge port, an interface in the switch namespace.
    port: String,
}

pub struct TestNet {
    tag: String,
    subnet: [u8; 3],
    switch: String,
    hosts: Vec<Host>,
    /// Namespaces created so far, deleted on drop.
    created: Vec<String>,
}

impl TestNet {
    /// A switch namespace with a bridge and `hosts` hosts attached to it.
    pub fn new(hosts: usize) -> TestNet {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        require_tool("ip");
        let pid = std::process::id();
        let k = NEXT.fetch_add(1, Ordering::Relaxed);
        let tag = format!("{pid}-{k}");
        let x = ((pid.wrapping_mul(7).wrapping_add(k)) % 250 + 1) as u8;
        let mut net = TestNet {
            switch: format!("bsw{tag}"),
            tag,
            subnet: [10, 231, x],
            hosts: Vec::new(),
            created: Vec::new(),
        };
        let sw = net.switch.clone();
        net.add_netns(&sw);
        let bridge_addr = format!("{}/24", net.switch_ip());
        net.ip_in(&sw, &["link", "add", "br0", "type", "bridge"]);
        net.ip_in(&sw, &["addr", "add", &bridge_addr, "dev", "br0"]);
        net.ip_in(&sw, &["link", "set", "br0", "up"]);
        for _ in 0..hosts {
            net.add_host();
        }
        net
    }

    /// The switch namespace (etcd runs there).
    pub fn switch_netns(&self) -> &str {
        &self.switch
    }

    /// The bridge's address in the switch namespace.
    pub fn switch_ip(&self) -> Ipv4Addr {
        let [a, b, c] = self.subnet;
        Ipv4Addr::new(a, b, c, 1)
    }

    pub fn host(&self, i: usize) -> &Host {
        &self.hosts[i]
    }

    pub fn hosts(&self) -> usize {
        self.hosts.len()
    }

    /// Attaches one more host; returns its index.
    pub fn add_host(&mut self) -> usize {
        let i = self.hosts.len();
        let [a, b, c] = self.subnet;
        let host = Host {
            netns: format!("bn{}-{i}", self.tag),
            ip: Ipv4Addr::new(a, b, c, 10 + i as u8),
            port: format!("p{i}"),
        };
        self.add_netns(&host.netns);
        let sw = self.switch.clone();
        self.ip_in(
            &sw,
            &[
                "link",
                "add",
                &host.port,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                &host.netns,
            ],
        );
        self.ip_in(&sw, &["link", "set", &host.port, "master", "br0", "up"]);
        let addr = format!("{}/24", host.ip);
        self.ip_in(&host.netns, &["addr", "add", &addr, "dev", "eth0"]);
        self.ip_in(&host.netns, &["link", "set", "eth0", "up"]);
        self.hosts.push(host);
        i
    }

    /// Partitions host `i`: its bridge port goes down.
    pub fn cut(&self, i: usize) {
        eprintln!(
            "partition: cutting {} ({})",
            self.hosts[i].netns, self.hosts[i].ip
        );
        self.ip_in(&self.switch, &["link", "set", &self.hosts[i].port, "down"]);
    }

    /// Ends host `i`'s partition.
    pub fn heal(&self, i: usize) {
        eprintln!(
            "partition: healing {} ({})",
            self.hosts[i].netns, self.hosts[i].ip
        );
        self.ip_in(&self.switch, &["link", "set", &self.hosts[i].port, "up"]);
    }

    fn add_netns(&mut self, name: &str) {
        ip(&["netns", "add", name]);
        self.created.push(name.to_string());
        self.ip_in(name, &["link", "set", "lo", "up"]);
    }

    /// `ip -n NS ARGS...`: only ever inside one of our namespaces.
    fn ip_in(&self, ns: &str, args: &[&str]) {
        assert!(
            self.created.iter().any(|c| c == ns),
            "{ns} is not a namespace of this test"
        );
        let mut all = vec!["-n", ns];
        all.extend_from_slice(args);
        ip(&all);
    }
}

#[track_caller]
fn ip(args: &[&str]) {
    let mut cmd = Command::new(require_tool("ip"));
    cmd.args(args);
    let out = run_cmd(&mut cmd, Duration::from_secs(30));
    assert!(
        out.status.success(),
        "`{}` failed (these tests need root for network namespaces):\n{}",
        out.cmdline,
        out.describe()
    );
}

impl Drop for TestNet {
    fn drop(&mut self) {
        for ns in self.created.iter().rev() {
            let mut cmd = Command::new("ip");
            cmd.args(["netns", "del", ns]);
            match cmd.output() {
                Ok(o) if o.status.success() => {}
                Ok(o) => eprintln!(
                    "could not delete network namespace {ns}: {}",
                    String::from_utf8_lossy(&o.stderr)
                ),
                Err(e) => eprintln!("could not run `ip netns del {ns}`: {e}"),
            }
        }
    }
}
