//! Linux dm-multipath with ALUA over a 3-node Basalt cluster, inside a
//! QEMU guest (see the basalt-guest crate): one RF3 volume is one iSCSI
//! target on every node, each node its own target port group, active/
//! optimized where the volume's primary runs and active/non-optimized
//! elsewhere (the others forward). The guest's kernel initiator (iscsi_tcp
//! with open-iscsi's iscsid) logs in to all three nodes' portals; the
//! kernel's ALUA device handler (scsi_dh_alua) attaches to the three SCSI
//! disks and reports each path's `access_state`; multipath-tools makes ONE
//! device of them, its paths grouped by the `alua` prioritizer, the
//! primary's path alone in the active group. fio with crc32c verification
//! then runs on the multipath device while the test kills the primary with
//! SIGKILL (asked through `host_call`): fio must finish without an I/O or
//! verify error, and afterwards the new primary's path must be
//! active/optimized (the target's ASYMMETRIC ACCESS STATE CHANGED unit
//! attention made the kernel read the port group's state again) and, with
//! `failback immediate`, the active group that the writes go to.
//!
//! What runs in the guest, and why:
//! - iscsid, one `iscsiadm` discovery through node 0's portal (which lists
//!   every node's: the test checks), and a login to all of them. The
//!   session's replacement timeout is 5 s instead of open-iscsi's 120:
//!   until it ends, the dead node's session holds its I/O, and
//!   dm-multipath only fails a path over when its I/O fails.
//! - The ALUA device handler (module scsi_dh_alua, loaded at boot so that
//!   it attaches to each LUN as it appears: INQUIRY says TPGS=01b). It
//!   reads REPORT TARGET PORT GROUPS for `access_state`, and again when a
//!   command gets the ASYMMETRIC ACCESS STATE CHANGED unit attention.
//! - multipath-tools without udev (the guest has none). multipath lists
//!   only block devices that udev has initialized, i.e. that have a record
//!   in udev's database, so the script writes the minimal record (`I:1`,
//!   /run/udev/data/b<major>:<minor>) for each path; `uid_attribute ""`
//!   makes it read each path's WWID from sysfs (`vpd_pg83`, the target's
//!   designators) rather than udev's `ID_SERIAL` (which it would otherwise
//!   wait for, and blacklist the path without); `find_multipaths no` takes
//!   every disk; `prio alua` (with `path_grouping_policy group_by_prio`)
//!   asks each path's group state with its own REPORT TARGET PORT GROUPS.
//!   `multipath -v2` creates the map (its device node is devtmpfs's
//!   `/dev/dm-N`); `multipathd -d` then runs in the background: the kernel
//!   fails a path on its own, but only multipathd checks paths (TUR every
//!   second, which also collects the unit attention), re-reads the
//!   priorities, regroups the map when they change and, with `failback
//!   immediate`, switches to the best group.
//!
//! Needs qemu-system-x86, apt's package lists (like `guest_iscsi.rs`) and
//! etcd (like `cluster.rs`).

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use basalt_guest::{Forward, GuestConfig, HostCalls, FORWARD_IP};
use common::cluster::*;
use common::guest::*;
use common::*;

const VOLUME: &str = "mpath";
const NODES: usize = 3;
/// Node `i` is reached (and advertised) at `FORWARD_IP:BASE_PORT + i`.
const BASE_PORT: u16 = 3260;
const GUEST_CALL_PORT: u16 = 7000;
/// The guest's initiator name (/etc/iscsi/initiatorname.iscsi).
const INITIATOR: &str = "iqn.2026-11.io.test:guest-multipath";
/// Seconds fio runs; the primary dies `KILL_AFTER` seconds into it.
const FIO_SECONDS: u32 = 15;
const KILL_AFTER: u32 = 4;
const OPTIMIZED: &str = "active/optimized";
const NON_OPTIMIZED: &str = "active/non-optimized";

