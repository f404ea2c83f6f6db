"""Typed HTTP clients of the sandbox service: :class:`SandboxClient` (sync) and :class:`AsyncSandboxClient`.

Both are built from one endpoint table, :data:`ENDPOINTS` (in the manner of httpx's ``_client.py`` and the
E2B SDK): each :class:`Endpoint` says the HTTP method, the path template, how the JSON body is built from
the call's arguments, the request and response models (shared with the server: :mod:`sandbox_server.models`)
and which field of the response the method returns. :class:`_ClientBase` turns one entry plus the call's
arguments into a :class:`_Request`, and maps the answer (or the error) back; :class:`SandboxClient` and
:class:`AsyncSandboxClient` only send it, with ``httpx.Client`` or ``httpx.AsyncClient``. Every public
method is a one-line call into the table and takes its docstring from its entry, so both clients have the
same methods, signatures, return types and documentation.

Why one file: the table and the two senders built from it are one unit; a reader checks a method against
its table row on the same page, and a test checks both clients against the table and the OpenAPI schema.

Both have the same method names and models as :class:`sandbox_server.service.SandboxService`, and raise
the same errors: :class:`ToolRefused` (422), :class:`SandboxNotFound` (404), :class:`ServiceUnavailable`
(503, ``retry_after_s`` from ``Retry-After``; also when the server does not answer at all),
:class:`LimitExceeded` (413: a body over the server's limit, or a bounded resource that would overflow),
:class:`SandboxError` (anything else unexpected), ``PermissionError`` (401: a missing or wrong API key;
the key is ``api_key=``, else ``FORKYARD_API_KEY``). Error bodies are the server's ``ErrorBody``
``{"detail": str, "status": str}``.

Each process has its own connections (field case S59): a client made before ``os.fork`` opens a new
``httpx`` client in the child on first use and never touches (nor closes) the parent's
(:class:`envs.client_retry.PerProcess`); a client given ``http=`` cannot make another and raises
:class:`~envs.client_retry.InheritedConnectionError` in the child.
"""

from __future__ import annotations

import base64
import builtins  # the clients' list() method shadows list in their class bodies
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

import httpx
from pydantic import BaseModel

from envs.api_key import auth_headers, client_credentials, redact
from envs.client_retry import (
    BUSY_TIMEOUT_S, KEEPALIVE_EXPIRY_S, BusyWait, PerProcess, is_busy, retry_after_s, safe_to_repeat,
)

from sandbox_server.errors import LimitExceeded, SandboxError, SandboxNotFound, ServiceUnavailable, ToolRefused
from sandbox_server.models import (
    CloneRequest, CloneResponse, CreateRequest, ExecRequest, ForkRequest, Health, PoolStatus, RollbackRequest,
    SandboxInfo,
    SandboxList, SnapshotInfo, SnapshotRequest, StateUpdate, ToolList, WriteFilesRequest,
)
from sandbox_server.tools import ToolResult, ToolSpec

#: HTTP status -> the error class raised for it (503 is :class:`ServiceUnavailable`, with ``Retry-After``).
ERRORS: dict[int, type[Exception]] = {413: LimitExceeded, 422: ToolRefused, 404: SandboxNotFound}

_ERRORS_DOC = {404: "SandboxNotFound (404): no such {what}", 413: "LimitExceeded (413): {limit}",
               422: "ToolRefused (422): {refused}", 503: "ServiceUnavailable (503, or no answer): retry after "
               "``retry_after_s`` seconds"}


def _raise_for(resp: httpx.Response) -> None:
    """Raise the error that an HTTP answer of 400 or more stands for (see :data:`ERRORS`)."""
    if resp.status_code < 400:
        return
    try:
        body = resp.json()
        detail = body.get("detail") if isinstance(body, dict) else body
    except ValueError:
        detail = resp.text
    if not isinstance(detail, str):
        detail = str(detail)
    if resp.status_code in ERRORS:
        raise ERRORS[resp.status_code](detail)
    if resp.status_code == 401:
        raise PermissionError(f"HTTP 401: {detail} (set FORKYARD_API_KEY or api_key=)")
    if resp.status_code == 503:
        try:
            retry = float(resp.headers.get("Retry-After", "1"))
        except ValueError:
            retry = 1.0
        raise ServiceUnavailable(detail, retry_after_s=retry)
    raise SandboxError(f"HTTP {resp.status_code}: {detail}")


