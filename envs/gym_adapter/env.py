"""The adapter itself: :class:`GymTextEnv`, one wrapped Gymnasium env as a forkable multi-turn text env.

Construction (the profile, the checked kwargs, the action set, the fork method taken), the episode (reset with a
seed drawn from the env's RNG, one wrapped step per turn, the record the verified replay checks), the features
(action vocabulary, tool schemas, the demonstrator) and fork / snapshot / restore by the fork method taken.
:mod:`envs.gym_adapter` documents the behaviour; the parts per wrapped env live in the package's other modules.
"""

from __future__ import annotations

import copy
import json
import random
from typing import Any, ClassVar

import gymnasium as gym

from envs.actions import ToolCall
from envs.core import Action, Outcome, TextEnv
from envs.features import mixed_demo
from envs.gym_adapter.actions import ActionSet
from envs.gym_adapter.kwargs import MAX_TURNS_LIMIT, parse_gym_kwargs
from envs.gym_adapter.profiles import GYM_PROFILES, GymProfile, gym_profile
from envs.gym_adapter.renderings import ansi_text, described_text
from envs.gym_adapter.replay import observation_digest, replay_verified
from envs.gym_adapter.state_codecs import METHOD_CODEC, StateCodec

#: The fork methods a :class:`GymTextEnv` can take (``"auto"`` picks the first the wrapped env allows).
GYM_FORK_METHODS = ("state_codec", "deepcopy", "replay")


