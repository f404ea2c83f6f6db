"""The ``cell`` operation (:class:`InterpreterOps`): one live Python session per sandbox, kept between calls.

The session is :mod:`sandbox_server.interpreter_runner` run by the sandbox's ``python3`` (the server sends its argv
with each request; the agent starts it at the first cell, and again after it ended). It runs in its own session and
process group with the workspace as its directory, the agent's limits (inherited) and its own Landlock signal scope,
and only where the sandbox's process count is bounded (``--bounded``), like every call that runs code. What a cell
starts (subprocesses, daemons) is killed when the cell ends; the session process and its waiting copies
(``marks``) are spared, and the session itself is stopped (SIGSTOP) until its next request: a thread a cell left
running never runs between calls (never beside a snapshot or another tool). A cell past its deadline is
interrupted (SIGINT: ``KeyboardInterrupt`` in the cell, the session kept) and, when it does not stop within
:data:`INTERRUPT_GRACE_S`, the session is killed (its variables are gone; the answer says so). Output is
captured like ``exec``'s: at most ``cap_bytes`` of stdout (the cell is interrupted at the cap), 16 KiB of stderr.
For a copy of the sandbox elsewhere, :meth:`InterpreterOps.export_session` asks the session for its state by value
(at most :data:`~.protocol.INTERPRETER_STATE_BYTES`; the answer is read no further than that), which ``pack`` puts
in the archive; :meth:`InterpreterOps.carry_in` keeps what an ``unpack`` brought for the next session's first cell.
Standard library only.

Why one file: the session, its copies and the channels they share are one set of handles whose life is one
sequence (start, cell, pause, copy, resume, end): split, each part would reach into the others' pids and pipes.
"""

from __future__ import annotations

import base64
import json
import os
import selectors
import signal
import subprocess
import time

from .proc import children_of, kill_descendants, oom_first, parent_of, reap_children, state_of
from .protocol import INTERPRETER_STATE_BYTES, MARKER, decode, refused, utf8_cut
from .state import AgentState

#: Seconds a cell has, after its SIGINT, to stop before its session is killed.
INTERRUPT_GRACE_S = 1.0
#: Most copies (marks) of a session kept; the oldest goes first.
MAX_MARKS = 8
#: The signal that resumes a copy; the copy takes it from the agent only (``si_pid``), so a cell cannot wake one.
RESUME_SIGNAL = signal.SIGUSR1
#: Longest answer line the agent reads from a session (a cell's answer lists the names a copy carried).
ANSWER_BYTES = 4 << 20
#: Longest answer to an ``export``: the state, base64-encoded, and room for the JSON around it.
EXPORT_ANSWER_BYTES = INTERPRETER_STATE_BYTES * 4 // 3 + (64 << 10)
#: How a carried member that holds no state starts (then the reason, UTF-8): written by :meth:`export_session` when
#: the session could not export its state; a copy's first cell then reports the reason and imports nothing.
NO_STATE = b"FORKYARD-NO-STATE:"


