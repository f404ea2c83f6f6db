"""The update on a tree as a tree (:mod:`trainer.text.tree_update`): rows merged into prefix tries and computed
once per shared prefix give the flat padded update's log-probs, entropies, loss and gradients within float
rounding, on forkyard's transformer and on a ``transformers`` Llama, for any rows (hypothesis) and for a real
tree-fork rollout's PPO update. Models are built from configs; nothing is downloaded."""

from __future__ import annotations

import copy
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.estimators import Assigned
from trainer.loop import collect, make_env
from trainer.text.lm import ByteTokenizer, LMConfig, build_model
from trainer.text.text_config import TextTrainConfig
from trainer.text.text_policy import pad_rows, token_logprobs
from trainer.text.text_train import PPOTextPolicy, build_batch
from trainer.text.tree_update import pack_rows, tree_token_logprobs

TOK = ByteTokenizer()
CFG = LMConfig(vocab_size=TOK.vocab_size, d_model=32, n_layers=2, n_heads=2, context=160)


def _model(arch: str):
    if arch == "tiny":
        return build_model(CFG, device="cpu", seed=1)
    from trainer.text.hf import build_llama

    return build_llama(CFG, TOK, device="cpu", seed=1)


def _branching_rows(rng: random.Random, n: int = 7) -> list[list[int]]:
    """Rows as a tree's: a shared trunk cut at random turns, then each row's own tokens; one unrelated row."""
    trunk = [rng.randrange(200) for _ in range(40)]
    rows = [trunk[: rng.randrange(4, 40)] + [rng.randrange(200) for _ in range(rng.randrange(1, 25))]
            for _ in range(n - 1)]
    return rows + [[rng.randrange(200) for _ in range(15)]]


def _inside(rows: list[list[int]]) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.arange(width)[None] < torch.tensor([len(r) for r in rows])[:, None]


def test_the_trie_holds_each_distinct_prefix_once_and_a_node_sees_exactly_its_ancestors():
    rows = [[5, 6, 7, 8], [5, 6, 9], [5, 6, 7, 10, 11], [4]]
    assert pack_rows(rows, TOK.pad_id, "cpu").ids.shape[0] == 2  # the default cap: 1.5 x the longest row
    packed = pack_rows(rows, TOK.pad_id, "cpu", max_nodes=8)
    # distinct prefixes: 5, 56, 567, 5678, 569, 567 10, 567 10 11, 4 -> 8 nodes against 4 x 5 padded slots
    assert packed.nodes == 8 and packed.flat_tokens == 20
    assert packed.ids.shape == (1, 8)
    for i, row in enumerate(rows):
        slots = packed.row_nodes[i, : len(row)]
        assert packed.ids[0, slots].tolist() == row  # the row's tokens, in order, through its nodes
        assert packed.positions[0, slots].tolist() == list(range(len(row)))
        for j, s in enumerate(slots.tolist()):
            seen = set(torch.nonzero(packed.attention[0, s]).flatten().tolist())
            assert seen == set(slots[: j + 1].tolist())  # its ancestors and itself, nothing of a sibling
            assert packed.parent[0, s] == (slots[j - 1] if j else -1)


def test_a_node_cap_splits_the_rows_into_packs_and_a_longer_row_gets_its_own():
    rng = random.Random(3)
    rows = _branching_rows(rng)
    packed = pack_rows(rows, TOK.pad_id, "cpu", max_nodes=30)
    assert packed.ids.shape[0] > 1
    assert packed.ids.shape[1] == max(30, max(len(r) for r in rows))
    for i, row in enumerate(rows):
        p, slots = int(packed.row_pack[i]), packed.row_nodes[i, : len(row)]
        assert packed.ids[p, slots].tolist() == row
    with pytest.raises(ValueError):
        pack_rows([[1], []], TOK.pad_id, "cpu")
    with pytest.raises(ValueError):
        pack_rows([], TOK.pad_id, "cpu")


