"""How a process plays Household's games (:mod:`envs.suite.household`): the pool of Jericho emulators, the loaded
games, and the game state a command turns into the next.

Each process keeps a small pool of emulators, one per story file (:data:`EMULATOR_POOL_SIZE`, least recently used
dropped; each is a private copy of Jericho's ``libfrotz``), and :func:`run_command` loads a state into the game's
pooled emulator, sends a command and reads the new state back, under that emulator's lock. A loaded game
(:class:`LoadedGame`, :data:`LOADED_GAMES` cached per process) holds TextWorld's objects, the goal and intro texts
and the start state. :class:`Progress` is one game state: the emulator's (an immutable value) and TextWorld's
logic progression (facts, admissible commands, quest tracking), rebuilt from the log of logic actions when absent.
"""

from __future__ import annotations

import hashlib
import re
import threading
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

#: Emulators kept open per process (one per game file, least recently used dropped first).
EMULATOR_POOL_SIZE = 8
#: Loaded games (TextWorld ``Game`` objects, intro text, initial emulator state) kept per process.
LOADED_GAMES = 64
_WON_MARK = "*** The End ***"
_LOST_MARK = "*** You lost! ***"
_GOAL_FORMS = [(re.compile(r"^put (.+) on (.+)$"), "put the {} on the {}"),
               (re.compile(r"^insert (.+) into (.+)$"), "put the {} in the {}")]

# ------------------------------------------------------------------------------------------ emulators
_pool: OrderedDict[str, tuple[Any, threading.Lock]] = OrderedDict()
_pool_lock = threading.Lock()


def _emulator(path: str) -> tuple[Any, threading.Lock]:
    """The pooled Jericho ``FrotzEnv`` of story file ``path`` and its lock (opened on first use; module docstring)."""
    with _pool_lock:
        entry = _pool.get(path)
        if entry is not None:
            _pool.move_to_end(path)
            return entry
    import jericho

    with warnings.catch_warnings():  # TextWorld's games are not in Jericho's list of "fully supported" games
        warnings.simplefilter("ignore")
        emulator = jericho.FrotzEnv(path)
    with _pool_lock:
        entry = _pool.setdefault(path, (emulator, threading.Lock()))
        _pool.move_to_end(path)
        while len(_pool) > EMULATOR_POOL_SIZE:
            _pool.popitem(last=False)  # freed (libfrotz shut down and unloaded) once no step holds it
    return entry


def drop_emulator(path: str) -> None:
    """Drop the pooled emulator of story file ``path`` (freed once no step holds it)."""
    with _pool_lock:
        _pool.pop(path, None)


def release_emulators() -> None:
    """Close every pooled emulator of this process (envs stay usable: the next step reopens what it needs)."""
    with _pool_lock:
        _pool.clear()


EmulatorState = tuple[Any, ...]  # Jericho's (ram, stack, pc, sp, fp, frame_count, opcode, rng, narrative)


def run_command(path: str, state: EmulatorState, command: str) -> tuple[str, EmulatorState]:
    """Send ``command`` to the pooled emulator of ``path`` loaded with ``state``; (raw output, new state)."""
    emulator, lock = _emulator(path)
    with lock:
        emulator.set_state(state)
        raw = emulator.step(command)[0]
        return raw, emulator.get_state()


# ------------------------------------------------------------------------------------------ loaded games
@dataclass(frozen=True)
class LoadedGame:
    """A game as a process uses it: TextWorld's objects, its texts and its start state."""

    path: str  # the .z8 story file
    game: Any  # textworld.generator.game.Game
    inform7: Any  # textworld.generator.inform7.Inform7Game
    digest: str  # BLAKE2b of the .json (16 hex digits): the same game on every machine
    goal: str  # "put the whisk on the stand"
    intro: str  # the first room's description
    start: EmulatorState  # after reset and ``tw-trace-actions``
    progression: Any  # textworld GameProgression at the start (copied per episode)
    story_size: int


_GRAMMARS_PATH = re.compile(rb'"text_grammars_path": "(?:[^"\\]|\\.)*"')


def portable_game_json(data: bytes) -> bytes:
    """A game's TextWorld ``.json`` (bytes) with its one install-dependent value blanked: ``text_grammars_path``, the
    absolute path of TextWorld's grammar folder in the venv that generated the game. Game digests (a snapshot's
    ``game_digest``) are taken over this form, so the same game has the same digest on every install."""
    return _GRAMMARS_PATH.sub(b'"text_grammars_path": ""', data)


