"""The clients' endpoint table against the server's own OpenAPI document (a real uvicorn on loopback, local
backend), and the sync and async clients as two senders of the same table."""

from __future__ import annotations

import asyncio
import inspect
import json

import httpx
import pytest

from sandbox_server.app import create_app
from sandbox_server.backends import LocalBackend
from sandbox_server.client import ENDPOINTS, NOT_IN_CLIENT, AsyncSandboxClient, SandboxClient
from sandbox_server.errors import SandboxNotFound, ToolRefused
from sandbox_server.service import SandboxService, ServiceConfig
from tests.docker_support import SERVER_NAME, UvicornThread, require_bwrap

METHODS = {"get", "post", "put", "patch", "delete"}
ERROR_CODES = {404, 413, 422, 503}


@pytest.fixture(scope="module")
def server(fixture_data):
    require_bwrap()
    svc = SandboxService(LocalBackend(fixture_data, server_name=f"{SERVER_NAME}-table"),
                         ServiceConfig(min_idle=1, max_total=4, default_timeout_s=5, max_timeout_s=10,
                                       acquire_timeout_s=2.0))
    srv = UvicornThread(create_app(service=svc)).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def openapi(server) -> dict:
    resp = httpx.get(f"{server.url}/openapi.json", timeout=30)
    resp.raise_for_status()
    return resp.json()


def _operations(openapi: dict) -> dict[tuple[str, str], dict]:
    return {(m.upper(), path): op for path, item in openapi["paths"].items() for m, op in item.items() if m in METHODS}


def _ref_name(schema: dict | None) -> str | None:
    """The model name a schema refers to (``anyOf`` with null unwrapped; module-qualified names shortened)."""
    if not schema:
        return None
    if "anyOf" in schema:
        refs = [s for s in schema["anyOf"] if "$ref" in s]
        schema = refs[0] if len(refs) == 1 else schema
    ref = schema.get("$ref")
    return ref.rsplit("/", 1)[-1].rsplit("__", 1)[-1] if ref else None


def test_every_v1_route_is_a_table_entry(openapi):
    table = {(e.method, e.path) for e in ENDPOINTS.values()}
    v1 = {k for k in _operations(openapi) if k[1].startswith("/v1/")}
    assert v1, "the server documents no /v1 route"
    missing = v1 - table - set(NOT_IN_CLIENT)
    assert not missing, f"server routes with no client method (add an Endpoint or list in NOT_IN_CLIENT): {missing}"
    assert not set(NOT_IN_CLIENT) & table, "a route is both in the table and listed as not in the client"
    assert set(NOT_IN_CLIENT) <= v1, "NOT_IN_CLIENT lists a route the server does not have"


def test_every_table_entry_is_an_openapi_operation(openapi):
    ops = _operations(openapi)
    for name, ep in ENDPOINTS.items():
        assert ep.name == name
        op = ops.get((ep.method, ep.path))
        assert op is not None, f"{name}: {ep.method} {ep.path} is not an operation of the server"
        path_params = {p["name"] for p in op.get("parameters", []) if p["in"] == "path"}
        assert set(ep.path_params) == path_params, name
        body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
        assert _ref_name(body) == (ep.request.__name__ if ep.request else None), name
        assert (ep.body is None) == (ep.request is None), name
        ok = [c for c in op["responses"] if c.startswith("2")]
        assert len(ok) == 1, name
        content = op["responses"][ok[0]].get("content", {}).get("application/json", {})
        if ep.response is None:
            assert ok[0] == "204" and not content, name
        else:
            assert _ref_name(content.get("schema")) == ep.response.__name__, name
            if ep.field is not None:
                assert ep.field in ep.response.model_fields, name
        documented = {int(c) for c in op["responses"] if c.isdigit()} & ERROR_CODES
        assert documented <= set(ep.errors), f"{name}: errors the server documents but the docstring omits"
        assert set(ep.errors) - {503} <= documented, f"{name}: errors the server does not document"


def _public(cls) -> dict[str, object]:
    return {n: f for n, f in inspect.getmembers(cls, inspect.isfunction) if not n.startswith("_")}


def test_sync_and_async_clients_have_the_same_methods_and_signatures():
    sync, asyn = _public(SandboxClient), _public(AsyncSandboxClient)
    assert set(sync) - {"close", "data_dir"} == set(asyn) - {"aclose", "data_dir"} == set(ENDPOINTS)
    for name in ENDPOINTS:
        s, a = sync[name], asyn[name]
        assert not inspect.iscoroutinefunction(s) and inspect.iscoroutinefunction(a), name
        assert inspect.signature(s) == inspect.signature(a), name
        assert s.__doc__ == a.__doc__ == ENDPOINTS[name].doc, name
        for err in ("SandboxNotFound", "LimitExceeded", "ToolRefused"):
            code = {"SandboxNotFound": 404, "LimitExceeded": 413, "ToolRefused": 422}[err]
            assert (err in s.__doc__) == (code in ENDPOINTS[name].errors), (name, err)
        assert "ServiceUnavailable" in s.__doc__, name


