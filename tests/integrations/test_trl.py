"""forkyard envs in TRL's real ``GRPOTrainer`` (trl pinned in the ``integrations`` extra): with
``envs.trl.environment_factory`` (ClueProbe in this process and on a server over HTTP, FileQA on the local
backend) and with the tree-fork ``rollout_func`` ``trainer.trl_rollout.TreeForkRollout`` (ClueProbe with
uniform and entropy fork turns, in-process and forked on a server; FileQA forked on a server, sandboxes
included). The policy is a tiny Qwen3 built from a config with a byte-level BPE trained here, carrying the
Qwen3 chat template TRL recognises; a few seconds of SFT on scripted tool calls (the env's own
``demo_action``) gets it calling tools. Each run is 2 GRPO steps on the CPU; the tests assert that tool calls
reached the env, that the env's reward was computed, that each group is one tree (one prompt, one fork
turn, the prefix's tokens shared, env tokens masked) and that no session (nor sandbox) is left. The
rollout_func's batched sampler (``trainer.trl_engine``, the default) is checked against its serial one on the
same seeds: the same rows token for token, log-probs within float32 rounding (CPU, 5e-5)."""

from __future__ import annotations

import copy
import gc
import json
import random
import re

import gymnasium as gym
import pytest
import torch
from datasets import Dataset
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM
from trl import GRPOConfig, GRPOTrainer
from trl.chat_template_utils import qwen3_chat_template, supports_tool_calling

import envs  # noqa: F401 - registers the forkyard ids
from envs.clueprobe import ClueProbeEnv
from envs.core import EnvInfraError
from envs.tool_calls import action_to_call
from envs.trl import EPISODE_OVER, environment_factory
from trainer.stops import stop_ids
from trainer.trl_engine import sample_rows
from trainer.trl_rollout import TreeForkRollout
from sandbox_server.app import create_env_app
from tests.docker_support import UvicornThread, require_bwrap

CLUE = "forkyard/ClueProbe-v0"
FILEQA = "forkyard/FileQA-v0"
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<tool_response>",
           "</tool_response>", "<think>", "</think>"]
PROMPT = "Use the tools to solve the task."


def demo_chats(env_id: str, kwargs: dict, n: int) -> tuple[list[list[dict]], list[dict]]:
    """``n`` demonstration conversations (the env's ``demo_action`` as tool calls) and the env's tools."""
    env = gym.make(env_id, **kwargs).unwrapped
    tools, rng, chats = env.tool_schemas(), random.Random(0), []
    try:
        for seed in range(n):
            obs, _ = env.reset(seed=seed)
            chat = [{"role": "user", "content": PROMPT + obs}]
            done = False
            while not done:
                action = env.demo_action(rng, 0.5)
                call = action_to_call(action, tools)
                chat.append({"role": "assistant", "content": "",
                             "tool_calls": [{"type": "function", "function": call}]})
                obs, _, term, trunc, _ = env.step(action)
                chat.append({"role": "tool", "name": call["name"], "content": obs})
                done = term or trunc
            chats.append(chat)
    finally:
        env.close()
    return chats, tools


