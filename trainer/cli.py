"""The ``forkyard`` command line. Heavy imports (torch, uvicorn) happen inside the subcommands."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``forkyard`` console script. Returns the process exit status."""
    parser = argparse.ArgumentParser(prog="forkyard", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="show the fork API at work on ClueProbe (no Docker, about a second)")
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)

    p = sub.add_parser("bench", help="run a benchmark script from benchmarks/ (default: bench_envs)")
    p.add_argument("name", nargs="?", default="bench_envs")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="arguments passed to the benchmark")

    args = parser.parse_args(argv)
    if args.command == "demo":
        from trainer.demo import run_demo

        run_demo(turns=args.turns, seed=args.seed)
    elif args.command == "bench":
        import runpy
        from pathlib import Path

        script = Path(__file__).resolve().parents[1] / "benchmarks" / f"{args.name}.py"
        if not script.is_file():
            parser.error(f"no benchmark {script} (benchmarks live in the source checkout)")
        sys.argv = [str(script), *args.rest]
        runpy.run_path(str(script), run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
