"""The per-iteration rows of docs/results/fileqa.md's first table, recomputed from a run's metrics.

Reads a ``metrics.jsonl`` of ``forkyard train`` (plain, or gzip when its name ends in ``.gz``: the committed
``docker-metrics.jsonl.gz`` and ``local-metrics.jsonl.gz`` beside this file) and prints, per file: env calls
and env fork calls per iteration (means over iterations), the mean sampled success (``reward_mean``) of
iterations 1-10, 11-20 and 21-30, and the episodes lost to infrastructure (``infra_failures``, summed).
Wall time and greedy success are in the run's ``summary.json``, not in its metrics.

Usage: .venv/bin/python experiments/fileqa/report.py experiments/fileqa/*-metrics.jsonl.gz
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path


def load(path: str | Path) -> list[dict]:
    """The rows of a metrics file (one JSON object per line; gzip when the name ends in ``.gz``)."""
    raw = Path(path).read_bytes()
    text = gzip.decompress(raw).decode() if str(path).endswith(".gz") else raw.decode()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def summary(rows: list[dict], window: int = 10) -> dict:
    """``env_calls``, ``forks``: means per iteration; ``success``: the mean ``reward_mean`` of each block of
    ``window`` iterations, in order; ``infra_failures``: the total. Raises ValueError on no rows."""
    if not rows:
        raise ValueError("no metrics rows")
    n = len(rows)
    blocks = [rows[i:i + window] for i in range(0, n, window)]
    return {"iterations": n,
            "env_calls": sum(r["env_calls"] for r in rows) / n,
            "forks": sum(r["forks"] for r in rows) / n,
            "success": [sum(r["reward_mean"] for r in b) / len(b) for b in blocks],
            "infra_failures": sum(r["infra_failures"] for r in rows)}


def main(argv: list[str] | None = None) -> None:
    """Print :func:`summary` of each metrics file named on the command line."""
    for path in argv if argv is not None else sys.argv[1:]:
        s = summary(load(path))
        blocks = " / ".join(f"{x:.3f}" for x in s["success"])
        print(f"{Path(path).name}: {s['iterations']} iterations; env calls / it. {s['env_calls']:.1f}; "
              f"forks / it. {s['forks']:.1f}; mean sampled success per 10 it. {blocks}; "
              f"episodes lost to infrastructure {s['infra_failures']}")


if __name__ == "__main__":
    main()
