"""Pydantic models of every request and response of the HTTP API (sandbox routes, env routes) and of the
in-process sandbox service. Each model is declared here once, so the OpenAPI schema names each once; the
answers of env sessions that clients decode too (``ErrorBody``, ``ResetResponse``, ``StepResponse``,
``ForkResponse``, ``EnvSnapshotResponse``) are declared in :mod:`envs.wire`, shared with the clients, and
re-exported here.

Why one file: the models are the API's one vocabulary (the server, both clients and the OpenAPI schema read
them here), and a model split from the models it nests would be declared twice or imported in a circle.

Request models derive from :class:`RequestModel`: strict types (a JSON ``true`` is not an integer and
``2.0`` is not one either; an integer is accepted for a float), unknown fields refused, numbers finite
(no ``NaN`` / ``Infinity``, which Python's JSON parser takes), and every string valid Unicode (no lone
surrogates such as ``"\\ud800"``, which could not be answered back as UTF-8). A request that breaks any
of these is answered 422 before anything runs.
"""

from __future__ import annotations

import base64
import json
import math
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel, ConfigDict, Field, ValidationError, ValidatorFunctionWrapHandler, field_validator, model_validator,
)

from envs.wire import EnvSnapshotResponse, ErrorBody, ForkResponse, ResetResponse, StepResponse
from sandbox_server.tools import ToolResult, ToolSpec

#: Most sandboxes (or env sessions) one clone / fork request may make.
MAX_CLONES = 64
#: Longest tool name an exec request may carry (longer ones cannot be a whitelisted tool).
MAX_TOOL_NAME_CHARS = 64


def _check_str(text: str) -> None:
    if not text.isascii():  # O(1) for ASCII strings: the common case costs nothing
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"{text[:40]!r} is not valid Unicode (it holds a lone surrogate)") from None


def _check_float(x: float) -> None:
    if not math.isfinite(x):
        raise ValueError(f"{x} is not a JSON number (NaN, Infinity and numbers past the float range are refused)")


#: Deepest nesting a request body may have (objects and arrays): deeper values could not be answered
#: back (the JSON encoder stops at 255 levels) or copied without exhausting the stack.
MAX_JSON_DEPTH = 32
#: Most bytes a session's free-form metadata may take as JSON (it is copied into every snapshot and clone).
MAX_METADATA_BYTES = 64 << 10


def _check_json(value: Any) -> None:
    """Raise ValueError if any string (or dict key) in a parsed JSON value holds a lone surrogate, a
    number is not finite (Python's parser takes ``NaN``, ``Infinity`` and ``1e400``, which JSON has not),
    or the value nests deeper than :data:`MAX_JSON_DEPTH`.

    Iterative, so a deeply nested value cannot exhaust the stack."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if type(v) in (dict, list) and depth > MAX_JSON_DEPTH:
            raise ValueError(f"the body nests objects and arrays deeper than {MAX_JSON_DEPTH} levels")
        if type(v) is str:
            _check_str(v)
        elif type(v) is dict:
            for k, x in v.items():
                if type(k) is str:
                    _check_str(k)
                if type(x) is str:
                    _check_str(x)
                elif type(x) is float:
                    _check_float(x)
                elif type(x) in (dict, list):
                    stack.append((x, depth + 1))
        elif type(v) is list:
            stack.extend((x, depth + 1) for x in v)
        elif type(v) is float:
            _check_float(v)


class RequestModel(BaseModel):
    """Base of every request body: strict types, no unknown fields, finite numbers, valid Unicode and at
    most :data:`MAX_JSON_DEPTH` levels of nesting (anywhere in it, free-form ``metadata`` / ``kwargs`` /
    ``options`` included)."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _valid_json(cls, data: Any) -> Any:
        _check_json(data)
        return data


