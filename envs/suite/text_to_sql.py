"""TextToSQL-v0: answer a question about a synthetic SQLite database with one SQL query, exploring it with
read-only SQL tools that run in a sandbox.

The task form of the field's text-to-SQL environments (SkyRL's SQL env: multi-turn exploration of a database,
an answer scored by execution match, i.e. the answer query's result set equals the gold query's, as in Spider's
execution accuracy, arXiv:1809.08887), on databases generated from the reset seed so that it runs offline:
:mod:`envs.suite.sql_tasks` draws a domain (a shop, a school, a library), a database of 3 or 4 tables with
foreign keys, and a question of one of :data:`~envs.suite.sql_tasks.KINDS` with its gold query.

The database file is written into the episode's sandbox as ``/scratch/db.sqlite`` when the sandbox is created,
so a fork (the provider clones the sandbox) and a snapshot (a tar of /scratch) carry it. Every query the agent
writes runs **in the sandbox**, never on the host: the tools are the sandbox service's ``sql`` family
(:data:`sandbox_server.tools.TOOLS`; the runner :mod:`sandbox_server.sql_runner` opens the database read-only
behind an authorizer that admits only reads, with a time budget per call and capped output). The gold query
runs on the host only while the task is generated, on the generator's own in-memory copy.

Actions (forkyard's one action format; positional or keyword arguments):

``list_tables()``   the tables with their column and row counts
``describe(table)`` a table's ``CREATE TABLE`` statement, row count and first rows
``query(sql)``      one read-only SQL statement; its result as a text table (at most 50 rows shown)
``answer(sql)``     ends the episode: the query runs in the sandbox (the ``rows`` tool) and its result set is
                    compared with the gold result (:func:`~envs.suite.sql_tasks.same_result`: multisets of rows,
                    lists when the question asks for an order; values normalised). Reward 1.0 when equal, else 0.0.

A refused statement (a write, ``ATTACH``, a pragma, ``load_extension``, two statements), an SQL error or a query
stopped at its budget is an observation, and the episode goes on. A call past ``per_turn_timeout_s`` ends the
episode as truncated with ``termination_reason="timeout"`` (or, with ``continue_on_timeout=True``, is explained
and the episode goes on). An answer query that fails or times out scores 0 (terminated, ``"answered"``).

The action set is open (any SQL), but ``info["legal_actions"]`` offers a finite menu per question so tabular
policies apply: ``list_tables()``, ``describe`` of every table, and ``query`` and ``answer`` of each candidate
query (the gold query and up to three near misses, each with another result; sorted).

Optional features (:mod:`envs.features`): :class:`~envs.features.ToolSchemas` and
:class:`~envs.features.Demonstrator` (list the tables, describe those the question needs, run the gold query,
answer with it).

The sandbox plumbing (provider, one sandbox per episode, fork, snapshots, tool calls and their timeouts and
failures) is :class:`envs.sandboxed.SandboxedTextEnv`'s, shared with FileQA.
"""

from __future__ import annotations

import json
import random
from typing import Any

from envs.actions import ToolCall, bind_arguments, format_action
from envs.core import EnvInfraError, IllegalActionError, Outcome
from envs.features import mixed_demo
from envs.sandboxed import SandboxedTextEnv
from envs.suite.sql_tasks import DOMAINS, KINDS, KINDS_NEEDING_4, MAX_ROWS, MIN_ROWS, draw_task, same_result
from envs.tool_calls import function_tool

__all__ = ["DB_FILE", "SQL_TOOLS", "TextToSQLEnv"]

#: The database's name under /scratch in the sandbox (the ``sql`` tools read ``/scratch/db.sqlite``).
DB_FILE = "db.sqlite"
#: The sandbox tools the env calls (the service's ``sql`` family): {action name: (tool, its parameter names)}.
#: ``answer`` runs the ``rows`` tool, which prints the result set as JSON.
SQL_TOOLS = {"list_tables": ("list_tables", []), "describe": ("describe", ["table"]), "query": ("query", ["sql"]),
             "answer": ("rows", ["sql"])}


