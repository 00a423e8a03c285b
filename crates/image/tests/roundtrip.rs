//! Property: any sparse set of clusters written by `Qcow2Writer`, in any
//! order, reads back identically through `Qcow2Reader`, holes as zeros, and
//! its extents are exactly the written clusters.

use std::io::Cursor;

use basalt_image::{ExtentKind, Qcow2Reader, Qcow2Writer};
use proptest::prelude::*;

/// (cluster_bits, virtual size, clusters to write in this order with a
/// fill seed each).
fn image_plan() -> impl Strategy<Value = (u32, u64, Vec<(u64, u8)>)> {
    (9u32..=14, 0u64..300, 0u64..(1 << 14)).prop_flat_map(|(bits, clusters, tail)| {
        let cs = 1u64 << bits;
        // Sizes that end mid-cluster as well as on a boundary (in whole
        // 512-byte sectors, as qcow2 sizes are).
        let size = clusters * cs + (tail % cs) / 512 * 512;
        let count = size.div_ceil(cs);
        let picks = if count == 0 {
            Just(Vec::new()).boxed()
        } else {
            proptest::collection::vec((0..count, any::<u8>()), 0..64).boxed()
        };
        (Just(bits), Just(size), picks).prop_map(|(bits, size, picks)| {
            // Keep the first write of each index: each is written once.
            let mut seen = std::collections::HashSet::new();
            let picks = picks.into_iter().filter(|(i, _)| seen.insert(*i)).collect();
            (bits, size, picks)
        })
    })
}

fn cluster_data(cs: u64, index: u64, seed: u8) -> Vec<u8> {
    (0..cs)
        .map(|i| (i as u8).wrapping_add(seed).wrapping_mul(index as u8 | 1))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn written_clusters_read_back((bits, size, picks) in image_plan(), probe in any::<u64>()) {
        let cs = 1u64 << bits;
        let mut expected = vec![0u8; size as usize];
        let mut w = Qcow2Writer::create(Cursor::new(Vec::new()), size, bits).unwrap();
        for &(index, seed) in &picks {
            let mut data = cluster_data(cs, index, seed);
            let start = (index * cs) as usize;
            let end = (start + cs as usize).min(expected.len());
            data[end - start..].fill(0);
            expected[start..end].copy_from_slice(&data[..end - start]);
            w.write_cluster(index, &data).unwrap();
        }
        let image = w.finish().unwrap().into_inner();
        prop_assert_eq!(image.len() as u64 % cs, 0);

        let r = Qcow2Reader::open(image).unwrap();
        prop_assert_eq!(r.virtual_size(), size);
        prop_assert_eq!(r.cluster_size(), cs);
        let mut got = vec![0u8; size as usize];
        r.read(0, &mut got).unwrap();
        prop_assert!(got == expected);

        // A random sub-range.
        if size > 0 {
            let start = probe % size;
            let len = (probe >> 32) % (size - start + 1);
            let mut part = vec![0u8; len as usize];
            r.read(start, &mut part).unwrap();
            prop_assert!(part[..] == expected[start as usize..(start + len) as usize]);
        }

        let mut covered = 0;
        for e in r.extents().unwrap() {
            prop_assert_eq!(e.offset, covered);
            covered += e.len;
            for c in e.offset / cs..(e.offset + e.len).div_ceil(cs) {
                let written = picks.iter().any(|&(i, _)| i == c);
                prop_assert_eq!(e.kind == ExtentKind::Data, written, "cluster {}", c);
            }
        }
        prop_assert_eq!(covered, size);
    }
}
