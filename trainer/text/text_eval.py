"""Evaluating a text policy: sampled and greedy rollouts (:func:`evaluate`), the exact expected
success of the sampling policy, summed over action paths enumerated with env forks (:func:`exact_success`),
and its exact gradient (:func:`exact_policy_gradient`), the reference for estimators' sampled gradients.

Why an exact figure: sampled accuracy on ``n`` episodes has a binomial s.e. of about
``sqrt(p (1 - p) / n)`` (0.014 for p = 0.25, n = 1,000), which was half the spread between training seeds
in docs/results/text_policy.md. For an env whose episodes form a small finite tree (ClueProbe: 8 targets,
3 probes per turn, 8 answers), the expectation can be summed instead of sampled::

    E[return] >= sum over resets c (weight 1 / |resets|) of
                 sum over action paths a_1..a_T of  prod_t P(a_t | history_t) * sum_t r_t(c, a_1..a_t)

where each ``a_t`` ranges over the env's ``action_vocabulary`` (every action text legal in *some* state:
the :class:`envs.features.FiniteActions` feature; ClueProbe: 3 probes and 8 answers) plus the state's
``legal_actions``. An action that is illegal at its turn is stepped like any other: the env answers
with its error observation and consumes the turn, as in a rollout, so a policy that answers on a probe
turn and still answers right at the end is credited.
``P(a | history)`` is the probability that the sampling policy (tempered, special ids suppressed, top-p
1, ``max_new_tokens``) writes exactly the canonical token ids of the text ``a`` and then ends the turn
(its ``<|end|>``, or the token limit reached right at the action's last token).

Not summed, so the figure is a lower bound on the sampled expected return: other token spellings of the
same text, texts outside the vocabulary (invalid calls), and paths pruned once their probability falls
below ``min_path_prob``. ``coverage`` (the summed probability of the complete paths) says how much of
the policy's mass the figure accounts for; with episode returns in [0, 1] (ClueProbe) the expected return
lies in ``[success, success + 1 - coverage]``.
"""

from __future__ import annotations

import math
import random
from typing import Any

import torch

from envs.features import FiniteActions
from trainer.loop import evaluation_resets, held_out_resets, make_env
from trainer.text.text_policy import SamplingConfig, TextPolicy, token_logprobs
from trainer.rollout import EpisodeMetrics
from trainer.text.tokenizer import model_tokenizer
from trainer.waves import WaveDriver, serial


def evaluate(model, cfg, samples: int | None = None) -> dict[str, float]:
    """Greedy accuracy over the env's evaluation resets (:func:`trainer.loop.evaluation_resets`: every
    ClueProbe target, exactly), and sampled accuracy (the training temperature) over ``samples`` held-out
    seeds (10**9 + i, never used in training); share of invalid actions; the
    means of what the env reports in ``info["episode_metrics"]`` at each episode's end (ClueProbe:
    ``distinct_probes``, distinct probe calls per episode). Episode i samples from the i-th stream of
    ``random.Random(12345)`` (:func:`trainer.rollout.episode_seeds`), batched through
    :class:`trainer.text.engine.RolloutEngine` unless ``cfg.sampler == "serial"`` (the same episodes either way).

    Args:
        model: a :class:`trainer.text.lm.CausalLM` with its ``tokenizer``.
        cfg: a :class:`trainer.text.text_config.TextTrainConfig` (env id and kwargs, sampling settings).
        samples: held-out seeds for the sampled figures (default ``cfg.eval_samples``).

    Returns:
        ``{"greedy_accuracy", "greedy_invalid_share", "greedy_<env metric>", ..., "sampled_..."}``, floats.
    """
    env = make_env(cfg.env_id, cfg.env_options())
    tok = model_tokenizer(model)
    greedy = TextPolicy(model, tok, SamplingConfig(0.0, 1.0, cfg.max_new_tokens, max_obs_tokens=cfg.max_obs_tokens,
                                                   tools=cfg.env_tools()))
    sampled = TextPolicy(model, tok, cfg.sampling())
    out: dict[str, float] = {}
    n_held_out = samples or cfg.eval_samples
    for name, policy, resets in (
        ("greedy", greedy, evaluation_resets(cfg.env_id, cfg.env_options(), n_held_out)),
        ("sampled", sampled, held_out_resets(n_held_out)),
    ):
        total = invalid = actions = 0.0
        env_metrics = EpisodeMetrics()
        rng = random.Random(12345)  # one sampling stream per episode (trainer.rollout.episode_seeds)
        if getattr(cfg, "sampler", "serial") in ("batched", "vllm"):  # the trainer's weights, in this process
            from trainer.text.engine import RolloutEngine

            driver: WaveDriver = RolloutEngine.from_config(cfg)
        else:
            driver = serial()
        episodes = driver.play(env, policy, resets, rng)
        for ep in episodes:
            actions += len(ep.steps)
            invalid += ep.invalid_actions
            total += ep.reward
            env_metrics.add(ep.env_metrics)
        n = max(len(resets), 1)
        out[f"{name}_accuracy"] = total / n
        out[f"{name}_invalid_share"] = invalid / max(actions, 1)
        out.update({f"{name}_{k}": v for k, v in env_metrics.means().items()})
    env.close()
    return out


