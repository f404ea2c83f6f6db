"""vLLM as a sampler of forkyard's wave driver: tree-fork rollouts sampled by a vLLM server.

:class:`VLLMSampler` is a :class:`trainer.waves.Sampler` that draws each row's reply from vLLM's OpenAI-compatible
server (``POST /v1/completions``, what users run next to a trainer), the rows of a wave sent at once (vLLM batches
concurrent requests itself). Every request carries the row's token context as token ids (``prompt`` a list of ints:
never re-tokenised), and the reply comes back as token ids (``return_tokens_as_token_ids``) with the log-prob of each
sampled token under the sampling distribution: the server must run with ``--logprobs-mode processed_logprobs`` (after
temperature; vLLM's default, raw log-probs, ignores it) and ``--enable-prefix-caching``, so that a fork's branches
reuse their parent's prefill. A reply ends at a stop id (``stop_token_ids``, kept as the reply's last token, as every
sampler keeps it) or after ``max_new_tokens``.

Streams: a row's reply is drawn by vLLM's per-request generator seeded with one ``getrandbits(32)`` of the row's
stream, taken after the fork-turn hook (:data:`trainer.waves.BeforeDraw`), so a tree's uniform fork-turn draws come
from the base's stream before the action's as in every sampler. The tokens themselves are vLLM's, not the inverse-CDF
draws of the torch samplers: the same seeds give other episodes than the serial loop's (the log-probs of the tokens
drawn agree with the trainer's recompute: 5e-7 nats measured in float32 on a tiny Qwen3, ``tests/integrations/
test_vllm.py``).

Entropy (nats): vLLM returns the top ``top_logprobs`` log-probs of each position, not the whole distribution; the
first token's entropy is estimated from them, the remaining mass counted as one outcome (a lower bound of the true
entropy; exact when the distribution has at most ``top_logprobs`` tokens). Entropy fork selection asks for it before
the reply is drawn: one extra one-token request on the cached prefix.

Rows: sessions with ``ids`` (the context) and ``record(ids, logps, entropy)`` (the reply appended, the action read),
:class:`trainer.trl_rollout.ChatSession` (TRL's tree-fork rollouts), whose ``policy`` gives ``temperature``,
``max_new_tokens`` and ``stops``.
"""

from __future__ import annotations

import functools
import json
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from trainer.rollout import Step
from trainer.waves import BeforeDraw, Row

#: Top log-probs vLLM returns per position for the entropy estimate (vLLM's ``--max-logprobs`` default is 20).
TOP_LOGPROBS = 20


class VLLMError(RuntimeError):
    """The vLLM server refused a request or answered something that is not a completion (its status and text)."""


def _ids(tokens: list[str]) -> list[int]:
    """Token ids of ``return_tokens_as_token_ids`` tokens (``"token_id:123"``)."""
    return [int(t.rsplit(":", 1)[1]) for t in tokens]


def top_entropy(top: dict[str, float]) -> float:
    """Entropy (nats) of a distribution known by its top log-probs ``top`` (token to natural-log prob), the mass they
    leave counted as one outcome: a lower bound of the distribution's entropy (module docstring)."""
    probs = [math.exp(v) for v in top.values()]
    rest = max(0.0, 1.0 - sum(probs))
    return -sum(p * math.log(p) for p in probs + [rest] if p > 0)


