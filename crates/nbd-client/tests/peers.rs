//! The client against NBD servers nobody here wrote: nbdkit's memory plugin
//! and qemu-nbd on a qcow2 file. Both must be installed (CI installs them);
//! a missing one fails the test.

use basalt_nbd_client::{Allocation, ClientError, Endpoint, NbdClient, WriteOp};
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_for_socket(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn nbdkit_memory(dir: &Path, size: &str) -> (Server, Endpoint) {
    let socket = dir.join("nbdkit.sock");
    let child = Command::new("nbdkit")
        .args(["--foreground", "--exit-with-parent", "-U"])
        .arg(&socket)
        .args(["memory", size])
        .spawn()
        .expect("nbdkit must be installed (apt-get install nbdkit)");
    wait_for_socket(&socket);
    (Server(child), Endpoint::Unix(socket))
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u64).wrapping_mul(31).wrapping_add(seed * 7) % 251) as u8)
        .collect()
}

#[test]
fn pipelined_writes_read_back_and_holes_show_in_the_allocation_map() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, endpoint) = nbdkit_memory(dir.path(), "64M");
    let mut c = NbdClient::connect(&endpoint, "").unwrap();
    assert_eq!(c.size(), 64 * MIB);
    assert!(!c.is_read_only());

    // 1 MiB writes at every other MiB of the first 32, 8 in flight.
    let writes = (0..16u64).map(|i| {
        Ok::<_, ClientError>(WriteOp::Data {
            offset: i * 2 * MIB,
            data: pattern(MIB as usize, i),
        })
    });
    c.write_pipelined(writes, 8).unwrap();
    c.flush().unwrap();

    let mut seen = 0;
    c.read_pipelined::<ClientError>(
        (0..16u64).map(|i| (i * 2 * MIB, MIB as u32)),
        8,
        |at, data| {
            let i = at / (2 * MIB);
            assert_eq!(data, pattern(MIB as usize, i), "MiB {i}");
            seen += 1;
            Ok(())
        },
    )
    .unwrap();
    assert_eq!(seen, 16);

    let runs = c.allocation(0, 64 * MIB).unwrap();
    let data: u64 = runs
        .iter()
        .filter(|r| r.2 == Allocation::Data)
        .map(|r| r.1)
        .sum();
    assert_eq!(data, 16 * MIB, "{runs:?}");
    assert_eq!(runs.iter().map(|r| r.1).sum::<u64>(), 64 * MIB);
    assert_eq!(runs[1], (MIB, MIB, Allocation::Zero));

    // Zeroing punches the data away again.
    c.write_pipelined(
        [Ok::<_, ClientError>(WriteOp::Zeroes {
            offset: 0,
            len: MIB as u32,
            trim: true,
        })],
        1,
    )
    .unwrap();
    c.read_pipelined::<ClientError>([(0, 4096)], 1, |_, d| {
        assert!(d.iter().all(|&b| b == 0));
        Ok(())
    })
    .unwrap();
    c.disconnect().unwrap();
}

#[test]
fn bad_requests_and_unknown_exports_get_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, endpoint) = nbdkit_memory(dir.path(), "1M");
    let mut c = NbdClient::connect(&endpoint, "").unwrap();
    let e = c
        .read_pipelined::<ClientError>([(MIB - 512, 1024)], 1, |_, _| Ok(()))
        .unwrap_err();
    assert!(matches!(e, ClientError::OutOfRange { .. }), "{e}");
    // The producer's error stops the pipeline and comes back as is.
    let e = c
        .write_pipelined([Err(ClientError::ReadOnly)], 4)
        .unwrap_err();
    assert!(matches!(e, ClientError::ReadOnly));

    let e = NbdClient::connect(&Endpoint::Unix(dir.path().join("none.sock")), "").unwrap_err();
    assert!(e.to_string().contains("cannot reach the NBD server"), "{e}");
}

#[test]
fn qemu_nbd_serves_a_read_only_qcow2_with_its_holes() {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("img.qcow2");
    let ok = Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2"])
        .arg(&image)
        .arg("8M")
        .status()
        .expect("qemu-img must be installed (apt-get install qemu-utils)");
    assert!(ok.success());
    let ok = Command::new("qemu-io")
        .args(["-f", "qcow2", "-c", "write -P 0x5a 2M 64k"])
        .arg(&image)
        .output()
        .unwrap();
    assert!(ok.status.success());
    let socket = dir.path().join("qemu-nbd.sock");
    let child = Command::new("qemu-nbd")
        .args(["-r", "-f", "qcow2", "-k"])
        .arg(&socket)
        .arg(&image)
        .spawn()
        .expect("qemu-nbd must be installed");
    let _server = Server(child);
    wait_for_socket(&socket);
    let mut c = NbdClient::connect(&Endpoint::Unix(socket), "").unwrap();
    assert!(c.is_read_only());
    assert_eq!(c.size(), 8 * MIB);
    let runs = c.allocation(0, 8 * MIB).unwrap();
    assert_eq!(
        runs,
        vec![
            (0, 2 * MIB, Allocation::Zero),
            (2 * MIB, 64 << 10, Allocation::Data),
            (2 * MIB + (64 << 10), 6 * MIB - (64 << 10), Allocation::Zero)
        ]
    );
    c.read_pipelined::<ClientError>([(2 * MIB, 64 << 10)], 1, |_, d| {
        assert!(d.iter().all(|&b| b == 0x5a));
        Ok(())
    })
    .unwrap();
    let e = c
        .write_pipelined(
            [Ok::<_, ClientError>(WriteOp::Zeroes {
                offset: 0,
                len: 4096,
                trim: false,
            })],
            1,
        )
        .unwrap_err();
    assert!(matches!(e, ClientError::ReadOnly));
}
