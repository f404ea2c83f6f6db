"""Text-policy training: SFT warm start on format-only demonstrations, then PPO-style RL with tree forks.

SFT (:func:`sft`): episodes played by the env's ``demo_action`` (ClueProbe: uniformly random legal
actions, i.e. the action format without the strategy; with ``demo_skill > 0`` a deliberately weak
scripted policy that answers from the probed bits that often and still probes at random) are rendered with the chat template and the model
is trained by cross-entropy on the action tokens only (loss mask 1 on the action bytes and the
``<|end|>`` that closes them). The result writes valid tool calls and still has the strategy to learn.

RL (:func:`train_rl`), one iteration:

1. Rollout with the sampling policy (:class:`trainer.text_policy.TextPolicy`): a tree-fork rollout
   (``n_base`` bases x ``branches``) or a group of ``group_size`` independent episodes, through the same
   :func:`trainer.rollout.tree_rollout` / :func:`trainer.rollout.group_rollout` as the tabular policy.
2. Per-step advantages from the existing estimators (:func:`trainer.train.step_advantages`), broadcast
   over that step's generated tokens.
3. Rows: one token row per episode or branch, exactly the ids it sampled and was shown (the last step's
   context plus its action; a branch's row contains the base prefix with mask 0). Each step's tokens
   are located by position and checked against the row (no re-tokenisation; a mismatch raises).
4. ``ppo_epochs`` full-batch epochs of :func:`trainer.losses.ppo_loss` (ratio against the recorded
   behavior log-probs; on the first epoch the ratio is 1 up to float rounding), Adam, grad-norm clip.
5. Monitors (:mod:`trainer.monitors`) and ``metrics.jsonl``.
"""

from __future__ import annotations

import json
import logging
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from trainer import advantages as adv
from trainer.lm import ByteTokenizer, LMConfig, build_model, load_checkpoint, resolve_device, save_checkpoint
from trainer.losses import PPOConfig, ppo_loss
from trainer.monitors import EchoTrapDetector, FormatCollapseDetector
from trainer.rollout import Rollout, group_rollout, tree_rollout
from trainer.text_policy import ChatTemplate, SamplingConfig, TextPolicy, token_logprobs
from trainer.text_eval import evaluate
from trainer.tokenizer import BPETokenizer, model_tokenizer
from trainer.train import TrainConfig, make_env, open_run_dir, rollout_kind, step_advantages

log = logging.getLogger(__name__)


@dataclass
class TextTrainConfig:
    """Hyperparameters of a text-policy run (SFT and RL share it)."""

    env_id: str = "forkyard/ClueProbe-v0"
    turns: int = 4
    bits: int = 3
    # model
    d_model: int = 96
    n_layers: int = 2
    n_heads: int = 4
    context: int = 512
    tokenizer: str = "bpe"  # "bpe": trained on the env's demo texts (trainer/tokenizer.py); "byte": bytes
    vocab: int = 512  # BPE vocabulary size (bytes + merges; the 6 special tokens come on top)
    device: str = "auto"
    dtype: str = "float32"
    threads: int = 0  # torch CPU threads (0: leave torch's default)
    # SFT
    sft_steps: int = 300
    sft_batch: int = 32
    sft_lr: float = 3e-3
    demo_skill: float = 0.0  # ClueProbe demo_action: chance of the fitting answer (0: random legal actions)
    # RL
    estimator: str = "tree"
    iterations: int = 60
    max_env_calls: int | None = None  # stop starting iterations once this many env calls were spent
    n_base: int = 6
    branches: int = 4
    group_size: int = 16
    fork_selection: str = "uniform"
    fork_entropy: str = "first"  # what "entropy" fork selection measures (SamplingConfig.entropy_mode)
    lr: float = 2e-4  # 1e-3 collapsed to invalid actions within 2 iterations (docs/results/text_policy.md)
    ppo_epochs: int = 2
    max_grad_norm: float = 1.0
    clip_low: float = 0.2
    clip_high: float = 0.28
    entropy_coef: float = 0.0
    kl_coef: float = 0.0
    reduction: str = "token-mean"
    rollout: str | None = None  # "group" or "tree" (trainer.train.rollout_kind); None: tree iff estimator is tree
    omega: float = 1.0  # anchor_fallback: weight of the step-level (anchor) term
    tree_prefix: str = "base"  # tree estimator: prefix value "base" or "branch_mean" (trainer.advantages.tree_advantages)
    filter_top_p: float | None = None  # StarPO-S: keep the top-p groups by reward std
    drop_zero_variance: bool = False
    invalid_penalty: float = 0.0  # subtracted from an episode's return per illegal action on its path (shaping)
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 16
    # bookkeeping
    seed: int = 0
    eval_every: int = 10
    eval_samples: int = 64
    checkpoint: str | None = None
    run_dir: str | None = None

    def env_kwargs(self) -> dict[str, Any]:
        return {"turns": self.turns, "bits": self.bits} if "ClueProbe" in self.env_id else {"max_turns": self.turns}

    def lm_config(self, vocab_size: int = 262) -> LMConfig:
        return LMConfig(vocab_size=vocab_size, d_model=self.d_model, n_layers=self.n_layers, n_heads=self.n_heads,
                        context=self.context)

    def sampling(self) -> SamplingConfig:
        return SamplingConfig(temperature=self.temperature, top_p=self.top_p, max_new_tokens=self.max_new_tokens,
                              entropy_mode=self.fork_entropy)


