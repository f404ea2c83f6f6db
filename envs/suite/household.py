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
knows where things are, like ALFWorld's expert), else a uniformly random admissible command.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import os
import random
import re
import shutil
import tempfile
import threading
import warnings
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from importlib.metadata import version as _package_version
from pathlib import Path
from typing import Any

import numpy as np

from envs.actions import ActionParseError, ToolCall, bind_arguments, format_action
from envs.core import IllegalActionError, Outcome, TextEnv
from envs.tool_calls import function_tool

#: Bumped whenever the generation recipe changes: part of the cache folder's name, so old games are never reused.
GENERATOR_VERSION = 1
MAX_ROOMS = 8
MAX_OBJECTS = 20
MAX_QUEST_LENGTH = 6
MAX_GAMES = 256
MAX_TURNS = 200
SPLITS = ("train", "test")
#: Emulators kept open per process (one per game file, least recently used dropped first).
EMULATOR_POOL_SIZE = 8
#: Quest samples tried for one game before generation gives up (each with its own seed, in a fixed order).
GENERATION_ATTEMPTS = 16
#: Loaded games (TextWorld ``Game`` objects, intro text, initial emulator state) kept per process.
LOADED_GAMES = 64

_STACK_BYTES = 2048  # Jericho's Z-machine stack (1024 words), fixed by libfrotz
_NARRATIVE_MAX = 8191  # libfrotz copies the last output into a char[8192]
_SPLIT_BASE = {"train": 0, "test": 1_000_003}
_WON_MARK = "*** The End ***"
_LOST_MARK = "*** You lost! ***"
_GOAL_FORMS = [(re.compile(r"^put (.+) on (.+)$"), "put the {} on the {}"),
               (re.compile(r"^insert (.+) into (.+)$"), "put the {} in the {}")]


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


def household_cache_dir() -> Path:
    """The folder the generated games live in: ``$FORKYARD_CACHE/household``, else
    ``$XDG_CACHE_HOME/forkyard/household`` (default ``~/.cache/forkyard/household``)."""
    root = os.environ.get("FORKYARD_CACHE")
    if root:
        return Path(root) / "household"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "forkyard" / "household"


@lru_cache(maxsize=1)
def _textworld_version() -> str:
    return _package_version("textworld")


def game_seed(split: str, index: int, attempt: int = 0) -> int:
    """TextWorld's generator seed (``GameOptions.seeds``, an int < 2**31) of game ``index`` of ``split``, at the
    ``attempt``-th quest sample (attempts run 0, 1, ... until one gives a game that is kept)."""
    return _SPLIT_BASE[split] + index * GENERATION_ATTEMPTS + attempt


# ------------------------------------------------------------------------------------------ the game set
@dataclass(frozen=True)
class GameSet:
    """The settings that determine a set of generated games; game ``k`` of the set is the same everywhere.

    Attributes:
        rooms: rooms of the house (TextWorld's ``nb_rooms``).
        objects: things in the house (``nb_objects``; containers and supporters included; the quest's own count).
        quest_length: actions of the winning walkthrough (``quest_length``), the last a ``put`` or ``insert``.
        split: ``"train"`` or ``"test"`` (disjoint generator seeds, :func:`game_seed`).
    """

    rooms: int
    objects: int
    quest_length: int
    split: str

    @property
    def folder(self) -> Path:
        """Where this set's games are cached (named by the textworld version and :data:`GENERATOR_VERSION`)."""
        name = (f"tw{_textworld_version()}-gen{GENERATOR_VERSION}-r{self.rooms}-o{self.objects}"
                f"-q{self.quest_length}-{self.split}")
        return household_cache_dir() / name

    def path(self, index: int) -> Path:
        """The ``.z8`` story file of game ``index`` (its TextWorld ``.json`` lies beside it)."""
        return self.folder / f"game-{index:03d}.z8"

    def ensure(self, index: int) -> Path:
        """The story file of game ``index``, generated first when the cache lacks it (2 to 4 s on a busy 2-core CPU).

        Raises:
            RuntimeError: no quest of these settings could be generated in :data:`GENERATION_ATTEMPTS` tries.
        """
        path = self.path(index)
        if not path.is_file():
            with _generation_lock(str(path)):  # one generation per game in this process (others may race: harmless)
                if not path.is_file():
                    _generate(self, index, path)
        return path


_generation_locks: dict[str, threading.Lock] = {}
_generation_guard = threading.Lock()


