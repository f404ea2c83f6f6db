"""Sandboxes on the nodes of a Ray cluster: :class:`RayProvider`, an :class:`envs.sandbox.SandboxProvider`.

Each node's :class:`~ray_cluster.nodes.NodeHost` runs that node's own sandbox service; this provider routes
every call to the host that owns the sandbox. It is the factory ``ray`` of the entry-point group
``forkyard.sandbox_providers`` (``pyproject.toml``; :func:`envs.sandbox.provider_for` with ``name="ray"``
makes one for a cluster address), which is how the server reaches it without naming this package: envs get it
with ``backend="ray:ADDRESS"`` (through :func:`sandbox_server.embedded.shared_provider`), and
``python -m sandbox_server --ray ADDRESS`` serves env sessions whose sandboxes live on the cluster: one URL in
front of many nodes.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from ray_cluster.nodes import NodeHost, is_node_loss, require_ray, start_hosts, unwrap

if TYPE_CHECKING:
    from sandbox_server.settings import ServerSettings


class RayProvider:
    """A :class:`envs.sandbox.SandboxProvider` whose sandboxes live on the nodes of a Ray cluster.

    Each node's :class:`NodeHost` runs the node's own sandbox service; a sandbox id is
    ``"<node name>|<the node's id>"``, so every call goes to the host that owns the sandbox. A new sandbox
    goes to the node holding the fewest of this provider's; forks stay on their parent's node. Envs get one
    with ``backend="ray:ADDRESS"`` (``ray:auto``: the cluster ``RAY_ADDRESS`` names), and a server with
    ``python -m sandbox_server --ray ADDRESS`` serves env sessions whose sandboxes are on the cluster.

    Made by :func:`envs.sandbox.provider_for` (``provider_for(address, name="ray")``: this class is the entry
    point ``ray`` of ``forkyard.sandbox_providers``) or directly.

    Args:
        address: the cluster (``auto``, an address, or ``local`` to start one here; None or ``""``:
            ``auto``); an existing connection of this process is used as it is.
        capacity: each host's ``capacity`` (envs; sandboxes are not counted against it).
        settings: the settings of the server (or process) this provider serves
            (:class:`~sandbox_server.settings.ServerSettings`, passed down by ``python -m sandbox_server --ray``
            and by :mod:`sandbox_server.embedded`): the hosts label their sandboxes ``<server_name>-<node name>``,
            and :meth:`data_dir` is ``corpus_dir(settings)``. Each node's sandboxes run on that node's own
            backend (its ``FORKYARD_BACKEND``, local by default). None: ``ServerSettings()`` read from the
            ``FORKYARD_*`` variables now, once.

    Every call raises :class:`envs.sandbox.SandboxFailure` when the sandbox's node is gone (an env then
    ends the episode as ``infra_error``; the node takes no new sandboxes afterwards), and what the node's
    provider raises otherwise. The hosts are those alive when the provider started: nodes that join later
    are not used by it.
    """

    def __init__(self, address: str | None = "auto", capacity: int = 64, *, settings: ServerSettings | None = None):
        from envs.sandbox import SandboxFailure
        from sandbox_server.settings import ServerSettings

        self.settings = settings if settings is not None else ServerSettings()
        address = address or "auto"
        ray = require_ray()
        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, log_to_driver=False)  # "local": a new one here
        self.name = f"ray:{address}"
        self._failure = SandboxFailure
        self.hosts = start_hosts(NodeHost, capacity=capacity, server_name=self.settings.server_name)
        self._held = {name: 0 for name in self.hosts}
        self._lock = threading.Lock()
        self._tools: Any = None

    def _call(self, node: str, op: str, *args: Any, **kwargs: Any) -> Any:
        ray = require_ray()
        host = self.hosts.get(node)
        if host is None:
            raise self._failure(f"node {node} is not part of this provider's cluster (lost, or an id of another)")
        try:
            return ray.get(host.sandbox.remote(op, *args, **kwargs))
        except Exception as exc:
            err = unwrap(exc, node, self._failure)
            if isinstance(err, self._failure) and node in self.hosts and is_node_loss(exc):
                with self._lock:  # a lost node takes no new sandboxes (its own are gone with it)
                    self.hosts.pop(node, None)
                    self._held.pop(node, None)
            raise err from None

    @staticmethod
    def _split(sandbox_id: str) -> tuple[str, str]:
        node, sep, inner = sandbox_id.partition("|")
        if not sep:
            raise KeyError(f"{sandbox_id!r} is not a sandbox id of a Ray provider (node|id)")
        return node, inner

    @staticmethod
    def _named(info: Any, node: str) -> Any:
        return info.model_copy(update={"id": f"{node}|{info.id}"})

    def create(self, *, files: dict[str, bytes] | None = None, archive: bytes | None = None,
               families: list[str] | None = None) -> Any:
        with self._lock:
            if not self._held:
                raise self._failure("every node of the Ray cluster this provider used is lost")
            node = min(self._held, key=lambda n: (self._held[n], n))
            self._held[node] += 1
        try:
            return self._named(self._call(node, "create", files=files, archive=archive,
                                          **({"families": families} if families else {})), node)
        except BaseException:
            with self._lock:
                if node in self._held:
                    self._held[node] -= 1
            raise

    def exec(self, sandbox_id: str, tool: str, args: dict[str, Any], timeout_s: float | None = None) -> Any:
        node, inner = self._split(sandbox_id)
        return self._call(node, "exec", inner, tool, args, timeout_s)

    def fork(self, sandbox_id: str, n: int) -> list[Any]:
        node, inner = self._split(sandbox_id)
        kids = self._call(node, "fork", inner, n)
        with self._lock:
            self._held[node] = self._held.get(node, 0) + len(kids)
        return [self._named(k, node) for k in kids]

    def delete(self, sandbox_id: str) -> None:
        node, inner = self._split(sandbox_id)
        self._call(node, "delete", inner)
        with self._lock:
            self._held[node] = max(self._held.get(node, 1) - 1, 0)

    def export(self, sandbox_id: str) -> bytes:
        node, inner = self._split(sandbox_id)
        return self._call(node, "export", inner)

    def tools(self) -> Any:
        if self._tools is None:
            self._tools = self._call(sorted(self.hosts)[0], "tools")
        return self._tools

    def data_dir(self) -> str:
        """This machine's corpus (``corpus_dir(self.settings)``), as for a remote server: the nodes build the same
        corpus, and FileQA checks the manifest against the sandbox's own."""
        from sandbox_server.corpus import ensure_corpus
        from sandbox_server.settings import corpus_dir

        return ensure_corpus(corpus_dir(self.settings))

    def close(self) -> None:
        """Shut the hosts down (their sandboxes are destroyed) and let them go."""
        ray = require_ray()
        for host in self.hosts.values():
            try:
                ray.get(host.shutdown.remote(), timeout=60)
                ray.kill(host)
            except Exception:  # noqa: BLE001 - a node gone: nothing left to close there
                pass
        self.hosts = {}