# ---------------------------------------------------------------------------------------------- batches
@dataclass
class Batch:
    """Padded rows for one forward pass; every tensor [B, L] (``group`` [B]) on the model's device."""

    ids: torch.Tensor
    mask: torch.Tensor
    advantages: torch.Tensor
    old_logp: torch.Tensor
    group: torch.Tensor
    rows: list[list[int]] = field(default_factory=list)


def pad_rows(rows: list[list[int]], pad_id: int, device) -> torch.Tensor:
    """[B, max len] int64 tensor of ``rows`` right-padded with ``pad_id`` (causal attention: padding
    after a token never changes that token's log-prob)."""
    width = max(len(r) for r in rows)
    return torch.tensor([r + [pad_id] * (width - len(r)) for r in rows], dtype=torch.long, device=device)


def build_batch(rollout: Rollout, steps: list, advantages: list[float], pad_id: int, device) -> Batch | None:
    """Token rows of the episodes whose steps are trained (see the module docstring, item 3).

    A row is ``ids[window_start:end]`` of one episode's token history, where ``end`` is the end of the
    last trained step; one row per distinct ``window_start`` (one row per episode when the history fits
    in the context). Mask 1 exactly on the sampled ids of trained steps (the ``<|end|>`` they generated
    included); advantage and behavior log-prob are set there. ``group`` is the episode's tree base (or 0).

    Returns None when no step is trained. Raises RuntimeError if a step's ids are not where its record
    says they are in the episode's history (re-tokenisation drift).
    """
    adv_of = {id(s): a for s, a in zip(steps, advantages)}
    rows, masks, advs, olds, groups = [], [], [], [], []
    for ei, ep in enumerate(rollout.episodes):
        trained = [s for s in ep.steps if id(s) in adv_of]
        if not trained:
            continue
        last = ep.steps[-1].data
        history = last.context + last.action_ids
        by_ws: dict[int, list] = {}
        for s in trained:
            by_ws.setdefault(s.data.window_start, []).append(s)
        for ws, group_steps in by_ws.items():
            end = max(len(s.data.context) + len(s.data.action_ids) for s in group_steps)
            row = history[ws:end]
            m = [0.0] * len(row)
            a = [0.0] * len(row)
            o = [0.0] * len(row)
            for s in group_steps:
                d = s.data
                start = len(d.context) - ws
                if history[: len(d.context)] != d.context or row[start:start + len(d.action_ids)] != d.action_ids:
                    raise RuntimeError(f"step at turn {s.turn}: token ids drifted from what was sampled")
                for j, lp in enumerate(d.logps):
                    m[start + j] = 1.0
                    a[start + j] = adv_of[id(s)]
                    o[start + j] = lp
            rows.append(row)
            masks.append(m)
            advs.append(a)
            olds.append(o)
            groups.append(ep.base if ep.base is not None else 0)
    if not rows:
        return None
    width = max(len(r) for r in rows)

    def pad(x, v=0.0):
        return torch.tensor([r + [v] * (width - len(r)) for r in x], dtype=torch.float32, device=device)

    return Batch(pad_rows(rows, pad_id, device), pad(masks), pad(advs), pad(olds),
                 torch.tensor(groups, dtype=torch.long, device=device), rows)