def _connection(base_url: str, api_key: str | None, own_http: bool) -> tuple[str, dict[str, str] | None]:
    """A client's base URL without user info and its default headers: the API key's (explicit, else the URL's,
    else the environment's: :func:`envs.api_key.client_credentials`, field case S60); no headers with a client of
    the caller's own (``own_http``)."""
    if own_http:
        return base_url, None
    base_url, key = client_credentials(base_url, api_key, "base_url")
    return base_url, auth_headers(key)


def _files_body(files: dict[str, bytes]) -> dict[str, Any]:
    return {"files": {k: base64.b64encode(v).decode("ascii") for k, v in files.items()}, "encoding": "base64"}


def _create_body(cwd: str | None = None, env: dict[str, str] | None = None, metadata: dict[str, Any] | None = None,
                 files: dict[str, bytes] | None = None, families: list[str] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"cwd": cwd, "env": env, "metadata": metadata}
    if families:
        body["families"] = list(families)
    if files:
        body.update(_files_body(files))
    return body


def _exec_body(tool: str, args: dict[str, Any] | None = None, timeout_s: float | None = None) -> dict[str, Any]:
    return {"tool": tool, "args": args or {}, "timeout_s": timeout_s}


def _exec_wait(timeout_s: float | None = None, **_: Any) -> float:
    """HTTP timeout of a tool call: its own ``timeout_s`` (60 s when unset or unusable) plus 30 s."""
    return (timeout_s if isinstance(timeout_s, (int, float)) and 0 < timeout_s < 1e6 else 60.0) + 30.0


@dataclass(frozen=True)
class Endpoint:
    """One operation of the HTTP API, as the clients call it.

    ``path`` is a template whose ``{names}`` are filled from the call's arguments of those names;
    ``body`` builds the JSON body from the other arguments (``None``: no body); ``request`` is the server's
    model of that body (for the record and the contract test: the client sends plain JSON and lets the
    server refuse what it refuses); ``response`` is the model the answer is parsed into (``None``: the answer
    has no body, the method returns ``None``) and ``field`` the attribute of it the method returns
    (``None``: the whole model); ``timeout`` the HTTP timeout in seconds from the arguments (``None``: the
    client's ``timeout_s``); ``errors`` the HTTP statuses the operation can answer besides success, with the
    docstring's words for each."""

    name: str
    method: str
    path: str
    summary: str
    response: type[BaseModel] | None = None
    field: str | None = None
    body: Callable[..., dict[str, Any]] | None = None
    request: type[BaseModel] | None = None
    timeout: Callable[..., float] | None = None
    errors: tuple[int, ...] = (503,)
    returns: str = ""
    words: tuple[tuple[str, str], ...] = ()

    @property
    def path_params(self) -> tuple[str, ...]:
        return tuple(p.split("}")[0] for p in self.path.split("{")[1:])

    @property
    def doc(self) -> str:
        """The docstring of the methods of this entry (sync and async alike)."""
        words = dict(self.words)
        lines = [self.summary, "", f"``{self.method} {self.path}``."]
        if self.returns:
            lines.append(f"Returns {self.returns}.")
        lines += ["", "Raises:"]
        for status in self.errors:
            lines.append("    " + _ERRORS_DOC[status].format(
                what=words.get("what", "sandbox"), limit=words.get("limit", "a body over the server's limit"),
                refused=words.get("refused", "the server refused the request")))
        lines.append("    SandboxError: any other unexpected answer.")
        return "\n".join(lines)


_SB = ("what", "sandbox (ended, replaced or never created)")
_SNAP = ("what", "snapshot (deleted, expired or never taken)")

