"""The ``forkyard`` command line. Heavy imports (torch, uvicorn) happen inside the subcommands.

Every subcommand registers a ``handler(args) -> int`` with ``set_defaults(handler=...)``. The options of
the training commands are generated from their config dataclasses (:mod:`trainer.config`): ``train``
from the config of the ``--policy`` registered in :mod:`trainer.policies` (:class:`trainer.train.TrainConfig`
for ``tabular``, the default; :class:`trainer.text.text_config.TextTrainConfig` for ``lm``, the same options as
``train-lm``; a plugin's own), ``compare`` from :class:`trainer.compare.SweepConfig`, ``sft`` / ``train-lm`` /
``eval-lm`` in :mod:`trainer.text.text_cli`. Only the invoked subcommand's options are built (they may read
registries and, for the text policy, torch).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys


def _demo(args: argparse.Namespace) -> int:
    from trainer.demo import run_demo

    run_demo(max_turns=args.max_turns, seed=args.seed)
    return 0


def _bench(args: argparse.Namespace) -> int:
    import runpy
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / f"{args.name}.py"
    if not script.is_file():
        print(f"forkyard bench: no benchmark {script} (benchmarks live in the source checkout)", file=sys.stderr)
        return 2
    sys.argv = [str(script), *args.rest]
    runpy.run_path(str(script), run_name="__main__")
    return 0


def _envs(args: argparse.Namespace) -> int:
    """``forkyard envs [ID ...] [--json]``: the catalog of registered envs (:func:`envs.catalog.catalog`), every
    id or those named (with the ``forkyard/`` prefix optional), as a Markdown table or as JSON."""
    import envs
    from envs.catalog import catalog_table, describe

    known = list(envs.forkyard_specs())
    wanted = []
    for name in args.ids:
        env_id = name if name in known or f"forkyard/{name}" not in known else f"forkyard/{name}"
        if env_id not in known:
            print(f"forkyard envs: error: unknown env id {name!r}; registered: {', '.join(known)}", file=sys.stderr)
            return 2
        wanted.append(env_id)
    cards = [describe(env_id, tools=not args.no_tools) for env_id in wanted or known]
    if args.json:
        print(json.dumps([c.to_dict() for c in cards], indent=2))
        return 0
    print(catalog_table(cards))
    if wanted:  # the settings of the envs asked for, with what each one sets
        for c in cards:
            print(f"\n{c.env_id} ({c.entry_point}): {c.summary}")
            for s in c.settings:
                default = "required" if s.required else f"default {json.dumps(s.default)}"
                print(f"  {s.name} ({default}): {s.doc}" if s.doc else f"  {s.name} ({default})")
    return 0


def train_config(args: argparse.Namespace, policy: str | None = None):
    """The run config of a parsed ``forkyard train``: the config class of ``--policy`` (or ``policy``;
    :func:`trainer.policies.get_policy`; tabular: :class:`~trainer.tabular_config.TrainConfig`, lm:
    :class:`~trainer.text.text_config.TextTrainConfig`) holding every option given, with ``progress`` on; validated
    as it is made. Raises ValueError on an invalid config."""
    from trainer.config import from_args
    from trainer.policies import get_policy

    return from_args(get_policy(policy or args.policy).part("config"), args, progress=True)


def run_policy(name: str, args: argparse.Namespace, command: str = "train") -> int:
    """``forkyard train --policy NAME`` (and ``forkyard train-lm``, the policy ``lm``): the config, the one
    driver (:func:`trainer.train.train`) with the policy's setup, then its report. A usage error (an invalid
    config, a plugin's parts that cannot be imported, a run folder that cannot take the run) is one line on
    stderr and status 2; SIGTERM / SIGINT is status 128 + the signal (:func:`trainer.text.text_cli.guarded`).
    Returns the exit status."""
    from envs.core import EnvInfraError
    from trainer.policies import get_policy
    from trainer.text.text_cli import guarded
    from trainer.train import train

    policy = get_policy(name)
    try:
        setup, report = policy.part("setup"), policy.part("report")
    except (ImportError, AttributeError) as exc:  # a plugin's parts that cannot be imported: named, status 2
        print(f"forkyard {command}: error: --policy {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    try:
        cfg = train_config(args, name)
    except (ValueError, EnvInfraError) as exc:  # a usage error: a line and status 2, not a traceback
        print(f"forkyard {command}: error: {exc}", file=sys.stderr)
        return 2
    report(guarded(command, train, cfg, setup, command))
    return 0


def _train(args: argparse.Namespace) -> int:
    return run_policy(args.policy, args)


def _compare(args: argparse.Namespace) -> int:
    import os
    import time

    from trainer.compare import SweepConfig, markdown_table, run_sweep
    from trainer.config import from_args

    try:
        sweep = from_args(SweepConfig, args)
        t0 = time.perf_counter()
        rows, summary, out = run_sweep(sweep)
    except ValueError as exc:  # bad settings, or an --out folder of another sweep: a usage error
        print(f"forkyard compare: error: {exc}", file=sys.stderr)
        return 2
    wall = time.perf_counter() - t0
    print(markdown_table(summary, sweep.bits, sweep.env))
    print(f"\n{len(rows)} runs in {wall:.1f} s wall on {sweep.workers or os.cpu_count()} processes; "
          f"wrote {out}/results.csv, table.md, accuracy_vs_T.png, metrics/")
    return 0


def _rollout_openai(args: argparse.Namespace) -> int:
    import random

    from trainer.loop import env_id_arg, make_env
    from trainer.rollout import training_seeds
    from trainer.openai_rollout import OpenAIPolicy, episode_rows, require_token_ids
    from trainer.waves import group_rollout, tree_rollout

    env = make_env(env_id_arg(args.env), json.loads(args.env_kwargs))
    schemas = env.tool_schemas() if hasattr(env, "tool_schemas") else None
    render = None
    if args.api == "completions":
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(args.template, local_files_only=True)

        def render(messages):
            return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    policy = OpenAIPolicy(args.base_url, args.model, tools=schemas if args.tools else None, api=args.api,
                          render=render, temperature=args.temperature, max_tokens=args.max_tokens,
                          extra_body=json.loads(args.extra_body))
    rng = random.Random(args.seed)
    seeds = training_seeds(args.seed, 0, args.episodes)
    if args.branches > 1:
        ro = tree_rollout(env, policy, args.episodes, args.branches, seeds, rng)
    else:
        ro = group_rollout(env, policy, args.episodes, seeds, rng)
    env.close()
    rows = episode_rows(ro)
    if args.out:
        with open(args.out, "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    try:
        require_token_ids(ro)
        trainable = "yes"
    except ValueError as exc:
        trainable = f"no: {exc}"
    valid = [e.reward for e in ro.episodes if not e.infra_failure]
    parsed = [s.data.parsed for s in ro.steps]
    print(json.dumps({"episodes": len(ro.episodes), "mean_reward": sum(valid) / max(len(valid), 1),
                      "env_calls": ro.env_calls, "parsed_share": sum(parsed) / max(len(parsed), 1),
                      "trainable": trainable, "out": args.out}, indent=2))
    return 0


def _rollout_openai_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", required=True, help="API root of an OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--model", required=True, help="the model name the server knows")
    p.add_argument("--env", default="ClueProbe-v0", help="a registered env id (the forkyard/ prefix is optional)")
    p.add_argument("--env-kwargs", default="{}", help="the env's constructor kwargs as a JSON object")
    p.add_argument("--episodes", type=int, default=8, help="episodes (group) or bases (tree)")
    p.add_argument("--branches", type=int, default=1,
                   help="tree-fork rollouts with this many branches per base (1: a group)")
    p.add_argument("--api", choices=("chat", "completions"), default="chat")
    p.add_argument("--template", default=None,
                   help="completions: a local model folder whose tokenizer's chat template renders the prompt")
    p.add_argument("--no-tools", dest="tools", action="store_false",
                   help="chat: send no tools= (and parse name(args) only)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--extra-body", default="{}", help="more JSON fields for every request (server extensions)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="JSONL file of the episodes and what the server returned")


def _train_args(p: argparse.ArgumentParser, policy: str, choose: bool = True) -> None:
    """The options of ``train`` for ``policy`` (its config's fields), with ``--policy`` when ``choose``."""
    from trainer.config import add_arguments
    from trainer.policies import get_policy, policy_names

    if choose:
        names = policy_names()  # the registry's, plugins of forkyard.policies included
        p.add_argument("--policy", choices=names, default="tabular",
                       help="; ".join(f"{n}: {get_policy(n).help}" if get_policy(n).help else n for n in names))
    spec = get_policy(policy)
    try:
        config, groups = spec.part("config"), spec.part("groups")
    except (ImportError, AttributeError) as exc:  # a plugin's config that cannot be imported: a usage error
        p.error(f"--policy {policy}: cannot import its config: {type(exc).__name__}: {exc}")
    add_arguments(p, config, groups=groups)


def _compare_args(p: argparse.ArgumentParser) -> None:
    from trainer.compare import SweepConfig
    from trainer.config import add_arguments

    add_arguments(p, SweepConfig)


def build_parser(command: str | None = None, policy: str = "tabular") -> argparse.ArgumentParser:
    """The argument parser of ``forkyard``. Every subcommand is listed; the options are built for
    ``command`` only (None: for all), ``train``'s for ``policy``."""
    parser = argparse.ArgumentParser(prog="forkyard", description="forkyard: forkable envs, sandboxes and tree-fork RL")
    sub = parser.add_subparsers(dest="command", required=True)

    def wanted(name: str) -> bool:
        return command is None or command == name

    p = sub.add_parser("demo", help="show the fork API at work on ClueProbe (no Docker, about a second)")
    p.add_argument("--max-turns", "--turns", dest="max_turns", type=int, default=4, help="turns per episode")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(handler=_demo)

    p = sub.add_parser("bench", help="run a benchmark script from benchmarks/ (default: bench_envs)")
    p.add_argument("name", nargs="?", default="bench_envs")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="arguments passed to the benchmark")
    p.set_defaults(handler=_bench)

    p = sub.add_parser("envs", help="list the registered envs: ids, tools, settings, fork method, features")
    p.add_argument("ids", nargs="*", help="only these ids (the forkyard/ prefix is optional); with their settings' "
                                          "descriptions")
    p.add_argument("--json", action="store_true", help="print the catalog as JSON (a list of env cards)")
    p.add_argument("--no-tools", action="store_true",
                   help="read the env classes only: build no env to list its tools (faster)")
    p.set_defaults(handler=_envs)

    p = sub.add_parser("train", help="train a policy with group or tree-fork rollouts")
    if wanted("train"):
        _train_args(p, policy)
    p.set_defaults(handler=_train)

    p = sub.add_parser("train-lm", help="text policy: PPO-style RL with tree forks (same as train --policy lm)")
    if wanted("train-lm"):
        _train_args(p, "lm", choose=False)
    p.set_defaults(handler=lambda a: run_policy("lm", a, "train-lm"))

    p = sub.add_parser("compare", help="the granularity sweep: T x estimator x seed, table + CSV + plot")
    if wanted("compare"):
        _compare_args(p)
    p.set_defaults(handler=_compare)

    p = sub.add_parser("rollout-openai", help="sample rollouts from an OpenAI-compatible server (evaluation, or "
                                              "data trained elsewhere); JSONL of what it returned")
    if wanted("rollout-openai"):
        _rollout_openai_args(p)
    p.set_defaults(handler=_rollout_openai)

    # Listed for `forkyard --help` only: main() hands `serve ARGS` to the server command's own main (one
    # implementation and one declaration of its options: `forkyard serve ARGS` is `python -m sandbox_server ARGS`).
    p = sub.add_parser("serve", add_help=False, help="run the forkyard server (python -m sandbox_server; "
                                                     "`forkyard serve --help` lists its options)")
    p.add_argument("server_args", nargs=argparse.REMAINDER)
    p.set_defaults(handler=lambda a: serve(a.server_args))

    from trainer.text.text_cli import register as register_text

    register_text(sub, command)
    return parser


def serve(server_args: list[str]) -> int:
    """``forkyard serve ARGS``: the server command itself, :func:`sandbox_server.__main__.main` with the same
    ``ARGS`` (its options, help and exit statuses). Returns the exit status."""
    from sandbox_server.__main__ import main as serve_main

    return serve_main(server_args, prog="forkyard serve")


def _policy_of(argv: list[str]) -> str:
    """The ``--policy`` of a ``train`` command line (tabular when absent or not a registered policy,
    :func:`trainer.policies.policy_names`: the full parser then reports the bad value)."""
    from trainer.policies import policy_names

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--policy", default="tabular")
    known, _ = pre.parse_known_args(argv)
    return known.policy if known.policy in policy_names() else "tabular"


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``forkyard`` console script. Returns the process exit status."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["serve"]:  # every option (--help included) belongs to the server command's own parser
        return serve(argv[1:])
    command = argv[0] if argv and not argv[0].startswith("-") else None
    policy = _policy_of(argv[1:]) if command == "train" else "tabular"
    parser = build_parser(command or "", policy)
    args = parser.parse_args(argv)
    return int(args.handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