def apply_invalid_penalty(rollout: Rollout, penalty: float) -> None:
    """Reward shaping (optional, off by default): subtract ``penalty`` from each episode's return per
    illegal action on its path; a tree branch's path is its base's steps before the fork turn plus its
    own steps. Only the returns the advantages are computed from change; the env's reward is untouched
    (``reward_mean`` in the metrics is then the shaped mean)."""
    bases = {e.base: e for e in rollout.episodes if e.branch in (0, None)}
    for ep in rollout.episodes:
        path = list(ep.steps)
        if ep.branch not in (0, None) and ep.fork_turn is not None and ep.base in bases:
            path = [s for s in bases[ep.base].steps if s.turn < ep.fork_turn] + path
        ep.reward -= penalty * sum(s.data.legal is False for s in path)


# ---------------------------------------------------------------------------------------------- SFT
def demo_episodes(cfg: TextTrainConfig, n_episodes: int, seed: int) -> list[tuple[str, list[tuple[str, str | None]]]]:
    """``n_episodes`` episodes played by ``env.demo_action`` (an env without one: a uniformly random
    action of ``info["legal_actions"]``), as texts: ``[(first observation, [(action, observation or None
    at the end), ...]), ...]``.

    Raises:
        ValueError: when the env has neither ``demo_action`` nor a ``legal_actions`` menu.
    """
    env = make_env(cfg.env_id, cfg.env_kwargs())
    demo = getattr(env, "demo_action", None)
    rng = random.Random(seed)
    episodes = []
    for i in range(n_episodes):
        first, info = env.reset(seed=seed * 1_000_003 + i)
        turns = []
        while True:
            if demo is not None:
                action = demo(rng, skill=cfg.demo_skill) if cfg.demo_skill else demo(rng)
            elif info.get("legal_actions"):
                action = rng.choice(info["legal_actions"])
            else:
                env.close()
                raise ValueError(f"{cfg.env_id} has no demo_action and no legal_actions menu to demonstrate from")
            obs, r, te, tr, info = env.step(action)
            done = te or tr
            turns.append((action, None if done else obs))
            if done:
                break
        episodes.append((first, turns))
    env.close()
    return episodes


def make_tokenizer(cfg: TextTrainConfig, n_episodes: int = 2000):
    """The tokenizer of a new model: :class:`ByteTokenizer` (``cfg.tokenizer == "byte"``) or a
    :class:`~trainer.tokenizer.BPETokenizer` of ``cfg.vocab`` tokens trained on the texts of
    ``n_episodes`` demonstration episodes (seed ``cfg.seed + 7``; never the evaluation seeds)."""
    if cfg.tokenizer == "byte":
        return ByteTokenizer()
    if cfg.tokenizer != "bpe":
        raise ValueError(f"tokenizer must be 'bpe' or 'byte', got {cfg.tokenizer!r}")
    texts = []
    for first, turns in demo_episodes(cfg, n_episodes, cfg.seed + 7):
        texts.append(first)
        for action, obs in turns:
            texts.append(action)
            if obs is not None:
                texts.append(obs)
    return BPETokenizer.train(texts, cfg.vocab)


def demo_rows(cfg: TextTrainConfig, n_episodes: int, seed: int, tokenizer=None) -> tuple[list[list[int]], list[list[int]]]:
    """``n_episodes`` episodes played by ``env.demo_action`` rendered with the chat template.

    Returns ``(rows, masks)``: token ids and loss masks (1 on action tokens and their ``<|end|>``)."""
    template = ChatTemplate(tokenizer or ByteTokenizer())
    rows, masks = [], []
    for first, turns in demo_episodes(cfg, n_episodes, seed):
        ids, mask = template.render(first, turns)
        rows.append(ids)
        masks.append(mask)
    return rows, masks


