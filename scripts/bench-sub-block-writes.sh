#!/bin/bash
# What sub-block writes to a replicated volume cost: a 512-byte write is a
# read-modify-write of its 4 KiB block by the node the client reaches,
# which since peer protocol v12 writes only if the block still holds what
# it read (`ClientReq::CompareWrite`: the primary reads its copy,
# compares, writes; a read more on the primary's disk than a plain
# write). Run it once per build to compare (BASALT=path/to/basalt).
#
# 3 node processes with a real etcd on loopback, an RF2 volume of SIZE
# (default 256M) filled by fio, then ROUNDS times (default 2), fio's nbd
# engine at QD1 for RUNTIME seconds (default 8) each:
#   - 4k random writes (whole blocks: no read) and 512-byte random writes,
#     through the primary's node and through the node holding no replica;
#   - 512-byte writes from two clients at once, one through each of those
#     two nodes, into the same 64 KiB (the blocks they share are written
#     by both: with v12 a node whose read another write overtook reads
#     again).
# Needs etcd, fio and a release build.
#
#   BASALT=target/release/basalt scripts/bench-sub-block-writes.sh
set -e
B=${BASALT:-$(dirname "$0")/../target/release/basalt}
RUNTIME=${RUNTIME:-8}
ROUNDS=${ROUNDS:-2}
SIZE=${SIZE:-256M}
W=$(mktemp -d /var/tmp/rfsub.XXXX)
PIDS=""
EP=""
cleanup() { kill $PIDS $EP 2>/dev/null || true; wait 2>/dev/null || true; rm -rf $W; }
trap cleanup EXIT
etcd --data-dir $W/etcd --listen-client-urls http://127.0.0.1:23791 --advertise-client-urls http://127.0.0.1:23791 --listen-peer-urls http://127.0.0.1:23801 >$W/etcd.log 2>&1 &
EP=$!
sleep 2
for i in 0 1 2; do
  $B server --data-dir $W/n$i --capacity 2G --preallocate --etcd http://127.0.0.1:23791 --node-name n$i --peer-listen 127.0.0.1:$((7200+i)) --cluster-secret-file $W/cluster-secret \
    --nbd-insecure --nbd-listen 127.0.0.1:$((11000+i)) --iscsi-listen 127.0.0.1:0 --nvme-listen 127.0.0.1:0 --api-listen 127.0.0.1:$((8200+i)) >$W/n$i.log 2>&1 &
  PIDS="$PIDS $!"
done
cli() { $B --data-dir $W/n0 "$@"; }
until cli node list >/dev/null 2>&1; do sleep 0.5; done
sleep 2
cli volume create sub --size $SIZE --replicas 2 >/dev/null
json() { cli volume show sub --output json; }
until json | python3 -c 'import json,sys; v=json.load(sys.stdin); r=v.get("replicas") or []; sys.exit(0 if len(r)==2 and all(x["state"]=="in-sync" for x in r) else 1)'; do sleep 0.5; done
read -r p other < <(json | python3 -c '
import json,sys
v=json.load(sys.stdin)
r=v["replicas"]
p=[x["node"] for x in r if x["primary"]][0]
o=[n for n in ("n0","n1","n2") if n not in [x["node"] for x in r]][0]
print(p[1:], o[1:])')
uri() { echo "nbd://127.0.0.1:$((11000+$1))/sub"; }
echo "$($B --version 2>/dev/null | head -1): RF2 volume sub, primary n$p, no replica on n$other"
fio --name=fill --ioengine=nbd --uri=$(uri $p) --rw=write --bs=1M --iodepth=8 --size=$SIZE >/dev/null 2>&1
stats() { python3 -c '
import json,sys
for j in json.load(open(sys.argv[1]))["jobs"]:
    w=j["write"]; c=w["clat_ns"]
    print("  %-8s mean %4.0f us  p99 %5.2f ms  %5d IOPS" % (j["jobname"], c["mean"]/1e3, c["percentile"]["99.000000"]/1e6, w["iops"]))' $W/fio.json; }
one() { # node bs
  fio --name=n$1 --ioengine=nbd --uri=$(uri $1) --rw=randwrite --bs=$2 --iodepth=1 --size=$SIZE \
    --time_based --runtime=$RUNTIME --output-format=json --output=$W/fio.json >/dev/null 2>&1
  stats
}
for r in $(seq 1 $ROUNDS); do
  echo "round $r"
  for bs in 4k 512; do
    for n in $p $other; do
      echo " $bs writes through n$n"
      one $n $bs
    done
  done
  echo " 512-byte writes through n$p and n$other at once, into the same 64 KiB"
  fio --ioengine=nbd --rw=randwrite --bs=512 --iodepth=1 --size=64k --time_based --runtime=$RUNTIME \
    --output-format=json --output=$W/fio.json \
    --name=n$p --uri=$(uri $p) --name=n$other --uri=$(uri $other) >/dev/null 2>&1
  stats
done
grep -h "lost .* rounds" $W/n*.log || true