#: The endpoint table: every operation of the client, in one place. Keys are the client's method names.
ENDPOINTS: dict[str, Endpoint] = {e.name: e for e in [
    Endpoint("health", "GET", "/healthz", "Whether the server is up and its backend and warm pool are healthy.",
             Health, returns="``Health`` (``status`` ``ok`` or ``degraded``, the backend's name, why"
             " degraded)"),
    Endpoint("tools", "GET", "/v1/tools", "The tool whitelist: each tool's name, ordered parameters and JSON schema.",
             ToolList, field="tools", returns="the list of ``ToolSpec``"),
    Endpoint("pool_status", "GET", "/v1/pool", "Warm pool sizes and limits (counts of sandboxes).", PoolStatus,
             returns="``PoolStatus``"),
    Endpoint("create", "POST", "/v1/sandboxes", "Take a warm sandbox for a new session.\n\n``cwd``: working "
             "directory; ``env``: environment variables; ``metadata``: free JSON kept with the session (and "
             "copied into snapshots, clones and forks); ``files``: relative path under /scratch -> content "
             "(bytes, sent base64); ``families``: opt-in tool families (``['workspace']``).", SandboxInfo,
             body=_create_body, request=CreateRequest,
             errors=(413, 422, 503), returns="the new sandbox's ``SandboxInfo``",
             words=(("limit", "files or metadata over the server's limits, or the pool is at its maximum"),
                    ("refused", "an invalid cwd, env, metadata or file path"))),
    Endpoint("get", "GET", "/v1/sandboxes/{sandbox_id}", "One session's state.", SandboxInfo, errors=(404, 503),
             returns="its ``SandboxInfo``", words=(_SB,)),
    Endpoint("list", "GET", "/v1/sandboxes", "Every live session.", SandboxList, field="sandboxes",
             returns="the list of ``SandboxInfo``"),
    Endpoint("delete", "DELETE", "/v1/sandboxes/{sandbox_id}", "End a session; its sandbox is destroyed and "
             "replaced in the pool.", errors=(404, 503), returns="``None``", words=(_SB,)),
    Endpoint("exec", "POST", "/v1/sandboxes/{sandbox_id}/exec", "Run one whitelisted tool call in the sandbox."
             "\n\n``tool``: the tool's name (see :meth:`tools`); ``args``: its arguments by name; ``timeout_s``: "
             "its time limit in seconds (``None``: the server's default; capped at the server's maximum). The "
             "HTTP call waits that limit plus 30 s (60 s + 30 s when unset).", ToolResult, body=_exec_body,
             request=ExecRequest, timeout=_exec_wait, errors=(404, 413, 422, 503),
             returns="the ``ToolResult`` (status, stdout, stderr, exit code, ``duration_s`` in seconds)",
             words=(_SB, ("limit", "a body over the server's limit"),
                    ("refused", "an unknown tool, bad arguments or a path outside the sandbox; nothing ran"))),
    Endpoint("write_files", "PUT", "/v1/sandboxes/{sandbox_id}/files", "Write per-episode files under /scratch "
             "(server-side; not a tool).\n\n``files``: relative path under /scratch -> content (bytes, sent "
             "base64).", body=lambda files: _files_body(files), request=WriteFilesRequest,
             errors=(404, 413, 422, 503), returns="``None``",
             words=(_SB, ("limit", "files over the server's size limits"), ("refused", "an invalid file path"))),
    Endpoint("update_state", "PATCH", "/v1/sandboxes/{sandbox_id}/state", "Set the working directory, "
             "environment variables or metadata of a session (``None``: left as it is).", SandboxInfo,
             body=lambda cwd=None, env=None, metadata=None: {"cwd": cwd, "env": env, "metadata": metadata},
             request=StateUpdate, errors=(404, 413, 422, 503), returns="the updated ``SandboxInfo``",
             words=(_SB, ("limit", "metadata over the server's limit"),
                    ("refused", "an invalid cwd, env or metadata"))),
    Endpoint("snapshot", "POST", "/v1/sandboxes/{sandbox_id}/snapshot", "Capture /scratch, /tmp and the session "
             "state as a stored snapshot.\n\n``ttl_s``: how long the server keeps it, in seconds (``None``: the "
             "server's default).", SnapshotInfo, body=lambda ttl_s=None: {"ttl_s": ttl_s}, request=SnapshotRequest,
             errors=(404, 413, 422, 503), returns="the ``SnapshotInfo`` (id, ``size_bytes``, expiry)",
             words=(_SB, ("limit", "the snapshot store is full"), ("refused", "an invalid ttl_s"))),
    Endpoint("get_snapshot", "GET", "/v1/snapshots/{snapshot_id}", "A stored snapshot's info.", SnapshotInfo,
             errors=(404, 503), returns="its ``SnapshotInfo``", words=(_SNAP,)),
    Endpoint("delete_snapshot", "DELETE", "/v1/snapshots/{snapshot_id}", "Forget a snapshot.", errors=(404, 503),
             returns="``None``", words=(_SNAP,)),
    Endpoint("clone", "POST", "/v1/snapshots/{snapshot_id}/clone", "``n`` new independent sandboxes restored to "
             "the snapshot (all or none).", CloneResponse, field="sandboxes", body=lambda n=1: {"n": n},
             request=CloneRequest, errors=(404, 413, 422, 503), returns="the list of the new ``SandboxInfo``",
             words=(_SNAP, ("limit", "n more sandboxes than the pool may hold"), ("refused", "an invalid n"))),
    Endpoint("rollback", "POST", "/v1/sandboxes/{sandbox_id}/rollback", "Put the sandbox back, in place, to a "
             "stored snapshot: its files and its state.", SandboxInfo,
             body=lambda snapshot_id: {"snapshot_id": snapshot_id}, request=RollbackRequest, errors=(404, 422, 503),
             returns="the sandbox's ``SandboxInfo``", words=(_SB, ("refused", "an invalid snapshot id"))),
    Endpoint("fork", "POST", "/v1/sandboxes/{sandbox_id}/fork", "Snapshot + clone in one call: ``n`` independent "
             "copies of the sandbox (all or none).", CloneResponse, field="sandboxes", body=lambda n=1: {"n": n},
             request=ForkRequest, errors=(404, 413, 422, 503), returns="the list of the new ``SandboxInfo``",
             words=(_SB, ("limit", "n more sandboxes than the pool may hold"), ("refused", "an invalid n"))),
]}

