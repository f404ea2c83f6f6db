"""The one wave driver of forkyard's rollouts, over pluggable samplers.

A rollout's live episode branches advance together, in waves: a wave takes up to ``max_batch`` rows (and at most
``max_kv_tokens`` KV-cache slots, as the sampler counts them), the :class:`Sampler` draws every row's next action
in one call, then the wave's env steps run (in worker threads when the env blocks, :func:`blocking`; inline for
pure-Python envs), their results applied in row order. Rows that ended leave; the next waves take the rest, until
every episode has ended. :class:`WaveDriver` runs group rollouts (independent episodes of many groups at once),
tree rollouts (many trees, each of one or more bases forked once into branches) and plain evaluation episodes
through that one loop; what differs between samplers is only how a wave's actions are drawn:

* :class:`SerialSampler`: each row's :meth:`trainer.rollout.PolicySession.act`, one after another (any policy: the
  tabular one, the text policy one token at a time). The baseline.
* :class:`trainer.text.engine.TorchSampler`: forkyard's batched torch engine (batched prefill, one batched decode
  step per token, in-place KV caches).
* :class:`trainer.trl_engine.HFChatSampler`: a ``transformers`` causal LM under TRL's chat template.

A tree's fork-turn choice (:class:`trainer.rollout.ForkTurn`) and the spreading of a base's checkpoint into branches
(:func:`trainer.rollout.spread_branches`) are written once and called here for every sampler: the sampler calls
``before_draw(row, entropy)`` once per row after the distribution of the row's next token is known and before the
row's stream gives its first draw (the fork turn is chosen before the turn's action). Every episode samples from its
own stream (:func:`trainer.rollout.stream`), so the same seeds give the same episodes whatever the sampler, batch
size or caps (the samplers' own tests: sampled ids equal, behavior log-probs within float rounding).

The serial rollout (:func:`serial`; :func:`group_rollout`, :func:`tree_rollout`) is this driver over
:class:`SerialSampler` with one row a wave and no env copies: the env given is reset before each episode and a tree's
bases run one after another on it, as the loops forkyard had before the driver did (kept as the tests' oracle,
``tests/trainer/serial_oracle.py``). ``forkyard train``, the Ray rollout workers, ``TreeForkRollout(sampler=
"serial")`` and ``--sampler serial`` of the text trainer run it.

Env copies (the default, ``copies=True``): each episode of a group (and each base of a tree with several bases) runs
on its own copy, ``env.fork(n)`` in calls of at most :data:`FORK_CHUNK`, each copy reset with its episode's seed (a
copy's ``reset(seed=s)`` is a fresh env's episode for ``s``); these copies are not counted in :attr:`Rollout.forks`,
which counts the tree's forks alone. A tree of one base runs it on the tree's env itself. ``max_live`` bounds the
episodes live at once (each holds an env copy, a sandbox for FileQA, and its session's KV cache between turns):
episodes past it start when the cohort before them has ended; a tree's cohort is ``max_live // branches`` bases,
then their branches.

Why one file: the wave loop, the episode starts and the group and tree drivers hold one invariant together (every
row's env results are applied in the serial order, from the stream the serial loop gives it); split, a change to one
could reorder episodes unseen by the others.
"""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from envs.core import EnvInfraError
from trainer.rollout import (FORK_SELECTIONS, Episode, ForkTurn, Rollout, Step, _Counter, episode_seeds,
                             given_streams, record_outcome, spread_branches, stream)

#: Default cap on the rows sampled in one wave.
MAX_BATCH = 64
#: Most env copies one ``env.fork`` call makes (a sandbox fork makes at most 64: ``sandbox_server``'s
#: ``MAX_CLONES``); a rollout's copies come in calls of at most this many.
FORK_CHUNK = 64
#: Default worker threads for the env calls of a wave when the env blocks.
ENV_THREADS = 16


@dataclass
class Row:
    """One live episode branch: its env (closed when the episode ends unless ``own_env`` is False), policy
    session, episode record, sampling stream and its rollout's counter."""

    env: Any
    session: Any
    ep: Episode
    rng: random.Random
    counter: _Counter = field(default_factory=_Counter)
    own_env: bool = True
    done: bool = False
    turn: int = 0
    fork: ForkTurn | None = None  # a tree base's fork-turn choice (its checkpoint)


