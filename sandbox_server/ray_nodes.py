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
* :class:`ClusterEnv` is a Gymnasium env whose episode lives in a host's session: ``reset``, ``step``,
  ``fork`` (children on the same host), ``snapshot`` and ``close`` are actor calls. A node lost under it
  raises :class:`envs.core.EnvInfraError`, so trainers drop the episode as ``infra_error``, as for a
  sandbox lost on one machine. :func:`make` places a new session on the host with the most room.
* A fork that cannot stay on its node travels as snapshot bytes (:meth:`envs.core.TextEnv.snapshot`,
  plain data, the sandbox's files included): :meth:`NodeHost.adopt` restores it on another node and
  forks it there.

Ray is imported inside the functions that need it: importing this module costs nothing without Ray.
"""

from __future__ import annotations

import itertools
import os
import threading
from typing import Any

import gymnasium as gym

from envs.core import EnvInfraError

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
    """The env sessions of one node (run as a Ray actor by :func:`start_hosts`).

    Args:
        name: the node's name (:func:`node_name`).
        capacity: envs this node may hold at once (sessions and a rollout worker's envs together).
        server_name: the sandbox label prefix; this host's sandboxes are labelled ``<server_name>-<name>``
            (``FORKYARD_SERVER_NAME`` of the actor's process, set before any provider starts).

    Session ids are ``"<name>/<n>"``. Methods raise KeyError for an unknown session (closed, or another
    host's) and what the env raises otherwise (ValueError for bad input, EnvInfraError for a sandbox lost).
    """

    def __init__(self, name: str, capacity: int, server_name: str = "default", backend: str | None = None):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        os.environ["FORKYARD_SERVER_NAME"] = f"{server_name}-{name}"
        self.name = name
        self.capacity = capacity
        self.backend = backend
        self.sessions: dict[str, Any] = {}
        self.live = 0  # envs alive on this node: sessions and the rollout worker's own envs
        self._ids = itertools.count()
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ capacity
    def reserve(self, n: int, force: bool = False) -> bool:
        """Count ``n`` more envs on this node if they fit (always when ``force``). Returns whether counted."""
        with self._lock:
            if not force and self.live + n > self.capacity:
                return False
            self.live += n
            return True

    def release(self, n: int = 1) -> None:
        """Count ``n`` envs fewer on this node."""
        with self._lock:
            self.live = max(self.live - n, 0)

    def info(self) -> dict[str, Any]:
        """``{"name", "node_id", "pid", "live", "capacity", "sessions"}`` of this host."""
        ray = require_ray()
        return {"name": self.name, "node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
                "live": self.live, "capacity": self.capacity, "sessions": len(self.sessions)}

    # ------------------------------------------------------------------ sessions
    def _add(self, env) -> str:
        sid = f"{self.name}/{next(self._ids)}"
        self.sessions[sid] = env
        return sid

    def create(self, env_id: str, kwargs: dict[str, Any]) -> str:
        """A new session of ``env_id`` made with ``kwargs`` (not reset yet). Counted even over capacity."""
        env = gym.make(env_id, disable_env_checker=True, **kwargs).unwrapped
        self.reserve(1, force=True)
        return self._add(env)

    def adopt(self, env_id: str, kwargs: dict[str, Any], snapshot: bytes, n: int) -> list[str] | None:
        """``n`` sessions at the state of ``snapshot`` (bytes of :meth:`envs.core.TextEnv.snapshot`): the
        snapshot restored here and forked into ``n`` copies, which take the fork keys a local ``fork(n)`` of
        the source would have given (the source counts them, :meth:`envs.core.TextEnv.count_forks`), so they
        draw independent later episodes. None (nothing made) when ``n`` do not fit."""
        if not self.reserve(n):
            return None
        try:
            template = gym.make(env_id, disable_env_checker=True, **kwargs).unwrapped
            try:
                template.restore(snapshot)
                envs_ = template.fork(n)
            finally:
                template.close()
        except BaseException:
            self.release(n)
            raise
        return [self._add(e) for e in envs_]

    def reset(self, sid: str, seed: int | None = None, options: dict[str, Any] | None = None):
        """``env.reset`` of session ``sid``: ``(observation, info)``."""
        return self.sessions[sid].reset(seed=seed, options=options)

    def step(self, sid: str, action: str):
        """``env.step`` of session ``sid``: ``(observation, reward, terminated, truncated, info)``."""
        return self.sessions[sid].step(action)

    def fork(self, sid: str, n: int) -> list[str]:
        """``n`` new sessions forked from ``sid`` on this node (counted even over capacity)."""
        children = self.sessions[sid].fork(n)
        self.reserve(len(children), force=True)
        return [self._add(c) for c in children]

    def snapshot(self, sid: str) -> bytes:
        """The snapshot bytes of session ``sid`` (for :meth:`adopt` on another host)."""
        return self.sessions[sid].snapshot().to_bytes()

    def spaces(self, sid: str) -> tuple[gym.Space, gym.Space]:
        """``(observation_space, action_space)`` of session ``sid``."""
        env = self.sessions[sid]
        return env.observation_space, env.action_space

    def current_info(self, sid: str) -> dict[str, Any]:
        """``env.current_info()`` of session ``sid``."""
        return self.sessions[sid].current_info()

    def close(self, sid: str) -> None:
        """Close session ``sid`` (its sandbox is released); an unknown id is ignored."""
        env = self.sessions.pop(sid, None)
        if env is not None:
            env.close()
            self.release(1)

    # ------------------------------------------------------------------ the node's sandboxes
    def sandbox(self, op: str, *args: Any, **kwargs: Any) -> Any:
        """One call of this node's sandbox provider (``backend``: None is the node's ``FORKYARD_BACKEND``):
        ``op`` is one of :data:`SANDBOX_OPS`. Raises ValueError for another op, and what the provider raises."""
        if op not in SANDBOX_OPS:
            raise ValueError(f"unknown sandbox op {op!r}; one of {SANDBOX_OPS}")
        from envs.sandbox import provider_for

        return getattr(provider_for(self.backend), op)(*args, **kwargs)

    def shutdown(self) -> int:
        """Close every session and this process's sandbox providers. Returns the sessions closed."""
        n = len(self.sessions)
        for sid in list(self.sessions):
            self.close(sid)
        try:
            from sandbox_server.embedded import close_shared_providers
        except ImportError:  # pragma: no cover - a host without the server extra has no providers
            return n
        close_shared_providers()
        return n


#: The provider calls a :class:`RayProvider` routes to a node (the :class:`envs.sandbox.SandboxProvider` protocol).
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
    when the cluster has no alive node. ``server_name`` defaults to ``FORKYARD_SERVER_NAME`` (ServerSettings);
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


class ClusterEnv(gym.Env):
    """A Gymnasium env whose episode lives in a session of a :class:`NodeHost` (module docstring).

    The observation and action spaces are the registered env's (made once locally, never reset).
    ``fork(n)`` returns ``n`` ClusterEnvs on the same host. Every method raises
    :class:`envs.core.EnvInfraError` when the host's node is gone.
    """

    metadata = {"render_modes": []}

    def __init__(self, host, sid: str, env_id: str | None = None, kwargs: dict[str, Any] | None = None,
                 node: str | None = None):
        self.host, self.sid, self.env_id, self.kwargs = host, sid, env_id, dict(kwargs or {})
        self.node = node or sid.split("/", 1)[0]
        self._closed = False
        if env_id is not None:
            self.spec = gym.spec(env_id)
            self.observation_space, self.action_space = self._call("spaces")

    def _call(self, method: str, *args: Any):
        ray = require_ray()
        try:
            return ray.get(getattr(self.host, method).remote(self.sid, *args))
        except Exception as exc:
            raise unwrap(exc, self.node, EnvInfraError) from None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        return self._call("reset", seed, options)

    def step(self, action: str):
        return self._call("step", action)

    def fork(self, n: int = 1) -> list["ClusterEnv"]:
        """``n`` copies on the same host (:meth:`envs.core.TextEnv.fork`)."""
        sids = self._call("fork", n)
        return [self._twin(s) for s in sids]

    def _twin(self, sid: str) -> "ClusterEnv":
        twin = object.__new__(ClusterEnv)
        twin.__dict__.update(self.__dict__)
        twin.sid, twin._closed = sid, False
        return twin

    def snapshot(self) -> bytes:
        """The session's snapshot as bytes."""
        return self._call("snapshot")

    def current_info(self) -> dict[str, Any]:
        return self._call("current_info")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._call("close")
        except EnvInfraError:
            pass  # the node is gone, and the session with it


def make(env_id: str, hosts: dict[str, Any], **kwargs: Any) -> ClusterEnv:
    """A :class:`ClusterEnv` of ``env_id`` (made with ``kwargs`` on its node) on the host of ``hosts``
    (``{node name: actor}``, from :func:`start_hosts`) with the most free room."""
    ray = require_ray()
    names = list(hosts)
    infos = ray.get([hosts[n].info.remote() for n in names])
    name = names[max(range(len(names)), key=lambda i: infos[i]["capacity"] - infos[i]["live"])]
    sid = ray.get(hosts[name].create.remote(env_id, kwargs))
    return ClusterEnv(hosts[name], sid, env_id, kwargs, node=name)

