#!/usr/bin/env bash
# Make bubblewrap (`bwrap`) work on this machine: the local sandbox backend refuses to start without it
# (unless told --unsafe-no-isolation). Installs Debian's bubblewrap when bwrap is absent, then checks that
# it can build a sandbox (user, mount, PID and network namespaces; a tmpfs; a read-only bind).
# In CI (CI=true) any failure is fatal; elsewhere it prints why and returns 0 (the isolated local backend
# then raises IsolationUnavailable and its tests skip, saying so).
set -uo pipefail
fail() {
    echo "ensure-bwrap: $*" >&2
    if [ "${CI:-}" = "true" ]; then exit 1; fi
    echo "ensure-bwrap: continuing without bubblewrap; the isolated local backend will not start" >&2
    exit 0
}
if ! command -v bwrap >/dev/null 2>&1; then
    [ "$(id -u)" = 0 ] || fail "bwrap is not installed and this is not root (apt-get install bubblewrap)"
    echo "ensure-bwrap: installing bubblewrap from Debian" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap) >/tmp/forkyard-apt-bwrap.log 2>&1 \
        || fail "apt-get install bubblewrap failed (see /tmp/forkyard-apt-bwrap.log)"
fi
args=(--ro-bind /usr /usr)
for d in /bin /lib /lib64 /sbin; do
    if [ -L "$d" ]; then args+=(--symlink "$(readlink "$d")" "$d"); elif [ -d "$d" ]; then args+=(--ro-bind "$d" "$d"); fi
done
if ! out="$(bwrap "${args[@]}" --tmpfs /scratch --proc /proc --dev /dev --unshare-all --die-with-parent \
        /bin/sh -c 'echo ok > /scratch/x && cat /scratch/x' 2>&1)" || [ "$out" != "ok" ]; then
    fail "bwrap is installed but cannot build a sandbox here: $out (user namespaces disabled?)"
fi
echo "ensure-bwrap: bubblewrap works ($(bwrap --version))" >&2
