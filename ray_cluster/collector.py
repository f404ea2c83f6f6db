"""Rollouts on a Ray cluster (``forkyard train --ray auto|ADDRESS|local``; ``pip install forkyard[ray]``).

The training loop reaches this module only by name: :func:`ray_collector` is the collector ``ray`` of the
entry-point group ``forkyard.collectors`` (``pyproject.toml``, :mod:`trainer.collectors`), which the loop takes
when ``cfg.ray`` is set. The learner stays on the driver (its GPU when there is one); each node runs one
:class:`RolloutWorker`, a :class:`ray_cluster.nodes.NodeHost` that also runs rollouts, near its sandboxes:

1. **Dispatch** (:meth:`RayCollector.rollout`): iteration ``it``'s bases (tree) or episodes (group) are
   dealt round-robin to the workers in node-name order, each with its seed and its own sampling RNG
   ``random.Random(f"{seed}:{it}:{b}")``. So a base's episodes depend on its seed and the weights only,
   not on which node ran it or what ran before it there: the same seeds give the same rollouts on 1 and
   on 3 nodes (tested), and equal the single-process :func:`trainer.waves.tree_rollout` of that base
   with that RNG. They differ from a run without ``--ray``, whose one RNG runs through every base in turn.
2. **Forks stay local**: a worker's env forks on its own node while the node holds fewer than
   ``node_capacity`` envs; past that the fork (the copies of a ``fork(n)`` that do not fit) travels as snapshot
   bytes to the first other node with room for them (:meth:`NodeHost.adopt`) and its branches step there over Ray
   (:class:`ray_cluster.transport.ClusterEnv`); with no room anywhere it stays local over capacity. Metrics
   ``forks_local`` / ``forks_remote`` count them.
3. **Behavior policy and staleness**: workers sample with a copy of the learner's weights
   (``policy.behavior_copy()``, sent once per version through the object store). With
   ``max_staleness = s`` the rollouts of iterations ``it+1 .. it+s`` are dispatched while the learner
   still trains on ``it``, so a rollout may be sampled with weights up to ``s`` updates old (metric
   ``staleness``). Behavior log-probs are recorded at sampling time, so the text policy's PPO ratio
   stays exact; the tabular policy's REINFORCE has no such correction and refuses ``s > 0``.
   **Batched sampling**: a copy with an ``engine`` (the text policy's :class:`trainer.text.engine.RolloutEngine`,
   its settings the learner's, ``--sampler batched``) runs all the bases (or episodes) dealt to a worker in one
   iteration in one engine call (:func:`batched_parts`), each from the stream it gets alone from its
   :func:`task_rng` (the engine's ``stream_seeds``): the same episodes as the serial per-base calls (sampled
   ids equal, behavior log-probs within float32 rounding, tested on 1 and 2 nodes). The engine gives each
   episode its own env copy (``fork``) and keeps the tree checkpoints of all its bases at once, so a worker
   holds more envs at a time than serially (bounded by ``max_live``); every one of those copies is placed as
   item 2 says (the part of a ``fork(n)`` that fits stays, the rest goes to a peer), so ``node_capacity``
   counts them all. Copies without an engine (the tabular policy) run the tasks one at a time.
4. **Node loss**: a worker whose node died (``RayActorError``) loses the episodes it was running: each
   lost base comes back as one episode with ``infra_failure=True`` and ``reason="infra_error"`` (left out
   of group statistics, as a lost sandbox is), metric ``episodes_lost_node`` counts the episodes that
   were planned on it (a tree base: its ``branches``). The learner goes on with the rest. The next
   dispatch looks at the cluster again: a node that came back gets a new worker, whose sandbox service
   removes the containers its dead predecessor left (labels and start-up clean-up). A worker whose
   rollout raised :class:`envs.core.EnvInfraError` (its node's sandbox backend cannot start) loses its
   tasks the same way, and the run goes on. Branches that other workers had sent to a dead node end as
   ``infra_error`` in their own rollouts (counted in ``infra_failures``, not in ``episodes_lost_node``);
   sessions a dead worker had placed on peers stay counted there until the run ends.

Policies plug in with two methods besides :class:`trainer.loop.Policy`'s: ``behavior_copy()`` (a
picklable sampling copy with a ``session`` method and optionally ``rollout_extras()``) and
``adopt(rollout, extras)`` (make the steps sampled by a copy trainable by the learner: the tabular policy
maps the rows the copy added to its own).
"""