#: ``before_draw(row, entropy)``: called by a sampler once per row before the row's first draw; ``entropy()`` gives
#: the entropy (nats) of the row's next-token (or next-action) distribution.
BeforeDraw = Callable[[Row, Callable[[], float]], None]


class Sampler(Protocol):
    """Draws the next action of every row of a wave.

    ``sample(rows, before_draw)`` returns one :class:`trainer.rollout.Step` per row, in order, each session's turn
    closed (its reply appended to the session's context): row r's tokens drawn from ``rows[r].rng`` alone, so a
    row's action depends on its context and stream, not on the rows beside it. ``before_draw`` (or None) is called
    as documented at :data:`BeforeDraw`. ``slots(row)`` is how many KV-cache slots the row's sampling will hold
    (its context plus the reply's most tokens), which ``max_kv_tokens`` caps; ``seconds`` the sampler's wall
    seconds by phase (added to the driver's)."""

    seconds: dict[str, float]

    def sample(self, rows: list[Row], before_draw: BeforeDraw | None) -> list[Step]: ...

    def slots(self, row: Row) -> int: ...


class SerialSampler:
    """Each row's ``session.act(row.rng)``, one row after another: any :class:`trainer.rollout.PolicySession`."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {"decode": 0.0}

    def sample(self, rows: list[Row], before_draw: BeforeDraw | None) -> list[Step]:
        """Each row's action, one row after another (:class:`Sampler`)."""
        t0 = time.perf_counter()
        out = []
        for r in rows:
            if before_draw is not None:
                before_draw(r, r.session.entropy)
            out.append(r.session.act(r.rng))
        self.seconds["decode"] += time.perf_counter() - t0
        return out

    def slots(self, row: Row) -> int:
        """1: a serial session holds no batched KV cache."""
        return 1


@dataclass
class Group:
    """One group of independent episodes: episode i reset with ``seeds[i]`` (and ``options[i]``) on a copy of
    ``env``, sampled from ``stream(stream_seeds[i])`` (:func:`trainer.rollout.given_streams` of ``rng``)."""

    env: Any
    policy: Any
    seeds: list[int | None]
    rng: random.Random | None = None
    stream_seeds: list[int] | None = None
    options: list[dict | None] | None = None


@dataclass
class Tree:
    """One tree: :func:`trainer.rollout.tree_rollout`'s arguments (``len(seeds)`` bases, each forked once into
    ``branches`` branches in all)."""

    env: Any
    policy: Any
    branches: int
    seeds: list[int]
    rng: random.Random | None = None
    stream_seeds: list[int] | None = None


def blocking(env) -> bool:
    """Whether ``env``'s calls wait on I/O: its class's ``blocking`` flag (:attr:`envs.core.TextEnv.blocking`,
    the one a server reads to run an env's steps in worker threads: FileQA's sandbox calls), read through
    Gymnasium wrappers (``unwrapped``). Pure-Python envs (ClueProbe) are not."""
    return bool(getattr(getattr(env, "unwrapped", env), "blocking", False))


def _call_step(env, action: str):
    """``env.step(action)``'s 5-tuple, or None when the infrastructure failed (:class:`EnvInfraError`)."""
    try:
        return env.step(action)
    except EnvInfraError:
        return None


def _call_reset(env, ep: Episode, options):
    """``env.reset(seed=ep.seed, options=options)``'s pair, or None when ``env`` is None (its copy failed) or the
    infrastructure failed (:class:`EnvInfraError`)."""
    if env is None:
        return None
    try:
        return env.reset(seed=ep.seed, options=options)
    except EnvInfraError:
        return None


def _apply_step(row: Row, step: Step, result) -> None:
    """Record the env step of ``step`` for ``row`` (as :func:`trainer.rollout._step` records it) from ``result``
    (:func:`_call_step`'s); marks the row done when its episode ended."""
    ep = row.ep
    ep.steps.append(step)
    row.counter.env_calls += 1
    row.turn += 1
    if result is None:
        ep.infra_failure, ep.reason, row.done = True, "infra_error", True
        return
    obs, reward, terminated, truncated, info = result
    row.done = record_outcome(ep, reward, terminated, truncated, info)
    if not row.done:
        row.session.observe(obs, info)


@dataclass
class _Pending:
    """An episode to start: the env to copy (or to use itself, ``own_env`` False), its policy, stream, reset
    options and counter."""

    env: Any
    policy: Any
    ep: Episode
    rng: random.Random
    counter: _Counter
    options: dict | None = None
    copy: bool = True


