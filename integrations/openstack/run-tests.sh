#!/usr/bin/env bash
# Tests of the Cinder driver (basalt_cinder) with Cinder's own code against a
# live Basalt server this script starts:
#   - a virtual environment in ${XDG_CACHE_HOME:-~/.cache}/basalt-cinder-venv with
#     the pinned cinder, os-brick, ruff, mypy and pytest (constraints.txt),
#     reused while constraints.txt and the Python version are unchanged;
#   - ruff and mypy on the package;
#   - a Basalt server (target/release/basalt) in a temporary directory, a
#     project and a project-scoped token for the driver;
#   - pytest tests/ (interface compliance, the lifecycle through Cinder's
#     VolumeManager with data checked over NBD, os-brick's NVMe-oF parsing,
#     failure injection).
# The server it started is stopped by its PID and the directory removed on exit.
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
cleanup() {
    if [[ -n "$server_pid" ]] && kill -0 "$server_pid" 2>/dev/null; then
        kill "$server_pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$server_pid" 2>/dev/null || true
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT
data="$tmp/data"
"$basalt" server --data-dir "$data" --capacity "${BASALT_CINDER_CAPACITY:-4G}" \
    --api-listen 127.0.0.1:0 --nvme-listen 127.0.0.1:0 >"$tmp/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 200); do
    [[ -s "$data/server.json" && -s "$data/api-token" ]] && break
    kill -0 "$server_pid" 2>/dev/null || { cat "$tmp/server.log" >&2; exit 1; }
    sleep 0.1
done
json() { "$venv/bin/python" -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$data/server.json" "$1"; }
BASALT_API_URL="$(json api_url)"
BASALT_NVME="$(json nvme)"
BASALT_NBD_SOCKET="$(json nbd_socket)"
BASALT_ADMIN_TOKEN="$(cat "$data/api-token")"
"$basalt" --data-dir "$data" project create cinder-test >/dev/null
BASALT_TOKEN="$("$basalt" --data-dir "$data" token create --project cinder-test --role admin | grep '^bst_')"
export BASALT_API_URL BASALT_NVME BASALT_NBD_SOCKET BASALT_ADMIN_TOKEN BASALT_TOKEN
export BASALT_PROJECT=cinder-test BASALT_BIN="$basalt" BASALT_SERVER_PID="$server_pid"
log "basalt server pid $server_pid at $BASALT_API_URL (nvme $BASALT_NVME)"

# --- tests --------------------------------------------------------------------------
log "pytest"
status=0
(cd "$here/tests" && "$venv/bin/python" -m pytest -p no:cacheprovider -q ${PYTEST_ARGS:-.}) || status=$?
if [[ $status -ne 0 ]]; then
    echo "--- basalt server log (last 40 lines) ---" >&2
    tail -n 40 "$tmp/server.log" >&2
fi
log "done (exit $status)"
exit $status
