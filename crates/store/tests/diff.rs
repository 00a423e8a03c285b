//! Changed blocks (`Store::changed_blocks`) against a plain model of every
//! layer's content: over seeded histories of writes, zeroing, snapshots,
//! clones, rollbacks, growth and snapshot deletions, every block that reads
//! differently in two layers is reported, and a run reported as zeros reads
//! zeros. A small exact case pins down that the diff is not just "all".

use basalt_store::{ChangedRun, FormatOptions, OpenOptions, SimDevice, Store};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::sync::Arc;
use uuid::Uuid;

const EXTENT: u64 = 64 * 1024;
const BLOCK: u64 = 4096;

fn format(dev: &Arc<SimDevice>) -> Arc<Store> {
    Store::create_with(
        dev.clone(),
        &FormatOptions {
            extent_size: Some(EXTENT as u32),
            journal_blocks: Some(64),
            ..Default::default()
        },
        &OpenOptions {
            background_zeroing: false,
            ..Default::default()
        },
    )
    .unwrap()
}

fn read_all(store: &Arc<Store>, v: Uuid) -> Vec<u8> {
    let h = store.volume(v).unwrap();
    let mut buf = vec![0u8; h.size() as usize];
    h.read(0, &mut buf).unwrap();
    buf
}

/// Checks the diff of `to` against `from` (None: against nothing).
fn check_diff(store: &Arc<Store>, from: Option<Uuid>, to: Uuid, what: &str) {
    let runs = store.changed_blocks(from, to).unwrap();
    let new = read_all(store, to);
    let old = from.map(|f| read_all(store, f)).unwrap_or_default();
    let mut reported = vec![None; new.len().div_ceil(BLOCK as usize)];
    let mut last_end = 0;
    for r in &runs {
        assert!(
            r.offset >= last_end,
            "{what}: runs overlap or go back: {runs:?}"
        );
        assert!(
            r.offset + r.len <= new.len() as u64,
            "{what}: run past the end"
        );
        last_end = r.offset + r.len;
        for b in r.offset / BLOCK..(r.offset + r.len).div_ceil(BLOCK) {
            reported[b as usize] = Some(r.data);
        }
    }
    for (b, kind) in reported.iter().enumerate() {
        let at = b * BLOCK as usize;
        let end = (at + BLOCK as usize).min(new.len());
        let now = &new[at..end];
        let before: Vec<u8> = (at..end)
            .map(|i| old.get(i).copied().unwrap_or(0))
            .collect();
        match kind {
            None => assert_eq!(
                now,
                &before[..],
                "{what}: block {b} changed but was not reported"
            ),
            Some(false) => assert!(
                now.iter().all(|&x| x == 0),
                "{what}: block {b} reported as zeros holds data"
            ),
            Some(true) => {}
        }
    }
}

#[test]
fn a_snapshot_diff_names_exactly_the_blocks_written_since() {
    let dev = SimDevice::new(16 << 20, 1);
    let store = format(&dev);
    let (vol, s1) = (Uuid::from_u128(1), Uuid::from_u128(2));
    store.create_volume(vol, 8 * EXTENT).unwrap();
    let v = store.volume(vol).unwrap();
    v.write(0, &vec![7u8; 2 * EXTENT as usize], false).unwrap();
    store.snapshot(vol, s1).unwrap();
    v.write(EXTENT + 3 * BLOCK, &vec![9u8; 2 * BLOCK as usize], false)
        .unwrap();
    v.write_zeroes(5 * BLOCK, BLOCK, true, false).unwrap();
    v.write(6 * EXTENT, &vec![1u8; BLOCK as usize], false)
        .unwrap();
    assert_eq!(
        store.changed_blocks(Some(s1), vol).unwrap(),
        vec![
            ChangedRun {
                offset: 5 * BLOCK,
                len: BLOCK,
                data: true // zeros written into the layer over the snapshot's data
            },
            ChangedRun {
                offset: EXTENT + 3 * BLOCK,
                len: 2 * BLOCK,
                data: true
            },
            ChangedRun {
                offset: 6 * EXTENT,
                len: BLOCK,
                data: true
            },
        ]
    );
    // Against nothing: what the volume reads data from, block by block.
    let all = store.changed_blocks(None, vol).unwrap();
    assert_eq!(
        all,
        vec![
            ChangedRun {
                offset: 0,
                len: 2 * EXTENT,
                data: true
            },
            ChangedRun {
                offset: 6 * EXTENT,
                len: BLOCK,
                data: true
            },
        ]
    );
    // A volume is not a base to diff from.
    let e = store.changed_blocks(Some(vol), s1).unwrap_err().to_string();
    assert!(e.contains("not a snapshot"), "{e}");
}