fn guest_script() -> String {
    format!(
        r#"{SH_PRELUDE}
{host_call}
T={target}
# For reading a failed run: the ends of the kernel's and multipathd's logs.
trap '[ $? -eq 0 ] || {{ dmesg | tail -n 40; tail -n 60 /tmp/multipathd.log; }} 2>/dev/null | sed "s/^/LOG /"' EXIT

step iscsid
mkdir -p /etc/multipath
{iscsid}

# "PORT DISK" of every session's SCSI disk, in /tmp/disks.
disks() {{
    local s d
    : > /tmp/disks
    for s in /sys/class/iscsi_session/session*; do
        for d in $s/device/target*/*:*:*:*/block/sd*; do
            [ -e "$d" ] || continue
            echo "$(cat $s/device/connection*/iscsi_connection/connection*/persistent_port) ${{d##*/}}" >> /tmp/disks
        done
    done
    [ "$(wc -l < /tmp/disks)" -eq {nodes} ]
}}

step discovery through one node lists every node
iscsiadm -m discovery -t sendtargets -p {ip}:{first_port} | tee /tmp/disc
for port in {ports}; do
    grep -q "^{ip}:$port,[0-9]* $T\$" /tmp/disc
done

step login to every node
# The dead node's path must fail in seconds, not after the default two
# minutes that a session waits to be re-established.
iscsiadm -m node -T $T -o update -n node.session.timeo.replacement_timeout -v 5
iscsiadm -m node -T $T --login
wait_until 100 disks
cat /tmp/disks
for d in $(cut -d' ' -f2 /tmp/disks); do
    echo "DISK $d $(cat /sys/block/$d/device/vendor) $(cat /sys/block/$d/device/dh_state) $(cat /sys/block/$d/device/access_state)"
done

step multipath
# No udev: multipath takes only disks with a record in udev's database, so
# each gets the least one (it is "initialized").
mkdir -p /run/udev/data
for d in $(cut -d' ' -f2 /tmp/disks); do echo I:1 > /run/udev/data/b$(cat /sys/block/$d/dev); done
cat > /etc/multipath.conf <<'EOF'
defaults {{
    find_multipaths no
    user_friendly_names yes
    uid_attribute ""
    path_grouping_policy group_by_prio
    prio alua
    detect_prio no
    path_checker tur
    detect_checker no
    failback immediate
    polling_interval 1
    max_polling_interval 2
    no_path_retry 30
}}
EOF
multipath -v2
multipathd -d -s > /tmp/multipathd.log 2>&1 &
multipathd_up() {{ multipathd show daemon > /dev/null 2>&1; }}
wait_until 100 multipathd_up

# Prints "PATH <port> <disk> <access_state> <dm state> <checker state>
# <prio> <group status>" per path, and the map's topology as "LL <line>".
paths() {{
    local port d
    multipathd show paths raw format "%d %t %T %p" > /tmp/mp
    multipath -ll > /tmp/ll
    for d in $(cut -d' ' -f2 /tmp/disks); do
        port=$(awk -v d=$d '$2 == d {{ print $1 }}' /tmp/disks)
        echo "PATH $port $d $(cat /sys/block/$d/device/access_state)" \
            "$(awk -v d=$d '$1 == d {{ print $2, $3, $4 }}' /tmp/mp)" \
            "$(awk -v d=$d '/policy=/ {{ g = /status=active/ ? "active" : "other" }} {{ for (i = 1; i <= NF; i++) if ($i == d) print g }}' /tmp/ll)"
    done
    sed 's/^/LL /' /tmp/ll
}}
# Exactly one path is active/optimized, up and in the map's active group. dm-multipath makes a group active when I/O goes to
# it (till then every group is "enabled"): a read first. Untraced: it is
# polled.
settled() {{
    set +x
    local rc=0
    dd if=/dev/$DM of=/dev/null bs=4k count=1 iflag=direct 2>/dev/null
    paths > /tmp/paths
    [ "$(awk '$1 == "PATH" && $4 == "{optimized}" && $5 == "active" && $8 == "active"' /tmp/paths | wc -l)" -eq 1 ] || rc=1
    set -x
    return $rc
}}
one_map() {{ [ "$(multipathd show maps raw format "%n %N" | awk '$2 == {nodes}' | wc -l)" -eq 1 ]; }}
wait_until 100 one_map
DM=$(multipathd show maps raw format "%d")
echo "MAP $(multipathd show maps raw format "%n %N %d")"
test -b /dev/$DM
all_up() {{ [ "$(awk '$1 == "PATH" && $5 == "active" && $6 == "ready"' /tmp/paths | wc -l)" -eq {nodes} ]; }}
settled_all_up() {{ settled && all_up; }}
wait_until 100 settled_all_up
sed 's/^/BEFORE-/' /tmp/paths

step fio while the primary dies
( sleep {kill_after}; host_call kill-primary ) &
KILLER=$!
cd /tmp
fio --name=mpath --filename=/dev/$DM --ioengine=libaio --direct=1 \
    --rw=randwrite --bs=4k --iodepth=8 --size=8M \
    --time_based --runtime={fio_seconds} \
    --verify=crc32c --verify_backlog=256 --verify_fatal=1 --verify_state_save=0 \
    --do_verify=1 --group_reporting
wait $KILLER
echo FIO-OK

step the new primary is optimized
wait_until 100 settled
sed 's/^/AFTER-/' /tmp/paths
# Writes now go to the active group, the new primary's path alone: count
# each disk's completed writes (field 5 of its stat) around a burst.
for d in $(cut -d' ' -f2 /tmp/disks); do echo "$d $(awk '{{ print $5 }}' /sys/block/$d/stat)"; done > /tmp/w0
dd if=/dev/urandom of=/dev/$DM bs=64k count=64 oflag=direct
for d in $(cut -d' ' -f2 /tmp/disks); do echo "$d $(awk '{{ print $5 }}' /sys/block/$d/stat)"; done > /tmp/w1
awk 'NR == FNR {{ w[$1] = $2; next }} {{ print "WRITES", $1, $2 - w[$1] }}' /tmp/w0 /tmp/w1
# The kernel log, for the test to check.
dmesg | sed "s/^/KMSG /"
step done
echo guest-mpath-done
"#,
        host_call = HostCalls::shell_function(GUEST_CALL_PORT),
        target = basalt_volume::iscsi_target_name(VOLUME),
        iscsid = iscsid_start(INITIATOR),
        nodes = NODES,
        ip = FORWARD_IP,
        first_port = BASE_PORT,
        ports = (0..NODES)
            .map(|i| (BASE_PORT + i as u16).to_string())
            .collect::<Vec<_>>()
            .join(" "),
        optimized = OPTIMIZED,
        kill_after = KILL_AFTER,
        fio_seconds = FIO_SECONDS,
    )
}

