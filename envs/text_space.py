"""A Gymnasium ``Text`` space for real text: any Unicode, any length up to a bound.

``gymnasium.spaces.Text`` checks every character against a finite charset (alphanumeric by default),
so a tool output with a space, a newline, ``é`` or an emoji is *not* contained in it. Listing all of
Unicode as a charset would cost a frozenset of 1.1 million code points, so :class:`TextSpace`
keeps ``Text``'s interface and sampling (over a small printable charset, see ``SAMPLE_CHARSET``) but
defines membership as "a ``str`` of ``min_length..max_length`` code points that encodes to UTF-8"
(lone surrogates, which no UTF-8 byte stream can carry, are rejected).
"""

from __future__ import annotations

import string
from typing import Any

from gymnasium import spaces

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
