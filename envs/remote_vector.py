"""A Gymnasium vector env over a forkyard server's batched env routes: ``num_envs`` server sessions driven
with one HTTP request per ``step`` (``POST /v1/envs/batch/step``), not one per session.

``RemoteVectorEnv("forkyard/ClueProbe-v0", "http://localhost:8000", 32, max_turns=5)`` behaves as
``gymnasium.make_vec(id, num_envs=32, vectorization_mode="sync")`` of the same envs: ``reset(seed=s)`` seeds
sub-env i with ``s + i``; ``step(actions)`` returns ``(observations, rewards, terminations, truncations,
infos)`` with observations a tuple of ``num_envs`` strings, rewards a float64 array, terminations and
truncations bool arrays, and infos in Gymnasium's vector form (``infos[key]`` an array over the sub-envs,
``infos["_" + key]`` the mask of those that have it); a sub-env whose episode ended is reset by the next
``step`` (next-step autoreset: its action is ignored, its reward is 0; the reset is unseeded, so it continues
the sub-env's RNG). ``fork`` forks sub-envs on the server into a new vector env; ``close`` closes every
session. The copies share the forked episode, but their autoresets draw independent later episodes: each
server-side copy switches to its own RNG stream, derived per copy (``envs.core.TextEnv.fork``, field case
S40), so a trainer never collects one later episode once per copy.

Per-item errors never vanish. A batch in which an item failed raises :class:`BatchItemError` after the
other items were applied (``failures`` maps each failed sub-env to its :class:`ItemFailure`; ``partial`` is
what the call would have returned, failed sub-envs marked as below); when every failure is the server's or
the session's (404 lost session, 5xx) it is a :class:`BatchInfraError`, which is also an
:class:`~envs.core.EnvInfraError`. With ``errors="mark"`` those infrastructure failures do not raise: the
sub-env is marked in the result instead, as an episode that ended by ``infra_error`` (observation ``""``,
reward 0, ``truncated`` True, ``infos["termination_reason"]`` ``"infra_error"``, ``infos["error"]`` the
failure as a dict) and the next ``step`` resets it (in a new session if its session was lost), which is how
trainers already treat infrastructure failures. Client errors (409 ended episode, 413 action too long, 422
invalid item) always raise; a missing or wrong API key raises ``PermissionError``. A reset of a sub-env whose
session was lost (404: the server restarted, the session expired) opens a new session for it (field case S61).
Used in a fork child, the vector env opens connections of its own; the sessions opened before the fork stay the
parent's: ``reset`` opens the child's own, ``step`` and ``fork`` on the parent's raise
:class:`~envs.process_local.InheritedConnectionError` (field case S59).

Transport: :class:`envs.http_connections.HttpConnections` (one ``httpx.HTTPTransport``), the HTTP connections of
every forkyard env client: keep-alive connections, a timeout per request, retries on connection errors (a
request that was sent is repeated only when that is safe, a batched reset after its connection closed with no
answer: never a step, create, fork or delete, so a step is never applied twice); batches of more than
:data:`BATCH_ITEMS` sub-envs go as several requests. Requests carry the server's API key (``api_key=``, else
``FORKYARD_API_KEY``: :mod:`envs.api_key`); items or requests answered ``503 unavailable`` (nothing ran: the
session cap is full) are sent again after the server's wait for up to ``busy_timeout_s`` seconds
(:mod:`envs.client_retry`).

Why one file: the vector env, its connection and its error types are one client of one protocol (the
batched routes), read together.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from envs.api_key import client_credentials
from envs.client_retry import BUSY_TIMEOUT_S, BusyWait, is_busy, retry_after_s
from envs.core import EnvInfraError
from envs.finalize import run_finalizer
from envs.http_connections import BATCH_ITEMS, HttpConnections, dumps, loads
from envs.process_local import inherited_error
from envs.text_space import TextSpace


def _error_status(data: bytes) -> str | None:
    """The ``status`` of an ErrorBody answer (None when the body is not one)."""
    try:
        body = loads(data)
    except ValueError:
        return None
    return body.get("status") if isinstance(body, dict) else None


@dataclass(frozen=True)
class ItemFailure:
    """One failed item of a batch: what the single-session route would have answered.

    Attributes:
        status_code: the HTTP status (404, 409, 413, 422, 500, 503, ...).
        status: the server's short word (``not_found``, ``conflict``, ``infra_error``, ...).
        detail: what went wrong, in words.
        retry_after_s: with a 503, seconds to wait before retrying; else None.
    """

    status_code: int
    status: str | None
    detail: str
    retry_after_s: int | None = None

    @property
    def infra(self) -> bool:
        """True for a failure of the server or the session (404 lost session, 5xx), not of the request."""
        return self.status_code == 404 or self.status_code >= 500

    def as_dict(self) -> dict[str, Any]:
        return {"status_code": self.status_code, "status": self.status, "detail": self.detail,
                "retry_after_s": self.retry_after_s}


class BatchItemError(Exception):
    """Some items of a batched call failed (the others were applied).

    Attributes:
        failures: sub-env index -> :class:`ItemFailure`.
        partial: what the call would have returned with the failed sub-envs marked (see the module
            docstring); None for ``fork``, which keeps nothing when an item fails.
    """

    def __init__(self, what: str, failures: dict[int, ItemFailure], partial: Any = None):
        shown = "; ".join(f"env {i}: HTTP {f.status_code} {f.detail}" for i, f in list(failures.items())[:5])
        more = f" (and {len(failures) - 5} more)" if len(failures) > 5 else ""
        super().__init__(f"{what}: {len(failures)} item(s) failed: {shown}{more}")
        self.failures = failures
        self.partial = partial


class BatchInfraError(BatchItemError, EnvInfraError):
    """A :class:`BatchItemError` whose failures are all the server's or the session's (404, 5xx)."""


def vector_info(n: int, infos: list[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
    """The infos of sub-envs in Gymnasium's vector form, as ``VectorEnv._add_info`` builds them one by one
    (the same dtypes, masks and nesting), in one pass per key.

    Args:
        n: the number of sub-envs.
        infos: ``(sub-env index, info)`` pairs.

    Returns:
        ``{key: array of shape (n,), "_" + key: bool mask}`` (a nested dict for dict values): int, float
        and bool values in an array of that type (zeros where absent), anything else in an object array
        (None where absent)."""
    if not infos:
        return {}
    idx = [i for i, _ in infos]
    first_keys = infos[0][1].keys()
    columns: dict[str, tuple[list[int], list[Any]]] = {}
    if all(info.keys() == first_keys for _, info in infos):  # the usual case: every info has the same keys
        for key in first_keys:
            columns[key] = (idx, [info[key] for _, info in infos])
    else:
        for i, info in infos:
            for key, value in info.items():
                col = columns.get(key)
                if col is None:
                    columns[key] = ([i], [value])
                else:
                    col[0].append(i)
                    col[1].append(value)
    out: dict[str, Any] = {}
    for key, (where, values) in columns.items():
        first = values[0]
        if isinstance(first, dict):
            array: Any = vector_info(n, [(i, v) for i, v in zip(where, values, strict=True) if isinstance(v, dict)])
        else:
            typ = type(first)
            if typ in (int, float, bool):
                array = np.zeros(n, dtype=typ)
                if all(type(v) is typ for v in values):
                    array[where] = values  # one assignment (values of that exact type convert alike)
                else:
                    for i, v in zip(where, values, strict=True):
                        array[i] = v
            else:
                array = np.full(n, None, dtype=object)
                for i, v in zip(where, values, strict=True):  # one by one: a list value stays one element
                    array[i] = v
        mask = np.zeros(n, dtype=np.bool_)
        mask[where] = True
        out[key], out[f"_{key}"] = array, mask
    return out


class RemoteVectorEnv(gym.vector.VectorEnv):
    """``num_envs`` sessions of ``env_id`` on a forkyard server, stepped with one request per batch.

    Not thread-safe: a vector env and the vector envs forked from it share one connection; call them from
    one thread (or give each thread its own ``RemoteVectorEnv``).

    Args:
        env_id: the registered id the server should run.
        server_url: base URL of the server, e.g. ``http://localhost:8000``.
        num_envs: how many sub-envs (server sessions), >= 1.
        timeout_s: seconds to wait for any one request (a batch of sandbox tool calls included), default 60.
        connect_retries: retries of a failed connection (never of a request that was sent), default 3.
        api_key: the server's API key (default: the key in ``server_url``'s user info, else ``FORKYARD_API_KEY`` or
            ``FORKYARD_API_KEY_FILE``: :func:`envs.api_key.client_credentials`), sent as ``Authorization: Bearer``;
            the URL is kept without its user info (field case S60).
        busy_timeout_s: seconds to keep retrying a request, or the items of one, that the server answered
            ``503 unavailable`` (nothing ran), honouring its wait (:mod:`envs.client_retry`); 0: never.
        errors: ``"raise"`` (default): any failed item raises :class:`BatchItemError`; ``"mark"``:
            infrastructure failures (404, 5xx) mark the sub-env as ended by ``infra_error`` instead.
        autoreset_mode: ``AutoresetMode.NEXT_STEP`` (default, as the envs declare) or ``DISABLED`` (a
            finished sub-env stays finished until ``reset(options={"reset_mask": mask})``).
        **kwargs: the env's constructor kwargs, sent to the server.

    Raises:
        ValueError: ``num_envs`` < 1, an unknown ``errors`` or ``autoreset_mode``, or an API key (or URL user
            info) :func:`envs.api_key.client_credentials` refuses; the message shows no key.
    """

    def __init__(self, env_id: str, server_url: str, num_envs: int, *, timeout_s: float = 60.0,
                 connect_retries: int = 3, errors: str = "raise", api_key: str | None = None,
                 busy_timeout_s: float = BUSY_TIMEOUT_S,
                 autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP, **kwargs: Any):
        if not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs must be an int >= 1, got {num_envs!r}")
        if errors not in ("raise", "mark"):
            raise ValueError(f"errors must be 'raise' or 'mark', got {errors!r}")
        mode = AutoresetMode(autoreset_mode)
        if mode not in (AutoresetMode.NEXT_STEP, AutoresetMode.DISABLED):
            raise ValueError(f"autoreset_mode must be NEXT_STEP or DISABLED, got {mode}")
        self.server_url, key = client_credentials(server_url.rstrip("/"), api_key)
        self.env_id, self.kwargs = env_id, kwargs
        self.num_envs, self.errors, self.autoreset_mode = num_envs, errors, mode
        self.metadata = {"autoreset_mode": mode}
        BusyWait(busy_timeout_s)  # validates it
        self.busy_timeout_s = float(busy_timeout_s)
        self._client = HttpConnections(self.server_url, timeout_s, connect_retries, key)
        self._client_refs = [1]  # shared with forks: the connection closes when the last vector env using it closes
        self.session_ids: list[str | None] = [None] * num_envs
        self._pid = os.getpid()  # the process the sessions belong to (field case S59)
        #: For a vector env made by :meth:`fork`, the index of each sub-env's parent in the forked vector env.
        self.parents: list[int] | None = None
        self._autoreset = np.zeros(num_envs, dtype=np.bool_)
        self._last_obs = [""] * num_envs
        self._batched: dict[tuple[str, int], tuple[gym.Space, gym.Space]] = {}  # shared with forks: _batched_space
        self._set_spaces(8192, 4096)

    # ------------------------------------------------------------------ transport
    def _set_spaces(self, obs_len: int, action_len: int) -> None:
        self.single_observation_space = TextSpace(obs_len)
        self.single_action_space = TextSpace(action_len)
        self._spaces_given: dict[str, gym.Space] = {}  # batched spaces assigned by hand (the setters)

    def _batched_space(self, name: str, single: gym.Space) -> gym.Space:
        """Gymnasium's ``batch_space(single, num_envs)``, built on first use and kept in a cache this vector env
        shares with its forks (so a fork with as many sub-envs gets the very same object): Gymnasium copies and
        seeds one space per sub-env (about 0.35 ms each on 2026-12-02), which neither a constructor nor a
        :meth:`fork` should pay for a space nobody reads."""
        given = self._spaces_given.get(name)
        if given is not None:
            return given
        key = (name, self.num_envs)
        kept = self._batched.get(key)
        if kept is None or kept[0] is not single:  # batched from this very single space, else anew
            kept = self._batched[key] = (single, batch_space(single, self.num_envs))
        return kept[1]

    @property  # type: ignore[override]
    def observation_space(self) -> gym.Space:
        """The batched observation space (``batch_space`` of ``single_observation_space``: a ``Tuple`` of
        ``num_envs`` text spaces), built on first use (:meth:`_batched_space`)."""
        return self._batched_space("observation", self.single_observation_space)

    @observation_space.setter
    def observation_space(self, space: gym.Space) -> None:
        self._spaces_given = {**self._spaces_given, "observation": space}  # a fresh dict: forks keep theirs

    @property  # type: ignore[override]
    def action_space(self) -> gym.Space:
        """The batched action space, built on first use (:meth:`_batched_space`)."""
        return self._batched_space("action", self.single_action_space)

    @action_space.setter
    def action_space(self, space: gym.Space) -> None:
        self._spaces_given = {**self._spaces_given, "action": space}

    def _batch(self, route: str, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``POST /v1/envs/batch/{route}`` in chunks of :data:`BATCH_ITEMS`; one result per item, in order.
        Items (or whole requests) answered ``503 unavailable`` are sent again after the server's wait, for up
        to ``busy_timeout_s`` seconds (nothing of them ran). Raises EnvInfraError (network, 404 or 5xx for the
        whole request) or ValueError (other 4xx)."""
        out: list[dict[str, Any]] = []
        busy = BusyWait(self.busy_timeout_s)  # one budget for the whole call, every chunk and retry included
        for start in range(0, len(items), BATCH_ITEMS):
            chunk = items[start:start + BATCH_ITEMS]
            results = self._post_batch(route, chunk, busy)
            while True:
                waiting = [k for k, r in enumerate(results)  # (a 503 first: the usual 200 costs one lookup)
                           if r.get("status_code") == 503 and is_busy(503, (r.get("error") or {}).get("status"))]
                if not waiting:
                    break
                if not busy.wait(max(retry_after_s(results[k].get("retry_after_s")) for k in waiting)):
                    break
                for k, r in zip(waiting, self._post_batch(route, [chunk[k] for k in waiting], busy), strict=True):
                    results[k] = r
            out.extend(results)
        self._track_leases(route, items, out)
        return out

    def _track_leases(self, route: str, items: list[dict[str, Any]], results: list[dict[str, Any]]) -> None:
        """Hold the leases of the sessions a create or fork made, let go those a delete closed (field case S51)."""
        if route not in ("create", "fork", "delete"):
            return  # steps and resets make no session
        leases = self._client.leases
        if route == "delete":
            leases.discard([it["session_id"] for it in items])
            return
        made: list[str] = []
        for r in results:
            got = r.get("result") if 200 <= r.get("status_code", 0) < 300 else None
            if isinstance(got, dict):
                made += [got["session_id"]] if "session_id" in got else list(got.get("session_ids", []))
        if route in ("create", "fork"):
            leases.add(made)

    def _post_batch(self, route: str, items: list[dict[str, Any]], busy: BusyWait) -> list[dict[str, Any]]:
        """One ``POST /v1/envs/batch/{route}`` of at most :data:`BATCH_ITEMS` items; a whole request answered
        ``503 unavailable`` is sent again while ``busy`` (the call's budget) lasts."""
        path, body = f"/v1/envs/batch/{route}", dumps({"items": items})
        while True:
            status, data, retry_after = self._client.post(path, body)
            if status == 503 and is_busy(status, _error_status(data)):
                if busy.wait(retry_after_s(retry_after)):
                    continue
            if status == 401:
                raise PermissionError(f"POST {path}: HTTP 401: {data[:500].decode('utf-8', 'replace')} "
                                      "(set FORKYARD_API_KEY or api_key=)")
            if status >= 500 or status == 404:
                raise EnvInfraError(f"POST {path}: HTTP {status}: {data[:500].decode('utf-8', 'replace')}")
            if status >= 400:
                raise ValueError(f"POST {path}: HTTP {status}: {data[:500].decode('utf-8', 'replace')}")
            return loads(data)["results"]

    @staticmethod
    def _failure(res: dict[str, Any]) -> ItemFailure:
        err = res.get("error") or {}
        return ItemFailure(res["status_code"], err.get("status"), err.get("detail", ""), res.get("retry_after_s"))

    def _parents_sessions(self, what: str | None) -> None:
        """In a fork child: refuse ``what`` (``"step"``, ``"fork"``) on the parent's sessions, or for a reset
        or a close (``what`` None) leave them to the parent (field case S59)."""
        if self._pid == os.getpid():
            return
        if what is not None and any(s is not None for s in self.session_ids):
            raise inherited_error("the sessions of this RemoteVectorEnv", self._pid, f"{what} is refused: call "
                                  "reset() here to open sessions of this process, or make the vector env here.")
        self.session_ids, self._pid = [None] * self.num_envs, os.getpid()
        self._autoreset = np.zeros(self.num_envs, dtype=np.bool_)

    def _raise_or_mark(self, what: str, failures: dict[int, ItemFailure], partial: Any) -> None:
        if not failures:
            return
        infra = all(f.infra for f in failures.values())
        if self.errors == "mark" and infra:
            return
        raise (BatchInfraError if infra else BatchItemError)(what, failures, partial)

    # ------------------------------------------------------------------ resets
    def _reset_some(self, idx: list[int], seeds: list[int | None], options: dict[str, Any] | None,
                    obs: list[str], infos: list[tuple[int, dict]], failures: dict[int, ItemFailure]) -> None:
        """Reset sub-envs ``idx`` (create a session for those without one); fill ``obs``, ``infos`` (index,
        info), ``failures``."""
        new = [k for k, i in enumerate(idx) if self.session_ids[i] is None]
        old = [k for k, i in enumerate(idx) if self.session_ids[i] is not None]
        answers: dict[int, dict[str, Any]] = {}
        if old:
            done = self._batch("reset", [{"session_id": self.session_ids[idx[k]], "seed": seeds[k],
                                          "options": options} for k in old])
            answers.update(zip(old, done, strict=True))
            new += [k for k in old if answers[k].get("status_code") == 404]  # lost: made anew (field case S61)
        if new:
            made = self._batch("create", [{"env_id": self.env_id, "kwargs": self.kwargs, "seed": seeds[k],
                                           "options": options} for k in new])
            answers.update(zip(new, made, strict=True))
            lost = [r for r in made if r.get("status_code") == 404]  # a create has no session to lose:
            if lost:  # its 404 is an env id the server does not serve, a configuration error
                raise ValueError(f"the server does not serve {self.env_id!r}: {self._failure(lost[0]).detail}")
        for k, i in enumerate(idx):
            res = answers[k]
            if "result" in res:
                data = res["result"]
                self.session_ids[i] = data["session_id"]
                lengths = data["observation_max_length"], data["action_max_length"]
                if lengths != (self.single_observation_space.max_length, self.single_action_space.max_length):
                    self._set_spaces(*lengths)
                obs[i] = data["observation"]
                infos.append((i, data["info"]))
                self._autoreset[i] = False
            else:
                self._mark(i, self._failure(res), obs, infos, failures)

    def _mark(self, i: int, failure: ItemFailure, obs: list[str], infos: list[tuple[int, dict]],
              failures: dict[int, ItemFailure]) -> None:
        failures[i] = failure
        obs[i] = ""
        infos.append((i, {"termination_reason": "infra_error", "error": failure.as_dict()}))
        if failure.infra:
            self._autoreset[i] = True  # the next step resets it (a new session if it was lost)
            if failure.status_code == 404:
                self.session_ids[i] = None

    def reset(self, *, seed: int | Sequence[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[tuple[str, ...], dict[str, Any]]:
        """Reset every sub-env (the first call opens the sessions): ``(observations, infos)``.

        Args:
            seed: None; an int ``s`` (sub-env i gets ``s + i``, as Gymnasium's vector envs do); or one
                seed (or None) per sub-env.
            options: reset options sent to every sub-env; ``options["reset_mask"]`` (a bool array over
                the sub-envs) resets only those marked, the others keep their state (their last observation
                is returned again, and they have no info).

        Raises:
            BatchItemError: an item failed (see the module docstring); ValueError: bad ``seed`` length.
        """
        options = dict(options) if options else None
        mask = np.asarray(options.pop("reset_mask"), dtype=np.bool_) if options and "reset_mask" in options else None
        if seed is None or isinstance(seed, (int, np.integer)):
            seeds = [None if seed is None else int(seed) + i for i in range(self.num_envs)]
        else:
            seeds = list(seed)
            if len(seeds) != self.num_envs:
                raise ValueError(f"{len(seeds)} seeds for {self.num_envs} sub-envs")
        idx = [i for i in range(self.num_envs) if mask is None or mask[i]]
        self._parents_sessions(None)
        infos: list[tuple[int, dict]] = []
        failures: dict[int, ItemFailure] = {}
        obs = list(self._last_obs)
        self._reset_some(idx, [seeds[i] for i in idx], options or None, obs, infos, failures)
        self._last_obs = obs
        result = (tuple(obs), vector_info(self.num_envs, infos))
        self._raise_or_mark("reset", failures, result)
        return result

    # ------------------------------------------------------------------ steps
    def step(self, actions: Sequence[str]
             ) -> tuple[tuple[str, ...], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Take one action in every sub-env: ``(observations, rewards, terminations, truncations, infos)``
        (a tuple of ``num_envs`` strings, float64, bool and bool arrays of shape ``(num_envs,)``, vector
        infos). One request (per :data:`BATCH_ITEMS` sub-envs), plus one for the sub-envs being reset.

        Raises:
            BatchItemError: an item failed (see the module docstring); gymnasium.error.ResetNeeded: before
            :meth:`reset`; ValueError: not one action per sub-env.
        """
        actions = list(actions)
        if len(actions) != self.num_envs:
            raise ValueError(f"{len(actions)} actions for {self.num_envs} sub-envs")
        self._parents_sessions("step")
        if all(s is None for s in self.session_ids) and not self._autoreset.any():  # (marked lost ones: reset now)
            raise gym.error.ResetNeeded("call reset() before step()")
        n = self.num_envs
        infos: list[tuple[int, dict]] = []
        failures: dict[int, ItemFailure] = {}
        obs = [""] * n
        rewards = np.zeros(n, dtype=np.float64)
        terms, truncs = np.zeros(n, dtype=np.bool_), np.zeros(n, dtype=np.bool_)
        next_step = self.autoreset_mode == AutoresetMode.NEXT_STEP
        again = [int(i) for i in np.flatnonzero(self._autoreset)] if next_step else []
        if again:
            self._reset_some(again, [None] * len(again), None, obs, infos, failures)
        skip = set(again)  # being reset this step: their actions are ignored
        go = [i for i in range(n) if i not in skip] if skip else list(range(n))
        if go:
            missing = [i for i in go if self.session_ids[i] is None]
            if missing:
                raise gym.error.ResetNeeded(f"sub-envs {missing} have no session: call reset()")
            sids = self.session_ids
            answers = self._batch("step", [{"session_id": sids[i], "action": actions[i]} for i in go])
            done: list[int] = []  # the sub-envs answered, and their values: written into the arrays at once
            got: tuple[list[float], list[bool], list[bool]] = ([], [], [])
            for i, res in zip(go, answers, strict=True):
                data = res.get("result")
                if data is not None:
                    obs[i] = data["observation"]
                    done.append(i)
                    got[0].append(data["reward"])
                    got[1].append(data["terminated"])
                    got[2].append(data["truncated"])
                    infos.append((i, data["info"]))
                else:
                    self._mark(i, self._failure(res), obs, infos, failures)
                    truncs[i] = failures[i].infra
            if done:
                rewards[done], terms[done], truncs[done] = got
        self._autoreset = np.logical_or(terms, truncs)
        for i in again:  # a reset that failed in mark mode: marked ended, reset again at the next step
            if i in failures:
                truncs[i] = self._autoreset[i] = failures[i].infra
        self._last_obs = obs
        result = (tuple(obs), rewards, terms, truncs, vector_info(n, infos))
        self._raise_or_mark("step", failures, result)
        return result

    # ------------------------------------------------------------------ forks
    def fork(self, n: int | Sequence[int] = 1) -> "RemoteVectorEnv":
        """Fork sub-envs on the server (env, history and sandbox) into a new vector env sharing this one's
        connection: ``n`` copies of every sub-env (an int), or ``n[i]`` copies of sub-env i (0: none). The
        children are ordered by parent (``child.parents[j]`` is child j's parent index) and inherit each
        parent's pending autoreset. Each copy's later (auto)resets draw its own episodes (the module docstring,
        field case S40). All or nothing: if any item fails, the copies made are closed and
        :class:`BatchItemError` is raised (``partial`` None).

        Raises:
            BatchItemError; gymnasium.error.ResetNeeded: a sub-env to fork has no session; ValueError: bad ``n``.
        """
        counts = [n] * self.num_envs if isinstance(n, (int, np.integer)) else [int(c) for c in n]
        if len(counts) != self.num_envs or any(c < 0 for c in counts) or not any(counts):
            raise ValueError(f"fork needs a count >= 0 per sub-env (not all 0), got {n!r}")
        idx = [i for i, c in enumerate(counts) if c]
        self._parents_sessions("fork")
        if any(self.session_ids[i] is None for i in idx):
            raise gym.error.ResetNeeded("call reset() before fork()")
        answers = self._batch("fork", [{"session_id": self.session_ids[i], "n": counts[i]} for i in idx])
        failures = {i: self._failure(res) for i, res in zip(idx, answers, strict=True) if "result" not in res}
        if failures:
            made = [sid for res in answers if "result" in res for sid in res["result"]["session_ids"]]
            self._delete(made)
            raise (BatchInfraError if all(f.infra for f in failures.values()) else BatchItemError)(
                "fork", failures)
        child = object.__new__(RemoteVectorEnv)
        child.__dict__.update(self.__dict__)
        child.session_ids = [sid for res in answers for sid in res["result"]["session_ids"]]
        child.parents = [i for i in idx for _ in range(counts[i])]
        child.num_envs = len(child.session_ids)
        child._autoreset = self._autoreset[child.parents].copy()
        child._last_obs = [self._last_obs[i] for i in child.parents]
        if child.num_envs != self.num_envs:  # single spaces shared; batched ones built if read (_batched_space)
            child._spaces_given = {}
        child._closed = False
        self._client_refs[0] += 1
        return child

    # ------------------------------------------------------------------ closing
    def _delete(self, sids: list[str]) -> None:
        if sids:
            try:
                self._batch("delete", [{"session_id": s} for s in sids])
            except (EnvInfraError, ValueError):
                pass  # the server's TTL reaps what it could not close now

    def close_extras(self, **kwargs: Any) -> None:
        """Close every session (one batched request; the server's TTL reaps them if it is unreachable). The
        connection, shared with forks, closes with the last vector env that uses it."""
        if getattr(self, "_closed", False):
            return
        self._closed = True
        self._parents_sessions(None)
        self._delete([s for s in self.session_ids if s is not None])
        self.session_ids = [None] * self.num_envs
        self._client_refs[0] -= 1
        if self._client_refs[0] <= 0:
            self._client.close()

    def __del__(self):  # best effort: a garbage-collected vector env frees its server sessions, never on a loop
        client = self.__dict__.get("_client")
        if client is not None and not client.closed:
            run_finalizer(self.close)


__all__ = ["BATCH_ITEMS", "BatchInfraError", "BatchItemError", "ItemFailure", "RemoteVectorEnv", "vector_info"]
