"""Token-level losses on hand-computed tensors: reductions, PPO clipped surrogate, entropy, KL, masking."""

import math

import pytest
import torch

from trainer.text.losses import PPOConfig, ppo_loss, reduce_tokens

VALUES = torch.tensor([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0], [5.0, 6.0, 0.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", 21 / 6),  # every token equal: (1+2+3+4+5+6)/6
        ("seq-mean-token-mean", (2 + 4 + 5.5) / 3),  # every row equal: row means 2, 4, 5.5
        ("seq-mean-token-sum", (6 + 4 + 11) / 3),  # row sums 6, 4, 11 over 3 rows
    ],
)
def test_reductions_hand_computed(mode, expected):
    assert float(reduce_tokens(VALUES, MASK, mode)) == pytest.approx(expected, abs=1e-6)


def test_group_mean_weighs_groups_equally():
    group = torch.tensor([0, 0, 1])
    # group 0: mean of row means (2, 4) = 3; group 1: 5.5 -> (3 + 5.5) / 2
    assert float(reduce_tokens(VALUES, MASK, "group-mean", group)) == pytest.approx(4.25)
    # a row with an empty mask is absent, not a zero in its group's mean
    v = torch.cat([VALUES, torch.full((1, 4), 100.0)])
    m = torch.cat([MASK, torch.zeros(1, 4)])
    assert float(reduce_tokens(v, m, "group-mean", torch.tensor([0, 0, 1, 1]))) == pytest.approx(4.25)
    assert float(reduce_tokens(v, m, "seq-mean-token-mean")) == pytest.approx(11.5 / 3)


def test_seq_sum_norm_len_and_errors():
    assert float(reduce_tokens(VALUES, MASK, "seq-mean-token-sum", norm_len=4)) == pytest.approx(21 / 3 / 4)
    with pytest.raises(ValueError):
        reduce_tokens(VALUES, MASK, "mean")
    with pytest.raises(ValueError):
        reduce_tokens(VALUES, MASK, "group-mean")


def test_masked_garbage_never_reaches_the_value():
    v = VALUES.clone()
    v[0, 3] = float("nan")
    v[1, 1] = float("inf")
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        assert float(reduce_tokens(v, MASK, mode)) == pytest.approx(float(reduce_tokens(VALUES, MASK, mode)))


def _ratios(r):
    old = torch.zeros(1, len(r))
    logp = torch.log(torch.tensor([r], dtype=torch.float32)).requires_grad_(True)
    return logp, old


def test_ppo_clip_hand_computed():
    # ratios 1.5, 0.5, 1.1, 0.7 with A = +1, +1, -1, -1; clip range [0.8, 1.28]
    logp, old = _ratios([1.5, 0.5, 1.1, 0.7])
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    mask = torch.ones(1, 4)
    loss, st = ppo_loss(logp, old, adv, mask)
    # per-token: -min(1.5, 1.28) = -1.28; -0.5; -min(-1.1, -1.1) = 1.1; -min(-0.7, -0.8) = 0.8
    assert float(loss.detach()) == pytest.approx((-1.28 - 0.5 + 1.1 + 0.8) / 4, abs=1e-6)
    assert st["clip_frac"] == 0.5 and st["clip_high_frac"] == 0.25 and st["clip_low_frac"] == 0.25
    assert st["ratio_max"] == pytest.approx(1.5) and st["ratio_min"] == pytest.approx(0.5)
    loss.backward()
    # d/dlogp of -r*A/4 = -A*r/4 where unclipped; 0 where the clip is active
    assert logp.grad.tolist()[0] == pytest.approx([0.0, -0.5 / 4, 1.1 / 4, 0.0], abs=1e-6)


def test_clip_is_asymmetric():
    logp, old = _ratios([1.25])
    adv, mask = torch.ones(1, 1), torch.ones(1, 1)
    loss, st = ppo_loss(logp, old, adv, mask)  # 1.25 < 1 + 0.28: not clipped
    assert float(loss.detach()) == pytest.approx(-1.25) and st["clip_frac"] == 0.0
    loss, st = ppo_loss(logp, old, adv, mask, PPOConfig(clip_low=0.2, clip_high=0.2))
    assert float(loss.detach()) == pytest.approx(-1.2) and st["clip_frac"] == 1.0


def test_entropy_bonus_and_kl_hand_computed():
    logp = torch.tensor([[math.log(0.5), math.log(0.25)]], requires_grad=True)
    old = logp.detach().clone()
    ref = torch.tensor([[math.log(0.25), math.log(0.25)]])
    ent = torch.tensor([[0.7, 0.3]])
    adv = torch.tensor([[2.0, 2.0]])
    mask = torch.tensor([[1.0, 1.0]])
    cfg = PPOConfig(entropy_coef=0.1, kl_coef=0.5)
    loss, st = ppo_loss(logp, old, adv, mask, cfg, entropy=ent, ref_logp=ref)
    d = math.log(0.5)  # ref - logp on token 0; 0 on token 1
    kl0 = math.exp(d) - d - 1
    expected = ((-2.0 - 0.1 * 0.7 + 0.5 * kl0) + (-2.0 - 0.1 * 0.3 + 0.0)) / 2
    assert float(loss.detach()) == pytest.approx(expected, abs=1e-6)
    assert st["kl"] == pytest.approx(kl0 / 2, abs=1e-6)
    with pytest.raises(ValueError):
        ppo_loss(logp, old, adv, mask, PPOConfig(entropy_coef=0.1))
    with pytest.raises(ValueError):
        ppo_loss(logp, old, adv, mask, PPOConfig(kl_coef=0.1))


def test_masked_tokens_get_no_gradient_from_any_term():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7, requires_grad=True)
    lp = torch.log_softmax(logits, -1)
    ids = torch.randint(0, 7, (2, 5))
    logp = lp.gather(-1, ids[..., None]).squeeze(-1)
    ent = -(lp.exp() * lp).sum(-1)
    mask = torch.tensor([[0, 1, 1, 0, 0], [0, 0, 0, 1, 0]], dtype=torch.float32)
    ref = logp.detach() - 0.3
    loss, st = ppo_loss(logp, logp.detach() + 0.1, torch.full((2, 5), 1.5), mask,
                        PPOConfig(entropy_coef=0.01, kl_coef=0.2), entropy=ent, ref_logp=ref)
    loss.backward()
    g = logits.grad.abs().sum(-1)
    assert torch.all(g[mask == 0] == 0)
    assert torch.all(g[mask == 1] > 0)
    assert st["tokens"] == 3.0
