"""Household's game sets (:mod:`envs.suite.household`, Games): the cache folder, TextWorld's generation of game
``k`` of a set, and its check on the emulator.

A :class:`GameSet` is the settings that determine a finite, deterministic set of games; game ``k`` is generated on
first use with TextWorld's generator seeded by :func:`game_seed` (a quest sampled backward from a final ``put`` /
``insert``, kept only when its walkthrough wins on the emulator), compiled in a temporary folder and renamed into
the cache (:func:`household_cache_dir`), its ``.json`` before its ``.z8``: concurrent processes never see half a game.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import warnings
from dataclasses import dataclass
from functools import lru_cache
from importlib.metadata import version as _package_version
from pathlib import Path
from typing import Any

from envs.suite.household_play import Progress, drop_emulator, load_game_uncached

#: Bumped whenever the generation recipe changes: part of the cache folder's name, so old games are never reused.
GENERATOR_VERSION = 1
SPLITS = ("train", "test")
#: Quest samples tried for one game before generation gives up (each with its own seed, in a fixed order).
GENERATION_ATTEMPTS = 16
_SPLIT_BASE = {"train": 0, "test": 1_000_003}


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
        loaded = load_game_uncached(str(story))
        state = Progress.start(loaded)
        for command in walkthrough:
            if state.won or state.failed or command not in state.admissible(loaded):
                return False
            state = state.step(loaded, command)[0]
        return state.won
    finally:
        drop_emulator(str(story))
