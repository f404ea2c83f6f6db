"""Training policies by name: what ``forkyard train --policy NAME`` configures, trains and reports.

A policy is a :class:`Policy` registered under a name with :func:`register_policy`: its run config (a
subclass of :class:`trainer.loop.LoopConfig` whose :func:`trainer.config.setting` fields become options), its
setup (``setup(cfg) -> trainer.train.Trainee``: the env, the learner, its evaluations and hooks) and the
function that prints the result. ``forkyard train --policy NAME`` generates its options from the config (those
of ``groups`` only, when given), builds the config (validated as it is made), runs the one training driver
:func:`trainer.train.train` with the policy's setup and prints ``report(result)``: the command line never
branches on a policy's name. Each part may be given as ``"module:attr"`` text, imported on use, so that
listing the policies imports neither torch nor the policy's code::

    register_policy("mine", config="my_pkg.config:MyConfig", setup="my_pkg.policy:setup",
                    help="what it is, in a few words")

From an installed package, declare the :class:`Policy` object in the entry-point group ``forkyard.policies``
under its name (``mine = "my_pkg.policy:POLICY"``): the registry loads the group on first lookup
(:class:`envs.plugins.PluginRegistry`; a plugin that fails is reported by name, never fatal).

Built in:

=======  ==================================================  ===============================================
name     config                                              setup
=======  ==================================================  ===============================================
tabular  :class:`trainer.tabular_config.TrainConfig`         :func:`trainer.tabular.setup` (REINFORCE on a
                                                             logit table)
lm       :class:`trainer.text.text_config.TextTrainConfig`        :func:`trainer.text.text_train.setup` (the text
                                                             policy; the options of ``train-lm``)
=======  ==================================================  ===============================================
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from envs.plugins import PluginRegistry


def _load(ref: Any) -> Any:
    """``ref`` itself, or the object a ``"module:attr"`` text names (imported now)."""
    if not isinstance(ref, str):
        return ref
    module, _, attr = ref.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def report_run(result: Any) -> None:
    """The summary ``forkyard train`` prints for a :class:`trainer.loop.TrainResult`: run folder, iterations,
    wall seconds, mean reward of the last 20 iterations, env calls per iteration, anchor degeneration, the
    final evaluation (JSON) and, for a Ray run, the cluster's totals."""
    ms = result.metrics
    tail = ms[-min(20, len(ms)):]
    print(f"run: {result.config.run_dir or '(not saved)'}  iterations: {len(ms)}  wall: {result.wall_s:.1f} s")
    print(f"mean reward (last {len(tail)} iterations): {sum(m['reward_mean'] for m in tail) / len(tail):.3f}")
    print(f"env calls per iteration: {sum(m['env_calls'] for m in ms) / len(ms):.1f}  "
          f"anchor degeneration: {100 * sum(m['degeneration'] for m in ms) / len(ms):.1f}%")
    print(f"greedy evaluation: {json.dumps(result.evaluation)}")
    if getattr(result.config, "ray", None) is not None:
        from trainer.collectors import cluster_totals

        print(f"ray: {json.dumps(cluster_totals(ms))}")


@dataclass(frozen=True)
class Policy:
    """A trainable policy as ``forkyard train`` drives it. Each of ``config``, ``setup``, ``report`` and
    ``groups`` may be ``"module:attr"`` text, imported when first used (:meth:`part`).

    Attributes:
        config: the run config dataclass (a :class:`trainer.loop.LoopConfig`); ``--policy NAME`` takes its
            :func:`trainer.config.setting` fields as options and sets ``progress=True``; it validates itself
            when made (ValueError: a usage error).
        setup: ``setup(cfg) -> trainer.train.Trainee``, what the driver :func:`trainer.train.train` trains.
        report: ``report(result) -> None``, prints the summary (default :func:`report_run`, for a
            :class:`trainer.loop.TrainResult`).
        groups: the config fields' groups that become options (None: every command-line field).
        help: a few words for ``forkyard train --help``.
    """

    config: type | str
    setup: Callable[[Any], Any] | str
    report: Callable[[Any], None] | str = report_run
    groups: tuple[str, ...] | str | None = None
    help: str = ""

    def part(self, name: str) -> Any:
        """The part ``name`` (``"config"``, ``"setup"``, ``"report"``, ``"groups"``), imported when given as text.
        Raises ImportError / AttributeError when the text names nothing."""
        return _load(getattr(self, name))


_REGISTRY: PluginRegistry = PluginRegistry()  # name -> Policy; plugins join on first lookup


def register_policy(name: str, policy: Policy | None = None, **parts: Any) -> Policy:
    """Register ``policy`` (or ``Policy(**parts)``) as ``name``, the value of ``forkyard train --policy``.

    Returns:
        The registered :class:`Policy`.

    Raises:
        ValueError: ``name`` is already registered with another policy, or is empty.
        TypeError: ``policy`` is not a :class:`Policy`, or both it and ``parts`` are given.
    """
    if policy is None:
        policy = Policy(**parts)
    elif parts or not isinstance(policy, Policy):
        raise TypeError(f"register_policy({name!r}, ...) takes a trainer.policies.Policy or its parts, not both")
    if not name:
        raise ValueError("a policy needs a name")
    if _REGISTRY.get(name, policy) != policy:
        raise ValueError(f"policy {name!r} is already registered")
    _REGISTRY[name] = policy
    return policy


def unregister_policy(name: str) -> None:
    """Remove the policy ``name`` (tests, experiments). Unknown names are ignored."""
    _REGISTRY.pop(name, None)


def policy_names() -> tuple[str, ...]:
    """Every name ``--policy`` accepts, in registration order (built-ins first, then plugins)."""
    return tuple(_REGISTRY)


def get_policy(name: str) -> Policy:
    """The policy registered as ``name``.

    Raises:
        ValueError: on an unknown name (the message lists the known ones, and why a plugin of that name
            failed to load).
    """
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"policy must be one of {policy_names()}, got {name!r}{_REGISTRY.explain(name)}") from None


def _add_plugin(name: str, obj: Any) -> None:
    """A ``forkyard.policies`` entry point: a :class:`Policy`, registered as ``name``."""
    if not isinstance(obj, Policy):
        raise TypeError(f"names a {type(obj).__name__}, not a trainer.policies.Policy")
    register_policy(name, obj)


register_policy("tabular", config="trainer.tabular_config:TrainConfig", setup="trainer.tabular:setup",
                help="a logit table trained by REINFORCE")
register_policy("lm", config="trainer.text.text_config:TextTrainConfig", setup="trainer.text.text_train:setup",
                report="trainer.text.text_train:print_result", groups="trainer.text.text_cli:RL_GROUPS",
                help="the text policy (the options of train-lm; `forkyard train --policy lm --help` lists them)")
_REGISTRY.load_from("forkyard.policies", _add_plugin)

__all__ = ["Policy", "get_policy", "policy_names", "register_policy", "report_run", "unregister_policy"]
