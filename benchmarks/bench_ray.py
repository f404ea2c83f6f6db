"""Tree-fork rollout throughput on a simulated Ray cluster, and the cost of a fork sent across nodes.

Run: ``./scripts/ray-sim.sh 3 .venv/bin/python benchmarks/bench_ray.py [--backend local|docker] [--n-base 12]
[--branches 4] [--repeats 3]`` (a cluster of 3 one-CPU nodes on this machine, in a network namespace of its
own). Measured in one run, interleaved repeats, medians:

* **throughput**: tree-fork FileQA rollouts (``--n-base`` bases x ``--branches``, a fresh tabular policy, the
  iteration's seeds), in env steps/s and episodes/s, with 1, 2 and 3 nodes
  (:class:`ray_cluster.collector.RayCollector` limited to n0.., node_capacity large: every fork local), against
  the baseline: the same rollout in one process (:func:`trainer.waves.tree_rollout`, as ``forkyard train``
  without ``--ray`` runs it);
* **fork cost**: a FileQA env forked on its node (``NodeHost.fork``) against one sent to another node
  (``NodeHost.snapshot`` then ``NodeHost.adopt`` on the other: what a rollout worker does past its node's
  capacity, where the snapshot is taken in-process), each timed from the driver and so including Ray
  calls; a no-op call (``NodeHost.info``) is the Ray call's own cost. The snapshot's size in bytes is what
  would cross the network.

The simulated nodes share this machine's cores (2 here): past 2 nodes the figure measures scheduling, not
scale. Nothing is asserted; docs/scaling.md holds the figures and the model of a real cluster.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ray  # noqa: E402

from ray_cluster.collector import RayCollector, connect, task_rng  # noqa: E402
from ray_cluster.nodes import NodeHost, alive_nodes, node_name, start_hosts  # noqa: E402
from trainer.estimators import step_advantages  # noqa: E402
from trainer.loop import make_env  # noqa: E402
from trainer.rollout import training_seeds  # noqa: E402
from trainer.waves import tree_rollout  # noqa: E402
from trainer.tabular import TabularPolicy  # noqa: E402
from trainer.tabular_config import TrainConfig  # noqa: E402

ENV = "forkyard/FileQA-v0"


def single_process(cfg: TrainConfig, env, it: int) -> tuple[int, int]:
    """One iteration's tree rollout in this process, base by base (the RNG of a Ray run). (steps, episodes)."""
    policy = TabularPolicy(device="cpu")
    steps = episodes = 0
    for b, seed in enumerate(training_seeds(cfg.seed, it, cfg.n_base)):
        ro = tree_rollout(env, policy, 1, cfg.branches, [seed], task_rng(cfg.seed, it, b))
        steps, episodes = steps + ro.env_calls, episodes + len(ro.episodes)
    return steps, episodes


def cpu_ticks() -> tuple[int, int]:
    """``(busy, total)`` jiffies of the whole machine (/proc/stat), for the cores-busy column."""
    with open("/proc/stat") as f:
        vals = [int(x) for x in f.readline().split()[1:]]
    return sum(vals) - vals[3] - vals[4], sum(vals)


