"""FileQA-v0 on the local sandbox backend, in-process and over a real uvicorn (S11, S12, gates, fork)."""

import random

import gymnasium as gym
import httpx
import pytest

from envs.fileqa import QUESTION_KINDS, corpus_facts, normalize_answer
from sandbox_server.embedded import shared_provider
from sandbox_server.app import create_env_app
from tests.docker_support import UvicornThread, require_docker

BACKEND = {"name": "local"}


def make(**kwargs):
    kwargs.setdefault("backend", BACKEND["name"])
    return gym.make("forkyard/FileQA-v0", **kwargs).unwrapped


@pytest.fixture(autouse=True)
def backend(request):
    """The sandbox backend of a test: ``local`` unless parametrized by :data:`both` (Docker fails in CI
    and skips elsewhere when no engine answers). Checks afterwards that every env closed its sandbox."""
    name = getattr(request, "param", "local")
    if name == "docker":
        require_docker()
    BACKEND["name"] = name
    yield name
    BACKEND["name"] = "local"
    assert shared_provider(name).list() == []


both = pytest.mark.parametrize("backend", ["local", "docker"], indirect=True)


@both
def test_determinism_by_seed_and_every_kind_answerable(backend):
    env = make()
    seen = set()
    for seed in range(30):
        obs, info = env.reset(seed=seed)
        obs2, info2 = make_once(seed)
        assert (obs, info) == (obs2, info2)
        seen.add(env._question["kind"])
        assert env.observation_space.contains(obs)
        assert f"answer({env._question['answer']!r})" in info["legal_actions"]
    assert seen == set(QUESTION_KINDS)
    env.close()


def make_once(seed):
    e = make()
    try:
        return e.reset(seed=seed)
    finally:
        e.close()


@both
@pytest.mark.parametrize("kind", QUESTION_KINDS)
def test_the_menu_tool_reveals_the_answer_and_the_checker_accepts_it(backend, kind):
    env = make(kinds=[kind])
    for seed in range(3):
        obs, info = env.reset(seed=seed)
        obs, r, te, tr, info = env.step(info["legal_actions"][0])
        assert not te and not tr and info["tool_status"] == "ok", obs
        answer = env._question["answer"]
        if kind == "log_errors":
            assert obs.count(" ERROR ") == answer
        if kind == "line_count":
            assert f"{answer} " in obs  # wc prints "LINES WORDS BYTES path"
        obs, r, te, tr, info = env.step(f"answer({answer!r})")
        assert (r, te, info["termination_reason"], info["correct"]) == (1.0, True, "answered", True)
    env.close()


@pytest.mark.parametrize("kind", QUESTION_KINDS)
def test_the_scripted_demonstrator_calls_the_informative_tool_then_answers_right(kind):
    env = make(kinds=[kind], max_turns=2)
    rng = random.Random(0)
    for seed in range(3):
        obs, info = env.reset(seed=seed)
        action = env.demo_action(rng, skill=1.0)
        assert action == info["legal_actions"][0]  # the informative call first
        obs, r, te, tr, info = env.step(action)
        assert not te and info["tool_status"] == "ok"
        obs, r, te, tr, info = env.step(env.demo_action(rng, skill=1.0))
        assert (r, te, info["correct"]) == (1.0, True, True)
    env.close()


def test_the_demonstrator_at_skill_0_is_the_random_menu_and_it_passes_the_gates():
    env = make(max_turns=5, min_tool_calls=2, required_tools=("cat",))
    for seed in range(4):
        obs, info = env.reset(seed=seed)
        assert env.demo_action(random.Random(seed), 0.0) == random.Random(seed).choice(info["legal_actions"])
    rewards = []
    for seed in range(4):
        env.reset(seed=seed)
        rng, done = random.Random(seed), False
        while not done:
            obs, r, te, tr, info = env.step(env.demo_action(rng, 1.0))
            done = te or tr
        rewards.append((r, info["termination_reason"], info.get("gate")))
    assert rewards == [(1.0, "answered", None)] * 4
    with pytest.raises(ValueError, match="skill"):
        env.demo_action(random.Random(0), 1.5)
    env.close()


def test_normalize_answer():
    assert normalize_answer("/data/Lib/os.py") == normalize_answer("./Lib/os.py") == "Lib/os.py"
    assert normalize_answer("'42'") == normalize_answer(42) == normalize_answer(" 42 ") == "42"
    assert normalize_answer("utf-8") == normalize_answer("'utf-8'")
    assert normalize_answer(41) != normalize_answer(42)


