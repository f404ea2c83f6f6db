"""OpenAI-compatible rollouts (issue 16) against a real server on loopback: ``transformers serve`` with a tiny
Llama that forkyard SFT'd and saved as a Hugging Face folder (built from a config; nothing downloaded).

``transformers serve`` (5.24) returns text but ignores ``logprobs``, so these tests check the text path and
the refusal to train on text; the token-id path (vLLM's ``return_tokens_as_token_ids``) has no server here
to run against (docs/results/hf_policy.md says so)."""

from __future__ import annotations

import json
import os
import random
import subprocess

import pytest

pytest.importorskip("transformers", reason="the hf extra is not installed (make installs it)")
pytest.importorskip("fastapi")

from tests.docker_support import ROOT, free_port, wait_http_ok  # noqa: E402
from trainer.loop import make_env  # noqa: E402
from trainer.openai_rollout import OpenAIPolicy, ServerRecord, require_token_ids  # noqa: E402
from trainer.rollout import group_rollout, tree_rollout  # noqa: E402
from trainer.text_config import TextTrainConfig  # noqa: E402
from trainer.text_sft import sft  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(base URL, model folder) of `transformers serve FOLDER` on a free loopback port."""
    run = tmp_path_factory.mktemp("oa")
    cfg = TextTrainConfig(arch="llama", sft_steps=80, turns=3, d_model=32, n_layers=1, n_heads=2, run_dir=str(run))
    sft(cfg)
    folder = str(run / "sft")
    port = free_port()
    log = open(run / "serve.log", "w")
    proc = subprocess.Popen([str(ROOT / ".venv" / "bin" / "transformers"), "serve", folder, "--host", "127.0.0.1",
                             "--port", str(port)], stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"}, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    if not wait_http_ok(f"{url}/health", 120, proc, run / "serve.log"):
        proc.kill()
        pytest.fail("transformers serve did not answer /health in 120 s")
    yield f"{url}/v1", folder
    proc.terminate()
    proc.wait(timeout=30)
    log.close()


def test_chat_rollouts_with_tools_map_every_answer_to_an_env_action(served):
    base_url, folder = served
    env = make_env("forkyard/ClueProbe-v0", {"turns": 3})
    policy = OpenAIPolicy(base_url, folder, tools=env.tool_schemas(), temperature=0.0, max_tokens=12)
    ro = group_rollout(env, policy, 3, [0, 1, 2], random.Random(0))
    assert ro.env_calls == 9 and all(e.reason is not None for e in ro.episodes)
    for s in ro.steps:
        assert isinstance(s.data, ServerRecord) and s.data.text and s.data.finish_reason in ("stop", "length")
        assert s.data.parsed and s.action.startswith(("probe(", "answer("))  # SFT taught the format
    # temperature 0: the same requests give the same episodes
    again = group_rollout(env, policy, 3, [0, 1, 2], random.Random(0))
    assert [s.action for s in again.steps] == [s.action for s in ro.steps]
    with pytest.raises(ValueError, match="no sampled token ids"):
        require_token_ids(ro)  # the server returned text: never trained on
    env.close()


def test_tree_rollouts_fork_the_chat_with_the_env(served):
    base_url, folder = served
    env = make_env("forkyard/ClueProbe-v0", {"turns": 3})
    policy = OpenAIPolicy(base_url, folder, tools=env.tool_schemas(), temperature=1.0, max_tokens=12)
    ro = tree_rollout(env, policy, 1, 3, [4], random.Random(1))
    assert len(ro.episodes) == 3 and ro.forks >= 1
    base, *branches = ro.episodes
    assert all(b.fork_turn == base.fork_turn for b in branches)
    with pytest.raises(ValueError, match="no entropy"):
        tree_rollout(env, policy, 1, 3, [4], random.Random(1), fork_selection="entropy")
    env.close()


def test_the_documented_command_writes_what_the_server_returned(served, tmp_path):
    base_url, folder = served
    out = tmp_path / "episodes.jsonl"
    r = subprocess.run([str(ROOT / ".venv" / "bin" / "forkyard"), "rollout-openai", "--base-url", base_url,
                        "--model", folder, "--api", "completions", "--template", folder, "--temperature", "0",
                        "--episodes", "4", "--env-kwargs", '{"turns": 3}', "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads(r.stdout)
    assert summary["episodes"] == 4 and summary["env_calls"] == 12 and summary["parsed_share"] == 1.0
    assert summary["trainable"].startswith("no: 12 of 12 steps")
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 4 and all(len(row["steps"]) == 3 for row in rows)
    assert all(st["text"] and st["token_ids"] is None for row in rows for st in row["steps"])
