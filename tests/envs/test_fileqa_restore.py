"""FileQA snapshots carry the sandbox (field case S18), in this process and in a fresh one, on every backend."""

import json
import subprocess
import sys

import gymnasium as gym
import pytest

import envs  # noqa: F401 - registers the ids
from envs import check_fork_contract
from envs.core import EnvInfraError
from sandbox_server.embedded import shared_provider
from tests.docker_support import ROOT, answers, require_docker

BACKENDS = pytest.mark.parametrize("backend", ["local", "docker"])


def make(backend, **kw):
    if backend == "docker":
        require_docker()
    return gym.make("forkyard/FileQA-v0", backend=backend, kinds=["log_errors"], **kw).unwrapped


@BACKENDS
def test_restore_rebuilds_the_sandbox(backend):
    a, b = make(backend), make(backend)
    try:
        a.reset(seed=1)
        a.step("wc('/scratch/app.log')")
        snap = a.snapshot()
        b.reset(seed=2)
        assert answers(b) != answers(a)  # different logs before the restore
        b.restore(snap)
        assert answers(b) == answers(a)
        assert b.turn == a.turn == 1 and b.history == a.history
        right = a._question["answer"]
        # the answer that scores in the restored env is the snapshot's, and it scores
        obs, reward, term, _, _ = b.step(f"answer({right})")
        assert term and reward == 1.0, obs
        check_fork_contract(a, seed=3)  # fork/snapshot/seeding contract, by envs.checks (closes what it makes)
    finally:
        a.close()
        b.close()
    assert shared_provider(backend).list() == []


@BACKENDS
def test_restore_in_a_fresh_process(backend, tmp_path):
    a = make(backend)
    try:
        a.reset(seed=3)
        snap = a.snapshot().to_bytes()
        expected = answers(a)
    finally:
        a.close()
    (tmp_path / "snap.json").write_bytes(snap)
    code = f"""
import json, sys, gymnasium as gym, envs
sys.path.insert(0, {str(ROOT)!r})
from tests.docker_support import answers
env = gym.make("forkyard/FileQA-v0", backend={backend!r}, kinds=["log_errors"]).unwrapped
env.restore(open({str(tmp_path / 'snap.json')!r}, "rb").read())
print(json.dumps(answers(env)))
env.close()
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == expected


def test_restore_refuses_a_snapshot_of_other_kwargs_and_changes_nothing():
    a, b = make("local"), make("local", max_turns=3)
    try:
        a.reset(seed=1)
        b.reset(seed=2)
        before = (b.turn, b.history, answers(b))
        with pytest.raises(ValueError, match="cannot restore"):
            b.restore(a.snapshot())
        assert (b.turn, b.history, answers(b)) == before
    finally:
        a.close()
        b.close()


def test_snapshot_refuses_when_the_provider_cannot_export(tmp_path):
    """A provider without ``export`` (an HTTP client) cannot put the sandbox in a snapshot: refused, loudly."""
    from sandbox_server.service import SandboxService

    svc = shared_provider("local")

    class NoExport:  # the provider protocol minus export: a real service behind it
        backend = svc.backend

        def __getattr__(self, name):
            if name == "export":
                raise AttributeError(name)
            return getattr(svc, name)

    assert isinstance(svc, SandboxService)
    env = gym.make("forkyard/FileQA-v0", sandbox_provider=NoExport()).unwrapped
    try:
        env.reset(seed=0)
        with pytest.raises(EnvInfraError, match="cannot export"):
            env.snapshot()
    finally:
        env.close()


def test_async_vector_fileqa_matches_sync():
    """Forked async workers start their own sandbox services: they once shared the parent's agents, and
    an env read another env's log (or hung)."""
    seen = {}
    for mode in ("sync", "async"):
        v = gym.make_vec("forkyard/FileQA-v0", num_envs=3, vectorization_mode=mode, kinds=["log_errors"])
        try:
            obs, _ = v.reset(seed=[0, 1, 2])
            out, *_ = v.step(["cat('/scratch/app.log')"] * 3)
            seen[mode] = (tuple(obs), tuple(out))
        finally:
            v.close()
    assert seen["async"] == seen["sync"]
    assert len({o.count(" ERROR ") for o in seen["sync"][1]}) == 3  # three different logs


def test_a_dead_sandbox_ends_the_episode_as_infra_error():
    """The agent killed under a FileQA session: the step raises EnvInfraError (trainers end the episode
    as infra_error), never an ordinary observation the policy would learn from."""
    import os

    env = make("local")
    try:
        env.reset(seed=1)
        svc = env._provider
        os.killpg(svc.backend.pid(svc._session(env._sandbox).sid), 9)
        with pytest.raises(EnvInfraError, match="sandbox failed"):
            env.step("wc('/scratch/app.log')")
    finally:
        env.close()


def test_documented_actions_never_raise_and_options_are_checked():
    env = make("local")
    try:
        env.reset(seed=1)
        obs, *_ = env.step("find('Lib', name='json*')")  # a keyword called `name` once raised TypeError
        assert "Lib/json" in obs
        with pytest.raises(ValueError, match="no reset options"):
            env.reset(seed=1, options={"targte": 3})
    finally:
        env.close()