def load_game_uncached(path: str) -> LoadedGame:
    from textworld.generator.game import Game, GameProgression
    from textworld.generator.inform7 import Inform7Game

    json_path = Path(path).with_suffix(".json")
    data = json_path.read_bytes()
    game = Game.load(str(json_path))
    inform7 = Inform7Game(game)
    emulator, lock = _emulator(path)
    with lock:
        intro = emulator.reset()[0]
        emulator.step("tw-trace-actions")  # TextWorld's tracing of Inform 7 actions, read by Progress.step
        start = emulator.get_state()
    last = game.quests[0].win_events[0].actions[-1]
    command = inform7.gen_commands_from_actions([last])[0]
    goal = command
    for form, text in _GOAL_FORMS:
        match = form.match(command)
        if match:
            goal = text.format(*match.groups())
    where = intro.find(game.objective)
    room = intro[where + len(game.objective):] if where >= 0 else intro[max(intro.find("-= "), 0):]
    return LoadedGame(path=path, game=game, inform7=inform7,
                      digest=hashlib.blake2b(portable_game_json(data), digest_size=8).hexdigest(),
                      goal=goal, intro=clean_output(room), start=start, progression=GameProgression(game),
                      story_size=Path(path).stat().st_size)


@lru_cache(maxsize=LOADED_GAMES)
def load_game(path: str) -> LoadedGame:
    """The loaded game of story file ``path`` (cached: :data:`LOADED_GAMES` per process)."""
    return load_game_uncached(path)


def clean_output(raw: str) -> str:
    """Game output as an observation: Inform 7 trace tags, the prompt and status line dropped, blank runs squeezed."""
    from textworld.envs.wrappers.tw_inform7 import _detect_i7_events_debug_tags

    text = _detect_i7_events_debug_tags(raw)[1]
    for mark in (_WON_MARK, _LOST_MARK):
        if mark in text:
            text = text[:text.index(mark)]
    cut = text.rfind("\n>")
    if cut >= 0:
        text = text[:cut]
    return re.sub(r"\n\s*\n+", "\n\n", text).strip()


# ------------------------------------------------------------------------------------------ episode state
@dataclass(frozen=True)
class Progress:
    """One game state: the emulator's and TextWorld's logic. A step returns a new one.

    ``emulator`` and ``log`` are values (never changed in place: forks share them). ``progression`` (TextWorld's
    ``GameProgression``: facts, admissible actions, quest tracking) belongs to one env (a fork copies it, a step hands
    it on updated); it is a cache rebuilt from ``log`` (the serialized logic actions taken, in order) when None: after
    an unpickle or a restore."""

    emulator: EmulatorState
    log: tuple[dict[str, Any], ...]
    won: bool
    failed: bool
    progression: Any

    @classmethod
    def start(cls, loaded: LoadedGame) -> "Progress":
        return cls(loaded.start, (), False, False, copy_progression(loaded.progression))

    def logic(self, loaded: LoadedGame) -> Any:
        """The logic progression (rebuilt from the log by replaying its actions when this state holds none)."""
        if self.progression is not None:
            return self.progression
        from textworld.logic import Action

        progression = copy_progression(loaded.progression)
        for data in self.log:
            progression.update(Action.deserialize(data))
        object.__setattr__(self, "progression", progression)  # a cache of a value: still the same state
        return progression

    def admissible(self, loaded: LoadedGame) -> list[str]:
        """TextWorld's admissible commands now, sorted, without duplicates."""
        return sorted(set(loaded.inform7.gen_commands_from_actions(self.logic(loaded).valid_actions)))

    def step(self, loaded: LoadedGame, command: str) -> tuple["Progress", str]:
        """The state after ``command`` and the game's raw output. Updates this state's logic progression in place
        and hands it to the new state: a state that has stepped is spent (its env holds the new one; forks copy)."""
        from textworld.envs.wrappers.tw_inform7 import _detect_i7_events_debug_tags

        raw, emulator = run_command(loaded.path, self.emulator, command)
        logic = self.logic(loaded)
        log = list(self.log)
        for event in _detect_i7_events_debug_tags(raw)[0]:
            action = loaded.inform7.detect_action(event, logic.valid_actions)
            if action is not None:
                logic.update(action)
                log.append(action.serialize())
        won = logic.completed or _WON_MARK in raw
        failed = not won and (logic.failed or _LOST_MARK in raw)
        return Progress(emulator, tuple(log), won, failed, logic), raw

    def policy(self, loaded: LoadedGame) -> list[str]:
        """The commands of TextWorld's winning policy from this state ([] when none: won or failed)."""
        plan = self.logic(loaded).winning_policy
        return list(loaded.inform7.gen_commands_from_actions(plan)) if plan else []



def copy_progression(progression: Any) -> Any:
    """An independent copy of a TextWorld ``GameProgression`` (world facts, admissible actions, quest trackers).

    TextWorld's own ``GameProgression.copy`` first builds a progression of the game's start state (recomputing its
    admissible actions: about 1.2 ms here) and then overwrites it; this copies the same members without that detour
    (about 0.2 ms), and falls back to ``copy()`` when the members are not those of textworld 1.7."""
    members = ("game", "state", "_valid_actions", "quest_progressions")
    if not all(hasattr(progression, m) for m in members):
        return progression.copy()
    twin = object.__new__(type(progression))
    twin.game = progression.game
    twin.state = progression.state.copy()
    twin._valid_actions = progression._valid_actions  # replaced, never changed in place, by update()
    twin.quest_progressions = [quest.copy() for quest in progression.quest_progressions]
    return twin