_ENV_API = ("the gymnasium-style env API (sandbox_server/routes/envs.py); its client is envs.remote.RemoteEnv, "
            "an env, not a sandbox client")

_ENV_BATCH_API = ("the batched env API (sandbox_server/routes/envs.py); its client is envs.RemoteVectorEnv, a "
                  "Gymnasium vector env, not a sandbox client")

#: Server routes under /v1 that these clients intentionally do not call, and why. (``/healthz`` is in the
#: table although outside /v1; ``/metrics`` is Prometheus text for scrapers, not a client method.)
NOT_IN_CLIENT: dict[tuple[str, str], str] = {
    ("GET", "/v1/envs"): _ENV_API,
    ("POST", "/v1/envs"): _ENV_API,
    ("GET", "/v1/envs/{session_id}"): _ENV_API,
    ("DELETE", "/v1/envs/{session_id}"): _ENV_API,
    ("POST", "/v1/envs/{session_id}/reset"): _ENV_API,
    ("POST", "/v1/envs/{session_id}/step"): _ENV_API,
    ("POST", "/v1/envs/{session_id}/fork"): _ENV_API,
    ("GET", "/v1/envs/{session_id}/tools"): _ENV_API,
    ("POST", "/v1/envs/{session_id}/snapshot"): _ENV_API,
    ("POST", "/v1/envs/restore"): _ENV_API,
    **{("POST", f"/v1/envs/batch/{r}"): _ENV_BATCH_API for r in ("create", "reset", "step", "fork", "delete")},
    ("POST", "/v1/envs/batch/renew"): "env-session leases, renewed by the env clients' own thread "
                                      "(envs/session_lease.py)",
}


@dataclass(frozen=True)
class _Request:
    """One HTTP request built from a table entry: what the senders pass to ``httpx``."""

    method: str
    url: str
    kwargs: dict[str, Any]


F = TypeVar("F", bound=Callable[..., Any])


def _op(name: str) -> Callable[[F], F]:
    """Mark a client method as the table entry ``name``: it takes the entry's docstring."""
    def deco(fn: F) -> F:
        fn.__doc__ = ENDPOINTS[name].doc
        return fn
    return deco


