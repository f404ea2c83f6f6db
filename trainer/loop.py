"""The training loop, one for every policy: sample, score, update, log (read it top to bottom).

One iteration of :func:`train_loop`:

1. **Rollout** (:func:`collect`): on the iteration's training seeds, a tree-fork rollout (``n_base``
   bases x ``branches``) or a group of ``group_size`` independent episodes
   (:func:`trainer.waves.tree_rollout` / :func:`trainer.waves.group_rollout`), shape per
   :func:`trainer.estimators.rollout_kind`. Optional reward shaping (the text policy's invalid-action
   penalty) changes the returns the advantages see.
2. **Advantages**: the registered estimator ``cfg.estimator`` and the group filters
   (:func:`trainer.estimators.step_advantages`).
3. **Update**: ``policy.update(rollout, assigned)``, the policy's own learning step (tabular:
   REINFORCE on its logit table; text: PPO epochs with Adam); it returns its metrics.
4. **Metrics** to ``RUN_DIR/metrics.jsonl``: the loop's own (reward mean/std, env calls, forks, lost
   episodes, anchor statistics), the policy's (``policy.rollout_metrics``), the env's (means of
   ``info["episode_metrics"]``, :class:`trainer.rollout.EpisodeMetrics`), the update's, monitor flags
   and, every ``eval_every`` iterations, ``eval_*`` from the evaluation hook.

The loop stops early once ``max_env_calls`` env calls were spent (no iteration starts after that). It
knows no env (it gets one) and no policy internals (:class:`Policy`): the tabular policy
(:class:`trainer.tabular.TabularPolicy`) and the text policy (:class:`trainer.text.text_train.PPOTextPolicy`)
both plug in here, and so will a Hugging Face policy.

Run folders (``cfg.run_dir``): ``config.json``, ``metrics.jsonl`` (a row per iteration, as it goes) and
``resume.pt``, the resume state (the policy's ``state_dict()``: weights, optimizer; the iteration, the RNG
states, the env calls spent, the monitors), written every ``save_every`` iterations, at the last one, and after
the iteration during which a SIGTERM / SIGINT arrived (the run then stops: :class:`TrainingInterrupted`).
``resume=RUN_DIR`` continues that run at the next iteration with that iteration's seeds and appends to its
``metrics.jsonl`` (a torn tail, from a kill mid-write or a power loss, cut off first: :mod:`trainer.runlog`,
field case S57); resumed and uninterrupted runs are the same run. A new run never writes into a folder that
holds a run's records (:func:`check_new_run_dir`). ``forkyard sft`` keeps its own records the same way
(:func:`trainer.text.text_sft.sft`, with the helpers here).

Why one file: the loop, its run folder and its resume state are one contract (which iteration a saved state
ends, which rows of ``metrics.jsonl`` it covers, which seeds come next); split, a change to the loop's state
could leave the saved state short of it unseen.

Env-specific figures come from the env: at the step that ends an episode an env may report
``info["episode_metrics"] = {name: number}`` (ClueProbe: ``distinct_probes``); the loop and the
evaluations average each name over the episodes that reported it and log it under that name.
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

import gymnasium as gym
from gymnasium.envs.registration import load_env_creator

import envs  # registers the forkyard ids
from envs.api_key import split_credentials
from envs.features import EvaluationResets
from trainer import advantages as adv
from trainer.collectors import Collector, InProcessCollector, get_collector
from trainer.config import setting
from trainer.estimators import ANCHOR_BY, Assigned, estimator_names, rollout_kind, step_advantages
from trainer.rollout import FORK_SELECTIONS, Actor, EpisodeMetrics, Rollout
from trainer.runlog import DamagedLogError, read_json, read_log, write_atomic

log = logging.getLogger(__name__)

#: Warn when more than this fraction of anchors hold a single sample (the degeneration the reference granularity
#: study reports, docs/results/granularity.md).
DEGENERATION_WARN = 0.30


def env_id_arg(text: str) -> str:
    """``--env`` value: an id without a namespace is a forkyard one (``ClueProbe-v0`` -> ``forkyard/ClueProbe-v0``);
    Gymnasium's ``"module:Id-v0"`` form is kept as given."""
    return text if "/" in text or ":" in text else f"forkyard/{text}"


