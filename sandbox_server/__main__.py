"""``python -m sandbox_server``: run a forkyard server (see ``--help``). The one implementation of the
server command: ``forkyard serve ARGS`` is :func:`main` with the same ``ARGS``, ``make serve`` and the
server image (``docker compose up``) run this module.

The ``--backend`` given here is the backend of every sandbox the server serves, env sessions (FileQA)
included. The local backend needs bubblewrap (``make`` installs it; ``apt-get install bubblewrap``);
without it the server refuses to start unless ``--unsafe-no-isolation`` says otherwise.
``--no-sandboxes`` serves env sessions alone (``/v1/envs``, ``/healthz``): no sandbox pool, and
sandbox-backed envs (FileQA) are refused with a 422 that says why. ``--ray ADDRESS`` serves env sessions
too, with the sandboxes of FileQA sessions on the nodes of a Ray cluster (the provider factory ``ray`` of the
entry-point group ``forkyard.sandbox_providers``, :func:`envs.sandbox.provider_for`): one URL in front of the
cluster.

Every option not given on the command line comes from its ``FORKYARD_*`` environment variable
(:class:`~sandbox_server.settings.ServerSettings`, :class:`~sandbox_server.settings.ServiceConfig`), else
its default. The command builds the two once, at start-up, and passes them down (the app, the backend, the
corpus, the Ray provider): a flag wins over its variable everywhere because nothing reads the variables again,
and nothing is written to the environment.

``FORKYARD_API_KEY`` (or ``FORKYARD_API_KEY_FILE``) has no flag, so that a secret never shows in a process list:
set, every route and transport but ``/healthz`` requires it (:mod:`sandbox_server.auth`); unset while the
server listens beyond loopback, the server says so loudly at start-up.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any

from sandbox_server.settings import LOG_LEVELS

PROG = "python -m sandbox_server"
#: Settings that are also flags: ``{field: flag}``. A flag's text goes to the settings model unchanged, so a
#: value is checked once, by the model, whichever way it arrives (field case S33).
FLAGS = {"host": "--host", "port": "--port", "backend": "--backend", "log_level": "--log-level", "ray": "--ray",
         "min_idle": "--min-idle", "max_total": "--max-total", "env_modules": "--env-modules",
         "allowed_hosts": "--allowed-hosts", "allowed_origins": "--allowed-origins"}


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The server command's options (every one reaches the running server)."""
    from sandbox_server.backends import BACKENDS

    ap = argparse.ArgumentParser(prog=prog, description="Run the forkyard server: a sandbox pool (/v1/sandboxes, "
                                 "/v1/snapshots, /v1/tools, /v1/pool) and env sessions (/v1/envs) over HTTP.")
    ap.add_argument("--host", default=None, help="address to listen on (default: FORKYARD_HOST or 127.0.0.1)")
    ap.add_argument("--port", default=None, metavar="PORT", help="TCP port (default: FORKYARD_PORT or 8000)")
    # BACKENDS loads the plugins of forkyard.backends on this first lookup; the settings model checks the value
    ap.add_argument("--backend", default=None, metavar="{" + ",".join(sorted(BACKENDS)) + "}",
                    help="where every sandbox of this server runs, env sessions included "
                         "(default: FORKYARD_BACKEND or local)")
    ap.add_argument("--unsafe-no-isolation", action="store_true",
                    help="local backend only: when bubblewrap is missing, run sandboxes as plain processes of "
                         "your user (only path checks stand between a tool call and your files; never for "
                         "untrusted policies)")
    ap.add_argument("--no-sandboxes", action="store_true",
                    help="serve env sessions alone (/v1/envs): no sandbox pool, no sandbox routes; sandbox-backed "
                         "envs (FileQA) are refused with a 422")
    ap.add_argument("--ray", default=None, metavar="ADDRESS",
                    help="serve env sessions whose sandboxes live on the nodes of a Ray cluster (auto, an address, "
                         "or local); like --no-sandboxes, no sandbox routes (default: FORKYARD_RAY, else none)")
    ap.add_argument("--min-idle", default=None, metavar="N",
                    help="sandboxes kept idle and ready (default: FORKYARD_MIN_IDLE or 2)")
    ap.add_argument("--max-total", default=None, metavar="N",
                    help="most sandboxes at once, idle and in use (default: FORKYARD_MAX_TOTAL or 16)")
    ap.add_argument("--log-level", default=None, metavar="{" + ",".join(LOG_LEVELS) + "}",
                    help="uvicorn's log level (default: FORKYARD_LOG_LEVEL or info)")
    ap.add_argument("--env-modules", default=None, metavar="MODULE[,MODULE...]",
                    help="modules to import at start-up whose registered envs the server serves, also as "
                         "'module:Id' (default: FORKYARD_ENV_MODULES; a client's 'module:Id' never makes the "
                         "server import a module)")
    ap.add_argument("--allowed-hosts", default=None, metavar="NAME[,NAME...]",
                    help="host names served besides loopback ones (*.example.com, * for any): behind a proxy or "
                         "a DNS name (default: FORKYARD_ALLOWED_HOSTS)")
    ap.add_argument("--allowed-origins", default=None, metavar="ORIGIN[,ORIGIN...]",
                    help="web origins (https://app.example.com, * for any) that may send requests and open "
                         "WebSockets besides the server's own and loopback ones (default: FORKYARD_ALLOWED_ORIGINS)")
    return ap


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or name to listen on) is this machine's loopback only."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name that may resolve anywhere


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``) and serve until interrupted: SIGINT / SIGTERM drain within
    a bound (:class:`~sandbox_server.app.DrainingServer`: requests in flight answered or cut within
    ``DRAIN_GRACE_S``), then close every sandbox and env session. Returns the exit status: 0 after a clean
    stop; 2 for bad options or settings, flag or ``FORKYARD_*`` variable alike (argparse exits with 2 itself),
    or a local backend without working isolation; 3 if the server could not start (the port is taken)."""
    ap = build_parser(prog)
    ns = ap.parse_args(argv)

    import pydantic

    from sandbox_server.settings import ServerSettings, ServiceConfig, explain

    given = {k: getattr(ns, k) for k in FLAGS if getattr(ns, k) is not None}
    problems = []
    try:
        settings = ServerSettings(**{k: v for k, v in given.items() if k in ServerSettings.model_fields})
    except pydantic.ValidationError as exc:
        problems.append(explain(exc, ServerSettings, FLAGS))
    else:
        from sandbox_server.backends import BACKENDS

        if not (ns.no_sandboxes or settings.ray) and settings.backend not in BACKENDS:  # the registry's check
            accepted = ", ".join(sorted(BACKENDS))
            problems.append(f"--backend / FORKYARD_BACKEND: unknown backend; accepted values: {accepted} "
                            f"(got {settings.backend!r})")
    try:
        config = ServiceConfig(**{k: v for k, v in given.items() if k in ServiceConfig.model_fields})
    except pydantic.ValidationError as exc:
        problems.append(explain(exc, ServiceConfig, FLAGS))
    if problems:  # every bad setting at once, each in the same words whichever way it came
        from sandbox_server.backends import BACKENDS

        problems += [BACKENDS.plugin_errors[name] for name in {given.get("backend"), os.environ.get("FORKYARD_BACKEND")}
                     if name in BACKENDS.plugin_errors]  # a backend plugin that failed to load: why
        ap.error("bad setting: " + "; ".join(problems))
    # From here on `settings` and `config` are the one configuration, passed down (a flag wins over its
    # variable everywhere: no variable is read again, none written).

    # the server's own modules only once the settings are known to be good: a refusal is quick
    from sandbox_server.env_sessions import import_env_modules

    try:  # the operator's env modules before anything starts: one that cannot be imported is a bad setting
        import_env_modules(settings.env_modules)
    except ValueError as exc:
        ap.error(str(exc))
    from envs.api_key import api_keys
    from sandbox_server.app import DrainingServer, create_app
    from sandbox_server.backends import make_backend
    from sandbox_server.errors import IsolationUnavailable, ServiceUnavailable

    try:
        keys = api_keys()  # FORKYARD_API_KEY / FORKYARD_API_KEY_FILE: required on every route but /healthz
        key = ",".join(keys) if keys else None  # any of them accepted (NEW,OLD during a rotation)
    except ValueError as exc:
        ap.error(str(exc))
    if key is None and not is_loopback(settings.host):
        print(f"{prog}: WARNING: listening on {settings.host}, beyond this machine's loopback, with no API key: "
              "anyone who reaches the port can start sandboxes and env sessions. Set FORKYARD_API_KEY (clients "
              "send it from the same variable).", file=sys.stderr, flush=True)
    provider: Any = None  # --ray: the cluster's sandboxes, closed when the server stops
    if ns.no_sandboxes or settings.ray:
        pool_flags = [f for f, v in (("--backend", ns.backend),
                                     ("--unsafe-no-isolation", ns.unsafe_no_isolation or None),
                                     ("--min-idle", ns.min_idle), ("--max-total", ns.max_total)) if v is not None]
        what = "--ray puts the sandboxes on the cluster's nodes" if settings.ray else "--no-sandboxes serves none"
        if pool_flags:
            ap.error(f"{', '.join(pool_flags)}: options of the sandbox pool, but {what}")
        if ns.no_sandboxes and settings.ray:
            ap.error("--no-sandboxes serves no sandbox-backed env; --ray serves them on a Ray cluster: choose one")
        if settings.ray:
            from envs.sandbox import provider_for

            try:  # the cluster's provider by name (the Ray code is a plugin of the group, never imported here)
                provider = provider_for(settings.ray, name="ray", settings=settings)
            except ImportError as exc:  # no ray extra (or no factory "ray" installed): says which package
                print(f"{prog}: {exc}", file=sys.stderr)
                return 2
            except Exception as exc:  # noqa: BLE001 - no cluster at that address (ConnectionError, RuntimeError...)
                print(f"{prog}: cannot use the Ray cluster {settings.ray!r}: {type(exc).__name__}: {exc}",
                      file=sys.stderr)
                return 2
            # ray.init made SIGTERM exit with status 15; uvicorn re-raises the SIGTERM it stopped on once it
            # has shut down: a stop asked for is a clean stop (status 0, the cluster's sandboxes closed below).
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        app = create_app(config=config, sandboxes=False, sandbox_provider=provider, api_key=key, settings=settings)
    else:
        try:  # built here, before the server listens: no isolation means no server
            backend = make_backend(settings.backend, settings=settings, unsafe_no_isolation=ns.unsafe_no_isolation)
        except IsolationUnavailable as exc:
            print(f"{prog}: {exc}", file=sys.stderr)
            return 2
        except ServiceUnavailable as exc:  # the engine is down: serve degraded (503s), retry at start-up
            print(f"{prog}: warning: the {settings.backend} backend is unavailable ({exc}); it is tried once more "
                  "as the server starts, and while it is down the server answers 503", file=sys.stderr)
            backend = settings.backend
        except ValueError as exc:  # unknown options, or --unsafe-no-isolation for an always isolated backend
            ap.error(str(exc).replace("unsafe_no_isolation", "--unsafe-no-isolation"))
        app = create_app(backend, config, api_key=key, settings=settings)
    try:
        # a stop (SIGTERM, as `docker stop` sends) drains within a bound: requests in flight are answered or cut
        # (503) within DRAIN_GRACE_S, then every sandbox is destroyed (field case S39)
        from sandbox_server.openenv_flow import WS_FRAME_BYTES

        # ws_max_size above the largest message the OpenEnv WebSocket answers (WS_MESSAGE_BYTES): a message a
        # little too large is answered 413 and the connection goes on; beyond it, close code 1009 (field case S55)
        server = DrainingServer(app, host=settings.host, port=settings.port, log_level=settings.log_level,
                                access_log=False, ws_max_size=WS_FRAME_BYTES)
        try:
            server.run()
        except KeyboardInterrupt:  # SIGINT (Ctrl-C): re-raised by uvicorn once it has drained, as uvicorn.run takes it
            pass
        if not server.started:
            return 3  # uvicorn's own status for a server that could not start (the port is taken...)
    finally:
        if provider is not None:
            provider.close()  # the nodes' sandboxes go with it
    return 0


if __name__ == "__main__":
    sys.exit(main())
