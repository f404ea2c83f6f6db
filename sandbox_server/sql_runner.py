"""The SQL tool family's query runner: a fixed, standard-library-only program that runs **in the sandbox**.

The ``sql`` tools of :data:`sandbox_server.tools.TOOLS` (``list_tables``, ``describe``, ``query``, ``rows``) run
the sandbox image's own ``python3`` in isolated mode on this module's source, passed with ``-c``
(``python3 -I -S -B -c SOURCE DB OP BUDGET_MS [ARG]``): nothing is installed in the image for it, the same text
runs under bubblewrap (the host's ``/usr/bin/python3``, bound read-only) and in Docker (the image's
``python3``), and no part of the program comes from the caller. The caller's SQL is one argv item, never code.
Python >= 3.9 (the agent's floor); imports nothing outside the standard library and nothing of forkyard.

Defences, each enough on its own for writes, all of them together:

* the database is opened read-only by URI (``file:DB?mode=ro``) and ``PRAGMA query_only`` is on;
* an authorizer allows only ``SELECT``, reads of columns, recursive CTEs and the functions of
  :data:`SAFE_FUNCTIONS`; it denies everything else: ``INSERT`` / ``UPDATE`` / ``DELETE``, every ``CREATE`` /
  ``DROP`` / ``ALTER`` (temp tables, views and triggers included), ``ATTACH`` / ``DETACH`` (so no other file
  can be opened, and ``VACUUM INTO`` cannot write one), ``PRAGMA`` (pragma table-valued functions included),
  transactions, ``ANALYZE``, virtual tables, and ``load_extension`` (extension loading is off as well);
* one statement per call (sqlite3's ``execute`` refuses a second);
* a progress handler aborts the statement past ``BUDGET_MS`` milliseconds of wall or CPU time (a query that
  never ends, a regex-free but quadratic join): it stops with exit status 3 well before the agent's
  per-call deadline kills the process group;
* memory: ``PRAGMA hard_heap_limit`` (SQLite's own allocations), ``SQLITE_LIMIT_LENGTH`` (the longest
  string or blob a query may build; Python >= 3.11) and ``RLIMIT_AS`` / ``RLIMIT_CPU`` / ``RLIMIT_FSIZE``
  on the process (no file can be written, not even a temporary one);
* output: at most :data:`MAX_ROWS` rows for ``query`` (a marker line says the result was cut; the rows past
  the cap are never computed), :data:`MAX_CELL_CHARS` characters per cell, :data:`MAX_OUTPUT_CHARS`
  characters in all; at most :data:`MAX_JSON_ROWS` rows and :data:`MAX_JSON_CHARS` characters for ``rows``.

Operations (``OP``) and what they print on stdout:

``tables``
    One line per table: ``name (N columns, M rows)``.
``describe TABLE``
    The table's ``CREATE TABLE`` statement, its row count and its first :data:`SAMPLE_ROWS` rows as a table.
``query SQL``
    The result of one read-only statement as a small text table (``a | b`` columns, ``NULL`` for null)
    followed by ``(N rows)``; at the cap, a ``[cut: ...]`` line instead.
``rows SQL``
    The result as one JSON object ``{"columns": [...], "rows": [[...], ...], "cut": false}`` (values as
    SQLite returns them; blobs as ``{"hex": "..."}``); ``"cut": true`` with no rows when the result passes
    the caps. For scoring an answer (:mod:`envs.suite.text_to_sql`).

Exit status: 0 ok; 1 an SQL error (syntax, no such table, ...); 2 refused by the authorizer (not a read-only
query); 3 stopped at the budget; 4 the database is missing or unreadable; 5 bad arguments. Errors go to
stderr as one line.
"""

import sys
import time

# No ``from __future__``, ``typing`` or ``json`` at the top: each costs milliseconds of start-up on every call
# (``json`` imports ``re``); ``rows`` imports ``json`` when it runs.

