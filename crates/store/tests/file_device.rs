//! The engine on a real data file (O_DIRECT + io_uring): what was flushed
//! is there after the process drops the store without closing it (as after
//! `kill -9`), and a clean close reopens without recovery.

use basalt_store::{FileDevice, FormatOptions, Store};

#[test]
fn flushed_data_survives_an_unclean_stop_on_a_file() {
    let dir = tempfile::tempdir().unwrap();
    unclean_stop_then_reopen(&dir.path().join("basalt.data"));
}

/// The same on tmpfs, where the device does its I/O with pread/pwrite on
/// the calling thread instead of io_uring.
#[test]
fn flushed_data_survives_an_unclean_stop_on_tmpfs() {
    let shm = std::path::Path::new("/dev/shm");
    assert!(shm.is_dir(), "/dev/shm (tmpfs) is needed for this test");
    let dir = tempfile::tempdir_in(shm).unwrap();
    unclean_stop_then_reopen(&dir.path().join("basalt.data"));
}

fn unclean_stop_then_reopen(path: &std::path::Path) {
    let path = path.to_path_buf();
    let dev = FileDevice::create(&path, 64 << 20, false).unwrap();
    let store = Store::create(dev, &FormatOptions::default()).unwrap();
    let (a, b) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
    store.create_volume(a, 8 << 20).unwrap();
    store.create_volume(b, 8 << 20).unwrap();
    let va = store.volume(a).unwrap();
    let vb = store.volume(b).unwrap();
    let data: Vec<u8> = (0..2 << 20).map(|i: u32| (i % 251) as u8).collect();
    va.write(0, &data, false).unwrap();
    vb.write(1 << 20, &data[..4096], true).unwrap();
    va.trim(64 << 10, 64 << 10, false).unwrap();
    vb.flush().unwrap();
    drop((va, vb));
    drop(store); // no close: like kill -9

    let dev = FileDevice::open(&path).unwrap();
    let store = Store::open(dev).unwrap();
    let va = store.volume(a).unwrap();
    let mut back = vec![0u8; 2 << 20];
    va.read(0, &mut back).unwrap();
    let mut expected = data.clone();
    expected[64 << 10..128 << 10].fill(0);
    assert!(back == expected, "flushed data lost after unclean stop");
    let mut blk = vec![0u8; 4096];
    store.volume(b).unwrap().read(1 << 20, &mut blk).unwrap();
    assert_eq!(blk, data[..4096]);
    store.close().unwrap();
    drop(store);
    let store = Store::open(FileDevice::open(&path).unwrap()).unwrap();
    store.volume(a).unwrap().read(0, &mut back).unwrap();
    assert!(back == expected, "data lost after clean close");
}

#[test]
fn flushed_data_survives_two_unclean_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("basalt.data");
    let store = Store::create(
        FileDevice::create(&path, 64 << 20, false).unwrap(),
        &FormatOptions::default(),
    )
    .unwrap();
    let a = uuid::Uuid::new_v4();
    store.create_volume(a, 8 << 20).unwrap();
    drop(store);
    let store = Store::open(FileDevice::open(&path).unwrap()).unwrap();
    let data = vec![0x78u8; 2 << 20];
    let writer = std::thread::spawn({
        let v = store.volume(a).unwrap();
        let data = data.clone();
        move || v.write(4 << 20, &data, false).unwrap()
    });
    writer.join().unwrap();
    store.volume(a).unwrap().flush().unwrap();
    drop(store);
    let store = Store::open(FileDevice::open(&path).unwrap()).unwrap();
    let mut back = vec![0u8; 2 << 20];
    store.volume(a).unwrap().read(4 << 20, &mut back).unwrap();
    assert!(
        back == data,
        "flushed data lost after the second unclean restart"
    );
}
