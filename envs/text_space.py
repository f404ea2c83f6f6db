"""A Gymnasium ``Text`` space for real text: any Unicode, any length up to a bound.

``gymnasium.spaces.Text`` checks every character against a finite charset (alphanumeric by default),
so a tool output with a space, a newline, ``é`` or an emoji is *not* contained in it. Listing all of
Unicode as a charset would cost a frozenset of 1.1 million code points, so :class:`TextSpace`
keeps ``Text``'s interface and sampling (over a small printable charset, see ``SAMPLE_CHARSET``) but
defines membership as "a ``str`` of ``min_length..max_length`` code points that encodes to UTF-8"
(lone surrogates, which no UTF-8 byte stream can carry, are rejected).

Vector envs: Gymnasium's ``AsyncVectorEnv`` passes observations through shared memory by default, and
its ``Text`` functions store each character as an index into the space's charset, which a character
outside the charset (most real text) does not survive. This module registers ``TextSpace``
implementations of ``gymnasium.vector.utils.create_shared_memory`` / ``write_to_shared_memory`` /
``read_from_shared_memory`` that store code points instead, so ``gymnasium.make_vec(...,
vectorization_mode="async")`` works with its default arguments. Layout per env: one ``int32`` row of
``1 + max_length`` values, the string's length in code points, then its code points (zero padded).
"""

from __future__ import annotations

import multiprocessing as mp
import string
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import create_shared_memory, read_from_shared_memory, write_to_shared_memory

#: Characters :meth:`TextSpace.sample` draws from: printable ASCII, whitespace and a few non-ASCII.
SAMPLE_CHARSET = string.printable + "éüßñçøåλπ中文🚀"

#: Appended to an observation that was cut to fit its space; ``{n}`` is the number of characters cut.
CUT_MARKER = "\n[... {n} characters cut]"


class TextSpace(spaces.Text):
    """Text of ``min_length..max_length`` Unicode code points (``len(str)``), any characters.

    Args:
        max_length: largest length contained, in code points (``len``), >= 1.
        min_length: smallest length contained, default 0 (the empty string is a valid observation).
        seed: seed for :meth:`sample`.
    """

    def __init__(self, max_length: int, *, min_length: int = 0, seed: int | None = None):
        super().__init__(max_length, min_length=min_length, charset=SAMPLE_CHARSET, seed=seed)

    def contains(self, x: Any) -> bool:
        if not isinstance(x, str) or not (self.min_length <= len(x) <= self.max_length):
            return False
        try:
            x.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogate
            return False
        return True

    def __repr__(self) -> str:
        return f"TextSpace(min_length={self.min_length}, max_length={self.max_length}, charset=<any Unicode>)"

    def __eq__(self, other: Any) -> bool:
        return (
            isinstance(other, TextSpace)
            and self.min_length == other.min_length
            and self.max_length == other.max_length
        )

    def __hash__(self) -> int:
        return hash((TextSpace, self.min_length, self.max_length))


def fit_text(text: str, max_length: int) -> str:
    """Return ``text`` unchanged if it has at most ``max_length`` code points, else cut it and append
    :data:`CUT_MARKER` so that the result has exactly ``max_length`` code points.

    Lone surrogates are replaced by U+FFFD so the result always encodes to UTF-8.

    Raises:
        ValueError: if ``max_length`` is too small to hold the marker (< 40).
    """
    if max_length < 40:
        raise ValueError(f"max_length must be >= 40 to hold the cut marker, got {max_length}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in text)
    if len(text) <= max_length:
        return text
    # The marker's own length depends on n; two passes settle it.
    n = len(text) - max_length
    marker = CUT_MARKER.format(n=n)
    keep = max_length - len(marker)
    marker = CUT_MARKER.format(n=len(text) - keep)
    keep = max_length - len(marker)
    return text[:keep] + marker


# ----------------------------------------------------------------- shared memory (AsyncVectorEnv)
@create_shared_memory.register(TextSpace)
def _create_textspace_shared_memory(space: TextSpace, n: int = 1, ctx: ModuleType = mp):
    """Shared ``int32`` array of ``n * (1 + space.max_length)`` values: per env, a length then code points."""
    return ctx.Array(np.dtype(np.int32).char, n * (space.max_length + 1))


@write_to_shared_memory.register(TextSpace)
def _write_textspace_to_shared_memory(space: TextSpace, index: int, value: str, shared_memory) -> None:
    """Write env ``index``'s observation ``value`` (a str of at most ``max_length`` code points).

    Raises:
        TypeError: if ``value`` is not a str.
        ValueError: if it has more than ``space.max_length`` code points.
    """
    if not isinstance(value, str):
        raise TypeError(f"a TextSpace observation must be a str, got {type(value).__name__}")
    if len(value) > space.max_length:
        raise ValueError(
            f"observation of {len(value)} code points does not fit TextSpace(max_length={space.max_length})"
        )
    row = space.max_length + 1
    dest = np.frombuffer(shared_memory.get_obj(), dtype=np.int32)[index * row : (index + 1) * row]
    dest[0] = len(value)
    # UTF-32 is one 4-byte unit per code point; surrogatepass keeps even a lone surrogate intact.
    dest[1 : 1 + len(value)] = np.frombuffer(value.encode("utf-32-le", "surrogatepass"), dtype="<u4")


class SharedTextBatch(Sequence):
    """A live, read-only view of the ``n`` observations in a TextSpace shared-memory buffer.

    ``AsyncVectorEnv`` calls ``read_from_shared_memory`` once, when it is built, and then returns that
    object (deep-copied unless ``copy=False``) after every ``reset`` and ``step``: for arrays it is a
    view of the buffer. A ``str`` cannot be a view, so this sequence decodes item ``i`` from the buffer
    each time it is read; a deep copy (what the vector env hands out by default) or a pickle is a plain
    ``tuple`` of ``str``, equal to what a ``SyncVectorEnv`` returns.
    """

    def __init__(self, space: TextSpace, shared_memory, n: int):
        self._data = np.frombuffer(shared_memory.get_obj(), dtype=np.int32).reshape((n, space.max_length + 1))

    def __len__(self) -> int:
        return self._data.shape[0]

    def __getitem__(self, i):
        if isinstance(i, slice):
            return tuple(self[j] for j in range(*i.indices(len(self))))
        row = self._data[i]
        return row[1 : 1 + int(row[0])].astype("<u4").tobytes().decode("utf-32-le", "surrogatepass")

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, (tuple, list, SharedTextBatch)) and tuple(self) == tuple(other)

    __hash__ = None  # type: ignore[assignment]  # mutable: its items change with the buffer

    def __deepcopy__(self, memo: dict) -> tuple[str, ...]:
        return tuple(self)

    def __reduce__(self):
        return tuple, (tuple(self),)

    def __repr__(self) -> str:
        return f"SharedTextBatch({tuple(self)!r})"


@read_from_shared_memory.register(TextSpace)
def _read_textspace_from_shared_memory(space: TextSpace, shared_memory, n: int = 1) -> SharedTextBatch:
    """A live view of the ``n`` observations in ``shared_memory`` (see :class:`SharedTextBatch`)."""
    return SharedTextBatch(space, shared_memory, n)
