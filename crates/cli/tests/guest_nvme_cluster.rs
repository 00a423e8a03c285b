//! Linux native NVMe multipath over a 3-node Basalt cluster, inside a QEMU
//! guest (see the basalt-guest crate): one RF3 volume reached through
//! every node's NVMe/TCP target under the same subsystem NQN. The guest
//! discovers through node 0 (whose discovery log lists the subsystem at
//! every node's address), connects to all of them (`nvme connect-all`)
//! and must see one subsystem with three paths,
//! exactly one of them ANA-optimized (the primary's; the others forward and
//! report non-optimized). fio with crc32c verification then runs while the
//! test kills the primary with SIGKILL (asked through `host_call`): fio
//! must finish without an I/O or verify error, and afterwards the guest
//! must see the new primary's path optimized (the target's ANA change
//! event made the kernel re-read the ANA log).
//!
//! Needs qemu-system-x86, apt's package lists (like `guest_nvme.rs`) and
//! etcd (like `cluster.rs`).

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use basalt_frontend_nvme::subsystem_nqn;
use basalt_guest::{Forward, GuestConfig, HostCalls, FORWARD_IP};
use common::cluster::*;
use common::guest::*;
use common::*;

const VOLUME: &str = "mpath";
const NODES: usize = 3;
/// Node `i` is reached (and advertised) at `FORWARD_IP:BASE_PORT + i`.
const BASE_PORT: u16 = 4420;
const GUEST_CALL_PORT: u16 = 7000;
const HOST_NQN: &str = "nqn.2014-08.org.nvmexpress:uuid:3f0b7c1e-9a2d-4c5b-8e6f-7a1b2c3d4e5f";
const HOST_ID: &str = "3f0b7c1e-9a2d-4c5b-8e6f-7a1b2c3d4e5f";
/// Seconds fio runs; the primary dies `KILL_AFTER` seconds into it.
const FIO_SECONDS: u32 = 15;
const KILL_AFTER: u32 = 4;

fn guest_script() -> String {
    format!(
        r#"{SH_PRELUDE}
{host_call}
SUB={sub}
H={host} HID={host_id}
# Prints "PATH <trsvcid> <controller state> <ANA state>" per path.
paths() {{
    local p c
    for p in /sys/block/nvme*c*n*; do
        [ -e "$p" ] || continue
        c=${{p##*/}}; c=nvme${{c#nvme*c}}; c=${{c%n*}}
        echo "PATH $(sed 's/.*trsvcid=\([0-9]*\).*/\1/' /sys/class/nvme/$c/address) $(cat /sys/class/nvme/$c/state) $(cat $p/ana_state)"
    done
}}
live_optimized() {{ paths | awk '$3 == "live" && $4 == "optimized"' | wc -l; }}
one_optimized() {{ [ "$(live_optimized)" -eq 1 ]; }}
three_paths() {{ [ "$(ls -d /sys/block/nvme*c*n* 2>/dev/null | wc -l)" -eq 3 ]; }}

step discovery through one node lists every node
nvme discover -t tcp -a {ip} -s {first_port} --hostnqn $H --hostid $HID | tee /tmp/disc
for port in {ports}; do
    grep -Eq "trsvcid: *$port( |\$)" /tmp/disc
done

step connect every node
nvme connect-all -t tcp -a {ip} -s {first_port} --hostnqn $H --hostid $HID
wait_until 100 three_paths
nvme list-subsys | tee /tmp/subsys
test "$(grep -c "$SUB" /tmp/subsys)" -eq 1
NS=
for d in /sys/block/nvme*n*; do
    case "${{d##*/}}" in *c*) continue ;; esac
    NS=${{d##*/}}
done
echo "namespace: $NS"
test "$(ls /sys/class/nvme-subsystem/*/ | grep -c '^nvme[0-9]*$')" -eq 3
wait_until 100 one_optimized
# Through a file: a pipe would interleave with the shell's trace.
paths > /tmp/before
sed 's/^/BEFORE-/' /tmp/before

step fio while the primary dies
( sleep {kill_after}; host_call kill-primary ) &
KILLER=$!
cd /tmp
fio --name=mpath --filename=/dev/$NS --ioengine=libaio --direct=1 \
    --rw=randwrite --bs=4k --iodepth=8 --size=32M \
    --time_based --runtime={fio_seconds} \
    --verify=crc32c --verify_backlog=256 --verify_fatal=1 --verify_state_save=0 \
    --do_verify=1 --group_reporting
wait $KILLER
echo FIO-OK

step the new primary is optimized
wait_until 300 one_optimized
paths > /tmp/after
sed 's/^/AFTER-/' /tmp/after
nvme disconnect -n $SUB
step done
echo guest-mpath-done
"#,
        host_call = HostCalls::shell_function(GUEST_CALL_PORT),
        sub = subsystem_nqn(VOLUME),
        host = HOST_NQN,
        host_id = HOST_ID,
        ip = FORWARD_IP,
        first_port = BASE_PORT,
        ports = (0..NODES)
            .map(|i| (BASE_PORT + i as u16).to_string())
            .collect::<Vec<_>>()
            .join(" "),
        kill_after = KILL_AFTER,
        fio_seconds = FIO_SECONDS,
    )
}

/// (trsvcid, controller state, ANA state) of the console lines
/// `<prefix>PATH ...`.
fn paths(run: &basalt_guest::GuestRun, prefix: &str) -> Vec<(u16, String, String)> {
    console_values(run, &format!("{prefix}PATH "))
        .iter()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 3, "path line {l:?}");
            (
                f[0].parse()
                    .unwrap_or_else(|e| panic!("port in {l:?}: {e}")),
                f[1].to_string(),
                f[2].to_string(),
            )
        })
        .collect()
}

