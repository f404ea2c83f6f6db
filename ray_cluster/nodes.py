"""Env sessions and sandbox pools on the nodes of a Ray cluster (``pip install forkyard[ray]``).

One :class:`NodeHost` actor runs on each node, pinned there by a hard node-affinity scheduling strategy
(placement by node, never by luck). It owns that node's sandbox service (its envs take their provider in
the actor's process: the node's own Docker engine or its local bubblewrap backend) and the env sessions
on it, and counts the envs alive on the node against ``capacity``.

* :func:`start_hosts` starts one host per alive node (or reuses those still alive) and returns them by
  node name; :func:`node_name` is the node's ``forkyard-node`` label when it has one, else its host name
  and id. A host's sandboxes carry ``forkyard.sandbox=<server name>-<node name>``, so a host that starts
  again on a node that came back removes the containers its dead predecessor left (the docker backend's
  start-up clean-up of orphans, as on one machine).
* A host's sessions are reached as Gymnasium envs through :class:`ray_cluster.transport.ClusterEnv` (its
  ``reset``, ``step``, ``fork``, ``snapshot`` and ``close`` are actor calls; a node lost under it raises
  :class:`envs.core.EnvInfraError`, so trainers drop the episode as ``infra_error``, as for a sandbox lost on
  one machine); :func:`ray_cluster.transport.make` places a new session on the host with the most room.
* A fork that cannot stay on its node travels as snapshot bytes (:meth:`envs.core.TextEnv.snapshot`,
  plain data, the sandbox's files included): :meth:`NodeHost.adopt` restores it on another node and
  forks it there.

Ray is imported inside the functions that need it: importing this module costs nothing without Ray.
"""

from __future__ import annotations

import itertools
import os
from typing import Any

import gymnasium as gym

#: The node label that names a node (``ray start --labels forkyard-node=gpu-a``; simulated clusters set it).
NODE_LABEL = "forkyard-node"


def require_ray():
    """Import and return the ``ray`` module. Raises ImportError naming the extra when it is missing."""
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - the extra is installed by `make`
        raise ImportError("Ray is not installed: pip install 'forkyard[ray]'") from exc
    return ray


def node_name(node: dict[str, Any]) -> str:
    """The stable name of a node of ``ray.nodes()``: its ``forkyard-node`` label, else ``host:id8``."""
    label = (node.get("Labels") or {}).get(NODE_LABEL)
    return label or f"{node.get('NodeManagerHostname', 'node')}:{node['NodeID'][:8]}"


def alive_nodes() -> list[dict[str, Any]]:
    """The alive nodes of the connected cluster, sorted by :func:`node_name`."""
    ray = require_ray()
    return sorted((n for n in ray.nodes() if n.get("Alive")), key=node_name)


def is_node_loss(exc: BaseException) -> bool:
    """True when ``exc`` says an actor or its node is gone: ``RayActorError`` (and subclasses), or a result
    lost with the node's object store (``ObjectLostError`` and subclasses)."""
    from ray.exceptions import ObjectLostError, RayActorError

    return isinstance(exc, (RayActorError, ObjectLostError))


