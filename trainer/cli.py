"""The ``forkyard`` command line. Heavy imports (torch, uvicorn) happen inside the subcommands.

Every subcommand registers a ``handler(args) -> int`` with ``set_defaults(handler=...)``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys


def _demo(args: argparse.Namespace) -> int:
    from trainer.demo import run_demo

    run_demo(turns=args.turns, seed=args.seed)
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


def _env_kwargs(pairs: list[str]) -> dict:
    """``["turns=5", "bits=3"]`` -> ``{"turns": 5, "bits": 3}`` (values parsed as JSON, else kept as text)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--env-kwarg needs KEY=VALUE, got {pair!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def _train(args: argparse.Namespace) -> int:
    if args.policy == "lm":
        from trainer.text_train import train_lm_from_args

        return int(train_lm_from_args(args) or 0)
    from trainer.train import TrainConfig, train

    kwargs = _env_kwargs(args.env_kwarg)
    if args.turns is not None:
        kwargs["turns"] = args.turns
    cfg = TrainConfig(
        env_id=args.env,
        env_kwargs=kwargs,
        estimator=args.estimator,
        fork_selection=args.fork_selection,
        tree_prefix=args.tree_prefix,
        rollout=args.rollout,
        omega=args.omega,
        group_size=args.group_size,
        n_base=args.n_base,
        branches=args.branches,
        iterations=args.iterations,
        max_env_calls=args.max_env_calls,
        eval_episodes=args.eval_episodes,
        lr=args.lr,
        seed=args.seed,
        device=args.device,
        server_url=args.server,
        run_dir=args.run_dir,
        progress=True,
    )
    result = train(cfg)
    ms = result.metrics
    tail = ms[-min(20, len(ms)):]
    print(f"run: {cfg.run_dir or '(not saved)'}  iterations: {len(ms)}  wall: {result.wall_s:.1f} s")
    print(f"mean reward (last {len(tail)} iterations): {sum(m['reward_mean'] for m in tail) / len(tail):.3f}")
    print(f"env calls per iteration: {sum(m['env_calls'] for m in ms) / len(ms):.1f}  "
          f"anchor degeneration: {100 * sum(m['degeneration'] for m in ms) / len(ms):.1f}%")
    print(f"greedy evaluation: {json.dumps(result.evaluation)}")
    return 0


def _compare(args: argparse.Namespace) -> int:
    from trainer.compare import SweepConfig, markdown_table, run_sweep

    sweep = SweepConfig(
        turns=tuple(args.turns),
        variants=tuple(args.variants),
        seeds=args.seeds,
        iterations=args.iterations,
        lr=args.lr,
        budget_iterations=args.budget_iterations,
        workers=args.workers,
        out=args.out,
    )
    t0 = __import__("time").perf_counter()
    rows, summary, out = run_sweep(sweep)
    wall = __import__("time").perf_counter() - t0
    print(markdown_table(summary, sweep.bits))
    print(f"\n{len(rows)} runs in {wall:.1f} s wall on {sweep.workers or __import__('os').cpu_count()} processes; "
          f"wrote {out}/results.csv, table.md, accuracy_vs_T.png, metrics/")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``forkyard`` with every subcommand."""
    from trainer.advantages import TREE_PREFIXES
    from trainer.compare import DEFAULT_VARIANTS, VARIANTS
    from trainer.train import ESTIMATORS, ROLLOUTS

    parser = argparse.ArgumentParser(prog="forkyard", description="forkyard: forkable envs, sandboxes and tree-fork RL")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="show the fork API at work on ClueProbe (no Docker, about a second)")
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(handler=_demo)

    p = sub.add_parser("bench", help="run a benchmark script from benchmarks/ (default: bench_envs)")
    p.add_argument("name", nargs="?", default="bench_envs")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="arguments passed to the benchmark")
    p.set_defaults(handler=_bench)

    p = sub.add_parser("train", help="train a policy with group or tree-fork rollouts")
    p.add_argument("--env", default="forkyard/ClueProbe-v0", help="a registered env id")
    p.add_argument("--turns", type=int, default=None, help="shortcut for --env-kwarg turns=N")
    p.add_argument("--env-kwarg", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--policy", choices=["tabular", "lm"], default="tabular")
    p.add_argument("--estimator", choices=ESTIMATORS, default="tree")
    p.add_argument("--fork-selection", choices=["uniform", "entropy"], default="uniform")
    p.add_argument("--tree-prefix", choices=TREE_PREFIXES, default="base",
                   help="tree estimator: prefix turns valued by the base episode's return (default) or its branches' mean")
    p.add_argument("--rollout", choices=ROLLOUTS, default=None,
                   help="rollout shape (default: tree for the tree estimator, else group)")
    p.add_argument("--omega", type=float, default=1.0, help="anchor_fallback: weight of the anchor term")
    p.add_argument("--group-size", type=int, default=16)
    p.add_argument("--n-base", type=int, default=5)
    p.add_argument("--branches", type=int, default=4)
    p.add_argument("--iterations", type=int, default=250)
    p.add_argument("--max-env-calls", type=int, default=None, help="stop after this many env calls")
    p.add_argument("--eval-episodes", type=int, default=64, help="greedy evaluation episodes on held-out seeds")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu or cuda")
    p.add_argument("--server", default=None, help="URL of a forkyard server; envs run there")
    p.add_argument("--run-dir", default=None, help="folder for config.json, metrics.jsonl, summary.json")
    p.add_argument("--checkpoint", default=None, help="lm policy: SFT weights to start from")
    p.set_defaults(handler=_train)

    p = sub.add_parser("compare", help="the granularity sweep: T x estimator x seed, table + CSV + plot")
    p.add_argument("--turns", type=int, nargs="+", default=[2, 3, 4, 5])
    p.add_argument("--variants", nargs="+", default=list(DEFAULT_VARIANTS), choices=list(VARIANTS))
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--iterations", type=int, default=250)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument(
        "--budget-iterations", type=int, default=None, metavar="N",
        help="equal env-call budget: each run at T may spend N*G*T env calls (traj's cost of N iterations)",
    )
    p.add_argument("--workers", type=int, default=None, help="processes (default: every core)")
    p.add_argument("--out", default=None, help="output folder (default runs/compare-<time>)")
    p.set_defaults(handler=_compare)

    # One declaration of the server's options: `forkyard serve ARGS` is `python -m sandbox_server ARGS`.
    p = sub.add_parser("serve", add_help=False, help="run the sandbox service (python -m sandbox_server; --help there)")
    p.add_argument("server_args", nargs=argparse.REMAINDER)
    p.set_defaults(handler=lambda a: __import__("sandbox_server.__main__", fromlist=["main"]).main(a.server_args))

    from trainer.text_cli import register as register_text

    register_text(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``forkyard`` console script. Returns the process exit status."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["serve"]:  # every option (--help included) belongs to the server's own parser
        from sandbox_server.__main__ import main as serve_main

        return serve_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
