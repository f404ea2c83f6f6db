"""The suite: the field's standard multi-turn benchmarks as forkable, offline forkyard envs (docs/envs.md).

Each entry of :data:`SUITE` is ``(env_id, "module:Class", default kwargs)``; ``import envs`` registers every one
with :func:`envs.register_env` (so ``gymnasium.make``, the server and the trainers' adapters see them like the
built-in envs). Registration imports nothing of an env's module: an env whose optional package is missing
(``pip install 'forkyard[suite]'``) fails only when it is made, with an ImportError that names the package.
Data only here, so that this package never imports :mod:`envs` (no import cycle).
"""

from __future__ import annotations

#: (env id, entry point, default kwargs) of every env of the suite, in the order docs/envs.md lists them.
SUITE: list[tuple[str, str, dict[str, object]]] = [
    # -- suite registrations: one line per env (keep this marker line; add yours below it) --
    ("forkyard/Wordle-v0", "envs.suite.wordle:WordleEnv", {"max_turns": 6, "word_length": 5}),
    ("forkyard/Household-v0", "envs.suite.household:HouseholdEnv", {"max_turns": 20, "quest_length": 3, "n_games": 16}),
    ("forkyard/TicketAPI-v0", "envs.suite.ticket_api:TicketAPIEnv", {"max_turns": 12}),
    ("forkyard/TextToSQL-v0", "envs.suite.text_to_sql:TextToSQLEnv", {"max_turns": 8}),
    ("forkyard/CodeRepair-v0", "envs.suite.code_repair:CodeRepairEnv", {"max_turns": 10, "functions": 4}),
    ("forkyard/Gym-v0", "envs.gym_adapter:GymTextEnv", {"gym_id": "FrozenLake-v1"}),
    ("forkyard/FrozenLake-v0", "envs.suite.frozenlake:FrozenLakeEnv", {"size": 4, "p": 0.8, "is_slippery": True}),
    ("forkyard/Sokoban-v0", "envs.suite.sokoban:SokobanEnv", {"max_turns": 10, "dim": 6, "num_boxes": 1}),
    ("forkyard/Bandit-v0", "envs.suite.bandit:BanditEnv", {"pulls": 1}),
    ("forkyard/Countdown-v0", "envs.suite.countdown:CountdownEnv", {"mode": "single", "num_count": 4}),
]