class GymTextEnv(TextEnv):
    """A Gymnasium env as a forkable multi-turn text env (:mod:`envs.gym_adapter`).

    Args:
        gym_id: an allow-listed Gymnasium id (:data:`~envs.gym_adapter.GYM_PROFILES`), default ``"FrozenLake-v1"``.
        gym_kwargs: the wrapped env's kwargs, a JSON object or its text; only the keys its profile allows.
        max_turns: turn budget, 1..1000; None: the profile's default (``max_episode_steps`` of the id, ...).
        fork_method: ``"auto"`` or one of :data:`GYM_FORK_METHODS`; the one taken is :attr:`fork_method`.
        action_names: tool names of the Discrete actions, one per action (identifiers, distinct, not in
            :data:`~envs.gym_adapter.RESERVED_TOOL_NAMES`, at most 32 characters); default the profile's, else
            ``act(a)``.
        render_mode: ``None`` or ``"ansi"`` (the transcript).

    ``reset`` takes no ``options`` (ValueError). Attributes beyond :class:`~envs.core.TextEnv`'s: ``gym_id``,
    :attr:`fork_method` (the method taken), ``observation_source``, :attr:`success`.

    Raises:
        ValueError: a kwarg out of range, an id not allowed, ``fork_method="state_codec"`` for an env without a
            codec, ``"deepcopy"`` for one that cannot be deep-copied, an action space neither Discrete nor Text.
        ImportError: the id's package (minigrid) is not installed.
    """

    max_observation_length = 8192
    max_action_length = 1024
    fork_method = "state_codec"
    #: A subclass's own profile (FrozenLake's RAGEN form); None: :data:`GYM_PROFILES` of ``gym_id``. Profiles are
    #: looked up, never stored on the instance, so that an env pickles without them.
    own_profile: ClassVar[GymProfile | None] = None
    _restored: Any = None  # the wrapped env a restore built before it changed anything (see restore)

    def __init__(self, gym_id: str = "FrozenLake-v1", gym_kwargs: dict[str, Any] | str | None = None,
                 max_turns: int | None = None, fork_method: str = "auto", action_names: list[str] | None = None,
                 render_mode: str | None = None):
        profile = gym_profile(gym_id)
        checked = parse_gym_kwargs(gym_id, profile.gym_kwargs, gym_kwargs)
        self._setup(gym_id, profile, checked, max_turns, fork_method, action_names, render_mode, None)

    # ------------------------------------------------------------- construction
    def _setup(self, gym_id: str, profile: GymProfile, gym_kwargs: dict[str, Any], max_turns: int | None,
               fork_method: str, action_names: list[str] | None, render_mode: str | None,
               record: dict[str, Any] | None) -> None:
        """Shared construction (subclasses with their own kwargs pass ``record``: the kwargs snapshots record)."""
        if fork_method != "auto" and fork_method not in GYM_FORK_METHODS:
            raise ValueError(f"fork_method must be 'auto' or one of {list(GYM_FORK_METHODS)}, got {fork_method!r}")
        if max_turns is not None and (isinstance(max_turns, bool) or not isinstance(max_turns, int)
                                      or not 1 <= max_turns <= MAX_TURNS_LIMIT):
            raise ValueError(f"max_turns must be an int in 1..{MAX_TURNS_LIMIT} or None, got {max_turns!r}")
        self.gym_id, self._gym_kwargs = gym_id, gym_kwargs
        self._episode_kwargs: dict[str, Any] = {}
        self._wrapped: Any = None
        wrapped = self._new_wrapped()
        try:
            self._action_set = ActionSet.of(gym_id, wrapped, action_names if action_names is not None
                                            else profile.action_names, profile.text_menu)
        except ValueError:
            wrapped.close()
            raise
        self._method_codec = callable(getattr(wrapped, "get_state", None)) and callable(
            getattr(wrapped, "set_state", None))
        method = fork_method
        if method == "state_codec" and self._codec is None:
            wrapped.close()
            raise ValueError(f"{gym_id} has no state codec (neither in the adapter's table nor get_state/set_state "
                             "methods); use fork_method='deepcopy', 'replay' or 'auto'")
        if method in ("auto", "deepcopy") and not (method == "auto" and self._codec is not None):
            try:
                copy.deepcopy(wrapped).close()
                deep_ok = True
            except Exception as exc:  # noqa: BLE001 - any failure means deepcopy is not a fork method here
                if method == "deepcopy":
                    wrapped.close()
                    raise ValueError(f"{gym_id} cannot be deep-copied ({type(exc).__name__}: {exc}); use "
                                     "fork_method='replay' or 'auto'") from exc
                deep_ok = False
            if method == "auto":
                method = "deepcopy" if deep_ok else "replay"
        elif method == "auto":
            method = "state_codec"
        if max_turns is None:
            spec_steps = gym.spec(gym_id).max_episode_steps
            max_turns = profile.max_turns or spec_steps or int(getattr(wrapped, "max_steps", 0) or 100)
            max_turns = min(int(max_turns), MAX_TURNS_LIMIT)
        if record is None:
            record = {"gym_id": gym_id, "gym_kwargs": gym_kwargs, "max_turns": max_turns, "fork_method": method,
                      "action_names": None if action_names is None else list(action_names)}
        super().__init__(max_turns=max_turns, kwargs=record, render_mode=render_mode)
        self.fork_method = method  # type: ignore[misc]  # per instance: the method taken for this wrapped env
        self._wrapped = wrapped
        self._wrapped_ansi = wrapped.render_mode == "ansi"
        #: Where the observation text comes from: ``"ansi"``, ``"state"`` or ``"described"`` (:mod:`envs.gym_adapter`).
        self.observation_source = profile.observation_source or (
            "ansi" if wrapped.render_mode == "ansi" else "described")
        self._wrapped_seed: int | None = None
        self._actions: list[Any] = []
        self._trace: list[list[Any]] = []
        self._return = 0.0
        self._last_reward = 0.0
        self._terminated = False

    @property
    def _profile(self) -> GymProfile:
        return type(self).own_profile or GYM_PROFILES[self.gym_id]

    @property
    def _codec(self) -> StateCodec | None:
        """The wrapped env's state codec: its profile's, else its own get_state / set_state methods, else None."""
        return self._profile.codec or (METHOD_CODEC if self._method_codec else None)

    def _render_fn(self, wrapped: Any, obs: Any, ended: bool) -> str:
        render = self._profile.render or (ansi_text if self._wrapped_ansi else described_text)
        return render(wrapped, obs, ended)

    def _new_wrapped(self, episode_kwargs: dict[str, Any] | None = None) -> Any:
        """A fresh wrapped env (never reset) of this env's id and kwargs (and ``episode_kwargs``, default this
        episode's): the bare env of ``gymnasium.make``."""
        spec = gym.spec(self.gym_id)
        creator = gym.envs.registration.load_env_creator(spec.entry_point) if isinstance(
            spec.entry_point, str) else spec.entry_point
        modes = getattr(creator, "metadata", {}).get("render_modes", [])
        render_mode = "ansi" if "ansi" in modes else None
        return gym.make(spec, render_mode=render_mode, disable_env_checker=True,
                        **self._gym_kwargs, **(self._episode_kwargs if episode_kwargs is None else episode_kwargs)
                        ).unwrapped

    def _episode_gym_kwargs(self) -> dict[str, Any]:
        """Wrapped-env kwargs drawn per episode from ``self.np_random`` (plain JSON data; none here). A subclass
        that generates its task per episode (FrozenLake's maps) overrides it; the wrapped env is rebuilt when
        they change."""
        return {}

    def _model_key(self) -> str:
        return json.dumps([self.gym_id, self._gym_kwargs, self._episode_kwargs], sort_keys=True)

    # ------------------------------------------------------------- episode
    def _text(self, wrapped: Any, obs: Any, ended: bool) -> tuple[str, str]:
        text = self._render_fn(wrapped, obs, ended)
        return text, observation_digest(obs, text)

    def _reset_task(self, options: dict[str, Any] | None) -> str:
        if options:
            raise ValueError(f"{type(self).__name__} takes no reset options, got {sorted(options)}")
        episode_kwargs = self._episode_gym_kwargs()
        if episode_kwargs != self._episode_kwargs:
            self._episode_kwargs = episode_kwargs
            old, self._wrapped = self._wrapped, self._new_wrapped()
            old.close()
        self._wrapped_seed = int(self.np_random.integers(2**31 - 1))
        obs, _ = self._wrapped.reset(seed=self._wrapped_seed)
        text, digest = self._text(self._wrapped, obs, False)
        self._actions, self._trace = [], [[digest, 0.0, False, False]]
        self._return, self._last_reward, self._terminated = 0.0, 0.0, False
        menu = ", ".join(self._action_set.menu)
        return f"{self._rules()}\nActions: {menu}.\n\n{text}\n{self._prompt()}"

    def _rules(self) -> str:
        return self._profile.rules or f"Gymnasium env {self.gym_id}."

    def _prompt(self) -> str:
        what = ("act(text) with your action as a string" if self._action_set.text
                else "one of " + ", ".join(self._action_set.menu))
        return f"Turn {self._turn + 1} of {self.max_turns}: call {what}."

    def _legal_actions(self) -> list[str]:
        return list(self._action_set.menu)

    def _state_text(self) -> str:
        """The wrapped env's current observation (the digest of its value and its text form, the last entry of the
        episode's trace), without the action echo and reward line of the step's observation."""
        trace = getattr(self, "_trace", None)
        return trace[-1][0] if trace else super()._state_text()

    def _action_text(self, action: Any) -> str:
        return self._action_set.action_text(action)

    def _act(self, call: ToolCall) -> Outcome:
        action = self._action_set.decode(call)
        obs, reward, terminated, truncated, _ = self._wrapped.step(action)
        reward, terminated, truncated = float(reward), bool(terminated), bool(truncated)
        text, digest = self._text(self._wrapped, obs, terminated or truncated)
        self._actions.append(action)
        self._trace.append([digest, reward, terminated, truncated])
        self._return += reward
        self._last_reward, self._terminated = reward, terminated
        head = f"{self._action_text(action)}: reward {reward:g}."
        if terminated:
            head += " The game is over."
        elif truncated:
            head += f" {self.gym_id}'s own step limit ended the episode."
        return Outcome(f"{head}\n{text}", reward=reward, terminated=terminated, truncated=truncated and not terminated,
                       reason="answered" if terminated else "max_turns" if truncated else None)

    def step(self, action: Action) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """:meth:`TextEnv.step`; at the episode's end ``info["episode_metrics"] = {"success", "return"}``."""
        out = TextEnv.step(self, action)
        if self._done:
            out[4]["episode_metrics"] = {"success": float(self.success), "return": self._return}
        return out

    @property
    def success(self) -> bool:
        """Whether the episode so far counts as a success (:mod:`envs.gym_adapter`; the profile's rule)."""
        rule = self._profile.success
        return bool(rule(self._return, self._last_reward, self._terminated)) if rule else self._return > 0

    # ------------------------------------------------------------- features
    @property
    def action_vocabulary(self) -> list[str]:
        """Every action text (the whole Discrete menu; all are legal in every state).

        Raises:
            AttributeError: the action space is Text (open: no vocabulary).
        """
        if self._action_set.text:
            raise AttributeError("a Text action space has no finite action vocabulary")
        return list(self._action_set.menu)

    def tool_schemas(self) -> list[dict[str, Any]]:
        """One tool per named action (no arguments), else ``act(a)`` (integer) or ``act(text)`` (string)."""
        profile = self._profile
        return self._action_set.tool_schemas(
            profile.action_help if self._action_set.names == profile.action_names else ())

    def demo_action(self, rng: random.Random, skill: float = 0.0) -> str:
        """With probability ``skill`` the profile's scripted action (:mod:`envs.gym_adapter.demonstrators`), else a
        uniformly random legal action (:func:`envs.features.mixed_demo`); ``skill`` 0 is random play, 1 the
        scripted play. Envs without a script play randomly (and draw no ``rng.random()`` for the mix).

        Raises:
            ValueError: ``skill`` outside [0, 1].
        """
        policy = self._profile.policy
        best = None if policy is None else (lambda: self._action_text(policy(self)))
        return mixed_demo(rng, skill, best, self._legal_actions)

    # ------------------------------------------------------------- fork / snapshot
    def _task_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "episode_kwargs": self._episode_kwargs, "wrapped_seed": self._wrapped_seed,
            "actions": list(self._actions), "trace": [list(t) for t in self._trace], "return": self._return,
            "last_reward": self._last_reward, "terminated": self._terminated, "gym_state": None}
        if self.fork_method == "state_codec" and self._wrapped_seed is not None and self._codec is not None:
            state["gym_state"] = self._codec.get(self._wrapped)
        return state

    def restore(self, snapshot: Any) -> None:
        """:meth:`TextEnv.restore`, atomic: the wrapped env is rebuilt first (state codec, else verified replay), so a
        snapshot that cannot be restored leaves this env as it was.

        Raises:
            ValueError: a snapshot of another class or kwargs, or with an action the wrapped env does not take.
            ReplayDivergedError: the replay of the snapshot's episode differs from its record.
        """
        snap = self._checked_snapshot(snapshot)
        self._restored = self._wrapped_for(snap.state["task"], "restore")
        try:
            super().restore(snap)
        finally:
            self._restored = None

    def _wrapped_for(self, task: dict[str, Any], what: str) -> Any:
        """A new wrapped env in the state a snapshot's task state records: by the codec, else by verified replay."""
        episode_kwargs = dict(task["episode_kwargs"])
        seed = task["wrapped_seed"]
        if seed is not None and self.fork_method == "state_codec" and self._codec is not None:
            wrapped = self._new_wrapped(episode_kwargs)
            try:
                self._codec.set(wrapped, task["gym_state"])
            except Exception:
                wrapped.close()
                raise
            return wrapped
        actions = [self._action_set.checked(a) for a in task["actions"]]
        return self._replayed(what, episode_kwargs, None if seed is None else int(seed), actions, task["trace"])

    def _load_task_state(self, state: dict[str, Any]) -> None:
        wrapped = self._restored if self._restored is not None else self._wrapped_for(state, "restore")
        self._episode_kwargs = dict(state["episode_kwargs"])
        seed = state["wrapped_seed"]
        self._wrapped_seed = None if seed is None else int(seed)
        self._actions = list(state["actions"])
        self._trace = [list(t) for t in state["trace"]]
        self._return, self._last_reward = float(state["return"]), float(state["last_reward"])
        self._terminated = bool(state["terminated"])
        old, self._wrapped = self._wrapped, wrapped
        if old is not None and old is not wrapped:
            old.close()

    def _fork_into(self, children: list[TextEnv]) -> None:
        wrapped_state = None
        if self._wrapped_seed is not None and self.fork_method == "state_codec" and self._codec is not None:
            wrapped_state = json.dumps(self._codec.get(self._wrapped))
        for child in children:
            assert isinstance(child, GymTextEnv)
            child._actions, child._trace = list(self._actions), list(self._trace)
            if self._wrapped_seed is None:
                child._wrapped = self._new_wrapped()
            elif wrapped_state is not None:
                assert self._codec is not None
                child._wrapped = copy.copy(self._wrapped) if self._codec.share_constants else self._new_wrapped()
                self._codec.set(child._wrapped, json.loads(wrapped_state))
            elif self.fork_method == "deepcopy":
                child._wrapped = copy.deepcopy(self._wrapped)
            else:
                child._wrapped = self._replayed("fork", self._episode_kwargs, self._wrapped_seed, self._actions,
                                                self._trace)

    def _replayed(self, what: str, episode_kwargs: dict[str, Any], seed: int | None, actions: list[Any],
                  trace: list[list[Any]]) -> Any:
        """A new wrapped env brought to an episode's state by the verified replay
        (:func:`envs.gym_adapter.replay.replay_verified`; ReplayDivergedError when it differs from the record)."""
        return replay_verified(self._new_wrapped(episode_kwargs), seed, actions, trace,
                               digest=lambda wrapped, obs, ended: self._text(wrapped, obs, ended)[1],
                               action_text=self._action_text, who=f"{type(self).__name__}({self.gym_id!r})",
                               gym_id=self.gym_id, what=what)

    def close(self) -> None:
        """Close the wrapped env."""
        if getattr(self, "_wrapped", None) is not None:
            self._wrapped.close()
        super().close()
