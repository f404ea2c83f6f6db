"""Batched env routes (/v1/envs/batch/...) and the vector client (envs.RemoteVectorEnv) over a real uvicorn on
loopback: per-item errors beside successful items, results equal to the single routes', the batch limits,
inline versus threaded env code, and the vector env against single RemoteEnvs and Gymnasium's own vector env."""

from __future__ import annotations

import threading
import time

import gymnasium as gym
import httpx
import numpy as np
import pytest
from gymnasium.envs.registration import EnvSpec

import envs.remote_vector as remote_vector
from envs import MAX_REPLY_CHARS, EnvInfraError, RemoteEnv, RemoteVectorEnv
from envs.clueprobe import ClueProbeEnv
from envs.fileqa import FileQAEnv
from envs.suite.text_to_sql import TextToSQLEnv
from envs.remote import env_factory
from envs.remote_vector import BatchInfraError, BatchItemError, vector_info
from sandbox_server.app import create_env_app
from sandbox_server.http_contract import ENV_BATCH_BODY_BYTES
from sandbox_server.models import MAX_BATCH_ITEMS
from sandbox_server.routes.envs import batch_body_limit, max_served_action_length
from tests.docker_support import UvicornThread, require_bwrap

CLUE = "forkyard/ClueProbe-v0"
FILEQA = "forkyard/FileQA-v0"


@pytest.fixture(scope="module")
def server():
    srv = UvicornThread(create_env_app(ttl_s=600, max_sessions=256)).start()
    yield srv
    srv.stop()


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def batch(http, route: str, items: list, status: int = 200) -> list[dict]:
    r = http.post(f"/v1/envs/batch/{route}", json={"items": items})
    assert r.status_code == status, r.text
    results = r.json()["results"]
    assert len(results) == len(items)
    return results


def ok(results: list[dict]) -> list[dict]:
    assert all(r["status_code"] in (200, 201, 204) for r in results), results
    return [r.get("result") for r in results]


def assert_item_error(res: dict, status: int, word: str, says: str = "") -> None:
    assert res["status_code"] == status and "result" not in res, res
    assert set(res["error"]) == {"detail", "status"} and res["error"]["status"] == word, res
    assert says in res["error"]["detail"], res


def without_ids(d: dict) -> dict:
    return {k: v for k, v in d.items() if k not in ("session_id", "session_ids")}


def sessions_of(server) -> int:
    return len(server.server.config.app.state.env_sessions)


