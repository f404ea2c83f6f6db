"""Env sessions over HTTP: the old home of what now lives in three modules, kept so existing imports work.

* the routes (``/v1/envs``): :mod:`sandbox_server.routes.envs`;
* the session store, the env classes and kwargs served, how env code runs: :mod:`sandbox_server.env_sessions`;
* the request and response models: :mod:`sandbox_server.models`;
* a server of env sessions alone: :func:`sandbox_server.app.create_env_app` (``create_app(sandboxes=False)``),
  started from the command line with ``python -m sandbox_server --no-sandboxes``.
"""

from __future__ import annotations

from sandbox_server.app import create_env_app
from sandbox_server.env_sessions import GYM_MAKE_KEYWORDS, SERVER_DECIDED_KWARGS, EnvSessions, reaper
from sandbox_server.http_contract import ENV_BODY_BYTES as ENV_BODY_LIMIT
from sandbox_server.models import (
    CreateEnvRequest, EnvHealth, EnvSpecInfo, ForkResponse, ResetRequest, ResetResponse, SessionInfo, StepRequest,
    StepResponse,
)

__all__ = ["ENV_BODY_LIMIT", "GYM_MAKE_KEYWORDS", "SERVER_DECIDED_KWARGS", "CreateEnvRequest", "EnvHealth", "EnvSessions",
           "EnvSpecInfo", "ForkResponse", "ResetRequest", "ResetResponse", "SessionInfo", "StepRequest", "StepResponse",
           "create_env_app", "reaper"]