def tiny_policy(chats: list[list[dict]], tools: list, steps: int = 300, batch: int = 8, lr: float = 3e-3,
                max_loss: float = 0.5):
    """A tiny Qwen3 (hidden 64, 2 layers) and its tokenizer, SFT'd on ``chats`` (``steps`` Adam steps of
    ``batch`` conversations, loss on the assistant turns only) until its loss is under ``max_loss``; ``steps=0``: the
    random model. ``tools``: the tool definitions the chats are rendered with, or one list of them per chat (chats of
    several envs)."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe)
    tok.chat_template = qwen3_chat_template
    per_chat = tools if tools and isinstance(tools[0], list) else [tools] * len(chats)
    texts = [tok.apply_chat_template(c, tools=t, tokenize=False) for c, t in zip(chats, per_chat, strict=True)]
    bpe.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=600, special_tokens=SPECIAL,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = qwen3_chat_template
    assert supports_tool_calling(tok)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, max_position_embeddings=2048, tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id))
    rows = [assistant_labels(tok, t) for t in texts]
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for step in range(steps):
        picked = [rows[(step * batch + i) % len(rows)] for i in range(batch)]
        ids = torch.nn.utils.rnn.pad_sequence([r[0] for r in picked], batch_first=True, padding_value=0)
        labels = torch.nn.utils.rnn.pad_sequence([r[1] for r in picked], batch_first=True, padding_value=-100)
        mask = torch.nn.utils.rnn.pad_sequence([torch.ones_like(r[0]) for r in picked], batch_first=True)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    if steps:
        assert loss.item() < max_loss, loss.item()
    return model.eval(), tok


def assistant_labels(tok, text: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids of ``text`` and labels that keep only the assistant turns (the tool calls and their end)."""
    enc = tok(text, return_offsets_mapping=True)
    spans = [(m.start(1), m.end(1)) for m in re.finditer(r"<\|im_start\|>assistant\n(.*?<\|im_end\|>)", text, re.S)]
    pairs = zip(enc["input_ids"], enc["offset_mapping"], strict=True)
    labels = [i if any(a <= s0 < b for a, b in spans) else -100 for i, (s0, _) in pairs]
    return torch.tensor(enc["input_ids"]), torch.tensor(labels)


def grpo_trainer(tmp_path, model, tok, factory, seeds: list[int], max_completion_length: int = 256,
                 prompt: str = PROMPT, batch: int = 4, **trainer_kwargs) -> GRPOTrainer:
    """TRL's GRPOTrainer for 2 steps of ``batch`` rows (groups of 4) over rows with ``seeds``, not yet trained."""
    rows = Dataset.from_list([{"prompt": [{"role": "user", "content": prompt}], "seed": s} for s in seeds])
    args = GRPOConfig(output_dir=str(tmp_path / "grpo"), max_steps=2, per_device_train_batch_size=batch,
                      num_generations=4, max_completion_length=max_completion_length, learning_rate=1e-4,
                      logging_steps=1, report_to=[], save_strategy="no", use_cpu=True, seed=0, beta=0.0,
                      max_tool_calling_iterations=4, dataloader_num_workers=0, disable_tqdm=True)
    return GRPOTrainer(model=model, processing_class=tok, args=args, train_dataset=rows,
                       environment_factory=factory, **trainer_kwargs)


def grpo(tmp_path, model, tok, factory, seeds: list[int], max_completion_length: int = 256, prompt: str = PROMPT,
         **trainer_kwargs) -> GRPOTrainer:
    trainer = grpo_trainer(tmp_path, model, tok, factory, seeds, max_completion_length, prompt, **trainer_kwargs)
    trainer.train()
    return trainer


def check_run(trainer: GRPOTrainer, name: str) -> None:
    pool = trainer._environment_pool[None]
    assert pool and sum(e.env.turn for e in pool) > 0, "no tool call reached the env"
    logged = [h for h in trainer.state.log_history if f"rewards/{name}/mean" in h]
    assert len(logged) == 2, trainer.state.log_history
    assert all(isinstance(h[f"rewards/{name}/mean"], float) for h in logged)


@pytest.fixture(scope="module")
def clue_sft():
    """The tiny Qwen3 SFT'd on ClueProbe demonstrations, run once for the module and never trained further: tests
    take copies (:func:`clue_policy`, :func:`untrained_clue_policy`)."""
    chats, tools = demo_chats(CLUE, {"max_turns": 2}, 48)
    return tiny_policy(chats, tools)


@pytest.fixture(scope="module")
def clue_policy(clue_sft):
    """A copy of :func:`clue_sft` that this module's GRPO tests train further, one after another."""
    return copy.deepcopy(clue_sft)


