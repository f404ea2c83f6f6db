"""The in-sandbox agent: the main process of every sandbox (Python >= 3.9).

Standard library only, one module per concern: :mod:`.protocol` (limits, the session-environment
allow-list, answers, host paths back to sandbox paths), :mod:`.confine` (noexec remounts, capabilities,
Landlock), :mod:`.state` (the agent's paths and limits), :mod:`.core` (``exec``, ``ps``, dispatch),
:mod:`.snapshot` (``pack`` / ``unpack``), :mod:`.writes` (``write``), :mod:`.recycle` (``recycle``),
:mod:`.interp` (``cell``: the live interpreter),
:mod:`.proc` and :mod:`.fs` (process table, IPC, directory helpers), :mod:`.capped` (capped execution) and
:mod:`.cli` (arguments, set-up, the request loop). The server imports the limits and :class:`Agent` from
here. Every module imports only the standard library and this package (relative imports), because the
sandbox gets the package as one zipapp (``sandbox_server/agent_bundle.py`` builds it deterministically;
``/opt/forkyard/agent.pyz`` in the image, bound read-only there under bubblewrap) run as
``python3 -u -I /opt/forkyard/agent.pyz``: nothing from the host's site-packages is there to import.

It reads one JSON request per line on stdin and writes one JSON answer per line on stdout; every
request carries an ``id`` that the answer echoes. The server talks to a Docker container through its
attached stdio (so the container keeps ``network_mode=none``) and to a local sandbox through pipes.

Operations (``op``):

``ping``
    ``{"pong": true, "pid": ..., "confinement": {...}, "limits": {...}}``: how this agent is confined
    (``noexec``: the writable areas are mounted ``noexec`` by this agent; ``landlock_abi``: > 0 when
    only system directories may be executed; ``caps_dropped``; ``signal_scope``) and the limits below (with
    ``proc_memory_bytes``, ``proc_open_files`` and ``bounded``).
``exec``
    ``argv`` (list of str, run directly, never through a shell), ``cwd`` (sandbox path under a readable
    root), ``env`` (dict; only the names in :data:`SESSION_ENV_NAMES` with plain values, see
    :func:`env_problems`; anything else refuses the call), ``timeout_s`` (seconds), ``cap_bytes`` (output
    cap, bytes), ``path_args`` (indices of ``argv`` items that are paths; each must resolve, symlinks
    included, inside one of the agent's readable roots, or the call is refused and nothing runs). The
    child runs in its own process group (new session) with an empty stdin; its output is read while it
    runs and the child is stopped at the cap; at the deadline the whole group is killed. Answer:
    ``stdout``, ``stderr``, ``exit_code``, ``status`` (ok|timeout|refused|error), ``truncated``,
    ``duration_s``, ``message``. Every process inherits the limits the agent set on itself at start
    (:func:`.capped.static_limits`); after the call every descendant of the agent is killed. ``bounded_only``
    (true for tools that run the caller's code): refused unless the agent runs ``--bounded`` (its sandbox's process
    count is bounded from outside: a pids cgroup, Docker's ``pids_limit``); such a call's processes also get a CPU
    limit (:func:`.capped.process_limits`) and, where the kernel has Landlock scopes, a domain that cannot signal or
    trace anything outside the call (:class:`.confine.SignalScope`).
``pack`` / ``unpack``
    Pack the writable areas into a base64 PAX tar (``data``), or replace their contents with one.
    Carried: regular files, directories, symbolic links, hard links, FIFOs and (unbound) UNIX socket files within
    the writable areas, with their permission bits (setuid/setgid dropped) and modification times to the
    nanosecond, whatever their modes. A device makes ``pack`` refuse (``error_kind: "unsupported"``) naming the
    path: nothing is ever dropped silently. ``pack`` with ``mark`` first keeps a waiting ``os.fork`` copy of the live
    interpreter under that name; ``unpack`` ends the live interpreter, or with ``resume`` puts that copy in its
    place (``resumed``: whether it did). Where a live interpreter ran, ``pack`` adds its state by value as the
    member :data:`SESSION_MEMBER` (at most :data:`INTERPRETER_STATE_BYTES`); ``unpack`` of an archive with one,
    where no copy was resumed, keeps it for the next session's first cell.
``cell``
    ``code`` run in the sandbox's live Python interpreter (:mod:`.interp`; ``argv`` starts one when none runs):
    variables persist between cells; answered like ``exec``, plus ``session`` (``kept``, ``started``, ``ended``) and,
    for the first cell of a session that took a carried state, ``carried`` and ``not_carried``.
    Refused unless ``--bounded``.
``write``
    ``files``: {relative path: base64 bytes} written under the first writable area (``/scratch``); at
    most :data:`MAX_WRITE_FILES` files per write, and the area's limits hold (below). A write that
    fails keeps none of its files (files it was replacing are removed too).
``ps``
    Command lines of the processes visible to the agent (tests use it to prove nothing was left).
``recycle``
    Reset the sandbox for another session, then check it (the pool hands a sandbox out again only when
    the answer's ``clean`` is true): SIGKILL every other process (``--isolated``: every process of the
    namespace but the agent and its ancestors, i.e. the container's or bubblewrap's init; otherwise only
    the agent's descendants), empty the writable areas and put back their modes and times as they were
    at start, and with ``--isolated`` remove whatever appeared in any other place the agent may write
    (``/dev/shm``, ``/dev/mqueue``, bubblewrap's root) and every System V IPC object. Answer: ``clean``,
    ``killed`` (processes), ``problems`` (one line per thing that could not be reset), ``duration_s``.

Errors are answered as ``{"error": message, "error_kind": kind}`` with ``kind`` one of ``limit`` (a
documented limit would be passed: nothing was written), ``refused`` (a bad request: nothing was done),
``unsupported`` (the writable areas hold something a snapshot cannot carry), ``isolation`` (the
confinement asked for could not be set up: the agent serves nothing) or ``error``.

Limits of each writable area (``/scratch`` and ``/tmp`` each): :data:`AREA_BYTES` bytes (16 MiB; set by
``--area-bytes``) counted as tmpfs counts them, each regular file taking its size rounded up to
:data:`PAGE_BYTES` (4 KiB); at most :data:`MAX_AREA_ENTRIES` entries (files, directories, links).

Paths are *sandbox paths* (``/data/x``); ``--root SANDBOX=HOST`` maps them onto host directories when
the agent runs without a mount namespace (the local backend's unsafe unisolated mode). In Docker and
under bubblewrap every mapping is the identity. Whatever the mapping, no host path reaches an answer:
the host roots are written back as sandbox paths in ``stdout``, ``stderr``, ``message`` and ``error``
(in the output streams *before* the cap is applied, so the cap counts the bytes the caller sees).

Confinement set up at start: ``--confine`` (the local backend under bubblewrap) remounts the writable
areas ``noexec,nosuid,nodev`` (in a nested user namespace when the agent has no capability of its own)
and drops every capability; failure is fatal. Always, where the kernel offers Landlock, execution is
restricted to the system directories (``/usr``, ``/bin``, ``/sbin``, ``/lib*``), so nothing uploaded
can be executed even without a mount namespace.
"""

from __future__ import annotations

from .capped import run_capped
from .cli import main, setup
from .core import Agent
from .protocol import (
    AREA_BYTES, INTERPRETER_STATE_BYTES, MARKER, MAX_AREA_ENTRIES, MAX_ENV_VALUE_CHARS, MAX_ENV_VARS, MAX_WRITE_FILES,
    PAGE_BYTES, SESSION_ENV_NAMES, PathRewriter, decode, env_problems, utf8_cut,
)
from .snapshot import SESSION_MEMBER

__all__ = [
    "AREA_BYTES", "INTERPRETER_STATE_BYTES", "MARKER", "MAX_AREA_ENTRIES", "MAX_ENV_VALUE_CHARS", "MAX_ENV_VARS",
    "MAX_WRITE_FILES", "PAGE_BYTES", "SESSION_ENV_NAMES", "SESSION_MEMBER", "Agent", "PathRewriter", "decode",
    "env_problems", "main", "run_capped", "setup", "utf8_cut",
]
