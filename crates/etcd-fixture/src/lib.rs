//! Test-only fixture: a real, throwaway etcd (one member, or a small cluster)
//! for Basalt's tests.
//!
//! This crate exists only so that the tests of several crates (the catalog's
//! today, the cluster's later) can run against a real etcd without each
//! growing its own copy of the process juggling; it is never a dependency of
//! anything shipped (`publish = false`, used as a dev-dependency only).
//!
//! [`EtcdServer::start`] runs the `etcd` binary (Debian's `etcd-server`,
//! 3.4; `BASALT_ETCD_BIN` names another one) and returns once etcd reports
//! itself healthy; [`EtcdCluster::start`] does the same for a cluster of
//! several members, for failover tests. `start_on` variants of both take
//! an [`EtcdNet`]: the address to listen on and a network namespace to run
//! in, for tests that cut the network between etcd and the nodes (the
//! [`netns`] module runs commands and probes inside such namespaces).
//! Invariants:
//! - Every member listens on 127.0.0.1 only (or on the address and in the
//!   network namespace an [`EtcdNet`] names), on a client and a peer port
//!   chosen free at run time below the ephemeral port range (so that a
//!   restart finds them free: [`stable_free_ports`]), with its data directory in a fresh temporary
//!   directory that is removed on drop.
//! - The fixture only ever signals the processes it spawned, each by that
//!   child's PID, and reaps them: on `kill` and on drop.
//! - If the test process dies without unwinding (SIGKILL, abort), the kernel
//!   kills etcd too (`PR_SET_PDEATHSIG`). Linux ties that to the *thread* that
//!   spawned etcd, so start (and restart) the server from a thread that
//!   outlives it, normally the test's own thread.
//! - [`EtcdServer::restart`] (and [`EtcdCluster::restart`]) bring a member
//!   back on the same data directory and ports, so clients connected before
//!   keep their endpoint.

pub mod netns;

use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Environment variable naming the etcd binary; `etcd` from `PATH` if unset.
pub const ETCD_BIN_ENV: &str = "BASALT_ETCD_BIN";

/// How long etcd gets to become healthy after it was spawned.
const HEALTHY_TIMEOUT: Duration = Duration::from_secs(30);
/// Fresh ports are tried this many times if another process grabs one
/// between our probe and etcd's bind.
const PORT_ATTEMPTS: usize = 3;
/// Bytes of etcd's log quoted in an error.
const LOG_TAIL_BYTES: u64 = 4096;

/// Why the fixture could not give a test a running etcd.
#[derive(Debug, thiserror::Error)]
pub enum FixtureError {
    #[error(
        "cannot run {bin:?}: {source}; install Debian's etcd-server (apt-get install etcd-server) or set {ETCD_BIN_ENV}"
    )]
    Spawn {
        bin: String,
        #[source]
        source: io::Error,
    },

    #[error("etcd (pid {pid}) exited with {status} before becoming healthy; end of {}:\n{tail}", .log.display())]
    Exited {
        pid: u32,
        status: ExitStatus,
        log: PathBuf,
        tail: String,
    },

    #[error("etcd (pid {pid}) at {endpoint} was not healthy within {timeout:?}; end of {}:\n{tail}", .log.display())]
    NotHealthy {
        pid: u32,
        endpoint: String,
        timeout: Duration,
        log: PathBuf,
        tail: String,
    },

    #[error("an etcd cluster needs at least one member")]
    EmptyCluster,

    #[error("etcd member {0} is not running")]
    NotRunning(usize),

    #[error("etcd fixture: {what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> FixtureError {
    let what = what.into();
    move |source| FixtureError::Io { what, source }
}

/// Where the members of a fixture's etcd listen: an address, and the
/// network namespace (made by `ip netns add`, see [`netns`]) they run in.
/// The default is 127.0.0.1 in the test's own namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdNet {
    /// Client and peer URLs use this address.
    pub host: IpAddr,
    /// Run etcd (and probe its health) inside this network namespace.
    pub netns: Option<String>,
}

impl Default for EtcdNet {
    fn default() -> Self {
        EtcdNet {
            host: IpAddr::V4(Ipv4Addr::LOCALHOST),
            netns: None,
        }
    }
}

impl EtcdNet {
    /// Runs `f` where etcd's addresses are reachable: in the namespace, or
    /// on the calling thread.
    fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T, FixtureError> {
        match &self.netns {
            None => Ok(f()),
            Some(ns) => {
                netns::run_in(ns, f).map_err(io_err(format!("enter network namespace {ns}")))
            }
        }
    }
}