def new_model(cfg: TextTrainConfig):
    """A fresh model sized by ``cfg`` with its tokenizer (:func:`make_tokenizer`) as ``model.tokenizer``."""
    tok = make_tokenizer(cfg)
    model = build_model(cfg.lm_config(tok.vocab_size), cfg.device, cfg.dtype, cfg.seed)
    model.tokenizer = tok
    return model


def sft(cfg: TextTrainConfig, model=None, progress: bool = False) -> tuple[Any, list[dict]]:
    """Supervised warm start on demonstrations (module docstring). Returns ``(model, metrics)``; writes
    ``RUN_DIR/sft.pt`` and ``RUN_DIR/sft_metrics.jsonl`` when ``cfg.run_dir`` is set."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = resolve_device(cfg.device)
    model = model or new_model(cfg)
    tok = model_tokenizer(model)
    rows, masks = demo_rows(cfg, cfg.sft_steps * cfg.sft_batch // 4 + cfg.sft_batch, cfg.seed, tok)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.sft_lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20) * max(0.1, 1 - s / cfg.sft_steps))
    rng = random.Random(cfg.seed)
    metrics = []
    model.train()
    t0 = time.perf_counter()
    for step in range(cfg.sft_steps):
        idx = rng.sample(range(len(rows)), cfg.sft_batch)
        ids = pad_rows([rows[i] for i in idx], tok.pad_id, device)
        width = ids.shape[1]
        mask = torch.tensor([masks[i] + [0] * (width - len(masks[i])) for i in idx], dtype=torch.float32, device=device)
        logp, _, _ = token_logprobs(model, ids, suppress=tok.suppressed_ids)
        loss = -torch.where(mask > 0, logp, torch.zeros_like(logp)).sum() / mask.sum()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        metrics.append({"step": step, "loss": float(loss.detach()), "wall_s": time.perf_counter() - t0})
        if progress and step % 20 == 0:
            print(f"sft step {step} loss {float(loss):.4f} ({time.perf_counter() - t0:.0f} s)", flush=True)
    model.eval()
    if cfg.run_dir:
        out = Path(cfg.run_dir)
        out.mkdir(parents=True, exist_ok=True)
        save_checkpoint(model, str(out / "sft.pt"), tok, turns=cfg.turns, env_id=cfg.env_id)
        with (out / "sft_metrics.jsonl").open("w") as f:
            for m in metrics:
                f.write(json.dumps(m) + "\n")
    return model, metrics


# ---------------------------------------------------------------------------------------------- evaluation
# ---------------------------------------------------------------------------------------------- RL
@dataclass
class TextTrainResult:
    config: TextTrainConfig
    metrics: list[dict]
    evaluation: dict[str, float]
    model: Any
    wall_s: float
    warnings: list[str]


def estimator_config(cfg: TextTrainConfig) -> TrainConfig:
    """The :class:`trainer.train.TrainConfig` that :func:`trainer.train.step_advantages` reads for ``cfg``
    (estimator, rollout shape, tree prefix, omega, group filters). Raises ValueError on a bad combination."""
    est_cfg = TrainConfig(env_id=cfg.env_id, env_kwargs=cfg.env_kwargs(), estimator=cfg.estimator,
                          tree_prefix=cfg.tree_prefix, rollout=cfg.rollout, omega=cfg.omega,
                          drop_zero_variance=cfg.drop_zero_variance, top_p=cfg.filter_top_p,
                          iterations=max(cfg.iterations, 1))
    est_cfg.validate()
    return est_cfg


def sample_batch(cfg: TextTrainConfig, est_cfg: TrainConfig, env, policy: TextPolicy, rng: random.Random,
                 iteration: int, device) -> tuple[Rollout, Any, Batch | None]:
    """One iteration's data: the rollout (group or tree, per ``est_cfg``) on the training seeds of
    ``iteration``, the invalid-action shaping if set, the per-step advantages and the token batch.

    Returns ``(rollout, assigned, batch)`` (``batch`` None when no step is trained)."""
    tree = rollout_kind(est_cfg.estimator, est_cfg.rollout) == "tree"
    n_eps = cfg.n_base if tree else cfg.group_size
    seeds = [(cfg.seed * 1_000_003 + iteration * n_eps + i) % 2**31 for i in range(n_eps)]
    if tree:
        ro = tree_rollout(env, policy, cfg.n_base, cfg.branches, seeds, rng, cfg.fork_selection)
    else:
        ro = group_rollout(env, policy, cfg.group_size, seeds, rng)
    if cfg.invalid_penalty:
        apply_invalid_penalty(ro, cfg.invalid_penalty)
    assigned = step_advantages(ro, est_cfg)
    return ro, assigned, build_batch(ro, assigned.steps, assigned.advantages, policy.tok.pad_id, device)


def train_rl(cfg: TextTrainConfig, model=None, progress: bool = False) -> TextTrainResult:
    """RL from ``model`` (or ``cfg.checkpoint``, or a fresh model). See the module docstring."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    t0 = time.perf_counter()
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    device = resolve_device(cfg.device)
    if model is None:
        model = load_checkpoint(cfg.checkpoint, cfg.device, cfg.dtype) if cfg.checkpoint else new_model(cfg)
    policy = TextPolicy(model, model_tokenizer(model), cfg.sampling())
    tok = policy.tok
    env = make_env(cfg.env_id, cfg.env_kwargs())
    est_cfg = estimator_config(cfg)
    ppo = PPOConfig(cfg.clip_low, cfg.clip_high, cfg.entropy_coef, cfg.kl_coef, cfg.reduction)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    ref = None
    if cfg.kl_coef:
        import copy

        ref = copy.deepcopy(model).eval()
    detector = EchoTrapDetector()
    format_detector = FormatCollapseDetector()
    warnings: list[str] = []
    out, sink = open_run_dir(cfg.run_dir, cfg)
    metrics: list[dict] = []
    spent = 0
    try:
        for it in range(cfg.iterations):
            if cfg.max_env_calls is not None and spent >= cfg.max_env_calls:
                break  # equal-budget comparisons: no iteration starts once the budget is spent
            model.eval()
            ro, assigned, batch = sample_batch(cfg, est_cfg, env, policy, rng, it, device)
            all_steps = [s for e in ro.episodes for s in e.steps]
            legal_known = [s for s in all_steps if s.data.legal is not None]
            valid_rewards = [e.reward for e in ro.episodes if not e.infra_failure]
            m: dict[str, Any] = {
                "iteration": it,
                "reward_mean": sum(valid_rewards) / max(len(valid_rewards), 1),
                "reward_std": adv.group_std(valid_rewards),
                "entropy": sum(x for s in all_steps for x in s.data.entropies) / max(sum(len(s.data.entropies) for s in all_steps), 1),
                "response_length": sum(len(s.data.action_ids) for s in all_steps) / max(len(all_steps), 1),
                "invalid_share": sum(not s.data.legal for s in legal_known) / max(len(legal_known), 1),
                "env_calls": ro.env_calls,
                "env_calls_total": spent + ro.env_calls,
                "episodes": len(ro.episodes),
                "infra_failures": len(ro.episodes) - len(valid_rewards),
                "forks_failed": ro.forks_failed,
                "branches_lost": ro.branches_lost,
                "trained_steps": len(assigned.steps),
                **assigned.stats,
            }
            gnorm, first_stats = 0.0, {}
            if batch is not None and any(a != 0.0 for a in assigned.advantages):
                model.train()
                ref_logp = None
                if ref is not None:
                    with torch.no_grad():
                        ref_logp = token_logprobs(ref, batch.ids, cfg.temperature, tok.suppressed_ids)[0]
                for epoch in range(cfg.ppo_epochs):
                    logp, ent, _ = token_logprobs(model, batch.ids, cfg.temperature, tok.suppressed_ids)
                    loss, st = ppo_loss(logp, batch.old_logp, batch.advantages, batch.mask, ppo, ent, ref_logp, batch.group)
                    opt.zero_grad()
                    loss.backward()
                    g = float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm))
                    opt.step()
                    if epoch == 0:
                        first_stats, gnorm = st, g
                        m["first_epoch_ratio_max_dev"] = max(abs(st["ratio_max"] - 1), abs(st["ratio_min"] - 1))
                    last_stats = st
                m.update(grad_norm=gnorm, clip_frac=last_stats["clip_frac"], ratio_mean=last_stats["ratio_mean"],
                         ratio_min=last_stats["ratio_min"], ratio_max=last_stats["ratio_max"], loss=float(loss.detach()),
                         trained_tokens=first_stats["tokens"])
            else:
                m.update(grad_norm=0.0, clip_frac=0.0, ratio_mean=1.0, ratio_min=1.0, ratio_max=1.0, loss=0.0, trained_tokens=0)
            warn = detector.update(it, m["reward_std"], m["entropy"], m["grad_norm"])
            if warn:
                warnings.append(warn)
                m["echo_trap_warning"] = 1
            warn = format_detector.update(it, m["invalid_share"])
            if warn:
                warnings.append(warn)
                m["format_collapse_warning"] = 1
            spent += ro.env_calls
            if cfg.eval_every and ((it + 1) % cfg.eval_every == 0 or it + 1 == cfg.iterations):
                model.eval()
                m.update({f"eval_{k}": v for k, v in evaluate(model, cfg).items()})
            m["wall_s"] = time.perf_counter() - t0
            metrics.append(m)
            if sink:
                sink.write(json.dumps(m) + "\n")
                sink.flush()
            if progress:
                print("it %d reward %.3f std %.3f ent %.3f gnorm %.3f %s" % (it, m["reward_mean"], m["reward_std"],
                         m["entropy"], m["grad_norm"],
                         {k: round(v, 3) for k, v in m.items() if k.startswith("eval_") and "accuracy" in k}), flush=True)
    finally:
        if sink:
            sink.close()
    model.eval()
    evaluation = evaluate(model, cfg, samples=max(cfg.eval_samples, 128))
    env.close()
    wall = time.perf_counter() - t0
    if out:
        save_checkpoint(model, str(out / "model.pt"), tok, turns=cfg.turns, env_id=cfg.env_id)
        (out / "summary.json").write_text(json.dumps({"evaluation": evaluation, "wall_s": wall, "warnings": warnings}, indent=2))
    return TextTrainResult(cfg, metrics, evaluation, model, wall, warnings)


