"""OpenAI-compatible rollouts against a real server on loopback: ``transformers serve`` with a tiny
Llama that forkyard SFT'd and saved as a Hugging Face folder (built from a config; nothing downloaded).

``transformers serve`` (5.24) returns text but ignores ``logprobs``, so these tests check the text path and
the refusal to train on text; the token-id path (vLLM's ``return_tokens_as_token_ids``) has no server here
to run against (docs/results/hf_policy.md says so).

Field case S34 (several tool calls in one turn, an unknown tool, calls in the content after reasoning) runs
against a scripted OpenAI-compatible server (FastAPI under a real uvicorn on loopback) that answers the way
serving stacks do and refuses a history the way the chat API does: 400 "tool_call_ids did not have response
messages" when a call id is left unanswered."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess

import httpx
import pytest

pytest.importorskip("transformers", reason="the hf extra is not installed (make installs it)")
pytest.importorskip("fastapi")

from tests.docker_support import ROOT, UvicornThread, free_port, wait_http_ok  # noqa: E402
from trainer.loop import make_env  # noqa: E402
from trainer.openai_rollout import NOT_EXECUTED, OpenAIPolicy, ServerRecord, require_token_ids  # noqa: E402
from trainer.waves import group_rollout, tree_rollout  # noqa: E402
from trainer.text.text_config import TextTrainConfig  # noqa: E402
from trainer.text.text_sft import sft  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(base URL, model folder) of `transformers serve FOLDER` on a free loopback port."""
    run = tmp_path_factory.mktemp("oa")
    # context 1024: the first request (ClueProbe's prompt and its two tool schemas) is 522 tokens, and since
    # 5.25 the server refuses a prompt plus max_tokens past the model's positions (400) instead of running it
    cfg = TextTrainConfig(arch="llama", sft_steps=80, max_turns=3, d_model=32, n_layers=1, n_heads=2, context=1024,
                          run_dir=str(run))
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
    env = make_env("forkyard/ClueProbe-v0", {"max_turns": 3})
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
    # a refusal carries the server's reason: here a prompt past the model's 1024 positions
    with pytest.raises(httpx.HTTPStatusError, match=r"^400 from .*chat/completions: .*at most 1024"):
        policy.request([{"role": "user", "content": "probe " * 1200}], 0)
    env.close()


def test_tree_rollouts_fork_the_chat_with_the_env(served):
    base_url, folder = served
    env = make_env("forkyard/ClueProbe-v0", {"max_turns": 3})
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
                        "--episodes", "4", "--env-kwargs", '{"max_turns": 3}', "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads(r.stdout)
    assert summary["episodes"] == 4 and summary["env_calls"] == 12 and summary["parsed_share"] == 1.0
    assert summary["trainable"].startswith("no: 12 of 12 steps")
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 4 and all(len(row["steps"]) == 3 for row in rows)
    assert all(st["text"] and st["token_ids"] is None for row in rows for st in row["steps"])


# ------------------------------------------------------------------ field case S34: every call id answered
def _history_error(messages: list[dict]) -> str | None:
    """What the OpenAI chat API says about a history it refuses, or None: every ``tool_calls`` id must be
    answered by a ``tool`` message right after the assistant message, and a ``tool`` message must answer one."""
    i = 0
    while i < len(messages):
        m = messages[i]
        if m.get("role") == "tool":
            return "messages with role 'tool' must be a response to a preceeding message with 'tool_calls'."
        if m.get("role") == "assistant" and m.get("tool_calls"):
            ids = []
            for c in m["tool_calls"]:
                if not isinstance(c.get("id"), str) or c.get("type") != "function" \
                        or not isinstance(c["function"].get("arguments"), str):
                    return f"Invalid 'tool_calls' entry: {c}"
                ids.append(c["id"])
            answered = []
            while i + 1 < len(messages) and messages[i + 1].get("role") == "tool":
                i += 1
                if messages[i].get("tool_call_id") not in ids or not isinstance(messages[i].get("content"), str):
                    return f"Invalid tool message: {messages[i]}"
                answered.append(messages[i]["tool_call_id"])
            missing = [x for x in ids if x not in answered]
            if missing:
                return ("An assistant message with 'tool_calls' must be followed by tool messages responding to each "
                        "'tool_call_id'. The following tool_call_ids did not have response messages: "
                        f"{', '.join(missing)}")
        i += 1
    return None


