"""How the messages of one OpenEnv WebSocket connection flow: what a message may cost before it is parsed (field
case S55) and how one connection's messages share the event loop with every other connection's (field case S56).

Size (field case S55). A message is parsed only if it holds at most :data:`WS_MESSAGE_BYTES` bytes (the largest
message the protocol needs: a ``reset`` carrying a snapshot token as large as ``POST /v1/envs/restore`` takes, or
a ``step`` carrying the longest action any served env takes, as ``/v1/envs`` sizes its bodies). A larger one is
answered with an error naming the limit (``VALIDATION_ERROR``, ``http_status`` 413, ``status`` ``too_large``),
before any JSON is parsed; the connection, its session and its forks go on. A frame larger than
:data:`WS_FRAME_BYTES` (the server's ``ws_max_size``, which ``python -m sandbox_server`` sets) is refused by the
WebSocket layer itself before it is read in full: the connection is closed with code 1009 (message too big), and
its sessions are deleted with it, as when any connection ends. Clients stay below :data:`WS_MESSAGE_BYTES` and
never meet it.

Fairness (field case S56). A connection's messages are answered one at a time, in order: the next one is read
only once the previous one is answered, and the connection yields the event loop after each answer, so a
client that pipelines (sends many messages without waiting for their answers) takes turns with every other
connection, one message each, instead of running its whole backlog back to back (an env whose steps run inline,
ClueProbe, would otherwise hold the loop for the whole backlog). What a connection has in flight is bounded:
uvicorn stops reading a connection's socket while messages it has read wait to be answered (its receive
queue holds at most one read of the socket), and stops answering it (so stops reading) while the client
does not read its answers (the transport's write buffer is full): the rest waits in the kernel's socket
buffers and the client's, not in the server's memory.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

import orjson
from fastapi import WebSocket, WebSocketDisconnect

from sandbox_server.http_contract import ENV_BATCH_BODY_BYTES, ENV_BODY_BYTES

#: Largest WebSocket message (bytes) the server parses: a snapshot token as large as ``POST /v1/envs/restore``
#: takes (:data:`~sandbox_server.http_contract.ENV_BATCH_BODY_BYTES`, 4 MiB) plus
#: :data:`~sandbox_server.http_contract.ENV_BODY_BYTES` (64 KiB) for the rest of the message. It also holds a
#: step whose action has ``ENV_BATCH_BODY_BYTES / 12`` (about 349,000) code points at 12 JSON bytes each (as the
#: REST step route counts them), far beyond any served env's action length (:data:`envs.actions.MAX_ACTION_CHARS`
#: by default, or a model's whole reply). A larger message is answered 413 and the connection goes on (S55).
WS_MESSAGE_BYTES = ENV_BATCH_BODY_BYTES + ENV_BODY_BYTES
#: The server's WebSocket frame limit (uvicorn's ``ws_max_size``, set by ``python -m sandbox_server``): a message
#: over it closes the connection with code 1009 before it is read in full. Above :data:`WS_MESSAGE_BYTES`, so
#: that every message a little too large is answered instead.
WS_FRAME_BYTES = 2 * WS_MESSAGE_BYTES
#: The WebSocket close code of a message over :data:`WS_FRAME_BYTES` (RFC 6455: message too big).
CLOSE_TOO_BIG = 1009


def too_large(size: int) -> dict[str, Any]:
    """The OpenEnv error answer to a message of ``size`` bytes over :data:`WS_MESSAGE_BYTES` (413)."""
    return {"type": "error", "data": {
        "message": f"the message has {size} bytes; this server parses WebSocket messages of at most "
                   f"{WS_MESSAGE_BYTES} bytes (WS_MESSAGE_BYTES; frames over {WS_FRAME_BYTES} bytes close the "
                   f"connection with code {CLOSE_TOO_BIG}). Nothing was done; the connection and its session go on",
        "code": "VALIDATION_ERROR", "status": "too_large", "http_status": 413}}


async def serve(websocket: WebSocket, answer: Callable[[str | bytes], Awaitable[dict[str, Any] | None]]) -> None:
    """Answer the messages of an accepted ``websocket`` one at a time, in order, until the client closes it or
    ``answer`` returns None (the client's ``close`` message); returns then (never raises for a client gone).

    Args:
        websocket: an accepted WebSocket.
        answer: the answer (a JSON-able dict) to one message's text or bytes, of at most
            :data:`WS_MESSAGE_BYTES` bytes; a larger message is answered :func:`too_large` without calling it.
    """
    try:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            raw = message.get("text")
            if raw is None:
                raw = message.get("bytes") or b""
            size = len(raw) if isinstance(raw, bytes) else len(raw.encode("utf-8", "surrogatepass"))
            reply = too_large(size) if size > WS_MESSAGE_BYTES else await answer(raw)
            if reply is None:
                return
            await websocket.send_text(orjson.dumps(reply).decode())
            await asyncio.sleep(0)  # one message per turn: other connections' messages run between (field case S56)
    except WebSocketDisconnect:
        return


__all__ = ["CLOSE_TOO_BIG", "WS_FRAME_BYTES", "WS_MESSAGE_BYTES", "serve", "too_large"]