@pytest.mark.parametrize("arch", ["tiny", "llama"])
@pytest.mark.parametrize("max_nodes", [2048, 40])
def test_tree_logprobs_entropies_and_gradients_equal_the_flat_ones(arch, max_nodes):
    model = _model(arch)
    rows = _branching_rows(random.Random(0))
    inside = _inside(rows)
    weights = torch.randn(inside.shape, generator=torch.Generator().manual_seed(0)) * inside
    flat_lp, flat_ent, _ = token_logprobs(model, pad_rows(rows, TOK.pad_id, "cpu"), 0.7, TOK.suppressed_ids)
    (flat_lp * weights).sum().backward()
    flat_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    packed = pack_rows(rows, TOK.pad_id, "cpu", max_nodes=max_nodes)
    assert packed.nodes < packed.flat_tokens
    tree_lp, tree_ent = tree_token_logprobs(model, packed, 0.7, TOK.suppressed_ids)
    (tree_lp * weights).sum().backward()
    assert torch.allclose(tree_lp[inside], flat_lp.detach()[inside], atol=1e-5)
    assert torch.allclose(tree_ent[inside], flat_ent.detach()[inside], atol=1e-5)
    assert not tree_lp[~inside].any()
    for flat, p in zip(flat_grads, model.parameters(), strict=True):  # float32 sums in another order: an element
        scale = max(1.0, flat.abs().max().item())  # near 0 in a tensor of magnitude 13 came 3.8e-6 apart (a bias)
        assert torch.allclose(p.grad, flat, rtol=1e-4, atol=1e-6 * scale)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=12), min_size=1, max_size=8),
       st.integers(1, 24))
def test_any_rows_get_the_flat_logprobs(rows, max_nodes):
    """Few distinct tokens make rows share prefixes, repeat whole, or contain one another."""
    model = _model("tiny")
    with torch.no_grad():
        flat = token_logprobs(model, pad_rows(rows, TOK.pad_id, "cpu"), 1.0, TOK.suppressed_ids)[0]
        tree = tree_token_logprobs(model, pack_rows(rows, TOK.pad_id, "cpu", max_nodes), 1.0, TOK.suppressed_ids)[0]
    inside = _inside(rows)
    assert torch.allclose(tree[inside], flat[inside], atol=1e-5)


@pytest.mark.parametrize("arch", ["tiny", "llama"])
def test_a_tree_fork_ppo_update_is_the_flat_one(arch):
    """One real iteration on ClueProbe (2 bases x 3 branches), two PPO epochs from the same weights and Adam
    state: the same statistics, and the same weights after the update."""
    cfg = TextTrainConfig(max_turns=3, n_base=2, branches=3, max_new_tokens=6, ppo_epochs=2, device="cpu", seed=0)
    model = _model(arch)
    flat = PPOTextPolicy.from_config(model, cfg)
    tree = PPOTextPolicy.from_config(copy.deepcopy(model), TextTrainConfig(**{**cfg.__dict__, "update": "tree"}))
    env = make_env(cfg.env_id, cfg.env_options())
    try:
        ro, assigned = collect(cfg, env, flat, random.Random(0), 0)
    finally:
        env.close()
    # an untrained model's actions are all invalid (advantages 0): alternating signs train every step
    signs = Assigned(assigned.steps, [(-1.0) ** i for i in range(len(assigned.steps))], assigned.n_episodes,
                     assigned.stats)
    a, b = flat.update(ro, signs), tree.update(ro, signs)
    batch = build_batch(ro, signs.steps, signs.advantages, TOK.pad_id, "cpu")
    assert a["forward_tokens"] == batch.ids.numel() and b["forward_tokens"] < a["forward_tokens"]
    for key in ("trained_tokens", "clip_frac", "first_epoch_ratio_max_dev"):
        assert b[key] == pytest.approx(a[key], abs=1e-5)
    assert b["loss"] == pytest.approx(a["loss"], rel=1e-4, abs=1e-6)
    assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
    for p, q in zip(flat.model.parameters(), tree.model.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-5)
    assert any(not torch.equal(p, q) for p, q in zip(model.parameters(), _model(arch).parameters(), strict=True))


def test_a_llama_on_eager_attention_gets_the_same_and_a_flash_kernel_is_refused():
    """The tree mask reaches a ``transformers`` model as a 4D additive mask: eager attention adds it as sdpa does;
    a flash-attention kernel would drop it, so the forward refuses rather than return other numbers."""
    model = _model("llama")
    rows = _branching_rows(random.Random(5))
    packed = pack_rows(rows, TOK.pad_id, "cpu")
    with torch.no_grad():
        sdpa = tree_token_logprobs(model, packed, 1.0, TOK.suppressed_ids)[0]
        model.hf.config._attn_implementation = "eager"
        eager = tree_token_logprobs(model, packed, 1.0, TOK.suppressed_ids)[0]
        flat = token_logprobs(model, pad_rows(rows, TOK.pad_id, "cpu"), 1.0, TOK.suppressed_ids)[0]
        model.hf.config._attn_implementation = "flash_attention_2"
        with pytest.raises(ValueError, match="sdpa or eager"):
            tree_token_logprobs(model, packed, 1.0, TOK.suppressed_ids)
    inside = _inside(rows)
    assert torch.allclose(eager[inside], sdpa[inside], atol=1e-5)
    assert torch.allclose(eager[inside], flat[inside], atol=1e-5)
