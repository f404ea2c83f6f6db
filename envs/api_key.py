"""The API key of a forkyard server: one reader for the server that requires it and every client that sends it.

A server started with ``FORKYARD_API_KEY`` set (or ``FORKYARD_API_KEY_FILE`` naming a file that holds the key,
as Docker and Kubernetes mount secrets) answers every route and transport but ``/healthz`` with 401 unless
the request carries the key (``sandbox_server/auth.py``). Its clients (``RemoteEnv``, ``RemoteVectorEnv``,
``ForkyardEnvClient``, ``SandboxClient``, ``AsyncSandboxClient``) read the same variables through
:func:`api_key` and send ``Authorization: Bearer KEY``; an explicit ``api_key=`` argument wins over them.
Clients that cannot add a header (OpenEnv's own ``GenericEnvClient``) put the key in the URL's user info,
``http://forkyard:KEY@host:8000/...``, which their WebSocket library sends as HTTP Basic credentials; the
server takes the key from the password.

A key is visible ASCII without spaces (it travels in a header): anything else, an empty value, or both
variables at once is a ValueError naming the variable, never echoing the value. Standard library only.
"""

from __future__ import annotations

import os
import urllib.parse
from pathlib import Path
from typing import Mapping

#: The key itself.
KEY_VAR = "FORKYARD_API_KEY"
#: A file whose content (surrounding whitespace stripped) is the key.
KEY_FILE_VAR = "FORKYARD_API_KEY_FILE"


def check_key(key: str, source: str) -> str:
    """``key`` when it can travel in a header (visible ASCII, no spaces, not empty); else ValueError naming
    ``source`` (the variable or argument it came from), without the value."""
    if not isinstance(key, str) or not key or not all(33 <= ord(c) <= 126 for c in key):
        raise ValueError(f"{source} must be a non-empty key of visible ASCII characters without spaces")
    return key


def api_key(explicit: str | None = None, environ: Mapping[str, str] | None = None) -> str | None:
    """The API key to require (server) or send (client): ``explicit`` when given, else ``FORKYARD_API_KEY``,
    else the content of the file ``FORKYARD_API_KEY_FILE`` names, else None (no key).

    Raises:
        ValueError: both variables set, an unreadable key file, or a key :func:`check_key` refuses.
    """
    if explicit is not None:
        return check_key(explicit, "api_key")
    env = os.environ if environ is None else environ
    value, path = env.get(KEY_VAR), env.get(KEY_FILE_VAR)
    if value is not None and path is not None:
        raise ValueError(f"set {KEY_VAR} or {KEY_FILE_VAR}, not both")
    if path is not None:
        try:
            return check_key(Path(path).read_text(encoding="utf-8").strip(), f"the content of {KEY_FILE_VAR}")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"{KEY_FILE_VAR}: cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    return None if value is None else check_key(value, KEY_VAR)


def redact_url(url: str) -> str:
    """``url`` with its user info hidden (``http://forkyard:KEY@host/x`` -> ``http://***@host/x``): how clients
    name a server in messages and errors, so that a key carried in a URL never shows."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]))


def auth_headers(key: str | None) -> dict[str, str]:
    """The request headers that carry ``key`` (``{}`` for None)."""
    return {"Authorization": f"Bearer {key}"} if key else {}


__all__ = ["KEY_FILE_VAR", "KEY_VAR", "api_key", "auth_headers", "check_key", "redact_url"]
