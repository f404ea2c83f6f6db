"""The text policy: chat template, generation with behavior log-probs, token ids kept as generated, the
loss mask (field case S7), ratio = 1 on the first on-policy epoch, fork of a text rollout.

A real (small, randomly initialised) :class:`TinyCausalLM` runs everywhere; its final LayerNorm bias is
set so that the end-of-turn token has a raised logit, so sampled actions end by themselves (with
<|end|>) or at the token limit, and both paths are exercised.
"""

import random

import pytest
import torch

from trainer.text.lm import ByteTokenizer, LMConfig, build_model
from trainer.text.losses import PPOConfig, ppo_loss
from trainer.rollout import Episode, Rollout
from trainer.waves import tree_rollout
from trainer.text.text_policy import ChatTemplate, SamplingConfig, TextPolicy, token_logprobs
from trainer.loop import make_env
from trainer.text.text_train import build_batch

TOK = ByteTokenizer()


def small_model(context=128, eot_logit=4.0, seed=0):
    model = build_model(LMConfig(d_model=32, n_layers=1, n_heads=2, context=context), device="cpu", seed=seed)
    with torch.no_grad():  # logits = ln_f(x) @ E^T: put a fixed component along E[eot] into ln_f's bias
        e = model.tok.weight[TOK.eot_id]
        model.ln_f.bias += eot_logit * e / e.pow(2).sum()
    return model.eval()


def policy(model, **kw):
    return TextPolicy(model, sampling=SamplingConfig(**{"max_new_tokens": 12, **kw}))


def test_tokenizer_roundtrip_and_specials():
    text = "a.txt\nb.txt café 🚀"
    ids = TOK.encode(text)
    assert all(0 <= i < 256 for i in ids) and TOK.decode(ids) == text
    assert TOK.encode("<|end|>") != [TOK.eot_id]  # text can never forge a special token
    assert TOK.decode([0xC3]) == "\ufffd"  # half a UTF-8 character decodes, never raises
    assert TOK.vocab_size == 262


def test_template_render_mask():
    tmpl = ChatTemplate(TOK)
    ids, mask = tmpl.render("Q?", [("ls()", "a.txt\nb.txt"), ("answer(2)", None)])
    a1 = TOK.encode("ls()") + [TOK.eot_id]
    a2 = TOK.encode("answer(2)") + [TOK.eot_id]
    expected = ([TOK.bos_id, TOK.user_id] + TOK.encode("Q?") + [TOK.eot_id, TOK.assistant_id] + a1
                + [TOK.tool_id] + TOK.encode("a.txt\nb.txt") + [TOK.eot_id, TOK.assistant_id] + a2)
    assert ids == expected
    assert [i for i, m in zip(ids, mask, strict=True) if m] == a1 + a2
    assert sum(mask) == len(a1) + len(a2)


def _two_turn_chat(model, tool_output, seeds=(1, 2)):
    pol = policy(model)
    session = pol.session("List the files, then say how many there are.", {"turn": 0, "anchor_key": "k0"})
    s1 = session.act(random.Random(seeds[0]))
    session.observe(tool_output, {"turn": 1, "anchor_key": "k1"})
    s2 = session.act(random.Random(seeds[1]))
    return session, s1, s2


