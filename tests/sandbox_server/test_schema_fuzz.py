"""Schema fuzzing with schemathesis against real uvicorn servers on loopback (field case S15's kind).

Every operation of the OpenAPI schema the server itself publishes gets generated requests, valid and
invalid (schemathesis' positive and negative modes), half of them aimed at live objects (a sandbox, a
snapshot, an env session that exist, a registered env id, a whitelisted tool) so the deep paths run,
not only the 404s. Every answer must pass schemathesis' conformance checks (the status is documented
for the operation, the content type and documented headers are right, the body matches the documented
schema) and be no 5xx other than a documented 503 (with Retry-After). Example counts are bounded so
the module fits CI on two cores; ``FORKYARD_FUZZ_EXAMPLES`` scales them. Afterwards the server holds
only the objects the harness kept: no request that was answered with an error took anything.
"""

from __future__ import annotations

import collections
import os
import random
from typing import Any

import httpx
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable

import schemathesis  # noqa: E402 - a dev dependency: CI has it, and the fuzz run must never skip
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance, response_headers_conformance, response_schema_conformance, status_code_conformance,
)

from sandbox_server.app import create_app  # noqa: E402
from sandbox_server.backends import LocalBackend  # noqa: E402
from sandbox_server.app import create_env_app  # noqa: E402
from sandbox_server.service import SandboxService, ServiceConfig  # noqa: E402
from tests.docker_support import SERVER_NAME, UvicornThread, require_bwrap  # noqa: E402

SCALE = float(os.environ.get("FORKYARD_FUZZ_EXAMPLES", "1"))
EXAMPLES = {GenerationMode.POSITIVE: max(1, int(40 * SCALE)), GenerationMode.NEGATIVE: max(1, int(15 * SCALE))}
TOOLS = ["ls", "cat", "head", "grep", "wc", "find"]


@schemathesis.check
def no_server_error_but_a_documented_503(ctx, response, case):
    """No 5xx but 503, and a 503 says when to retry."""
    if response.status_code >= 500 and response.status_code != 503:
        raise AssertionError(f"{case.operation.label} answered {response.status_code}: {response.text[:500]}")
    if response.status_code == 503 and int(response.headers.get("retry-after", ["0"])[0]) < 1:
        raise AssertionError(f"a 503 without Retry-After: {response.headers}")


CHECKS = [no_server_error_but_a_documented_503, status_code_conformance, content_type_conformance,
          response_headers_conformance, response_schema_conformance]


class Live:
    """Live objects on the server for the harness to aim requests at (re-made when a fuzzed request
    deleted them), and clean-up of what fuzzed requests made (so the pool does not run dry)."""

    def __init__(self, url: str, env_ids: list[str]):
        self.http = httpx.Client(base_url=url, timeout=60)
        self.env_ids = env_ids
        self.ids: dict[str, str | None] = {"sandbox_id": None, "snapshot_id": None, "session_id": None}

    def _alive(self, name: str, path: str) -> bool:
        return self.ids[name] is not None and self.http.get(path.format(self.ids[name])).status_code == 200

    def get(self, name: str) -> str | None:
        if name == "sandbox_id" and not self._alive(name, "/v1/sandboxes/{}"):
            r = self.http.post("/v1/sandboxes", json={"files": {"q.txt": "question"}})
            self.ids[name] = r.json()["id"] if r.status_code == 201 else None
        elif name == "snapshot_id" and not self._alive(name, "/v1/snapshots/{}"):
            sb = self.get("sandbox_id")
            r = self.http.post(f"/v1/sandboxes/{sb}/snapshot", json={}) if sb else None
            self.ids[name] = r.json()["id"] if r is not None and r.status_code == 201 else None
        elif name == "session_id" and not self._alive(name, "/v1/envs/{}"):
            r = self.http.post("/v1/envs", json={"env_id": "forkyard/ClueProbe-v0", "seed": 0})
            self.ids[name] = r.json()["session_id"] if r.status_code == 201 else None
        return self.ids.get(name)

    def aim(self, case: Any, rng: random.Random) -> None:
        """Point the case at live objects: real ids, a registered env id, a whitelisted tool."""
        for name in list(case.path_parameters):
            if name in self.ids and (live := self.get(name)) is not None:
                case.path_parameters[name] = live
        if isinstance(case.body, dict):
            if "env_id" in case.body:
                case.body["env_id"] = rng.choice(self.env_ids)
            if "tool" in case.body:
                case.body["tool"] = rng.choice(TOOLS)

    def clean_up(self, case: Any, resp: httpx.Response) -> None:
        """Delete what a successful fuzzed create / clone / fork made."""
        if resp.status_code not in (200, 201) or case.method.upper() != "POST":
            return
        body = resp.json()
        if case.path == "/v1/sandboxes":
            self.http.delete(f"/v1/sandboxes/{body['id']}")
        elif case.path.endswith(("/clone", "/sandboxes/{sandbox_id}/fork")):
            for sb in body["sandboxes"]:
                self.http.delete(f"/v1/sandboxes/{sb['id']}")
        elif case.path == "/v1/envs":
            self.http.delete(f"/v1/envs/{body['session_id']}")
        elif case.path == "/v1/envs/{session_id}/fork":
            for sid in body["session_ids"]:
                self.http.delete(f"/v1/envs/{sid}")
        elif case.path in ("/v1/envs/batch/create", "/v1/envs/batch/fork"):  # items that made sessions
            made = [r["result"] for r in body["results"] if 200 <= r["status_code"] < 300]
            for sid in [m["session_id"] for m in made if "session_id" in m] + \
                    [k for m in made for k in m.get("session_ids", [])]:
                self.http.delete(f"/v1/envs/{sid}")
        elif case.path == "/v1/envs/restore":
            self.http.delete(f"/v1/envs/{body['session_id']}")