class _ClientBase:
    """What the sync and async clients share: building a request from a table entry, parsing the answer."""

    timeout_s: float

    @property
    def http(self) -> httpx.Client | httpx.AsyncClient:
        """This process's HTTP client (each subclass says which kind)."""
        raise NotImplementedError

    @staticmethod
    def _build(name: str, args: dict[str, Any]) -> _Request:
        ep = ENDPOINTS[name]
        params = ep.path_params
        url = ep.path.format(**{p: args[p] for p in params})
        rest = {k: v for k, v in args.items() if k not in params}
        kwargs: dict[str, Any] = {}
        if ep.body is not None:
            kwargs["json"] = ep.body(**rest)
        if ep.timeout is not None:
            kwargs["timeout"] = ep.timeout(**rest)
        return _Request(ep.method, url, kwargs)

    @staticmethod
    def _parse(name: str, resp: httpx.Response) -> Any:
        _raise_for(resp)
        ep = ENDPOINTS[name]
        if ep.response is None:
            return None
        model = ep.response.model_validate(resp.json())
        return getattr(model, ep.field) if ep.field else model

    @staticmethod
    def _busy(resp: httpx.Response) -> float | None:
        """Seconds to wait before sending again when ``resp`` is a ``503 unavailable`` (nothing ran); else None."""
        if resp.status_code != 503:
            return None
        try:
            body = resp.json()
        except ValueError:
            return None
        status = body.get("status") if isinstance(body, dict) else None
        return retry_after_s(resp.headers.get("Retry-After")) if is_busy(503, status) else None

    @staticmethod
    def _repeat(req: "_Request", exc: httpx.TransportError, repeated: bool) -> bool:
        """Whether to send ``req`` once more after ``exc``: never twice, and only when the request may have
        reached the server with no answer and repeating it is safe (:func:`envs.client_retry.safe_to_repeat`)."""
        no_answer = isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError))
        return not repeated and no_answer and safe_to_repeat(req.method, req.url)

    @staticmethod
    def _unavailable(exc: httpx.TransportError) -> ServiceUnavailable:
        return ServiceUnavailable(redact(f"the sandbox server did not answer: {exc}"), retry_after_s=1.0)

    @property
    def name(self) -> str:
        """The server's base URL (what the sandboxes run on, as ``envs.sandbox.SandboxProvider`` names it), without
        user info."""
        return redact(str(self.http.base_url))

    @staticmethod
    def _local_corpus() -> str:
        from sandbox_server.corpus import ensure_corpus
        from sandbox_server.settings import corpus_dir

        return ensure_corpus(corpus_dir())


