"""The stop set (trainer/stops.py, field case S50): every sampler of forkyard ends a reply at the tokenizer's EOS
and at every id of the model's generation config, and handles each alike.

The model is a tiny Qwen2 (Qwen2.5's architecture) built from a config, with a ChatML tokenizer whose EOS is
``<|im_end|>`` while the generation config lists ``<|endoftext|>`` and a plain text token (``Q``): the
tokenizer's one id is not the model's whole stop set. Its output layer is set to a fixed distribution
(weights 0, a bias): a few letters, and one stop id carrying a quarter of the mass; every other stop id has
probability ~0. Every path is run: TRL's tree-fork rollout (``TreeForkRollout.play``, batched and serial
samplers) and the text policy (``trainer.rollout`` serial loop and the batched ``RolloutEngine``), each on
ClueProbe. Each reply must end at the stop id, kept with mask 1 and its exact log-prob, with nothing sampled
past it and nothing of it in the action text.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

pytest.importorskip("transformers", reason="the hf extra is not installed (make installs it)")

from trainer.loop import make_env  # noqa: E402
from trainer.waves import group_rollout, tree_rollout  # noqa: E402
from trainer.stops import stop_ids  # noqa: E402
from trainer.text.engine import RolloutEngine  # noqa: E402
from trainer.text.hf import HFCausalLM, HFTokenizerAdapter  # noqa: E402
from trainer.text.text_policy import SamplingConfig, TextPolicy  # noqa: E402
from trainer.trl_rollout import ChatPolicy, TreeForkRollout  # noqa: E402

CLUE = "forkyard/ClueProbe-v0"
#: A ChatML chat template with tools in the style of Qwen2.5's: a newline after each ``<|im_end|>`` (written here:
#: nothing is downloaded).
CHATML = (
    "{%- if tools %}<|im_start|>system\n# Tools\n<tools>{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n</tools>\n"
    "Call a function inside <tool_call></tool_call>.<|im_end|>\n{% endif %}"
    "{%- for m in messages %}{%- if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n"
    "</tool_response><|im_end|>\n{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LETTERS = "xyz"  # what the model writes before it stops: no tool call, so the action is the text as written
MAX_NEW = 30
P_STOP = 0.25  # the forced stop id's share of the mass: a reply reaches MAX_NEW with probability 0.75 ** 30


def chatml_tokenizer(eos: str = "<|im_end|>"):
    """A byte-level BPE ``PreTrainedTokenizerFast`` with Qwen2.5's special tokens and :data:`CHATML`; ``eos`` is
    its one EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE(unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(["probe the bits and answer", "Turn 1 of 3: call probe(k).", "xyz zyx"] * 20,
                           trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<|endoftext|>"],
                                               initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token=eos, pad_token="<|endoftext|>", unk_token="<unk>",
                                   additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    fast.chat_template = CHATML
    return fast


def ids_of(fast) -> dict[str, int]:
    return {t: fast.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>", "Q", *LETTERS)}


def forced_qwen(fast, stop: str):
    """A tiny Qwen2 whose generation config lists ``<|endoftext|>`` and ``Q`` (not the tokenizer's EOS), whose
    config names ``<|endoftext|>``, and whose next-token distribution is fixed: :data:`LETTERS` equally likely,
    ``stop`` with :data:`P_STOP` of the mass, every other token ~0. Returns ``(model, log p(stop))``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    ids = ids_of(fast)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=len(fast), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=1024, tie_word_embeddings=False,
        eos_token_id=ids["<|endoftext|>"], pad_token_id=ids["<|endoftext|>"]))
    model.generation_config.eos_token_id = [ids["<|endoftext|>"], ids["Q"]]
    bias = torch.full((len(fast),), -30.0)
    for ch in LETTERS:
        bias[ids[ch]] = 0.0
    bias[ids[stop]] = math.log(P_STOP / (1 - P_STOP) * len(LETTERS))
    with torch.no_grad():
        model.lm_head.weight.zero_()
    model.lm_head.bias = torch.nn.Parameter(bias)
    return model.eval(), float(torch.log_softmax(bias, -1)[ids[stop]])


def runs(mask: list[int]) -> list[tuple[int, int, int]]:
    """``(start, end, value)`` of each run of equal values in ``mask``."""
    out, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            out.append((start, i, mask[start]))
            start = i
    return out


def test_the_stop_set_is_the_tokenizer_eos_and_every_listed_id():
    fast = chatml_tokenizer()
    ids = ids_of(fast)
    model, _ = forced_qwen(fast, "Q")
    want = {ids["<|im_end|>"], ids["<|endoftext|>"], ids["Q"]}
    assert stop_ids(model, fast) == want
    model.generation_config.eos_token_id = ids["Q"]  # an int, not a list
    model.config.eos_token_id = [ids["x"]]  # the model config's ids count too
    assert stop_ids(model, fast) == {ids["<|im_end|>"], ids["Q"], ids["x"]}
    model.generation_config.eos_token_id = torch.tensor([ids["y"]])  # a tensor
    model.config.eos_token_id = None
    assert stop_ids(model, fast) == {ids["<|im_end|>"], ids["y"]}
    with pytest.raises(ValueError, match="no stop set"):
        stop_ids(None, object())


def test_a_forkyard_hf_model_has_the_same_stop_set_and_may_write_every_stop_id():
    fast = chatml_tokenizer()
    ids = ids_of(fast)
    hf, _ = forced_qwen(fast, "Q")
    tok = HFTokenizerAdapter(fast)
    assert ids["<|endoftext|>"] in tok.suppressed_ids  # a special token: never written, until paired with hf
    model = HFCausalLM(hf, tok)
    assert tok.eot_id == ids["<|im_end|>"]
    assert stop_ids(model, tok) == stop_ids(hf, fast) == {ids["<|im_end|>"], ids["<|endoftext|>"], ids["Q"]}
    assert not set(tok.suppressed_ids) & stop_ids(model, tok)  # every stop id may end an action
    assert fast.convert_tokens_to_ids("<|im_start|>") in tok.suppressed_ids  # a policy still cannot open a turn
    assert TextPolicy(model, tok).stops == stop_ids(model, tok)


@pytest.mark.parametrize("sampler", ["batched", "serial"])
@pytest.mark.parametrize("stop", ["Q", "<|endoftext|>", "<|im_end|>"])
def test_trl_tree_fork_replies_end_at_any_stop_id_as_at_the_eos(sampler, stop):
    """Every model reply of every branch ends at ``stop`` (the tokenizer's EOS or a listed id, handled alike):
    kept with mask 1 and its exact log-prob, no stop id before it, no closer appended, and the action text is
    the reply before it."""
    fast = chatml_tokenizer()
    model, logp_stop = forced_qwen(fast, stop)
    stops = stop_ids(model, fast)
    rollout = TreeForkRollout(CLUE, max_turns=3, max_new_tokens=MAX_NEW, sampler=sampler)
    messages = [{"role": "user", "content": "Solve it."}]
    played = rollout.play(model, fast, None, [(messages, 7), (messages, 8)], 3)
    turns = 0
    for ro in played:
        assert len(ro.episodes) == 3
        for ep in ro.episodes:
            session = ep.steps[-1].data
            model_runs = [(a, b) for a, b, m in runs(session.mask) if m == 1]
            assert len(model_runs) >= len(ep.steps)
            for a, b in model_runs:
                reply = session.completion[a:b]
                assert reply[-1] == fast.convert_tokens_to_ids(stop) and not stops & set(reply[:-1])
                assert len(reply) < MAX_NEW
                assert session.logprobs[b - 1] == pytest.approx(logp_stop, abs=1e-5)
            for step, (a, b) in zip(ep.steps, model_runs[-len(ep.steps):], strict=True):
                text = fast.decode(session.completion[a:b - 1])
                assert step.action == text.strip() and set(step.action) <= set(LETTERS)
                turns += 1
    assert turns >= 6


def test_the_tool_suffix_follows_the_turn_end_the_template_writes():
    """A base tokenizer (EOS ``<|endoftext|>``) under a ChatML template that closes turns with ``<|im_end|>``, an
    id of the model's stop set: the tool message's delta starts after that id, with the template's newline."""
    fast = chatml_tokenizer(eos="<|endoftext|>")
    model, _ = forced_qwen(fast, "Q")
    model.generation_config.eos_token_id = [fast.convert_tokens_to_ids("<|im_end|>")]
    policy = ChatPolicy(model, fast, [{"role": "user", "content": "Solve it."}], [], 1.0, MAX_NEW)
    assert fast.decode(policy.tool_suffix("OK")) == \
        "\n<|im_start|>user\n<tool_response>\nOK\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("stop", ["Q", "<|endoftext|>", "<|im_end|>"])
def test_text_policy_actions_end_at_any_stop_id_serial_and_batched(stop):
    """The text policy with a Hugging Face model (the serial loop and the batched engine, group and tree): every
    action ends at ``stop``, recorded as an end of turn (``stop == "eot"``, mask 1, no closer appended), with its
    exact log-prob, and the action text is the decoded ids before it."""
    fast = chatml_tokenizer()
    hf, logp_stop = forced_qwen(fast, stop)
    tok = HFTokenizerAdapter(fast)
    policy = TextPolicy(HFCausalLM(hf, tok), tok, SamplingConfig(max_new_tokens=MAX_NEW))
    stop_id = fast.convert_tokens_to_ids(stop)
    env = make_env(CLUE, {"max_turns": 3})
    try:
        played = [group_rollout(env, policy, 3, [0, 1, 2], random.Random(4)),
                  RolloutEngine(max_batch=2).group_rollout(env, policy, 3, [0, 1, 2], random.Random(4)),
                  tree_rollout(env, policy, 2, 2, [3, 4], random.Random(5)),
                  RolloutEngine(max_batch=3).tree_rollout(env, policy, 2, 2, [3, 4], random.Random(5))]
    finally:
        env.close()
    assert [s.data.action_ids for s in played[0].steps] == [s.data.action_ids for s in played[1].steps]
    steps = [s for ro in played for s in ro.steps]
    assert len(steps) >= 12
    for s in steps:
        r = s.data
        assert r.stop == "eot" and r.action_ids[-1] == stop_id and not policy.stops & set(r.action_ids[:-1])
        assert r.logps[-1] == pytest.approx(logp_stop, abs=1e-5)
        assert s.action == fast.decode(r.action_ids[:-1]) and set(s.action) <= set(LETTERS)
    for ro in played:  # the next turn's context: the action as sampled, then the observation (no closer added)
        for ep in ro.episodes:
            for prev, nxt in zip(ep.steps, ep.steps[1:], strict=False):
                k = len(prev.data.context) + len(prev.data.action_ids)
                assert nxt.data.context[:k] == prev.data.context + prev.data.action_ids
                assert fast.decode(nxt.data.context[k:k + 2]) == "\n<|im_start|>"  # the template's, after its closer