def action_probabilities(policy: TextPolicy, context: list[int], actions: list[str],
                         differentiable: bool = False) -> list[float] | torch.Tensor:
    """Probability that ``policy`` (its sampling settings) writes exactly each action text's canonical ids
    and ends the turn there, given the token history ``context``.

    One batched forward pass over ``len(actions)`` rows ``context[window:] + ids(a) + [<|end|>]`` (the
    window is the left truncation :class:`trainer.text.text_policy.TextSession` applies). An action longer than
    ``max_new_tokens`` tokens has probability 0; one of exactly ``max_new_tokens`` ends at the limit
    (no ``<|end|>`` factor).

    Args:
        policy: a :class:`TextPolicy` with ``temperature > 0`` (0 is read as 1), ``top_p == 1`` and no
            stop strings.
        context: the history's token ids, ending with the assistant header.
        actions: action texts (usually ``info["legal_actions"]``).
        differentiable: return a float tensor [len(actions)] that carries the autograd graph to the
            model's parameters instead of floats.

    Returns:
        ``len(actions)`` floats in [0, 1] (their sum is at most 1 up to rounding).

    Raises:
        ValueError: for top-p < 1 or stop strings (the exact sum would need the truncated support).
    """
    sc = policy.sampling
    if sc.top_p < 1.0 or sc.stop_strings:
        raise ValueError("action_probabilities needs top_p == 1 and no stop strings")
    tok = policy.tok
    encoded = [tok.encode(a) for a in actions]
    ctx_len = policy.model.config.context
    ws = max(0, len(context) + sc.max_new_tokens - ctx_len)
    prompt = context[ws:]
    rows, spans = [], []
    for ids in encoded:
        gen = ids + [tok.eot_id] if len(ids) < sc.max_new_tokens else ids[: sc.max_new_tokens]
        rows.append(prompt + gen)
        spans.append((len(prompt), len(prompt) + len(gen), len(ids) <= sc.max_new_tokens))
    width = max(map(len, rows))
    batch = torch.full((len(rows), width), tok.pad_id, dtype=torch.long)
    for b, row in enumerate(rows):
        batch[b, : len(row)] = torch.tensor(row)
    with torch.set_grad_enabled(differentiable):
        logp, _, _ = token_logprobs(policy.model, batch.to(policy.device), sc.temperature, tok.suppressed_ids)
        if differentiable:
            return torch.stack([logp[b, s:e].sum().exp() * float(ok) for b, (s, e, ok) in enumerate(spans)])
    return [math.exp(float(logp[b, s:e].sum())) if ok else 0.0 for b, (s, e, ok) in enumerate(spans)]


def exact_success(model, cfg, resets: list[tuple[int | None, dict | None]] | None = None,
                  min_path_prob: float = 1e-6, max_paths: int = 200_000) -> dict[str, float]:
    """Exact expected return of the sampling policy over canonical action paths (module docstring).

    Walks the tree of actions depth first: at each node the policy's probability of every candidate
    action is computed in one batch (:func:`action_probabilities`); the env is forked once per action
    whose path probability is at least ``min_path_prob`` (:meth:`envs.core.TextEnv.fork`) and each child
    is stepped with its action; the tool output is appended to the token history by the chat template,
    exactly as in a rollout.

    Args:
        model: a :class:`trainer.text.lm.CausalLM` with its ``tokenizer``.
        cfg: a :class:`trainer.text.text_config.TextTrainConfig` (env id and kwargs, temperature,
            max_new_tokens; top-p must be 1).
        resets: ``[(seed, options), ...]``, weighted equally (default: the env's evaluation resets,
            :func:`trainer.loop.evaluation_resets`; ClueProbe: every target).
        min_path_prob: paths less likely than this are not expanded (their mass is not covered).
        max_paths: stop with ValueError once more complete paths than this were visited.

    Returns:
        ``{"success": lower bound on the expected return per episode, "coverage": mean probability of
        the complete paths, "paths": complete paths visited}``.

    Raises:
        ValueError: when the env gives no finite ``legal_actions``, the tree exceeds ``max_paths``, or the
            sampling settings are not supported (:func:`action_probabilities`).
    """
    return _walk_tree(model, cfg, resets, min_path_prob, max_paths, None)[0]


