"""FileQA-v0: answer a question about a real read-only corpus by calling read-only tools in a sandbox.

The corpus is a pinned subset of the CPython standard library sources (``sandbox_server.corpus``),
mounted read-only at ``/data`` in every sandbox. Each episode asks one question, generated
deterministically from the corpus and the reset seed, and checked by rule:

``defines``      Which file defines the top-level class or function NAME? (a path such as ``Lib/json/decoder.py``)
``line_count``   How many lines does FILE have? (an integer, as ``wc -l`` counts)
``constant``     What is the value of the module-level constant NAME in FILE? (the literal)
``imports``      How many corpus files import module M? (an integer)
``log_errors``   How many lines of ``/scratch/app.log`` have level ERROR? (the log is generated per episode
                 and written into the sandbox's scratch area by the server at reset, not by a tool)

Actions are tool calls in forkyard's one format: the sandbox's whitelisted tools (``ls``, ``cat``,
``head``, ``tail``, ``wc``, ``grep``, ``find``, ``stat``; positional arguments follow each tool's
parameter order) and ``answer(value)``. Each tool's output is the next observation, prefixed with the turn
and cut to ``max_observation_length`` (4096) characters. A refused call, a tool error or a timeout comes
back as an observation. A call past ``per_turn_timeout_s`` ends the episode as truncated with
``termination_reason="timeout"`` (or, with ``continue_on_timeout=True``, explains and goes on).

The action set is open, but ``info["legal_actions"]`` offers a finite menu for each question (a few useful
and useless tool calls and four candidate answers, sorted) so tabular policies apply.

Hard gates (seed article 000, section 5.3): ``min_tool_calls`` tool calls must have run before an answer
counts, and every tool in ``required_tools`` must have been called; a gated answer earns 0 and
``info["gate"]`` says why. Reward 1.0 for a right answer that passes the gates, else 0.0.

A manifest with a content hash ties the question generator to the corpus: if the sandbox's
``/data/MANIFEST.json`` differs from the corpus the questions come from, construction fails with
:class:`~envs.core.EnvInfraError` instead of asking questions with wrong answers.
"""

from __future__ import annotations

import ast
import atexit
import base64
import json
import os
import threading
from functools import lru_cache
from typing import Any

from envs.actions import ToolCall, bind_arguments, format_action
from envs.core import EnvInfraError, IllegalActionError, Outcome, TextEnv

QUESTION_KINDS = ("defines", "line_count", "constant", "imports", "log_errors")
LOG_PATH = "/scratch/app.log"

_providers: dict[str, Any] = {}
_providers_lock = threading.Lock()
_inherited: list[Any] = []  # a forked child's copies of its parent's providers (never used, never closed)


def _forget_inherited_providers() -> None:
    """In a forked child (an async vector env's worker), the parent's sandbox services are not ours:
    their agents' pipes and sockets are shared with the parent, and their threads did not survive the
    fork. Forget them (without closing: the parent still uses them); the child starts its own."""
    global _providers_lock
    _inherited.extend(_providers.values())  # kept referenced: no finalizer of theirs may run in the child
    _providers.clear()
    _verified.clear()
    _providers_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_inherited_providers)
_verified: set[tuple[int, str]] = set()  # (id of a provider, content hash) pairs whose sandbox corpus matched


def _default_corpus(provider: Any, backend: str) -> str:
    """Where the question generator reads the corpus: the provider's data folder (a local backend, or a
    docker backend with a bind-mounted corpus), else its image's corpus, else the local corpus."""
    from sandbox_server.corpus import ensure_corpus

    sandbox_backend = getattr(provider, "backend", None)
    data_dir = getattr(sandbox_backend, "data_dir", None)
    if data_dir:
        return data_dir
    image = getattr(sandbox_backend, "image", None)
    if image:
        return image_corpus(image)
    return image_corpus(sandbox_image()) if backend == "docker" else ensure_corpus()