def _check_s7(session, s1, s2, tool_output, model):
    ids, mask = session.ids, session.mask
    generated = s1.data.action_ids + s2.data.action_ids
    # mask 1 exactly on the generated ids (a generated <|end|> included), in order
    assert [i for i, m in zip(ids, mask, strict=True) if m] == generated
    assert sum(mask) == len(generated)
    for s in (s1, s2):
        if s.data.stop == "eot":
            assert s.data.action_ids[-1] == TOK.eot_id
    # every tool token, role header and separator is 0
    tool = TOK.encode(tool_output)
    start = len(s1.data.context) + len(s1.data.action_ids) + (s1.data.stop != "eot")
    assert ids[start] == TOK.tool_id and ids[start + 1:start + 1 + len(tool)] == tool
    assert not any(mask[start:start + len(tool) + 3])
    specials = (TOK.bos_id, TOK.user_id, TOK.assistant_id, TOK.tool_id)
    assert all(m == 0 for i, m in zip(ids, mask, strict=True) if i in specials)
    # the trainer's rows: mask sum = response length; entropy and KL read the same mask
    ro = Rollout("group", [Episode(steps=[s1, s2])])
    batch = build_batch(ro, [s1, s2], [1.0, -0.5], TOK.pad_id, "cpu")
    assert float(batch.mask.sum()) == len(generated)
    logp, ent, logits = token_logprobs(model, batch.ids)
    logits.retain_grad()
    ref = small_model(model.config.context, seed=7)
    with torch.no_grad():
        ref_logp = token_logprobs(ref, batch.ids)[0]
    loss, st = ppo_loss(logp, batch.old_logp, batch.advantages, batch.mask,
                        PPOConfig(entropy_coef=0.01, kl_coef=0.1), entropy=ent, ref_logp=ref_logp)
    assert st["tokens"] == len(generated)
    # on-policy: the recomputed log-probs equal the behavior ones on every masked token (same window)
    on = batch.mask > 0
    assert torch.allclose(logp[on], batch.old_logp[on], atol=1e-4)
    loss.backward()
    # position j's logits predict token j+1: only positions before a masked-in token get any gradient
    predicts_trained = torch.zeros_like(batch.mask, dtype=torch.bool)
    predicts_trained[:, :-1] = on[:, 1:]
    g = logits.grad.abs().sum(-1)
    assert torch.all(g[~predicts_trained] == 0)
    assert torch.all(g[predicts_trained] > 0)
    return batch, logp.detach(), ent.detach()


def test_s7_short_tool_output():
    """Field case S7, short: question, tool call, tool output ``a.txt\\nb.txt``, answer."""
    model = small_model()
    session, s1, s2 = _two_turn_chat(model, "a.txt\nb.txt")
    assert s1.data.window_start == 0 and s2.data.window_start == 0
    batch, _, _ = _check_s7(session, s1, s2, "a.txt\nb.txt", model)
    assert batch.ids.shape[0] == 1  # one row: the whole chat fits in the context


def test_s7_long_tool_output_50k_tokens():
    """Field case S7, long: a 50,000-token tool output (50,000 ASCII bytes = 50,000 byte tokens).

    The model's context is 128, so the second action's prompt is truncated from the left
    (``window_start > 0``, recorded with the step); the trainer recomputes its log-probs over exactly
    that window. The full 50k-token history is kept and masked; the transformer only ever runs over
    the 128-token windows. The first action precedes the tool output, so its loss terms are identical
    whatever the tool output is; the second action's terms differ only through conditioning (its
    window holds tool tokens), while no tool token carries a loss term of its own."""
    model = small_model()
    long_a = ("x" * 99 + "\n") * 500
    long_b = ("y" * 99 + "\n") * 500
    assert len(TOK.encode(long_a)) == 50_000
    sess_a, a1, a2 = _two_turn_chat(model, long_a)
    sess_b, b1, b2 = _two_turn_chat(model, long_b)
    assert len(sess_a.ids) > 50_000 and sum(sess_a.mask) == len(a1.data.action_ids) + len(a2.data.action_ids)
    assert a2.data.window_start > 0 and a1.data.window_start == 0
    batch_a, logp_a, ent_a = _check_s7(sess_a, a1, a2, long_a, model)
    batch_b, logp_b, ent_b = _check_s7(sess_b, b1, b2, long_b, model)
    assert batch_a.ids.shape[1] <= model.config.context
    # turn 1 is the same in both chats: same ids, same behavior log-probs, same loss terms (row 0)
    assert a1.data.action_ids == b1.data.action_ids and a1.data.logps == b1.data.logps
    m0 = batch_a.mask[0] > 0
    assert torch.equal(logp_a[0][m0], logp_b[0][m0]) and torch.equal(ent_a[0][m0], ent_b[0][m0])
    # the short and the long chat start identically too
    _, s1, _ = _two_turn_chat(model, "a.txt\nb.txt")
    assert s1.data.action_ids == a1.data.action_ids and s1.data.logps == a1.data.logps


def test_sampling_records_settings_and_logps():
    model = small_model()
    for temp, top_p in ((1.0, 1.0), (0.7, 0.9)):
        pol = policy(model, temperature=temp, top_p=top_p)
        s = pol.session("hello", {"turn": 0}).act(random.Random(3))
        d = s.data
        assert (d.temperature, d.top_p) == (temp, top_p)
        assert len(d.logps) == len(d.action_ids) == len(d.entropies)
        row = torch.tensor([d.context + d.action_ids])
        lp = token_logprobs(model, row, temp)[0][0, len(d.context):]
        assert lp.tolist() == pytest.approx(d.logps, abs=1e-4)
        assert s.logp == pytest.approx(sum(d.logps), abs=1e-5)
    # greedy: argmax every time, deterministic
    g = policy(model, temperature=0.0)
    x = g.session("hello", {"turn": 0}).act(random.Random(0)).data.action_ids
    y = g.session("hello", {"turn": 0}).act(random.Random(99)).data.action_ids
    assert x == y


