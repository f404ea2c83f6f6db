"""The :class:`~sandbox_server.backends.base.Backend` contract as checks: what the pool and the service rely on,
run against a real backend (the sandbox counterpart of :func:`envs.check_fork_contract`).

:func:`check_backend_contract` runs every check on one backend: each starts its own sandbox and destroys it,
and each failure is an ``AssertionError`` naming the promise that broke. A new backend (built in or a plugin
of ``forkyard.backends``) passes them before a server serves it::

    from sandbox_server.backends import make_backend
    from sandbox_server.backends.checks import check_backend_contract

    backend = make_backend("mine")
    try:
        check_backend_contract(backend)
    finally:
        backend.close()
"""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager

from sandbox_server.agent import AREA_BYTES, MAX_WRITE_FILES
from sandbox_server.backends.base import Backend
from sandbox_server.errors import LimitExceeded, SandboxNotFound
from sandbox_server.tools import ToolResult, validate_call

#: /scratch folder the checks write in.
AREA = "contract"


@contextmanager
def _sandbox(backend: Backend, check: str) -> Iterator[str]:
    """A sandbox of ``backend`` for one check, destroyed afterwards."""
    sid = backend.create()
    assert isinstance(sid, str) and sid, f"{check}: create() returned {sid!r}, not a non-empty sandbox id"
    try:
        yield sid
    finally:
        backend.destroy(sid)


def _tool(backend: Backend, sid: str, tool: str, **args: object) -> ToolResult:
    """Run the whitelisted, read-only ``tool`` (validated as the service validates a client's call)."""
    call = validate_call(tool, args)
    res = backend.exec(sid, call.argv, cwd="/data", timeout_s=10.0, cap_bytes=65536, path_args=call.path_args)
    assert isinstance(res, ToolResult), f"exec({call.argv}) returned {type(res).__name__}, not a ToolResult"
    return res


def _text(backend: Backend, sid: str, tool: str, **args: object) -> str:
    """stdout of a tool call that must succeed (status ok, exit code 0)."""
    res = _tool(backend, sid, tool, **args)
    assert res.status == "ok" and res.exit_code == 0, (
        f"exec of the whitelisted {tool}({args}) did not succeed: status {res.status}, exit code {res.exit_code}, "
        f"stderr {res.stderr[:300]!r}, message {res.message!r}")
    return res.stdout


def check_interface(backend: Backend) -> None:
    """Every method of the protocol is there; ``name``, ``isolated`` and ``describe()`` are what they say."""
    missing = [m for m in ("describe", "host_data_dir", "create", "exec", "snapshot", "restore", "write_files",
                           "recycle", "destroy", "alive", "cleanup_orphans", "close")
               if not callable(getattr(backend, m, None))]
    assert not missing, f"{type(backend).__name__} lacks the Backend methods {missing}"
    assert isinstance(backend, Backend), f"{type(backend).__name__} is not a sandbox_server.backends.Backend"
    assert isinstance(backend.name, str) and backend.name, f"backend.name must be a non-empty str, got {backend.name!r}"
    assert isinstance(backend.isolated, bool), f"backend.isolated must be a bool, got {backend.isolated!r}"
    line = backend.describe()
    assert isinstance(line, str) and line and "\n" not in line, f"describe() must be one line, got {line!r}"


def check_alive_and_destroy(backend: Backend) -> None:
    """``alive`` is True for a created sandbox and False once destroyed (or never created); ``destroy`` is
    idempotent; ``exec`` on a destroyed sandbox raises SandboxNotFound."""
    assert backend.alive("no-such-sandbox") is False, "alive() of an id never created must be False"
    sid = backend.create()
    try:
        assert backend.alive(sid) is True, f"alive({sid!r}) must be True right after create()"
    finally:
        backend.destroy(sid)
    assert backend.alive(sid) is False, f"alive({sid!r}) must be False after destroy()"
    backend.destroy(sid)  # a second destroy: no error (idempotent)
    call = validate_call("ls", {"path": "/data"})
    try:
        backend.exec(sid, call.argv, path_args=call.path_args)
    except SandboxNotFound:
        pass
    else:
        raise AssertionError(f"exec on the destroyed sandbox {sid!r} must raise SandboxNotFound")


