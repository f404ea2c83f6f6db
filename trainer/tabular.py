"""A tabular softmax policy in torch: one logit vector per anchor key over ``info["legal_actions"]``.

The logits live in one torch tensor ``table`` of shape [rows, width] (float32, on ``device``); row r
belongs to one anchor key and uses its first ``n_actions[r]`` columns (the rest are masked to -inf).
A key seen for the first time gets a new row of zeros (a uniform distribution).

Sampling runs in plain Python on a cached copy of the probabilities (refreshed after each update),
so the rollout hot loop never calls torch; only :meth:`TabularPolicy.log_probs` (the update) does.

:class:`TabularPolicy` implements the training loop's :class:`trainer.loop.Policy`: ``session`` acts,
``rollout_metrics`` reports the mean action entropy, ``update`` takes one REINFORCE step (Williams 1992)
with plain SGD of step size ``lr`` on the table.
"""

from __future__ import annotations

import math
import random
from typing import Any

import torch

from trainer.rollout import EpisodeMetrics, Rollout, Step
from trainer.tabular_config import POLICY_KEYS
from trainer.update import grad_norm, reinforce_loss, resolve_device


class TabularPolicy:
    """Softmax policy ``pi(a | key) = softmax(table[row(key)])[a]`` over the legal actions, ``key`` the history's
    anchor key (default) or the current state's key.

    Args:
        device: ``"auto"``, ``"cpu"`` or ``"cuda"``.
        capacity: initial number of rows (grows by doubling).
        lr: SGD step size of :meth:`update` (the trainer passes ``TrainConfig.lr``).
        key_by: what a row is keyed by (:data:`POLICY_KEYS`): ``"history"``, the visible history
            (``info["anchor_key"]``: the policy sees what a history-conditioned agent sees), or ``"state"``, the
            current state alone (``info["state_key"]``: a Markov policy, for envs whose observation is their state).

    Raises:
        ValueError: if one key is seen with two different legal-action lists, or on an unknown ``key_by``.
    """

    def __init__(self, device: str = "auto", capacity: int = 1024, lr: float = 0.1, key_by: str = "history"):
        if key_by not in POLICY_KEYS:
            raise ValueError(f"key_by must be one of {POLICY_KEYS}, got {key_by!r}")
        self.device = resolve_device(device)
        self.lr = lr
        self.key_by = key_by
        self.table = torch.zeros(capacity, 1, device=self.device)
        self.mask = torch.zeros(capacity, 1, dtype=torch.bool, device=self.device)
        self.rows: dict[str, int] = {}
        self.legal: list[tuple[str, ...]] = []
        self._probs: list[list[float]] = []  # per row, refreshed by refresh()
        self._entropy: list[float] = []

    # ------------------------------------------------------------------ table management
    def row_key(self, info: dict[str, Any]) -> str:
        """The key of the row that acts at the state ``info`` describes (per ``key_by``)."""
        return info["anchor_key"] if self.key_by == "history" else info["state_key"]

    @property
    def n_rows(self) -> int:
        return len(self.legal)

    def row(self, anchor_key: str, legal_actions: list[str]) -> int:
        """The row of ``anchor_key``, created (uniform) on first sight."""
        r = self.rows.get(anchor_key)
        if r is not None:
            if len(self.legal[r]) != len(legal_actions):
                raise ValueError(
                    f"anchor {anchor_key} seen with {len(self.legal[r])} and {len(legal_actions)} legal actions"
                )
            return r
        r = len(self.legal)
        n = len(legal_actions)
        if n == 0:
            raise ValueError(f"anchor {anchor_key} has no legal actions")
        cap, width = self.table.shape
        if r >= cap or n > width:
            new_cap, new_width = max(cap, 2 * cap if r >= cap else cap), max(width, n)
            table = torch.zeros(new_cap, new_width, device=self.device)
            mask = torch.zeros(new_cap, new_width, dtype=torch.bool, device=self.device)
            with torch.no_grad():  # a copy, not a step of the graph: the new table is a leaf like the old one
                table[:cap, :width] = self.table
            table.requires_grad_(self.table.requires_grad)
            mask[:cap, :width] = self.mask
            self.table, self.mask = table, mask
        self.mask[r, :n] = True
        self.rows[anchor_key] = r
        self.legal.append(tuple(legal_actions))
        self._probs.append([1.0 / n] * n)
        self._entropy.append(math.log(n))
        return r

    def refresh(self, rows: list[int] | None = None) -> None:
        """Recompute the cached probabilities of ``rows`` (default: every row) from ``table`` (call after an
        update; an update changes only the rows of the steps it trained on, and each row's softmax is its own)."""
        n = self.n_rows
        if n == 0:
            return
        idx = torch.arange(n, device=self.device) if rows is None else torch.tensor(rows, dtype=torch.long,
                                                                                   device=self.device)
        logits = self.table[idx].masked_fill(~self.mask[idx], float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        ent = -(probs * torch.log_softmax(logits, dim=-1)).nan_to_num(0.0).sum(-1)
        if rows is None:
            self._probs = [row[: len(self.legal[i])] for i, row in enumerate(probs.cpu().tolist())]
            self._entropy = ent.cpu().tolist()
            return
        for r, row, e in zip(rows, probs.cpu().tolist(), ent.cpu().tolist(), strict=True):
            self._probs[r], self._entropy[r] = row[: len(self.legal[r])], e

    # ------------------------------------------------------------------ acting
    def sample(self, anchor_key: str, legal_actions: list[str], rng: random.Random) -> tuple[int, float, float, int]:
        """Sample an action at ``anchor_key`` (one ``rng.random()`` draw, inverse CDF).

        Returns:
            ``(index into legal_actions, log-prob (natural log), entropy of the row in nats, table row)``.
        """
        r = self.row(anchor_key, legal_actions)
        probs = self._probs[r]
        u = rng.random()
        acc = 0.0
        idx = len(probs) - 1
        for i, p in enumerate(probs):
            acc += p
            if u < acc:
                idx = i
                break
        return idx, math.log(max(probs[idx], 1e-300)), self._entropy[r], r

    def greedy(self, anchor_key: str, legal_actions: list[str]) -> str:
        """The most probable legal action (the first one on ties; unseen keys are uniform -> the first)."""
        r = self.rows.get(anchor_key)
        if r is None:
            return legal_actions[0]
        probs = self._probs[r]
        return legal_actions[max(range(len(probs)), key=probs.__getitem__)]

    def entropy_at(self, anchor_key: str, legal_actions: list[str]) -> float:
        """Entropy (nats) of the action distribution at ``anchor_key`` (the row is created if new)."""
        return self._entropy[self.row(anchor_key, legal_actions)]

    def session(self, observation: str, info: dict[str, Any]) -> "TabularSession":
        """A :class:`TabularSession` for one episode starting at ``info`` (needs ``anchor_key``,
        ``legal_actions`` and ``turn``)."""
        return TabularSession(self, info)

    # ------------------------------------------------------------------ Ray rollout workers
    def behavior_copy(self) -> "TabularPolicy":
        """A CPU copy of the table for a Ray rollout worker (:mod:`ray_cluster.collector`). Rows it adds for new
        anchors are reported by :meth:`rollout_extras` and mapped to this policy's by :meth:`adopt`."""
        twin = TabularPolicy(device="cpu", capacity=1, lr=self.lr, key_by=self.key_by)
        twin.table, twin.mask = self.table.detach().cpu().clone(), self.mask.cpu().clone()
        twin.rows, twin.legal = dict(self.rows), list(self.legal)
        twin._probs, twin._entropy = [list(p) for p in self._probs], list(self._entropy)
        twin.base_rows = self.n_rows
        return twin

    def rollout_extras(self) -> tuple[int, list[tuple[str, tuple[str, ...]]]]:
        """``(rows the copy started with, [(anchor key, legal actions)] of the rows it added since)``."""
        base = getattr(self, "base_rows", self.n_rows)
        keys = {r: k for k, r in self.rows.items() if r >= base}
        return base, [(keys[r], self.legal[r]) for r in range(base, self.n_rows)]

    def adopt(self, rollout: Rollout, extras: tuple[int, list[tuple[str, tuple[str, ...]]]]) -> None:
        """Point the steps a behavior copy sampled (``extras`` of its :meth:`rollout_extras`) at this table's
        rows: rows the copy added are found or created here by anchor key; older rows are shared."""
        base, added = extras
        rows = {base + i: self.row(key, list(legal)) for i, (key, legal) in enumerate(added)}
        for step in rollout.steps:
            r, idx = step.data
            if r >= base:
                step.data = (rows[r], idx)

    # ------------------------------------------------------------------ resume state
    def state_dict(self) -> dict[str, Any]:
        """Everything the policy learned and caches: table, mask, rows, legal actions, cached probabilities."""
        return {"table": self.table.detach().cpu().clone(), "mask": self.mask.cpu().clone(), "rows": dict(self.rows),
                "legal": [list(x) for x in self.legal], "probs": [list(p) for p in self._probs],
                "entropy": list(self._entropy)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict` (the state as it was: the same samples follow)."""
        self.table, self.mask = state["table"].to(self.device), state["mask"].to(self.device)
        self.rows, self.legal = dict(state["rows"]), [tuple(x) for x in state["legal"]]
        self._probs, self._entropy = [list(p) for p in state["probs"]], list(state["entropy"])

    # ------------------------------------------------------------------ learning
    def parameters(self) -> list[torch.Tensor]:
        return [self.table]

    def log_probs(self, steps: list[Step]) -> torch.Tensor:
        """Log-probs under the current table of the actions in ``steps``: a [N] float32 tensor with grad
        w.r.t. ``table`` (``table.requires_grad`` is switched on)."""
        self.table.requires_grad_(True)
        rows = torch.tensor([s.data[0] for s in steps], dtype=torch.long, device=self.device)
        acts = torch.tensor([s.data[1] for s in steps], dtype=torch.long, device=self.device)
        logits = self.table[rows].masked_fill(~self.mask[rows], float("-inf"))
        return torch.log_softmax(logits, dim=-1).gather(1, acts[:, None]).squeeze(1)

    def rollout_metrics(self, rollout: Rollout) -> dict[str, float]:
        """``{"entropy": mean entropy (nats) of the action distributions the rollout's steps sampled from}``."""
        steps = rollout.steps
        return {"entropy": sum(s.entropy for s in steps) / max(len(steps), 1)}

    def update(self, rollout: Rollout, assigned) -> dict[str, float]:
        """One REINFORCE step (:func:`trainer.update.reinforce_loss`, normalised per valid episode) and
        ``table -= lr * grad``; skipped when no step has a non-zero advantage.

        Returns:
            ``{"grad_norm": L2 norm of the table's gradient}`` (0.0 when skipped).
        """
        gnorm = 0.0
        if assigned.steps and any(a != 0.0 for a in assigned.advantages):
            logp = self.log_probs(assigned.steps)
            a = torch.tensor(assigned.advantages, dtype=logp.dtype, device=logp.device)
            reinforce_loss(logp, a, assigned.n_episodes).backward()
            gnorm = grad_norm(self.parameters())
            self.sgd_step(self.lr, sorted({s.data[0] for s in assigned.steps}))
        return {"grad_norm": gnorm}

    @torch.no_grad()
    def sgd_step(self, lr: float, rows: list[int] | None = None) -> None:
        """``table -= lr * table.grad``; clears the gradient and refreshes the cached probabilities of ``rows``
        (default: all; the rows with a gradient are enough: the others did not change)."""
        if self.table.grad is not None:
            self.table -= lr * self.table.grad
            self.table.grad = None
        self.refresh(rows)


class TabularSession:
    """The tabular policy's view of one episode branch: the current anchor key and legal actions."""

    __slots__ = ("policy", "key", "anchor", "state", "legal", "turn")

    def __init__(self, policy: TabularPolicy, info: dict[str, Any]):
        self.policy = policy
        self.observe("", info)

    def observe(self, observation: str, info: dict[str, Any]) -> None:
        self.key = self.policy.row_key(info)
        self.anchor, self.state = info["anchor_key"], info.get("state_key", "")
        self.legal = info["legal_actions"]
        self.turn = info["turn"]

    def act(self, rng: random.Random) -> Step:
        idx, logp, ent, row = self.policy.sample(self.key, self.legal, rng)
        return Step(self.turn, self.anchor, self.legal[idx], logp, ent, (row, idx), self.state)

    def entropy(self) -> float:
        return self.policy.entropy_at(self.key, self.legal)

    def fork(self) -> "TabularSession":
        twin = object.__new__(TabularSession)
        twin.policy, twin.key, twin.anchor, twin.state = self.policy, self.key, self.anchor, self.state
        twin.legal, twin.turn = self.legal, self.turn
        return twin


def greedy_eval(policy: TabularPolicy, env, resets: list[tuple[int | None, dict | None]]) -> dict[str, float]:
    """Run the greedy (argmax) tabular policy once per reset.

    Returns ``{"accuracy": mean reward, <env episode metrics>: their means, "episodes": n}``; the env's
    metrics are what it reports in ``info["episode_metrics"]`` at each episode's end (ClueProbe:
    ``distinct_probes``, the mean number of distinct probes per episode).
    """
    total = 0.0
    env_metrics = EpisodeMetrics()
    for seed, options in resets:
        obs, info = env.reset(seed=seed, options=options)
        while True:
            obs, r, te, tr, info = env.step(policy.greedy(policy.row_key(info), info["legal_actions"]))
            total += r
            if te or tr:
                env_metrics.add_info(info)
                break
    return {"accuracy": total / max(len(resets), 1), **env_metrics.means(), "episodes": len(resets)}


def setup(cfg):
    """The tabular policy's run (:func:`trainer.train.train`, ``forkyard train --policy tabular``): the env of
    ``cfg`` (:class:`trainer.tabular_config.TrainConfig`; on ``cfg.server_url`` when set), a fresh
    :class:`TabularPolicy` trained by REINFORCE with step size ``cfg.lr``, and the greedy evaluation
    (:func:`greedy_eval`) on the env's evaluation resets (ClueProbe: every target; else ``cfg.eval_episodes``
    held-out seeds). Returns a :class:`trainer.train.Trainee`."""
    from trainer.loop import evaluation_resets, make_env
    from trainer.train import Trainee

    env = make_env(cfg.env_id, cfg.env_options(), cfg.server_url)
    policy = TabularPolicy(device=cfg.device, lr=cfg.lr, key_by=cfg.policy_key)
    resets = evaluation_resets(cfg.env_id, cfg.env_options(), cfg.eval_episodes)
    return Trainee(policy, env, evaluate=lambda: greedy_eval(policy, env, resets))