def test_max_tokens_turn_closed_by_template_with_mask_0():
    model = small_model(eot_logit=-20.0)  # never ends by itself
    pol = policy(model, max_new_tokens=5)
    sess = pol.session("q", {"turn": 0})
    s = sess.act(random.Random(0))
    assert s.data.stop == "max_tokens" and len(s.data.action_ids) == 5 and TOK.eot_id not in s.data.action_ids
    assert sess.ids[-1] == TOK.eot_id and sess.mask[-1] == 0 and sess.mask[-6:-1] == [1] * 5


@pytest.fixture(scope="module")
def tree():
    model = small_model(context=512, eot_logit=5.0)
    env = make_env("forkyard/ClueProbe-v0", {"max_turns": 3})
    ro = tree_rollout(env, policy(model), 3, 3, [0, 1, 2], random.Random(0))
    return model, ro


def test_no_retokenisation_drift(tree):
    """The ids trained are the ids sampled, even where decode -> encode would change them."""
    model, ro = tree
    steps = [s for e in ro.episodes for s in e.steps]
    batch = build_batch(ro, steps, [1.0] * len(steps), TOK.pad_id, "cpu")
    # batch.rows are unpadded, the mask is padded to the widest row: the inner zip stops at the row's end
    trained = [i for row, m in zip(batch.rows, batch.mask.tolist(), strict=True)
               for i, k in zip(row, m, strict=False) if k]
    by_row = []
    for e in ro.episodes:
        if e.steps:
            by_row += [i for s in e.steps for i in s.data.action_ids]
    assert trained == by_row
    # byte-level sampling makes invalid UTF-8 likely: re-encoding the decoded text would change ids
    drift = [s for s in steps if TOK.encode(TOK.decode(s.data.action_ids)) + [TOK.eot_id] * (s.data.stop == "eot")
             != s.data.action_ids]
    assert drift, "expected at least one action whose text does not re-encode to its sampled ids"
    # corrupting one recorded id is caught
    s = next(s for s in steps if s.data.action_ids)
    s.data.action_ids[0] ^= 1
    with pytest.raises(RuntimeError, match="drifted"):
        build_batch(ro, steps, [1.0] * len(steps), TOK.pad_id, "cpu")
    s.data.action_ids[0] ^= 1


def test_ratio_is_one_on_first_on_policy_epoch(tree):
    model, ro = tree
    steps = [s for e in ro.episodes for s in e.steps]
    advs = [(-1.0) ** i for i in range(len(steps))]
    batch = build_batch(ro, steps, advs, TOK.pad_id, "cpu")
    model.train()
    logp, ent, _ = token_logprobs(model, batch.ids)
    loss, st = ppo_loss(logp, batch.old_logp, batch.advantages, batch.mask)
    model.eval()
    assert abs(st["ratio_max"] - 1) < 1e-4 and abs(st["ratio_min"] - 1) < 1e-4 and st["clip_frac"] == 0.0
    assert st["tokens"] == sum(len(s.data.action_ids) for s in steps)


def test_fork_of_a_text_rollout(tree):
    model, ro = tree
    assert ro.forks > 0
    for e in ro.episodes:
        if e.branch == 0 or not e.steps:
            continue
        base = next(b for b in ro.episodes if b.base == e.base and b.branch == 0)
        first = e.steps[0]
        assert first.turn == e.fork_turn
        base_step = next(s for s in base.steps if s.turn == e.fork_turn)
        # the branch continues from exactly the base's token history at the fork turn
        assert first.data.context == base_step.data.context
        assert first.anchor_key == base_step.anchor_key
    # a forked session is independent: acting on the twin leaves the original's ids and mask alone
    pol = policy(model)
    sess = pol.session("q", {"turn": 0})
    sess.act(random.Random(0))
    sess.observe("obs", {"turn": 1})
    ids, mask = list(sess.ids), list(sess.mask)
    twin = sess.fork()
    t1 = twin.act(random.Random(1))
    assert sess.ids == ids and sess.mask == mask and twin.ids[: len(ids)] == ids
    s1 = sess.act(random.Random(1))
    assert s1.data.action_ids == t1.data.action_ids and s1.data.logps == pytest.approx(t1.data.logps, abs=1e-6)


