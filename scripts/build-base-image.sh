#!/usr/bin/env bash
# Build the offline base image forkyard-base:bookworm (Debian bookworm minbase + python3) with
# debootstrap and `docker import`, because no image registry is reachable here. Reused when present.
# Usage: scripts/build-base-image.sh [IMAGE_TAG]   (default forkyard-base:bookworm)
# In CI (CI=true) a failure is fatal; elsewhere it prints why and exits 0 (Docker tests then skip).
set -uo pipefail
TAG="${1:-${FORKYARD_BASE_IMAGE:-forkyard-base:bookworm}}"
fail() {
    echo "build-base-image: $*" >&2
    if [ "${CI:-}" = "true" ]; then exit 1; fi
    exit 0
}
docker info >/dev/null 2>&1 || fail "no Docker engine answers"
if docker image inspect "$TAG" >/dev/null 2>&1; then exit 0; fi
command -v debootstrap >/dev/null 2>&1 || {
    [ "$(id -u)" = 0 ] || fail "debootstrap is not installed and this is not root"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap) >/tmp/forkyard-apt.log 2>&1 \
        || fail "apt-get install debootstrap failed (see /tmp/forkyard-apt.log)"
}
DIR="$(mktemp -d /tmp/forkyard-base.XXXXXX)"
trap 'rm -rf "$DIR"' EXIT
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
echo "build-base-image: debootstrap bookworm into $DIR (about 40 s)" >&2
debootstrap --variant=minbase --include=python3 bookworm "$DIR" "$MIRROR" >/tmp/forkyard-debootstrap.log 2>&1 \
    || fail "debootstrap failed (see /tmp/forkyard-debootstrap.log)"
rm -rf "$DIR"/var/cache/apt/archives/*.deb "$DIR"/var/lib/apt/lists/*
tar -C "$DIR" -c . | docker import -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' - "$TAG" >/dev/null \
    || fail "docker import failed"
echo "build-base-image: built $TAG" >&2