#[test]
fn kernel_multipath_follows_the_primary_across_a_node_kill() {
    require_tool("qemu-system-x86_64");
    let c = Cluster::start_with(NODES, &[], |i| {
        vec![
            "--nvme-advertise".into(),
            format!("{FORWARD_IP}:{}", BASE_PORT + i as u16),
            "--nvme-allow-host".into(),
            HOST_NQN.into(),
        ]
    });
    c.nodes[0]
        .cli(&[
            "volume",
            "create",
            VOLUME,
            "--size",
            "64M",
            "--replicas",
            "3",
        ])
        .ok();
    let v = c.wait_volume(1, VOLUME, "placed and in sync", |v| all_in_sync(v, 3));
    let first = node_index(&primary(&v).expect("a primary"));
    let forwards: Vec<Forward> = c
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| Forward::new(BASE_PORT + i as u16, n.nvme_addr()))
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

    // Before: three live paths, the primary's optimized, the others not.
    let before = paths(&run, "BEFORE-");
    assert_eq!(before.len(), NODES, "{before:?}");
    for (port, state, ana) in &before {
        assert_eq!(state, "live", "{before:?}");
        let want = if *port == BASE_PORT + first as u16 {
            "optimized"
        } else {
            "non-optimized"
        };
        assert_eq!(ana, want, "port {port} (primary node{first}): {before:?}");
    }
    assert!(run.console_log.contains("FIO-OK"));
    let done = calls.calls();
    assert_eq!(done.len(), 1, "{done:?}");
    assert!(done[0].answer.is_ok(), "{done:?}");

    // After: the new primary's path is the one live optimized path.
    let survivor = (first + 1) % NODES;
    let v = c.wait_volume(survivor, VOLUME, "failed over", |v| {
        primary(v).is_some_and(|p| node_index(&p) != first)
    });
    let second = node_index(&primary(&v).expect("a primary"));
    let after = paths(&run, "AFTER-");
    let optimized: Vec<u16> = after
        .iter()
        .filter(|(_, state, ana)| state == "live" && ana == "optimized")
        .map(|(port, _, _)| *port)
        .collect();
    assert_eq!(
        optimized,
        vec![BASE_PORT + second as u16],
        "new primary node{second}: {after:?}\n{}",
        c.logs()
    );
    let dead = after
        .iter()
        .find(|(port, _, _)| *port == BASE_PORT + first as u16)
        .expect("the dead node's path");
    assert_ne!(dead.1, "live", "{after:?}");

    // No I/O errors or oopses in the guest kernel's log.
    for bad in ["I/O error", "Call Trace"] {
        assert!(
            !run.console_log
                .lines()
                .any(|l| l.starts_with('[') && l.contains(bad)),
            "guest kernel reported {bad:?}:\n{}",
            run.console_log
        );
    }
    // The survivors told the guest about the change.
    let notified: usize = (0..NODES)
        .filter(|i| *i != first)
        .map(|i| c.nodes[i].log().matches("NVMe ANA state changed").count())
        .sum();
    assert!(notified >= 1, "no ANA change notice:\n{}", c.logs());
}