def _generation_lock(path: str) -> threading.Lock:
    with _generation_guard:
        return _generation_locks.setdefault(path, threading.Lock())


def _make_game(gs: GameSet, seed: int) -> Any:
    """A TextWorld ``Game`` of ``gs``'s settings from ``seed`` (not compiled), or None when its quest sampler finds
    no quest of that length. TextWorld's ``make_game`` with the final quest action restricted to ``put``/``insert``."""
    from textworld import GameOptions
    from textworld.generator import make_grammar, make_world
    from textworld.generator.chaining import QuestGenerationError, sample_quest
    from textworld.generator.game import Event, Game, Quest

    options = GameOptions()
    options.seeds = seed
    options.nb_rooms, options.nb_objects = gs.rooms, gs.objects
    options.quest_length, options.quest_breadth = gs.quest_length, 1
    options.grammar.only_last_action = True  # the objective names the goal, not the walkthrough
    rngs = options.rngs
    world = make_world(options.nb_rooms, nb_objects=0, rngs=rngs)
    rules = options.kb.rules
    final = [rule for name, rule in rules.items() if name in ("put", "insert")]
    before = rules.get_matching(".*", exclude=["examine.*", "look.*", "inventory.*", "eat.*", "drop.*", "close.*",
                                               "lock.*", "put.*", "insert.*"])
    options.chaining.rules_per_depth = [final] + [before] * (gs.quest_length - 1)
    options.chaining.backward = True
    options.chaining.create_variables = True
    options.chaining.rng = rngs["quest"]
    options.chaining.restricted_types = {"r", "d"}
    try:
        chain = sample_quest(world.state, options.chaining)
    except QuestGenerationError:
        return None
    world.state = chain.initial_state  # backward chaining may have added the quest's objects
    quests = [Quest(win_events=[Event(chain.actions)])]
    missing = options.nb_objects - sum(1 for e in world.entities if e.type not in {"r", "d", "I", "P"})
    if missing > 0:
        world.populate(missing, rng=rngs["objects"])
    game = Game(world, make_grammar(options.grammar, rng=rngs["grammar"]), quests)
    game.metadata["uuid"] = options.uuid
    return game


def _generate(gs: GameSet, index: int, path: Path) -> None:
    """Generate game ``index`` of ``gs`` into ``path`` (and its ``.json``), atomically (module docstring)."""
    from textworld import GameOptions
    from textworld.generator import compile_game

    gs.folder.mkdir(parents=True, exist_ok=True)
    for attempt in range(GENERATION_ATTEMPTS):
        game = _make_game(gs, game_seed(gs.split, index, attempt))
        if game is None or len(game.metadata.get("walkthrough") or ()) != gs.quest_length:
            continue
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{path.stem}-", dir=gs.folder))
        try:
            options = GameOptions()
            options.path = str(tmp / "game.z8")
            options.force_recompile = True
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                story = Path(compile_game(game, options))
            if not _walkthrough_wins(story, list(game.metadata["walkthrough"])):
                continue
            os.replace(story.with_suffix(".json"), path.with_suffix(".json"))
            os.replace(story, path)
            return
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    raise RuntimeError(
        f"TextWorld generated no household game with rooms={gs.rooms}, objects={gs.objects}, "
        f"quest_length={gs.quest_length} ({gs.split} game {index}, {GENERATION_ATTEMPTS} tries); "
        "try fewer quest steps or more rooms and objects")


def _walkthrough_wins(story: Path, walkthrough: list[str]) -> bool:
    """Whether ``walkthrough`` wins the freshly compiled game ``story`` on the emulator and in TextWorld's logic."""
    try:
        loaded = _load_uncached(str(story))
        state = _Progress.start(loaded)
        for command in walkthrough:
            if state.won or state.failed or command not in state.admissible(loaded):
                return False
            state = state.step(loaded, command)[0]
        return state.won
    finally:
        _drop_emulator(str(story))


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


def _drop_emulator(path: str) -> None:
    with _pool_lock:
        _pool.pop(path, None)


def release_emulators() -> None:
    """Close every pooled emulator of this process (envs stay usable: the next step reopens what it needs)."""
    with _pool_lock:
        _pool.clear()


EmulatorState = tuple[Any, ...]  # Jericho's (ram, stack, pc, sp, fp, frame_count, opcode, rng, narrative)


