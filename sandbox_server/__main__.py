"""``python -m sandbox_server``: run the sandbox service (see ``--help``).

The ``--backend`` given here is the backend of every sandbox the server serves, env sessions (FileQA)
included. The local backend needs bubblewrap (``make`` installs it; ``apt-get install bubblewrap``);
without it the server refuses to start unless ``--unsafe-no-isolation`` says otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
    """Parse arguments and serve until interrupted. Returns the exit status (2: bad options, or the
    local backend has no working isolation)."""
    ap = argparse.ArgumentParser(prog="python -m sandbox_server", description="forkyard sandbox service")
    ap.add_argument("--host", default=os.environ.get("FORKYARD_HOST", "127.0.0.1"))
    ap.add_argument("--port", type=int, default=int(os.environ.get("FORKYARD_PORT", "8000")))
    ap.add_argument("--backend", choices=["local", "docker"], default=os.environ.get("FORKYARD_BACKEND", "local"),
                    help="where every sandbox of this server runs, env sessions included (default: local)")
    ap.add_argument("--unsafe-no-isolation", action="store_true",
                    help="local backend only: when bubblewrap is missing, run sandboxes as plain processes of "
                         "your user (only path checks stand between a tool call and your files; never for "
                         "untrusted policies)")
    ap.add_argument("--min-idle", type=int, default=None)
    ap.add_argument("--max-total", type=int, default=None)
    ap.add_argument("--log-level", default="info")
    ns = ap.parse_args(argv)
    from sandbox_server.app import serve
    from sandbox_server.backends import LocalBackend
    from sandbox_server.errors import IsolationUnavailable
    from sandbox_server.service import ServiceConfig

    backend: object = ns.backend
    if ns.backend == "local":
        try:  # built here, before the server listens: no isolation means no server
            backend = LocalBackend(unsafe_no_isolation=ns.unsafe_no_isolation,
                                   server_name=os.environ.get("FORKYARD_SERVER_NAME", "default"))
        except IsolationUnavailable as exc:
            print(f"python -m sandbox_server: {exc}", file=sys.stderr)
            return 2
    elif ns.unsafe_no_isolation:
        ap.error("--unsafe-no-isolation applies to the local backend only")
    serve(ns.host, ns.port, backend=backend,
          config=ServiceConfig.from_env(min_idle=ns.min_idle, max_total=ns.max_total), log_level=ns.log_level)
    return 0


if __name__ == "__main__":
    sys.exit(main())
