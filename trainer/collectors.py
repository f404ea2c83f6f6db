"""Where an iteration's rollout comes from: a :class:`Collector`, chosen by name.

The training loop (:func:`trainer.loop.train_loop`) asks its collector for each iteration's
:class:`~trainer.rollout.Rollout` (``collector.rollout(iteration)``) and closes it when the run ends; it knows
no more of where the episodes ran. A collector is made by a factory registered under a name
(:func:`register_collector`), called as ``factory(cfg, policy, env=..., rng=..., env_kwargs=..., kind=...)``
(:class:`CollectorFactory`). The loop takes ``ray`` when ``cfg.ray`` is set, else this process's own
(:class:`InProcessCollector`, also registered as ``local``).

Built in:

* ``local`` (:class:`InProcessCollector`): this process steps the env given to the loop, with the loop's
  sampling RNG, as :func:`trainer.waves.tree_rollout` / :func:`trainer.waves.group_rollout` (or the
  policy's batched engine, ``policy.engine``) on the iteration's training seeds.

From an installed package, declare the factory in the entry-point group ``forkyard.collectors`` under its name
(``mine = "my_pkg.collect:make_collector"``); the registry loads the group on first lookup
(:class:`envs.plugins.PluginRegistry`; a plugin that fails is reported by name, never fatal). forkyard declares
``ray`` there (``pyproject.toml``): rollout workers on the nodes of a Ray cluster (``forkyard train --ray``, the ray
extra, docs/scaling.md). So the trainer imports nothing of Ray: a run without ``--ray`` never reads the
registry, and a ``--ray`` run without the extra fails when the collector connects, with ``ImportError: Ray is
not installed: pip install 'forkyard[ray]'``.

:func:`cluster_totals` sums the placement figures a Ray run's rollouts report (``Rollout.cluster``).
"""

from __future__ import annotations

import random
from typing import Any, Protocol, runtime_checkable

from envs.plugins import PluginRegistry
from trainer.estimators import rollout_kind
from trainer.rollout import Rollout, training_seeds
from trainer.waves import group_rollout, tree_rollout

#: The entry-point group of collector factories (``name = "pkg.mod:factory"``).
COLLECTOR_GROUP = "forkyard.collectors"


@runtime_checkable
class Collector(Protocol):
    """What the training loop needs of a rollout source."""

    def rollout(self, iteration: int) -> Rollout:
        """Iteration ``iteration``'s rollout on its training seeds (:func:`trainer.rollout.training_seeds`):
        a tree of ``cfg.n_base`` bases x ``cfg.branches`` or a group of ``cfg.group_size`` episodes, as ``kind``
        says. Episodes lost to infrastructure come back with ``infra_failure=True``, never raised."""

    def close(self) -> None:
        """Free what the collector holds (workers, connections); called once, when the run ends."""


class CollectorFactory(Protocol):
    """``factory(cfg, policy, *, env, rng, env_kwargs, kind) -> Collector``.

    Args:
        cfg: the run's :class:`trainer.loop.LoopConfig` (or a subclass).
        policy: the learner's policy (:class:`trainer.loop.Policy`).
        env: the env the loop was given (its process's own; a collector may make its envs elsewhere).
        rng: the loop's sampling RNG (``random.Random``, saved in the resume state).
        env_kwargs: the env's constructor kwargs, for envs made elsewhere (a Ray run's nodes).
        kind: ``"tree"`` or ``"group"`` (:func:`trainer.estimators.rollout_kind`).
    """

    def __call__(self, cfg: Any, policy: Any, *, env: Any, rng: random.Random, env_kwargs: dict[str, Any],
                 kind: str) -> Collector: ...


