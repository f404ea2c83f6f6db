"""The HTTP routes, one module per resource; :func:`sandbox_server.app.create_app` includes them.

* :mod:`.sandboxes`: ``/v1/sandboxes`` (create, list, get, delete, files, state).
* :mod:`.snapshots`: snapshots, clone and fork (``/v1/sandboxes/{id}/snapshot|fork``, ``/v1/snapshots``).
* :mod:`.tools`: tool calls (``/v1/sandboxes/{id}/exec``), the whitelist (``/v1/tools``) and the pool (``/v1/pool``).
* :mod:`.health`: ``/healthz`` and ``/metrics``.
* :mod:`.envs`: env sessions (``/v1/envs``).

Handlers get the service and the env sessions through the typed dependencies of :mod:`sandbox_server.deps`;
blocking work runs through :func:`sandbox_server.work.run_blocking` with the deadlines computed there. Every
error answer is an ``ErrorBody`` (:mod:`sandbox_server.http_contract`); each route documents its statuses.
"""

#: Prefix of every versioned route.
V1 = "/v1"
