"""Checks of what a client hands a sandbox session (working directory, environment variables, per-episode
files), made before any sandbox is taken or touched. Every refusal names what was wrong."""

from __future__ import annotations

import posixpath

from sandbox_server.backends import check_write_limits
from sandbox_server.errors import LimitExceeded, ToolRefused
from sandbox_server.settings import MAX_WRITE_BYTES
from sandbox_server.tools import OPT_IN_FAMILIES, READABLE_ROOTS, validate_session_env

#: Longest file name (one path component) and relative path of a written file, in UTF-8 bytes (Linux's
#: NAME_MAX, and PATH_MAX less room for the /scratch prefix).
MAX_NAME_BYTES, MAX_PATH_BYTES = 255, 4000


def check_cwd(cwd: str) -> str:
    """The normalised working directory. Raises ToolRefused unless it is an absolute path under one of
    :data:`~sandbox_server.tools.READABLE_ROOTS`, without ``..`` or NUL."""
    if not isinstance(cwd, str) or "\x00" in cwd or not cwd.startswith("/") or ".." in cwd.split("/"):
        raise ToolRefused(f"cwd must be an absolute path under {', '.join(READABLE_ROOTS)} without '..', got {cwd!r}")
    norm = posixpath.normpath(cwd)
    if not any(norm == r or norm.startswith(r + "/") for r in READABLE_ROOTS):
        raise ToolRefused(f"cwd {cwd!r} is outside {', '.join(READABLE_ROOTS)}")
    return norm


def check_env(env: dict[str, str] | None) -> dict[str, str]:
    """Session environment variables, checked against the allow-list. Raises ToolRefused naming the refused ones."""
    return validate_session_env(dict(env or {}))


def check_families(families: list[str] | None) -> list[str]:
    """The opt-in tool families a sandbox is created with, sorted and without repeats. Raises ToolRefused for a
    name not in :data:`~sandbox_server.tools.OPT_IN_FAMILIES`."""
    out = sorted(set(families or []))
    bad = [f for f in out if f not in OPT_IN_FAMILIES]
    if bad:
        raise ToolRefused(f"unknown opt-in tool families {bad}; the opt-in families are: {', '.join(OPT_IN_FAMILIES)}")
    return out


def check_files(files: dict[str, bytes]) -> None:
    """Refuse bad per-episode file paths, more than :data:`MAX_WRITE_BYTES` in all, and writes that cannot
    fit /scratch or pass the file-count limit (:func:`~sandbox_server.backends.check_write_limits`), before
    any sandbox is taken or touched. Raises ToolRefused / LimitExceeded."""
    total = 0
    for rel, data in files.items():
        if not isinstance(rel, str) or not rel or rel.startswith("/") or "\x00" in rel or ".." in rel.split("/"):
            raise ToolRefused(f"file path {rel!r} must be relative to /scratch, without '..' or NUL")
        if len(rel.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES or \
                any(len(part.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES for part in rel.split("/")):
            raise ToolRefused(f"file path {rel[:60]!r}... is too long: at most {MAX_NAME_BYTES} bytes a name and "
                              f"{MAX_PATH_BYTES} bytes a path")
        total += len(data)
    if total > MAX_WRITE_BYTES:
        raise LimitExceeded(f"{total} bytes of files; the limit of one write is {MAX_WRITE_BYTES} bytes")
    check_write_limits(files)


__all__ = ["MAX_NAME_BYTES", "MAX_PATH_BYTES", "check_cwd", "check_env", "check_files"]
