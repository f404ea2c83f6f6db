"""The JSON codec of Household's emulator state (:mod:`envs.suite.household`, Fork and snapshot): Jericho's saved
state (dynamic memory, stack, program counter, frame and stack pointers, random-number state, last output) as plain
JSON, memory and stack zlib-compressed and base64-encoded; decoding checks every size and pointer against the game
(a malformed snapshot must not make the C emulator read or write out of bounds) and inflates with a limit (no
decompression bomb).
"""

from __future__ import annotations

import base64
import zlib
from typing import Any

import numpy as np

from envs.suite.household_play import EmulatorState, LoadedGame

_STACK_BYTES = 2048  # Jericho's Z-machine stack (1024 words), fixed by libfrotz
_NARRATIVE_MAX = 8191  # libfrotz copies the last output into a char[8192]


def _inflate(text: Any, limit: int) -> bytes:
    """base64 text of zlib data, inflated to at most ``limit`` bytes (ValueError past it: no decompression bomb)."""
    if not isinstance(text, str):
        raise ValueError("expected base64 text")
    inflater = zlib.decompressobj()
    out = inflater.decompress(base64.b64decode(text, validate=True), limit + 1)
    if len(out) > limit or inflater.unconsumed_tail:
        raise ValueError(f"more than {limit} bytes")
    return out


def encode_emulator_state(state: EmulatorState) -> dict[str, Any]:
    """Jericho's emulator state as plain JSON data: memory and stack zlib-compressed and base64-encoded, the last
    output base64-encoded, the rest ints."""
    ram, stack, pc, sp, fp, frames, opcode, rng, narrative = state
    pack = lambda b: base64.b64encode(zlib.compress(bytes(b), 6)).decode("ascii")  # noqa: E731
    return {"ram": pack(np.asarray(ram, dtype=np.uint8).tobytes()),
            "stack": pack(np.asarray(stack, dtype=np.uint8).tobytes()),
            "pc": int(pc), "sp": int(sp), "fp": int(fp), "frame_count": int(frames), "opcode": int(opcode),
            "rng": [int(x) for x in rng], "narrative": base64.b64encode(bytes(narrative)).decode("ascii")}


def decode_emulator_state(data: dict[str, Any], loaded: LoadedGame) -> EmulatorState:
    """Inverse of :func:`encode_emulator_state`, checked against the game (sizes and pointer ranges, so that a
    malformed snapshot cannot make the C emulator read or write out of bounds).

    Raises:
        ValueError: on malformed data.
    """
    try:
        ram = np.frombuffer(_inflate(data["ram"], len(loaded.start[0])), dtype=np.uint8).copy()
        stack = np.frombuffer(_inflate(data["stack"], _STACK_BYTES), dtype=np.uint8).copy()
        narrative = base64.b64decode(data["narrative"], validate=True)
        ints = {k: data[k] for k in ("pc", "sp", "fp", "frame_count", "opcode")}
        rng = data["rng"]
    except (KeyError, TypeError, ValueError, zlib.error) as exc:
        raise ValueError(f"malformed Household emulator state: {exc}") from None
    if not all(type(v) is int for v in ints.values()) or not (
            isinstance(rng, list) and len(rng) == 3 and all(type(v) is int for v in rng)):
        raise ValueError("malformed Household emulator state: pc, sp, fp, frame_count, opcode and rng must be ints")
    if len(ram) != len(loaded.start[0]) or len(stack) != _STACK_BYTES:
        raise ValueError(f"malformed Household emulator state: memory of {len(ram)} bytes and stack of {len(stack)} "
                         f"(the game has {len(loaded.start[0])} and {_STACK_BYTES})")
    words = _STACK_BYTES // 2
    if not (0 <= ints["pc"] < loaded.story_size and 0 <= ints["sp"] <= words and 0 <= ints["fp"] <= words
            and 0 <= ints["frame_count"] < 1 << 16 and 0 <= ints["opcode"] < 1 << 16
            and all(-(1 << 31) <= v < 1 << 31 for v in rng)):
        raise ValueError("malformed Household emulator state: a pointer or counter out of range")
    if len(narrative) > _NARRATIVE_MAX or b"\x00" in narrative:
        raise ValueError("malformed Household emulator state: the last output is too long or holds a NUL")
    return (ram, stack, ints["pc"], ints["sp"], ints["fp"], ints["frame_count"], ints["opcode"], tuple(rng),
            narrative)