class NodeHost:
    """The env sessions of one node (a Ray actor, :func:`start_hosts`), held as ``/v1/envs`` holds its own: by
    :class:`~sandbox_server.env_sessions.EnvSessions` (ids, capacity) and the synchronous core of
    :class:`~sandbox_server.session_host.SessionHost` (``*_now``). Needs the server extra (``forkyard[server]``).

    Args:
        name: the node's name (:func:`node_name`).
        capacity: envs this node may hold at once (sessions and a rollout worker's envs together).
        server_name: the sandbox label prefix; this host's sandboxes are labelled ``<server_name>-<name>``: the
            host makes every shared provider of its process (the actor's: :meth:`sandbox`'s, its envs') with that
            ``server_name`` (:func:`sandbox_server.embedded.use_shared_settings`; nothing is written to the
            environment). Their other settings are the node's own ``FORKYARD_*`` variables.
        backend: the sandbox backend of :meth:`sandbox` (None: the node's ``FORKYARD_BACKEND``).

    Session ids are ``"<name>/<n>"``; sessions never expire. The kwargs are the operator's (the trainer's config):
    passed on unchecked, ``backend`` included. Errors are the session host's domain errors (:mod:`envs.errors`),
    each the builtin a Gymnasium env raises: KeyError for an unknown session (closed, or another host's),
    EpisodeFinishedError for a step on an ended episode, ValueError for a value the env refuses, EnvInfraError
    when the env or its sandbox failed; an action longer than the env accepts gets the env's invalid-action
    observation, as in-process.
    """

    def __init__(self, name: str, capacity: int, server_name: str = "default", backend: str | None = None):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        from sandbox_server.embedded import use_shared_settings
        from sandbox_server.env_sessions import EnvSessions
        from sandbox_server.session_host import SessionHost

        # One host per actor process: the providers its sandboxes and its envs' come from carry its label
        # (restored by shutdown, for a host made in another process, as tests do).
        self._shared_before = use_shared_settings({"server_name": f"{server_name}-{name}"})

        self.name = name
        self.capacity = capacity
        self.backend = backend
        ids = itertools.count()
        self.store = EnvSessions(ttl_s=float("inf"), max_sessions=capacity, operator_kwargs=True,
                                 new_id=lambda: f"{name}/{next(ids)}")
        self.host = SessionHost(self.store)

    @property
    def sessions(self) -> dict[str, Any]:
        """``{session id: env}`` of the sessions held now (a copy)."""
        return {sid: s.env for sid, s in self.store.held().items()}

    @property
    def live(self) -> int:
        """Envs alive on this node: sessions and the rollout worker's own envs (:meth:`reserve`)."""
        return self.store.in_use

    # ------------------------------------------------------------------ capacity
    def reserve(self, n: int, force: bool = False) -> bool:
        """Count ``n`` envs that are not sessions (a rollout worker's) if they fit (always when ``force``)."""
        return self.store.hold(n, force)

    def release(self, n: int = 1) -> None:
        """Count ``n`` envs of :meth:`reserve` fewer on this node."""
        self.store.hold(-n, force=True)

    def info(self) -> dict[str, Any]:
        """``{"name", "node_id", "pid", "live", "capacity", "sessions"}`` of this host."""
        ray = require_ray()
        return {"name": self.name, "node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
                "live": self.live, "capacity": self.capacity, "sessions": len(self.store)}

    # ------------------------------------------------------------------ sessions
    def create(self, env_id: str, kwargs: dict[str, Any]) -> str:
        """A new session of ``env_id`` made with ``kwargs`` (not reset yet). Counted even over capacity."""
        return self.host.open_now(self.store.recipe(env_id, kwargs), force=True).session_id

    def adopt(self, env_id: str, kwargs: dict[str, Any], snapshot: bytes, n: int) -> list[str] | None:
        """``n`` sessions at the state of ``snapshot`` (bytes of :meth:`envs.core.TextEnv.snapshot`): the
        snapshot restored here and forked into ``n`` copies, which take the fork keys a local ``fork(n)`` of
        the source would have given (the source counts them, :meth:`envs.core.TextEnv.count_forks`), so they
        draw independent later episodes. None (nothing made) when ``n`` do not fit."""
        from sandbox_server.errors import CapacityReached

        try:
            return self.host.adopt_now(self.store.recipe(env_id, kwargs), snapshot, n)
        except CapacityReached:
            return None

    def reset(self, sid: str, seed: int | None = None, options: dict[str, Any] | None = None):
        """``env.reset`` of session ``sid``: ``(observation, info)``."""
        return self.host.reset_now(sid, seed, options)

    def step(self, sid: str, action: str):
        """``env.step`` of session ``sid``: ``(observation, reward, terminated, truncated, info)``."""
        return self.host.step_now(sid, action, check_length=False)  # an action too long: as in-process

    def fork(self, sid: str, n: int) -> list[str]:
        """``n`` new sessions forked from ``sid`` on this node (counted even over capacity)."""
        return self.host.fork_now(sid, n, force=True)

    def snapshot(self, sid: str) -> bytes:
        """The snapshot bytes of session ``sid`` (for :meth:`adopt` on another host)."""
        return self.host.snapshot_now(sid).to_bytes()

    def _env(self, sid: str) -> Any:
        return self.store.get(sid).env

    def spaces(self, sid: str) -> tuple[gym.Space, gym.Space]:
        """``(observation_space, action_space)`` of session ``sid``."""
        env = self._env(sid)
        return env.observation_space, env.action_space

    def current_info(self, sid: str) -> dict[str, Any]:
        """``env.current_info()`` of session ``sid``."""
        return self._env(sid).current_info()

    def close(self, sid: str) -> None:
        """Close session ``sid`` (its sandbox is released); an unknown id is ignored."""
        self.host.close_now([sid])

    # ------------------------------------------------------------------ the node's sandboxes
    def sandbox(self, op: str, *args: Any, **kwargs: Any) -> Any:
        """One call of this node's sandbox provider (``backend``: None is the node's ``FORKYARD_BACKEND``):
        ``op`` is one of :data:`SANDBOX_OPS`. Raises ValueError for another op, and what the provider raises."""
        if op not in SANDBOX_OPS:
            raise ValueError(f"unknown sandbox op {op!r}; one of {SANDBOX_OPS}")
        from envs.sandbox import provider_for

        return getattr(provider_for(self.backend), op)(*args, **kwargs)

    def shutdown(self) -> int:
        """Close every session and this process's sandbox providers, and give the process back the shared settings
        it had before this host. Returns the sessions closed."""
        n = sum(self.host.close_now(list(self.store.held())))
        from sandbox_server.embedded import use_shared_settings
        from sandbox_server.shared_providers import close_shared_providers

        close_shared_providers()
        use_shared_settings(self._shared_before)
        return n


