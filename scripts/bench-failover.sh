#!/bin/bash
# Client I/O through a primary kill and through a rebuild (issue 5), on one
# machine: a real etcd and 4 `basalt server` processes on loopback, one RF3
# volume, fio's nbd engine (4k randwrite, iodepth 16) connected to a node
# that is not the volume's primary, logging IOPS every second.
#
# Phase 1 (failover): SIGKILL the primary 10 s into a 40 s run. Reports the
#   IOPS before, the seconds below 10% of that after the kill (the outage),
#   and the IOPS after.
# Phase 2 (rebuild): `basalt node remove` the killed node, so its replica is
#   rebuilt on the fourth node while fio keeps writing. Reports the rebuild
#   time and throughput (volume bytes written before the kill / time) and the
#   client's IOPS during the rebuild relative to phase 1's baseline.
#
# Needs etcd, fio, python3 and a release build (BASALT=path overrides;
# SERVER_ARGS adds server options, e.g. "--resync-rate 32"; KEEP=1 keeps
# the work directory with the logs).
# Usage: scripts/bench-failover.sh [FILL_MIB (default 1024)]
set -euo pipefail
B=${BASALT:-$(dirname "$0")/../target/release/basalt}
FILL=${1:-1024}
W=$(mktemp -d /var/tmp/failbench.XXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ -n "${KEEP:-}" ]; then echo "kept $W"; else rm -rf "$W"; fi
}
trap cleanup EXIT

etcd --data-dir "$W/etcd" --listen-client-urls http://127.0.0.1:23890 --advertise-client-urls http://127.0.0.1:23890 \
  --listen-peer-urls http://127.0.0.1:23900 >"$W/etcd.log" 2>&1 &
PIDS+=($!)
sleep 2
declare -A NODE_PID
for i in 0 1 2 3; do
  "$B" server --data-dir "$W/n$i" --capacity 4G --etcd http://127.0.0.1:23890 --node-name "n$i" \
    --peer-listen 127.0.0.1:$((7200 + i)) --nbd-listen 127.0.0.1:$((11000 + i)) --nvme-listen 127.0.0.1:0 \
    --api-listen 127.0.0.1:$((8200 + i)) ${SERVER_ARGS:-} >"$W/n$i.log" 2>&1 &
  NODE_PID[n$i]=$!
  PIDS+=($!)
done
sleep 3
"$B" volume create fb --size 2G --replicas 3 --data-dir "$W/n0" >/dev/null

show() { "$B" volume show fb --data-dir "$W/$1" --output json 2>/dev/null || echo '{}'; }
field() { python3 -c "import json,sys; v=json.load(sys.stdin); print($1)" 2>/dev/null || true; }
wait_in_sync() {
  local via=$1
  while ! show "$via" | field 'all(r["state"]=="in-sync" for r in v["replicas"]) and len(v["replicas"])==3' | grep -q True; do
    sleep 0.2
  done
}
wait_in_sync n0
P=$(show n0 | field '[r["node"] for r in v["replicas"] if r["primary"]][0]')
# The client's node: any other node (it forwards to the primary).
C=n0
[ "$P" = n0 ] && C=n1
[ "$P" = n1 ] && [ "$C" = n1 ] && C=n2
URI=nbd://127.0.0.1:$((11000 + ${C#n}))/fb
COORD=$("$B" node list --data-dir "$W/n0" --output json 2>/dev/null | field '[n["name"] for n in v["nodes"] if n.get("coordinator")][0]')
echo "primary $P (coordinator: ${COORD:-unknown}), client through $C, filling ${FILL} MiB"
fio --name=fill --ioengine=nbd --uri="$URI" --rw=write --bs=1M --iodepth=8 --size="${FILL}M" >/dev/null 2>&1

# Per-second IOPS from fio's log (msec, iops, ...), as "second iops" lines.
# fio logs nothing for a second without completions: those count as 0.
per_second() {
  awk -F', ' '{ s = int(($1 + 500) / 1000); v[s] = $2; if (s > m) m = s }
    END { for (s = 1; s <= m; s++) print s, (s in v ? v[s] : 0) }' "$1"
}

start_fio() { # name runtime; sets FIO to fio's own pid
  fio --name="$1" --ioengine=nbd --uri="$URI" --rw=randwrite --bs=4k --iodepth=16 --size="${FILL}M" \
    --time_based --runtime="$2" --write_iops_log="$W/$1" --log_avg_msec=1000 >"$W/$1.out" 2>&1 &
  FIO=$!
}

echo "== phase 1: SIGKILL of the primary ($P) at t=10 s"
start_fio failover 40
sleep 10
kill -9 "${NODE_PID[$P]}"
KILLED_AT=$(date +%s.%N)
wait $FIO || echo "fio reported errors (see $W/failover.out)"
per_second "$W/failover_iops.1.log" >"$W/failover.tsv"
python3 - "$W/failover.tsv" <<'PY'
import sys
rows = [tuple(map(float, l.split())) for l in open(sys.argv[1])]
before = [i for s, i in rows if 2 <= s <= 10]
base = sum(before) / len(before)
after = [(s, i) for s, i in rows if s > 10]
outage = sum(1 for s, i in after if i < 0.1 * base)
tail = [i for s, i in after if s > 30]
print(f"IOPS before the kill: {base:.0f}")
print(f"seconds below 10% of that after the kill: {outage}")
print(f"IOPS 20-30 s after the kill: {sum(tail)/max(len(tail),1):.0f} ({sum(tail)/max(len(tail),1)/base:.2f}x)")
print("per second:", " ".join(f"{i:.0f}" for s, i in rows))
PY

echo "== phase 2: node remove $P; its replica is rebuilt on another node under client load"
start_fio rebuild 120
sleep 5
T0=$(date +%s.%N)
"$B" node remove "$P" --data-dir "$W/$C" >/dev/null
# The killed node's replica is Faulty until a new one, rebuilt, is in sync.
wait_in_sync "$C"
T1=$(date +%s.%N)
# SIGINT: fio stops and writes its logs.
kill -INT $FIO 2>/dev/null || true
wait $FIO 2>/dev/null || true
per_second "$W/rebuild_iops.1.log" >"$W/rebuild.tsv"
python3 - "$W/failover.tsv" "$W/rebuild.tsv" "$T0" "$T1" "$FILL" <<'PY'
import sys
base_rows = [tuple(map(float, l.split())) for l in open(sys.argv[1])]
base = [i for s, i in base_rows if 2 <= s <= 10]
base = sum(base) / len(base)
rows = [tuple(map(float, l.split())) for l in open(sys.argv[2])]
t = float(sys.argv[4]) - float(sys.argv[3])
fill = float(sys.argv[5])
during = [i for s, i in rows if 6 <= s <= 5 + t]
print(f"rebuild time: {t:.1f} s for a volume with {fill:.0f} MiB written + the fio job's writes")
print(f"rebuild throughput: {fill / t:.0f} MiB/s (written data / rebuild time)")
if during:
    m = sum(during) / len(during)
    print(f"client IOPS during the rebuild: {m:.0f} ({m / base:.2f}x the phase-1 baseline)")
print("per second:", " ".join(f"{i:.0f}" for s, i in rows))
PY
