"""Run a command against a simulated Ray cluster of NODES nodes on this machine (``scripts/ray-sim.sh``).

``python scripts/ray_sim_cluster.py NODES CMD...`` starts ``ray.cluster_utils.Cluster`` with NODES nodes of
one CPU each, labelled ``forkyard-node=n0 .. n{NODES-1}``, runs CMD with ``RAY_ADDRESS`` set to the cluster
(so ``forkyard train --ray auto`` joins it), stops the cluster and exits with CMD's status. Run it through
``scripts/ray-sim.sh``, which puts it in a network namespace of its own where Ray binds only to 127.0.0.1.
"""

from __future__ import annotations

import os
import subprocess
import sys


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not argv[0].isdigit() or int(argv[0]) < 1:
        print("usage: ray_sim_cluster.py NODES CMD...", file=sys.stderr)
        return 2
    from ray.cluster_utils import Cluster

    nodes = int(argv[0])
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "labels": {"forkyard-node": "n0"},
                                                            "include_dashboard": False})
    try:
        for i in range(1, nodes):
            cluster.add_node(num_cpus=1, labels={"forkyard-node": f"n{i}"})
        cluster.wait_for_nodes()
        return subprocess.run(argv[1:], env={**os.environ, "RAY_ADDRESS": cluster.address}).returncode
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
