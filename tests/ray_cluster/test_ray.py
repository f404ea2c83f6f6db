"""Scale-out on Ray: placement by node, forks across nodes, determinism, node loss.

The cluster tests run ``tests/ray_cluster/ray_scenarios.py`` in a network namespace this test makes (``unshare -n``
with only ``lo`` up), so Ray binds to 127.0.0.1 and sends nothing off the machine; the Docker socket (a
file) still works in there. The ``forkyard train --ray auto`` commands of docs/scaling.md run in
tests/repo/test_docs_commands.py. The fast tests at the top need no cluster.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys

import pytest

from tests.docker_support import ROOT, require_docker
from ray_cluster.collector import task_rng
from trainer.collectors import cluster_totals
from trainer.rollout import Rollout
from trainer.waves import tree_rollout
from trainer.tabular import TabularPolicy
from trainer.tabular_config import TrainConfig

pytest.importorskip("ray", reason="the ray extra is not installed (make installs it)")


def run_scenario(name: str, tmp_path) -> dict:
    if os.geteuid() != 0 and shutil.which("unshare") is None:
        pytest.skip("needs unshare for a network namespace")
    out = tmp_path / f"{name}.json"
    ns = ["unshare", "-n"] if os.geteuid() == 0 else ["unshare", "-rn"]
    cmd = ns + ["sh", "-c", 'ip link set lo up && exec "$0" tests/ray_cluster/ray_scenarios.py "$1" "$2"',
                sys.executable, name, str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert "error" not in data, data["error"]
    return data


# ------------------------------------------------------------------ no cluster needed
def test_a_behavior_copy_samples_like_the_learner_and_its_new_rows_map_back():
    from envs.clueprobe import ClueProbeEnv

    learner = TabularPolicy(device="cpu")
    env = ClueProbeEnv()
    warm = tree_rollout(env, learner, 1, 2, [1], random.Random(0))  # the learner knows some anchors
    learner.table[: learner.n_rows, 0] += 1.0  # and they are no longer uniform
    learner.refresh()
    copy = learner.behavior_copy()
    assert copy.n_rows == learner.n_rows and copy.table.device.type == "cpu"
    a = tree_rollout(env, copy, 2, 3, [7, 8], task_rng(0, 0, 0))
    b = tree_rollout(env, learner.behavior_copy(), 2, 3, [7, 8], task_rng(0, 0, 0))
    assert [s.logp for s in a.steps] == [s.logp for s in b.steps]  # same weights, same RNG: same samples
    extras = copy.rollout_extras()
    assert extras[0] == learner.n_rows and len(extras[1]) == copy.n_rows - learner.n_rows > 0
    learner.adopt(a, extras)
    for s in a.steps:  # every step now points at the learner's row of its anchor, with the same log-prob
        row, idx = s.data
        assert learner.rows[s.anchor_key] == row
        assert abs(learner.log_probs([s]).item() - s.logp) < 1e-6
    assert warm.episodes


def test_tabular_refuses_stale_rollouts_and_ray_refuses_a_server():
    with pytest.raises(ValueError, match="max_staleness must be 0"):
        TrainConfig(ray="local", max_staleness=1).validate()
    with pytest.raises(ValueError, match="cannot be combined with --server"):
        TrainConfig(ray="local", server_url="http://127.0.0.1:1").validate()
    with pytest.raises(ValueError, match="node_capacity"):
        TrainConfig(ray="local", node_capacity=0).validate()


@pytest.mark.parametrize("argv, says", [
    (["--max-staleness", "1"], "needs --ray"),
    (["--ray", "local", "--node-capacity", "0"], "node_capacity must be >= 1"),
    (["--ray", "local", "--max-staleness", "1"], "max_staleness must be 0"),
    (["--ray", "local", "--server", "http://127.0.0.1:1"], "cannot be combined with --server"),
])
def test_bad_ray_options_are_usage_errors_before_anything_starts(argv, says, capsys):
    from trainer import cli

    assert cli.main(["train", *argv]) == 2
    assert says in capsys.readouterr().err


def test_cluster_totals_sum_what_the_iterations_report():
    ms = [{"nodes": 3, "forks_local": 4, "forks_remote": 1, "episodes_lost_node": 0},
          {"nodes": 2, "forks_local": 2, "forks_remote": 0, "episodes_lost_node": 8}]
    assert cluster_totals(ms) == {"nodes": 2, "forks_local": 6, "forks_remote": 1, "episodes_lost_node": 8}
    assert Rollout("tree", []).cluster == {}


# ------------------------------------------------------------------ simulated clusters
@pytest.mark.slow
def test_placement_cross_node_forks_and_same_rollouts_on_three_and_one_nodes(tmp_path):
    d = run_scenario("forks", tmp_path)
    # One host per node, on the node its label names (hard node affinity).
    assert d["placement"] == {"n0": True, "n1": True, "n2": True}
    ce = d["clusterenv"]
    assert ce["contains"] and ce["kid_nodes"] == [ce["node"]] * 2 and ce["kid_turns"] == [1, 1]
    # A fork that travelled as snapshot bytes plays exactly like one that stayed: observations, rewards,
    # termination flags, anchor keys and turns, step by step (sandbox files included: FileQA, local backend).
    cf = d["cross_fork"]
    assert cf["remote_node"] == "n1" and cf["snapshot_bytes"] > 1000
    assert len(cf["local"]) >= 2 and cf["local"] == cf["remote"]
    for env_id, run in d["determinism"].items():
        assert run["nodes_three"] == [3, 3] and run["nodes_one"] == [1, 1], env_id
        assert run["forks_remote"] > 0, env_id  # node_capacity=2 sent forks across nodes
        # Same seeds, same rollouts: 3 nodes (forks crossing nodes) = 1 node = one process running the bases.
        assert run["three"] == run["one"] == run["single"], env_id
        assert all(len(sig) == 18 for sig in run["three"])  # 6 bases x 3 branches


@pytest.mark.slow
@pytest.mark.docker
def test_node_loss_mid_training_loses_only_its_episodes_and_leaks_no_container(tmp_path):
    require_docker()
    d = run_scenario("node_loss", tmp_path)
    ms = d["metrics"]
    assert [m["iteration"] for m in ms] == list(range(6))  # training went on
    lost = [m for m in ms if m["episodes_lost_node"]]
    assert len(lost) == 1, ms  # the iteration running when n2 died
    m = lost[0]
    assert m["nodes"] == 2 and m["episodes_lost_node"] % 4 == 0 and m["infra_failures"] == m["episodes_lost_node"] // 4
    assert m["trained_steps"] > 0  # the learner trained on the other nodes' episodes
    assert ms[-1]["nodes"] == 3  # n2 came back and got a new worker
    assert all(x["infra_failures"] == 0 for x in ms if x is not m)
    # The dead node left containers behind; its successor's start-up clean-up removed them.
    assert d["events"]["left_by_dead_node"] > 0
    assert d["left_after"] == {"n0": 0, "n1": 0, "n2": 0}


@pytest.mark.slow
def test_fileqa_sandboxes_on_the_cluster_in_process_and_behind_one_server_url(tmp_path):
    d = run_scenario("front", tmp_path)
    # backend="ray:auto": each new sandbox on the node holding the fewest; forks on their parent's node.
    assert d["spread"] == {"n0": 1, "n1": 1, "n2": 1}
    # The same seeds and actions give the same observations, rewards and anchor keys as the local backend
    # in one process: in-process over the cluster, and through `python -m sandbox_server --ray auto`.
    assert all(len(t) >= 3 for t in d["expected"])
    assert d["in_process"] == d["expected"]
    assert d["over_http"] == d["expected"]
    assert d["sandbox_routes"] == 404  # env sessions only: the sandboxes are the cluster's
    assert d["server_rc"] == 0, d["server_log"]


def same_text_episodes(got: list, want: list) -> None:
    """Two iterations' :func:`tests.ray_cluster.ray_scenarios.text_signature` lists hold the same episodes:
    everything exact but the behavior log-probs, within 1e-5 (batched vs serial float32 sums)."""
    assert len(got) == len(want)
    for g_it, w_it in zip(got, want, strict=True):
        assert len(g_it) == len(w_it) > 0
        for g, w in zip(g_it, w_it, strict=True):
            assert g[:-1] == w[:-1]  # seed, base, branch, fork turn, reason, infra flag, return, token ids
            for gl, wl in zip(g[-1], w[-1], strict=True):
                assert gl == pytest.approx(wl, abs=1e-5)


@pytest.mark.slow
def test_text_policy_workers_sample_through_the_engine_as_the_serial_per_base_rollouts(tmp_path):
    d = run_scenario("text_engine", tmp_path)["text_engine"]
    tree, group, placed = d["tree"], d["group"], d["placed"]
    # Every worker ran its bases (episodes) in one engine call; each is the single-process serial rollout of that
    # base with its task RNG (token ids exact, behavior log-probs within 1e-5), on 2 nodes and on 1.
    assert tree["two"]["nodes"] == [2, 2] and tree["one"]["nodes"] == [1, 1]
    for run in (tree["two"], tree["one"]):
        same_text_episodes(run["sig"], tree["single"]["sig"])
        assert run["env_calls"] == tree["single"]["env_calls"] and run["forks"] == tree["single"]["forks"]
        assert run["forks_remote"] == 0  # room enough on every node
    assert all(len(it) == 18 for it in tree["two"]["sig"])  # 6 bases x 3 branches
    same_text_episodes(group["two"]["sig"], group["single"]["sig"])
    assert group["two"]["env_calls"] == group["single"]["env_calls"]
    assert all(len(it) == 5 for it in group["two"]["sig"])
    # node_capacity 3: a fork split between the node (its part that fit) and the other node; same episodes
    same_text_episodes(placed["two"]["sig"], placed["single"]["sig"])
    assert placed["two"]["forks_remote"] == 2 and placed["two"]["forks_local"] >= 4
    assert placed["two"]["env_calls"] == placed["single"]["env_calls"]