class _Session:
    """A running interpreter: its process, the request / answer pipes (agent's ends) and its output pipes."""

    def __init__(self, proc: subprocess.Popen, req_w: int, ans_r: int):
        assert proc.stdout is not None and proc.stderr is not None  # both are pipes
        self.proc = proc
        self.out_fd, self.err_fd = proc.stdout.fileno(), proc.stderr.fileno()
        self.pid: int | None = proc.pid  # the live session's pid (a resumed copy's, after a rollback), None: ended
        self.req_w = req_w
        self.ans_r = ans_r
        self.answer = bytearray()
        self.scanned = 0  # bytes of ``answer`` known to hold no newline
        self.cells = 0
        self.n = 0  # number of the last request sent; an answer with another is stale (dropped)

    def send(self, req: dict) -> bool:
        """Send one numbered request; False when the session cannot take it (it ended)."""
        self.n += 1
        try:
            os.write(self.req_w, json.dumps({**req, "n": self.n}).encode("utf-8", "surrogatepass") + b"\n")
            return True
        except OSError:
            return False

    def take_answer(self, limit: int = ANSWER_BYTES) -> dict | None:
        """The answer to the last request if a whole line of it arrived (stale ones dropped); None when none yet.
        Raises ValueError when the channel carried something that is not an answer, or a line longer than
        ``limit`` bytes (a runner a cell rewrote: the agent's memory is the sandbox's too)."""
        while True:
            end = self.answer.find(b"\n", self.scanned)
            if end < 0:
                if len(self.answer) > limit:
                    raise ValueError(f"an answer longer than {limit} bytes")
                self.scanned = len(self.answer)  # a long answer (an exported state) arrives in many reads
                return None
            line = bytes(self.answer[:end])
            del self.answer[:end + 1]
            self.scanned = 0
            ans = json.loads(line)
            if isinstance(ans, dict) and ans.get("n") == self.n:
                return ans

    def close(self) -> None:
        for fd in (self.req_w, self.ans_r):
            try:
                os.close(fd)
            except OSError:
                pass
        for f in (self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()


class InterpreterOps(AgentState):
    """``cell``: run code in the sandbox's live interpreter (see the module docstring); ``mark`` / ``resume``: a
    waiting ``os.fork`` copy of the session, and putting it back in place of the live one.

    A copy outlives the session it was made from (a crash, a session ended at its deadline, a rollback elsewhere):
    only recycling (:meth:`end_interpreter`) and the :data:`MAX_MARKS` bound drop copies. Each copy keeps the
    channel (pipes) of the session it came from, open until no copy and no live session uses it."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        #: The channel of the live session (its ``pid`` None when no session runs on it), or None.
        self._interp: _Session | None = None
        #: The copies kept: {name: (pid, the channel it answers on)}, oldest first.
        self._marks: dict[str, tuple[int, _Session]] = {}
        #: An interpreter state by value an unpacked archive carried, for the next session's first cell; None: none.
        self._carried: bytes | None = None
        #: Why the agent ended the live session between calls (a snapshot it could not take), for the next cell.
        self._ended_why: str | None = None

    def spared(self) -> set[int]:
        """Pids a call's clean-up must not kill: the live session and the copies."""
        live = {self._interp.pid} if self._interp is not None and self._interp.pid is not None else set()
        return live | {pid for pid, _ in self._marks.values()}

    def _release(self, ch: _Session | None) -> None:
        """Close channel ``ch`` when no live session and no copy uses it any more."""
        if ch is None or (ch is self._interp and ch.pid is not None) or any(c is ch for _, c in self._marks.values()):
            return
        ch.close()
        try:
            ch.proc.wait(2)
        except subprocess.TimeoutExpired:
            pass
        if ch is self._interp:
            self._interp = None

    def end_session(self) -> None:
        """Kill the live session (its variables are gone; the next cell starts a new one); the copies stay."""
        s = self._interp
        if s is None:
            return
        if s.pid is not None:
            _kill_group(s.pid)
            s.pid = None
        self._interp = None
        self._release(s)

    def _drop_mark(self, name: str) -> None:
        pid, ch = self._marks.pop(name)
        _kill_group(pid)
        self._release(ch)

    def end_interpreter(self) -> None:
        """Kill the session and every copy, close their channels (recycling: nothing of it reaches the next user)."""
        self._carried = self._ended_why = None
        self.end_session()
        for name in list(self._marks):
            self._drop_mark(name)
        reap_children()

    def _pause(self) -> None:
        """Stop the live session until its next request (its threads too: nothing of a cell runs between calls, so a
        snapshot or another tool never races it); a session that will not stop is ended."""
        s = self._interp
        if s is not None and s.pid is not None and not (_signal(s.pid, signal.SIGSTOP) and _wait_stopped(s.pid, 2.0)):
            self.end_session()

    def _start(self, argv: list[str], env: dict) -> _Session:
        req_r, req_w = os.pipe()
        ans_r, ans_w = os.pipe()
        scope = self.signal_scope

        def first_step() -> None:  # the OOM killer's first choice (the agent its last), then its own signal scope
            oom_first()
            if scope is not None:
                scope.enter()

        try:  # the runner's last two arguments: the request and answer channels' descriptors
            proc = subprocess.Popen([*argv, str(req_r), str(ans_w)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, cwd=self.host(self.writable[0]), env=env,
                                    start_new_session=True, pass_fds=(req_r, ans_w), preexec_fn=first_step)
        finally:
            os.close(req_r)
            os.close(ans_w)
        for fd in (proc.stdout.fileno(), proc.stderr.fileno()):  # type: ignore[union-attr]  # both are pipes
            os.set_blocking(fd, False)
        os.set_blocking(ans_r, False)
        return _Session(proc, req_w, ans_r)

    def op_cell(self, req: dict) -> dict:
        """Run ``code`` in the live session (starting ``argv`` when there is none); answer like ``exec`` plus
        ``session`` (``kept``, ``started``: a new session ran this cell, ``ended``: the cell ended the session)."""
        t0 = time.monotonic()
        if not self.bounded:
            return refused("this sandbox does not bound its process count; the interpreter is off here")
        argv, code = req.get("argv"), req.get("code")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) and "\x00" not in a for a in argv):
            return refused("argv must be a non-empty list of strings")
        if not isinstance(code, str):
            return refused("code must be a string")
        timeout = float(req.get("timeout_s", 10.0))
        cap = int(req.get("cap_bytes", 65536))
        self.open_areas()
        started = False
        live = self._interp
        if live is not None and live.pid is not None and state_of(live.pid) in ("Z", "X", None):
            self.end_session()  # the session ended between calls
        if self._interp is None or self._interp.pid is None:
            self.end_session()
            env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C.UTF-8", "TZ": "UTC",
                   "HOME": self.writable[0] if self.writable else "/tmp"}
            env.update(req.get("env") or {})
            env = {k: v for k, v in env.items() if not k.startswith("PYTHON")}
            env["PYTHONHASHSEED"] = "0"  # one string hash in every session: a set prints alike in a copy and a replay
            try:
                self._interp = self._start(argv, env)
            except (OSError, ValueError, subprocess.SubprocessError) as exc:
                return {"stdout": "", "stderr": "", "exit_code": None, "status": "error", "truncated": False,
                        "duration_s": time.monotonic() - t0, "message": f"could not start the interpreter: {exc}"}
            started = True
        s = self._interp
        assert s.pid is not None
        carry, self._carried = (self._carried if started else None), (None if started else self._carried)
        note = carry[len(NO_STATE):].decode("utf-8", "replace")[:300] if carry and carry.startswith(NO_STATE) else None
        _signal(s.pid, signal.SIGCONT)  # stopped between calls
        answer, out, err, truncated, timed_out = self._run(s, code, t0 + max(0.0, timeout), cap,
                                                           None if note is not None else carry)
        report = {"carried": [], "dropped": {"*": note}} if note is not None else answer  # what the copy took
        ended = answer is None
        if ended:
            self.end_session()
        else:
            s.cells += 1
        kill_descendants(spare=self.spared())  # what the cell started, never the session or its copies
        if self._interp is not None and self._interp.pid is not None and _zombie_children(self._interp.pid):
            self._request(self._interp, {"op": "reap"})  # dead children of the session count against the pids bound
        self._pause()
        err_cap = min(cap, 16384)
        stdout = decode(utf8_cut(bytes(out[:cap])) if truncated else bytes(out[:cap]))
        if truncated:
            stdout += MARKER.format(cap=cap)
        stderr = decode(utf8_cut(bytes(err[:err_cap])) if len(err) > err_cap else bytes(err))
        if timed_out:
            msg = (f"the cell ran past its {timeout:g} s timeout and was interrupted"
                   + ("; it did not stop, so the interpreter was ended (its variables are gone)" if ended else ""))
        elif truncated:
            msg = f"the output passed the {cap}-byte cap; the cell was interrupted"
        elif ended:
            msg = ("the cell ended the interpreter (os._exit, a crash, or a kill at the sandbox's memory bound); its "
                   "variables are gone and the next cell starts a new one")
        else:
            msg = ""
        if answer and answer.get("lost_output"):
            msg = "; ".join(x for x in (msg, "the cell closed or replaced its standard output or error: what the "
                                             "session prints no longer reaches the caller (os._exit(0) in a cell "
                                             "starts a new interpreter)") if x)
        if started:  # a policy that relies on earlier variables learns what came with a copy, and what is gone
            msg = "; ".join(x for x in (_started_text(carry, report), self._ended_why, msg) if x)
            self._ended_why = None
        ok = answer.get("ok") if answer else None
        out_ans = {"stdout": stdout, "stderr": stderr, "exit_code": None if ended or timed_out else (0 if ok else 1),
                   "status": "timeout" if timed_out else "ok", "truncated": truncated,
                   "duration_s": time.monotonic() - t0, "message": msg,
                   "session": "ended" if ended else ("started" if started else "kept")}
        if carry is not None:
            names, dropped = _carry_result(report)
            out_ans.update(carried=names, not_carried=dropped)
        return out_ans

    def _run(self, s: _Session, code: str, deadline: float, cap: int, carry: bytes | None = None):
        """Send one cell (with the state it imports first, ``carry``) and read until its answer; ``(answer dict or
        None if the session ended, stdout bytes, stderr bytes, truncated, timed_out)``."""
        out, err = bytearray(), bytearray()
        truncated = timed_out = False
        req = {"code": code} if carry is None else {"code": code, "carry": base64.b64encode(carry).decode("ascii")}
        if not s.send(req):
            return None, out, err, False, False
        sel = selectors.DefaultSelector()
        sel.register(s.out_fd, selectors.EVENT_READ, out)
        sel.register(s.err_fd, selectors.EVENT_READ, err)
        sel.register(s.ans_r, selectors.EVENT_READ, None)
        interrupted_at = None
        answer = None
        try:
            while answer is None:
                now = time.monotonic()
                if interrupted_at is None and (now >= deadline or truncated):
                    timed_out = not truncated
                    interrupted_at = now
                    if s.pid is not None:
                        _signal(s.pid, signal.SIGINT)
                elif interrupted_at is not None and now - interrupted_at > INTERRUPT_GRACE_S:
                    break
                limit = (deadline if interrupted_at is None else interrupted_at + INTERRUPT_GRACE_S) - now
                events = sel.select(max(0.0, min(limit, 0.5)))
                for key, _ in events:
                    try:
                        chunk = os.read(key.fd, 65536)
                    except BlockingIOError:
                        continue
                    if not chunk:
                        sel.unregister(key.fileobj)
                        if key.data is None:  # the answer channel closed: the session ended
                            return None, out, err, truncated, timed_out
                        continue
                    if key.data is None:
                        s.answer += chunk
                        try:
                            answer = s.take_answer()
                        except ValueError:
                            return None, out, err, truncated, timed_out
                    elif len(key.data) <= cap + 16384:
                        key.data.extend(chunk)
                        if key.data is out and len(out) > cap:
                            truncated = True
                if not events and (s.pid is None or state_of(s.pid) in ("Z", "X", None)):
                    return None, out, err, truncated, timed_out  # the session died (a copy keeps the pipes open)
            for fd, buf in ((s.out_fd, out), (s.err_fd, err)):  # written before the answer: in the pipe
                try:
                    while len(buf) <= cap + 16384:
                        chunk = os.read(fd, 65536)
                        if not chunk:
                            break
                        buf += chunk
                except BlockingIOError:
                    pass
        finally:
            sel.close()
        if len(out) > cap:
            truncated = True
        return answer, out, err, truncated, timed_out

    def op_mark(self, req: dict) -> dict:
        """Keep a waiting ``os.fork`` copy of the live session under ``name`` (at most :data:`MAX_MARKS`, the oldest
        dropped); ``{"marked": bool}`` (False: no live session, or no copy it made can be trusted to be one)."""
        name = str(req.get("name", ""))
        s = self._interp
        if s is None or s.pid is None or not name:
            return {"marked": False}
        _signal(s.pid, signal.SIGCONT)
        answer = self._request(s, {"op": "fork"})
        pid = answer.get("pid") if answer else None
        self._pause()
        if answer is None or self._interp is None:
            if isinstance(pid, int):
                _kill_group(pid)
            self.end_session()  # the session did not answer, or will not stop: it is of no use any more
            return {"marked": False}
        if not isinstance(pid, int) or pid == s.pid or parent_of(pid) != s.pid:
            return {"marked": False}  # not a child of the session (a cell rewrote the runner): no copy kept
        if name in self._marks:
            self._drop_mark(name)
        self._marks[name] = (pid, s)
        while len(self._marks) > MAX_MARKS:
            self._drop_mark(next(iter(self._marks)))
        return {"marked": True}

    def export_session(self) -> bytes | None:
        """The live session's state by value (:func:`sandbox_server.interpreter_runner.export_state`), for a copy of
        this sandbox elsewhere; where no session runs, the state the last unpack carried that no cell took yet (a
        fork of a fork); None when there is neither. A session that does not answer within 5 s (a value's own
        ``__reduce__`` that never returns) is ended, as a session that will not make a copy is."""
        s = self._interp
        if s is None or s.pid is None or state_of(s.pid) in ("Z", "X", None):
            return self._carried
        _signal(s.pid, signal.SIGCONT)
        answer = self._request(s, {"op": "export", "max_bytes": INTERPRETER_STATE_BYTES}, EXPORT_ANSWER_BYTES)
        if answer is None:
            self.end_session()
            self._ended_why = ("the interpreter was ended at a snapshot: it did not export its state (no answer "
                               "within 5 s: a value's own code that does not return; or an answer past the size "
                               "bound)")
            return NO_STATE + b"the session did not export its state (no answer within 5 s, or one past the size " \
                b"bound); it was ended"
        self._pause()
        try:
            data = base64.b64decode(answer["data"]) if isinstance(answer.get("data"), str) else None
        except ValueError:
            data = None
        if data is None:
            why = str(answer.get("error") or "the session's answer held no state")[:300]
            return NO_STATE + f"the session could not export its state ({why})".encode("utf-8", "replace")
        if len(data) > INTERPRETER_STATE_BYTES:
            return NO_STATE + f"the session's state took {len(data)} bytes (at most {INTERPRETER_STATE_BYTES})".encode()
        return data

    def carry_in(self, data: bytes | None) -> None:
        """Keep ``data`` (an exported state, or None) for the next session: its first cell imports it first."""
        self._carried, self._ended_why = data, None

    def _request(self, s: _Session, req: dict, limit: int = ANSWER_BYTES) -> dict | None:
        """Send a request that runs no cell and wait (5 s at most) for its answer, at most ``limit`` bytes; None when
        none came (or a longer one began)."""
        if not s.send(req):
            return None
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            try:
                chunk = os.read(s.ans_r, 1 << 20)
            except BlockingIOError:
                time.sleep(0.0005)
                continue
            if not chunk:
                return None  # the channel closed: the session ended
            s.answer += chunk
            try:
                got = s.take_answer(limit)
            except ValueError:
                return None
            if got is not None:
                return got
        return None

    def op_resume(self, req: dict) -> dict:
        """Put the copy ``name`` in place of the live session (the live one is killed and waited for; the copy is
        copied again first, for a later resume). ``{"resumed": bool}``: False when no such copy is kept (the live
        session is then ended: the next cell starts a new one; the other copies stay)."""
        name = str(req.get("name", ""))
        self.end_session()
        if name not in self._marks:
            return {"resumed": False}
        pid, ch = self._marks.pop(name)
        if not _signal(pid, RESUME_SIGNAL):
            self._release(ch)
            return {"resumed": False}
        ch.pid = pid
        self._interp = ch
        ch.answer, ch.scanned = bytearray(), 0
        _drain(ch)
        again = self.op_mark({"name": name})  # keep a copy for the next resume
        return {"resumed": True, "marked_again": again["marked"]}


