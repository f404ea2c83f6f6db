"""Every command the README and docs/ show is run, exactly as written, by this module or by CI.

The commands are the lines of the fenced ```sh blocks (``\\`` continuations joined, trailing ``# comments``
stripped) and the whole of each ```python block. ``TABLE`` says how each one is exercised; a documented
command without an entry fails, and so does an entry the docs no longer show. Kinds:

* ``BY_CI``: run by ``.ci/run`` (only what that script really runs may say so);
* ``RUN``: ``bash -c CMD`` in the repository root, must exit 0 (and pass the entry's check);
* ``PYTHON``: ``.venv/bin/python -c BLOCK`` in the repository root, must exit 0;
* ``SERVER``: ``bash -c CMD`` in a new process group; once port 8000 answers, every ``FOLLOW_UP`` entry runs
  against it (in the docs' order), then the group gets SIGTERM and must exit leaving no sandbox process and
  no container with its ``forkyard.sandbox`` label;
* ``DETACHED``: like ``SERVER`` for a command that returns once its stack is up (compose): must exit 0, the
  stack is stopped with ``docker compose down`` (which sends the server SIGTERM);
* ``BEFORE``: a command whose output a later block reads; the entry naming it in ``needs`` runs it first
  (``bash -c CMD``, must exit 0), once per session (:func:`run_before`: another module may read its output too);
* ``FOLLOW_UP``: run inside every ``SERVER`` / ``DETACHED`` test; ``SESSION`` is replaced with the
  ``session_id`` the create line printed (the only substitution);
* ``TODO``: too slow to run as written in CI; fails until the docs show a cheaper command.

The server tests need port 8000 (the documented default) and fail when it is busy; run them serially.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, NamedTuple

import httpx
import pytest

from tests.docker_support import IN_CI, ROOT, docker_reason, once

DOCS = ["README.md", "docs/serving.md", "docs/sandbox.md", "docs/reliability.md", "docs/scaling.md",
        "docs/integrations.md", "docs/envs.md", "docs/training.md", "docs/performance.md", "docs/architecture.md"]
VENV_PYTHON = str(ROOT / ".venv" / "bin" / "python")
URL = "http://127.0.0.1:8000"  # every documented server and follow-up uses port 8000

BY_CI, RUN, PYTHON, SERVER, DETACHED, FOLLOW_UP, STOP, BEFORE, TODO = (
    "by CI", "run", "python", "server", "detached server", "follow-up", "stops the detached server",
    "run first by the entry that needs it", "TODO: too slow")


class Entry(NamedTuple):
    how: str
    note: str
    marks: tuple[str, ...] = ()
    check: Callable[[str], bool] | None = None  # on the command's stdout
    backend: str | None = None  # servers: what GET /v1/pool must report
    label: str | None = None  # servers: the forkyard.sandbox label of their sandbox containers
    sandbox_routes: bool = False  # follow-ups: needs the sandbox routes (not run against an env-only server)
    needs: str | None = None  # a BEFORE command this one runs first (its output is this one's input)


TRL_SFT = (".venv/bin/forkyard sft --arch llama --tools json --max-turns 2 --vocab 400 --d-model 64 --n-heads 2 "
           "--context 1024 --sft-steps 150 --sft-batch 16 --run-dir runs/trl-sft")
TRL_BLOCK = '''\
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer
from envs.trl import environment_factory

rows = Dataset.from_list([{"prompt": [{"role": "user", "content": ""}], "seed": s} for s in range(8)])
args = GRPOConfig(output_dir="runs/trl-grpo", max_steps=2, per_device_train_batch_size=4, num_generations=4,
                  max_completion_length=128, use_cpu=True, report_to=[])
trainer = GRPOTrainer(model="runs/trl-sft/sft", args=args, train_dataset=rows,
                      environment_factory=environment_factory("forkyard/ClueProbe-v0", max_turns=2))
trainer.train()
print("tool calls per completion:", trainer.state.log_history[-1]["tools/call_frequency"])
'''

OPENENV_BLOCK = '''\
from openenv.core.generic_client import GenericEnvClient

with GenericEnvClient(base_url="http://127.0.0.1:8000/openenv/forkyard/ClueProbe-v0").sync() as env:
    result = env.reset(seed=0, kwargs={"max_turns": 4})   # kwargs: the env's constructor kwargs
    result = env.step({"action": "probe(0)"})          # result.observation: {"text", "info", ...}
    print(result.observation["text"], result.reward, result.done)
'''
FORK_BLOCK = '''\
from envs.openenv_client import ForkyardEnvClient

base = "http://127.0.0.1:8000/openenv/forkyard/ClueProbe-v0"
with ForkyardEnvClient(base_url=base).sync() as env:
    env.reset(seed=0)
    env.step({"action": "probe(0)"})
    children = env.fork(4)
    with ForkyardEnvClient(base_url=base).sync() as branch:
        branch.attach(children[0])
        branch.step({"action": "probe(1)"})
'''
ENV_API_BLOCK = '''\
import gymnasium as gym
import envs  # registers forkyard/* ids (or write gymnasium.make("envs:forkyard/ClueProbe-v0"))

env = gym.make("forkyard/ClueProbe-v0", max_turns=5).unwrapped
obs, info = env.reset(seed=0)                 # obs: str; info: turn, anchor_key, state_key, legal_actions
obs, reward, terminated, truncated, info = env.step("probe(0)")
branches = env.fork(4)                        # 4 independent copies: same hidden target, same history
for b, action in zip(branches, ["probe(1)", "probe(2)", "probe(0)", "answer(3)"]):
    print(b.step(action)[0])                  # each branch diverges (answer(3) is refused: too early)
snap = env.snapshot().to_bytes()              # plain JSON: crosses a process or HTTP boundary
'''

SANDBOX_CLIENT_BLOCK = '''\
from sandbox_server.client import SandboxClient
c = SandboxClient("http://127.0.0.1:8000")
sb = c.create(files={"question.txt": b"..."})      # per-episode files land in /scratch
c.exec(sb.id, "grep", {"pattern": "def main", "path": "Lib"}, timeout_s=5)   # ToolResult(stdout, status, truncated, ...)
kids = c.fork(sb.id, 4)                            # 4 independent copies of /scratch, /tmp, cwd, env, metadata
'''  # noqa: E501 - README.md's block, verbatim

def ray_line(out: str) -> dict:
    """The ``ray: {...}`` line a ``forkyard train --ray`` run ends with, as a dict."""
    return json.loads(next(line for line in out.splitlines() if line.startswith("ray: "))[5:])


TABLE: dict[str, Entry] = {
    # docs/scaling.md: simulated Ray clusters (scripts/ray-sim.sh makes its own network namespace)
    "./scripts/ray-sim.sh 3 .venv/bin/forkyard train --ray auto --env ClueProbe-v0 --iterations 30": Entry(
        RUN, "13 s here", ("slow",),
        check=lambda out: ray_line(out)["nodes"] == 3 and ray_line(out)["forks_local"] > 0),
    "./scripts/ray-sim.sh 3 .venv/bin/forkyard train --ray auto --env FileQA-v0 --iterations 5 --n-base 12 "
    "--node-capacity 3": Entry(
        RUN, "16 s here; forks travel", ("slow",),
        check=lambda out: ray_line(out)["nodes"] == 3 and ray_line(out)["forks_remote"] > 0),
    "./scripts/ray-sim.sh 2 .venv/bin/forkyard train --policy lm --ray auto --iterations 3 --n-base 2 "
    "--max-staleness 1": Entry(
        RUN, "22 s here", ("slow",),
        check=lambda out: json.loads(out[out.index("{\n"):])["ray"]["nodes"] == 2),  # the summary: stdout's JSON
    "./scripts/ray-sim.sh 3 .venv/bin/python benchmarks/bench_ray.py --n-base 24 --repeats 5": Entry(
        RUN, "30 s here", ("slow",), check=lambda out: "| 3 node(s) |" in out and "to another node" in out),
    "./scripts/ray-sim.sh 3 .venv/bin/python benchmarks/bench_ray.py --n-base 24 --repeats 5 --backend docker": Entry(
        RUN, "42 s here", ("slow", "docker"), check=lambda out: "| 3 node(s) |" in out and "docker backend" in out),
    # docs/envs.md: the measured columns and the fork benchmark, for one env
    ".venv/bin/python experiments/suite/measure.py --only forkyard/Sokoban-v0 --episodes 20 --tasks 4 "
    "--out runs/suite-sokoban.json": Entry(
        RUN, "about 1 s here", check=lambda out: "| `forkyard/Sokoban-v0` |" in out and "100% (" in out),
    ".venv/bin/python benchmarks/bench_suite.py --only forkyard/Sokoban-v0 --reps 5": Entry(
        RUN, "a loopback server of its own; about 4 s here",
        check=lambda out: out.count("forkyard/Sokoban-v0") == 2 and "x |" in out),
    # docs/integrations.md: train-lm sampling through vLLM's server, which the policy starts and stops
    "make vllm": Entry(RUN, "vLLM's venv (.venv-vllm); nothing to do once built, about 2 min cold"),
    (".venv/bin/forkyard train-lm --arch llama --sampler vllm --d-model 64 --n-heads 2 --vocab 300 --max-turns 3 "
     "--n-base 2 --branches 4 --iterations 3 --eval-samples 16 --tis-cap 2 --threads 1 --run-dir runs/vllm-train"):
    Entry(RUN, "3 iterations sampled by a vLLM server it starts and stops: about 60 s here (the server's start)",
          ("slow",), check=lambda out: "\"greedy_accuracy\"" in out),
    # README, first block
    "make run": Entry(RUN, "install (when pyproject.toml changed) + demo + 60-run sweep: 13-18 s here", ("slow",),
                      check=lambda out: "60 runs in" in out),
    "make test": Entry(BY_CI, ".ci/run runs `make test` (a test cannot run the suite that holds it)"),
    "make test-layer LAYER=envs": Entry(RUN, "the envs layer's tests with make test's set-up: about 2 min here",
                                        ("slow",), check=lambda out: " passed" in out and " failed" not in out),
    "make lint": Entry(RUN, "ruff, and mypy against mypy-baseline.txt: about 70 s here with a cold mypy cache",
                       ("slow",)),
    # README, env API
    ENV_API_BLOCK: Entry(PYTHON, "no server; the answer(3) branch is refused",
                         check=lambda out: "Invalid action" in out),
    # README, training
    ".venv/bin/forkyard train --max-turns 5 --estimator tree --run-dir runs/t5-tree": Entry(
        RUN, "250 tabular iterations, 2 s here", check=lambda out: "greedy evaluation" in out),
    ".venv/bin/forkyard compare --seeds 5": Entry(RUN, "100 runs, 19 s here on 2 cores", ("slow",),
                                                  check=lambda out: "100 runs in" in out),
    (".venv/bin/forkyard compare --env forkyard/Sokoban-v0 --env-kwarg n_rooms=4 --max-turns 10 --lr 1.0 "
     "--variants traj gigpo_state tree_entropy --seeds 2 --budget-iterations 20"): Entry(
        RUN, "6 runs on a pool of 4 Sokoban rooms, about 15 s here",
        check=lambda out: "| 10 | gigpo_state |" in out and "degeneration, state key" in out and "6 runs in" in out),
    # docs/serving.md: the catalog; README, serve and fork over HTTP: against every server below
    ".venv/bin/forkyard envs": Entry(
        RUN, "the catalog table: every registered id, ClueProbe's tools listed",
        check=lambda out: "| forkyard/ClueProbe-v0 | probe, answer |" in out and "| forkyard/FileQA-v0 |" in out),
    ".venv/bin/python -m sandbox_server --no-sandboxes": Entry(
        SERVER, "follow-ups; env sessions only: /v1/pool is a 404, FileQA refused with a 422 naming the missing "
                "sandbox service"),
    "curl -s localhost:8000/v1/envs": Entry(
        FOLLOW_UP, "lists ClueProbe",
        check=lambda out: "forkyard/ClueProbe-v0" in [e["env_id"] for e in json.loads(out)]),
    "curl -s localhost:8000/openenv/list_environments": Entry(
        FOLLOW_UP, "OpenEnv's listing: a JSON list of the ids, ClueProbe and FileQA among them",
        check=lambda out: {"forkyard/ClueProbe-v0", "forkyard/FileQA-v0"} <= set(json.loads(out))),
    "curl -s -XPOST localhost:8000/v1/envs -H 'content-type: application/json' -d "
    "'{\"env_id\": \"forkyard/ClueProbe-v0\", \"kwargs\": {\"max_turns\": 3}, \"seed\": 1}'": Entry(
        FOLLOW_UP, "prints the session_id that replaces SESSION below",
        check=lambda out: {"session_id", "observation", "info"} <= json.loads(out).keys()),
    "curl -s -XPOST localhost:8000/v1/envs/SESSION/step -H 'content-type: application/json' -d "
    "'{\"action\": \"probe(0)\"}'": Entry(
        FOLLOW_UP, "SESSION -> the created id; one turn taken", check=lambda out: json.loads(out)["info"]["turn"] == 1),
    "curl -s -XPOST localhost:8000/v1/envs/SESSION/fork -H 'content-type: application/json' -d '{\"n\": 4}'": Entry(
        FOLLOW_UP, "SESSION -> the created id; 4 new ids", check=lambda out: len(json.loads(out)["session_ids"]) == 4),
    "curl -s -XDELETE localhost:8000/v1/envs/SESSION": Entry(
        FOLLOW_UP, "SESSION -> the created id; 204, empty body", check=lambda out: out == ""),
    # README, TRL: forkyard's SFT writes the folder the TRL script trains
    TRL_SFT: Entry(BEFORE, "150 SFT steps of a tiny Llama writing JSON tool calls: about 30 s here"),
    TRL_BLOCK: Entry(PYTHON, "2 GRPO steps on CPU in TRL's tool loop, about 10 s here", ("slow",), needs=TRL_SFT,
                     check=lambda out: float(out.rsplit("tool calls per completion:", 1)[1]) > 0),
    # docs/serving.md, the server and the sandbox service
    ".venv/bin/forkyard serve --backend local": Entry(
        SERVER, "follow-ups; local pool; SIGTERM leaves no sandbox process", backend="local"),
    "make images && .venv/bin/python -m sandbox_server --backend docker": Entry(
        SERVER, "follow-ups; docker pool; SIGTERM leaves no container labelled default", ("slow", "docker"),
        backend="docker", label="default"),
    "./scripts/compose-up.sh": Entry(
        DETACHED, "follow-ups; docker pool; `docker compose down` leaves no container labelled compose",
        ("slow", "docker"), backend="docker", label="compose"),
    "docker compose down": Entry(STOP, "run as written to stop the detached server of ./scripts/compose-up.sh"),
    SANDBOX_CLIENT_BLOCK: Entry(FOLLOW_UP, ".venv/bin/python -c BLOCK against every sandbox server above",
                                sandbox_routes=True),
    # docs/integrations.md: OpenEnv's client and the fork extension against every server above
    OPENENV_BLOCK: Entry(FOLLOW_UP, "OpenEnv's GenericEnvClient plays a turn at /openenv/forkyard/ClueProbe-v0",
                         check=lambda out: "bit 0 of the target" in out),
    FORK_BLOCK: Entry(FOLLOW_UP, "fork(4) over the OpenEnv transport, one child attached by a second connection"),
    # docs/reliability.md
    "FORKYARD_RELIABILITY_OUT=/tmp/forkyard-reliability.json .venv/bin/python -m pytest -q -s "
    "tests/sandbox_server/test_reliability.py tests/sandbox_server/test_schema_fuzz.py": Entry(
        RUN, "the reliability suite and the schema fuzzer, again as documented: about 100 s here",
        ("slow", "docker"), check=lambda out: "[reliability] load:" in out and "requests over 16 operations" in out),
}


# ---------------------------------------------------------------------------------------------------
# extraction


FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.M | re.S)


def strip_comment(line: str) -> str:
    """``line`` without a trailing ``# comment`` (a ``#`` after whitespace, outside quotes)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def commands_in(text: str) -> list[str]:
    """The commands of ``text``'s ```sh blocks (one per logical line) and ```python blocks (whole)."""
    out = []
    for lang, body in FENCE.findall(text):
        if lang == "python":
            out.append(body)
        elif lang == "sh":
            pending = ""
            for raw in body.splitlines():
                line = strip_comment(raw)
                if pending:
                    line = f"{pending} {line.lstrip()}"
                if line.endswith("\\"):
                    pending = line[:-1].rstrip()
                    continue
                pending = ""
                if line.strip():
                    out.append(line.strip())
    return out


