#!/bin/bash
# Two operations on a replicated volume that go through its primary (this
# session's work on issues 21 and 23): `basalt volume compact` of an RF2
# volume (every replica packs its copy and its snapshots before the answer),
# and the export of its snapshot through a node that holds no replica
# (read from the primary's layer over the peer protocol) against the export
# from a node that holds one (read from its own store).
#
# 3 node processes with a real etcd on loopback; an RF2 lz4 volume of SIZE
# (default 1G) filled by fio with 50%-compressible data, a snapshot taken,
# then, ROUNDS times (default 2):
#   - fio QD1 4k random writes for RUNTIME seconds (default 10) through the
#     primary's node, alone, then again while `volume compact` runs (the
#     compaction's wall time and report are printed; the second round finds
#     the data packed and measures a compaction with nothing left to do);
#   - the snapshot read through a replica's node and through the third
#     node: fio 1 MiB sequential reads at QD8 and 4k random reads at QD1.
# Needs etcd, fio and a release build.
#
#   scripts/bench-replicated-compact-export.sh
set -e
B=${BASALT:-$(dirname "$0")/../target/release/basalt}
RUNTIME=${RUNTIME:-10}
ROUNDS=${ROUNDS:-2}
SIZE=${SIZE:-1G}
W=$(mktemp -d /var/tmp/rfcompact.XXXX)
PIDS=""
EP=""
cleanup() { kill $PIDS $EP 2>/dev/null || true; wait 2>/dev/null || true; rm -rf $W; }
trap cleanup EXIT
etcd --data-dir $W/etcd --listen-client-urls http://127.0.0.1:23791 --advertise-client-urls http://127.0.0.1:23791 --listen-peer-urls http://127.0.0.1:23801 >$W/etcd.log 2>&1 &
EP=$!
sleep 2
for i in 0 1 2; do
  $B server --data-dir $W/n$i --capacity 4G --preallocate --etcd http://127.0.0.1:23791 --node-name n$i --peer-listen 127.0.0.1:$((7200+i)) --cluster-secret-file $W/cluster-secret \
    --nbd-insecure --nbd-listen 127.0.0.1:$((11000+i)) --iscsi-listen 127.0.0.1:0 --nvme-listen 127.0.0.1:0 --api-listen 127.0.0.1:$((8200+i)) >$W/n$i.log 2>&1 &
  PIDS="$PIDS $!"
done
cli() { $B --data-dir $W/n0 "$@"; }
until cli node list >/dev/null 2>&1; do sleep 0.5; done
sleep 2
cli volume create rc --size $SIZE --replicas 2 --compression lz4 >/dev/null
json() { cli volume show rc --output json; }
until json | python3 -c 'import json,sys; v=json.load(sys.stdin); r=v.get("replicas") or []; sys.exit(0 if len(r)==2 and all(x["state"]=="in-sync" for x in r) else 1)'; do sleep 0.5; done
read -r p holder other < <(json | python3 -c '
import json,sys
v=json.load(sys.stdin)
r=v["replicas"]
p=[x["node"] for x in r if x["primary"]][0]
s=[x["node"] for x in r if not x["primary"]][0]
o=[n for n in ("n0","n1","n2") if n not in (p,s)][0]
print(p[1:], s[1:], o[1:])')
uri() { echo "nbd://127.0.0.1:$((11000+$1))/$2"; }
echo "RF2 volume rc: primary n$p, secondary n$holder, no replica on n$other"
fio --name=fill --ioengine=nbd --uri=$(uri $p rc) --rw=write --bs=1M --iodepth=8 --size=$SIZE \
  --buffer_compress_percentage=50 --refill_buffers >/dev/null 2>&1
cli snapshot create rc s1 >/dev/null
run() { fio --name=b --ioengine=nbd --output-format=json --output=$W/fio.json "$@" >/dev/null 2>&1; }
w_stats() { python3 -c 'import json,sys; w=json.load(open(sys.argv[1]))["jobs"][0]["write"]; c=w["clat_ns"]; print("mean %.0f us, p99 %.2f ms, max %.1f ms, %d IOPS" % (c["mean"]/1e3, c["percentile"]["99.000000"]/1e6, c["max"]/1e6, w["iops"]))' $W/fio.json; }
r_stats() { python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["jobs"][0]["read"]; c=r["clat_ns"]; print("%.0f MiB/s, %d IOPS, mean %.0f us" % (r["bw"]/1024, r["iops"], c["mean"]/1e3))' $W/fio.json; }
# Writes go to the volume's second half: the snapshot's blocks stay shared
# in the first.
QD1=(--uri=$(uri $p rc) --rw=randwrite --bs=4k --iodepth=1 --offset=50% --size=25% --runtime=$RUNTIME --time_based --norandommap --refill_buffers --buffer_compress_percentage=50)
for round in $(seq 1 $ROUNDS); do
  run "${QD1[@]}"
  echo "round $round, QD1 writes alone:           $(w_stats)"
  run "${QD1[@]}" &
  fiopid=$!
  sleep 1
  t0=$(date +%s%N)
  report=$($B --data-dir $W/n$other volume compact rc --output json | python3 -c 'import json,sys; r=json.load(sys.stdin); print("%d extents packed, %d MiB into %d MiB" % (r["packed_extents"], r["packed_bytes"]>>20, r["stored_bytes"]>>20))')
  took=$(( ($(date +%s%N) - t0) / 1000000 ))
  wait $fiopid
  echo "round $round, QD1 writes while compacting: $(w_stats); volume compact (through n$other) took $took ms: $report"
  for n in $holder $other; do
    run --uri=$(uri $n rc@s1) --readonly --rw=read --bs=1M --iodepth=8 --size=$SIZE
    seq=$(r_stats)
    run --uri=$(uri $n rc@s1) --readonly --rw=randread --bs=4k --iodepth=1 --runtime=$RUNTIME --time_based --norandommap
    echo "round $round, snapshot through n$n ($( [ $n = $holder ] && echo 'own replica' || echo 'no replica')): 1 MiB QD8 $seq; 4k QD1 $(r_stats)"
  done
done
for i in 0 1 2; do
  echo "n$i: $($B --data-dir $W/n$i status --output json | python3 -c 'import json,sys; s=json.load(sys.stdin); print("packed %d MiB stored in %d MiB" % (s["packed_bytes"]>>20, s["packed_stored_bytes"]>>20))')"
done
