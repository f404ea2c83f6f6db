"""Ray scenarios run by tests/ray_cluster/test_ray.py, each in a network namespace the test made (Ray binds to
127.0.0.1).

``python tests/ray_cluster/ray_scenarios.py NAME OUT.json`` starts a simulated cluster (``ray.cluster_utils.Cluster``,
one-CPU nodes labelled ``forkyard-node=n0..``), runs scenario NAME against it and writes what it measured
to OUT.json for the test to assert on. The scenarios use the shipped code only (no mocks).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
from typing import Any

import ray
from ray.cluster_utils import Cluster

from envs.core import EnvInfraError
from ray_cluster.collector import RayCollector, task_rng
from ray_cluster.nodes import NodeHost, alive_nodes, node_name, start_hosts
from ray_cluster.transport import ClusterEnv, make
from trainer.loop import make_env, train_loop
from trainer.rollout import training_seeds
from trainer.waves import tree_rollout
from trainer.tabular import TabularPolicy
from trainer.tabular_config import TrainConfig


def cluster(nodes: int) -> tuple[Cluster, dict[str, Any]]:
    """A cluster of ``nodes`` one-CPU nodes labelled n0 (the head) .. n{nodes-1}, connected; and its worker
    nodes by label."""
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "labels": {"forkyard-node": "n0"},
                                                      "include_dashboard": False})
    workers = {f"n{i}": c.add_node(num_cpus=1, labels={"forkyard-node": f"n{i}"}) for i in range(1, nodes)}
    c.wait_for_nodes()
    CLUSTERS.append(c)
    ray.init(address=c.address, include_dashboard=False, log_to_driver=False)
    return c, workers


CLUSTERS: list[Cluster] = []  # shut down when the scenario ends, whatever happened


def signature(rollout) -> list:
    """What must match between two rollouts: per episode its seed, place in the tree, actions, anchor keys,
    return and reason."""
    return [[e.seed, e.base, e.branch, e.fork_turn, [s.action for s in e.steps], [s.anchor_key for s in e.steps],
             round(e.reward, 9), e.reason, e.infra_failure] for e in rollout.episodes]


def play(env, picks: int, info: dict | None = None) -> list:
    """Step ``env`` ``picks`` times with a fixed choice among its legal actions (``info``: its current info,
    asked for when not given); the trace of what it said."""
    trace = []
    info = info or env.current_info()
    for k in range(picks):
        legal = [a for a in info["legal_actions"] if not a.startswith("answer")] or info["legal_actions"]
        obs, r, te, tr, info = env.step(legal[(7 * k + 3) % len(legal)])
        trace.append([obs, r, te, tr, info.get("anchor_key"), info.get("turn")])
        if te or tr:
            break
    return trace


def scenario_forks(out: dict[str, Any]) -> None:
    """Placement by node, ClusterEnv, a fork across nodes against a local fork, same rollouts on 3 and 1 nodes."""
    c, workers = cluster(3)
    by_label = {node_name(n): n["NodeID"] for n in alive_nodes()}
    hosts = start_hosts(NodeHost, capacity=8)
    infos = {name: ray.get(h.info.remote()) for name, h in hosts.items()}
    out["placement"] = {name: info["node_id"] == by_label[name] for name, info in infos.items()}

    env = make("forkyard/ClueProbe-v0", hosts)
    obs, info = env.reset(seed=3)
    env.step(info["legal_actions"][0])
    kids = env.fork(2)
    out["clusterenv"] = {"contains": bool(env.observation_space.contains(obs)), "node": env.node,
                         "kid_nodes": [k.node for k in kids], "kid_turns": [k.current_info()["turn"] for k in kids]}
    for k in kids:
        k.close()
    env.close()

    # A fork sent to another node as snapshot bytes against a fork that stays (FileQA, local backend).
    kwargs = {"backend": "local"}
    h0, h1 = hosts["n0"], hosts["n1"]
    sid = ray.get(h0.create.remote("forkyard/FileQA-v0", kwargs))
    _, info = ray.get(h0.reset.remote(sid, 11, None))
    ray.get(h0.step.remote(sid, info["legal_actions"][1]))
    local_sid = ray.get(h0.fork.remote(sid, 1))[0]
    snapshot = ray.get(h0.snapshot.remote(sid))
    remote_sid = ray.get(h1.adopt.remote("forkyard/FileQA-v0", kwargs, snapshot, 1))[0]
    local_env, remote_env = ClusterEnv(h0, local_sid), ClusterEnv(h1, remote_sid)
    out["cross_fork"] = {"local": play(local_env, 4), "remote": play(remote_env, 4), "remote_node": remote_env.node,
                         "snapshot_bytes": len(snapshot)}
    for e in (local_env, remote_env, ClusterEnv(h0, sid)):
        e.close()
    ray.get([h.shutdown.remote() for h in hosts.values()])
    for h in hosts.values():
        ray.kill(h)

    # The same seeds give the same rollouts: 3 nodes (forks crossing nodes), 1 node, and one process.
    runs: dict[str, Any] = {}
    for env_id, env_kwargs in (("forkyard/ClueProbe-v0", {}), ("forkyard/FileQA-v0", kwargs)):
        cfg = TrainConfig(env_id=env_id, n_base=6, branches=3, ray=c.address, node_capacity=2, seed=5)
        policy = TabularPolicy(device="cpu")
        col = RayCollector(cfg, policy, env_kwargs, "tree")
        three = [col.rollout(it) for it in range(2)]
        local = make_env(env_id, env_kwargs)
        single = []
        for it in range(2):
            seeds = training_seeds(cfg.seed, it, cfg.n_base)
            eps = []
            for b, seed in enumerate(seeds):
                ro = tree_rollout(local, policy, 1, cfg.branches, [seed], task_rng(cfg.seed, it, b))
                for e in ro.episodes:
                    e.base = b
                eps.append(ro)
            single.append([x for ro in eps for x in signature(ro)])
        local.close()
        runs[env_id] = {"three": [signature(r) for r in three], "single": single,
                        "forks_remote": sum(r.cluster["forks_remote"] for r in three),
                        "nodes_three": [r.cluster["nodes"] for r in three]}
        col.close()
    for node in workers.values():
        c.remove_node(node)
    for env_id, env_kwargs in (("forkyard/ClueProbe-v0", {}), ("forkyard/FileQA-v0", kwargs)):
        cfg = TrainConfig(env_id=env_id, n_base=6, branches=3, ray=c.address, node_capacity=2, seed=5)
        col = RayCollector(cfg, TabularPolicy(device="cpu"), env_kwargs, "tree")
        one = [col.rollout(it) for it in range(2)]
        runs[env_id]["one"] = [signature(r) for r in one]
        runs[env_id]["nodes_one"] = [r.cluster["nodes"] for r in one]
        col.close()
    out["determinism"] = runs


def containers(label: str) -> int:
    res = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=forkyard.sandbox={label}"],
                         capture_output=True, text=True, check=True)
    return len(res.stdout.split())


def scenario_node_loss(out: dict[str, Any]) -> None:
    """Tree-fork FileQA training on the docker backend; node n2 dies mid-rollout and comes back."""
    from sandbox_server.settings import ServerSettings

    c, workers = cluster(3)
    label = f"{ServerSettings().server_name}-n2"
    events: dict[str, Any] = {}

    def kill_n2() -> None:
        time.sleep(0.1)  # an iteration takes 0.4 s here (more on a busier machine): n2 is mid-rollout
        c.remove_node(workers["n2"])
        events["removed_at"] = time.time()

    def on_iteration(m: dict[str, Any]) -> None:
        it = m["iteration"]
        if it == 1:
            threading.Thread(target=kill_n2, daemon=True).start()
        if it == 3:
            time.sleep(1.0)  # let the dead worker's pid and containers settle
            events["left_by_dead_node"] = containers(label)
            c.add_node(num_cpus=1, labels={"forkyard-node": "n2"})
            c.wait_for_nodes()

    cfg = TrainConfig(env_id="forkyard/FileQA-v0", env_kwargs={"backend": "docker"}, iterations=6, n_base=24,
                      branches=4, ray=c.address, seed=1)
    env = make_env(cfg.env_id, cfg.env_options())
    policy = TabularPolicy(device="cpu", lr=cfg.lr)
    run = train_loop(cfg, env, policy, on_iteration=on_iteration, env_kwargs=cfg.env_options())
    env.close()
    out["metrics"] = [{k: m.get(k) for k in ("iteration", "nodes", "episodes_lost_node", "infra_failures",
                                             "episodes", "reward_mean", "trained_steps", "forks_local", "wall_s")}
                      for m in run.metrics]
    out["events"] = events
    out["left_after"] = {n: containers(f"{ServerSettings().server_name}-{n}") for n in ("n0", "n1", "n2")}


def fixed_actions(env, picks: int, seed: int) -> list:
    """Reset ``env`` with ``seed``, step it ``picks`` times with a fixed choice among its legal actions, then
    fork it once (when not ended) and step the child once; the trace of what it said."""
    obs, info = env.reset(seed=seed)
    trace: list = [[obs, info.get("anchor_key")]]
    for k in range(picks + 1):
        legal = [a for a in info["legal_actions"] if not a.startswith("answer")] or info["legal_actions"]
        target = env if k < picks else env.fork(1)[0]
        obs, r, te, tr, info = target.step(legal[(7 * k + 3) % len(legal)])
        trace.append([k, obs, r, te, tr, info.get("anchor_key"), info.get("turn")])
        if k == picks:
            target.close()
        if te or tr:
            break
    return trace


def scenario_front(out: dict[str, Any]) -> None:
    """FileQA with its sandboxes on the cluster: in-process (backend="ray:auto") and behind one server URL
    (python -m sandbox_server --ray auto), each against the local backend in this process."""
    import os
    import socket

    import gymnasium as gym
    import httpx

    c, _ = cluster(3)
    local = gym.make("forkyard/FileQA-v0", backend="local").unwrapped
    expected = [fixed_actions(local, 3, seed) for seed in (4, 9, 13)]
    local.close()
    envs_ = [gym.make("forkyard/FileQA-v0", backend="ray:auto").unwrapped for _ in range(3)]
    out["in_process"] = [fixed_actions(e, 3, seed) for e, seed in zip(envs_, (4, 9, 13), strict=True)]
    out["expected"] = expected
    from sandbox_server.embedded import shared_provider

    provider = shared_provider("ray:auto")
    out["spread"] = {node: n for node, n in provider._held.items()}
    for e in envs_:
        e.close()

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "RAY_ADDRESS": c.address}
    server = subprocess.Popen([sys.executable, "-m", "sandbox_server", "--ray", "auto", "--port", str(port)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.5)
        remote = gym.make("forkyard/FileQA-v0", server_url=url).unwrapped
        out["over_http"] = [fixed_actions(remote, 3, seed) for seed in (4, 9, 13)]
        remote.close()
        out["sandbox_routes"] = httpx.get(f"{url}/v1/pool", timeout=5).status_code
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
        out["server_rc"] = server.returncode
        out["server_log"] = (server.stdout.read() if server.stdout else "")[-2000:]


def text_signature(rollout) -> list:
    """Per episode: its seed, place in the tree, reason and return, and per step its action token ids and
    behavior log-probs (the test compares the log-probs within 1e-5, the rest exactly)."""
    return [[e.seed, e.base, e.branch, e.fork_turn, e.reason, e.infra_failure, round(e.reward, 9),
             [s.data.action_ids for s in e.steps], [s.data.logps for s in e.steps]] for e in rollout.episodes]


def scenario_text_engine(out: dict[str, Any]) -> None:
    """The text policy on Ray sampling through the batched engine: its rollouts against the serial single-process
    tree (group) rollout of each base (episode) with its task RNG, on 2 nodes and on 1."""
    import torch

    from trainer.text.lm import ByteTokenizer, LMConfig, build_model
    from trainer.waves import group_rollout
    from trainer.text.text_config import TextTrainConfig
    from trainer.text.text_train import PPOTextPolicy

    torch.set_num_threads(1)
    c, workers = cluster(2)
    model = build_model(LMConfig(d_model=32, n_layers=2, n_heads=2, context=160), device="cpu", seed=0).eval()
    with torch.no_grad():  # the end-of-turn logit raised: actions end by <|end|> and at the token limit
        eot = model.tok.weight[ByteTokenizer().eot_id]
        model.ln_f.bias += 3.0 * eot / eot.pow(2).sum()
    common = dict(env_id="forkyard/ClueProbe-v0", max_turns=3, seed=5, max_new_tokens=8, tokenizer="byte",
                  ray=c.address, sampler="batched", max_batch=4, iterations=2)

    def serial(cfg, policy, kind: str) -> dict[str, Any]:
        """Each base (episode) alone in this process, serially, with its task RNG."""
        env = make_env(cfg.env_id, cfg.env_options())
        n = cfg.n_base if kind == "tree" else cfg.group_size
        res: dict[str, Any] = {"sig": [], "env_calls": [], "forks": []}
        for it in range(2):
            ros = []
            for b, seed in enumerate(training_seeds(cfg.seed, it, n)):
                rng = task_rng(cfg.seed, it, b)
                ro = (tree_rollout(env, policy, 1, cfg.branches, [seed], rng, cfg.fork_selection) if kind == "tree"
                      else group_rollout(env, policy, 1, [seed], rng))
                for ep in ro.episodes:
                    ep.base = b if kind == "tree" else None
                ros.append(ro)
            res["sig"].append([x for ro in ros for x in text_signature(ro)])
            res["env_calls"].append(sum(ro.env_calls for ro in ros))
            res["forks"].append(sum(ro.forks for ro in ros))
        env.close()
        return res

    def on_ray(cfg, policy, kind: str) -> dict[str, Any]:
        col = RayCollector(cfg, policy, cfg.env_options(), kind)
        assert policy.behavior_copy().engine is not None
        ros = [col.rollout(it) for it in range(2)]
        col.close()
        return {"sig": [text_signature(r) for r in ros], "nodes": [r.cluster["nodes"] for r in ros],
                "forks_local": sum(r.cluster["forks_local"] for r in ros),
                "forks_remote": sum(r.cluster["forks_remote"] for r in ros),
                "env_calls": [r.env_calls for r in ros], "forks": [r.forks for r in ros]}

    runs: dict[str, Any] = {}
    # 6 bases x 3 branches: 3 bases a worker on 2 nodes (6 on 1), each worker's in one engine call
    tree_cfg = TextTrainConfig(**common, n_base=6, branches=3, node_capacity=64)
    policy = PPOTextPolicy.from_config(model, tree_cfg)
    runs["tree"] = {"two": on_ray(tree_cfg, policy, "tree"), "single": serial(tree_cfg, policy, "tree")}
    group_cfg = TextTrainConfig(**common, group_size=5, node_capacity=64)
    runs["group"] = {"two": on_ray(group_cfg, policy, "group"), "single": serial(group_cfg, policy, "group")}
    # node_capacity 3 and one base of 4 branches on n0 (n1 idle): the worker's env, the base's copy and its
    # checkpoint fill n0; when the base has ended, the checkpoint's fork(2) for branches 2-3 keeps one copy on n0
    # and sends one to n1, whose branch steps there (a ClusterEnv row in the engine)
    small_cfg = TextTrainConfig(**common, n_base=1, branches=4, node_capacity=3)
    runs["placed"] = {"two": on_ray(small_cfg, policy, "tree"), "single": serial(small_cfg, policy, "tree")}
    for node in workers.values():
        c.remove_node(node)
    runs["tree"]["one"] = on_ray(tree_cfg, policy, "tree")
    out["text_engine"] = runs


def main() -> int:
    name, path = sys.argv[1], sys.argv[2]
    out: dict[str, Any] = {}
    random.seed(0)
    try:
        {"forks": scenario_forks, "node_loss": scenario_node_loss, "front": scenario_front,
         "text_engine": scenario_text_engine}[name](out)
    except EnvInfraError as exc:
        out["error"] = f"EnvInfraError: {exc}"
    finally:
        with open(path, "w") as f:
            json.dump(out, f)
        ray.shutdown()
        for c in CLUSTERS:
            c.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
