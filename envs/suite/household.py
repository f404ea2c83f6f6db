"""Household-v0: a text game of rooms, containers and supporters whose goal is to put an object in or on something.

The task form is ALFWorld's pick-and-place (ALFWorld, arXiv 2010.03768; the family of envs GiGPO's anchor grouping
was built for, arXiv 2505.10978): the agent reads "Your task is to: put the whisk on the stand." and a room's
description, then acts by text commands (``go east``, ``open chest``, ``take whisk from bowl``, ``put whisk on
stand``) until the object is where the goal says. The games are generated offline by TextWorld (the ``textworld``
package, arXiv 1806.11532) in its house theme and played on the Jericho Z-machine emulator (the ``jericho``
package, arXiv 1909.05398); nothing is downloaded.

**Games.** Generating a game takes a second or two (TextWorld samples a world and a quest, then compiles Inform 7
to a ``.z8`` story file), so each setting has a finite, deterministic set of ``n_games`` games, generated on first
use (one game when an episode first needs it) into a cache folder and reused by every process: ``$FORKYARD_CACHE/
household`` when ``FORKYARD_CACHE`` is set, else ``$XDG_CACHE_HOME/forkyard/household`` (default
``~/.cache/forkyard/household``), in a subfolder named by the textworld version, :data:`GENERATOR_VERSION` and the
settings. Writes are concurrency-safe: a game is compiled in a temporary folder and renamed into place, its
``.json`` before its ``.z8`` (a game exists when its ``.z8`` does). Game ``k`` of a split is TextWorld's generator
seeded with :func:`game_seed`; the quest is sampled by backward chaining from a final ``put`` / ``insert`` action
(``quest_length`` actions in all, ``go``, ``open``, ``unlock`` and ``take`` before it), the objective names only
that last action (TextWorld's ``only_last_action``), and a game is kept only when its walkthrough wins on the
emulator. Generation is deterministic across processes and hash seeds (the ``.json`` files are byte-identical);
the ``.z8`` headers carry Inform's compile date as serial number and differ in those bytes only.

**Episodes.** ``reset(seed=s)`` plays game ``s % n_games`` (``reset(options={"game": k})`` names it; an unseeded
``reset()`` draws it from the env's RNG). The games are deterministic: a game's every episode is the same game.
:meth:`HouseholdEnv.evaluation_resets` enumerates the games.

**Actions.** One tool, ``command(text)``: ``text`` is one of the game's admissible commands now (TextWorld's, from
its logic state: ``go``, ``open``, ``close``, ``take``, ``put``, ``insert``, ``drop``, ``unlock``, ``lock``,
``eat``, ``examine``, ``look``, ``inventory`` with the objects in reach). ``info["legal_actions"]`` lists them as
sorted canonical texts (``command('open chest')``; ``command(text='open chest')`` is the same call), and the
observation repeats the commands (as ALFWorld agents' prompts do). Matching ignores case and runs of spaces. A
command that is not admissible is refused without touching the game (:class:`~envs.core.IllegalActionError`: an
explaining observation, reward 0, turn consumed). The commands depend on the game (its objects' names), so the
env offers no ``action_vocabulary`` (:class:`~envs.features.FiniteActions`): the union over a set's games is known
only once every game is generated, and too large for that feature's exact enumeration.

**Reward and ending.** Reward 1.0 on the command that completes the goal (TextWorld's quest; its score also goes
0 -> 1 then, and no other score change exists in these games); the episode *terminates* there
(``termination_reason="answered"``). A command that makes the goal unreachable (eating the object to be placed,
when it is food) terminates it with reward 0 (also ``"answered"``: the task ended, failed). Otherwise it is
*truncated* after ``max_turns`` commands. The step that ends an episode carries ``info["episode_metrics"] =
{"success": 0.0 or 1.0, "distinct_commands": n}``.

**Fork and snapshot** (``fork_method="state_codec"``): the emulator's own saved state (Jericho's ``get_state`` /
``set_state``: dynamic memory, stack, program counter, frame and stack pointers, random-number state, last output)
plus TextWorld's logic state. Each process keeps a small pool of emulators, one per game file
(:data:`EMULATOR_POOL_SIZE`, least recently used dropped; each is a private copy of Jericho's ``libfrotz`` of about
1.6 MB), and an env holds only its emulator *state*: a step loads the state into the game's pooled emulator, sends
the command and reads the new state back, under that emulator's lock. A fork therefore copies no emulator (the
states are immutable values; only TextWorld's logic progression is copied), forked copies never share an emulator
object's state, and an evicted emulator costs one reload. A snapshot encodes the emulator state as JSON (memory and
stack zlib-compressed, base64) beside the logic actions taken (TextWorld's ``Action.serialize``), which a restore
replays on the logic state (the emulator is restored, never replayed); it restores in another process with the
same settings, generating the game there if its cache lacks it (the game's digest must match). The env pickles and
deep-copies (its logic progression is rebuilt the same way). ``close`` drops the env's emulator state and logic
state (the pooled emulator stays for other envs of that game; :func:`release_emulators` closes the pool).

**Demonstrator** (:meth:`HouseholdEnv.demo_action`): with probability ``skill`` the next command of TextWorld's
winning policy from the current state (its quest tracker's ``winning_policy``, re-planned after every command: it
knows where things are, like ALFWorld's expert), else a uniformly random admissible command (with none, the
episode over, ``command('look')``). It mixes as :func:`envs.features.mixed_demo` does, but for that fallback.

**Modules.** This one is the env; the game sets (cache, generation, :data:`GENERATOR_VERSION`) are
:mod:`envs.suite.household_games`, playing them (the emulator pool, :data:`EMULATOR_POOL_SIZE`, loaded games, the
game state) :mod:`envs.suite.household_play`, and the emulator state's JSON codec :mod:`envs.suite.household_codec`.
"""

