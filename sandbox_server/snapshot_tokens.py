"""Env snapshots that leave the server: opaque, authenticated tokens.

An env snapshot (:class:`envs.core.Snapshot`) holds the env's hidden task state (ClueProbe's target, a
FileQA answer and its sandbox files). A client that could read it would learn the answer; one that could
alter it would forge episodes. So a snapshot handed to a client (over ``/v1/envs`` or the OpenEnv
transport) is sealed: compressed (zlib), then encrypted and authenticated with Fernet (AES-128-CBC with an
HMAC-SHA256 tag, from the ``cryptography`` package). The client can store and return the token, nothing
more: a token altered by one bit, or made under another key, is refused.

What sealing does not hide: a client that restores a token may replay from it (try each answer and read
the reward); a token does not expire while its key is in use. Sealing keeps the state's contents from the
client, not the env's own feedback.

The key is ``FORKYARD_SNAPSHOT_KEY`` (:class:`sandbox_server.settings.ServerSettings`; a Fernet key:
32 random bytes in URL-safe base64, as ``python -c "from cryptography.fernet import Fernet;
print(Fernet.generate_key().decode())"`` prints). Without it each server process draws its own key at start,
so tokens restore only on the server that made them and only until it restarts.
"""

from __future__ import annotations

import zlib

from cryptography.fernet import Fernet, InvalidToken

from envs.core import Snapshot


class SnapshotTokenError(ValueError):
    """A token that this server did not seal (altered, truncated, or sealed under another key)."""


class SnapshotSealer:
    """Seals env snapshots into tokens and opens them.

    Args:
        key: a Fernet key (44 characters of URL-safe base64); None draws a random one for this process.

    Raises:
        ValueError: a key that is not a Fernet key.
    """

    def __init__(self, key: str | bytes | None = None):
        self._fernet = Fernet(key if key is not None else Fernet.generate_key())

    def seal(self, snapshot: Snapshot) -> str:
        """The token (ASCII str) of ``snapshot``."""
        return self._fernet.encrypt(zlib.compress(snapshot.to_bytes(), 6)).decode("ascii")

    def open(self, token: str, max_bytes: int = 256 << 20) -> Snapshot:
        """The snapshot sealed in ``token``.

        Args:
            token: what :meth:`seal` returned.
            max_bytes: most bytes the snapshot may take once decompressed.

        Raises:
            SnapshotTokenError: ``token`` was not sealed by this key, was altered, or inflates past ``max_bytes``.
        """
        try:
            packed = self._fernet.decrypt(token.encode("ascii"))
        except (InvalidToken, UnicodeEncodeError, ValueError):
            raise SnapshotTokenError("not a snapshot token of this server (altered, truncated, or sealed under "
                                     "another key: set the same FORKYARD_SNAPSHOT_KEY on every server that "
                                     "restores it)") from None
        inflate = zlib.decompressobj()
        raw = inflate.decompress(packed, max_bytes)
        if inflate.unconsumed_tail:
            raise SnapshotTokenError(f"the snapshot inflates past {max_bytes} bytes")
        return Snapshot.from_bytes(raw)


__all__ = ["SnapshotSealer", "SnapshotTokenError"]
