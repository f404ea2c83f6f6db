"""Any forkyard env as a SkyRL-gym ``BaseTextEnv`` (needs the ``skyrl-gym`` package), registered as ``forkyard``.

SkyRL's generator makes one env per trajectory with ``skyrl_gym.make(env_class, env_config=...,
extras=...)``, calls ``init(prompt)`` (the chat messages to generate from), then ``step(model_output)``
until ``done``, appending the returned ``observations`` (chat messages) to the conversation, then
``close()``. So, in a SkyRL config or directly::

    import skyrl_gym
    import envs.skyrl  # registers "forkyard"

    env = skyrl_gym.make("forkyard", env_config={"env_id": "forkyard/ClueProbe-v0", "kwargs": {"max_turns": 4}},
                         extras={"seed": 3})     # per row; add "server_url" to env_config for a server
    prompt, _ = env.init([{"role": "user", "content": "Find the target."}])
    out = env.step('<tool_call>{"name": "probe", "arguments": {"k": 0}}</tool_call>')

* ``env_config`` (a dict or an OmegaConf config): ``env_id``, ``kwargs`` (the env's), ``server_url``
  (optional: the env runs on a forkyard server), ``tools`` (default True: the model's output is read as a
  tool call in any form :func:`envs.tool_calls.parse_model_output` accepts, when the env has tool schemas).
* ``extras`` (per row): ``seed`` (or ``extra_info.seed``) seeds the episode (:func:`envs.trl.row_seed`).
* ``init`` appends the env's first observation to the prompt's last user message (a user message is added
  when the prompt ends otherwise) and returns ``{"tools": [...]}`` as metadata for the chat template.
* ``step`` returns the observation as one ``user`` message (none once done), the env's reward, ``done``
  (terminated or truncated) and the env's ``info`` as metadata. It never sets ``postprocessed_action``: the
  model's own tokens stay what is trained on. Unparseable output reaches the env as written, which answers
  with its invalid-action observation (reward ``0.0``). An infrastructure failure ends the episode
  (``done``, reward 0, ``metadata["termination_reason"] == "infra_error"``) instead of raising.
* ``fork(n)``: n adapters at this env's state (the forkyard fork, sandbox included).

The SkyRL trainer itself (``skyrl`` 0.4) needs Python 3.12 or later; ``skyrl-gym`` installs on 3.11.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
from skyrl_gym import register, registry
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

from envs.actions import ActionParseError
from envs.core import EnvInfraError
from envs.tool_calls import parse_model_output
from envs.trl import row_seed

#: The id forkyard's adapter is registered under in SkyRL-gym's registry.
SKYRL_ENV_ID = "forkyard"


def _plain(config: Any) -> Any:
    """``config`` as plain Python containers (an OmegaConf config, as SkyRL passes one, converted whole)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(config, resolve=True) if OmegaConf.is_config(config) else config


class ForkyardTextEnv(BaseTextEnv):
    """A forkyard env behind SkyRL-gym's ``BaseTextEnv`` (module docstring).

    Args:
        env_config: ``env_id`` (required), ``kwargs``, ``server_url``, ``tools``.
        extras: the row's extras; ``seed`` (or ``extra_info["seed"]``) seeds the episode.

    Raises:
        ValueError: no ``env_id``.
    """

    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None):
        super().__init__()
        env_config, extras = _plain(env_config) or {}, _plain(extras) or {}
        if not isinstance(env_config, dict) or not env_config.get("env_id"):
            raise ValueError("env_config needs env_id, e.g. {'env_id': 'forkyard/ClueProbe-v0'}")
        env_id = env_config["env_id"]
        kwargs = env_config.get("kwargs") or {}
        if not isinstance(kwargs, dict):
            raise ValueError(f"env_config.kwargs must be a mapping of the env's kwargs, got {kwargs!r}")
        kwargs = dict(kwargs)
        if env_config.get("server_url"):
            kwargs["server_url"] = env_config["server_url"]
        self.env = gym.make(env_id, **kwargs).unwrapped
        self.use_tools = bool(env_config.get("tools", True))
        info = extras.get("extra_info") if isinstance(extras.get("extra_info"), dict) else {}
        seed = extras.get("seed") if extras.get("seed") is not None else info.get("seed")
        self.seed = row_seed(seed, "extras.seed")
        self.max_turns = int(getattr(self.env, "max_turns", 1))
        self.tools: list[dict[str, Any]] = []
        self.info: dict[str, Any] = {}

    def init(self, prompt: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        try:
            obs, self.info = self.env.reset(seed=self.seed)
            schemas = getattr(self.env, "tool_schemas", None)
            self.tools = list(schemas()) if schemas is not None and self.use_tools else []
        except EnvInfraError as exc:  # lost: the first step ends the episode (termination_reason infra_error)
            obs, self.info, self.tools = f"The environment failed: {exc}", {"termination_reason": "infra_error"}, []
        prompt = [dict(m) for m in prompt]
        if prompt and prompt[-1].get("role") == "user" and isinstance(prompt[-1].get("content"), str):
            prompt[-1]["content"] += ("\n" if prompt[-1]["content"] else "") + obs
        else:
            prompt.append({"role": "user", "content": obs})
        self.turns = 0
        return prompt, {"tools": self.tools}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        if self.info.get("termination_reason") == "infra_error":
            return BaseTextEnvStepOutput(observations=[], reward=0.0, done=True, metadata=dict(self.info))
        text = action
        if self.tools:
            try:
                text = parse_model_output(action, self.tools)
            except ActionParseError:
                pass  # the env answers with its invalid-action observation
        self.turns += 1
        try:
            obs, reward, terminated, truncated, self.info = self.env.step(text)
        except EnvInfraError:
            self.info = {"termination_reason": "infra_error"}
            return BaseTextEnvStepOutput(observations=[], reward=0.0, done=True, metadata=dict(self.info))
        done = bool(terminated or truncated)
        return BaseTextEnvStepOutput(observations=[] if done else [{"role": "user", "content": obs}],
                                     reward=float(reward), done=done, metadata=dict(self.info))

    def fork(self, n: int = 1) -> list["ForkyardTextEnv"]:
        """``n`` adapters at this env's state (forkyard's fork: hidden state, history, sandbox)."""
        out = []
        for child in self.env.fork(n):
            twin = object.__new__(type(self))
            twin.__dict__.update(self.__dict__)
            twin.env, twin.info = child, dict(self.info)
            out.append(twin)
        return out

    def get_metrics(self) -> dict[str, Any]:
        return {"turns": self.turns, "answered": float(self.info.get("termination_reason") == "answered")}

    def close(self) -> None:
        self.env.close()


if SKYRL_ENV_ID not in registry:
    register(id=SKYRL_ENV_ID, entry_point="envs.skyrl:ForkyardTextEnv")

__all__ = ["SKYRL_ENV_ID", "ForkyardTextEnv"]