def _carry_result(answer: dict | None) -> tuple[list[str], dict[str, str]]:
    """``(names carried, {name: why not})`` of the answer to a cell that imported a carried state first."""
    if answer is None or not isinstance(answer.get("carried"), list):
        return [], {"*": "the session ended before it answered: nothing was restored"}
    raw = answer.get("dropped")
    dropped: dict = raw if isinstance(raw, dict) else {}
    return [str(n) for n in answer["carried"]], {str(k): str(v) for k, v in dropped.items()}


def _started_text(carry: bytes | None, answer: dict | None) -> str:
    """The message of a cell that started a new session: no variables from before, or what a copy carried."""
    if carry is None:
        return "a new interpreter started for this cell (no variables from before)"
    if answer is None or not isinstance(answer.get("carried"), list):
        return "a new interpreter started for this cell; the variables this copy carried were not restored"
    names, dropped = _carry_result(answer)
    if not names and "*" in dropped:
        return f"a new interpreter started for this cell in this copy of the sandbox, with no variables: {dropped['*']}"
    text = (f"a new interpreter started for this cell in this copy of the sandbox, with {len(names)} names carried "
            f"by value ({', '.join(names[:20])}{', ...' if len(names) > 20 else ''})")
    if dropped:
        text += "; not carried: " + "; ".join(f"{k} ({v})" for k, v in list(dropped.items())[:10])
        text += "; ..." if len(dropped) > 10 else ""
    return text


