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
variables at once is a ValueError naming the variable, never echoing the value.

Rotation (field case S54): either variable may hold several keys, comma-separated, ``NEW,OLD`` (so a key
never contains a comma). A server accepts each of them (:func:`api_keys`); a client sends the first
(:func:`api_key`). To change the key without refusing anyone: give the server ``NEW,OLD`` and restart it,
move the clients to ``NEW``, then give the server ``NEW`` alone. An empty item (a stray comma) or a key
listed twice is refused like a bad key. Standard library only.
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


def api_keys(explicit: str | None = None, environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Every key a server accepts: ``explicit`` when given, else ``FORKYARD_API_KEY``, else the content of the
    file ``FORKYARD_API_KEY_FILE`` names, split at its commas (``NEW,OLD`` during a rotation, field case S54);
    ``()`` when neither variable is set (no key).

    Raises:
        ValueError: both variables set, an unreadable key file, an empty item, a key :func:`check_key`
            refuses, or a key listed twice; the message names the variable (and the key's place in the list),
            never a key.
    """
    if explicit is not None:
        return _split(explicit, "api_key")
    env = os.environ if environ is None else environ
    value, path = env.get(KEY_VAR), env.get(KEY_FILE_VAR)
    if value is not None and path is not None:
        raise ValueError(f"set {KEY_VAR} or {KEY_FILE_VAR}, not both")
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"{KEY_FILE_VAR}: cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
        return _split(text, f"the content of {KEY_FILE_VAR}")
    return () if value is None else _split(value, KEY_VAR)


def api_key(explicit: str | None = None, environ: Mapping[str, str] | None = None) -> str | None:
    """The API key a client sends: the first of :func:`api_keys` (the newest during a rotation), else None.

    Raises:
        ValueError: as :func:`api_keys`.
    """
    keys = api_keys(explicit, environ)
    return keys[0] if keys else None


def _split(text: str, source: str) -> tuple[str, ...]:
    """The keys of ``text`` (comma-separated), each checked by :func:`check_key`, none twice."""
    items = text.split(",")
    if len(items) == 1:
        return (check_key(text, source),)
    keys: list[str] = []
    for i, item in enumerate(items, 1):
        place = f"{source} (key {i} of {len(items)}, comma-separated)"
        check_key(item, place)
        if item in keys:
            raise ValueError(f"{place} repeats key {keys.index(item) + 1}: list each key once")
        keys.append(item)
    return tuple(keys)


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


__all__ = ["KEY_FILE_VAR", "KEY_VAR", "api_key", "api_keys", "auth_headers", "check_key", "redact_url"]
