"""The agent's command line (:func:`main`): arguments, confinement at start (:func:`setup`), the baseline
for recycling, then one JSON request per line on stdin answered by one JSON line on stdout until EOF.
Run as ``python3 -u -I agent.pyz ARGS`` (the zipapp) or ``python3 -m sandbox_server.agent ARGS``.
Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

from .confine import EXEC_ROOTS, SignalScope, confine, restrict_exec
from .capped import limit_self, static_limits
from .core import Agent
from .proc import become_subreaper
from .protocol import AREA_BYTES, MAX_AREA_ENTRIES, MAX_WRITE_FILES, within


def setup(agent: Agent, confine_areas: bool) -> None:
    """Confine the agent (see the package docstring); on failure set ``agent.fatal`` (nothing is served)."""
    info: dict = {"noexec": [], "caps_dropped": False}
    if confine_areas:
        try:
            info.update(confine([agent.host(w) for w in agent.writable]))
        except OSError as exc:
            agent.fatal = (f"the sandbox's isolation could not be set up: {exc.strerror or exc}; the writable areas "
                           "must be mounted noexec (bubblewrap with user namespaces)")
    exec_roots = [r for r in EXEC_ROOTS if os.path.isdir(r)]
    if any(within(os.path.realpath(agent.host(w)), os.path.realpath(r)) for w in agent.writable for r in exec_roots):
        info["landlock_abi"] = 0  # a writable area under a system directory: Landlock could not tell them apart
    else:
        info["landlock_abi"] = restrict_exec(exec_roots)
    agent.signal_scope = SignalScope()
    info["signal_scope"] = agent.signal_scope.active
    info["limits"] = limit_self(static_limits(agent.area_bytes))
    agent.confinement = info


def main(argv: list[str] | None = None) -> int:
    """Serve JSON-line requests on stdin until EOF. Returns the exit status."""
    ap = argparse.ArgumentParser(description="forkyard in-sandbox agent")
    ap.add_argument("--root", action="append", default=[], help="SANDBOX_PATH=HOST_PATH mapping")
    ap.add_argument("--readable", action="append", default=None, help="sandbox roots tools may read")
    ap.add_argument("--writable", action="append", default=None, help="writable areas (packed by snapshot)")
    ap.add_argument("--area-bytes", type=int, default=AREA_BYTES, help="bytes per writable area")
    ap.add_argument("--max-write-files", type=int, default=MAX_WRITE_FILES)
    ap.add_argument("--max-area-entries", type=int, default=MAX_AREA_ENTRIES)
    ap.add_argument("--confine", action="store_true", help="remount the writable areas noexec, drop capabilities")
    ap.add_argument("--bounded", action="store_true",
                    help="the sandbox bounds its process count from outside (a pids cgroup, Docker's pids_limit)")
    ap.add_argument("--probe", action="store_true", help="set up, print the ping answer as JSON, exit")
    ap.add_argument("--isolated", action="store_true",
                    help="the agent is the main process of its own PID, mount and IPC namespaces (a container, "
                         "bubblewrap): recycle may kill every other process it sees and reset every writable place")
    ns = ap.parse_args(argv)
    roots = dict(r.split("=", 1) for r in ns.root)
    agent = Agent(roots, ns.readable or ["/data", "/scratch"], ns.writable or ["/scratch", "/tmp"],
                  area_bytes=ns.area_bytes, max_write_files=ns.max_write_files, max_area_entries=ns.max_area_entries,
                  bounded=ns.bounded)
    setup(agent, ns.confine)
    if ns.probe:
        print(json.dumps(agent.handle({"op": "ping"})))
        return 1 if agent.fatal else 0
    agent.record_baseline(ns.isolated)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    become_subreaper()
    stdin = sys.stdin.buffer
    stdout = sys.stdout.buffer
    while True:
        line = stdin.readline()
        if not line:
            return 0
        rid = None
        try:
            req = json.loads(line)
            rid = req.get("id") if isinstance(req, dict) else None
            if not isinstance(req, dict):
                raise ValueError("a request must be a JSON object")
            ans = agent.handle(req)
        except Exception as exc:  # never die on one bad request
            ans = {"error": agent.to_sandbox(f"{type(exc).__name__}: {exc}"), "error_kind": "error"}
        ans["id"] = rid
        stdout.write(json.dumps(ans, ensure_ascii=True).encode("ascii") + b"\n")
        stdout.flush()
