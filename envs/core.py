"""The base class of every forkyard environment: multi-turn text in and out, with fork and snapshot.

Why one file: :class:`TextEnv`'s state, its stepping, fork, snapshot and restore are one class over one state.

An episode is a sequence of *turns*. On each turn the agent sends one action (a tool call in the format
of :mod:`envs.actions`) and receives one observation (text). ``step`` returns the Gymnasium 5-tuple
``(observation, reward, terminated, truncated, info)`` and ``info`` always carries:

``turn`` (int)
    0-based index of the turn the agent takes next (turns already taken: 0 after ``reset``, ``max_turns`` at most).
``anchor_key`` (str, 32 hex digits)
    A stable hash of the agent's visible history: the first observation and every (action, observation)
    pair since. Two episodes share an anchor key exactly when the agent saw and did the same things,
    whatever their hidden state; the key is the same across processes and machines (BLAKE2b, not
    Python's ``hash``). Advantage estimators group steps by it (GiGPO's anchor states, arXiv:2505.10978).
``state_key`` (str, 32 hex digits)
    A stable hash of the current state alone, as GiGPO (arXiv:2505.10978) groups steps: the text
    of :meth:`TextEnv._state_text` (default: the latest observation without the turn line :meth:`TextEnv._prompt`
    appended to it; a board game's board). The same state reached by another path or at another turn has the
    same key; where the observation does not show everything that matters (a probe's answer, a partial view),
    steps that differ share it. Trainers group by it with ``--anchor-by state``.
``legal_actions`` (list[str])
    The canonical texts of the actions legal now, for envs with a finite action set (``[]`` at the end).
``invalid_action`` (bool)
    True when the action of this step was refused (unparseable or illegal).
``termination_reason`` (str, only at episode end)
    One of :data:`TERMINATION_REASONS`.

Actions are read by :func:`envs.action_input.read_action` (field case S62): the env's syntax with positional
or keyword arguments of a declared tool, and a model's tool call in the forms serving stacks write.
Invalid actions never raise: the observation says what was wrong and how to write a correct call,
the turn is consumed, and the reward is ``invalid_action_reward`` (0.0 by default). An answer *terminates*
an episode; an exhausted turn budget *truncates* it (``"max_turns"``, or ``"invalid"`` after a refused action).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium.error import ResetNeeded
from pydantic import BaseModel

from envs.action_input import action_record, read_action
from envs.actions import MAX_ACTION_CHARS, ActionParseError, ToolCall, parse_action
from envs.text_space import TextSpace, fit_text

#: Every value ``info["termination_reason"]`` can take.
TERMINATION_REASONS = ("answered", "max_turns", "timeout", "invalid", "infra_error")
#: How an env's ``fork`` / ``snapshot`` / ``restore`` copy its state (:attr:`TextEnv.fork_method`; the "fork method"
#: column of docs/envs.md): ``state_codec`` (the env's own codec of its task state: :meth:`TextEnv._task_state` /
#: :meth:`TextEnv._load_task_state`, or a wrapped package's documented get-state / set-state, such as a Z-machine
#: emulator's saved state), ``deepcopy`` (``copy.deepcopy`` of a wrapped in-process env), ``replay`` (a seeded replay of
#: the action log, verified against every recorded observation and reward; refused with an error when it differs) and
#: ``sandbox`` (the task state plus a clone of the env's sandbox through its provider).
FORK_METHODS = ("state_codec", "deepcopy", "replay", "sandbox")
#: Reasons that mean the *infrastructure* failed (not the agent): trainers leave such episodes out of
#: group statistics instead of scoring them 0.
INFRA_FAILURE_REASONS = frozenset({"infra_error"})


#: What ``step`` takes: the env's ``name(args)`` text, a model's reply, or a JSON call (field case S62).
Action = str | dict[str, Any] | list[Any]

class IllegalActionError(ActionParseError):
    """A well-formed tool call that is not allowed now (unknown tool, bad argument, wrong turn)."""


class EnvInfraError(RuntimeError):
    """The environment's infrastructure failed (a sandbox lost, a server error), not the agent.

    Trainers catch it, end the episode with ``termination_reason="infra_error"`` and leave the episode
    out of group statistics."""


class EpisodeFinishedError(RuntimeError):
    """``step`` was called after the episode terminated or was truncated; call ``reset`` first."""


class Snapshot(BaseModel):
    """The complete state of a :class:`TextEnv` as plain data (JSON-serialisable).

    ``state`` holds the turn, visible history, anchor key, RNG state (numpy ``bit_generator.state``)
    and the env's hidden task state. A snapshot restores only into an env of the same class and kwargs.
    """

    env_class: str
    env_id: str | None = None
    kwargs: dict[str, Any]
    state: dict[str, Any]

    def to_bytes(self) -> bytes:
        """UTF-8 JSON bytes of this snapshot."""
        return self.model_dump_json().encode("utf-8")

    @classmethod
    def from_bytes(cls, data: bytes | str) -> "Snapshot":
        """Inverse of :meth:`to_bytes`. Raises ``pydantic.ValidationError`` on malformed data."""
        return cls.model_validate_json(data)


@dataclass
class Outcome:
    """What a subclass's :meth:`TextEnv._act` returns for one legal action."""

    observation: str
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    reason: str | None = None
    info: dict[str, Any] = field(default_factory=dict)


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def _generator_from_state(state: dict[str, Any]) -> np.random.Generator:
    bitgen = getattr(np.random, state["bit_generator"])()
    bitgen.state = state
    return np.random.Generator(bitgen)