class VLLMSampler:
    """Draws a wave's replies from a vLLM OpenAI-compatible server (module docstring).

    Args:
        base_url: the server's root, e.g. ``http://127.0.0.1:8000`` (``/v1/completions`` is appended).
        model: the served model's name (``--served-model-name``, else the path it was started with).
        timeout_s: seconds one request may take.
        top_logprobs: top log-probs per position for the entropy estimate (at most the server's ``--max-logprobs``).
        max_concurrency: most requests in flight at once.
        api_key: sent as a bearer token when given (``vllm serve --api-key``).

    Attributes:
        seconds: ``decode``: wall seconds of the replies' requests; ``prefill``: of entropy requests.

    Raises:
        VLLMError: from :meth:`sample` when the server answers with an error or without log-probs.
        httpx.HTTPError: when the server cannot be reached.
    """

    def __init__(self, base_url: str, model: str, timeout_s: float = 600.0, top_logprobs: int = TOP_LOGPROBS,
                 max_concurrency: int = 64, api_key: str | None = None):
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout_s, headers=headers,
                                   limits=httpx.Limits(max_connections=max_concurrency))
        self.model, self.top_logprobs, self.max_concurrency = model, top_logprobs, max_concurrency
        self.seconds = {"prefill": 0.0, "decode": 0.0}

    def close(self) -> None:
        """Close the HTTP connections."""
        self.client.close()

    def load_weights(self, folder: str) -> None:
        """Sync the server to the weights saved in ``folder`` (``save_pretrained`` of the trained model, the
        architecture the server was started with): vLLM reloads them in place (``reload_weights`` through
        ``POST /collective_rpc``) and drops its prefix cache (whose keys and values the old weights computed).
        Needs the server's development endpoints (``VLLM_SERVER_DEV_MODE=1``, which ``scripts/vllm-serve.sh``
        sets; the script binds to loopback). Every reply sampled after it returns comes from the new weights.

        A model whose output layer is tied to its input embeddings (``tie_word_embeddings`` in its config) is
        refused: vLLM 0.32's in-place reload leaves the tied output layer unloaded ("ParallelLMHead: Failed to load
        weights" in its log, then replies from a broken head); save such a model untied.

        Raises:
            VLLMError: the server refused (no development endpoints: HTTP 404) or failed to load, or the folder's
                model ties its embeddings.
        """
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
            if json.load(f).get("tie_word_embeddings"):
                raise VLLMError(f"{folder}: a model with tied embeddings does not reload in vLLM (its output layer "
                                "stays unloaded); save it with tie_word_embeddings=False")
        for path, body in (("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": folder}}),
                           ("/reset_prefix_cache", None)):
            r = self.client.post(path, json=body)
            if r.status_code != 200:
                raise VLLMError(f"vLLM answered HTTP {r.status_code} to {path}: {r.text[:500]}")

    def complete(self, ids: list[int], max_tokens: int, temperature: float, stops: list[int],
                 seed: int | None) -> dict[str, Any]:
        """One ``/v1/completions`` request after the token context ``ids``: the answer's first choice. Raises
        :class:`VLLMError` on an error answer or one without log-probs."""
        body = {"model": self.model, "prompt": ids, "max_tokens": max_tokens, "temperature": temperature,
                "seed": seed, "logprobs": self.top_logprobs, "return_tokens_as_token_ids": True,
                "stop_token_ids": stops, "skip_special_tokens": False, "n": 1}
        r = self.client.post("/v1/completions", json=body)
        if r.status_code != 200:
            raise VLLMError(f"vLLM answered HTTP {r.status_code}: {r.text[:500]}")
        choice = r.json()["choices"][0]
        if not choice.get("logprobs") or choice["logprobs"].get("token_logprobs") is None:
            raise VLLMError("vLLM answered without log-probs")
        return choice

    def _reply(self, row: Row, seed: int) -> tuple[list[int], list[float], float]:
        p = row.session.policy
        choice = self.complete(row.session.ids, p.max_new_tokens, p.temperature, sorted(p.stops), seed)
        lp = choice["logprobs"]
        ids = _ids(lp["tokens"])
        entropy = top_entropy(lp["top_logprobs"][0]) if ids else 0.0
        return ids, [float(x) for x in lp["token_logprobs"]], entropy

    def entropy(self, row: Row) -> float:
        """The estimated entropy (nats) of the row's next token: a one-token request on its (cached) context."""
        t0 = time.perf_counter()
        p = row.session.policy
        choice = self.complete(row.session.ids, 1, p.temperature, sorted(p.stops), 0)
        self.seconds["prefill"] += time.perf_counter() - t0
        return top_entropy(choice["logprobs"]["top_logprobs"][0])

    def sample(self, rows: list[Row], before_draw: BeforeDraw | None) -> list[Step]:
        """One reply per row, requested together (:class:`trainer.waves.Sampler`)."""
        seeds = []
        for r in rows:
            if before_draw is not None:
                before_draw(r, functools.partial(self.entropy, r))
            seeds.append(r.rng.getrandbits(32))
        t0 = time.perf_counter()
        with ThreadPoolExecutor(min(self.max_concurrency, len(rows)), thread_name_prefix="forkyard-vllm") as pool:
            replies = list(pool.map(self._reply, rows, seeds))
        self.seconds["decode"] += time.perf_counter() - t0
        return [r.session.record(*reply) for r, reply in zip(rows, replies, strict=True)]

    def slots(self, row: Row) -> int:
        """KV-cache slots the row's request holds on the server: its context plus ``max_new_tokens``."""
        return len(row.session.ids) + row.session.policy.max_new_tokens


__all__ = ["TOP_LOGPROBS", "VLLMError", "VLLMSampler", "top_entropy"]
