"""FileQA-v0: answer a question about a real read-only corpus by calling read-only tools in a sandbox.

The corpus is a pinned subset of the CPython standard library sources (built by the sandbox service),
mounted read-only at ``/data`` in every sandbox. Each episode asks one question, generated
deterministically from the corpus and the reset seed, and checked by rule:

``defines``      Which file defines the top-level class or function NAME? (a path such as ``Lib/json/decoder.py``)
``line_count``   How many lines does FILE have? (an integer, as ``wc -l`` counts)
``constant``     What is the value of the module-level constant NAME in FILE? (the literal)
``imports``      How many corpus files import module M? (an integer)
``log_errors``   How many lines of ``/scratch/app.log`` have level ERROR? (the log is generated per episode
                 and written into the sandbox's scratch area by the server at reset, not by a tool)

Optional features (:mod:`envs.features`): :class:`~envs.features.ToolSchemas` (``tool_schemas``, from the
provider's tool registry) and :class:`~envs.features.Demonstrator` (``demo_action``: the menu's informative
call, then the right answer, with probability ``skill``).

Questions are made by :mod:`envs.fileqa_questions`; sandboxes come from an
:class:`envs.sandbox.SandboxProvider` through :class:`envs.sandboxed.SandboxedTextEnv`, the sandbox plumbing
(provider, one sandbox per episode, fork, snapshots, tool calls) FileQA shares with TextToSQL (this module
knows no service or backend).

Actions are tool calls in forkyard's one format: the sandbox's whitelisted tools (``ls``, ``cat``,
``head``, ``tail``, ``wc``, ``grep``, ``find``, ``stat``; positional arguments follow each tool's
parameter order) and ``answer(value)``. Each tool's output is the next observation, prefixed with the turn
and cut to ``max_observation_length`` (4096) characters. A refused call, a tool error or a timeout comes
back as an observation. A call past ``per_turn_timeout_s`` ends the episode as truncated with
``termination_reason="timeout"`` (or, with ``continue_on_timeout=True``, explains and goes on).

The action set is open, but ``info["legal_actions"]`` offers a finite menu for each question (a few useful
and useless tool calls and four candidate answers, sorted) so tabular policies apply.

Hard gates (a minimum of tool calls before an answer, against answer-first shortcuts): ``min_tool_calls`` tool
calls must have run before an answer counts, and every tool in ``required_tools`` must have been called; a gated
answer earns 0 and ``info["gate"]`` says why. Reward 1.0 for a right answer that passes the gates, else 0.0.

A manifest with a content hash ties the question generator to the corpus: if the sandbox's
``/data/MANIFEST.json`` differs from the corpus the questions come from, construction fails with
:class:`~envs.core.EnvInfraError` instead of asking questions with wrong answers.
"""

from __future__ import annotations

import json
import random
from typing import Any

from envs.actions import ToolCall, bind_arguments, format_action, parse_action
from envs.core import EnvInfraError, IllegalActionError, Outcome
from envs.features import mixed_demo
from envs.fileqa_questions import LOG_PATH, QUESTION_KINDS, corpus_facts, draw_question, load_corpus, normalize_answer
from envs.sandboxed import SandboxedTextEnv, infra_errors
from envs.tool_calls import function_tool

__all__ = ["FileQAEnv", "LOG_PATH", "QUESTION_KINDS", "corpus_facts", "load_corpus", "normalize_answer"]

_verified: set[tuple[int, str]] = set()  # (id of a provider, content hash) pairs whose sandbox corpus matched


