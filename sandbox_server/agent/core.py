"""The agent (:class:`Agent`): ``exec``, ``ps`` and the dispatch of every request to its operation, with
``pack`` / ``unpack`` (:mod:`.snapshot`), ``write`` (:mod:`.writes`) and ``recycle`` (:mod:`.recycle`)
from its bases. Standard library only.
"""

from __future__ import annotations

import os

from .capped import process_limits, run_capped
from .protocol import PAGE_BYTES, PROC_MEMORY_BYTES, PROC_OPEN_FILES, Fail, PathRewriter, env_problems, refused, within
from .interp import InterpreterOps
from .recycle import RecycleOps
from .snapshot import SnapshotOps
from .writes import WriteOps


class Agent(SnapshotOps, WriteOps, RecycleOps, InterpreterOps):
    """One agent process: the root mapping, the writable areas and their limits, and the operations of the
    protocol (the package docstring), each an ``op_<name>(request) -> answer`` method.

    Args:
        roots: {sandbox path: host path}; identity where absent.
        readable: sandbox roots tools may read.
        writable: writable areas (packed by snapshots; the first takes ``write``).
        area_bytes / max_write_files / max_area_entries: the limits (bytes; files; entries).
    """

    def op_exec(self, req: dict) -> dict:
        """Run ``argv`` (see ``exec`` in the package docstring) after the checks; refused calls run nothing."""
        argv = req.get("argv")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            return refused("argv must be a non-empty list of strings")
        self.open_areas()
        if any("\x00" in a for a in argv):
            return refused("argv contains a NUL byte")
        if req.get("bounded_only") and not self.bounded:
            return refused("this sandbox does not bound its process count (no pids cgroup could be made for it: the "
                           "local backend needs write access to the cgroup file system, as root); tools that run "
                           "code are off here")
        problems = env_problems(req.get("env") or {})
        if problems:
            return refused("session environment refused: " + "; ".join(problems))
        cwd = req.get("cwd") or (self.readable[0] if self.readable else "/")
        if not isinstance(cwd, str) or not cwd.startswith("/") or "\x00" in cwd \
                or not any(within(os.path.normpath(cwd), r) for r in self.readable):
            return refused(f"cwd {cwd!r} is outside {', '.join(self.readable)}")
        argv = list(argv)
        for i in req.get("path_args") or []:
            if not (isinstance(i, int) and 0 <= i < len(argv)):
                return refused(f"path_args index {i} out of range")
            err = self.check_path(cwd, argv[i])
            if err:
                return refused(err)
            if os.path.isabs(argv[i]):
                argv[i] = self.host(argv[i])  # identity in Docker / bubblewrap
        timeout = float(req.get("timeout_s", 10.0))
        cap = int(req.get("cap_bytes", 65536))
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C.UTF-8", "TZ": "UTC",
               "HOME": self.writable[0] if self.writable else "/tmp"}
        env.update(req.get("env") or {})
        rewriter = (lambda: PathRewriter(self._pairs)) if self._pairs else None  # one per stream
        if not req.get("bounded_only"):  # a fixed program of the whitelist: the agent's own limits, inherited
            return run_capped(argv, self.host(cwd), env, timeout, cap, rewriter, spare=self.spared())
        return run_capped(argv, self.host(cwd), env, timeout, cap, rewriter, process_limits(timeout, self.area_bytes),
                          self.signal_scope.enter if self.signal_scope is not None else None, spare=self.spared())

    def op_pack(self, req: dict) -> dict:
        """``pack`` (:mod:`.snapshot`) with the live interpreter's state by value (:meth:`export_session`, for copies
        in other sandboxes); with ``mark``, first a waiting copy of the live interpreter kept under that name
        (:meth:`op_mark`, for a rollback of this one)."""
        if req.get("mark"):
            self.op_mark({"name": req["mark"]})
        carried = self.export_session()
        self.open_areas()
        return self.pack_areas(carried)

    def op_unpack(self, req: dict) -> dict:
        """``unpack`` (:mod:`.snapshot`), then the live interpreter ends, or the copy named ``resume`` takes its place
        (:meth:`op_resume`); ``resumed`` (with ``resume`` only) says whether it did. Where no copy was resumed, the
        interpreter state the archive carries (if any) goes into the next session (:meth:`carry_in`)."""
        self.open_areas()
        try:
            ans = SnapshotOps.op_unpack(self, req)
        except BaseException:
            self.end_session()
            raise
        self.open_areas()  # an archive of an area taken while it was closed
        carried = ans.pop("carried", None)
        if req.get("resume"):
            ans["resumed"] = self.op_resume({"name": str(req["resume"])})["resumed"]
        else:
            self.end_session()  # the copies stay: a later rollback to one of this sandbox's snapshots resumes it
        self.carry_in(None if ans.get("resumed") else carried)
        return ans

    def op_recycle(self, req: dict) -> dict:
        """``recycle`` (:mod:`.recycle`), the interpreter and its copies ended first."""
        self.end_interpreter()
        self.open_areas()
        return RecycleOps.op_recycle(self, req)

    def op_ps(self, req: dict) -> dict:
        """``{"procs": [command line, ...]}`` of every process the agent sees."""
        procs = []
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        procs.append(f.read().replace(b"\x00", b" ").decode("utf-8", "replace").strip())
                except OSError:
                    pass
        return {"procs": procs}

    def handle(self, req: dict) -> dict:
        """Answer one request (never raises): errors become ``{"error", "error_kind"}``; host paths in
        ``error`` and ``message`` are written as sandbox paths."""
        if self.fatal is not None:
            return {"error": self.fatal, "error_kind": "isolation"}
        op = req.get("op")
        fn = getattr(self, f"op_{op}", None) if isinstance(op, str) else None
        if op == "ping":
            return {"pong": True, "pid": os.getpid(), "confinement": self.confinement, "recycle_scope": self.scope,
                    "limits": {"area_bytes": self.area_bytes, "page_bytes": PAGE_BYTES,
                               "max_write_files": self.max_write_files, "max_area_entries": self.max_area_entries,
                               "proc_memory_bytes": PROC_MEMORY_BYTES, "proc_open_files": PROC_OPEN_FILES,
                               "bounded": self.bounded}}
        if fn is None:
            return {"error": f"unknown op {op!r}", "error_kind": "refused"}
        try:
            ans = fn(req)
        except Fail as exc:
            ans = {"error": str(exc), "error_kind": exc.kind}
        except OSError as exc:
            ans = {"error": f"{type(exc).__name__}: {exc}", "error_kind": "error"}
        for k in ("error", "message"):
            if isinstance(ans.get(k), str):
                ans[k] = self.to_sandbox(ans[k])
        return ans
