"""FileQA's questions: facts drawn from the corpus (CPython standard library sources, ``/data`` in every
sandbox) and questions generated from them, deterministically given the corpus and a random generator.
The kinds are described in :mod:`envs.fileqa`; the env asks them, this module only makes them.
"""

from __future__ import annotations

import ast
import json
import os
from functools import lru_cache
from typing import Any

import numpy as np

from envs.actions import format_action, parse_python

QUESTION_KINDS = ("defines", "line_count", "constant", "imports", "log_errors")
LOG_PATH = "/scratch/app.log"


@lru_cache(maxsize=4)
def load_corpus(root: str) -> tuple[dict, dict[str, str]]:
    """``(manifest, {relative path: text})`` of the corpus at ``root`` (files under ``Lib/``, listed by its
    ``MANIFEST.json``). Raises ``OSError`` / ``ValueError`` if the manifest is absent or malformed."""
    with open(os.path.join(root, "MANIFEST.json"), encoding="utf-8") as f:
        manifest = json.load(f)
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
            tree = parse_python(text)
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
        for sub in ast.walk(tree):
            mods = []
            if isinstance(sub, ast.Import):
                mods = [a.name.split(".")[0] for a in sub.names]
            elif isinstance(sub, ast.ImportFrom) and sub.module and sub.level == 0:
                mods = [sub.module.split(".")[0]]
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


def draw_question(
    corpus_dir: str, kinds: tuple[str, ...], rng: np.random.Generator
) -> tuple[dict[str, Any], dict[str, bytes]]:
    """One question of a kind drawn from ``kinds`` with ``rng``: ``({"text", "answer", "candidates", "menu",
    "kind"}, {per-episode file name under /scratch: bytes})``. Deterministic given the corpus and ``rng``'s state."""
    facts = corpus_facts(corpus_dir)
    kind = kinds[int(rng.integers(len(kinds)))]
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
