"""Rollouts sampled from an OpenAI-compatible server: for evaluation, and for data whose training happens
elsewhere (``forkyard rollout-openai``).

:class:`OpenAIPolicy` is an :class:`trainer.rollout.Actor`: group and tree-fork rollouts run over it as over
forkyard's own policies. Each action is one request:

* ``api="chat"``: ``POST {base_url}/chat/completions`` with the episode's messages (the first observation
  as the user turn; after a structured ``tool_calls`` answer one ``tool`` message per call id, after a call
  written in the content a ``user`` message) and the env's tools (:class:`envs.features.ToolSchemas`) as
  ``tools=``. A structured ``tool_calls`` answer, or a call written in the content (``<tool_call>`` JSON,
  bare JSON, ``name(args)``, reasoning skipped), is read by the one parser of :mod:`envs.tool_calls`: of
  structured calls the first is the action and the others are answered "not executed" (:class:`OpenAISession`,
  field case S34); content is read as every forkyard policy reads text (:func:`envs.tool_calls.parse_model_output`),
  and text that is no single call goes to the env as it is, which answers with its invalid-action observation.
* ``api="completions"``: ``POST {base_url}/completions`` with the messages rendered to one prompt by
  ``render`` (for example a tokenizer's ``apply_chat_template(..., tokenize=False,
  add_generation_prompt=True)``); the completion text is the model output.

Every request asks for ``logprobs`` and passes a seed drawn from the rollout's RNG, so a server that honours
seeds replays. What the server returned is recorded per step (:class:`ServerRecord`): the text, the tool
calls, token log-probs and token ids where the server gives them (vLLM writes tokens as ``token_id:N`` with
``return_tokens_as_token_ids``, passed through ``extra_body``). :func:`require_token_ids` refuses a rollout
for training unless every step carries the sampled ids and their log-probs: training on text that would have
to be re-tokenised trains on tokens that were never sampled (docs/field-notes: the re-tokenisation drift).
The server gives no entropy, so tree rollouts over this policy use uniform fork turns.
"""

from __future__ import annotations

import copy
import json
import math
import random
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import httpx

from envs.actions import ActionParseError
from envs.tool_calls import calls_from_openai, parse_model_output
from trainer.rollout import Rollout, Step

TOKEN_ID = re.compile(r"^token_id:(\d+)$")


@dataclass
class ServerRecord:
    """What the server returned for one action (``Step.data`` of an :class:`OpenAIPolicy` step).

    Attributes:
        text: the model output (message content or completion text; a tool call's JSON when only
            ``tool_calls`` came back).
        tool_calls: the structured tool calls of a chat answer (OpenAI format), if any.
        token_logprobs: [n] natural-log probabilities of the sampled tokens, None when the server gave none.
        token_ids: [n] the sampled token ids, None when the server gave tokens as text only.
        finish_reason: the server's ``finish_reason``.
        parsed: whether ``text`` / ``tool_calls`` mapped to an env action (else the raw text went to the env).
    """

    text: str
    tool_calls: list[dict[str, Any]] | None = None
    token_logprobs: list[float] | None = None
    token_ids: list[int] | None = None
    finish_reason: str | None = None
    parsed: bool = False
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


