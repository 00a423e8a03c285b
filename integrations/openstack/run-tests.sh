#!/usr/bin/env bash
# Tests of the Cinder driver (basalt_cinder) with Cinder's own code against a
# live Basalt server this script starts:
#   - a virtual environment in ${XDG_CACHE_HOME:-~/.cache}/basalt-cinder-venv with
#     the pinned cinder, os-brick, ruff, mypy and pytest (constraints.txt),
#     reused while constraints.txt and the Python version are unchanged;
#   - ruff and mypy on the package;
#   - a Basalt server (target/release/basalt) in a temporary directory, with
#     NBD over TLS (pre-shared keys) on 127.0.0.1 for the driver's image copies,
#     a project and a project-scoped token for the driver;
#   - a three-node Basalt cluster (n0 n1 n2, 127.0.0.1) with its own etcd (the
#     `etcd` binary, Debian's etcd-server), the same project and a token, for
#     what differs in a cluster (the replica count the driver reports as nodes
#     are drained, refusals of more replicas than active nodes, snapshots and
#     clones of three-replica volumes, and of two-replica ones placed on two of
#     the three nodes);
#   - pytest tests/ (interface compliance, the lifecycle through Cinder's
#     VolumeManager with data checked over NBD, multiattach, os-brick's NVMe-oF
#     parsing, failure injection, replica counts, snapshots, reverts, clones
#     and flattening of replicated volumes (three replicas, and two), image
#     copies over NBD with qemu-img, DH-HMAC-CHAP secrets). The image tests
#     run qemu-img and qemu-io (Debian's qemu-utils); Cinder runs `qemu-img
#     info` with run_as_root, which needs root (or sudo with cinder-rootwrap).
# The processes it started are stopped by their PIDs and the directory removed
# on exit.
# Environment: BASALT_CINDER_PYTHON (default python3), BASALT_CINDER_VENV,
# BASALT_BIN (default target/release/basalt, built when missing), PYTEST_ARGS
# (instead of every tests/test_*.py),
# BASALT_CINDER_CAPACITY (the server's store, default 4G; tests/bench_lifecycle.py
# needs 200G, sparse).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
python="${BASALT_CINDER_PYTHON:-python3}"
venv="${BASALT_CINDER_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/basalt-cinder-venv}"
basalt="${BASALT_BIN:-$root/target/release/basalt}"
start=$SECONDS

log() { printf '[basalt-cinder %3ds] %s\n' "$((SECONDS - start))" "$*"; }

# --- virtual environment (pinned) -------------------------------------------
"$python" -c 'import sys; assert sys.version_info >= (3, 10), sys.version' || {
    echo "basalt-cinder tests need Python >= 3.10 ($python)" >&2; exit 1; }
command -v etcd >/dev/null 2>&1 || {
    echo "basalt-cinder tests need etcd for their Basalt cluster (apt-get install etcd-server)" >&2
    exit 1; }
stamp="$("$python" -c 'import sys; print(sys.version.split()[0])') $(sha256sum "$here/constraints.txt" | cut -c1-16)"
if [[ ! -x "$venv/bin/python" || "$(cat "$venv/.basalt-stamp" 2>/dev/null)" != "$stamp" ]]; then
    log "creating $venv ($stamp)"
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check \
        -c "$here/constraints.txt" \
        cinder os-brick fixtures oslotest ddt testtools testscenarios \
        ruff mypy pytest types-requests setuptools
    echo "$stamp" > "$venv/.basalt-stamp"
else
    log "reusing $venv"
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps --no-build-isolation \
    --force-reinstall "$here" >/dev/null
