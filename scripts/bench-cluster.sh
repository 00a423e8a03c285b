#!/bin/bash
# RF1 vs RF3 on one machine (issue 5): 3 node processes with a real etcd on
# loopback, `basalt bench run matrix` (4k random at QD1 and QD32, 1 MiB
# sequential writes at QD8) and `db-latency` (the database pattern)
# comparing an RF1 and an RF3 volume through each one's primary
# node (fio's nbd engine). Prints IOPS, mean and p99 latency per workload
# (medians of ROUNDS rounds, default 3; RUNTIME seconds per cell, default
# 10) and the RF3/RF1 ratios; each round's report is kept under OUT. Needs
# etcd, fio and a release build.
set -e
B=${BASALT:-$(dirname "$0")/../target/release/basalt}
W=$(mktemp -d /var/tmp/rfbench.XXXX)
PIDS=""
EP=""
# Whatever happens, stop what this script started (a server or etcd left
# behind would answer the next run on the same ports).
cleanup() { kill $PIDS $EP 2>/dev/null || true; wait 2>/dev/null || true; rm -rf $W; }
trap cleanup EXIT
etcd --data-dir $W/etcd --listen-client-urls http://127.0.0.1:23790 --advertise-client-urls http://127.0.0.1:23790 --listen-peer-urls http://127.0.0.1:23800 >$W/etcd.log 2>&1 &
EP=$!
sleep 2
for i in 0 1 2; do
  $B server --data-dir $W/n$i --capacity 4G --etcd http://127.0.0.1:23790 --node-name n$i --peer-listen 127.0.0.1:$((7100+i)) --cluster-secret-file $W/cluster-secret \
    --nbd-insecure --nbd-listen 127.0.0.1:$((10900+i)) --iscsi-listen 127.0.0.1:0 --nvme-listen 127.0.0.1:0 --api-listen 127.0.0.1:$((8100+i)) >$W/n$i.log 2>&1 &
  PIDS="$PIDS $!"
done
sleep 3
# 1 GiB volumes, filled in full below: the bench's fio jobs span the whole
# volume, and a first write to a region would measure its allocation and,
# for RF3, the region's first crash-log save (docs/cluster.md).
$B volume create rf1 --size 1G --replicas 1 --data-dir $W/n0 >/dev/null
$B volume create rf3 --size 1G --replicas 3 --data-dir $W/n0 >/dev/null
sleep 3
prim() { $B volume show $1 --data-dir $W/n0 --output json | python3 -c 'import json,sys; v=json.load(sys.stdin); print([r["node"] for r in v["replicas"] if r["primary"]][0])'; }
# Fill both volumes, then measure both with `basalt bench` (matrix profile,
# the two volumes compared cell by cell, interleaved), ROUNDS times, and
# report the median of each figure and the RF3/RF1 ratio of the medians.
# Each round's full report (tables, charts, HTML) stays in $OUT/round-N.
ROUNDS=${ROUNDS:-3}
OUT=${OUT:-$(pwd)/bench-results/cluster-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p $OUT
uri() { p=$(prim $1); echo nbd://127.0.0.1:$((10900+${p#n}))/$1; }
RF1=$(uri rf1)
RF3=$(uri rf3)
echo "rf1: $RF1"
echo "rf3: $RF3"
for vol in $RF1 $RF3; do
  fio --name=pre --ioengine=nbd --uri=$vol --rw=write --bs=1M --iodepth=8 --size=1G >/dev/null 2>&1
done
for round in $(seq 1 $ROUNDS); do
  $B bench run matrix --compare $RF1,$RF3 --rw randwrite,randread --bs 4k --numjobs 1 \
    --iodepth 1,32 --runtime ${RUNTIME:-10} --size 1G --out $OUT/round-$round >/dev/null
  # Sequential 1 MiB writes at QD8 (issue 20's RF3 throughput target).
  # (the datapath profile; its 1 MiB write cell is the one reported)
  $B bench run datapath --compare $RF1,$RF3 \
    --runtime ${RUNTIME:-10} --out $OUT/seq-round-$round >/dev/null
  # The database pattern: 8k random writes at QD1, fsync after each.
  $B bench run db-latency --compare $RF1,$RF3 --runtime ${RUNTIME:-10} --size 1G \
    --out $OUT/db-round-$round >/dev/null
done
python3 - $OUT $ROUNDS $RF1 $RF3 <<'PY'
import json, statistics, sys
out, rounds, uris = sys.argv[1], int(sys.argv[2]), {"rf1": sys.argv[3], "rf3": sys.argv[4]}
figures = {}
for r in range(1, rounds + 1):
    for cell in json.load(open("%s/round-%d/summary.json" % (out, r)))["cells"]:
        w = cell["workload"]
        m = cell["outcome"].get("metrics", {})
        d = m.get("write") or m.get("read")
        if cell["outcome"].get("status") != "ok" or not d:
            continue
        key = (cell["target"], w["rw"], w["iodepth"])
        figures.setdefault(key, []).append((d["iops"], d["latency"]["mean_us"], d["latency"]["p99_us"]))
print("basalt bench, median of %d rounds (reports in %s):" % (rounds, out))
for rw in ["randwrite", "randread"]:
    for qd in [1, 32]:
        med = {}
        for vol, uri in uris.items():
            v = figures.get((uri, rw, qd))
            if v:
                med[vol] = [statistics.median(x[i] for x in v) for i in range(3)]
                print("%s %s QD%d: %.0f IOPS, mean %.1f us, p99 %.1f us" % (vol, rw, qd, *med[vol]))
        if len(med) == 2:
            print("  RF3/RF1 %s QD%d: IOPS %.2fx, mean latency %.2fx" % (rw, qd, med["rf3"][0] / med["rf1"][0], med["rf3"][1] / med["rf1"][1]))
seq = {}
for r in range(1, rounds + 1):
    for cell in json.load(open("%s/seq-round-%d/summary.json" % (out, r)))["cells"]:
        d = cell["outcome"].get("metrics", {}).get("write")
        if cell["outcome"].get("status") == "ok" and d and cell["workload"]["rw"] == "write":
            seq.setdefault(cell["target"], []).append(d["bandwidth_bytes_per_sec"] / 1048576)
for vol, uri in uris.items():
    if uri in seq:
        print("%s 1 MiB sequential write QD8: %.0f MiB/s" % (vol, statistics.median(seq[uri])))
db = {}
for r in range(1, rounds + 1):
    for cell in json.load(open("%s/db-round-%d/summary.json" % (out, r)))["cells"]:
        m = cell["outcome"].get("metrics", {})
        if cell["outcome"].get("status") != "ok" or "write" not in m or "sync" not in m:
            continue
        w, s = m["write"], m["sync"]
        db.setdefault(cell["target"], []).append((w["iops"], w["latency"]["mean_us"], s["mean_us"], w["latency"]["p99_us"]))
med = {}
for vol, uri in uris.items():
    if uri in db:
        med[vol] = [statistics.median(x[i] for x in db[uri]) for i in range(4)]
        print("%s 8k randwrite QD1 + fsync: %.0f IOPS, write mean %.1f us, fsync mean %.1f us, write p99 %.1f us" % (vol, *med[vol]))
if len(med) == 2:
    print("  RF3/RF1 8k randwrite QD1 + fsync: IOPS %.2fx" % (med["rf3"][0] / med["rf1"][0]))
PY
