"""CodeRepair-v0: find and fix the bug in a small Python package, editing its files and running its tests in a
sandbox whose workspace the episode changes (and a fork copies).

The task form of the field's code-repair environments (SWE-Gym, arXiv:2412.21139; R2E-Gym, arXiv:2504.07164;
SWE-smith, arXiv:2504.21798: a repository with a bug, tools to read, edit and run tests, reward from held-out tests),
generated offline from the reset seed by :mod:`envs.suite.code_tasks`: a package of two modules of small utility
functions, one made wrong, its visible unit tests (at least one fails), and hidden tests. The package lives in the
episode's sandbox workspace (``/scratch``); every edit and every test run happens **in the sandbox** through the
sandbox service's ``workspace`` tool family (opt-in: the env creates its sandboxes with it), never on the host. A
fork clones the sandbox, so each branch continues from the files as the episode left them, edits included, and
from the live Python session's variables (the ``interpreter`` family: each copy's session takes them by value, see
:mod:`sandbox_server.interpreter_runner`): a branch's next ``python()`` reads as it would had the episode been
replayed up to the fork (a module imported before an edit runs as imported, defaults and attributes of the cells'
functions and classes are kept, one string hash seed), unless a variable could not be carried (an open file, a
generator, a thread: the observation then names it). Not named, and different from a replay: attributes a cell set
on a module, state inside a decorator's wrapper (an ``lru_cache``'s cache), the iteration order of a set (rebuilt by
insertion), a warning shown once (the warnings registry starts empty), a class redefined after its subclasses.

Actions (forkyard's one action format; positional or keyword arguments; paths relative to the workspace):

``ls(path=".")``               list a directory
``cat(path)``                  print a file
``grep(pattern, path=".")``    search the package (extended regex, recursive)
``replace(path, old, new)``    replace the one occurrence of ``old`` in a file (refused when it occurs 0 or 2+
                               times; nothing changes then)
``write(path, text)``          write a whole file
``run_tests()``                run the visible tests (``tests/``, ``python3 -m unittest``; the runner's wall time
                               is cut from the observation, so that equal states read alike)
``python(code)``               run code in the episode's live Python session (variables kept from call to call,
                               working directory the workspace; a last expression's value is printed)
``submit()``                   end the episode: the hidden tests run on the package as it is; reward 1.0 when they
                               all pass, else 0.0. Gated: refused (an invalid action) until the visible tests have
                               run after the last edit.

A failed edit, a failing test run or a script error is an observation, and the episode goes on; a call past
``per_turn_timeout_s`` ends the episode as truncated with ``termination_reason="timeout"`` (or is explained, with
``continue_on_timeout=True``). Out of turns without a submission: truncated, reward 0.

``info["legal_actions"]`` offers a finite menu (tabular policies): ``ls()``, ``cat`` of every module and test file,
``run_tests()``, a ``python()`` probe (the buggy function, reloaded, called on a visible test's arguments), the right
repair and a wrong one (another mutation of the same lines), and ``submit()``. A ``python()`` call counts as an
edit for ``submit()``'s gate (its code can write files).

Optional features (:mod:`envs.features`): :class:`~envs.features.ToolSchemas` and :class:`~envs.features.Demonstrator`
(run the tests, read the failing module, repair it, run the tests again, submit).

The hidden tests are written into the workspace only at ``submit()``, into a folder cleared first (anything the
episode put there is removed), and run there; the reward needs unittest's summary to report every hidden test run
and ``OK``. The package's own code still runs in the same process as the hidden tests, so a policy that edits it to
patch ``unittest`` or to print a forged summary can earn the reward without a fix, as in the field's code envs
(SWE-Gym and R2E-Gym score by tests run in the agent's own environment): check rewarded episodes' diffs when that
matters.
"""

from __future__ import annotations

import random
import re
from typing import Any

from envs.actions import ToolCall, bind_arguments, format_action
from envs.core import IllegalActionError, Outcome
from envs.features import mixed_demo
from envs.sandboxed import SandboxedTextEnv
from envs.suite.code_tasks import FUNCTIONS, draw_task
from envs.tool_calls import function_tool

__all__ = ["ACTIONS", "CodeRepairEnv", "WORKSPACE"]

#: Where the package lives in the sandbox (the service's workspace).
WORKSPACE = "/scratch"
#: The hidden tests' directory, written at ``submit()``.
HIDDEN_DIR = "hidden_tests"
#: The env's actions: {action: (sandbox tool, the action's parameter names, fixed tool arguments)}.
ACTIONS: dict[str, tuple[str, list[str], dict[str, Any]]] = {
    "ls": ("ls", ["path"], {}),
    "cat": ("cat", ["path"], {}),
    "grep": ("grep", ["pattern", "path"], {}),
    "replace": ("replace_in_file", ["path", "old", "new"], {}),
    "write": ("write_file", ["path", "text"], {}),
    "run_tests": ("run_tests", [], {"path": f"{WORKSPACE}/tests"}),
    "python": ("run_cell", ["code"], {}),
    "submit": ("run_tests", [], {"path": f"{WORKSPACE}/{HIDDEN_DIR}"}),
}
_EDITS = ("replace", "write", "python")
#: unittest's summary line with its wall time (``Ran 6 tests in 0.001s``), which the observation drops.
_RAN_IN = re.compile(r"^(Ran \d+ tests?) in [0-9.]+s$", re.M)