# ----------------------------------------------------------------------------------------- per item
def test_per_item_errors_beside_successful_items(server, http):
    before = sessions_of(server)
    made = batch(http, "create", [
        {"env_id": CLUE, "seed": 1, "kwargs": {"max_turns": 2}},
        {"env_id": "forkyard/Nope-v0"},
        {"env_id": CLUE, "seed": -1},
        {"env_id": CLUE, "kwargs": {"max_turns": True}},
        {"env_id": FILEQA},  # this server has no sandbox service
        {"env_id": CLUE, "seed": 2, "kwargs": {"max_turns": 3}},
    ])
    assert made[0]["status_code"] == made[5]["status_code"] == 201
    assert_item_error(made[1], 404, "unknown_env", "unknown env id")
    assert_item_error(made[2], 422, "invalid", "seed")
    assert_item_error(made[3], 422, "invalid", "max_turns")
    assert_item_error(made[4], 422, "invalid", "no sandbox service")
    assert sessions_of(server) == before + 2  # the failed items left nothing behind
    a, b = made[0]["result"]["session_id"], made[5]["result"]["session_id"]

    res = batch(http, "step", [
        {"session_id": a, "action": "probe(0)"},
        {"session_id": "unknown", "action": "probe(0)"},
        {"session_id": a, "action": "answer(1)"},       # ends a's episode (max_turns=2) ...
        {"session_id": a, "action": "answer(1)"},       # ... so this one is a 409
        {"session_id": b, "action": 5},                 # not a string: 422
        {"session_id": b, "action": "x" * 40_000},      # past the longest reply a door takes: 413
        {"session_id": b, "action": "probe(1)", "extra": 1},
        {"session_id": b, "action": "probe(2)"},
    ])
    assert res[0]["status_code"] == res[2]["status_code"] == res[7]["status_code"] == 200
    assert res[2]["result"]["terminated"] and res[2]["result"]["info"]["termination_reason"] == "answered"
    assert_item_error(res[1], 404, "not_found", "no env session 'unknown'")
    assert_item_error(res[3], 409, "conflict", "episode has ended")
    assert_item_error(res[4], 422, "invalid", "action")
    assert_item_error(res[5], 413, "too_large", f"at most {MAX_REPLY_CHARS}")
    assert_item_error(res[6], 422, "invalid", "extra")
    assert res[7]["result"]["info"]["turn"] == 1  # only the valid step of b ran
    assert http.get(f"/v1/envs/{b}").json()["turn"] == 1

    res = batch(http, "reset", [{"session_id": a, "seed": 3}, {"session_id": "gone"}, {"session_id": b, "seed": -2},
                                {"session_id": b, "options": {"target": 99}}])
    assert res[0]["status_code"] == 200 and res[0]["result"]["info"]["turn"] == 0
    assert_item_error(res[1], 404, "not_found")
    assert_item_error(res[2], 422, "invalid", "seed")
    assert_item_error(res[3], 422, "invalid", "target")
    single = http.post(f"/v1/envs/{b}/reset", json={"options": {"target": 99}})  # as the single route answers
    assert (single.status_code, single.json()) == (res[3]["status_code"], res[3]["error"])

    res = batch(http, "fork", [{"session_id": a, "n": 2}, {"session_id": "gone", "n": 1}, {"session_id": b, "n": 0},
                               {"session_id": b, "n": 65}, {"session_id": b}])
    kids = res[0]["result"]["session_ids"]
    assert res[0]["status_code"] == 200 and len(kids) == 2 and res[4]["status_code"] == 200
    assert_item_error(res[1], 404, "not_found")
    assert_item_error(res[2], 422, "invalid", "n")
    assert_item_error(res[3], 422, "invalid", "n")

    gone = kids + [a, b, res[4]["result"]["session_ids"][0]]
    res = batch(http, "delete", [{"session_id": s} for s in gone] + [{"session_id": a}, {"sid": 1}])
    assert [r["status_code"] for r in res[:len(gone)]] == [204] * len(gone)
    assert_item_error(res[len(gone)], 404, "not_found")
    assert_item_error(res[-1], 422, "invalid")
    assert sessions_of(server) == before


def test_items_on_one_session_run_in_their_order(http):
    sid = ok(batch(http, "create", [{"env_id": CLUE, "seed": 0, "kwargs": {"max_turns": 5}}]))[0]["session_id"]
    res = ok(batch(http, "step", [{"session_id": sid, "action": f"probe({k % 3})"} for k in range(4)]))
    assert [r["info"]["turn"] for r in res] == [1, 2, 3, 4]
    local = ClueProbeEnv(max_turns=5)
    local.reset(seed=0)
    assert [r["observation"] for r in res] == [local.step(f"probe({k % 3})")[0] for k in range(4)]
    batch(http, "delete", [{"session_id": sid}])


def test_the_session_cap_answers_503_per_item():
    srv = UvicornThread(create_env_app(max_sessions=3)).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as http:
            res = batch(http, "create", [{"env_id": CLUE, "seed": i} for i in range(4)])
            assert [r["status_code"] for r in res[:3]] == [201] * 3
            assert_item_error(res[3], 503, "unavailable", "env sessions")
            assert res[3]["retry_after_s"] >= 1
            sids = [r["result"]["session_id"] for r in res[:3]]
            ok(batch(http, "delete", [{"session_id": sids[2]}]))
            res = batch(http, "fork", [{"session_id": sids[0], "n": 2}, {"session_id": sids[1], "n": 1}])
            assert_item_error(res[0], 503, "unavailable")  # all n or none
            assert res[1]["status_code"] == 200
            assert sessions_of(srv) == 3
            ok(batch(http, "delete", [{"session_id": s} for s in sids[:2] + res[1]["result"]["session_ids"]]))
            assert sessions_of(srv) == 0
    finally:
        srv.stop()


