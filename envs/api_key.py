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
listed twice is refused like a bad key.

Secrets never show (field case S60). :func:`redact` is the one redaction: every client names servers and
words its errors through it, hiding URL user info whatever characters a key holds there and every known key in
the forms it travels in. Clients take a key out of a URL's user info (:func:`split_credentials`; percent-encoded
there when it holds reserved characters, ``urllib.parse.quote(key, safe='')``) and send it as a header, keeping
only the URL without it, so no library they use can print it; a key written raw where a URL cannot carry it is
refused with a message saying how to encode it or send it in a header, never echoing it. Keys are
:class:`Concealed` once read (a ``repr`` shows ``'<hidden>'``). A URL that third-party clients print and store
should carry a URL token (``POST /v1/tokens``: scoped to the OpenEnv routes, expiring; :mod:`sandbox_server.auth`),
never the server's key. Standard library only.
"""

from __future__ import annotations

import json
import logging
import os
import re
import urllib.parse
from collections.abc import Iterable, Mapping
from pathlib import Path

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
    ``()`` when neither variable is set (no key). Each key is :class:`Concealed` (its ``repr`` hides it).

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
        return (Concealed(check_key(text, source)),)
    keys: list[str] = []
    for i, item in enumerate(items, 1):
        place = f"{source} (key {i} of {len(items)}, comma-separated)"
        check_key(item, place)
        if item in keys:
            raise ValueError(f"{place} repeats key {keys.index(item) + 1}: list each key once")
        keys.append(item)
    return tuple(Concealed(k) for k in keys)


#: Characters a URL's user info carries as they are, besides ASCII letters and digits (RFC 3986: unreserved,
#: sub-delims and ``:``); any other character of a key written there must be percent-encoded.
_USERINFO_SAFE = frozenset("-._~!$&'()*+,;=:")
_PCT = re.compile(r"%[0-9A-Fa-f]{2}")
#: The user info of a URL in text: from ``scheme://`` (or the start of a word) to the last ``@`` of the word.
_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://)\S*@"
                       r"|(?<![^\s'\"(\[<=,])[^\s'\"(\[<=,](?:(?!://)\S)*@")

#: How to write a key a URL cannot carry as it is: the end of every such refusal.
HOW_TO_ENCODE = ("percent-encode the key (urllib.parse.quote(key, safe='')), or better leave it out of the URL: pass "
                 f"api_key= or set {KEY_VAR} / {KEY_FILE_VAR} (sent as an Authorization header), or give third-party "
                 "clients a scoped, expiring URL token (POST /v1/tokens, docs/serving.md) instead of the server's key")


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` with every credential hidden: the one place forkyard hides secrets in messages, reprs and logs
    (field case S60).

    Hidden: the user info of each URL in ``text`` (``http://forkyard:KEY@host/x`` -> ``http://***@host/x``; from
    ``scheme://``, or the start of a word, to the word's last ``@``, so a key holding ``/ ? # @ :`` as it is
    hides whole; a word with an ``@`` but no URL, such as an e-mail address, loses what precedes it too), and,
    before that, every occurrence of each of ``secrets`` (None and empty ones skipped) as it is, percent-encoded,
    and escaped as ``repr`` and JSON write it.

    Args:
        text: any message, URL or repr.
        secrets: the keys that must not show (a client's key, the key its URL carried).

    Returns:
        ``text`` with ``***`` in place of each credential.
    """
    text = str(text)
    forms: set[str] = set()
    for secret in secrets:
        if secret:
            quoted = urllib.parse.quote(secret, safe="")
            forms |= {secret, quoted, _PCT.sub(lambda m: m[0].lower(), quoted), urllib.parse.quote(secret),
                      urllib.parse.quote_plus(secret), repr(secret)[1:-1], json.dumps(secret)[1:-1]}
    for form in sorted(forms, key=len, reverse=True):  # first: the user info pass would cut a key holding "@"
        text = text.replace(form, "***")
    return _USERINFO.sub(lambda m: (m["head"] or "") + "***@", text)


def redact_url(url: str) -> str:
    """``url`` with its user info hidden: :func:`redact` (the one redaction), the name clients give a server."""
    return redact(url)


class Concealed(str):
    """A secret, or a URL that may carry one, whose ``repr`` shows ``shown`` (``'<hidden>'``, or the URL through
    :func:`redact`) and whose value is intact: for records that print their values (a Gymnasium spec's kwargs).

    Args:
        value: the secret or URL.
        shown: what ``repr`` shows instead.
    """

    shown: str

    def __new__(cls, value: str, shown: str = "<hidden>") -> "Concealed":
        self = super().__new__(cls, value)
        self.shown = shown
        return self

    def __repr__(self) -> str:
        return repr(self.shown)

    def __getnewargs__(self) -> tuple[str, str]:  # type: ignore[override]  # copy and pickle keep both
        return str(self), self.shown