def _run(path: str, state: EmulatorState, command: str) -> tuple[str, EmulatorState]:
    """Send ``command`` to the pooled emulator of ``path`` loaded with ``state``; (raw output, new state)."""
    emulator, lock = _emulator(path)
    with lock:
        emulator.set_state(state)
        raw = emulator.step(command)[0]
        return raw, emulator.get_state()


# ------------------------------------------------------------------------------------------ loaded games
@dataclass(frozen=True)
class _Loaded:
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


def _load_uncached(path: str) -> _Loaded:
    from textworld.generator.game import Game, GameProgression
    from textworld.generator.inform7 import Inform7Game

    json_path = Path(path).with_suffix(".json")
    data = json_path.read_bytes()
    game = Game.load(str(json_path))
    inform7 = Inform7Game(game)
    emulator, lock = _emulator(path)
    with lock:
        intro = emulator.reset()[0]
        emulator.step("tw-trace-actions")  # TextWorld's tracing of Inform 7 actions, read by _Progress.step
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
    return _Loaded(path=path, game=game, inform7=inform7, digest=hashlib.blake2b(data, digest_size=8).hexdigest(),
                   goal=goal, intro=_clean(room), start=start, progression=GameProgression(game),
                   story_size=Path(path).stat().st_size)


@lru_cache(maxsize=LOADED_GAMES)
def _load(path: str) -> _Loaded:
    return _load_uncached(path)


def _clean(raw: str) -> str:
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
class _Progress:
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
    def start(cls, loaded: _Loaded) -> "_Progress":
        return cls(loaded.start, (), False, False, copy_progression(loaded.progression))

    def logic(self, loaded: _Loaded) -> Any:
        """The logic progression (rebuilt from the log by replaying its actions when this state holds none)."""
        if self.progression is not None:
            return self.progression
        from textworld.logic import Action

        progression = copy_progression(loaded.progression)
        for data in self.log:
            progression.update(Action.deserialize(data))
        object.__setattr__(self, "progression", progression)  # a cache of a value: still the same state
        return progression

    def admissible(self, loaded: _Loaded) -> list[str]:
        """TextWorld's admissible commands now, sorted, without duplicates."""
        return sorted(set(loaded.inform7.gen_commands_from_actions(self.logic(loaded).valid_actions)))

    def step(self, loaded: _Loaded, command: str) -> tuple["_Progress", str]:
        """The state after ``command`` and the game's raw output. Updates this state's logic progression in place
        and hands it to the new state: a state that has stepped is spent (its env holds the new one; forks copy)."""
        from textworld.envs.wrappers.tw_inform7 import _detect_i7_events_debug_tags

        raw, emulator = _run(loaded.path, self.emulator, command)
        logic = self.logic(loaded)
        log = list(self.log)
        for event in _detect_i7_events_debug_tags(raw)[0]:
            action = loaded.inform7.detect_action(event, logic.valid_actions)
            if action is not None:
                logic.update(action)
                log.append(action.serialize())
        won = logic.completed or _WON_MARK in raw
        failed = not won and (logic.failed or _LOST_MARK in raw)
        return _Progress(emulator, tuple(log), won, failed, logic), raw

    def policy(self, loaded: _Loaded) -> list[str]:
        """The commands of TextWorld's winning policy from this state ([] when none: won or failed)."""
        plan = self.logic(loaded).winning_policy
        return list(loaded.inform7.gen_commands_from_actions(plan)) if plan else []


def _inflate(text: Any, limit: int) -> bytes:
    """base64 text of zlib data, inflated to at most ``limit`` bytes (ValueError past it: no decompression bomb)."""
    if not isinstance(text, str):
        raise ValueError("expected base64 text")
    inflater = zlib.decompressobj()
    out = inflater.decompress(base64.b64decode(text, validate=True), limit + 1)
    if len(out) > limit or inflater.unconsumed_tail:
        raise ValueError(f"more than {limit} bytes")
    return out


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


def encode_emulator_state(state: EmulatorState) -> dict[str, Any]:
    """Jericho's emulator state as plain JSON data: memory and stack zlib-compressed and base64-encoded, the last
    output base64-encoded, the rest ints."""
    ram, stack, pc, sp, fp, frames, opcode, rng, narrative = state
    pack = lambda b: base64.b64encode(zlib.compress(bytes(b), 6)).decode("ascii")  # noqa: E731
    return {"ram": pack(np.asarray(ram, dtype=np.uint8).tobytes()),
            "stack": pack(np.asarray(stack, dtype=np.uint8).tobytes()),
            "pc": int(pc), "sp": int(sp), "fp": int(fp), "frame_count": int(frames), "opcode": int(opcode),
            "rng": [int(x) for x in rng], "narrative": base64.b64encode(bytes(narrative)).decode("ascii")}


