"""forkyard environments: multi-turn text envs with fork, snapshot and restore, registered with Gymnasium.

After ``import envs``, ``gymnasium.make("forkyard/ClueProbe-v0", turns=5)`` works; the form
``gymnasium.make("envs:forkyard/ClueProbe-v0")`` imports this package itself.
"""

from __future__ import annotations

from gymnasium.envs.registration import register, registry

from envs.actions import ActionParseError, ToolCall, format_action, parse_action
from envs.checks import check_fork_contract
from envs.core import (
    INFRA_FAILURE_REASONS,
    TERMINATION_REASONS,
    EnvInfraError,
    EpisodeFinishedError,
    IllegalActionError,
    Snapshot,
    TextEnv,
)
from envs.features import Demonstrator, EvaluationResets, FiniteActions
from envs.remote import RemoteEnv, env_factory
from envs.remote_vector import RemoteVectorEnv
from envs.text_space import TextSpace, fit_text

#: Every env id forkyard serves, with the entry point (``"module:Class"``, a TextEnv) and its default kwargs.
#: Filled by :func:`register_env` only.
ENV_SPECS: dict[str, tuple[str, dict]] = {}


def register_env(env_id: str, entry_point: str, **kwargs: object) -> None:
    """Register a TextEnv under ``env_id``: the one registration a new env needs.

    Afterwards ``gymnasium.make(env_id, **kw)`` builds it in-process, ``gymnasium.make(env_id,
    server_url=...)`` builds a :class:`RemoteEnv` for it, and every forkyard server started in this
    process serves it under ``/v1/envs``. ``entry_point`` is ``"module:Class"``; ``kwargs`` are defaults.

    Raises:
        ValueError: ``env_id`` is already registered with another entry point or other defaults.
    """
    if env_id in ENV_SPECS and ENV_SPECS[env_id] != (entry_point, kwargs):
        raise ValueError(f"env id {env_id!r} is already registered as {ENV_SPECS[env_id]}")
    ENV_SPECS[env_id] = (entry_point, dict(kwargs))
    if env_id not in registry:
        # The entry point builds the local env, or a RemoteEnv when given server_url=...
        register(id=env_id, entry_point=env_factory(entry_point, env_id), kwargs=dict(kwargs))


register_env("forkyard/ClueProbe-v0", "envs.clueprobe:ClueProbeEnv", turns=5, bits=3)
register_env("forkyard/FileQA-v0", "envs.fileqa:FileQAEnv", max_turns=6)

__all__ = [
    "ENV_SPECS",
    "INFRA_FAILURE_REASONS",
    "TERMINATION_REASONS",
    "ActionParseError",
    "Demonstrator",
    "EnvInfraError",
    "EpisodeFinishedError",
    "EvaluationResets",
    "FiniteActions",
    "IllegalActionError",
    "RemoteEnv",
    "RemoteVectorEnv",
    "Snapshot",
    "TextEnv",
    "TextSpace",
    "ToolCall",
    "check_fork_contract",
    "fit_text",
    "format_action",
    "parse_action",
    "register_env",
]
