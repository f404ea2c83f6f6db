"""Text-policy RL (``forkyard train-lm`` = ``forkyard train --policy lm``): PPO-style updates in the shared
training loop (:func:`trainer.loop.train_loop`), usually from an SFT checkpoint (:mod:`trainer.text.text_sft`).

One iteration (the loop's steps; this module supplies :class:`PPOTextPolicy`, the shaping and the hooks):

1. Rollout with the sampling policy (:class:`trainer.text.text_policy.TextPolicy`): a tree-fork rollout
   (``n_base`` bases x ``branches``) or a group of ``group_size`` independent episodes, batched across every
   live episode by :class:`trainer.text.engine.RolloutEngine` (``--sampler batched``, the default), or one session at
   a time through the same :func:`trainer.waves.tree_rollout` / :func:`trainer.waves.group_rollout` as the
   tabular policy (``--sampler serial``): the same episodes for the same seeds; optionally the invalid-action
   penalty (:func:`apply_invalid_penalty`).
2. Per-step advantages from the registered estimators (:func:`trainer.estimators.step_advantages`),
   broadcast over that step's generated tokens.
3. Rows (:func:`build_batch`): one token row per episode or branch, exactly the ids it sampled and was
   shown (the last step's context plus its action; a branch's row contains the base prefix with mask 0).
   Each step's tokens are located by position and checked against the row (no re-tokenisation; a
   mismatch raises). With ``--update tree`` the rows are merged into prefix trees and each shared prefix is
   computed once (:mod:`trainer.text.tree_update`): the same log-probs, loss and gradients.
4. ``ppo_epochs`` full-batch epochs of :func:`trainer.text.losses.ppo_loss` (ratio against the recorded
   behavior log-probs; on the first epoch the ratio is 1 up to float rounding: every forward runs with
   dropout off, as sampling does, :func:`trainer.update.dropout_off`), Adam, grad-norm clip
   (:meth:`PPOTextPolicy.update`).
5. Monitors (:mod:`trainer.text.monitors`), periodic evaluation (:func:`trainer.text.text_eval.evaluate`) and
   ``metrics.jsonl``.
"""

from __future__ import annotations

import copy
import json
import random
import tempfile
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from trainer.estimators import Assigned
from trainer.text.checkpoints import load_checkpoint, save_checkpoint
from trainer.loop import TrainResult, collect, make_env
from trainer.text.losses import PPOConfig, ppo_loss
from trainer.text.monitors import EchoTrapDetector, FormatCollapseDetector
from trainer.rollout import Rollout
from trainer.text.text_config import TextTrainConfig
from trainer.text.text_eval import evaluate
from trainer.text.text_policy import SamplingConfig, TextPolicy, pad_rows, token_logprobs
from trainer.text.text_sft import new_model, training_model
from trainer.text.hf import save_folder, untie_output
from trainer.text.tokenizer import model_tokenizer
from trainer.text.tree_update import pack_rows, tree_token_logprobs
from trainer.update import dropout_off


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


def build_batch(rollout: Rollout, steps: list, advantages: list[float], pad_id: int, device) -> Batch | None:
    """Token rows of the episodes whose steps are trained (see the module docstring, item 3).

    A row is ``ids[window_start:end]`` of one episode's token history, where ``end`` is the end of the
    last trained step; one row per distinct ``window_start`` (one row per episode when the history fits
    in the context). Mask 1 exactly on the sampled ids of trained steps (the ``<|end|>`` they generated
    included); advantage and behavior log-prob are set there. ``group`` is the episode's tree base (or 0).

    Returns None when no step is trained. Raises RuntimeError if a step's ids are not where its record
    says they are in the episode's history (re-tokenisation drift).
    """
    adv_of = {id(s): a for s, a in zip(steps, advantages, strict=True)}
    rows, masks, advs, olds, groups = [], [], [], [], []
    for ep in rollout.episodes:
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


