"""The in-sandbox agent: the main process of every sandbox. Standard library only (Python >= 3.9).

It reads one JSON request per line on stdin and writes one JSON answer per line on stdout; every
request carries an ``id`` that the answer echoes. The server talks to a Docker container through its
attached stdio (so the container keeps ``network_mode=none``) and to a local sandbox through pipes.

Operations (``op``):

``ping``
    ``{"pong": true, "pid": ...}``.
``exec``
    ``argv`` (list of str, run directly, never through a shell), ``cwd`` (sandbox path), ``env``
    (dict), ``timeout_s`` (seconds), ``cap_bytes`` (output cap, bytes), ``path_args`` (indices of
    ``argv`` items that are paths; each must resolve, symlinks included, inside one of the agent's
    readable roots, or the call is refused and nothing runs). The child runs in its own process group
    (new session) with an empty stdin; its output is read while it runs and the child is stopped at the
    cap; at the deadline the whole group is killed. Answer: ``stdout``, ``stderr``, ``exit_code``,
    ``status`` (ok|timeout|refused|error), ``truncated``, ``duration_s``, ``message``.
``pack`` / ``unpack``
    Pack the writable areas into a base64 tar (``data``), or replace their contents with one.
``write``
    ``files``: {relative path: base64 bytes} written under the first writable area (``/scratch``).
``ps``
    Command lines of the processes visible to the agent (tests use it to prove nothing was left).

Paths are *sandbox paths* (``/data/x``); ``--root SANDBOX=HOST`` maps them onto host directories when
the agent runs without a mount namespace (the local backend without bubblewrap). In Docker and under
bubblewrap every mapping is the identity.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tarfile
import time

MARKER = "\n[... output cut at {cap} bytes]"


def utf8_cut(data: bytes) -> bytes:
    """Drop an incomplete UTF-8 sequence at the end of ``data`` (so a cut never splits a character)."""
    n = len(data)
    for back in range(1, min(4, n) + 1):
        b = data[n - back]
        if b & 0xC0 == 0x80:  # continuation byte: keep looking for the lead byte
            continue
        if b & 0x80 == 0:  # ASCII: nothing incomplete
            return data
        need = 2 if b & 0xE0 == 0xC0 else 3 if b & 0xF0 == 0xE0 else 4 if b & 0xF8 == 0xF0 else 1
        return data if back >= need else data[: n - back]
    return data


def decode(data: bytes) -> str:
    """Decode bytes as UTF-8 with U+FFFD for invalid sequences."""
    return data.decode("utf-8", errors="replace")


def _within(path: str, root: str) -> bool:
    """Component-wise containment (never a string-prefix test)."""
    try:
        return os.path.commonpath([path, root]) == root
    except ValueError:
        return False


class Agent:
    """State of one agent process: the root mapping and the writable areas."""

    def __init__(self, roots: dict[str, str], readable: list[str], writable: list[str]):
        self.roots = {os.path.normpath(k): os.path.normpath(v) for k, v in roots.items()}
        self.readable = [os.path.normpath(r) for r in readable]
        self.writable = [os.path.normpath(w) for w in writable]

    # -- path mapping ---------------------------------------------------------------------------
    def host(self, sandbox_path: str) -> str:
        """Map a sandbox path to a host path (identity where no root maps it)."""
        p = os.path.normpath(sandbox_path)
        best = None
        for s in self.roots:
            if _within(p, s) and (best is None or len(s) > len(best)):
                best = s
        if best is None:
            return p
        rel = os.path.relpath(p, best)
        return self.roots[best] if rel == "." else os.path.join(self.roots[best], rel)

    def check_path(self, cwd: str, arg: str) -> str | None:
        """Return an error message if ``arg`` (relative to sandbox ``cwd``) escapes the readable roots."""
        virt = os.path.normpath(os.path.join(cwd, arg))
        if not any(_within(virt, r) for r in self.readable):
            return f"path {arg!r} resolves to {virt}, outside {', '.join(self.readable)}"
        real = os.path.realpath(self.host(virt))
        real_roots = [os.path.realpath(self.host(r)) for r in self.readable]
        if not any(_within(real, r) for r in real_roots):
            return f"path {arg!r} leaves {', '.join(self.readable)} through a symbolic link"
        return None

    # -- operations -----------------------------------------------------------------------------
    def op_exec(self, req: dict) -> dict:
        argv = req.get("argv")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            return _refused("argv must be a non-empty list of strings")
        if any("\x00" in a for a in argv):
            return _refused("argv contains a NUL byte")
        cwd = req.get("cwd") or (self.readable[0] if self.readable else "/")
        argv = list(argv)
        for i in req.get("path_args") or []:
            if not (0 <= i < len(argv)):
                return _refused(f"path_args index {i} out of range")
            err = self.check_path(cwd, argv[i])
            if err:
                return _refused(err)
            if os.path.isabs(argv[i]):
                argv[i] = self.host(argv[i])  # identity in Docker / bubblewrap
        timeout = float(req.get("timeout_s", 10.0))
        cap = int(req.get("cap_bytes", 65536))
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C.UTF-8", "HOME": self.writable[0] if self.writable else "/tmp"}
        env.update({str(k): str(v) for k, v in (req.get("env") or {}).items()})
        return run_capped(argv, self.host(cwd), env, timeout, cap)

    def op_pack(self, req: dict) -> dict:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for w in self.writable:
                h = self.host(w)
                for name in sorted(os.listdir(h)) if os.path.isdir(h) else []:
                    tar.add(os.path.join(h, name), arcname=os.path.join(w.lstrip("/"), name))
        return {"data": base64.b64encode(buf.getvalue()).decode("ascii"), "size_bytes": buf.tell()}

    def op_unpack(self, req: dict) -> dict:
        for w in self.writable:
            _clear(self.host(w))
        raw = base64.b64decode(req.get("data") or "")
        if raw:
            with tarfile.open(fileobj=io.BytesIO(raw), mode="r") as tar:
                for m in tar.getmembers():
                    virt = os.path.normpath("/" + m.name)
                    if not any(_within(virt, w) and virt != w for w in self.writable):
                        return {"error": f"archive member {m.name!r} outside the writable areas"}
                    if m.issym() or m.islnk() or m.isdev():
                        # Links could point anywhere; the writable areas never need them restored.
                        continue
                    dest = self.host(virt)
                    if m.isdir():
                        os.makedirs(dest, exist_ok=True)
                    elif m.isfile():
                        os.makedirs(os.path.dirname(dest), exist_ok=True)
                        src = tar.extractfile(m)
                        with open(dest, "wb") as f:
                            shutil.copyfileobj(src, f)
                        os.chmod(dest, m.mode & 0o755)
        return {"ok": True}

    def op_write(self, req: dict) -> dict:
        if not self.writable:
            return {"error": "no writable area"}
        base = self.writable[0]
        for rel, b64 in (req.get("files") or {}).items():
            virt = os.path.normpath(os.path.join(base, rel))
            if os.path.isabs(rel) or not _within(virt, base) or virt == base or "\x00" in rel:
                return {"error": f"file path {rel!r} must be relative and stay inside {base}"}
            dest = self.host(virt)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            if os.path.islink(dest):
                os.unlink(dest)
            with open(dest, "wb") as f:
                f.write(base64.b64decode(b64))
        return {"ok": True}

    def op_ps(self, req: dict) -> dict:
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
        op = req.get("op")
        fn = getattr(self, f"op_{op}", None) if isinstance(op, str) else None
        if op == "ping":
            return {"pong": True, "pid": os.getpid()}
        if fn is None:
            return {"error": f"unknown op {op!r}"}
        return fn(req)


def _refused(message: str) -> dict:
    return {"stdout": "", "stderr": "", "exit_code": None, "status": "refused", "truncated": False,
            "duration_s": 0.0, "message": message}


def _clear(path: str) -> None:
    if not os.path.isdir(path):
        return
    for name in os.listdir(path):
        p = os.path.join(path, name)
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p, ignore_errors=True)
        else:
            try:
                os.unlink(p)
            except OSError:
                pass


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_capped(argv: list[str], cwd: str, env: dict, timeout_s: float, cap_bytes: int) -> dict:
    """Run ``argv`` in a new session with empty stdin; read stdout/stderr while it runs.

    Stops the call's whole process group at ``cap_bytes`` of stdout or at ``timeout_s`` seconds. The call
    ends when the direct child has exited *and* both pipes are closed (a background child that keeps the
    pipe open keeps the call running until the deadline), after which the group is killed so nothing
    the call started survives it. Returns the answer dict of the ``exec`` op.
    """
    t0 = time.monotonic()
    deadline = t0 + max(0.0, timeout_s)
    err_cap = min(cap_bytes, 16384)
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                cwd=cwd, env=env, start_new_session=True, close_fds=True)
    except (OSError, ValueError) as exc:
        return {"stdout": "", "stderr": str(exc), "exit_code": None, "status": "error", "truncated": False,
                "duration_s": time.monotonic() - t0, "message": f"could not start {argv[0]}: {exc}"}
    pgid = proc.pid
    out, err = bytearray(), bytearray()
    truncated = False
    timed_out = False
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, (out, cap_bytes + 1))
    sel.register(proc.stderr, selectors.EVENT_READ, (err, err_cap + 1))
    open_streams = 2
    exited = False
    pidfd = -1
    try:
        pidfd = os.pidfd_open(proc.pid)
        sel.register(pidfd, selectors.EVENT_READ, None)
    except (AttributeError, OSError):
        pidfd = -1
    try:
        while open_streams or (pidfd >= 0 and not exited):
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            for key, _ in sel.select(min(left, 0.5)):
                if key.data is None:  # the pidfd: the direct child exited
                    exited = True
                    sel.unregister(key.fileobj)
                    continue
                buf, limit = key.data
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    open_streams -= 1
                    continue
                room = limit - len(buf)
                buf += chunk[:room]
                if len(buf) >= limit and buf is out:
                    truncated = True
                    break
                # stderr over its cap: keep reading (and dropping) so the child is not blocked
            if truncated:
                break
    finally:
        if timed_out or truncated:
            _killpg(pgid)
        sel.close()
        if pidfd >= 0:
            os.close(pidfd)
    if not (timed_out or truncated):
        left = max(0.05, deadline - time.monotonic())
        try:
            proc.wait(left)
        except subprocess.TimeoutExpired:
            timed_out = True
    _killpg(pgid)  # nothing the call started outlives it
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        pass
    proc.stdout.close()
    proc.stderr.close()
    _wait_group_gone(pgid)
    status = "timeout" if timed_out else "ok"
    out_b = bytes(out[:cap_bytes])
    err_trunc = len(err) > err_cap
    err_b = bytes(err[:err_cap])
    stdout = decode(utf8_cut(out_b) if truncated else out_b)
    if truncated:
        stdout += MARKER.format(cap=cap_bytes)
    stderr = decode(utf8_cut(err_b) if err_trunc else err_b)
    msg = ""
    if timed_out:
        msg = f"the call ran past its {timeout_s:g} s timeout and was killed"
    elif truncated:
        msg = f"the output passed the {cap_bytes}-byte cap; the call was stopped"
    return {"stdout": stdout, "stderr": stderr, "exit_code": None if (timed_out or truncated) else proc.returncode,
            "status": status, "truncated": truncated, "duration_s": time.monotonic() - t0, "message": msg}


def _wait_group_gone(pgid: int, limit_s: float = 2.0) -> None:
    """Reap and wait until no process of group ``pgid`` is left (the agent is a child subreaper)."""
    end = time.monotonic() + limit_s
    while True:
        _reap()
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        if time.monotonic() > end:
            return
        _killpg(pgid)
        time.sleep(0.001)


def _become_subreaper() -> None:
    """Make orphans of tool calls re-parent to the agent (Linux prctl), so it can reap them."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except Exception:
        pass