@dataclass
class LoopConfig:
    """The settings of :func:`train_loop`, shared by every policy's config (each field declared here once;
    a policy's config may give a field another default, e.g. ``n_base``).

    Groups (which commands show a field): ``common`` for every training command, ``loop`` for the RL
    commands (``train``, ``train-lm``).
    """

    env_id: str = setting("forkyard/ClueProbe-v0", flag="--env", aliases=("--env-id",), parse=env_id_arg,
                          group="common", help="a registered env id (the forkyard/ prefix is optional)")
    max_turns: int | None = setting(None, aliases=("--turns",), group="common",
                                    help="the env's turn budget, its max_turns (None: the env's default)")
    env_kwargs: dict[str, Any] = setting(default_factory=dict, flag="--env-kwarg", group="common",
                                         help="an env constructor argument, KEY=VALUE (repeatable; values parsed "
                                              "as JSON)")
    server_url: str | None = setting(None, flag="--server", aliases=("--server-url",), group="loop",
                                     help="URL of a forkyard server; the training envs run there")
    threads: int = setting(0, group="common", help="torch CPU threads (0: torch's default)")
    estimator: str = setting("tree", choices=estimator_names, group="loop",
                             help="advantage estimator (trainer/estimators.py; traj = grpo, anchor_fallback = gigpo)")
    rollout: str | None = setting(None, choices=("group", "tree"), group="loop",
                                  help="rollout shape (default: tree for the tree estimator, else group); any "
                                       "estimator but tree also runs on a tree rollout")
    fork_selection: str = setting("uniform", choices=FORK_SELECTIONS, group="loop",
                                  help="tree rollouts: fork turn uniform over the base's turns, or at its "
                                       "highest-entropy turn")
    tree_prefix: str = setting("base", choices=adv.TREE_PREFIXES, group="loop",
                               help="tree estimator: prefix turns valued by the base episode's return or its "
                                    "branches' mean")
    omega: float = setting(1.0, group="loop", help="gigpo / anchor_fallback: weight of the step-level (anchor) term")
    anchor_by: str = setting("history", choices=ANCHOR_BY, group="loop",
                             help="anchor and gigpo estimators: group steps by the visible history (info's "
                                  "anchor_key) or by the current state alone (info's state_key, GiGPO's key)")
    std_floor: float = setting(adv.STD_FLOOR, group="loop", help="lower bound on a group's reward std in the advantage")
    drop_zero_variance: bool = setting(False, group="loop",
                                       help="DAPO dynamic sampling: drop groups whose rewards are all equal")
    filter_top_p: float | None = setting(None, group="loop",
                                         help="StarPO-S: keep the top fraction of groups by reward std, in (0, 1]")
    group_size: int = setting(16, group="loop", help="G: independent episodes per group rollout")
    n_base: int = setting(5, group="loop", help="tree rollouts: base episodes per iteration")
    branches: int = setting(4, group="loop",
                            help="tree rollouts: m, branches per fork (the base's own continuation included)")
    iterations: int = setting(250, group="loop", help="training iterations")
    max_env_calls: int | None = setting(None, group="loop",
                                        help="stop once this many env calls were spent (equal-budget comparisons)")
    eval_every: int = setting(0, group="loop", help="evaluate every N iterations and at the last (0: only at the end)")
    ray: str | None = setting(None, group="loop",
                              help="run the rollouts on a Ray cluster (docs/scaling.md): auto (RAY_ADDRESS or "
                                   "the local cluster), a cluster address, or local (start one here); default: no Ray")
    node_capacity: int = setting(64, group="loop",
                                 help="with --ray: envs a node holds before its forks travel to another node")
    max_staleness: int = setting(0, group="loop",
                                 help="with --ray: rollouts may be sampled with weights up to N updates old "
                                      "(0: on-policy)")
    seed: int = setting(0, group="common", help="seed of the training seeds, the sampling RNG and torch")
    device: str = setting("auto", group="common", help="auto (CUDA when present), cpu or cuda")
    run_dir: str | None = setting(None, group="common",
                                  help="folder for config.json, metrics.jsonl, summary.json; a folder that holds a "
                                       "run's records is refused (see --resume)")
    save_every: int = setting(10, group="common",
                              help="write the resume state (RUN_DIR/resume.pt; sft: sft_resume.pt) every N "
                                   "iterations (sft: optimizer steps), at the last one and on SIGTERM; 0: only at "
                                   "the last one and on SIGTERM")
    resume: str | None = setting(None, group="common", metavar="RUN_DIR",
                                 help="continue the run in RUN_DIR from its resume state, with its settings (those "
                                      "given too must agree, but --iterations, --max-env-calls, --save-every, "
                                      "--device, --threads)")
    progress: bool = setting(False, cli=False, help="show progress (the command line turns it on)")

    def __post_init__(self) -> None:
        """A config is checked once, when it is made (:meth:`validate`): an invalid one never exists."""
        self.validate()

    def env_options(self) -> dict[str, Any]:
        """The env's constructor kwargs: ``env_kwargs`` with the turn budget ``max_turns`` when set (it wins over
        ``--env-kwarg max_turns=``)."""
        if self.max_turns is None:
            return dict(self.env_kwargs)
        return {**self.env_kwargs, "max_turns": self.max_turns}

    def validate(self) -> None:
        """Called by ``__post_init__``: every config is validated once, when made (call it again only after
        changing a field). Raises ValueError on an unknown estimator, rollout, tree prefix or anchor key, a tree-only
        estimator on a group rollout, out-of-range sizes, or a ``server_url`` with user info (a key there would be
        written to the run folder; the message shows none)."""
        if self.tree_prefix not in adv.TREE_PREFIXES:
            raise ValueError(f"tree_prefix must be one of {adv.TREE_PREFIXES}, got {self.tree_prefix!r}")
        if self.anchor_by not in ANCHOR_BY:
            raise ValueError(f"anchor_by must be one of {ANCHOR_BY}, got {self.anchor_by!r}")
        rollout_kind(self.estimator, self.rollout)
        if min(self.group_size, self.n_base, self.branches, self.iterations) < 1:
            raise ValueError("group_size, n_base, branches and iterations must be >= 1")
        if self.filter_top_p is not None and not 0 < self.filter_top_p <= 1:
            raise ValueError(f"filter_top_p must be in (0, 1], got {self.filter_top_p}")
        if self.node_capacity < 1 or self.max_staleness < 0:
            raise ValueError(f"node_capacity must be >= 1 and max_staleness >= 0, got {self.node_capacity}, "
                             f"{self.max_staleness}")
        if self.ray is None and self.max_staleness:
            raise ValueError("--max-staleness pipelines rollouts on a Ray cluster: it needs --ray")
        if self.ray is not None and self.server_url:
            raise ValueError("--ray runs the envs on the cluster's nodes; it cannot be combined with --server")
        if self.server_url and split_credentials(self.server_url, "--server")[1] is not None:
            raise ValueError("--server holds a credential in its user info, which the run folder's config.json and "
                             "resume.pt would keep (field case S60): give --server http://HOST:PORT and the key in "
                             "FORKYARD_API_KEY or FORKYARD_API_KEY_FILE")
        if self.save_every < 0 or self.threads < 0:
            raise ValueError(f"save_every and threads must be >= 0, got {self.save_every}, {self.threads}")
        if self.max_turns is not None and self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")