def _scripted_server(requests: list):
    """A chat-completions server that answers turn t (the number of assistant messages so far) with the t-th
    reply below; its last reply answers the target read from the probe observations in the history."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    def call(cid, name, args):
        return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}

    probe = '<tool_call>{"name": "probe", "arguments": {"k": %d}}</tool_call>'
    app = FastAPI()

    @app.post("/v1/chat/completions")
    def chat(body: dict):
        requests.append(body)
        error = _history_error(body["messages"])
        if error:
            return JSONResponse({"error": {"message": error, "type": "invalid_request_error"}}, status_code=400)
        turn = sum(m["role"] == "assistant" for m in body["messages"])
        message = {"role": "assistant", "content": None}
        if turn == 0:  # two calls in one turn
            message["tool_calls"] = [call("call_a", "probe", {"k": 1}), call("call_b", "probe", {"k": 0})]
        elif turn == 1:  # an unknown tool first
            message["tool_calls"] = [call("call_c", "rm", {"path": "/"}), call("call_d", "probe", {"k": 0})]
        elif turn == 2:  # a call in the content, after one drafted in the reasoning
            message["content"] = f"<think>I could call {probe % 1}, but bit 0 tells more.</think>\n{probe % 0}"
        else:  # the answer, as a call without an id and with arguments as an object (servers do both)
            seen = "\n".join(str(m.get("content")) for m in body["messages"])
            bits = {int(k): int(b) for k, b in re.findall(r"probe\((\d)\) -> bit \d of the target is (\d)", seen)}
            message["tool_calls"] = [{"type": "function", "function": {
                "name": "answer", "arguments": {"c": sum(b << k for k, b in bits.items())}}}]
        return {"id": "x", "object": "chat.completion", "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls", "logprobs": None}]}

    return app


def test_field_case_s34_every_call_of_a_turn_is_answered_and_the_episode_goes_on():
    requests: list = []
    srv = UvicornThread(_scripted_server(requests)).start()
    try:
        env = make_env("forkyard/ClueProbe-v0", {"bits": 2, "max_turns": 4})
        policy = OpenAIPolicy(f"{srv.url}/v1", "scripted", tools=env.tool_schemas(), temperature=0.0)
        ro = group_rollout(env, policy, 2, [0, 1], random.Random(0))
        # the server accepted every history: no 400, every episode ran its four turns and answered right
        assert [len(e.steps) for e in ro.episodes] == [4, 4] and [e.reward for e in ro.episodes] == [1.0, 1.0]
        first = ro.episodes[0].steps
        assert [s.action for s in first[:1] + first[2:3]] == ["probe(1)", "probe(0)"]
        assert [s.data.parsed for s in first] == [True, False, True, True]
        assert "rm" in first[1].action and first[3].action.startswith("answer(")
        last = requests[-1]["messages"]  # the final request of episode 2: the whole chat so far
        tool = {m["tool_call_id"]: m["content"] for m in last if m["role"] == "tool"}
        assert tool["call_a"].startswith("probe(1) -> bit 1 of the target is")  # the env's observation
        assert tool["call_b"] == tool["call_d"] == NOT_EXECUTED
        assert tool["call_c"].startswith("Invalid action")  # the env's invalid-action observation
        user = [m["content"] for m in last if m["role"] == "user"]
        assert len(user) == 2 and user[1].startswith("probe(0) -> bit 0")  # a call without an id: a user turn
        assert [m["role"] for m in last] == ["user", "assistant", "tool", "tool", "assistant", "tool", "tool",
                                             "assistant", "user"]
        # the forks of a tree rollout carry their own chats, each one the API accepts
        n = len(requests)
        tree = tree_rollout(env, policy, 1, 3, [5], random.Random(1))
        assert len(tree.episodes) == 3 and all(e.reward == 1.0 for e in tree.episodes) and len(requests) > n
        env.close()
    finally:
        srv.stop()