class CodeRepairEnv(SandboxedTextEnv):
    """CodeRepair-v0 (see module docstring).

    Args:
        max_turns: turn budget, 1..50 (default 10; the demonstrator takes 6: at 3 or fewer left it repairs at once).
        functions: functions in each package, 2..8 (default 4), over two modules.
        per_turn_timeout_s: deadline of each tool call in seconds, in [1, 60] (default 10).
        continue_on_timeout: if True a timed-out call is explained and the episode goes on.
        backend: ``"local"`` (bubblewrap; needs control groups for the test runs: a root server), ``"docker"``,
            or the URL of a forkyard server; default ``$FORKYARD_BACKEND`` or ``"local"``.
        render_mode: ``None`` or ``"ansi"``.
        sandbox_provider: the sandbox service to take sandboxes from (a server passes its own).

    Raises:
        ValueError: on a bad setting (the message names it and the accepted values).
        EnvInfraError: the sandbox backend is unavailable, or its service lacks the ``workspace`` tools.
    """

    tool_family = "workspace"
    extra_families = ("files", "interpreter")
    sandbox_families = ("workspace", "interpreter")
    needed_tools = ("cat", "grep", "ls", "replace_in_file", "run_cell", "run_tests", "write_file")
    max_observation_length = 6144
    max_action_length = 4096  # the action format's own limit (envs.actions)

    def __init__(self, max_turns: int = 10, functions: int = 4, per_turn_timeout_s: float = 10.0,
                 continue_on_timeout: bool = False, backend: str | None = None, render_mode: str | None = None,
                 sandbox_provider: Any = None):
        if not isinstance(max_turns, int) or isinstance(max_turns, bool) or not 1 <= max_turns <= 50:
            raise ValueError(f"max_turns must be an int in 1..50, got {max_turns!r}")
        if not isinstance(functions, int) or isinstance(functions, bool) or not 2 <= functions <= len(FUNCTIONS):
            raise ValueError(f"functions must be an int in 2..{len(FUNCTIONS)}, got {functions!r}")
        if isinstance(per_turn_timeout_s, bool) or not isinstance(per_turn_timeout_s, (int, float)) \
                or not 1 <= per_turn_timeout_s <= 60:
            raise ValueError(f"per_turn_timeout_s must be a number of seconds in [1, 60], got {per_turn_timeout_s!r}")
        if not isinstance(continue_on_timeout, bool):
            raise ValueError(f"continue_on_timeout must be True or False, got {continue_on_timeout!r}")
        provider, backend, tools = self._open_provider(backend, sandbox_provider)
        super().__init__(provider=provider, backend=backend, tools=tools, per_turn_timeout_s=per_turn_timeout_s,
                         continue_on_timeout=continue_on_timeout, max_turns=max_turns, render_mode=render_mode, kwargs={
            "max_turns": max_turns, "functions": functions, "per_turn_timeout_s": per_turn_timeout_s,
            "continue_on_timeout": continue_on_timeout, "backend": backend})
        self.functions = functions
        self._task: dict[str, Any] = {}  # never changed in place: a new task is a new dict, and forks share it
        self._tested = False  # the visible tests ran after the last edit (submit's gate)

    # ------------------------------------------------------------------ the task
    def _reset_task(self, options: dict[str, Any] | None) -> str:
        if options:
            raise ValueError(f"CodeRepair takes no reset options, got {sorted(options)}")
        seed = int(self.np_random.integers(0, 2**63 - 1))
        task = draw_task(random.Random(seed), self.functions)
        self._task, self._tested = task, False
        self._start_episode({p: t.encode("utf-8") for p, t in task["files"].items()})
        listing = "\n".join(sorted(task["files"]))
        return (f"CodeRepair: the package {task['package']} in {WORKSPACE} has a bug: one function returns wrong "
                f"results. Its files:\n{listing}\nFind the bug and fix it. Tools: ls(path), cat(path), "
                "grep(pattern, path), replace(path, old, new), write(path, text), run_tests(), python(code) (a "
                "Python session that keeps its variables); submit() ends the "
                "episode (allowed once the tests have run after your last edit): hidden tests decide the reward. "
                f"You have {self.max_turns} turn(s).\n{self._prompt()}")

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The eight actions as JSON-schema tool definitions (:class:`envs.features.ToolSchemas`); parameter names
        are the keywords the actions accept."""
        path = {"type": "string", "description": "a path relative to the package's workspace"}
        text = {"type": "string", "maxLength": 3500}
        return [
            function_tool("ls", "list a directory of the workspace", {"path": path}, []),
            function_tool("cat", "print a file", {"path": path}),
            function_tool("grep", "search files for an extended regex, recursively",
                          {"pattern": {"type": "string"}, "path": path}, ["pattern"]),
            function_tool("replace", "replace the one occurrence of old in a file by new (refused when old occurs "
                          "zero or several times)", {"path": path, "old": text, "new": text}),
            function_tool("write", "write a whole file", {"path": path, "text": text}),
            function_tool("run_tests", "run the package's unit tests", {}),
            function_tool("python", "run Python code in the episode's live session (variables kept between calls; "
                          "a last expression's value is printed)", {"code": text}),
            function_tool("submit", "end the episode: hidden tests run on the package (reward 1 when they pass)", {}),
        ]

    def _prompt(self) -> str:
        return f"Turn {self._turn + 1} of {self.max_turns}: call a tool or submit()."

    def _repairs(self) -> list[str]:
        """The menu's two repairs: the right one and a wrong one (the hidden tests fail it)."""
        bug = self._task["bug"]
        return [format_action("replace", bug["path"], bug["buggy"], bug["fixed"]),
                format_action("replace", bug["path"], bug["buggy"], bug["wrong"])]

    def _probe(self) -> str:
        """The menu's ``python()`` probe: the module with the bug reloaded (the session holds it as first imported,
        before any repair: reloaded, it reads the file as it is now) and its buggy function called on a visible
        test's arguments."""
        bug = self._task["bug"]
        module = bug["path"].removesuffix(".py").replace("/", ".")
        return format_action("python", f"import importlib, {module} as m\nimportlib.reload(m)\nm.{bug['probe']}")

    def _legal_actions(self) -> list[str]:
        t = self._task
        if not t:
            return []
        return sorted([format_action("ls")] + [format_action("cat", p) for p in t["modules"] + t["tests"]]
                      + [format_action("run_tests"), format_action("submit"), self._probe()] + self._repairs())

    def _path(self, call: ToolCall, value: Any) -> str:
        if not isinstance(value, str) or not value.strip():
            raise IllegalActionError(f"{call.name}() needs a path as a non-empty quoted string, e.g. "
                                     f"{call.name}({self._task['modules'][0]!r}).")
        return value if value.startswith("/") else f"{WORKSPACE}/{value}"

    def _act(self, call: ToolCall) -> Outcome:
        if call.name not in ACTIONS:
            raise IllegalActionError(f"unknown tool {call.name!r}; the tools are ls(path), cat(path), grep(pattern, "
                                     "path), replace(path, old, new), write(path, text), run_tests(), python(code) "
                                     "and submit().")
        tool, params, fixed = ACTIONS[call.name]
        args = bind_arguments(call, params)
        if call.name == "ls":
            args["path"] = self._path(call, args.get("path") or ".")
        elif call.name == "grep":
            if not isinstance(args.get("pattern"), str) or not args["pattern"]:
                raise IllegalActionError("grep() needs a pattern as a non-empty quoted string, e.g. grep('def ').")
            args["path"] = self._path(call, args.get("path") or ".")
        elif "path" in params:
            args["path"] = self._path(call, args.get("path"))
        for p in ("old", "new", "text", "code"):
            if p in params and not isinstance(args.get(p), str):
                raise IllegalActionError(f"{call.name}() needs {p} as a quoted string.")
        if call.name == "replace" and not args["old"]:
            raise IllegalActionError("replace() needs the text to replace (old) to be non-empty.")
        if call.name == "submit":
            return self._submit(call)
        res = self._exec(tool, {**args, **fixed}, during=f"during {call.name}")
        self._calls.append(call.text())
        if call.name in _EDITS:  # any edit that ran, even one whose result was cut or failed midway
            self._tested = False
        if call.name == "run_tests" and res.status == "ok":
            self._tested = True
        body = (res.stdout + res.stderr).rstrip("\n") or res.message or "(no output)"
        if call.name == "run_tests":  # the runner's wall time would make equal states read apart (anchors, replays)
            body = _RAN_IN.sub(r"\1", body)
        if call.name == "run_tests" and res.status == "ok":
            body += "\n" + ("[the tests pass]" if res.exit_code == 0 else "[some tests fail]")
        notes: list[str] = []
        if call.name == "python":  # its own notes say what the sandbox's message would
            body, notes = (res.stdout + res.stderr).rstrip("\n") or "(no output)", _session_notes(res)
        return self._tool_outcome(f"[turn {self._turn + 1}] {call.text()}\n", body, res, notes)

    def _submit(self, call: ToolCall) -> Outcome:
        if not self._tested:
            raise IllegalActionError("submit() is allowed once the tests have run after your last edit: call "
                                     "run_tests() first.")
        hidden = f"{WORKSPACE}/{HIDDEN_DIR}"
        cleared = self._exec("remove", {"path": hidden}, during="while submitting")  # whatever the episode put there
        if cleared.exit_code != 0 and "No such file" not in cleared.stderr:
            return self._refused_submission(call, f"the hidden tests' folder could not be cleared "
                                                  f"({cleared.stderr.strip()[-200:]})")
        for name, text in (("__init__.py", ""), ("test_hidden.py", self._task["hidden"])):
            wrote = self._exec("write_file", {"path": f"{hidden}/{name}", "text": text}, during="while submitting")
            if wrote.status != "ok" or wrote.exit_code != 0:  # the episode put something in the way
                return self._refused_submission(call, f"the hidden tests could not be written "
                                                      f"({wrote.stderr.strip()[-200:]})")
        res = self._exec("run_tests", {"path": hidden}, during="while the hidden tests ran")
        want = self._task["hidden"].count("    def test_")
        lines = (res.stderr or "").strip().splitlines()
        ran = next((ln for ln in reversed(lines) if ln.startswith("Ran ")), "")
        passed = (res.status == "ok" and res.exit_code == 0 and ran.startswith(f"Ran {want} test")
                  and bool(lines) and lines[-1].startswith("OK"))
        tail = lines[-1:] or [res.status]
        verdict = "the hidden tests pass: reward 1." if passed else f"the hidden tests fail ({tail[0]}): reward 0."
        return Outcome(f"{call.text()}: {verdict}", reward=1.0 if passed else 0.0, terminated=True,
                       reason="submitted", info={"correct": passed, "tool_status": res.status})

    def _refused_submission(self, call: ToolCall, why: str) -> Outcome:
        return Outcome(f"{call.text()}: {why}; reward 0.", terminated=True, reason="submitted",
                       info={"correct": False})

    # ------------------------------------------------------------------ snapshots (the sandbox: the base class)
    def _task_state(self) -> dict[str, Any]:
        return {"task": self._task, "tested": self._tested, **super()._task_state()}

    def _load_task_state(self, state: dict[str, Any]) -> None:
        super()._load_task_state(state)
        self._task, self._tested = dict(state["task"]), bool(state["tested"])

    # ------------------------------------------------------------------ demonstrations
    def demo_action(self, rng: random.Random, skill: float = 0.0) -> str:
        """A demonstration action (:class:`envs.features.Demonstrator`): with probability ``skill`` the scripted
        play (:meth:`oracle_action`), else a uniformly random action of the menu.

        Raises:
            ValueError: if ``skill`` is outside [0, 1].
        """
        return mixed_demo(rng, skill, self.oracle_action, self._legal_actions)

    def oracle_action(self) -> str:
        """The scripted play: ``run_tests()``, ``cat`` of the module with the bug, the ``python()`` probe of the buggy
        function, the right ``replace``, ``run_tests()`` again, ``submit()``; with three turns left or fewer it
        repairs at once (the reading steps give way). Uses the hidden location of the bug."""
        bug = self._task["bug"]
        fix = self._repairs()[0]
        taken = [a for a, _ in self._history]
        left = self.max_turns - self._turn
        if fix in taken:
            return format_action("submit") if self._tested else format_action("run_tests")
        plan = [format_action("run_tests"), format_action("cat", bug["path"]), self._probe(), fix]
        pending = [a for a in plan if a not in taken]
        if left <= 3:  # the repair, the test run and the submission still fit
            return fix
        return pending[0]


def _session_notes(res: Any) -> list[str]:
    """Notes of a ``python()`` call on the live session (``ToolResult.session``, ``carried``, ``not_carried``,
    ``message``): a new session with no variables, one in a copy that could not carry every variable (each named),
    one the cell ended (the sandbox's reason), and what the sandbox said of a kept session (a cell that closed its
    output). A copy's session that carried everything gets no note: it reads as the replayed episode's kept session
    does."""
    session = getattr(res, "session", None)
    said = [f"[{res.message}]"] if res.message and res.status != "timeout" else []  # the sandbox's own words
    if session == "ended":
        return said or ["[the cell ended the Python session: its variables are gone]"]
    if session != "started":
        return said
    carried, lost = getattr(res, "carried", None), getattr(res, "not_carried", None) or {}
    if carried is None:
        return ["[a new Python session: no variables from before]"]
    if lost:  # every name the sandbox listed (at most 50, then a count)
        return ["[a new Python session in this copy of the episode; not carried: "
                + "; ".join(f"{k} ({v})" for k, v in sorted(lost.items())) + "]"]
    return []