class Policy(Actor, Protocol):
    """What the training loop needs of a policy (tabular, text LM, or any other).

    ``session`` (from :class:`trainer.rollout.Actor`) acts: one :class:`trainer.rollout.PolicySession`
    per episode, forked with the env. The other two learn and report. A policy that learns also has
    ``state_dict()`` / ``load_state_dict(state)`` (tensors, numbers, strings, lists and dicts of them: what it
    learned and its optimizer), saved in the run's resume state; one without them is stateless.
    """

    def rollout_metrics(self, rollout: Rollout) -> dict[str, float]:
        """The policy's figures about a rollout before the update (e.g. ``entropy``; text: also
        ``response_length``, ``invalid_share``)."""
        ...

    def update(self, rollout: Rollout, assigned: Assigned) -> dict[str, float]:
        """One learning step on the trained steps ``assigned`` (their advantages; ``assigned.n_episodes``
        valid episodes). Returns its metrics (at least ``grad_norm``; 0.0 when nothing was trained)."""
        ...


class Monitor(Protocol):
    """A stability check over the iteration metrics (:mod:`trainer.text.monitors`): ``check`` returns a warning
    text once it fires; the loop then records ``metrics[key] = 1`` and keeps the warning."""

    key: str

    def check(self, iteration: int, metrics: dict[str, Any]) -> str | None: ...


@dataclass
class LoopResult:
    """What :func:`train_loop` returns: every iteration's metrics, the monitors' warnings, the run folder
    (None when not saved) and the loop's wall time in seconds."""

    metrics: list[dict[str, Any]]
    warnings: list[str]
    run_dir: Path | None
    wall_s: float