class OpenAIPolicy:
    """A policy served by an OpenAI-compatible endpoint (module docstring).

    Args:
        base_url: the API root, e.g. ``http://127.0.0.1:8000/v1``.
        model: the ``model`` field of requests.
        tools: the env's tool definitions (``env.tool_schemas()``); None: no ``tools=`` (chat) and actions
            parsed as ``name(args)`` only.
        api: ``"chat"`` or ``"completions"``.
        render: ``messages -> prompt`` for ``api="completions"``.
        temperature, top_p, max_tokens: sampling settings sent with every request.
        extra_body: more JSON fields for every request (server extensions).
        timeout_s: HTTP timeout in seconds.

    Raises:
        ValueError: an unknown ``api``, or ``completions`` without ``render``.
    """

    def __init__(self, base_url: str, model: str, *, tools: list[dict[str, Any]] | None = None, api: str = "chat",
                 render: Callable[[list[dict[str, Any]]], str] | None = None, temperature: float = 1.0,
                 top_p: float = 1.0, max_tokens: int = 64, extra_body: dict[str, Any] | None = None,
                 timeout_s: float = 120.0, api_key: str | None = None):
        if api not in ("chat", "completions"):
            raise ValueError(f"api must be 'chat' or 'completions', got {api!r}")
        if api == "completions" and render is None:
            raise ValueError("api='completions' needs render(messages) -> prompt")
        self.model, self.tools, self.api, self.render = model, tools, api, render
        self.sampling = {"temperature": temperature, "top_p": top_p, "max_tokens": max_tokens}
        self.extra_body = dict(extra_body or {})
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(base_url=base_url.rstrip("/") + "/", timeout=timeout_s, headers=headers)

    def session(self, observation: str, info: dict[str, Any]) -> "OpenAISession":
        return OpenAISession(self, [{"role": "user", "content": observation}], info)

    def request(self, messages: list[dict[str, Any]], seed: int) -> tuple[ServerRecord, dict[str, Any]]:
        """One sampling request for ``messages``: ``(record, assistant message to append)``.
        Raises httpx.HTTPError on a transport failure; httpx.HTTPStatusError on an HTTP error status, its message
        ending with the server's answer (up to 1,000 characters: why it refused, e.g. a prompt past its context)."""
        body: dict[str, Any] = {"model": self.model, "seed": seed, **self.sampling, **self.extra_body}
        if self.api == "chat":
            body.update(messages=messages, logprobs=True)
            if self.tools:
                body["tools"] = self.tools
            r = self.http.post("chat/completions", json=body)
        else:
            body.update(prompt=self.render(messages), logprobs=1)
            r = self.http.post("completions", json=body)
        if r.is_error:
            raise httpx.HTTPStatusError(f"{r.status_code} from {r.request.url}: {r.text[:1000]}", request=r.request,
                                        response=r)
        data = r.json()
        choice = data["choices"][0]
        if self.api == "chat":
            msg = choice.get("message") or {}
            text, calls = msg.get("content") or "", msg.get("tool_calls") or None
            tokens = ((choice.get("logprobs") or {}).get("content") or [])
            token_strs, lps = [t.get("token", "") for t in tokens], [t.get("logprob") for t in tokens]
        else:
            text, calls = choice.get("text") or "", None
            lp = choice.get("logprobs") or {}
            token_strs, lps = lp.get("tokens") or [], lp.get("token_logprobs") or []
        ids = [int(m.group(1)) for m in map(TOKEN_ID.match, token_strs) if m]
        record = ServerRecord(text=text, tool_calls=calls, finish_reason=choice.get("finish_reason"), raw=choice,
                              token_logprobs=[float(x) for x in lps] if lps and None not in lps else None,
                              token_ids=ids if token_strs and len(ids) == len(token_strs) else None)
        reply: dict[str, Any] = {"role": "assistant", "content": text}
        if calls:
            reply["tool_calls"] = calls
        return record, reply


#: The ``tool`` message answering a call of a turn that was not executed (an env step runs one call).
NOT_EXECUTED = "Not executed: the env runs one tool call per turn, and this turn's first call ran."


def _history_calls(calls: list[Any], turn: int) -> list[dict[str, Any]]:
    """The server's ``tool_calls`` as the chat API takes them back in the history: every entry with a string
    ``id`` (``call_{turn}_{i}`` when the server gave none), ``"type": "function"`` and its ``arguments`` as
    a JSON string."""
    out = []
    for i, c in enumerate(calls):
        c = c if isinstance(c, dict) else {}
        fn = c.get("function") if isinstance(c.get("function"), dict) else {}
        args = fn.get("arguments")
        cid = c.get("id") if isinstance(c.get("id"), str) and c.get("id") else f"call_{turn}_{i}"
        name = fn.get("name") if isinstance(fn.get("name"), str) else ""
        args = args if isinstance(args, str) else json.dumps(args if args is not None else {})
        out.append({**c, "id": cid, "type": "function", "function": {**fn, "name": name, "arguments": args}})
    return out