def documented_commands() -> list[str]:
    return [c for doc in DOCS for c in commands_in((ROOT / doc).read_text())]


def ci_commands() -> set[str]:
    """The commands .ci/run runs (its lines, less comments and shell set-up)."""
    lines = [strip_comment(x).strip() for x in (ROOT / ".ci" / "run").read_text().splitlines()]
    return {x for x in lines if x and not x.startswith(("set ", "cd ", "export "))}


# ---------------------------------------------------------------------------------------------------
# runners


def user_env() -> dict[str, str]:
    """The environment of a documented command: this process's, less every ``FORKYARD_*`` setting (the test
    session sets some; a user who copies the command has none unless the docs say so)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("FORKYARD_")}


def fresh_run_dirs(cmd: str) -> None:
    """Remove the ``--run-dir`` folders under ``runs/`` that ``cmd`` names: a documented command runs as on a
    fresh clone (a run folder that already holds a run is refused, never replaced, by the trainer)."""
    import shutil

    for path in re.findall(r"--run-dir\s+(\S+)", cmd):
        target = (ROOT / path).resolve()
        if target.is_relative_to(ROOT / "runs") and target != ROOT / "runs":
            shutil.rmtree(target, ignore_errors=True)


def run_shell(cmd: str, timeout_s: float = 600) -> subprocess.CompletedProcess:
    """``bash -c cmd`` in the repository root, in its own process group (killed whole on timeout), after
    :func:`fresh_run_dirs`."""
    fresh_run_dirs(cmd)
    proc = subprocess.Popen(["bash", "-c", cmd], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, env=user_env())
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"`{cmd}` ran past {timeout_s} s:\n{(out + err)[-3000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run_before(cmd: str) -> subprocess.CompletedProcess:
    """:func:`run_shell` of a ``BEFORE`` entry, once per session (:func:`tests.docker_support.once`): a test of
    another module that reads what it writes shares the run (tests/integrations/test_trl.py trains the model folder
    of :data:`TRL_SFT` in TRL's tool loop). Run again if a ``--run-dir`` folder it names has gone meanwhile."""
    dirs = [ROOT / p for p in re.findall(r"--run-dir\s+(\S+)", cmd)]
    return once(f"documented command: {cmd}", lambda: run_shell(cmd), lambda _: all(d.is_dir() for d in dirs))


def run_python(block: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([VENV_PYTHON, "-c", block], cwd=ROOT, capture_output=True, text=True, timeout=timeout_s,
                          env=user_env())


def assert_ran(cmd: str, r: subprocess.CompletedProcess) -> None:
    """Exit status 0 and, when the table has one, the entry's check on stdout."""
    shown = f"`{cmd[:300]}` exited {r.returncode}\nstdout: {r.stdout[-2000:]}\nstderr: {r.stderr[-3000:]}"
    assert r.returncode == 0, shown
    check = TABLE[cmd].check
    if check:
        try:
            ok = check(r.stdout)
        except Exception as exc:  # noqa: BLE001  (a JSON error body, a missing key: the check failed)
            ok, shown = False, f"{shown}\ncheck raised {exc!r}"
        assert ok, f"output check failed: {shown}"


def run_follow_ups(sandboxes: bool = True) -> None:
    """Every FOLLOW_UP entry in the docs' order against the server on port 8000 (``sandboxes=False``: a
    server of env sessions alone, which the sandbox-route follow-ups do not apply to)."""
    session = None
    for cmd in documented_commands():
        if TABLE[cmd].how != FOLLOW_UP or (not sandboxes and TABLE[cmd].sandbox_routes):
            continue
        if "\n" in cmd:  # a python block (a sh command is one line once its continuations are joined)
            r = run_python(cmd)
        else:
            assert session or "SESSION" not in cmd, "the create line must come before the SESSION lines"
            r = run_shell(cmd.replace("SESSION", session or "SESSION"), timeout_s=120)
        assert_ran(cmd, r)
        if '"env_id"' in cmd:  # the create line: its session_id replaces SESSION in the lines after it
            session = json.loads(r.stdout)["session_id"]


def need_docker() -> None:
    """Fail in CI, skip elsewhere, when no engine answers (no image is built here: the command must)."""
    reason = docker_reason()
    if reason:
        if IN_CI:
            pytest.fail(f"CI=true but {reason}")
        pytest.skip(reason)


def containers(label: str | None = None, project: str | None = None) -> list[str]:
    """Containers (all states) with ``forkyard.sandbox=label`` or of the compose project ``project``."""
    import docker

    flt = f"forkyard.sandbox={label}" if label else f"com.docker.compose.project={project}"
    c = docker.from_env(timeout=30)
    try:
        return [f"{ct.id[:12]} {ct.attrs.get('Names')}"
                for ct in c.containers.list(all=True, sparse=True, filters={"label": flt})]
    finally:
        c.close()


def remove_containers(label: str) -> None:
    subprocess.run(f"docker ps -aq --filter label=forkyard.sandbox={label} | xargs -r docker rm -f", shell=True,
                   capture_output=True, timeout=120)


def port_8000_busy() -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", 8000)) == 0


def descendants(pid: int) -> dict[int, str]:
    """Every live descendant of ``pid``: pid -> start time (field 22 of /proc/PID/stat, against pid reuse)."""
    parent, start = {}, {}
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            parent[int(p)], start[int(p)] = int(fields[1]), fields[19]
        except (OSError, IndexError, ValueError):
            pass
    out, todo = {}, [pid]
    while todo:
        ppid = todo.pop()
        kids = [p for p, pp in parent.items() if pp == ppid]
        out.update({k: start[k] for k in kids})
        todo += kids
    return out


def still_alive(procs: dict[int, str], grace_s: float = 10.0) -> list[str]:
    """Those of ``procs`` still running (zombies count as gone) after up to ``grace_s`` seconds."""
    deadline = time.monotonic() + grace_s
    while True:
        alive = []
        for pid, started in procs.items():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                if fields[19] == started and fields[0] != "Z":
                    argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:200]
                    alive.append(f"{pid} {argv!r}")
            except (OSError, IndexError):
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


def check_backend(cmd: str, backend: str | None) -> None:
    """The server's backend flag holds for all it serves: its pool has that backend, and a FileQA env session
    (the sandbox-backed env) takes its sandbox from that pool."""
    with httpx.Client(base_url=URL, timeout=120) as http:
        if backend is None:  # a server of env sessions alone: a sandbox-backed env is refused, never run elsewhere
            r = http.post("/v1/envs", json={"env_id": "forkyard/FileQA-v0", "kwargs": {"kinds": ["log_errors"]}})
            assert r.status_code == 422 and "sandbox" in r.json()["detail"], (
                f"`{cmd}`: FileQA: {r.status_code} {r.text}")
            assert http.get("/v1/pool").status_code == 404, f"`{cmd}` serves a sandbox pool"
            return
        pool = http.get("/v1/pool").json()
        assert pool.get("backend") == backend, f"`{cmd}` serves with backend {pool.get('backend')!r}: {pool}"
        r = http.post("/v1/envs", json={"env_id": "forkyard/FileQA-v0", "kwargs": {"kinds": ["log_errors"]}, "seed": 1})
        assert r.status_code == 201, f"`{cmd}`: a FileQA env session: {r.status_code} {r.text[:2000]}"
        busy = http.get("/v1/pool").json()["busy"]
        assert busy == pool["busy"] + 1, f"`{cmd}`: a FileQA env session took no sandbox from the {backend} pool"
        assert http.delete(f"/v1/envs/{r.json()['session_id']}").status_code == 204


def exercise_server(cmd: str, entry: Entry) -> None:
    """Start ``cmd``, wait for port 8000, run the follow-ups, stop it, and check that it left nothing."""
    assert not port_8000_busy(), "port 8000 is busy before the test: stop whatever listens there (servers need 8000)"
    if entry.label:
        before = containers(entry.label)
        assert not before, f"containers labelled forkyard.sandbox={entry.label} exist before the test: {before}"
    if entry.how == DETACHED:
        before = containers(project="forkyard")
        assert not before, f"compose project `forkyard` already has containers: {before}"
    log = tempfile.NamedTemporaryFile("w+", prefix="forkyard-docs-server-", suffix=".log")
    proc, sandbox_procs, problems = None, {}, []
    try:
        if entry.how == DETACHED:
            assert_ran(cmd, run_shell(cmd, timeout_s=900))
        else:
            proc = subprocess.Popen(["bash", "-c", cmd], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True, env=user_env())
        deadline = time.monotonic() + 900  # `make images` may build the images first
        while True:
            if proc is not None and proc.poll() is not None:
                log.seek(0)
                pytest.fail(f"`{cmd}` exited {proc.returncode} before answering on port 8000:\n{log.read()[-3000:]}")
            try:
                if httpx.get(f"{URL}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"`{cmd}` did not answer on port 8000 within 900 s"
            time.sleep(0.2)
        run_follow_ups(sandboxes=entry.backend is not None)
        check_backend(cmd, entry.backend)
        if entry.label:
            assert containers(entry.label), f"`{cmd}` runs no container labelled forkyard.sandbox={entry.label}"
        if proc is not None:
            sandbox_procs = descendants(proc.pid)
            assert sandbox_procs or entry.backend != "local", f"`{cmd}` runs its local sandboxes in no process"
    finally:
        if proc is not None:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                problems.append(f"`{cmd}` did not exit within 60 s of SIGTERM")
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
            left = still_alive(sandbox_procs)
            if left:
                problems.append(f"processes left after the server exited: {left}")
                for pid in sandbox_procs:  # only the server's own descendants
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        if entry.how == DETACHED:
            stop = next(c for c, e in TABLE.items() if e.how == STOP)
            down = run_shell(stop, timeout_s=180)
            if down.returncode:
                problems.append(f"`{stop}` exited {down.returncode}: {(down.stdout + down.stderr)[-2000:]}")
            if containers(project="forkyard"):
                problems.append(f"compose containers left: {containers(project='forkyard')}")
        if entry.label and containers(entry.label):
            problems.append(f"sandbox containers left: {containers(entry.label)}")
            remove_containers(entry.label)
        if port_8000_busy():
            problems.append("port 8000 still answers after the stop")
        log.seek(0)
        server_log = log.read()
        log.close()
        if problems:
            print(f"server log of `{cmd}`:\n{server_log[-3000:]}\nproblems after stopping it: {problems}")
    assert not problems, f"{problems}\nserver log:\n{server_log[-3000:]}"


# ---------------------------------------------------------------------------------------------------
# tests


def test_extraction_rules():
    doc = ("```sh\nmake run    # a comment\n            # a comment line\ncurl -d '{\"a\": \"#x\"}' \\\n"
           "     -H 'h: v'  # -> out\n```\n```python\nx = 1  # kept\n```\n```\nnot a command\n```\n")
    assert commands_in(doc) == ["make run", "curl -d '{\"a\": \"#x\"}' -H 'h: v'", "x = 1  # kept\n"]


def test_every_documented_command_has_an_entry():
    missing = [c for c in documented_commands() if c not in TABLE]
    assert not missing, f"documented commands with no entry in TABLE (add one and a way to run it): {missing}"


def test_every_entry_is_documented():
    gone = [c for c in TABLE if c not in documented_commands()]
    assert not gone, f"TABLE entries the docs no longer show (remove or update them): {gone}"


def test_every_before_entry_is_needed():
    needed = {e.needs for e in TABLE.values() if e.needs}
    idle = [c for c, e in TABLE.items() if e.how == BEFORE and c not in needed]
    assert not idle, f"BEFORE entries no entry needs (so nothing runs them): {idle}"


def test_only_what_ci_runs_is_marked_by_ci():
    claimed = {c for c, e in TABLE.items() if e.how == BY_CI}
    assert claimed <= ci_commands(), f"marked by CI but not in .ci/run: {claimed - ci_commands()}"


def _params():
    return [pytest.param(cmd, marks=[getattr(pytest.mark, m) for m in e.marks], id=cmd.splitlines()[0][:60])
            for cmd, e in TABLE.items() if e.how not in (BY_CI, FOLLOW_UP, STOP, BEFORE)]


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("cmd", _params())
def test_documented_command(cmd: str):
    entry = TABLE[cmd]
    if entry.how == TODO:
        pytest.fail(f"`{cmd}` is too slow to run as written: the docs need a cheaper command ({entry.note})")
    if "docker" in entry.marks:
        need_docker()
    if entry.needs:
        assert TABLE[entry.needs].how == BEFORE, f"`{entry.needs}` must be a BEFORE entry"
        assert_ran(entry.needs, run_before(entry.needs))
    if entry.how == RUN:
        assert_ran(cmd, run_shell(cmd))
    elif entry.how == PYTHON:
        assert_ran(cmd, run_python(cmd))
    else:
        exercise_server(cmd, entry)


def test_every_relative_link_in_the_docs_resolves():
    """README.md and docs/ link each other (the README keeps what a newcomer needs, the rest lives in docs/):
    every relative link names a file or folder that exists."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    broken = [(str(page.relative_to(ROOT)), target) for page in pages
              for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text())
              if not target.startswith(("http://", "https://", "mailto:")) and not (page.parent / target).exists()]
    assert len(pages) > 10 and broken == []
