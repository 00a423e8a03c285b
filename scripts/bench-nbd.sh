#!/usr/bin/env bash
# Baseline measurement for BENCHMARKS.md: fio 4k random read/write at QD1
# (mean and p99 latency) and QD32 (IOPS) against
#   file     - fio io_uring, O_DIRECT, on a file (the physical limit here)
#   basalt   - a Basalt volume over NBD (fio's nbd engine)
#   qemu-nbd - qemu-nbd (cache=none, aio=io_uring) serving an equal file
# in one run, with the server's CPU time per I/O. Cells are interleaved by
# target to spread machine noise. (`basalt bench` will replace this script.)
#
# Usage: scripts/bench-nbd.sh [runtime-seconds] [size]
set -euo pipefail
RUNTIME=${1:-15}
SIZE=${2:-2G}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BASALT="$ROOT/target/release/basalt"
[ -x "$BASALT" ] || (cd "$ROOT" && cargo build --release -p basalt)
for t in fio qemu-nbd python3; do command -v $t >/dev/null || { echo "missing $t: run scripts/test.sh first" >&2; exit 1; }; done

WORK=$(mktemp -d /var/tmp/basalt-bench.XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]:-}"; do kill "$p" 2>/dev/null || true; done; sleep 0.5; rm -rf "$WORK"; }
trap cleanup EXIT

# Basalt server on its own data file.
"$BASALT" server --data-dir "$WORK/basalt" --capacity 8G --nbd-listen 127.0.0.1:0 --api-listen 127.0.0.1:0 \
  >"$WORK/basalt.log" 2>&1 &
BPID=$!; PIDS+=("$BPID")
for _ in $(seq 100); do [ -f "$WORK/basalt/server.json" ] && break; sleep 0.1; done
NBD=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['nbd'])" "$WORK/basalt/server.json")
"$BASALT" --data-dir "$WORK/basalt" volume create bench --size "$SIZE" >/dev/null

# qemu-nbd on an equal (sparse) file.
truncate -s "$SIZE" "$WORK/qemu.img"
QPORT=$((20000 + RANDOM % 20000))
qemu-nbd -f raw --cache=none --aio=io_uring -x bench -b 127.0.0.1 -p "$QPORT" -t --shared=16 "$WORK/qemu.img" \
  >"$WORK/qemu.log" 2>&1 &
QPID=$!; PIDS+=("$QPID")
sleep 1
truncate -s "$SIZE" "$WORK/raw.img"

target_args() {
  case $1 in
    file) echo "--ioengine=io_uring --direct=1 --filename=$WORK/raw.img" ;;
    basalt) echo "--ioengine=nbd --uri=nbd://$NBD/bench" ;;
    qemu-nbd) echo "--ioengine=nbd --uri=nbd://127.0.0.1:$QPORT/bench" ;;
  esac
}
server_pid() { case $1 in basalt) echo "$BPID" ;; qemu-nbd) echo "$QPID" ;; *) echo "" ;; esac; }
cpu_ticks() { [ -n "$1" ] && awk '{print $14+$15}' "/proc/$1/stat" || echo 0; }

echo "precondition: sequential fill of each target ($SIZE)"
for t in file basalt qemu-nbd; do
  # shellcheck disable=SC2046
  fio --name=fill $(target_args $t) --rw=write --bs=1M --iodepth=8 --size="$SIZE" --output=/dev/null
done

RESULTS="$WORK/results.jsonl"
for cell in "randread 1" "randwrite 1" "randread 32" "randwrite 32"; do
  set -- $cell
  for t in file basalt qemu-nbd; do
    pid=$(server_pid $t); before=$(cpu_ticks "$pid")
    # shellcheck disable=SC2046
    fio --name=cell $(target_args $t) --rw="$1" --bs=4k --iodepth="$2" --numjobs=1 --size="$SIZE" \
      --time_based --runtime="$RUNTIME" --ramp_time=2 --norandommap --randrepeat=0 \
      --output-format=json --output="$WORK/$t-$1-$2.json"
    after=$(cpu_ticks "$pid")
    python3 - "$WORK/$t-$1-$2.json" "$t" "$1" "$2" "$before" "$after" >>"$RESULTS" <<'PY'
import json, os, sys
path, target, rw, qd, before, after = sys.argv[1:]
job = json.load(open(path))["jobs"][0]
d = job["read"] if rw == "randread" else job["write"]
ticks = os.sysconf("SC_CLK_TCK")
cpu_s = (float(after) - float(before)) / ticks
ios = d["total_ios"]
print(json.dumps({"target": target, "rw": rw, "qd": int(qd), "iops": d["iops"],
  "lat_mean_us": d["lat_ns"]["mean"] / 1000, "lat_p99_us": d["clat_ns"]["percentile"]["99.000000"] / 1000,
  "cpu_us_per_io": (cpu_s * 1e6 / ios) if (ios and target != "file") else None}))
PY
    echo "  $t $1 QD$2 done"
  done
done

python3 - "$RESULTS" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
get = lambda t, rw, qd: next(r for r in rows if r["target"] == t and r["rw"] == rw and r["qd"] == qd)
print("\n| test | file (io_uring) | basalt (NBD) | qemu-nbd | basalt / file | basalt / qemu-nbd |")
print("|---|---|---|---|---|---|")
for rw in ("randread", "randwrite"):
    f, b, q = get("file", rw, 1), get("basalt", rw, 1), get("qemu-nbd", rw, 1)
    print(f"| 4k {rw} QD1 mean latency (µs) | {f['lat_mean_us']:.1f} | {b['lat_mean_us']:.1f} | {q['lat_mean_us']:.1f} | {b['lat_mean_us']/f['lat_mean_us']:.2f}× | {b['lat_mean_us']/q['lat_mean_us']:.2f}× |")
    print(f"| 4k {rw} QD1 p99 latency (µs) | {f['lat_p99_us']:.1f} | {b['lat_p99_us']:.1f} | {q['lat_p99_us']:.1f} | {b['lat_p99_us']/f['lat_p99_us']:.2f}× | {b['lat_p99_us']/q['lat_p99_us']:.2f}× |")
for rw in ("randread", "randwrite"):
    f, b, q = get("file", rw, 32), get("basalt", rw, 32), get("qemu-nbd", rw, 32)
    print(f"| 4k {rw} QD32 IOPS | {f['iops']:.0f} | {b['iops']:.0f} | {q['iops']:.0f} | {b['iops']/f['iops']:.2f}× | {b['iops']/q['iops']:.2f}× |")
for rw in ("randread", "randwrite"):
    for qd in (1, 32):
        b, q = get("basalt", rw, qd), get("qemu-nbd", rw, qd)
        print(f"| server CPU per I/O, 4k {rw} QD{qd} (µs) | – | {b['cpu_us_per_io']:.1f} | {q['cpu_us_per_io']:.1f} | – | {b['cpu_us_per_io']/q['cpu_us_per_io']:.2f}× |")
PY