/// A running (or deliberately stopped) single-member etcd owned by a test.
#[derive(Debug)]
pub struct EtcdServer {
    cluster: EtcdCluster,
}

impl EtcdServer {
    /// Starts etcd on free ports with an empty data directory and waits until
    /// it is healthy.
    pub fn start() -> Result<Self, FixtureError> {
        Self::start_on(EtcdNet::default())
    }

    /// [`EtcdServer::start`] listening on `net`'s address, inside its
    /// network namespace.
    pub fn start_on(net: EtcdNet) -> Result<Self, FixtureError> {
        Ok(EtcdServer {
            cluster: EtcdCluster::start_on(1, net)?,
        })
    }

    /// The client URL, e.g. `http://127.0.0.1:40123`.
    pub fn endpoint(&self) -> String {
        self.cluster.endpoint(0)
    }

    /// The client port.
    pub fn client_port(&self) -> u16 {
        self.cluster.client_port(0)
    }

    /// etcd's data directory (inside the fixture's temporary directory).
    pub fn data_dir(&self) -> PathBuf {
        self.cluster.data_dir(0)
    }

    /// etcd's stdout and stderr, across restarts.
    pub fn log_path(&self) -> PathBuf {
        self.cluster.log_path(0)
    }

    /// The PID of the running etcd, or `None` after [`EtcdServer::kill`].
    pub fn pid(&self) -> Option<u32> {
        self.cluster.pid(0)
    }

    /// How many raft proposals etcd has committed since it started: every
    /// write (put, delete, txn, lease grant and revoke), each an fsync of
    /// its WAL; reads and lease keep-alives are not proposals. Tests use it
    /// to show what a quiet cluster costs etcd.
    pub fn proposals_committed(&self) -> Result<u64, FixtureError> {
        let addr = SocketAddr::new(self.cluster.net.host, self.client_port());
        self.cluster
            .net
            .run(|| proposals_committed(addr))?
            .map_err(io_err(format!("read etcd's metrics at {addr}")))
    }

    /// How long the last start (or restart) took, from spawn to healthy.
    pub fn last_start_duration(&self) -> Duration {
        self.cluster.last_start_duration()
    }

    /// What clients have cost etcd since it started: gRPC messages it
    /// received (every request, and each message on a stream: lease
    /// keep-alives, watch requests) and bytes it received and sent.
    pub fn traffic(&self) -> Result<Traffic, FixtureError> {
        let addr = SocketAddr::new(self.cluster.net.host, self.client_port());
        self.cluster
            .net
            .run(|| traffic(addr))?
            .map_err(io_err(format!("read etcd's metrics at {addr}")))
    }

    /// Kills etcd with SIGKILL (as a crash would) and reaps it. Everything
    /// etcd acknowledged is on disk already (it fsyncs its WAL before
    /// answering), so [`EtcdServer::restart`] finds it. A no-op if stopped.
    pub fn kill(&mut self) -> Result<(), FixtureError> {
        self.cluster.kill(0)
    }

    /// Starts etcd again on the same data directory and ports (killing it
    /// first if it runs) and waits until it is healthy.
    pub fn restart(&mut self) -> Result<(), FixtureError> {
        self.cluster.restart(0)
    }
}

/// A running etcd cluster of several members on 127.0.0.1, for tests of
/// failover: members are numbered from 0 and can be killed and restarted one
/// at a time.
#[derive(Debug)]
pub struct EtcdCluster {
    dir: tempfile::TempDir,
    net: EtcdNet,
    members: Vec<Member>,
    last_start: Duration,
}

#[derive(Debug)]
struct Member {
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

impl EtcdCluster {
    /// Starts `size` members (at least one) forming one new cluster and
    /// waits until every one of them is healthy.
    pub fn start(size: usize) -> Result<Self, FixtureError> {
        Self::start_on(size, EtcdNet::default())
    }

