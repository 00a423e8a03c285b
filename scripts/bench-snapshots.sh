#!/usr/bin/env bash
# Measures what snapshots cost a single-node volume, with fio's nbd engine
# against a server on a preallocated store (BENCHMARKS.md, "Snapshots"):
#   1. 4k random writes (2 jobs x QD16, and QD1) on a volume without a
#      snapshot, right after a snapshot (every write a first write to its
#      block in the new layer), and in steady state after it;
#   2. the I/O pause of `basalt snapshot create` under QD1 writes (max and
#      p99.99 completion latency with 5 snapshots taken during the run,
#      against the same run without);
#   3. 4k random reads at QD1 through clone chains of depth 1 and 16.
#
#   scripts/bench-snapshots.sh BASALT_BINARY WORK_DIR NBD_PORT
#
# Needs fio, nbdinfo and jq. WORK_DIR is removed and recreated; the API and
# NVMe/TCP listeners take ports NBD_PORT-2700 and NBD_PORT-6400.
set -euo pipefail
[ $# = 3 ] || { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
BIN=$1; DIR=$2; PORT=$3
rm -rf "$DIR"; mkdir -p "$DIR"
"$BIN" server --data-dir "$DIR" --capacity 12G --preallocate --nbd-insecure --nbd-listen 127.0.0.1:$PORT --api-listen 127.0.0.1:$((PORT-2700)) --iscsi-listen 127.0.0.1:0 --nvme-listen 127.0.0.1:$((PORT-6400)) > "$DIR.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -rf "$DIR" "$DIR.log"' EXIT
cli() { "$BIN" --data-dir "$DIR" "$@" >/dev/null; }
until "$BIN" --data-dir "$DIR" status >/dev/null 2>&1; do sleep 0.2; done
uri() { echo "nbd://127.0.0.1:$PORT/$1"; }

# fio VOLUME ARGS... -> JSON on stdout
# (fio prints a line per NBD connection on stdout: JSON goes to a file.)
run() { local vol=$1; shift; fio --name=b --ioengine=nbd --uri="$(uri "$vol")" --output-format=json --output="$DIR/fio.json" "$@" >/dev/null 2>&1; cat "$DIR/fio.json"; }
iops() { jq -r '[.jobs[].write.iops] | add | floor'; }
riops() { jq -r '[.jobs[].read.iops] | add | floor'; }
lat_us() { jq -r '.jobs[0].write.clat_ns.mean / 1000 | . * 10 | floor / 10'; }
rlat_us() { jq -r '.jobs[0].read.clat_ns.mean / 1000 | . * 10 | floor / 10'; }
tail_us() { jq -r '.jobs[0].write | "max \(.clat_ns.max / 1000 | floor) us, p99.99 \(.clat_ns.percentile["99.990000"] / 1000 | floor) us"'; }

cli volume create v --size 4G
run v --rw=write --bs=1m --iodepth=8 --size=4G >/dev/null
QD32=(--rw=randwrite --bs=4k --numjobs=2 --iodepth=16 --group_reporting=0)

echo "== 4k random writes"
base=$(run v "${QD32[@]}" --offset=2G --size=1G --runtime=15 --time_based --norandommap | iops)
base1=$(run v --rw=randwrite --bs=4k --iodepth=1 --offset=3G --size=1G --runtime=15 --time_based --norandommap | lat_us)
echo "no snapshot:        QD32 $base IOPS, QD1 $base1 us"
# The same first writes into a new volume: the store maps fresh (punched,
# zeroed) extents either way, which the host filesystem must allocate.
cli volume create fresh --size 2G
fresh=$(run fresh "${QD32[@]}" --offset=0 --size=512M --offset_increment=512M --io_size=512M | iops)
fresh1=$(run fresh --rw=randwrite --bs=4k --iodepth=1 --offset=1G --size=1G --runtime=15 --time_based | lat_us)
echo "new volume, first:  QD32 $fresh IOPS, QD1 $fresh1 us"
cli volume delete fresh
cli snapshot create v s1
# Each job writes each block of its 512 MiB once (fio's random map): all
# first writes in the new layer.
first=$(run v "${QD32[@]}" --offset=0 --size=512M --offset_increment=512M --io_size=512M | iops)
first1=$(run v --rw=randwrite --bs=4k --iodepth=1 --offset=3G --size=1G --runtime=15 --time_based | lat_us)
echo "first writes after: QD32 $first IOPS, QD1 $first1 us"
steady=$(run v "${QD32[@]}" --offset=0 --size=512M --offset_increment=512M --runtime=15 --time_based --norandommap | iops)
steady1=$(run v --rw=randwrite --bs=4k --iodepth=1 --offset=0 --size=1G --runtime=15 --time_based --norandommap | lat_us)
echo "steady after:       QD32 $steady IOPS, QD1 $steady1 us"

echo "== I/O pause of snapshot create (QD1 4k writes, 20 s)"
echo "without snapshots:  $(run v --rw=randwrite --bs=4k --iodepth=1 --offset=0 --size=1G --runtime=20 --time_based --norandommap | tail_us)"
fio --name=b --ioengine=nbd --uri="$(uri v)" --output-format=json --output="$DIR/pause.json" --rw=randwrite --bs=4k --iodepth=1 --offset=0 --size=1G --runtime=20 --time_based --norandommap >/dev/null 2>&1 &
fpid=$!
for i in 1 2 3 4 5; do sleep 3; cli snapshot create v p$i; done
wait $fpid
echo "5 snapshots during: $(tail_us < "$DIR/pause.json")"

echo "== deleting the snapshots (each merged into the next layer), and the space they held"
used() { "$BIN" --data-dir "$DIR" status --output json | jq -r '.allocated_bytes / 1048576 | floor'; }
before=$(used)
t0=$(date +%s.%N)
for s in s1 p1 p2 p3 p4 p5; do cli snapshot delete v@$s; done
t1=$(date +%s.%N)
sleep 2  # freed extents are zeroed in the background
echo "6 snapshots deleted in $(echo "$t1 - $t0" | bc) s; allocated $before MiB -> $(used) MiB (the volume is 4096 MiB)"

echo "== 4k random reads at QD1 through clone chains"
cli volume create c0 --size 1G
run c0 --rw=write --bs=1m --iodepth=8 --size=1G >/dev/null
for i in $(seq 1 16); do
    cli snapshot create c$((i-1)) s
    cli volume create c$i --from c$((i-1))@s
done
for c in c0 c1 c16; do
    echo "$c: $(run $c --rw=randread --bs=4k --iodepth=1 --size=1G --runtime=10 --time_based | rlat_us) us, QD32 $(run $c --rw=randread --bs=4k --numjobs=2 --iodepth=16 --size=1G --runtime=10 --time_based | riops) IOPS"
done
