"""Field case S61: a client whose server lost its sessions. A real uvicorn server restarts on the same port
(its sessions are gone) under every forkyard client and transport; a step of the lost episode fails as an
infrastructure error and is never replayed (the restarted server holds no session afterwards), and a reset,
which needs nothing of the old episode, opens a new session and plays the seed's episode as the in-process env
does. Fork children and sessions restored from a snapshot recover the same way."""

from __future__ import annotations

import gymnasium as gym
import pytest

import envs  # noqa: F401 - registers the forkyard ids
from envs.clueprobe import ClueProbeEnv
from envs.core import EnvInfraError
from envs.openenv_client import ForkyardEnvClient
from envs.remote_vector import BatchInfraError, RemoteVectorEnv
from envs.session_client import SessionClient, make_transport
from envs.trl import environment_factory
from sandbox_server.app import create_env_app
from tests.docker_support import UvicornThread

CLUE = "forkyard/ClueProbe-v0"
KW = {"max_turns": 4}


class Restartable:
    """A real env server that restarts on the same port with none of its sessions."""

    def __init__(self) -> None:
        self.srv = UvicornThread(create_env_app(ttl_s=600, max_sessions=64)).start()
        self.url = self.srv.url

    def restart(self) -> None:
        port = self.srv.port
        self.srv.stop()
        self.srv = UvicornThread(create_env_app(ttl_s=600, max_sessions=64), port=port).start()

    def sessions(self) -> int:
        return len(self.srv.server.config.app.state.env_sessions)

    def stop(self) -> None:
        self.srv.stop()


@pytest.fixture(scope="module")
def server():
    srv = Restartable()
    yield srv
    srv.stop()


def local(seed: int, actions: list[str]) -> list[str]:
    """The in-process env's observations: the reset's, then one per action."""
    env = ClueProbeEnv(**KW)
    return [env.reset(seed=seed)[0]] + [env.step(a)[0] for a in actions]


# Each client as (reset(seed) -> list of observations, step(action) -> list of observations, close()); a vector
# env's lists hold one observation per sub-env (seeds s, s + 1), the others' one.
class GymMade:
    def __init__(self, url: str, transport: str):
        self.env = gym.make(CLUE, server_url=url, transport=transport, **KW)

    def reset(self, seed):
        return [self.env.reset(seed=seed)[0]]

    def step(self, action):
        return [self.env.step(action)[0]]

    def close(self):
        self.env.close()


class Vector:
    n = 2

    def __init__(self, url: str, transport: str):
        self.env = RemoteVectorEnv(CLUE, url, self.n, **KW)

    def reset(self, seed):
        return list(self.env.reset(seed=seed)[0])

    def step(self, action):
        return list(self.env.step([action] * self.n)[0])

    def close(self):
        self.env.close()


class OpenEnv:
    def __init__(self, url: str, transport: str):
        self.env = ForkyardEnvClient(base_url=f"{url}/openenv/{CLUE}").sync()

    def reset(self, seed):
        return [self.env.reset(seed=seed, kwargs=KW).observation["text"]]

    def step(self, action):
        return [self.env.step({"action": action}).observation["text"]]

    def close(self):
        self.env.close()


class Trl:
    """An instance of TRL's ``environment_factory`` class: infrastructure failures become its answers."""

    def __init__(self, url: str, transport: str):
        self.env = environment_factory(CLUE, server_url=url, transport=transport, **KW)()

    def reset(self, seed):
        return [self.env.reset(seed=seed)]

    def step(self, action):
        obs = self.env.probe(k=int(action[6]))
        if obs.startswith("The environment failed"):
            assert self.env.get_reward() is None  # the lost episode is dropped, not scored
            raise EnvInfraError(obs)
        return [obs]

    def close(self):
        self.env._release()


CLIENTS = [(GymMade, "http"), (GymMade, "ws"), (Vector, "http"), (OpenEnv, "ws"), (Trl, "http"), (Trl, "ws")]


@pytest.mark.parametrize("make,transport", CLIENTS, ids=[f"{m.__name__}-{t}" for m, t in CLIENTS])
def test_a_reset_recovers_after_the_server_lost_the_sessions(server, make, transport):
    width = Vector.n if make is Vector else 1

    def expect(seed: int, actions: list[str]) -> list[list[str]]:
        return [list(x) for x in zip(*[local(seed + i, actions) for i in range(width)], strict=True)]

    client = make(server.url, transport)
    try:
        want = expect(3, ["probe(0)"])
        assert [client.reset(3), client.step("probe(0)")] == want
        server.restart()
        with pytest.raises(EnvInfraError):  # the lost episode's step: an infrastructure error, never replayed
            client.step("probe(1)")
        assert server.sessions() == 0  # nothing was made by that step
        want = expect(5, ["probe(0)", "probe(2)"])
        assert [client.reset(5), client.step("probe(0)"), client.step("probe(2)")] == want
        assert server.sessions() == width
        server.restart()
        assert [client.reset(5), client.step("probe(0)"), client.step("probe(2)")] == want  # reset at once
    finally:
        client.close()


@pytest.mark.parametrize("transport", ["http", "ws"])
def test_fork_children_and_restored_sessions_recover(server, transport):
    parent = gym.make(CLUE, server_url=server.url, transport=transport, **KW).unwrapped
    kids = []
    restored = SessionClient(make_transport(transport, server.url, CLUE, KW, 30.0), CLUE, KW)
    try:
        parent.reset(seed=1)
        parent.step("probe(0)")
        kids = parent.fork(2)
        restored.restore(parent._session.snapshot())
        server.restart()
        for env in [parent, *kids]:
            with pytest.raises(EnvInfraError):
                env.step("probe(1)")
        with pytest.raises(EnvInfraError):
            restored.step("probe(1)")
        assert server.sessions() == 0
        for i, env in enumerate([parent, *kids]):
            assert [env.reset(seed=10 + i)[0], env.step("probe(1)")[0]] == local(10 + i, ["probe(1)"])
        assert [restored.reset(seed=9).observation, restored.step("probe(2)").observation] == local(9, ["probe(2)"])
        assert server.sessions() == 4
    finally:
        for env in [*kids, parent]:
            env.close()
        restored.close()


def test_vector_forks_recover_and_mark_mode_reopens_lost_sessions(server):
    vec = RemoteVectorEnv(CLUE, server.url, 2, **KW)
    marked = RemoteVectorEnv(CLUE, server.url, 2, errors="mark", **KW)
    child = None
    try:
        vec.reset(seed=0)
        marked.reset(seed=0)
        child = vec.fork(2)
        server.restart()
        with pytest.raises(BatchInfraError) as info:
            child.step(["probe(0)"] * 4)
        assert sorted(info.value.failures) == [0, 1, 2, 3] and {f.status_code for f in info.value.failures.values()} \
            == {404}
        obs, _ = child.reset(seed=20)
        assert list(obs) == [local(20 + i, [])[0] for i in range(4)]
        _, _, _, trunc, infos = marked.step(["probe(0)"] * 2)  # marked as ended by infra_error ...
        assert trunc.all() and list(infos["termination_reason"]) == ["infra_error"] * 2
        obs = marked.step(["probe(0)"] * 2)[0]  # ... and reset, in new sessions, by the next step
        assert all(o.startswith("ClueProbe:") for o in obs) and server.sessions() == 6
    finally:
        for v in (child, vec, marked):
            if v is not None:
                v.close()