class InProcessCollector:
    """The rollouts of this process (the ``local`` collector): on ``env``, with ``policy`` and ``rng``, as
    ``cfg`` shapes them; the policy's batched engine (``policy.engine``, :mod:`trainer.text.engine`) when it has
    one, else the serial :func:`~trainer.waves.tree_rollout` / :func:`~trainer.waves.group_rollout`.

    Args:
        cfg: a :class:`trainer.loop.LoopConfig` (``estimator``, ``rollout``, ``seed``, ``n_base``,
            ``branches``, ``fork_selection``, ``group_size``).
        env: a forkyard env (reset per episode, forked by tree rollouts); not closed here.
        policy: a :class:`trainer.rollout.Actor`.
        rng: the sampling RNG, advanced by every rollout (shared with the caller).
        kind: ``"tree"`` or ``"group"``; None: :func:`trainer.estimators.rollout_kind` of ``cfg``.
    """

    def __init__(self, cfg: Any, env: Any, policy: Any, rng: random.Random, kind: str | None = None):
        self.cfg, self.env, self.policy, self.rng = cfg, env, policy, rng
        self.kind = kind or rollout_kind(cfg.estimator, cfg.rollout)

    def rollout(self, iteration: int) -> Rollout:
        """Iteration ``iteration``'s rollout (:meth:`Collector.rollout`)."""
        cfg = self.cfg
        engine = getattr(self.policy, "engine", None)  # the policy's batched rollouts, or None: serial
        if self.kind == "tree":
            seeds = training_seeds(cfg.seed, iteration, cfg.n_base)
            return (engine.tree_rollout if engine else tree_rollout)(self.env, self.policy, cfg.n_base,
                                                                     cfg.branches, seeds, self.rng,
                                                                     cfg.fork_selection)
        seeds = training_seeds(cfg.seed, iteration, cfg.group_size)
        return (engine.group_rollout if engine else group_rollout)(self.env, self.policy, cfg.group_size, seeds,
                                                                   self.rng)

    def close(self) -> None:
        """Nothing to free: the env is the caller's."""


def local_collector(cfg: Any, policy: Any, *, env: Any, rng: random.Random, env_kwargs: dict[str, Any],
                    kind: str) -> InProcessCollector:
    """The ``local`` factory (:class:`CollectorFactory`): an :class:`InProcessCollector` (``env_kwargs`` unused)."""
    return InProcessCollector(cfg, env, policy, rng, kind)


_REGISTRY: PluginRegistry = PluginRegistry()  # name -> CollectorFactory; plugins join on first lookup


def register_collector(name: str, factory: CollectorFactory) -> CollectorFactory:
    """Register ``factory`` as the collector ``name``. Returns it.

    Raises:
        ValueError: ``name`` is empty or already registered with another factory.
        TypeError: ``factory`` is not callable.
    """
    if not callable(factory):
        raise TypeError(f"register_collector({name!r}, ...) takes a callable factory, not {type(factory).__name__}")
    if not name:
        raise ValueError("a collector needs a name")
    if _REGISTRY.get(name, factory) is not factory:
        raise ValueError(f"collector {name!r} is already registered")
    _REGISTRY[name] = factory
    return factory


def collector_names() -> tuple[str, ...]:
    """Every registered collector name (built-ins first, then the plugins of :data:`COLLECTOR_GROUP`)."""
    return tuple(_REGISTRY)


def get_collector(name: str) -> CollectorFactory:
    """The factory registered as ``name``.

    Raises:
        ValueError: on an unknown name (the message lists the known ones, and why a plugin of that name failed
            to load).
    """
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"collector must be one of {collector_names()}, got {name!r}"
                         f"{_REGISTRY.explain(name)}") from None


def cluster_totals(metrics: list[dict[str, Any]]) -> dict[str, int]:
    """What a ``--ray`` run reports at its end, from its iterations' metrics: ``nodes`` (at the last
    iteration), ``forks_local``, ``forks_remote`` and ``episodes_lost_node`` (summed). ``{"nodes": 0, ...}``
    with zeros for no metrics."""
    out = {k: int(sum(m.get(k, 0) for m in metrics)) for k in ("forks_local", "forks_remote", "episodes_lost_node")}
    return {"nodes": int(metrics[-1].get("nodes", 0)) if metrics else 0, **out}


def _add_plugin(name: str, obj: Any) -> None:
    """A ``forkyard.collectors`` entry point: a collector factory, registered as ``name``."""
    register_collector(name, obj)


register_collector("local", local_collector)
_REGISTRY.load_from(COLLECTOR_GROUP, _add_plugin)

__all__ = ["COLLECTOR_GROUP", "Collector", "CollectorFactory", "InProcessCollector", "cluster_totals",
           "collector_names", "get_collector", "register_collector"]
