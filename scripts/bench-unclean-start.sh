#!/usr/bin/env bash
# Measures an unclean start: a 20 GiB preallocated store with a 16 GiB
# volume, 4 GiB written, 2 GiB trimmed, then the server is killed with
# SIGKILL during 64k random writes; prints the time from starting it again
# until its NBD export answers. Used for BENCHMARKS.md (store v1 vs v2).
#
#   scripts/bench-unclean-start.sh BASALT_BINARY WORK_DIR NBD_PORT
#
# Needs fio and nbdinfo. WORK_DIR is removed and recreated; the API and
# NVMe/TCP listeners take ports NBD_PORT-2700 and NBD_PORT-6400.
set -euo pipefail
[ $# = 3 ] || { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
BIN=$1; DIR=$2; PORT=$3
rm -rf "$DIR"; mkdir -p "$DIR"
"$BIN" server --data-dir "$DIR" --capacity 20G --preallocate --demo-volume demo:16G --nbd-insecure --nbd-listen 127.0.0.1:$PORT --api-listen 127.0.0.1:$((PORT-2700)) --iscsi-listen 127.0.0.1:0 --nvme-listen 127.0.0.1:$((PORT-6400)) > "$DIR.log" 2>&1 &
pid=$!
until nbdinfo nbd://127.0.0.1:$PORT/demo >/dev/null 2>&1; do sleep 0.2; done
fio --name=fill --ioengine=nbd --uri=nbd://127.0.0.1:$PORT/demo --rw=write --bs=1m --iodepth=8 --size=4G >/dev/null 2>&1
# free 2 GiB (TRIM) and keep writing while the process is killed
fio --name=trim --ioengine=nbd --uri=nbd://127.0.0.1:$PORT/demo --rw=trim --bs=1m --size=2G >/dev/null 2>&1
fio --name=w --ioengine=nbd --uri=nbd://127.0.0.1:$PORT/demo --rw=randwrite --bs=64k --iodepth=8 --size=8G --runtime=30 --time_based >/dev/null 2>&1 &
fpid=$!
sleep 3
kill -9 $pid; wait $pid 2>/dev/null || true; kill $fpid 2>/dev/null || true; wait $fpid 2>/dev/null || true
sync
t0=$(date +%s.%N)
"$BIN" server --data-dir "$DIR" --nbd-insecure --nbd-listen 127.0.0.1:$PORT --api-listen 127.0.0.1:$((PORT-2700)) --iscsi-listen 127.0.0.1:0 --nvme-listen 127.0.0.1:$((PORT-6400)) > "$DIR.log2" 2>&1 &
pid=$!
until nbdinfo nbd://127.0.0.1:$PORT/demo >/dev/null 2>&1; do sleep 0.05; done
t1=$(date +%s.%N)
echo "$BIN: unclean restart to serving: $(echo "$t1 - $t0" | bc) s"
grep -E "opened store" "$DIR.log2" | head -2
kill $pid; wait $pid 2>/dev/null || true
rm -rf "$DIR" "$DIR.log" "$DIR.log2"