class WaveDriver:
    """Group, tree and evaluation rollouts in waves over one :class:`Sampler` (module docstring).

    Args:
        sampler: draws a wave's actions.
        max_batch: most rows in one wave (>= 1); rows past it wait for the next wave.
        max_kv_tokens: most KV-cache slots a wave holds (>= 1; a row's are ``sampler.slots(row)``, and a wave of B
            rows takes B x its largest, the batch being padded to it), or None: no cap besides ``max_batch``. A wave
            always takes at least one row.
        env_threads: worker threads for the env calls of a wave (steps, and the resets of new episodes) when the
            env blocks (:func:`blocking`); 1: one after another. Results are applied in row order either way.
        max_live: most episodes live at once, or None: all of them (module docstring).
        copies: False: no env copies; every episode runs on the env it was given, one episode (a tree: one base
            and its branches) at a time, reset before each, as a serial loop reuses one env (``max_live`` is then
            not read). The serial rollouts :func:`group_rollout` / :func:`tree_rollout` run so.

    Attributes:
        seconds: wall seconds by phase: ``env`` (copies, resets, steps, closes; a tree's branch copies), ``other``
            (a tree's fork-turn choices), and the sampler's own (``prefill``, ``decode``).

    Raises:
        ValueError: ``max_batch < 1``, ``max_kv_tokens < 1``, ``env_threads < 1`` or ``max_live < 1``.
    """

    def __init__(self, sampler: Sampler, max_batch: int = MAX_BATCH, max_kv_tokens: int | None = None,
                 env_threads: int = ENV_THREADS, max_live: int | None = None, copies: bool = True):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if max_kv_tokens is not None and max_kv_tokens < 1:
            raise ValueError(f"max_kv_tokens must be >= 1 (or None), got {max_kv_tokens}")
        if env_threads < 1:
            raise ValueError(f"env_threads must be >= 1, got {env_threads}")
        if max_live is not None and max_live < 1:
            raise ValueError(f"max_live must be >= 1 (or None), got {max_live}")
        self.sampler, self.copies = sampler, copies
        self.max_batch, self.max_kv_tokens, self.env_threads, self.max_live = (max_batch, max_kv_tokens, env_threads,
                                                                               max_live)
        self._seconds = {"env": 0.0, "other": 0.0}

    @property
    def seconds(self) -> dict[str, float]:
        """Wall seconds by phase since construction: the driver's (``env``, ``other``) and the sampler's."""
        return {**self.sampler.seconds, **self._seconds}

    def _add(self, phase: str, t0: float) -> None:
        self._seconds[phase] += time.perf_counter() - t0

    # ------------------------------------------------------------------------------------------------ the loop
    def waves(self, rows: list[Row]) -> list[list[Row]]:
        """``rows`` cut, in order, into waves of at most ``max_batch`` rows and ``max_kv_tokens`` slots."""
        out: list[list[Row]] = []
        wave: list[Row] = []
        longest = 0
        for r in rows:
            need = self.sampler.slots(r) if self.max_kv_tokens is not None else 0
            if wave and (len(wave) == self.max_batch or (self.max_kv_tokens is not None and
                                                         (len(wave) + 1) * max(longest, need) > self.max_kv_tokens)):
                out.append(wave)
                wave, longest = [], 0
            wave.append(r)
            longest = max(longest, need)
        if wave:
            out.append(wave)
        return out

    def _pool(self, rows: list[Row]) -> ThreadPoolExecutor | None:
        if self.env_threads > 1 and len(rows) > 1 and blocking(rows[0].env):
            return ThreadPoolExecutor(min(self.env_threads, len(rows)), thread_name_prefix="forkyard-env")
        return None

    def run(self, rows: list[Row], before_draw: BeforeDraw | None = None) -> None:
        """Advance ``rows`` wave by wave until every episode has ended (ended rows' own envs closed)."""
        live = [r for r in rows if not r.done]
        pool = self._pool(live)
        try:
            while live:
                for wave in self.waves(live):
                    steps = self.sampler.sample(wave, before_draw)
                    t0 = time.perf_counter()
                    envs_, actions = [r.env for r in wave], [s.action for s in steps]
                    results = pool.map(_call_step, envs_, actions) if pool is not None and len(wave) > 1 \
                        else map(_call_step, envs_, actions)
                    for r, step, result in zip(wave, steps, list(results), strict=True):
                        _apply_step(r, step, result)
                    self._add("env", t0)
                t0 = time.perf_counter()
                for r in live:
                    if r.done and r.own_env:
                        r.env.close()
                self._add("env", t0)
                live = [r for r in live if not r.done]
        finally:
            if pool is not None:
                pool.shutdown()

    def _start(self, pending: list[_Pending]) -> list[Row]:
        """Rows for ``pending``: copies of their envs (``fork`` in chunks, consecutive episodes of one env
        together), reset with their seeds (in worker threads when the env blocks) and their sessions opened; an
        episode whose copy or reset failed through the infrastructure is marked lost and gets no row."""
        t0 = time.perf_counter()
        envs_: list = []
        i = 0
        while i < len(pending):
            p = pending[i]
            if not p.copy:
                envs_.append(p.env)
                i += 1
                continue
            n = 1
            while i + n < len(pending) and n < FORK_CHUNK and pending[i + n].copy and pending[i + n].env is p.env:
                n += 1
            try:
                envs_ += p.env.fork(n)
            except EnvInfraError:
                envs_ += [None] * n
            i += n
        eps, opts = [p.ep for p in pending], [p.options for p in pending]
        threads = min(self.env_threads, len(pending)) if pending and blocking(pending[0].env) else 1
        if threads > 1:
            with ThreadPoolExecutor(threads, thread_name_prefix="forkyard-env") as pool:
                resets = list(pool.map(_call_reset, envs_, eps, opts))
        else:
            resets = list(map(_call_reset, envs_, eps, opts))
        rows = []
        for p, env, reset in zip(pending, envs_, resets, strict=True):
            if reset is None:
                p.ep.infra_failure, p.ep.reason = True, "infra_error"
                if env is not None and p.copy:
                    env.close()
                continue
            obs, info = reset
            rows.append(Row(env, p.policy.session(obs, info), p.ep, p.rng, p.counter, own_env=p.copy))
        self._add("env", t0)
        return rows

    def _cohorts(self, n: int, per: int = 1) -> list[slice]:
        size = 1 if not self.copies else n if self.max_live is None else max(1, self.max_live // per)
        return [slice(i, min(i + size, n)) for i in range(0, n, size)] if n else []

    # ------------------------------------------------------------------------------------------- the rollouts
    def groups(self, groups: list[Group]) -> list[Rollout]:
        """The group rollout of each of ``groups`` (:func:`trainer.rollout.group_rollout`: same episodes), their
        episodes sampled together. Returns one :class:`Rollout` per group, in order.

        Raises:
            ValueError: a group's ``stream_seeds`` (or ``options``) is not one per seed, or it has neither ``rng``
                nor ``stream_seeds``.
        """
        rollouts, pending = [], []
        for g in groups:
            streams = given_streams(g.rng, len(g.seeds), g.stream_seeds)
            options = g.options if g.options is not None else [None] * len(g.seeds)
            if len(options) != len(g.seeds):
                raise ValueError(f"{len(options)} reset options for {len(g.seeds)} seeds")
            counter = _Counter()
            episodes = [Episode(seed=s) for s in g.seeds]
            pending += [_Pending(g.env, g.policy, ep, stream(s), counter, opt, self.copies)
                        for ep, s, opt in zip(episodes, streams, options, strict=True)]
            rollouts.append((episodes, counter))
        for c in self._cohorts(len(pending)):
            self.run(self._start(pending[c]))
        return [Rollout("group", eps, c.env_calls, c.forks, c.forks_failed) for eps, c in rollouts]

    def trees(self, trees: list[Tree], fork_selection: str = "uniform") -> list[Rollout]:
        """The tree rollout of each of ``trees`` (:func:`trainer.rollout.tree_rollout`: same episodes, in its order:
        base 0, its branches 1..m-1, base 1, ...): the bases sampled together, then their branches together, each
        from its base's session and env at the fork turn. Returns one :class:`Rollout` per tree, in order.

        Raises:
            ValueError: an unknown ``fork_selection``, a tree with ``branches < 1`` or no seeds, or stream seeds that
                are not one per base.
        """
        if fork_selection not in FORK_SELECTIONS:
            raise ValueError(f"fork_selection must be one of {FORK_SELECTIONS}, got {fork_selection!r}")
        for t in trees:
            if t.branches < 1 or not t.seeds:
                raise ValueError(f"need n_base >= 1, branches >= 1 and n_base seeds; got {len(t.seeds)}, "
                                 f"{t.branches}, {len(t.seeds)}")
        counters = [_Counter() for _ in trees]
        bases, pending, streams = [], [], []  # flat, tree by tree
        for k, t in enumerate(trees):
            seeds = given_streams(t.rng, len(t.seeds), t.stream_seeds)
            for b, seed in enumerate(t.seeds):
                ep = Episode(seed=seed, base=b, branch=0)
                bases.append((k, ep))
                streams.append(seeds[b])
                pending.append(_Pending(t.env, t.policy, ep, stream(seeds[b]), counters[k],
                                    copy=self.copies and len(t.seeds) > 1))
        branches = {id(c): t.branches for c, t in zip(counters, trees, strict=True)}

        def before_draw(row: Row, entropy: Callable[[], float]) -> None:  # the one fork-turn choice
            t0 = time.perf_counter()
            if row.fork is None:
                row.fork = ForkTurn(fork_selection, branches[id(row.counter)])
            row.fork.consider(row.turn, row.rng, entropy, row.env, row.session, row.ep.reward, row.counter)
            self._add("other", t0)

        episodes: list[list[Episode]] = [[] for _ in trees]
        lost = [0] * len(trees)
        per = max(t.branches for t in trees) if trees else 1
        for c in self._cohorts(len(pending), per):  # bases, then their branches; then the next cohort's
            rows = self._start(pending[c])
            self.run(rows, before_draw)
            by_ep = {id(r.ep): r for r in rows}
            branch_rows = []
            for (k, base), s in zip(bases[c], streams[c], strict=True):
                episodes[k].append(base)
                row = by_ep.get(id(base))
                checkpoint = row.fork.checkpoint if row is not None and row.fork is not None else None
                t0 = time.perf_counter()
                branch_eps, starts, n_lost = spread_branches(base, checkpoint, trees[k].branches, s, counters[k])
                self._add("env", t0)
                episodes[k] += branch_eps
                lost[k] += n_lost
                branch_rows += [Row(st.env, st.session, st.episode, st.rng, counters[k], turn=checkpoint.turn)
                                for st in starts if checkpoint is not None]
            self.run(branch_rows)
        return [Rollout("tree", eps, c.env_calls, c.forks, c.forks_failed, n)
                for eps, c, n in zip(episodes, counters, lost, strict=True)]


    # ------------------------------------------------------------------------------ the serial rollouts' signatures
    def group_rollout(self, env, policy, group_size: int, seeds: list[int], rng: random.Random | None,
                      stream_seeds: list[int] | None = None) -> Rollout:
        """G independent episodes of one env configuration, episode i reset with ``seeds[i]``: :meth:`groups` of one
        group.

        Args:
            env: a forkyard env (copied per episode, or reused with ``copies=False``).
            policy: the sampling policy (an :class:`trainer.rollout.Actor`).
            group_size: G >= 1.
            seeds: [G] reset seeds (each episode its own hidden state).
            rng: the rollout's RNG: one stream seed per episode is drawn from it
                (:func:`trainer.rollout.episode_seeds`).
            stream_seeds: [G] 64-bit stream seeds used instead of drawing them from ``rng``
                (:func:`trainer.rollout.given_streams`: given, ``rng`` is not read).

        Raises:
            ValueError: ``len(seeds) != group_size``, or ``stream_seeds`` given without G seeds.
        """
        if len(seeds) != group_size:
            raise ValueError(f"{len(seeds)} seeds for a group of {group_size}")
        return self.groups([Group(env, policy, list(seeds), rng, stream_seeds)])[0]

    def tree_rollout(self, env, policy, n_base: int, branches: int, seeds: list[int], rng: random.Random | None,
                     fork_selection: str = "uniform", stream_seeds: list[int] | None = None) -> Rollout:
        """Tree-fork rollout: ``n_base`` base episodes, each forked once into ``branches`` branches in total
        (:meth:`trees` of one tree).

        For each base: run the episode; at the chosen fork turn t, fork the env (and the policy session) and run
        ``branches - 1`` new branches from that state to the end, each sampling its own action at turn t. The base's
        own continuation is branch 0. Fork-turn selection (:class:`trainer.rollout.ForkTurn`):

        * ``uniform``: t uniform over the turns the base actually took (reservoir sampling: at turn t a fork
          replaces the kept one with probability 1/(t+1)), so episodes of unknown length work;
        * ``entropy``: t is the turn where the policy's action entropy was highest on the base's path (earliest on
          ties), as ARPO (arXiv:2507.19849) branches where the policy is uncertain; a fork is kept at each new
          maximum.

        Episodes are returned in order: base 0, its branches 1..m-1, base 1, ... Each branch's ``steps`` start at the
        fork turn; its ``reward`` includes the base's prefix rewards. Base b samples (and draws its uniform fork
        turn) from ``stream(s_b)``, its branch j from ``stream(s_b, j)``, ``s_b`` the b-th of
        :func:`trainer.rollout.episode_seeds` of ``rng``, or ``stream_seeds[b]`` when given.

        A fork that raises :class:`~envs.core.EnvInfraError` loses only the branches it would have started; the
        base and every other fork run on. Such branches are returned as episodes with no steps,
        ``infra_failure=True``, ``reason="infra_error"`` and the ``fork_turn`` of the failed fork, and are counted
        in :attr:`Rollout.forks_failed` / :attr:`Rollout.branches_lost`. If the checkpoint fork of a base failed
        (all its new branches lost), the base keeps ``fork_turn=None``: nothing branched from it, so its whole
        episode trains as a prefix. If only the fork that spreads the checkpoint into branches 2..m-1 failed,
        branch 1 still runs.

        Raises:
            ValueError: on bad sizes (``stream_seeds`` included) or an unknown ``fork_selection``.
        """
        if fork_selection not in FORK_SELECTIONS:
            raise ValueError(f"fork_selection must be one of {FORK_SELECTIONS}, got {fork_selection!r}")
        if n_base < 1 or branches < 1 or len(seeds) != n_base:
            raise ValueError(f"need n_base >= 1, branches >= 1 and n_base seeds; got {n_base}, {branches}, "
                             f"{len(seeds)}")
        return self.trees([Tree(env, policy, branches, list(seeds), rng, stream_seeds)], fork_selection)[0]

    def play(self, env, policy, resets: list[tuple[int | None, dict | None]], rng: random.Random) -> list[Episode]:
        """Independent episodes, the i-th reset with ``resets[i]`` = ``(seed, options)`` and sampled from the i-th
        stream of ``rng`` (:func:`trainer.rollout.episode_seeds`): the evaluations of :mod:`trainer.text.text_eval`.
        Returns the episodes in order."""
        group = Group(env, policy, [seed for seed, _ in resets], None, episode_seeds(rng, len(resets)),
                      [opt for _, opt in resets])
        return self.groups([group])[0].episodes


def serial() -> WaveDriver:
    """The serial rollout: :class:`SerialSampler`, one row a wave, no env copies (one episode after another on the
    env given, reset before each): what :func:`group_rollout`, :func:`tree_rollout` and every entry point without a
    batched sampler run (``forkyard train``, the Ray rollout workers, ``TreeForkRollout(sampler="serial")``)."""
    return WaveDriver(SerialSampler(), max_batch=1, copies=False)


def group_rollout(env, policy, group_size: int, seeds: list[int], rng: random.Random | None,
                  stream_seeds: list[int] | None = None) -> Rollout:
    """:meth:`WaveDriver.group_rollout` on the serial driver (:func:`serial`): ``env`` reused, one episode at a time."""
    return serial().group_rollout(env, policy, group_size, seeds, rng, stream_seeds)


def tree_rollout(env, policy, n_base: int, branches: int, seeds: list[int], rng: random.Random | None,
                 fork_selection: str = "uniform", stream_seeds: list[int] | None = None) -> Rollout:
    """:meth:`WaveDriver.tree_rollout` on the serial driver (:func:`serial`): the bases one after another on ``env``
    itself, each base's branches on copies of its fork-turn checkpoint."""
    return serial().tree_rollout(env, policy, n_base, branches, seeds, rng, fork_selection, stream_seeds)


__all__ = ["ENV_THREADS", "FORK_CHUNK", "MAX_BATCH", "BeforeDraw", "Group", "Row", "Sampler", "SerialSampler", "Tree",
           "WaveDriver", "blocking", "group_rollout", "serial", "tree_rollout"]