def test_environment_factory_tools_follow_the_schemas():
    from transformers.utils import get_json_schema

    Env = environment_factory(CLUE, max_turns=2)
    env = Env()
    schema = get_json_schema(env.probe)["function"]
    assert schema["name"] == "probe" and schema["parameters"]["properties"]["k"]["type"] == "integer"
    assert schema["parameters"]["required"] == ["k"]
    public = sorted(m for m in dir(Env) if not m.startswith("_") and callable(getattr(Env, m)))
    assert public == ["answer", "get_reward", "probe", "reset"]  # TRL offers every other public method as a tool
    first = env.reset(seed=3, prompt="ignored")
    again = Env()
    assert again.reset(seed=3) == first  # a GRPO group (one seed) shares one task
    assert "Invalid action" in env.probe(k="x") and env.env.turn == 1  # the env's invalid-action observation
    env.answer(c=0)
    assert env.done and env.get_reward() in (0.0, 1.0) and env.probe(k=0) == EPISODE_OVER
    assert Env().reset(seed="3") == first  # a CSV column arrives as text
    for bad in (1.5, True, -2, "abc"):
        with pytest.raises(ValueError, match="seed must be a non-negative integer"):
            env.reset(seed=bad)
    gym.register("forkyard-test/NoTools-v0", entry_point=NoTools)
    try:
        with pytest.raises(ValueError, match="no tool schemas"):
            environment_factory("forkyard-test/NoTools-v0")
    finally:
        gym.registry.pop("forkyard-test/NoTools-v0")


class NoTools(ClueProbeEnv):
    """ClueProbe without its ToolSchemas feature."""

    tool_schemas = None


def test_grpo_trains_on_clueprobe_in_process(tmp_path, clue_policy):
    model, tok = clue_policy
    trainer = grpo(tmp_path, model, tok, environment_factory(CLUE, max_turns=2), list(range(4)))
    check_run(trainer, "ClueProbev0")


def test_grpo_trains_on_clueprobe_over_http_and_leaves_no_session(tmp_path, clue_policy):
    model, tok = clue_policy
    srv = UvicornThread(create_env_app()).start()
    try:
        trainer = grpo(tmp_path, model, tok, environment_factory(CLUE, max_turns=2, server_url=srv.url), list(range(4)))
        check_run(trainer, "ClueProbev0")
        sessions = srv.server.config.app.state.env_sessions
        assert len(sessions) == len(trainer._environment_pool[None])
        del trainer
        gc.collect()
        assert len(sessions) == 0  # TRL never closes its envs: the factory's instances did, when dropped
    finally:
        srv.stop()