def _reap() -> None:
    """Reap any exited children (the agent may run as PID 1 and inherit orphans)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def main(argv: list[str] | None = None) -> int:
    """Serve JSON-line requests on stdin until EOF. Returns the exit status."""
    ap = argparse.ArgumentParser(description="forkyard in-sandbox agent")
    ap.add_argument("--root", action="append", default=[], help="SANDBOX_PATH=HOST_PATH mapping")
    ap.add_argument("--readable", action="append", default=None, help="sandbox roots tools may read")
    ap.add_argument("--writable", action="append", default=None, help="writable areas (packed by snapshot)")
    ns = ap.parse_args(argv)
    roots = dict(r.split("=", 1) for r in ns.root)
    agent = Agent(roots, ns.readable or ["/data", "/scratch"], ns.writable or ["/scratch", "/tmp"])
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    _become_subreaper()
    stdin = sys.stdin.buffer
    stdout = sys.stdout.buffer
    while True:
        line = stdin.readline()
        if not line:
            return 0
        rid = None
        try:
            req = json.loads(line)
            rid = req.get("id") if isinstance(req, dict) else None
            if not isinstance(req, dict):
                raise ValueError("a request must be a JSON object")
            ans = agent.handle(req)
        except Exception as exc:  # never die on one bad request
            ans = {"error": f"{type(exc).__name__}: {exc}"}
        ans["id"] = rid
        stdout.write(json.dumps(ans, ensure_ascii=True).encode("ascii") + b"\n")
        stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
