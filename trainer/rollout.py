"""The pieces of forkyard's rollouts over any env: episodes, streams, the fork-turn choice, branch spreading, counts.

The rollouts themselves (independent groups and tree forks) are played by the one wave driver,
:mod:`trainer.waves` (:func:`trainer.waves.group_rollout` / :func:`trainer.waves.tree_rollout` serially, batched
samplers over the same driver). The rollout code sees an env only through the Gymnasium API (``reset``, ``step``,
``info``) plus ``fork(n)`` and ``close()``; it never reads an env's internals. A policy is seen only through
:class:`PolicySession` objects (one per episode branch), so the tabular policy and the text policy
plug into the same code.

Every ``env.step`` call is counted in :attr:`Rollout.env_calls`, branch steps included; every env
``fork`` call in :attr:`Rollout.forks`, the ones that failed through the infrastructure also in
:attr:`Rollout.forks_failed`.

Infrastructure failures (:class:`~envs.core.EnvInfraError`) never end a rollout: a failed ``reset`` or
``step`` loses that episode, a failed ``fork`` loses the branches that fork would have started. Lost
episodes are returned with ``infra_failure=True`` and ``reason="infra_error"``; trainers leave them out
of group statistics.

Sampling RNG streams: every episode samples from its own ``random.Random`` (:func:`stream`), derived from the
rollout's ``rng`` by :func:`episode_seeds` (one 64-bit seed per episode or base, all drawn before any sampling),
and a tree branch from its base's seed and branch index; a tree's fork-turn draws come from its base's stream.
An episode's actions thereby depend on its seed alone, not on which episodes ran before it or beside it, so a
batched rollout (:mod:`trainer.text.engine`) samples the same episodes as the serial one.

Env-reported episode metrics: the ``info`` of the step that ends an episode may carry
``info["episode_metrics"]`` (:data:`EPISODE_METRICS`), a dict of numbers the env computes about the
whole episode (ClueProbe: ``distinct_probes``). The rollout keeps it as :attr:`Episode.env_metrics`;
the trainer averages it (:class:`EpisodeMetrics`) without knowing what the names mean.

A tree's fork-turn choice (:class:`ForkTurn`) and the spreading of a base's checkpoint into branches
(:func:`spread_branches`) are written once, here, and called by the driver for every sampler.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from envs.core import INFRA_FAILURE_REASONS, EnvInfraError

log = logging.getLogger(__name__)

FORK_SELECTIONS = ("uniform", "entropy")
#: The ``info`` key under which an env reports its per-episode metrics at the step that ends the episode.
EPISODE_METRICS = "episode_metrics"


@dataclass
class Step:
    """One action the policy took.

    Attributes:
        turn: 0-based turn index of the action.
        anchor_key: ``info["anchor_key"]`` of the state the action was taken in.
        action: the action text sent to ``env.step``.
        logp: behavior log-prob of the action under the sampling policy (natural log).
        entropy: entropy of the policy's action distribution at that state (nats).
        data: policy-specific record (tabular: ``(row, action_index)``; text: token ids, log-probs).
        state_key: ``info["state_key"]`` of that state (GiGPO's key, :mod:`envs.core`); ``""`` if not recorded.
    """

    turn: int
    anchor_key: str
    action: str
    logp: float
    entropy: float
    data: Any = None
    state_key: str = ""


@dataclass
class Episode:
    """One episode (or one branch of a tree), with the steps it took itself.

    A branch's ``steps`` start at its ``fork_turn``; the prefix before it belongs to the base episode.
    ``reward`` is the full return, prefix rewards included. ``infra_failure`` marks an episode ended
    by the infrastructure (``EnvInfraError`` or ``termination_reason == "infra_error"``); trainers
    leave it out of group statistics. A truncation adds no reward of its own and nothing is
    bootstrapped past the last step.
    """

    steps: list[Step] = field(default_factory=list)
    reward: float = 0.0
    reason: str | None = None
    infra_failure: bool = False
    seed: int | None = None
    base: int | None = None  # tree: index of the base this episode belongs to
    branch: int = 0  # tree: 0 for the base's own continuation, 1..m-1 for new branches
    fork_turn: int | None = None  # tree: turn at which the base was forked
    env_metrics: dict[str, float] | None = None  # info["episode_metrics"] of the last step, if the env gave one
    invalid_actions: int = 0  # steps whose info said ``invalid_action`` (the env did not run the action)


@dataclass
class Rollout:
    """The episodes of one iteration and what they cost."""

    kind: str  # "group" or "tree"
    episodes: list[Episode]
    env_calls: int = 0
    forks: int = 0  # env.fork calls, failed ones included
    forks_failed: int = 0  # env.fork calls that raised EnvInfraError
    branches_lost: int = 0  # branch episodes never run because their fork failed (each in ``episodes``, infra_failure)
    cluster: dict[str, float] = field(default_factory=dict)  # a Ray run's placement figures (ray_cluster.collector)

    @property
    def valid(self) -> list[bool]:
        """[K] per episode: False when it was lost to the infrastructure."""
        return [not e.infra_failure for e in self.episodes]

    @property
    def rewards(self) -> list[float]:
        """[K] per episode: its return (a branch's includes its base's prefix rewards)."""
        return [e.reward for e in self.episodes]

    @property
    def steps(self) -> list[Step]:
        """[S] every step of every episode, episode by episode (the order advantages are given in)."""
        return [s for e in self.episodes for s in e.steps]

    @property
    def step_episode(self) -> list[int]:
        """[S] index into :attr:`episodes` of the episode each step of :attr:`steps` belongs to."""
        return [i for i, e in enumerate(self.episodes) for _ in e.steps]


class EpisodeMetrics:
    """Means of env-reported episode metrics (:data:`EPISODE_METRICS`) over the episodes that reported them.

    ``add(info)`` with the ``info`` of an episode's last step (or an :attr:`Episode.env_metrics` dict);
    :meth:`means` returns ``{name: sum / number of episodes that reported name}`` (plain Python numbers:
    an int sum divided by an int count).
    """

    __slots__ = ("sums", "counts")

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def add(self, metrics: dict[str, Any] | None) -> None:
        """Count one episode's metrics (``metrics`` None or empty: nothing)."""
        for key, value in (metrics or {}).items():
            self.sums[key] = self.sums.get(key, 0) + value
            self.counts[key] = self.counts.get(key, 0) + 1

    def add_info(self, info: dict[str, Any]) -> None:
        """Count the metrics of an episode's last ``info`` (none when the env reports none)."""
        self.add(info.get(EPISODE_METRICS))

    def means(self) -> dict[str, float]:
        """``{name: mean over the episodes that reported it}``, in first-seen order."""
        return {k: self.sums[k] / self.counts[k] for k in self.sums}


class PolicySession(Protocol):
    """A policy's view of one episode branch: chooses actions, sees observations, can be forked."""

    def act(self, rng: random.Random) -> Step: ...

    def observe(self, observation: str, info: dict[str, Any]) -> None: ...

    def fork(self) -> "PolicySession": ...

    def entropy(self) -> float:
        """Entropy (nats) of the action distribution at the current state."""
        ...


class Actor(Protocol):
    """What a rollout needs of a policy: a session per episode (the training loop's
    :class:`trainer.loop.Policy` adds the learning side)."""

    def session(self, observation: str, info: dict[str, Any]) -> PolicySession: ...


class _Counter:
    __slots__ = ("env_calls", "forks", "forks_failed")

    def __init__(self) -> None:
        self.env_calls = 0
        self.forks = 0
        self.forks_failed = 0


def training_seeds(seed: int, iteration: int, n: int) -> list[int]:
    """The ``n`` env reset seeds of ``iteration`` of a run with ``seed`` (disjoint across iterations;
    evaluation uses others): what every collector of a run resets its episodes with, local or on Ray."""
    return [(seed * 1_000_003 + iteration * n + i) % 2**31 for i in range(n)]


def branch_envs(fork_env, branches: int, counter: _Counter) -> list:
    """The envs of a tree base's new branches 1..branches-1 at its checkpoint: ``fork_env`` (the checkpoint's
    copy; None when that fork failed: no branch) and ``branches - 2`` forks of it. Fewer when a fork fails
    (:func:`_fork`): the missing branches are lost."""
    if fork_env is None:
        return []
    return [fork_env] + ((_fork(fork_env, branches - 2, counter) or []) if branches > 2 else [])


def episode_seeds(rng: random.Random, n: int) -> list[int]:
    """``n`` 64-bit stream seeds drawn from ``rng`` in order (one per episode of a group, one per base of a
    tree), before any sampling."""
    return [rng.getrandbits(64) for _ in range(n)]


def given_streams(rng: random.Random | None, n: int, stream_seeds: list[int] | None) -> list[int]:
    """The ``n`` stream seeds of a rollout: ``stream_seeds`` when given (``rng`` is then not read), else
    :func:`episode_seeds` of ``rng``. Passing ``episode_seeds(rng_b, 1)[0]`` for each of several bases (or group
    episodes) runs them in one rollout with the streams each would get alone with its own ``rng_b`` (a Ray
    rollout worker's bases, :mod:`ray_cluster.collector`).

    Raises:
        ValueError: ``stream_seeds`` does not hold ``n`` seeds, or both it and ``rng`` are None.
    """
    if stream_seeds is None:
        if rng is None:
            raise ValueError("need rng or stream_seeds")
        return episode_seeds(rng, n)
    if len(stream_seeds) != n:
        raise ValueError(f"{len(stream_seeds)} stream seeds for {n} episodes")
    return [int(s) for s in stream_seeds]


def stream(seed: int, branch: int = 0) -> random.Random:
    """The sampling RNG of an episode (``branch`` 0: a group's episode or a tree's base) or of a tree's branch
    ``branch >= 1`` of the base with stream seed ``seed`` (:func:`episode_seeds`): ``random.Random(seed +
    branch * 2**64)``, distinct integer seeds for every (seed, branch)."""
    return random.Random(seed + (branch << 64))


def _fork(env, n: int, counter: _Counter) -> list | None:
    """``env.fork(n)``, counted; None when the fork failed through the infrastructure."""
    counter.forks += 1
    try:
        return env.fork(n)
    except EnvInfraError as exc:
        counter.forks_failed += 1
        log.warning("fork(%d) lost to infrastructure: %s", n, exc)
        return None


@dataclass
class Checkpoint:
    """A tree base's fork point: the turn, the env's copy there (None when that fork failed: no branch), the policy
    session's copy, and the reward the base had gathered before that turn."""

    turn: int
    env: Any
    session: Any
    prefix_reward: float


@dataclass
class ForkTurn:
    """The fork-turn choice of one tree base, called by every sampler (serial, batched, TRL) once per turn, before
    the turn's action is drawn: uniform over the turns the base takes (reservoir sampling: at turn t a fork replaces
    the kept one with probability 1/(t+1), the draw from the base's own stream), or the turn of highest action
    entropy (earliest on ties; ARPO, arXiv:2507.19849). A new choice forks the env (one ``fork(1)``, counted) and the
    policy session and closes the copy it replaces. ``branches == 1`` never forks."""

    selection: str
    branches: int
    best_entropy: float = float("-inf")
    checkpoint: Checkpoint | None = None

    def consider(self, turn: int, rng: random.Random, entropy: Callable[[], float], env: Any, session: Any,
                 reward: float, counter: _Counter) -> None:
        """Turn ``turn`` of the base: keep a fork of ``env`` / ``session`` here if the rule chooses it.

        Args:
            rng: the base's sampling stream (read by ``uniform`` only).
            entropy: the action entropy at this turn, in nats (called by ``entropy`` only, once).
            reward: the base's reward so far (the branches' prefix reward).
        """
        if self.branches == 1:
            return
        if self.selection == "uniform":
            take = rng.random() * (turn + 1) < 1.0
        else:
            value = entropy()
            take = value > self.best_entropy
        if not take:
            return
        if self.checkpoint is not None and self.checkpoint.env is not None:
            self.checkpoint.env.close()
        forked = _fork(env, 1, counter)
        # A failed fork still takes this turn's place in the choice (the fork-turn distribution stays as
        # documented); its branches are recorded as lost by spread_branches.
        self.checkpoint = Checkpoint(turn, forked[0] if forked else None, session.fork() if forked else None, reward)
        if self.selection == "entropy":
            self.best_entropy = value


@dataclass
class BranchStart:
    """A live branch ready to run from its base's checkpoint: its env, policy session, episode and sampling stream."""

    env: Any
    session: Any
    episode: "Episode"
    rng: random.Random


def spread_branches(base: "Episode", checkpoint: Checkpoint | None, branches: int, stream_seed: int,
                    counter: _Counter) -> tuple[list["Episode"], list[BranchStart], int]:
    """Branches 1..branches-1 of ``base`` from its ``checkpoint`` (every sampler's one spreading): the env copies of
    :func:`branch_envs`, the policy session forked per branch (the last takes the checkpoint's own), branch j
    sampling from ``stream(stream_seed, j)``; sets ``base.fork_turn`` when the checkpoint's fork held.

    Returns:
        (the branch episodes in order, those that can run as :class:`BranchStart`, how many were lost: their
        episodes have no steps, ``infra_failure=True`` and ``reason="infra_error"``). No checkpoint: nothing.
    """
    if checkpoint is None:
        return [], [], 0
    if checkpoint.env is not None:
        base.fork_turn = checkpoint.turn
    envs_ = branch_envs(checkpoint.env, branches, counter)
    live = len(envs_)
    episodes, starts, lost = [], [], 0
    for j in range(1, branches):
        ep = Episode(seed=base.seed, base=base.base, branch=j, fork_turn=checkpoint.turn,
                     reward=checkpoint.prefix_reward)
        episodes.append(ep)
        if j > live:
            ep.infra_failure, ep.reason = True, "infra_error"
            lost += 1
            continue
        session = checkpoint.session if j == live else checkpoint.session.fork()
        starts.append(BranchStart(envs_[j - 1], session, ep, stream(stream_seed, j)))
    return episodes, starts, lost


def record_outcome(ep: Episode, reward: float, terminated: bool, truncated: bool, info: dict[str, Any]) -> bool:
    """Add one env step's outcome to ``ep`` (its reward, an invalid action, and, when the episode ended, the reason,
    whether the infrastructure ended it and the env's episode metrics), as every sampler records it. Returns True
    when the episode ended."""
    ep.reward += reward
    ep.invalid_actions += bool(info.get("invalid_action"))
    if terminated or truncated:
        ep.reason = info.get("termination_reason")
        ep.infra_failure = ep.reason in INFRA_FAILURE_REASONS
        ep.env_metrics = info.get(EPISODE_METRICS)
        return True
    return False