#: Rows ``query`` prints at most (the query stops there: the rest is never computed).
MAX_ROWS = 50
#: Characters of one cell that ``query`` prints at most (longer ones end in ``...``).
MAX_CELL_CHARS = 80
#: Characters ``query`` and ``describe`` print at most in all.
MAX_OUTPUT_CHARS = 8000
#: Rows ``rows`` returns at most (more: ``"cut": true``).
MAX_JSON_ROWS = 1000
#: Characters of the JSON that ``rows`` prints at most (more: ``"cut": true``).
MAX_JSON_CHARS = 48000
#: Rows ``describe`` shows as a sample.
SAMPLE_ROWS = 3
#: Longest string or blob a statement may build, in bytes (``SQLITE_LIMIT_LENGTH``, Python >= 3.11).
MAX_VALUE_BYTES = 1_000_000
#: SQLite's heap limit, bytes (``PRAGMA hard_heap_limit``).
HEAP_BYTES = 64 << 20
#: Address-space limit of the runner process, bytes (``RLIMIT_AS``).
ADDRESS_SPACE_BYTES = 1 << 30
#: The SQL functions a query may call (lower case): scalar, aggregate, window, date and math functions that
#: read nothing but their arguments. ``load_extension``, ``randomblob`` / ``zeroblob`` (memory),
#: ``sqlite_*`` introspection and anything else are denied.
SAFE_FUNCTIONS = frozenset("""
abs avg count group_concat string_agg max min sum total coalesce ifnull nullif iif if length octet_length lower
upper substr substring trim ltrim rtrim replace round instr typeof printf format char unicode hex unhex quote
like glob likely unlikely likelihood sign date time datetime julianday strftime unixepoch timediff
row_number rank dense_rank ntile lag lead first_value last_value nth_value percent_rank cume_dist
ceil ceiling floor sqrt pow power ln log log2 log10 exp mod pi trunc degrees radians sin cos tan asin acos atan
atan2 sinh cosh tanh asinh acosh atanh concat concat_ws
""".split())

# SQLite's authorizer action codes (sqlite3.h; stable across versions, named here because Python's sqlite3
# module exports only some of them before 3.11).
_SELECT, _READ, _FUNCTION, _RECURSIVE = 21, 20, 31, 33
_OK, _DENY = 0, 1

EXIT_SQL, EXIT_REFUSED, EXIT_BUDGET, EXIT_NO_DB, EXIT_USAGE = 1, 2, 3, 4, 5


