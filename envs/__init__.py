"""forkyard environments: multi-turn text envs with fork, snapshot and restore, registered with Gymnasium.

After ``import envs``, ``gymnasium.make("forkyard/ClueProbe-v0", max_turns=5)`` works; the form
``gymnasium.make("envs:forkyard/ClueProbe-v0")`` imports this package itself. Gymnasium's registry is the one
registry (:mod:`envs.registry`: :func:`register_env`, :func:`forkyard_specs`, :func:`env_spec`); envs from
installed packages join through the entry-point group ``forkyard.envs`` when this package is imported (so a
plugin's module imports ``envs`` only). :func:`catalog` describes every registered env (``forkyard envs``).
"""

from __future__ import annotations

from envs.action_input import MAX_REPLY_CHARS, read_action, reply_limit
from envs.actions import ActionParseError, ToolCall, format_action, parse_action
from envs.catalog import EnvCard, catalog
from envs.checks import check_fork_contract
from envs.core import (
    FORK_METHODS,
    INFRA_FAILURE_REASONS,
    TERMINATION_REASONS,
    EnvInfraError,
    EpisodeFinishedError,
    IllegalActionError,
    Snapshot,
    TextEnv,
)
from envs.features import Demonstrator, EvaluationResets, FiniteActions
from envs.registry import ForkyardSpec, env_spec, forkyard_specs, load_env_plugins, register_builtin_envs, register_env
from envs.remote import RemoteEnv
from envs.remote_vector import RemoteVectorEnv
from envs.text_space import TextSpace, fit_text

register_builtin_envs()
load_env_plugins()  # last: a plugin's module imports this package's names (Gymnasium cannot load on lookup)

__all__ = [
    "FORK_METHODS",
    "INFRA_FAILURE_REASONS",
    "MAX_REPLY_CHARS",
    "TERMINATION_REASONS",
    "ActionParseError",
    "Demonstrator",
    "EnvCard",
    "EnvInfraError",
    "EpisodeFinishedError",
    "EvaluationResets",
    "FiniteActions",
    "ForkyardSpec",
    "IllegalActionError",
    "RemoteEnv",
    "RemoteVectorEnv",
    "Snapshot",
    "TextEnv",
    "TextSpace",
    "ToolCall",
    "catalog",
    "check_fork_contract",
    "env_spec",
    "fit_text",
    "forkyard_specs",
    "format_action",
    "parse_action",
    "read_action",
    "register_env",
    "reply_limit",
]