class SandboxClient(_ClientBase):
    """Synchronous client. ``base_url`` like ``http://127.0.0.1:8000``; ``timeout_s``: HTTP timeout in seconds
    for calls without their own deadline (tool calls wait their ``timeout_s`` plus 30 s); ``api_key``: the
    server's key (default ``FORKYARD_API_KEY`` / ``FORKYARD_API_KEY_FILE``, :mod:`envs.api_key`);
    ``busy_timeout_s``: seconds to keep retrying calls answered ``503 unavailable`` (nothing ran), honouring
    ``Retry-After`` (:mod:`envs.client_retry`; 0: never). A call whose connection closed with no answer is
    sent once more when that is safe (reads, deletes, read-only tool calls). ``http``: a client of your own
    (then ``api_key`` is not added to it). A key in ``base_url``'s user info is sent as the header, the URL kept
    without it. Raises ValueError for a key (or URL user info) :func:`envs.api_key.client_credentials` refuses."""

    def __init__(self, base_url: str, timeout_s: float = 60.0, http: httpx.Client | None = None, *,
                 api_key: str | None = None, busy_timeout_s: float = BUSY_TIMEOUT_S):
        base_url, headers = _connection(base_url, api_key, http is not None)
        self._http = PerProcess(None if http else lambda: httpx.Client(
            base_url=base_url, timeout=timeout_s, headers=headers,
            limits=httpx.Limits(keepalive_expiry=KEEPALIVE_EXPIRY_S)), http, "this SandboxClient's http= client")
        self.timeout_s = timeout_s
        BusyWait(busy_timeout_s)  # validates it
        self.busy_timeout_s = busy_timeout_s

    @property
    def http(self) -> httpx.Client:
        """This process's ``httpx.Client`` (module docstring: a fork child opens its own)."""
        return self._http.get()

    def close(self) -> None:
        """Close this process's HTTP connections (in a fork child, the parent's are left untouched)."""
        http = self._http.owned()
        if http is not None:
            http.close()

    def __enter__(self) -> "SandboxClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def data_dir(self) -> str:
        """This host's corpus (``settings.corpus_dir()``), built on first use. A server cannot hand its
        ``/data`` over HTTP: an env that generates questions from it checks the manifest against the
        sandbox's own and refuses a mismatch."""
        return self._local_corpus()

    def _call(self, name: str, **args: Any) -> Any:
        req = self._build(name, args)
        busy, repeated = None, False
        while True:
            try:
                resp = self.http.request(req.method, req.url, **req.kwargs)
            except httpx.TransportError as exc:
                if self._repeat(req, exc, repeated):
                    repeated = True
                    continue
                raise self._unavailable(exc) from None
            wait = self._busy(resp)
            if wait is not None:
                busy = busy or BusyWait(self.busy_timeout_s)
                if busy.wait(wait):
                    continue
            if repeated and req.method == "DELETE" and resp.status_code == 404:
                return None  # the first delete ran before its connection closed: done
            return self._parse(name, resp)

    @_op("health")
    def health(self) -> Health:
        return self._call("health")

    @_op("tools")
    def tools(self) -> list[ToolSpec]:
        return self._call("tools")

    @_op("pool_status")
    def pool_status(self) -> PoolStatus:
        return self._call("pool_status")

    @_op("create")
    def create(self, cwd: str | None = None, env: dict[str, str] | None = None, metadata: dict[str, Any] | None = None,
               files: dict[str, bytes] | None = None, families: list[str] | None = None) -> SandboxInfo:
        return self._call("create", cwd=cwd, env=env, metadata=metadata, files=files, families=families)

    @_op("get")
    def get(self, sandbox_id: str) -> SandboxInfo:
        return self._call("get", sandbox_id=sandbox_id)

    @_op("list")
    def list(self) -> list[SandboxInfo]:
        return self._call("list")

    @_op("delete")
    def delete(self, sandbox_id: str) -> None:
        return self._call("delete", sandbox_id=sandbox_id)

    @_op("exec")
    def exec(self, sandbox_id: str, tool: str, args: dict[str, Any] | None = None,
             timeout_s: float | None = None) -> ToolResult:
        return self._call("exec", sandbox_id=sandbox_id, tool=tool, args=args, timeout_s=timeout_s)

    @_op("write_files")
    def write_files(self, sandbox_id: str, files: dict[str, bytes]) -> None:
        return self._call("write_files", sandbox_id=sandbox_id, files=files)

    @_op("update_state")
    def update_state(self, sandbox_id: str, cwd: str | None = None, env: dict[str, str] | None = None,
                     metadata: dict[str, Any] | None = None) -> SandboxInfo:
        return self._call("update_state", sandbox_id=sandbox_id, cwd=cwd, env=env, metadata=metadata)

    @_op("snapshot")
    def snapshot(self, sandbox_id: str, ttl_s: float | None = None) -> SnapshotInfo:
        return self._call("snapshot", sandbox_id=sandbox_id, ttl_s=ttl_s)

    @_op("get_snapshot")
    def get_snapshot(self, snapshot_id: str) -> SnapshotInfo:
        return self._call("get_snapshot", snapshot_id=snapshot_id)

    @_op("delete_snapshot")
    def delete_snapshot(self, snapshot_id: str) -> None:
        return self._call("delete_snapshot", snapshot_id=snapshot_id)

    @_op("clone")
    def clone(self, snapshot_id: str, n: int = 1) -> builtins.list[SandboxInfo]:
        return self._call("clone", snapshot_id=snapshot_id, n=n)

    @_op("fork")
    def fork(self, sandbox_id: str, n: int = 1) -> builtins.list[SandboxInfo]:
        return self._call("fork", sandbox_id=sandbox_id, n=n)

    @_op("rollback")
    def rollback(self, sandbox_id: str, snapshot_id: str) -> SandboxInfo:
        return self._call("rollback", sandbox_id=sandbox_id, snapshot_id=snapshot_id)


