#!/bin/bash
# Clones of a replicated golden image (issue 21): 3 node processes with a
# real etcd on loopback, an RF${RF:-2} volume of SIZE (default 1G) filled in
# full and snapshotted, then COUNT clones (default 10) created at once
# through different nodes. Prints the time until every `volume create
# --from` returned and until every clone was placed with all its replicas
# in sync, QD1 4k random read latency on the source and on a clone (the
# clone reads through the snapshot), and, as the baseline a user would
# otherwise have, the time of one full copy of the source into a new
# replicated volume with nbdcopy. Needs etcd, fio, nbdcopy and a release
# build.
#
#   scripts/bench-replicated-clones.sh
set -e
B=${BASALT:-$(dirname "$0")/../target/release/basalt}
RF=${RF:-2}
SIZE=${SIZE:-1G}
COUNT=${COUNT:-10}
W=$(mktemp -d /var/tmp/rfclone.XXXX)
PIDS=""
EP=""
cleanup() { kill $PIDS $EP 2>/dev/null || true; wait 2>/dev/null || true; if [ -n "$KEEP_LOGS" ]; then mkdir -p "$KEEP_LOGS"; cp $W/*.log "$KEEP_LOGS/"; fi; rm -rf $W; }
trap cleanup EXIT
etcd --data-dir $W/etcd --listen-client-urls http://127.0.0.1:23792 --advertise-client-urls http://127.0.0.1:23792 --listen-peer-urls http://127.0.0.1:23802 >$W/etcd.log 2>&1 &
EP=$!
sleep 2
for i in 0 1 2; do
  $B server --data-dir $W/n$i --capacity 8G --etcd http://127.0.0.1:23792 --node-name n$i --peer-listen 127.0.0.1:$((7300+i)) --cluster-secret-file $W/cluster-secret \
    --nbd-insecure --nbd-listen 127.0.0.1:$((11100+i)) --iscsi-listen 127.0.0.1:0 --nvme-listen 127.0.0.1:0 --api-listen 127.0.0.1:$((8300+i)) >$W/n$i.log 2>&1 &
  PIDS="$PIDS $!"
done
cli() { local n=$1; shift; $B --data-dir $W/n$n "$@"; }
until cli 0 node list >/dev/null 2>&1; do sleep 0.5; done
sleep 2
in_sync() { cli 0 volume show "$1" --output json 2>/dev/null | python3 -c 'import json,sys; v=json.load(sys.stdin); r=v.get("replicas") or []; sys.exit(0 if r and len(r)==v["replicas_wanted"] and all(x["state"]=="in-sync" for x in r) else 1)'; }
primary_uri() { cli 0 volume show "$1" --output json | python3 -c 'import json,sys; v=json.load(sys.stdin); p=[r["node"] for r in v["replicas"] if r["primary"]][0]; print("nbd://127.0.0.1:%d/%s" % (11100+int(p[1:]), sys.argv[1]))' "$1"; }
now() { date +%s.%N; }
since() { python3 -c "import sys; print('%.2f' % (float(sys.argv[2]) - float(sys.argv[1])))" "$1" "$(now)"; }

cli 0 volume create gold --size $SIZE --replicas $RF >/dev/null
until in_sync gold; do sleep 0.3; done
GOLD=$(primary_uri gold)
fio --name=fill --ioengine=nbd --uri=$GOLD --rw=write --bs=1M --iodepth=8 --size=$SIZE >/dev/null 2>&1
cli 0 snapshot create gold base >/dev/null
echo "RF$RF golden volume gold ($SIZE, filled), snapshot gold@base"

t0=$(now)
clones=()
for c in $(seq 1 $COUNT); do
  cli $((c % 3)) volume create vm$c --from gold@base >/dev/null &
  clones+=($!)
done
wait "${clones[@]}"
created=$(since $t0)
for c in $(seq 1 $COUNT); do until in_sync vm$c; do sleep 0.1; done; done
placed=$(since $t0)
echo "$COUNT clones: every create returned after $created s, all placed and in sync after $placed s"

lat() { fio --name=r --ioengine=nbd --uri=$1 --rw=randread --bs=4k --iodepth=1 --runtime=10 --time_based --size=$SIZE --output-format=json --output=$W/fio.json >/dev/null 2>&1
  python3 -c 'import json,sys; c=json.load(open(sys.argv[1]))["jobs"][0]["read"]["clat_ns"]; print("mean %.0f us, p99 %.0f us" % (c["mean"]/1e3, c["percentile"]["99.000000"]/1e3))' $W/fio.json; }
echo "QD1 4k randread, source gold: $(lat $GOLD)"
echo "QD1 4k randread, clone vm1:   $(lat $(primary_uri vm1))"

cli 0 volume create copy --size $SIZE --replicas $RF >/dev/null
until in_sync copy; do sleep 0.3; done
t0=$(now)
nbdcopy --request-size=1048576 "$GOLD" "$(primary_uri copy)"
echo "one full copy (nbdcopy gold -> new RF$RF volume): $(since $t0) s"
