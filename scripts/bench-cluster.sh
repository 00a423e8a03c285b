#!/bin/bash
# RF1 vs RF3 on one machine (issue 5): 3 node processes with a real etcd on
# loopback, fio's nbd engine against each volume's primary node. Prints IOPS,
# mean and p99 latency per workload (medians of ROUNDS interleaved rounds,
# default 3) and the RF3/RF1 ratios. Needs etcd, fio and a release build.
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
  $B server --data-dir $W/n$i --capacity 4G --etcd http://127.0.0.1:23790 --node-name n$i --peer-listen 127.0.0.1:$((7100+i)) \
    --nbd-listen 127.0.0.1:$((10900+i)) --nvme-listen 127.0.0.1:0 --api-listen 127.0.0.1:$((8100+i)) >$W/n$i.log 2>&1 &
  PIDS="$PIDS $!"
done
sleep 3
$B volume create rf1 --size 2G --replicas 1 --data-dir $W/n0 >/dev/null
$B volume create rf3 --size 2G --replicas 3 --data-dir $W/n0 >/dev/null
sleep 3
prim() { $B volume show $1 --data-dir $W/n0 --output json | python3 -c 'import json,sys; v=json.load(sys.stdin); print([r["node"] for r in v["replicas"] if r["primary"]][0])'; }
# Fill both volumes, then run every workload on RF1 and RF3 in turn,
# ROUNDS times (interleaved, so both see the same machine), and report the
# median of each and the RF3/RF1 ratio of the medians.
ROUNDS=${ROUNDS:-3}
for vol in rf1 rf3; do
  p=$(prim $vol)
  echo "$vol: primary $p"
  fio --name=pre --ioengine=nbd --uri=nbd://127.0.0.1:$((10900+${p#n}))/$vol --rw=write --bs=1M --iodepth=8 --size=1G >/dev/null 2>&1
done
for round in $(seq 1 $ROUNDS); do
  for spec in "qd1-write --rw=randwrite --iodepth=1" "qd32-randwrite --rw=randwrite --iodepth=32" "qd32-randread --rw=randread --iodepth=32" "qd1-read --rw=randread --iodepth=1"; do
    set -- $spec
    name=$1; shift
    for vol in rf1 rf3; do
      p=$(prim $vol); port=$((10900+${p#n}))
      fio --name=$name --ioengine=nbd --uri=nbd://127.0.0.1:$port/$vol "$@" --bs=4k --size=1G --time_based --runtime=10 --output-format=json 2>/dev/null | sed -n '/^{/,$p' | python3 -c '
import json,sys
j=json.load(sys.stdin)["jobs"][0]
d=j["write"] if j["write"]["io_bytes"]>0 else j["read"]
print("'$vol' '$name' %.0f %.1f %.1f" % (d["iops"], d["clat_ns"]["mean"]/1000, d["clat_ns"]["percentile"]["99.000000"]/1000))' | tee -a $W/results
    done
  done
done
python3 - $W/results <<'PY'
import sys, statistics
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
med = {}
for vol, name, iops, mean, p99 in rows:
    med.setdefault((vol, name), []).append((float(iops), float(mean), float(p99)))
print("median of %d rounds:" % max(len(v) for v in med.values()))
for name in ["qd1-write", "qd32-randwrite", "qd32-randread", "qd1-read"]:
    r = {}
    for vol in ["rf1", "rf3"]:
        v = med.get((vol, name), [])
        if not v:
            continue
        r[vol] = tuple(statistics.median(x[i] for x in v) for i in range(3))
        print("%s %s: %.0f IOPS, mean %.1f us, p99 %.1f us" % (vol, name, *r[vol]))
    if "rf1" in r and "rf3" in r:
        print("  RF3/RF1 %s: IOPS %.2fx, mean latency %.2fx" % (name, r["rf3"][0] / r["rf1"][0], r["rf3"][1] / r["rf1"][1]))
PY