CALLS = [
    ("health", {}), ("tools", {}), ("pool_status", {}), ("list", {}),
    ("create", {"cwd": "/scratch", "env": {"A": "1"}, "metadata": {"k": [1]}, "files": {"a.txt": b"\xff"}}),
    ("create", {}), ("get", {"sandbox_id": "sb1"}), ("delete", {"sandbox_id": "sb1"}),
    ("exec", {"sandbox_id": "sb1", "tool": "cat", "args": {"path": "a"}, "timeout_s": 2.5}),
    ("exec", {"sandbox_id": "sb1", "tool": "ls"}), ("write_files", {"sandbox_id": "sb1", "files": {"b": b"x"}}),
    ("update_state", {"sandbox_id": "sb1", "cwd": "/tmp"}), ("snapshot", {"sandbox_id": "sb1", "ttl_s": 60.0}),
    ("get_snapshot", {"snapshot_id": "sn1"}), ("delete_snapshot", {"snapshot_id": "sn1"}),
    ("clone", {"snapshot_id": "sn1", "n": 3}), ("fork", {"sandbox_id": "sb1"}),
]

EXPECTED = {  # the requests the hand-written clients sent before the table (method, path, JSON body, timeout)
    0: ("GET", "/healthz", None, 60.0), 1: ("GET", "/v1/tools", None, 60.0), 2: ("GET", "/v1/pool", None, 60.0),
    3: ("GET", "/v1/sandboxes", None, 60.0),
    4: ("POST", "/v1/sandboxes", {"cwd": "/scratch", "env": {"A": "1"}, "metadata": {"k": [1]},
                                  "files": {"a.txt": "/w=="}, "encoding": "base64"}, 60.0),
    5: ("POST", "/v1/sandboxes", {"cwd": None, "env": None, "metadata": None}, 60.0),
    6: ("GET", "/v1/sandboxes/sb1", None, 60.0), 7: ("DELETE", "/v1/sandboxes/sb1", None, 60.0),
    8: ("POST", "/v1/sandboxes/sb1/exec", {"tool": "cat", "args": {"path": "a"}, "timeout_s": 2.5}, 32.5),
    9: ("POST", "/v1/sandboxes/sb1/exec", {"tool": "ls", "args": {}, "timeout_s": None}, 90.0),
    10: ("PUT", "/v1/sandboxes/sb1/files", {"files": {"b": "eA=="}, "encoding": "base64"}, 60.0),
    11: ("PATCH", "/v1/sandboxes/sb1/state", {"cwd": "/tmp", "env": None, "metadata": None}, 60.0),
    12: ("POST", "/v1/sandboxes/sb1/snapshot", {"ttl_s": 60.0}, 60.0),
    13: ("GET", "/v1/snapshots/sn1", None, 60.0), 14: ("DELETE", "/v1/snapshots/sn1", None, 60.0),
    15: ("POST", "/v1/snapshots/sn1/clone", {"n": 3}, 60.0), 16: ("POST", "/v1/sandboxes/sb1/fork", {"n": 1}, 60.0),
}


def test_both_senders_send_the_same_requests_as_before():
    """Offline (httpx.MockTransport): each call sends the same request from either client; answers 404."""
    seen: list[tuple] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        seen.append((request.method, request.url.path, body, request.extensions["timeout"]["read"]))
        return httpx.Response(404, json={"detail": "no such thing", "status": "not_found"})

    http = httpx.Client(base_url="http://t", timeout=60.0, transport=httpx.MockTransport(handler))
    with SandboxClient("http://t", http=http) as sync:
        for name, kw in CALLS:
            with pytest.raises(SandboxNotFound, match="no such thing"):
                getattr(sync, name)(**kw)
    sync_seen, seen[:] = list(seen), []

    async def main():
        http = httpx.AsyncClient(base_url="http://t", timeout=60.0, transport=httpx.MockTransport(handler))
        async with AsyncSandboxClient("http://t", http=http) as c:
            for name, kw in CALLS:
                with pytest.raises(SandboxNotFound, match="no such thing"):
                    await getattr(c, name)(**kw)
    asyncio.run(main())
    assert sync_seen == seen == [EXPECTED[i] for i in range(len(CALLS))]


def test_errors_through_the_table_on_the_real_server(server):
    with SandboxClient(server.url) as c:
        assert c.health().status == "ok"
        sb = c.create(files={"q.txt": b"q"})
        try:
            assert c.exec(sb.id, "cat", {"path": "/scratch/q.txt"}).stdout == "q"
            with pytest.raises(ToolRefused):
                c.exec(sb.id, "rm", {"path": "q.txt"})
        finally:
            c.delete(sb.id)
        with pytest.raises(SandboxNotFound):
            c.get(sb.id)

    async def main():
        async with AsyncSandboxClient(server.url) as c:
            sb = await c.create()
            try:
                assert [x.id for x in await c.list()].count(sb.id) == 1
                with pytest.raises(ToolRefused):
                    await c.exec(sb.id, "rm", {"path": "q.txt"})
            finally:
                await c.delete(sb.id)
            with pytest.raises(SandboxNotFound):
                await c.delete_snapshot("no-such-snapshot")
    asyncio.run(main())