def test_entropy_mode_greedy_max_sees_the_whole_action_and_leaves_the_session_alone():
    model = small_model(eot_logit=-20.0)  # no early end: the greedy continuation runs max_new_tokens
    first = policy(model).session("q", {"turn": 0})
    whole = policy(model, entropy_mode="greedy_max").session("q", {"turn": 0})
    assert whole.entropy() >= first.entropy() - 1e-6
    # the greedy continuation's tokens: the largest of their entropies, recomputed in one forward pass
    g = policy(model, temperature=0.0).session("q", {"turn": 0}).act(random.Random(0)).data
    assert whole.entropy() == pytest.approx(max(g.entropies), abs=1e-4)
    # the probe changes nothing: what the session samples next is what a fresh session samples
    ids_before = list(whole.ids)
    a = whole.act(random.Random(5)).data.action_ids
    b = policy(model, entropy_mode="greedy_max").session("q", {"turn": 0}).act(random.Random(5)).data.action_ids
    assert whole.ids[:len(ids_before)] == ids_before and a == b
    with pytest.raises(ValueError):
        policy(model, entropy_mode="nope").session("q", {"turn": 0}).entropy()


def test_entropy_fork_with_greedy_max_runs_a_text_tree():
    # a model whose only uncertainty is the answer digit: first-token entropy cannot tell turns apart
    model = small_model(context=512, eot_logit=5.0)
    env = make_env("forkyard/ClueProbe-v0", {"max_turns": 3})
    ro = tree_rollout(env, policy(model, entropy_mode="greedy_max"), 2, 2, [0, 1], random.Random(0), "entropy")
    assert all(e.fork_turn is not None for e in ro.episodes if e.branch == 0)


def test_invalid_penalty_counts_illegal_actions_on_each_path(tree):
    import copy

    from trainer.text.text_train import apply_invalid_penalty

    _, ro = tree
    ro = copy.deepcopy(ro)
    before = [e.reward for e in ro.episodes]
    apply_invalid_penalty(ro, 0.5)
    bases = {e.base: e for e in ro.episodes if e.branch == 0}
    for e, r0 in zip(ro.episodes, before, strict=True):
        path = list(e.steps)
        if e.branch:
            path = [s for s in bases[e.base].steps if s.turn < e.fork_turn] + path
        assert e.reward == pytest.approx(r0 - 0.5 * sum(not s.data.legal for s in path))


def test_sample_batch_puts_any_estimator_on_a_tree_rollout_and_rejects_a_tree_estimator_on_groups():
    from trainer.text.text_config import TextTrainConfig
    from trainer.text.text_train import sample_batch

    cfg = TextTrainConfig(max_turns=3, n_base=2, branches=3, estimator="anchor_fallback", rollout="tree", device="cpu")
    model = small_model(context=512, eot_logit=5.0)
    env = make_env(cfg.env_id, cfg.env_options())
    ro, assigned, batch = sample_batch(cfg, env, policy(model), random.Random(0), 0)
    assert ro.kind == "tree" and len(ro.episodes) == 6 and assigned.n_episodes == 6
    assert int(batch.mask.sum()) == sum(len(s.data.action_ids) for s in assigned.steps)
    with pytest.raises(ValueError, match="needs a tree rollout"):
        TextTrainConfig(estimator="tree", rollout="group").validate()


def test_long_observations_are_cut_for_the_model_alike_in_sft_and_sampling():
    from trainer.text.text_policy import OBS_CUT_MARKER

    t = ChatTemplate(TOK, max_obs_tokens=40)
    long_obs = "x" * 500
    cut = t.encode_observation(long_obs)
    assert len(cut) == 40 and TOK.decode(cut).endswith(OBS_CUT_MARKER) and cut[:20] == TOK.encode("x" * 20)
    assert t.encode_observation("short") == TOK.encode("short")  # shorter ones untouched
    ids, mask = t.render(long_obs, [("probe(0)", long_obs), ("answer(1)", None)])
    sess = TextPolicy(small_model(), sampling=SamplingConfig(max_new_tokens=4, max_obs_tokens=40)).session(long_obs, {})
    assert sess.ids == t.first(long_obs)  # the sampler's prompt is the SFT rows' prompt
    sess.observe(long_obs, {"turn": 1})
    assert sess.ids[-len(t.observation(long_obs)):] == t.observation(long_obs)
    assert len(ids) < 200  # 3 observations of 500 tokens each fit in under 200
    with pytest.raises(ValueError, match="max_obs_tokens"):
        ChatTemplate(TOK, max_obs_tokens=0)