def shared_provider(backend: str):
    """The sandbox provider of a backend, shared by every env of this process.

    ``"local"`` / ``"docker"``: an in-process ``SandboxService`` over that backend (started on first use,
    closed at exit); a URL: a ``SandboxClient`` for a forkyard server. Both have the same methods
    (``create``, ``exec``, ``fork``, ``delete``, ``tools``).

    Raises:
        EnvInfraError: if the backend cannot start (e.g. the Docker engine is down).
    """
    with _providers_lock:
        if backend in _providers:
            return _providers[backend]
        from sandbox_server.errors import SandboxError

        try:
            if backend.startswith(("http://", "https://")):
                from sandbox_server.client import SandboxClient

                provider = SandboxClient(backend)
            elif backend in ("local", "docker"):
                from sandbox_server.backends import make_backend
                from sandbox_server.service import SandboxService, ServiceConfig

                kw = {"image": sandbox_image()} if backend == "docker" else {}
                provider = SandboxService(make_backend(backend, **kw), ServiceConfig.from_env()).start(wait=False)
                atexit.register(provider.close)
            else:
                raise ValueError(f"backend must be 'local', 'docker' or an http(s) URL, got {backend!r}")
        except SandboxError as exc:
            raise EnvInfraError(f"sandbox backend {backend!r} is unavailable: {exc}") from exc
        _providers[backend] = provider
        return provider


def sandbox_image() -> str:
    """The sandbox image the docker backend runs: ``$FORKYARD_SANDBOX_IMAGE`` or ``forkyard-sandbox:latest``."""
    return os.environ.get("FORKYARD_SANDBOX_IMAGE", "forkyard-sandbox:latest")


def image_corpus(image: str) -> str:
    """Copy ``/data`` out of a sandbox image into a host cache folder (once per image id) and return it.

    The image builds its corpus from its own Python's standard library, which may differ from the host's,
    so FileQA on the docker backend generates its questions from exactly these files. Uses a created,
    never started container, removed at once.

    Raises:
        EnvInfraError: if the engine or the image is unavailable.
    """
    import io
    import shutil
    import tarfile
    import tempfile

    client = None
    try:
        import docker

        client = docker.from_env()
        img = client.images.get(image)
    except Exception as exc:  # noqa: BLE001 - docker's errors are many; all mean "no corpus from the image"
        if client is not None:
            client.close()
        raise EnvInfraError(f"cannot read the corpus of image {image!r}: {exc}") from exc
    cache = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "forkyard")
    dest = os.path.join(cache, f"corpus-image-{img.id.split(':')[-1][:16]}")
    try:
        if os.path.isfile(os.path.join(dest, "MANIFEST.json")):
            return dest
        container = client.containers.create(image, command=["true"], network_mode="none")
        try:
            stream, _ = container.get_archive("/data")
            data = b"".join(stream)
        finally:
            container.remove(force=True)
    finally:
        client.close()  # one client per call: never leave its socket to the garbage collector
    os.makedirs(cache, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=cache)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        # Plain files and folders under data/ only (Python < 3.11.4 has no extraction filters).
        safe = [m for m in tar.getmembers()
                if (m.isfile() or m.isdir()) and m.name.split("/")[0] == "data" and ".." not in m.name.split("/")]
        tar.extractall(tmp, members=safe)
    try:
        os.replace(os.path.join(tmp, "data"), dest)
    except OSError:  # another process won the race: its copy is the same
        pass
    shutil.rmtree(tmp, ignore_errors=True)
    return dest


@lru_cache(maxsize=4)
def load_corpus(root: str) -> tuple[dict, dict[str, str]]:
    """``(manifest, {relative path: text})`` of the corpus at ``root`` (files under ``Lib/``)."""
    from sandbox_server.corpus import load_manifest

    manifest = load_manifest(root)
    texts = {}
    for rel in manifest["files"]:
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            texts[rel] = f.read()
    return manifest, texts


