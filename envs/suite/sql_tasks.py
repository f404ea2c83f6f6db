"""Text-to-SQL tasks (:mod:`envs.suite.text_to_sql`): synthetic SQLite databases and questions with gold queries.

A task is drawn from a numpy ``Generator`` (the env's seeded ``np_random``; nothing else is random): a domain
(:data:`DOMAINS`: a shop, a school, a library), a database of three or four tables joined by foreign keys with
rows drawn from word lists, and one question of a kind of :data:`KINDS`, made from a template with its gold
query. The gold query and a few near-miss queries (a wrong filter, a missing ``DISTINCT``, a wrong join key, an
aggregate too many) are run here, on the host, on the in-memory copy of the database the generator just built:
only these fixed, generated queries ever run on the host, never an agent's. A question is kept only when its
gold result is non-empty and unambiguous (a unique maximum, no ties at a ``LIMIT``) and each near-miss kept
gives another result. The database file travels into the sandbox as bytes (``/scratch/db.sqlite``).

The task form follows the text-to-SQL environments of the field (SkyRL's SQL env, trained with execution-match
reward: a query is right when its result set equals the gold query's, as in Spider's execution accuracy,
arXiv:1809.08887), on synthetic databases so that it runs offline and every seed gives a new database.

Scoring (:func:`same_result`): result sets compared as multisets of rows (as lists when the question asks for
an order), every value normalised by :func:`normalize_value` (numbers as floats rounded to 6 decimals, so
``3`` equals ``3.0``; text as is; blobs as hex).
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from typing import Any

import numpy as np

#: The question kinds (each a template with a gold query): ``count_where`` (a count with a filter),
#: ``list_where`` (names under a numeric filter), ``join_names`` (who is linked to an item: two joins and
#: ``DISTINCT``), ``group_max`` (the category with the most rows: ``GROUP BY`` and ``ORDER BY COUNT(*)``),
#: ``sum_join`` (a total over one person's links), ``top_k`` (the k highest, in order: an ordered answer),
#: ``count_3way`` (a count across three tables; needs ``tables=4``), ``avg_group`` (an average per category).
KINDS = ("count_where", "list_where", "join_names", "group_max", "sum_join", "top_k", "count_3way", "avg_group")
#: Kinds that need the fourth table.
KINDS_NEEDING_4 = ("count_3way",)

_FIRST = ("Ada Alan Bea Carl Dana Eli Finn Gia Hugo Ines Jon Kai Lena Milo Nora Omar Pia Quinn Rosa Sam Tara Uma "
          "Vic Wen Xavi Yara Zoe Ivo Lars Mina").split()
_LAST = ("Abe Berg Cruz Diaz Eng Fox Gray Hale Ito Jung Kerr Lund Mohr Nash Ortiz Park Quist Ruiz Sato Toth Ueda "
         "Voss Wolf Xu Yoon Zorn Kim Lee Moss Reyes").split()
_CITIES = ("Lyon Porto Graz Turin Ghent Bergen Leeds Malmo Krakow Bilbao Utrecht Aarhus").split()
_COUNTRIES = ("France Spain Norway Italy Japan Chile Kenya Canada").split()

#: The domains: table and column names, the words rows are drawn from, and the phrases the questions use.
#: Roles: ``A`` people (name, a category column), ``B`` items (a name, a category, a number, and a foreign key
#: to ``C`` with four tables), ``L`` links of a person and an item (with a number), ``C`` makers of items.
DOMAINS: dict[str, dict[str, Any]] = {
    "shop": {
        "A": "customers", "a": "customer", "a_cat": "city", "a_cats": _CITIES,
        "B": "products", "b": "product", "b_name": "name", "b_cat": "category",
        "b_cats": ("garden", "kitchen", "toys", "office", "sports"), "b_num": "price", "b_num_type": "REAL",
        "b_num_range": (2, 300),
        "b_words": (("red", "small", "smart", "steel", "wooden", "classic", "compact", "deluxe", "eco", "folding",
                     "giant", "mini", "pro", "quiet", "rapid", "solar", "soft", "travel", "urban", "vintage"),
                    ("lamp", "kettle", "chair", "drill", "ball", "desk", "tent", "mug", "clock", "fan", "grill",
                     "hammer", "kite", "mat", "pan", "racket", "rake", "shelf", "stool", "tray")),
        "L": "orders", "l": "order", "a_fk": "customer_id", "b_fk": "product_id", "l_num": "quantity",
        "l_num_range": (1, 9), "verb": "ordered",
        "C": "suppliers", "c": "supplier", "c_fk": "supplier_id", "c_cat": "country", "c_cats": _COUNTRIES,
        "c_words": (("Acme", "Borea", "Cobalt", "Delta", "Evera", "Fjord", "Granite", "Helio", "Iris", "Juno"),
                    ("Ltd", "Works", "Trading", "Supply")),
    },
    "school": {
        "A": "students", "a": "student", "a_cat": "house", "a_cats": ("Amber", "Birch", "Cedar", "Dune", "Elm",
                                                                      "Fern", "Gale", "Heath"),
        "B": "courses", "b": "course", "b_name": "title", "b_cat": "department",
        "b_cats": ("science", "arts", "languages", "maths", "history"), "b_num": "hours", "b_num_type": "INTEGER",
        "b_num_range": (10, 160),
        "b_words": (("Basic", "Applied", "Modern", "Advanced", "Intro", "Practical", "Classical", "Global", "Urban",
                     "Digital", "Ancient", "Creative", "Quantum", "Visual", "Early", "Rural", "Marine", "Social",
                     "Formal", "Open"),
                    ("Algebra", "Biology", "Chemistry", "Drawing", "Ethics", "Geometry", "Latin", "Music", "Optics",
                     "Poetry", "Statistics", "Theatre", "Logic", "Botany", "Welsh", "Physics", "Pottery", "Rhetoric",
                     "Geology", "Economics")),
        "L": "enrollments", "l": "enrollment", "a_fk": "student_id", "b_fk": "course_id", "l_num": "grade",
        "l_num_range": (40, 100), "verb": "enrolled in",
        "C": "teachers", "c": "teacher", "c_fk": "teacher_id", "c_cat": "office",
        "c_cats": ("A1", "A2", "B1", "B2", "C1", "C2"), "c_words": (_FIRST, _LAST),
    },
    "library": {
        "A": "members", "a": "member", "a_cat": "city", "a_cats": _CITIES,
        "B": "books", "b": "book", "b_name": "title", "b_cat": "genre",
        "b_cats": ("mystery", "fantasy", "poetry", "history", "science"), "b_num": "pages", "b_num_type": "INTEGER",
        "b_num_range": (60, 900),
        "b_words": (("Silent", "Hidden", "Last", "Golden", "Broken", "Winter", "Distant", "Burning", "Quiet", "Lost",
                     "Crimson", "Hollow", "Northern", "Paper", "Glass", "Iron", "Secret", "Wild", "Pale", "Endless"),
                    ("River", "Garden", "Empire", "Letter", "Harbor", "Forest", "Mirror", "Voyage", "Tower", "Island",
                     "Promise", "Shadow", "Orchard", "Archive", "Lantern", "Comet", "Bridge", "Valley", "Crown",
                     "Signal")),
        "L": "loans", "l": "loan", "a_fk": "member_id", "b_fk": "book_id", "l_num": "days", "l_num_range": (1, 30),
        "verb": "borrowed",
        "C": "authors", "c": "author", "c_fk": "author_id", "c_cat": "country", "c_cats": _COUNTRIES,
        "c_words": (_FIRST, _LAST),
    },
}

#: Rows per people / items table: bounds of the ``rows`` setting (links: twice as many; makers: a quarter, 2..12).
MIN_ROWS, MAX_ROWS = 4, 200
_TRIES = 50  # draws of a question's parameters before another database is drawn


def _pick(rng: np.random.Generator, seq: Any) -> Any:
    return seq[int(rng.integers(len(seq)))]


def _distinct_names(rng: np.random.Generator, words: tuple, n: int, sep: str = " ") -> list[str]:
    """``n`` distinct two-word names (first word x second word), drawn without replacement."""
    first, second = words
    picks = rng.choice(len(first) * len(second), size=n, replace=False)
    return [f"{first[int(i) // len(second)]}{sep}{second[int(i) % len(second)]}" for i in picks]


def build_database(rng: np.random.Generator, dom: dict[str, Any], rows: int, tables: int) -> sqlite3.Connection:
    """A new in-memory database of the domain ``dom``: ``tables`` (3 or 4) tables with foreign keys, ``rows``
    people and items, ``2 * rows`` links and ``max(2, min(rows // 4, 12))`` makers, every value drawn from ``rng``."""
    d = dom
    conn = sqlite3.connect(":memory:")
    n_c = max(2, min(rows // 4, 12))
    if tables == 4:
        conn.execute(f"CREATE TABLE {d['C']} (\n  id INTEGER PRIMARY KEY,\n  name TEXT NOT NULL,\n"
                     f"  {d['c_cat']} TEXT NOT NULL\n)")
        names = _distinct_names(rng, d["c_words"], n_c)
        conn.executemany(f"INSERT INTO {d['C']} VALUES (?, ?, ?)",
                         [(i + 1, names[i], _pick(rng, d["c_cats"])) for i in range(n_c)])
    conn.execute(f"CREATE TABLE {d['A']} (\n  id INTEGER PRIMARY KEY,\n  name TEXT NOT NULL,\n"
                 f"  {d['a_cat']} TEXT NOT NULL\n)")
    cats = [str(c) for c in rng.choice(d["a_cats"], size=min(len(d["a_cats"]), max(3, rows // 3)), replace=False)]
    people = _distinct_names(rng, (_FIRST, _LAST), rows)
    conn.executemany(f"INSERT INTO {d['A']} VALUES (?, ?, ?)",
                     [(i + 1, people[i], _pick(rng, cats)) for i in range(rows)])
    fk = f",\n  {d['c_fk']} INTEGER NOT NULL REFERENCES {d['C']}(id)" if tables == 4 else ""
    conn.execute(f"CREATE TABLE {d['B']} (\n  id INTEGER PRIMARY KEY,\n  {d['b_name']} TEXT NOT NULL,\n"
                 f"  {d['b_cat']} TEXT NOT NULL,\n  {d['b_num']} {d['b_num_type']} NOT NULL{fk}\n)")
    items = [s.lower() if d["b_name"] == "name" else s for s in _distinct_names(rng, d["b_words"], rows)]
    lo, hi = d["b_num_range"]
    b_rows = []
    for i in range(rows):
        num: float | int = (round(float(rng.uniform(lo, hi)), 2) if d["b_num_type"] == "REAL"
                            else int(rng.integers(lo, hi + 1)))
        row: tuple = (i + 1, items[i], _pick(rng, d["b_cats"]), num)
        b_rows.append(row + ((int(rng.integers(1, n_c + 1)),) if tables == 4 else ()))
    conn.executemany(f"INSERT INTO {d['B']} VALUES ({', '.join('?' * len(b_rows[0]))})", b_rows)
    conn.execute(f"CREATE TABLE {d['L']} (\n  id INTEGER PRIMARY KEY,\n"
                 f"  {d['a_fk']} INTEGER NOT NULL REFERENCES {d['A']}(id),\n"
                 f"  {d['b_fk']} INTEGER NOT NULL REFERENCES {d['B']}(id),\n  {d['l_num']} INTEGER NOT NULL\n)")
    lo, hi = d["l_num_range"]
    conn.executemany(f"INSERT INTO {d['L']} VALUES (?, ?, ?, ?)",
                     [(i + 1, int(rng.integers(1, rows + 1)), int(rng.integers(1, rows + 1)),
                       int(rng.integers(lo, hi + 1))) for i in range(2 * rows)])
    conn.commit()
    return conn


def _q(value: str) -> str:
    """An SQL string literal."""
    return "'" + value.replace("'", "''") + "'"


def _column(conn: sqlite3.Connection, sql: str) -> list:
    return [r[0] for r in conn.execute(sql).fetchall()]


# Each template: (rng, conn, domain) -> (question, gold, near misses, ordered, tables the gold reads) or None.
def _count_where(rng, conn, d):
    v = _pick(rng, sorted(set(_column(conn, f"SELECT {d['a_cat']} FROM {d['A']}"))))
    gold = f"SELECT COUNT(*) FROM {d['A']} WHERE {d['a_cat']} = {_q(v)}"
    misses = [f"SELECT COUNT(*) FROM {d['A']}", f"SELECT COUNT(*) FROM {d['A']} WHERE {d['a_cat']} <> {_q(v)}",
              f"SELECT COUNT(DISTINCT {d['a_cat']}) FROM {d['A']}"]
    return f"How many {d['A']} have the {d['a_cat']} {v!r}?", gold, misses, False, [d["A"]]


def _list_where(rng, conn, d):
    values = sorted(set(_column(conn, f"SELECT {d['b_num']} FROM {d['B']}")))
    if len(values) < 3:
        return None
    x = values[int(rng.integers(1, len(values) - 1))]  # neither the least nor the greatest: some rows each side
    col, t = d["b_name"], d["B"]
    gold = f"SELECT {col} FROM {t} WHERE {d['b_num']} > {x}"
    misses = [f"SELECT {col} FROM {t} WHERE {d['b_num']} >= {x}", f"SELECT {col} FROM {t} WHERE {d['b_num']} < {x}",
              f"SELECT {col} FROM {t}"]
    return f"List the {col} of every {d['b']} whose {d['b_num']} is greater than {x}.", gold, misses, False, [t]


def _join_names(rng, conn, d):
    linked = sorted(set(_column(conn, f"SELECT b.{d['b_name']} FROM {d['B']} AS b JOIN {d['L']} AS l "
                                      f"ON l.{d['b_fk']} = b.id")))
    if not linked:
        return None
    item = _pick(rng, linked)
    body = (f"FROM {d['A']} AS a JOIN {d['L']} AS l ON l.{d['a_fk']} = a.id JOIN {d['B']} AS b "
            f"ON b.id = l.{d['b_fk']} WHERE b.{d['b_name']} = {_q(item)}")
    gold = f"SELECT DISTINCT a.name {body}"
    misses = [f"SELECT a.name {body}",
              f"SELECT DISTINCT a.name FROM {d['A']} AS a JOIN {d['L']} AS l ON l.{d['a_fk']} = a.id "
              f"JOIN {d['B']} AS b ON b.id = l.{d['a_fk']} WHERE b.{d['b_name']} = {_q(item)}",
              f"SELECT a.name FROM {d['A']} AS a"]
    return (f"Which {d['A']} {d['verb']} the {d['b']} {item!r}? Give each one's name once.", gold, misses, False,
            [d["A"], d["L"], d["B"]])


def _group_max(rng, conn, d):
    counts = conn.execute(f"SELECT COUNT(*) FROM {d['A']} GROUP BY {d['a_cat']} ORDER BY COUNT(*) DESC").fetchall()
    if len(counts) < 2 or counts[0][0] == counts[1][0]:
        return None  # no unique maximum
    cat, t = d["a_cat"], d["A"]
    gold = f"SELECT {cat} FROM {t} GROUP BY {cat} ORDER BY COUNT(*) DESC LIMIT 1"
    misses = [f"SELECT {cat} FROM {t} GROUP BY {cat} ORDER BY COUNT(*) ASC LIMIT 1",
              f"SELECT {cat}, COUNT(*) FROM {t} GROUP BY {cat}", f"SELECT MAX({cat}) FROM {t}"]
    return f"Which {cat} has the most {t}?", gold, misses, False, [t]


def _sum_join(rng, conn, d):
    linked = sorted(set(_column(conn, f"SELECT a.name FROM {d['A']} AS a JOIN {d['L']} AS l "
                                      f"ON l.{d['a_fk']} = a.id")))
    if not linked:
        return None
    who = _pick(rng, linked)
    body = f"FROM {d['L']} AS l JOIN {d['A']} AS a ON a.id = l.{d['a_fk']} WHERE a.name = {_q(who)}"
    num = d["l_num"]
    gold = f"SELECT SUM(l.{num}) {body}"
    misses = [f"SELECT COUNT(*) {body}", f"SELECT AVG(l.{num}) {body}", f"SELECT SUM({num}) FROM {d['L']}"]
    return (f"What is the total {num} over all {d['L']} of the {d['a']} {who!r}?", gold, misses, False,
            [d["L"], d["A"]])


def _top_k(rng, conn, d):
    k = int(rng.integers(2, 5))
    top = _column(conn, f"SELECT {d['b_num']} FROM {d['B']} ORDER BY {d['b_num']} DESC LIMIT {k + 1}")
    if len(top) < k + 1 or len(set(top)) < k + 1:
        return None  # a tie inside the top k or at its edge: the order or the set would be ambiguous
    col, t, num = d["b_name"], d["B"], d["b_num"]
    gold = f"SELECT {col} FROM {t} ORDER BY {num} DESC LIMIT {k}"
    misses = [f"SELECT {col} FROM {t} ORDER BY {num} ASC LIMIT {k}", f"SELECT {col} FROM {t} ORDER BY {num} DESC "
              f"LIMIT {k + 1}", f"SELECT {col} FROM (SELECT {col} FROM {t} ORDER BY {num} DESC LIMIT {k}) "
              f"ORDER BY {col}"]
    return (f"List the {col} of the {k} {t} with the greatest {num}, greatest first.", gold, misses, True, [t])


def _count_3way(rng, conn, d):
    makers = sorted(set(_column(conn, f"SELECT c.name FROM {d['C']} AS c JOIN {d['B']} AS b "
                                      f"ON b.{d['c_fk']} = c.id JOIN {d['L']} AS l ON l.{d['b_fk']} = b.id")))
    if not makers:
        return None
    who = _pick(rng, makers)
    join_b = f"JOIN {d['C']} AS c ON c.id = b.{d['c_fk']} WHERE c.name = {_q(who)}"
    gold = f"SELECT COUNT(*) FROM {d['L']} AS l JOIN {d['B']} AS b ON b.id = l.{d['b_fk']} {join_b}"
    misses = [f"SELECT COUNT(*) FROM {d['B']} AS b {join_b}",
              f"SELECT COUNT(DISTINCT l.{d['a_fk']}) FROM {d['L']} AS l JOIN {d['B']} AS b "
              f"ON b.id = l.{d['b_fk']} {join_b}", f"SELECT COUNT(*) FROM {d['L']}"]
    return (f"How many {d['L']} are of {d['B']} whose {d['c']} is {who!r}?", gold, misses, False,
            [d["L"], d["B"], d["C"]])


def _avg_group(rng, conn, d):
    cat, num, t = d["b_cat"], d["b_num"], d["B"]
    gold = f"SELECT {cat}, AVG({num}) FROM {t} GROUP BY {cat}"
    misses = [f"SELECT {cat}, SUM({num}) FROM {t} GROUP BY {cat}", f"SELECT {cat}, MAX({num}) FROM {t} GROUP BY {cat}",
              f"SELECT AVG({num}) FROM {t}"]
    return (f"What is the average {num} of the {t} of each {cat}? Give each {cat} with its average.", gold, misses,
            False, [t])


_TEMPLATES = {"count_where": _count_where, "list_where": _list_where, "join_names": _join_names,
              "group_max": _group_max, "sum_join": _sum_join, "top_k": _top_k, "count_3way": _count_3way,
              "avg_group": _avg_group}


def normalize_value(value: Any) -> Any:
    """One result value in the form results are compared in: ``None``; numbers (``bool``, ``int``, ``float``) as
    a ``float`` rounded to 6 decimals; ``bytes`` (or the runner's ``{"hex": ...}``) as ``"x'<hex>'"``; text as
    is. Type: JSON scalar -> JSON scalar."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (bool, int, float)):
        return round(float(value), 6) + 0.0  # + 0.0: -0.0 compares and prints as 0.0
    if isinstance(value, bytes):
        return f"x'{value.hex()}'"
    if isinstance(value, dict) and isinstance(value.get("hex"), str):
        return f"x'{value['hex']}'"
    return str(value)


def normalize_rows(rows: Any, ordered: bool) -> list[list[Any]]:
    """A result set (a list of rows, each a list of values) in its compared form: every value normalised and,
    unless ``ordered``, the rows sorted (by their ``repr``, so that rows of mixed types sort too). JSON data."""
    out = [[normalize_value(v) for v in row] for row in rows]
    return out if ordered else sorted(out, key=repr)


def same_result(rows: Any, gold: list[list[Any]], ordered: bool) -> bool:
    """Whether the result set ``rows`` equals ``gold`` (already in :func:`normalize_rows` form): as multisets of
    rows, or as lists when ``ordered``. Column names are not compared; column counts are (rows are tuples)."""
    mine = normalize_rows(rows, ordered)
    if ordered:
        return mine == gold
    return Counter(map(repr, mine)) == Counter(map(repr, gold))


def draw_task(rng: np.random.Generator, domains: tuple[str, ...], kinds: tuple[str, ...], rows: int,
              tables: int) -> tuple[dict[str, Any], bytes]:
    """A task and its database file: ``(task, database bytes)``.

    ``task`` (JSON data): ``domain``, ``kind``, ``text`` (the question), ``gold`` (the gold query), ``ordered``
    (whether the answer's row order counts), ``tables`` (every table, sorted), ``relevant`` (the tables the gold
    query reads, in join order), ``candidates`` (the gold query and its near misses, sorted: at most four, each
    with its own result), ``gold_rows`` (the gold result in :func:`normalize_rows` form). The bytes are the
    SQLite file (rollback journal, no WAL) that the sandbox serves read-only.

    Raises:
        RuntimeError: no question of ``kinds`` could be made (not met with the shipped domains and rows >= 4).
    """
    domain = _pick(rng, domains)
    d = DOMAINS[domain]
    for _ in range(_TRIES):
        kind = _pick(rng, kinds)
        conn = build_database(rng, d, rows, tables)
        try:
            for _ in range(_TRIES):
                made = _TEMPLATES[kind](rng, conn, d)
                if made is None:
                    break  # this database cannot ask it: draw another
                text, gold, misses, ordered, relevant = made
                gold_rows = normalize_rows(conn.execute(gold).fetchall(), ordered)
                if not gold_rows or all(v is None for row in gold_rows for v in row):
                    continue
                candidates, seen = [gold], [gold_rows]
                for sql in misses:
                    got = normalize_rows(conn.execute(sql).fetchall(), ordered)
                    if got not in seen:
                        candidates.append(sql)
                        seen.append(got)
                names = sorted(_column(conn, "SELECT name FROM sqlite_master WHERE type = 'table'"))
                task = {"domain": domain, "kind": kind, "text": text, "gold": gold, "ordered": ordered,
                        "tables": names, "relevant": list(relevant), "candidates": sorted(candidates),
                        "gold_rows": gold_rows}
                return task, conn.serialize()
        finally:
            conn.close()
    raise RuntimeError(f"no {', '.join(kinds)} question could be made from {domain} databases of {rows} rows")


__all__ = ["DOMAINS", "KINDS", "KINDS_NEEDING_4", "MAX_ROWS", "MIN_ROWS", "build_database", "draw_task",
           "normalize_rows", "normalize_value", "same_result"]