    /// [`EtcdCluster::start`] listening on `net`'s address, inside its
    /// network namespace.
    pub fn start_on(size: usize, net: EtcdNet) -> Result<Self, FixtureError> {
        if size == 0 {
            return Err(FixtureError::EmptyCluster);
        }
        let dir = tempfile::Builder::new()
            .prefix("basalt-etcd-")
            .tempdir()
            .map_err(io_err("create a temporary directory"))?;
        let mut cluster = EtcdCluster {
            dir,
            net,
            members: Vec::new(),
            last_start: Duration::ZERO,
        };
        let mut attempt = 1;
        loop {
            let host = cluster.net.host;
            cluster.members = cluster
                .net
                .run(|| stable_free_ports(host, 2 * size))??
                .chunks(2)
                .map(|p| Member {
                    client_port: p[0],
                    peer_port: p[1],
                    child: None,
                })
                .collect();
            let t0 = Instant::now();
            let all: Vec<usize> = (0..size).collect();
            let started = all
                .iter()
                .try_for_each(|&i| cluster.spawn(i))
                .and_then(|()| cluster.wait_healthy(&all, t0));
            match started {
                Ok(()) => return Ok(cluster),
                Err(FixtureError::Exited { ref tail, .. })
                    if attempt < PORT_ATTEMPTS && tail.contains("address already in use") =>
                {
                    tracing::warn!(attempt, "etcd lost a port race; retrying with new ports");
                    attempt += 1;
                    // Fresh data directories too: the failed attempt may
                    // have written ones naming the old peer URLs.
                    for i in all {
                        cluster.kill(i)?;
                        let data = cluster.data_dir(i);
                        if data.exists() {
                            std::fs::remove_dir_all(&data)
                                .map_err(io_err(format!("remove {}", data.display())))?;
                        }
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// How many members the cluster has.
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// Member `i`'s client URL, e.g. `http://127.0.0.1:40123`.
    pub fn endpoint(&self, i: usize) -> String {
        url(self.net.host, self.members[i].client_port)
    }

    /// Every member's client URL, in member order.
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.size()).map(|i| self.endpoint(i)).collect()
    }

    /// Member `i`'s client port.
    pub fn client_port(&self, i: usize) -> u16 {
        self.members[i].client_port
    }

    /// Member `i`'s data directory (inside the fixture's temporary
    /// directory).
    pub fn data_dir(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("member-{i}"))
    }

    /// Member `i`'s stdout and stderr, across restarts.
    pub fn log_path(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("member-{i}.log"))
    }

    /// The PID of member `i`, or `None` while it is killed.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members[i].child.as_ref().map(Child::id)
    }

    /// How long the last start (or restart), from spawn to healthy, took.
    pub fn last_start_duration(&self) -> Duration {
        self.last_start
    }

    /// Kills member `i` with SIGKILL (as a crash would) and reaps it; a no-op
    /// if it is not running.
    pub fn kill(&mut self, i: usize) -> Result<(), FixtureError> {
        if let Some(mut child) = self.members[i].child.take() {
            let pid = child.id();
            // Child::kill signals exactly this PID, and only while it is
            // not reaped, so it can never hit a recycled PID.
            child
                .kill()
                .map_err(io_err(format!("kill etcd (pid {pid})")))?;
            child
                .wait()
                .map_err(io_err(format!("reap etcd (pid {pid})")))?;
            tracing::info!(pid, member = i, "etcd killed");
        }
        Ok(())
    }

    /// Starts member `i` again on its data directory and ports (killing it
    /// first if it runs) and waits until it is healthy, which takes a quorum
    /// of the cluster.
    pub fn restart(&mut self, i: usize) -> Result<(), FixtureError> {
        self.kill(i)?;
        let t0 = Instant::now();
        self.spawn(i)?;
        self.wait_healthy(&[i], t0)
    }