def fuzz(url: str, live: Live, include: tuple[str, ...]) -> collections.Counter:
    """Fuzz every operation whose path starts with one of ``include``; returns (operation, status) counts."""
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    stats: collections.Counter = collections.Counter()
    ops = [r.ok() for r in schema.get_all_operations()]
    ops = [op for op in ops if op.path.startswith(include)]
    assert ops
    for op in ops:
        for mode, n in EXAMPLES.items():
            @settings(max_examples=n, deadline=None, database=None, derandomize=True,
                      phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
            @given(case=op.as_strategy(generation_mode=mode), aim=st.booleans(), seed=st.integers(0, 2**16))
            def run(case, aim, seed):
                if aim:
                    live.aim(case, random.Random(seed))
                resp = case.call(base_url=url, timeout=60)
                stats[(op.label, resp.status_code)] += 1  # noqa: B023 - run() is called in this very iteration
                case.validate_response(resp, checks=CHECKS)
                live.clean_up(case, resp)

            try:
                run()
            except Unsatisfiable:  # nothing to make invalid (no parameters, no body)
                assert mode == GenerationMode.NEGATIVE
    return stats


def report(name: str, stats: collections.Counter) -> None:
    by_status = collections.Counter()
    for (_, status), n in stats.items():
        by_status[status] += n
    print(f"\n{name}: {sum(stats.values())} requests over {len({op for op, _ in stats})} operations; "
          f"statuses {dict(sorted(by_status.items()))}")
    for (op, status), n in sorted(stats.items()):
        print(f"  {op}: {status} x{n}")


def test_fuzz_the_sandbox_routes_on_a_local_backend_server(fixture_data):
    require_bwrap()
    svc = SandboxService(LocalBackend(fixture_data, server_name=f"{SERVER_NAME}-fuzz"),
                         ServiceConfig(min_idle=2, max_total=10, acquire_timeout_s=0.5, default_timeout_s=2,
                                       max_timeout_s=3, max_env_sessions=64))
    srv = UvicornThread(create_app(service=svc)).start()
    live = Live(srv.url, ["forkyard/ClueProbe-v0"])
    try:
        stats = fuzz(srv.url, live, ("/v1/sandboxes", "/v1/snapshots", "/v1/tools", "/v1/pool", "/healthz", "/metrics"))
        report("sandbox routes", stats)
        statuses = {s for _, s in stats}
        assert {200, 201, 404, 422} <= statuses  # the fuzzer reached live objects, not only 404s
        kept = {live.ids["sandbox_id"]} - {None}
        assert {s.id for s in svc.list()} <= kept  # error answers took nothing
    finally:
        live.http.close()
        srv.stop()


def test_fuzz_the_env_routes(fixture_data):
    """On an env-only server (ClueProbe; FileQA refused there) and on a full server (FileQA served from
    its own pool)."""
    require_bwrap()
    svc = SandboxService(LocalBackend(fixture_data, server_name=f"{SERVER_NAME}-fuzz-env"),
                         ServiceConfig(min_idle=1, max_total=4, acquire_timeout_s=0.5, max_env_sessions=32))
    for app, env_ids in ((create_env_app(max_sessions=32), ["forkyard/ClueProbe-v0", "forkyard/FileQA-v0"]),
                         (create_app(service=svc), ["forkyard/ClueProbe-v0", "forkyard/FileQA-v0"])):
        srv = UvicornThread(app).start()
        live = Live(srv.url, env_ids)
        try:
            stats = fuzz(srv.url, live, ("/v1/envs",))
            report(f"env routes ({app.title})", stats)
            assert {200, 201, 404, 422} <= {s for _, s in stats}
            kept = {live.ids["session_id"]} - {None}
            assert set(app.state.env_sessions._sessions) <= kept
        finally:
            live.http.close()
            srv.stop()