class AsyncSandboxClient(_ClientBase):
    """Asynchronous client with the same methods as :class:`SandboxClient` (each a coroutine)."""

    def __init__(self, base_url: str, timeout_s: float = 60.0, http: httpx.AsyncClient | None = None, *,
                 api_key: str | None = None, busy_timeout_s: float = BUSY_TIMEOUT_S):
        base_url, headers = _connection(base_url, api_key, http is not None)
        self._http = PerProcess(None if http else lambda: httpx.AsyncClient(
            base_url=base_url, timeout=timeout_s, headers=headers,
            limits=httpx.Limits(keepalive_expiry=KEEPALIVE_EXPIRY_S)), http, "this AsyncSandboxClient's http= client")
        self.timeout_s = timeout_s
        BusyWait(busy_timeout_s)  # validates it
        self.busy_timeout_s = busy_timeout_s

    @property
    def http(self) -> httpx.AsyncClient:
        """This process's ``httpx.AsyncClient`` (module docstring: a fork child opens its own)."""
        return self._http.get()

    async def aclose(self) -> None:
        """Close this process's HTTP connections (in a fork child, the parent's are left untouched)."""
        http = self._http.owned()
        if http is not None:
            await http.aclose()

    async def __aenter__(self) -> "AsyncSandboxClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def data_dir(self) -> str:
        """This host's corpus (``settings.corpus_dir()``), built on first use (see :meth:`SandboxClient.data_dir`)."""
        import anyio

        return await anyio.to_thread.run_sync(self._local_corpus)

    async def _call(self, name: str, **args: Any) -> Any:
        req = self._build(name, args)
        busy, repeated = None, False
        while True:
            try:
                resp = await self.http.request(req.method, req.url, **req.kwargs)
            except httpx.TransportError as exc:
                if self._repeat(req, exc, repeated):
                    repeated = True
                    continue
                raise self._unavailable(exc) from None
            wait = self._busy(resp)
            if wait is not None:
                busy = busy or BusyWait(self.busy_timeout_s)
                if await busy.wait_async(wait):
                    continue
            if repeated and req.method == "DELETE" and resp.status_code == 404:
                return None  # the first delete ran before its connection closed: done
            return self._parse(name, resp)

    @_op("health")
    async def health(self) -> Health:
        return await self._call("health")

    @_op("tools")
    async def tools(self) -> list[ToolSpec]:
        return await self._call("tools")

    @_op("pool_status")
    async def pool_status(self) -> PoolStatus:
        return await self._call("pool_status")

    @_op("create")
    async def create(self, cwd: str | None = None, env: dict[str, str] | None = None,
                     metadata: dict[str, Any] | None = None, files: dict[str, bytes] | None = None,
                     families: list[str] | None = None) -> SandboxInfo:
        return await self._call("create", cwd=cwd, env=env, metadata=metadata, files=files, families=families)

    @_op("get")
    async def get(self, sandbox_id: str) -> SandboxInfo:
        return await self._call("get", sandbox_id=sandbox_id)

    @_op("list")
    async def list(self) -> list[SandboxInfo]:
        return await self._call("list")

    @_op("delete")
    async def delete(self, sandbox_id: str) -> None:
        return await self._call("delete", sandbox_id=sandbox_id)

    @_op("exec")
    async def exec(self, sandbox_id: str, tool: str, args: dict[str, Any] | None = None,
                   timeout_s: float | None = None) -> ToolResult:
        return await self._call("exec", sandbox_id=sandbox_id, tool=tool, args=args, timeout_s=timeout_s)

    @_op("write_files")
    async def write_files(self, sandbox_id: str, files: dict[str, bytes]) -> None:
        return await self._call("write_files", sandbox_id=sandbox_id, files=files)

    @_op("update_state")
    async def update_state(self, sandbox_id: str, cwd: str | None = None, env: dict[str, str] | None = None,
                           metadata: dict[str, Any] | None = None) -> SandboxInfo:
        return await self._call("update_state", sandbox_id=sandbox_id, cwd=cwd, env=env, metadata=metadata)

    @_op("snapshot")
    async def snapshot(self, sandbox_id: str, ttl_s: float | None = None) -> SnapshotInfo:
        return await self._call("snapshot", sandbox_id=sandbox_id, ttl_s=ttl_s)

    @_op("get_snapshot")
    async def get_snapshot(self, snapshot_id: str) -> SnapshotInfo:
        return await self._call("get_snapshot", snapshot_id=snapshot_id)

    @_op("delete_snapshot")
    async def delete_snapshot(self, snapshot_id: str) -> None:
        return await self._call("delete_snapshot", snapshot_id=snapshot_id)

    @_op("clone")
    async def clone(self, snapshot_id: str, n: int = 1) -> builtins.list[SandboxInfo]:
        return await self._call("clone", snapshot_id=snapshot_id, n=n)

    @_op("fork")
    async def fork(self, sandbox_id: str, n: int = 1) -> builtins.list[SandboxInfo]:
        return await self._call("fork", sandbox_id=sandbox_id, n=n)

    @_op("rollback")
    async def rollback(self, sandbox_id: str, snapshot_id: str) -> SandboxInfo:
        return await self._call("rollback", sandbox_id=sandbox_id, snapshot_id=snapshot_id)