class SessionState(BaseModel):
    """The non-filesystem state of a sandbox: working directory, environment variables, free metadata, and the
    opt-in tool families it was created with (``sandbox_server.tools.OPT_IN_FAMILIES``: ``workspace``,
    ``interpreter``; kept by its snapshots, clones and forks)."""

    cwd: str = "/data"
    env: dict[str, str] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)
    families: list[str] = Field(default_factory=list)

    @field_validator("metadata")
    @classmethod
    def _plain_json(cls, value: dict[str, Any]) -> dict[str, Any]:
        _check_json(value)  # in-process callers too: a value the HTTP API could not answer back is refused
        size = len(json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass"))
        if size > MAX_METADATA_BYTES:  # it is copied into every snapshot, clone and fork
            raise ValueError(f"metadata takes {size} bytes as JSON; the limit is {MAX_METADATA_BYTES}")
        return value


class CreateRequest(RequestModel):
    """``POST /v1/sandboxes``: optional initial state and per-episode files (see :class:`WriteFilesRequest`)."""

    cwd: str | None = None
    env: dict[str, str] | None = None
    metadata: dict[str, Any] | None = None
    families: list[str] | None = Field(default=None, description="opt-in tool families: ['workspace'] for the tools "
                                       "that write the workspace and run code in it")
    files: dict[str, str] | None = Field(default=None, description="relative path under /scratch -> content")
    encoding: Literal["utf-8", "base64"] = "utf-8"


class SandboxInfo(BaseModel):
    """A live sandbox: its id, backend, state and times (seconds since the epoch)."""

    id: str
    backend: str
    state: SessionState
    created_at: float
    last_used_at: float
    idle_ttl_s: float


class SandboxList(BaseModel):
    sandboxes: list[SandboxInfo]


class ExecRequest(RequestModel):
    """``POST /v1/sandboxes/{id}/exec``: ``{"tool": "cat", "args": {"path": "x"}, "timeout_s": 5}``."""

    tool: str = Field(max_length=MAX_TOOL_NAME_CHARS)
    args: dict[str, Any] = Field(default_factory=dict)
    timeout_s: float | None = Field(default=None, description="per-call deadline in seconds (clamped to the maximum)")


class WriteFilesRequest(RequestModel):
    """``PUT /v1/sandboxes/{id}/files``: ``files`` maps a path relative to /scratch to its content."""

    files: dict[str, str]
    encoding: Literal["utf-8", "base64"] = "utf-8"

    def decoded(self) -> dict[str, bytes]:
        """The files as bytes. Raises ValueError on bad base64."""
        if self.encoding == "base64":
            return {k: base64.b64decode(v, validate=True) for k, v in self.files.items()}
        return {k: v.encode("utf-8") for k, v in self.files.items()}


class StateUpdate(RequestModel):
    """``PATCH /v1/sandboxes/{id}/state``: fields given replace the current ones."""

    cwd: str | None = None
    env: dict[str, str] | None = None
    metadata: dict[str, Any] | None = None


class SnapshotRequest(RequestModel):
    """``POST /v1/sandboxes/{id}/snapshot``."""

    ttl_s: float | None = Field(default=None, gt=0, description="seconds the snapshot is kept (default: server's)")


class SnapshotInfo(BaseModel):
    """A stored snapshot: the tar of /scratch and /tmp (``size_bytes``) plus the session state."""

    id: str
    source_sandbox: str
    size_bytes: int
    state: SessionState
    created_at: float
    expires_at: float


class CloneRequest(RequestModel):
    """``POST /v1/snapshots/{id}/clone``: how many sandboxes to restore from the snapshot."""

    n: int = Field(default=1, ge=1, le=MAX_CLONES, description="number of clones")


class ForkRequest(RequestModel):
    """``POST /v1/sandboxes/{id}/fork`` and ``POST /v1/envs/{id}/fork``: how many copies to make."""

    n: int = Field(default=1, ge=1, le=MAX_CLONES, description="number of copies")


class RollbackRequest(RequestModel):
    """``POST /v1/sandboxes/{id}/rollback``: the stored snapshot to put the sandbox back to."""

    snapshot_id: str = Field(max_length=64, description="a snapshot of this server (POST /v1/sandboxes/{id}/snapshot)")


class CloneResponse(BaseModel):
    snapshot_id: str | None = None
    sandboxes: list[SandboxInfo]
    duration_s: float


class PoolStatus(BaseModel):
    """Pool sizes and limits. ``starting`` counts containers being started now."""

    backend: str
    idle: int
    busy: int
    starting: int
    min_idle: int
    max_total: int
    max_concurrent_starts: int
    sessions: int
    snapshots: int
    last_error: str | None = None


class EnvSessionGroup(BaseModel):
    """The env sessions of one env id made over one transport (field case S63)."""

    env_id: str = Field(description="the registered env id")
    transport: str = Field(description="the transport that made them: rest (/v1/envs) or openenv (WebSocket)")
    open: int = Field(description="sessions held now")
    expired: int = Field(description="sessions closed after their idle TTL since the server started")


class EnvSessionCounts(BaseModel):
    """What a server's env sessions hold, in every server mode (field case S63); no session id."""

    open: int = Field(description="env sessions held now")
    connection_held: int = Field(description="of those, the ones an open connection holds (never expired while "
                                             "it is open)")
    in_use: int = Field(description="envs counted against the cap (sessions, ones being made, held elsewhere)")
    max_sessions: int = Field(description="the cap (FORKYARD_MAX_ENV_SESSIONS)")
    expired: int = Field(description="sessions closed after their idle TTL since the server started")
    refused: int = Field(description="creates and forks refused at the cap since the server started")
    groups: list[EnvSessionGroup] = Field(description="by env id and transport")


class Health(BaseModel):
    """``/healthz`` of the full server: its backend's health and its env sessions."""

    status: Literal["ok", "degraded"]
    backend: str
    detail: str = ""
    env_sessions: int = Field(0, description="env sessions held now")
    env_session_counts: EnvSessionCounts | None = Field(None, description="the env sessions in detail (None: a "
                                                                          "server older than this field)")


class ToolList(BaseModel):
    tools: list[ToolSpec]
    default_timeout_s: float
    max_timeout_s: float
    output_cap_bytes: int


# ------------------------------------------------------------------------------------------ env sessions
class EnvSettingInfo(BaseModel):
    """One constructor setting of a registered env (``envs.catalog.Setting``)."""

    name: str = Field(description="the kwarg's name")
    default: Any = Field(description="the registered default, else the constructor's (null when required)")
    required: bool = Field(description="no default: a client must give it")
    doc: str = Field(description="what it sets, from the env's docstring")


class EnvSpecInfo(BaseModel):
    """One registered env (``GET /v1/envs``): its card in the catalog (``envs.catalog.EnvCard``; the classes are
    read, no env is built, so tools are listed per session at ``GET /v1/envs/{session_id}/tools``)."""

    env_id: str = Field(description="id to pass to POST /v1/envs or gymnasium.make")
    kwargs: dict[str, Any] = Field(description="default constructor kwargs")
    summary: str = Field(default="", description="what the env is, in a line")
    settings: list[EnvSettingInfo] = Field(default_factory=list, description="the constructor's settings")
    max_turns: int | None = Field(default=None, description="the default turn budget")
    fork_method: str | None = Field(default=None, description="how fork / snapshot copy the env's state: "
                                                              "state_codec, deepcopy, replay or sandbox")
    sandboxed: bool = Field(default=False, description="the env's tools run in a sandbox of the server's pool")
    finite_actions: bool = Field(default=False, description="a finite action vocabulary (beside the per-turn "
                                                            "info.legal_actions menu every env offers)")
    demonstrator: bool = Field(default=False, description="a scripted demonstrator (demo_action)")
    evaluation_resets: bool = Field(default=False, description="the env declares its evaluation resets")
    note: str = Field(default="", description='"" or why something is unknown (e.g. "needs package X")')


class ToolsResponse(BaseModel):
    """``GET /v1/envs/{session_id}/tools``: the env's tools in the OpenAI / Hugging Face ``tools=`` format
    (``envs.tool_calls``); empty for an env that declares none."""

    tools: list[dict[str, Any]] = Field(description='[{"type": "function", "function": {"name", "description", '
                                                    '"parameters": JSON schema}}]')


class CreateEnvRequest(RequestModel):
    """``POST /v1/envs``."""

    env_id: str = Field(description="a registered forkyard env id, e.g. forkyard/ClueProbe-v0", max_length=200)
    kwargs: dict[str, Any] = Field(default_factory=dict, description="constructor kwargs (JSON values)")
    seed: int | None = Field(default=None, ge=0, description="reset seed (a non-negative integer)")
    options: dict[str, Any] | None = Field(default=None, description="reset options")


class ResetRequest(RequestModel):
    """``POST /v1/envs/{session_id}/reset``."""

    seed: int | None = Field(default=None, ge=0, description="reset seed (a non-negative integer)")
    options: dict[str, Any] | None = Field(default=None, description="reset options")


#: What a step's ``action`` may be: read by the env with the one reader of tool calls (field case S62).
ACTION_HELP = ("one action: forkyard's name(args) text such as probe(2) or probe(k=2), a model's reply holding one "
               "tool call (<tool_call>{...}</tool_call>, bare JSON), or a JSON call object such as "
               '{"name": "probe", "arguments": {"k": 2}}')


class StepRequest(RequestModel):
    """``POST /v1/envs/{session_id}/step``."""

    action: str | dict[str, Any] | list[Any] = Field(description=ACTION_HELP)


class RestoreEnvRequest(RequestModel):
    """``POST /v1/envs/restore``: a new session at the state a snapshot token holds."""

    snapshot: str = Field(description="a token from POST /v1/envs/{session_id}/snapshot (or the OpenEnv "
                                      "transport's snapshot message) of this server, or of one with the same key")


class SessionInfo(BaseModel):
    """An env session's state."""

    session_id: str
    env_id: str
    turn: int
    done: bool


# ------------------------------------------------------------------------------ batched env sessions
#: Most items one batched env request (``POST /v1/envs/batch/...``) may carry; more is a 422 for the whole
#: request (nothing runs). The one declaration: the routes, their body limits and the clients read it here.
MAX_BATCH_ITEMS = 128


class InvalidItem:
    """An item of a batched request that failed validation (it is answered 422 on its own; the rest run).

    Attributes:
        detail: what was wrong, in words (``"action: Input should be a valid string"``)."""

    __slots__ = ("detail",)

    def __init__(self, detail: str):
        self.detail = detail

    def __repr__(self) -> str:
        return f"InvalidItem({self.detail!r})"


def _item_errors(exc: ValidationError) -> str:
    parts = [f"{'.'.join(map(str, e['loc']))}: {e['msg']}" if e["loc"] else str(e["msg"]) for e in exc.errors()[:10]]
    return "; ".join(parts) or "invalid item"


class BatchRequest(RequestModel):
    """Base of the batched env requests: ``{"items": [...]}`` with 1 to :data:`MAX_BATCH_ITEMS` items.

    The envelope is strict (no other field, a list of the declared length, else 422 for the whole
    request); each item is validated on its own against the item model (strict, as the single route's
    body), and an item that fails becomes an :class:`InvalidItem`, answered 422 in its own place while
    the other items run. The JSON checks of :class:`RequestModel` (valid Unicode, finite numbers,
    nesting) apply per item too."""

    item_model: ClassVar[type[RequestModel]]

    @model_validator(mode="before")
    @classmethod
    def _valid_json(cls, data: Any) -> Any:  # per item (see _each_item), not over the whole batch
        return data

    @field_validator("items", mode="wrap", check_fields=False)
    @classmethod
    def _each_item(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        if type(value) is not list or not 1 <= len(value) <= MAX_BATCH_ITEMS:
            return handler(value)  # the declared errors: not a list, too few or too many items
        try:
            return handler(value)  # the common case: every item valid, validated in one call
        except ValidationError:
            pass
        out: list[Any] = []
        for v in value:
            try:
                out.append(cls.item_model.model_validate(v))
            except ValidationError as exc:
                out.append(InvalidItem(_item_errors(exc)))
        return out


def _items(model: type, what: str) -> Any:
    return Field(min_length=1, max_length=MAX_BATCH_ITEMS, description=f"1 to {MAX_BATCH_ITEMS} {what}; each "
                 "is answered in its own place of `results`, an invalid one with 422 while the others run")


class BatchCreateRequest(BatchRequest):
    """``POST /v1/envs/batch/create``: one new session per item (each item as the body of ``POST /v1/envs``)."""

    item_model: ClassVar[type[RequestModel]] = CreateEnvRequest
    items: list[CreateEnvRequest] = _items(CreateEnvRequest, "sessions to make")


class BatchResetItem(RequestModel):
    """One item of ``POST /v1/envs/batch/reset``: a session and its reset arguments."""

    session_id: str = Field(description="an env session id")
    seed: int | None = Field(default=None, ge=0, description="reset seed (a non-negative integer)")
    options: dict[str, Any] | None = Field(default=None, description="reset options")


class BatchResetRequest(BatchRequest):
    """``POST /v1/envs/batch/reset``."""

    item_model: ClassVar[type[RequestModel]] = BatchResetItem
    items: list[BatchResetItem] = _items(BatchResetItem, "resets")


class BatchStepItem(RequestModel):
    """One item of ``POST /v1/envs/batch/step``: a session and its action."""

    session_id: str = Field(description="an env session id")
    action: str | dict[str, Any] | list[Any] = Field(description=ACTION_HELP)


class BatchStepRequest(BatchRequest):
    """``POST /v1/envs/batch/step``: items on the same session run in their order, one after the other."""

    item_model: ClassVar[type[RequestModel]] = BatchStepItem
    items: list[BatchStepItem] = _items(BatchStepItem, "steps")


class BatchForkItem(RequestModel):
    """One item of ``POST /v1/envs/batch/fork``: a session and how many copies to make of it."""

    session_id: str = Field(description="an env session id")
    n: int = Field(default=1, ge=1, le=MAX_CLONES, description="number of copies")


class BatchForkRequest(BatchRequest):
    """``POST /v1/envs/batch/fork``."""

    item_model: ClassVar[type[RequestModel]] = BatchForkItem
    items: list[BatchForkItem] = _items(BatchForkItem, "forks")


class BatchSessionItem(RequestModel):
    """One item of ``POST /v1/envs/batch/delete``: a session to close."""

    session_id: str = Field(description="an env session id")


class BatchDeleteRequest(BatchRequest):
    """``POST /v1/envs/batch/delete``."""

    item_model: ClassVar[type[RequestModel]] = BatchSessionItem
    items: list[BatchSessionItem] = _items(BatchSessionItem, "sessions to close")


#: Most session ids one lease renewal names (a client renews more in several requests).
MAX_RENEW_IDS = 1024


class RenewRequest(RequestModel):
    """``POST /v1/envs/batch/renew``: the sessions whose leases to renew (field case S51)."""

    session_ids: list[Annotated[str, Field(max_length=200)]] = Field(max_length=MAX_RENEW_IDS)


class RenewResponse(BaseModel):
    """Which sessions were renewed (live) and which are gone (closed, expired, never made)."""

    renewed: list[str]
    missing: list[str]


_STATUS_CODE = Field(description="the HTTP status the single-session route would have answered for this item: "
                     "2xx with `result`, else 404, 409, 413, 422 or 503 with `error`")
_ITEM_ERROR = Field(default=None, description="the error body the single-session route would have answered")
_RETRY = Field(default=None, description="with a 503: seconds to wait before retrying this item (Retry-After)")


class BatchResetResult(BaseModel):
    """One item's outcome in a batched create or reset: ``result`` on success, else ``error``."""

    status_code: int = _STATUS_CODE
    result: ResetResponse | None = Field(default=None, description="as POST /v1/envs or .../reset answers it")
    error: ErrorBody | None = _ITEM_ERROR
    retry_after_s: int | None = _RETRY


class BatchStepResult(BaseModel):
    """One item's outcome in a batched step: ``result`` on success, else ``error``."""

    status_code: int = _STATUS_CODE
    result: StepResponse | None = Field(default=None, description="as POST /v1/envs/{id}/step answers it")
    error: ErrorBody | None = _ITEM_ERROR
    retry_after_s: int | None = _RETRY


class BatchForkResult(BaseModel):
    """One item's outcome in a batched fork: ``result`` on success, else ``error``."""

    status_code: int = _STATUS_CODE
    result: ForkResponse | None = Field(default=None, description="as POST /v1/envs/{id}/fork answers it")
    error: ErrorBody | None = _ITEM_ERROR
    retry_after_s: int | None = _RETRY


class BatchDeleteResult(BaseModel):
    """One item's outcome in a batched delete: 204, or ``error`` (404 for an unknown session)."""

    status_code: int = _STATUS_CODE
    error: ErrorBody | None = _ITEM_ERROR
    retry_after_s: int | None = _RETRY


class BatchResetResponse(BaseModel):
    """``results[i]`` answers ``items[i]`` (the same order, one result per item)."""

    results: list[BatchResetResult]


class BatchStepResponse(BaseModel):
    """``results[i]`` answers ``items[i]`` (the same order, one result per item)."""

    results: list[BatchStepResult]


class BatchForkResponse(BaseModel):
    """``results[i]`` answers ``items[i]`` (the same order, one result per item)."""

    results: list[BatchForkResult]


class BatchDeleteResponse(BaseModel):
    """``results[i]`` answers ``items[i]`` (the same order, one result per item)."""

    results: list[BatchDeleteResult]


class EnvHealth(BaseModel):
    """``/healthz`` of a server of env sessions alone."""

    status: Literal["ok"]
    env_sessions: int = Field(description="env sessions held now")
    env_session_counts: EnvSessionCounts | None = Field(None, description="the env sessions in detail (None: a "
                                                                          "server older than this field)")


__all__ = ["RequestModel", "SessionState", "CreateRequest", "SandboxInfo", "SandboxList", "ExecRequest",
           "WriteFilesRequest", "StateUpdate", "SnapshotRequest", "SnapshotInfo", "CloneRequest", "ForkRequest",
           "RollbackRequest",
           "CloneResponse", "PoolStatus", "Health", "ToolList", "ErrorBody", "ToolResult", "ToolSpec",
           "EnvSettingInfo", "EnvSpecInfo",
           "CreateEnvRequest", "ResetRequest", "StepRequest", "ResetResponse", "StepResponse", "ForkResponse",
           "EnvSnapshotResponse", "RestoreEnvRequest", "SessionInfo", "EnvHealth", "EnvSessionCounts",
           "EnvSessionGroup", "MAX_CLONES", "MAX_TOOL_NAME_CHARS",
           "MAX_JSON_DEPTH", "MAX_METADATA_BYTES", "MAX_BATCH_ITEMS", "InvalidItem", "BatchRequest",
           "BatchCreateRequest", "BatchResetItem", "BatchResetRequest", "BatchStepItem", "BatchStepRequest",
           "BatchForkItem", "BatchForkRequest", "BatchSessionItem", "BatchDeleteRequest", "BatchResetResult",
           "BatchStepResult", "BatchForkResult", "BatchDeleteResult", "BatchResetResponse", "BatchStepResponse",
           "BatchForkResponse", "BatchDeleteResponse"]
