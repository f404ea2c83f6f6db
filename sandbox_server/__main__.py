"""``python -m sandbox_server``: run the sandbox service (see ``--help``)."""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
    """Parse arguments and serve until interrupted. Returns the exit status."""
    ap = argparse.ArgumentParser(prog="python -m sandbox_server", description="forkyard sandbox service")
    ap.add_argument("--host", default=os.environ.get("FORKYARD_HOST", "127.0.0.1"))
    ap.add_argument("--port", type=int, default=int(os.environ.get("FORKYARD_PORT", "8000")))
    ap.add_argument("--backend", choices=["local", "docker"], default=os.environ.get("FORKYARD_BACKEND", "local"))
    ap.add_argument("--min-idle", type=int, default=None)
    ap.add_argument("--max-total", type=int, default=None)
    ap.add_argument("--log-level", default="info")
    ns = ap.parse_args(argv)
    from sandbox_server.app import serve
    from sandbox_server.service import ServiceConfig

    serve(ns.host, ns.port, backend=ns.backend,
          config=ServiceConfig.from_env(min_idle=ns.min_idle, max_total=ns.max_total), log_level=ns.log_level)
    return 0


if __name__ == "__main__":
    sys.exit(main())
