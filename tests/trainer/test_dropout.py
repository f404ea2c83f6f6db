"""Field case S37: a checkpoint whose config has dropout (GPT-2's 0.1, a Llama's ``attention_dropout``) must
not make the PPO update a different function from the sampling forward. The rollout samples in eval mode;
every RL forward with gradients runs with dropout off (:func:`trainer.update.dropout_off`), so the first
epoch's importance ratio is 1 within float error for any checkpoint. Every model is built from a config and
saved to a temporary folder (the ``--model FOLDER`` path); nothing is downloaded."""

from __future__ import annotations

import random

import pytest
import torch

from trainer.estimators import Assigned
from trainer.text.checkpoints import load_checkpoint, save_checkpoint
from trainer.text.lm import LMConfig, TinyCausalLM
from trainer.loop import collect, make_env
from trainer.text.text_config import TextTrainConfig
from trainer.text.text_policy import token_logprobs
from trainer.text.text_train import PPOTextPolicy
from trainer.text.tokenizer import model_tokenizer
from trainer.update import dropout_off

#: A small RL config: 2 bases x 3 branches on ClueProbe T=3, short actions, two PPO epochs.
CFG = dict(max_turns=3, n_base=2, branches=3, max_new_tokens=6, ppo_epochs=2, device="cpu", seed=0)


def _first_epoch_dev(model, **overrides) -> float:
    """``first_epoch_ratio_max_dev`` of one real iteration of ``model``: a tree rollout sampled by the policy,
    then its PPO update. An untrained model's actions are all invalid (equal rewards, advantages 0), so the
    steps get advantages of alternating sign instead of the estimator's."""
    cfg = TextTrainConfig(**{**CFG, **overrides})
    policy = PPOTextPolicy.from_config(model, cfg)
    env = make_env(cfg.env_id, cfg.env_options())
    try:
        ro, assigned = collect(cfg, env, policy, random.Random(0), 0)
    finally:
        env.close()
    signs = [(-1.0) ** i for i in range(len(assigned.steps))]
    out = policy.update(ro, Assigned(assigned.steps, signs, assigned.n_episodes, assigned.stats))
    assert out["trained_tokens"] > 0
    return out["first_epoch_ratio_max_dev"]


def _dropout_is_live(model) -> bool:
    """Whether ``model`` in training mode gives two different outputs for one input (its dropout is on)."""
    ids = torch.tensor([list(range(3, 40))])
    was = model.training
    model.train()
    try:
        with torch.no_grad():
            a, b = model(ids)[0], model(ids)[0]
    finally:
        model.train(was)
    return not torch.equal(a, b)


@pytest.mark.parametrize("rate", [0.1, 0.3])
def test_a_tiny_checkpoint_with_dropout_trains_at_ratio_one(rate, tmp_path):
    model = TinyCausalLM(LMConfig(d_model=32, n_layers=1, n_heads=2, context=256, dropout=rate))
    path = save_checkpoint(model, str(tmp_path / "drop.pt"))
    model = load_checkpoint(path, device="cpu").eval()
    assert model.config.dropout == rate and _dropout_is_live(model)  # the fault is there to be avoided
    assert _first_epoch_dev(model) < 1e-5
    assert not model.training  # kept in eval mode outside the update


def test_dropout_off_restores_every_mode_and_keeps_gradients():
    model = TinyCausalLM(LMConfig(d_model=32, n_layers=1, n_heads=2, context=64, dropout=0.5))
    model.train()
    model.blocks[0].mlp.eval()  # a mixed state comes back as it was
    before = {name: m.training for name, m in model.named_modules()}
    ids = torch.tensor([list(range(5, 30))])
    with dropout_off(model):
        assert not any(m.training for m in model.modules())
        logp, _, _ = token_logprobs(model, ids)
        with torch.no_grad():
            again, _, _ = token_logprobs(model, ids)
        assert torch.equal(logp.detach(), again)  # deterministic: no dropout
        logp.sum().backward()
    assert model.tok.weight.grad is not None and model.tok.weight.grad.abs().sum() > 0
    assert {name: m.training for name, m in model.named_modules()} == before


transformers = pytest.importorskip("transformers", reason="the hf extra is not installed (make installs it)")


@pytest.fixture(scope="module")
def tok():
    from trainer.text.text_sft import make_tokenizer

    return make_tokenizer(TextTrainConfig(max_turns=3, vocab=300), n_episodes=200)


def _gpt2_folder(tok, folder, rate: float):
    """A tiny GPT-2 built from a config with every dropout at ``rate``, saved as a model folder."""
    from trainer.text.hf import HFCausalLM, save_folder

    cfg = transformers.GPT2Config(vocab_size=tok.vocab_size, n_positions=256, n_embd=32, n_layer=1, n_head=2,
                                  resid_pdrop=rate, embd_pdrop=rate, attn_pdrop=rate,
                                  bos_token_id=tok.bos_id, eos_token_id=tok.eot_id, pad_token_id=tok.pad_id)
    torch.manual_seed(0)
    return save_folder(HFCausalLM(transformers.GPT2LMHeadModel(cfg), tok), folder)


def _llama_folder(tok, folder, rate: float):
    """A tiny Llama built from a config with ``attention_dropout=rate``, saved as a model folder."""
    from trainer.text.hf import HFCausalLM, save_folder

    cfg = transformers.LlamaConfig(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
                                   attention_dropout=rate, bos_token_id=tok.bos_id, eos_token_id=tok.eot_id,
                                   pad_token_id=tok.pad_id)
    torch.manual_seed(0)
    return save_folder(HFCausalLM(transformers.LlamaForCausalLM(cfg), tok), folder)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_a_hugging_face_folder_with_dropout_trains_at_ratio_one(arch, tok, tmp_path):
    folder = (_gpt2_folder if arch == "gpt2" else _llama_folder)(tok, tmp_path / arch, 0.1)
    model = load_checkpoint(str(folder), device="cpu")  # what --model FOLDER loads
    assert _dropout_is_live(model)
    assert _first_epoch_dev(model) < 1e-5


def test_gradient_checkpointing_still_recomputes_with_dropout_off(tok, tmp_path):
    """The checkpointed layers recompute only in training mode: inside :func:`dropout_off` they still do
    (the attention runs twice per update forward), and the gradients equal those of the same model without
    checkpointing, with the attention dropout of its config (0.2) off in both."""
    from trainer.text.hf import configure_training

    folder = _llama_folder(tok, tmp_path / "llama", 0.2)
    plain = load_checkpoint(str(folder), device="cpu")
    ckpt = configure_training(load_checkpoint(str(folder), device="cpu"), gradient_checkpointing=True)
    calls = []
    ckpt.hf.model.layers[0].self_attn.register_forward_hook(lambda *a: calls.append(1))
    ids = torch.tensor([model_tokenizer(plain).encode("probe(1) -> bit 1 is 0. answer(3)")])
    for m in (plain, ckpt):
        with dropout_off(m):
            logp, _, _ = token_logprobs(m, ids, suppress=model_tokenizer(m).suppressed_ids)
            logp.sum().backward()
    assert len(calls) == 2  # forward, then the recomputation in the backward pass
    for (name, a), (_, b) in zip(plain.named_parameters(), ckpt.named_parameters(), strict=True):
        assert torch.allclose(a.grad, b.grad, atol=1e-6, rtol=1e-4), name
    assert _first_epoch_dev(ckpt) < 1e-5