@dataclass
class TrainResult:
    """A finished run (:func:`trainer.train.train`): its config, metrics, final evaluation, the trained policy,
    wall seconds, warnings, and the trained model (the text policy's; None for a policy without one)."""

    config: Any
    metrics: list[dict[str, Any]]
    evaluation: dict[str, float]
    policy: Any
    wall_s: float
    warnings: list[str] = field(default_factory=list)
    model: Any = None


def make_env(env_id: str, env_kwargs: dict[str, Any], server_url: str | None = None):
    """A bare env (no Gymnasium checker wrappers: the hot loop pays for none of them).

    ``server_url`` makes a remote env that proxies to a forkyard server."""
    kwargs = dict(env_kwargs)
    if server_url:
        kwargs["server_url"] = server_url
    return gym.make(env_id, disable_env_checker=True, **kwargs).unwrapped


#: The first held-out seed: evaluation seeds are ``HELD_OUT_SEED + i``, never used in training.
HELD_OUT_SEED = 10**9


def held_out_resets(n_seeds: int) -> list[tuple[int | None, dict | None]]:
    """``n_seeds`` held-out resets ``(10**9 + i, None)`` (seeds never used in training)."""
    return [(HELD_OUT_SEED + i, None) for i in range(n_seeds)]


def env_class(env_id: str) -> type | None:
    """The class a registered ``env_id`` builds locally (a forkyard id: the class of its entry point,
    :func:`envs.env_spec`, whatever ``server_url`` would make of it), or None when the entry point is no class."""
    module, _, env_id = env_id.rpartition(":")  # Gymnasium's "module:Id" form: importing the module registers Id
    if module:
        importlib.import_module(module)
    forkyard = envs.forkyard_specs().get(env_id)
    entry: Any = forkyard.entry_point if forkyard is not None else gym.spec(env_id).entry_point
    if isinstance(entry, str):
        entry = load_env_creator(entry)
    return entry if isinstance(entry, type) else None


def env_parameters(env_id: str) -> set[str]:
    """Names of the constructor parameters of ``env_id``'s class (:func:`env_class`; empty when unknown)."""
    cls = env_class(env_id)
    return set(inspect.signature(cls).parameters) if cls is not None else set()


def evaluation_resets(
    env_id: str, env_kwargs: dict[str, Any], n_seeds: int = 256
) -> list[tuple[int | None, dict | None]]:
    """Resets for evaluation: the env's own when its class declares them
    (:class:`envs.features.EvaluationResets`, given the registered kwargs merged with ``env_kwargs``;
    ClueProbe: every target exactly once), otherwise ``n_seeds`` held-out seeds (:func:`held_out_resets`).
    Decided by the registered class, so a run against a server (:class:`envs.remote.RemoteEnv`) evaluates
    on the same resets as a local one."""
    cls = env_class(env_id)
    if cls is not None and issubclass(cls, EvaluationResets):
        return list(cls.evaluation_resets({**gym.spec(env_id.rpartition(":")[2]).kwargs, **env_kwargs}, n_seeds))
    return held_out_resets(n_seeds)


#: What a run folder holds (the records :func:`train_loop` writes; the SFT run's are :data:`SFT_RECORDS`).
RUN_RECORDS = ("config.json", "metrics.jsonl", "summary.json", "resume.pt")
SFT_RECORDS = ("sft_config.json", "sft_metrics.jsonl", "sft_summary.json", "sft_resume.pt", "sft.pt", "sft")

#: Settings a resumed run may change (every other one is the run's own, from its config file).
RESUME_MAY_CHANGE = ("iterations", "max_env_calls", "save_every", "device", "threads", "progress", "resume", "run_dir")


class RunDirError(ValueError):
    """A run folder that cannot take this run: it holds another run's records (a new run never replaces them:
    resume it, or choose another folder), or it holds no run to resume, or a resumed run's settings disagree
    with its own."""


class TrainingInterrupted(Exception):
    """SIGTERM or SIGINT stopped a run after a finished iteration (or SFT step) whose state was saved.

    Attributes:
        run_dir: the run folder (``forkyard ... --resume RUN_DIR`` continues it).
        done: iterations (SFT: optimizer steps) finished and saved.
        signal: the signal number received.
    """

    def __init__(self, run_dir: Path, done: int, signum: int):
        super().__init__(f"stopped by signal {signum} after {done} iterations; state saved in {run_dir} "
                         f"(continue with --resume {run_dir})")
        self.run_dir, self.done, self.signal = run_dir, done, signum