    fn initial_cluster(&self) -> String {
        (0..self.size())
            .map(|i| format!("m{i}={}", url(self.net.host, self.members[i].peer_port)))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Spawns member `i` (not running).
    fn spawn(&mut self, i: usize) -> Result<(), FixtureError> {
        let bin = std::env::var(ETCD_BIN_ENV).unwrap_or_else(|_| "etcd".to_string());
        let log_path = self.log_path(i);
        let log = File::options()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(io_err(format!("open {}", log_path.display())))?;
        let log_err = log
            .try_clone()
            .map_err(io_err(format!("open {}", log_path.display())))?;
        let client = self.endpoint(i);
        let peer = url(self.net.host, self.members[i].peer_port);
        let mut cmd = Command::new(&bin);
        cmd.arg("--name")
            .arg(format!("m{i}"))
            .arg("--data-dir")
            .arg(self.data_dir(i))
            .arg("--listen-client-urls")
            .arg(&client)
            .arg("--advertise-client-urls")
            .arg(&client)
            .arg("--listen-peer-urls")
            .arg(&peer)
            .arg("--initial-advertise-peer-urls")
            .arg(&peer)
            // Read only on the first start; a restart finds its data dir.
            .arg("--initial-cluster")
            .arg(self.initial_cluster())
            .arg("--initial-cluster-state")
            .arg("new")
            .arg("--initial-cluster-token")
            .arg(format!("basalt-test-{}", self.members[0].peer_port))
            // Loopback only: elect fast (a single member is healthy in about
            // 0.1 s instead of 0.6 s with the defaults).
            .arg("--heartbeat-interval")
            .arg("10")
            .arg("--election-timeout")
            .arg("100")
            .arg("--logger")
            .arg("zap")
            .arg("--log-level")
            .arg("warn")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err);
        if let Some(ns) = &self.net.netns {
            netns::command_in(&mut cmd, ns);
        }
        let parent = std::process::id();
        // SAFETY: the closure runs in the forked child before exec and only
        // calls async-signal-safe functions (prctl, getppid, _exit).
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // The parent may have died before prctl took effect.
                if libc::getppid() as u32 != parent {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|source| FixtureError::Spawn {
            bin: bin.clone(),
            source,
        })?;
        tracing::debug!(pid = child.id(), member = i, endpoint = %client, "etcd spawned");
        self.members[i].child = Some(child);
        Ok(())
    }

    /// Waits until every member in `which` reports itself healthy; `t0` is
    /// when they were spawned.
    fn wait_healthy(&mut self, which: &[usize], t0: Instant) -> Result<(), FixtureError> {
        let deadline = t0 + HEALTHY_TIMEOUT;
        let mut pending: Vec<usize> = which.to_vec();
        loop {
            let mut still = Vec::new();
            for &i in &pending {
                let Some(child) = self.members[i].child.as_mut() else {
                    return Err(FixtureError::NotRunning(i));
                };
                let pid = child.id();
                let exited = child
                    .try_wait()
                    .map_err(io_err(format!("wait for etcd (pid {pid})")))?;
                if let Some(status) = exited {
                    self.members[i].child = None;
                    let log = self.log_path(i);
                    return Err(FixtureError::Exited {
                        pid,
                        status,
                        tail: log_tail(&log),
                        log,
                    });
                }
                let addr = SocketAddr::new(self.net.host, self.members[i].client_port);
                if !self.net.run(|| is_healthy(addr))? {
                    still.push(i);
                }
            }
            if still.is_empty() {
                self.last_start = t0.elapsed();
                tracing::info!(members = ?which, took = ?self.last_start, "etcd healthy");
                return Ok(());
            }
            if Instant::now() >= deadline {
                let i = still[0];
                let log = self.log_path(i);
                return Err(FixtureError::NotHealthy {
                    pid: self.pid(i).unwrap_or(0),
                    endpoint: self.endpoint(i),
                    timeout: HEALTHY_TIMEOUT,
                    tail: log_tail(&log),
                    log,
                });
            }
            pending = still;
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            if let Err(e) = self.kill(i) {
                tracing::error!(error = %e, "could not stop a test etcd");
            }
        }
    }
}

/// `http://HOST:PORT` (IPv6 hosts in brackets).
fn url(host: IpAddr, port: u16) -> String {
    format!("http://{}", SocketAddr::new(host, port))
}

/// `n` distinct ports on `host` that were free a moment ago (all held while
/// probing), below the kernel's range of ephemeral ports.
///
/// A server that tests stop and start again on the same port (an etcd
/// member, a cluster node's peer listener) needs a port nobody else takes
/// meanwhile. A port the kernel handed out for `bind(0)` is in the
/// ephemeral range, and while its server is down any outbound connection
/// of the machine may get it as its local port: the restart then fails
/// with "Address already in use" (a cluster test restarting a node hit
/// that). Ports below the range are only taken by someone who asks for
/// them.
pub fn stable_free_ports(host: IpAddr, n: usize) -> Result<Vec<u16>, FixtureError> {
    let (low, _) = ephemeral_range();
    let floor: u16 = 10_000;
    let span = low.saturating_sub(floor).max(1);
    // Start somewhere different in each process and call, so that parallel
    // tests rarely probe the same ports.
    static CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let seed = std::process::id()
        .wrapping_mul(2_654_435_761)
        .wrapping_add(CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) * 7919)
        .wrapping_add(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos()),
        );
    let mut held = Vec::with_capacity(n);
    for k in 0..u32::from(span) {
        if held.len() == n {
            break;
        }
        let port = floor + ((seed.wrapping_add(k) % u32::from(span)) as u16);
        if let Ok(l) = TcpListener::bind((host, port)) {
            held.push((port, l));
        }
    }
    if held.len() < n {
        return free_ports(host, n);
    }
    Ok(held.into_iter().map(|(port, _)| port).collect())
}