@both
def test_gates(backend):
    env = make(min_tool_calls=1, required_tools=["grep"], kinds=["line_count"])
    obs, info = env.reset(seed=1)
    answer = env._question["answer"]
    assert "at least 1 tool call" in obs
    o, r, te, tr, info = env.step(f"answer({answer})")
    assert r == 0.0 and te and "at least 1 tool call" in info["gate"] and info["correct"]
    env.reset(seed=1)
    env.step(f"wc('{env._question['text'].split('/data/')[1].split(' ')[0]}')")
    o, r, te, tr, info = env.step(f"answer({answer})")
    assert r == 0.0 and "grep" in info["gate"]
    env.reset(seed=1)
    env.step("grep('import', 'Lib/abc.py')")
    o, r, te, tr, info = env.step(f"answer({answer})")
    assert r == 1.0 and "gate" not in info
    env.close()


@both
def test_refusals_and_errors_are_observations(backend):
    env = make(kinds=["defines"])
    env.reset(seed=0)
    for action, says in [
        ("cat('../../etc/passwd')", "refused"),
        ("cat('/etc/passwd')", "refused"),
        ("rm('-rf', '/')", "unknown tool"),
        ("find('.', exec='touch /tmp/pwned')", "no argument 'exec'"),
        ("cat('no_such_file.txt')", "exit code"),
    ]:
        obs, r, te, tr, info = env.step(action)
        assert says in obs, (action, obs)
        assert r == 0.0 and not te and not tr
    env.close()


@both
def test_s12_truncated_versus_terminated(backend):
    env = make(max_turns=3, kinds=["line_count"])
    env.reset(seed=0)
    for _ in range(3):
        obs, r, te, tr, info = env.step("ls('Lib')")
    assert (te, tr, info["termination_reason"]) == (False, True, "max_turns")
    env.reset(seed=0)
    env.step("ls('Lib')")
    env.step("ls('Lib')")
    obs, r, te, tr, info = env.step(f"answer({env._question['answer']})")
    assert (te, tr, r, info["termination_reason"]) == (True, False, 1.0, "answered")
    env.close()
    slow = make(max_turns=3, per_turn_timeout_s=0.001)
    slow.reset(seed=0)
    obs, r, te, tr, info = slow.step("grep('zzzz', '.')")
    assert (te, tr, r, info["termination_reason"]) == (False, True, 0.0, "timeout")
    assert "timed out" in obs
    slow.close()
    goes_on = make(max_turns=3, per_turn_timeout_s=0.001, continue_on_timeout=True)
    goes_on.reset(seed=0)
    obs, r, te, tr, info = goes_on.step("grep('zzzz', '.')")
    assert not te and not tr and info["tool_status"] == "timeout" and "Turn 2 of 3" in obs
    goes_on.close()


@both
def test_fork_after_reset_keeps_scratch_files_and_sandboxes_are_separate(backend):
    env = make(kinds=["log_errors"])
    env.reset(seed=4)
    answer = env._question["answer"]
    kids = env.fork(3)
    assert len({k._sandbox for k in kids} | {env._sandbox}) == 4
    for k in kids:
        obs, *_ = k.step("grep('ERROR', '/scratch/app.log')")
        assert obs.count(" ERROR ") == answer
    a, b = env.fork(2)
    a.step("ls('Lib')")
    assert a.turn == 1 and b.turn == 0 and env.turn == 0
    a.close()
    obs, r, *_ = b.step(f"answer({answer})")
    assert r == 1.0
    for e in (*kids, b, env):
        e.close()


def test_check_env_passes_on_fileqa_local():
    import warnings

    from gymnasium.utils.env_checker import check_env

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        env = make()
        check_env(env)
        env.close()


def test_fileqa_over_http_with_remote_client():
    srv = UvicornThread(create_env_app(sandbox_provider=shared_provider("local"))).start()
    try:
        env = gym.make("forkyard/FileQA-v0", server_url=srv.url, kinds=["constant"]).unwrapped
        obs, info = env.reset(seed=2)
        local = make(kinds=["constant"])
        lobs, linfo = local.reset(seed=2)
        assert obs == lobs and info == linfo
        a, b = env.fork(2)
        ra = a.step(info["legal_actions"][0])
        rb = b.step(info["legal_actions"][0])
        assert ra[0] == rb[0] and ra[4]["turn"] == 1
        answer = local._question["answer"]
        assert a.step(f"answer({answer!r})")[1] == 1.0
        with httpx.Client(base_url=srv.url) as http:
            r = http.post("/v1/envs", json={"env_id": "forkyard/FileQA-v0", "kwargs": {"kinds": ["nope"]}})
            assert r.status_code == 422 and "unknown question kinds" in r.text
        for e in (a, b, env, local):
            e.close()
    finally:
        srv.stop()