class StopSignals:
    """A context manager: inside, the first SIGTERM or SIGINT only sets ``received`` (the signal number), so
    the run can finish its iteration and save; a second one acts as usual (the process ends). Outside the main
    thread (where Python cannot handle signals) it does nothing. The previous handlers come back on exit."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.received: int | None = None
        self._old: dict[int, Any] = {}

    def _handle(self, signum, frame) -> None:
        if self.received is not None:  # the second one: what it would have done without us
            signal.signal(signum, self._old.get(signum, signal.SIG_DFL))
            signal.raise_signal(signum)
            return
        self.received = signum
        log.warning("signal %d: stopping after this iteration with its state saved (again to stop now)", signum)

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def records_in(run_dir: str | Path | None, names: Iterable[str] = RUN_RECORDS) -> list[str]:
    """The ``names`` that exist in ``run_dir`` (none when it is None or absent)."""
    if not run_dir or not Path(run_dir).is_dir():
        return []
    return [n for n in names if (Path(run_dir) / n).exists()]


def check_new_run_dir(run_dir: str | None, names: Iterable[str] = RUN_RECORDS, command: str = "train") -> None:
    """Refuse a new run into a folder that holds a run's records (they would be replaced).

    Raises:
        RunDirError: naming the records found and the two ways on: ``--resume RUN_DIR``, or another folder.
    """
    found = records_in(run_dir, names)
    if found:
        raise RunDirError(f"{run_dir} holds a run already ({', '.join(found)}); continue it with "
                          f"`forkyard {command} --resume {run_dir}`, or give another --run-dir")


def run_config(cfg: Any, command: str = "train", config_file: str = "config.json",
               records: Iterable[str] = RUN_RECORDS) -> Any:
    """The config a command runs with: the resumed run's (:func:`resume_config`) when ``cfg.resume`` is set,
    else ``cfg`` once its run folder is known to hold no run's ``records`` (:func:`check_new_run_dir`).

    Raises:
        RunDirError: as :func:`resume_config` or :func:`check_new_run_dir`.
    """
    if cfg.resume:
        return resume_config(cfg, config_file)
    check_new_run_dir(cfg.run_dir, records, command=command)
    return cfg


def resume_config(cfg: Any, config_file: str = "config.json") -> Any:
    """The config of a resumed run: ``RUN_DIR/config_file`` (``RUN_DIR = cfg.resume``) with the settings
    :data:`RESUME_MAY_CHANGE` taken from ``cfg`` where given, ``run_dir = RUN_DIR``. A setting counts as given
    when the command line gave it (:func:`trainer.config.given_fields`), else when it differs from its default.

    Raises:
        RunDirError: no such config file; it cannot be read and the resume state holds no copy (a torn one is
            repaired from that copy: :func:`_saved_config`); it is not a config of ``type(cfg)`` (another
            command's run); or a given setting outside :data:`RESUME_MAY_CHANGE` differs from the run's.
    """
    from trainer.config import given_fields

    run_dir = Path(cfg.resume)
    path = run_dir / config_file
    if not path.is_file():
        raise RunDirError(f"--resume {run_dir}: no {config_file} there (no run of this command to continue)")
    saved = _saved_config(run_dir, config_file)
    names = {f.name: f for f in fields(cfg)}
    alien = sorted(set(saved) - set(names))
    if alien:
        raise RunDirError(f"--resume {run_dir}: its {config_file} is another command's run (settings {alien[:4]}); "
                          "resume it with the command that started it")
    if cfg.run_dir and Path(cfg.run_dir).resolve() != run_dir.resolve():
        raise RunDirError(f"--resume {run_dir} continues that run in its own folder, not in --run-dir {cfg.run_dir}")
    given = given_fields(cfg)
    if given is None:
        given = {n for n, f in names.items() if f.init and getattr(cfg, n) != _default(f)}
    values = dict(saved)
    for name in given:
        value = getattr(cfg, name)
        if name in RESUME_MAY_CHANGE:
            values[name] = value
        elif name in saved and _jsonable(value) != saved[name]:
            raise RunDirError(f"--resume {run_dir}: {name} is {saved[name]!r} in the run, {value!r} given; a "
                              f"resumed run keeps its settings (may change: {', '.join(RESUME_MAY_CHANGE[:6])})")
    values.update(resume=str(run_dir), run_dir=str(run_dir), progress=cfg.progress)
    out = type(cfg)(**{k: _typed(names[k], v) for k, v in values.items() if k in names and names[k].init})
    return out


def _saved_config(run_dir: Path, config_file: str) -> dict[str, Any]:
    """The settings in ``run_dir/config_file``; one that cannot be read (torn) is repaired from the copy in the
    run's resume state (``resume.pt``; ``sft_resume.pt`` for ``sft_config.json``): :func:`trainer.runlog.read_json`.

    Raises:
        RunDirError: the file cannot be read and no resume state holds the settings.
    """
    state = run_dir / config_file.replace("config.json", "resume.pt")

    def saved_in_state() -> Any:
        import torch

        return torch.load(state, map_location="cpu", weights_only=True).get("config") if state.is_file() else None

    try:
        return read_json(run_dir / config_file, fallback=saved_in_state, fallback_name=state.name)
    except ValueError as exc:
        raise RunDirError(f"--resume {run_dir}: {exc}") from exc


def _default(f: Any) -> Any:
    if f.default is not MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not MISSING else MISSING


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value))


def _typed(f: Any, value: Any) -> Any:
    """A JSON value back in its field's container type (a tuple stays a tuple)."""
    default = f.default if f.default is not MISSING else None
    return tuple(value) if isinstance(default, tuple) and isinstance(value, list) else value


def save_state(path: Path, state: dict[str, Any]) -> None:
    """``torch.save(state, path)`` through a temporary file and a rename: a kill mid-write leaves the previous
    state whole."""
    import torch

    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def rng_state() -> dict[str, Any]:
    """torch's CPU and CUDA generator states (the python ``random.Random`` of a run is saved by its owner)."""
    import torch

    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Inverse of :func:`rng_state`."""
    import torch

    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def continue_records(path: Path, done: int, key: str = "iteration") -> list[dict[str, Any]]:
    """The records of a resumed run: the rows of JSONL ``path`` with ``row[key] < done`` (those the saved
    state includes). The log is read by :func:`trainer.runlog.read_log`, which cuts a torn tail off (a kill
    mid-write, NUL padding after a power loss: field case S57) with a warning. Rows past ``done`` (written after
    the last save, before a kill) are redone by the resumed run: they move to ``<stem>.discarded.jsonl`` beside
    it (appended, never lost) and the file keeps the others. Rows the saved state covers but the log lost are
    named in a warning. Returns the rows kept.

    Raises:
        RunDirError: the log is damaged before its last whole row (corruption, not a torn tail; file and line
            named, the file unchanged).
    """
    try:
        got = read_log(path, repair=True)
    except DamagedLogError as exc:
        raise RunDirError(f"--resume {path.parent}: {exc}") from exc
    keep = [line for line, row in zip(got.lines, got.rows, strict=True) if row.get(key, -1) < done]
    extra = [line for line, row in zip(got.lines, got.rows, strict=True) if row.get(key, -1) >= done]
    if extra:
        aside = path.with_name(path.stem + ".discarded.jsonl")
        with aside.open("a") as f:
            f.write("".join(line + "\n" for line in extra))
        write_atomic(path, "".join(line + "\n" for line in keep))
        log.warning("%s: %d rows past the saved state moved to %s (the resumed run redoes them)", path, len(extra),
                    aside)
    kept = [row for row in got.rows if row.get(key, -1) < done]
    missing = sorted(set(range(done)) - {row.get(key) for row in kept})
    if missing:
        log.warning("%s: no rows for %s %s..%s (%d rows), which the saved state covers; the resumed run goes on "
                    "without them", path, key, missing[0], missing[-1], len(missing))
    return kept


def open_run_dir(cfg: Any) -> tuple[Path | None, Any, dict[str, Any] | None]:
    """Open ``cfg.run_dir`` for :func:`train_loop`. A new run: refused when the folder holds a run's records
    (:func:`check_new_run_dir`), else ``config.json`` written and ``metrics.jsonl`` created. A resumed run
    (``cfg.resume``): its ``resume.pt`` loaded, ``metrics.jsonl`` kept up to the saved iteration
    (:func:`continue_records`) and opened for appending, ``config.json`` rewritten when a setting changed.

    Returns ``(path, metrics file, saved state or None)``; ``(None, None, None)`` without a run folder.

    Raises:
        RunDirError: as :func:`check_new_run_dir`, or a resumed folder without ``resume.pt``.
    """
    if cfg.resume:
        import torch

        out = Path(cfg.resume)
        if not (out / "resume.pt").is_file():
            raise RunDirError(f"--resume {out}: no resume.pt there (the run saved no state)")
        state = torch.load(out / "resume.pt", map_location="cpu", weights_only=True)
        state["metrics"] = continue_records(out / "metrics.jsonl", state["iteration"])
        config = json.dumps(asdict(cfg), indent=2)
        if (out / "config.json").read_bytes() != config.encode():
            write_atomic(out / "config.json", config)
        return out, (out / "metrics.jsonl").open("a"), state
    if not cfg.run_dir:
        return None, None, None
    check_new_run_dir(cfg.run_dir)
    out = Path(cfg.run_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "config.json", json.dumps(asdict(cfg), indent=2))
    return out, (out / "metrics.jsonl").open("x"), None


def write_summary(out: Path | None, evaluation: dict[str, float], wall_s: float, warnings: list[str]) -> None:
    """``RUN_DIR/summary.json``: the final evaluation, wall seconds and warnings (nothing when ``out`` is None)."""
    if out:
        write_atomic(out / "summary.json",
                     json.dumps({"evaluation": evaluation, "wall_s": wall_s, "warnings": warnings}, indent=2))


def collect(cfg: LoopConfig, env, policy: Actor, rng: random.Random, iteration: int,
            shaping: Callable[[Rollout], None] | None = None,
            rollouts: Callable[[int], Rollout] | None = None) -> tuple[Rollout, Assigned]:
    """Steps 1-2 of an iteration: the rollout on ``iteration``'s training seeds (made by ``rollouts``
    when given: the run's :meth:`trainer.collectors.Collector.rollout`; else this process's, as
    :class:`trainer.collectors.InProcessCollector` makes it), the reward shaping if any, and the per-step
    advantages. Returns ``(rollout, assigned)``."""
    ro = (rollouts or InProcessCollector(cfg, env, policy, rng).rollout)(iteration)
    if shaping is not None:
        shaping(ro)
    return ro, step_advantages(ro, cfg)


def train_loop(cfg: LoopConfig, env, policy: Policy, *, shaping: Callable[[Rollout], None] | None = None,
               monitors: Iterable[Monitor] = (), evaluate: Callable[[], dict[str, float]] | None = None,
               on_iteration: Callable[[dict[str, Any]], None] | None = None,
               env_kwargs: dict[str, Any] | None = None) -> LoopResult:
    """Train ``policy`` on ``env`` for ``cfg.iterations`` iterations (module docstring).

    Args:
        cfg: the loop's settings (a policy's config extends :class:`LoopConfig`).
        env: a forkyard env (reset per episode, forked by tree rollouts); the caller closes it.
        policy: a :class:`Policy`.
        shaping: called on each rollout before the advantages (may change ``Episode.reward``).
        monitors: checks run on every iteration's metrics (:class:`Monitor`).
        evaluate: called every ``cfg.eval_every`` iterations and at the last; its figures are logged as
            ``eval_<name>``.
        on_iteration: called with every iteration's metrics (progress display).
        env_kwargs: the env's constructor kwargs, for the nodes of a Ray run (``cfg.ray``): each node's
            rollout worker makes its own env with them (``env`` then serves the evaluation only).

    Returns:
        A :class:`LoopResult` (a resumed run's metrics include the rows of the iterations before it). Writes
        ``config.json``, ``metrics.jsonl`` and ``resume.pt`` to ``cfg.run_dir`` when set (module docstring);
        ``cfg.resume`` continues the run there (``policy`` built as the run's was: it gets the saved state).

    Raises:
        RunDirError: (a ValueError) when the folder holds a run's records, or has no resume state to continue.
        TrainingInterrupted: after the iteration during which SIGTERM or SIGINT arrived, its state saved.
    """
    import torch

    t0 = time.perf_counter()
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)  # the policy's sampling RNG (and uniform fork turns)
    out, sink, state = open_run_dir(cfg)
    metrics: list[dict[str, Any]] = []
    warnings: list[str] = []
    monitors = list(monitors)
    warned = False
    spent = 0
    start = 0
    if state is not None:  # a resumed run: everything as it was after iteration state["iteration"] - 1
        start, spent, warned, warnings = state["iteration"], state["spent"], state["warned"], list(state["warnings"])
        metrics = state["metrics"]
        rng.setstate(as_random_state(state["rng"]))
        set_rng_state(state["torch_rng"])
        for monitor, saved in zip(monitors, state["monitors"], strict=True):
            vars(monitor).update(saved)
        if state.get("policy") is not None:
            policy.load_state_dict(state["policy"])
    saved_at = start
    wall0 = metrics[-1].get("wall_s", 0.0) if metrics else 0.0  # a resumed run's clock continues the run's

    def save(done: int) -> None:
        save_state(out / "resume.pt", {
            "iteration": done, "spent": spent, "warned": warned, "warnings": warnings, "rng": rng.getstate(),
            "torch_rng": rng_state(), "monitors": [dict(vars(m)) for m in monitors],
            "policy": policy.state_dict() if hasattr(policy, "state_dict") else None, "config": asdict(cfg)})

    collector: Collector | None = None
    stop = StopSignals()
    try:
        if out is not None:
            stop.__enter__()
        # The rollouts' source: this process, or (cfg.ray) the collector "ray" found by name (trainer.collectors).
        kind = rollout_kind(cfg.estimator, cfg.rollout)
        collector = (InProcessCollector(cfg, env, policy, rng, kind) if cfg.ray is None else
                     get_collector("ray")(cfg, policy, env=env, rng=rng, env_kwargs=env_kwargs or {}, kind=kind))
        for it in range(start, cfg.iterations):
            if cfg.max_env_calls is not None and spent >= cfg.max_env_calls:
                break  # equal-budget comparisons: no iteration starts once the budget is spent
            # 1-2. rollout, shaping, advantages
            ro, assigned = collect(cfg, env, policy, rng, it, shaping, collector.rollout)
            valid_rewards = [e.reward for e in ro.episodes if not e.infra_failure]
            env_metrics = EpisodeMetrics()
            for e in ro.episodes:
                if not e.infra_failure:
                    env_metrics.add(e.env_metrics)
            m: dict[str, Any] = {
                "iteration": it,
                "reward_mean": sum(valid_rewards) / max(len(valid_rewards), 1),
                "reward_std": adv.group_std(valid_rewards),
                **policy.rollout_metrics(ro),
                "env_calls": ro.env_calls,
                "env_calls_total": spent + ro.env_calls,
                "forks": ro.forks,
                "forks_failed": ro.forks_failed,
                "branches_lost": ro.branches_lost,
                "episodes": len(ro.episodes),
                "infra_failures": len(ro.episodes) - len(valid_rewards),
                "trained_steps": len(assigned.steps),
                **assigned.stats,
            }
            _merge(m, ro.cluster, "cluster figure")
            _merge(m, env_metrics.means(), "env episode metric")
            spent += ro.env_calls
            # 3. the policy's learning step
            m.update(policy.update(ro, assigned))
            # 4. monitors, evaluation, log
            for monitor in monitors:
                warning = monitor.check(it, m)
                if warning:
                    warnings.append(warning)
                    m[monitor.key] = 1
            if m["degeneration"] > DEGENERATION_WARN and not warned:
                warned = True
                log.warning(
                    "iteration %d: %.0f%% of anchors hold a single sample (advantage 0 under anchor grouping); "
                    "above %.0f%%, consider tree forks", it, 100 * m["degeneration"], 100 * DEGENERATION_WARN,
                )
            if evaluate is not None and cfg.eval_every and ((it + 1) % cfg.eval_every == 0 or it + 1 == cfg.iterations):
                m.update({f"eval_{k}": v for k, v in evaluate().items()})
            m["wall_s"] = wall0 + time.perf_counter() - t0
            metrics.append(m)
            if sink:
                sink.write(json.dumps(m) + "\n")
                sink.flush()
            if on_iteration is not None:
                on_iteration(m)
            # 5. the resume state: periodically, at the last iteration, and on SIGTERM / SIGINT (then stop)
            if out is not None and (stop.received or it + 1 == cfg.iterations
                                    or (cfg.save_every and (it + 1) % cfg.save_every == 0)):
                save(it + 1)
                saved_at = it + 1
            if stop.received:
                raise TrainingInterrupted(out, it + 1, stop.received)
        if out is not None and metrics and metrics[-1]["iteration"] + 1 != saved_at:  # stopped by the budget
            save(metrics[-1]["iteration"] + 1)
    finally:
        stop.__exit__()
        if collector is not None:
            collector.close()
        if sink:
            sink.close()
    return LoopResult(metrics, warnings, out, time.perf_counter() - t0)


def as_random_state(x: Any) -> Any:
    """A ``random.Random.getstate()`` that went through storage, for ``setstate`` (lists back to tuples)."""
    return tuple(as_random_state(v) for v in x) if isinstance(x, (list, tuple)) else x


def _merge(target: dict[str, Any], extra: dict[str, Any], what: str) -> None:
    """``target.update(extra)``, refusing a name ``target`` already holds (an env metric may not
    overwrite one of the loop's)."""
    clash = target.keys() & extra.keys()
    if clash:
        raise ValueError(f"{what} {sorted(clash)} clashes with a metric of the same name")
    target.update(extra)