# ---------------------------------------------------------------------------------------------- the policy
class PPOTextPolicy(TextPolicy):
    """The text policy with its PPO learner: implements :class:`trainer.loop.Policy`.

    ``session`` is :class:`TextPolicy`'s (sampling with the recorded behavior log-probs);
    :meth:`rollout_metrics` reports token entropy, response length and the invalid-action share;
    :meth:`update` builds the token batch and runs ``ppo_epochs`` epochs of Adam on the PPO loss.

    Args:
        model: a :class:`trainer.text.lm.CausalLM` (kept in eval mode outside :meth:`update`).
        tokenizer, sampling: as :class:`TextPolicy`.
        lr: Adam learning rate.
        ppo: the loss settings (:class:`trainer.text.losses.PPOConfig`); ``kl_coef > 0`` keeps a frozen copy
            of ``model`` as the KL reference (a LoRA model: itself with its adapters disabled, no copy).
        ppo_epochs: full-batch epochs per update (>= 1).
        max_grad_norm: gradient-norm clip.
        update: ``"flat"`` (padded rows) or ``"tree"`` (the rows' prefix trees, :mod:`trainer.text.tree_update`):
            the same log-probs, loss and gradients up to float rounding, one forward per shared prefix.
        tis_cap: None, or the truncated importance sampling cap C: the PPO ratio is taken against the trainer's own
            recompute of the sampled tokens before the update, each token weighted by ``min(recompute / behavior,
            C)`` (:func:`trainer.text.losses.ppo_loss`'s ``is_weight``), for a sampler whose numbers differ (vLLM).

    Attributes:
        version: updates made so far; every step records the version that sampled it (``TextRecord.version``).

    Raises:
        ValueError: on an unknown ``update``.
    """

    def __init__(self, model, tokenizer, sampling: SamplingConfig, *, lr: float, ppo: PPOConfig,
                 ppo_epochs: int, max_grad_norm: float, update: str = "flat", tis_cap: float | None = None):
        super().__init__(model, tokenizer, sampling)
        self.tis_cap = tis_cap
        self._sync_dir: tempfile.TemporaryDirectory | None = None
        if update not in ("flat", "tree"):
            raise ValueError(f"update must be flat or tree, got {update!r}")
        self.update_layout, self.ppo, self.ppo_epochs, self.max_grad_norm = update, ppo, ppo_epochs, max_grad_norm
        self.optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        # the KL reference: a frozen copy, or for a LoRA model the same model with its adapters disabled (the
        # base weights are the starting model's and never move), which costs no second copy
        self._ref_is_base = bool(ppo.kl_coef) and getattr(model, "lora", False)
        self.ref = copy.deepcopy(model).eval() if ppo.kl_coef and not self._ref_is_base else None
        model.eval()

    @classmethod
    def from_config(cls, model, cfg: TextTrainConfig) -> "PPOTextPolicy":
        """The policy ``cfg`` describes, around ``model`` (its ``tokenizer`` attribute, or bytes); it samples
        through the batched engine (:class:`trainer.text.engine.RolloutEngine`) unless ``cfg.sampler == "serial"``."""
        if cfg.sampler == "vllm":
            untie_output(model)  # before the optimizer sees the parameters
        policy = cls(model, model_tokenizer(model), cfg.sampling(), lr=cfg.lr,
                     ppo=PPOConfig(cfg.clip_low, cfg.clip_high, cfg.entropy_coef, cfg.kl_coef, cfg.reduction),
                     ppo_epochs=cfg.ppo_epochs, max_grad_norm=cfg.max_grad_norm, update=cfg.update,
                     tis_cap=cfg.tis_cap)
        if cfg.sampler in ("batched", "vllm"):
            from trainer.text.engine import RolloutEngine
            from trainer.vllm_sampler import VLLMSampler

            sampler = None if cfg.sampler != "vllm" else (
                VLLMSampler.connect(cfg.vllm_url) if cfg.vllm_url else VLLMSampler.launch(policy.save_weights()))
            policy.engine = RolloutEngine.from_config(cfg, sampler)
            if cfg.vllm_url:
                policy.sync_sampler()
        return policy

    def save_weights(self) -> str:
        """The current weights as a Hugging Face folder (:func:`trainer.text.hf.save_folder`), in a temporary folder
        this policy keeps (removed with it); returns its path."""
        if self._sync_dir is None:
            self._sync_dir = tempfile.TemporaryDirectory(prefix="forkyard-weights-")
        save_folder(self.model, self._sync_dir.name)
        return self._sync_dir.name

    def sync_sampler(self) -> None:
        """Give a sampler outside this process (vLLM's server, :class:`trainer.vllm_sampler.VLLMSampler`) the current
        weights (:meth:`save_weights`, then reloaded there). Nothing to do for the torch samplers, which read this
        process's model. Raises what ``load_weights`` raises."""
        load = getattr(getattr(getattr(self, "engine", None), "sampler", None), "load_weights", None)
        if load is not None:
            load(self.save_weights())

    def rollout_metrics(self, rollout: Rollout) -> dict[str, float]:
        """``entropy`` (nats, mean over every generated token), ``response_length`` (tokens per action) and
        ``invalid_share`` (share of actions that mean none of ``info["legal_actions"]``, by the env's parser
        (:func:`envs.actions.is_legal_action`), over the steps whose env has such a menu)."""
        steps, ents = rollout.steps, [x for s in rollout.steps for x in s.data.entropies]
        legal_known = [s for s in steps if s.data.legal is not None]
        return {
            "entropy": sum(ents) / max(len(ents), 1),
            "response_length": sum(len(s.data.action_ids) for s in steps) / max(len(steps), 1),
            "invalid_share": sum(not s.data.legal for s in legal_known) / max(len(legal_known), 1),
        }

    def state_dict(self) -> dict[str, Any]:
        """The resume state: weights, Adam's state, the KL reference's weights (None without one), the version."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "ref": self.ref.state_dict() if self.ref is not None else None, "version": self.version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`, into a policy built as the saved one was (same model and settings)."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.ref is not None and state.get("ref") is not None:
            self.ref.load_state_dict(state["ref"])
        self.version = int(state.get("version", 0))
        self.sync_sampler()  # a server outside this process samples the resumed weights

    def behavior_copy(self) -> TextPolicy:
        """A sampling copy of the current weights on the CPU, for a Ray rollout worker (:mod:`ray_cluster.collector`):
        model, tokenizer and sampling settings, no optimizer; a batched engine of this policy's engine settings
        when it has one (``engine``: the worker samples through it)."""
        behavior = TextPolicy(copy.deepcopy(self.model).cpu().eval(), self.tok, self.sampling)
        behavior.version = self.version
        if self.engine is not None:
            e = self.engine
            if hasattr(e.sampler, "load_weights"):
                raise ValueError("Ray rollout workers sample with this process's torch engine; --sampler vllm runs "
                                 "without --ray")
            behavior.engine = type(e)(e.max_batch, e.max_kv_tokens, e.env_threads, e.max_live)
        return behavior

    def adopt(self, rollout: Rollout, extras: Any) -> None:
        """Nothing to do: a text step (token ids, behavior log-probs) means the same on every node."""

    def update(self, rollout: Rollout, assigned: Assigned) -> dict[str, float]:
        """PPO on the trained steps (module docstring, items 3-4); skipped when no step has a non-zero advantage.

        Returns:
            ``grad_norm`` (first epoch, before clipping), ``clip_frac``, ``ratio_mean``/``min``/``max``
            and ``loss`` (last epoch), ``trained_tokens``, and ``first_epoch_ratio_max_dev``
            (``max |ratio - 1|`` of the first epoch: ~0 on policy) when trained; ``forward_tokens``: the token
            slots one forward pass computes (flat: rows x longest row; tree: the prefix trees' nodes);
            ``behavior_logp_gap`` / ``_max``: mean and largest ``|trainer's log-prob - behavior log-prob|`` over the
            trained tokens before the first step (nats; float rounding on policy, more from a sampler whose numbers
            differ or whose weights lag); ``policy_lag``: the most updates between a trained step's sampling and
            this update (0 on policy); with ``tis_cap``, ``tis_weight_mean`` and ``tis_clipped_frac``. After a
            step the version counts one more and an outside sampler gets the new weights (:meth:`sync_sampler`).

        Raises:
            RuntimeError: if a step's token ids drifted from what was sampled (:func:`build_batch`).
        """
        batch = build_batch(rollout, assigned.steps, assigned.advantages, self.tok.pad_id, self.device)
        if batch is None or not any(a != 0.0 for a in assigned.advantages):
            return dict(grad_norm=0.0, clip_frac=0.0, ratio_mean=1.0, ratio_min=1.0, ratio_max=1.0, loss=0.0,
                        trained_tokens=0)
        model, temperature, suppress = self.model, self.sampling.temperature, self.tok.suppressed_ids
        if self.update_layout == "tree":
            packed = pack_rows(batch.rows, self.tok.pad_id, self.device)

            def forward(m) -> tuple[torch.Tensor, torch.Tensor]:
                return tree_token_logprobs(m, packed, temperature, suppress)
        else:
            def forward(m) -> tuple[torch.Tensor, torch.Tensor]:
                return token_logprobs(m, batch.ids, temperature, suppress)[:2]
        # every forward of the update without dropout, as the sampling forward: the first epoch's ratio is 1 up to
        # float rounding for any checkpoint (field case S37; trainer.update.dropout_off)
        with dropout_off(model):
            ref_logp = None
            if self.ref is not None:
                with torch.no_grad():
                    ref_logp = forward(self.ref)[0]
            elif self._ref_is_base:
                with torch.no_grad(), model.hf.disable_adapter():
                    ref_logp = forward(model)[0]
            out: dict[str, float] = {}
            on = batch.mask > 0
            old, weight = batch.old_logp, None
            if self.tis_cap is not None:  # the ratio against the trainer's recompute, weighted back to the sampler's
                with torch.no_grad():
                    old = forward(model)[0]
                weight = torch.exp(old - batch.old_logp).clamp(max=self.tis_cap)
                out["tis_weight_mean"] = float(weight[on].mean())
                out["tis_clipped_frac"] = float((torch.exp(old - batch.old_logp)[on] > self.tis_cap).float().mean())
            for epoch in range(self.ppo_epochs):
                logp, ent = forward(model)
                loss, st = ppo_loss(logp, old, batch.advantages, batch.mask, self.ppo, ent, ref_logp, batch.group,
                                    weight)
                self.optimizer.zero_grad()
                loss.backward()
                g = float(torch.nn.utils.clip_grad_norm_(model.parameters(), self.max_grad_norm))
                self.optimizer.step()
                if epoch == 0:
                    out["first_epoch_ratio_max_dev"] = max(abs(st["ratio_max"] - 1), abs(st["ratio_min"] - 1))
                    out["grad_norm"], out["trained_tokens"] = g, st["tokens"]
                    out["forward_tokens"] = float(packed.nodes if self.update_layout == "tree" else batch.ids.numel())
                    gap = (logp.detach() - batch.old_logp)[on].abs()
                    out["behavior_logp_gap"], out["behavior_logp_gap_max"] = float(gap.mean()), float(gap.max())
                last = st
        out.update(clip_frac=last["clip_frac"], ratio_mean=last["ratio_mean"], ratio_min=last["ratio_min"],
                   ratio_max=last["ratio_max"], loss=float(loss.detach()),
                   policy_lag=float(max(self.version - s.data.version for s in assigned.steps)))
        self.version += 1
        self.sync_sampler()
        return out


def invalid_penalty_shaping(cfg: TextTrainConfig):
    """The loop's shaping hook for ``cfg.invalid_penalty`` (:func:`apply_invalid_penalty`), or None when 0."""
    return partial(apply_invalid_penalty, penalty=cfg.invalid_penalty) if cfg.invalid_penalty else None


def sample_batch(cfg: TextTrainConfig, env, policy: TextPolicy, rng: random.Random,
                 iteration: int) -> tuple[Rollout, Assigned, Batch | None]:
    """One iteration's data exactly as :func:`train_rl` makes it: the rollout on the training seeds of
    ``iteration``, the invalid-action shaping if set, the per-step advantages and the token batch
    (``batch`` None when no step is trained). For analyses of single iterations
    (``benchmarks/bench_gradient_alignment.py``).

    """
    ro, assigned = collect(cfg, env, policy, rng, iteration, invalid_penalty_shaping(cfg))
    return ro, assigned, build_batch(ro, assigned.steps, assigned.advantages, policy.tok.pad_id, policy.device)


# ---------------------------------------------------------------------------------------------- RL
def setup(cfg: TextTrainConfig, model=None):
    """The text policy's run (:func:`trainer.train.train`, ``forkyard train --policy lm``): RL from ``model``
    (or ``cfg.checkpoint``, or a fresh model) as :class:`PPOTextPolicy`, with the invalid-action shaping
    (:func:`invalid_penalty_shaping`), the echo-trap and format-collapse monitors, the sampled and greedy
    evaluations (:func:`trainer.text.text_eval.evaluate`: ``cfg.eval_samples`` held-out episodes every
    ``cfg.eval_every`` iterations, at least 128 at the end) and ``model.pt`` saved in the run folder. A resumed
    run's model is built as the run built it (``--model`` or a new one); the loop then gives it the saved
    state. Returns a :class:`trainer.train.Trainee`."""
    from trainer.train import Trainee

    if model is None:
        model = load_checkpoint(cfg.checkpoint, cfg.device, cfg.dtype) if cfg.checkpoint else new_model(cfg)
    model = training_model(cfg, model)
    policy = PPOTextPolicy.from_config(model, cfg)

    def evaluation(samples: int) -> dict[str, float]:
        model.eval()
        return evaluate(model, cfg, samples=samples)

    def postfix(m: dict[str, Any]) -> dict[str, Any]:
        evals = {k[5:]: round(v, 3) for k, v in m.items() if k.startswith("eval_") and "accuracy" in k}
        return {"reward": f"{m['reward_mean']:.3f}", "std": f"{m['reward_std']:.3f}", "ent": f"{m['entropy']:.3f}",
                "gnorm": f"{m['grad_norm']:.3f}", **evals}

    def finish(run_dir) -> None:
        if run_dir:
            save_checkpoint(model, str(run_dir / "model.pt"), policy.tok, max_turns=cfg.max_turns, env_id=cfg.env_id)

    return Trainee(policy, make_env(cfg.env_id, cfg.env_options(), cfg.server_url),
                   evaluate=partial(evaluation, max(cfg.eval_samples, 128)),
                   periodic_evaluation=partial(evaluation, cfg.eval_samples), shaping=invalid_penalty_shaping(cfg),
                   monitors=(EchoTrapDetector(), FormatCollapseDetector()), postfix=postfix, finish=finish,
                   model=model)


def train_rl(cfg: TextTrainConfig, model=None) -> TrainResult:
    """:func:`trainer.train.train` of the text policy from ``model`` (None: ``cfg.checkpoint`` or a fresh model;
    :func:`setup`). Writes ``config.json``, ``metrics.jsonl``, ``resume.pt`` (weights, optimizer, KL
    reference, RNG states, loop state), ``summary.json`` and ``model.pt`` to ``cfg.run_dir`` when set.
    Raises as :func:`trainer.train.train`."""
    from trainer.train import train

    return train(cfg, partial(setup, model=model), command="train-lm")


def print_result(result: TrainResult) -> None:
    """The summary ``forkyard train-lm`` prints: evaluation, wall seconds, warnings (JSON)."""
    out = {"evaluation": result.evaluation, "wall_s": round(result.wall_s, 1), "warnings": result.warnings}
    if getattr(result.config, "ray", None) is not None:
        from trainer.collectors import cluster_totals

        out["ray"] = cluster_totals(result.metrics)
    print(json.dumps(out, indent=2))
