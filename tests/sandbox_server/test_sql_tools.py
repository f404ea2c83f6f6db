"""The ``sql`` tool family on both backends (bubblewrap and Docker): the whitelist entries, and hostile queries
(writes, ATTACH, pragmas, load_extension, a huge result, a query that never ends, reads of other files), each
refused or cut, the database unchanged (checksum), the server unharmed (another session still answers)."""

from __future__ import annotations

import hashlib
import io
import json
import sqlite3
import tarfile
import time

import pytest

from sandbox_server.tools import SQL_DB_PATH, TOOLS, ToolRefused, tool_specs, validate_call

SQL_TOOLS = ["list_tables", "describe", "query", "rows"]


def make_db() -> bytes:
    conn = sqlite3.connect(":memory:")
    conn.executescript("""
        CREATE TABLE people (id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT NOT NULL);
        CREATE TABLE pets (id INTEGER PRIMARY KEY, owner_id INTEGER NOT NULL REFERENCES people(id), kind TEXT);
        INSERT INTO people VALUES (1, 'Ada', 'Lyon'), (2, 'Bea', 'Graz'), (3, 'Carl', 'Lyon');
        INSERT INTO pets VALUES (1, 1, 'cat'), (2, 1, 'dog'), (3, 3, 'cat');
    """)
    data = conn.serialize()
    conn.close()
    return data


DB = make_db()
SHA = hashlib.sha256(DB).hexdigest()


@pytest.fixture(scope="module", params=["local", "docker"])
def box(request):
    """(service, sandbox id) per backend: the session-wide service of the backend (shared with the other sandbox
    tests) and one sandbox holding the database, shared by this module's tests."""
    svc = request.getfixturevalue(f"{request.param}_service")
    sb = svc.create(files={"db.sqlite": DB})
    yield svc, sb.id
    svc.delete(sb.id)


def run(box, tool, timeout_s=5.0, **args):
    svc, sid = box
    return svc.exec(sid, tool, args, timeout_s=timeout_s)


def scratch(box) -> dict[str, bytes]:
    """Every regular file of the sandbox's writable areas (/scratch and /tmp), from an export."""
    svc, sid = box
    with tarfile.open(fileobj=io.BytesIO(svc.export(sid))) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def test_the_sql_family_is_listed_and_builds_argv_without_a_shell():
    specs = {s.name: s for s in tool_specs()}
    assert [n for n, s in specs.items() if s.family == "sql"] == SQL_TOOLS
    assert {s.family for s in specs.values()} == {"files", "sql", "workspace", "interpreter"}
    assert specs["describe"].params == ["table", "budget_ms"] and specs["query"].params == ["sql", "budget_ms"]
    hostile = "x'); import os; os.system('id') --"
    call = validate_call("query", {"sql": hostile})
    assert call.argv[:5] == ["python3", "-I", "-S", "-B", "-c"] and call.argv[-1] == hostile  # one argv item
    assert call.argv[call.path_args[0]] == SQL_DB_PATH and call.argv[-3:-1] == ["query", "2000"]
    assert TOOLS["query"].build is not TOOLS["rows"].build
    for args in ({"sql": "x" * 1025}, {"sql": "SELECT 1", "budget_ms": 0}, {"sql": "SELECT 1", "budget_ms": 10 ** 6},
                 {"sql": 1}, {}, {"sql": "SELECT 1", "db": "/etc/passwd"}):
        with pytest.raises(ToolRefused):
            validate_call("query", args)


def test_the_server_lists_each_tools_family(fixture_data):
    from fastapi.testclient import TestClient

    from sandbox_server.app import create_app
    from sandbox_server.backends import LocalBackend
    from sandbox_server.service import SandboxService, ServiceConfig
    from tests.docker_support import SERVER_NAME, require_bwrap

    require_bwrap()
    svc = SandboxService(LocalBackend(fixture_data, server_name=f"{SERVER_NAME}-sqllist"), ServiceConfig(min_idle=0))
    with TestClient(create_app(service=svc, warm=False)) as http:  # the app closes the service
        tools = http.get("/v1/tools").json()["tools"]
    assert {t["name"]: t["family"] for t in tools} == {n: t.family for n, t in TOOLS.items()}
    assert [t["name"] for t in tools if t["family"] == "sql"] == SQL_TOOLS


def test_the_tools_answer(box):
    assert run(box, "list_tables").stdout == "people (3 columns, 3 rows)\npets (3 columns, 3 rows)\n"
    d = run(box, "describe", table="pets")
    assert "REFERENCES people(id)" in d.stdout and "3 rows; the first 3:" in d.stdout
    q = run(box, "query", sql="SELECT city, COUNT(*) AS n FROM people GROUP BY city ORDER BY city")
    assert q.stdout == "city | n\n-----+--\nGraz | 1\nLyon | 2\n(2 rows)\n" and q.exit_code == 0
    r = json.loads(run(box, "rows", sql="SELECT name, 1.5, NULL FROM people WHERE id = 1").stdout)
    assert r == {"columns": ["name", "1.5", "NULL"], "rows": [["Ada", 1.5, None]], "cut": False}
    missing = run(box, "describe", table="nope")
    assert missing.exit_code == 1 and "no table 'nope'" in missing.stderr