from __future__ import annotations

import logging
import random
import threading
from typing import Any

from envs.core import EnvInfraError
from ray_cluster.nodes import NodeHost, is_node_loss, require_ray, start_hosts
from ray_cluster.transport import ClusterEnv
from trainer.rollout import Episode, Rollout, episode_seeds, training_seeds
from trainer.waves import group_rollout, tree_rollout

log = logging.getLogger(__name__)


def task_rng(seed: int, iteration: int, index: int) -> random.Random:
    """The sampling RNG of base (or episode) ``index`` of ``iteration`` in a Ray run."""
    return random.Random(f"{seed}:{iteration}:{index}")


class PlacedEnv:
    """A rollout worker's local env: ``fork`` keeps children on the node while it has room, else sends the
    state as snapshot bytes to a peer node (module docstring, item 2). ``reset``, ``step``,
    ``current_info`` and ``close`` go to the env."""

    def __init__(self, env, worker: "RolloutWorker", peers: dict[str, Any], env_id: str, kwargs: dict[str, Any]):
        self.env, self.worker, self.peers, self.env_id, self.kwargs = env, worker, peers, env_id, kwargs

    def reset(self, **kw: Any):
        return self.env.reset(**kw)

    def step(self, action: str):
        return self.env.step(action)

    def current_info(self) -> dict[str, Any]:
        return self.env.current_info()

    @property
    def blocking(self) -> bool:
        """The env's :attr:`envs.core.TextEnv.blocking` (the batched engine runs blocking env calls in threads)."""
        return bool(getattr(self.env, "blocking", False))

    def fork(self, n: int = 1) -> list:
        """``n`` copies: as many as the node has room for here, the rest on the first peer with room for all of
        them (snapshot bytes, :meth:`NodeHost.adopt`), else here over capacity. Local copies come first; the
        copies take the fork keys a local ``fork(n)`` would give (:meth:`envs.core.TextEnv.count_forks`)."""
        ray = require_ray()
        w = self.worker
        here = w.reserve_upto(n)
        out = self._local_fork(here) if here else []
        if here:
            w.stats["forks_local"] += 1
        rest = n - here
        if not rest:
            return out
        snapshot = self.env.snapshot().to_bytes()  # after the local copies: it holds their fork count
        for name, peer in self.peers.items():
            try:
                sids = ray.get(peer.adopt.remote(self.env_id, self.kwargs, snapshot, rest))
            except Exception as exc:  # noqa: BLE001 - a dead or failing peer: try the next one
                log.warning("fork to node %s failed: %s", name, exc)
                continue
            if sids:
                self.env.count_forks(rest)  # the remote copies took this env's next fork keys
                w.stats["forks_remote"] += 1
                w.stats["fork_bytes"] += len(snapshot)
                return out + [ClusterEnv(peer, sid, node=name) for sid in sids]
        w.reserve(rest, force=True)  # no room anywhere: over capacity here rather than no branches
        w.stats["forks_local"] += 0 if here else 1
        try:
            return out + self._local_fork(rest)
        except BaseException:
            for child in out:
                child.close()
            raise

    def _local_fork(self, n: int) -> list:
        """``env.fork(n)`` on this node, already counted; the count is given back when the fork fails."""
        try:
            children = self.env.fork(n)
        except BaseException:
            self.worker.release(n)
            raise
        return [PlacedEnv(c, self.worker, self.peers, self.env_id, self.kwargs) for c in children]

    def close(self) -> None:
        self.env.close()
        self.worker.release(1)


