#!/usr/bin/env bash
# Usage: scripts/ray-sim.sh NODES CMD...
# Runs CMD against a simulated Ray cluster of NODES one-CPU nodes on this machine (RAY_ADDRESS set, so
# `forkyard train --ray auto` joins it), inside a new network namespace with only loopback up: Ray binds to
# 127.0.0.1 and nothing it starts is reachable from outside. The Docker socket (a file) still works inside.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
if [ "$(id -u)" = 0 ]; then ns=(unshare -n); else ns=(unshare -rn); fi
exec "${ns[@]}" bash -c 'ip link set lo up && exec "$0" scripts/ray_sim_cluster.py "$@"' "$PY" "$@"
