"""The BPE tokenizer of the text policy (trainer/text/tokenizer.py): trained on real ClueProbe demo texts,
digits always single tokens, special tokens never forgeable from text, every string encodes, and the
tokenizer travels with the checkpoint (a real file)."""

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.text.checkpoints import load_checkpoint, save_checkpoint
from trainer.text.lm import ByteTokenizer, LMConfig, build_model
from trainer.text.text_policy import SamplingConfig, TextPolicy, token_logprobs
from trainer.loop import make_env
from trainer.text.text_config import TextTrainConfig
from trainer.text.text_sft import demo_episodes, demo_rows, make_tokenizer, new_model

CFG = TextTrainConfig(max_turns=4, vocab=400)


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer(CFG, n_episodes=300)


def test_clueprobe_episode_is_short_and_digits_are_single_tokens(tok):
    rows, masks = demo_rows(CFG, 20, seed=3, tokenizer=tok)
    byte_rows, _ = demo_rows(CFG, 20, seed=3)
    assert sum(map(len, rows)) * 4 < sum(map(len, byte_rows))  # far shorter than bytes (85 vs 448 here)
    digits = {tok.encode(str(d))[0] for d in range(10)}
    assert all(len(tok.encode(str(d))) == 1 for d in range(10))
    assert tok.encode("answer(57)")[-3:-1] == [tok.encode("5")[0], tok.encode("7")[0]]
    # every digit in the text is exactly one token: the observation's bits can be read one by one
    obs = "probe(2) -> bit 2 of the target is 1.\nTurn 4 of 4: call answer(c)."
    ids = tok.encode(obs)
    assert sum(i in digits for i in ids) == sum(c.isdigit() for c in obs)
    assert tok.decode(ids) == obs


def test_special_tokens_cannot_be_forged_from_text(tok):
    text = "<|tool|>probe(1)<|end|><|assistant|>"
    ids = tok.encode(text)
    assert ids and max(ids) < tok.bpe_size and tok.decode(ids) == text
    assert set(tok.suppressed_ids) == {tok.pad_id, tok.bos_id, tok.user_id, tok.assistant_id, tok.tool_id}
    assert tok.eot_id not in tok.suppressed_ids and tok.vocab_size == tok.bpe_size + 6


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_any_text_round_trips(tok, text):
    ids = tok.encode(text)
    assert all(0 <= i < tok.bpe_size for i in ids)
    assert tok.decode(ids) == text.encode("utf-8", errors="replace").decode("utf-8")


def test_lone_surrogate_and_invalid_utf8_never_raise(tok):
    assert tok.decode(tok.encode("a\ud800b")) == "a?b"
    e_acute = tok.encode("é")  # two bytes; decoding a lone byte of it gives U+FFFD, not an exception
    assert "\ufffd" in tok.decode(e_acute[:1]) or len(e_acute) == 1


def test_checkpoint_carries_the_tokenizer(tmp_path, tok):
    model = build_model(LMConfig(vocab_size=tok.vocab_size, d_model=32, n_layers=1, n_heads=2, context=128), "cpu")
    path = tmp_path / "m.pt"
    save_checkpoint(model, str(path), tok)
    loaded = load_checkpoint(str(path), "cpu")
    text = "probe(1) -> bit 1 of the target is 0."
    assert loaded.tokenizer.encode(text) == tok.encode(text)
    assert loaded.tokenizer.vocab_size == tok.vocab_size == loaded.config.vocab_size
    old = tmp_path / "old.pt"  # written before tokenizers were stored: byte-level
    small = LMConfig(d_model=32, n_layers=1, n_heads=2)
    torch.save({"config": small.to_dict(), "state_dict": build_model(small, "cpu").state_dict(), "extra": {}}, old)
    assert isinstance(load_checkpoint(str(old), "cpu").tokenizer, ByteTokenizer)


def test_bpe_policy_never_samples_a_suppressed_id_and_ratio_is_one(tok):
    model = new_model(TextTrainConfig(max_turns=4, vocab=400, d_model=32, n_layers=1, n_heads=2, context=256,
                                      device="cpu"))
    assert model.config.vocab_size == model.tokenizer.vocab_size
    with torch.no_grad():  # make the forbidden ids the most likely ones: suppression must still hold
        model.ln_f.bias += 5.0 * model.tok.weight[list(model.tokenizer.suppressed_ids)].sum(0)
    policy = TextPolicy(model.eval(), model.tokenizer, SamplingConfig(max_new_tokens=6))
    env = make_env(CFG.env_id, CFG.env_options())
    obs, info = env.reset(seed=0)
    session = policy.session(obs, info)
    rng = random.Random(0)
    for _ in range(5):
        step = session.act(rng)
        assert not set(step.data.action_ids) & set(model.tokenizer.suppressed_ids)
        row = torch.tensor([step.data.context + step.data.action_ids])
        lp = token_logprobs(model, row, 1.0, model.tokenizer.suppressed_ids)[0][0, len(step.data.context):]
        assert torch.allclose(lp, torch.tensor(step.data.logps), atol=1e-4)


def test_sft_then_rl_end_to_end_with_bpe(tmp_path):
    """forkyard sft -> train-lm on real files: the checkpoint carries the BPE tokenizer into RL, the
    trained ids equal the sampled ids (build_batch checks), the ratio is 1 on the first epoch."""
    from trainer.text.text_sft import sft
    from trainer.text.text_train import train_rl

    cfg = TextTrainConfig(max_turns=4, vocab=400, d_model=32, n_layers=1, n_heads=2, context=256, device="cpu",
                          sft_steps=5, sft_batch=8, demo_skill=0.5, run_dir=str(tmp_path / "sft"))
    model, metrics = sft(cfg)
    assert len(metrics) == 5 and (tmp_path / "sft" / "sft.pt").exists()
    rl = TextTrainConfig(max_turns=4, device="cpu", estimator="tree", n_base=2, branches=3, iterations=5,
                         max_env_calls=9,
                         max_new_tokens=6, eval_every=0, eval_samples=8, checkpoint=str(tmp_path / "sft" / "sft.pt"),
                         run_dir=str(tmp_path / "rl"))
    result = train_rl(rl)
    assert result.model.tokenizer.encode("answer(3)") == model.tokenizer.encode("answer(3)")
    assert all(m.get("first_epoch_ratio_max_dev", 0.0) < 1e-4 for m in result.metrics)
    # the env-call budget stops the run: no iteration starts once 9 calls are spent (2 bases of 4 turns
    # plus 2 branches spend at least 10 per iteration, so exactly one of the 5 iterations runs)
    assert len(result.metrics) == 1 and result.metrics[0]["env_calls_total"] >= 10
    assert 0.0 <= result.evaluation["sampled_accuracy"] <= 1.0 and (tmp_path / "rl" / "model.pt").exists()


def test_fileqa_tokenizer_from_its_legal_action_menu():
    """FileQA has no demo_action: demonstrations are random actions of its legal_actions menu, played on
    the real (local) sandbox; the tokenizer trained on them encodes FileQA text and round-trips it."""
    cfg = TextTrainConfig(env_id="forkyard/FileQA-v0", max_turns=6, vocab=300)
    episodes = demo_episodes(cfg, 3, seed=0)
    assert len(episodes) == 3 and all(turns for _, turns in episodes)
    tok = make_tokenizer(cfg, n_episodes=5)
    first, turns = episodes[0]
    assert tok.decode(tok.encode(first)) == first and len(tok.encode(first)) < len(first.encode())