# Tests must import the installed package, not the source tree.
rm -rf "$here/build" "$here"/*.egg-info

# --- static checks -------------------------------------------------------------
log "ruff"
(cd "$here" && "$venv/bin/ruff" check basalt_cinder tests)
log "mypy"
(cd "$here" && "$venv/bin/mypy" basalt_cinder)

# --- a Basalt server -------------------------------------------------------------
if [[ ! -x "$basalt" ]]; then
    log "building basalt"
    (cd "$root" && cargo build --release -p basalt)
fi
tmp="$(mktemp -d /tmp/basalt-cinder-test.XXXXXX)"
server_pid=""
pids=()  # every process started below, stopped last-started first
stop() {
    local pid=$1
    kill -0 "$pid" 2>/dev/null || return 0
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
}
cleanup() {
    local i
    for ((i = ${#pids[@]} - 1; i >= 0; i--)); do stop "${pids[i]}"; done
    rm -rf "$tmp"
}
trap cleanup EXIT
free_port() { "$venv/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
json() { "$venv/bin/python" -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$1/server.json" "$2"; }
# wait_ready DATA_DIR PID LOG: until the server wrote its server.json and api-token.
wait_ready() {
    for _ in $(seq 200); do
        [[ -s "$1/server.json" && -s "$1/api-token" ]] && return 0
        kill -0 "$2" 2>/dev/null || { cat "$3" >&2; exit 1; }
        sleep 0.1
    done
    echo "basalt server in $1 did not start; its log:" >&2; cat "$3" >&2; exit 1
}

data="$tmp/data"
# NBD over TLS with pre-shared keys on loopback, for the driver's image copies.
"$basalt" server --data-dir "$data" --capacity "${BASALT_CINDER_CAPACITY:-4G}" \
    --api-listen 127.0.0.1:0 --iscsi-listen 127.0.0.1:0 --nvme-listen 127.0.0.1:0 --nbd-listen 127.0.0.1:0 \
    --master-key-file "$tmp/master.key" >"$tmp/server.log" 2>&1 &
server_pid=$!
pids+=("$server_pid")

# The cluster's etcd starts meanwhile.
etcd_client="http://127.0.0.1:$(free_port)"
etcd_peer="http://127.0.0.1:$(free_port)"
etcd --name basalt-cinder --data-dir "$tmp/etcd" \
    --listen-client-urls "$etcd_client" --advertise-client-urls "$etcd_client" \
    --listen-peer-urls "$etcd_peer" --initial-advertise-peer-urls "$etcd_peer" \
    --initial-cluster "basalt-cinder=$etcd_peer" >"$tmp/etcd.log" 2>&1 &
pids+=("$!")

wait_ready "$data" "$server_pid" "$tmp/server.log"
BASALT_API_URL="$(json "$data" api_url)"
BASALT_NVME="$(json "$data" nvme)"
BASALT_NBD_SOCKET="$(json "$data" nbd_socket)"
BASALT_NBD_TLS="$(json "$data" nbd_tls)"
BASALT_SERVER_LOG="$tmp/server.log"
BASALT_ADMIN_TOKEN="$(cat "$data/api-token")"
"$basalt" --data-dir "$data" project create cinder-test >/dev/null
BASALT_TOKEN="$("$basalt" --data-dir "$data" token create --project cinder-test --role admin | grep '^bst_')"
export BASALT_API_URL BASALT_NVME BASALT_NBD_SOCKET BASALT_NBD_TLS BASALT_SERVER_LOG
export BASALT_ADMIN_TOKEN BASALT_TOKEN
export BASALT_PROJECT=cinder-test BASALT_BIN="$basalt" BASALT_SERVER_PID="$server_pid"
log "basalt server pid $server_pid at $BASALT_API_URL (nvme $BASALT_NVME, nbds $BASALT_NBD_TLS)"

# --- a three-node Basalt cluster --------------------------------------------------
"$venv/bin/python" - "$etcd_client" <<'PY' || { tail -n 40 "$tmp/etcd.log" >&2; exit 1; }
import sys, time, urllib.request
for _ in range(300):
    try:
        urllib.request.urlopen(sys.argv[1] + "/health", timeout=1)
        sys.exit(0)
    except OSError:
        time.sleep(0.1)
sys.exit(f"etcd at {sys.argv[1]} did not become healthy")
PY
(umask 077 && "$venv/bin/python" -c 'import secrets; print(secrets.token_hex(32))' >"$tmp/cluster-secret")
declare -A node_pid
nodes=(n0 n1 n2)
# 2G each (sparse): tests/test_replicated_snapshots.py extends a three-replica
# volume, which has a copy on every node, to 2 GiB, more than 1G x the
# overcommit ratio 2 after the store's metadata; its clone test then holds
# three 1 GiB volumes on every node.
for node in "${nodes[@]}"; do
    "$basalt" server --data-dir "$tmp/$node" --capacity 2G --etcd "$etcd_client" \
        --node-name "$node" --peer-listen "127.0.0.1:$(free_port)" \
        --cluster-secret-file "$tmp/cluster-secret" \
        --api-listen 127.0.0.1:0 --iscsi-listen 127.0.0.1:0 --nvme-listen 127.0.0.1:0 >"$tmp/$node.log" 2>&1 &
    node_pid[$node]=$!
    pids+=("$!")
done
for node in "${nodes[@]}"; do
    wait_ready "$tmp/$node" "${node_pid[$node]}" "$tmp/$node.log"
done
BASALT_CLUSTER_API_URL="$(json "$tmp/n0" api_url)"
BASALT_CLUSTER_NBD_SOCKET="$(json "$tmp/n0" nbd_socket)"
# Every node's, NAME=PATH,...: a snapshot is exported by the nodes holding a
# replica of its volume only.
BASALT_CLUSTER_NBD_SOCKETS="$(for node in "${nodes[@]}"; do
    printf '%s=%s,' "$node" "$(json "$tmp/$node" nbd_socket)"; done)"
BASALT_CLUSTER_NBD_SOCKETS="${BASALT_CLUSTER_NBD_SOCKETS%,}"
BASALT_CLUSTER_ADMIN_TOKEN="$(cat "$tmp/n0/api-token")"
# Until every node is alive and active in etcd.
"$venv/bin/python" - "$BASALT_CLUSTER_API_URL" "$BASALT_CLUSTER_ADMIN_TOKEN" "${#nodes[@]}" <<'PY'
import sys, time, requests
url, token, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
nodes = []
for _ in range(300):
    try:
        answer = requests.get(url + "/api/v1/nodes",
                              headers={"Authorization": "Bearer " + token}, timeout=5)
        nodes = answer.json().get("nodes", []) if answer.ok else []
    except requests.RequestException:
        nodes = []
    if sum(1 for n in nodes if n["alive"] and n["state"] == "active") == count:
        sys.exit(0)
    time.sleep(0.1)
sys.exit(f"the cluster's {count} nodes did not all become active: {nodes}")
PY
# (the CLI would send BASALT_TOKEN, the single server's token, exported above)
n0_cli() { env -u BASALT_TOKEN "$basalt" --data-dir "$tmp/n0" "$@"; }
n0_cli project create cinder-test >/dev/null
BASALT_CLUSTER_TOKEN="$(n0_cli token create --project cinder-test --role admin | grep '^bst_')"
export BASALT_CLUSTER_API_URL BASALT_CLUSTER_NBD_SOCKET BASALT_CLUSTER_NBD_SOCKETS
export BASALT_CLUSTER_ADMIN_TOKEN BASALT_CLUSTER_TOKEN
log "basalt cluster (${nodes[*]}, etcd $etcd_client) at $BASALT_CLUSTER_API_URL"

# --- tests --------------------------------------------------------------------------
log "pytest"
status=0
(cd "$here/tests" && "$venv/bin/python" -m pytest -p no:cacheprovider -q ${PYTEST_ARGS:-.}) || status=$?
if [[ $status -ne 0 ]]; then
    for name in server "${nodes[@]}"; do
        echo "--- basalt $name log (last 40 lines) ---" >&2
        tail -n 40 "$tmp/$name.log" >&2
    done
fi
log "done (exit $status)"
exit $status
