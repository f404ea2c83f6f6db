#!/usr/bin/env bash
# Copy the server's Python distributions (and their dependency closure) from .venv into
# docker/vendor/site-packages, so the server image builds offline. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
"$PY" - <<'PYEOF'
import os, re, shutil
from importlib import metadata
from pathlib import Path

dest = Path("docker/vendor/site-packages")
want = ["fastapi", "uvicorn", "uvloop", "httptools", "docker", "prometheus-client", "pydantic", "httpx", "gymnasium", "numpy", "orjson", "pydantic-settings"]
seen, todo = set(), list(want)
while todo:
    name = re.split(r"[\s;<>=!~\[(]", todo.pop(), 1)[0].lower().replace("_", "-")
    if not name or name in seen:
        continue
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        continue
    seen.add(name)
    for req in dist.requires or []:
        if "extra ==" not in req:
            todo.append(req)
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
