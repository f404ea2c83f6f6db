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
    Demonstrator,
    EnvInfraError,
    EpisodeFinishedError,
    EvaluationResets,
    FiniteActions,
    IllegalActionError,
    Snapshot,
    TextEnv,
)
from envs.remote import RemoteEnv, env_factory
from envs.text_space import TextSpace, fit_text

#: Every env id forkyard registers, with the entry point and its default kwargs.
ENV_SPECS: dict[str, tuple[str, dict]] = {
    "forkyard/ClueProbe-v0": ("envs.clueprobe:ClueProbeEnv", {"turns": 5, "bits": 3}),
    "forkyard/FileQA-v0": ("envs.fileqa:FileQAEnv", {"max_turns": 6}),
}

for _env_id, (_entry, _kwargs) in ENV_SPECS.items():
    if _env_id not in registry:
        # The entry point builds the local env, or a RemoteEnv when given server_url=...
        register(id=_env_id, entry_point=env_factory(_entry, _env_id), kwargs=dict(_kwargs))

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
    "Snapshot",
    "TextEnv",
    "TextSpace",
    "ToolCall",
    "check_fork_contract",
    "fit_text",
    "format_action",
    "parse_action",
]