class FileQAEnv(SandboxedTextEnv):
    """FileQA-v0 (see module docstring).

    Args:
        max_turns: turn budget, >= 1 (default 6).
        backend: ``"local"`` (no Docker), ``"docker"`` (any registered sandbox backend), or the URL of a
            forkyard server; default ``$FORKYARD_BACKEND`` or ``"local"``. The sandbox provider comes from
            :func:`envs.sandbox.provider_for`, and the questions from its :meth:`~envs.sandbox.SandboxProvider.data_dir`
            (with ``"docker"``: the sandbox image's own corpus; with a URL: this host's corpus, which must
            match the server's, else :class:`EnvInfraError`: run the env on the server, ``server_url=``, instead).
        per_turn_timeout_s: deadline of each tool call in seconds, > 0 (default 5).
        continue_on_timeout: if True a timed-out call is explained and the episode goes on.
        min_tool_calls: gate: tool calls needed before an answer counts (default 0).
        required_tools: gate: tool names that must have been called before an answer counts.
        kinds: question kinds to draw from (default all of :data:`QUESTION_KINDS`).
        corpus_dir: where the question generator reads the corpus (default: see ``backend``).
        render_mode: ``None`` or ``"ansi"``.
        sandbox_provider: the sandbox service to take sandboxes from (an :class:`envs.sandbox.SandboxProvider`;
            for snapshots that carry the sandbox, an :class:`~envs.sandbox.ExportingProvider`): a server passes
            its own service here, so every env session it serves runs on the server's backend. ``backend``
            then only names it (default: the provider's ``name``).

    Snapshots (:meth:`snapshot`) carry the sandbox's writable areas (a tar of /scratch and /tmp, with
    modes and mtimes), and :meth:`restore` rebuilds a sandbox from them, in this process or another one;
    a provider that cannot export a sandbox (a server URL) makes :meth:`snapshot` refuse.

    Raises:
        ValueError: on bad arguments. EnvInfraError: if the sandbox backend is unavailable or its corpus
        differs from the generator's.
    """

    tool_family = "files"  # the ``sql`` family belongs to Text-to-SQL
    max_observation_length = 4096
    max_action_length = 1024

    def __init__(self, max_turns: int = 6, backend: str | None = None, per_turn_timeout_s: float = 5.0,
                 continue_on_timeout: bool = False, min_tool_calls: int = 0, required_tools: tuple | list = (),
                 kinds: tuple | list | None = None, corpus_dir: str | None = None, render_mode: str | None = None,
                 sandbox_provider: Any = None):
        if isinstance(kinds, str):
            raise ValueError(f"kinds must be a list of question kinds, e.g. [{kinds!r}], not a str")
        kinds = tuple(kinds) if kinds else QUESTION_KINDS
        if set(kinds) - set(QUESTION_KINDS):
            raise ValueError(
                f"unknown question kinds {sorted(set(kinds) - set(QUESTION_KINDS))}; choose from {QUESTION_KINDS}"
            )
        if not isinstance(per_turn_timeout_s, (int, float)) or not 0 < per_turn_timeout_s <= 60:
            raise ValueError(f"per_turn_timeout_s must be in (0, 60] seconds, got {per_turn_timeout_s!r}")
        if not isinstance(min_tool_calls, int) or min_tool_calls < 0:
            raise ValueError(f"min_tool_calls must be an int >= 0, got {min_tool_calls!r}")
        provider, backend, tools = self._open_provider(backend, sandbox_provider)
        if corpus_dir is None:
            with infra_errors(f"sandbox backend {backend!r} is unavailable"):
                corpus_dir = provider.data_dir()
        super().__init__(provider=provider, backend=backend, tools=tools, per_turn_timeout_s=per_turn_timeout_s,
                         continue_on_timeout=continue_on_timeout, max_turns=max_turns, render_mode=render_mode, kwargs={
            "max_turns": max_turns, "backend": backend, "per_turn_timeout_s": per_turn_timeout_s,
            "continue_on_timeout": continue_on_timeout, "min_tool_calls": min_tool_calls,
            "required_tools": list(required_tools), "kinds": list(kinds), "corpus_dir": corpus_dir})
        self.min_tool_calls = min_tool_calls
        self.required_tools = tuple(required_tools)
        self.kinds = kinds
        self.corpus_dir = corpus_dir
        unknown = set(self.required_tools) - set(self._tools)
        if unknown:
            raise ValueError(f"required_tools {sorted(unknown)} are not sandbox tools {sorted(self._tools)}")
        self._question: dict[str, Any] = {}  # never changed in place: forks share it
        self._check_corpus()

    def _check_corpus(self) -> None:
        manifest, _ = load_corpus(self.corpus_dir)
        if (id(self._provider), manifest["content_hash"]) in _verified:
            return
        sid = self._provider.create().id
        try:
            res = self._provider.exec(sid, "cat", {"path": "MANIFEST.json"})
        finally:
            self._provider.delete(sid)
        try:
            theirs = json.loads(res.stdout).get("content_hash")
        except ValueError:
            theirs = None
        if theirs != manifest["content_hash"]:
            raise EnvInfraError(
                f"the sandbox corpus ({theirs}) differs from the question generator's ({manifest['content_hash']} "
                f"at {self.corpus_dir}); questions would have wrong answers")
        _verified.add((id(self._provider), manifest["content_hash"]))

    # ------------------------------------------------------------------ the task
    def _reset_task(self, options: dict[str, Any] | None) -> str:
        if options:
            raise ValueError(f"FileQA takes no reset options, got {sorted(options)}")
        self._question, files = draw_question(self.corpus_dir, self.kinds, self.np_random)
        self._start_episode(files)
        gates = ""
        if self.min_tool_calls or self.required_tools:
            gates = (f" An answer counts only after at least {self.min_tool_calls} tool call(s)"
                     + (f" including {', '.join(self.required_tools)}" if self.required_tools else "") + ".")
        tools = ", ".join(f"{n}({','.join(p)})" for n, p in self._tools.items())
        return (f"FileQA: {self._question['text']}\nTools: {tools}"
                f"; answer(value) ends the episode. You have {self.max_turns} turn(s).{gates}\n{self._prompt()}")

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The sandbox's whitelisted tools (generated from the provider's tool registry) and ``answer``, as
        JSON-schema tool definitions (:class:`envs.features.ToolSchemas`)."""
        return [*super().tool_schemas(), function_tool(
            "answer", "give the final answer (ends the episode; reward 1 when right)",
            {"value": {"type": ["string", "integer"], "description": "the answer: a number or a path"}})]

    def _prompt(self) -> str:
        return f"Turn {self._turn + 1} of {self.max_turns}: call a tool or answer(value)."

    def _legal_actions(self) -> list[str]:
        q = self._question
        return list(q.get("menu", [])) + [format_action("answer", c) for c in q.get("candidates", [])]

    def _act(self, call: ToolCall) -> Outcome:
        if call.name == "answer":
            return self._answer(call)
        params = self._tools.get(call.name)
        if params is None:
            raise IllegalActionError(f"unknown tool {call.name!r}; tools: {', '.join(sorted(self._tools))}, answer.")
        args = bind_arguments(call, params)
        return self._run_tool(call, args)

    def _run_tool(self, call: ToolCall, args: dict[str, Any]) -> Outcome:
        res = self._exec(call.name, args, during=f"during {call.name}")
        self._calls.append(call.name)
        body = res.stdout
        if res.stderr:
            body += ("\n" if body and not body.endswith("\n") else "") + f"[stderr] {res.stderr}"
        exit_note = [f"[exit code {res.exit_code}]"] if res.status == "ok" and res.exit_code not in (0, None) else []
        return self._tool_outcome(f"[turn {self._turn + 1}] $ {call.text()}\n", body, res, exit_note)

    def _answer(self, call: ToolCall) -> Outcome:
        if len(call.args) + len(call.kwargs) != 1:
            raise IllegalActionError("answer takes exactly one value, e.g. answer(42) or answer('Lib/os.py').")
        value = call.args[0] if call.args else call.kwargs[0][1]
        correct = normalize_answer(value) == normalize_answer(self._question["answer"])
        gate = None
        if len(self._calls) < self.min_tool_calls:
            gate = f"an answer needs at least {self.min_tool_calls} tool call(s) first; {len(self._calls)} ran"
        missing = [t for t in self.required_tools if t not in self._calls]
        if gate is None and missing:
            gate = f"an answer needs a call of {', '.join(missing)} first"
        if gate:
            return Outcome(f"answer({value!r}) does not count: {gate}. Reward 0.", terminated=True, reason="answered",
                           info={"gate": gate, "correct": correct})
        verdict = "correct" if correct else f"wrong; the answer was {self._question['answer']!r}"
        return Outcome(f"answer({value!r}) is {verdict}.", reward=1.0 if correct else 0.0, terminated=True,
                       reason="answered", info={"correct": correct})

    def _task_state(self) -> dict[str, Any]:
        return {"question": self._question, **super()._task_state()}

    def _load_task_state(self, state: dict[str, Any]) -> None:
        super()._load_task_state(state)
        self._question = dict(state["question"])

    def demo_action(self, rng: random.Random, skill: float = 0.0) -> str:
        """A demonstration action (:class:`envs.features.Demonstrator`): with probability ``skill``, the
        scripted play, else a uniformly random action of the menu (``info["legal_actions"]``; ``skill=0``
        draws exactly what a trainer's random-menu fallback draws).

        The scripted play calls the question's informative tool (the menu's first call: ``wc`` of the file,
        ``grep`` of the definition, constant, import or ``ERROR`` lines) when it has not run in this episode,
        then the tools the gates still require, then answers right. The answer comes from the hidden
        question record, but only once the informative tool's output is in the history: for ``line_count``,
        ``defines`` and ``constant`` that output shows the answer; for ``imports`` and ``log_errors`` it
        shows the lines to count (which an observation cut for a small model may hide). At ``max_turns``
        of 2 or more every question is answered right at ``skill=1`` (tested).

        Raises:
            ValueError: if ``skill`` is outside [0, 1].
        """
        return mixed_demo(rng, skill, self._scripted_action, self._legal_actions)

    def _scripted_action(self) -> str:
        """The scripted play's next action (:meth:`demo_action`): the question's informative tool when it has not run
        in this episode, else :meth:`oracle_action`."""
        menu = self._question.get("menu") or []
        if menu and parse_action(menu[0]).name not in self._calls:
            return menu[0]
        return self.oracle_action()

    def oracle_action(self) -> str:
        """The right answer after the tool calls the gates require (uses the hidden answer: for tests)."""
        missing = [t for t in self.required_tools if t not in self._calls]
        if missing or len(self._calls) < self.min_tool_calls:
            tool = missing[0] if missing else "wc"
            return format_action("grep", "x", "Lib/abc.py") if tool == "grep" else format_action(tool, "Lib/abc.py")
        return format_action("answer", self._question["answer"])