@lru_cache(maxsize=4)
def corpus_facts(root: str) -> dict[str, Any]:
    """Facts the questions are drawn from, computed once per corpus: unique top-level definitions,
    line counts, simple module-level constants, and which files import which modules."""
    _, texts = load_corpus(root)
    defined: dict[str, list[str]] = {}
    constants: list[tuple[str, str, Any]] = []
    importers: dict[str, set[str]] = {}
    for path, text in sorted(texts.items()):
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        names_here: dict[str, int] = {}
        for node in tree.body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and not node.name.startswith("_"):
                defined.setdefault(node.name, []).append(path)
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                names_here[node.targets[0].id] = names_here.get(node.targets[0].id, 0) + 1
        for node in tree.body:
            if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                    and node.targets[0].id.isupper() and names_here[node.targets[0].id] == 1
                    and isinstance(node.value, ast.Constant) and type(node.value.value) in (int, str)
                    and len(str(node.value.value)) <= 40 and "\n" not in str(node.value.value)):
                constants.append((path, node.targets[0].id, node.value.value))
        for node in ast.walk(tree):
            mods = []
            if isinstance(node, ast.Import):
                mods = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                mods = [node.module.split(".")[0]]
            for m in mods:
                importers.setdefault(m, set()).add(path)
    unique_defs = sorted((name, paths[0]) for name, paths in defined.items() if len(paths) == 1)
    popular = sorted((m, len(files)) for m, files in importers.items() if 2 <= len(files) <= 12)
    lines = sorted((p, t.count("\n")) for p, t in texts.items())
    return {"defines": unique_defs, "constants": sorted(constants, key=repr), "imports": popular, "lines": lines,
            "paths": sorted(texts)}


_OFFSETS = (-10, -5, -3, -2, -1, 1, 2, 3, 5, 10)


def _numeric_candidates(n: int, rng) -> list[int]:
    """``n`` and three distinct non-negative distractors at random offsets, sorted: the right answer's
    rank among the candidates varies from question to question, so a policy cannot learn a position."""
    offsets = [o for o in _OFFSETS if n + o >= 0]
    picks = [offsets[int(i)] for i in rng.choice(len(offsets), 3, replace=False)]
    return sorted({n, *(n + o for o in picks)})


def normalize_answer(value: Any) -> str:
    """Canonical form for comparing answers: stripped text, ``./`` and ``/data/`` dropped, quotes removed,
    integers in decimal (``'42'`` and ``42`` compare equal)."""
    text = str(value).strip().strip("'\"").strip()
    for prefix in ("/data/", "./"):
        if text.startswith(prefix):
            text = text[len(prefix):]
    try:
        return str(int(text))
    except ValueError:
        return text