def _walk_tree(model, cfg, resets, min_path_prob: float, max_paths: int, nodes: list | None):
    """The depth-first walk of :func:`exact_success`. Each node returns its value ``V(h) = sum_a P(a|h) Q(h, a)``
    with ``Q(h, a) = r + V(child)`` (0 for a pruned action); the success is the reset-weighted mean of the
    roots' values. When ``nodes`` is a list, every node is appended to it as ``(weight * P(h), ids,
    candidates, Q)``: what :func:`exact_policy_gradient` needs. Returns ``(totals, policy)``."""
    resets = resets if resets is not None else evaluation_resets(cfg.env_id, cfg.env_options())
    policy = TextPolicy(model, model_tokenizer(model), cfg.sampling())
    template = policy.template
    tok = policy.tok
    env = make_env(cfg.env_id, cfg.env_options())
    vocabulary = list(env.action_vocabulary) if isinstance(env, FiniteActions) else []
    total = {"success": 0.0, "coverage": 0.0, "paths": 0}

    def expand(node, ids: list[int], info: dict[str, Any], prob: float, weight: float) -> float:
        legal = info.get("legal_actions")
        if not legal:
            raise ValueError(f"{cfg.env_id} gives no legal_actions at turn {info.get('turn')}: no finite tree")
        candidates = list(dict.fromkeys([*legal, *vocabulary]))
        probs = action_probabilities(policy, ids, candidates)
        q = [0.0] * len(candidates)
        kept = [(i, prob * p) for i, p in enumerate(probs) if prob * p >= min_path_prob]
        for (i, path_prob), child in zip(kept, node.fork(len(kept)) if kept else [], strict=True):
            obs, reward, terminated, truncated, child_info = child.step(candidates[i])
            q[i] = float(reward)
            if terminated or truncated:
                total["coverage"] += weight * path_prob
                total["paths"] += 1
                if total["paths"] > max_paths:
                    raise ValueError(f"more than max_paths={max_paths} complete paths")
            else:
                q[i] += expand(child, ids + tok.encode(candidates[i]) + [tok.eot_id] + template.observation(obs),
                               child_info, path_prob, weight)
            child.close()
        if nodes is not None:
            nodes.append((weight * prob, ids, candidates, q))
        return math.fsum(p * v for p, v in zip(probs, q, strict=True))

    try:
        for seed, options in resets:
            obs, info = env.reset(seed=seed, options=options)
            weight = 1.0 / len(resets)
            total["success"] += weight * expand(env, template.first(obs), info, 1.0, weight)
    finally:
        env.close()
    return total, policy


def exact_policy_gradient(model, cfg, resets: list[tuple[int | None, dict | None]] | None = None,
                          min_path_prob: float = 1e-6,
                          max_paths: int = 200_000) -> tuple[dict[str, float], list[torch.Tensor]]:
    """The exact gradient of :func:`exact_success` with respect to the model's parameters.

    The policy-gradient theorem on the finite tree (Sutton et al. 2000, Theorem 1, undiscounted):
    ``grad J = sum_h P(h) sum_a grad P(a|h) * Q(h, a)``, with ``P(h)`` the reset-weighted probability of
    reaching history ``h`` and ``Q`` the exact action values of the walk (pruned actions: 0). One forward
    and backward pass per node (P(h) and Q are constants there), so memory stays that of one node.
    This is the reference direction against which estimators' sampled gradients are compared
    (``benchmarks/bench_gradient_alignment.py``).

    Args/Raises: as :func:`exact_success`.

    Returns:
        ``(totals, grads)``: the dict of :func:`exact_success` and one float tensor per parameter of
        ``model.parameters()`` (its shape; zeros for parameters the policy does not use and for frozen
        ones). The model's own
        ``.grad`` fields are left as they were.
    """
    nodes: list = []
    total, policy = _walk_tree(model, cfg, resets, min_path_prob, max_paths, nodes)
    params = list(model.parameters())
    grads = [torch.zeros_like(p) for p in params]
    live = [i for i, p in enumerate(params) if p.requires_grad]  # frozen weights (LoRA's base) keep zeros
    for reach, ids, candidates, q in nodes:
        if reach == 0.0 or not any(q):
            continue
        probs = action_probabilities(policy, ids, candidates, differentiable=True)
        value = reach * (probs * torch.tensor(q, dtype=probs.dtype, device=probs.device)).sum()
        for i, d in zip(live, torch.autograd.grad(value, [params[i] for i in live], allow_unused=True), strict=True):
            if d is not None:
                grads[i] += d
    return total, grads