def median_ms(fn, n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="local", choices=("local", "docker"))
    ap.add_argument("--n-base", type=int, default=12)
    ap.add_argument("--branches", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--forks", type=int, default=30, help="fork-cost samples of each kind")
    args = ap.parse_args()
    kwargs = {"backend": args.backend}
    connect("auto")
    names = [node_name(n) for n in alive_nodes()]
    print(f"cluster: {len(names)} nodes {names}; FileQA on the {args.backend} backend; "
          f"{args.n_base} bases x {args.branches} branches per rollout")
    cfg = TrainConfig(env_id=ENV, n_base=args.n_base, branches=args.branches, seed=3, node_capacity=10_000, ray="auto")
    collectors = {n: RayCollector(cfg, TabularPolicy(device="cpu"), kwargs, "tree", nodes=names[:n])
                  for n in range(1, len(names) + 1)}
    local_env = make_env(ENV, kwargs)
    runs: dict[str, list[tuple[float, float, float]]] = {"one process": []} | {f"{n} node(s)": [] for n in collectors}
    ncpu = os.cpu_count() or 1

    def cores(t0: tuple[int, int]) -> float:
        t1 = cpu_ticks()
        return ncpu * (t1[0] - t0[0]) / max(t1[1] - t0[1], 1)

    single_process(cfg, local_env, 0)  # warm-up: sandboxes started, the pool at its size
    for col in collectors.values():
        col.rollout(0)
    for r in range(args.repeats):
        it = 1 + r
        c0, t0 = cpu_ticks(), time.perf_counter()
        steps, eps = single_process(cfg, local_env, it)
        dt = time.perf_counter() - t0
        runs["one process"].append((steps / dt, eps / dt, cores(c0)))
        for n, col in collectors.items():
            c0, t0 = cpu_ticks(), time.perf_counter()
            ro = col.rollout(it, version=it)
            dt = time.perf_counter() - t0
            runs[f"{n} node(s)"].append((ro.env_calls / dt, len(ro.episodes) / dt, cores(c0)))
    base = statistics.median(v[0] for v in runs["one process"])
    print(f"\n| rollouts on | env steps/s | episodes/s | vs one process | cores busy (of {ncpu}) |")
    print("|---|---:|---:|---:|---:|")
    for name, vals in runs.items():
        sps, eps, busy = (statistics.median(v[i] for v in vals) for i in range(3))
        print(f"| {name} | {sps:.0f} | {eps:.1f} | {sps / base:.2f}x | {busy:.2f} |")
    # The learner's side of one iteration on the driver: advantages + the tabular update (what bounds the
    # iteration rate once rollouts are spread over enough hosts, without --max-staleness overlap).
    col = collectors[len(names)]
    learn = []
    for r in range(args.repeats):
        ro = col.rollout(100 + r, version=100 + r)
        t0 = time.perf_counter()
        col.policy.update(ro, step_advantages(ro, cfg))
        learn.append((time.perf_counter() - t0) * 1e3)
    print(f"\nlearner (tabular, driver): advantages + update of one {len(ro.episodes)}-episode rollout: "
          f"{statistics.median(learn):.2f} ms")
    for col in collectors.values():
        col.close()
    local_env.close()

    hosts = start_hosts(NodeHost, capacity=10_000, nodes=names[:2])
    h0, h1 = hosts[names[0]], hosts[names[1]]
    sid = ray.get(h0.create.remote(ENV, kwargs))
    _, info = ray.get(h0.reset.remote(sid, 5, None))
    ray.get(h0.step.remote(sid, info["legal_actions"][1]))
    made: list[tuple] = []

    def local_fork() -> None:
        made.append((h0, ray.get(h0.fork.remote(sid, 1))[0]))

    def remote_fork() -> None:
        snap = ray.get(h0.snapshot.remote(sid))
        made.append((h1, ray.get(h1.adopt.remote(ENV, kwargs, snap, 1))[0]))

    noop = median_ms(lambda: ray.get(h0.info.remote()), args.forks)
    snap_bytes = len(ray.get(h0.snapshot.remote(sid)))
    lf, rf = [], []
    for _ in range(args.forks):  # interleaved
        lf.append(median_ms(local_fork, 1))
        rf.append(median_ms(remote_fork, 1))
        for host, s in made:
            ray.get(host.close.remote(s))
        made.clear()
    lf_ms, rf_ms = statistics.median(lf), statistics.median(rf)
    print(f"\nfork of a FileQA env ({args.backend} backend), median of {args.forks}, timed from the driver:")
    print(f"  on its node:        {lf_ms:.2f} ms")
    print(f"  to another node:    {rf_ms:.2f} ms ({rf_ms / lf_ms:.2f}x), snapshot {snap_bytes} bytes")
    print(f"  a no-op Ray call:   {noop:.2f} ms")
    ray.get([h.shutdown.remote() for h in hosts.values()])
    return 0


if __name__ == "__main__":
    sys.exit(main())