class FileQAEnv(TextEnv):
    """FileQA-v0 (see module docstring).

    Args:
        max_turns: turn budget, >= 1 (default 6).
        backend: ``"local"`` (no Docker), ``"docker"``, or the URL of a forkyard server; default
            ``$FORKYARD_BACKEND`` or ``"local"``. With ``"docker"`` the questions come from the sandbox
            image's own corpus (:func:`image_corpus`); with a URL, from the local corpus, which must match
            the server's (else :class:`EnvInfraError`): run the env on the server (``server_url=``) instead.
        per_turn_timeout_s: deadline of each tool call in seconds, > 0 (default 5).
        continue_on_timeout: if True a timed-out call is explained and the episode goes on.
        min_tool_calls: gate: tool calls needed before an answer counts (default 0).
        required_tools: gate: tool names that must have been called before an answer counts.
        kinds: question kinds to draw from (default all of :data:`QUESTION_KINDS`).
        corpus_dir: where the question generator reads the corpus (default: see ``backend``).
        render_mode: ``None`` or ``"ansi"``.
        sandbox_provider: the sandbox service to take sandboxes from (an object with ``create``,
            ``exec``, ``fork``, ``delete``, ``tools`` and, for snapshots that carry the sandbox,
            ``export``): a server passes its own ``SandboxService`` here, so every env session it serves
            runs on the server's backend. ``backend`` then only names it (default: the provider's).

    Snapshots (:meth:`snapshot`) carry the sandbox's writable areas (a tar of /scratch and /tmp, with
    modes and mtimes), and :meth:`restore` rebuilds a sandbox from them, in this process or another one;
    a provider that cannot export a sandbox (a server URL) makes :meth:`snapshot` refuse.

    Raises:
        ValueError: on bad arguments. EnvInfraError: if the sandbox backend is unavailable or its corpus
        differs from the generator's.
    """

    blocking = True  # steps wait on a sandbox: servers run them in worker threads
    uses_sandbox = True  # servers pass their own sandbox service as ``sandbox_provider``
    max_observation_length = 4096
    max_action_length = 1024

    def __init__(self, max_turns: int = 6, backend: str | None = None, per_turn_timeout_s: float = 5.0,
                 continue_on_timeout: bool = False, min_tool_calls: int = 0, required_tools: tuple | list = (),
                 kinds: tuple | list | None = None, corpus_dir: str | None = None, render_mode: str | None = None,
                 sandbox_provider: Any = None):
        if sandbox_provider is not None:
            backend = backend or getattr(getattr(sandbox_provider, "backend", None), "name", None) or "provider"
        backend = backend or os.environ.get("FORKYARD_BACKEND", "local")
        kinds = tuple(kinds) if kinds else QUESTION_KINDS
        if set(kinds) - set(QUESTION_KINDS):
            raise ValueError(f"unknown question kinds {sorted(set(kinds) - set(QUESTION_KINDS))}; choose from {QUESTION_KINDS}")
        if not isinstance(per_turn_timeout_s, (int, float)) or not 0 < per_turn_timeout_s <= 60:
            raise ValueError(f"per_turn_timeout_s must be in (0, 60] seconds, got {per_turn_timeout_s!r}")
        if not isinstance(min_tool_calls, int) or min_tool_calls < 0:
            raise ValueError(f"min_tool_calls must be an int >= 0, got {min_tool_calls!r}")
        super().__init__(max_turns=max_turns, render_mode=render_mode, kwargs={
            "max_turns": max_turns, "backend": backend, "per_turn_timeout_s": per_turn_timeout_s,
            "continue_on_timeout": continue_on_timeout, "min_tool_calls": min_tool_calls,
            "required_tools": list(required_tools), "kinds": list(kinds), "corpus_dir": corpus_dir})
        self.backend = backend
        self.per_turn_timeout_s = float(per_turn_timeout_s)
        self.continue_on_timeout = continue_on_timeout
        self.min_tool_calls = min_tool_calls
        self.required_tools = tuple(required_tools)
        self.kinds = kinds
        self._provider = sandbox_provider if sandbox_provider is not None else shared_provider(backend)
        self.corpus_dir = corpus_dir if corpus_dir is not None else _default_corpus(self._provider, backend)
        self._tools = {t.name: list(t.params) for t in self._provider.tools()}
        unknown = set(self.required_tools) - set(self._tools)
        if unknown:
            raise ValueError(f"required_tools {sorted(unknown)} are not sandbox tools {sorted(self._tools)}")
        self._sandbox: str | None = None
        self._question: dict[str, Any] = {}
        self._calls: list[str] = []
        self._check_corpus()

    # ------------------------------------------------------------------ sandbox plumbing
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

    def _release(self) -> None:
        if self._sandbox is not None:
            sid, self._sandbox = self._sandbox, None
            try:
                self._provider.delete(sid)
            except Exception:  # noqa: BLE001 - already gone (TTL) or server down: nothing to free
                pass

    def close(self) -> None:
        """Release the sandbox (the pool destroys and replaces it)."""
        self._release()

    def __del__(self):
        try:
            self._release()
        except Exception:  # noqa: BLE001
            pass

    def _fork_into(self, children: list["FileQAEnv"]) -> None:
        for child in children:
            child._calls = list(self._calls)
            child._question = dict(self._question)
            child._sandbox = None
        if self._sandbox is None:
            return
        from sandbox_server.errors import SandboxError

        try:  # one snapshot, n clones from the warm pool
            boxes = self._provider.fork(self._sandbox, len(children))
        except SandboxError as exc:
            raise EnvInfraError(f"sandbox fork failed: {exc}") from exc
        for child, box in zip(children, boxes):
            child._sandbox = box.id

    # ------------------------------------------------------------------ the task
    def _draw_question(self) -> tuple[dict[str, Any], dict[str, bytes]]:
        facts = corpus_facts(self.corpus_dir)
        rng = self.np_random
        kind = self.kinds[int(rng.integers(len(self.kinds)))]
        files: dict[str, bytes] = {}
        if kind == "defines":
            name, path = facts["defines"][int(rng.integers(len(facts["defines"])))]
            others = [p for p in facts["paths"] if p != path]
            cands = [path] + [others[int(i)] for i in rng.choice(len(others), 3, replace=False)]
            q = {"text": f"Which file under /data/Lib defines the top-level class or function `{name}`? "
                         f"Answer with its path relative to /data, e.g. answer('Lib/json/decoder.py').",
                 "answer": path, "candidates": sorted(cands),
                 "menu": [format_action("grep", f"^(class|def) {name}\\b", "Lib"), format_action("ls", "Lib")]}
        elif kind == "line_count":
            path, n = facts["lines"][int(rng.integers(len(facts["lines"])))]
            cands = _numeric_candidates(n, rng)
            q = {"text": f"How many lines does /data/{path} have (as wc -l counts)? Answer with a number.",
                 "answer": n, "candidates": cands, "menu": [format_action("wc", path), format_action("head", path)]}
        elif kind == "constant":
            path, name, value = facts["constants"][int(rng.integers(len(facts["constants"])))]
            alt = [v for p, n, v in facts["constants"] if type(v) is type(value) and v != value]
            picks = {value} | {alt[int(i)] for i in rng.choice(len(alt), min(3, len(alt)), replace=False)}
            q = {"text": f"What is the value of the module-level constant {name} in /data/{path}? "
                         f"Answer with the value, e.g. answer(10) or answer('utf-8').",
                 "answer": value, "candidates": sorted(picks, key=repr),
                 "menu": [format_action("grep", f"^{name} =", path), format_action("cat", path)]}
        elif kind == "imports":
            module, n = facts["imports"][int(rng.integers(len(facts["imports"])))]
            cands = _numeric_candidates(n, rng)
            q = {"text": f"How many files under /data/Lib import the module `{module}` (with `import {module}` or "
                         f"`from {module} import ...`, at any indentation)? Answer with a number.",
                 "answer": n, "candidates": cands,
                 "menu": [format_action("grep", f"^\\s*(import|from) {module}\\b", "Lib"), format_action("ls", "Lib")]}
        else:  # log_errors
            n_lines = int(rng.integers(40, 120))
            levels = rng.choice(["INFO", "INFO", "WARNING", "ERROR", "DEBUG"], n_lines)
            lines = [f"2026-11-{1 + i % 28:02d} 12:{i % 60:02d}:{(7 * i) % 60:02d} {lvl} worker-{int(rng.integers(8))}: "
                     f"{'request failed' if lvl == 'ERROR' else 'request handled'} id={int(rng.integers(10**6))}"
                     for i, lvl in enumerate(levels)]
            n = sum(1 for lvl in levels if lvl == "ERROR")
            files["app.log"] = ("\n".join(lines) + "\n").encode()
            cands = _numeric_candidates(n, rng)
            q = {"text": f"How many lines of {LOG_PATH} have level ERROR? Answer with a number.",
                 "answer": n, "candidates": cands,
                 "menu": [format_action("grep", "ERROR", LOG_PATH), format_action("wc", LOG_PATH)]}
        q["kind"] = kind
        return q, files

    def _reset_task(self, options: dict[str, Any] | None) -> str:
        from sandbox_server.errors import SandboxError

        if options:
            raise ValueError(f"FileQA takes no reset options, got {sorted(options)}")
        self._release()
        self._question, files = self._draw_question()
        self._calls = []
        try:
            self._sandbox = self._provider.create(files={k: v for k, v in files.items()} or None).id
        except SandboxError as exc:
            raise EnvInfraError(f"no sandbox: {exc}") from exc
        gates = ""
        if self.min_tool_calls or self.required_tools:
            gates = (f" An answer counts only after at least {self.min_tool_calls} tool call(s)"
                     + (f" including {', '.join(self.required_tools)}" if self.required_tools else "") + ".")
        return (f"FileQA: {self._question['text']}\nTools: {', '.join(f'{n}({chr(44).join(p)})' for n, p in self._tools.items())}"
                f"; answer(value) ends the episode. You have {self.max_turns} turn(s).{gates}\n{self._prompt()}")

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
        from sandbox_server.errors import SandboxError, ServiceUnavailable, ToolRefused

        head = f"[turn {self._turn + 1}] $ {call.text()}\n"
        try:
            res = self._provider.exec(self._sandbox, call.name, args, timeout_s=self.per_turn_timeout_s)
        except ToolRefused as exc:
            raise IllegalActionError(f"the sandbox refused the call: {exc}") from None
        except (ServiceUnavailable, SandboxError) as exc:
            raise EnvInfraError(f"sandbox failure: {exc}") from exc
        if res.sandbox_replaced:  # the sandbox failed, not the tool: the episode ends as infra_error
            raise EnvInfraError(f"the sandbox failed during {call.name}: {res.message}")
        self._calls.append(call.name)
        body = res.stdout
        if res.stderr:
            body += ("\n" if body and not body.endswith("\n") else "") + f"[stderr] {res.stderr}"
        notes = []
        if res.truncated:
            notes.append("[output cut at the sandbox's cap]")
        if res.status == "ok" and res.exit_code not in (0, None):
            notes.append(f"[exit code {res.exit_code}]")
        if res.status == "error":
            notes.append(f"[error: {res.message or 'the tool could not run'}]")
        if res.status == "timeout":
            notes.append(f"[timed out after {self.per_turn_timeout_s:g} s]")
            text = head + body + "\n" + " ".join(notes)
            if not self.continue_on_timeout:
                return Outcome(text, truncated=True, reason="timeout", info={"tool_status": "timeout"})
        text = head + body + ("\n" + " ".join(notes) if notes else "")
        return Outcome(text, info={"tool_status": res.status})

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
        return {"question": self._question, "calls": list(self._calls), "sandbox": self._export_sandbox()}

    def _export_sandbox(self) -> str | None:
        """The sandbox's writable areas as base64 tar text (None when the env holds no sandbox).

        Raises:
            EnvInfraError: the provider cannot export a sandbox (a server URL: snapshot the env session on
                the server instead), or the sandbox failed.
        """
        if self._sandbox is None:
            return None
        export = getattr(self._provider, "export", None)
        if export is None:
            raise EnvInfraError(f"{type(self._provider).__name__} cannot export a sandbox, so a snapshot of this "
                                "env could not restore it; run the env on the server (server_url=) and fork there")
        from sandbox_server.errors import SandboxError

        try:
            return base64.b64encode(export(self._sandbox)).decode("ascii")
        except SandboxError as exc:
            raise EnvInfraError(f"could not export the sandbox: {exc}") from exc

    def restore(self, snapshot: Any) -> None:
        """Set this env to a snapshot's state, sandbox included: a new sandbox is made from the snapshot's
        tar of /scratch and /tmp, so every tool answers as it did in the snapshotted env.

        Raises:
            ValueError: a snapshot of another env class or other kwargs (nothing changed).
            EnvInfraError: no sandbox could be made from it (nothing changed).
        """
        from sandbox_server.errors import SandboxError

        snapshot = self._checked_snapshot(snapshot)  # raises before anything changes
        archive = snapshot.state.get("task", {}).get("sandbox")
        new_sandbox = None
        if archive is not None:
            try:
                new_sandbox = self._provider.create(archive=base64.b64decode(archive)).id
            except SandboxError as exc:
                raise EnvInfraError(f"could not rebuild the sandbox of the snapshot: {exc}") from exc
        try:
            super().restore(snapshot)
        except BaseException:
            if new_sandbox is not None:
                self._provider.delete(new_sandbox)
            raise
        self._release()
        self._sandbox = new_sandbox

    def _load_task_state(self, state: dict[str, Any]) -> None:
        self._question = dict(state["question"])
        self._calls = list(state["calls"])

    def oracle_action(self) -> str:
        """The right answer after the tool calls the gates require (uses the hidden answer: for tests)."""
        needed = list(self.required_tools) + ["wc"] * max(0, self.min_tool_calls - len(self.required_tools))
        if len(self._calls) < len(needed):
            tool = needed[len(self._calls)]
            return format_action("grep", "x", "Lib/abc.py") if tool == "grep" else format_action(tool, "Lib/abc.py")
        return format_action("answer", self._question["answer"])