class RolloutWorker(NodeHost):
    """A :class:`NodeHost` that also runs rollouts on its node (one per node, started by :class:`RayCollector`)."""

    def __init__(self, name: str, capacity: int, server_name: str = "default"):
        super().__init__(name, capacity, server_name)
        self._policy: Any = None
        self._version = -1
        self._envs: dict[str, Any] = {}
        self.stats = {"forks_local": 0, "forks_remote": 0, "fork_bytes": 0}
        self._rollout_lock = threading.Lock()  # one rollout at a time (the host's other calls run beside it)

    def reserve_upto(self, n: int) -> int:
        """Count up to ``n`` envs on this node, as many as it has room for (0 when none, or when a peer's
        adoption took the room meanwhile); returns how many were counted."""
        k = max(0, min(n, self.capacity - self.live))
        return k if k and self.reserve(k) else 0

    def _rollout_env(self, env_id: str, kwargs: dict[str, Any]):
        """This worker's own env of ``env_id`` made with ``kwargs`` (made once, counted on the node). Not
        ``NodeHost._env``, which the host's session calls (``spaces``, ``current_info``) use."""
        import json

        import gymnasium as gym

        key = json.dumps([env_id, kwargs], sort_keys=True, default=str)
        if key not in self._envs:
            self._envs[key] = gym.make(env_id, disable_env_checker=True, **kwargs).unwrapped
            self.reserve(1, force=True)
        return self._envs[key]

    def rollout(self, spec: dict[str, Any], version: int, policy_ref: list, tasks: list[tuple[int, int]],
                peers: dict[str, Any]) -> dict[str, Any]:
        """Run ``tasks`` (``(index, seed)`` pairs) of one iteration as ``spec`` says and return
        ``{"parts": [(index, Rollout)], "extras": policy extras, "stats": fork counts, "node": name}``.

        ``policy_ref`` is ``[ObjectRef]`` of the behavior copy of ``version`` (fetched only when new).
        Calls run one at a time (a pipelined next iteration waits for this one).
        """
        with self._rollout_lock:
            return self._rollout(spec, version, policy_ref, tasks, peers)

    def _rollout(self, spec, version, policy_ref, tasks, peers) -> dict[str, Any]:
        ray = require_ray()
        if version != self._version:
            self._policy = ray.get(policy_ref[0])
            self._version = version
        self.stats = {"forks_local": 0, "forks_remote": 0, "fork_bytes": 0}
        env = PlacedEnv(self._rollout_env(spec["env_id"], spec["env_kwargs"]), self, peers, spec["env_id"],
                        spec["env_kwargs"])
        engine = getattr(self._policy, "engine", None)  # a TextPolicy's batched engine, or None: serial
        if engine is not None and tasks:
            parts = batched_parts(engine, env, self._policy, spec, tasks)
        else:
            parts = []
            for index, seed in tasks:
                rng = task_rng(spec["seed"], spec["iteration"], index)
                if spec["kind"] == "tree":
                    ro = tree_rollout(env, self._policy, 1, spec["branches"], [seed], rng, spec["fork_selection"])
                else:
                    ro = group_rollout(env, self._policy, 1, [seed], rng)
                parts.append((index, ro))
        extras = self._policy.rollout_extras() if hasattr(self._policy, "rollout_extras") else None
        return {"parts": parts, "extras": extras, "stats": dict(self.stats), "node": self.name}

    def shutdown(self) -> int:
        """Close this worker's envs, sessions and sandbox providers, after the rollout running now (if any)."""
        with self._rollout_lock:
            for env in self._envs.values():
                env.close()
            self._envs.clear()
            return super().shutdown()


def batched_parts(engine, env, policy, spec: dict[str, Any], tasks: list[tuple[int, int]]) -> list[tuple[int, Rollout]]:
    """Every task of ``tasks`` (``(index, seed)`` pairs of one iteration, ``spec`` as :meth:`RolloutWorker.rollout`
    takes it) in one call of ``engine`` (a :class:`trainer.text.engine.RolloutEngine`) on ``env``, each sampled from
    the stream it gets alone with its :func:`task_rng` (``episode_seeds(task_rng(...), 1)[0]``, the
    ``stream_seeds`` argument); so its episodes are those of the serial per-task call. Returns
    ``[(index, Rollout)]`` in task order: a tree base with its branches (or one group episode) each; the
    rollout's counters (env calls, forks, failed forks, lost branches) all on the first part."""
    seeds = [seed for _, seed in tasks]
    streams = [episode_seeds(task_rng(spec["seed"], spec["iteration"], index), 1)[0] for index, _ in tasks]
    kind = spec["kind"]
    if kind == "tree":
        ro = engine.tree_rollout(env, policy, len(tasks), spec["branches"], seeds, None, spec["fork_selection"],
                                 stream_seeds=streams)
        by_task: list[list[Episode]] = [[] for _ in tasks]
        for e in ro.episodes:
            by_task[e.base].append(e)
    else:
        ro = engine.group_rollout(env, policy, len(tasks), seeds, None, stream_seeds=streams)
        by_task = [[e] for e in ro.episodes]
    parts = [(index, Rollout(kind, eps)) for (index, _), eps in zip(tasks, by_task, strict=True)]
    first = parts[0][1]
    first.env_calls, first.forks, first.forks_failed, first.branches_lost = (
        ro.env_calls, ro.forks, ro.forks_failed, ro.branches_lost)
    return parts