/// The kernel's range of ephemeral ports (Linux's default if unreadable).
fn ephemeral_range() -> (u16, u16) {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            let mut it = s.split_whitespace().map(|p| p.parse::<u16>().ok());
            Some((it.next()??, it.next()??))
        })
        .unwrap_or((32768, 60999))
}

/// `n` distinct ports on `host` that were free a moment ago (all held while
/// probing), as the kernel picks them.
fn free_ports(host: IpAddr, n: usize) -> Result<Vec<u16>, FixtureError> {
    let what = || format!("find a free port on {host}");
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        let l = TcpListener::bind((host, 0)).map_err(io_err(what()))?;
        let port = l.local_addr().map_err(io_err(what()))?.port();
        held.push((port, l));
    }
    Ok(held.into_iter().map(|(port, _)| port).collect())
}

/// The whole HTTP/1.0 response (headers and body) to `GET path` at `addr`.
fn http_get(addr: SocketAddr, path: &str) -> io::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.set_write_timeout(Some(Duration::from_secs(2)))?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())?;
    let mut response = String::new();
    s.read_to_string(&mut response)?;
    Ok(response)
}

/// Whether etcd's `/health` at `addr` answers `"health":"true"` (it does
/// once the member has a leader and serves requests).
fn is_healthy(addr: SocketAddr) -> bool {
    http_get(addr, "/health").is_ok_and(|body| body.contains(r#""health":"true""#))
}

/// `etcd_server_proposals_committed_total` from the Prometheus metrics at
/// `addr`.
fn proposals_committed(addr: SocketAddr) -> io::Result<u64> {
    let metrics = http_get(addr, "/metrics")?;
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("etcd_server_proposals_committed_total "))
        // Prometheus prints counters as floats (`1.234e+06` when large).
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                "no etcd_server_proposals_committed_total in /metrics",
            )
        })
}

/// Counters of [`EtcdServer::traffic`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Traffic {
    pub messages: f64,
    pub bytes: f64,
}

impl std::ops::Sub for Traffic {
    type Output = Traffic;
    fn sub(self, o: Traffic) -> Traffic {
        Traffic {
            messages: self.messages - o.messages,
            bytes: self.bytes - o.bytes,
        }
    }
}

