"""The interpreter family's live Python session: a fixed, standard-library-only program that runs **in the sandbox**.

The agent starts it once per sandbox, at the first ``run_cell`` call, with the sandbox's own ``python3`` (``-E -s -B
-c SOURCE``, working directory the workspace ``/scratch``) and the limits of every call that runs code (memory, file
size, open files; a Landlock domain of its own, so it can signal nothing outside it). It then keeps its variables
from cell to cell, as the code interpreters of data-analysis and coding agents do (a Jupyter kernel without Jupyter).
Python >= 3.9; imports nothing outside the standard library and nothing of forkyard.

Channels (file descriptors the agent opens and passes, named by the last two arguments):

* requests, one JSON line each, numbered (``n``, echoed by the answer): ``{"code": str}`` runs a cell;
  ``{"op": "fork"}`` answers with the pid of a
  copy of this process made by ``os.fork`` that waits until the agent resumes it (SIGUSR1, from the agent only) in
  place of the session then running: the session's variables as they were (a rollback of the interpreter);
  ``{"op": "reap"}`` reaps the session's ended children (after the agent killed what a cell left).
* answers, one JSON line each: ``{"n": int, "ok": bool, "error": str | null, "lost_output": bool}`` (``lost_output``:
  file descriptor 1 or 2 is no longer the agent's pipe), written after the cell's output is flushed. A process the
  cell itself forked never answers: it exits when the cell ends in it.
* ``1`` / ``2``: the cell's standard output and error (the agent captures and caps them); stdin is ``/dev/null``.

A cell runs as IPython runs one: its statements in the session's ``__main__`` namespace, and when its last statement
is an expression, that value's ``repr`` printed (unless None). An exception prints its traceback (without this
runner's frames) to stderr and the session goes on; ``SystemExit`` (``exit()``, ``sys.exit``) is reported the same
way and does not end the session; SIGINT (the agent's first step at a cell's deadline) raises ``KeyboardInterrupt``
in the cell. A cell that ends the process (``os._exit``, a crash, the memory bound) ends the session: the agent
says so, and the next cell starts a new one with no variables.
"""

from __future__ import annotations

import ast
import json
import os
import signal
import sys
import traceback

#: The signal that resumes a waiting copy, taken from the agent only.
RESUME_SIGNAL = signal.SIGUSR1
#: The agent: the process that started this session (every copy keeps the value).
AGENT_PID = os.getppid()


def _streams() -> list[tuple[int, int] | None]:
    """What file descriptors 1 and 2 are now: ``(device, inode)`` each, None when closed."""
    out: list[tuple[int, int] | None] = []
    for fd in (1, 2):
        try:
            st = os.fstat(fd)
            out.append((st.st_dev, st.st_ino))
        except OSError:
            out.append(None)
    return out


def _reap_forked() -> None:
    """Reap the children a cell forked that have ended and that no live ``subprocess.Popen`` holds: a fork bomb's
    exited copies would otherwise stay zombies of this session, each one counted against the sandbox's process bound
    until the session ends. (A child a cell forked with ``os.fork`` and meant to ``os.waitpid`` later is reaped here
    too; a ``Popen``'s child is left to its object.)"""
    zombies = []
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children") as f:
                for child in f.read().split():
                    with open(f"/proc/{child}/stat", "rb") as st:
                        if st.read().rpartition(b")")[2].split()[0] == b"Z":
                            zombies.append(int(child))
    except (OSError, ValueError, IndexError):
        pass
    if not zombies:
        return
    held: set = set()
    if "subprocess" in sys.modules:
        import gc

        popen = sys.modules["subprocess"].Popen
        held = {o.pid for o in gc.get_objects() if isinstance(o, popen) and o.returncode is None}
    for pid in zombies:
        if pid not in held:
            try:
                os.waitpid(pid, os.WNOHANG)
            except OSError:
                pass