def test_a_forkyard_checkpoint_trains_in_trls_tool_loop(tmp_path):
    """forkyard's own SFT (``--arch llama --tools json``) writes a folder TRL takes as it is: its chat template
    passes TRL's tool-calling check and is prefix-preserving, its tokenizer carries the response template TRL
    parses tool calls with, and the model's calls reach the env. The SFT is the README's command for TRL
    (``TRL_SFT`` of tests/repo/test_docs_commands.py: 150 steps of 16 episodes, context 1024), run once per session
    for this test and the docs test's TRL block, which trains the same folder."""
    from trl.chat_template_utils import is_chat_template_prefix_preserving

    from tests.repo.test_docs_commands import ROOT, TRL_SFT, assert_ran, run_before

    assert_ran(TRL_SFT, run_before(TRL_SFT))
    run_dir = ROOT / TRL_SFT.split("--run-dir ")[1].split()[0]
    metrics = [json.loads(line) for line in (run_dir / "sft_metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 150 and metrics[-1]["loss"] < 0.5
    folder = str(run_dir / "sft")
    tok = AutoTokenizer.from_pretrained(folder)
    assert supports_tool_calling(tok) and is_chat_template_prefix_preserving(tok)
    assert tok.response_template is not None  # TRL's add_response_schema knows no forkyard template: not needed
    trainer = grpo(tmp_path, folder, None, environment_factory(CLUE, max_turns=2), list(range(4)), 128, prompt="")
    check_run(trainer, "ClueProbev0")


FILEQA_KWARGS = {"kinds": ["line_count"], "max_turns": 3}


@pytest.fixture(scope="module")
def fileqa_policy():
    require_bwrap()
    chats, tools = demo_chats(FILEQA, {"backend": "local", **FILEQA_KWARGS}, 8)
    return tiny_policy(chats, tools, steps=150, batch=2, lr=5e-3, max_loss=1.0)  # prompts of ~1,700 tokens


def test_grpo_trains_on_fileqa_local_backend(tmp_path, fileqa_policy):
    from sandbox_server.embedded import shared_provider

    model, tok = fileqa_policy
    factory = environment_factory(FILEQA, backend="local", **FILEQA_KWARGS)
    trainer = grpo(tmp_path, model, tok, factory, list(range(4)), 384)
    check_run(trainer, "FileQAv0")
    del trainer
    gc.collect()
    assert shared_provider("local").list() == []  # every env gave its sandbox back


# ------------------------------------------------------------------------------------ tree-fork rollout_func
def runs(mask: list[int]) -> list[int]:
    """Lengths of the runs of equal values in ``mask`` (model reply, env reply, model reply, ...)."""
    out: list[int] = []
    for i, m in enumerate(mask):
        if i and m == mask[i - 1]:
            out[-1] += 1
        else:
            out.append(1)
    return out


def check_tree(rollout: TreeForkRollout, rows: dict, g: int = 4) -> None:
    """Each group of g rows is one tree: one prompt, one fork turn, and the branches repeat the base's tokens
    up to the fork turn (the prefix played once), each then sampling its own continuation."""
    eps = rollout.episodes
    assert len(eps) == len(rows["completion_ids"]) and len(eps) % g == 0
    for j in range(0, len(eps), g):
        group = eps[j:j + g]
        assert [e.branch for e in group] == list(range(g)) and len({e.seed for e in group}) == 1
        assert all(rows["prompt_ids"][j + i] == rows["prompt_ids"][j] for i in range(g))
        t = group[0].fork_turn
        assert t is not None and all(e.fork_turn == t for e in group[1:])
        assert all(e.steps[0].turn == t for e in group[1:])  # a branch's own steps start at the fork turn
        base_runs = runs(rows["env_mask"][j])
        prefix = sum(base_runs[:2 * t])  # t model replies and the t env replies after them
        for i in range(1, g):
            assert rows["completion_ids"][j + i][:prefix] == rows["completion_ids"][j][:prefix]
        for i in range(g):
            c, lp, m = rows["completion_ids"][j + i], rows["logprobs"][j + i], rows["env_mask"][j + i]
            assert len(c) == len(lp) == len(m) and m[0] == 1
            assert all(x == 0.0 for x, k in zip(lp, m, strict=True) if k == 0) and all(x <= 0.0 for x in lp)


class Recording(TreeForkRollout):
    """The rollout_func under test, keeping what it returned to TRL."""

    def __call__(self, prompts, trainer):
        self.rows = super().__call__(prompts, trainer)
        self.calls = getattr(self, "calls", []) + [(self.rows, self.episodes)]
        return self.rows


@pytest.mark.parametrize("fork_turn", ["uniform", "entropy"])
def test_tree_fork_rollout_func_in_grpo(tmp_path, clue_policy, fork_turn):
    model, tok = clue_policy
    rollout = Recording(CLUE, max_turns=3, fork_turn=fork_turn, max_new_tokens=48)
    trainer = grpo(tmp_path, model, tok, None, list(range(4)), reward_funcs=[rollout.reward], rollout_func=rollout)
    check_tree(rollout, rollout.rows)
    assert rollout.env_calls >= 4 * 2  # every branch acted at least once (4 rows per step, 2 steps)
    logged = [h for h in trainer.state.log_history if "rewards/reward/mean" in h]
    assert len(logged) == 2


def test_the_control_arm_plays_independent_episodes_of_one_task(tmp_path, clue_policy):
    model, tok = clue_policy
    rollout = Recording(CLUE, max_turns=3, fork_turn="none", max_new_tokens=48)
    trainer = grpo(tmp_path, model, tok, None, list(range(4)), reward_funcs=[rollout.reward], rollout_func=rollout)
    for rows, episodes in rollout.calls:
        assert [ep.branch for ep in episodes] == [0] * 4 and len({ep.seed for ep in episodes}) == 1  # one task
        assert len(set(map(tuple, rows["prompt_ids"]))) == 1 and rollout.env_calls >= 4
    assert len([h for h in trainer.state.log_history if "rewards/reward/mean" in h]) == 2
    with pytest.raises(ValueError, match="fork_turn"):
        TreeForkRollout(CLUE, fork_turn="middle")


def test_tree_fork_rollout_func_forks_on_a_server_and_leaves_no_session(tmp_path, clue_policy):
    model, tok = clue_policy
    srv = UvicornThread(create_env_app()).start()
    try:
        rollout = Recording(CLUE, max_turns=3, max_new_tokens=48, server_url=srv.url)
        grpo(tmp_path, model, tok, None, list(range(4)), reward_funcs=[rollout.reward], rollout_func=rollout)
        check_tree(rollout, rollout.rows)
        assert len(srv.server.config.app.state.env_sessions) == 0
    finally:
        srv.stop()


def test_tree_fork_rollout_func_on_fileqa_forks_sandboxes_on_a_server(tmp_path, fileqa_policy):
    from sandbox_server.embedded import shared_provider

    model, tok = fileqa_policy
    provider = shared_provider("local")
    srv = UvicornThread(create_env_app(sandbox_provider=provider)).start()
    try:
        rollout = Recording(FILEQA, max_new_tokens=48, server_url=srv.url, **FILEQA_KWARGS)
        grpo(tmp_path, model, tok, None, list(range(4)), 384, reward_funcs=[rollout.reward], rollout_func=rollout)
        check_tree(rollout, rollout.rows)
        assert len(srv.server.config.app.state.env_sessions) == 0
    finally:
        srv.stop()
    assert provider.list() == []  # every session (forks included) gave its sandbox back


class FlakyClueProbe(ClueProbeEnv):
    """ClueProbe whose reset fails through the infrastructure for even seeds."""

    def _reset_task(self, options):
        if self._np_random_seed % 2 == 0:
            raise EnvInfraError("no sandbox for even seeds")
        return super()._reset_task(options)


def test_a_group_lost_at_its_reset_keeps_its_rows_and_gets_no_reward(tmp_path, clue_policy):
    model, tok = clue_policy
    gym.register("forkyard-test/Flaky-v0", entry_point=FlakyClueProbe)
    try:
        rollout = Recording("forkyard-test/Flaky-v0", max_turns=2, max_new_tokens=48)
        trainer = grpo(tmp_path, model, tok, None, list(range(4)), reward_funcs=[rollout.reward],
                       rollout_func=rollout)
    finally:
        gym.registry.pop("forkyard-test/Flaky-v0")
    (lost, lost_eps), (ran, _) = rollout.calls  # one group per step: seed 0 (lost at its reset), then 1009
    assert len(lost["completion_ids"]) == 4 and lost["env_reward"] == [None] * 4
    assert all(e.infra_failure for e in lost_eps) and all(m == [0] for m in lost["env_mask"])
    assert len(ran["completion_ids"]) == 4 and all(r is not None for r in ran["env_reward"])
    assert len([h for h in trainer.state.log_history if "rewards/reward/mean" in h]) == 2


# ------------------------------------------------------------------------------------ batched sampling
@pytest.fixture(scope="module")
def untrained_clue_policy(clue_sft):
    """The SFT'd policy of :func:`clue_policy` made afresh and in eval mode, for the batched-equals-serial tests:
    ``clue_policy`` is trained further by the GRPO tests of this module, after which padded and unpadded attention
    were measured to differ by up to 1.2e-3 nats on unlikely tokens (enough to flip an inverse-CDF draw), so
    those tests would depend on which tests ran before them. A copy of :func:`clue_sft`, the same SFT run (its
    weights as the SFT left them, whatever :func:`clue_policy` went through since)."""
    model, tok = copy.deepcopy(clue_sft)
    return model.eval(), tok


#: How far a batched reply's log-probs may be from the same reply's sampled alone (nats): float32 rounding only,
#: as SDPA attention sums a left-padded row and an unpadded one in different orders (the logits, of size ~10,
#: differ by about 1e-6 relative). Measured on the tiny Qwen3 on CPU: 3e-6 to 1.2e-5, depending on its SFT run.
LOGP_TOL = 5e-5
def test_batched_replies_are_the_one_at_a_time_replies_and_their_log_probs_the_models(untrained_clue_policy):
    """sample_rows over contexts of different lengths (left-padded, one forward per token, rows leaving at EOS)
    draws what each row draws alone from the same stream, and each log-prob is the tempered log-softmax of a
    plain forward over context + reply, up to float32 rounding (:data:`LOGP_TOL`)."""
    model, tok = untrained_clue_policy
    chat = [{"role": "user", "content": PROMPT + " " + "x" * k} for k in (0, 40, 90)]
    contexts = [list(tok.apply_chat_template([c], add_generation_prompt=True, tokenize=True, return_dict=False))
                for c in chat]
    assert len({len(c) for c in contexts}) == 3
    args = (1.0, 40, stop_ids(model, tok), tok.pad_token_id)
    together = sample_rows(model, contexts, [random.Random(s) for s in (1, 2, 3)], *args)
    alone = [sample_rows(model, [c], [random.Random(s)], *args)[0] for c, s in zip(contexts, (1, 2, 3), strict=True)]
    for (ids, lps, ent), (ids1, lps1, ent1), ctx in zip(together, alone, contexts, strict=True):
        assert ids == ids1 and ids and (ids[-1] == tok.eos_token_id or len(ids) == 40)
        assert max(abs(a - b) for a, b in zip(lps, lps1, strict=True)) < LOGP_TOL and abs(ent - ent1) < LOGP_TOL
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ctx + ids])).logits[0, len(ctx) - 1:-1].float()
        ref = torch.log_softmax(logits, -1)
        assert torch.allclose(ref[torch.arange(len(ids)), ids], torch.tensor(lps), rtol=0, atol=LOGP_TOL)
        assert abs(float(-(ref[0].exp() * ref[0]).sum()) - ent) < LOGP_TOL
    assert len({len(r[0]) for r in together}) > 1  # rows stopped at different tokens