def test_corpus_facts_are_real():
    from sandbox_server.corpus import ensure_corpus
    from sandbox_server.settings import corpus_dir

    facts = corpus_facts(ensure_corpus(corpus_dir()))
    assert ("dataclass", "Lib/dataclasses.py") in facts["defines"]
    assert any(p == "Lib/json/decoder.py" for p, _ in facts["lines"])


def test_corpus_facts_computed_by_threads_at_once_agree():
    """Threads at different stack depths compute the corpus facts at once (as a Ray collector's envs reset
    together), each through the uncached function: every thread gets the same facts and none a SystemError
    (CPython 3.11's shared AST recursion counter, CPython gh-106905)."""
    import threading

    from sandbox_server.corpus import ensure_corpus
    from sandbox_server.settings import corpus_dir

    root = ensure_corpus(corpus_dir())
    results, errors = [], []

    def at_depth(depth):
        if depth:
            return at_depth(depth - 1)
        try:
            results.append(corpus_facts.__wrapped__(root))
        except Exception as exc:  # noqa: BLE001 - the test reports any error
            errors.append(repr(exc))

    threads = [threading.Thread(target=at_depth, args=(7 * i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(results) == 4
    assert all(r == results[0] for r in results[1:])


def test_the_right_answer_has_no_fixed_position_in_the_menu():
    env = make(kinds=["line_count", "imports", "log_errors"])
    ranks = set()
    for seed in range(40):
        _, info = env.reset(seed=seed)
        answers = [a for a in info["legal_actions"] if a.startswith("answer(")]
        ranks.add(answers.index(f"answer({env._question['answer']!r})"))
    env.close()
    assert len(ranks) >= 3  # (rank 3 needs three negative offsets: rare for small counts)


def test_a_blocking_sandbox_step_does_not_stall_other_sessions():
    """The full sandbox app (its own pool serves FileQA): while one FileQA step runs a tool call that
    lasts until its 2 s deadline (a backreference grep over the corpus), another session's ClueProbe
    steps are answered. Ordering, not timing, is asserted: they all finish before the slow step."""
    import threading
    import time

    from sandbox_server.app import create_app

    srv = UvicornThread(create_app("local")).start()
    try:
        with (httpx.Client(base_url=srv.url, timeout=30) as slow_http,
              httpx.Client(base_url=srv.url, timeout=30) as fast):
            slow = slow_http.post("/v1/envs", json={"env_id": "forkyard/FileQA-v0", "seed": 0,
                                                    "kwargs": {"per_turn_timeout_s": 2}}).json()
            quick = fast.post("/v1/envs", json={"env_id": "forkyard/ClueProbe-v0", "seed": 0}).json()
            done = {}

            def slow_step():
                r = slow_http.post(f"/v1/envs/{slow['session_id']}/step",
                                   json={"action": "grep('(.*)(.*)(.*)(.*)\\\\4\\\\3\\\\2\\\\1x', 'Lib')"}).json()
                done["slow"] = (time.monotonic(), r)

            t = threading.Thread(target=slow_step)
            t.start()
            time.sleep(0.3)
            for action in ("probe(0)", "probe(1)", "probe(2)", "probe(0)"):
                assert fast.post(f"/v1/envs/{quick['session_id']}/step", json={"action": action}).status_code == 200
            quick_done = time.monotonic()
            t.join(30)
            slow_done, r = done["slow"]
            assert r["info"]["termination_reason"] == "timeout" and r["truncated"]
            assert quick_done < slow_done
            for sid in (slow["session_id"], quick["session_id"]):
                assert fast.delete(f"/v1/envs/{sid}").status_code == 204
    finally:
        srv.stop()


@pytest.mark.parametrize("kwargs,words", [({"backend": 5}, "backend must be"), ({"kinds": "line_count"}, "not a str"),
                                          ({"max_turns": True}, "max_turns must be")])
def test_bad_kwargs_are_clear_value_errors(kwargs, words):
    with pytest.raises(ValueError, match=words):
        gym.make("forkyard/FileQA-v0", **kwargs)
