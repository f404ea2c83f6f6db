"""TextToSQL-v0: generated databases and questions, the SQL tools in the sandbox (local and docker), fork and
snapshot with the database, seeded determinism, settings, the demonstrator's success rates."""

import base64
import io
import json
import random
import sqlite3
import tarfile
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import envs  # noqa: F401 - registers the ids
from envs import check_fork_contract
from envs.suite.sql_tasks import DOMAINS, KINDS, build_database, draw_task, normalize_rows, same_result
from envs.suite.text_to_sql import TextToSQLEnv
from sandbox_server.embedded import shared_provider
from tests.docker_support import require_docker

ID = "forkyard/TextToSQL-v0"


def make(backend="local", **kwargs):
    if backend == "docker":
        require_docker()
    return gym.make(ID, backend=backend, **kwargs).unwrapped


@pytest.fixture(scope="module")
def env():
    """One env on the local backend, shared by the tests that reset it (each closes nothing of it)."""
    e = make()
    yield e
    e.close()
    assert shared_provider("local").list() == []  # every fork and restore of the module released its sandbox


def play(env, seed, skill, rng):
    env.reset(seed=seed)
    reward, info = 0.0, {}
    while not env.done:
        _, reward, _, _, info = env.step(env.demo_action(rng, skill))
    return reward, info


def db_of(env):
    """The bytes of /scratch/db.sqlite in the env's sandbox, read from an export (a tar of the writable areas)."""
    tar = tarfile.open(fileobj=io.BytesIO(env._provider.export(env._sandbox)))
    return tar.extractfile("scratch/db.sqlite").read()


# ---------------------------------------------------------------------------------------------- the generator
def test_every_kind_and_domain_makes_a_checked_question():
    for domain in DOMAINS:
        for kind in KINDS:
            task, db = draw_task(np.random.default_rng(7), (domain,), (kind,), 12, 4)
            assert db[:16] == b"SQLite format 3\x00" and task["kind"] == kind and task["domain"] == domain
            assert task["gold"] in task["candidates"] and 2 <= len(task["candidates"]) <= 4
            assert task["gold_rows"] and set(task["relevant"]) <= set(task["tables"])
            assert len(task["tables"]) == 4
            json.dumps(task)  # plain JSON: it lives in snapshots
    for tables in (3, 4):
        conn = build_database(np.random.default_rng(tables), DOMAINS["school"], 5, tables)
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        assert len(names) == tables and conn.execute("PRAGMA foreign_key_check").fetchall() == []
        assert len(conn.execute("PRAGMA foreign_key_list(enrollments)").fetchall()) == 2
        assert len(conn.execute("PRAGMA foreign_key_list(courses)").fetchall()) == (tables == 4)
        conn.close()


def test_near_misses_give_other_results_and_scoring_normalises():
    for seed in range(40):
        task, db = draw_task(np.random.default_rng(seed), tuple(DOMAINS), KINDS, 8, 4)
        mem = sqlite3.connect(":memory:")  # the generator's own check, again: on the host, our queries only
        mem.deserialize(db)
        results = [mem.execute(c).fetchall() for c in task["candidates"]]
        mem.close()
        right = [same_result([list(r) for r in res], task["gold_rows"], task["ordered"]) for res in results]
        assert right.count(True) == 1 and right[task["candidates"].index(task["gold"])]
    assert same_result([[3]], normalize_rows([[3.0]], False), False)
    assert same_result([["b"], ["a"], ["a"]], normalize_rows([["a"], ["a"], ["b"]], False), False)
    assert not same_result([["a"], ["b"]], normalize_rows([["a"], ["a"], ["b"]], False), False)  # a multiset
    assert not same_result([["b"], ["a"]], normalize_rows([["a"], ["b"]], True), True)  # order counts here
    assert not same_result([["a", 1]], normalize_rows([["a"]], False), False)  # column counts count
    assert same_result([[1 / 3]], normalize_rows([[0.3333333333334]], False), False)