def _derived_generator(state: dict[str, Any], fork_key: tuple[int, ...]) -> np.random.Generator:
    """A new PCG64 Generator for the fork copy ``fork_key`` of an env whose RNG is at ``state`` (a numpy
    ``bit_generator.state``): ``SeedSequence(entropy=BLAKE2b(state), spawn_key=fork_key)``, the same in every
    process; copies with different keys draw independent streams (field case S40)."""
    text = json.dumps(state, sort_keys=True, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o))
    entropy = int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest(), "big")
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy, spawn_key=fork_key)))


class TextEnv(gym.Env):
    """Base class: a multi-turn text environment with ``reset``, ``step``, ``fork``, ``snapshot``, ``restore``.

    Observation and action spaces are :class:`~envs.text_space.TextSpace` of at most
    ``max_observation_length`` / ``max_action_length`` code points; longer observations are cut with
    a marker so every observation is contained in the space.

    Subclasses implement :meth:`_reset_task` (draw hidden state from ``self.np_random``, return the first
    observation), :meth:`_act` (apply one parsed call, raise :class:`IllegalActionError` if it is not
    allowed), :meth:`_legal_actions`, :meth:`_prompt`, and :meth:`_task_state` /
    :meth:`_load_task_state` for snapshots. A subclass that owns external resources (a sandbox)
    overrides :meth:`_fork_into` and :meth:`close`, and sets :attr:`blocking` / :attr:`uses_sandbox`.
    Optional features a subclass may add are the protocols of :mod:`envs.features`.

    Args:
        max_turns: turn budget of an episode, >= 1.
        kwargs: the constructor arguments of the subclass, recorded for snapshots.
        render_mode: ``None`` or ``"ansi"`` (``render`` returns the transcript).

    Raises:
        ValueError: if ``max_turns`` < 1 or ``render_mode`` is not supported.
    """

    #: ``autoreset_mode``: how a Gymnasium vector env of this env resets a finished sub-env. NEXT_STEP
    #: (Gymnasium's default): the ``step`` after the one that ended the episode resets that sub-env and
    #: returns the new first observation (reward 0, terminated and truncated False); its action is ignored.
    metadata: ClassVar[dict[str, Any]] = {
        "render_modes": ["ansi"], "render_fps": 1, "autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP,
    }
    max_observation_length: ClassVar[int] = 8192
    max_action_length: ClassVar[int] = MAX_ACTION_CHARS
    invalid_action_reward: ClassVar[float] = 0.0
    #: True when ``reset`` / ``step`` / ``fork`` wait on I/O (a sandbox, a remote service): a server then
    #: runs them in worker threads instead of on its event loop. Pure-Python envs (ClueProbe) leave it False.
    blocking: ClassVar[bool] = False
    #: True when the env runs its tools in a sandbox and takes a ``sandbox_provider=`` constructor argument:
    #: a server then passes its own sandbox service there, so every env session it serves uses the
    #: server's backend (FileQA). False: the server constructs the env with the client's kwargs only.
    uses_sandbox: ClassVar[bool] = False
    #: How fork and snapshot copy this env's state: one of :data:`FORK_METHODS` (a class default; an adapter that
    #: picks its method per wrapped env sets it on the instance). :func:`envs.checks.check_fork_contract` checks
    #: the contract whatever the method; catalogs (``forkyard envs``, docs/envs.md) report it.
    fork_method: ClassVar[str] = "state_codec"
    _rng_pending: dict[str, Any] | None = None  # RNG state copied at fork, turned into a Generator on first use
    #: A fork copy's key (its index path in the fork tree): its next unseeded reset draws from an RNG derived
    #: from the current one and this key (see :meth:`fork`); None for an env that is not a pending copy.
    _fork_key: tuple[int, ...] | None = None
    _forks_made = 0  # copies this env has made, so that every copy gets its own key

    def __init__(self, *, max_turns: int, kwargs: dict[str, Any], render_mode: str | None = None):
        if not isinstance(max_turns, int) or isinstance(max_turns, bool) or max_turns < 1:
            raise ValueError(f"max_turns must be an int >= 1, got {max_turns!r}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']} or None, got {render_mode!r}")
        self.max_turns = max_turns
        self.render_mode = render_mode
        self._kwargs = dict(kwargs)
        self.observation_space = TextSpace(self.max_observation_length)
        self.action_space = TextSpace(self.max_action_length)
        self._turn = 0
        self._history: list[tuple[str, str]] = []
        self._first_observation = ""
        self._anchor = ""
        self._done = False
        self._needs_reset = True

    @property
    def np_random(self) -> np.random.Generator:
        """The env's RNG (``numpy.random.Generator``), seeded by ``reset(seed=...)``.

        A fork's child holds its parent's RNG state in ``_rng_pending`` and builds the Generator from it
        on first use. The pending state counts only while no Generator is installed: Gymnasium's
        ``Env.reset(seed=...)`` assigns ``self._np_random`` directly (not through this property), and the
        Generator it installs must win over any state inherited from a parent."""
        if self._np_random is None and self._rng_pending is not None:
            self._np_random = _generator_from_state(self._rng_pending)
        self._rng_pending = None
        return gym.Env.np_random.fget(self)

    @np_random.setter
    def np_random(self, value: np.random.Generator) -> None:
        self._rng_pending = None
        self._np_random = value
        self._np_random_seed = -1  # Gymnasium's convention: the seed of a Generator set by hand is unknown

    def _rng_state(self) -> dict[str, Any] | None:
        if self._np_random is not None:  # an installed Generator always wins over a pending state
            return self._np_random.bit_generator.state
        return self._rng_pending

    # ----------------------------------------------------------------- subclass hooks
    def _reset_task(self, options: dict[str, Any] | None) -> str:
        raise NotImplementedError

    def _act(self, call: ToolCall) -> Outcome:
        raise NotImplementedError

    def _legal_actions(self) -> list[str] | None:
        """Canonical texts of the legal actions now, or ``None`` when the action set is open."""
        return None

    def _prompt(self) -> str:
        """One line telling the agent what it may do on the coming turn."""
        return f"Turn {self._turn + 1} of {self.max_turns}."

    def _state_text(self) -> str:
        """The text ``info["state_key"]`` hashes: the latest observation without the turn line
        that :meth:`step` / the subclass's first observation append to it (the line of the turn now coming; an
        observation cut by ``max_observation_length`` keeps its cut tail). Envs whose observations also echo the
        last action (a board game's ``"Left: moved."``) override it with the state alone."""
        text = self.last_observation
        prompt = self._prompt()
        return text.removesuffix("\n" + prompt).removesuffix(prompt)

    def _task_state(self) -> dict[str, Any]:
        return {}

    def _load_task_state(self, state: dict[str, Any]) -> None:
        pass

    def _fork_into(self, children: list["TextEnv"]) -> None:
        """Give each child its own copy of any resource this env owns beyond plain Python state
        (one call for all n children, so a sandbox can be snapshotted once and cloned n times)."""

    # ----------------------------------------------------------------- Gymnasium API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start a new episode; returns ``(observation, info)``.

        ``reset(seed=s)`` gives exactly the episode a freshly constructed env gives for ``s``, whatever
        this env did before (earlier episodes, ``fork``, ``restore``): the RNG is re-seeded from ``s``
        and every piece of episode state is rebuilt. ``reset()`` without a seed continues this env's
        RNG stream, except the first one of a fork copy, which switches to the copy's own derived stream
        (:meth:`fork`): copies share the forked episode, never a later one. ``options`` are the subclass's (e.g.
        ClueProbe's ``{"target": c}``). A reset that raises (bad options) leaves the episode as it was (turn,
        history, RNG, flags; ``_reset_task`` validates its options before it changes the task's state)."""
        saved = (self._np_random, self._np_random_seed, self._rng_pending, self._fork_key,
                 self._turn, self._history, self._done, self._needs_reset)
        super().reset(seed=seed)  # with a seed, installs a new Generator, which outranks a forked RNG state
        if self._fork_key is not None:
            state = None if seed is not None else self._rng_state()
            if state is not None:  # (an RNG never seeded is drawn at random per copy anyway)
                self._np_random, self._np_random_seed = _derived_generator(state, self._fork_key), -1
                self._rng_pending = None
            self._fork_key = None
        self._turn, self._history, self._done, self._needs_reset = 0, [], False, False
        try:
            task_text = self._reset_task(options)
        except BaseException:
            (self._np_random, self._np_random_seed, self._rng_pending, self._fork_key,
             self._turn, self._history, self._done, self._needs_reset) = saved
            raise
        obs = fit_text(task_text, self.max_observation_length)
        self._first_observation = obs
        self._anchor = _digest("reset\x1f" + obs)
        return obs, self._info()

    def step(self, action: Action) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """One turn: ``(observation, reward, terminated, truncated, info)`` (module docstring).

        ``action`` is read by :func:`envs.action_input.read_action` against the env's tool schemas: the env's
        ``name(args)`` syntax with positional or keyword arguments, a model's reply in the forms serving stacks
        write (``<tool_call>`` blocks, bare JSON calls, reasoning around them), or a JSON call object. The history
        and anchor key record the action read (an unreadable one as written). What cannot be read, or is not
        allowed now, is refused in the observation (``info["invalid_action"]``), never raised.

        Raises:
            gymnasium.error.ResetNeeded: before the first ``reset``.
            EpisodeFinishedError: the episode has ended.
        """
        if self._needs_reset:
            raise ResetNeeded("call reset() before step()")
        if self._done:
            raise EpisodeFinishedError("the episode has ended; call reset() (or fork before the end)")
        invalid, read = False, None
        try:
            read = read_action(action, self._declared_tools)  # the one reader of every door (field case S62)
            outcome = self._act(parse_action(read))
        except ActionParseError as exc:
            invalid = True
            outcome = Outcome(observation=f"Invalid action: {exc}", reward=self.invalid_action_reward)
        self._turn += 1
        if not (outcome.terminated or outcome.truncated) and self._turn >= self.max_turns:
            outcome.truncated = True
            outcome.reason = "invalid" if invalid else "max_turns"
        self._done = outcome.terminated or outcome.truncated
        text = outcome.observation
        if not self._done:
            text = f"{text}\n{self._prompt()}"
        elif outcome.reason == "max_turns" or (invalid and self._done):
            text = f"{text}\nNo turns left: the episode is over."
        obs = fit_text(text, self.max_observation_length)
        action_text = read if read is not None else action_record(action)
        self._anchor = _digest(f"{self._anchor}\x1f{action_text}\x1e{obs}")
        self._history.append((action_text, obs))
        info = self._info()
        info["invalid_action"] = invalid
        if self._done:
            info["termination_reason"] = outcome.reason or ("answered" if outcome.terminated else "max_turns")
        info.update(outcome.info)
        return obs, float(outcome.reward), bool(outcome.terminated), bool(outcome.truncated), info

    def _declared_tools(self) -> list[dict[str, Any]] | None:
        """The env's tool schemas (the :class:`envs.features.ToolSchemas` feature), None without it."""
        schemas = getattr(self, "tool_schemas", None)
        return schemas() if callable(schemas) else None

    def _info(self) -> dict[str, Any]:
        info: dict[str, Any] = {"turn": self._turn, "anchor_key": self._anchor,
                                "state_key": _digest("state\x1f" + self._state_text())}
        legal = [] if self._done else self._legal_actions()
        if legal is not None:
            info["legal_actions"] = legal
        return info

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        lines = [f"[observation] {self._first_observation}"]
        for action, obs in self._history:
            lines += [f"[action] {action}", f"[observation] {obs}"]
        return "\n".join(lines)

    # ----------------------------------------------------------------- visible state
    @property
    def turn(self) -> int:
        """Number of turns taken in this episode (0-based index of the next turn)."""
        return self._turn

    @property
    def history(self) -> list[tuple[str, str]]:
        """A copy of the visible history: ``[(action, observation), ...]`` since ``reset``."""
        return list(self._history)

    @property
    def last_observation(self) -> str:
        """The latest observation: the last step's, else the first one after ``reset`` (``""`` before)."""
        return self._history[-1][1] if self._history else self._first_observation

    @property
    def done(self) -> bool:
        """True once the episode has terminated or been truncated."""
        return self._done

    # ----------------------------------------------------------------- fork / snapshot / restore
    def fork(self, n: int = 1) -> list["TextEnv"]:
        """Return ``n`` independent copies of this env at its current state.

        Each copy has its own hidden state, visible history, turn counter and RNG. Within the forked
        episode a copy's RNG is a copy of this env's (a copy draws the same numbers this env would, so
        copies given the same actions step alike). Later episodes are independent (field case S40): a
        copy's first ``reset()`` without a seed switches to a stream derived from its RNG state and its
        fork key (``SeedSequence(entropy=BLAKE2b(rng state), spawn_key=key)``; the key is the copy's index
        path in the fork tree, ``(k,)`` for this env's k-th copy ever, ``key + (k,)`` for a copy of a copy),
        so the copies of one fork, later forks and this env itself draw different later episodes, and
        the same fork history gives the same draws in every process. ``reset(seed=s)`` drops the key (a
        fresh env's episode for ``s``). Vector envs over copies (Gymnasium's, :class:`envs.RemoteVectorEnv`
        after its ``fork``) thereby autoreset to independent episodes. Stepping or closing a copy never
        changes another copy or this env. Copies are bare envs (no Gymnasium wrappers): fork
        ``env.unwrapped`` of an env made by ``gymnasium.make``.

        Raises:
            ValueError: if ``n`` is not an int >= 1.
        """
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"fork(n) needs an int n >= 1, got {n!r}")
        children = [self._clone() for _ in range(n)]
        self._fork_into(children)
        base = self._fork_key or ()
        for k, child in enumerate(children, self._forks_made):
            child._fork_key, child._forks_made = base + (k,), 0
        self._forks_made += n
        return children

    def count_forks(self, n: int) -> None:
        """Count ``n`` copies of this env made elsewhere from its snapshot (a cross-node fork restores the
        snapshot on another node and forks it there, :meth:`ray_cluster.nodes.NodeHost.adopt`): they took
        this env's next ``n`` fork keys, so its later forks take the ones after (no two copies share a stream)."""
        self._forks_made += int(n)

    def _clone(self) -> "TextEnv":
        child = object.__new__(type(self))
        child.__dict__.update(self.__dict__)
        child._history = list(self._history)
        child._kwargs = dict(self._kwargs)
        # Copying a numpy Generator costs ~100 us; its state dict costs ~2 us. The child builds its
        # Generator from the state on first use (see ``np_random``).
        child._rng_pending = self._rng_state()
        child._np_random = None
        return child

    def __copy__(self):
        raise TypeError(
            "copy.copy(env) would share the env's state between two objects; use env.fork(n) for "
            "independent copies (or copy.deepcopy for an in-process deep copy without external resources)"
        )

    def __getstate__(self) -> dict[str, Any]:
        """Pickle (and deepcopy) support (field case S44): an env of plain Python state pickles whole
        (episode, RNG, fork key, ``spec``), and unpickles into an env that continues exactly where it was.

        Raises:
            TypeError: the env runs its tools in a sandbox (:attr:`uses_sandbox`): its sandbox provider and
                live sandbox cannot cross a process boundary. Send ``env.snapshot().to_bytes()`` and restore it
                into an env built in the other process, or pickle ``env.spec`` and make the env there.
        """
        if self.uses_sandbox:
            provider = getattr(getattr(self, "_provider", None), "name", None)
            raise TypeError(
                f"cannot pickle {type(self).__name__}: it holds a sandbox provider ({provider or 'unnamed'}) and "
                "a live sandbox, which cannot cross a process boundary; send env.snapshot().to_bytes() and "
                f"restore() it into a {type(self).__name__} built in the other process, or pickle env.spec and "
                "gymnasium.make(spec) there")
        return self.__dict__.copy()

    def snapshot(self) -> Snapshot:
        """Capture this env's full state as a :class:`Snapshot` (plain data, JSON-serialisable)."""
        rng = self._rng_state()
        return Snapshot(
            env_class=f"{type(self).__module__}:{type(self).__qualname__}",
            env_id=self.spec.id if self.spec is not None else None,
            kwargs=self._kwargs,
            state={
                "turn": self._turn,
                "history": [list(pair) for pair in self._history],
                "first_observation": self._first_observation,
                "anchor_key": self._anchor,
                "done": self._done,
                "needs_reset": self._needs_reset,
                "rng": rng,
                "rng_seed": self._np_random_seed,
                "fork_key": None if self._fork_key is None else list(self._fork_key),
                "forks_made": self._forks_made,
                "task": self._task_state(),
            },
        )

    def _checked_snapshot(self, snapshot: Snapshot | dict[str, Any] | bytes | str) -> Snapshot:
        """``snapshot`` as a :class:`Snapshot` that this env can restore (same class, same kwargs).

        Raises:
            ValueError: if the snapshot was taken from another env class or other constructor kwargs.
            pydantic.ValidationError: if the data is not a snapshot.
        """
        if isinstance(snapshot, (bytes, str)):
            snapshot = Snapshot.from_bytes(snapshot)
        elif isinstance(snapshot, dict):
            snapshot = Snapshot.model_validate(snapshot)
        mine = f"{type(self).__module__}:{type(self).__qualname__}"
        if snapshot.env_class != mine or snapshot.kwargs != self._kwargs:
            raise ValueError(
                f"snapshot of {snapshot.env_class} with kwargs {snapshot.kwargs} cannot restore into "
                f"{mine} with kwargs {self._kwargs}"
            )
        return snapshot

    def restore(self, snapshot: Snapshot | dict[str, Any] | bytes | str) -> None:
        """Set this env to the state captured in ``snapshot`` (a :class:`Snapshot`, its dict or its JSON).

        Raises:
            ValueError: if the snapshot was taken from another env class or other constructor kwargs.
            pydantic.ValidationError: if the data is not a snapshot.
        """
        snapshot = self._checked_snapshot(snapshot)
        st = snapshot.state
        self._turn = int(st["turn"])
        self._history = [(str(a), str(o)) for a, o in st["history"]]
        self._first_observation = st["first_observation"]
        self._anchor = st["anchor_key"]
        self._done = bool(st["done"])
        self._needs_reset = bool(st["needs_reset"])
        self._rng_pending = None
        self._np_random = None if st["rng"] is None else _generator_from_state(st["rng"])
        seed = st.get("rng_seed")
        # A Generator with an unknown seed is marked -1 (Gymnasium's convention); leaving None would make
        # Gymnasium's ``np_random_seed`` property replace the restored Generator with a random one.
        self._np_random_seed = -1 if seed is None and self._np_random is not None else seed
        key = st.get("fork_key")  # absent from snapshots taken before field case S40
        self._fork_key = None if key is None else tuple(int(k) for k in key)
        self._forks_made = int(st.get("forks_made", 0))
        self._load_task_state(st["task"])

    def current_info(self) -> dict[str, Any]:
        """The ``info`` dict describing the current state (``turn``, ``anchor_key``, ``state_key``,
        ``legal_actions``)."""
        return self._info()
