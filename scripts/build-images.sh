#!/usr/bin/env bash
# Build forkyard's images on the local engine, offline: the base (scripts/build-base-image.sh, when
# BASE_IMAGE is the local forkyard-base:bookworm), the sandbox image (docker/sandbox.Dockerfile) and,
# with --server, the server image (docker/server.Dockerfile, its Python packages vendored from .venv by
# scripts/vendor-server-deps.sh). An image is rebuilt only when its sources changed (label forkyard.agent_sha).
# Env: BASE_IMAGE (default forkyard-base:bookworm), SANDBOX_IMAGE (forkyard-sandbox:latest),
#      SERVER_IMAGE (forkyard-server:latest). In CI (CI=true) every failure is fatal.
set -euo pipefail
cd "$(dirname "$0")/.."
BASE_IMAGE="${BASE_IMAGE:-forkyard-base:bookworm}"
SANDBOX_IMAGE="${SANDBOX_IMAGE:-forkyard-sandbox:latest}"
SERVER_IMAGE="${SERVER_IMAGE:-forkyard-server:latest}"
PY="${PYTHON:-.venv/bin/python}"; [ -x "$PY" ] || PY=python3
if ! docker info >/dev/null 2>&1; then
    echo "build-images: no Docker engine answers" >&2
    [ "${CI:-}" = "true" ] && exit 1 || exit 0
fi
if [ "$BASE_IMAGE" = "forkyard-base:bookworm" ]; then ./scripts/build-base-image.sh "$BASE_IMAGE"; fi
docker image inspect "$BASE_IMAGE" >/dev/null 2>&1 || { echo "build-images: base $BASE_IMAGE missing" >&2; exit 1; }
SHA="$("$PY" -m sandbox_server.agent_bundle docker/agent.pyz)"  # the agent zipapp the Dockerfile copies
have="$(docker image inspect -f '{{ index .Config.Labels "forkyard.agent_sha" }}' "$SANDBOX_IMAGE" 2>/dev/null || true)"
if [ "$have" != "$SHA" ]; then
    echo "build-images: building $SANDBOX_IMAGE (agent $SHA)" >&2
    DOCKER_BUILDKIT=0 docker build -q -f docker/sandbox.Dockerfile --build-arg BASE_IMAGE="$BASE_IMAGE" \
        --build-arg AGENT_SHA="$SHA" -t "$SANDBOX_IMAGE" . >/dev/null
fi
if [ "${1:-}" = "--server" ]; then
    ./scripts/vendor-server-deps.sh
    SSHA="$(find sandbox_server envs -name "*.py" -print0 | sort -z | xargs -0 cat docker/server.Dockerfile scripts/vendor-server-deps.sh | sha256sum | cut -c1-16)"
    have="$(docker image inspect -f '{{ index .Config.Labels "forkyard.src_sha" }}' "$SERVER_IMAGE" 2>/dev/null || true)"
    if [ "$have" != "$SSHA" ]; then
        echo "build-images: building $SERVER_IMAGE" >&2
        DOCKER_BUILDKIT=0 docker build -q -f docker/server.Dockerfile --build-arg BASE_IMAGE="$BASE_IMAGE" \
            --build-arg SRC_SHA="$SSHA" -t "$SERVER_IMAGE" . >/dev/null
    fi
fi