# ---------------------------------------------------------------------------------------------- the env
def test_check_env_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        e = make()
        try:
            check_env(e)
        finally:
            e.close()


@pytest.mark.parametrize("kwargs", [{"max_turns": 3},
                                    {"tables": 3, "rows": 5, "domains": ["shop"], "kinds": ["top_k"], "max_turns": 2}])
def test_fork_contract(kwargs):
    """The whole contract (envs.checks) for two settings; short turn budgets keep the sandbox calls few."""
    e = make(**kwargs)
    try:
        check_fork_contract(e, seed=11)
    finally:
        e.close()


def test_seeded_resets_are_deterministic_and_differ_by_seed(env):
    other = make()
    try:
        seen = set()
        for seed in range(6):
            obs, info = env.reset(seed=seed)
            assert (obs, info) == other.reset(seed=seed)
            assert env._task == other._task and db_of(env) == db_of(other)  # the same database, byte for byte
            seen.add(obs)
            assert env.observation_space.contains(obs)
        assert len(seen) == 6
        first = env.step("list_tables()")[0]
        assert first == other.step("list_tables()")[0]
    finally:
        other.close()


def test_tool_schemas_keywords_and_positional_calls(env):
    names = [t["function"]["name"] for t in env.tool_schemas()]
    assert names == ["list_tables", "describe", "query", "answer"]
    params = {t["function"]["name"]: list(t["function"]["parameters"]["properties"]) for t in env.tool_schemas()}
    assert params == {"list_tables": [], "describe": ["table"], "query": ["sql"], "answer": ["sql"]}
    env.reset(seed=4)
    table = env._task["tables"][0]
    kw = env.step(f"describe(table={table!r})")
    pos = env.fork(1)[0]
    try:
        # a keyword call runs as its canonical action (field case S62: envs.action_input.read_action)
        assert kw[0].startswith(f"[turn 1] describe({table!r})") and "CREATE TABLE" in kw[0]
        q = env.step(f"query(sql={'SELECT COUNT(*) FROM ' + table!r})")
        assert "(1 row)" in q[0] and not q[4]["invalid_action"]
        obs, r, te, tr, info = env.step(f"answer(sql={env._task['gold']!r})")
        assert (r, te, tr, info["correct"], info["termination_reason"]) == (1.0, True, False, True, "answered")
        assert "CREATE TABLE" in pos.step(f"describe({table!r})")[0]  # the fork's own sandbox answers too
    finally:
        pos.close()


def test_illegal_and_hostile_actions_are_explained_and_the_episode_goes_on(env):
    env.reset(seed=5)
    before = db_of(env)
    for action, words in [("drop_table('x')", "unknown tool"), ("describe(3)", "non-empty quoted string"),
                          ("query()", "non-empty quoted string"), ("answer('')", "non-empty quoted string"),
                          ("query('SELECT 1', 'x')", "at most 1"), (f"query(sql={'x' * 2000!r})", "refused")]:
        obs, r, te, tr, info = env.step(action)
        assert info["invalid_action"] and r == 0.0 and not te and words in obs, (action, obs)
        if tr:  # the turn budget ran out: start again
            env.reset(seed=5)
    env.reset(seed=5)
    for sql, words in [(f"DROP TABLE {env._task['tables'][0]}", "refused"),
                       ("ATTACH DATABASE '/tmp/x.db' AS x", "ATTACH"), ("PRAGMA writable_schema = 1", "PRAGMA"),
                       ("SELECT nope FROM nowhere", "SQL error")]:
        obs, r, te, tr, info = env.step(f"query({sql!r})")
        assert not info["invalid_action"] and not te and not tr and words in obs, (sql, obs)
    assert db_of(env) == before
    # a refused answer scores 0 and ends the episode
    obs, r, te, tr, info = env.step(f"answer({'DELETE FROM ' + env._task['tables'][0]!r})")
    assert (r, te, info["correct"]) == (0.0, True, False) and "refused" in obs


