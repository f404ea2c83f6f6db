"""Tools in the text policy's prompt: the env's JSON-schema tool definitions open the first user
turn exactly as the Hugging Face chat template renders ``tools=``, model output in every tool-call form maps
to the env action, anything else reaches the env as written, and a model trained on ``<tool_call>`` JSON
demonstrations plays the env through that mapping (real env, real SFT, real CLI)."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest

from tests.docker_support import ROOT
from tests.repo.test_plugins import CoinEnv
from trainer.text.lm import ByteTokenizer, LMConfig, build_model
from trainer.loop import make_env
from trainer.text.text_config import TextTrainConfig
from trainer.text.text_policy import ChatTemplate, SamplingConfig, TextPolicy
from trainer.text.text_sft import demo_episodes, make_tokenizer

CLI = [sys.executable, "-c", "import sys; from trainer.cli import main; sys.exit(main(sys.argv[1:]))"]
CFG = TextTrainConfig(max_turns=3, vocab=300, tools="json")
TOOLS = CFG.env_tools()


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer(CFG, n_episodes=150)


def test_the_env_tools_are_the_env_schemas_and_none_means_none():
    env = make_env(CFG.env_id, CFG.env_options())
    assert list(TOOLS) == env.tool_schemas()
    assert [t["function"]["name"] for t in TOOLS] == ["probe", "answer"]
    assert TextTrainConfig().env_tools() is None and TextTrainConfig().sampling().tools is None


def test_the_prompt_with_tools_is_the_hf_chat_template_with_tools(tok):
    hf_mod = pytest.importorskip("trainer.text.hf")
    pytest.importorskip("transformers", reason="the hf extra is not installed (make installs it)")
    hf = hf_mod.hf_tokenizer(tok)
    template = ChatTemplate(tok, tools=TOOLS)
    first, turns = demo_episodes(CFG, 1, 5)[0]
    messages = [{"role": "user", "content": first}]
    for action, obs in turns:
        messages.append({"role": "assistant", "content": action})
        if obs is not None:
            messages.append({"role": "tool", "content": obs})
    ids, mask = template.render(first, turns)
    assert list(hf.apply_chat_template(messages, tools=list(TOOLS), tokenize=True, return_dict=False)) == ids
    prompt = hf.apply_chat_template(messages[:1], tools=list(TOOLS), tokenize=True, add_generation_prompt=True,
                                    return_dict=False)
    assert list(prompt) == template.first(first)
    text = tok.decode(template.first(first))
    assert text.startswith(json.dumps(TOOLS[0]) + "\n" + json.dumps(TOOLS[1]) + "\n")
    assert len(template.first(first)) > len(ChatTemplate(tok).first(first)) + 50
    # the demonstrated actions are <tool_call> JSON, and only they carry loss
    written = tok.decode([i for i, m in zip(ids, mask, strict=True) if m])
    assert written.count("<tool_call>") == len(turns) and '"name": "answer"' in written


@pytest.mark.parametrize("n", [12, 2, 1])  # 2 and 1: fewer tokens than the cut marker itself
def test_a_cut_never_reaches_into_the_tools(tok, n):
    template = ChatTemplate(tok, max_obs_tokens=n, tools=TOOLS)
    long_obs = "Turn 1 of 3: " + "x y z " * 200
    text = tok.decode(template.first(long_obs))
    assert text.startswith(template.tools_text)
    assert len(template.first(long_obs)) <= len(tok.encode(template.tools_text)) + n + 4
    if n == 12:
        assert text.endswith(" [...cut]")


@pytest.mark.parametrize("written, action", [
    ('<tool_call>{"name": "probe", "arguments": {"k": 1}}</tool_call>', "probe(1)"),
    ('I will look. <tool_call>\n{"name": "answer", "arguments": {"c": 5}}\n</tool_call>', "answer(5)"),
    ('{"name": "probe", "parameters": {"k": 2}}', "probe(2)"),
    ('{"name": "probe", "arguments": "{\\"k\\": 0}"}', "probe(0)"),
    ("probe( 2 )", "probe(2)"),
    ("answer(c=3)", "answer(3)"),
])
def test_model_output_in_any_tool_call_form_maps_to_the_env_action(written, action):
    policy = TextPolicy(None, ByteTokenizer(), SamplingConfig(tools=TOOLS))
    assert policy.to_action(written) == action
    env = make_env(CFG.env_id, CFG.env_options())
    env.reset(seed=1)
    if action.startswith("probe"):  # the env plays the mapped action
        obs, reward, terminated, truncated, info = env.step(policy.to_action(written))
        assert obs.startswith(action + " -> bit") and not info.get("invalid_action")


@pytest.mark.parametrize("written", ["probe(9, 9)", "let me think", '<tool_call>{"name": "rm"}</tool_call>',
                                     '<tool_call>{"name": "probe", "arguments": {"k": 1}}</tool_call>' * 2, ""])
def test_other_output_reaches_the_env_as_written_and_gets_its_invalid_action_observation(written):
    policy = TextPolicy(None, ByteTokenizer(), SamplingConfig(tools=TOOLS))
    assert policy.to_action(written) == written
    env = make_env(CFG.env_id, CFG.env_options())
    env.reset(seed=1)
    obs, reward, terminated, truncated, info = env.step(written)
    assert reward == 0.0 and not terminated and "invalid" in obs.lower()
    assert TextPolicy(None, ByteTokenizer()).to_action('{"name": "probe", "arguments": {"k": 1}}') == \
        '{"name": "probe", "arguments": {"k": 1}}'  # no tools: no mapping


def test_sampled_actions_go_to_the_env_mapped_and_the_record_keeps_the_sampled_ids(tok):
    model = build_model(LMConfig(vocab_size=tok.vocab_size, d_model=32, n_layers=1, n_heads=2, context=512)).eval()
    policy = TextPolicy(model, tok, SamplingConfig(max_new_tokens=6, tools=TOOLS))
    env = make_env(CFG.env_id, CFG.env_options())
    obs, info = env.reset(seed=2)
    session = policy.session(obs, info)
    step = session.act(random.Random(0))
    assert step.action == policy.to_action(tok.decode([i for i in step.data.action_ids if i != tok.eot_id]))
    start = len(step.data.context)
    assert session.ids[start:start + len(step.data.action_ids)] == step.data.action_ids


def test_sft_on_tool_call_json_then_evaluation_plays_the_env_through_the_mapping(tmp_path):
    run = tmp_path / "sft"
    cmd = [*CLI, "sft", "--max-turns", "4", "--threads", "1", "--demo-skill", "1",
           "--sft-steps", "200", "--sft-batch", "16", "--sft-lr", "3e-3", "--tools", "json", "--run-dir", str(run)]
    # 16 episodes a step (the default 32 takes twice as long): the loss ends at the same floor (0.28 with 16 and 32,
    # seeds 0-2) and the sampled invalid share at 2.3-2.5% (1.6% with 32), under the 5% asserted below
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads((run / "sft_summary.json").read_text())["evaluation"]
    assert summary["sampled_invalid_share"] < 0.05 and summary["greedy_invalid_share"] == 0.0
    ev = [*CLI, "eval-lm", str(run / "sft.pt"), "--samples", "64", "--no-exact",
          "--threads", "1"]
    # the two evaluations of the one checkpoint side by side (one thread each)
    procs = [subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for argv in (ev + ["--tools", "json"], ev)]
    try:
        outs = [p.communicate(timeout=600)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    a, b = (json.loads(out.strip().splitlines()[-1]) for out in outs)
    assert a["sampled_invalid_share"] < 0.05
    # without the tools the model sees another prompt than it was trained on: the env reads the JSON calls it still
    # writes (the one reader of every door, field case S62), but it writes fewer of them right
    assert b["sampled_invalid_share"] > a["sampled_invalid_share"] + 0.1


class CoinTurns(CoinEnv):
    """test_plugins' coin env with the ``max_turns`` parameter the text trainer passes, and no tool schemas."""

    def __init__(self, max_turns: int = 2, render_mode: str | None = None):
        super().__init__(render_mode)


def test_tools_on_an_env_without_tool_schemas_are_refused_before_any_work():
    import envs

    envs.register_env("forkyard-test/CoinTurns-v0", "tests.trainer.test_tool_prompt:CoinTurns")
    cfg = TextTrainConfig(env_id="forkyard-test/CoinTurns-v0", max_turns=2)
    cfg.validate()  # without --tools it is fine
    cfg.tools = "json"
    with pytest.raises(ValueError, match="declares no tool schemas"):
        cfg.validate()


def test_exact_evaluation_of_a_json_tool_call_policy_is_refused_with_a_reason(tmp_path):
    out = subprocess.run([*CLI, "eval-lm", str(tmp_path / "none.pt"), "--exact", "--tools", "json"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--exact scores name(args)" in out.stderr