def decode_emulator_state(data: dict[str, Any], loaded: _Loaded) -> EmulatorState:
    """Inverse of :func:`encode_emulator_state`, checked against the game (sizes and pointer ranges, so that a
    malformed snapshot cannot make the C emulator read or write out of bounds).

    Raises:
        ValueError: on malformed data.
    """
    try:
        ram = np.frombuffer(_inflate(data["ram"], len(loaded.start[0])), dtype=np.uint8).copy()
        stack = np.frombuffer(_inflate(data["stack"], _STACK_BYTES), dtype=np.uint8).copy()
        narrative = base64.b64decode(data["narrative"], validate=True)
        ints = {k: data[k] for k in ("pc", "sp", "fp", "frame_count", "opcode")}
        rng = data["rng"]
    except (KeyError, TypeError, ValueError, zlib.error) as exc:
        raise ValueError(f"malformed Household emulator state: {exc}") from None
    if not all(type(v) is int for v in ints.values()) or not (
            isinstance(rng, list) and len(rng) == 3 and all(type(v) is int for v in rng)):
        raise ValueError("malformed Household emulator state: pc, sp, fp, frame_count, opcode and rng must be ints")
    if len(ram) != len(loaded.start[0]) or len(stack) != _STACK_BYTES:
        raise ValueError(f"malformed Household emulator state: memory of {len(ram)} bytes and stack of {len(stack)} "
                         f"(the game has {len(loaded.start[0])} and {_STACK_BYTES})")
    words = _STACK_BYTES // 2
    if not (0 <= ints["pc"] < loaded.story_size and 0 <= ints["sp"] <= words and 0 <= ints["fp"] <= words
            and 0 <= ints["frame_count"] < 1 << 16 and 0 <= ints["opcode"] < 1 << 16
            and all(-(1 << 31) <= v < 1 << 31 for v in rng)):
        raise ValueError("malformed Household emulator state: a pointer or counter out of range")
    if len(narrative) > _NARRATIVE_MAX or b"\x00" in narrative:
        raise ValueError("malformed Household emulator state: the last output is too long or holds a NUL")
    return (ram, stack, ints["pc"], ints["sp"], ints["fp"], ints["frame_count"], ints["opcode"], tuple(rng),
            narrative)


# ------------------------------------------------------------------------------------------ the env
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
        self._state: _Progress | None = None
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
        self._set_state(_Progress.start(loaded))
        return f"Your task is to: {loaded.goal}.\n\n{loaded.intro}\n\n{self._prompt()}"

    def _loaded(self, index: int | None = None) -> _Loaded:
        """The loaded game ``index`` (default: this episode's), generated first when the cache lacks it."""
        if index is None:
            if self._game_path is not None:
                return _load(self._game_path)
            if self._game is None:
                raise RuntimeError("no game yet: call reset() first")
            index = self._game
        return _load(str(self.games.ensure(index)))

    def _set_state(self, state: _Progress) -> None:
        self._state = state
        self._admissible = state.admissible(self._loaded()) if not (state.won or state.failed) else []

    def _prompt(self) -> str:
        return (f"Turn {self._turn + 1} of {self.max_turns}. Admissible commands: {', '.join(self._admissible)}.\n"
                "Call command(text) with one of them as text.")

    def _legal_actions(self) -> list[str]:
        return sorted(format_action("command", c) for c in self._admissible)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
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
        observation = _clean(raw) or "Nothing happens."
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
        if not 0.0 <= skill <= 1.0:
            raise ValueError(f"skill must be in [0, 1], got {skill!r}")
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
                child._state = _Progress(self._state.emulator, self._state.log, self._state.won, self._state.failed,
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
        progress = _Progress(decode_emulator_state(state.get("emulator") or {}, loaded), tuple(log),
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
            state["_state"] = _Progress(s.emulator, s.log, s.won, s.failed, None)
        return state

    def close(self) -> None:
        """Drop this env's emulator and logic state (the process's pooled emulators stay: module docstring)."""
        self._state, self._admissible, self._game, self._game_path = None, [], None, None
        self._needs_reset = True
        super().close()