class TextToSQLEnv(SandboxedTextEnv):
    """TextToSQL-v0 (see module docstring).

    Args:
        max_turns: turn budget, 1..50 (default 8; the demonstrator needs at most 6).
        domains: the domains to draw from, a list of ``"shop"``, ``"school"``, ``"library"`` (default all).
        kinds: the question kinds to draw from (default all of :data:`~envs.suite.sql_tasks.KINDS` that the
            ``tables`` setting allows).
        rows: rows of the people and items tables, 4..200 (default 12; links: twice as many).
        tables: tables per database, 3 or 4 (default 4: the makers table, which ``count_3way`` needs).
        per_turn_timeout_s: deadline of each tool call in seconds, in [0.5, 60] (default 5). A query's own time
            budget inside the sandbox is 60% of it (at most 20 s): a query that runs that long is stopped there
            and explained, well before the deadline.
        continue_on_timeout: if True a timed-out call is explained and the episode goes on.
        backend: ``"local"`` (bubblewrap), ``"docker"``, or the URL of a forkyard server; default
            ``$FORKYARD_BACKEND`` or ``"local"`` (:func:`envs.sandbox.provider_for`).
        render_mode: ``None`` or ``"ansi"``.
        sandbox_provider: the sandbox service to take sandboxes from (an :class:`envs.sandbox.SandboxProvider`; an
            :class:`~envs.sandbox.ExportingProvider` for snapshots): a server passes its own service here.

    Snapshots carry the sandbox's writable areas (the database included); :meth:`restore` rebuilds a sandbox
    from them. A provider that cannot export a sandbox (a server URL) makes :meth:`snapshot` refuse.

    Raises:
        ValueError: on a bad setting (the message names it and the accepted values).
        EnvInfraError: the sandbox backend is unavailable, or its service has no ``sql`` tools (an older server).
    """

    tool_family = "sql"  # the database travels with /scratch when the provider clones or exports the sandbox
    needed_tools = tuple(sorted({tool for tool, _ in SQL_TOOLS.values()}))
    max_observation_length = 4096
    max_action_length = 2048

    def __init__(self, max_turns: int = 8, domains: list | tuple | None = None, kinds: list | tuple | None = None,
                 rows: int = 12, tables: int = 4, per_turn_timeout_s: float = 5.0, continue_on_timeout: bool = False,
                 backend: str | None = None, render_mode: str | None = None, sandbox_provider: Any = None):
        if not isinstance(max_turns, int) or isinstance(max_turns, bool) or not 1 <= max_turns <= 50:
            raise ValueError(f"max_turns must be an int in 1..50, got {max_turns!r}")
        domains = _names("domains", domains, tuple(DOMAINS))
        if not isinstance(tables, int) or isinstance(tables, bool) or tables not in (3, 4):
            raise ValueError(f"tables must be 3 or 4, got {tables!r}")
        allowed = tuple(k for k in KINDS if tables == 4 or k not in KINDS_NEEDING_4)
        if tables == 3 and isinstance(kinds, (list, tuple)) and set(kinds) & set(KINDS_NEEDING_4):
            raise ValueError(f"kinds {sorted(set(kinds) & set(KINDS_NEEDING_4))} need tables=4 (a third table "
                             "to join through)")
        kinds = _names("kinds", kinds, allowed)
        if not isinstance(rows, int) or isinstance(rows, bool) or not MIN_ROWS <= rows <= MAX_ROWS:
            raise ValueError(f"rows must be an int in {MIN_ROWS}..{MAX_ROWS}, got {rows!r}")
        if isinstance(per_turn_timeout_s, bool) or not isinstance(per_turn_timeout_s, (int, float)) \
                or not 0.5 <= per_turn_timeout_s <= 60:
            raise ValueError(f"per_turn_timeout_s must be a number of seconds in [0.5, 60], got {per_turn_timeout_s!r}")
        if not isinstance(continue_on_timeout, bool):
            raise ValueError(f"continue_on_timeout must be True or False, got {continue_on_timeout!r}")
        provider, backend, tools = self._open_provider(backend, sandbox_provider)
        super().__init__(provider=provider, backend=backend, tools=tools, per_turn_timeout_s=per_turn_timeout_s,
                         continue_on_timeout=continue_on_timeout, max_turns=max_turns, render_mode=render_mode, kwargs={
            "max_turns": max_turns, "domains": list(domains), "kinds": list(kinds), "rows": rows, "tables": tables,
            "per_turn_timeout_s": per_turn_timeout_s, "continue_on_timeout": continue_on_timeout, "backend": backend})
        self.domains, self.kinds, self.rows, self.tables = domains, kinds, rows, tables
        #: The query's budget inside the sandbox, milliseconds (the runner stops it there: exit status 3).
        self.budget_ms = max(10, min(20000, int(self.per_turn_timeout_s * 600)))
        self._task: dict[str, Any] = {}  # never changed in place: a new task is a new dict, and forks share it

    # ------------------------------------------------------------------ the task
    def _reset_task(self, options: dict[str, Any] | None) -> str:
        if options:
            raise ValueError(f"TextToSQL takes no reset options, got {sorted(options)}")
        task, db = draw_task(self.np_random, self.domains, self.kinds, self.rows, self.tables)
        self._task = task
        self._start_episode({DB_FILE: db})
        order = " The order of the rows counts." if task["ordered"] else " The order of the rows does not count."
        return (f"Text-to-SQL: {task['text']}\nThe SQLite database /scratch/db.sqlite ({len(task['tables'])} tables) "
                "is read-only. Tools: list_tables(), describe(table), query(sql); answer(sql) ends the episode: "
                f"your query's result set is compared with the right one's.{order} You have {self.max_turns} "
                f"turn(s).\n{self._prompt()}")

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The four actions as JSON-schema tool definitions (:class:`envs.features.ToolSchemas`); parameter names
        are the keywords the actions accept."""
        sql = {"type": "string", "description": "one read-only SQLite statement (SELECT / WITH / VALUES)",
               "maxLength": 1024}
        return [
            function_tool("list_tables", "list the database's tables with their column and row counts", {}),
            function_tool("describe", "show a table's CREATE TABLE statement, row count and first rows",
                          {"table": {"type": "string", "description": "the table's name"}}),
            function_tool("query", "run one read-only SQL query; prints the result as a text table (50 rows at most)",
                          {"sql": sql}),
            function_tool("answer", "answer with the SQL query whose result answers the question (ends the episode; "
                          "reward 1 when its result set equals the right query's)", {"sql": sql}),
        ]

    def _prompt(self) -> str:
        return f"Turn {self._turn + 1} of {self.max_turns}: call a tool or answer(sql)."

    def _legal_actions(self) -> list[str]:
        t = self._task
        if not t:
            return []
        return ([format_action("list_tables")] + [format_action("describe", n) for n in t["tables"]]
                + [format_action("query", c) for c in t["candidates"]]
                + [format_action("answer", c) for c in t["candidates"]])

    def _act(self, call: ToolCall) -> Outcome:
        if call.name not in SQL_TOOLS:
            raise IllegalActionError(f"unknown tool {call.name!r}; the tools are list_tables(), describe(table), "
                                     "query(sql) and answer(sql).")
        tool, params = SQL_TOOLS[call.name]
        args = bind_arguments(call, params)
        for p in params:
            if not isinstance(args.get(p), str) or not args[p].strip():
                raise IllegalActionError(f"{call.name}() needs {p} as a non-empty quoted string, e.g. "
                                         + (f"{call.name}('SELECT COUNT(*) FROM t')." if p == "sql"
                                            else f"{call.name}({(self._task.get('tables') or ['t'])[0]!r})."))
        # a statement over the service's 1024-character argument limit is refused: an invalid action
        res = self._exec(tool, {**args, "budget_ms": self.budget_ms},
                         during="while the answer ran" if call.name == "answer" else f"during {call.name}")
        if call.name == "answer":
            return self._answer(call, args["sql"], res)
        self._calls.append(call.text())
        body = res.stdout if res.exit_code == 0 else (res.stderr.strip() or res.message or "the tool failed")
        return self._tool_outcome(f"[turn {self._turn + 1}] {call.text()}\n", body.rstrip("\n"), res)

    def _answer(self, call: ToolCall, sql: str, res: Any) -> Outcome:
        t = self._task
        why, correct = "", False
        if res.status == "timeout":
            why = f"the query timed out after {self.per_turn_timeout_s:g} s"
        elif res.status != "ok" or res.exit_code != 0:
            why = res.stderr.strip() or res.message or "the query failed"
        elif res.truncated:  # a server whose output cap is below the runner's own JSON cap
            why = "its result is larger than the sandbox service's output cap"
        else:
            try:
                got = json.loads(res.stdout)
                rows, cut = got["rows"], bool(got["cut"])
            except (ValueError, KeyError, TypeError):
                raise EnvInfraError(f"the sandbox's rows tool printed no result: {res.stdout[:200]!r}") from None
            if cut:
                why = "its result is larger than any answer (over 1000 rows or 48 000 characters)"
            else:
                correct = same_result(rows, t["gold_rows"], t["ordered"])
                if not correct:
                    why = f"its result ({len(rows)} row(s)) differs from the right one ({len(t['gold_rows'])} row(s))"
        verdict = "correct." if correct else f"wrong: {why}. A right query: {t['gold']}"
        return Outcome(f"{call.text()} is {verdict}", reward=1.0 if correct else 0.0, terminated=True,
                       reason="answered", info={"correct": correct, "tool_status": res.status})

    # ------------------------------------------------------------------ snapshots (the sandbox: the base class)
    def _task_state(self) -> dict[str, Any]:
        return {"task": self._task, **super()._task_state()}

    def _load_task_state(self, state: dict[str, Any]) -> None:
        super()._load_task_state(state)
        self._task = dict(state["task"])

    # ------------------------------------------------------------------ demonstrations
    def demo_action(self, rng: random.Random, skill: float = 0.0) -> str:
        """A demonstration action (:class:`envs.features.Demonstrator`): with probability ``skill`` the scripted
        play (:meth:`oracle_action`), else a uniformly random action of the menu (``info["legal_actions"]``;
        ``skill=0`` draws exactly what a trainer's random-menu fallback draws).

        Raises:
            ValueError: if ``skill`` is outside [0, 1].
        """
        return mixed_demo(rng, skill, self.oracle_action, self._legal_actions)

    def oracle_action(self) -> str:
        """The scripted play: ``list_tables()``, ``describe`` of each table the gold query reads, ``query`` of the
        gold query, then ``answer`` with it; steps already taken in this episode are skipped, and with few turns
        left the earliest steps give way, so that the answer always comes on the last turn at the latest. Uses
        the hidden gold query (which the menu lists among the candidates)."""
        t = self._task
        plan = ([format_action("list_tables")] + [format_action("describe", n) for n in t["relevant"]]
                + [format_action("query", t["gold"]), format_action("answer", t["gold"])])
        taken = {a for a, _ in self._history}
        pending = [a for a in plan if a not in taken]
        left = self.max_turns - self._turn
        return pending[-left:][0] if left < len(pending) else pending[0]


def _names(what: str, value: Any, allowed: tuple[str, ...]) -> tuple[str, ...]:
    """A validated, non-empty choice of names from ``allowed`` (default: all of them). Raises ValueError."""
    if value is None:
        return allowed
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ValueError(f"{what} must be a list of names from {list(allowed)}, e.g. [{allowed[0]!r}], got {value!r}")
    if not value or len(value) > 16:
        raise ValueError(f"{what} must name 1..{len(allowed)} of {list(allowed)}, got {list(value)}")
    bad = [v for v in value if not isinstance(v, str) or v not in allowed]
    if bad:
        raise ValueError(f"unknown {what} {bad}; choose from {list(allowed)}")
    return tuple(dict.fromkeys(value))