HOSTILE = [
    ("INSERT INTO people VALUES (9, 'Eve', 'X')", "INSERT"),
    ("UPDATE people SET name = 'Eve'", "UPDATE"),
    ("DELETE FROM pets", "DELETE"),
    ("CREATE TABLE t (x)", "change of the schema"),
    ("DROP TABLE pets", "change of the schema"),
    ("CREATE INDEX i ON pets (kind)", "refused"),
    ("CREATE VIEW v AS SELECT 1", "refused"),
    ("CREATE TEMP TRIGGER t AFTER INSERT ON people BEGIN SELECT 1; END", "refused"),
    ("CREATE TEMP TABLE t AS SELECT 1", "refused"),
    ("ATTACH DATABASE '/tmp/x.db' AS x", "ATTACH"),
    ("ATTACH DATABASE '/data/notes.txt' AS x", "ATTACH"),
    ("VACUUM INTO '/tmp/copy.db'", "ATTACH"),
    ("PRAGMA writable_schema = 1", "PRAGMA writable_schema"),
    ("PRAGMA journal_mode = WAL", "PRAGMA journal_mode"),
    ("SELECT * FROM pragma_table_info('people')", "refused"),
    ("SELECT load_extension('/tmp/x.so')", "load_extension"),
    ("SELECT randomblob(500000000)", "randomblob"),
    ("SELECT 1; DELETE FROM pets", "one statement"),
    ("BEGIN", "transaction"),
    ("ANALYZE", "ANALYZE"),
]


@pytest.mark.parametrize("sql,words", HOSTILE, ids=[w for _, w in HOSTILE])
def test_hostile_statements_are_refused_and_nothing_changes(box, sql, words):
    for tool in ("query", "rows"):
        r = run(box, tool, sql=sql)
        assert r.status == "ok" and r.exit_code == 2 and r.stdout == "", (tool, r)
        assert r.stderr.startswith("refused:") and words in r.stderr, r.stderr


def test_reads_of_other_files_find_nothing(box):
    for sql in ("SELECT readfile('/etc/passwd')", "SELECT * FROM fsdir('/')", "SELECT edit('x')"):
        r = run(box, "query", sql=sql)
        assert r.exit_code in (1, 2) and "root:" not in r.stdout + r.stderr, r
    svc, sid = box
    bad = svc.create(files={"db.sqlite": b"not a database"})
    try:  # a file that is not a database: refused before SQLite opens it
        r = svc.exec(bad.id, "query", {"sql": "SELECT 1"})
        assert r.exit_code == 4 and "not an SQLite database" in r.stderr
    finally:
        svc.delete(bad.id)


def test_a_huge_result_is_cut_at_the_row_cap(box):
    sql = "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r LIMIT 5000000) SELECT i, 'x' FROM r"
    t0 = time.monotonic()
    r = run(box, "query", sql=sql)
    assert time.monotonic() - t0 < 3  # the rows past the cap are never computed
    assert r.exit_code == 0 and r.stdout.count("\n") == 53
    assert r.stdout.endswith("[cut: showing the first 50 rows; the query returned more]\n")
    j = json.loads(run(box, "rows", sql=sql).stdout)
    assert j["cut"] is True and j["rows"] == []
    wide = run(box, "query", sql="SELECT printf('%.*c', 900000, 'y') AS w")  # one huge cell: cut to 80 characters
    assert wide.exit_code == 0 and max(len(line) for line in wide.stdout.splitlines()) <= 80


def test_a_query_that_never_ends_is_stopped(box):
    forever = "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) SELECT COUNT(*) FROM r"
    t0 = time.monotonic()
    r = run(box, "query", sql=forever, budget_ms=300)  # the runner's budget (progress handler)
    assert r.status == "ok" and r.exit_code == 3 and "time budget" in r.stderr
    assert time.monotonic() - t0 < 3
    r = run(box, "query", sql=forever, budget_ms=20000, timeout_s=1.0)  # past the budget: the agent's deadline
    assert r.status == "timeout" and r.exit_code is None
    assert run(box, "query", sql="SELECT COUNT(*) FROM pets").stdout.endswith("3\n(1 row)\n")  # still serves


def test_the_database_is_unchanged_and_the_server_unharmed(box):
    svc, sid = box
    files = scratch(box)
    assert sorted(files) == ["scratch/db.sqlite"]  # no journal, no WAL, no copy, nothing in /tmp
    assert hashlib.sha256(files["scratch/db.sqlite"]).hexdigest() == SHA
    other = svc.create(files={"db.sqlite": DB})
    try:  # another session's query answers
        r = svc.exec(other.id, "query", {"sql": "SELECT name FROM people WHERE city = 'Lyon' ORDER BY name"})
        assert r.stdout == "name\n----\nAda\nCarl\n(2 rows)\n"
    finally:
        svc.delete(other.id)
    procs = svc.backend.ps(svc._session(sid).sid)  # no query runner outlived its call (the timed-out one included)
    assert not [p for p in procs if "-S -B -c" in p], procs