# ------------------------------------------------------------------------------------ the same results
def drive_single(http, creates: list[dict], actions: list[list[str]], fork_n: int) -> list:
    """The single routes: create, a step per action row, fork, a step of every child, reset."""
    out, sids = [], []
    for c in creates:
        r = http.post("/v1/envs", json=c)
        assert r.status_code == 201, r.text
        out.append(without_ids(r.json()))
        sids.append(r.json()["session_id"])
    for row in actions:
        out.append([without_ids(http.post(f"/v1/envs/{s}/step", json={"action": a}).json())
                    for s, a in zip(sids, row, strict=True)])
    kids = [k for s in sids for k in http.post(f"/v1/envs/{s}/fork", json={"n": fork_n}).json()["session_ids"]]
    act = actions[-1]
    out.append([without_ids(http.post(f"/v1/envs/{k}/step", json={"action": act[j // fork_n]}).json())
                for j, k in enumerate(kids)])
    out.append([without_ids(http.post(f"/v1/envs/{s}/reset", json={"seed": 7 + i}).json()) for i, s in enumerate(sids)])
    for s in sids + kids:
        assert http.delete(f"/v1/envs/{s}").status_code == 204
    return out


def drive_batched(http, creates: list[dict], actions: list[list[str]], fork_n: int) -> list:
    """The same through the batched routes."""
    made = ok(batch(http, "create", creates))
    out = [without_ids(m) for m in made]
    sids = [m["session_id"] for m in made]
    for row in actions:
        out.append([without_ids(r) for r in ok(batch(http, "step", [{"session_id": s, "action": a}
                                                                     for s, a in zip(sids, row, strict=True)]))])
    forks = ok(batch(http, "fork", [{"session_id": s, "n": fork_n} for s in sids]))
    assert [f["session_id"] for f in forks] == sids
    kids = [k for f in forks for k in f["session_ids"]]
    act = actions[-1]
    out.append([without_ids(r) for r in ok(batch(http, "step", [{"session_id": k, "action": act[j // fork_n]}
                                                                 for j, k in enumerate(kids)]))])
    out.append([without_ids(r) for r in ok(batch(http, "reset", [{"session_id": s, "seed": 7 + i}
                                                                  for i, s in enumerate(sids)]))])
    ok(batch(http, "delete", [{"session_id": s} for s in sids + kids]))
    return out


def test_clueprobe_batched_results_equal_the_single_routes(server, http):
    before = sessions_of(server)
    creates = [{"env_id": CLUE, "seed": s, "kwargs": {"max_turns": 4, "bits": 3}} for s in range(6)]
    creates.append({"env_id": CLUE, "seed": 3, "kwargs": {"max_turns": 4}, "options": {"target": 5}})
    rng = np.random.default_rng(0)
    actions = [[str(rng.choice(["probe(0)", "probe(1)", "probe(2)", "answer(5)", "nonsense"])) for _ in creates]
               for _ in range(2)]
    assert drive_batched(http, creates, actions, 2) == drive_single(http, creates, actions, 2)
    assert sessions_of(server) == before


@pytest.fixture(scope="module")
def fileqa_server():
    require_bwrap()
    from sandbox_server.embedded import shared_provider

    provider = shared_provider("local")
    srv = UvicornThread(create_env_app(sandbox_provider=provider)).start()
    yield srv
    srv.stop()
    assert provider.list() == []  # every session gave its sandbox back


def test_fileqa_batched_results_equal_the_single_routes(fileqa_server):
    creates = [{"env_id": FILEQA, "seed": s, "kwargs": {"kinds": ["constant", "line_count"]}} for s in range(3)]
    with httpx.Client(base_url=fileqa_server.url, timeout=120) as http:
        first = http.post("/v1/envs", json=creates[0]).json()
        probe = first["info"]["legal_actions"][0]
        http.delete(f"/v1/envs/{first['session_id']}")
        actions = [[probe, "ls('.')", "cat('nope/missing.txt')"], ["wc('Lib/json/decoder.py')", "head('x', n=True)",
                                                                    probe]]
        single = drive_single(http, creates, actions, 2)
        steps = [r for row in single[3:6] for r in row]
        assert all(r["info"]["turn"] >= 1 and r["info"].get("termination_reason") != "infra_error" for r in steps)
        assert drive_batched(http, creates, actions, 2) == single
        assert len(fileqa_server.server.config.app.state.env_sessions) == 0


# ----------------------------------------------------------------------------------------- limits
def test_the_batch_limit_is_refused_for_the_whole_request(http):
    item = {"session_id": "s", "action": "probe(0)"}
    r = http.post("/v1/envs/batch/step", json={"items": [item] * (MAX_BATCH_ITEMS + 1)})
    assert r.status_code == 422 and f"at most {MAX_BATCH_ITEMS} items" in r.json()["detail"]
    assert batch(http, "step", [item] * MAX_BATCH_ITEMS)[0]["status_code"] == 404  # at the limit: answered per item
    for body in ({"items": []}, {"items": "x"}, {"items": [item], "more": 1}, {}, [item]):
        r = http.post("/v1/envs/batch/step", json=body)
        assert r.status_code == 422 and set(r.json()) == {"detail", "status"}, r.text
    r = http.post("/v1/envs/batch/create", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422


def test_batch_body_limits_follow_the_single_routes():
    step, hint = batch_body_limit("step")
    longest = max_served_action_length()  # the longest action of a registered env (TextToSQL: 2048 characters)
    assert longest >= TextToSQLEnv.max_action_length > FileQAEnv.max_action_length
    assert step == min(ENV_BATCH_BODY_BYTES, MAX_BATCH_ITEMS * (longest * 12 + 1024))
    assert str(MAX_BATCH_ITEMS) in hint and f"{longest} characters" in hint
    assert batch_body_limit("fork")[0] == batch_body_limit("delete")[0] == MAX_BATCH_ITEMS * 1024
    assert batch_body_limit("create")[0] == batch_body_limit("reset")[0] == ENV_BATCH_BODY_BYTES
    srv = UvicornThread(create_env_app(max_body_bytes=64 << 20)).start()  # the server's own cap above the batch's
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as http:
            big = {"items": [{"session_id": "s", "action": "x" * 2000}] * 128}  # 128 * ~2 KB: over fork's limit
            r = http.post("/v1/envs/batch/fork", json={"items": [{"session_id": "s" * 2000, "n": 1}] * 128})
            assert r.status_code == 413 and "a batch holds at most" in r.json()["detail"]
            res = batch(http, "step", big["items"])  # within the step route's limit: answered per item
            assert res[0]["status_code"] == 404
            r = http.post("/v1/envs/batch/step", content=b'{"items": [' + b" " * (step + 1) + b"]}",
                          headers={"content-type": "application/json"})
            assert r.status_code == 413 and "too_large" == r.json()["status"]
    finally:
        srv.stop()


# ----------------------------------------------------------------------------- where env code runs
class ThreadEnv(ClueProbeEnv):
    """ClueProbe that records the thread each step ran on, and may sleep (blocking) in its steps."""

    threads: list[int] = []
    sleep_s = 0.0

    def _act(self, call):
        ThreadEnv.threads.append(threading.get_ident())
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return super()._act(call)


class SleepyEnv(ThreadEnv):
    blocking = True
    sleep_s = 0.3


@pytest.fixture
def thread_envs(monkeypatch):
    for name in ("ThreadEnv", "SleepyEnv"):  # registered as envs.register_env would, removed after the test
        env_id = f"test/{name}-v0"
        spec = EnvSpec(env_id, entry_point=env_factory(f"{__name__}:{name}", env_id), kwargs={"max_turns": 5})
        monkeypatch.setitem(gym.registry, env_id, spec)
    ThreadEnv.threads = []


def test_cpu_envs_step_inline_and_blocking_envs_overlap_in_threads(server, http, thread_envs):
    loop_thread = server.thread.ident
    cheap = [m["session_id"] for m in ok(batch(http, "create", [{"env_id": "test/ThreadEnv-v0", "seed": i}
                                                                for i in range(8)]))]
    ok(batch(http, "step", [{"session_id": s, "action": "probe(0)"} for s in cheap]))
    assert ThreadEnv.threads == [loop_thread] * 8  # on the event loop: no thread hop per item
    ThreadEnv.threads = []
    slow = [m["session_id"] for m in ok(batch(http, "create", [{"env_id": "test/SleepyEnv-v0", "seed": i}
                                                               for i in range(8)]))]
    t0 = time.perf_counter()
    ok(batch(http, "step", [{"session_id": s, "action": "probe(0)"} for s in slow]))
    took = time.perf_counter() - t0
    assert loop_thread not in ThreadEnv.threads and len(set(ThreadEnv.threads)) > 1
    assert took < 8 * SleepyEnv.sleep_s / 2, took  # 8 sleeps of 0.3 s overlapped (serially: 2.4 s)
    ok(batch(http, "delete", [{"session_id": s} for s in cheap + slow]))


# ---------------------------------------------------------------------------------------- the client
def assert_same(a, b) -> None:
    """Equal vector-env outputs: tuples, arrays (dtype and values, object arrays element-wise), dicts."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), (sorted(a), sorted(b))
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape, (a, b)
        assert all(x == y for x, y in zip(a.tolist(), b.tolist(), strict=True)), (a, b)
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b), (a, b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    else:
        assert a == b, (a, b)


def random_actions(rng, n: int) -> list[str]:
    return [str(rng.choice(["probe(0)", "probe(1)", "probe(2)", "answer(3)", "answer(5)", "oops"])) for _ in range(n)]


def test_vector_env_matches_gymnasiums_sync_vector_env(server):
    n = 5
    remote = RemoteVectorEnv(CLUE, server.url, n, max_turns=3)
    local = gym.make_vec(CLUE, num_envs=n, vectorization_mode="sync", max_turns=3)
    assert_same(remote.reset(seed=11), local.reset(seed=11))
    assert remote.single_observation_space == local.single_observation_space
    assert remote.observation_space == local.observation_space
    rng = np.random.default_rng(1)
    for _ in range(15):  # episodes end at different steps: next-step autoresets mixed with steps
        actions = random_actions(rng, n)
        assert_same(remote.step(actions), local.step(actions))
    assert_same(remote.reset(seed=[3, None, 4, None, 5]), local.reset(seed=[3, None, 4, None, 5]))
    remote.close()
    local.close()


def test_vector_env_matches_a_loop_of_single_remote_envs(server):
    n = 4
    vec = RemoteVectorEnv(CLUE, server.url, n, max_turns=2)
    singles = [RemoteEnv(CLUE, server.url, max_turns=2) for _ in range(n)]
    obs, infos = vec.reset(seed=100)
    for i, e in enumerate(singles):
        o, info = e.reset(seed=100 + i)
        assert obs[i] == o and infos["anchor_key"][i] == info["anchor_key"] and infos["turn"][i] == info["turn"]
    rng = np.random.default_rng(2)
    ended = [False] * n
    for _ in range(9):
        actions = random_actions(rng, n)
        obs, rewards, terms, truncs, infos = vec.step(actions)
        for i, e in enumerate(singles):
            if ended[i]:  # next-step autoreset: the vector env resets it, its action is ignored
                o, info = e.reset()
                expect = (o, 0.0, False, False, info)
            else:
                expect = e.step(actions[i])
            assert (obs[i], rewards[i], terms[i], truncs[i], infos["anchor_key"][i]) == (
                *expect[:4], expect[4]["anchor_key"])
            ended[i] = expect[2] or expect[3]
    vec.close()
    for e in singles:
        e.close()


def test_vector_env_fork(server):
    vec = RemoteVectorEnv(CLUE, server.url, 3, max_turns=4)
    vec.reset(seed=0)
    vec.step(["probe(0)", "probe(1)", "probe(2)"])
    kids = vec.fork([2, 0, 1])
    assert kids.num_envs == 3 and kids.parents == [0, 0, 2] and len(set(kids.session_ids)) == 3
    local = gym.make_vec(CLUE, num_envs=3, vectorization_mode="sync", max_turns=4)
    local.reset(seed=0)
    local.step(["probe(0)", "probe(1)", "probe(2)"])
    want = [local.envs[p].unwrapped.fork(1)[0].step("probe(1)") for p in kids.parents]
    obs, rewards, terms, truncs, infos = kids.step(["probe(1)"] * 3)
    assert list(obs) == [w[0] for w in want] and list(infos["anchor_key"]) == [w[4]["anchor_key"] for w in want]
    assert vec.step(["probe(0)"] * 3)[4]["turn"].tolist() == [2, 2, 2]  # the parents went on unchanged
    vec.close()  # closing the parents keeps the forks' connection
    assert kids.step(["probe(0)"] * 3)[4]["turn"].tolist() == [3, 3, 3]
    kids.close()
    assert vec._client.closed
    with pytest.raises(ValueError):
        kids.fork([1, 2])


def test_vector_env_raises_for_failed_items_after_applying_the_rest(server, http):
    vec = RemoteVectorEnv(CLUE, server.url, 3, max_turns=5)
    vec.reset(seed=0)
    assert http.delete(f"/v1/envs/{vec.session_ids[1]}").status_code == 204  # the server lost sub-env 1
    with pytest.raises(BatchInfraError) as err:
        vec.step(["probe(0)"] * 3)
    assert isinstance(err.value, EnvInfraError) and set(err.value.failures) == {1}
    assert err.value.failures[1].status_code == 404 and "no env session" in err.value.failures[1].detail
    obs, rewards, terms, truncs, infos = err.value.partial
    assert infos["turn"].tolist() == [1, 0, 1] and infos["_turn"].tolist() == [True, False, True]
    assert truncs.tolist() == [False, True, False] and infos["termination_reason"][1] == "infra_error"
    with pytest.raises(BatchItemError) as err:  # a client error: never an infra error
        vec.step(["probe(1)", "probe(1)", "x" * 40_000])
    assert not isinstance(err.value, EnvInfraError) and err.value.failures[2].status_code == 413
    vec.close()


def test_vector_env_marks_infra_failures_and_replaces_lost_sessions(server, http):
    vec = RemoteVectorEnv(CLUE, server.url, 3, max_turns=5, errors="mark")
    vec.reset(seed=0)
    lost = vec.session_ids[2]
    http.delete(f"/v1/envs/{lost}")
    obs, rewards, terms, truncs, infos = vec.step(["probe(0)"] * 3)
    assert truncs.tolist() == [False, False, True] and obs[2] == ""
    assert infos["termination_reason"][2] == "infra_error" and infos["error"]["status_code"][2] == 404
    assert infos["_error"].tolist() == [False, False, True]
    obs, rewards, terms, truncs, infos = vec.step(["probe(1)"] * 3)  # next-step autoreset: a new session
    assert vec.session_ids[2] not in (None, lost) and infos["turn"].tolist() == [2, 2, 0]
    with pytest.raises(BatchItemError):  # client errors raise in mark mode too
        vec.step(["probe(1)", 7, "probe(1)"])
    vec.close()


def test_vector_env_splits_batches_over_the_item_limit(server, monkeypatch):
    monkeypatch.setattr(remote_vector, "BATCH_ITEMS", 2)
    remote = RemoteVectorEnv(CLUE, server.url, 5, max_turns=2)
    local = gym.make_vec(CLUE, num_envs=5, vectorization_mode="sync", max_turns=2)
    assert_same(remote.reset(seed=4), local.reset(seed=4))
    for _ in range(4):
        assert_same(remote.step(["probe(1)"] * 5), local.step(["probe(1)"] * 5))
    remote.close()


def test_the_client_batch_size_is_the_servers_limit():
    assert remote_vector.BATCH_ITEMS == MAX_BATCH_ITEMS


def test_vector_info_is_gymnasiums_add_info():
    rng = np.random.default_rng(3)
    base = gym.vector.VectorEnv()
    base.num_envs = 6
    for _ in range(20):
        infos = []
        for i in sorted(rng.choice(6, size=int(rng.integers(0, 7)), replace=False).tolist()):
            info = {"turn": int(rng.integers(5)), "anchor_key": "k%d" % i, "legal_actions": ["a", "b"][: i % 3]}
            if rng.random() < 0.5:
                info["episode_metrics"] = {"distinct_probes": int(rng.integers(3)), "rate": float(rng.random())}
            if rng.random() < 0.5:
                info["invalid_action"] = bool(rng.random() < 0.5)
            infos.append((i, info))
        expect: dict = {}
        for i, info in infos:
            expect = base._add_info(expect, info, i)
        assert_same(vector_info(6, infos), expect)


def test_vector_env_on_fileqa_matches_single_remote_envs(fileqa_server):
    kw = {"kinds": ["constant"], "max_turns": 3}
    vec = RemoteVectorEnv(FILEQA, fileqa_server.url, 3, timeout_s=120, **kw)
    singles = [RemoteEnv(FILEQA, fileqa_server.url, timeout_s=120, **kw) for _ in range(3)]
    obs, infos = vec.reset(seed=20)
    assert list(obs) == [e.reset(seed=20 + i)[0] for i, e in enumerate(singles)]
    for turn in range(2):
        actions = [infos["legal_actions"][i][turn] for i in range(3)]
        obs, rewards, terms, truncs, infos = vec.step(actions)
        for i, e in enumerate(singles):
            o, r, te, tr, info = e.step(actions[i])
            assert (obs[i], rewards[i], terms[i], truncs[i], infos["anchor_key"][i]) == (
                o, r, te, tr, info["anchor_key"])
    vec.close()
    for e in singles:
        e.close()


@pytest.mark.parametrize("errors", ["raise", "mark"])
def test_an_env_id_the_server_does_not_serve_is_a_configuration_error(server, http, errors):
    before = http.get("/healthz").json()["env_sessions"]
    vec = RemoteVectorEnv("nope/Missing-v0", server.url, num_envs=2, errors=errors)
    try:
        with pytest.raises(ValueError, match="does not serve 'nope/Missing-v0'") as info:
            vec.reset(seed=0)
        assert not isinstance(info.value, EnvInfraError)  # never dropped as an infrastructure failure
    finally:
        vec.close()
    assert http.get("/healthz").json()["env_sessions"] == before