def test_settings_are_validated():
    for kwargs, words in [({"max_turns": 0}, "max_turns"), ({"max_turns": True}, "max_turns"),
                          ({"rows": 3}, "rows"), ({"rows": 201}, "rows"), ({"rows": "12"}, "rows"),
                          ({"tables": 2}, "tables"), ({"domains": "shop"}, "domains"),
                          ({"domains": ["mall"]}, "unknown domains"), ({"kinds": []}, "kinds"),
                          ({"kinds": ["nope"]}, "unknown kinds"), ({"tables": 3, "kinds": ["count_3way"]}, "tables=4"),
                          ({"per_turn_timeout_s": 0}, "per_turn_timeout_s"),
                          ({"per_turn_timeout_s": 61}, "per_turn_timeout_s"),
                          ({"continue_on_timeout": 1}, "continue_on_timeout"), ({"backend": 3}, "backend")]:
        with pytest.raises(ValueError, match=words):
            TextToSQLEnv(**kwargs)
    with pytest.raises(ValueError, match="reset options"):
        TextToSQLEnv().reset(seed=0, options={"x": 1})


def test_demonstrator_success_at_skill_1_and_0(env):
    """Skill 1 answers every question right (its longest script is 6 turns: list, 3 describes, query, answer);
    skill 0 is the random menu: 0.15-0.2 right over 60-100 seeds (about 13 actions, 2-4 answers, one right)."""
    rng = random.Random(0)
    assert [play(env, seed, 1.0, rng)[0] for seed in range(12)] == [1.0] * 12
    short = make(max_turns=2)
    try:  # with 2 turns the script queries the gold query, then answers with it
        assert [play(short, seed, 1.0, rng)[0] for seed in range(3)] == [1.0] * 3
    finally:
        short.close()
    wins = [play(env, seed, 0.0, random.Random(seed))[0] for seed in range(24)]
    assert 0.05 <= sum(wins) / len(wins) <= 0.5, sum(wins)
    env.reset(seed=0)
    assert env.demo_action(random.Random(1), 0.0) == random.Random(1).choice(env.current_info()["legal_actions"])
    with pytest.raises(ValueError, match="skill"):
        env.demo_action(rng, 1.5)


@pytest.mark.parametrize("backend", ["local", "docker"])
def test_fork_and_snapshot_carry_the_database(backend):
    """fork(4) clones the sandbox with its database: each child answers from it alone; a snapshot carries the
    database into a new env (restore), on each backend."""
    e, other = make(backend), make(backend)
    before = {s.id for s in shared_provider(backend).list()}  # the module's env may hold one
    kids = []
    try:
        e.reset(seed=9)
        e.step("list_tables()")
        kids = e.fork(4)
        gold, table = e._task["gold"], e._task["tables"][0]
        outs = [k.step(f"query({gold!r})")[0] for k in kids]
        assert len(set(outs)) == 1 and "row" in outs[0]
        assert kids[0].step(f"answer({gold!r})")[1] == 1.0
        assert kids[1].step(f"answer({'SELECT * FROM ' + table!r})")[1] == 0.0
        assert kids[2].turn == 2 and e.turn == 1 and not e.done
        other.reset(seed=10)
        other.restore(json.loads(e.snapshot().to_bytes()))
        assert other._task == e._task and db_of(other) == db_of(e)
        assert other.step(f"query({gold!r})")[0] == outs[0]
        assert base64.b64decode(e.snapshot().state["task"]["sandbox"])  # the sandbox's tar is in the snapshot
    finally:
        for k in (*kids, e, other):
            k.close()
    assert {s.id for s in shared_provider(backend).list()} <= before


def test_local_and_docker_give_the_same_episode():
    """The same seed and actions give the same observations on bubblewrap and in Docker (the runner's text)."""
    seen = []
    for backend in ("local", "docker"):
        e = make(backend)
        try:
            e.reset(seed=21)
            rng = random.Random(21)
            seen.append([e.step(e.demo_action(rng, 1.0))[:4] for _ in range(3)] + [e.step("list_tables()")[:4]])
        finally:
            e.close()
    assert seen[0] == seen[1]
