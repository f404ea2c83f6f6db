"""The in-sandbox agent (the package :mod:`sandbox_server.agent`) as one artifact: a zipapp (PEP 441), run in
every sandbox as ``python3 -u -I agent.pyz ARGS``.

The archive holds the package's modules as ``forkyard_agent/*.py`` and a ``__main__.py`` that runs
``forkyard_agent.cli.main``; ``-I`` keeps the host's site-packages and environment out, and the zip itself
is the only entry Python adds to ``sys.path``. It is built deterministically: entries sorted, every entry
dated 1980-01-01 00:00:00 with mode 0644, stored uncompressed (no dependence on the zlib version), then
given its ``#!/usr/bin/env python3`` line by :func:`zipapp.create_archive`. So the same sources give the
same bytes on every machine, and :func:`agent_sha` (which names the sandbox image's sources) is stable.

Where it goes: the local backend binds :func:`agent_zipapp` (a per-user cache file, in a folder named by its hash)
read-only at ``/opt/forkyard/agent.pyz`` under bubblewrap; ``scripts/build-images.sh`` and
``scripts/compose-up.sh`` write ``docker/agent.pyz`` (``python -m sandbox_server.agent_bundle
docker/agent.pyz``, a build output ignored by git) before ``docker build`` copies it into the image.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import sys
import tempfile
import threading
import zipapp
import zipfile
from pathlib import Path

#: The agent package (its ``*.py`` files are the zipapp's contents).
AGENT_PACKAGE = Path(__file__).resolve().parent / "agent"
#: The corpus builder, copied into the sandbox image beside the agent (part of :func:`agent_sha`).
CORPUS_SCRIPT = Path(__file__).resolve().parent / "corpus.py"
#: Name of the package inside the zipapp.
ZIP_PACKAGE = "forkyard_agent"
#: Where the sandbox sees the zipapp (Docker image and bubblewrap alike).
SANDBOX_AGENT_PATH = "/opt/forkyard/agent.pyz"
#: The interpreter line :func:`zipapp.create_archive` writes first.
INTERPRETER = "/usr/bin/env python3"

_EPOCH = (1980, 1, 1, 0, 0, 0)  # the earliest date a zip entry can carry
_MAIN = (f'"""forkyard in-sandbox agent (zipapp entry point): serve JSON lines on stdin."""\n\nimport sys\n\n'
         f"from {ZIP_PACKAGE}.cli import main\n\nsys.exit(main())\n").encode()
_lock = threading.Lock()
_built: dict[str, bytes] = {}
_checked: dict[str, tuple[int, int, int]] = {}  # path: (inode, size, mtime) when its bytes were last compared


def agent_sources() -> list[tuple[str, bytes]]:
    """``[(name in the archive, bytes)]``, sorted by name: the package's ``*.py`` files under
    :data:`ZIP_PACKAGE` and the root ``__main__.py``. Raises OSError when the package cannot be read."""
    files = [(f"{ZIP_PACKAGE}/{p.name}", p.read_bytes()) for p in AGENT_PACKAGE.glob("*.py")]
    return sorted(files + [("__main__.py", _MAIN)])


def zipapp_bytes() -> bytes:
    """The zipapp's bytes, built from the current sources (deterministic: see the module docstring)."""
    raw = io.BytesIO()
    with zipfile.ZipFile(raw, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, data in agent_sources():
            info = zipfile.ZipInfo(name, date_time=_EPOCH)
            info.create_system = 3  # Unix, whatever builds it
            info.external_attr = 0o100644 << 16
            zf.writestr(info, data)
    out = io.BytesIO()
    zipapp.create_archive(io.BytesIO(raw.getvalue()), out, interpreter=INTERPRETER)
    return out.getvalue()


def _cached_bytes() -> bytes:
    """:func:`zipapp_bytes`, built once per process (a running server's sources do not change)."""
    with _lock:
        if "pyz" not in _built:
            _built["pyz"] = zipapp_bytes()
        return _built["pyz"]


def _write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename. Raises OSError, and FileExistsError
    when ``path`` exists and is not a regular file (a device, a directory: never replaced)."""
    if (path.exists() or path.is_symlink()) and (path.is_symlink() or not path.is_file()):
        raise FileExistsError(errno.EEXIST, "exists and is not a regular file; the agent zipapp is not written there",
                              str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def agent_sha() -> str:
    """SHA-256 (hex, first 16 characters) of the agent zipapp and ``corpus.py``: what the sandbox image is
    built from (its label ``forkyard.agent_sha``; the image is rebuilt when this changes)."""
    h = hashlib.sha256(_cached_bytes())
    h.update(CORPUS_SCRIPT.read_bytes())
    return h.hexdigest()[:16]


def build_agent_zipapp(path: str | os.PathLike) -> str:
    """Write the agent zipapp to ``path`` (atomically, mode 0644; parents created) and return
    :func:`agent_sha`. Raises OSError when ``path`` cannot be written, FileExistsError when it is something
    other than a regular file (``/dev/null`` is never replaced)."""
    _write_atomically(Path(path), _cached_bytes())
    return agent_sha()


def agent_zipapp(directory: str | os.PathLike) -> Path:
    """The agent zipapp as a file, for the local backend to run or bind: ``<directory>/<hash>/agent.pyz``
    (the local backend's directory: ``cache_dir() / "agent"``, ``~/.cache/forkyard/agent``). Written once per
    content (the folder is named by the hash of the bytes), rewritten when missing or altered. Raises OSError."""
    data = _cached_bytes()
    path = Path(directory) / hashlib.sha256(data).hexdigest()[:16] / "agent.pyz"
    try:
        st = path.stat()
        key = (st.st_ino, st.st_size, st.st_mtime_ns)
        ok = _checked.get(str(path)) == key or (st.st_size == len(data) and path.read_bytes() == data)
    except OSError:
        ok = False
    if not ok:
        _write_atomically(path, data)
        st = path.stat()
        key = (st.st_ino, st.st_size, st.st_mtime_ns)
    with _lock:
        _checked[str(path)] = key
    return path


if __name__ == "__main__":
    # python -m sandbox_server.agent_bundle OUT.pyz: write the zipapp, print agent_sha (scripts/build-images.sh).
    if len(sys.argv) != 2:
        sys.exit("usage: python -m sandbox_server.agent_bundle OUT.pyz")
    print(build_agent_zipapp(sys.argv[1]))
