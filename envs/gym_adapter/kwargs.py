"""The checks of a client's ``gym_kwargs``: each allowed key's type and range, and the whole object's size.

Kwargs come from untrusted clients of a server (:mod:`envs.gym_adapter`, Security): a profile
(:class:`envs.gym_adapter.profiles.GymProfile`) names the keys it allows, each with one check of this module,
``(name, value) -> value``, which raises ValueError naming the key, the value and what it must be.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

MAX_GYM_KWARGS_CHARS = 4096
#: The largest turn budget (``max_turns``) and wrapped step limit (MiniGrid's ``max_steps``) a client may set.
MAX_TURNS_LIMIT = 1000
#: A check of one key: ``(name, value) -> the value as the wrapped env takes it``; ValueError when refused.
KwargCheck = Callable[[str, Any], Any]


def v_bool(name: str, value: Any) -> bool:
    """A JSON boolean."""
    if not isinstance(value, bool):
        raise ValueError(f"gym_kwargs[{name!r}] must be true or false, got {value!r}")
    return value


def v_float(lo: float, hi: float) -> Callable[[str, Any], float]:
    """The check of a number in ``[lo, hi]`` (an int is taken as a float; a boolean is refused)."""
    def check(name: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= float(value) <= hi:
            raise ValueError(f"gym_kwargs[{name!r}] must be a number in [{lo}, {hi}], got {value!r}")
        return float(value)
    return check


def v_int(lo: int, hi: int) -> Callable[[str, Any], int]:
    """The check of an int in ``lo..hi`` (a boolean is refused)."""
    def check(name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise ValueError(f"gym_kwargs[{name!r}] must be an int in {lo}..{hi}, got {value!r}")
        return value
    return check


def v_choice(*choices: str) -> Callable[[str, Any], str]:
    """The check of one of ``choices``."""
    def check(name: str, value: Any) -> str:
        if value not in choices:
            raise ValueError(f"gym_kwargs[{name!r}] must be one of {list(choices)}, got {value!r}")
        return str(value)
    return check


def v_lake_map(name: str, value: Any) -> list[str]:
    """A FrozenLake ``desc``: 2..12 rows of equal length 2..12 over ``SFHG``, one ``S``, at least one ``G``."""
    ok = (isinstance(value, list) and 2 <= len(value) <= 12 and all(isinstance(r, str) for r in value)
          and len({len(r) for r in value}) == 1 and 2 <= len(value[0]) <= 12
          and set("".join(value)) <= set("SFHG") and "".join(value).count("S") == 1 and "G" in "".join(value))
    if not ok:
        raise ValueError(f"gym_kwargs[{name!r}] must be 2..12 equal rows of 2..12 letters S F H G with one S "
                         f"and a G, got {value!r}")
    return list(value)


def parse_gym_kwargs(gym_id: str, allowed: Mapping[str, KwargCheck],
                     gym_kwargs: dict[str, Any] | str | None) -> dict[str, Any]:
    """The checked ``gym_kwargs`` as plain JSON data (a dict), from a dict, its JSON text or None.

    Raises:
        ValueError: text over :data:`MAX_GYM_KWARGS_CHARS`, not a JSON object, a key the id does not allow, or a
            value its check refuses.
    """
    if gym_kwargs is None:
        return {}
    if isinstance(gym_kwargs, str):
        if len(gym_kwargs) > MAX_GYM_KWARGS_CHARS:
            raise ValueError(f"gym_kwargs text is {len(gym_kwargs)} characters long; the limit is "
                             f"{MAX_GYM_KWARGS_CHARS}")
        try:
            gym_kwargs = json.loads(gym_kwargs)
        except json.JSONDecodeError as exc:
            raise ValueError(f"gym_kwargs is not valid JSON: {exc}") from None
    if not isinstance(gym_kwargs, dict):
        raise ValueError(f"gym_kwargs must be a JSON object (dict), got {type(gym_kwargs).__name__}")
    if len(json.dumps(gym_kwargs, default=str)) > MAX_GYM_KWARGS_CHARS:
        raise ValueError(f"gym_kwargs is longer than {MAX_GYM_KWARGS_CHARS} characters as JSON")
    unknown = sorted(str(k) for k in gym_kwargs if k not in allowed)
    if unknown:
        raise ValueError(f"{gym_id} takes no gym_kwargs {unknown} here; allowed: {sorted(allowed) or 'none'}")
    return {k: allowed[k](k, v) for k, v in sorted(gym_kwargs.items())}