@pytest.mark.parametrize("fork_turn", ["uniform", "entropy", "none"])
def test_batched_rollout_func_gives_the_serial_rows(tmp_path, untrained_clue_policy, fork_turn):
    """Two groups (a tree each, or G independent episodes) played in batched waves (3 sessions a wave: the
    branches of one group span waves) give the serial path's rows token for token, log-probs within float32
    rounding (:data:`LOGP_TOL`)."""
    model, tok = untrained_clue_policy
    trainer = grpo_trainer(tmp_path, model, tok, None, list(range(8)), batch=8,
                           reward_funcs=[lambda completions, **kwargs: [0.0] * len(completions)])
    prompts = [[{"role": "user", "content": PROMPT}]] * 4 + [[{"role": "user", "content": PROMPT + " "}]] * 4
    rows, episodes = {}, {}
    for sampler in ("serial", "batched"):
        rollout = TreeForkRollout(CLUE, max_turns=3, fork_turn=fork_turn, max_new_tokens=40, temperature=1.3,
                                  sampler=sampler, max_batch=3)
        rows[sampler], episodes[sampler] = rollout(prompts, trainer), rollout.episodes
    serial, batched = rows["serial"], rows["batched"]
    if fork_turn != "none":
        check_tree(rollout, batched)
    for key in ("prompt_ids", "completion_ids", "env_mask", "env_reward"):
        assert batched[key] == serial[key], key
    for x, y in zip(serial["logprobs"], batched["logprobs"], strict=True):
        assert max(abs(a - b) for a, b in zip(x, y, strict=True)) < LOGP_TOL
    assert [(e.fork_turn, len(e.steps), e.reward) for e in episodes["serial"]] == \
        [(e.fork_turn, len(e.steps), e.reward) for e in episodes["batched"]]
    assert len(set(map(tuple, serial["completion_ids"]))) == 8  # every row sampled its own continuation
    with pytest.raises(ValueError, match="sampler"):
        TreeForkRollout(CLUE, sampler="vllm")