/// One path as the guest printed it.
#[derive(Debug)]
struct Path {
    port: u16,
    disk: String,
    /// The kernel's ALUA state of the path (`access_state`).
    access: String,
    /// dm-multipath's state of the path: `active` or `failed`.
    dm: String,
    /// The `alua` prioritizer's priority: 50 optimized, 10 non-optimized.
    prio: String,
    /// The path group's status: `active` (I/O goes there) or `other`.
    group: String,
}

/// The console lines `<prefix>PATH ...`.
fn paths(run: &basalt_guest::GuestRun, prefix: &str) -> Vec<Path> {
    console_values(run, &format!("{prefix}PATH "))
        .iter()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 7, "path line {l:?}");
            Path {
                port: f[0]
                    .parse()
                    .unwrap_or_else(|e| panic!("port in {l:?}: {e}")),
                disk: f[1].to_string(),
                access: f[2].to_string(),
                dm: f[3].to_string(),
                prio: f[5].to_string(),
                group: f[6].to_string(),
            }
        })
        .collect()
}

#[test]
fn dm_multipath_with_alua_follows_the_primary_across_a_node_kill() {
    require_tool("qemu-system-x86_64");
    let c = Cluster::start_with(NODES, &[], |i| {
        vec![
            "--iscsi-advertise".into(),
            format!("{FORWARD_IP}:{}", BASE_PORT + i as u16),
            "--iscsi-allow-initiator".into(),
            INITIATOR.into(),
        ]
    });
    let v = c.create_rf3(VOLUME, "64M");
    let first = node_index(&primary(&v).expect("a primary"));
    let forwards: Vec<Forward> = c
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| Forward::new(BASE_PORT + i as u16, n.iscsi_listen_addr()))
        .collect();
    let c = Arc::new(Mutex::new(c));
    let calls = HostCalls::start({
        let c = Arc::clone(&c);
        move |req| {
            if req != "kill-primary" {
                return Err(format!("unknown request {req:?}"));
            }
            let mut c = c.lock().unwrap_or_else(|p| p.into_inner());
            eprintln!("killing the primary node{first} under fio");
            c.nodes[first].kill9();
            Ok(format!("killed node{first}"))
        }
    })
    .expect("host call listener");
    let mut all_forwards = forwards;
    all_forwards.push(calls.forward(GUEST_CALL_PORT));
    let config = GuestConfig {
        forwards: all_forwards,
        memory_mib: 512,
        timeout: Duration::from_secs(300),
        ..GuestConfig::default()
    };
    let run = boot_ok(config, &guest_script(), "guest-mpath-done");
    let c = c.lock().unwrap_or_else(|p| p.into_inner());
    let port_of = |node: usize| BASE_PORT + node as u16;

    // Before: one map of three paths, all up; the primary's path alone is
    // active/optimized and alone in the active group.
    let map = console_value(&run, "MAP ");
    assert_eq!(map.split_whitespace().nth(1), Some("3"), "map {map:?}");
    let before = paths(&run, "BEFORE-");
    assert_eq!(before.len(), NODES, "{before:?}");
    for p in &before {
        assert_eq!(p.dm, "active", "{before:?}");
        let primary = p.port == port_of(first);
        let want = match primary {
            true => (OPTIMIZED, "50", "active"),
            false => (NON_OPTIMIZED, "10", "other"),
        };
        assert_eq!(
            (p.access.as_str(), p.prio.as_str(), p.group.as_str()),
            want,
            "port {} (primary node{first}): {before:?}",
            p.port
        );
    }
    // Two path groups: the optimized one (alua prio 50) in use.
    let topology = console_values(&run, "BEFORE-LL ");
    let groups: Vec<&String> = topology.iter().filter(|l| l.contains("policy=")).collect();
    assert_eq!(groups.len(), 2, "{topology:#?}");
    assert!(
        groups[0].contains("prio=50") && groups[0].contains("status=active"),
        "{topology:#?}"
    );
    assert!(run.console_log.contains("FIO-OK"));
    let done = calls.calls();
    assert_eq!(done.len(), 1, "{done:?}");
    assert!(done[0].answer.is_ok(), "{done:?}");

    // After: the new primary's path is the one optimized path in use.
    let survivor = (first + 1) % NODES;
    let v = c.wait_volume(survivor, VOLUME, "failed over", |v| {
        primary(v).is_some_and(|p| node_index(&p) != first)
    });
    let second = node_index(&primary(&v).expect("a primary"));
    let after = paths(&run, "AFTER-");
    let optimized: Vec<u16> = after
        .iter()
        .filter(|p| {
            p.access == OPTIMIZED && p.prio == "50" && p.dm == "active" && p.group == "active"
        })
        .map(|p| p.port)
        .collect();
    assert_eq!(
        optimized,
        vec![port_of(second)],
        "new primary node{second}: {after:?}\n{}",
        c.logs()
    );
    let dead = after
        .iter()
        .find(|p| p.port == port_of(first))
        .expect("the dead node's path");
    assert_eq!(dead.dm, "failed", "{after:?}");
    // The burst after the failover went to the new primary's path alone.
    let writes: Vec<(String, u64)> = console_values(&run, "WRITES ")
        .iter()
        .map(|l| {
            let (d, n) = l.split_once(' ').expect("WRITES disk count");
            (d.to_string(), n.parse().expect("write count"))
        })
        .collect();
    let new_disk = &after
        .iter()
        .find(|p| p.port == port_of(second))
        .expect("the new primary's path")
        .disk;
    for (disk, n) in &writes {
        match disk == new_disk {
            true => assert!(*n > 0, "no writes on the new primary's path: {writes:?}"),
            false => assert_eq!(*n, 0, "writes off the new primary's path: {writes:?}"),
        }
    }

    // No I/O errors but the dead path's, no oopses in the guest kernel's log.
    let kmsg = console_values(&run, "KMSG ");
    assert!(kmsg.len() > 100, "no kernel log:\n{}", run.console_tail(40));
    let found: Vec<&String> = kmsg
        .iter()
        .filter(|l| {
            (l.contains("I/O error") && !l.contains(&format!("dev {}", dead.disk)))
                || l.contains("Call Trace")
        })
        .collect();
    assert!(found.is_empty(), "guest kernel reported: {found:#?}");
    // The survivors told the guest about the change.
    let notified: usize = (0..NODES)
        .filter(|i| *i != first)
        .map(|i| c.nodes[i].log().matches("iSCSI ALUA state changed").count())
        .sum();
    assert!(notified >= 1, "no ALUA change notice:\n{}", c.logs());
    // And the iSCSI targets had nothing to warn about.
    let warnings: Vec<String> = (0..NODES)
        .flat_map(|i| {
            c.nodes[i]
                .log()
                .lines()
                .filter(|l| {
                    l.contains("basalt_frontend_iscsi")
                        && (l.contains(" WARN ") || l.contains(" ERROR "))
                })
                .map(|l| format!("node{i}: {l}"))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        warnings.is_empty(),
        "iSCSI target warnings:\n{}",
        warnings.join("\n")
    );
}
