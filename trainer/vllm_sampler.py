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

Rows: two kinds of session.

* :class:`trainer.trl_rollout.ChatSession` (TRL's tree-fork rollouts): ``ids`` (the context) and ``record(ids, logps,
  entropy)`` (the reply appended, the action read); its ``policy`` gives ``temperature``, ``max_new_tokens`` and
  ``stops``.
* :class:`trainer.text.text_policy.TextSession` (``forkyard train-lm --sampler vllm``): the context is the session's
  window (``_pending``: the ids that fit the model context with room for the reply), sampled with the policy's
  ``SamplingConfig`` (temperature, top-p, ``max_new_tokens``) and stop ids; the tokenizer's suppressed ids get a logit
  bias of -100 (the OpenAI API's floor: a probability below e^-100 of the others', never drawn in practice, where the
  torch samplers give exactly 0); each token's entropy is estimated from its top log-probs; the turn is closed by
  ``finish`` as every sampler closes it. Stop strings are refused (vLLM would cut the text, not the token ids).
"""

from __future__ import annotations

import atexit
import functools
import json
import math
import os
import signal
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
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


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to a started server's process group (the script's vLLM processes), SIGKILL after 60 s."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            pass


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
        self._server: subprocess.Popen | None = None  # the server process when launch() started it

    @classmethod
    def connect(cls, base_url: str, **kwargs: Any) -> "VLLMSampler":
        """A sampler of the model ``base_url``'s server serves (the first of ``GET /v1/models``); ``kwargs`` as the
        constructor's. Raises :class:`VLLMError` when the server lists no model, httpx.HTTPError when it cannot be
        reached."""
        r = httpx.get(base_url.rstrip("/") + "/v1/models", timeout=30)
        models = r.json().get("data") if r.status_code == 200 else None
        if not models:
            raise VLLMError(f"{base_url} lists no model (HTTP {r.status_code}): {r.text[:300]}")
        return cls(base_url, models[0]["id"], **kwargs)

    @classmethod
    def launch(cls, folder: str, port: int | None = None, timeout_s: float = 600.0, **kwargs: Any) -> "VLLMSampler":
        """Start vLLM's server on the model ``folder`` on loopback (``scripts/vllm-serve.sh FOLDER PORT``, from the
        venv ``make vllm`` builds; its output in ``FOLDER/vllm.log``, removed with the folder), wait until it lists
        the model, and return a sampler of it that stops the server on :meth:`close` (and at interpreter exit).
        ``port``: None, a free one.

        Raises:
            VLLMError: no ``scripts/vllm-serve.sh`` beside this package (a source checkout has it), or the server
                exited or did not answer within ``timeout_s`` seconds (the log's tail in the message).
        """
        script = Path(__file__).resolve().parents[1] / "scripts" / "vllm-serve.sh"
        if not script.exists():
            raise VLLMError(f"no {script}: start vLLM's server yourself and pass its URL (--vllm-url)")
        if port is None:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
        log = Path(folder) / "vllm.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen([str(script), folder, str(port)], stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + timeout_s
        while True:
            try:
                if httpx.get(f"{url}/v1/models", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                _stop(proc)
                raise VLLMError(f"vLLM's server on {folder} {'exited' if proc.returncode else 'did not answer'}; "
                                f"its log ({log}) ends: {log.read_text(errors='replace')[-1500:]}")
            time.sleep(1.0)
        sampler = cls.connect(url, **kwargs)
        sampler._server = proc
        atexit.register(sampler.close)
        return sampler

    def close(self) -> None:
        """Close the HTTP connections; stop the server when :meth:`launch` started it."""
        self.client.close()
        server, self._server = getattr(self, "_server", None), None
        if server is not None:
            _stop(server)

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
                 seed: int | None, **params: Any) -> dict[str, Any]:
        """One ``/v1/completions`` request after the token context ``ids`` (``params``: more sampling parameters, such
        as ``top_p`` and ``logit_bias``): the answer's first choice. Raises :class:`VLLMError` on an error answer or
        one without log-probs."""
        body = {"model": self.model, "prompt": ids, "max_tokens": max_tokens, "temperature": temperature,
                "seed": seed, "logprobs": self.top_logprobs, "return_tokens_as_token_ids": True,
                "stop_token_ids": stops, "skip_special_tokens": False, "n": 1, **params}
        r = self.client.post("/v1/completions", json=body)
        if r.status_code != 200:
            raise VLLMError(f"vLLM answered HTTP {r.status_code}: {r.text[:500]}")
        choice = r.json()["choices"][0]
        if not choice.get("logprobs") or choice["logprobs"].get("token_logprobs") is None:
            raise VLLMError("vLLM answered without log-probs")
        return choice

    @staticmethod
    def _request(session: Any) -> tuple[list[int], int, dict[str, Any]]:
        """``(context ids, max_new_tokens, sampling parameters)`` of a row's next reply (module docstring, Rows)."""
        p = session.policy
        if not hasattr(session, "finish"):  # a ChatSession
            return session.ids, p.max_new_tokens, {"temperature": p.temperature, "stops": sorted(p.stops)}
        sc, tok = p.sampling, p.tok
        if sc.stop_strings:
            raise ValueError("the vLLM sampler does not take stop strings (it would cut the text, not the token ids)")
        context = session.ids[session._window():]
        return context, sc.max_new_tokens, {"temperature": sc.temperature, "stops": sorted(p.stops), "top_p": sc.top_p,
                                            "logit_bias": {str(i): -100 for i in tok.suppressed_ids}}

    def _reply(self, row: Row, seed: int) -> tuple[list[int], list[float], list[float]]:
        ids, max_tokens, params = self._request(row.session)
        choice = self.complete(ids, max_tokens, params.pop("temperature"), params.pop("stops"), seed, **params)
        lp = choice["logprobs"]
        ents = [top_entropy(t) for t in lp["top_logprobs"]]
        return _ids(lp["tokens"]), [float(x) for x in lp["token_logprobs"]], ents

    def _finish(self, session: Any, reply: tuple[list[int], list[float], list[float]]) -> Step:
        ids, logps, ents = reply
        if not hasattr(session, "finish"):
            return session.record(ids, logps, ents[0] if ents else 0.0)
        stop = "eot" if ids and ids[-1] in session.policy.stops else "max_tokens"
        return session.finish(list(session.ids), session._window(), ids, logps, ents, stop)

    def entropy(self, row: Row) -> float:
        """The estimated entropy (nats) of the row's next token: a one-token request on its (cached) context."""
        t0 = time.perf_counter()
        ids, _, params = self._request(row.session)
        choice = self.complete(ids, 1, params.pop("temperature"), params.pop("stops"), 0, **params)
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
        return [self._finish(r.session, reply) for r, reply in zip(rows, replies, strict=True)]

    def slots(self, row: Row) -> int:
        """KV-cache slots the row's request holds on the server: its context plus ``max_new_tokens``."""
        ids, max_tokens, _ = self._request(row.session)
        return len(ids) + max_tokens


__all__ = ["TOP_LOGPROBS", "VLLMError", "VLLMSampler", "top_entropy"]