#[test]
fn changed_blocks_cover_every_difference_over_random_histories() {
    for seed in 0..40u64 {
        random_history(seed);
    }
}

fn random_history(seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let dev = SimDevice::new(32 << 20, seed);
    let store = format(&dev);
    let mut next_id = 100u128;
    let mut fresh = || {
        next_id += 1;
        Uuid::from_u128(next_id)
    };
    let base = fresh();
    store.create_volume(base, 6 * EXTENT).unwrap();
    // Volumes (heads) and the snapshots of each.
    let mut heads = vec![base];
    let mut snaps: BTreeMap<Uuid, Vec<Uuid>> = BTreeMap::new();
    for step in 0..60 {
        let head = heads[rng.gen_range(0..heads.len())];
        let h = store.volume(head).unwrap();
        let size = h.size();
        match rng.gen_range(0..100) {
            0..=44 => {
                let blocks = rng.gen_range(1..=24u64).min(size / BLOCK);
                let at = rng.gen_range(0..=size / BLOCK - blocks) * BLOCK;
                let fill: u8 = rng.gen_range(1..=255);
                h.write(at, &vec![fill; (blocks * BLOCK) as usize], false)
                    .unwrap();
            }
            45..=59 => {
                let len = rng.gen_range(1..=2 * EXTENT).min(size);
                let at = rng.gen_range(0..=size - len);
                h.write_zeroes(at, len, rng.gen_bool(0.7), false).unwrap();
            }
            60..=74 => {
                let s = fresh();
                store.snapshot(head, s).unwrap();
                snaps.entry(head).or_default().push(s);
            }
            75..=81 => {
                let Some(&s) = snaps.get(&head).and_then(|l| l.last()) else {
                    continue;
                };
                let clone = fresh();
                store.clone_snapshot(s, clone, None).unwrap();
                heads.push(clone);
            }
            82..=86 => {
                let Some(list) = snaps.get(&head).filter(|l| !l.is_empty()) else {
                    continue;
                };
                let s = list[rng.gen_range(0..list.len())];
                store.rollback(head, s).unwrap();
            }
            87..=91 => {
                store.resize_volume(head, size + EXTENT / 2).unwrap();
            }
            _ => {
                let Some(list) = snaps.get_mut(&head).filter(|l| !l.is_empty()) else {
                    continue;
                };
                let i = rng.gen_range(0..list.len());
                if store.delete_snapshot(list[i]).is_ok() {
                    list.remove(i);
                }
            }
        }
        if step % 10 == 9 {
            check_all(&store, &heads, &snaps, seed, step);
        }
    }
    check_all(&store, &heads, &snaps, seed, 60);
}

fn check_all(
    store: &Arc<Store>,
    heads: &[Uuid],
    snaps: &BTreeMap<Uuid, Vec<Uuid>>,
    seed: u64,
    step: u32,
) {
    let all_snaps: Vec<Uuid> = snaps.values().flatten().copied().collect();
    for &head in heads {
        check_diff(
            store,
            None,
            head,
            &format!("seed {seed} step {step}: {head} from nothing"),
        );
        for &s in &all_snaps {
            check_diff(
                store,
                Some(s),
                head,
                &format!("seed {seed} step {step}: {head} from {s}"),
            );
        }
    }
    for &a in &all_snaps {
        for &b in &all_snaps {
            check_diff(
                store,
                Some(a),
                b,
                &format!("seed {seed} step {step}: {b} from {a}"),
            );
        }
    }
}
