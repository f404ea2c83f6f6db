"""Env sessions of a :class:`~ray_cluster.nodes.NodeHost` as Gymnasium envs, from any process of the cluster.

* :class:`RayTransport` is a transport of :class:`envs.session_client.SessionClient` (the client of
  ``/v1/envs`` and of the OpenEnv WebSocket too) over one host actor: one actor call per operation.
* :class:`ClusterEnv` is a Gymnasium env whose episode lives in a host's session: ``reset``, ``step``,
  ``fork`` (children on the same host), ``snapshot`` and ``close`` are actor calls. A node lost under it
  raises :class:`envs.core.EnvInfraError`, so trainers drop the episode as ``infra_error``, as for a
  sandbox lost on one machine. :func:`make` places a new session on the host with the most room.

Ray is imported inside the functions that need it: importing this module costs nothing without Ray.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from envs.core import EnvInfraError
from envs.wire import ResetResponse, StepResponse, decode
from ray_cluster.nodes import require_ray, unwrap


class RayTransport:
    """Env sessions on one :class:`~ray_cluster.nodes.NodeHost` actor, as a transport of
    :class:`envs.session_client.SessionClient` (the client of ``/v1/envs`` and the OpenEnv WebSocket too): one
    actor call per operation; the host raises what a Gymnasium env raises, and a node lost under a call raises
    :class:`envs.core.EnvInfraError`. No ``restore`` or ``tools``: a snapshot moves to another node with
    :meth:`ray_cluster.nodes.NodeHost.adopt`."""

    def __init__(self, host, node: str):
        self.host, self.node, self.refs = host, node, 1

    def call(self, method: str, *args: Any):
        """``host.method(*args)``, waited for; EnvInfraError naming the node when it is gone."""
        try:
            return require_ray().get(getattr(self.host, method).remote(*args))
        except Exception as exc:
            raise unwrap(exc, self.node, EnvInfraError) from None

    def create(self, env_id, kwargs, seed, options):
        return self.reset(self.call("create", env_id, kwargs), seed, options)

    def reset(self, sid, seed, options):
        obs, info = self.call("reset", sid, seed, options)
        return decode(ResetResponse, {"session_id": sid, "observation": obs, "info": info})

    def step(self, sid, action):
        obs, reward, term, trunc, info = self.call("step", sid, action)
        return decode(StepResponse, {"session_id": sid, "observation": obs, "reward": reward, "terminated": term,
                                     "truncated": trunc, "info": info})

    def fork(self, sid, n):
        return self.call("fork", sid, n)

    def snapshot(self, sid) -> bytes:
        return self.call("snapshot", sid)

    def delete(self, sid) -> None:
        self.call("close", sid)

    def close(self) -> None:
        pass  # the actor is the cluster's, not this transport's


class ClusterEnv(gym.Env):
    """A Gymnasium env whose episode lives in a session of a :class:`~ray_cluster.nodes.NodeHost` (module
    docstring): a shim over :class:`envs.session_client.SessionClient` on a :class:`RayTransport`, as
    ``envs.remote.RemoteEnv`` is on the HTTP and WebSocket transports. The observation and action spaces are
    the registered env's (made once locally, never reset). ``fork(n)`` returns ``n`` ClusterEnvs on the same
    host. Every method raises :class:`envs.core.EnvInfraError` when the host's node is gone.
    """

    metadata = {"render_modes": []}

    def __init__(self, host, sid: str, env_id: str | None = None, kwargs: dict[str, Any] | None = None,
                 node: str | None = None):
        from envs.session_client import SessionClient

        self.env_id, self.kwargs, self.node = env_id, dict(kwargs or {}), node or sid.split("/", 1)[0]
        self._session = SessionClient(RayTransport(host, self.node), env_id or "", self.kwargs, session_id=sid)
        if env_id is not None:
            self.spec = gym.spec(env_id)
            self.observation_space, self.action_space = self._session.transport.call("spaces", sid)

    host = property(lambda self: self._session.transport.host, doc="The NodeHost actor holding the session.")
    sid = property(lambda self: self._session.session_id, doc="The session's id on its host (None once closed).")

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        data = self._session.reset(seed, options)
        return data.observation, data.info

    def step(self, action: str):
        data = self._session.step(action)
        return data.observation, data.reward, data.terminated, data.truncated, data.info

    def fork(self, n: int = 1) -> list["ClusterEnv"]:
        """``n`` copies on the same host (:meth:`envs.core.TextEnv.fork`)."""
        twins = [object.__new__(ClusterEnv) for _ in range(n)]
        for twin, session in zip(twins, self._session.fork(n), strict=True):
            twin.__dict__.update(self.__dict__, _session=session)
        return twins

    def snapshot(self) -> bytes:
        """The session's snapshot as bytes."""
        return self._session.snapshot()

    def current_info(self) -> dict[str, Any]:
        return self._session.transport.call("current_info", self.sid)

    def close(self) -> None:
        """Close the session (nothing more when its node is gone: the session went with it)."""
        self._session.close()


def make(env_id: str, hosts: dict[str, Any], **kwargs: Any) -> ClusterEnv:
    """A :class:`ClusterEnv` of ``env_id`` (made with ``kwargs`` on its node) on the host of ``hosts``
    (``{node name: actor}``, from :func:`ray_cluster.nodes.start_hosts`) with the most free room."""
    ray = require_ray()
    names = list(hosts)
    infos = ray.get([hosts[n].info.remote() for n in names])
    name = names[max(range(len(names)), key=lambda i: infos[i]["capacity"] - infos[i]["live"])]
    sid = ray.get(hosts[name].create.remote(env_id, kwargs))
    return ClusterEnv(hosts[name], sid, env_id, kwargs, node=name)
