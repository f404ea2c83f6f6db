"""The verified replay: a wrapped env brought to a recorded episode's state by replaying its action log from its
seed, every step checked against the record (fork method ``"replay"`` of :mod:`envs.gym_adapter`, and the restore
of a ``"deepcopy"`` env's snapshot).

The record holds one entry per step, the reset first: ``[digest, reward, terminated, truncated]``, where the digest
(:func:`observation_digest`) is a BLAKE2b hash of the raw observation and its text. A replay that differs raises
:class:`ReplayDivergedError` naming the env and the step: never a silently different copy.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np


class ReplayDivergedError(RuntimeError):
    """A fork or restore by seeded replay did not reproduce the recorded episode (the wrapped env is not
    deterministic given its seed and actions): the copy is refused rather than silently different."""


def _feed(h: Any, obj: Any) -> None:
    if isinstance(obj, np.ndarray):
        h.update(f"a{obj.dtype.str}{obj.shape}".encode())
        h.update(np.ascontiguousarray(obj).tobytes())
    elif isinstance(obj, np.generic):
        _feed(h, obj.item())
    elif isinstance(obj, dict):
        h.update(f"d{len(obj)}".encode())
        for k in sorted(obj, key=str):
            _feed(h, str(k))
            _feed(h, obj[k])
    elif isinstance(obj, (list, tuple)):
        h.update(f"l{len(obj)}".encode())
        for x in obj:
            _feed(h, x)
    else:
        h.update(f"{type(obj).__name__}:{obj!r}\x1f".encode("utf-8", "surrogatepass"))


def observation_digest(obs: Any, text: str) -> str:
    """BLAKE2b (16 bytes, hex) of a raw Gymnasium observation (arrays by dtype, shape and bytes) and its text."""
    h = hashlib.blake2b(digest_size=16)
    _feed(h, obs)
    h.update(text.encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def replay_verified(wrapped: Any, seed: int | None, actions: list[Any], trace: list[list[Any]], *,
                    digest: Callable[[Any, Any, bool], str], action_text: Callable[[Any], str], who: str,
                    gym_id: str, what: str) -> Any:
    """``wrapped`` (a new wrapped env, never reset) brought to an episode's state by seeded replay of its action log
    from its wrapped ``seed``, every step verified against its ``trace`` (``[digest, reward, terminated,
    truncated]`` per step, the reset first); with no ``seed`` (no episode yet) ``wrapped`` as it is.

    Args:
        digest: ``(wrapped env, raw observation, ended) -> the digest`` the trace records.
        action_text: an action of the log as the agent wrote it (for the error).
        who: the env in the error, e.g. ``"GymTextEnv('Taxi-v4')"``; ``gym_id``: the wrapped env's id.
        what: the operation in the error (``"fork"``, ``"restore"``).

    Raises:
        ReplayDivergedError: the log and the trace disagree in length, or a step's observation, reward, terminated
            or truncated differs from the record (``wrapped`` is closed first).
    """
    if seed is None:
        return wrapped
    if len(trace) != len(actions) + 1:
        wrapped.close()
        raise ReplayDivergedError(f"cannot {what} {who}: its action log ({len(actions)}) and trace ({len(trace)}) "
                                  "disagree")
    obs, _ = wrapped.reset(seed=seed)
    have = [digest(wrapped, obs, False), 0.0, False, False]
    for i, want in enumerate(trace):
        if i > 0:
            obs, reward, terminated, truncated, _ = wrapped.step(actions[i - 1])
            ended = bool(terminated or truncated)
            have = [digest(wrapped, obs, ended), float(reward), bool(terminated), bool(truncated)]
        if list(want) != have:
            wrapped.close()
            where = "the reset observation" if i == 0 else f"step {i} ({action_text(actions[i - 1])})"
            raise ReplayDivergedError(
                f"cannot {what} {who} by seeded replay: replaying its {len(actions)} recorded action(s) from seed "
                f"{seed} gave another {where} than the episode recorded (digest, reward, terminated, truncated: "
                f"recorded {list(want)}, replayed {have}). {gym_id} is not deterministic given its seed and actions, "
                "so it cannot be copied by replay; refusing rather than returning a different copy.")
    return wrapped
