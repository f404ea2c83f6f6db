"""Any forkyard env as what TRL's ``GRPOTrainer(environment_factory=...)`` takes, with no glue code.

TRL (1.16) calls the factory with no argument once per concurrent rollout, keeps the instances for the whole
run and, per rollout: ``reset(**row)`` with the dataset row (its return value is appended to the prompt's
last user message), then the model's tool calls as method calls (one public method per tool, described to
the model by the method's signature and Google-style docstring), then ``get_reward()``. So::

    from trl import GRPOConfig, GRPOTrainer
    from envs.trl import environment_factory

    Env = environment_factory("forkyard/ClueProbe-v0", max_turns=4)            # in this process
    Env = environment_factory("forkyard/FileQA-v0", server_url="http://127.0.0.1:8000")  # on a server
    trainer = GRPOTrainer(model=..., args=GRPOConfig(...), train_dataset=rows, environment_factory=Env)

* Tools: one method per tool of the env's JSON-schema tools (:class:`envs.features.ToolSchemas`), typed from
  the schema (``integer`` -> ``int``, ``number`` -> ``float``, ``string`` -> ``str``, ``boolean`` -> ``bool``;
  optional parameters default to None) and documented from its descriptions. A call becomes the env's
  canonical action (:func:`envs.tool_calls.call_to_action`); a call whose arguments do not fit the tool
  reaches the env as written, which answers with its invalid-action observation (reward ``0.0``, a turn
  consumed). A call to a tool name the env lacks never reaches the env: TRL answers it itself.
* ``reset(**row)``: ``row[seed_column]`` (default ``"seed"``) seeds the episode, so rows that repeat a seed
  (a GRPO group of ``num_generations`` copies of one row) share one task; other columns are ignored.
* ``get_reward()``: the episode's summed reward, or None when the env's infrastructure failed
  (``termination_reason == "infra_error"``), which TRL turns into NaN and leaves out of the group.
* After the episode ends a tool call answers that it is over and does not step the env.
* Sessions: each instance holds one env (with ``server_url``: one server session). It is closed when TRL
  drops the instance or the process ends (``weakref.finalize``), so no session waits for the server's TTL.
  The class has no other public method: TRL would offer it to the model as a tool.

The env must offer ``tool_schemas()`` (ClueProbe and FileQA do). Standard library and Gymnasium only: TRL
need not be installed to build the class.
"""

from __future__ import annotations

import inspect
import json
import weakref
from typing import Any, Callable

import gymnasium as gym

from envs.actions import ActionParseError
from envs.core import EnvInfraError
from envs.tool_calls import call_to_action

#: JSON-schema types of tool parameters and the Python types of the generated methods.
JSON_TYPES: dict[str, type] = {"integer": int, "number": float, "string": str, "boolean": bool, "array": list,
                               "object": dict}
#: What a tool call after the episode's end answers (the env is not stepped).
EPISODE_OVER = "The episode is over: no more tool calls are taken."


class ForkyardToolEnv:
    """The base of the classes :func:`environment_factory` makes (one forkyard env behind TRL's protocol).

    Attributes:
        env: the forkyard env (a :class:`envs.core.TextEnv`, or :class:`envs.remote.RemoteEnv` on a server).
        rewards: the episode's rewards so far (float, one per step).
        done: whether the episode has ended.
        info: the latest ``info`` (``turn``, ``anchor_key``, ``termination_reason`` at the end).
    """

    _make: Callable[[], Any]
    _tools: list[dict[str, Any]]
    _seed_column: str = "seed"

    def __init__(self) -> None:
        self.env = type(self)._make()
        self._finalizer = weakref.finalize(self, _close_quietly, self.env)
        self.rewards: list[float] = []
        self.done = False
        self.info: dict[str, Any] = {}

    def reset(self, **row: Any) -> str:
        """Start an episode seeded by ``row[seed_column]`` (None: unseeded); returns the first observation. An
        infrastructure failure ends the episode at once (``get_reward()`` is None) and returns a notice."""
        seed = row_seed(row.get(self._seed_column), self._seed_column)
        self.rewards, self.done = [], False
        try:
            obs, self.info = self.env.reset(seed=seed)
        except EnvInfraError as exc:  # the episode is lost: get_reward() is None, tool calls answer that
            self.done, self.info = True, {"termination_reason": "infra_error"}
            return f"The environment failed: {exc}"
        return obs

    def get_reward(self) -> float | None:
        """The episode's summed reward; None if the env's infrastructure failed."""
        if self.info.get("termination_reason") == "infra_error":
            return None
        return float(sum(self.rewards))

    def _release(self) -> None:
        """Release the env (its sandbox, its server session) now rather than when the object is dropped. Not
        public: TRL offers every public method to the model as a tool."""
        self._finalizer()

    def _call(self, name: str, arguments: dict[str, Any]) -> str:
        if self.done:
            return EPISODE_OVER
        call = {"name": name, "arguments": {k: v for k, v in arguments.items() if v is not None}}
        try:
            action = call_to_action(call, type(self)._tools)
        except (ActionParseError, TypeError, ValueError):
            action = _as_written(call)  # the env answers with its invalid-action observation
        try:
            obs, reward, terminated, truncated, self.info = self.env.step(action)
        except EnvInfraError as exc:
            self.done, self.info = True, {"termination_reason": "infra_error"}
            return f"The environment failed: {exc}"
        self.rewards.append(float(reward))
        self.done = bool(terminated or truncated)
        return obs


