"""An OpenEnv client that also speaks forkyard's fork extension (needs the ``openenv-core`` package).

OpenEnv's own clients (``GenericEnvClient``, or a typed ``EnvClient`` subclass) run forkyard episodes
unchanged against ``http://HOST:PORT/openenv/{env_id}`` (see ``sandbox_server/routes/openenv.py``).
:class:`ForkyardEnvClient` is ``GenericEnvClient`` plus the extension's messages::

    from envs.openenv_client import ForkyardEnvClient

    base = "http://127.0.0.1:8000/openenv/forkyard/ClueProbe-v0"
    with ForkyardEnvClient(base_url=base).sync() as env:
        env.reset(seed=0, kwargs={"turns": 4})
        env.step({"action": "probe(0)"})
        children = env.fork(2)                  # 2 session ids at this state, owned by this connection
        token = env.snapshot()                  # opaque, authenticated: restore with env.reset(snapshot=token)
        with ForkyardEnvClient(base_url=base).sync() as branch:
            branch.attach(children[0])          # this connection now drives the child
            branch.step({"action": "probe(1)"})
        env.delete(children[1:])                # or leave them: they go when this connection closes

Every method raises ``RuntimeError("Server error: ... (code: ...)")`` on an error answer, as OpenEnv's
client does.
"""

from __future__ import annotations

from typing import Any

from openenv.core.client_types import StepResult
from openenv.core.generic_client import GenericEnvClient


class ForkyardEnvClient(GenericEnvClient):
    """``GenericEnvClient`` with ``fork``, ``attach``, ``snapshot`` and ``delete`` (async; ``.sync()`` wraps
    them like the others). Observations are dicts: ``text``, ``info``, ``terminated``, ``truncated``,
    ``session_id``."""

    async def fork(self, n: int = 1) -> list[str]:
        """``n`` new sessions at this session's state: their ids (deleted when this connection closes unless
        another connection attaches them)."""
        answer = await self._send_and_receive({"type": "fork", "data": {"n": n}})
        return list(answer["data"]["session_ids"])

    async def attach(self, session_id: str) -> StepResult[dict[str, Any]]:
        """Drive ``session_id`` (a fork's child) from this connection; its latest observation."""
        answer = await self._send_and_receive({"type": "attach", "data": {"session_id": session_id}})
        return self._parse_result(answer.get("data", {}))

    async def snapshot(self) -> str:
        """This session's state as an opaque token; ``reset(snapshot=token)`` restores it."""
        answer = await self._send_and_receive({"type": "snapshot", "data": {}})
        return str(answer["data"]["snapshot"])

    async def delete(self, session_ids: list[str]) -> dict[str, list[str]]:
        """Close many sessions in one message: ``{"deleted": [...], "missing": [...]}``."""
        answer = await self._send_and_receive({"type": "delete", "data": {"session_ids": list(session_ids)}})
        return dict(answer["data"])


__all__ = ["ForkyardEnvClient"]
