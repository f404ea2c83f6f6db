"""The sandbox corpus: a pinned subset of the CPython standard library sources, plus a manifest.

One builder for both backends: the sandbox image runs this file (standard library only) at build time
against its own interpreter, and the local backend materialises the same list from the running
interpreter. Layout: ``DEST/Lib/<module path>`` and ``DEST/MANIFEST.json`` with each file's size and
SHA-256 and a ``content_hash`` over all of them (the texts depend on the interpreter's patch version;
compare ``content_hash`` when two corpora must be identical).

Run: ``python3 corpus.py DEST [--stdlib DIR]``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import sysconfig

#: Files of the corpus, relative to the standard library directory (pinned: the order is the manifest's).
FILES = (
    "abc.py", "base64.py", "bisect.py", "calendar.py", "colorsys.py", "contextlib.py", "copy.py", "csv.py",
    "dataclasses.py", "difflib.py", "enum.py", "fnmatch.py", "fractions.py", "functools.py", "getopt.py",
    "glob.py", "graphlib.py", "heapq.py", "hmac.py", "keyword.py", "linecache.py", "numbers.py", "operator.py",
    "pprint.py", "queue.py", "random.py", "reprlib.py", "sched.py", "secrets.py", "shlex.py", "shutil.py",
    "statistics.py", "string.py", "textwrap.py", "this.py", "token.py", "tokenize.py", "uuid.py", "weakref.py",
    "json/__init__.py", "json/decoder.py", "json/encoder.py", "json/scanner.py", "json/tool.py",
    "html/__init__.py", "html/entities.py", "html/parser.py",
    "collections/__init__.py", "collections/abc.py",
    "urllib/__init__.py", "urllib/parse.py",
    "logging/__init__.py", "logging/handlers.py",
)
MANIFEST = "MANIFEST.json"


def stdlib_dir() -> str:
    """The running interpreter's standard library directory."""
    return sysconfig.get_paths()["stdlib"]


def build_corpus(dest: str, stdlib: str | None = None) -> dict:
    """Copy :data:`FILES` from ``stdlib`` (default: this interpreter's) into ``dest/Lib`` and write the manifest.

    Files missing from ``stdlib`` are skipped and listed under ``missing``. Files are made world-readable.
    Returns the manifest dict. Raises ``OSError`` if ``dest`` cannot be written.
    """
    src = stdlib or stdlib_dir()
    lib = os.path.join(dest, "Lib")
    os.makedirs(lib, exist_ok=True)
    files, missing = {}, []
    total = hashlib.sha256()
    for rel in FILES:
        s = os.path.join(src, rel)
        if not os.path.isfile(s):
            missing.append(rel)
            continue
        d = os.path.join(lib, rel)
        os.makedirs(os.path.dirname(d), exist_ok=True)
        shutil.copyfile(s, d)
        os.chmod(d, 0o644)
        with open(d, "rb") as f:
            data = f.read()
        digest = hashlib.sha256(data).hexdigest()
        files["Lib/" + rel] = {"size": len(data), "sha256": digest}
        total.update(f"Lib/{rel}\0{digest}\n".encode())
    for root, dirs, _ in os.walk(dest):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o755)
    os.chmod(dest, 0o755)
    manifest = {
        "source": "CPython standard library",
        "python_version": "%d.%d.%d" % sys.version_info[:3],
        "files": files,
        "missing": missing,
        "content_hash": total.hexdigest(),
    }
    with open(os.path.join(dest, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
    os.chmod(os.path.join(dest, MANIFEST), 0o644)
    return manifest


def ensure_corpus(dest: str) -> str:
    """Materialise the corpus once at ``dest`` and return it (callers take ``dest`` from
    :func:`sandbox_server.settings.corpus_dir`; this file stays stdlib-only: the sandbox image runs it).

    Rebuilt when the manifest is absent or was built from another interpreter version.
    """
    man = os.path.join(dest, MANIFEST)
    if os.path.isfile(man):
        try:
            with open(man) as f:
                m = json.load(f)
            if m.get("python_version") == "%d.%d.%d" % sys.version_info[:3] and m.get("files"):
                return dest
        except (OSError, ValueError):
            pass
    build_corpus(dest)
    return dest


def load_manifest(dest: str) -> dict:
    """Read ``dest/MANIFEST.json``. Raises ``OSError`` / ``ValueError`` if absent or malformed."""
    with open(os.path.join(dest, MANIFEST)) as f:
        return json.load(f)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dest")
    ap.add_argument("--stdlib", default=None)
    ns = ap.parse_args()
    m = build_corpus(ns.dest, ns.stdlib)
    print(f"corpus: {len(m['files'])} files, content_hash {m['content_hash'][:16]}, missing {m['missing']}")