/// The client traffic counters from the Prometheus metrics at `addr`.
fn traffic(addr: SocketAddr) -> io::Result<Traffic> {
    let metrics = http_get(addr, "/metrics")?;
    let value = |l: &str| {
        l.rsplit(' ')
            .next()
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    let mut t = Traffic::default();
    for l in metrics.lines() {
        if l.starts_with("grpc_server_msg_received_total{") {
            t.messages += value(l).unwrap_or(0.0);
        } else if l.starts_with("etcd_network_client_grpc_received_bytes_total ")
            || l.starts_with("etcd_network_client_grpc_sent_bytes_total ")
        {
            t.bytes += value(l).unwrap_or(0.0);
        }
    }
    Ok(t)
}

/// The last few KiB of etcd's log, for error messages.
fn log_tail(path: &Path) -> String {
    let read = || -> io::Result<String> {
        let mut f = File::open(path)?;
        let len = f.metadata()?.len();
        let start = len.saturating_sub(LOG_TAIL_BYTES);
        io::Seek::seek(&mut f, io::SeekFrom::Start(start))?;
        let mut buf = Vec::new();
        f.read_to_end(&mut buf)?;
        Ok(String::from_utf8_lossy(&buf).into_owned())
    };
    read().unwrap_or_else(|e| format!("(log unreadable: {e})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn healthy(port: u16) -> bool {
        is_healthy(SocketAddr::from(([127, 0, 0, 1], port)))
    }

    fn alive(pid: u32) -> bool {
        // Signal 0 checks existence without signalling. Only used on PIDs
        // this test's fixture spawned.
        unsafe { libc::kill(pid as libc::pid_t, 0) == 0 }
    }

    #[test]
    fn stable_ports_are_distinct_free_and_below_the_ephemeral_range() {
        let (low, _) = ephemeral_range();
        let ports = stable_free_ports([127, 0, 0, 1].into(), 4).unwrap();
        let mut distinct = ports.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), 4, "{ports:?}");
        for p in ports {
            assert!(p < low, "{p} is in the ephemeral range from {low}");
            assert!(TcpListener::bind(("127.0.0.1", p)).is_ok(), "{p} is taken");
        }
    }

    #[test]
    fn starts_healthy_on_loopback() {
        let etcd = EtcdServer::start().unwrap();
        assert!(etcd.endpoint().starts_with("http://127.0.0.1:"));
        assert!(healthy(etcd.client_port()));
        assert!(etcd.data_dir().join("member").is_dir(), "data dir in use");
        assert!(etcd.last_start_duration() > Duration::ZERO);
        eprintln!("etcd healthy {:?} after spawn", etcd.last_start_duration());
    }

    #[test]
    fn two_servers_get_distinct_ports() {
        let a = EtcdServer::start().unwrap();
        let b = EtcdServer::start().unwrap();
        assert_ne!(a.endpoint(), b.endpoint());
        assert!(healthy(a.client_port()) && healthy(b.client_port()));
    }

    #[test]
    fn kill_then_restart_on_same_ports_and_data() {
        let mut etcd = EtcdServer::start().unwrap();
        let endpoint = etcd.endpoint();
        let pid = etcd.pid().unwrap();
        etcd.kill().unwrap();
        assert_eq!(etcd.pid(), None);
        assert!(!healthy(etcd.client_port()), "nothing answers after kill");
        etcd.kill().unwrap(); // idempotent
        etcd.restart().unwrap();
        eprintln!(
            "etcd restarted, healthy {:?} after spawn",
            etcd.last_start_duration()
        );
        assert_eq!(etcd.endpoint(), endpoint);
        assert_ne!(etcd.pid(), Some(pid));
        assert!(healthy(etcd.client_port()));
    }

    #[test]
    fn a_cluster_survives_losing_a_member() {
        let mut cluster = EtcdCluster::start(3).unwrap();
        eprintln!(
            "3 members healthy {:?} after spawn",
            cluster.last_start_duration()
        );
        let ports: Vec<u16> = (0..3).map(|i| cluster.client_port(i)).collect();
        assert!(ports.iter().all(|&p| healthy(p)));
        assert_eq!(cluster.endpoints().len(), 3);
        cluster.kill(0).unwrap();
        assert!(!healthy(ports[0]));
        // If member 0 led, the others report unhealthy until they elected
        // a new leader (a few election timeouts).
        let deadline = Instant::now() + Duration::from_secs(10);
        while !(healthy(ports[1]) && healthy(ports[2])) {
            assert!(Instant::now() < deadline, "quorum left, yet no leader");
            std::thread::sleep(Duration::from_millis(20));
        }
        cluster.restart(0).unwrap();
        assert!(ports.iter().all(|&p| healthy(p)));
        assert!(matches!(
            EtcdCluster::start(0),
            Err(FixtureError::EmptyCluster)
        ));
    }

    #[test]
    fn drop_kills_the_process() {
        let etcd = EtcdServer::start().unwrap();
        let pid = etcd.pid().unwrap();
        let port = etcd.client_port();
        let dir = etcd.data_dir();
        assert!(alive(pid));
        drop(etcd);
        assert!(!alive(pid), "etcd pid {pid} still exists after drop");
        assert!(!healthy(port));
        assert!(!dir.exists(), "temporary directory removed");
    }

    #[test]
    fn missing_binary_is_a_clear_error() {
        // Run in a child process so the environment change cannot leak into
        // other tests of this binary, which run in parallel threads.
        if std::env::var_os("BASALT_FIXTURE_MISSING_BIN_CHILD").is_some() {
            let err = EtcdServer::start().unwrap_err();
            assert!(matches!(err, FixtureError::Spawn { .. }), "{err}");
            assert!(err.to_string().contains("etcd-server"), "{err}");
            return;
        }
        let exe = std::env::current_exe().unwrap();
        let out = Command::new(exe)
            .args([
                "--exact",
                "tests::missing_binary_is_a_clear_error",
                "--nocapture",
            ])
            .env("BASALT_FIXTURE_MISSING_BIN_CHILD", "1")
            .env(ETCD_BIN_ENV, "/nonexistent/etcd")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout}");
        assert!(stdout.contains("1 passed"), "{stdout}");
    }
}