# ------------------------------------------------------------------ field case S43: legal by meaning
S43_SPELLINGS = {0: ["ｐｒｏｂｅ(0)", "probe( 0 )", "answer( 0 )"], 1: ["ｐｒｏｂｅ(0)", "probe( 0 )", "answer(0x1)"]}


def _memorized(spellings: dict[int, list[str]], steps: int = 120):
    """A real model fitted (Adam on the action tokens' log-probs) until its greedy output is, for each ClueProbe
    target (bits=1, max_turns=3), exactly that target's action texts: what a policy that learned unusual spellings
    writes."""
    model = build_model(LMConfig(d_model=32, n_layers=1, n_heads=2, context=1024), device="cpu", seed=0)
    template = policy(model).template
    env = make_env("forkyard/ClueProbe-v0", {"bits": 1, "max_turns": 3})
    rows, masks = [], []
    for target, actions in spellings.items():
        obs, _ = env.reset(seed=0, options={"target": target})
        ids, mask = template.first(obs), []
        for a in actions:
            gen = TOK.encode(a) + [TOK.eot_id]
            mask += [0] * (len(ids) - len(mask)) + [1] * len(gen)
            obs, *_ = env.step(a)
            ids = ids + gen + template.observation(obs)
        rows.append(ids)
        masks.append(mask + [0] * (len(ids) - len(mask)))
    env.close()
    width = max(map(len, rows))
    ids = torch.tensor([r + [TOK.pad_id] * (width - len(r)) for r in rows])
    mask = torch.tensor([m + [0] * (width - len(m)) for m in masks], dtype=torch.float32)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        opt.zero_grad()
        (-(token_logprobs(model, ids)[0] * mask).sum()).backward()
        opt.step()
    return model.eval()


def test_field_case_s43_actions_the_env_runs_are_legal_however_spelled():
    """``ｐｒｏｂｅ(0)``, ``probe( 0 )``, ``answer(0x1)``: the env runs them as ``probe(0)`` / ``answer(1)``, so the
    text policy marks them legal (the env's parser decides, not string equality): invalid_share is 0 and
    ``--invalid-penalty 0.5`` leaves a correct episode's return at 1.0."""
    from trainer.waves import group_rollout
    from trainer.text.text_train import PPOTextPolicy, apply_invalid_penalty

    model = _memorized(S43_SPELLINGS)
    ppo = PPOTextPolicy(model, TOK, SamplingConfig(temperature=0.0, max_new_tokens=32), lr=1e-3, ppo=PPOConfig(),
                        ppo_epochs=1, max_grad_norm=1.0)
    env = make_env("forkyard/ClueProbe-v0", {"bits": 1, "max_turns": 3})
    ro = group_rollout(env, ppo, 6, list(range(6)), random.Random(0))
    env.close()
    written = {s.action for s in ro.steps}
    assert written == {a for acts in S43_SPELLINGS.values() for a in acts}  # the spellings the model learned
    assert not written & {"probe(0)", "answer(0)", "answer(1)"}  # none of them the canonical string
    assert [e.reward for e in ro.episodes] == [1.0] * 6  # the env ran every one: every episode answered right
    assert all(s.data.legal is True for s in ro.steps)
    assert ppo.rollout_metrics(ro)["invalid_share"] == 0.0
    apply_invalid_penalty(ro, 0.5)
    assert [e.reward for e in ro.episodes] == [1.0] * 6
    # a spelling the env refuses is still illegal, and penalised: the same check, one function
    wrong = PPOTextPolicy(_memorized({0: ["probe(k=0)", "probe(True)", "answer(0)"],
                                      1: ["probe(k=0)", "probe(True)", "answer(0)"]}, steps=60), TOK,
                          SamplingConfig(temperature=0.0, max_new_tokens=32), lr=1e-3, ppo=PPOConfig(), ppo_epochs=1,
                          max_grad_norm=1.0)
    env = make_env("forkyard/ClueProbe-v0", {"bits": 1, "max_turns": 3})
    ro = group_rollout(env, wrong, 2, [0, 1], random.Random(0))
    env.close()
    assert [[s.data.legal for s in e.steps] for e in ro.episodes] == [[False, False, True]] * 2
    assert wrong.rollout_metrics(ro)["invalid_share"] == pytest.approx(2 / 3)
