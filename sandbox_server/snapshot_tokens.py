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

Rotation (field case S54): the setting holds several keys, comma-separated, ``NEW,OLD``: the first seals
every new token, each one opens (``cryptography``'s ``MultiFernet``), so tokens sealed before a key change
still restore. A key not listed opens nothing: a server set to ``NEW`` alone refuses the tokens ``OLD``
sealed, as it refuses forged ones.
"""

from __future__ import annotations

import zlib
from typing import Sequence

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from envs.core import Snapshot
from sandbox_server.settings import snapshot_keys


class SnapshotTokenError(ValueError):
    """A token that this server did not seal (altered, truncated, or sealed under another key)."""


class SnapshotSealer:
    """Seals env snapshots into tokens and opens them.

    Args:
        key: a Fernet key (44 characters of URL-safe base64), or several: comma-separated in one string (the
            ``FORKYARD_SNAPSHOT_KEY`` text, ``"NEW,OLD"``) or a sequence. The first seals, every one opens
            (a rotation, field case S54). None draws a random key for this process.

    Raises:
        ValueError: a key that is not a Fernet key, an empty list or item, a key listed twice
            (:func:`sandbox_server.settings.snapshot_keys`; the message never shows a key).
    """

    def __init__(self, key: str | bytes | Sequence[str | bytes] | None = None):
        if key is None:
            keys: tuple[str, ...] = (Fernet.generate_key().decode("ascii"),)
        else:
            items = [key] if isinstance(key, (str, bytes)) else list(key)
            text = ",".join(k.decode("ascii", "replace") if isinstance(k, bytes) else k for k in items)
            keys = snapshot_keys(text, "the snapshot key")
        self._fernet = MultiFernet([Fernet(k) for k in keys])

    def seal(self, snapshot: Snapshot) -> str:
        """The token (ASCII str) of ``snapshot``, sealed with the first key."""
        return self._fernet.encrypt(zlib.compress(snapshot.to_bytes(), 6)).decode("ascii")

    def open(self, token: str, max_bytes: int = 256 << 20) -> Snapshot:
        """The snapshot sealed in ``token``.

        Args:
            token: what :meth:`seal` returned.
            max_bytes: most bytes the snapshot may take once decompressed.

        Raises:
            SnapshotTokenError: ``token`` was sealed by none of this sealer's keys, was altered, or inflates past
                ``max_bytes``.
        """
        try:
            packed = self._fernet.decrypt(token.encode("ascii"))
        except (InvalidToken, UnicodeEncodeError, ValueError):
            raise SnapshotTokenError("not a snapshot token of this server: altered, truncated, or sealed under "
                                     "another key, one not in this server's FORKYARD_SNAPSHOT_KEY (servers that "
                                     "restore each other's tokens share the key; after a key change, keep the "
                                     "old key listed after the new one, NEW,OLD, while its tokens are in use)"
                                     ) from None
        inflate = zlib.decompressobj()
        raw = inflate.decompress(packed, max_bytes)
        if inflate.unconsumed_tail:
            raise SnapshotTokenError(f"the snapshot inflates past {max_bytes} bytes")
        return Snapshot.from_bytes(raw)


__all__ = ["SnapshotSealer", "SnapshotTokenError"]