class _Stop(Exception):
    """Ends the runner with an exit status and a one-line message on stderr."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def _limit_process(budget_s: float) -> None:
    try:
        import resource
    except ImportError:  # not on Linux: the agent's deadline still holds
        return
    cpu = int(budget_s) + 2
    for name, value in (("RLIMIT_AS", ADDRESS_SPACE_BYTES), ("RLIMIT_CPU", cpu), ("RLIMIT_FSIZE", 0),
                        ("RLIMIT_CORE", 0)):
        which = getattr(resource, name, None)
        if which is None:
            continue
        try:
            soft, hard = resource.getrlimit(which)
            if hard != resource.RLIM_INFINITY:
                value = min(value, hard)
            resource.setrlimit(which, (value, hard))
        except (ValueError, OSError):
            pass


def _connect(db: str, budget_s: float):
    import sqlite3

    try:
        with open(db, "rb") as f:  # the URI below would report a missing file as "unable to open"
            if f.read(16) != b"SQLite format 3\x00":
                raise _Stop(EXIT_NO_DB, f"{db} is not an SQLite database")
    except OSError as exc:
        raise _Stop(EXIT_NO_DB, f"no database at {db}: {exc.strerror}") from None
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, isolation_level=None, check_same_thread=False)
    try:
        conn.enable_load_extension(False)
    except AttributeError:  # built without extension support: nothing to switch off
        pass
    conn.execute("PRAGMA query_only = ON")
    conn.execute("PRAGMA temp_store = MEMORY")
    try:
        conn.execute(f"PRAGMA hard_heap_limit = {HEAP_BYTES}")
    except sqlite3.Error:  # SQLite < 3.31
        pass
    if hasattr(conn, "setlimit"):
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
        conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    denied: list = []  # (action, arg1, arg2) of the first denials

    def authorize(action, arg1, arg2, db_name, trigger):
        if action in (_SELECT, _READ, _RECURSIVE):
            return _OK
        if action == _FUNCTION and str(arg2).lower() in SAFE_FUNCTIONS:
            return _OK
        if len(denied) < 8:
            denied.append((action, arg1, arg2))
        return _DENY

    conn.set_authorizer(authorize)
    t0, c0 = time.monotonic(), time.process_time()

    def progress():
        return 1 if (time.monotonic() - t0 > budget_s or time.process_time() - c0 > budget_s) else 0

    conn.set_progress_handler(progress, 20000)
    return conn, denied


_SCHEMA_TABLES = ("sqlite_master", "sqlite_temp_master", "sqlite_schema", "sqlite_temp_schema")
_ACTIONS = {1: "CREATE INDEX", 2: "CREATE TABLE", 3: "CREATE TEMP INDEX", 4: "CREATE TEMP TABLE",
            5: "CREATE TEMP TRIGGER", 6: "CREATE TEMP VIEW", 7: "CREATE TRIGGER", 8: "CREATE VIEW", 9: "DELETE",
            10: "DROP INDEX", 11: "DROP TABLE", 12: "DROP TEMP INDEX", 13: "DROP TEMP TABLE",
            14: "DROP TEMP TRIGGER", 15: "DROP TEMP VIEW", 16: "DROP TRIGGER", 17: "DROP VIEW", 18: "INSERT",
            19: "PRAGMA", 22: "a transaction", 23: "UPDATE", 24: "ATTACH", 25: "DETACH", 26: "ALTER TABLE",
            27: "REINDEX", 28: "ANALYZE", 29: "CREATE VIRTUAL TABLE", 30: "DROP VIRTUAL TABLE", 32: "SAVEPOINT"}


def _telling(denied: list) -> tuple:
    """The denial that names what the statement tried: SQLite checks writes of its own schema tables on the way
    to a ``CREATE`` or a pragma function, which say less than the ``CREATE`` or ``PRAGMA`` itself."""
    for action, arg1, arg2 in denied:
        if str(arg1).lower() not in _SCHEMA_TABLES:
            return action, arg1, arg2
    return denied[0]


def _what(action: int, arg1, arg2) -> str:
    if action == _FUNCTION:
        return f"the function {arg2}()"
    name = _ACTIONS.get(action, f"operation {action}")
    if action in (9, 18, 23) and arg1:  # DELETE, INSERT, UPDATE: of which table
        schema = str(arg1).lower() in _SCHEMA_TABLES  # SQLite checks these first on the way to a CREATE or DROP
        return f"{name} of {arg1}" + (" (a change of the schema)" if schema else "")
    detail = arg1 if action in (19, 24) else None
    return f"{name} {detail}" if detail else name


def _run(conn, denied: list, sql: str):
    import sqlite3

    try:
        return conn.execute(sql)
    except (sqlite3.DatabaseError, sqlite3.Warning) as exc:  # Warning: a second statement, before Python 3.12
        raise _stop_for(exc, denied) from None
    except ValueError as exc:
        raise _Stop(EXIT_SQL, f"SQL error: {exc}") from None


def _stop_for(exc: Exception, denied: list) -> _Stop:
    """The :class:`_Stop` that explains an error of SQLite (``denied``: what the authorizer refused)."""
    text = str(exc)
    if "one statement at a time" in text:
        return _Stop(EXIT_REFUSED, f"refused: {text} (one read-only statement per call)")
    if denied or "not authorized" in text:
        what = _what(*_telling(denied)) if denied else "this statement"
        return _Stop(EXIT_REFUSED, f"refused: {what} is not allowed; only read-only SELECT queries run here")
    if "interrupted" in text:
        return _Stop(EXIT_BUDGET, "stopped: the query ran past its time budget")
    if "out of memory" in text or "too big" in text:
        return _Stop(EXIT_BUDGET, f"stopped: {text} (a sandboxed query's memory and value sizes are capped)")
    if "readonly" in text or "read-only" in text:
        return _Stop(EXIT_REFUSED, f"refused: {text}; the database is read-only")
    return _Stop(EXIT_SQL, f"SQL error: {text}")


def _fetch(cur, denied: list, limit: int) -> tuple[list, bool]:
    """At most ``limit`` rows, and whether there were more (the row past the cap is fetched, no further)."""
    import sqlite3

    rows: list = []
    try:
        for row in cur:
            if len(rows) == limit:
                return rows, True
            rows.append(row)
    except sqlite3.DatabaseError as exc:
        raise _stop_for(exc, denied) from None
    return rows, False


def _cell(value) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        text = format(value, ".10g")
    elif isinstance(value, bytes):
        text = "x'" + value[:MAX_CELL_CHARS].hex() + "'"
    else:
        text = str(value)
    text = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    text = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)
    return text if len(text) <= MAX_CELL_CHARS else text[:MAX_CELL_CHARS - 3] + "..."


def _table(columns: list, rows: list) -> str:
    cells = [[_cell(c) for c in columns]] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lines = [" | ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]  # noqa: B905 - 3.9
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def _clip(text: str) -> str:
    if len(text) <= MAX_OUTPUT_CHARS:
        return text
    return text[:MAX_OUTPUT_CHARS].rsplit("\n", 1)[0] + f"\n[cut: the output passed {MAX_OUTPUT_CHARS} characters]"


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _tables(conn, denied: list) -> list:
    cur = _run(conn, denied, "SELECT name, sql FROM sqlite_master WHERE type = 'table' "
                             "AND name NOT LIKE 'sqlite_%' ORDER BY name")
    return _fetch(cur, denied, 1000)[0]


def op_tables(conn, denied: list) -> str:
    lines = []
    for name, _sql in _tables(conn, denied):
        ncols = len(_run(conn, denied, f"SELECT * FROM {_quote(name)} LIMIT 0").description or ())
        count = _fetch(_run(conn, denied, f"SELECT COUNT(*) FROM {_quote(name)}"), denied, 1)[0][0][0]
        lines.append(f"{name} ({ncols} columns, {count} rows)")
    return "\n".join(lines) if lines else "(no tables)"


def op_describe(conn, denied: list, table: str) -> str:
    known = {name: sql for name, sql in _tables(conn, denied)}
    if table not in known:
        raise _Stop(EXIT_SQL, f"no table {table!r}; the tables are: {', '.join(sorted(known)) or 'none'}")
    count = _fetch(_run(conn, denied, f"SELECT COUNT(*) FROM {_quote(table)}"), denied, 1)[0][0][0]
    cur = _run(conn, denied, f"SELECT * FROM {_quote(table)} LIMIT {SAMPLE_ROWS}")
    rows = _fetch(cur, denied, SAMPLE_ROWS)[0]
    columns = [d[0] for d in cur.description or ()]
    return _clip(f"{known[table]};\n{count} rows; the first {len(rows)}:\n{_table(columns, rows)}")


def op_query(conn, denied: list, sql: str) -> str:
    cur = _run(conn, denied, sql)
    if cur.description is None:
        raise _Stop(EXIT_REFUSED, "refused: the statement returns no rows; only SELECT queries run here")
    columns = [d[0] for d in cur.description]
    rows, more = _fetch(cur, denied, MAX_ROWS)
    tail = (f"[cut: showing the first {MAX_ROWS} rows; the query returned more]" if more
            else f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return _clip(_table(columns, rows) + "\n" + tail)


def _json_value(value):
    if isinstance(value, bytes):
        return {"hex": value.hex()}
    if isinstance(value, float) and value != value:  # NaN is not JSON
        return None
    return value


def op_rows(conn, denied: list, sql: str) -> str:
    import json

    cur = _run(conn, denied, sql)
    if cur.description is None:
        raise _Stop(EXIT_REFUSED, "refused: the statement returns no rows; only SELECT queries run here")
    columns = [d[0] for d in cur.description]
    rows, more = _fetch(cur, denied, MAX_JSON_ROWS)
    out = json.dumps({"columns": columns, "rows": [[_json_value(v) for v in r] for r in rows], "cut": False},
                     ensure_ascii=True)
    if more or len(out) > MAX_JSON_CHARS:
        out = json.dumps({"columns": columns, "rows": [], "cut": True})
    return out


def main(argv: list) -> int:
    """Run one operation (module docstring); returns the exit status. ``argv``: ``[DB, OP, BUDGET_MS, ARG?]``."""
    try:
        if len(argv) < 3:
            raise _Stop(EXIT_USAGE, "usage: DB OP BUDGET_MS [ARG]")
        db, op, budget = argv[0], argv[1], argv[2]
        arg = argv[3] if len(argv) > 3 else None
        ops = {"tables": 0, "describe": 1, "query": 1, "rows": 1}
        if op not in ops or (arg is None) != (ops[op] == 0) or not budget.isdigit():
            raise _Stop(EXIT_USAGE, f"bad arguments for {op!r}")
        budget_s = int(budget) / 1000.0
        _limit_process(budget_s)
        conn, denied = _connect(db, budget_s)
        if op == "tables":
            text = op_tables(conn, denied)
        elif op == "describe":
            text = op_describe(conn, denied, str(arg))
        elif op == "query":
            text = op_query(conn, denied, str(arg))
        else:
            text = op_rows(conn, denied, str(arg))
    except _Stop as stop:
        sys.stderr.write(str(stop) + "\n")
        return stop.status
    except MemoryError:
        sys.stderr.write("stopped: the query needed more memory than a sandboxed query may use\n")
        return EXIT_BUDGET
    sys.stdout.buffer.write(text.encode("utf-8", "replace") + (b"" if text.endswith("\n") else b"\n"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