#: The provider calls a :class:`ray_cluster.sandboxes.RayProvider` routes to a node (the
#: :class:`envs.sandbox.SandboxProvider` protocol).
SANDBOX_OPS = ("create", "exec", "fork", "delete", "export", "tools")


def unwrap(exc: BaseException, node: str, failure: type[Exception]) -> BaseException:
    """What a caller of a host should raise for ``exc`` from a Ray call: ``failure`` (naming the node) when
    the node is gone, the remote code's own exception when Ray wrapped one, else ``exc``."""
    if is_node_loss(exc):
        return failure(f"node {node} lost: {type(exc).__name__}")
    cause = getattr(exc, "cause", None)  # a RayTaskError wraps the remote code's exception
    return cause if isinstance(cause, Exception) else exc


def host_options(node: dict[str, Any], max_concurrency: int = 8) -> dict[str, Any]:
    """Ray actor options that pin an actor to ``node`` (hard node affinity) and take no CPU slot."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node["NodeID"], soft=False),
            "num_cpus": 0, "max_concurrency": max_concurrency, "max_restarts": 0}


def start_hosts(cls: type = NodeHost, existing: dict[str, Any] | None = None, *, capacity: int,
                server_name: str | None = None, nodes: list[str] | None = None, max_concurrency: int = 8,
                **kwargs: Any) -> dict[str, Any]:
    """One ``cls`` actor (a :class:`NodeHost` or subclass) on each alive node of the connected cluster.

    Hosts in ``existing`` (``{node name: actor}``) whose node is still alive are kept; nodes without one
    get a new actor (a node that came back gets a fresh host, whose sandboxes' start-up clean-up removes
    its predecessor's containers). Returns ``{node name: actor}`` of the alive nodes. Raises RuntimeError
    when the cluster has no alive node. ``server_name``: the hosts' label prefix, passed to each host (None,
    for a caller holding no settings: ``FORKYARD_SERVER_NAME`` of ``ServerSettings()``, read now, once);
    ``nodes``, when given, limits the hosts to the nodes of those names; ``max_concurrency``: calls a host
    serves at once (threads). Raises ValueError for ``capacity < 1``.
    """
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity}")
    ray = require_ray()
    if server_name is None:
        from sandbox_server.settings import ServerSettings

        server_name = ServerSettings().server_name
    alive = [n for n in alive_nodes() if nodes is None or node_name(n) in nodes]
    if not alive:
        raise RuntimeError(f"the Ray cluster has no alive node{'' if nodes is None else f' among {nodes}'}")
    remote = ray.remote(cls)
    out: dict[str, Any] = {}
    for node in alive:
        name = node_name(node)
        if existing and name in existing:
            out[name] = existing[name]
        else:
            out[name] = remote.options(**host_options(node, max_concurrency)).remote(name, capacity, server_name,
                                                                                    **kwargs)
    infos = {name: a.info.remote() for name, a in out.items()}
    for name, ref in infos.items():  # every host is up before use; one whose node died meanwhile is left out
        try:
            ray.get(ref)
        except Exception as exc:
            if not is_node_loss(exc):
                raise
            del out[name]
    if not out:
        raise RuntimeError("every node of the Ray cluster was lost while its host started")
    return out