def check_exec(backend: Backend) -> None:
    """A whitelisted read-only command runs: ``ls /data`` lists the files of :meth:`host_data_dir`."""
    host = backend.host_data_dir()
    assert os.path.isdir(host), f"host_data_dir() must be an existing folder, got {host!r}"
    with _sandbox(backend, "exec") as sid:
        listed = set(_text(backend, sid, "ls", path="/data").splitlines())
        expected = {n for n in os.listdir(host) if not n.startswith(".")}
        assert listed == expected, (f"ls /data in the sandbox and host_data_dir() {host} differ: only in the "
                                    f"sandbox {sorted(listed - expected)[:5]}, only on the host "
                                    f"{sorted(expected - listed)[:5]}")


def check_snapshot_round_trip(backend: Backend) -> None:
    """``snapshot`` returns a tar of the writable areas; ``restore`` of it brings back exactly that state
    (a file changed since is restored, a file added since is gone)."""
    with _sandbox(backend, "snapshot") as sid:
        backend.write_files(sid, {f"{AREA}/a.txt": b"first\n"})
        snap = backend.snapshot(sid)
        assert isinstance(snap, bytes), f"snapshot() must return bytes, got {type(snap).__name__}"
        with tarfile.open(fileobj=io.BytesIO(snap)) as tar:
            names = tar.getnames()
        assert any(n.endswith(f"{AREA}/a.txt") for n in names), f"the snapshot's tar lacks {AREA}/a.txt: {names[:10]}"
        backend.write_files(sid, {f"{AREA}/a.txt": b"second\n", f"{AREA}/b.txt": b"later\n"})
        assert _text(backend, sid, "cat", path=f"/scratch/{AREA}/a.txt") == "second\n", "write_files did not overwrite"
        backend.restore(sid, snap)
        assert _text(backend, sid, "cat", path=f"/scratch/{AREA}/a.txt") == "first\n", \
            "after restore(snapshot), a file changed since the snapshot must hold its old content"
        assert _text(backend, sid, "ls", path=f"/scratch/{AREA}").split() == ["a.txt"], \
            "after restore(snapshot), a file written since the snapshot must be gone"


def check_write_files_limits(backend: Backend) -> None:
    """``write_files`` refuses with LimitExceeded, keeping nothing of the write: more files than
    ``MAX_WRITE_FILES``, more bytes than /scratch holds, and a write that fits alone but not beside what
    /scratch already holds (the sandbox's own check)."""
    with _sandbox(backend, "write limits") as sid:
        backend.write_files(sid, {f"{AREA}/keep.txt": b"kept\n"})
        too_many = {f"{AREA}/n{i}": b"" for i in range(MAX_WRITE_FILES + 1)}
        too_big = {f"{AREA}/big": bytes(AREA_BYTES + 1)}
        half = AREA_BYTES * 3 // 4
        backend.write_files(sid, {f"{AREA}/first": bytes(half)})
        beside = {f"{AREA}/second": bytes(half), f"{AREA}/partner.txt": b"x"}
        for what, files in (("too many files", too_many), ("too many bytes", too_big),
                            ("more than /scratch has left", beside)):
            try:
                backend.write_files(sid, files)
            except LimitExceeded:
                pass
            else:
                raise AssertionError(f"write_files of {what} must raise LimitExceeded")
        listed = _text(backend, sid, "ls", path=f"/scratch/{AREA}").split()
        assert sorted(listed) == ["first", "keep.txt"], \
            f"a refused write must keep none of its files; /scratch/{AREA} holds {sorted(listed)[:10]}"


def check_recycle(backend: Backend) -> None:
    """``recycle`` of a used sandbox answers True, and the sandbox is then alive with empty writable areas."""
    with _sandbox(backend, "recycle") as sid:
        backend.write_files(sid, {f"{AREA}/left.txt": b"left over\n"})
        ok = backend.recycle(sid)
        assert ok is True, f"recycle() of a healthy sandbox must answer True, got {ok!r}"
        assert backend.alive(sid) is True, "a recycled sandbox must be alive"
        left = _text(backend, sid, "ls", path="/scratch", all=True).split()
        assert left == [] or set(left) <= {".", ".."}, f"a recycled sandbox's /scratch must be empty, holds {left[:10]}"


def check_backend_contract(backend: Backend) -> None:
    """Run every check of this module on ``backend`` (it must be able to start sandboxes; it is not closed).

    Raises:
        AssertionError: naming the first broken promise. The backend's own errors (EngineUnavailable,
            IsolationUnavailable, AgentFailed...) pass through.
    """
    check_interface(backend)
    check_alive_and_destroy(backend)
    check_exec(backend)
    check_snapshot_round_trip(backend)
    check_write_files_limits(backend)
    check_recycle(backend)


__all__ = ["check_alive_and_destroy", "check_backend_contract", "check_exec", "check_interface", "check_recycle",
           "check_snapshot_round_trip", "check_write_files_limits"]
