#!/usr/bin/env bash
# Copy the server's Python distributions (and their dependency closure) from .venv into
# docker/vendor/site-packages, so the server image builds offline. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
"$PY" - <<'PYEOF'
import shutil, tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

dest = Path("docker/vendor/site-packages")
# The one list: pyproject.toml's dependencies and its server extra (extras such as uvicorn[standard] followed).
project = tomllib.loads(Path("pyproject.toml").read_text())["project"]
todo = [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["server"]]
seen: set[str] = set()
extras_of: dict[str, set[str]] = {}
while todo:
    req = todo.pop()
    name = req.name.lower().replace("_", "-")
    new_extras = set(req.extras) - extras_of.get(name, set())
    if name in seen and not new_extras:
        continue
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        continue
    seen.add(name)
    extras_of.setdefault(name, set()).update(req.extras)
    for r in map(Requirement, dist.requires or []):
        if r.marker is None or any(r.marker.evaluate({"extra": e}) for e in extras_of[name] | {""}):
            todo.append(r)
stamp = dest / ".stamp"
key = ",".join(sorted(f"{n}=={metadata.version(n)}" for n in seen))
if stamp.exists() and stamp.read_text() == key:
    raise SystemExit(0)
shutil.rmtree(dest, ignore_errors=True)
dest.mkdir(parents=True)
for name in sorted(seen):
    dist = metadata.distribution(name)
    for f in dist.files or []:
        src = Path(dist.locate_file(f))
        if "__pycache__" in f.parts or ".." in f.parts or not src.is_file():
            continue
        out = dest / f
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, out)
stamp.write_text(key)
print(f"vendored {len(seen)} distributions into {dest}")
PYEOF