class OpenAISession:
    """One episode branch of an :class:`OpenAIPolicy`: the chat so far.

    Every call of a turn is answered (field case S34), so the chat API accepts the next request: with
    structured ``tool_calls``, the first call is the env action and its ``tool`` message holds the env's
    observation (the invalid-action one when the call does not map, :func:`envs.tool_calls.calls_from_openai`),
    every other call gets a ``tool`` message :data:`NOT_EXECUTED`. A call written in the content
    (:func:`envs.tool_calls.parse_model_output`) has no id: the observation comes back as a ``user`` message.
    """

    def __init__(self, policy: OpenAIPolicy, messages: list[dict[str, Any]], info: dict[str, Any]):
        self.policy, self.messages = policy, messages
        self.turn, self.anchor_key = info.get("turn", 0), info.get("anchor_key", "")
        self.state_key = info.get("state_key", "")
        self._answers: list[tuple[str, str | None]] = []  # (tool_call_id, note; None: the observation)

    def act(self, rng: random.Random) -> Step:
        record, reply = self.policy.request(self.messages, rng.randrange(2**31))
        tools = self.policy.tools or []
        self._answers = []
        if record.tool_calls:
            reply["tool_calls"] = _history_calls(record.tool_calls, self.turn)
            calls = calls_from_openai(reply["tool_calls"], tools)
            first = calls[0]
            # an unmappable call goes to the env as its JSON text, which no env reads as an action
            action = first.action if first.action is not None else first.text
            record.parsed = first.action is not None
            self._answers = [(c["id"], None if i == 0 else NOT_EXECUTED) for i, c in enumerate(reply["tool_calls"])]
        elif self.policy.tools:
            try:
                action, record.parsed = parse_model_output(record.text, tools), True
            except ActionParseError:
                action = record.text  # the env answers with its invalid-action observation
        else:
            action, record.parsed = record.text.strip(), True
        self.messages.append(reply)
        logp = math.fsum(record.token_logprobs) if record.token_logprobs is not None else float("nan")
        return Step(self.turn, self.anchor_key, action, logp, 0.0, record, self.state_key)

    def observe(self, observation: str, info: dict[str, Any]) -> None:
        if self._answers:
            self.messages += [{"role": "tool", "tool_call_id": cid, "content": observation if note is None else note}
                              for cid, note in self._answers]
        else:
            self.messages.append({"role": "user", "content": observation})
        self._answers = []
        self.turn, self.anchor_key = info.get("turn", self.turn), info.get("anchor_key", "")
        self.state_key = info.get("state_key", "")

    def fork(self) -> "OpenAISession":
        twin = copy.copy(self)
        twin.messages = copy.deepcopy(self.messages)
        twin._answers = list(self._answers)
        return twin

    def entropy(self) -> float:
        raise ValueError("an OpenAI-compatible server reports no entropy: use uniform fork turns")


def require_token_ids(rollout: Rollout) -> None:
    """Refuse ``rollout`` for training unless every step holds the ids it sampled and their log-probs.

    Raises:
        ValueError: naming how many steps lack them (the server returned text only, or no log-probs).
    """
    lacking = [s for s in rollout.steps if not isinstance(s.data, ServerRecord) or s.data.token_ids is None
               or s.data.token_logprobs is None or len(s.data.token_ids) != len(s.data.token_logprobs)]
    if lacking:
        raise ValueError(f"{len(lacking)} of {len(rollout.steps)} steps have no sampled token ids with log-probs "
                         "(the server returned text): training on them would re-tokenise text that was never "
                         "sampled as those tokens. Use a server that returns token ids (vLLM: "
                         '--extra-body \'{"return_tokens_as_token_ids": true}\').')


def episode_rows(rollout: Rollout) -> list[dict[str, Any]]:
    """The rollout as JSON-able rows, one per episode: seed, base/branch/fork turn, return, reason, and per
    step the action and what the server returned (text, tool calls, token ids and log-probs when given)."""
    rows = []
    for e in rollout.episodes:
        steps = [{"turn": s.turn, "action": s.action, "text": s.data.text, "tool_calls": s.data.tool_calls,
                  "token_ids": s.data.token_ids, "token_logprobs": s.data.token_logprobs,
                  "finish_reason": s.data.finish_reason, "parsed": s.data.parsed} for s in e.steps]
        rows.append({"seed": e.seed, "base": e.base, "branch": e.branch, "fork_turn": e.fork_turn,
                     "reward": e.reward, "reason": e.reason, "infra_failure": e.infra_failure, "steps": steps})
    return rows