from __future__ import annotations

import importlib.util
import random
from typing import Any

from envs.actions import ActionParseError, ToolCall, bind_arguments, format_action
from envs.core import Action, IllegalActionError, Outcome, TextEnv
from envs.features import check_skill
from envs.suite.household_codec import decode_emulator_state, encode_emulator_state
from envs.suite.household_games import SPLITS, GameSet, game_seed, household_cache_dir
from envs.suite.household_play import LoadedGame, Progress, clean_output, copy_progression, load_game, release_emulators
from envs.tool_calls import function_tool

__all__ = ["GameSet", "HouseholdEnv", "decode_emulator_state", "encode_emulator_state", "game_seed",
           "household_cache_dir", "release_emulators"]

MAX_ROOMS = 8
MAX_OBJECTS = 20
MAX_QUEST_LENGTH = 6
MAX_GAMES = 256
MAX_TURNS = 200


def _int_in(name: str, value: Any, lo: int, hi: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an int in {lo}..{hi}, got {value!r}")
    return value


def _require_packages() -> None:
    """Raise ModuleNotFoundError naming the missing package when textworld or jericho is not installed."""
    for name in ("textworld", "jericho"):
        if importlib.util.find_spec(name) is None:
            raise ModuleNotFoundError(
                f"forkyard/Household-v0 needs the package {name} (pip install 'forkyard[suite]')", name=name)


class HouseholdEnv(TextEnv):
    """Household-v0 (see module docstring): put an object in or on something, in a TextWorld house.

    Args:
        max_turns: turn budget, 1..200 (default 20); the walkthrough takes ``quest_length`` commands.
        rooms: rooms of the house, 1..8 (default 3).
        objects: things in the house, containers and supporters included, 1..20 (default 6).
        quest_length: commands of the shortest winning walkthrough, 1..6 (default 3); the last puts the object in
            or on its target, those before go, open, unlock or take.
        n_games: games of the set, 1..256 (default 16): ``reset(seed=s)`` plays game ``s % n_games``. Each is
            generated on first use (a few seconds) and cached on disk (module docstring).
        split: ``"train"`` (default) or ``"test"``: disjoint sets of games for the same settings.
        render_mode: ``None`` or ``"ansi"``.

    Raises:
        ValueError: on a setting of the wrong type or out of range (the message names it and its range).
        ModuleNotFoundError: textworld or jericho is not installed (``pip install 'forkyard[suite]'``).
    """

    max_observation_length = 8192
    max_action_length = 512
    fork_method = "state_codec"
    #: reset may generate a game (seconds of CPU) and every step runs the emulator: a server runs them in threads.
    blocking = True

    def __init__(self, max_turns: int = 20, rooms: int = 3, objects: int = 6, quest_length: int = 3,
                 n_games: int = 16, split: str = "train", render_mode: str | None = None):
        _int_in("max_turns", max_turns, 1, MAX_TURNS)
        _int_in("rooms", rooms, 1, MAX_ROOMS)
        _int_in("objects", objects, 1, MAX_OBJECTS)
        _int_in("quest_length", quest_length, 1, MAX_QUEST_LENGTH)
        _int_in("n_games", n_games, 1, MAX_GAMES)
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        _require_packages()
        super().__init__(max_turns=max_turns, render_mode=render_mode, kwargs={
            "max_turns": max_turns, "rooms": rooms, "objects": objects, "quest_length": quest_length,
            "n_games": n_games, "split": split})
        self.games = GameSet(rooms, objects, quest_length, split)
        self.n_games = n_games
        self._game: int | None = None
        self._game_path: str | None = None  # the story file of game self._game (known to exist)
        self._state: Progress | None = None
        self._admissible: list[str] = []
        self._reset_seed: int | None = None

    # ----------------------------------------------------------------- episode
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """:meth:`TextEnv.reset`: ``reset(seed=s)`` plays game ``s % n_games``; ``options={"game": k}`` plays game
        ``k``; an unseeded reset draws the game from the env's RNG. Generates the game first when the cache lacks it.

        Raises:
            ValueError: unknown options, or a game index outside 0..n_games-1.
            RuntimeError: the game could not be generated (:meth:`GameSet.ensure`).
        """
        self._reset_seed = seed
        try:
            return super().reset(seed=seed, options=options)
        finally:
            self._reset_seed = None

    def _reset_task(self, options: dict[str, Any] | None) -> str:
        unknown = sorted(set(options or {}) - {"game"})
        if unknown:
            raise ValueError(f"unknown reset options {unknown}; Household takes only 'game'")
        drawn = int(self.np_random.integers(self.n_games))  # drawn always: the RNG stream is the same
        if options and "game" in options:
            index = _int_in("options['game']", options["game"], 0, self.n_games - 1)
        elif self._reset_seed is not None:
            index = self._reset_seed % self.n_games
        else:
            index = drawn
        loaded = self._loaded(index)
        self._game, self._game_path = index, loaded.path
        self._set_state(Progress.start(loaded))
        return f"Your task is to: {loaded.goal}.\n\n{loaded.intro}\n\n{self._prompt()}"

    def _loaded(self, index: int | None = None) -> LoadedGame:
        """The loaded game ``index`` (default: this episode's), generated first when the cache lacks it."""
        if index is None:
            if self._game_path is not None:
                return load_game(self._game_path)
            if self._game is None:
                raise RuntimeError("no game yet: call reset() first")
            index = self._game
        return load_game(str(self.games.ensure(index)))

    def _set_state(self, state: Progress) -> None:
        self._state = state
        self._admissible = state.admissible(self._loaded()) if not (state.won or state.failed) else []

    def _prompt(self) -> str:
        return (f"Turn {self._turn + 1} of {self.max_turns}. Admissible commands: {', '.join(self._admissible)}.\n"
                "Call command(text) with one of them as text.")

    def _legal_actions(self) -> list[str]:
        return sorted(format_action("command", c) for c in self._admissible)

    def step(self, action: Action) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """:meth:`TextEnv.step`; at the episode's end ``info["episode_metrics"]`` (module docstring)."""
        out = super().step(action)
        if self._done:
            won = self._state is not None and self._state.won
            commands = {a for a, _ in self._history}
            out[4]["episode_metrics"] = {"success": 1.0 if won else 0.0, "distinct_commands": len(commands)}
        return out

    def _act(self, call: ToolCall) -> Outcome:
        if call.name != "command":
            raise IllegalActionError(f"this env has one tool, command(text), with an admissible command as text; "
                                     f"got {call.text()}.")
        try:
            text = bind_arguments(call, ["text"]).get("text")
        except ActionParseError as exc:
            raise IllegalActionError(str(exc)) from None
        if not isinstance(text, str):
            raise IllegalActionError(f"command(text) needs text as a quoted string, got {call.text()}.")
        wanted = " ".join(text.split()).casefold()
        command = next((c for c in self._admissible if " ".join(c.split()).casefold() == wanted), None)
        if command is None:
            raise IllegalActionError(
                f"{text!r} is not an admissible command here; nothing happened. Admissible now: "
                f"{', '.join(self._admissible)}.")
        assert self._state is not None
        loaded = self._loaded()
        state, raw = self._state.step(loaded, command)
        self._set_state(state)
        observation = clean_output(raw) or "Nothing happens."
        if state.won:
            return Outcome(f"{observation}\nYou completed the task: {loaded.goal}.", reward=1.0, terminated=True,
                           reason="answered")
        if state.failed:
            return Outcome(f"{observation}\nThe task can no longer be completed: {loaded.goal}.", terminated=True,
                           reason="answered")
        return Outcome(observation)

    # ----------------------------------------------------------------- features
    def tool_schemas(self) -> list[dict[str, Any]]:
        """The one tool as a JSON-schema definition (:class:`envs.features.ToolSchemas`)."""
        return [function_tool(
            "command", "send one text command to the game; it must be one of the admissible commands the "
            "observation lists (go, open, close, take, put, insert, drop, unlock, lock, eat, examine, look, "
            "inventory with objects in reach). The episode ends with reward 1 when the task is done.",
            {"text": {"type": "string", "description": "an admissible command, e.g. 'open chest'"}})]

    @classmethod
    def evaluation_resets(cls, kwargs: dict[str, Any], n_seeds: int) -> list[tuple[int, dict[str, int]]]:
        """Every game of the set once: ``[(k, {"game": k}) for k in range(n_games)]`` (``n_seeds`` is ignored: the
        set is finite). The :class:`envs.features.EvaluationResets` feature.

        Raises:
            ValueError: on kwargs the constructor refuses.
        """
        return [(k, {"game": k}) for k in range(cls(**kwargs).n_games)]

    def winning_commands(self) -> list[str]:
        """TextWorld's winning policy from the current state, as game commands ([] when the episode is over or
        before reset). Privileged: it knows where every object is."""
        if self._state is None or self._done:
            return []
        return self._state.policy(self._loaded())

    def demo_action(self, rng: random.Random, skill: float = 0.0) -> str:
        """A demonstration action: with probability ``skill`` the next command of TextWorld's winning policy from
        the current state (:meth:`winning_commands`, re-planned after every command), else (or when there is no
        policy) a uniformly random admissible command. ``skill=1`` wins every game within ``quest_length`` turns.

        Raises:
            ValueError: if ``skill`` is outside [0, 1].
        """
        check_skill(skill)
        legal = self._legal_actions()
        if skill and rng.random() < skill:
            plan = self.winning_commands()
            if plan and plan[0] in self._admissible:
                return format_action("command", plan[0])
        return rng.choice(legal) if legal else format_action("command", "look")

    # ----------------------------------------------------------------- fork / snapshot / pickle
    def _fork_into(self, children: list[TextEnv]) -> None:
        """Children share the parent's emulator state (an immutable value) and get their own logic progression."""
        for child in children:
            assert isinstance(child, HouseholdEnv)
            if self._state is not None:
                progression = self._state.progression
                child._state = Progress(self._state.emulator, self._state.log, self._state.won, self._state.failed,
                                         None if progression is None else copy_progression(progression))
            child._admissible = list(self._admissible)

    def _task_state(self) -> dict[str, Any]:
        if self._state is None or self._game is None:
            return {}
        return {"game": self._game, "game_digest": self._loaded().digest,
                "emulator": encode_emulator_state(self._state.emulator), "logic_actions": list(self._state.log),
                "won": self._state.won, "failed": self._state.failed}

    def _load_task_state(self, state: dict[str, Any]) -> None:
        if not state:
            self._game, self._game_path, self._state, self._admissible = None, None, None, []
            return
        index = _int_in("snapshot game", state.get("game"), 0, self.n_games - 1)
        loaded = self._loaded(index)
        if state.get("game_digest") != loaded.digest:
            raise ValueError(f"the snapshot's game {index} (digest {state.get('game_digest')}) is not this "
                             f"machine's game {index} (digest {loaded.digest}): another textworld version or "
                             "generator made it")
        log = state.get("logic_actions")
        if not isinstance(log, list) or not all(isinstance(a, dict) for a in log):
            raise ValueError("malformed Household snapshot: logic_actions must be a list of objects")
        progress = Progress(decode_emulator_state(state.get("emulator") or {}, loaded), tuple(log),
                             bool(state.get("won")), bool(state.get("failed")), None)
        try:
            progress.logic(loaded)
        except Exception as exc:  # noqa: BLE001 - TextWorld raises assorted errors on actions that do not apply
            raise ValueError(f"malformed Household snapshot: its logic actions do not replay ({exc})") from None
        self._game, self._game_path = index, loaded.path
        self._set_state(progress)

    def __getstate__(self) -> dict[str, Any]:
        """Pickle and deepcopy support: the logic progression is left out and rebuilt from its action log, and the
        game's story file is found again in the unpickling process's cache (generated there when missing)."""
        state = super().__getstate__()
        state["_game_path"] = None
        if self._state is not None:
            s = self._state
            state["_state"] = Progress(s.emulator, s.log, s.won, s.failed, None)
        return state

    def close(self) -> None:
        """Drop this env's emulator and logic state (the process's pooled emulators stay: module docstring)."""
        self._state, self._admissible, self._game, self._game_path = None, [], None, None
        self._needs_reset = True
        super().close()