def _zombie_children(pid: int) -> bool:
    """Whether process ``pid`` has a child that ended and was not reaped."""
    return any(state_of(c) == "Z" for c in children_of(pid) or [])


def _signal(pid: int, sig: int) -> bool:
    """Send ``sig`` to process ``pid``; whether it was sent."""
    try:
        os.kill(pid, sig)
        return True
    except OSError:
        return False


def _wait_stopped(pid: int, limit_s: float = 5.0) -> bool:
    """Wait until process ``pid`` (the live session, sent SIGSTOP) has stopped; whether it did within ``limit_s``
    seconds."""
    deadline = time.monotonic() + limit_s
    while True:
        state = state_of(pid)
        if state in ("T", "t"):
            return True
        if state in (None, "Z", "X") or time.monotonic() > deadline:
            return False
        time.sleep(0.0002)


def _kill_group(pid: int, limit_s: float = 2.0) -> None:
    """SIGKILL process group ``pid`` (and the process) and wait until the process is gone: a session killed while it
    waits on the request channel may still take the next request from it before it dies."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except OSError:
            pass
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        reap_children()
        if state_of(pid) in ("Z", "X", None):
            return
        time.sleep(0.0002)


def _drain(s: _Session) -> None:
    for fd in (s.out_fd, s.err_fd, s.ans_r):
        try:
            while os.read(fd, 65536):
                pass
        except (BlockingIOError, OSError):
            pass


__all__ = ["INTERRUPT_GRACE_S", "InterpreterOps", "MAX_MARKS", "RESUME_SIGNAL"]
