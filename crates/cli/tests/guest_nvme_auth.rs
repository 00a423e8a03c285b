//! NVMe in-band authentication (DH-HMAC-CHAP) with the Linux kernel's own
//! initiator, in a QEMU guest running Debian 12's backports kernel (6.12:
//! 6.1 has no NVMe authentication). The host attached with `basalt volume
//! attach --dhchap` connects with the printed secret, one-way and
//! bidirectional (the kernel checks the target's response too), and writes
//! and reads through the namespace; a wrong secret, a missing secret and a
//! wrong controller secret are refused and leave no namespace. The guest
//! prints how long each connect took, with one to a volume attached without
//! secrets as the baseline (BENCHMARKS.md).
//!
//! Needs qemu-system-x86 and the network to the Debian mirror on first run
//! (the backports kernel is downloaded into the guest cache once).

mod common;

use std::time::Duration;

use basalt_frontend_nvme::{subsystem_nqn, DhchapSecret};
use basalt_guest::{Forward, GuestConfig, GuestKernel, FORWARD_IP};
use common::guest::*;
use common::*;

const VOLUME: &str = "authvol";
/// Attached without secrets: the connect-time baseline.
const PLAIN: &str = "plainvol";
const GUEST_NVME_PORT: u16 = 4420;
const HOST_NQN: &str = "nqn.2014-08.org.nvmexpress:uuid:1f0c7a52-3b1e-4c6f-9d2a-5e8b7c6d4a31";
const HOST_ID: &str = "1f0c7a52-3b1e-4c6f-9d2a-5e8b7c6d4a31";

/// A secret nobody was given: well formed, wrong key.
fn wrong_secret() -> String {
    DhchapSecret {
        transform: 1,
        key: vec![7; 32],
    }
    .encode()
}

fn script(secret: &str, ctrl_secret: &str) -> String {
    format!(
        r#"{SH_PRELUDE}
SUB={sub}
T="-t tcp -a {ip} -s {port} --hostnqn {host} --hostid {host_id}"
has_ns() {{ ls /sys/block | grep -q '^nvme[0-9]*n[0-9]*$'; }}
no_ns() {{ ! has_ns; }}
ms() {{ cut -d' ' -f1 /proc/uptime | awk '{{printf "%d", $1 * 1000}}'; }}

step wrong secret
if nvme connect $T -n $SUB --dhchap-secret {wrong}; then echo "connected with a wrong secret"; exit 1; fi
no_ns
step no secret
if nvme connect $T -n $SUB; then echo "connected without a secret"; exit 1; fi
no_ns

step one-way
t0=$(ms)
nvme connect $T -n $SUB --dhchap-secret {secret}
wait_until 100 has_ns
echo "AUTH-CONNECT-MS one-way $(( $(ms) - t0 ))"
NS=$(ls /sys/block | grep '^nvme[0-9]*n[0-9]*$' | head -1)
dd if=/dev/urandom of=/tmp/blob bs=64k count=16
dd if=/tmp/blob of=/dev/$NS bs=64k oflag=direct
dd if=/dev/$NS of=/tmp/back bs=64k count=16 iflag=direct
cmp /tmp/blob /tmp/back
nvme disconnect -n $SUB
wait_until 100 no_ns

step bidirectional
t0=$(ms)
nvme connect $T -n $SUB --dhchap-secret {secret} --dhchap-ctrl-secret {ctrl}
wait_until 100 has_ns
echo "AUTH-CONNECT-MS bidirectional $(( $(ms) - t0 ))"
dd if=/dev/$NS of=/tmp/back2 bs=64k count=16 iflag=direct
cmp /tmp/blob /tmp/back2
nvme disconnect -n $SUB
wait_until 100 no_ns

step baseline without authentication
t0=$(ms)
nvme connect $T -n {plain_sub}
wait_until 100 has_ns
echo "AUTH-CONNECT-MS none $(( $(ms) - t0 ))"
nvme disconnect -n {plain_sub}
wait_until 100 no_ns

step wrong controller secret
if nvme connect $T -n $SUB --dhchap-secret {secret} --dhchap-ctrl-secret {wrong}; then
    echo "accepted a controller that proved a wrong secret"; exit 1
fi
no_ns
if dmesg | grep -i "I/O error"; then exit 1; fi
echo guest-auth-done
"#,
        sub = subsystem_nqn(VOLUME),
        plain_sub = subsystem_nqn(PLAIN),
        ip = FORWARD_IP,
        port = GUEST_NVME_PORT,
        host = HOST_NQN,
        host_id = HOST_ID,
        wrong = wrong_secret(),
        secret = secret,
        ctrl = ctrl_secret,
    )
}

#[test]
fn kernel_initiator_authenticates_with_dhchap() {
    require_tool("qemu-system-x86_64");
    let advertise = format!("{FORWARD_IP}:{GUEST_NVME_PORT}");
    let s = Server::start_with("512M", &["--nvme-advertise", &advertise]);
    s.create_volume(VOLUME, "64M");
    s.create_volume(PLAIN, "64M");
    s.cli(&["volume", "attach", PLAIN, "--host-nqn", HOST_NQN])
        .ok();
    let attached = s.cli_json(&[
        "volume",
        "attach",
        VOLUME,
        "--host-nqn",
        HOST_NQN,
        "--dhchap",
    ]);
    let secret = attached["dhchap_secret"].as_str().expect("host secret");
    let ctrl = attached["dhchap_ctrl_secret"]
        .as_str()
        .expect("controller secret");
    assert!(secret.starts_with("DHHC-1:01:"), "{attached}");
    assert_eq!(attached["nvme_hosts_dhchap"][0], HOST_NQN, "{attached}");
    // The secrets are shown once: never in `volume show`.
    let shown = s.cli(&["volume", "show", VOLUME, "--output", "json"]);
    assert!(
        !shown.ok().contains(&secret[10..30]),
        "{}",
        shown.describe()
    );

    let config = GuestConfig {
        kernel: GuestKernel::Backports,
        forwards: vec![Forward::new(GUEST_NVME_PORT, s.nvme_addr())],
        memory_mib: 512,
        timeout: Duration::from_secs(600),
        ..GuestConfig::default()
    };
    let run = boot_ok(config, &script(secret, ctrl), "guest-auth-done");
    for (mode, ms) in console_values(&run, "AUTH-CONNECT-MS ")
        .iter()
        .filter_map(|l| l.split_once(' '))
    {
        eprintln!("DH-HMAC-CHAP connect ({mode}), under TCG: {ms} ms");
    }
    let log = s.log();
    assert!(
        log.contains("NVMe in-band authentication failed"),
        "the refused connects are logged:\n{log}"
    );
}