# ---------------------------------------------------------------------------------------------- CLI glue
def config_from_args(args) -> TextTrainConfig:
    """A :class:`TextTrainConfig` from an argparse Namespace; attributes absent from it keep defaults."""
    cfg = TextTrainConfig()
    env = getattr(args, "env", None)
    if env:
        cfg.env_id = env if "/" in env else f"forkyard/{env}"
    via_train = getattr(args, "policy", None) == "lm"  # `forkyard train --policy lm`: its --lr is the tabular one
    for name in asdict(cfg):
        if name == "env_id" or (via_train and name == "lr"):
            continue
        if getattr(args, name, None) is not None:
            setattr(cfg, name, getattr(args, name))
    return cfg


def train_lm_from_args(args) -> int:
    """``forkyard train --policy lm`` / ``forkyard train-lm``: RL from an argparse Namespace with at least
    ``env``, ``turns``, ``iterations``, ``seed``, ``estimator``, ``run_dir``, ``device``, ``checkpoint``
    (SFT weights, optional). Prints the evaluation; returns the exit status 0. Under ``train --policy lm``
    that command's ``--lr`` (the tabular policy's step size) is ignored: the LM keeps its Adam lr
    (:class:`TextTrainConfig`; ``train-lm --lr`` sets it)."""
    cfg = config_from_args(args)
    result = train_rl(cfg, progress=True)
    print(json.dumps({"evaluation": result.evaluation, "wall_s": round(result.wall_s, 1), "warnings": result.warnings}, indent=2))
    return 0