def connect(address: str) -> bool:
    """Connect this process to Ray: ``"local"`` starts a one-node cluster here, ``"auto"`` joins the one
    ``RAY_ADDRESS`` or the local Ray names, anything else is a cluster address. Returns True when this call
    connected (and so should disconnect), False when already connected."""
    ray = require_ray()
    if ray.is_initialized():
        return False
    ray.init(address=address, include_dashboard=False, log_to_driver=False,  # "local": always a new cluster
             logging_level=logging.WARNING)
    return True


def lost_episodes(kind: str, index: int, seed: int) -> Episode:
    """The episode standing for a base (or group episode) lost with its node."""
    return Episode(seed=seed, base=index if kind == "tree" else None, infra_failure=True, reason="infra_error")


class RayCollector:
    """The driver's side of a Ray run (module docstring), a :class:`trainer.collectors.Collector`:
    ``rollout(it)`` returns iteration ``it``'s :class:`~trainer.rollout.Rollout`, its ``cluster`` dict holding
    ``forks_local``, ``forks_remote``, ``fork_bytes``, ``episodes_lost_node``, ``staleness`` and ``nodes``.

    Args:
        cfg: a :class:`trainer.loop.LoopConfig` with ``ray`` set (``env_id``, the rollout shape, ``seed``,
            ``node_capacity``, ``max_staleness``).
        policy: the learner's policy (``behavior_copy`` / ``adopt``).
        env_kwargs: the env's constructor kwargs.
        kind: ``"tree"`` or ``"group"``.
        server_name: sandbox label prefix of the nodes' hosts (None: ``FORKYARD_SERVER_NAME``).
        nodes: names of the nodes to use (None: every alive node).
    """

    def __init__(self, cfg, policy, env_kwargs: dict[str, Any], kind: str, server_name: str | None = None,
                 nodes: list[str] | None = None):
        for method in ("behavior_copy", "adopt"):
            if not hasattr(policy, method):
                raise ValueError(f"{type(policy).__name__} cannot run on Ray: it has no {method}()")
        self.cfg, self.policy, self.env_kwargs, self.kind = cfg, policy, dict(env_kwargs), kind
        self.server_name, self.nodes = server_name, nodes
        self.owns_ray = connect(cfg.ray)
        self.workers: dict[str, Any] = {}
        self.pending: dict[int, tuple[int, list]] = {}
        self._ref: tuple[int, Any] | None = None

    def _reconcile(self) -> None:
        # Pipelined rollouts queue on a worker's threads: room for them and for its peers' calls beside them.
        self.workers = start_hosts(RolloutWorker, self.workers, capacity=self.cfg.node_capacity,
                                   server_name=self.server_name, nodes=self.nodes,
                                   max_concurrency=8 + self.cfg.max_staleness)

    def _submit(self, it: int, version: int) -> None:
        ray = require_ray()
        cfg = self.cfg
        n = cfg.n_base if self.kind == "tree" else cfg.group_size
        seeds = training_seeds(cfg.seed, it, n)
        self._reconcile()
        if self._ref is None or self._ref[0] != version:
            self._ref = (version, ray.put(self.policy.behavior_copy()))
        names = sorted(self.workers)
        spec = {"env_id": cfg.env_id, "env_kwargs": self.env_kwargs, "kind": self.kind, "branches": cfg.branches,
                "fork_selection": cfg.fork_selection, "seed": cfg.seed, "iteration": it}
        calls = []
        for k, name in enumerate(names):
            tasks = [(b, seeds[b]) for b in range(k, n, len(names))]
            if not tasks:
                continue
            peers = {p: self.workers[p] for p in names[k + 1:] + names[:k]}
            fut = self.workers[name].rollout.remote(spec, version, [self._ref[1]], tasks, peers)
            calls.append((name, self.workers[name], fut, tasks))
        self.pending[it] = (version, calls)

    def rollout(self, it: int, version: int | None = None) -> Rollout:
        """Iteration ``it``'s rollout (dispatching ``it .. it + max_staleness`` first when not yet done).
        ``version``: the learner's update count now (default ``it``: one update per iteration)."""
        ray = require_ray()
        version = it if version is None else version
        for j in range(it, min(it + self.cfg.max_staleness, self.cfg.iterations - 1) + 1):
            if j not in self.pending:
                self._submit(j, version)
        sent_version, calls = self.pending.pop(it)
        parts: dict[int, Rollout] = {}
        stats = {"forks_local": 0, "forks_remote": 0, "fork_bytes": 0, "episodes_lost_node": 0}
        per_lost = self.cfg.branches if self.kind == "tree" else 1
        for name, worker, fut, tasks in calls:
            try:
                res = ray.get(fut)
            except Exception as exc:
                cause = getattr(exc, "cause", None)
                if not (is_node_loss(exc) or isinstance(cause, EnvInfraError)):
                    raise
                log.warning("node %s lost %d of iteration %d's tasks: %s", name, len(tasks), it,
                            type(cause if isinstance(cause, EnvInfraError) else exc).__name__)
                if is_node_loss(exc) and self.workers.get(name) is worker:
                    self.workers.pop(name)  # not a successor started meanwhile under the same name
                stats["episodes_lost_node"] += per_lost * len(tasks)
                for index, seed in tasks:
                    parts[index] = Rollout(self.kind, [lost_episodes(self.kind, index, seed)])
                continue
            for key in ("forks_local", "forks_remote", "fork_bytes"):
                stats[key] += res["stats"][key]
            for index, ro in res["parts"]:
                self.policy.adopt(ro, res["extras"])
                for e in ro.episodes:
                    if self.kind == "tree":
                        e.base = index
                parts[index] = ro
        episodes = [e for i in sorted(parts) for e in parts[i].episodes]
        total = Rollout(self.kind, episodes,
                        sum(p.env_calls for p in parts.values()), sum(p.forks for p in parts.values()),
                        sum(p.forks_failed for p in parts.values()), sum(p.branches_lost for p in parts.values()))
        total.cluster = {**stats, "staleness": version - sent_version, "nodes": len(self.workers)}
        return total

    def close(self) -> None:
        """Shut every worker down (sessions closed, sandboxes destroyed) and disconnect when this collector
        connected."""
        ray = require_ray()
        futures = [fut for _, calls in self.pending.values() for _, _, fut, _ in calls]
        if futures:  # rollouts dispatched ahead (pipelining, an early stop): let them end before shutting down
            ray.wait(futures, num_returns=len(futures), timeout=120)
        self.pending.clear()
        for name, w in list(self.workers.items()):
            try:
                ray.get(w.shutdown.remote(), timeout=60)
                ray.kill(w)
            except Exception as exc:  # noqa: BLE001 - a node gone at the end: nothing left to close there
                log.warning("closing the worker of node %s: %s", name, exc)
        self.workers.clear()
        if self.owns_ray:
            ray.shutdown()


def ray_collector(cfg, policy, *, env, rng, env_kwargs: dict[str, Any], kind: str) -> RayCollector:
    """The collector factory ``ray`` of ``forkyard.collectors`` (:class:`trainer.collectors.CollectorFactory`):
    a :class:`RayCollector` of ``cfg``, ``policy``, ``env_kwargs`` and ``kind`` (the driver's ``env`` and
    ``rng`` are unused: each node makes its envs, each task has its own RNG, :func:`task_rng`).

    Raises:
        ImportError: Ray is not installed (``pip install 'forkyard[ray]'``).
        ValueError: the policy has no ``behavior_copy`` or ``adopt``.
    """
    return RayCollector(cfg, policy, env_kwargs, kind)