def _compile(code: str):
    """``(statements code object or None, last-expression code object or None)`` of one cell."""
    tree = ast.parse(code, "<cell>", "exec")
    last = None
    tail = tree.body[-1] if tree.body else None
    if isinstance(tail, ast.Expr):
        tree.body.pop()
        last = ast.Expression(tail.value)
    body = compile(tree, "<cell>", "exec") if tree.body else None
    return body, (compile(last, "<cell>", "eval") if last is not None else None)


def _print_exception(exc: BaseException) -> None:
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != "<cell>":
        tb = tb.tb_next  # this runner's frames are not the cell's
    sys.stderr.write("".join(traceback.format_exception(type(exc), exc, tb)))


def run_cell(code: str, namespace: dict) -> tuple[bool, str | None]:
    """Run one cell in ``namespace``; ``(ok, error name or None)``. Never raises (but for a process exit)."""
    try:
        body, last = _compile(code)
        if body is not None:
            exec(body, namespace)
        if last is not None:
            value = eval(last, namespace)
            if value is not None:
                namespace["_"] = value
                print(repr(value))
        return True, None
    except BaseException as exc:  # SystemExit and KeyboardInterrupt too: the session goes on
        _print_exception(exc)
        return False, type(exc).__name__
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass


def _fork_template() -> int:
    """Make a waiting copy of this session (``os.fork``); returns its pid here. The copy waits until the agent sends it
    :data:`RESUME_SIGNAL` (the same signal from any other process is ignored), then goes on serving the request
    channel as the live session. The ``random`` module's generator, which reseeds itself in a forked child, is put
    back to the session's state in the copy."""
    rng = sys.modules.get("random")
    state = rng.getstate() if rng is not None else None
    signal.pthread_sigmask(signal.SIG_BLOCK, {RESUME_SIGNAL})  # the copy's resume stays pending until it waits
    pid = os.fork()
    if pid == 0:
        if rng is not None:  # the random module reseeds itself in a forked child: a copy keeps the session's state
            rng.setstate(state)
        os.setsid()  # its own process group: killing the live session's group never reaches a waiting copy
        while signal.sigwaitinfo({RESUME_SIGNAL}).si_pid != AGENT_PID:
            pass  # sent by anyone but the agent (a cell): ignored
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {RESUME_SIGNAL})
        return 0
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {RESUME_SIGNAL})
    return pid


def main() -> int:
    """Serve cells until the request channel closes."""
    namespace: dict = {"__name__": "__main__", "__builtins__": __builtins__}
    session = [os.getpid()]  # the process that serves requests (a resumed copy, after a rollback)
    streams = _streams()  # the agent's output pipes
    requests = os.fdopen(int(sys.argv[-2]), "rb")
    answers = os.fdopen(int(sys.argv[-1]), "wb", buffering=0)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.path.insert(0, os.getcwd())  # the workspace's modules import, as in a script run from there
    line = b""
    while True:
        chunk = requests.readline()
        if not chunk:
            return 0
        line += chunk
        if not line.endswith(b"\n"):
            continue
        try:
            req = json.loads(line)
        except ValueError:
            req = {}
        line = b""
        if req.get("op") == "reap":  # the agent killed what the cell left: its ended children
            _reap_forked()
            answers.write(json.dumps({"n": req.get("n"), "ok": True}).encode() + b"\n")
            continue
        if req.get("op") == "fork":
            pid = _fork_template()
            if pid == 0:
                session[0] = os.getpid()
                continue  # resumed: this copy is now the session
            answers.write(json.dumps({"n": req.get("n"), "ok": True, "pid": pid}).encode() + b"\n")
            continue
        ok, error = run_cell(str(req.get("code", "")), namespace)
        if os.getpid() != session[0]:
            os._exit(0)  # a copy the cell's own os.fork made: it never answers nor reads the next request
        lost = _streams() != streams  # a cell closed or replaced fd 1 or 2: later output never reaches the agent
        answers.write(json.dumps({"n": req.get("n"), "ok": ok, "error": error, "lost_output": lost}).encode() + b"\n")


if __name__ == "__main__":
    sys.exit(main())
