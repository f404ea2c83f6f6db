"""The answers of a forkyard server's env sessions: the one definition of their shapes, shared by the server
(``sandbox_server/models.py`` re-exports these models as its response models) and every client
(:mod:`envs.session_client` decodes the answers of both transports, ``/v1/envs`` and the OpenEnv WebSocket,
into them).

Pydantic models, so the server documents them in its OpenAPI schema; clients build them from the answers
with :func:`decode` (no validation: the server validated them when it answered).
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, Field


#: The request header that asks for a lease (seconds) on the env sessions a request makes; the server closes them
#: that long after the last request that touched or renewed them (``sandbox_server/session_lease.py``, field case
#: S51).
LEASE_HEADER = "Forkyard-Lease-S"


class ErrorBody(BaseModel):
    """Every 4xx / 5xx answer of the API (FastAPI's own validation errors included)."""

    detail: str = Field(description="what was wrong, in words")
    status: str | None = Field(default=None, description="a short machine-readable kind: not_found, refused, "
                               "invalid, conflict, too_large, unavailable, sandbox_error, infra_error, internal")


class ResetResponse(BaseModel):
    """A session's first observation (create, reset, restore)."""

    session_id: str
    observation: str
    info: dict[str, Any] = Field(description="turn, anchor_key, state_key, legal_actions (finite action sets)")
    observation_max_length: int = Field(description="max code points of an observation")
    action_max_length: int = Field(description="max code points of an action")


class StepResponse(BaseModel):
    """One step's outcome."""

    session_id: str
    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any] = Field(description="turn, anchor_key, state_key, legal_actions, termination_reason at "
                                             "the end")


class ForkResponse(BaseModel):
    """The sessions an env fork made."""

    session_id: str = Field(description="the parent session")
    session_ids: list[str] = Field(description="the new sessions, each at the parent's state")


class EnvSnapshotResponse(BaseModel):
    """``POST /v1/envs/{session_id}/snapshot``: the session's state as an opaque, authenticated token."""

    session_id: str
    snapshot: str = Field(description="a sealed token (sandbox_server/snapshot_tokens.py): the client can store "
                                      "and return it to POST /v1/envs/restore, but neither read nor alter it")


M = TypeVar("M", bound=BaseModel)
_set, _new = object.__setattr__, object.__new__


def decode(model: type[M], data: dict[str, Any]) -> M:
    """``model`` built from a server's answer ``data`` (a JSON object) without validation: the server validated
    it with the same model when it answered. What ``model_construct`` builds (a test checks that the two are
    equal), at a tenth of its cost (about 1 us, what a dataclass costs): a client's step pays it every time.
    Keys the model does not name are dropped, fields missing from ``data`` are None. ``data`` is kept (not
    copied) when its keys are the model's fields."""
    fields = model.model_fields
    if data.keys() != fields.keys():
        data = {k: data.get(k) for k in fields}
    out = _new(model)
    _set(out, "__dict__", data)
    _set(out, "__pydantic_fields_set__", set(data))
    _set(out, "__pydantic_extra__", None)
    _set(out, "__pydantic_private__", None)
    return out


__all__ = ["LEASE_HEADER", "EnvSnapshotResponse", "ErrorBody", "ForkResponse", "ResetResponse", "StepResponse",
           "decode"]
