"""Each pluggable part takes one registration: a new env, a new advantage estimator, a new sandbox backend
and a new policy, each defined here in a few lines, registered once, and then used through every path a
user has (gymnasium.make, a served env session, the training loop, ``forkyard train``, FileQA and the sandbox
service); and every built-in backend meets the backend contract
(:func:`sandbox_server.backends.checks.check_backend_contract`). The same parts from an installed package,
through entry points: tests/repo/test_entry_point_plugins.py."""

from __future__ import annotations

from typing import Any, Literal

import gymnasium as gym
import httpx
import pytest

import envs
from envs.actions import ToolCall
from envs.core import IllegalActionError, Outcome, TextEnv
from sandbox_server.backends import BACKENDS, LocalBackend, LocalBackendConfig, make_backend, register_backend
from sandbox_server.backends.checks import check_backend_contract
from tests.docker_support import SERVER_NAME, UvicornThread, backend_for, require_bwrap
from trainer.estimators import episode_scores, estimator_names, register_estimator, unregister_estimator
from trainer.policies import Policy, get_policy, policy_names, register_policy, unregister_policy

ENV_ID = "forkyard-test/Coin-v0"


class CoinEnv(TextEnv):
    """A hidden coin: ``peek()`` shows it on turn 1, ``guess(b)`` on turn 2 earns 1.0 when right."""

    max_observation_length = 256
    max_action_length = 64

    def __init__(self, render_mode: str | None = None):
        super().__init__(max_turns=2, kwargs={}, render_mode=render_mode)
        self._coin = 0

    def _reset_task(self, options: dict[str, Any] | None) -> str:
        self._coin = int(self.np_random.integers(2))
        return "A coin is hidden. Turn 1: peek(). Turn 2: guess(b)."

    def _legal_actions(self) -> list[str]:
        return ["peek()"] if self._turn == 0 else ["guess(0)", "guess(1)"]

    def _act(self, call: ToolCall) -> Outcome:
        if self._turn == 0 and call.text() == "peek()":
            return Outcome(f"the coin is {self._coin}")
        if self._turn == 1 and call.name == "guess" and call.args in ((0,), (1,)):
            return Outcome("done", reward=float(call.args[0] == self._coin), terminated=True, reason="answered")
        raise IllegalActionError(f"not now: {call.text()}")

    def _task_state(self) -> dict[str, Any]:
        return {"coin": self._coin}

    def _load_task_state(self, state: dict[str, Any]) -> None:
        self._coin = int(state["coin"])


@pytest.fixture(scope="module")
def coin_env_id():
    envs.register_env(ENV_ID, "tests.repo.test_plugins:CoinEnv")  # the one registration
    return ENV_ID


def test_a_new_env_is_one_registration_away_from_every_path(coin_env_id):
    env = gym.make(coin_env_id).unwrapped
    envs.check_fork_contract(env)
    obs, _ = env.reset(seed=3)
    assert obs.startswith("A coin is hidden")
    # the server (built after the registration) serves it, and RemoteEnv reaches it
    from sandbox_server.app import create_env_app

    srv = UvicornThread(create_env_app()).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as http:
            r = http.post("/v1/envs", json={"env_id": coin_env_id, "seed": 3})
            assert r.status_code == 201, r.text
            assert r.json()["observation"] == obs
        remote = gym.make(coin_env_id, server_url=srv.url)
        try:
            assert remote.reset(seed=3)[0] == obs
            _, _, _, _, info = remote.step("peek()")
            assert info["turn"] == 1
        finally:
            remote.close()
    finally:
        srv.stop()


def test_a_new_estimator_is_one_registration_away_from_training(coin_env_id, tmp_path):
    from trainer.tabular_config import TrainConfig
    from trainer.train import train

    calls = []

    def centred(rollout, cfg):  # reward minus one half: a baseline nobody would ship, but a real one
        calls.append(len(rollout.episodes))
        return episode_scores(rollout, [r - 0.5 for r in rollout.rewards])

    register_estimator("test-centred", centred)  # the one registration
    try:
        assert "test-centred" in estimator_names()
        result = train(TrainConfig(env_id=coin_env_id, estimator="test-centred", iterations=3, group_size=4,
                                   eval_episodes=8, device="cpu", run_dir=str(tmp_path)))
        assert calls and all(n > 0 for n in calls)
        assert len(result.metrics) == 3 and result.evaluation["episodes"] == 8
    finally:
        unregister_estimator("test-centred")


class CountingBackend(LocalBackend):
    """The local backend, counting the sandboxes it starts."""

    name = "test-counting"
    started = 0

    def create(self) -> str:
        type(self).started += 1
        return super().create()


def test_a_new_backend_is_one_registration_away_from_envs_and_services():
    require_bwrap()

    class CountingConfig(LocalBackendConfig):
        type: Literal["test-counting"] = "test-counting"

        def build(self):
            return CountingBackend(self.data_dir, state_dir=self.state_dir, server_name=self.server_name)

    register_backend(CountingConfig)  # the one registration
    try:
        backend = make_backend("test-counting", server_name="pytest-plugins")
        assert isinstance(backend, CountingBackend)
        backend.close()
        # FileQA by backend name: the provider is a service over the new backend
        from envs.fileqa import FileQAEnv
        from sandbox_server.embedded import shared_provider

        before = CountingBackend.started
        env = FileQAEnv(backend="test-counting", kinds=["line_count"])
        try:
            env.reset(seed=0)
            obs, *_ = env.step(env.oracle_action())
            assert "correct" in obs
        finally:
            env.close()
        assert CountingBackend.started > before
        assert shared_provider("test-counting").backend.name == "test-counting"
        with pytest.raises(ValueError, match="already registered"):
            register_backend(type("Other", (CountingConfig,), {"__module__": __name__}))
    finally:
        from sandbox_server.shared_providers import close_shared_provider

        close_shared_provider("test-counting")
        BACKENDS.pop("test-counting", None)


def test_a_new_policy_is_one_registration_away_from_forkyard_train(coin_env_id, tmp_path, capsys):
    from trainer.cli import main
    from trainer.tabular import setup
    from trainer.tabular_config import TrainConfig

    results = []
    register_policy("test-tabular", config=TrainConfig, setup=setup, report=results.append,  # the one registration
                    help="the tabular policy, reported to a list")
    try:
        assert policy_names()[-1] == "test-tabular" and isinstance(get_policy("test-tabular"), Policy)
        assert main(["train", "--policy", "test-tabular", "--env", coin_env_id, "--iterations", "2", "--group-size",
                     "4", "--eval-episodes", "4", "--device", "cpu", "--run-dir", str(tmp_path / "run")]) == 0
        (result,) = results
        assert len(result.metrics) == 2 and result.evaluation["episodes"] == 4
        assert result.config.env_id == coin_env_id and (tmp_path / "run" / "summary.json").is_file()
        with pytest.raises(ValueError, match="already registered"):
            register_policy("test-tabular", config=TrainConfig, setup=setup)
    finally:
        unregister_policy("test-tabular")
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:  # gone: argparse refuses it, listing the registered ones
        main(["train", "--policy", "test-tabular"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'test-tabular'" in err and "'tabular'" in err and "'lm'" in err


@pytest.mark.parametrize("kind", ["local", "docker"])
def test_every_built_in_backend_meets_the_backend_contract(kind, fixture_data):
    if kind == "local":
        require_bwrap()  # docker: backend_for skips without an engine (fails in CI)
    backend = backend_for(kind, f"{SERVER_NAME}-contract", fixture_data)
    try:
        check_backend_contract(backend)
    finally:
        backend.close()