def conceal(kwargs: Mapping[str, object]) -> dict[str, object]:
    """``kwargs`` with an ``api_key`` and a ``server_url`` (strings) made :class:`Concealed`: the values work as
    before, their ``repr`` shows no key (field case S60)."""
    out = dict(kwargs)
    key, url = out.get("api_key"), out.get("server_url")
    if isinstance(key, str):
        out["api_key"] = Concealed(key)
    if isinstance(url, str):
        out["server_url"] = Concealed(url, redact(url))
    return out


def split_credentials(url: str, source: str = "server_url") -> tuple[str, str | None]:
    """``url`` without its user info, and the key that user info carries (``http://forkyard:KEY@host/x`` ->
    ``("http://host/x", "KEY")``; ``(url, None)`` without user info). The key is the password, percent-decoded
    (``a%2Fb`` -> ``a/b``), as the WebSocket and HTTP libraries send it; an ``@`` anywhere after ``scheme://``
    starts the host part after the last one (forkyard's routes hold none).

    Args:
        url: a server URL as a user wrote it.
        source: the argument or setting it came from, for messages.

    Raises:
        ValueError: user info without ``scheme://`` before it, without a ``:`` before the key, holding a
            character a URL cannot carry as it is (``/ ? # @ [ ] %`` not followed by two hex digits, a space,
            non-ASCII, ...), or whose key :func:`check_key` refuses; the message says how to percent-encode the
            key or send it in a header, and shows neither the key nor the URL's user info (field case S60).
    """
    if "@" not in url:
        return url, None
    scheme = re.match(r"[A-Za-z][A-Za-z0-9+.\-]*://", url)
    if scheme is None:
        raise ValueError(f"{source} must be scheme://[USER:KEY@]HOST[:PORT]... (not shown: it may hold a key)")
    info, _, rest = url[scheme.end():].rpartition("@")
    user, colon, password = info.partition(":")
    where = f"the key in {source}'s user info ({scheme[0]}USER:KEY@HOST)"
    if not colon:
        raise ValueError(f"{source}: write the key as the password of the URL's user info, "
                         f"{scheme[0]}forkyard:KEY@HOST, or {HOW_TO_ENCODE}")
    if not all(c.isascii() and (c.isalnum() or c in _USERINFO_SAFE) for c in _PCT.sub("", info)):
        raise ValueError(f"{where} holds characters a URL cannot carry as they are (/ ? # @ [ ] % \" < > \\ ^ ` "
                         f"{{ | }}, spaces, non-ASCII): {HOW_TO_ENCODE}")
    key = urllib.parse.unquote(password, errors="replace")
    try:
        check_key(key, where)
    except ValueError as exc:
        raise ValueError(f"{exc} once percent-decoded: {HOW_TO_ENCODE}") from None
    return url[:scheme.end()] + rest, Concealed(key)


def client_credentials(url: str, explicit: str | None = None, source: str = "server_url",
                       environ: Mapping[str, str] | None = None) -> tuple[str, str | None]:
    """What a client connects to and the key it sends: ``url`` without its user info
    (:func:`split_credentials`), and ``explicit`` when given, else the key in the URL's user info, else
    :func:`api_key` of the environment (``FORKYARD_API_KEY`` / ``FORKYARD_API_KEY_FILE``); None for no key.
    Clients send the key as ``Authorization: Bearer`` and keep only the URL without it, so no library they use
    ever prints it (field case S60).

    Raises:
        ValueError: as :func:`split_credentials` and :func:`api_key`.
    """
    clean, in_url = split_credentials(url, source)
    if explicit is not None:
        return clean, api_key(explicit)
    return clean, in_url if in_url is not None else api_key(None, environ)


class HideCredentials(logging.Filter):
    """A log filter that hides credentials in records: an ``Authorization`` header's value (websockets logs each
    handshake header as ``("> %s: %s", name, value)`` at DEBUG, client and server side) and URL user info in
    any string argument (:func:`redact`). It never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and args:
            if len(args) == 2 and str(args[0]).lower() in ("authorization", "proxy-authorization"):
                args = (args[0], "<hidden>")
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in args)
        return True


#: The loggers that see handshake headers: websockets' own and uvicorn's (its WebSocket protocols log there).
HEADER_LOGGERS = ("websockets.client", "websockets.server", "uvicorn.error")


def hide_credentials_in_logs() -> None:
    """Put :class:`HideCredentials` on each of :data:`HEADER_LOGGERS` (once; done when this module is imported,
    so every forkyard client and server has it: field case S60)."""
    for name in HEADER_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, HideCredentials) for f in logger.filters):
            logger.addFilter(HideCredentials())


def auth_headers(key: str | None) -> dict[str, str]:
    """The request headers that carry ``key`` (``{}`` for None), the value :class:`Concealed`."""
    return {"Authorization": Concealed(f"Bearer {key}", "Bearer <hidden>")} if key else {}


hide_credentials_in_logs()

__all__ = ["Concealed", "HEADER_LOGGERS", "HOW_TO_ENCODE", "HideCredentials", "KEY_FILE_VAR", "KEY_VAR", "api_key",
           "api_keys", "auth_headers", "check_key", "client_credentials", "conceal", "hide_credentials_in_logs",
           "redact", "redact_url", "split_credentials"]
