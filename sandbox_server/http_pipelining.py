"""HTTP/1.1 pipelining served in turn with other connections (field case S56, its HTTP share).

A client may send many requests on one keep-alive connection without waiting for answers (pipelining). uvicorn's
httptools protocol answers them in order, one at a time, but reads the connection again after every answer even
while requests it already read are still waiting: the queue of read requests grows by a socket buffer's worth
(thousands of small requests) per answer, and parsing them takes the event loop from every other connection.
Measured on this machine kind (two cores), a connection pipelining ClueProbe steps to ``python -m sandbox_server``
raised another connection's step p99 from 12-24 ms to 0.9-2.6 s, and the flooding connection itself got about 50
answers a second.

:class:`PipelinedHttpToolsProtocol` reads a connection again only once every request read from it has been
answered: at most one read's worth of requests waits per connection, each answered by a task of its own that
takes turns with every other connection's. The pure-Python ``h11`` protocol already works that way (it reads no
further while a request is unanswered); :data:`HTTP_PROTOCOL` is what the server command runs.
"""

from __future__ import annotations

from typing import Any

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # no httptools: uvicorn's h11 protocol, which reads no request ahead of an answer
    HttpToolsProtocol = None  # type: ignore[assignment,misc]


if HttpToolsProtocol is not None:
    class PipelinedHttpToolsProtocol(HttpToolsProtocol):  # type: ignore[misc,valid-type]
        """uvicorn's httptools protocol, reading no more from a connection while requests read from it wait."""

        def on_response_complete(self) -> None:
            super().on_response_complete()  # resumes reading, starts the next request read ahead, if any
            if self.pipeline and not self.transport.is_closing():
                self.flow.pause_reading()  # requests still wait: read more only once they are answered

#: The ``uvicorn.Config(http=...)`` of forkyard's server: :class:`PipelinedHttpToolsProtocol` where httptools is
#: installed (the server extra's ``uvicorn[standard]``), else uvicorn's ``h11``.
HTTP_PROTOCOL: Any = PipelinedHttpToolsProtocol if HttpToolsProtocol is not None else "h11"

__all__ = ["HTTP_PROTOCOL"]