def env_tools(env: Any, env_id: str, seed: int | None = None) -> list[dict[str, Any]]:
    """``env.tool_schemas()`` (a :class:`envs.features.ToolSchemas` env); a :class:`envs.remote.RemoteEnv`,
    which learns its session's tools at its first reset, is reset first (with ``seed``).

    Raises:
        ValueError: the env declares no tool schemas.
        EnvInfraError: that reset failed through the infrastructure.
    """
    schemas = getattr(env, "tool_schemas", None)
    if schemas is None:
        raise ValueError(f"{env_id} declares no tool schemas (envs.features.ToolSchemas): a tool-calling trainer "
                         "needs one definition per tool")
    try:
        return list(schemas())
    except gym.error.ResetNeeded:
        env.reset(seed=seed)
        return list(schemas())


def row_seed(value: Any, where: str = "seed") -> int | None:
    """A dataset row's seed: None, a non-negative int, or a str of decimal digits (as CSV columns arrive).

    Raises:
        ValueError: anything else (a bool, a float, a negative number, other text), naming ``where``.
    """
    if value is None:
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{where} must be a non-negative integer (or None), got {value!r}")
    return value


def environment_factory(env_id: str, *, seed_column: str = "seed", **kwargs: Any) -> type[ForkyardToolEnv]:
    """A zero-argument class for ``GRPOTrainer(environment_factory=...)`` over ``gymnasium.make(env_id, **kwargs)``.

    Args:
        env_id: a registered id (``forkyard/ClueProbe-v0``), or ``"module:Id"`` as ``gymnasium.make`` takes it.
        seed_column: the dataset column that seeds each episode.
        **kwargs: the env's kwargs; ``server_url="http://HOST:PORT"`` runs it on a forkyard server.

    Returns:
        A :class:`ForkyardToolEnv` subclass with one method per tool (see the module docstring).

    Raises:
        gymnasium.error.Error, TypeError, ValueError: ``env_id`` or ``kwargs`` that ``gymnasium.make`` refuses.
        ValueError: an env without tool schemas, or a tool whose name clashes with the protocol's methods.
    """
    probe = gym.make(env_id, **kwargs).unwrapped
    try:
        tools = env_tools(probe, env_id)
    finally:
        _close_quietly(probe)
    members: dict[str, Any] = {
        "_make": staticmethod(lambda: gym.make(env_id, **kwargs).unwrapped),
        "_tools": tools, "_seed_column": seed_column,
        "__doc__": f"{env_id} for TRL's GRPOTrainer (envs.trl.environment_factory).",
    }
    for tool in tools:
        fn = tool["function"]
        if fn["name"].startswith("_") or hasattr(ForkyardToolEnv, fn["name"]):
            raise ValueError(f"tool {fn['name']!r} of {env_id} clashes with ForkyardToolEnv's own members")
        members[fn["name"]] = _tool_method(fn)
    name = "".join(ch for ch in env_id.rpartition("/")[2].rpartition(":")[2] if ch.isalnum()) or "Env"
    return type(name, (ForkyardToolEnv,), members)


def _tool_method(fn: dict[str, Any]) -> Callable[..., str]:
    """A method ``name(self, *, params) -> str`` (keyword arguments, as TRL calls tools) whose signature,
    annotations and docstring describe the tool as ``transformers.utils.get_json_schema`` reads them."""
    name = fn["name"]
    params = fn.get("parameters", {})
    required = set(params.get("required", []))
    sig = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {}
    doc = [(fn.get("description") or name).strip().replace("\n", " "), "", "Args:"]
    for pname, spec in params.get("properties", {}).items():
        kinds = spec.get("type", "string")
        kinds = [k for k in kinds if k != "null"] or ["string"] if isinstance(kinds, list) else [kinds]
        typ = JSON_TYPES.get(kinds[0], str)
        default = inspect.Parameter.empty if pname in required else None
        sig.append(inspect.Parameter(pname, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=typ))
        annotations[pname] = typ
        doc.append(f"    {pname}: {(spec.get('description') or pname).strip().replace(chr(10), ' ')}")
    if len(doc) == 3:
        doc = doc[:1]
    doc += ["", "Returns:", "    The environment's observation."]

    def method(self: ForkyardToolEnv, **arguments: Any) -> str:
        return self._call(name, arguments)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = "\n".join(doc)
    method.__signature__ = inspect.Signature(sig, return_annotation=str)  # type: ignore[attr-defined]
    method.__annotations__ = {**annotations, "return": str}
    return method


def _as_written(call: dict[str, Any]) -> str:
    args = ", ".join(f"{k}={json.dumps(v)}" for k, v in call["arguments"].items())
    return f"{call['name']}({args})"


def _close_quietly(env: Any) -> None:
    try:
        env.close()
    except Exception:  # noqa: BLE001 - closing must never raise from a finalizer
        pass


__all__ = ["EPISODE_OVER", "JSON_TYPES", "ForkyardToolEnv", "env_tools", "environment_factory", "row_seed"]
